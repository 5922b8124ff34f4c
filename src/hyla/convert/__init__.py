"""HALO conversion. Names load on first use, so `import hyla.convert` stays light.

Teacher loading and weight transfer live below, in `hyla.models.loading` and `hyla.models.transfer` (the data,
training, evaluation and analysis commands load models too); their names are exported here as well.
"""

import importlib

_EXPORTS = {
    "LoadedModel": "hyla.models.loading",
    "load_teacher": "hyla.models.loading",
    "load_teacher_config": "hyla.models.loading",
    "load_tokenizer": "hyla.models.loading",
    "teacher_fingerprint": "hyla.models.loading",
    "SUPPORTED_FAMILIES": "hyla.models.loading",
    "to_hypenet": "hyla.models.transfer",
    "lightning_from_attention": "hyla.models.transfer",
    "gla_from_attention": "hyla.models.transfer",
    "gdn_from_attention": "hyla.models.transfer",
    "swa_from_attention": "hyla.models.transfer",
    "hypenet_config_from_teacher": "hyla.models.transfer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hyla.convert' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
