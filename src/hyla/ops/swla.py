"""Sliding-window linear attention (SWLA), the EME inference mode of every linear mixer (docs/method.md, "EME").

Windows of W tokens start at every multiple of the stride S (absolute positions 0, S, 2S, ...), each from a zero
state. Position t is served by the window starting at

    start(t) = S * max(0, floor((t - W + S) / S)),

the latest window whose retained part covers t: window 0 serves [0, W), window s > 0 serves [s + W - S, s + W), so
each output sees a local prefix of W - S + 1 to W tokens. Work is about W / S times that of the plain op.

All windows that touch the current tokens are packed into one batch-of-one sequence with `cu_seqlens` and run by the
linear op itself (its reference on CPU, its chunk kernel on GPU), so SWLA has no kernel of its own. With a cache the
states of the windows still open at the end are carried to the next call, so that chunked prefill and token-by-token
decoding give the same outputs as one pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Per row: window start -> that window's state [H, K, V] after the tokens seen so far.
WindowStates = list[dict[int, torch.Tensor]]


def serving_window_start(positions: torch.Tensor, *, window: int, stride: int) -> torch.Tensor:
    """start(t) for integer positions (any shape)."""
    return stride * torch.div(positions - window + stride, stride, rounding_mode="floor").clamp(min=0)


def check_window(window: int, stride: int) -> None:
    if window < 1 or stride < 1 or stride > window:
        raise ValueError(f"SWLA needs 1 <= stride <= window, got window={window}, stride={stride}")


@dataclass
class _Segment:
    row: int
    start: int  # window start (absolute position)
    token_index: torch.Tensor  # indices into the row's T axis, consecutive positions
    first_position: int


def _open_before(position: int, window: int, stride: int) -> range:
    """Starts of the windows opened before `position` that can still take it: s < position < s + W."""
    return range(max(0, -(-(position - window + 1) // stride) * stride), position, stride)


def _row_segments(row, index, first, window, stride, caching) -> list[_Segment]:
    """The windows that hold any of positions [first, first + len(index)) of one row and either serve one of them
    or stay open after them (when caching), with their token slices."""
    end = first + len(index)
    segments = []
    for start in range(_open_before(first, window, stride).start, end, stride):
        serves_from = start + window - stride if start > 0 else 0
        if serves_from >= end and not caching:
            continue
        lo, hi = max(start, first), min(start + window, end)
        segments.append(_Segment(row, start, index[lo - first : hi - first], lo))
    return segments


def _rows(positions, token_mask, batch, length, device):
    """(row, token indices, first position) of the real tokens of each row."""
    rows = []
    for row in range(batch):
        index = torch.arange(length, device=device) if token_mask is None else token_mask[row].nonzero()[:, 0]
        if len(index):
            rows.append((row, index, int(positions[row, index[0]])))
    return rows


def sliding_window_linear_attention(
    op: Callable,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window: int,
    stride: int,
    token_inputs: dict[str, torch.Tensor] | None = None,
    positions: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
    window_states: WindowStates | None = None,
    **op_kwargs,
) -> tuple[torch.Tensor, WindowStates | None]:
    """SWLA around a linear op with the `lightning_attention` contract (`op(q, k, v, **token_inputs, **op_kwargs,
    initial_state=, output_final_state=, cu_seqlens=)`).

    q, k: [B, T, H, K]; v: [B, T, H, V]; token_inputs: per-token op inputs [B, T, ...] (GLA's g, GDN's g and beta);
    positions: [B, T] absolute positions (default 0..T-1); token_mask: bool [B, T], False at padding (those outputs
    are zero); window_states: the open windows' states of each row from the previous call, or None when there is no
    cache. Returns o [B, T, H, V] and, when window_states was given, the updated states (a new list).
    """
    check_window(window, stride)
    token_inputs = token_inputs or {}
    batch, length = q.shape[:2]
    if positions is None:
        positions = torch.arange(length, device=q.device)[None].expand(batch, -1)
    caching = window_states is not None
    rows = _rows(positions, token_mask, batch, length, q.device)
    # Without a cache only window 0 matters while every position is below W; with one, the windows opening at S,
    # 2S, ... must be carried too, so the plain op serves only positions below S.
    if _single_window(rows, batch, length, stride if caching else window):
        first = rows[0][2]
        return _run_unwindowed(op, q, k, v, token_inputs, window_states, first, length, window, op_kwargs)
    segments = [
        segment
        for row, index, first in rows
        for segment in _row_segments(row, index, first, window, stride, caching)
    ]
    if not segments:
        return v.new_zeros(v.shape), (list(window_states) if caching else None)
    initial = _initial_states(segments, window_states, q, v)
    packed = {
        name: torch.cat([x[s.row, s.token_index] for s in segments])[None]
        for name, x in dict(q=q, k=k, v=v, **token_inputs).items()
    }
    lengths = torch.tensor([0] + [len(s.token_index) for s in segments], device=q.device)
    cu_seqlens = lengths.cumsum(0)
    packed_out, final = op(
        packed.pop("q"), packed.pop("k"), packed.pop("v"), **packed, **op_kwargs,
        initial_state=initial, output_final_state=caching, cu_seqlens=cu_seqlens,
    )
    output = _retained_outputs(segments, packed_out[0], cu_seqlens, v, window, stride)
    if not caching:
        return output, None
    return output, _open_window_states(segments, final, window_states, batch, window)


def _single_window(rows, batch, length, limit) -> bool:
    """True when every row is unpadded, at the same position, and below `limit`: SWLA is then the plain op."""
    firsts = {first for _, index, first in rows}
    return len(rows) == batch and all(len(index) == length for _, index, _ in rows) and len(firsts) == 1 and (
        firsts.pop() + length <= limit
    )


def _run_unwindowed(op, q, k, v, token_inputs, window_states, first, length, window, op_kwargs):
    """The plain op over window 0, carrying window 0's state through the cache."""
    caching = window_states is not None
    initial = None
    if first > 0:
        if not caching or any(0 not in states for states in window_states):
            raise ValueError(f"SWLA continues at position {first} without its window state: pass the cache")
        initial = torch.stack([states[0] for states in window_states])
    output, final = op(q, k, v, **token_inputs, **op_kwargs, initial_state=initial, output_final_state=caching)
    if not caching:
        return output, None
    updated = [dict(states) for states in window_states]
    for row, states in enumerate(updated):
        if first + length < window:
            states[0] = final[row]
        else:
            states.pop(0, None)
    return output, updated


