"""Run hyla's fla wrappers for GLA and GDN (`gla_fla`, `gdn_fla`) through Triton's CPU interpreter and compare output,
final state and every gradient with the pure-torch references (no GPU needed). tests/ops/test_fla_interpreter.py
runs it in a process of its own (the interpreter and the patches below must be in place before fla is imported).

Needs triton, fla and einops importable, e.g.
`pip install --no-deps --target /tmp/tri triton==3.6.0 einops .whl/fla_core-0.6.0-py3-none-any.whl
.whl/flash_linear_attention-0.6.0-py3-none-any.whl`, then:
`TRITON_INTERPRET=1 PYTHONPATH=/tmp/tri:src python tests/ops/fla_interpreter_check.py --lengths 1 3 65`
(or `PYTHONPATH=/tmp/tri python -m pytest tests/ops/test_fla_interpreter.py`).
Each line gives relative errors, or the norm of fla's value where the reference is exactly 0.

Options: `--tf32` rounds the inputs of fp32 dots that ask for TF32 to TF32, as Hopper's tensor cores do (the
interpreter otherwise computes them in full fp32), and gives GDN's triangular solve the TF32 that fla gives it on
GPUs; `--dim 64 --heads 4` for the GPU test's shapes; `--strong-gates` gives GDN the GPU test's strong gates
(log-gates in [-5, -4) per token); `--hopper` makes fla believe it runs on Hopper and shows its refusal of GDN's
backward under Triton < 3.7.1, and hyla's fallback; `--max-error X` exits with status 1 past X.
The interpreter cannot run bfloat16 (numpy has none); `--dtype float16` exercises the 16-bit paths.

Patches, for the interpreter only (compiled kernels are unaffected): scalars are 1-element arrays, which numpy 2
refuses as loop bounds; kernel loop indices are Python ints, where compiled Triton has scalar tensors (`i_t.to(...)`);
autotuning has no benchmarker, so the first config runs.
"""

import argparse
import builtins
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
import triton.language as tl
import triton.runtime.autotuner as autotuner
import triton.runtime.interpreter as interpreter
from triton._C.libtriton import ir

_patch_tensor = interpreter._patch_lang_tensor
_create_dot = interpreter.InterpreterBuilder.create_dot
EMULATE_TF32 = False


def _patch_with_scalar_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


class _LoopIndex(int):
    def to(self, dtype, **kwargs):
        handle = interpreter.TensorHandle(np.array([int(self)], dtype=np.int64), tl.int64)
        return tl.tensor(handle, tl.int64).to(dtype)


def _kernel_range(*args):
    return (_LoopIndex(i) for i in builtins.range(*args))


def _to_tf32(x):
    # round to nearest on the 13 low mantissa bits (cvt.rna.tf32.f32)
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _create_dot_maybe_tf32(self, a, b, d, input_precision, max_num_imprecise_acc):
    if EMULATE_TF32 and input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32:
        a = interpreter.TensorHandle(_to_tf32(a.data), a.dtype)
        b = interpreter.TensorHandle(_to_tf32(b.data), b.dtype)
    return _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


interpreter._patch_lang_tensor = _patch_with_scalar_index
interpreter.InterpreterBuilder.create_dot = _create_dot_maybe_tf32
autotuner.Autotuner.do_bench = lambda self, kernel_call, quantiles: [0.0, 0.0, 0.0]

import fla.ops.gated_delta_rule  # noqa: E402
import fla.ops.gla  # noqa: E402,F401

for _name, _module in list(sys.modules.items()):
    if _name.startswith("fla.ops"):
        _module.range = _kernel_range

