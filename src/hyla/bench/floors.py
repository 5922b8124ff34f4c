"""Lower bounds on time from counted work: bytes per decoded token over memory bandwidth, prefill FLOPs over the
matrix rate. Ceilings measured on the reference H200 (docs/method.md, "Reference GPU")."""

from __future__ import annotations

from dataclasses import dataclass

COPY_BANDWIDTH = 4.22e12  # bytes/s, device-to-device copy (read + write), measured
MATMUL_RATE = 783e12  # FLOP/s, bf16 matmul, measured
# fla's chunked Lightning kernel works in chunks of 64 positions.
LIGHTNING_CHUNK = 64


@dataclass(frozen=True)
class ModelShape:
    num_params: int  # unique parameters (tied embeddings counted once)
    matmul_params: int  # parameters used as matrices per token (no embedding lookup; LM head for the last token only)
    num_attention_layers: int
    num_lightning_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    weight_bytes: int  # bytes per parameter times num_params

    @classmethod
    def of(cls, model) -> ModelShape:
        config = model.config
        num_params = sum(p.numel() for p in model.parameters())
        embedding = model.get_input_embeddings().weight.numel()
        layer_types = getattr(config, "layer_types", None) or ["attention"] * config.num_hidden_layers
        dtype_bytes = next(model.parameters()).element_size()
        return cls(
            num_params=num_params, matmul_params=num_params - embedding,
            num_attention_layers=sum(kind != "lightning" for kind in layer_types),
            num_lightning_layers=sum(kind == "lightning" for kind in layer_types),
            num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
            weight_bytes=num_params * dtype_bytes,
        )

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.num_attention_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    def state_bytes(self) -> int:
        return self.num_lightning_layers * self.num_heads * self.head_dim**2 * 4

    def decode_bytes(self, context: int, batch: int) -> int:
        """Bytes one decode step must move: every weight once, every row's KV cache read, every fp32 state read and
        written."""
        return self.weight_bytes + batch * (context * self.kv_bytes_per_token() + 2 * self.state_bytes())

    def decode_floor_ms(self, context: int, batch: int = 1) -> float:
        return 1e3 * self.decode_bytes(context, batch) / COPY_BANDWIDTH

    def prefill_flops(self, length: int) -> float:
        """Forward FLOPs of a causal prefill of `length` tokens: 2 per matrix parameter per token, causal attention
        2 T^2 H D per layer (QK^T and PV over the lower triangle), chunked Lightning 4 C D + 4 D^2 per token and
        head."""
        linear = 2.0 * self.matmul_params * length
        attention = self.num_attention_layers * 2.0 * length**2 * self.num_heads * self.head_dim
        lightning = self.num_lightning_layers * length * self.num_heads * (
            4.0 * LIGHTNING_CHUNK * self.head_dim + 4.0 * self.head_dim**2
        )
        return linear + attention + lightning

    def prefill_floor_s(self, length: int) -> float:
        return self.prefill_flops(length) / MATMUL_RATE
