"""Stage-1 initialisation at the teacher's output scale: the Lightning twins' output-norm weights set from a few
calibration batches before alignment starts.

A twin built from the teacher's attention weights (`lightning_from_attention`) ends in `o_proj(o_norm(y) · g)`, with the
o_norm weight at 1 and the output gate g ≈ sigmoid(small) ≈ 0.5. The teacher's attention output entering the same
`o_proj` has another scale per channel, so the twin starts far from its target (SmolLM2-135M layer 0: an error 233× the
teacher's output energy, 0.16 after `lstsq`; docs/results/smollm2-135m/twin-init-cpu/) and the first alignment steps go
to shrinking it under gradient clipping. The output is linear in the o_norm weight w (one number per channel), so with b
the twin's gated output at w = 1 and a the teacher's input to `o_proj` (M = W_oᵀ W_o):

- `rms`: w_c = RMS(a_c) / RMS(b_c): the twin's output energy per channel equals the teacher's;
- `lstsq`: the w minimising the alignment MSE itself, E‖(a − b ⊙ w) W_oᵀ‖², i.e.
  (E[b bᵀ] ⊙ M) w = E[b ⊙ (a M)] (a small ridge keeps it defined); where the twin's output correlates poorly with
  the teacher's it starts smaller;
- `none`: w = 1, the transfer as it was.

The gate is left as built (random, ~0.5 ± 0.03 on SmolLM2): its mean is part of b, so the scale absorbs it. Every
statistic accumulates in float64 over all calibration tokens, and the relative errors before and after follow from
the same sums, exactly, with no second pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

TWIN_INITS = ("none", "rms", "lstsq")
# Relative to the mean diagonal of the normal equations: enough to keep a channel the twin never uses finite.
RIDGE = 1e-4


@dataclass
class OutputStats:
    """Sums over the calibration tokens for one layer (a: teacher input to o_proj, b: the twin's at w = 1)."""

    count: int
    b_outer: torch.Tensor  # Σ b bᵀ, [C, C]
    a_square: torch.Tensor  # Σ a ⊙ a, [C]
    b_a_metric: torch.Tensor  # Σ b ⊙ (a M), [C]
    a_metric_a: float  # Σ aᵀ M a  (the teacher's output energy without the o_proj bias)
    output_energy: float  # Σ ‖teacher mixer output‖², bias included
    hidden_size: int

    def error(self, weight: torch.Tensor, metric: torch.Tensor) -> float:
        """Mean squared alignment error per output element at o_norm weight `weight`."""
        weight = weight.double()
        quadratic = weight @ ((self.b_outer * metric) @ weight)
        total = self.a_metric_a - 2 * float(weight @ self.b_a_metric) + float(quadratic)
        return max(total, 0.0) / (self.count * self.hidden_size)

    @property
    def mean_output_energy(self) -> float:
        """The teacher's mixer output, mean square per element."""
        return self.output_energy / (self.count * self.hidden_size)


def _check_mode(mode: str) -> str:
    if mode not in TWIN_INITS:
        raise ValueError(f"unknown twin init {mode!r}; choose one of {', '.join(TWIN_INITS)}")
    return mode


def _input_recorder(modules: dict[int, torch.nn.Module], store: dict[int, torch.Tensor]):
    def hook(index: int):
        return lambda module, args: store.__setitem__(index, args[0].detach())

    return [module.register_forward_pre_hook(hook(index)) for index, module in modules.items()]


@torch.no_grad()
def collect_output_stats(twins, batches: Iterable[dict]) -> dict[int, OutputStats]:
    """Run teacher and twins (`hyla.convert.align.AlignmentTwins`) over `batches`; the sums of `OutputStats`."""
    from hyla.convert.align import MixerRecorder

    teacher = twins.teacher[0]
    stats: dict[int, dict] = {}
    teacher_inputs: dict[int, torch.Tensor] = {}
    twin_inputs: dict[int, torch.Tensor] = {}
    saved = [twin.o_norm.weight.detach().clone() for twin in twins.twins]
    device = saved[0].device
    hooks = _input_recorder({i: block.mixer.o_proj for i, block in enumerate(teacher.model.layers)}, teacher_inputs)
    hooks += _input_recorder({i: twin.o_proj for i, twin in enumerate(twins.twins)}, twin_inputs)
    try:
        for twin in twins.twins:
            twin.o_norm.weight.fill_(1.0)
        for batch in batches:
            recorder = MixerRecorder(teacher)
            try:
                teacher.model(batch["input_ids"].to(device), use_cache=False)
            finally:
                recorder.close()
            context = teacher.model._context(recorder.inputs[0], None, None, None, None)
            for i, twin in enumerate(twins.twins):
                twin(recorder.inputs[i].to(twin.q_proj.weight.dtype), context)
                _accumulate(stats.setdefault(i, {}), teacher_inputs[i], twin_inputs[i], recorder.outputs[i],
                            twin.o_proj.weight)
    finally:
        for hook in hooks:
            hook.remove()
        for twin, weight in zip(twins.twins, saved):
            twin.o_norm.weight.copy_(weight)
    return {i: OutputStats(**sums) for i, sums in stats.items()}


def _accumulate(sums: dict, teacher_in: torch.Tensor, twin_in: torch.Tensor, output: torch.Tensor,
                o_weight: torch.Tensor) -> None:
    a = teacher_in.reshape(-1, teacher_in.shape[-1]).double()
    b = twin_in.reshape(-1, twin_in.shape[-1]).double()
    a_metric = a @ (o_weight.double().T @ o_weight.double())
    update = {"count": a.shape[0], "b_outer": b.T @ b, "a_square": (a * a).sum(0),
              "b_a_metric": (b * a_metric).sum(0), "a_metric_a": float((a_metric * a).sum()),
              "output_energy": float(output.double().pow(2).sum())}
    for key, value in update.items():
        sums[key] = sums[key] + value if key in sums else value
    sums["hidden_size"] = output.shape[-1]


def output_scale(stats: OutputStats, metric: torch.Tensor, mode: str) -> torch.Tensor | None:
    """The o_norm weight `mode` sets (float64 [C]); None for `none`."""
    if _check_mode(mode) == "none":
        return None
    if mode == "rms":
        twin_square = stats.b_outer.diagonal()
        # A channel the twin leaves at zero keeps weight 1 (nothing to scale).
        return torch.where(twin_square > 0, (stats.a_square / twin_square.clamp(min=1e-300)).sqrt(),
                           torch.ones_like(twin_square))
    normal = stats.b_outer * metric
    ridge = RIDGE * normal.diagonal().mean().clamp(min=1e-300)
    return torch.linalg.solve(normal + ridge * torch.eye(normal.shape[0], dtype=normal.dtype, device=normal.device), stats.b_a_metric)


@torch.no_grad()
def calibrate_twins(twins, batches: Iterable[dict], mode: str) -> dict[str, list[float]]:
    """Set every twin's o_norm weight by `mode` from `batches`; returns, per layer, the teacher's output energy
    (mean square) and the alignment MSE relative to it at the weight before and after."""
    _check_mode(mode)
    stats = collect_output_stats(twins, batches)
    report = {"energy": [], "relative_error_before": [], "relative_error_after": []}
    for i, twin in enumerate(twins.twins):
        metric = twin.o_proj.weight.double().T @ twin.o_proj.weight.double()
        before = stats[i].error(twin.o_norm.weight, metric)
        scale = output_scale(stats[i], metric, mode)
        if scale is not None:
            twin.o_norm.weight.copy_(scale.to(twin.o_norm.weight.dtype))
        after = stats[i].error(twin.o_norm.weight, metric)
        energy = stats[i].mean_output_energy
        report["energy"].append(energy)
        report["relative_error_before"].append(before / energy)
        report["relative_error_after"].append(after / energy)
    return report
