"""Lightning attention layer: HypeNet's RNN mixer (docs/method.md, "Lightning layer").

q = RMSNorm_q(x Wq), k = RMSNorm_k(x Wk), v = x Wv, RoPE on q and k, fixed per-head decay gamma_h = exp(-2^(-8h/H)),
output RMSNorm over all heads, times sigmoid(x Wz), then Wo. K/V heads are full multi-head (no GQA sharing).
"""

from __future__ import annotations

import torch
from torch import nn

from hyla.layers.context import MixerContext
from hyla.layers.linear_mixer import run_linear_op
from hyla.layers.norm import RMSNorm
from hyla.layers.projections import project_with_gate
from hyla.layers.rope import apply_rotary
from hyla.ops.lightning import decay_is_chunk_safe, lightning_attention, lightning_log_decay


class LightningAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.use_rope = config.lightning_rope
        width = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps) if config.lightning_qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps) if config.lightning_qk_norm else None
        self.o_norm = RMSNorm(width, eps=config.rms_norm_eps)
        self.z_proj = nn.Linear(config.hidden_size, width, bias=False) if config.lightning_output_gate else None
        # Fixed, not learned, identical in every layer: a float64 constant outside the state dict and outside
        # `module.to(dtype)`, converted by the op to its accumulation precision.
        self._log_decay = lightning_log_decay(self.num_heads)
        self._log_decay_by_device: dict[torch.device, torch.Tensor] = {self._log_decay.device: self._log_decay}
        # Known here, from the CPU constant: the GPU op need not read the decays back from the device at every call.
        self._chunk_safe = decay_is_chunk_safe(self._log_decay)
        # True: q, k, v and the output gate's pre-activation as one product (`hyla.layers.projections`; a training
        # setting, `hyla.models.modeling.use_fused_projections`).
        self.fuse_projections = False

    @property
    def chunk_safe(self) -> bool:
        """Whether every head's decay suits fla's chunk kernel (known from the CPU constant, so that callers of the
        op need not read the decays back from the device)."""
        return self._chunk_safe

    def log_decay(self, device: torch.device) -> torch.Tensor:
        """The per-head log-decay g_h = -2^(-8h/H) (float64 [H]) on `device`, copied there once."""
        if device not in self._log_decay_by_device:
            self._log_decay_by_device[device] = self._log_decay.to(device)
        return self._log_decay_by_device[device]

    def _apply(self, fn, recurse=True):
        # The decay follows the module to its device (`.to`, `.cuda`): a compiled forward then finds it there from
        # its first call, instead of tracing the copy once and recompiling when the cache has filled.
        module = super()._apply(fn, recurse)
        self.log_decay(self.q_proj.weight.device)
        return module

    def project(self, hidden_states: torch.Tensor, context: MixerContext):
        """The mixer's input side: q, k, v [B, T, heads, D] of hidden_states [B, T, hidden] (the linear maps, then
        `prepare_qkv`)."""
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self.prepare_qkv(q, k, v, context)

    def prepare_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: MixerContext):
        """q/k/v from their linear maps ([B, T, width] each) to [B, T, H, D], with q/k norms and RoPE; shared with
        the inference engine's fused projections."""
        shape = q.shape[:2] + (self.num_heads, self.head_dim)
        q, k, v = q.view(shape), k.view(shape), v.view(shape)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = apply_rotary(q, *context.rope), apply_rotary(k, *context.rope)
        if context.token_mask is not None:
            # A zero key adds nothing to the state: left padding leaves the state at its initial zero.
            k = k * context.token_mask[:, :, None, None].to(k.dtype)
        return q, k, v

    def forward(self, hidden_states: torch.Tensor, context: MixerContext) -> torch.Tensor:
        q, k, v, gate = project_with_gate(self, hidden_states, context)
        # The cached state, or SWLA windows under EME (hyla.layers.linear_mixer).
        output = run_linear_op(
            lightning_attention, self.layer_idx, q, k, v, context,
            log_decay=self.log_decay(q.device), scale=self.head_dim**-0.5, chunk_safe=self._chunk_safe,
        )
        return self.project_output(output, hidden_states, gate)

    def project_output(
        self, output: torch.Tensor, hidden_states: torch.Tensor, gate: torch.Tensor | None = None, linear=None
    ) -> torch.Tensor:
        """The mixer's tail, shared with the fast inference path: output [B, T, H, D] -> [B, T, hidden]. `gate`: the
        output gate's pre-activation z_proj(hidden_states) when the caller computed it already; `linear`: F.linear's
        signature, computing o_proj instead of the module (the fast path's own matrix-vector kernel)."""
        output = self.o_norm(output.reshape(hidden_states.shape[:2] + (-1,)))
        if self.z_proj is not None:
            output = output * torch.sigmoid(self.z_proj(hidden_states) if gate is None else gate)
        if linear is not None:
            return linear(output, self.o_proj.weight, self.o_proj.bias)
        return self.o_proj(output)

    def gate_projection(self) -> nn.Linear | None:
        """The linear map whose output `project_output` takes as `gate` (None without an output gate)."""
        return self.z_proj