def _initial_states(segments, window_states, q, v) -> torch.Tensor:
    """[N, H, K, V]: the carried state of a window opened in an earlier call, zero for a window that opens now."""
    num_heads, key_dim, value_dim = q.shape[2], q.shape[3], v.shape[3]
    zero = q.new_zeros(num_heads, key_dim, value_dim, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)
    states = []
    for s in segments:
        if s.start < s.first_position:
            carried = None if window_states is None else window_states[s.row].get(s.start)
            if carried is None:
                raise ValueError(
                    f"SWLA window at {s.start} continues at position {s.first_position} without its state: "
                    "pass the cache (or start at position 0)"
                )
            states.append(carried.to(zero.dtype))
        else:
            states.append(zero)
    return torch.stack(states)


def _retained_outputs(segments, packed_out, cu_seqlens, v, window, stride) -> torch.Tensor:
    """Scatter each segment's outputs at the positions its window serves; others (and padding) stay zero."""
    output = v.new_zeros(v.shape)
    for n, s in enumerate(segments):
        span = packed_out[cu_seqlens[n] : cu_seqlens[n + 1]]
        positions = torch.arange(s.first_position, s.first_position + len(s.token_index), device=v.device)
        keep = serving_window_start(positions, window=window, stride=stride) == s.start
        output[s.row, s.token_index[keep]] = span[keep]
    return output


def _open_window_states(segments, final, window_states, batch, window) -> WindowStates:
    """Windows that can still take tokens after this call (start + W > next position), per row."""
    updated = [dict(states) for states in window_states] if window_states else [{} for _ in range(batch)]
    for n, s in enumerate(segments):
        end = s.first_position + len(s.token_index)
        row_states = updated[s.row]
        if s.start + window > end:
            row_states[s.start] = final[n]
        else:
            row_states.pop(s.start, None)
    return updated


