"""Pure-torch gated delta rule (GDN, docs/method.md, "Hybrid family"), in fla's convention (state [K, V], row vectors):

    S_t = exp(g_t) S_{t-1} + k_t^T u_t,   u_t = beta_t (v_t - k_t exp(g_t) S_{t-1}),   o_t = scale * q_t S_t

i.e. S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t. g: [B, T, H] log-decay (<= 0), beta: [B, T, H]
in (0, 1). Callers L2-normalise q and k (the layer does). `gdn_recurrent` is the definition; `gdn_chunked` the
chunkwise WY form: the work within chunks is batched over every chunk (the sequence zero-padded to whole chunks, one
unit-lower-triangular solve for all of them), and only the state passes from chunk to chunk in a Python loop, one
[K, K] @ [K, V] product and sum (baddbmm) each.
"""

from __future__ import annotations

import torch

from hyla.ops.recurrence import DEFAULT_CHUNK_SIZE, run_by_segment


def _token_update(q, k, v, g, beta, state):
    """One token: q (pre-scaled), k [B, H, K]; v [B, H, V]; g, beta [B, H]; state [B, H, K, V] -> (o [B, H, V],
    new state)."""
    # Products and sums rather than einsum: compiled, the update and the read-outs fuse around the state.
    state = g[..., None, None].exp() * state
    predicted = (k[..., None] * state).sum(-2)
    update = beta[..., None] * (v - predicted)
    state = state + k[..., None] * update[..., None, :]
    return (q[..., None] * state).sum(-2), state


def _recurrent_step(q, k, v, g, beta, state):
    # q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; state: [B, H, K, V]
    outputs = []
    for t in range(q.shape[1]):
        o, state = _token_update(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        outputs.append(o)
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def gdn_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of `gdn_recurrent` for every row, without its batching driver (no host reads: a decode step that a
    CUDA graph can capture). q, k: [B, H, K]; v: [B, H, V]; g, beta: [B, H]; state: [B, H, K, V] float32 (float64 for
    float64 inputs). Returns (o [B, H, V] in v's dtype, the new state in the state's dtype)."""
    acc = state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, state = _token_update(q.to(acc) * scale, k.to(acc), v.to(acc), g.to(acc), beta.to(acc), state)
    return o.to(v.dtype), state


def _split_chunks(x, chunk_size):
    """[B, T, H, ...] -> [B, N, H, C, ...], T padded with zeros up to N * C."""
    length = x.shape[1]
    num_chunks = -(-length // chunk_size)
    padding = [0, 0] * (x.dim() - 2) + [0, num_chunks * chunk_size - length]
    x = torch.nn.functional.pad(x, padding).unflatten(1, (num_chunks, chunk_size))
    return x.transpose(2, 3)


def _chunk_forms(q, k, v, g, beta):
    """Everything within the chunks, for all chunks at once ([B, N, H, C, ...] inputs). With G the cumulative log-decay
    within a chunk and S its starting state, a chunk's u = beta (v - e^G k S - strict(e^{G_i - G_j} k_i.k_j) u) is
    u = u_v - w S, where (I + L) [u_v | w] = [beta v | beta e^G k], L_ij = beta_i e^{G_i - G_j} k_i.k_j (j < i).
    Returns the chunk's transition and input (S_end = transition S + input) and the output's parts
    (o = read S + attention u_v)."""
    length, key_dim = k.shape[-2:]
    cum = g.cumsum(-1)  # G_i, [B, N, H, C]
    lower = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    lag = cum[..., :, None] - cum[..., None, :]  # G_i - G_j, [B, N, H, i, j]
    decay = torch.where(lower, lag, float("-inf")).exp()
    strict = ((k @ k.transpose(-1, -2)) * decay).tril(diagonal=-1) * beta[..., None]
    eye = torch.eye(length, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta[..., None] * v, (beta * cum.exp())[..., None] * k], dim=-1)
    # One triangular solve for every chunk and both right-hand sides.
    solved = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
    u_v, w = solved.split([v.shape[-1], key_dim], dim=-1)  # [B, N, H, C, V], [B, N, H, C, K]
    attention = (q @ k.transpose(-1, -2)) * decay  # causal, diagonal included
    total = cum[..., -1:]  # G at the chunk's end, [B, N, H, 1]
    decayed_keys = (total - cum).exp()[..., None] * k
    eye_keys = torch.eye(key_dim, dtype=q.dtype, device=q.device)
    transition = total.exp()[..., None] * eye_keys - decayed_keys.transpose(-1, -2) @ w  # [B, N, H, K, K]
    chunk_input = decayed_keys.transpose(-1, -2) @ u_v  # [B, N, H, K, V]
    read = cum.exp()[..., None] * q - attention @ w  # [B, N, H, C, K]
    return transition, chunk_input, read, attention @ u_v


class _StateScan(torch.autograd.Function):
    """The states S_0..S_N of S_{n+1} = A_n S_n + B_n (A: [N, M, K, K], B: [N, M, K, V], S_0: [M, K, V]) as one
    [N + 1, M, K, V] tensor, one baddbmm a step each way. The backward runs G_n = dS_n + A_n^T G_{n+1} from G_N = dS_N
    and then takes every dA_n = G_{n+1} S_n^T in one batched product (dB_n = G_{n+1}, dS_0 = G_0): autograd through
    the loop would launch about twice the kernels, and reading A_n by index would backpropagate each read through a
    zero tensor the size of all N steps. Plain torch ops both ways, so torch.func's transforms (the analysis's
    Jacobians) derive its vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(transitions, inputs, state):
        states = [state]
        for transition, chunk_input in zip(transitions.unbind(0), inputs.unbind(0)):
            states.append(torch.baddbmm(chunk_input, transition, states[-1]))
        return torch.stack(states)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output)

    @staticmethod
    def backward(ctx, grad_states):
        transitions, states = ctx.saved_tensors
        grads = [grad_states[-1]]
        for step in range(transitions.shape[0] - 1, -1, -1):
            grads.append(torch.baddbmm(grad_states[step], transitions[step].transpose(-1, -2), grads[-1]))
        grads = torch.stack(grads[::-1])  # G_0..G_N
        return grads[1:] @ states[:-1].transpose(-1, -2), grads[1:], grads[0]


