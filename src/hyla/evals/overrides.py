"""Inference options given to an evaluation or an analysis (logit scaling, EME: `hyla.InferenceOptions`).

`apply_inference_overrides(model, **overrides)` is the single place where evaluation options change how a model
runs, so the teacher and its hybrid are measured by one command with the same flags. It builds the
`InferenceOptions` of the given options (`inference_options_of`, which commands call first, to refuse bad
combinations before loading a model) and makes them the model's inference options (`model.inference_options`,
what its forward, `generate` and the inference engine run with); the model's config is left as it was loaded. A
model without inference options (not a HypeNet) cannot honour them, and that is an error rather than a silent
no-op. The names are InferenceOptions' fields; `logit_scaling_a="off"` evaluates without the scaling the model was
saved with (logit_scaling "off"). `check_options_change_layers` refuses options that change no layer of a model;
`eme_window_note` says when SWLA cannot change a model's outputs (Lightning's decays forget within the window).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import math

from hyla.layers.context import InferenceOptions
from hyla.models.configuration import HEADWISE_LAYER_TYPES, LINEAR_LAYER_TYPES
from hyla.ops.lightning import lightning_log_decay

# override name -> what it means, for the error messages
OVERRIDES = {
    "logit_scaling_a": "per-query logit scaling s_t = log(t + a) / log(a)",
    "logit_scaling": "logit scaling mode ('per_query', 'per_length' or 'off')",
    "logit_scaling_train_length": "training length L0 of c(L) = log L / log L0",
    "eme_window": "EME: SWLA window W of linear mixers and sliding window of RoPE attention",
    "eme_stride": "EME: SWLA stride S (default W // 4)",
}


# option -> (the layer types it changes, what it does to them): hyla.layers.linear_mixer.run_linear_op (SWLA),
# Attention.window and hyla.layers.attention.query_logit_scale. "hh_swa" keeps its window under EME.
_EFFECTS = {
    "eme_window": ((*LINEAR_LAYER_TYPES, "attention_rope", "hh_lightning", "hh_gla", "hh_gdn"),
                   "runs lightning, gla and gdn layers as SWLA and gives attention_rope layers a sliding window"),
    "logit_scaling_train_length": (("attention", *HEADWISE_LAYER_TYPES), "scales the logits of NoPE attention"),
    "logit_scaling_a": (("attention", "attention_rope", *HEADWISE_LAYER_TYPES),
                        "scales the logits of full attention (NoPE and RoPE)"),
}


def _given(overrides: dict[str, Any]) -> dict[str, Any]:
    given = {name: value for name, value in overrides.items() if value is not None}
    unknown = sorted(set(given) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"unknown inference override(s) {unknown}; known: {', '.join(OVERRIDES)}")
    return given


def inference_options_of(**overrides: Any) -> InferenceOptions | None:
    """The `InferenceOptions` of the given (non-None) overrides, or None when none is given. Raises ValueError for
    an unknown override or values that do not go together."""
    given = _given(overrides)
    if not given:
        return None
    if given.get("logit_scaling_a") == "off":
        del given["logit_scaling_a"]
        if given.setdefault("logit_scaling", "off") != "off":
            raise ValueError(f"--logit-scaling-a off turns the scaling off; --logit-scaling {given['logit_scaling']} "
                             "asks for it")
    return InferenceOptions(**given)


def apply_inference_overrides(model: Any, **overrides: Any) -> dict[str, Any]:
    """Make the given (non-None) overrides the model's inference options; returns them (option -> value).

    Raises ValueError for an unknown override, a model without inference options, or values that do not go
    together (the model is then left as it was)."""
    given = _given(overrides)
    if not given:
        return {}
    if not hasattr(model, "inference_options"):
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise no_inference_options(given, model_type)
    options = inference_options_of(**given)
    model.inference_options = options
    return options.changes()


def no_inference_options(names: Iterable[str], model: str) -> ValueError:
    """The one error for inference options given to a model that has none (any model but a hyla HypeNet)."""
    names = list(names)
    flags = ", ".join(f"--{name.replace('_', '-')}" for name in names)
    if len(names) == 1:
        return ValueError(f"{flags} needs a hyla HypeNet model, for its {OVERRIDES[names[0]]} ({model} has no "
                          "inference options)")
    return ValueError(f"{flags} need a hyla HypeNet model ({model} has no inference options)")


def check_options_change_layers(options: InferenceOptions, layer_types: Sequence[str], model: str) -> None:
    """Raise one clear ValueError when an option of `options` changes no layer of a model with `layer_types`
    (e.g. EME on a model without linear mixers or RoPE attention, c(L) on one without NoPE attention)."""
    for name, (changed, effect) in _EFFECTS.items():
        if getattr(options, name) is not None and not any(kind in changed for kind in layer_types):
            raise ValueError(f"--{name.replace('_', '-')} changes no layer of {model}: it {effect}, and its layers "
                             f"are {', '.join(sorted(set(layer_types)))}")


# Below this weight a token's contribution to a Lightning state is lost in the rounding of the ones beside it (bf16
# keeps 8 significant bits, float32 24: 6e-8 relative).
FORGOTTEN_WEIGHT = 1e-6


def eme_window_note(options: InferenceOptions | None, layer_types: Sequence[str], num_heads: int) -> str | None:
    """A one-line note when `options`' SWLA window cannot change a model's outputs, else None: every recurrent layer
    is Lightning (fixed decays g_h, `hyla.ops.lightning.lightning_log_decay`) and even the slowest head keeps a
    weight exp(max g_h * W) below FORGOTTEN_WEIGHT for a token W positions back, so cutting the state at W removes
    nothing the model can see (GLA and GDN gates depend on the data: no note for them)."""
    if options is None or options.eme_window is None:
        return None
    recurrent = {kind for kind in layer_types if kind in LINEAR_LAYER_TYPES or kind in HEADWISE_LAYER_TYPES}
    if recurrent != {"lightning"}:
        return None
    window = options.eme_window
    weight = math.exp(float(lightning_log_decay(num_heads).max()) * window)
    if weight >= FORGOTTEN_WEIGHT:
        return None
    return (f"note: --eme-window {window} changes nothing here but rounding: every layer's recurrence is Lightning, "
            f"whose slowest head weighs a token {window} positions back by {weight:.1e}; SWLA still multiplies the "
            f"prefill's recurrent work by W/S")
