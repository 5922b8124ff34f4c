"""`lightning_step_reference` (hyla.ops.lightning_step.reference) as one Triton kernel: one program per head and block
of `block_v` value columns; each reads its head's q and k (norms and RoPE computed on the way), its [D, block_v]
slice of the float32 state, updates and writes it back, and reads out its part of o. Batch 1. Imported only on CUDA
(or under Triton's interpreter)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyla.ops.lightning_step import BLOCK_V as DEFAULT_BLOCK_V
from hyla.ops.lightning_step import NUM_WARPS as DEFAULT_NUM_WARPS


@triton.jit
def _lightning_step_kernel(
    y_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, state_ptr, decay_ptr, u_ptr, p_ptr, scale, eps,
    H: tl.constexpr, D: tl.constexpr, BLOCK_V: tl.constexpr, HAS_QK_NORM: tl.constexpr, HAS_ROPE: tl.constexpr,
    HAS_GATE: tl.constexpr, PDL: tl.constexpr, STATE_READY: tl.constexpr,
):
    head = tl.program_id(0)
    block = tl.program_id(1)
    HALF: tl.constexpr = D // 2
    W: tl.constexpr = H * D
    i = tl.arange(0, HALF)
    if PDL:  # programmatic dependent launch: the next kernel may start; read the layer's constants, then wait
        tl.extra.cuda.gdc_launch_dependents()
    gamma = tl.load(decay_ptr + head).to(tl.float32)
    if HAS_QK_NORM:
        qw1 = tl.load(qw_ptr + i).to(tl.float32)
        qw2 = tl.load(qw_ptr + HALF + i).to(tl.float32)
        kw1 = tl.load(kw_ptr + i).to(tl.float32)
        kw2 = tl.load(kw_ptr + HALF + i).to(tl.float32)
    cols = block * BLOCK_V + tl.arange(0, BLOCK_V)
    top = state_ptr + head * D * D + i[:, None] * D + cols[None, :]
    bottom = top + HALF * D
    if STATE_READY:  # the caller vouches that no kernel it may overlap writes the state (lightning_step_triton)
        old_top = tl.load(top)
        old_bottom = tl.load(bottom)
    if PDL:
        tl.extra.cuda.gdc_wait()
    if not STATE_READY:
        old_top = tl.load(top)
        old_bottom = tl.load(bottom)
    q1 = tl.load(y_ptr + head * D + i).to(tl.float32)
    q2 = tl.load(y_ptr + head * D + HALF + i).to(tl.float32)
    k1 = tl.load(y_ptr + W + head * D + i).to(tl.float32)
    k2 = tl.load(y_ptr + W + head * D + HALF + i).to(tl.float32)
    if HAS_QK_NORM:
        rq = tl.rsqrt((tl.sum(q1 * q1, axis=0) + tl.sum(q2 * q2, axis=0)) / D + eps)
        rk = tl.rsqrt((tl.sum(k1 * k1, axis=0) + tl.sum(k2 * k2, axis=0)) / D + eps)
        q1 = q1 * rq * qw1
        q2 = q2 * rq * qw2
        k1 = k1 * rk * kw1
        k2 = k2 * rk * kw2
    if HAS_ROPE:
        c1 = tl.load(cos_ptr + i).to(tl.float32)
        c2 = tl.load(cos_ptr + HALF + i).to(tl.float32)
        s1 = tl.load(sin_ptr + i).to(tl.float32)
        s2 = tl.load(sin_ptr + HALF + i).to(tl.float32)
        q1, q2 = q1 * c1 - q2 * s1, q2 * c2 + q1 * s2
        k1, k2 = k1 * c1 - k2 * s1, k2 * c2 + k1 * s2
    v = tl.load(y_ptr + 2 * W + head * D + cols).to(tl.float32)
    s_top = old_top.to(tl.float32) * gamma + k1[:, None] * v[None, :]
    s_bottom = old_bottom.to(tl.float32) * gamma + k2[:, None] * v[None, :]
    tl.store(top, s_top.to(state_ptr.dtype.element_ty))
    tl.store(bottom, s_bottom.to(state_ptr.dtype.element_ty))
    o = (tl.sum(q1[:, None] * s_top, axis=0) + tl.sum(q2[:, None] * s_bottom, axis=0)) * scale
    tl.store(p_ptr + head * (D // BLOCK_V) + block, tl.sum(o * o, axis=0))
    if HAS_GATE:
        z = tl.load(y_ptr + 3 * W + head * D + cols).to(tl.float32)
        o = o * tl.sigmoid(z)
    tl.store(u_ptr + head * D + cols, o.to(u_ptr.dtype.element_ty))


def _launch(launcher, y, cos, sin, q_norm_weight, k_norm_weight, state, decay, scale, eps, has_gate, block_v,
            num_warps, pdl=False, state_ready=False):
    _, heads, dim, _ = state.shape
    u = torch.empty(1, 1, heads * dim, device=y.device, dtype=y.dtype)
    partials = torch.empty(heads * dim // block_v, device=y.device, dtype=torch.float32)
    launcher[(heads, dim // block_v)](
        y, cos if cos is not None else y, sin if sin is not None else y,
        q_norm_weight if q_norm_weight is not None else y, k_norm_weight if k_norm_weight is not None else y,
        state, decay, u, partials, scale, eps,
        H=heads, D=dim, BLOCK_V=block_v, HAS_QK_NORM=q_norm_weight is not None, HAS_ROPE=cos is not None,
        HAS_GATE=has_gate, PDL=pdl, STATE_READY=pdl and state_ready, num_warps=num_warps,
        **({"launch_pdl": True} if pdl else {}),
    )
    return u, partials


def check_inputs(y, state, decay, has_gate: bool, block_v: int) -> None:
    batch, heads, dim, dim_v = state.shape
    if batch != 1 or dim != dim_v or dim % 2 or dim % block_v or not state.is_contiguous():
        raise ValueError(f"the Lightning step kernel takes one sequence's contiguous state [1, H, D, D] with D even "
                         f"and a multiple of {block_v}; got {tuple(state.shape)}")
    if y.numel() != (4 if has_gate else 3) * heads * dim or not y.is_contiguous() or decay.numel() != heads:
        raise ValueError(f"the Lightning step kernel takes y [1, 1, {'4' if has_gate else '3'} * H * D] and decay "
                         f"[H]; got {tuple(y.shape)}, {tuple(decay.shape)}")


def lightning_step_triton(y, cos, sin, q_norm_weight, k_norm_weight, state, decay, *, scale: float, eps: float,
                          has_gate: bool, block_v: int = DEFAULT_BLOCK_V, num_warps: int = DEFAULT_NUM_WARPS,
                          pdl: bool = False, state_ready: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `hyla.ops.lightning_step.reference.lightning_step_reference` (u, partials; state in place),
    u in y's dtype. pdl: programmatic dependent launch (`hyla.ops.matvec.gpu.pdl_supported`): the kernel
    may start before the previous one ends and waits for it before reading y. state_ready (with pdl): the state
    was last written before the stream's last launch without programmatic dependent launch (which waits for all
    earlier work; in the engine, each decode step's embedding), so it is read before that wait too."""
    check_inputs(y, state, decay, has_gate, block_v)
    return _launch(_lightning_step_kernel, y, cos, sin, q_norm_weight, k_norm_weight, state, decay, scale, eps,
                   has_gate, block_v, num_warps, pdl, state_ready)
