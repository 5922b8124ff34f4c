"""The benchmarked model shapes, as configs: HypeNet-2B (docs/method.md, "HypeNet" sizes), the Qwen3-1.7B shape on
hyla's own engine (every layer RoPE attention), and the Qwen3-1.7B shape for HF transformers; plus toy versions for CPU
smoke tests."""

from __future__ import annotations

from hyla.models.configuration import LINEAR_LAYER_TYPES, HypeNetConfig

HYPENET_2B_ATTENTION_LAYERS = (2, 3, 6, 8, 9, 21, 25)
QWEN3_1P7B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, max_position_embeddings=1048576,
)
TOY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=4096,
)
TOY_ATTENTION_LAYERS = (1,)
# SmolLM2-135M's sizes (the teacher hyla converts in docs/results/smollm2-135m.md), with 7 of its 30 layers kept
# attention, as a converted student of it has.
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, max_position_embeddings=8192,
)
SMOLLM2_135M_ATTENTION_LAYERS = (2, 6, 10, 14, 18, 22, 26)
# The toy of the converted shape: head dimension 32, so that hyla's fused Lightning kernel takes it too.
TOY_CONVERTED = dict(TOY, num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def parse_case(text: str, kinds: tuple[str, ...], *, what: str, example: str,
               min_length: int = 1) -> tuple[str, int, int]:
    """A benchmark case `KIND:BATCHxLEN` (e.g. `distill:16x4096`) as (kind, batch, length); ValueError in one line
    for any other text, a kind not in `kinds`, a batch below 1 or a length below `min_length`. what: the first
    part's name in the message ("stage", "loss")."""
    try:
        kind, shape = text.strip().split(":")
        batch, length = (int(part) for part in shape.lower().split("x"))
    except ValueError:
        raise ValueError(f"case {text!r} is not {what.upper()}:BATCHxLEN (e.g. {example})") from None
    if kind not in kinds or batch < 1 or length < min_length:
        raise ValueError(f"case {text!r}: {what} one of {', '.join(kinds)}, batch >= 1, length >= {min_length}")
    return kind, batch, length


def hypenet_config(*, toy: bool = False) -> HypeNetConfig:
    """HypeNet-2B: Lightning everywhere but 7 NoPE attention layers with output gates and logit scaling a = 500."""
    sizes = TOY if toy else QWEN3_1P7B
    attention = TOY_ATTENTION_LAYERS if toy else HYPENET_2B_ATTENTION_LAYERS
    layer_types = ["attention" if i in attention else "lightning" for i in range(sizes["num_hidden_layers"])]
    return HypeNetConfig(
        **sizes, layer_types=layer_types, attention_qk_norm=True, attention_output_gate=True,
        attention_logit_scaling_a=500.0,
    )


def qwen3_engine_config(*, toy: bool = False) -> HypeNetConfig:
    """The Qwen3-1.7B shape as a HypeNetConfig: every layer RoPE attention with q/k norms, no gate, no scaling."""
    sizes = TOY if toy else QWEN3_1P7B
    return HypeNetConfig(
        **sizes, layer_types=["attention_rope"] * sizes["num_hidden_layers"], attention_qk_norm=True,
        attention_output_gate=False, attention_logit_scaling_a=None,
    )


def qwen3_hf_config(*, toy: bool = False):
    from transformers import Qwen3Config

    sizes = dict(TOY if toy else QWEN3_1P7B)
    return Qwen3Config(**sizes, attn_implementation="sdpa")


def converted_135m_config(*, toy: bool = False, rnn_mixer: str = "lightning") -> HypeNetConfig:
    """A HypeNet of the shape hyla converts SmolLM2-135M to: its sizes, 7 NoPE attention layers (output gates,
    logit scaling a = 500, no q/k norms: SmolLM2 has none) and `rnn_mixer` layers (Lightning, GLA or GDN, each with
    the config's defaults) everywhere else, as a conversion's `model.rnn_mixer` makes them."""
    if rnn_mixer not in LINEAR_LAYER_TYPES:
        raise ValueError(f"rnn_mixer must be one of {', '.join(LINEAR_LAYER_TYPES)}, got {rnn_mixer!r}")
    sizes = TOY_CONVERTED if toy else SMOLLM2_135M
    attention = TOY_ATTENTION_LAYERS if toy else SMOLLM2_135M_ATTENTION_LAYERS
    layer_types = ["attention" if i in attention else rnn_mixer for i in range(sizes["num_hidden_layers"])]
    return HypeNetConfig(
        **sizes, layer_types=layer_types, attention_qk_norm=False, attention_output_gate=True,
        attention_logit_scaling_a=500.0,
    )
