"""Stage-1 initialisation at the teacher's output scale: the linear twins' output-norm weights (Lightning, GLA, GDN)
set from a few calibration batches before alignment starts.

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

GLA and GDN normalise each head on its own, with one weight of head_dim shared by the heads: there w is that weight
tiled over the heads (channel h·d + i takes w_i), and both rules sum their statistics over the heads (`fold_heads`).

Lightning's sigmoid gate is left as built (random, ~0.5 ± 0.03 on SmolLM2): its mean is part of b, so the scale
absorbs it. GLA's and GDN's gate, swish(x W_g), has no bias: built random and small it is ~0 ± noise, which no
scale absorbs (a one-off measurement on SmolLM2-135M, 4 × 2 × 256 tokens of argparse.py, median over layers after
`lstsq`: 0.96 of the teacher's output energy missed, against 0.78 for Lightning). Their mixer inputs x share a strong
common direction, the mean m over the calibration tokens (x·m/|m|² = 1 ± 0.1 in most SmolLM2 layers, ± 0.5 in layer
0), so `rms` and `lstsq` first set every row of W_g to c m/|m|² (c = SWISH_GATE_LEVEL): the gate is then ≈ swish(c)
on every token and channel, nearly constant, and the scale absorbs it (same measurement: 0.80 for GLA and GDN, as
with a gate held at exactly 1; docs/convert.md, "RNN mixer", has the numbers of a command to rerun). Every statistic
accumulates in float64 over all calibration tokens, and the relative errors before and after follow from the same
sums, exactly; twins with a swish gate take a second pass after it opens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

TWIN_INITS = ("none", "rms", "lstsq")
# Relative to the mean diagonal of the normal equations: enough to keep a channel the twin never uses finite.
RIDGE = 1e-4
# The pre-activation a swish output gate opens to along the mean input direction: swish is ~linear and positive
# there (swish(4) = 3.93, slope 1.05), so the gate follows x·m/|m|² without changing sign; the scale absorbs its level.
SWISH_GATE_LEVEL = 4.0


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
    input_sum: torch.Tensor  # Σ x, the mixer's input (the normed hidden states), [hidden]
    input_square: float  # Σ ‖x‖²

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
    from hyla.convert.align import record_mixers

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
            recorder, context = record_mixers(teacher, batch["input_ids"].to(device))
            for i, twin in enumerate(twins.twins):
                twin(recorder.inputs[i].to(twin.q_proj.weight.dtype), context)
                _accumulate(stats.setdefault(i, {}), teacher_inputs[i], twin_inputs[i], recorder.outputs[i],
                            twin.o_proj.weight, recorder.inputs[i])
    finally:
        for hook in hooks:
            hook.remove()
        for twin, weight in zip(twins.twins, saved):
            twin.o_norm.weight.copy_(weight)
    return {i: OutputStats(**sums) for i, sums in stats.items()}


def _accumulate(sums: dict, teacher_in: torch.Tensor, twin_in: torch.Tensor, output: torch.Tensor,
                o_weight: torch.Tensor, mixer_in: torch.Tensor) -> None:
    a = teacher_in.reshape(-1, teacher_in.shape[-1]).double()
    b = twin_in.reshape(-1, twin_in.shape[-1]).double()
    x = mixer_in.reshape(-1, mixer_in.shape[-1]).double()
    a_metric = a @ (o_weight.double().T @ o_weight.double())
    update = {"count": a.shape[0], "b_outer": b.T @ b, "a_square": (a * a).sum(0),
              "b_a_metric": (b * a_metric).sum(0), "a_metric_a": float((a_metric * a).sum()),
              "output_energy": float(output.double().pow(2).sum()), "input_sum": x.sum(0),
              "input_square": float(x.pow(2).sum())}
    for key, value in update.items():
        sums[key] = sums[key] + value if key in sums else value
    sums["hidden_size"] = output.shape[-1]


def fold_heads(values: torch.Tensor, num_tiles: int) -> torch.Tensor:
    """Sums over the tiles of an o_norm weight shared by `num_tiles` heads: [C] -> [C / n], [C, C] -> [C / n, C / n]
    (the normal equations of w tiled, w_full = P w, are Pᵀ N P w = Pᵀ r)."""
    width = values.shape[0] // num_tiles
    if values.dim() == 1:
        return values.view(num_tiles, width).sum(0)
    return values.view(num_tiles, width, num_tiles, width).sum((0, 2))


def output_scale(stats: OutputStats, metric: torch.Tensor, mode: str, num_tiles: int = 1) -> torch.Tensor | None:
    """The o_norm weight `mode` sets (float64 [C / num_tiles]: `num_tiles` heads share it); None for `none`."""
    if _check_mode(mode) == "none":
        return None
    if mode == "rms":
        twin_square = fold_heads(stats.b_outer.diagonal(), num_tiles)
        teacher_square = fold_heads(stats.a_square, num_tiles)
        # A channel the twin leaves at zero keeps weight 1 (nothing to scale).
        return torch.where(twin_square > 0, (teacher_square / twin_square.clamp(min=1e-300)).sqrt(),
                           torch.ones_like(twin_square))
    normal = fold_heads(stats.b_outer * metric, num_tiles)
    ridge = RIDGE * normal.diagonal().mean().clamp(min=1e-300)
    return torch.linalg.solve(normal + ridge * torch.eye(normal.shape[0], dtype=normal.dtype, device=normal.device),
                              fold_heads(stats.b_a_metric, num_tiles))


def has_swish_gate(twin) -> bool:
    """GLA and GDN twins: output gate swish(x W_g), no bias."""
    from hyla.layers.gdn import GatedDeltaNet
    from hyla.layers.gla import GatedLinearAttention

    return isinstance(twin, (GatedLinearAttention, GatedDeltaNet))


@torch.no_grad()
def open_swish_gates(twins, stats: dict[int, OutputStats]) -> dict[int, float]:
    """Every row of W_g of every twin with a swish gate set to SWISH_GATE_LEVEL · m/|m|², m the mean mixer input of
    `stats`; returns, per such layer, |m|² / E‖x‖² (the mean's share of the input energy: near 1, a gate that is
    nearly constant)."""
    shares = {}
    for i, twin in enumerate(twins.twins):
        if not has_swish_gate(twin):
            continue
        mean = stats[i].input_sum / stats[i].count
        energy = float(mean @ mean)
        weight = twin.g_proj.weight
        weight.copy_((SWISH_GATE_LEVEL * mean / max(energy, 1e-300)).to(weight.dtype).expand_as(weight))
        shares[i] = energy / max(stats[i].input_square / stats[i].count, 1e-300)
    return shares


@torch.no_grad()
def calibrate_twins(twins, batches: Iterable[dict], mode: str) -> dict[str, list[float]]:
    """Set every twin's o_norm weight by `mode` from `batches` (opening swish output gates first, `rms` and `lstsq`
    only); returns, per layer, the teacher's output energy (mean square) and the alignment MSE relative to it at the
    twin as built and after, and with swish gates opened, each such layer's `input_mean_share`."""
    _check_mode(mode)
    batches = list(batches)
    stats = collect_output_stats(twins, batches)
    report = {"energy": [], "relative_error_before": [], "relative_error_after": []}
    metrics, tiles = [], []
    for i, twin in enumerate(twins.twins):
        metrics.append(twin.o_proj.weight.double().T @ twin.o_proj.weight.double())
        # 1 for Lightning's norm over all heads; the number of heads for GLA's and GDN's per-head norm.
        tiles.append(twin.o_proj.in_features // twin.o_norm.weight.numel())
        energy = stats[i].mean_output_energy
        report["energy"].append(energy)
        report["relative_error_before"].append(stats[i].error(twin.o_norm.weight.repeat(tiles[i]), metrics[i]) / energy)
    if mode != "none" and any(has_swish_gate(twin) for twin in twins.twins):
        shares = open_swish_gates(twins, stats)
        report["input_mean_share"] = [shares.get(i) for i in range(len(twins.twins))]
        stats = collect_output_stats(twins, batches)
    for i, twin in enumerate(twins.twins):
        scale = output_scale(stats[i], metrics[i], mode, tiles[i])
        if scale is not None:
            twin.o_norm.weight.copy_(scale.to(twin.o_norm.weight.dtype))
        after = stats[i].error(twin.o_norm.weight.repeat(tiles[i]), metrics[i])
        report["relative_error_after"].append(after / report["energy"][i])
    return report
