"""What every token mixer receives beside its hidden states: the positions, masks and cache of the call, and the
inference options it runs under."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hyla.models.cache import HybridCache

LOGIT_SCALING_MODES = ("per_query", "per_length", "off")


@dataclass(frozen=True)
class InferenceOptions:
    """How a HypeNet runs at inference: chosen per call (forward, generate, the engine, an evaluation), never saved
    with the model. The default runs the model as its config describes it.

    logit_scaling: "per_query" multiplies the query of full softmax attention at position t by
        s_t = log(t + a) / log(a) (docs/method.md, "Attention layer and logit scaling"), with a = `logit_scaling_a`,
        else the model's `attention_logit_scaling_a` (neither set: no scaling); "per_length" multiplies NoPE
        queries by c(L) = max(1, log L / log L0), L = t + 1 the length the query sees and
        L0 = `logit_scaling_train_length` (docs/method.md, "EME"); "off": no scaling.
    eme_window, eme_stride: EME (docs/method.md, "EME"). With `eme_window` W, every linear mixer (Lightning, GLA,
        GDN, also inside "hh_*" layers) runs as SWLA with windows of W tokens every `eme_stride` S (default W // 4),
        and RoPE full attention becomes sliding-window attention with window W ("swa" keeps its own window).
    """

    logit_scaling: str = "per_query"
    logit_scaling_a: float | None = None
    logit_scaling_train_length: int | None = None
    eme_window: int | None = None
    eme_stride: int | None = None

    def __post_init__(self) -> None:
        if self.logit_scaling not in LOGIT_SCALING_MODES:
            raise ValueError(f"logit_scaling must be one of {', '.join(LOGIT_SCALING_MODES)}, got "
                             f"{self.logit_scaling!r}")
        if self.logit_scaling_a is not None:
            if self.logit_scaling != "per_query":
                raise ValueError(f"logit_scaling_a is the a of logit_scaling='per_query', not of "
                                 f"{self.logit_scaling!r}")
            if not self.logit_scaling_a > 1:
                # s_t = log(t + a) / log(a) needs log(a) > 0.
                raise ValueError(f"logit_scaling_a must be > 1, got {self.logit_scaling_a}")
        if self.logit_scaling == "per_length" and self.logit_scaling_train_length is None:
            raise ValueError("logit_scaling='per_length' needs logit_scaling_train_length L0 >= 2")
        if self.logit_scaling != "per_length" and self.logit_scaling_train_length is not None:
            raise ValueError(f"logit_scaling_train_length is the L0 of logit_scaling='per_length', not of "
                             f"{self.logit_scaling!r}")
        if self.logit_scaling_train_length is not None and self.logit_scaling_train_length < 2:
            raise ValueError(f"logit_scaling_train_length L0 must be >= 2, got {self.logit_scaling_train_length}")
        if self.eme_stride is not None and self.eme_window is None:
            raise ValueError("eme_stride needs eme_window")
        if self.eme_window is not None and (self.eme_window < 1 or not 1 <= self.swla_stride <= self.eme_window):
            raise ValueError(f"EME needs 1 <= eme_stride <= eme_window, got eme_window={self.eme_window}, "
                             f"eme_stride={self.swla_stride}")

    @property
    def swla_stride(self) -> int | None:
        """The SWLA stride S in use: `eme_stride`, else W // 4 (at least 1); None when EME is off."""
        if self.eme_window is None:
            return None
        return self.eme_stride if self.eme_stride is not None else max(1, self.eme_window // 4)

    def changes(self) -> dict[str, Any]:
        """The options that differ from the default (what a results file records)."""
        default = InferenceOptions()
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) != getattr(default, field.name)}


DEFAULT_OPTIONS = InferenceOptions()


@dataclass
class MixerContext:
    """position_ids: [B, T] absolute positions of the current tokens (per row, padding excluded).
    rope: (cos, sin) [B, T, head_dim] for those positions.
    token_mask: bool [B, T], False at padding of the current tokens; None when there is no padding.
    key_mask: bool [B, Tk], False at padding over cached + current keys; None when there is no padding.
    cu_seqlens: [N + 1] boundaries of packed documents (batch of one), or None.
    cache: the hybrid cache to read and update, or None.
    options: the inference options of the call (logit scaling, EME); None: the default options."""

    position_ids: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor]
    token_mask: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    cache: HybridCache | None = None
    # None, not DEFAULT_OPTIONS, as the field's default: torch.compile (2.11) cannot trace a dataclass constructed
    # inside a compiled function whose field default is another dataclass instance (pytorch/pytorch#154009).
    options: InferenceOptions | None = None

    def __post_init__(self) -> None:
        if self.options is None:
            self.options = DEFAULT_OPTIONS
