"""Fast inference: static hybrid cache, chunked prefill, CUDA-graph decode (see `engine.py`)."""

from hyla.inference.cache import StaticHybridCache
from hyla.inference.decode_attention import decode_attention, decode_attention_reference
from hyla.inference.engine import InferenceEngine
from hyla.inference.prefill_attention import chunk_attention, merge_attention

__all__ = [
    "InferenceEngine",
    "StaticHybridCache",
    "chunk_attention",
    "decode_attention",
    "decode_attention_reference",
    "merge_attention",
]
