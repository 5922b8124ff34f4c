"""The training fast path on CUDA against the eager reference: 30 steps of each conversion stage both ways, from
one seed and on the same batches, at SmolLM2-135M's widths (6 layers); and the fast path with the hybrid's
activations in float32, with the KL's torch chunks, and with fused input projections, against the fast path."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.train import SMOLLM2_135M, Case, TrainBenchSettings, measure_case
from hyla.convert.presets import make_plan

pytestmark = pytest.mark.gpu

STEPS = 30
# Both paths run bf16 products under autocast, read the same teacher and hold the same activations (the defaults':
# bf16 on CUDA); they differ in rounding order only (compiled fusions with Lightning's kernel inside as a custom op,
# the chunked head loss, fused AdamW). At the first step (the same weights) that moves the loss by ~1e-3 at most;
# the runs then drift apart as updates compound, by ~1% over 30 steps at these learning rates. A bug (a wrong
# gradient, a missing term, a skipped update) moves the curves by far more.
FIRST_STEP_RTOL = 5e-3
CURVE_RTOL = 3e-2


# `fast-cuda-graphs`: stage 1's compiled twins and the teacher's compiled blocks replayed as CUDA graphs
# (align.cuda_graphs), held to the same reference: the same kernels as `fast`, launched from graphs from the third
# step on (tests/convert/test_align_cuda_graphs_gpu.py compares each replay with `fast` on its own batch).
@pytest.mark.parametrize("case,path", [(Case("align", 8, 512), "fast"), (Case("distill", 4, 1024), "fast"),
                                       (Case("finetune", 2, 2048), "fast"),
                                       (Case("align", 8, 512), "fast-cuda-graphs")],
                         ids=lambda value: value.stage if isinstance(value, Case) else value)
def test_fast_path_follows_the_eager_loss_curve(case, path):
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=6))).cuda().eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    settings = TrainBenchSettings(steps=STEPS, warmup=0, profile=False, losses=False)
    curves = {name: measure_case(case, name, teacher, plan, (1, 4), settings)["losses"] for name in ("eager", path)}
    eager, fast = (torch.tensor(curves[name], dtype=torch.float64) for name in ("eager", path))
    assert torch.isfinite(fast).all() and torch.isfinite(eager).all()
    assert abs(fast[0] - eager[0]) <= FIRST_STEP_RTOL * abs(eager[0])
    assert ((fast - eager).abs() / eager.abs()).max() <= CURVE_RTOL, (curves["eager"], curves[path])
    if case.stage != "finetune":  # random tokens leave a random-weight model's cross-entropy where it is
        assert eager[-1] < eager[0] and fast[-1] < fast[0]  # both learn


@pytest.mark.parametrize("stage", ["align", "distill"])
def test_steps_with_whole_compiled_blocks_follow_those_without(stage):
    """`fast-whole-blocks` (Lightning's kernel as a custom op inside the compiled blocks; in stage 1 each twin
    compiled with its loss) against `fast-split-blocks` (the same with fla's call between compiled pieces), both with
    the float32 teacher: the same kernels and formulas, compiled as one graph per block
    instead of five pieces; the fusions' rounding order differs, so the first steps' losses agree within
    FIRST_STEP_RTOL."""
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=6))).cuda().eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    settings = TrainBenchSettings(steps=3, warmup=0, profile=False, losses=False)
    case = Case("align", 8, 512) if stage == "align" else Case("distill", 4, 1024)
    curves = {path: torch.tensor(measure_case(case, path, teacher, plan, (1, 4), settings)["losses"],
                                 dtype=torch.float64) for path in ("fast-split-blocks", "fast-whole-blocks")}
    plain, with_op = curves["fast-split-blocks"], curves["fast-whole-blocks"]
    assert torch.isfinite(with_op).all()
    assert ((with_op - plain).abs() / plain.abs()).max() <= FIRST_STEP_RTOL, (plain.tolist(), with_op.tolist())


# `fast` (the default on CUDA since 2026-12-06) holds the hybrid's residual stream and norm outputs in bf16 (distill
# and finetune `.bf16_activations`); `fast-fp32-activations` holds them in float32 (the default before): the same
# kernels, one bf16 rounding fewer of each value where those are written, forward and backward. On CPU under bf16
# autocast at these shapes the first-step loss moved by 7e-6 (distill) and 2e-5 (finetune) relative (means over
# 4,096 tokens), far inside FIRST_STEP_RTOL; over 30 steps the updates compound rounding differences as between fast
# and eager, so the curves get the same CURVE_RTOL. Activations that lost a term (a norm's weight, a residual branch)
# or a gradient would move the first step already by far more.
@pytest.mark.parametrize("case", [Case("distill", 4, 1024), Case("finetune", 2, 2048)], ids=lambda case: case.stage)
def test_bf16_activations_follow_the_float32_activations_loss_curve(case):
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=6))).cuda().eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    settings = TrainBenchSettings(steps=STEPS, warmup=0, profile=False, losses=False)
    runs = {path: measure_case(case, path, teacher, plan, (1, 4), settings)
            for path in ("fast-fp32-activations", "fast")}
    assert runs["fast"]["bf16_activations"] and not runs["fast-fp32-activations"]["bf16_activations"]
    fp32, bf16 = (torch.tensor(runs[path]["losses"], dtype=torch.float64) for path in runs)
    assert torch.isfinite(bf16).all()
    assert abs(bf16[0] - fp32[0]) <= FIRST_STEP_RTOL * abs(fp32[0])
    assert ((bf16 - fp32).abs() / fp32.abs()).max() <= CURVE_RTOL, (fp32.tolist(), bf16.tolist())
    if case.stage == "distill":
        assert bf16[-1] < bf16[0]  # it learns


# `fast-triton-kl` (the default on CUDA) and `fast-torch-kl` differ only in the fused KL's chunks: hyla's Triton
# kernel or compiled torch (`distill.kl_kernel`). The same
# float32 formulas, the row's log-sum-exps taken online in one read; on CPU through Triton's interpreter the loss
# and gradients agree with the default's within 1e-5 relative (2^-8 for gradients rounded to bf16 under autocast:
# tests/ops/test_kernels_interpreted.py). So the first step agrees within FIRST_STEP_RTOL, and the curves within
# CURVE_RTOL as updates compound rounding differences; a wrong gradient or a missed term moves them by far more.
def test_the_triton_kl_follows_the_fast_path_loss_curve():
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=6))).cuda().eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    settings = TrainBenchSettings(steps=STEPS, warmup=0, profile=False, losses=False)
    runs = {path: measure_case(Case("distill", 4, 1024), path, teacher, plan, (1, 4), settings)
            for path in ("fast-torch-kl", "fast-triton-kl")}
    assert runs["fast-triton-kl"]["kl_kernel"] == "triton" and runs["fast-torch-kl"]["kl_kernel"] == "torch"
    fast, triton = (torch.tensor(runs[path]["losses"], dtype=torch.float64) for path in runs)
    assert torch.isfinite(triton).all()
    assert abs(triton[0] - fast[0]) <= FIRST_STEP_RTOL * abs(fast[0])
    assert ((triton - fast).abs() / fast.abs()).max() <= CURVE_RTOL, (fast.tolist(), triton.tolist())
    assert triton[-1] < triton[0]  # it learns


# `fast-fused-projections` is `fast` with each mixer's q/k/v/output-gate maps and each MLP's gate/up maps as one
# product, in the hybrid and its teacher (distill and finetune `.fused_projections`): the same sums in another
# kernel's order (cuBLAS's tiling of a wider product; the input's gradient summed inside one product instead of as
# 3-4 bf16 products added). In float64 on CPU the two agree to 1e-10 (tests/layers/test_fused_projections.py); under
# bf16 autocast they differ by rounding as fast and eager do, so the first step agrees within FIRST_STEP_RTOL and the
# curves within CURVE_RTOL. A map's weight in the wrong place or a missing gradient moves them by far more.
@pytest.mark.parametrize("case", [Case("distill", 4, 1024), Case("finetune", 2, 2048)], ids=lambda case: case.stage)
def test_fused_projections_follow_the_fast_path_loss_curve(case):
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=6))).cuda().eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    settings = TrainBenchSettings(steps=STEPS, warmup=0, profile=False, losses=False)
    runs = {path: measure_case(case, path, teacher, plan, (1, 4), settings)
            for path in ("fast-whole-blocks-bf16-teacher", "fast-fused-projections")}
    assert runs["fast-fused-projections"]["fused_projections"]
    assert not runs["fast-whole-blocks-bf16-teacher"]["fused_projections"]
    fast, fused = (torch.tensor(runs[path]["losses"], dtype=torch.float64) for path in runs)
    assert torch.isfinite(fused).all()
    assert abs(fused[0] - fast[0]) <= FIRST_STEP_RTOL * abs(fast[0])
    assert ((fused - fast).abs() / fast.abs()).max() <= CURVE_RTOL, (fast.tolist(), fused.tolist())
    if case.stage == "distill":
        assert fused[-1] < fused[0]  # it learns
