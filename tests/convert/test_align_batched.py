"""Stage 1's batched loss (hyla.convert.align_batched) against the per-twin reference loop (`alignment_loss`): the
same loss, metrics and gradient of every twin parameter on tiny random teachers of several families and twin
configs, the loop where the twins cannot be batched, and the same twins after a short stage 1 of the pipeline."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from hyla.cli import main
from hyla.convert.align import AlignmentTwins, alignment_loss, compiled_twin_error, record_mixers
from hyla.convert.align_batched import (batched_alignment_loss, batched_twin_outputs, batching_obstacle,
                                        choose_alignment_path, compiled_twin_errors)
from hyla.layers.lightning import LightningAttention
from hyla.models.transfer import to_hypenet
from test_convert_pipeline import convert_args

COMMON = dict(vocab_size=120, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, max_position_embeddings=256)
TEACHERS = {
    # q/k/v and o biases
    "llama-bias": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, attention_bias=True)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**COMMON)),
    # q/k/v biases, none on o
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON)),
    # the teacher's own q/k norms; head_dim 16: the attention width (96) differs from the hidden size (48)
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16)),
}
TWIN_OPTIONS = {
    "default": {},
    "no-gate": {"lightning_output_gate": False},
    "no-qk-norm": {"lightning_qk_norm": False},
    "bare": {"lightning_output_gate": False, "lightning_qk_norm": False, "lightning_rope": False},
}


def make_twins(family: str, options: dict, dtype=torch.float64) -> AlignmentTwins:
    torch.manual_seed(0)
    teacher = TEACHERS[family]().to(dtype)
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    config = copy.deepcopy(equivalent.config)
    for name, value in options.items():
        setattr(config, name, value)
    twins = AlignmentTwins(equivalent, teacher, config).to(dtype)
    with torch.no_grad():
        # Every parameter away from its initial value (norm weights of 1, zero biases): each one counts.
        for param in twins.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return twins


def loss_and_gradients(loss_fn, twins, batch):
    twins.zero_grad()
    loss, metrics = loss_fn(twins, batch)
    loss.backward()
    return loss.detach(), metrics, {name: param.grad.clone() for name, param in twins.named_parameters()}


def tokens(batch: int, length: int, seed: int = 1) -> dict:
    return {"input_ids": torch.randint(0, 120, (batch, length), generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize("family", sorted(TEACHERS))
@pytest.mark.parametrize("options", sorted(TWIN_OPTIONS))
def test_batched_loss_gives_the_per_twin_loss_metrics_and_gradients(family, options):
    twins = make_twins(family, TWIN_OPTIONS[options])
    assert batching_obstacle(list(twins.twins)) is None
    # 3 rows of 70 tokens: an odd batch, and a length past one 64-token chunk of the reference op.
    batch = tokens(3, 70)
    loss, metrics, grads = loss_and_gradients(alignment_loss, twins, batch)
    batched_loss, batched_metrics, batched_grads = loss_and_gradients(batched_alignment_loss, twins, batch)
    # float64 twins; both paths take the MSE in float32 (as the loop does), summed in another order: float32
    # rounding of a mean of squares.
    assert batched_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    assert batched_metrics.keys() == metrics.keys()
    for name, value in metrics.items():
        assert batched_metrics[name].item() == pytest.approx(value.item(), rel=1e-6), name
    # The float32 MSE's gradient, 2 (p - t) / N, is elementwise: the same in both; the rest runs in float64.
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        assert ((batched_grads[name] - grad).norm() / grad.norm()).item() <= 1e-10, name


def test_batched_outputs_are_each_twins_own_output_in_float64():
    twins = make_twins("qwen3", {})
    recorder, context = record_mixers(twins.teacher[0], tokens(1, 5)["input_ids"])
    layers = range(len(twins.twins))
    first = twins.twins[0]
    outputs = batched_twin_outputs(list(twins.twins), [recorder.inputs[i] for i in layers], context.rope,
                                   first.log_decay(first.q_proj.weight.device), torch.float64)
    for i, twin in enumerate(twins.twins):
        expected = twin(recorder.inputs[i], context).reshape(outputs.shape[1:])
        # float64 throughout: only the order of the products' sums differs.
        assert ((outputs[i] - expected).norm() / expected.norm()).item() <= 1e-12, i


def test_batched_loss_in_float32_follows_the_loop():
    twins = make_twins("llama-bias", {}, dtype=torch.float32)
    batch = tokens(2, 33)
    loss, _, grads = loss_and_gradients(alignment_loss, twins, batch)
    batched_loss, _, batched_grads = loss_and_gradients(batched_alignment_loss, twins, batch)
    # float32: batched and per-layer products sum in different orders (a few float32 ulps per product, grown
    # through the norms and the recurrence).
    assert batched_loss.item() == pytest.approx(loss.item(), rel=1e-5)
    for name, grad in grads.items():
        assert ((batched_grads[name] - grad).norm() / grad.norm()).item() <= 1e-4, name


def test_the_plans_keep_the_per_twin_loop_until_the_batched_loss_is_measured_on_a_gpu():
    from hyla.convert.presets import make_plan

    assert not make_plan("halo-smollm2", 135_000_000).align.batched_twins
    twins = make_twins("llama", {}, dtype=torch.float32)
    loop = choose_alignment_path(twins, compile=True, batched=False)
    assert not loop.batched and loop.loss_fn is alignment_loss and loop.compile_twins
    assert "align.batched_twins=false" in loop.describe()


def test_twins_that_cannot_be_batched_fall_back_to_the_loop_and_say_why():
    twins = make_twins("llama", {}, dtype=torch.float32)
    assert choose_alignment_path(twins, compile=True).batched
    reference = choose_alignment_path(twins, compile=False)
    assert not reference.batched and reference.loss_fn is alignment_loss
    assert reference.describe() == "per-twin loop (the reference path)"
    sharded = choose_alignment_path(twins, compile=True, data_parallel_mode="fsdp")
    assert not sharded.batched and sharded.compile_twins and "FSDP2" in sharded.reason
    # Each twin compiled with its loss: the loop's fast path only, and not under FSDP2's per-twin hooks.
    whole = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True)
    assert whole.whole_twins and not whole.compile_twins and whole.compiled and not whole.batched
    assert whole.describe() == ("per-twin loop, each twin compiled with its loss (the per-twin loop, each twin "
                                "compiled with its loss (align.batched_twins=false))")
    assert not choose_alignment_path(twins, compile=False, batched=False, whole_twins=True).whole_twins
    sharded_whole = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True,
                                          data_parallel_mode="fsdp")
    assert not sharded_whole.whole_twins and sharded_whole.compile_twins
    # One twin of another config (no q/k norm) among Lightning twins.
    config = copy.deepcopy(twins.twins[1].config)
    config.lightning_qk_norm = False
    twins.twins[1] = LightningAttention(config, 1)
    path = choose_alignment_path(twins, compile=False, batched=True)
    assert not path.batched and path.loss_fn is alignment_loss
    assert path.reason == "twin 1 differs from twin 0 in norms, parameters"
    assert path.describe() == "per-twin loop (twin 1 differs from twin 0 in norms, parameters)"
    teacher = TEACHERS["llama"]()
    gla = AlignmentTwins(to_hypenet(teacher, attention_rope=True).eval(), teacher, rnn_mixer="gla")
    assert "twin 0 is GatedLinearAttention, not LightningAttention" in choose_alignment_path(gla, compile=True).reason


@pytest.mark.slow
def test_the_compiled_batched_loss_compiles_in_the_first_step_only_and_leaves_the_twins_alone():
    twins = make_twins("qwen3", {}, dtype=torch.float32)
    torch._dynamo.reset()
    compiled_twin_errors.cache_clear()
    counters = torch._dynamo.utils.counters
    counters.clear()
    path = choose_alignment_path(twins, compile=True)
    assert path.batched and path.compiled and not path.compile_twins
    graphs = []
    for seed in range(3):
        batch = tokens(2, 40, seed=seed)
        loss, _, grads = loss_and_gradients(path.loss_fn, twins, batch)
        graphs.append(counters["stats"]["unique_graphs"])
        reference, _, reference_grads = loss_and_gradients(alignment_loss, twins, batch)
        # Inductor's fused float32 kernels against eager float32: rounding order.
        assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
        for name, grad in reference_grads.items():
            assert ((grads[name] - grad).norm() / grad.norm()).item() <= 1e-4, name
    assert graphs[0] > 0 and graphs[1] == graphs[0] and graphs[2] == graphs[0]
    assert all(twin._compiled_call_impl is None for twin in twins.twins)


@pytest.mark.slow
def test_each_twin_compiled_with_its_loss_shares_one_graph_and_gives_the_loops_loss():
    """The loop's fast path with `whole_twins`: `twin_error` compiled once for every twin (Lightning's kernel as the
    custom op, as on CUDA), in the first step only, with the eager loop's loss, metrics and gradients."""
    from hyla.ops.lightning import chunk_kernel_as_custom_op

    twins = make_twins("qwen3", {}, dtype=torch.float32)
    torch._dynamo.reset()
    compiled_twin_error.cache_clear()
    counters = torch._dynamo.utils.counters
    counters.clear()
    path = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True)
    graphs = []
    with chunk_kernel_as_custom_op():
        for seed in range(3):
            batch = tokens(2, 40, seed=seed)
            loss, metrics, grads = loss_and_gradients(path.loss_fn, twins, batch)
            graphs.append(counters["stats"]["unique_graphs"])
            reference, reference_metrics, reference_grads = loss_and_gradients(alignment_loss, twins, batch)
            # Inductor's fused float32 kernels against eager float32: rounding order.
            assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
            for name, value in reference_metrics.items():
                assert metrics[name].item() == pytest.approx(value.item(), rel=1e-5), name
            for name, grad in reference_grads.items():
                assert ((grads[name] - grad).norm() / grad.norm()).item() <= 1e-4, name
    assert graphs == [1, 1, 1] and not counters["graph_break"]
    assert all(twin._compiled_call_impl is None for twin in twins.twins)
    torch._dynamo.reset()
    compiled_twin_error.cache_clear()


