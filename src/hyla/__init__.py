"""hyla: hybrid linear-attention language models for extremely long contexts.

Importing hyla registers the `hypenet` model type with transformers' Auto classes; it imports no GPU kernels.
`hyla.generate(model, input_ids, attention_mask, ...)` generates on the inference engine (hyla.inference.generate);
`hyla.InferenceOptions` says how a model runs at inference (logit scaling, EME), per call or as the model's default.
"""

from hyla.inference.generate import generate
from hyla.models import HybridCache, HypeNetConfig, HypeNetForCausalLM, HypeNetModel, InferenceOptions
from hyla.models.hf import register as _register
from hyla.version import __version__

_register()

__all__ = ["HybridCache", "HypeNetConfig", "HypeNetForCausalLM", "HypeNetModel", "InferenceOptions", "__version__",
           "generate"]
