"""The call path shared by the linear mixers (Lightning, GLA, GDN): the recurrent state in the cache, or SWLA's
window states when the call's inference options turn EME on (`eme_window`, docs/method.md, "EME"); and the forward
and output tail shared by the gated mixers (GLA, GDN)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hyla.layers.context import MixerContext
from hyla.layers.rope import apply_rotary
from hyla.ops.swla import sliding_window_linear_attention


def run_linear_op(
    op: Callable,
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context: MixerContext,
    *,
    token_inputs: dict[str, torch.Tensor] | None = None,
    **constants,
) -> torch.Tensor:
    """o [B, T, H, V] of `op` (the `lightning_attention` contract) over this call's tokens, continuing from and
    updating the cache slot `layer_idx`. token_inputs: per-token gate tensors [B, T, ...]; constants: the rest."""
    token_inputs = token_inputs or {}
    # Under autocast the projections come out in bf16 but the q/k RMSNorms (float32 weights) in float32; the fused
    # kernels need one dtype: take the value projection's.
    q, k = q.to(v.dtype), k.to(v.dtype)
    cache, options = context.cache, context.options
    if options.eme_window is not None:
        if context.cu_seqlens is not None:
            raise ValueError("EME (SWLA) runs on unpacked batches: pass documents as rows, not with cu_seqlens")
        states = cache.swla_states(layer_idx, q.shape[0]) if cache is not None else None
        output, states = sliding_window_linear_attention(
            op, q, k, v, window=options.eme_window, stride=options.swla_stride, token_inputs=token_inputs,
            positions=context.position_ids, token_mask=context.token_mask, window_states=states, **constants,
        )
        if cache is not None:
            cache.set_swla_states(layer_idx, states)
        return output
    initial_state = cache.recurrent_state(layer_idx) if cache is not None else None
    output, final_state = op(
        q, k, v, **token_inputs, **constants, initial_state=initial_state, output_final_state=cache is not None,
        cu_seqlens=context.cu_seqlens,
    )
    if cache is not None:
        cache.set_recurrent_state(layer_idx, final_state)
    return output


class GatedOutputMixer(nn.Module):
    """What GLA and GDN share: a forward through their chunked op (`op`, with the per-token gates of
    `token_inputs`), optional RoPE on q and k (`rotate`) and the output tail (o_norm, a SiLU output gate from
    `g_proj`, o_proj). Subclasses define `op` (a staticmethod), `use_rope` (their `gla_rope` / `gdn_rope`),
    `project`, `token_inputs` and the modules g_proj, o_norm, o_proj."""

    op: Callable
    use_rope: bool

    def rotate(self, q: torch.Tensor, k: torch.Tensor, context: MixerContext) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k [B, T, H, D] rotated by RoPE at the tokens' absolute positions (`context.rope`, as Lightning's) when
        the layer has RoPE, else as they are. Under EME the positions stay absolute: q_t k_s depends on t - s only,
        so every SWLA window sees the same relative rotations."""
        if not self.use_rope:
            return q, k
        return apply_rotary(q, *context.rope), apply_rotary(k, *context.rope)

    def forward(self, hidden_states: torch.Tensor, context: MixerContext) -> torch.Tensor:
        q, k, v = self.project(hidden_states, context)
        output = run_linear_op(
            self.op, self.layer_idx, q, k, v, context,
            token_inputs=self.token_inputs(hidden_states, context), scale=self.head_dim**-0.5,
        )
        return self.project_output(output, hidden_states)

    def project_output(
        self, output: torch.Tensor, hidden_states: torch.Tensor, gate: torch.Tensor | None = None, linear=None
    ) -> torch.Tensor:
        """The mixer's tail, shared with the fast inference path: output [B, T, H, D] -> [B, T, hidden]. `gate`: the
        output gate's pre-activation g_proj(hidden_states) when the caller computed it already; `linear`: F.linear's
        signature, computing o_proj instead of the module."""
        gate = self.g_proj(hidden_states) if gate is None else gate
        output = self.o_norm(output) * F.silu(gate).view(output.shape)
        output = output.reshape(hidden_states.shape[:2] + (-1,))
        if linear is not None:
            return linear(output, self.o_proj.weight, self.o_proj.bias)
        return self.o_proj(output)

    def gate_projection(self) -> nn.Linear:
        """The linear map whose output `project_output` takes as `gate`."""
        return self.g_proj