def _trained_twins(out) -> dict[str, torch.Tensor]:
    return load_file(out / "01-align" / "twins.safetensors")


def _assert_same_twins(expected: dict, actual: dict, rtol: float) -> None:
    assert expected.keys() == actual.keys()
    for name, value in expected.items():
        assert ((actual[name] - value).norm() / value.norm()).item() <= rtol, name


def test_stage_1_with_the_batched_loss_trains_the_loops_twins(tiny_teacher, distilled_run, tmp_path, capsys):
    # The loop: stage 1 of the plain run (stage 1 is the same whichever stage a run stops after).
    loop, printed = distilled_run
    assert "[align] alignment loss: per-twin loop (the reference path)" in printed
    # The batched loss, eager (the CPU default does not compile).
    assert main(convert_args(tiny_teacher, tmp_path / "batched", "--until-stage", "align",
                             "--set", "align.batched_twins=true")) == 0
    assert "[align] alignment loss: batched, every twin in one problem, eager (4 Lightning twins of one shape)" \
        in capsys.readouterr().out
    # float32 on CPU, 8 AdamW steps: the two losses' rounding differs by float32 ulps, which AdamW's normalised
    # update can turn into up to lr-sized moves of entries with gradients near zero.
    _assert_same_twins(_trained_twins(loop), _trained_twins(tmp_path / "batched"), rtol=1e-4)


