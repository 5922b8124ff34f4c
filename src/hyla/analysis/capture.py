"""Capture each mixer layer's queries and keys (as `HeadInputs`) during one forward pass, layer by layer.

A forward pre-hook on every mixer module recomputes, from the module's own input, exactly the q and k its kernel
receives, and hands them to a callback before the next layer runs: only one layer's q/k is alive at a time, so the
memory stays that of a plain forward pass.
- HypeNet mixers: the hook calls the layer's own `project(hidden_states, context)` (norms, RoPE, logit scaling and
  padding mask exactly as in `forward`), and for GLA and GDN its own `token_inputs` (the per-token gates and β of
  its op); the call's inference options give the window of RoPE attention and SWA and SWLA's windows (EME).
- Hugging Face decoders (Llama, Mistral, Qwen2, Qwen3): the hook re-runs the projection math of their attention
  `forward` from its `hidden_states` and `position_embeddings` (q_proj/k_proj, q_norm/k_norm when present, and the
  model file's own `apply_rotary_pos_emb`), with the module's `scaling` and `sliding_window`.
New mixers register a capture with `register_mixer(mixer_class, capture)`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from hyla.analysis.concentration import HeadInputs
from hyla.layers.attention import Attention
from hyla.layers.context import MixerContext
from hyla.layers.gdn import GatedDeltaNet
from hyla.layers.gla import GatedLinearAttention
from hyla.layers.lightning import LightningAttention
from hyla.models.configuration import LINEAR_LAYER_TYPES

# (mixer module, positional args, keyword args of its forward) -> HeadInputs
MixerCapture = Callable[[nn.Module, tuple, dict], HeadInputs]
CAPTURES: dict[type, MixerCapture] = {}


def register_mixer(mixer_class: type, capture: MixerCapture) -> None:
    """Analyse layers whose mixer is a `mixer_class` with `capture`."""
    CAPTURES[mixer_class] = capture


def _hypenet_mixer_inputs(args: tuple, kwargs: dict) -> tuple[torch.Tensor, MixerContext]:
    hidden_states = args[0] if args else kwargs["hidden_states"]
    context = args[1] if len(args) > 1 else kwargs["context"]
    return hidden_states, context


def _swla(context: MixerContext) -> dict[str, int | None]:
    """The SWLA windows a linear mixer runs with under this call's options (`run_linear_op`): none without EME."""
    return {"swla_window": context.options.eme_window, "swla_stride": context.options.swla_stride}


def capture_lightning(module: LightningAttention, args: tuple, kwargs: dict) -> HeadInputs:
    hidden_states, context = _hypenet_mixer_inputs(args, kwargs)
    q, k, _ = module.project(hidden_states, context)
    return HeadInputs("decay", q, k, scale=module.head_dim**-0.5, log_decay=module.log_decay(q.device),
                      **_swla(context))


def _capture_gated(form: str, module: GatedLinearAttention | GatedDeltaNet, args: tuple, kwargs: dict) -> HeadInputs:
    """GLA ("gated": per-channel gates) and GDN ("delta": per-head gates and the write strength beta)."""
    hidden_states, context = _hypenet_mixer_inputs(args, kwargs)
    q, k, _ = module.project(hidden_states, context)
    gates = module.token_inputs(hidden_states, context)
    return HeadInputs(form, q, k, scale=module.head_dim**-0.5, log_gates=gates["g"], beta=gates.get("beta"),
                      **_swla(context))


def capture_gla(module: GatedLinearAttention, args: tuple, kwargs: dict) -> HeadInputs:
    return _capture_gated("gated", module, args, kwargs)


def capture_gdn(module: GatedDeltaNet, args: tuple, kwargs: dict) -> HeadInputs:
    return _capture_gated("delta", module, args, kwargs)


def capture_attention(module: Attention, args: tuple, kwargs: dict) -> HeadInputs:
    """NoPE and RoPE attention and SWA (a subclass): the window is the layer's own under the call's options."""
    hidden_states, context = _hypenet_mixer_inputs(args, kwargs)
    q, k, _ = module.project(hidden_states, context)
    return HeadInputs("softmax", q, k, scale=module.head_dim**-0.5, window=module.window(context.options))