def _chunked_step(q, k, v, g, beta, state, chunk_size=DEFAULT_CHUNK_SIZE):
    # q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; state: [B, H, K, V]. The padding tokens (q = k = v = 0,
    # g = beta = 0) leave the state exactly as it was, and their outputs are dropped.
    length = v.shape[1]
    if length == 0:
        return v.new_zeros(v.shape), state
    chunks = [_split_chunks(x, chunk_size) for x in (q, k, v, g, beta)]
    transition, chunk_input, read, intra = _chunk_forms(*chunks)
    # Only the state passes from chunk to chunk: chunk-major, flattened over (batch, head).
    batch, heads = state.shape[:2]
    states = _StateScan.apply(transition.transpose(0, 1).flatten(1, 2), chunk_input.transpose(0, 1).flatten(1, 2),
                              state.flatten(0, 1))  # [N + 1, B * H, K, V]
    starts = states[:-1].unflatten(1, (batch, heads)).transpose(0, 1)  # [B, N, H, K, V]
    state = states[-1].unflatten(0, (batch, heads))
    o = read @ starts + intra  # [B, N, H, C, V]
    o = o.transpose(2, 3).flatten(1, 2)[:, :length]
    return o, state


def gdn_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token form. q, k: [B, T, H, K]; v: [B, T, H, V]; g (log-decay <= 0), beta: [B, T, H];
    initial_state: [N, H, K, V] (N = B, or the number of packed sequences); returns o [B, T, H, V] and the final
    state [N, H, K, V] (float32, float64 for float64 inputs) when asked."""
    return run_by_segment(
        _recurrent_step, q, k, v, (g, beta),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


def gdn_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise form of `gdn_recurrent` (same arguments, same results)."""
    return run_by_segment(
        _chunked_step, q, k, v, (g, beta),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )
