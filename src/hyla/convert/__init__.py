"""Teacher import and HALO conversion. Names load on first use, so `import hyla.convert` stays light."""

import importlib

_EXPORTS = {
    "Teacher": "hyla.convert.teacher",
    "load_teacher": "hyla.convert.teacher",
    "load_teacher_config": "hyla.convert.teacher",
    "load_tokenizer": "hyla.convert.teacher",
    "teacher_fingerprint": "hyla.convert.teacher",
    "SUPPORTED_FAMILIES": "hyla.convert.teacher",
    "to_hypenet": "hyla.convert.transfer",
    "lightning_from_attention": "hyla.convert.transfer",
    "hypenet_config_from_teacher": "hyla.convert.transfer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hyla.convert' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
