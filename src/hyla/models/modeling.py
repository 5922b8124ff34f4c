"""HypeNet: a decoder stack `x += Mixer(RMSNorm(x)); x += SwiGLU(RMSNorm(x))` whose mixer is chosen per layer
(Lightning RNN or softmax attention), with an LM head; HF-compatible (save/load, generate) on CPU and GPU.

How the model runs at inference (logit scaling, EME) is an `InferenceOptions` given to `forward` or `generate`
(`inference_options=`), or set for every later call as `model.inference_options`; it is never part of the config, so
a saved model is the model as trained."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from hyla.layers.attention import Attention, OutputGate
from hyla.layers.context import DEFAULT_OPTIONS, InferenceOptions, MixerContext
from hyla.layers.gdn import GatedDeltaNet
from hyla.layers.gla import GatedLinearAttention
from hyla.layers.headwise import headwise_mixer
from hyla.layers.lightning import LightningAttention
from hyla.layers.mlp import GatedMLP
from hyla.layers.norm import RMSNorm
from hyla.layers.rope import RotaryEmbedding
from hyla.layers.swa import RopeAttention, SlidingWindowAttention
from hyla.models.cache import HybridCache
from hyla.models.configuration import HEADWISE_LAYER_TYPES, HypeNetConfig

# transformers 5.24 renamed the cache argument of forward and the cache field of model outputs from
# `past_key_values` to `cache` (its generate passes `cache=`); hyla accepts both and fills the field this version has.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_argument(cache) -> dict:
    """The keyword that passes `cache` to a transformers model's forward under this version's name (the old name is
    deprecated from 5.24 and removed in 5.40)."""
    return {CACHE_FIELD: cache}


def output_cache(outputs):
    """The cache a transformers model's forward returned, read under this version's name."""
    return getattr(outputs, CACHE_FIELD)


MIXERS = {
    "lightning": LightningAttention,
    "attention": Attention,
    "attention_rope": RopeAttention,
    "swa": SlidingWindowAttention,
    "gla": GatedLinearAttention,
    "gdn": GatedDeltaNet,
    **{kind: headwise_mixer(kind.removeprefix("hh_")) for kind in HEADWISE_LAYER_TYPES},
}


class HypeNetBlock(nn.Module):
    def __init__(self, config: HypeNetConfig, layer_idx: int):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mixer = MIXERS[self.layer_type](config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = GatedMLP(
            config.hidden_size, config.intermediate_size, act=config.hidden_act, bias=config.mlp_bias
        )

    def forward(self, hidden_states: torch.Tensor, context: MixerContext,
                record: list | None = None) -> torch.Tensor:
        """`record`: an empty list the mixer's input and output are appended to, as a pair (stage 1's targets; a
        list, not a hook, so that a compiled block records without recompiling; empty, because dynamo guards on its
        length: one list passed from block to block would compile a graph per layer)."""
        mixer_input = self.input_layernorm(hidden_states)
        mixer_output = self.mixer(mixer_input, context)
        if record is not None:
            record.append((mixer_input, mixer_output))
        hidden_states = hidden_states + mixer_output
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class HypeNetPreTrainedModel(PreTrainedModel):
    config_class = HypeNetConfig
    config: HypeNetConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HypeNetBlock"]
    _supports_sdpa = True
    _is_stateful = True

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save, plus `auto_map` and its module so that the folder loads without `import hyla`
        (`hyla.models.hf.complete_folder`)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            from hyla.models.hf import complete_folder

            complete_folder(save_directory)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, OutputGate):
            module.reset_to_constant()
        elif isinstance(module, GatedDeltaNet):
            module.reset_gate_parameters()
        elif isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        elif isinstance(module, RMSNorm):
            module.weight.fill_(1.0)


def _one_cache(past_key_values: HybridCache | None, cache: HybridCache | None) -> HybridCache | None:
    if past_key_values is not None and cache is not None:
        raise ValueError("pass the cache as past_key_values or as cache, not both")
    return past_key_values if past_key_values is not None else cache


def _checked_options(options) -> InferenceOptions:
    if not isinstance(options, InferenceOptions):
        raise TypeError(f"inference_options must be a hyla.InferenceOptions, got {type(options).__name__}")
    return options


def positions_from_mask(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
    """Per-row positions of the last `length` tokens: the count of real tokens before each (padding excluded)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp(min=0)[:, -length:]


