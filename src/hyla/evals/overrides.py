"""Inference-time settings applied to a loaded model before an evaluation (logit scaling, EME).

`apply_inference_overrides(model, **overrides)` is the single place where evaluation options change how a model
runs, so the teacher and its hybrid are measured by the same command with the same flags. Each override names a
config field; a model that lacks the field cannot honour it, and that is an error rather than a silent no-op.
New EME settings (SWLA window and stride, NoPE length scaling) are added here as the models grow those fields.
"""

from __future__ import annotations

from typing import Any

# override name → (config field, what it means), for the error message and the results file
OVERRIDE_FIELDS = {
    "logit_scaling_a": ("attn_logits_scaling_a", "dynamic logit scaling s_t = log(t + a) / log(a) of attention queries"),
}


def apply_inference_overrides(model: Any, **overrides: Any) -> dict[str, Any]:
    """Set each given (non-None) override on `model.config`; returns what was applied, for the results file.

    Raises ValueError for an unknown override or a model whose config lacks the field.
    """
    applied: dict[str, Any] = {}
    config = getattr(model, "config", None)
    for name, value in overrides.items():
        if value is None:
            continue
        if name not in OVERRIDE_FIELDS:
            raise ValueError(f"unknown inference override {name!r}; known: {', '.join(OVERRIDE_FIELDS)}")
        field, meaning = OVERRIDE_FIELDS[name]
        if config is None or not hasattr(config, field):
            model_type = getattr(config, "model_type", type(model).__name__)
            raise ValueError(f"--{name.replace('_', '-')} needs a model with {meaning} ({model_type} has no {field})")
        setattr(config, field, value)
        applied[field] = value
    return applied