from hyla.ops.dispatch import use_backend  # noqa: E402
from hyla.ops.gdn import gdn_attention  # noqa: E402
from hyla.ops.gdn import gpu as gdn_gpu  # noqa: E402
from hyla.ops.gla import gla_attention  # noqa: E402
from hyla.ops.gla.gpu import gla_fla  # noqa: E402


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def make_inputs(name, batch, length, heads, dim, dtype, seed, strong_gates=False):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, heads, dim)
    if name == "gla":
        q, k, v = (torch.randn(*shape, generator=gen).to(dtype) for _ in range(3))
        return dict(q=q, k=k, v=v, g=F.logsigmoid(torch.randn(*shape, generator=gen)) / 16)
    q, k = (F.normalize(torch.randn(*shape, generator=gen), dim=-1).to(dtype) for _ in range(2))
    v = torch.randn(*shape, generator=gen).to(dtype)
    g = -F.softplus(torch.randn(batch, length, heads, generator=gen)) * 0.2
    beta = torch.rand(batch, length, heads, generator=gen)
    if strong_gates:  # as test_strong_gates_stay_finite: log-gates in [-5, -4) per token
        g = g * 0 - 5.0 + torch.rand(g.shape, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def run_with_grads(op, inputs, state):
    """Exactly as tests/ops/test_gla_gdn_swa_gpu.py: loss = <out, weights> + sum(final state)."""
    leaves = {n: x.detach().clone().requires_grad_() for n, x in inputs.items()}
    init = None if state is None else state.detach().clone().requires_grad_()
    rest = {n: x for n, x in leaves.items() if n not in ("q", "k", "v")}
    out, final = op(leaves["q"], leaves["k"], leaves["v"], **rest, initial_state=init, output_final_state=True)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    ((out.float() * weights).sum() + final.sum()).backward()
    grads = {f"d{n}": x.grad for n, x in leaves.items()}
    if init is not None:
        grads["dh0"] = init.grad
    return out, final, grads


def compare(name, fast_op, ref_op, args):
    """Print one line per case; return the errors: relative, or the norm of fla's value where the reference is
    exactly 0 (GLA's and GDN's dg at T = 1 without an initial state: the gate multiplies a zero state)."""
    errors = []
    for length in args.lengths:
        for with_state in (False, True):
            inputs = make_inputs(name, 2, length, args.heads, args.dim, args.dtype, seed=length,
                                 strong_gates=args.strong_gates)
            state = torch.randn(2, args.heads, args.dim, args.dim) * 0.1 if with_state else None
            with use_backend("torch"):
                ref = run_with_grads(ref_op, inputs, state)
                ref_nograd = ref_op(**inputs, initial_state=state, output_final_state=True)
            fast = run_with_grads(fast_op, inputs, state)
            with torch.no_grad():  # T = 1 without grad takes the fused recurrent kernel
                fast_nograd = fast_op(**inputs, initial_state=state, output_final_state=True)
            pairs = {"o": (fast[0], ref[0]), "ht": (fast[1], ref[1])}
            pairs.update({n: (fast[2][n], expected) for n, expected in ref[2].items()})
            pairs.update({"no-grad o": (fast_nograd[0], ref_nograd[0]), "no-grad ht": (fast_nograd[1], ref_nograd[1])})
            parts = []
            for part, (actual, expected) in pairs.items():
                if expected.norm() == 0:
                    errors.append(actual.norm().item())
                    parts.append(f"{part} {errors[-1]:.1e} (norm; reference exactly 0)")
                else:
                    errors.append(rel(actual, expected))
                    parts.append(f"{part} {errors[-1]:.1e}")
            print(f"{name} T={length} h0={with_state}: " + ", ".join(parts), flush=True)
    return errors


def show_hopper_guard(args):
    import fla.ops.common.chunk_o as chunk_o
    import fla.utils

    chunk_o.IS_NVIDIA_HOPPER = fla.utils.IS_NVIDIA_HOPPER = True
    gdn_gpu.fla_backward_blocker.cache_clear()
    inputs = make_inputs("gdn", 1, 3, args.heads, args.dim, args.dtype, seed=0)
    q = inputs.pop("q").requires_grad_()
    out, _ = fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, **inputs)
    try:
        out.sum().backward()
        print("fla as on Hopper: GDN backward ran")
    except RuntimeError as err:
        print(f"fla as on Hopper: GDN backward raised RuntimeError: {err}")
    print(f"hyla's fla_backward_blocker(): {gdn_gpu.fla_backward_blocker()}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compare("gdn", gdn_gpu.gdn_fla, gdn_attention, args)
    print(f"warnings from gdn_fla: {sorted({str(w.message) for w in caught})}")


def main():
    global EMULATE_TF32
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 3, 65])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument("--tf32", action="store_true")
    parser.add_argument("--hopper", action="store_true")
    parser.add_argument("--strong-gates", action="store_true", help="GDN only, log-gates in [-5, -4) per token")
    parser.add_argument("--max-error", type=float, help="exit with status 1 when an error exceeds it")
    args = parser.parse_args()
    args.dtype = getattr(torch, args.dtype)
    EMULATE_TF32 = args.tf32
    if args.tf32:
        # what fla picks where IS_TF32_SUPPORTED (Ampere and later) for GDN's in-chunk triangular solve
        import fla.ops.gated_delta_rule.chunk_fwd as chunk_fwd

        chunk_fwd.SOLVE_TRIL_DOT_PRECISION = tl.constexpr("tf32")
    print(f"triton interpreter, fla {fla.__version__}, B=2 H={args.heads} D={args.dim} {args.dtype}, TF32 dots: "
          f"{args.tf32}, as Hopper: {args.hopper}", flush=True)
    torch.manual_seed(0)
    if args.hopper:
        show_hopper_guard(args)
        return
    errors = compare("gdn", gdn_gpu.gdn_fla, gdn_attention, args)
    if not args.strong_gates:
        errors += compare("gla", gla_fla, gla_attention, args)
    print(f"largest error: {max(errors):.1e}")
    if args.max_error is not None and max(errors) > args.max_error:
        sys.exit(1)


if __name__ == "__main__":
    main()
