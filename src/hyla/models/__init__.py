"""HypeNet models and their registration with transformers' Auto classes."""

from hyla.layers.context import InferenceOptions
from hyla.models.cache import HybridCache
from hyla.models.configuration import HypeNetConfig
from hyla.models.modeling import HypeNetForCausalLM, HypeNetModel

__all__ = ["HybridCache", "HypeNetConfig", "HypeNetForCausalLM", "HypeNetModel", "InferenceOptions"]
