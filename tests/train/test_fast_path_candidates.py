"""Speed settings of the training fast path, each a candidate `hyla bench train` times before it may become a
default: `distill.kl_kernel` (the fused KL's per-chunk kernel), resolved into the fast path, passed by the
distillation loss to the chunked loss, timed by `--paths fast-triton-kl`; `distill.compile_mode` /
`finetune.compile_mode` (torch.compile's mode for the blocks), passed to each block's compile, timed by `--paths
fast-max-autotune`; the fused input projections (`--paths fast-fused-projections`); and `align.cuda_graphs` (stage
1's compiled twins replayed as CUDA graphs, `--paths fast-cuda-graphs`). The kernel's numbers against the
default's: tests/ops/test_kernels_interpreted.py (CPU, Triton's interpreter) and tests/train/test_fast_path_gpu.py
(30 steps on CUDA)."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.train import PATHS, Case, TrainBenchSettings, path_measures_stage, run_train_bench
from hyla.convert.distill import StudentWithTeacher, build_student, distill_loss
from hyla.compile import compile_blocks
from hyla.convert.presets import COMPILE_MODES, KL_KERNELS, apply_overrides, check_plan, make_plan
from hyla.convert.stages import settings_hash
from hyla.train.fast import COMPILE_MODES as FAST_PATH_MODES
from hyla.train.fast import check_kl_kernel, resolve_fast_path


def test_the_plans_kernels_and_modes_are_the_ops_and_the_fast_paths():
    from hyla.inference.settings import COMPILE_MODES as ENGINE_MODES
    from hyla.ops.linear_loss import KL_KERNELS as OPS_KERNELS

    assert KL_KERNELS == OPS_KERNELS
    assert COMPILE_MODES == FAST_PATH_MODES == ENGINE_MODES


def test_the_kernel_is_a_speed_setting_of_stage_2_only():
    plan = make_plan("smoke", 0)
    chosen = check_plan(apply_overrides(make_plan("smoke", 0), ["distill.kl_kernel=triton"]))
    assert chosen.distill.kl_kernel == "triton" and plan.distill.kl_kernel is None  # None: the device's default
    # float rounding only: a run resumed with the other kernel keeps its stage
    assert settings_hash(chosen.distill.settings()) == settings_hash(plan.distill.settings())
    for stage in ("align", "finetune"):
        with pytest.raises(ValueError, match=f"{stage}.kl_kernel: the KL is stage 2's loss"):
            check_plan(apply_overrides(make_plan("smoke", 0), [f"{stage}.kl_kernel=triton"]))
        check_plan(apply_overrides(make_plan("smoke", 0), [f"{stage}.kl_kernel=torch"]))  # what it runs anyway
    with pytest.raises(ValueError, match="distill.fused_loss=false takes the whole logits"):
        check_plan(apply_overrides(make_plan("smoke", 0), ["distill.kl_kernel=triton", "distill.fused_loss=false"]))
    # the default gives way to the unfused loss instead of refusing it
    unfused = check_plan(apply_overrides(make_plan("smoke", 0), ["distill.fused_loss=false"]))
    assert resolve_fast_path(compile=None, fused_loss=unfused.distill.fused_loss, fused_optimizer=None,
                             micro_batch_size=None, device=torch.device("cuda"),
                             kl_kernel=unfused.distill.kl_kernel).kl_kernel == "torch"


def test_the_fast_path_carries_the_kernel_where_it_can_run():
    def resolve(device, **kwargs):
        return resolve_fast_path(compile=None, fused_loss=kwargs.pop("fused_loss", None), fused_optimizer=None,
                                 micro_batch_size=None, device=torch.device(device), **kwargs)

    assert resolve("cuda").kl_kernel == "torch" and "KL kernel" not in resolve("cuda").describe()  # not stage 2
    # stage 2's default (None): the Triton kernel on CUDA with the fused loss, compiled torch elsewhere
    assert resolve("cuda", kl_kernel=None).kl_kernel == "triton"
    assert resolve("cpu", kl_kernel=None).kl_kernel == "torch"
    assert resolve("cuda", kl_kernel=None, fused_loss=False).kl_kernel == "torch"
    assert resolve("cuda", kl_kernel="torch").kl_kernel == "torch"
    triton = resolve("cuda", kl_kernel="triton")
    assert triton.kl_kernel == "triton" and "(KL kernel triton)" in triton.describe()
    assert triton.as_dict()["kl_kernel"] == "triton"  # in the stage's manifest
    with pytest.raises(ValueError, match="kl_kernel=triton runs on CUDA, and this device is cpu"):
        resolve("cpu", kl_kernel="triton")
    with pytest.raises(ValueError, match="is a kernel of the fused LM head"):
        resolve("cuda", kl_kernel="triton", fused_loss=False)
    with pytest.raises(ValueError, match="unknown KL kernel 'cuda'"):
        check_kl_kernel("cuda")


def test_the_distillation_loss_hands_its_kernel_to_the_chunked_loss(monkeypatch):
    import hyla.convert.distill as distill

    seen = []
    real = distill.linear_kl_divergence_chunked

    def spy(*args, **kwargs):
        seen.append(kwargs.get("kernel"))
        return real(*args, **{**kwargs, "kernel": "torch"})

    monkeypatch.setattr(distill, "linear_kl_divergence_chunked", spy)
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2)).eval()
    pair = StudentWithTeacher(build_student(teacher, [1], None), teacher)
    ids = torch.randint(0, 64, (2, 9))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    plain, _ = distill_loss(pair, batch, fused=True)
    chosen, _ = functools.partial(distill_loss, fused=True, kernel="triton")(pair, batch)
    assert seen == ["torch", "triton"] and torch.equal(plain, chosen)


def test_bench_train_times_the_kernel_in_distillation_on_cuda_only():
    assert {"fast-triton-kl", "fast-torch-kl", "fast-bf16-activations-triton-kl"} <= set(PATHS)
    for path in ("fast-triton-kl", "fast-torch-kl", "fast-bf16-activations-triton-kl"):
        assert [stage for stage in ("align", "distill", "finetune") if path_measures_stage(path, stage)] == ["distill"]
    settings = TrainBenchSettings(paths=("fast", "fast-triton-kl"), toy=True, device="cpu", steps=1, warmup=0)
    with pytest.raises(ValueError, match="paths fast-triton-kl run the KL's Triton kernel, on CUDA only"):
        run_train_bench(settings)  # before the teacher is built


def test_the_compile_mode_is_a_speed_setting_of_stages_2_and_3_given_to_each_block(monkeypatch):
    mode = "max-autotune-no-cudagraphs"
    plan = make_plan("smoke", 0)
    chosen = check_plan(apply_overrides(make_plan("smoke", 0), [f"distill.compile_mode={mode}",
                                                                f"finetune.compile_mode={mode}"]))
    assert chosen.distill.compile_mode == chosen.finetune.compile_mode == mode
    for stage in ("distill", "finetune"):
        assert settings_hash(getattr(chosen, stage).settings()) == settings_hash(getattr(plan, stage).settings())
    with pytest.raises(ValueError, match="align.compile_mode: the alignment compiles each twin with its loss"):
        check_plan(apply_overrides(make_plan("smoke", 0), [f"align.compile_mode={mode}"]))
    with pytest.raises(ValueError, match="distill.compile_mode must be one of default, max-autotune-no-cudagraphs"):
        check_plan(apply_overrides(make_plan("smoke", 0), ["distill.compile_mode=reduce-overhead"]))
    fast = resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                             device=torch.device("cuda"), compile_mode=mode)
    assert fast.compile_mode == mode and f"mode {mode}" in fast.describe()
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                          device=torch.device("cuda"), compile_mode="max-autotune")

    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: calls.append(kwargs))
    assert compile_blocks([torch.nn.Linear(2, 2)] * 2, mode=mode) == 2 and calls == [{"mode": mode}] * 2
    calls.clear()
    compile_blocks([torch.nn.Linear(2, 2)])
    assert calls == [{}]  # the default mode: torch.compile's own default, as before
    for path in ("fast-max-autotune",):
        assert [stage for stage in ("align", "distill", "finetune") if path_measures_stage(path, stage)] == \
            ["distill", "finetune"]
    assert path_measures_stage("fast-bf16-activations-triton-kl-max-autotune", "distill")
    assert not path_measures_stage("fast-bf16-activations-triton-kl-max-autotune", "finetune")


def test_fused_projections_are_a_speed_setting_of_stages_2_and_3():
    from hyla.train.fast import FUSED_PROJECTIONS_BY_DEFAULT

    plan = make_plan("smoke", 0)
    assert plan.distill.fused_projections is None and plan.finetune.fused_projections is None
    chosen = check_plan(apply_overrides(make_plan("smoke", 0), ["distill.fused_projections=true",
                                                                "finetune.fused_projections=false"]))
    assert chosen.distill.fused_projections is True and chosen.finetune.fused_projections is False
    for stage in ("distill", "finetune"):  # float rounding only: a run resumed either way keeps its stage
        assert settings_hash(getattr(chosen, stage).settings()) == settings_hash(getattr(plan, stage).settings())
    with pytest.raises(ValueError, match="align.fused_projections: the alignment trains single mixers"):
        check_plan(apply_overrides(make_plan("smoke", 0), ["align.fused_projections=true"]))

    def resolve(device, **kwargs):
        return resolve_fast_path(compile=kwargs.pop("compile", None), fused_loss=None, fused_optimizer=None,
                                 micro_batch_size=None, device=torch.device(device), **kwargs)

    assert not resolve("cuda").fused_projections  # stage 1, and callers that do not ask
    assert resolve("cuda", fused_projections=None).fused_projections == FUSED_PROJECTIONS_BY_DEFAULT
    assert not resolve("cpu", fused_projections=None).fused_projections  # nothing compiled on CPU
    on = resolve("cpu", fused_projections=True)
    assert on.fused_projections and "fused input projections" in on.describe() and on.as_dict()["fused_projections"]
    for path in ("fast-fused-projections", "fast-bf16-activations-fused-projections"):
        assert path in PATHS
        assert [stage for stage in ("align", "distill", "finetune") if path_measures_stage(path, stage)] == \
            ["distill", "finetune"]


def test_bench_train_fuses_the_projections_of_the_hybrid_and_its_teacher(monkeypatch):
    """The path's student and teacher run with fused maps (every Attention, Lightning and MLP module switched), and
    on CPU (float32, no autocast) its first loss is that of the same path unfused (whole blocks, the bf16 teacher) up
    to the sums' order."""
    import hyla.models.modeling as modeling

    switched = []
    real = modeling.use_fused_projections

    def spy(model, enabled=True):
        switched.append((type(model).__name__, enabled))
        return real(model, enabled)

    monkeypatch.setattr(modeling, "use_fused_projections", spy)
    unfused = "fast-whole-blocks-bf16-teacher"
    settings = TrainBenchSettings(paths=(unfused, "fast-fused-projections"), toy=True, device="cpu", steps=2,
                                  warmup=0, profile=False, losses=False, cases=(Case.parse("distill:2x64"),))
    results = run_train_bench(settings)
    cases = {case["path"]: case for case in results["cases"]}
    assert cases["fast-fused-projections"]["fused_projections"] and not cases[unfused]["fused_projections"]
    assert ("HypeNetForCausalLM", True) in switched
    assert switched.count(("HypeNetForCausalLM", True)) == 2  # the student and the teacher-equivalent HypeNet
    first = [cases[path]["losses"][0] for path in (unfused, "fast-fused-projections")]
    assert first[1] == pytest.approx(first[0], rel=1e-5)


