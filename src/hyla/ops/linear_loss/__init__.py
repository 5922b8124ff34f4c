"""The LM head fused with its training loss (KL to a teacher, cross-entropy): the plain formulas
(`reference`), the chunked version that never materialises [tokens, vocabulary] logits (`chunked`), and the KL's
per-chunk arithmetic as a Triton kernel (`gpu.py`, not imported here: `import hyla` never imports triton)."""

from hyla.ops.linear_loss.chunked import (
    KL_KERNELS,
    default_chunk_rows,
    linear_cross_entropy_chunked,
    linear_kl_divergence_chunked,
)
from hyla.ops.linear_loss.reference import linear_cross_entropy_reference, linear_kl_divergence_reference

__all__ = ["KL_KERNELS", "default_chunk_rows", "linear_cross_entropy_chunked", "linear_cross_entropy_reference",
           "linear_kl_divergence_chunked", "linear_kl_divergence_reference"]