register_mixer(LightningAttention, capture_lightning)
register_mixer(GatedLinearAttention, capture_gla)
register_mixer(GatedDeltaNet, capture_gdn)
register_mixer(Attention, capture_attention)


def capture_hf_attention(module: nn.Module, args: tuple, kwargs: dict) -> HeadInputs:
    """q, k of a transformers Llama-family attention, recomputed as its `forward` computes them."""
    hidden_states = args[0] if args else kwargs["hidden_states"]
    cos, sin = kwargs["position_embeddings"] if "position_embeddings" in kwargs else args[1]
    shape = (*hidden_states.shape[:-1], -1, module.head_dim)
    q = module.q_proj(hidden_states).view(shape)
    k = module.k_proj(hidden_states).view(shape)
    if getattr(module, "q_norm", None) is not None:
        q, k = module.q_norm(q), module.k_norm(k)
    apply_rotary = sys.modules[type(module).__module__].apply_rotary_pos_emb
    # transformers' rotary helper takes [B, H, T, D].
    q, k = apply_rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    window = getattr(module, "sliding_window", None)
    return HeadInputs("softmax", q.transpose(1, 2), k.transpose(1, 2), scale=module.scaling, window=window)


def _is_hf_attention(module: nn.Module) -> bool:
    model_file = sys.modules.get(type(module).__module__)
    return (
        type(module).__module__.startswith("transformers.models.")
        and all(hasattr(module, name) for name in ("q_proj", "k_proj", "head_dim", "scaling"))
        and hasattr(model_file, "apply_rotary_pos_emb")
    )


# What kind of head each HypeNet layer type has, for the plots (seed 003 Fig. 12(b), 21(b) set recurrent heads apart
# from NoPE attention heads); a teacher's attention is RoPE attention.
HEAD_KINDS = {**dict.fromkeys(LINEAR_LAYER_TYPES, "recurrent"), "attention": "NoPE attention",
              "attention_rope": "RoPE attention", "swa": "RoPE attention"}
TEACHER_HEAD_KIND = "RoPE attention"


@dataclass
class MixerLayer:
    """One decoder layer's mixer: its index, its type (HypeNet `layer_types`, else the HF config's), the module, its
    capture and its head kind (a value of `HEAD_KINDS`, or the layer type where it has none)."""

    index: int
    layer_type: str
    module: nn.Module
    capture: MixerCapture
    head_kind: str


def _capture_for(module: nn.Module) -> MixerCapture:
    for mixer_class in type(module).__mro__:
        if mixer_class in CAPTURES:
            return CAPTURES[mixer_class]
    if _is_hf_attention(module):
        return capture_hf_attention
    raise ValueError(
        f"no concentration capture for mixer {type(module).__name__}; register one with "
        "hyla.analysis.capture.register_mixer"
    )


def mixer_layers(model: nn.Module) -> list[MixerLayer]:
    """The mixer of every decoder layer: `.mixer` of HypeNet blocks, `.self_attn` of HF decoder layers."""
    decoder = getattr(model, "model", model)
    blocks = getattr(decoder, "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers (expected model.model.layers)")
    config_types = getattr(model.config, "layer_types", None)
    layers = []
    for index, block in enumerate(blocks):
        module = getattr(block, "mixer", None)
        if module is None:
            module = getattr(block, "self_attn", None)
        if module is None:
            raise ValueError(f"decoder layer {index} of {type(model).__name__} has neither .mixer nor .self_attn")
        layer_type = getattr(block, "layer_type", None) or (config_types[index] if config_types else "attention")
        head_kind = HEAD_KINDS.get(layer_type, layer_type) if hasattr(block, "mixer") else TEACHER_HEAD_KIND
        layers.append(MixerLayer(index, layer_type, module, _capture_for(module), head_kind))
    return layers


@torch.inference_mode()
def capture_heads(
    model: nn.Module, input_ids: torch.Tensor, on_layer: Callable[[MixerLayer, HeadInputs], None]
) -> None:
    """Run `model` on `input_ids` ([B, T]) and call `on_layer(layer, inputs)` for every mixer layer, in order."""
    handles = []
    for layer in mixer_layers(model):

        def hook(module, args, kwargs, layer=layer):
            on_layer(layer, layer.capture(module, args, kwargs))

        handles.append(layer.module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
