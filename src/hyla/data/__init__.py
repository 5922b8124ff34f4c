"""Text sources, tokenization into corpus folders, packed and resumable loading.

Names load on first use, so `import hyla.data` imports neither torch nor transformers.
"""

import importlib

_EXPORTS = {
    "GenerationSettings": "hyla.data.generated",
    "open_source": "hyla.data.sources",
    "PrepareSettings": "hyla.data.tokenize",
    "PreparedCorpus": "hyla.data.tokenize",
    "prepare_corpus": "hyla.data.tokenize",
    "tokenizer_identity": "hyla.data.tokenize",
    "TokenCorpus": "hyla.data.loader",
    "PackedDataset": "hyla.data.loader",
    "TokenLoader": "hyla.data.loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hyla.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
