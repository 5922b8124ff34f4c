"""One Lightning decode step for one sequence, from the fused q/k/v(/z) projection to the gated output and the
output norm's partial sums (`reference.py`: float64; `gpu.py`: one Triton kernel). This package imports no triton."""

from hyla.ops.lightning_step.reference import lightning_step_reference

# The kernel's default launch: value columns a program (8 programs a head at D = 128) and warps, the fastest of 12
# settings on an H200, 3.66 us a step at HypeNet-2B's shape
# (docs/results/speed/2026-11-30-matvec-and-fused-kernels/fused-settings, `hyla bench sweep fused`). Launched as the
# engine launches it on Hopper (programmatic dependent launch, state read before the wait), 32 columns were faster in
# a later sweep (2.17 against 2.50 us, docs/results/speed/2026-11-30-pdl/headline); not adopted, not measured in the
# engine. A settings file may choose others (hyla.inference.settings).
BLOCK_V = 16
NUM_WARPS = 1

__all__ = ["BLOCK_V", "NUM_WARPS", "lightning_step_reference"]