def test_cuda_graphs_are_a_speed_setting_of_stage_1_on_cuda():
    from hyla.train.fast import CUDA_GRAPHS_BY_DEFAULT

    plan = make_plan("smoke", 0)
    assert plan.align.cuda_graphs is None
    chosen = check_plan(apply_overrides(make_plan("smoke", 0), ["align.cuda_graphs=true"]))
    assert chosen.align.cuda_graphs is True
    # speed only: a run resumed either way keeps its stage
    assert settings_hash(chosen.align.settings()) == settings_hash(plan.align.settings())
    for stage in ("attn_align", "distill", "finetune"):
        with pytest.raises(ValueError, match=f"{stage}.cuda_graphs: CUDA graphs replay stage 1's twins"):
            check_plan(apply_overrides(make_plan("smoke", 0), [f"{stage}.cuda_graphs=true"]))
    with pytest.raises(ValueError, match="which align.batched_twins=true replaces"):
        check_plan(apply_overrides(make_plan("smoke", 0), ["align.cuda_graphs=true", "align.batched_twins=true"]))

    def resolve(device, **kwargs):
        return resolve_fast_path(compile=kwargs.pop("compile", None), fused_loss=None, fused_optimizer=None,
                                 micro_batch_size=None, device=torch.device(device), **kwargs)

    assert not resolve("cuda").cuda_graphs  # the other stages, and callers that do not ask
    assert resolve("cuda", cuda_graphs=None).cuda_graphs == CUDA_GRAPHS_BY_DEFAULT
    assert not resolve("cpu", cuda_graphs=None).cuda_graphs
    assert not resolve("cuda", cuda_graphs=None, whole_blocks=False).cuda_graphs
    on = resolve("cuda", cuda_graphs=True)
    assert on.cuda_graphs and "under CUDA graphs" in on.describe() and on.as_dict()["cuda_graphs"]
    with pytest.raises(ValueError, match="cuda_graphs=true runs on CUDA, and this device is cpu"):
        resolve("cpu", compile=True, cuda_graphs=True)
    with pytest.raises(ValueError, match="compile or whole_blocks is off here"):
        resolve("cuda", compile=False, cuda_graphs=True)
    with pytest.raises(ValueError, match="compile or whole_blocks is off here"):
        resolve("cuda", whole_blocks=False, cuda_graphs=True)


