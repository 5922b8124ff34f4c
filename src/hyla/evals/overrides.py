"""Inference-time settings applied to a loaded model before an evaluation (logit scaling, EME).

`apply_inference_overrides(model, **overrides)` is the single place where evaluation options change how a model
runs, so the teacher and its hybrid are measured by the same command with the same flags. Each override names a
config field; a model that lacks the field cannot honour it, and that is an error rather than a silent no-op.
- `logit_scaling_a` sets `attn_logits_scaling_a` (dynamic logit scaling s_t = log(t + a) / log(a), docs/method.md,
  "Attention layer and logit scaling"); the value "off" sets it to None (no scaling);
- the EME settings (`eme_window`, `eme_stride`, `logit_scaling`, `logit_scaling_train_length`, docs/method.md, "EME") go
  through `hyla.models.eme.apply_eme_overrides`, which checks them together with the model config.
A new override is a row of `OVERRIDE_FIELDS` (or of the EME table) plus a CLI option in `hyla.evals.cli`.
"""

from __future__ import annotations

from typing import Any

# override name → (config field, what it means), for the error message and the results file
OVERRIDE_FIELDS = {
    "logit_scaling_a": ("attn_logits_scaling_a", "per-query logit scaling s_t = log(t + a) / log(a)"),
}


def _eme_override_names() -> set[str]:
    from hyla.models.eme import EME_OVERRIDE_FIELDS

    return set(EME_OVERRIDE_FIELDS)


def apply_inference_overrides(model: Any, **overrides: Any) -> dict[str, Any]:
    """Set each given (non-None) override on `model.config`; returns what was applied (config field → value).

    Raises ValueError for an unknown override, a model whose config lacks the field, or a value the config rejects.
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    if not given:
        return {}
    eme_names = _eme_override_names()
    eme_overrides = {name: given.pop(name) for name in list(given) if name in eme_names}
    applied: dict[str, Any] = {}
    for name, value in given.items():
        applied.update(_set_config_field(model, name, value))
    if eme_overrides:
        from hyla.models.eme import apply_eme_overrides

        applied.update(apply_eme_overrides(model, **eme_overrides))
    return applied


def _set_config_field(model: Any, name: str, value: Any) -> dict[str, Any]:
    if name not in OVERRIDE_FIELDS:
        known = sorted(set(OVERRIDE_FIELDS) | _eme_override_names())
        raise ValueError(f"unknown inference override {name!r}; known: {', '.join(known)}")
    field, meaning = OVERRIDE_FIELDS[name]
    if name == "logit_scaling_a" and value == "off":
        value = None  # evaluate without the scaling the model was saved with
    elif name == "logit_scaling_a" and not value > 1:
        # s_t = log(t + a) / log(a) needs log(a) > 0.
        raise ValueError(f"--logit-scaling-a must be > 1, got {value}")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, field):
        model_type = getattr(config, "model_type", type(model).__name__)
        raise ValueError(f"--{name.replace('_', '-')} needs a model with {meaning} ({model_type} has no {field})")
    previous = getattr(config, field)
    setattr(config, field, value)
    # A hyla config checks its fields together; leave it unchanged when it rejects the value.
    validate = getattr(config, "validate_family", None)
    if callable(validate):
        try:
            validate()
        except ValueError:
            setattr(config, field, previous)
            raise
    return {field: value}
