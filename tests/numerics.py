"""What the fused ops' tests measure errors against: the rounding of one float32 result to a half-precision dtype
(on the GPU, and under Triton's interpreter, which truncates to bfloat16), and exact forms in float64."""

from __future__ import annotations

import torch

# float32's unit roundoff: one rounding of a float32 result, relative.
FLOAT32_ROUNDING = 2.0**-24
# One rounding to nearest in a dtype is within UNIT_ROUNDING * |value| of the value (8 significant bits in bfloat16,
# 11 in float16), plus half the spacing of the dtype's subnormals for values below its smallest normal.
UNIT_ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SUBNORMAL_HALF_SPACING = {torch.bfloat16: 2.0**-134, torch.float16: 2.0**-25}
# Triton's interpreter truncates float32 to bfloat16 (the GPU rounds to nearest): within one bf16 unit in the last
# place, 2^-7 relative, and one subnormal spacing below the smallest normal. Its float16 conversion is numpy's, to
# nearest: as on the GPU.
INTERPRETER_UNIT_ROUNDING = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-11}
INTERPRETER_SUBNORMAL_ERROR = {torch.bfloat16: 2.0**-133, torch.float16: 2.0**-25}


def rms_norm_float64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float64, written out: x / sqrt(mean(x^2) + eps) * w."""
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
