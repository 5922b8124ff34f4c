"""Plots of the analyses (PNG, written atomically): heads as points coloured by layer type and shaped by head kind
(recurrent, NoPE or RoPE attention), as in seed 003's Fig. 12(b) and 21(b); entropy by head and by position;
displacement by layer."""

from __future__ import annotations

from pathlib import Path

from hyla.outputs import new_figure, save_figure

# Fixed colours per known layer type, so that plots of different models read alike; others cycle.
_LAYER_TYPE_COLORS = {"attention": "tab:blue", "lightning": "tab:orange", "full_attention": "tab:blue",
                      "sliding_attention": "tab:green", "gla": "tab:red", "gdn": "tab:purple", "swa": "tab:green"}
_OTHER_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
# A marker per head kind (`hyla.analysis.capture.HEAD_KINDS`), so that recurrent and NoPE heads stand apart whatever
# the colours; other kinds get a diamond.
HEAD_KIND_MARKERS = {"recurrent": "o", "NoPE attention": "^", "RoPE attention": "s"}
_OTHER_MARKER = "D"


def _color(layer_type: str, others: list[str]) -> str:
    if layer_type in _LAYER_TYPE_COLORS:
        return _LAYER_TYPE_COLORS[layer_type]
    if layer_type not in others:
        others.append(layer_type)
    return _OTHER_COLORS[others.index(layer_type) % len(_OTHER_COLORS)]


def _by_type(records: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for record in records:
        grouped.setdefault(record["layer_type"], []).append(record)
    return grouped


def plot_entropy_vs_hit_rate(records: list[dict], *, top_k: int, title: str, path: Path) -> None:
    """Every head a point: normalized entropy at the answer position vs top-k hit rate, coloured by layer type, its
    marker the head kind (`HEAD_KIND_MARKERS`)."""
    figure, axes = new_figure(5.5, 4.2)
    others: list[str] = []
    for layer_type, members in _by_type(records).items():
        kind = members[0].get("head_kind", layer_type)
        label = f"{layer_type} ({len(members)})" if kind == layer_type else f"{layer_type}, {kind} ({len(members)})"
        axes.scatter([member["answer_entropy"] for member in members], [member["hit_rate"] for member in members],
                     s=18, alpha=0.75, color=_color(layer_type, others),
                     marker=HEAD_KIND_MARKERS.get(kind, _OTHER_MARKER), label=label)
    axes.set_xlabel("normalized entropy H~ at the answer position")
    axes.set_ylabel(f"top-{top_k} hit rate on the needle")
    axes.set_xlim(0, 1)
    axes.set_ylim(-0.03, 1.03)
    axes.set_title(title)
    axes.legend(loc="best", fontsize=8)
    save_figure(figure, path)


def plot_entropy_by_head(records: list[dict], *, title: str, path: Path) -> None:
    """Mean normalized entropy as a layers × heads grid; layer types on the row labels."""
    import numpy as np

    num_layers = max(record["layer"] for record in records) + 1
    num_heads = max(record["head"] for record in records) + 1
    grid = np.full((num_layers, num_heads), np.nan)
    layer_types = [""] * num_layers
    for record in records:
        grid[record["layer"], record["head"]] = record["entropy"]
        layer_types[record["layer"]] = record["layer_type"]
    figure, axes = new_figure(1.5 + 0.35 * num_heads, 1.2 + 0.25 * num_layers)
    image = axes.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    axes.set_yticks(range(num_layers), [f"{layer} {kind}" for layer, kind in enumerate(layer_types)], fontsize=7)
    axes.set_xticks(range(num_heads))
    axes.set_xlabel("head")
    axes.set_title(title)
    figure.colorbar(image, ax=axes, label="mean normalized entropy")
    save_figure(figure, path)


def plot_entropy_by_position(curves: dict[str, dict[str, list[float]]], *, title: str, path: Path) -> None:
    """Mean normalized entropy over heads at each sampled query position, one line per layer type."""
    figure, axes = new_figure(5.5, 3.8)
    others: list[str] = []
    for layer_type, curve in curves.items():
        axes.plot(curve["position"], curve["entropy"], color=_color(layer_type, others), label=layer_type)
    axes.set_xlabel("query position")
    axes.set_ylabel("mean normalized entropy")
    axes.set_title(title)
    axes.legend(loc="best", fontsize=8)
    save_figure(figure, path)


def plot_displacement_by_layer(by_layer: dict[int, dict], *, title: str, path: Path) -> None:
    """Mean r per layer for each projection (markers), layer types shaded along the x axis."""
    figure, axes = new_figure(6.5, 3.8)
    layers = sorted(by_layer)
    from matplotlib.patches import Patch

    others: list[str] = []
    shades = {}
    for layer in layers:
        layer_type = by_layer[layer]["layer_type"]
        shades[layer_type] = _color(layer_type, others)
        axes.axvspan(layer - 0.5, layer + 0.5, color=shades[layer_type], alpha=0.12, lw=0)
    for projection, marker in zip(("q", "k", "v", "o"), ("o", "s", "^", "D")):
        points = [(layer, by_layer[layer][projection]) for layer in layers if projection in by_layer[layer]]
        if points:
            axes.plot(*zip(*points), marker=marker, ms=4, lw=1, label=f"r_{projection.upper()}")
    handles, _ = axes.get_legend_handles_labels()
    handles += [Patch(color=color, alpha=0.3, label=layer_type) for layer_type, color in shades.items()]
    axes.set_xlabel("layer")
    axes.set_ylabel("mean ‖W' − W‖₂ / ‖W‖₂ over heads")
    axes.set_title(title)
    axes.legend(handles=handles, loc="best", fontsize=8)
    save_figure(figure, path)
