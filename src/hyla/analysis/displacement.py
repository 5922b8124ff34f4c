"""Parameter displacement per head between two checkpoints (docs/method.md, "Analysis"; seed 003 Sec. 5.1):
`r = ‖W' − W‖₂ / ‖W‖₂` (spectral norms) of each head's slice of the q, k, v and o projections.

A head's slice is its `head_dim` rows of q_proj/k_proj/v_proj and its `head_dim` columns of o_proj. K and V have
one slice per key/value head. When the second checkpoint has more heads in a projection than the first (a HypeNet
Lightning layer's MHA keys made from a GQA teacher), its head j is compared with the first's head j // g, the head it
was copied from. Checkpoints are model specs (`hyla.models.loading`): local HF folders are read tensor by tensor from
their safetensors files, without building a model; GGUF files, aliases and hub ids are loaded as models.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch

from hyla.models.configuration import SAVED_LAYER_TYPES_KEY
from hyla.models.loading import load_model, resolve_spec

PROJECTIONS = ("q", "k", "v", "o")
_PROJECTION_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mixer)\.([qkvo])_proj\.weight$")


@dataclass
class Checkpoint:
    """The attention projection weights of a checkpoint: {(layer, "q"|"k"|"v"|"o"): weight}, and its config."""

    weights: dict[tuple[int, str], torch.Tensor]
    config: dict
    source: str

    @property
    def head_dim(self) -> int:
        return self.config.get("head_dim") or self.config["hidden_size"] // self.config["num_attention_heads"]

    def layer_type(self, layer: int) -> str:
        layer_types = self.config.get(SAVED_LAYER_TYPES_KEY) or self.config.get("layer_types")
        return layer_types[layer] if layer_types else "attention"


def _projection_weights(items) -> dict[tuple[int, str], torch.Tensor]:
    weights = {}
    for name, get_tensor in items:
        match = _PROJECTION_KEY.search(name)
        if match:
            weights[(int(match.group(1)), match.group(2))] = get_tensor()
    return weights


def _load_folder(folder: Path) -> Checkpoint:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    weights = {}
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            weights.update(_projection_weights((name, lambda n=name: reader.get_tensor(n)) for name in reader.keys()))
    return Checkpoint(weights, json.loads((folder / "config.json").read_text()), str(folder))


def _load_model(spec: str) -> Checkpoint:
    model = load_model(spec).model
    state = model.state_dict()
    weights = _projection_weights((name, lambda n=name: state[n]) for name in state)
    return Checkpoint(weights, model.config.to_dict(), spec)


def load_checkpoint(spec: str | Path) -> Checkpoint:
    """A HF folder (config.json + safetensors), a .gguf file, an alias (e.g. smollm2-135m) or a hub id."""
    source = resolve_spec(str(spec), role="checkpoint")
    if source.gguf_file is None and Path(source.location).is_dir():
        checkpoint = _load_folder(Path(source.location))
    else:
        checkpoint = _load_model(str(spec))
    if not checkpoint.weights:
        raise ValueError(f"{spec} has no layers.N.(self_attn|mixer).(q|k|v|o)_proj.weight tensors")
    return checkpoint


def head_slices(weight: torch.Tensor, projection: str, head_dim: int) -> torch.Tensor:
    """[heads, head_dim, in] rows of q/k/v, or [heads, out, head_dim] columns of o (views of `weight`)."""
    matrix = weight.T if projection == "o" else weight
    if matrix.shape[0] % head_dim:
        raise ValueError(f"{projection}_proj has {matrix.shape[0]} head rows, not a multiple of head_dim {head_dim}")
    slices = matrix.reshape(-1, head_dim, matrix.shape[1])
    return slices.transpose(1, 2) if projection == "o" else slices


def spectral_norms(matrices: torch.Tensor) -> torch.Tensor:
    """‖A‖₂ of each matrix of [N, m, n] (pass float64), as √λ_max of the smaller Gram matrix (A Aᵀ or Aᵀ A): for head
    slices (64 × hidden) that is a 64 × 64 symmetric eigenproblem, far cheaper on CPU than an SVD of the slice."""
    gram = matrices @ matrices.mT if matrices.shape[-2] <= matrices.shape[-1] else matrices.mT @ matrices
    return torch.linalg.eigvalsh(gram)[..., -1].clamp(min=0).sqrt()


def relative_displacements(before: torch.Tensor, after: torch.Tensor) -> list[float]:
    """‖after − before‖₂ / ‖before‖₂ for each pair of matrices of [N, m, n]."""
    before = before.double()
    return (spectral_norms(after.double() - before) / spectral_norms(before)).tolist()


def _compare_projection(before: Checkpoint, after: Checkpoint, layer: int, projection: str) -> list[dict]:
    key = (layer, projection)
    old = head_slices(before.weights[key], projection, before.head_dim)
    new = head_slices(after.weights[key], projection, after.head_dim)
    if len(new) % len(old) or old[0].shape != new[0].shape:
        raise ValueError(
            f"layer {layer} {projection}_proj: {len(new)} heads of {tuple(new[0].shape)} cannot be matched with "
            f"{len(old)} heads of {tuple(old[0].shape)}"
        )
    copies = len(new) // len(old)
    sources = [head // copies for head in range(len(new))]
    ratios = relative_displacements(old[sources], new)
    layer_type = after.layer_type(layer)
    return [
        {"layer": layer, "layer_type": layer_type, "group": layer_type, "projection": projection, "head": head,
         "source_head": source, "r": ratio}
        for head, (source, ratio) in enumerate(zip(sources, ratios))
    ]


def compare_checkpoints(before: Checkpoint, after: Checkpoint) -> list[dict]:
    """One record per (layer, projection, head) found in both checkpoints: r and the group (layer type)."""
    shared = sorted(set(before.weights) & set(after.weights))
    if not shared:
        raise ValueError(f"{before.source} and {after.source} share no attention projection weights")
    records = []
    for layer, projection in shared:
        records += _compare_projection(before, after, layer, projection)
    return records


def summarize_displacement(records: list[dict]) -> dict:
    """Mean r per group and projection (`by_group`), and per layer and projection (`by_layer`)."""
    by_group: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_layer: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_group[record["group"]][record["projection"]].append(record["r"])
        by_layer[record["layer"]][record["projection"]].append(record["r"])

    def means(table):
        return {key: {projection: sum(row[projection]) / len(row[projection])
                      for projection in PROJECTIONS if projection in row}
                for key, row in sorted(table.items())}

    layer_types = {record["layer"]: record["layer_type"] for record in records}
    layers = {layer: {"layer_type": layer_types[layer], **row} for layer, row in means(by_layer).items()}
    return {"by_group": means(by_group), "by_layer": layers}