# The window ring of a static cache: the states of the open windows of each row in a fixed tensor
# [B, n, H, K, V], window start s in slot (s // S) % n, so that a decode step finds its slots without host logic.
# At position t the windows that can take t start in (t - W, t]: at most ceil(W / S) multiples of S, consecutive,
# hence in distinct slots; the window that opens at t reuses the slot of the one that started n S <= W earlier,
# which closed at or before t.

def ring_size(*, window: int, stride: int) -> int:
    """n = ceil(W / S): the slots of a window ring, exactly the most windows open at one position."""
    check_window(window, stride)
    return -(-window // stride)


def ring_slot(starts: torch.Tensor | int, *, stride: int, num_slots: int):
    """The slot of window start(s) `starts` (multiples of the stride)."""
    return (starts // stride) % num_slots


def sliding_window_linear_attention_ring(
    op: Callable,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window: int,
    stride: int,
    ring: torch.Tensor,
    start: int,
    token_inputs: dict[str, torch.Tensor] | None = None,
    **op_kwargs,
) -> torch.Tensor:
    """`sliding_window_linear_attention` of unpadded rows at positions start .. start + T - 1 (the same in every
    row), continuing from and updating in place the window ring `ring` [B, n, H, K, V] (n = `ring_size`; the state
    dtype). q, k: [B, T, H, K]; v: [B, T, H, V]. Returns o [B, T, H, V]. Slots of windows not open are left as
    they are (a window is zeroed when it opens)."""
    batch, length = q.shape[:2]
    num_slots = ring.shape[1]
    if num_slots != ring_size(window=window, stride=stride):
        raise ValueError(f"a ring for window={window}, stride={stride} has {ring_size(window=window, stride=stride)} "
                         f"slots, got {num_slots}")
    window_states = [
        {s: ring[row, ring_slot(s, stride=stride, num_slots=num_slots)] for s in _open_before(start, window, stride)}
        for row in range(batch)
    ]
    positions = torch.arange(start, start + length, device=q.device)[None].expand(batch, -1)
    output, updated = sliding_window_linear_attention(
        op, q, k, v, window=window, stride=stride, token_inputs=token_inputs, positions=positions,
        window_states=window_states, **op_kwargs,
    )
    for s in updated[0]:
        ring[:, ring_slot(s, stride=stride, num_slots=num_slots)] = torch.stack([states[s] for states in updated])
    return output


def swla_decode_step(
    step: Callable,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    ring: torch.Tensor,
    positions: torch.Tensor,
    window: int,
    stride: int,
    **token_inputs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row through SWLA's window ring, on the device (no host reads: a CUDA graph captures it): at a
    position that is a multiple of the stride a window opens (its slot zeroed), every slot takes the token through
    `step(q, k, v, **token_inputs, state=) -> (o, state)` (a single-token recurrence over rows, e.g.
    `gla_decode_step`), and the output is that of the serving window's slot. Slots of closed or unopened windows
    take the token too: they are zeroed before they serve. q, k: [B, H, K]; v: [B, H, V]; token_inputs: [B, ...];
    ring: [B, n, H, K, V]; positions: int64 [B], each row's position. Returns (o [B, H, V], the updated ring)."""
    batch, num_slots = ring.shape[:2]
    slots = torch.arange(num_slots, device=ring.device)
    opening = (positions % stride == 0)[:, None] & (slots[None] == ring_slot(positions, stride=stride,
                                                                             num_slots=num_slots)[:, None])
    state = torch.where(opening[:, :, None, None, None], torch.zeros((), dtype=ring.dtype, device=ring.device), ring)

    def spread(x):
        return x[:, None].expand(batch, num_slots, *x.shape[1:]).flatten(0, 1)

    output, updated = step(spread(q), spread(k), spread(v), **{name: spread(x) for name, x in token_inputs.items()},
                           state=state.flatten(0, 1))
    serving = ring_slot(serving_window_start(positions, window=window, stride=stride), stride=stride,
                        num_slots=num_slots)
    rows = torch.arange(batch, device=ring.device)
    return output.view(batch, num_slots, *output.shape[1:])[rows, serving], updated.view(ring.shape)
