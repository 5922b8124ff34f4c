"""HypeNet models and their registration with transformers' Auto classes."""

from hyla.models.cache import HybridCache
from hyla.models.configuration import HypeNetConfig
from hyla.models.modeling import HypeNetForCausalLM, HypeNetModel

__all__ = ["HybridCache", "HypeNetConfig", "HypeNetForCausalLM", "HypeNetModel"]
