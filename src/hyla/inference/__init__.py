"""Fast inference: static hybrid cache, chunked prefill, CUDA-graph decode (`engine.py`), the decode step's
implementations (`decode_step.py`), the tuned settings that ship per GPU (`settings.py`, `tuned/*.json`) and
generation on top of them (`generate.py`: `hyla.generate`). The kernels live under `hyla.ops` (decode_attention,
chunk_attention, matvec, lightning_step). Importing this package does not import triton."""

from hyla.inference.cache import StaticHybridCache
from hyla.inference.engine import InferenceEngine
from hyla.inference.settings import EngineSettings, load_settings, tuned_settings

__all__ = ["EngineSettings", "InferenceEngine", "StaticHybridCache", "load_settings", "tuned_settings"]