@pytest.mark.slow
def test_stage_1_on_the_fast_path_compiles_the_batched_loss_and_trains_the_loops_twins(tiny_teacher, distilled_run,
                                                                                        tmp_path, capsys):
    import json

    loop, _ = distilled_run
    assert main(convert_args(tiny_teacher, tmp_path / "fast", "--until-stage", "align", "--set", "align.compile=true",
                             "--set", "align.batched_twins=true")) == 0
    printed = capsys.readouterr().out
    assert "[align] alignment loss: batched, every twin in one problem, one compiled function" in printed
    assert "[align] torch.compile: the loss function, whole (no block compiled on its own)" in printed
    results = json.loads((tmp_path / "fast" / "01-align" / "manifest.json").read_text())["results"]
    assert results["alignment_loss"]["batched"] and results["fast_path"]["compile"]
    # As above, with inductor's fused float32 kernels on the batched side.
    _assert_same_twins(_trained_twins(loop), _trained_twins(tmp_path / "fast"), rtol=1e-3)


@pytest.mark.slow
def test_stage_1_batched_loss_with_a_bf16_teacher_compiles_the_teachers_blocks(tiny_teacher, tmp_path, capsys):
    import json

    assert main(convert_args(tiny_teacher, tmp_path / "fast", "--until-stage", "align", "--set", "align.compile=true",
                             "--set", "align.batched_twins=true", "--set", "align.teacher_bf16=true")) == 0
    printed = capsys.readouterr().out
    # The tiny teacher's 4 blocks, in bf16, compiled as blocks beside the batched loss compiled whole.
    assert "[align] torch.compile: the loss function, whole, and 4 frozen teacher blocks" in printed
    results = json.loads((tmp_path / "fast" / "01-align" / "manifest.json").read_text())["results"]
    assert results["alignment_loss"]["batched"] and results["fast_path"]["compile"]


