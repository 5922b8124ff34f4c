"""Weight transfer from a Llama-family teacher into HypeNet (docs/method.md, "Weight transfer").

Attention layers are copied as they are (a teacher's sliding-window layers become "swa" layers with its window). A
Lightning, GLA or GDN layer is built from the attention weights of the same layer: q and o projections (and, for
Lightning, the q/k norms) copied, k and v projections expanded from grouped (GQA) to one head per query head (query
head j takes teacher KV head j // g); the data-dependent gates of GLA and GDN start at Lightning's fixed per-head
decay. MLPs, norms, embeddings and the LM head are copied.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from hyla.layers.gdn import GatedDeltaNet
from hyla.layers.gla import GatedLinearAttention
from hyla.layers.lightning import LightningAttention
from hyla.layers.swa import SlidingWindowAttention
from hyla.models.configuration import HypeNetConfig
from hyla.models.loading import SUPPORTED_FAMILIES, check_supported
from hyla.models.modeling import HypeNetForCausalLM
from hyla.ops.lightning import lightning_log_decay

# Student layer types whose weights come from the teacher's attention: copied, or a linear twin built from it.
COPIED_LAYER_TYPES = ("attention", "attention_rope", "swa")
LINEAR_TWIN_TYPES = ("lightning", "gla", "gdn")
TRANSFER_LAYER_TYPES = (*COPIED_LAYER_TYPES, *LINEAR_TWIN_TYPES)


def _check_family(config) -> None:
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"teacher model_type {config.model_type!r} is not supported; supported: {', '.join(SUPPORTED_FAMILIES)}"
        )


def teacher_layer_windows(config) -> list[int | None]:
    """The key window of each teacher layer as the family's transformers code applies it: None for full causal
    attention, W for sliding-window attention (a query sees itself and the W - 1 keys before it).

    Llama ignores `layer_types` (full attention everywhere); Mistral applies `sliding_window`, when set, in every
    layer; Qwen2 and Qwen3 apply it in the layers their `layer_types` name "sliding_attention".
    """
    check_supported(config.model_type)
    num_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type == "llama":
        return [None] * num_layers
    if config.model_type == "mistral":
        return [window] * num_layers
    windows = []
    for index, kind in enumerate(getattr(config, "layer_types", None) or ["full_attention"] * num_layers):
        if kind not in ("full_attention", "sliding_attention"):
            raise ValueError(f"teacher layer {index} is {kind!r}; hyla converts 'full_attention' and "
                             "'sliding_attention' layers")
        if kind == "sliding_attention" and window is None:
            raise ValueError(f"teacher layer {index} is 'sliding_attention' but its config sets no sliding_window "
                             "(use_sliding_window is off)")
        windows.append(window if kind == "sliding_attention" else None)
    return windows


def check_full_attention(config, spec: str = "teacher") -> None:
    """Raise one clear `ValueError` unless every teacher layer has full attention (what HALO conversion needs)."""
    windows = teacher_layer_windows(config)
    windowed = [index for index, window in enumerate(windows) if window is not None]
    if windowed:
        raise ValueError(
            f"teacher {spec} has sliding-window attention (window {windows[windowed[0]]}) in layers {windowed}; "
            "HALO conversion needs full attention in every layer (to_hypenet keeps such layers as 'swa')"
        )


def student_layer_types(windows: list[int | None], layer_types: list[str] | None, *,
                        attention_rope: bool = False) -> list[str]:
    """The student's layer types: by default the teacher's own ("swa" where it has a window, else "attention");
    a given list may replace any layer by a linear mixer but never turns a sliding-window layer into full attention.
    With `attention_rope`, the "attention" layers are "attention_rope" (they keep the teacher's RoPE)."""
    if layer_types is None:
        layer_types = ["swa" if window is not None else "attention" for window in windows]
    for index, (kind, window) in enumerate(zip(layer_types, windows)):
        if window is not None and kind in ("attention", "attention_rope"):
            raise ValueError(f"teacher layer {index} is sliding-window attention (window {window}); give it 'swa' "
                             f"(the same window) or 'lightning', not {kind!r}")
    return ["attention_rope" if attention_rope and kind == "attention" else kind for kind in layer_types]


def hypenet_config_from_teacher(
    teacher: nn.Module, layer_types: list[str] | None = None, *, attention_rope: bool = False, **overrides
) -> HypeNetConfig:
    """A HypeNet config with the teacher's sizes, norms, biases, RoPE, head tying and attention windows; with
    `attention_rope`, its "attention" layers are "attention_rope"."""
    config = teacher.config
    _check_family(config)
    windows = teacher_layer_windows(config)
    # The supported families have one window for all their sliding-window layers.
    teacher_window = next((window for window in windows if window is not None), None)
    attn = teacher.model.layers[0].self_attn
    mlp = teacher.model.layers[0].mlp
    num_layers = config.num_hidden_layers
    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads or config.num_attention_heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        rope_parameters=dict(config.rope_parameters),
        qkv_bias=attn.q_proj.bias is not None,
        o_bias=attn.o_proj.bias is not None,
        mlp_bias=mlp.gate_proj.bias is not None,
        attention_qk_norm=getattr(attn, "q_norm", None) is not None,
        layer_types=student_layer_types(windows, layer_types, attention_rope=attention_rope),
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    if teacher_window is not None:
        kwargs["swa_window"] = teacher_window
    kwargs.update(overrides)
    return HypeNetConfig(**kwargs)


def expand_kv_heads(weight: torch.Tensor, num_kv_heads: int, groups: int) -> torch.Tensor:
    """[Hkv * d, ...] grouped rows -> [Hkv * g * d, ...]: query head j gets the rows of KV head j // g."""
    rows = weight.reshape(num_kv_heads, -1, *weight.shape[1:])
    return rows.repeat_interleave(groups, dim=0).reshape(-1, *weight.shape[1:])


def _placed_like(twin: nn.Module, teacher_attention: nn.Module) -> nn.Module:
    reference = teacher_attention.q_proj.weight
    return twin.to(device=reference.device, dtype=reference.dtype)


@torch.no_grad()
def _copy_projections(twin: nn.Module, teacher_attention: nn.Module, config: HypeNetConfig) -> None:
    """q and o copied; k and v expanded from the teacher's KV heads to one per query head (`expand_kv_heads`)."""
    groups = config.num_attention_heads // config.num_key_value_heads
    twin.q_proj.load_state_dict(teacher_attention.q_proj.state_dict())
    twin.o_proj.load_state_dict(teacher_attention.o_proj.state_dict())
    for name in ("k_proj", "v_proj"):
        source, target = getattr(teacher_attention, name), getattr(twin, name)
        target.weight.copy_(expand_kv_heads(source.weight, config.num_key_value_heads, groups))
        if source.bias is not None:
            target.bias.copy_(expand_kv_heads(source.bias, config.num_key_value_heads, groups))


@torch.no_grad()
def lightning_from_attention(teacher_attention: nn.Module, config: HypeNetConfig, layer_idx: int) -> LightningAttention:
    """A Lightning layer initialised from one teacher attention layer (its twin for alignment)."""
    twin = _placed_like(LightningAttention(config, layer_idx), teacher_attention)
    _copy_projections(twin, teacher_attention, config)
    if twin.q_norm is not None:
        for name in ("q_norm", "k_norm"):
            source = getattr(teacher_attention, name, None)
            getattr(twin, name).weight.copy_(source.weight if source is not None else 1.0)
    twin.o_norm.weight.fill_(1.0)
    if twin.z_proj is not None:
        twin.z_proj.weight.normal_(0.0, config.initializer_range)
    return twin


def gla_gate_bias(log_decay: torch.Tensor, normalizer: float) -> torch.Tensor:
    """The GLA gate bias b whose gate logsigmoid(b) / n equals `log_decay` (< 0): b = -log(expm1(-n log_decay)),
    in float64."""
    return -torch.expm1(-normalizer * log_decay.double()).log()


@torch.no_grad()
def gla_from_attention(teacher_attention: nn.Module, config: HypeNetConfig,
                       layer_idx: int) -> GatedLinearAttention:
    """A GLA layer initialised from one teacher attention layer: q/k/v/o as for Lightning (GLA has no q/k norms: the
    teacher's are not carried; its RoPE is, with `config.gla_rope`, at the theta and scaling of the config's
    `rope_parameters`, which `hypenet_config_from_teacher` copies from the teacher). The gate's second low-rank map
    W2 starts at zero and its bias at `gla_gate_bias` of Lightning's log-decay g_h, so every token's gate is g_h on
    every key channel of head h: the twin starts as linear attention with Lightning's fixed decay, and W2's gradient,
    (x W1)^T dg, is not zero, so the gate becomes data-dependent as the alignment trains. W1 and the output gate's
    Wg start random (std `initializer_range`, as Lightning's output gate; stage 1's `twin_init` then opens Wg along
    the mean input, hyla.convert.calibrate); the per-head output norm at 1."""
    twin = _placed_like(GatedLinearAttention(config, layer_idx), teacher_attention)
    _copy_projections(twin, teacher_attention, config)
    low_rank, full_rank = twin.gk_proj
    low_rank.weight.normal_(0.0, config.initializer_range)
    full_rank.weight.zero_()
    bias = gla_gate_bias(lightning_log_decay(config.num_attention_heads), config.gla_gate_logit_normalizer)
    full_rank.bias.copy_(bias.repeat_interleave(config.head_dim))
    twin.g_proj.weight.normal_(0.0, config.initializer_range)
    twin.o_norm.weight.fill_(1.0)
    return twin


# softplus(DT_BIAS_AT_ONE) = 1: the GDN decay's data-dependent factor starts at 1.
DT_BIAS_AT_ONE = math.log(math.e - 1.0)


@torch.no_grad()
def gdn_from_attention(teacher_attention: nn.Module, config: HypeNetConfig, layer_idx: int) -> GatedDeltaNet:
    """A Gated DeltaNet layer initialised from one teacher attention layer: q/k/v/o as for Lightning (GDN's own
    silu and L2 norm apply on top; the teacher's q/k norms are not carried, its RoPE only with `config.gdn_rope`, as
    GLA's).

    Decay: g = -exp(A_log) * softplus(x Wa + dt_bias) with Wa = 0, dt_bias = softplus^-1(1) and A_log = log(-g_h),
    so g = g_h, Lightning's per-head log-decay, on every token; Wa's gradient is not zero (softplus' slope there is
    1 - 1/e), so the decay becomes data-dependent as the alignment trains.

    Write strength: beta = sigmoid(x Wb) with Wb = 0, i.e. beta = 1/2 on every token. The layer's beta has no bias,
    so a data-independent start is sigmoid(0) = 1/2, its steepest point, where Wb learns fastest; random Wb would only
    add noise around it. With beta = 1/2 the twin starts close to linear attention: for keys orthogonal to those
    already stored, (I - beta k^T k) leaves the state unchanged and the state is half the linear-attention state
    with the same decay, a factor that the per-head output norm removes; overlapping keys are partly overwritten
    (the delta rule), which linear attention does not do. The output gate's Wg starts random (std
    `initializer_range`; opened by stage 1's `twin_init` as GLA's); the per-head output norm at 1."""
    twin = _placed_like(GatedDeltaNet(config, layer_idx), teacher_attention)
    _copy_projections(twin, teacher_attention, config)
    twin.a_proj.weight.zero_()
    twin.b_proj.weight.zero_()
    twin.dt_bias.fill_(DT_BIAS_AT_ONE)
    twin.A_log.copy_((-lightning_log_decay(config.num_attention_heads)).log())
    twin.g_proj.weight.normal_(0.0, config.initializer_range)
    twin.o_norm.weight.fill_(1.0)
    return twin


@torch.no_grad()
def swa_from_attention(teacher_attention: nn.Module, config: HypeNetConfig,
                       layer_idx: int) -> SlidingWindowAttention:
    """The teacher's attention layer itself (GQA, q/k norms, RoPE) restricted to the window `config.swa_window`:
    equal to the teacher's layer on sequences no longer than the window, so it needs no alignment."""
    twin = _placed_like(SlidingWindowAttention(config, layer_idx), teacher_attention)
    _copy_attention(twin, teacher_attention)
    return twin


@torch.no_grad()
def _copy_attention(target: nn.Module, source: nn.Module) -> None:
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        getattr(target, name).load_state_dict(getattr(source, name).state_dict())
    if target.q_norm is not None:
        target.q_norm.weight.copy_(source.q_norm.weight)
        target.k_norm.weight.copy_(source.k_norm.weight)


@torch.no_grad()
def to_hypenet(
    teacher: nn.Module,
    layer_types: list[str] | None = None,
    *,
    attention_rope: bool = False,
    **config_overrides,
) -> HypeNetForCausalLM:
    """Build a HypeNet from a Llama/Mistral/Qwen2/Qwen3 teacher (`*ForCausalLM`).

    layer_types: one of TRANSFER_LAYER_TYPES per layer ("attention", "attention_rope" and "swa" copy the teacher's
        attention, "lightning", "gla" and "gdn" build its twin of that type, `TWIN_BUILDERS`); None keeps the
        teacher's attention in every layer, "swa" where the teacher has sliding-window attention. A sliding-window
        teacher layer may not become full attention.
    attention_rope: the "attention" layers keep the teacher's RoPE ("attention_rope": the teacher-equivalent
        configuration); HypeNet drops it.
    """
    config = hypenet_config_from_teacher(teacher, layer_types, attention_rope=attention_rope, **config_overrides)
    other = [(index, kind) for index, kind in enumerate(config.layer_types) if kind not in TRANSFER_LAYER_TYPES]
    if other:
        index, kind = other[0]
        raise ValueError(f"layer {index} is {kind!r}; to_hypenet builds {', '.join(TRANSFER_LAYER_TYPES)} layers "
                         "from a teacher")
    reference = teacher.model.embed_tokens.weight
    student = HypeNetForCausalLM(config).to(device=reference.device, dtype=reference.dtype).eval()
    student.model.embed_tokens.load_state_dict(teacher.model.embed_tokens.state_dict())
    student.model.norm.weight.copy_(teacher.model.norm.weight)
    if not config.tie_word_embeddings:
        student.lm_head.load_state_dict(teacher.lm_head.state_dict())
    for idx, (block, source) in enumerate(zip(student.model.layers, teacher.model.layers)):
        block.input_layernorm.weight.copy_(source.input_layernorm.weight)
        block.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight)
        block.mlp.load_state_dict(source.mlp.state_dict())
        if block.layer_type in COPIED_LAYER_TYPES:
            _copy_attention(block.mixer, source.self_attn)
        else:
            block.mixer = TWIN_BUILDERS[block.layer_type](source.self_attn, config, idx)
    if config.tie_word_embeddings:
        student.tie_weights()
    return student


# How each mixer a conversion may give its non-attention layers ("model.rnn_mixer") is built from the teacher's
# attention layer: `TWIN_BUILDERS[kind](teacher_attention, config, layer_idx)`.
TWIN_BUILDERS = {"lightning": lightning_from_attention, "gla": gla_from_attention, "gdn": gdn_from_attention,
                 "swa": swa_from_attention}
