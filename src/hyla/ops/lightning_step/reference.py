"""One Lightning decode step for one sequence, from the fused q/k/v(/z) projection to the output gate, as one
operation (the reference of `hyla.ops.lightning_step.gpu`, which runs it as one Triton kernel):

    q, k = RMSNorm_q(q), RMSNorm_k(k) (per head, if the layer has them); RoPE on both (if it has it)
    S = gamma S + k^T v;  o = scale q S            (state S [H, D, D] in float32, updated in place)
    u = o * sigmoid(z) (z: the output gate, if the layer has one);  partials = sums of o^2 by head and block of D

The layer's output RMSNorm over all heads is left to the next product (`hyla.ops.matvec`, SCALED prologue):
its scalar factor rsqrt(mean(o^2) + eps) comes from `partials`, its weight is folded into o_proj. Importing this
module does not import triton.
"""

from __future__ import annotations

import torch


def lightning_step_reference(y: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                             q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None,
                             state: torch.Tensor, decay: torch.Tensor, *, scale: float, eps: float,
                             has_gate: bool, block_v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y: [1, 1, P * H * D], the fused projection's output (P = 4 with a gate, 3 without); cos, sin: RoPE at the
    position ([..., D]) or None; state: [1, H, D, D] (updated in place, in its dtype); decay: [H].
    Returns (u [1, 1, H * D] float32, partials [H * D // block_v] float32). Computed in float64 (the kernel
    returns u in y's dtype)."""
    _, heads, dim, _ = state.shape
    width = heads * dim
    parts = y.double().reshape(-1)
    q, k, v = (parts[i * width:(i + 1) * width].view(heads, dim) for i in range(3))

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()

    if q_norm_weight is not None:
        q, k = norm(q, q_norm_weight), norm(k, k_norm_weight)
    if cos is not None:
        c, s = cos.double().reshape(dim), sin.double().reshape(dim)

        def rope(x):
            x1, x2 = x[:, : dim // 2], x[:, dim // 2:]
            return x * c + torch.cat([-x2, x1], -1) * s

        q, k = rope(q), rope(k)
    updated = state[0].double() * decay.double().view(heads, 1, 1) + k[:, :, None] * v[:, None, :]
    state[0].copy_(updated.to(state.dtype))
    o = torch.einsum("hk,hkv->hv", q, updated) * scale
    partials = o.pow(2).view(heads, dim // block_v, block_v).sum(-1).reshape(-1)
    if has_gate:
        o = o * torch.sigmoid(parts[3 * width:4 * width].view(heads, dim))
    return o.reshape(1, 1, width).float(), partials.float()
