"""The fla paths of GLA, GDN, SWLA and sliding-window attention against the pure-torch references on CUDA:
output, final state and every gradient, on odd lengths and packed sequences."""

import os

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.attention import softmax_attention, softmax_attention_reference
from hyla.ops.dispatch import use_backend
from hyla.ops.gdn import gdn_attention
from hyla.ops.gla import gla_attention
from hyla.ops.lightning import lightning_attention, lightning_log_decay
from hyla.ops.swla import sliding_window_linear_attention

pytestmark = pytest.mark.gpu

# fp32 inputs: fla's chunk kernels run their matmuls in TF32 on Hopper (~1.5e-3 relative, docs/method.md,
# "Kernel notes").
# bf16 inputs: bf16 rounding of q, k, v and of the kernels' intermediate products.
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 1e-2}
# The gate gradients (GLA's dg, GDN's dg and dbeta) are reverse cumulative sums of differences of products, where
# cancellation amplifies the same rounding: twice the bound above, written down before the first GPU run.
GATE_TOLERANCE = {torch.float32: 4e-3, torch.bfloat16: 2e-2}
HEADS, DIM = 4, 64
# Odd lengths; 1 and 23 are shorter than fla's chunk of 64, which hyla pads GLA's calls to (at 23 fla's own choice,
# chunk 32, faulted in float32 on the H200: docs/method.md, "Kernel notes").
LENGTHS = [1, 23, 63, 65, 300]
# Packed sequences (cu_seqlens): 273 tokens in four, and 23 in three (padded for GLA, the last sequence taking it).
PACKED = [[0, 7, 72, 272, 273], [0, 5, 6, 23]]


def rel(a, b):
    """Relative L2 error; where the reference is exactly zero (the gate gradient at t = 1 without an initial state,
    which multiplies a zero state), the root-mean-square of the difference instead."""
    difference, reference = (a.double() - b.double()).norm(), b.double().norm()
    if reference == 0:
        return (difference / a.numel() ** 0.5).item()
    return (difference / reference).item()


def gla_inputs(batch, length, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, length, HEADS, DIM)
    q, k, v = (torch.randn(*shape, device="cuda", generator=gen).to(dtype) for _ in range(3))
    # fla's GLA gate: logsigmoid(.) / 16
    g = F.logsigmoid(torch.randn(*shape, device="cuda", generator=gen)) / 16
    return dict(q=q, k=k, v=v, g=g), ("g",)


def gdn_inputs(batch, length, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, length, HEADS, DIM)
    q, k = (F.normalize(torch.randn(*shape, device="cuda", generator=gen), dim=-1).to(dtype) for _ in range(2))
    v = torch.randn(*shape, device="cuda", generator=gen).to(dtype)
    g = -F.softplus(torch.randn(batch, length, HEADS, device="cuda", generator=gen)) * 0.2
    beta = torch.rand(batch, length, HEADS, device="cuda", generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta), ("g", "beta")


OPS = {"gla": (gla_attention, gla_inputs), "gdn": (gdn_attention, gdn_inputs)}


def run_with_grads(op, inputs, state, cu_seqlens, backend):
    leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
    init = None if state is None else state.detach().clone().requires_grad_()
    with use_backend(backend):
        rest = {n: x for n, x in leaves.items() if n not in ("q", "k", "v")}
        out, final = op(leaves["q"], leaves["k"], leaves["v"], **rest, initial_state=init, output_final_state=True,
                        cu_seqlens=cu_seqlens)
    weights = torch.randn(out.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(9))
    ((out.float() * weights).sum() + final.sum()).backward()
    grads = {f"d{n}": x.grad for n, x in leaves.items()}
    if init is not None:
        grads["dh0"] = init.grad
    return out, final, grads