def test_the_alignment_replays_its_compiled_twins_on_one_process_only():
    from transformers import LlamaConfig, LlamaForCausalLM

    from hyla.convert.align import AlignmentTwins, compiled_twin_error
    from hyla.convert.align_batched import choose_alignment_path
    from hyla.models.transfer import to_hypenet

    hf_teacher = LlamaForCausalLM(LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2))
    teacher = to_hypenet(hf_teacher, attention_rope=True).eval()
    twins = AlignmentTwins.for_training(teacher, hf_teacher, None, torch.device("cpu"))
    graphs = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True, cuda_graphs=True)
    assert graphs.cuda_graphs and graphs.whole_twins and not graphs.compile_twins
    assert "replayed as CUDA graphs" in graphs.describe() and graphs.as_dict()["cuda_graphs"]
    assert graphs.loss_fn.keywords == {"error": compiled_twin_error(True), "cuda_graphs": True}
    plain = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True)
    assert not plain.cuda_graphs and plain.loss_fn.keywords["error"] is compiled_twin_error(False)
    assert compiled_twin_error(True) is not compiled_twin_error(False)
    ddp = choose_alignment_path(twins, compile=True, batched=False, whole_twins=True, cuda_graphs=True,
                                data_parallel_mode="ddp")
    assert ddp.whole_twins and not ddp.cuda_graphs and "no CUDA graphs under ddp" in ddp.describe()
    assert ddp.loss_fn.keywords["error"] is compiled_twin_error(False)


def test_bench_train_replays_the_twins_in_alignment_on_cuda_only():
    assert "fast-cuda-graphs" in PATHS
    assert [stage for stage in ("align", "distill", "finetune") if path_measures_stage("fast-cuda-graphs", stage)] \
        == ["align"]
    settings = TrainBenchSettings(paths=("fast", "fast-cuda-graphs"), toy=True, device="cpu", steps=1, warmup=0)
    with pytest.raises(ValueError, match="paths fast-cuda-graphs run CUDA graphs, on CUDA only"):
        run_train_bench(settings)  # before the teacher is built
