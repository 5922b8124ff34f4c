"""Inference options given to an evaluation (logit scaling, EME: `hyla.InferenceOptions`).

`apply_inference_overrides(model, **overrides)` is the single place where evaluation options change how a model
runs, so the teacher and its hybrid are measured by one command with the same flags. It builds the
`InferenceOptions` of the given options and makes them the model's inference options (`model.inference_options`,
what its forward, `generate` and the inference engine run with); the model's config is left as it was loaded. A
model without inference options (not a HypeNet) cannot honour them, and that is an error rather than a silent
no-op. The names are InferenceOptions' fields; `logit_scaling_a="off"` evaluates without the scaling the model was
saved with (logit_scaling "off").
"""

from __future__ import annotations

from typing import Any

from hyla.layers.context import InferenceOptions

# override name -> what it means, for the error messages
OVERRIDES = {
    "logit_scaling_a": "per-query logit scaling s_t = log(t + a) / log(a)",
    "logit_scaling": "logit scaling mode ('per_query', 'per_length' or 'off')",
    "logit_scaling_train_length": "training length L0 of c(L) = log L / log L0",
    "eme_window": "EME: SWLA window W of linear mixers and sliding window of RoPE attention",
    "eme_stride": "EME: SWLA stride S (default W // 4)",
}


def apply_inference_overrides(model: Any, **overrides: Any) -> dict[str, Any]:
    """Make the given (non-None) overrides the model's inference options; returns them (option -> value).

    Raises ValueError for an unknown override, a model without inference options, or values that do not go
    together (the model is then left as it was)."""
    given = {name: value for name, value in overrides.items() if value is not None}
    if not given:
        return {}
    unknown = sorted(set(given) - set(OVERRIDES))
    if unknown:
        raise ValueError(f"unknown inference override(s) {unknown}; known: {', '.join(OVERRIDES)}")
    if not hasattr(model, "inference_options"):
        name = next(iter(given))
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(f"--{name.replace('_', '-')} needs a hyla HypeNet model, for its {OVERRIDES[name]} "
                         f"({model_type} has no inference options)")
    if given.get("logit_scaling_a") == "off":
        del given["logit_scaling_a"]
        if given.setdefault("logit_scaling", "off") != "off":
            raise ValueError(f"--logit-scaling-a off turns the scaling off; --logit-scaling {given['logit_scaling']} "
                             "asks for it")
    options = InferenceOptions(**given)
    model.inference_options = options
    return options.changes()
