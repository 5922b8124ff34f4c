"""Jacobian concentration of a token mixer's heads (docs/method.md, "Analysis"; seed 003 Eq. 1).

For query t of one head, `α~_{t,s} = ‖∂o_t/∂v_s‖₂ / Σ_u ‖∂o_t/∂v_u‖₂` with queries and keys held fixed. Every mixer
hyla has mixes values with one scalar per (t, s) (o_t = Σ_s c_{t,s} v_s), so the Jacobian block is c_{t,s} I and its
spectral norm is |c_{t,s}|. Each *form* below computes |c| in closed form from what the mixer captured:
- "softmax": c = softmax_s(scale q_t·k_s) over the visible keys (causal, optionally a sliding window);
- "decay":   c = scale (q_t·k_s) exp((t−s) g_h), a fixed per-head log-decay g_h (Lightning).
The scale of c drops out in the normalisation; "decay" works in log space so that γ^(t−s) never underflows.

New mixers add a form with `register_form` (e.g. GLA: c = q_t Diag(Π α) k_sᵀ, a per-channel decay) and a capture
with `hyla.analysis.capture.register_mixer`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass
class HeadInputs:
    """What one layer's value path depends on, as its kernel sees it (batch B, length T, H query heads).

    form: the closed form to use, a key of `FORMS`.
    q: [B, T, H, D] queries after norms, RoPE and logit scaling (before the kernel's `scale`).
    k: [B, T, Hk, D] keys; Hk divides H and query head j reads key head j // (H // Hk) (GQA).
    scale: the kernel's factor on q·k.
    log_decay: [H] per-token log-decay of each head (form "decay").
    window: softmax over the `window` most recent keys only (the query's own included); None = all.
    """

    form: str
    q: torch.Tensor
    k: torch.Tensor
    scale: float
    log_decay: torch.Tensor | None = None
    window: int | None = None

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


def _visible(query_positions: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """bool [Tq, S]: key s is visible to the query at position t (s ≤ t, and t − s < window)."""
    keys = torch.arange(num_keys, device=query_positions.device)
    distance = query_positions[:, None] - keys[None, :]
    visible = distance >= 0
    if window is not None:
        visible &= distance < window
    return visible


def softmax_concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """Softmax attention: α~ is the attention weight itself."""
    scores = _scores(inputs, query_positions) * inputs.scale
    visible = _visible(query_positions, scores.shape[-1], inputs.window)
    return torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)


def decay_concentration(inputs: HeadInputs, query_positions: torch.Tensor) -> torch.Tensor:
    """Linear attention with a fixed per-head decay: α~_{t,s} ∝ |q_t·k_s| exp((t − s) g_h), normalised over s ≤ t."""
    if inputs.log_decay is None:
        raise ValueError("the 'decay' form needs the per-head log_decay")
    scores = _scores(inputs, query_positions)
    log_decay = inputs.log_decay.to(device=scores.device, dtype=scores.dtype)
    distance = (query_positions[:, None] - torch.arange(scores.shape[-1], device=scores.device)[None, :]).to(scores)
    log_weight = scores.abs().log() + distance[None, None] * log_decay[None, :, None, None]
    visible = _visible(query_positions, scores.shape[-1], inputs.window)
    # A softmax of log-weights is the normalisation Σ_u; an all-zero row (every q·k = 0) becomes 0, not NaN.
    return torch.softmax(log_weight.masked_fill(~visible, float("-inf")), dim=-1).nan_to_num(0.0)


register_form("softmax", softmax_concentration)
register_form("decay", decay_concentration)


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
