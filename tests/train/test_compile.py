"""`compile=true` for training stages: blocks compiled in place compute the same loss and gradients as the eager
model, keep their parameter names, compile one graph per kind of block, and leave the stages' hashes alone (speed
only)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.compile import compile_blocks
from hyla.convert.pipeline import stage_settings
from hyla.convert.presets import apply_overrides, make_plan
from offline_models import tiny_mixed_hypenet


@pytest.mark.slow
def test_compiled_blocks_give_the_eager_loss_and_gradients():
    eager = tiny_mixed_hypenet()
    compiled = copy.deepcopy(eager)
    keys = list(compiled.state_dict())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert compile_blocks(compiled.model.layers) == 3
    assert list(compiled.state_dict()) == keys  # checkpoints and safetensors exports see the same names
    tokens = torch.randint(0, 60, (2, 37), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (eager, compiled):
        loss = model(tokens, labels=tokens, use_cache=False).loss
        loss.backward()
        losses.append(loss.item())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # something was compiled
    assert losses[1] == pytest.approx(losses[0], rel=1e-12)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        assert ((a.grad - b.grad).norm() / a.grad.norm()).item() <= 1e-9, name


@pytest.mark.slow
def test_compiled_blocks_compile_in_the_first_step_only():
    # A cache a block fills in its first call (the Lightning decay on the model's device) must not fail a guard in
    # the second: on the H200 that recompile cost ~24 s a stage.
    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention"])
    model = HypeNetForCausalLM(config).to(torch.device("cpu")).train()
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compile_blocks(model.model.layers)
    tokens = torch.randint(0, 60, (2, 16), generator=torch.Generator().manual_seed(1))
    graphs = []
    for _ in range(3):
        model(tokens, labels=tokens, use_cache=False).loss.backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[0] and graphs[2] == graphs[0]


@pytest.mark.slow
def test_compiled_teacher_blocks_record_their_mixers_without_recompiling():
    """Stage 1 with `align.teacher_bf16` compiles the teacher's blocks; they record each mixer's input and output
    into a list (`record_mixers`), which must give the eager recording and compile in the first step only."""
    from hyla.convert.align import record_mixers

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["attention_rope"] * 3)
    eager = HypeNetForCausalLM(config).double().eval()
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compile_blocks(compiled.model.layers)
    graphs = []
    for step in range(3):
        tokens = torch.randint(0, 60, (2, 24), generator=torch.Generator().manual_seed(step))
        expected, _ = record_mixers(eager, tokens)
        actual, _ = record_mixers(compiled, tokens)
        graphs.append(counters["stats"]["unique_graphs"])
        for i in range(3):
            for want, got in ((expected.inputs[i], actual.inputs[i]), (expected.outputs[i], actual.outputs[i])):
                assert ((want - got).norm() / want.norm()).item() <= 1e-12, (step, i)
    assert graphs[0] > 0 and graphs[1] == graphs[0] and graphs[2] == graphs[0]


@pytest.mark.parametrize("twins_path", ["per-twin-loop", "batched-twins", "whole-twins"])
@pytest.mark.parametrize("teacher_bf16", [False, True], ids=["float32-teacher", "bf16-teacher"])
# Past its recompile limit dynamo would run the blocks uncompiled, compiling nothing new: an error instead.
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def test_compiled_conversion_steps_compile_one_graph_per_kind_of_block(twins_path, teacher_bf16, monkeypatch,
                                                                      request):
    """Stages 1 and 2 of `hyla convert` on the fast path, in one process as the pipeline runs them: stage 1 compiles
    one graph for the twins (block by block, the batched loss, or each twin with its loss: `whole-twins`, with
    Lightning's kernel as the custom op, as `hyla bench train --paths fast-whole-blocks` runs it) and, with
    `teacher_bf16`, one for the teacher's recording blocks; stage 2 one for each kind of student block and one for
    the teacher's blocks. No graph per layer, and nothing new at a second step. Dynamo's "eager" backend: its
    guards, which decide what recompiles, without inductor's code generation."""
    from torch._dynamo.utils import counters
    from transformers import LlamaConfig, LlamaForCausalLM

    from hyla.convert.align import AlignmentTwins, compiled_twin_error
    from hyla.convert.align_batched import choose_alignment_path, compiled_twin_errors
    from hyla.ops.lightning import chunk_kernel_as_custom_op
    from hyla.convert.distill import StudentWithTeacher, bf16_teacher, build_student, distill_loss
    from hyla.models.transfer import to_hypenet

    original_compile = torch.compile
    # nn.Module.compile and the batched loss both call torch.compile.
    monkeypatch.setattr(torch, "compile", lambda function, **options:
                        original_compile(function, **{**options, "backend": "eager"}))
    request.addfinalizer(torch._dynamo.reset)
    request.addfinalizer(compiled_twin_errors.cache_clear)
    request.addfinalizer(compiled_twin_error.cache_clear)
    batched, whole_twins = twins_path == "batched-twins", twins_path == "whole-twins"
    torch.manual_seed(0)
    hf_teacher = LlamaForCausalLM(LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=48,
                                              num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=128))
    teacher = to_hypenet(hf_teacher, attention_rope=True).eval()
    teacher = bf16_teacher(teacher) if teacher_bf16 else teacher
    batches = [{"input_ids": ids, "labels": ids}
               for ids in torch.randint(0, 60, (2, 1, 16), generator=torch.Generator().manual_seed(1))]
    torch._dynamo.reset()
    compiled_twin_errors.cache_clear()
    compiled_twin_error.cache_clear()
    counters.clear()
    settings = contextlib.ExitStack()
    request.addfinalizer(settings.close)
    settings.enter_context(chunk_kernel_as_custom_op(whole_twins))

    def graphs_per_step(model, loss_fn) -> list[int]:
        graphs = []
        for batch in batches:
            loss_fn(model, batch)[0].backward()
            graphs.append(counters["stats"]["unique_graphs"])
        return graphs

    # What hyla.convert.runners' run_align and train_budget compile.
    twins = AlignmentTwins.for_training(teacher, hf_teacher, copy.deepcopy(teacher.config), torch.device("cpu"))
    path = choose_alignment_path(twins, compile=True, batched=batched, whole_twins=whole_twins)
    assert path.batched == batched and path.compiled and path.whole_twins == whole_twins
    frozen = list(teacher.model.layers) if teacher_bf16 else []
    compile_blocks([*twins.twins, *frozen] if path.compile_twins else frozen)
    # The twins' graph (or the batched loss's), and the teacher's recording block where it is compiled.
    stage_1 = 2 if teacher_bf16 else 1
    assert graphs_per_step(twins, path.loss_fn) == [stage_1, stage_1]
    # Stage 2 (run_distill), fused loss (the CUDA default): a Lightning and an attention block of the student, and the
    # teacher's block without recording and without gradients.
    student = build_student(hf_teacher, [1, 4]).float()
    compile_blocks([*student.model.layers, *teacher.model.layers])
    distill = functools.partial(distill_loss, fused=True)
    assert graphs_per_step(StudentWithTeacher(student, teacher), distill) == [stage_1 + 3, stage_1 + 3]


