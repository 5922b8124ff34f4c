"""Per-head statistics of Jacobian concentration over a set of sequences: normalized entropy and top-k hit rate.

One forward pass per sequence; inside it each layer's α~ is computed block by block at the sampled query positions
(entropy) and at the answer position only (hit rate), then its q/k are dropped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hyla.analysis.capture import MixerLayer, capture_heads
from hyla.analysis.concentration import (
    HeadInputs,
    concentration,
    concentration_blocks,
    normalized_entropy,
    top_k_hit_rate,
)
from hyla.progress import progress as progress_bar

DEFAULT_TOP_K = 64
DEFAULT_BLOCK_SIZE = 128


@dataclass
class Probe:
    """One sequence to analyse. input_ids: [T]. needle_positions: key positions of the needle's value tokens, read
    at the answer position (the last token) for the hit rate; None for plain text."""

    input_ids: torch.Tensor
    needle_positions: torch.Tensor | None = None
    label: str = ""

    @property
    def length(self) -> int:
        return self.input_ids.shape[-1]


@dataclass
class LayerStatistics:
    """One layer on one probe: entropy [H, Tq] at the sampled positions, and at the answer position entropy [H] and
    hit rate [H] (None when not asked for)."""

    index: int
    layer_type: str
    head_kind: str
    entropy: torch.Tensor | None = None
    answer_entropy: torch.Tensor | None = None
    hit_rate: torch.Tensor | None = None


def sample_query_positions(length: int, num_positions: int) -> torch.Tensor:
    """`num_positions` query positions spread evenly over 1..T−1 (position 0 sees one key); 0 = all of them."""
    if length < 2:
        raise ValueError(f"a sequence needs at least 2 tokens for entropy, got {length}")
    if num_positions < 0:
        raise ValueError(f"num_positions must be >= 0, got {num_positions}")
    if num_positions == 0 or num_positions >= length - 1:
        return torch.arange(1, length)
    return torch.linspace(1, length - 1, num_positions).round().long().unique()


def _layer_statistics(
    layer: MixerLayer,
    inputs: HeadInputs,
    probe: Probe,
    query_positions: torch.Tensor | None,
    *,
    top_k: int,
    block_size: int,
    normalizer: str,
) -> LayerStatistics:
    statistics = LayerStatistics(layer.index, layer.layer_type, layer.head_kind)
    length = inputs.length
    if query_positions is not None:
        entropies = [
            normalized_entropy(alpha[0], positions.to(alpha.device), length=length, normalizer=normalizer)
            for positions, alpha in concentration_blocks(inputs, query_positions.to(inputs.q.device),
                                                         block_size=block_size)
        ]
        statistics.entropy = torch.cat(entropies, dim=-1).cpu()
    if probe.needle_positions is not None:
        answer = torch.tensor([length - 1], device=inputs.q.device)
        alpha = concentration(inputs, answer)[0, :, 0]  # [H, T]
        statistics.answer_entropy = normalized_entropy(alpha, answer, length=length, normalizer=normalizer).cpu()
        statistics.hit_rate = top_k_hit_rate(alpha, probe.needle_positions, top_k=top_k).cpu()
    return statistics


def measure_probe(
    model: torch.nn.Module,
    probe: Probe,
    *,
    num_query_positions: int | None = 256,
    top_k: int = DEFAULT_TOP_K,
    block_size: int = DEFAULT_BLOCK_SIZE,
    normalizer: str = "length",
) -> list[LayerStatistics]:
    """Statistics of every mixer layer of `model` on one probe. num_query_positions None skips the entropy sample
    (then only the answer-position statistics of a needle probe are computed)."""
    query_positions = None
    if num_query_positions is not None:
        query_positions = sample_query_positions(probe.length, num_query_positions)
    results: list[LayerStatistics] = []
    device = next(model.parameters()).device

    def on_layer(layer: MixerLayer, inputs: HeadInputs) -> None:
        results.append(_layer_statistics(layer, inputs, probe, query_positions, top_k=top_k, block_size=block_size,
                                         normalizer=normalizer))

    capture_heads(model, probe.input_ids.reshape(1, -1).to(device), on_layer)
    return results


def measure_probes(model: torch.nn.Module, probes: Sequence[Probe], *, progress: bool = True,
                   **options) -> list[list[LayerStatistics]]:
    """`measure_probe` for each probe (options as there), with a progress bar."""
    if not probes:
        raise ValueError("no sequences to analyse")
    return [measure_probe(model, probe, **options) for probe in progress_bar(probes, desc="analyze",
                                                                        disable=not progress)]


def _mean_std(values: list[torch.Tensor]) -> tuple[list[float], list[float]]:
    """Per-head mean and standard deviation over all entries ([H, ...] tensors concatenated on the last dim)."""
    stacked = torch.cat([value.reshape(value.shape[0], -1).double() for value in values], dim=-1)
    return stacked.mean(-1).tolist(), stacked.std(-1, correction=0).tolist()


def head_records(per_probe: list[list[LayerStatistics]]) -> list[dict]:
    """One record per (layer, head) with the means (and standard deviations) over probes and positions.

    `group` is the head group used for averages: the layer type, as every head of a HypeNet layer has the same mixer;
    `head_kind` says whether the head is recurrent, NoPE or RoPE attention (`hyla.analysis.capture.HEAD_KINDS`).
    """
    records = []
    for layer_index, layer in enumerate(per_probe[0]):
        layers = [statistics[layer_index] for statistics in per_probe]
        columns: dict[str, tuple[list[float], list[float]]] = {}
        for name in ("entropy", "answer_entropy", "hit_rate"):
            if getattr(layer, name) is not None:
                columns[name] = _mean_std([getattr(statistics, name) for statistics in layers])
        num_heads = len(next(iter(columns.values()))[0])
        for head in range(num_heads):
            record = {"layer": layer.index, "head": head, "layer_type": layer.layer_type, "group": layer.layer_type,
                      "head_kind": layer.head_kind}
            for name, (means, stds) in columns.items():
                record[name], record[f"{name}_std"] = means[head], stds[head]
            if layer.hit_rate is not None:
                record["hit_rate_by_sample"] = [statistics.hit_rate[head].item() for statistics in layers]
            records.append(record)
    return records


def group_means(records: list[dict], metrics: Sequence[str]) -> dict[str, dict[str, float]]:
    """Mean of each metric over the heads of each group: {group: {metric: mean, "num_heads": n}}."""
    grouped: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        grouped[record["group"]].append(record)
    summary = {}
    for group, members in sorted(grouped.items()):
        summary[group] = {"num_heads": len(members)}
        for metric in metrics:
            values = [member[metric] for member in members if member.get(metric) is not None]
            if values:
                summary[group][metric] = sum(values) / len(values)
    return summary


def entropy_by_position(per_probe: list[list[LayerStatistics]], probes: Sequence[Probe],
                        num_query_positions: int) -> dict[str, dict[str, list[float]]]:
    """Mean entropy over heads and probes at each sampled position, per layer type.

    Probes of different lengths are aligned by sample index (each one's positions are spread evenly over it);
    `position` is the mean position over probes.
    """
    samples = [sample_query_positions(probe.length, num_query_positions) for probe in probes]
    count = min(len(sample) for sample in samples)
    positions = torch.stack([sample[:count].double() for sample in samples]).mean(0)
    by_type: dict[str, list[torch.Tensor]] = defaultdict(list)
    for statistics in per_probe:
        for layer in statistics:
            by_type[layer.layer_type].append(layer.entropy.double().mean(0)[:count])
    return {
        layer_type: {"position": positions.tolist(), "entropy": torch.stack(curves).mean(0).tolist()}
        for layer_type, curves in sorted(by_type.items())
    }
