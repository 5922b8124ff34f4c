"""EME at inference (docs/method.md, "EME"): switch a loaded model's config to SWLA for the linear mixers, sliding
windows for RoPE attention, and per-length logit scaling for NoPE attention.

`apply_eme_overrides(model, eme_window=4096, eme_stride=1024, logit_scaling="per_length",
logit_scaling_train_length=4096)` sets the given (non-None) fields, checks them together and returns what it set,
for the results file. The layers read these fields at every call, so nothing has to be rebuilt.
"""

from __future__ import annotations

from typing import Any

# override name -> what it means (the config field has the same name)
EME_OVERRIDE_FIELDS = {
    "eme_window": "SWLA window W of linear mixers and sliding window of RoPE attention",
    "eme_stride": "SWLA stride S (default W // 4)",
    "logit_scaling": "NoPE logit scaling mode: 'per_query' (s_t, needs attn_logits_scaling_a) or 'per_length' (c(L))",
    "logit_scaling_train_length": "training length L0 of c(L) = log L / log L0",
}


def apply_eme_overrides(model: Any, **overrides: Any) -> dict[str, Any]:
    """Set each given (non-None) EME field on `model.config` (or on a config passed directly); returns them.

    Raises ValueError for an unknown name, a config without the fields, or a combination the config rejects (the
    config is then left unchanged)."""
    config = getattr(model, "config", model)
    applied = {name: value for name, value in overrides.items() if value is not None}
    unknown = sorted(set(applied) - set(EME_OVERRIDE_FIELDS))
    if unknown:
        raise ValueError(f"unknown EME override(s) {unknown}; known: {', '.join(EME_OVERRIDE_FIELDS)}")
    if not hasattr(config, "validate_family"):
        model_type = getattr(config, "model_type", type(model).__name__)
        raise ValueError(f"EME needs a hyla HypeNet model ({model_type} has no EME settings)")
    previous = {name: getattr(config, name) for name in applied}
    for name, value in applied.items():
        setattr(config, name, value)
    try:
        config.validate_family()
    except ValueError:
        for name, value in previous.items():
            setattr(config, name, value)
        raise
    return applied
