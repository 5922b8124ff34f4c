"""HypeNet configuration: a Llama/Qwen-style decoder whose mixer is named per layer in `layer_types`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters

# Mixers a layer may use (docs/family.md): efficient mixers, softmax attention (NoPE "attention", RoPE
# "attention_rope" and "swa"), and head-wise hybrids "hh_<efficient>" whose heads split between an efficient mixer
# and NoPE attention in the ratio `headwise_ratio`.
EFFICIENT_LAYER_TYPES = ("lightning", "gla", "gdn", "swa")
LINEAR_LAYER_TYPES = ("lightning", "gla", "gdn")
HEADWISE_LAYER_TYPES = tuple(f"hh_{kind}" for kind in EFFICIENT_LAYER_TYPES)
LAYER_TYPES = ("lightning", "attention", "attention_rope", "swa", "gla", "gdn", *HEADWISE_LAYER_TYPES)
# Layer types that keep a key/value cache (all but the pure recurrent ones).
KV_LAYER_TYPES = ("attention", "attention_rope", "swa", *HEADWISE_LAYER_TYPES)

# Fields of configs saved by earlier versions, read at load: old name -> its name now.
RENAMED_FIELDS = {
    "attn_logits_scaling_a": "attention_logit_scaling_a",
    "attention_bias": "qkv_bias",
    "attention_out_bias": "o_bias",
    "sliding_window": "swa_window",
}
# The key `layer_types` is saved under in config.json (hyla.models.hf.complete_folder): transformers checks a config's
# `layer_types` against its own layer names wherever it reads config.json without hyla's class (AutoTokenizer always
# does: without `import hyla` it falls back to a plain PreTrainedConfig), so a saved folder keeps hyla's names apart.
SAVED_LAYER_TYPES_KEY = "hypenet_layer_types"
# Inference options that earlier versions kept in the config (now hyla.layers.context.InferenceOptions), with the
# value that ran the model as saved.
MOVED_TO_INFERENCE_OPTIONS = {"logit_scaling": "per_query", "logit_scaling_train_length": None, "eme_window": None,
                              "eme_stride": None}


def parse_ratio(ratio: str) -> tuple[int, int]:
    """"E:N" -> (E, N), two non-negative integers, not both zero (head-wise and layer-wise hybrid ratios)."""
    parts = ratio.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or sum(map(int, parts)) == 0:
        raise ValueError(f"a ratio looks like '3:1' (two non-negative integers, not both 0), got {ratio!r}")
    efficient, global_ = map(int, parts)
    return efficient, global_


def default_layer_types(num_layers: int) -> list[str]:
    """Three Lightning layers, then one attention layer, repeated (about a quarter attention)."""
    return ["attention" if i % 4 == 3 else "lightning" for i in range(num_layers)]


@strict
class HypeNetConfig(PreTrainedConfig):
    r"""
    Fields without a prefix apply to every layer; a mixer's own options start with its layer type (`attention_`,
    `lightning_`, `gla_`, `gdn_`, `swa_`, `headwise_`). How the model runs at inference (logit scaling mode, EME) is
    not part of the config: it is passed per call as `hyla.InferenceOptions`.

    layer_types (`list[str]`): the mixer of each layer, one of LAYER_TYPES: "lightning", "gla", "gdn", "swa",
        "attention" (NoPE), "attention_rope" (RoPE), or a head-wise hybrid "hh_<lightning|gla|gdn|swa>"
        (docs/family.md; hyla.models.layouts builds LH/YOCO-like/HH lists). Default: 3 Lightning then 1 attention,
        repeated.
    qkv_bias (`bool`): biases on every mixer's q/k/v projections (Qwen2 style); o_bias on its o_proj.
    attention_logit_scaling_a (`float`, *optional*): the constant a of the per-query logit scaling
        s_t = log(t + a) / log(a) in full softmax attention layers ("attention", "attention_rope", the NoPE heads of
        "hh_*"); None turns scaling off. The conversion chooses it (docs/method.md, "Attention layer and logit
        scaling"); `InferenceOptions` may override it for a call.
    attention_qk_norm (`bool`): per-head RMSNorm on q and k in attention layers (as the teacher has them).
    attention_output_gate (`bool`): sigmoid(x W_g + b_g) gate on the attention output, before o_proj.
    attention_gate_init_bias (`float`): initial b_g of a new gate (W_g starts at 0), so the gate starts at
        sigmoid(b_g) and a converted model starts close to its teacher.
    lightning_rope, lightning_qk_norm, lightning_output_gate (`bool`): the Lightning layer's RoPE, q/k RMSNorm and
        sigmoid output gate (each on in HypeNet; off for ablations).
    gla_gate_low_rank_dim, gla_gate_logit_normalizer: GLA's gate alpha_t = exp(logsigmoid(x W1 W2 + b) / n), as
        fla's GLA layer (rank 16, n = 16).
    gla_rope, gdn_rope (`bool`): RoPE on the q and k of GLA / GDN layers (also in "hh_gla" / "hh_gdn"), at the
        token's absolute position with the model's `rope_parameters`, as Lightning's; GDN rotates after its SiLU and
        before its L2 norm. Off by default (seed 003's layers: the gates are the only position signal); on, a
        converted GLA/GDN twin keeps its RoPE-trained teacher's relative rotations (HyPE: RoPE in the RNN layers).
    swa_window (`int`): the window W of "swa" layers (a query sees itself and the W - 1 keys before it).
    headwise_ratio (`str`): "E:N", how the heads of an "hh_*" layer split between the efficient mixer (E parts) and
        NoPE attention (N parts), e.g. "3:1", "1:1"; "1:0" and "0:1" give the pure mixers.

    Configs saved by earlier versions load to the same model: the old names of RENAMED_FIELDS are read under
    their new names, `attention_rope=True` turns every "attention" layer into "attention_rope", and the inference
    options they carried (MOVED_TO_INFERENCE_OPTIONS) are dropped when they hold the value that ran the model as
    saved; any other value is refused with the `InferenceOptions` to pass instead. One combination has no
    equivalent and is refused: "attention_rope" layers together with a logit-scaling a (those layers ignored a).
    """

    model_type = "hypenet"
    # Trainer drops these output fields at evaluation: the cache, under its old and its new (5.24) name.
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

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
    layer_types: list[str] | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    attention_logit_scaling_a: float | None = None
    attention_qk_norm: bool = False
    attention_output_gate: bool = False
    attention_gate_init_bias: float = 4.0
    lightning_rope: bool = True
    lightning_qk_norm: bool = True
    lightning_output_gate: bool = True
    gla_gate_low_rank_dim: int = 16
    gla_gate_logit_normalizer: float = 16.0
    gla_rope: bool = False
    gdn_rope: bool = False
    swa_window: int = 128
    headwise_ratio: str = "3:1"

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.layer_types is None:
            self.layer_types = default_layer_types(self.num_hidden_layers)
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        self._read_earlier_fields(kwargs)
        layer_types = list(self.layer_types)
        super().__post_init__(**kwargs)
        # transformers >= 5.18 renames its legacy layer type "attention" to "full_attention" in every config;
        # hyla's layer types are its own names (LAYER_TYPES), so they are put back.
        self.layer_types = layer_types

    def _read_earlier_fields(self, kwargs: dict) -> None:
        """Map (and remove from `kwargs`) what configs saved by earlier versions spell differently, and the layer
        types as a saved folder's config.json holds them."""
        if SAVED_LAYER_TYPES_KEY in kwargs:
            self.layer_types = kwargs.pop(SAVED_LAYER_TYPES_KEY)
        for old, new in RENAMED_FIELDS.items():
            if old in kwargs:
                setattr(self, new, kwargs.pop(old))
        # Every config an earlier version saved has the flag; there, "attention_rope" layers scaled no logits.
        if "attention_rope" in kwargs and "attention_rope" in self.layer_types and self.attention_logit_scaling_a:
            raise ValueError("this config, saved by an earlier hyla, has 'attention_rope' layers and "
                             f"attn_logits_scaling_a={self.attention_logit_scaling_a}: those layers did not scale "
                             "their logits then and do now (every full attention layer does), so it cannot load as "
                             "the same model")
        if kwargs.pop("attention_rope", False):
            self.layer_types = ["attention_rope" if kind == "attention" else kind for kind in self.layer_types]
        for name, neutral in MOVED_TO_INFERENCE_OPTIONS.items():
            value = kwargs.pop(name, neutral)
            if value != neutral:
                raise ValueError(f"this config sets {name}={value!r}, an inference option now: remove it from the "
                                 f"config and pass hyla.InferenceOptions({name}={value!r}) at inference")

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
        a = self.attention_logit_scaling_a
        if a is not None and a <= 1:
            raise ValueError(f"attention_logit_scaling_a must be > 1 or None, got {a}")
        self.validate_family()

    def validate_family(self):
        """The GLA/GDN/SWA and head-wise settings (docs/family.md)."""
        if self.swa_window < 1:
            raise ValueError(f"swa_window must be >= 1, got {self.swa_window}")
        if any(kind.startswith("hh_") for kind in self.layer_types):
            self.headwise_split()

    def headwise_split(self) -> tuple[int, int]:
        """(efficient heads, NoPE heads) of an "hh_*" layer from `headwise_ratio` "E:N" and num_attention_heads;
        the NoPE heads keep the model's query-to-KV-head grouping."""
        efficient_parts, nope_parts = parse_ratio(self.headwise_ratio)
        heads = self.num_attention_heads
        group = heads // self.num_key_value_heads
        nope_heads, remainder = divmod(heads * nope_parts, efficient_parts + nope_parts)
        if remainder or nope_heads % group:
            raise ValueError(
                f"headwise_ratio {self.headwise_ratio} does not split {heads} heads into whole groups of {group} "
                "query heads per KV head"
            )
        return heads - nope_heads, nope_heads

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == "attention"]
