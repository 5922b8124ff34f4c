"""Lightning attention's training call (no initial state, no final state, unpacked rows) as a torch custom op,
`hyla::lightning_chunk`, so that torch.compile keeps it inside the compiled graph.

fla's `chunk_simple_gla` is wrapped in `torch.compiler.disable`: in a compiled block every call to it splits the
block into separately compiled pieces (five per Lightning block: the input norm, the projections, the q/k casts,
the output tail, the MLP), with float32 tensors written and read at each seam and the gradients of the tensors that
cross a seam summed by eager kernels. Called through this op instead, the block compiles as one forward graph and
one backward graph, the kernel an opaque call inside each.

The op's forward and backward run fla's chunk kernels where the dispatch rule picks fla (`hyla.ops.dispatch`: CUDA
tensors, fla installed), the same kernels `chunk_simple_gla` runs for this case, called as its autograd function
calls them; elsewhere the pure-torch chunked form, with the backward written as three more calls of it (below). The
module registers the ops when first imported (`hyla.ops.lightning` imports it only when the op is switched on).
"""

from __future__ import annotations

import torch

from hyla.ops.dispatch import resolve_backend
from hyla.ops.lightning.reference import lightning_chunked

# fla's chunk length for these kernels (its default).
FLA_CHUNK_SIZE = 64


def _fla_log2_decay(log_decay: torch.Tensor, device: torch.device) -> torch.Tensor:
    """fla's chunk kernels take the decay in base 2 (its autograd function pre-scales by 1 / ln 2 before calling
    them), float32 [H]."""
    from fla.ops.utils.constant import RCP_LN2

    return log_decay.to(device=device, dtype=torch.float32) * RCP_LN2


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
               scale: float) -> torch.Tensor:
    return lightning_chunked(q, k, v, log_decay=log_decay, scale=scale)[0]


def _reversed(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.flip(1)


@torch.library.custom_op("hyla::lightning_chunk", mutates_args=())
def lightning_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """o [B, T, H, V] = scale * sum_{j <= t} exp(g_h (t - j)) (q_t . k_j) v_j for q, k [B, T, H, K], v [B, T, H, V]
    of one dtype (the output's) and log_decay g [H]."""
    if resolve_backend(q) == "fla":
        from fla.ops.simple_gla.chunk import chunk_simple_gla_fwd

        with torch.cuda.device(q.device):
            output, _ = chunk_simple_gla_fwd(
                q.contiguous(), k.contiguous(), v.contiguous(), g=None,
                g_gamma=_fla_log2_decay(log_decay, q.device), scale=scale, initial_state=None,
                output_final_state=False, cu_seqlens=None, chunk_size=FLA_CHUNK_SIZE,
            )
        return output.to(q.dtype)
    return _reference(q, k, v, log_decay, scale).to(q.dtype).contiguous()


@lightning_chunk.register_fake
def _(q, k, v, log_decay, scale):
    return torch.empty(v.shape, dtype=q.dtype, device=v.device)


@torch.library.custom_op("hyla::lightning_chunk_backward", mutates_args=())
def lightning_chunk_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                             scale: float, grad_output: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of `lightning_chunk` for the output gradient grad_output [B, T, H, V].

    Away from fla, three more Lightning calls, from o_t = s sum_{j <= t} gamma^(t - j) (q_t . k_j) v_j:
    dq_t = s sum_{j <= t} gamma^(t - j) (do_t . v_j) k_j is Lightning(do, v, k); dk_j and dv_j sum over the later
    tokens t >= j, so they are Lightning run over the reversed sequence: dk = Lightning(v, do, q) and
    dv = Lightning(k, q, do), both in reverse."""
    if resolve_backend(q) == "fla":
        from fla.ops.simple_gla.chunk import chunk_simple_gla_bwd

        with torch.cuda.device(q.device):
            dq, dk, dv, _, _ = chunk_simple_gla_bwd(
                q.contiguous(), k.contiguous(), v.contiguous(), g=None,
                g_gamma=_fla_log2_decay(log_decay, q.device), initial_state=None, do=grad_output.contiguous(),
                dht=None, scale=scale, cu_seqlens=None, chunk_size=FLA_CHUNK_SIZE,
            )
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    do = grad_output.to(v.dtype)
    dq = _reference(do, v, k, log_decay, scale)
    dk = _reversed(_reference(_reversed(v), _reversed(do), _reversed(q), log_decay, scale))
    dv = _reversed(_reference(_reversed(k), _reversed(q), _reversed(do), log_decay, scale))
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


@lightning_chunk_backward.register_fake
def _(q, k, v, log_decay, scale, grad_output):
    # Contiguous, as both implementations return them.
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, log_decay, scale = inputs
    ctx.save_for_backward(q, k, v, log_decay)
    ctx.scale = scale


def _backward(ctx, grad_output):
    q, k, v, log_decay = ctx.saved_tensors
    dq, dk, dv = lightning_chunk_backward(q, k, v, log_decay, ctx.scale, grad_output)
    return dq, dk, dv, None, None


lightning_chunk.register_autograd(_backward, setup_context=_setup_context)