def packed_positions(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[1, T] positions restarting at 0 at every packed document."""
    index = torch.arange(length, device=cu_seqlens.device)
    document = torch.bucketize(index, cu_seqlens[1:], right=True)
    return (index - cu_seqlens[document])[None]


class HypeNetModel(HypeNetPreTrainedModel):
    def __init__(self, config: HypeNetConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(HypeNetBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.gradient_checkpointing = False
        # What a call that passes no inference options runs with (not saved: the config holds none).
        self.inference_options = DEFAULT_OPTIONS
        # Under autocast, the residual stream in the autocast dtype from the embeddings on (a training setting, not
        # saved: `use_autocast_activations`); False: in the embeddings' dtype, float32 for float32 weights.
        self.autocast_activations = False
        self.post_init()

    def _context(self, hidden_states, attention_mask, position_ids, cache, cu_seqlens,
                 options: InferenceOptions = DEFAULT_OPTIONS) -> MixerContext:
        batch, length = hidden_states.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None and attention_mask.shape[-1] != past + length:
            raise ValueError(
                f"attention_mask covers {attention_mask.shape[-1]} positions, expected cached {past} + new {length}"
            )
        padded = attention_mask is not None and not bool(attention_mask.all())
        if position_ids is None:
            if cu_seqlens is not None:
                position_ids = packed_positions(cu_seqlens, length)
            elif padded:
                position_ids = positions_from_mask(attention_mask, length)
            else:
                position_ids = torch.arange(past, past + length, device=hidden_states.device)[None].expand(batch, -1)
        key_mask = attention_mask.bool() if padded else None
        return MixerContext(
            position_ids=position_ids,
            rope=self.rotary_emb(position_ids, hidden_states.dtype),
            token_mask=key_mask[:, -length:] if padded else None,
            key_mask=key_mask,
            cu_seqlens=cu_seqlens,
            cache=cache,
            options=options,
        )

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: HybridCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.LongTensor | None = None,
        cache: HybridCache | None = None,
        inference_options: InferenceOptions | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """past_key_values, cache: the HybridCache to continue, under either of transformers' names (CACHE_FIELD).
        inference_options: how to run this call (None: `self.inference_options`)."""
        past_key_values = _one_cache(past_key_values, cache)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        device_type = hidden_states.device.type
        if self.autocast_activations and torch.is_autocast_enabled(device_type):
            hidden_states = hidden_states.to(torch.get_autocast_dtype(device_type))
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and past_key_values is None and not self.training:
            past_key_values = HybridCache(self.config.layer_types)
        cache = past_key_values if use_cache else None
        options = self.inference_options if inference_options is None else _checked_options(inference_options)
        context = self._context(hidden_states, attention_mask, position_ids, cache, cu_seqlens, options)
        for block in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(block.__call__, hidden_states, context)
            else:
                hidden_states = block(hidden_states, context)
        if cache is not None:
            cache.advance(hidden_states.shape[1])
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states), **{CACHE_FIELD: cache})


class HypeNetForCausalLM(HypeNetPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: HypeNetConfig):
        super().__init__(config)
        self.model = HypeNetModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The model builds its own HybridCache on the first forward.
        return False

    @property
    def inference_options(self) -> InferenceOptions:
        """The inference options of calls that pass none (default: the model as its config describes it)."""
        return self.model.inference_options

    @inference_options.setter
    def inference_options(self, options: InferenceOptions) -> None:
        self.model.inference_options = _checked_options(options)

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """transformers' `generate`; on CUDA, the requests the inference engine serves alike (greedy or sampling
        with temperature / top-k / top-p, one beam, EOS and padding; `hyla.inference.generate.hf_request_to_engine`)
        run on it: static cache, chunked prefill, graph-captured decode. `hyla.generate` is the same engine
        generation on any device; `hf_generate` is transformers' alone. `inference_options=` applies to the whole
        generation on either path."""
        from hyla.inference.generate import GenerationSession, hf_request_to_engine

        options = kwargs.pop("inference_options", None)
        options = self.inference_options if options is None else _checked_options(options)
        request = hf_request_to_engine(self, inputs, generation_config, kwargs, options)
        if request is None:
            return self.hf_generate(inputs, generation_config, inference_options=options, **kwargs)
        session = GenerationSession(self, inference_options=options)
        return session.generate(request.pop("input_ids"), request.pop("attention_mask"), **request)

    def hf_generate(self, inputs=None, generation_config=None, **kwargs):
        """transformers' own `generate` (HybridCache, eager forward), whatever the device."""
        return GenerationMixin.generate(self, inputs, generation_config, **kwargs)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: HybridCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.LongTensor | None = None,
        logits_to_keep: int = 0,
        cache: HybridCache | None = None,
        inference_options: InferenceOptions | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """labels: [B, T] next-token targets already aligned with input_ids (HF convention: shifted inside),
        -100 ignored. logits_to_keep: compute logits for the last N positions only (0 = all).
        past_key_values, cache: the HybridCache to continue, under either of transformers' names (CACHE_FIELD).
        inference_options: how to run this call (None: `self.inference_options`)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=_one_cache(past_key_values, cache),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            cu_seqlens=cu_seqlens,
            inference_options=inference_options,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)})


def use_autocast_activations(model: HypeNetForCausalLM | HypeNetModel, enabled: bool = True) -> None:
    """Train `model` with its activations in the autocast dtype (bf16 under the training stages' autocast): the
    residual stream from the embeddings on, and every RMSNorm's output (the block norms, the mixers' q/k and output
    norms), instead of float32 wherever a float32 weight or the float32 embeddings promote them. Weights, their
    gradients and the optimizer stay float32; outside autocast a model of one dtype computes as before."""
    inner = model.model if isinstance(model, HypeNetForCausalLM) else model
    inner.autocast_activations = enabled
    for module in inner.modules():
        if isinstance(module, RMSNorm):
            module.keep_input_dtype = enabled


def use_fused_projections(model: nn.Module, enabled: bool = True) -> int:
    """Compute each softmax and Lightning mixer's q/k/v and output-gate maps, and each MLP's gate/up maps, as one
    product of the input with their concatenated weights (`hyla.layers.projections`): the same outputs and gradients
    up to float rounding, fewer and larger matrix products. Parameters, their names and checkpoints stay as they are
    (the weights are concatenated at every call). The other mixers (GLA, GDN, head-wise) keep their own maps.
    `model`: a HypeNet or any module holding its blocks. Returns the number of modules switched."""
    count = 0
    for module in model.modules():
        if isinstance(module, (Attention, LightningAttention, GatedMLP)):
            module.fuse_projections = enabled
            count += 1
    return count