def test_fast_path_settings_leave_stage_hashes_alone():
    plan = make_plan("smoke", 1_000_000)
    compiled = apply_overrides(make_plan("smoke", 1_000_000),
                               ["align.compile=true", "distill.compile=true", "finetune.compile=true",
                                "finetune.fused_loss=false", "distill.micro_batch_size=1",
                                "finetune.fused_optimizer=true", "distill.data_parallel=fsdp",
                                "align.data_parallel=ddp", "align.batched_twins=true",
                                "align.whole_blocks=false", "distill.whole_blocks=true", "distill.kl_kernel=triton",
                                "distill.compile_mode=max-autotune-no-cudagraphs",
                                "finetune.compile_mode=max-autotune-no-cudagraphs",
                                "distill.fused_projections=true", "finetune.fused_projections=false",
                                "align.cuda_graphs=false"])
    assert compiled.distill.compile and not plan.distill.compile
    request = SimpleNamespace(data=["somewhere"])
    assert stage_settings(compiled, request) == stage_settings(plan, request)
    # The budget's other fields are all in its settings: leaving out the speed-only ones kept earlier hashes, as
    # does leaving out `align_documents`, `teacher_bf16`, `bf16_activations`, `logit_scaling_a` and `freeze` while they
    # are off, unset or "none" (fields added later; on, they change the training windows, the teacher's targets, the
    # student's rounding, its attention logits or what trains; `hyla convert` resolves an unset teacher_bf16 for its
    # device before hashing).
    speed_only = ("compile", "fused_loss", "fused_optimizer", "micro_batch_size", "checkpoint_activations",
                  "data_parallel", "batched_twins", "whole_blocks", "kl_kernel", "compile_mode", "fused_projections",
                  "cuda_graphs")
    off_by_default = ("align_documents", "teacher_bf16", "bf16_activations", "logit_scaling_a", "freeze")
    assert plan.distill.settings() == {k: v for k, v in dataclasses.asdict(plan.distill).items()
                                       if k not in speed_only + off_by_default}
    frozen = apply_overrides(make_plan("smoke", 1_000_000), ["distill.freeze=attention"])
    assert frozen.distill.settings()["freeze"] == "attention"
    aligned = apply_overrides(make_plan("smoke", 1_000_000), ["distill.align_documents=true"])
    assert aligned.distill.settings()["align_documents"] is True
    half = apply_overrides(make_plan("smoke", 1_000_000), ["align.teacher_bf16=true"])
    assert half.align.settings()["teacher_bf16"] is True
    assert stage_settings(half, request)["align"] != stage_settings(plan, request)["align"]
    rounded = apply_overrides(make_plan("smoke", 1_000_000), ["distill.bf16_activations=true"])
    assert rounded.distill.settings()["bf16_activations"] is True
    assert stage_settings(rounded, request)["distill"] != stage_settings(plan, request)["distill"]
    changed = apply_overrides(make_plan("smoke", 1_000_000), ["distill.seq_len=64"])
    assert stage_settings(changed, request)["distill"] != stage_settings(plan, request)["distill"]
