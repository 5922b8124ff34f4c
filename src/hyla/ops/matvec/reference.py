"""The float64 reference of hyla's fused matrix-vector kernel (`hyla.ops.matvec.gpu`): what it computes, written
out without its roundings to the weight's dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The kernel's prologues (hyla.ops.matvec.gpu's module docstring).
PLAIN, NORM, SCALED, SIGMOID_GATE = 0, 1, 2, 4
PROLOGUES = (PLAIN, NORM, SCALED, SIGMOID_GATE)


def fused_matvec_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                           prologue: int = PLAIN, x2: torch.Tensor | None = None,
                           norm_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                           eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """x: [..., K] (one row); weight: [N, K]. prologue NORM: rsqrt(mean(x^2) + eps) (x * norm_weight); SCALED:
    rsqrt(sum(partials) / K + eps) x; SIGMOID_GATE: x * sigmoid(x2). glu: rows interleaved (gate, up), returns
    silu(gate) * up [..., N / 2]; residual: added to the product. Float64 result."""
    v = x.double()
    if prologue == NORM:
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
        if norm_weight is not None:
            v = v * norm_weight.double()
    elif prologue == SCALED:
        v = v * torch.rsqrt(partials.double().sum() / x.shape[-1] + eps)
    elif prologue == SIGMOID_GATE:
        v = v * torch.sigmoid(x2.double())
    y = F.linear(v, weight.double(), bias.double() if bias is not None else None)
    if glu:
        gate, up = y[..., 0::2], y[..., 1::2]
        return F.silu(gate) * up
    return y + residual.double().reshape(y.shape) if residual is not None else y
