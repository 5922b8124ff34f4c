"""Token-mixing operators. Each op has a pure-torch reference (CPU path and test oracle) and, where one exists, a
GPU path with the same signature; `hyla.ops.dispatch` picks between them."""

from hyla.ops.dispatch import current_backend, resolve_backend, use_backend
from hyla.ops.lightning import lightning_attention, lightning_log_decay
from hyla.ops.attention import softmax_attention
from hyla.ops.scaling import attention_logit_scale

__all__ = [
    "attention_logit_scale",
    "current_backend",
    "lightning_attention",
    "lightning_log_decay",
    "resolve_backend",
    "softmax_attention",
    "use_backend",
]
