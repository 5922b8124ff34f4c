"""Softmax attention layer: GQA with the teacher's q/k norms, NoPE (the RoPE layers are its subclasses in
hyla.layers.swa), an optional sigmoid output gate, and the per-query dynamic logit scaling s_t = log(t + a) / log(a)
(docs/method.md, "Attention layer and logit scaling")."""

from __future__ import annotations

import math

import torch
from torch import nn

from hyla.layers.context import InferenceOptions, MixerContext
from hyla.layers.norm import RMSNorm
from hyla.layers.projections import project_with_gate
from hyla.layers.rope import apply_rotary
from hyla.ops.attention import softmax_attention
from hyla.ops.scaling import attention_logit_scale


def query_logit_scale(config, options: InferenceOptions, position_ids: torch.Tensor, *,
                      nope: bool) -> torch.Tensor | None:
    """float64 [B, T] factor for the queries of full attention, or None: s_t = log(t + a) / log(a) ("per_query",
    a from `options` or else the config's attention_logit_scaling_a) or, for NoPE queries only,
    c(t + 1) = max(1, log(t + 1) / log L0) ("per_length", EME)."""
    if options.logit_scaling == "per_length":
        if not nope:
            return None
        # L = t + 1, the length the query sees: the same factor at prefill and decode, and c(L) at the last token
        lengths = position_ids.to(torch.float64) + 1
        return (lengths.log() / math.log(options.logit_scaling_train_length)).clamp(min=1.0)
    if options.logit_scaling == "off":
        return None
    a = options.logit_scaling_a if options.logit_scaling_a is not None else config.attention_logit_scaling_a
    return attention_logit_scale(position_ids, a=a) if a is not None else None


def packed_document_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """bool [1, 1, T, T]: True where query and key belong to the same packed document."""
    document = torch.bucketize(torch.arange(length, device=cu_seqlens.device), cu_seqlens[1:], right=True)
    return (document[:, None] == document[None, :])[None, None]


class OutputGate(nn.Linear):
    """sigmoid(x W + b), elementwise on the attention output. A new gate starts with W = 0 and b = init_bias, i.e.
    as the constant sigmoid(init_bias), so that adding it to a converted layer barely changes the layer."""

    def __init__(self, in_features: int, out_features: int, *, init_bias: float):
        super().__init__(in_features, out_features, bias=True)
        self.init_bias = init_bias

    def reset_to_constant(self) -> None:
        with torch.no_grad():
            self.weight.zero_()
            self.bias.fill_(self.init_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(super().forward(hidden_states))


class Attention(nn.Module):
    # RoPE on q and k: off here (NoPE, the HypeNet design), on in the subclasses of hyla.layers.swa.
    use_rope = False

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        width = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps) if config.attention_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps) if config.attention_qk_norm else None
        self.g_proj = (
            OutputGate(config.hidden_size, width, init_bias=config.attention_gate_init_bias)
            if config.attention_output_gate
            else None
        )
        # True: q, k, v and the output gate's pre-activation as one product (`hyla.layers.projections`; a training
        # setting, `hyla.models.modeling.use_fused_projections`).
        self.fuse_projections = False

    def project(self, hidden_states: torch.Tensor, context: MixerContext):
        """The mixer's input side: q, k, v [B, T, heads, D] of hidden_states [B, T, hidden] (the linear maps, then
        `prepare_qkv`)."""
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self.prepare_qkv(q, k, v, context)

    def prepare_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: MixerContext):
        """q/k/v from their linear maps to [B, T, heads, D], with q/k norms, RoPE and logit scaling as the layer has
        them; shared with the inference engine's fused projections."""
        batch, length = q.shape[:2]
        q = q.view(batch, length, self.num_heads, self.head_dim)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = apply_rotary(q, *context.rope), apply_rotary(k, *context.rope)
        scale = self.logit_scale(context)
        if scale is not None:
            # Queries are scaled, keys are cached unscaled: the same formula serves prefill and decode.
            q = q * scale[:, :, None, None].to(q.dtype)
        return q, k, v

    def logit_scale(self, context: MixerContext) -> torch.Tensor | None:
        """float64 [B, T] factor of this call's queries, or None (`query_logit_scale`)."""
        return query_logit_scale(self.config, context.options, context.position_ids, nope=not self.use_rope)

    def window(self, options: InferenceOptions) -> int | None:
        """This layer's sliding window under `options`: EME limits RoPE attention to `eme_window` (docs/method.md,
        "EME"); NoPE stays global."""
        return options.eme_window if self.use_rope else None

    def _mask(self, context: MixerContext, query_length: int) -> torch.Tensor | None:
        mask = None
        if context.key_mask is not None:
            mask = context.key_mask[:, None, None, :]
        if context.cu_seqlens is not None:
            mask = packed_document_mask(context.cu_seqlens, query_length)
        return mask

    def forward(self, hidden_states: torch.Tensor, context: MixerContext) -> torch.Tensor:
        q, k, v, gate = project_with_gate(self, hidden_states, context)
        if context.cache is not None:
            k, v = context.cache.update_kv(self.layer_idx, k, v)
        mask, window = self._mask(context, q.shape[1]), self.window(context.options)
        if window is not None:
            # The cache holds every key; the queries reach only the last window + Tq - 1 of them.
            keep = window + q.shape[1] - 1
            k, v = k[:, -keep:], v[:, -keep:]
            mask = mask[..., -keep:] if mask is not None else None
        output = softmax_attention(q, k, v, scale=self.head_dim**-0.5, attention_mask=mask, window=window)
        return self.project_output(output, hidden_states, gate)

    def project_output(
        self, output: torch.Tensor, hidden_states: torch.Tensor, gate: torch.Tensor | None = None, linear=None
    ) -> torch.Tensor:
        """The mixer's tail, shared with the fast inference path: output [B, T, H, D] -> [B, T, hidden]. `gate`: the
        output gate's pre-activation (x W + b) when the caller computed it already; `linear`: F.linear's
        signature, computing o_proj instead of the module (the fast path's own matrix-vector kernel)."""
        output = output.reshape(hidden_states.shape[:2] + (-1,))
        if self.g_proj is not None:
            output = output * (self.g_proj(hidden_states) if gate is None else torch.sigmoid(gate))
        if linear is not None:
            return linear(output, self.o_proj.weight, self.o_proj.bias)
        return self.o_proj(output)

    def gate_projection(self) -> nn.Linear | None:
        """The linear map whose output `project_output` takes as `gate` (None without an output gate)."""
        return self.g_proj
