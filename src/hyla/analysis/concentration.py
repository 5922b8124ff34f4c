"""Jacobian concentration of a token mixer's heads (docs/method.md, "Analysis"; seed 003 Eq. 1).

For query t of one head, `α~_{t,s} = ‖∂o_t/∂v_s‖₂ / Σ_u ‖∂o_t/∂v_u‖₂` with queries, keys and gates held fixed. Every
mixer hyla has mixes values with one scalar per (t, s) (o_t = Σ_s c_{t,s} v_s), so the Jacobian block is c_{t,s} I and
its spectral norm is |c_{t,s}|. Each *form* below computes |c| in closed form from what the mixer captured:
- "softmax": c = softmax_s(scale q_t·k_s) over the visible keys (causal, optionally a sliding window);
- "decay":   c = scale (q_t·k_s) exp((t−s) g_h), a fixed per-head log-decay g_h (Lightning);
- "gated":   c = scale Σ_d q_{t,d} k_{s,d} exp(G_{t,d} − G_{s,d}), G the cumulative per-channel log-gates (GLA);
- "delta":   c = scale β_s q_t A_t A_{t−1} ⋯ A_{s+1} k_sᵀ, A_r = exp(g_r) (I − β_r k_rᵀ k_r) (GDN, the gated delta rule).
Under SWLA (EME) a linear mixer's output at t is that of the window serving t, run from a zero state: the same c for
the keys of that window, s ≥ start(t), and 0 before it. The scale of c drops out in the normalisation; the recurrent
forms work in log space so that long products of decays never underflow.

New mixers add a form with `register_form` and a capture with `hyla.analysis.capture.register_mixer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hyla.ops.swla import serving_window_start

# The "gated" form works through the keys in chunks: C keys at a time with B·Tq·C·H·K ≈ this many elements in each
# [B, Tq, C, H, K] intermediate (16 MiB in float32; the few alive at once stay near 100 MiB for any block of queries).
GATED_CHUNK_ELEMENTS = 2**22
# Keys per step of the "delta" form's backward sweep (one C × C triangular solve per step).
DELTA_CHUNK_SIZE = 64


@dataclass
class HeadInputs:
    """What one layer's value path depends on, as its kernel sees it (batch B, length T, H query heads).

    form: the closed form to use, a key of `FORMS`.
    q: [B, T, H, D] queries after norms, RoPE and logit scaling (before the kernel's `scale`).
    k: [B, T, Hk, D] keys; Hk divides H and query head j reads key head j // (H // Hk) (GQA).
    scale: the kernel's factor on q·k.
    log_decay: [H] per-token log-decay of each head (form "decay").
    log_gates: per-token log-decays g_t, [B, T, H, D] per key channel (form "gated") or [B, T, H] per head ("delta").
    beta: [B, T, H] the delta rule's write strength β_t (form "delta").
    window: softmax over the `window` most recent keys only (the query's own included); None = all.
    swla_window, swla_stride: SWLA (EME): query t reads only the keys of the window that serves it, s ≥ start(t)
        (`hyla.ops.swla.serving_window_start`); None = all.
    """

    form: str
    q: torch.Tensor
    k: torch.Tensor
    scale: float
    log_decay: torch.Tensor | None = None
    log_gates: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    window: int | None = None
    swla_window: int | None = None
    swla_stride: int | None = None

    @property
    def num_heads(self) -> int:
        return self.q.shape[2]

    @property
    def length(self) -> int:
        return self.q.shape[1]


# (inputs, query_positions [Tq]) -> α~ [B, H, Tq, S] with S = max(query_positions) + 1 keys; rows sum to 1 over the
# visible keys and are 0 elsewhere.
ConcentrationForm = Callable[[HeadInputs, torch.Tensor], torch.Tensor]
FORMS: dict[str, ConcentrationForm] = {}


def register_form(name: str, form: ConcentrationForm) -> None:
    """Make `form` the closed form of α~ for captures whose `form` field is `name`."""
    FORMS[name] = form


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scores(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """q_t·k_s for the given queries and keys 0..max(t): [B, H, Tq, S] in float32 (float64 for float64)."""
    acc = _accumulation_dtype(inputs.q.dtype)
    num_keys = int(query_positions.max()) + 1
    q = inputs.q[:, query_positions].to(acc)
    k = inputs.k[:, :num_keys].to(acc)
    groups = inputs.num_heads // k.shape[2]
    if groups * k.shape[2] != inputs.num_heads:
        raise ValueError(f"{inputs.num_heads} query heads cannot share {k.shape[2]} key heads")
    k = k.repeat_interleave(groups, dim=2)
    return torch.einsum("bqhd,bshd->bhqs", q, k)


def _first_visible_key(query_positions: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
    """[Tq] the first key each query reads: after a sliding window's reach, at its SWLA window's start; else 0."""
    first = torch.zeros_like(query_positions)
    if inputs.window is not None:
        first = torch.maximum(first, query_positions - inputs.window + 1)
    if inputs.swla_window is not None:
        start = serving_window_start(query_positions, window=inputs.swla_window, stride=inputs.swla_stride)
        first = torch.maximum(first, start)
    return first


def _visible(query_positions: torch.Tensor, num_keys: int, inputs: HeadInputs) -> torch.Tensor:
    """bool [Tq, S]: key s is visible to the query at position t (first(t) ≤ s ≤ t)."""
    keys = torch.arange(num_keys, device=query_positions.device)
    first = _first_visible_key(query_positions, inputs)
    return (keys[None, :] <= query_positions[:, None]) & (keys[None, :] >= first[:, None])


def _normalize_visible(log_weight: torch.Tensor, query_positions: torch.Tensor, inputs: HeadInputs) -> torch.Tensor:
    """α~ from log|c| [B, H, Tq, S] (overwritten): a softmax over the visible keys (the normalisation Σ_u); a row
    whose c are all 0 becomes 0, not NaN."""
    visible = _visible(query_positions, log_weight.shape[-1], inputs)
    # In place: log_weight is the form's own, and a block of α~ is the largest tensor of the analysis.
    return torch.softmax(log_weight.masked_fill_(~visible, float("-inf")), dim=-1).nan_to_num_(0.0)


def softmax_concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """Softmax attention: α~ is the attention weight itself."""
    return _normalize_visible(_scores(inputs, query_positions) * inputs.scale, query_positions, inputs)


def decay_concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """Linear attention with a fixed per-head decay: α~_{t,s} ∝ |q_t·k_s| exp((t − s) g_h), normalised over s ≤ t."""
    if inputs.log_decay is None:
        raise ValueError("the 'decay' form needs the per-head log_decay")
    scores = _scores(inputs, query_positions)
    log_decay = inputs.log_decay.to(device=scores.device, dtype=scores.dtype)
    distance = (query_positions[:, None] - torch.arange(scores.shape[-1], device=scores.device)[None, :]).to(scores)
    # In place, as in _normalize_visible: log|q·k| + (t − s) g_h without another block-sized temporary.
    log_weight = scores.abs_().log_().addcmul_(distance[None, None], log_decay[None, :, None, None])
    return _normalize_visible(log_weight, query_positions, inputs)


def _recurrent_inputs(inputs: HeadInputs, form: str, *needs: str) -> None:
    if inputs.k.shape[2] != inputs.num_heads:
        raise ValueError(f"the {form!r} form needs one key head per query head, got {inputs.k.shape[2]} key heads "
                         f"for {inputs.num_heads} query heads")
    missing = [name for name in needs if getattr(inputs, name) is None]
    if missing:
        raise ValueError(f"the {form!r} form needs {' and '.join(missing)}")


def gated_concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """GLA: c_{t,s} = scale Σ_d q_{t,d} k_{s,d} exp(G_{t,d} − G_{s,d}), G_t = Σ_{r ≤ t} g_r per key channel.

    In log space, log|c| = m + log|Σ_d q k exp(G_t − G_s − m)| with m = max_d (G_{t,d} − G_{s,d}), so no key
    underflows however far; the keys go in chunks (`GATED_CHUNK_ELEMENTS`), the cumulative gates in float64.
    """
    _recurrent_inputs(inputs, "gated", "log_gates")
    acc = _accumulation_dtype(inputs.q.dtype)
    num_keys = int(query_positions.max()) + 1
    cumulative = inputs.log_gates[:, :num_keys].to(torch.float64).cumsum(1)  # [B, S, H, D]
    q = inputs.q[:, query_positions].to(acc)  # [B, Tq, H, D]
    query_cumulative = cumulative[:, query_positions]
    log_weight = q.new_full((q.shape[0], q.shape[2], q.shape[1], num_keys), float("-inf"))
    chunk = max(1, GATED_CHUNK_ELEMENTS // q.numel())
    for start in range(int(_first_visible_key(query_positions, inputs).min()), num_keys, chunk):
        end = min(start + chunk, num_keys)
        lag = (query_cumulative[:, :, None] - cumulative[:, None, start:end]).to(acc)  # [B, Tq, C, H, D]
        shift = lag.amax(-1, keepdim=True)
        c = (q[:, :, None] * inputs.k[:, None, start:end].to(acc) * (lag - shift).exp()).sum(-1)  # [B, Tq, C, H]
        log_weight[..., start:end] = (c.abs().log() + shift[..., 0]).permute(0, 3, 1, 2)
    return _normalize_visible(log_weight, query_positions, inputs)


def delta_concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """GDN, the gated delta rule S_t = A_t S_{t−1} + β_t k_tᵀ v_t with A_t = exp(g_t) (I − β_t k_tᵀ k_t) and
    o_t = scale q_t S_t: c_{t,s} = scale β_s w_{t,s}·k_s, where w_{t,s} = q_t A_t A_{t−1} ⋯ A_{s+1}.

    One sweep from the last key back to the first carries every query's w, `DELTA_CHUNK_SIZE` keys at a time:
    with x_s = β_s w_s·k_s, w_{s−1} = exp(g_s) (w_s − x_s k_s), so the x of a chunk solve one unit upper-triangular
    system (I + M) x = r with M_{s,r} = β_s exp(G_r − G_s) k_s·k_r (r > s, G the cumulative log-decay), r from the w
    carried in at the chunk's end and from the queries inside the chunk. Each carried w is renormalised after its
    chunk and its log-norm kept, so log|c| never underflows however far the key.
    """
    _recurrent_inputs(inputs, "delta", "log_gates", "beta")
    acc = _accumulation_dtype(inputs.q.dtype)
    num_keys = int(query_positions.max()) + 1
    q = inputs.q[:, query_positions].to(acc).transpose(1, 2)  # [B, H, Tq, D]
    k = inputs.k[:, :num_keys].to(acc).transpose(1, 2)  # [B, H, S, D]
    beta = inputs.beta[:, :num_keys].to(acc).transpose(1, 2)  # [B, H, S]
    cumulative = inputs.log_gates[:, :num_keys].to(torch.float64).cumsum(1).transpose(1, 2)  # [B, H, S]
    query_cumulative = cumulative[..., query_positions]
    carried = torch.zeros_like(q)  # w_{t,s} / exp(log_scale) at the end s of the chunk to come
    log_scale = q.new_zeros(q.shape[:3])
    log_weight = q.new_full(q.shape[:3] + (num_keys,), float("-inf"))
    first = int(_first_visible_key(query_positions, inputs).min())
    for start in reversed(range(0, num_keys, DELTA_CHUNK_SIZE)):
        end = min(start + DELTA_CHUNK_SIZE, num_keys)
        if end <= first:
            break
        before = cumulative[..., start - 1] if start > 0 else torch.zeros_like(cumulative[..., 0])
        x, carried = _delta_chunk(q, query_positions, query_cumulative, k[:, :, start:end],
                                  beta[..., start:end], cumulative[..., start:end], before, carried, start=start)
        log_weight[..., start:end] = x.abs().log().transpose(-1, -2) + log_scale[..., None]
        norm = carried.norm(dim=-1)
        nonzero = norm > 0
        carried = carried / torch.where(nonzero, norm, 1.0)[..., None]
        log_scale = log_scale + torch.where(nonzero, norm.log(), 0.0)
    return _normalize_visible(log_weight, query_positions, inputs)


def _delta_chunk(q, query_positions, query_cumulative, k, beta, cumulative, before, carried, *, start: int):
    """Keys start .. start + C − 1 of `delta_concentration`: x [B, H, C, Tq] and every query's w carried on to
    start − 1. q, carried: [B, H, Tq, D]; query_cumulative: G at the queries [B, H, Tq]; k: [B, H, C, D]; beta,
    cumulative (G of the chunk's keys, float64): [B, H, C]; before: G at start − 1 [B, H]."""
    acc, size = q.dtype, k.shape[2]
    last = start + size - 1
    keys = torch.arange(start, last + 1, device=q.device)
    end_cumulative = cumulative[..., -1:]
    # r_s = β_s (exp(G_end − G_s) k_s·w_end + [s ≤ t ≤ end] exp(G_t − G_s) k_s·q_t)
    from_end = (end_cumulative - cumulative).exp().to(acc)[..., None] * (k @ carried.transpose(-1, -2))
    reads = (keys[:, None] <= query_positions[None, :]) & (query_positions[None, :] <= last)  # [C, Tq]
    lag = query_cumulative[..., None, :] - cumulative[..., :, None]  # G_t − G_s [B, H, C, Tq]
    from_query = lag.masked_fill(~reads, float("-inf")).exp().to(acc) * (k @ q.transpose(-1, -2))
    rhs = beta[..., None] * (from_end + from_query)
    later = torch.ones(size, size, dtype=torch.bool, device=q.device).triu(1)  # r > s
    decay = (cumulative[..., None, :] - cumulative[..., :, None]).masked_fill(~later, float("-inf")).exp().to(acc)
    system = torch.eye(size, dtype=acc, device=q.device) + beta[..., None] * decay * (k @ k.transpose(-1, -2))
    x = torch.linalg.solve_triangular(system, rhs, upper=True, unitriangular=True)
    # w_{start−1} = exp(G_end − G_{start−1}) w_end + [start ≤ t ≤ end] exp(G_t − G_{start−1}) q_t
    #               − Σ_r exp(G_r − G_{start−1}) x_r k_r
    inside = (query_positions >= start) & (query_positions <= last)
    injected = (query_cumulative - before[..., None]).masked_fill(~inside, float("-inf")).exp().to(acc)
    to_before = (cumulative - before[..., None]).exp().to(acc)
    carried = ((end_cumulative - before[..., None]).exp().to(acc)[..., None] * carried + injected[..., None] * q
               - torch.einsum("bhct,bhc,bhcd->bhtd", x, to_before, k))
    return x, carried


register_form("softmax", softmax_concentration)
register_form("decay", decay_concentration)
register_form("gated", gated_concentration)
register_form("delta", delta_concentration)


def concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """α~ [B, H, Tq, S] at `query_positions` (ascending, [Tq] long) over keys 0..max(query_positions)."""
    form = FORMS.get(inputs.form)
    if form is None:
        raise ValueError(f"no concentration form {inputs.form!r}; registered: {', '.join(sorted(FORMS))}")
    return form(inputs, query_positions)


def concentration_blocks(
    inputs: HeadInputs, query_positions: torch.Tensor, *, block_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(positions, α~) for consecutive blocks of `block_size` query positions: memory ~ B·H·block_size·T."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    for start in range(0, len(query_positions), block_size):
        positions = query_positions[start : start + block_size]
        yield positions, concentration(inputs, positions)


def normalized_entropy(
    alpha: torch.Tensor, query_positions: torch.Tensor, *, length: int, normalizer: str = "length"
) -> torch.Tensor:
    """H~_t = −Σ_s α~ log α~ / log N for α~ [..., Tq, S]; returns [..., Tq].

    normalizer "length": N = L, the sequence length (docs/method.md, "Analysis"); "visible": N = t + 1, the keys query t
    can see, so that a uniform head scores 1 at every position (N = 1 at t = 0 gives NaN: sample t ≥ 1).
    """
    entropy = -torch.special.xlogy(alpha, alpha).sum(-1)
    if normalizer == "length":
        if length < 2:
            raise ValueError(f"normalized entropy needs a length of at least 2, got {length}")
        return entropy / math.log(length)
    if normalizer == "visible":
        return entropy / torch.log((query_positions + 1).to(entropy))
    raise ValueError(f"unknown entropy normalizer {normalizer!r}; use 'length' or 'visible'")


def top_k_hit_rate(alpha: torch.Tensor, target_positions: torch.Tensor, *, top_k: int) -> torch.Tensor:
    """Fraction of `target_positions` ([N] key positions) among each row's `top_k` largest α~.

    alpha: [..., S] (one query per row); returns [...]. Rows with fewer than `top_k` keys count all of them; a key
    with α~ = 0 never counts, even when ties put it among the top k.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if len(target_positions) == 0:
        raise ValueError("the hit rate needs at least one target position")
    top = alpha.topk(min(top_k, alpha.shape[-1]), dim=-1).indices
    targets = target_positions.to(top.device)
    hits = (top[..., None, :] == targets[:, None]).any(-1) & (alpha[..., targets] > 0)
    return hits.to(alpha.dtype).mean(-1)
