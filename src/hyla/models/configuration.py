"""HypeNet configuration: a Llama/Qwen-style decoder whose mixer is named per layer in `layer_types`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters

# Mixers a layer may use; later families register more in hyla.models.mixers.
LAYER_TYPES = ("lightning", "attention")


def default_layer_types(num_layers: int) -> list[str]:
    """Three Lightning layers, then one attention layer, repeated (about a quarter attention)."""
    return ["attention" if i % 4 == 3 else "lightning" for i in range(num_layers)]


@strict
class HypeNetConfig(PreTrainedConfig):
    r"""
    layer_types (`list[str]`): the mixer of each layer, "lightning" or "attention". Default: 3 Lightning then 1
        attention, repeated.
    attn_logits_scaling_a (`float`, *optional*): the constant a of the per-query logit scaling
        s_t = log(t + a) / log(a) in attention layers; None turns scaling off.
    attention_rope (`bool`): RoPE in attention layers (False = NoPE, the HypeNet design).
    attention_qk_norm (`bool`): per-head RMSNorm on q and k in attention layers (as the teacher has them).
    attention_output_gate (`bool`): sigmoid(x W_g + b_g) gate on the attention output, before o_proj.
    attention_gate_init_bias (`float`): initial b_g of a new gate (W_g starts at 0), so the gate starts at
        sigmoid(b_g) and a converted model starts close to its teacher.
    lightning_rope, lightning_qk_norm, lightning_output_gate (`bool`): the Lightning layer's RoPE, q/k RMSNorm and
        sigmoid output gate (each on in HypeNet; off for ablations).
    attention_bias (`bool`): biases on q/k/v projections (Qwen2 style); attention_out_bias on o_proj.
    """

    model_type = "hypenet"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    layer_types: list[str] | None = None
    attn_logits_scaling_a: float | None = None
    attention_rope: bool = False
    attention_qk_norm: bool = False
    attention_output_gate: bool = False
    attention_gate_init_bias: float = 4.0
    lightning_rope: bool = True
    lightning_qk_norm: bool = True
    lightning_output_gate: bool = True

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.layer_types is None:
            self.layer_types = default_layer_types(self.num_hidden_layers)
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        super().__post_init__(**kwargs)

    def validate_layer_type(self):
        # transformers' check only knows its own layer names; ours are validated in validate_architecture.
        return

    def validate_architecture(self):
        """Checked at construction and load: every mismatch is one clear ValueError."""
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers"
            )
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"unknown layer types {unknown}; supported: {', '.join(LAYER_TYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.attn_logits_scaling_a is not None and self.attn_logits_scaling_a <= 1:
            raise ValueError(f"attn_logits_scaling_a must be > 1 or None, got {self.attn_logits_scaling_a}")

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == "attention"]