@pytest.mark.slow
def test_compiled_stages_default_to_whole_blocks_and_train_what_the_split_blocks_train(tiny_teacher, tmp_path,
                                                                                       capsys):
    """`compile` alone (as on CUDA by default) runs stage 1 as the loop with each twin compiled with its loss
    (Lightning's kernel as the custom op) and stage 2 with it inside the compiled blocks; `whole_blocks=false`
    splits them again. The same formulas either way: the twins and students agree to float32 rounding order."""
    import json


    stop = ["--until-stage", "distill", "--set", "align.compile=true", "--set", "distill.compile=true"]
    assert main(convert_args(tiny_teacher, tmp_path / "whole", *stop)) == 0
    printed = capsys.readouterr().out
    assert "[align] alignment loss: per-twin loop, each twin compiled with its loss" in printed
    assert "[align] torch.compile: the loss function, whole (no block compiled on its own)" in printed
    assert "[distill] fast path: compiled blocks whole (Lightning as a custom op)" in printed
    assert main(convert_args(tiny_teacher, tmp_path / "split", *stop, "--set", "align.whole_blocks=false",
                             "--set", "distill.whole_blocks=false")) == 0
    printed = capsys.readouterr().out
    assert "[align] alignment loss: per-twin loop, each twin compiled (" in printed
    assert "[distill] fast path: compiled blocks split" in printed
    for stage, whole in (("01-align", True), ("03-distill", True)):
        results = json.loads((tmp_path / "whole" / stage / "manifest.json").read_text())["results"]
        assert results["fast_path"]["whole_blocks"] is whole
    _assert_same_twins(_trained_twins(tmp_path / "split"), _trained_twins(tmp_path / "whole"), rtol=1e-3)
    split, whole = (load_file(tmp_path / name / "03-distill" / "student.safetensors") for name in ("split", "whole"))
    assert split.keys() == whole.keys()
    for name in split:
        torch.testing.assert_close(whole[name], split[name], rtol=1e-3, atol=1e-5, msg=name)