def compare(name, inputs, gate_names, state, cu_seqlens, dtype, skip=()):
    if name == "gdn":
        from hyla.ops.gdn.gpu import fla_backward_blocker

        if fla_backward_blocker():
            # hyla then differentiates its own chunked form: comparing it with the reference tests nothing of fla.
            pytest.skip(fla_backward_blocker())
    op = OPS[name][0]
    ref = run_with_grads(op, inputs, state, cu_seqlens, "torch")
    fast = run_with_grads(op, inputs, state, cu_seqlens, "fla")
    assert torch.isfinite(fast[0]).all() and torch.isfinite(fast[1]).all()
    assert rel(fast[0], ref[0]) <= TOLERANCE[dtype], "output"
    assert rel(fast[1], ref[1]) <= TOLERANCE[dtype], "final state"
    for grad_name, g_ref in ref[2].items():
        if grad_name in skip:
            continue
        gate = grad_name[1:] in gate_names
        tol = (GATE_TOLERANCE if gate else TOLERANCE)[dtype]
        assert rel(fast[2][grad_name], g_ref) <= tol, grad_name


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_state", [False, True])
def test_fla_matches_reference(name, dtype, length, with_state):
    inputs, gate_names = OPS[name][1](2, length, dtype, seed=length)
    state = torch.randn(2, HEADS, DIM, DIM, device="cuda") * 0.1 if with_state else None
    compare(name, inputs, gate_names, state, None, dtype)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_state", [False, True])
def test_fla_forward_matches_reference_without_grad(name, dtype, with_state):
    """The no-grad path (inference, evaluation) on odd lengths and packed sequences: output and final state. It runs
    where fla cannot differentiate GDN (Triton < 3.7.1 on Hopper), so GDN's fla forward is checked there too."""
    op, make_inputs = OPS[name]
    cases = [(2, length, None) for length in LENGTHS]
    cases += [(1, int(cu[-1]), torch.tensor(cu, device="cuda")) for cu in PACKED]
    for batch, length, cu_seqlens in cases:
        inputs, _ = make_inputs(batch, length, dtype, seed=length)
        states = len(cu_seqlens) - 1 if cu_seqlens is not None else batch
        state = torch.randn(states, HEADS, DIM, DIM, device="cuda") * 0.1 if with_state else None
        rest = {n: x for n, x in inputs.items() if n not in ("q", "k", "v")}
        results = {}
        for backend in ("torch", "fla"):
            with use_backend(backend), torch.no_grad():
                results[backend] = op(inputs["q"], inputs["k"], inputs["v"], **rest, initial_state=state,
                                      output_final_state=True, cu_seqlens=cu_seqlens)
        assert torch.isfinite(results["fla"][0]).all() and torch.isfinite(results["fla"][1]).all()
        assert rel(results["fla"][0], results["torch"][0]) <= TOLERANCE[dtype], f"output, length {length}"
        assert rel(results["fla"][1], results["torch"][1]) <= TOLERANCE[dtype], f"final state, length {length}"


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("boundaries", PACKED, ids=lambda cu: f"{len(cu) - 1}-in-{cu[-1]}")
def test_fla_packed_sequences_match_reference(name, dtype, boundaries):
    inputs, gate_names = OPS[name][1](1, boundaries[-1], dtype, seed=1)
    cu = torch.tensor(boundaries, device="cuda")
    state = torch.randn(len(boundaries) - 1, HEADS, DIM, DIM, device="cuda") * 0.1
    compare(name, inputs, gate_names, state, cu, dtype)


@pytest.mark.parametrize("name", OPS)
def test_single_token_decode_matches(name):
    inputs, _ = OPS[name][1](3, 1, torch.bfloat16, seed=3)
    state = torch.randn(3, HEADS, DIM, DIM, device="cuda") * 0.1
    op = OPS[name][0]
    rest = {n: x for n, x in inputs.items() if n not in ("q", "k", "v")}
    with torch.no_grad():
        results = {}
        for backend in ("torch", "fla"):
            with use_backend(backend):
                results[backend] = op(inputs["q"], inputs["k"], inputs["v"], **rest, initial_state=state,
                                      output_final_state=True)
    assert rel(results["fla"][0], results["torch"][0]) <= 1e-2
    assert rel(results["fla"][1], results["torch"][1]) <= 1e-2


@pytest.mark.parametrize("name", ["lightning", "gla", "gdn"])
def test_swla_on_packed_windows_matches_reference(name):
    """SWLA on GPU runs the chunk kernels over all windows packed with cu_seqlens; fp32 inputs (TF32 bound)."""
    if name == "lightning":
        inputs, _ = gla_inputs(2, 777, torch.float32, seed=5)
        inputs.pop("g")
        op, constants = lightning_attention, dict(log_decay=lightning_log_decay(HEADS).cuda())
    else:
        inputs, _ = OPS[name][1](2, 777, torch.float32, seed=5)
        op, constants = OPS[name][0], {}
    rest = {n: x for n, x in inputs.items() if n not in ("q", "k", "v")}
    results = {}
    for backend in ("torch", "fla"):
        with use_backend(backend), torch.no_grad():
            results[backend], _ = sliding_window_linear_attention(
                op, inputs["q"], inputs["k"], inputs["v"], window=256, stride=64, token_inputs=rest, **constants
            )
    assert rel(results["fla"], results["torch"]) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("length", [100, 333])
