"""Token ids of evaluation prompts: from the tokenizer's own call, or from its Rust backend directly where that gives
the same ids (`plain_backend`), without the character offsets the evaluations never read, in about half the time;
and the ids a prompt's builder computed while sizing it, kept for its evaluation (`PromptIds`), so that a 64K-token
prompt is not encoded a second time (bench/niah_host.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyla.evals.haystack import count_tokens


def plain_backend(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` behind `tokenizer` where `tokenizer(texts)` is that backend's `encode_batch` and
    nothing more: transformers' own TokenizersBackend encoding (no subclass changes it or switches input and target
    modes), no truncation or padding set on the backend (a call with the defaults turns both off first) and special
    tokens split as the tokenizer's `split_special_tokens` says (a call sets it first). Else None."""
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return None
    kind, backend = type(tokenizer), getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(tokenizer, TokenizersBackend) or not hasattr(backend, "encode_batch_fast"):
        return None
    plain_class = (kind._encode_plus is TokenizersBackend._encode_plus
                   and kind.__call__ is PreTrainedTokenizerBase.__call__
                   and not hasattr(tokenizer, "_switch_to_input_mode"))
    plain_state = (backend.truncation is None and backend.padding is None
                   and backend.encode_special_tokens == bool(tokenizer.split_special_tokens))
    return backend if plain_class and plain_state else None


def prompt_tokens(tokenizer: Any, text: str, backend: Any | None) -> tuple[int, Any | None]:
    """(the tokens of `text` without special tokens, as `count_tokens` counts them; the backend's encoding of it, or
    None where `backend` is None: `plain_backend(tokenizer)`, looked up once by the caller)."""
    if backend is None:
        return count_tokens(tokenizer, text), None
    encoding = backend.encode_batch_fast([text], add_special_tokens=False)[0]
    return len(encoding), encoding


@dataclass(frozen=True)
class PromptIds:
    """A prompt's token ids [T] int64, special tokens added as `tokenizer(prompt)` adds them, and the tokenizer that
    made them, held weakly: `of(tokenizer)` gives them to that tokenizer only."""

    ids: np.ndarray
    tokenizer: Callable[[], Any]  # a weak reference: the tokenizer, or None once it is gone

    @classmethod
    def from_encoding(cls, tokenizer: Any, backend: Any, encoding: Any) -> PromptIds:
        """From the backend's encoding without special tokens (`prompt_tokens`): the backend's post-processing,
        which `encode` runs last, adds them (it only touched offsets when they were left out)."""
        return cls(np.array(backend.post_process(encoding).ids, dtype=np.int64), weakref.ref(tokenizer))

    def __reduce__(self):
        # A weak reference does not pickle: a pickled or copied PromptIds is given to no tokenizer (the evaluation
        # encodes its prompt again).
        return PromptIds, (self.ids, _no_tokenizer)

    def of(self, tokenizer: Any) -> np.ndarray | None:
        """The ids where `tokenizer` is the one that made them and still encodes through its plain backend (nothing
        set since that changes the ids); else None."""
        made_here = self.tokenizer() is tokenizer
        return self.ids if made_here and plain_backend(tokenizer) is not None else None


def _no_tokenizer() -> None:
    return None


def kept_prompt_ids(tokenizer: Any, texts: list[str]) -> list[PromptIds | None]:
    """Each text's PromptIds, as a prompt builder that sized the text with `prompt_tokens` keeps them (None for
    every text where the tokenizer has no plain backend)."""
    backend = plain_backend(tokenizer)
    if backend is None:
        return [None] * len(texts)
    encodings = backend.encode_batch_fast(list(texts), add_special_tokens=False)
    return [PromptIds.from_encoding(tokenizer, backend, encoding) for encoding in encodings]
