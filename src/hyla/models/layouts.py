"""Layer layouts of the hybrid family (docs/method.md, "Hybrid family") as `layer_types` lists: layer-wise hybrids (LH)
with a ratio and an order, and head-wise hybrids (HH), whose head ratio lives in `HypeNetConfig.headwise_ratio`.

    layerwise_layout(8)                              # 3 Lightning, 1 NoPE attention, repeated
    layerwise_layout(8, efficient="gla", ratio="1:1", order="bottom")   # YOCO-like: 4 GLA layers, then 4 NoPE
    headwise_layout(8, efficient="gdn")              # every layer "hh_gdn"; pass headwise_ratio="3:1" to the config
"""

from __future__ import annotations

from hyla.models.configuration import EFFICIENT_LAYER_TYPES, parse_ratio

LAYOUT_ORDERS = ("interleaved", "bottom")


def layerwise_layout(
    num_layers: int,
    *,
    efficient: str = "lightning",
    global_type: str = "attention",
    ratio: str = "3:1",
    order: str = "interleaved",
) -> list[str]:
    """LH layout: `efficient` and `global_type` layers in the ratio "E:N" (the global count rounded down, at least
    one when N > 0). order "interleaved" spreads the global layers evenly, each closing its group (3:1 gives
    E E E G E E E G ...); "bottom" puts every efficient layer below every global one (YOCO-like)."""
    if efficient not in EFFICIENT_LAYER_TYPES:
        raise ValueError(f"efficient layer type must be one of {', '.join(EFFICIENT_LAYER_TYPES)}, got {efficient!r}")
    if order not in LAYOUT_ORDERS:
        raise ValueError(f"order must be one of {', '.join(LAYOUT_ORDERS)}, got {order!r}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    efficient_parts, global_parts = parse_ratio(ratio)
    period = efficient_parts + global_parts
    if order == "bottom":
        num_global = max(1 if global_parts else 0, num_layers * global_parts // period)
        return [efficient] * (num_layers - num_global) + [global_type] * num_global
    # layer i is global when it completes another 1/N-th share of a period: floor((i+1) N / P) > floor(i N / P)
    layout = [
        global_type if (i + 1) * global_parts // period > i * global_parts // period else efficient
        for i in range(num_layers)
    ]
    if global_parts and global_type not in layout:
        layout[-1] = global_type
    return layout


def headwise_layout(num_layers: int, *, efficient: str = "lightning") -> list[str]:
    """HH layout: every layer "hh_<efficient>", its heads split by the config's `headwise_ratio`."""
    if efficient not in EFFICIENT_LAYER_TYPES:
        raise ValueError(f"efficient layer type must be one of {', '.join(EFFICIENT_LAYER_TYPES)}, got {efficient!r}")
    return [f"hh_{efficient}"] * num_layers