@pytest.mark.parametrize("window", [64, 128])
def test_sliding_window_attention_fla_matches_reference(length, window):
    gen = torch.Generator(device="cuda").manual_seed(length)
    q = torch.randn(2, length, 8, DIM, device="cuda", generator=gen).bfloat16().requires_grad_()
    k, v = (torch.randn(2, length, 2, DIM, device="cuda", generator=gen).bfloat16().requires_grad_() for _ in range(2))
    with use_backend("fla"):
        fast = softmax_attention(q, k, v, window=window)
    ref = softmax_attention_reference(*(t.double() for t in (q, k, v)), window=window)
    assert rel(fast, ref) <= TOLERANCE[torch.bfloat16]
    weights = torch.randn(fast.shape, device="cuda", generator=gen)
    fast_grads = torch.autograd.grad((fast.float() * weights).sum(), (q, k, v))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = softmax_attention_reference(*leaves, window=window)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), leaves)
    for name, a, b in zip(("dq", "dk", "dv"), fast_grads, ref_grads):
        assert rel(a, b) <= 2 * TOLERANCE[torch.bfloat16], name  # bf16 gradients: two rounded products deep


def strong_gate_inputs(name, length):
    inputs, gate_names = OPS[name][1](2, length, torch.float32, seed=7)
    inputs["g"] = inputs["g"] * 0 - 5.0 + torch.rand_like(inputs["g"])
    return inputs, gate_names, torch.randn(2, HEADS, DIM, DIM, device="cuda") * 0.1


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("length", [65, 100])
def test_strong_gates_stay_finite(name, length):
    """The hazard of docs/method.md, "Kernel notes" (NaN final states of chunk kernels for |log-decay| > ~1.41 on
    lengths not a multiple of 64), checked for the data-dependent gates with log-gates around -5 per token: finite, and
    every output, state and gradient at the usual tolerance, except GDN's gate gradient (the next test)."""
    inputs, gate_names, state = strong_gate_inputs(name, length)
    compare(name, inputs, gate_names, state, None, torch.float32, skip=("dg",) if name == "gdn" else ())


# GDN's gate gradient under strong gates, measured 2026-11-30 on the H200 (Triton 3.7.1, fla 0.6.0): 4.5e-2 (T=65)
# and 4.4e-2 (T=100) relative, against 4e-3. Reproduced without a GPU (tests/ops/test_fla_interpreter.py runs
# tests/ops/fla_interpreter_check.py --strong-gates --dim 64 --heads 4): fla's kernels in full fp32 give 1.0e-5 /
# 6.1e-5, the same kernels with their fp32 dots rounded to TF32 (as Hopper's tensor cores do) 2.7e-2 / 6.2e-2, while
# every other output and gradient stays <= 4.3e-4. The
# error is fla's TF32 arithmetic, amplified by cancellation in dg when decays are ~e^-5 per token; not a bound this
# test may relax, so the case stays here, expected to fail, until fla computes it differently. With Triton's fp32 dots
# in IEEE precision (TRITON_F32_DEFAULT=ieee, set before the process starts) the interpreter gives 1.1e-5 under the
# same TF32 emulation, and the test must pass: `TRITON_F32_DEFAULT=ieee python -m pytest -m gpu
# "tests/ops/test_gla_gdn_swa_gpu.py::test_gdn_gate_gradient_under_strong_gates"`.
@pytest.mark.xfail(os.environ.get("TRITON_F32_DEFAULT") != "ieee", strict=True,
                   reason="fla's GDN dg from TF32 dots: 3-6% relative error under log-gates <= -4")
@pytest.mark.parametrize("length", [65, 100])
def test_gdn_gate_gradient_under_strong_gates(length):
    inputs, _, state = strong_gate_inputs("gdn", length)
    from hyla.ops.gdn.gpu import fla_backward_blocker

    if fla_backward_blocker():
        pytest.skip(fla_backward_blocker())
    ref = run_with_grads(gdn_attention, inputs, state, None, "torch")
    fast = run_with_grads(gdn_attention, inputs, state, None, "fla")
    assert torch.isfinite(fast[2]["dg"]).all()
    assert rel(fast[2]["dg"], ref[2]["dg"]) <= GATE_TOLERANCE[torch.float32]
