"""The engine's single-token decode step, in the implementations `hyla.inference.settings.DECODE_STEPS` names, and
the one factory that picks one (`build_decode_step`).

Each implementation runs the model's own modules and weights for everything but what it fuses, through the mixers'
public steps (`project` / `prepare_qkv` for the input side, `project_output` for the tail) and offers the engine the
same five calls: `embed`, `lightning` (a whole Lightning block), `attention_in` (an attention block up to its cache
write), `attention_out` (after the attention kernel) and `logits`; the module steps also `recurrent` (a whole GLA or
GDN block: one step of its gated recurrence, `hyla.ops.gla.gla_decode_step` / `hyla.ops.gdn.gdn_decode_step`). What
flows between blocks (the residual stream) is the implementation's own:

- "eager" and "fused-projections" (`ModuleDecodeStep`): the stream is (hidden, delta): each block returns its MLP
  output as `delta` without adding it, and the next block (or the final norm) adds it first, so that the add and the
  next RMSNorm are one fused kernel when compiled. With fused projections each block's input-side maps are
  concatenated (`FusedProjections`: 4 matrix-vector products a block instead of 8), optionally through hyla's Triton
  matrix-vector kernel (`linear`).
- "triton-fused" (`KernelDecodeStep`, batch 1): the stream is hidden alone: o_proj and down_proj add their output
  to it in their epilogue, each RMSNorm is the prologue of the product that follows it, and each Lightning layer's
  step is one kernel (`hyla.ops.lightning_step`): 5 kernels a Lightning block.

Block functions are module-level and compiled once per process (`compiled`), so every engine shares them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from hyla.compile import raise_recompile_limits
from hyla.layers.context import DEFAULT_OPTIONS, MixerContext
from hyla.layers.projections import concatenate_linears, mixer_input_linears
from hyla.ops.gdn import gdn_decode_step
from hyla.ops.gla import gla_decode_step
from hyla.ops.lightning import lightning_decode_step
from hyla.ops.matvec import NORM, PLAIN, SCALED, SIGMOID_GATE, interleave_glu
from hyla.ops.swla import swla_decode_step

# The single-token step of each gated linear mixer: plain torch, which compiled is one pass over the state, and
# which a CUDA graph captures as it is (no host reads).
RECURRENT_DECODE_OPS = {"gla": gla_decode_step, "gdn": gdn_decode_step}

_COMPILED: dict = {}


def compiled(function, **options):
    """torch.compile(function, **options), built once per process: engines share the compiled code (dynamo's guards
    tell models of other shapes apart)."""
    key = (function, tuple(sorted(options.items())))
    if key not in _COMPILED:
        raise_recompile_limits()
        _COMPILED[key] = torch.compile(function, **options)
    return _COMPILED[key]


class FusedProjections(NamedTuple):
    """One block's input-side linear maps concatenated, so that decode reads each block's weights in 4 matrix-vector
    products instead of 8: mixer q/k/v (+ output gate) in one, MLP gate/up in one. Copies of the weights, taken
    when the engine is built (later changes to the model's weights do not reach them)."""

    mixer_weight: torch.Tensor
    mixer_bias: torch.Tensor | None
    mixer_sizes: tuple[int, ...]
    mlp_weight: torch.Tensor
    mlp_bias: torch.Tensor | None
    mlp_sizes: tuple[int, ...]


@torch.no_grad()
def fuse_block_projections(block) -> FusedProjections:
    return FusedProjections(*concatenate_linears(mixer_input_linears(block.mixer)),
                            *concatenate_linears([block.mlp.gate_proj, block.mlp.up_proj]))


class FoldedWeights(NamedTuple):
    """One block's weights for the triton-fused step: the fused mixer map (as `FusedProjections`) and the MLP's
    gate/up map with the preceding RMSNorm's weight folded into their columns (W diag(w): the norm's scalar factor
    is applied by the kernel after the product), the gate/up rows interleaved for the kernel's GLU epilogue
    (`hyla.ops.matvec.interleave_glu`), and o_proj with the Lightning output norm's weight folded in (attention:
    o_proj's own weight). Copies, taken when the engine is built."""

    mixer_weight: torch.Tensor
    mixer_bias: torch.Tensor | None
    mixer_sizes: tuple[int, ...]
    o_weight: torch.Tensor
    mlp_weight: torch.Tensor
    mlp_bias: torch.Tensor | None


def _fold(weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    return (weight.float() * norm_weight.float()[None, :]).to(weight.dtype).contiguous()


@torch.no_grad()
def fold_block_weights(block) -> FoldedWeights:
    mixer, mlp = block.mixer, block.mlp
    mixer_weight, mixer_bias, mixer_sizes = concatenate_linears(mixer_input_linears(mixer))
    o_weight = mixer.o_proj.weight
    if block.layer_type == "lightning":
        o_weight = _fold(o_weight, mixer.o_norm.weight)
    post = block.post_attention_layernorm.weight
    mlp_weight = interleave_glu(_fold(mlp.gate_proj.weight, post), _fold(mlp.up_proj.weight, post))
    mlp_bias = None
    if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
        zeros = mlp.gate_proj.weight.new_zeros(mlp.gate_proj.out_features)
        mlp_bias = interleave_glu(mlp.gate_proj.bias if mlp.gate_proj.bias is not None else zeros,
                                  mlp.up_proj.bias if mlp.up_proj.bias is not None else zeros)
    return FoldedWeights(_fold(mixer_weight, block.input_layernorm.weight), mixer_bias, mixer_sizes, o_weight,
                         mlp_weight, mlp_bias)


def write_kv(keys, values, k, v, positions) -> None:
    """Row b's key/value [B, 1, Hkv, D] into its buffers [B, Hkv, Tmax, D] at position positions[b] (graph-safe)."""
    rows = torch.arange(keys.shape[0], device=keys.device)
    keys[rows, :, positions] = k[:, 0]
    values[rows, :, positions] = v[:, 0]


# The eager and fused-projections step: the model's modules, or the fused maps through `linear` (F.linear's
# signature; None: F.linear).

def _project(mixer, x, context, fused: FusedProjections | None, linear=None):
    """(q, k, v, output-gate pre-activation or None), through the fused map when given."""
    if fused is None:
        return (*mixer.project(x, context), None)
    parts = (linear or F.linear)(x, fused.mixer_weight, fused.mixer_bias).split(fused.mixer_sizes, dim=-1)
    q, k, v = mixer.prepare_qkv(parts[0], parts[1], parts[2], context)
    return q, k, v, parts[3] if len(parts) > 3 else None


def _mlp(block, hidden, fused: FusedProjections | None, linear=None):
    x = block.post_attention_layernorm(hidden)
    if fused is None:
        return block.mlp(x)
    linear = linear or F.linear
    gate, up = linear(x, fused.mlp_weight, fused.mlp_bias).split(fused.mlp_sizes, dim=-1)
    down = block.mlp.down_proj
    return linear(block.mlp.act_fn(gate) * up, down.weight, down.bias)


def decode_embed(model, input_ids, position_ids):
    """The decode step's input: embeddings [B, 1, hidden], a zero `delta`, and RoPE's cos/sin at the positions."""
    hidden = model.embed_tokens(input_ids)
    cos, sin = model.rotary_emb(position_ids, hidden.dtype)
    return hidden, torch.zeros_like(hidden), cos, sin


def decode_logits(model, lm_head, hidden, delta, linear=None):
    """Logits [B, V] of the decode step from the last block's (hidden, delta)."""
    x = model.norm(hidden + delta)
    return (lm_head(x) if linear is None else linear(x, lm_head.weight, lm_head.bias))[:, 0]


def _state_step(step, q, k, v, inputs, state, position_ids, options, **constants):
    """One token of a linear mixer's recurrence `step` (`lightning_decode_step`'s contract), the state [B, H, D, D]
    written back in place; under EME (options.eme_window) through SWLA's window ring [B, n, H, D, D] at each row's
    position. q, k: [B, H, K]; v: [B, H, V]. Returns o [B, H, V]."""
    if options.eme_window is not None:
        output, updated = swla_decode_step(
            lambda q, k, v, state, **inputs: step(q, k, v, **inputs, state=state, **constants), q, k, v, ring=state,
            positions=position_ids[:, 0], window=options.eme_window, stride=options.swla_stride, **inputs)
    else:
        output, updated = step(q, k, v, **inputs, state=state, **constants)
    state.copy_(updated)
    return output


def lightning_block_decode(block, hidden, delta, position_ids, cos, sin, state, decay, scale, options, fused=None,
                           linear=None):
    """One Lightning block for one token on input `hidden + delta`: S = gamma S + k^T v (fp32, written back in
    place; under EME every open window's state, `_state_step`), o = scale q S, then the mixer's own tail and the
    MLP. hidden, delta: [B, 1, hidden]; state: [B, H, D, D] ([B, n, H, D, D] under EME); decay: [H, 1, 1] =
    exp(log-decay); options: the InferenceOptions (passed in, so that compiled the context holds the caller's
    object). Returns (hidden after the mixer, the MLP's output): their sum is the block's output."""
    hidden = hidden + delta
    x = block.input_layernorm(hidden)
    context = MixerContext(position_ids=position_ids, rope=(cos, sin), options=options)
    q, k, v, gate = _project(block.mixer, x, context, fused, linear)
    output = _state_step(lightning_decode_step, q[:, 0], k[:, 0], v[:, 0], {}, state, position_ids, options,
                         decay=decay, scale=scale)
    hidden = hidden + block.mixer.project_output(output[:, None].to(hidden.dtype), x, gate, linear)
    return hidden, _mlp(block, hidden, fused, linear)


def recurrent_block_decode(block, hidden, delta, position_ids, cos, sin, state, scale, options, fused=None,
                           linear=None):
    """One GLA or GDN block for one token on input `hidden + delta`: the mixer's projections and per-token gates
    (`token_inputs`), one step of its recurrence (fp32 state, written back in place; under EME every open window's,
    `_state_step`), the mixer's tail and the MLP. state: [B, H, D, D] ([B, n, H, D, D] under EME). Returns (hidden
    after the mixer, the MLP's output), as lightning_block_decode."""
    hidden = hidden + delta
    x = block.input_layernorm(hidden)
    context = MixerContext(position_ids=position_ids, rope=(cos, sin), options=options)
    q, k, v, gate = _project(block.mixer, x, context, fused, linear)
    inputs = {name: value[:, 0] for name, value in block.mixer.token_inputs(x, context).items()}
    # As the model's forward (`run_linear_op`): q and k in v's dtype before the op.
    output = _state_step(RECURRENT_DECODE_OPS[block.layer_type], q[:, 0].to(v.dtype), k[:, 0].to(v.dtype), v[:, 0],
                         inputs, state, position_ids, options, scale=scale)
    hidden = hidden + block.mixer.project_output(output[:, None].to(hidden.dtype), x, gate, linear)
    return hidden, _mlp(block, hidden, fused, linear)


def attention_block_decode_pre(block, hidden, delta, position_ids, cos, sin, keys, values, positions, options,
                               fused=None, linear=None):
    """On input `hidden + delta`: norm, projections (q/k norms, RoPE or logit scaling as the layer has them under the
    InferenceOptions `options`), cache write at each row's position (`positions`: int64 [B] device tensor). Returns
    (the block's input hidden + delta, mixer input x, q [B, H, D], output-gate pre-activation or None)."""
    hidden = hidden + delta
    x = block.input_layernorm(hidden)
    context = MixerContext(position_ids=position_ids, rope=(cos, sin), options=options)
    q, k, v, gate = _project(block.mixer, x, context, fused, linear)
    write_kv(keys, values, k, v, positions)
    return hidden, x, q[:, 0].contiguous(), gate


def attention_block_decode_post(block, hidden, x, attention_output, gate=None, fused=None, linear=None):
    """Returns (hidden after the mixer, the MLP's output), as lightning_block_decode."""
    hidden = hidden + block.mixer.project_output(attention_output[:, None], x, gate, linear)
    return hidden, _mlp(block, hidden, fused, linear)


class ModuleDecodeStep:
    """The "eager" and "fused-projections" decode steps (module docstring). fused: per block a FusedProjections or
    None; linear: the products' function (None: F.linear)."""

    def __init__(self, model, *, name: str, fused: list, linear, decay, scale: float, compile_decode: bool,
                 compile_mode: str, options):
        self.name, self.model, self.fused, self.linear, self.options = name, model, fused, linear, options
        self.decay, self.scale, self.launch_pdl = decay, scale, False
        functions = (lightning_block_decode, recurrent_block_decode, attention_block_decode_pre,
                     attention_block_decode_post, decode_embed, decode_logits)
        if compile_decode:
            functions = tuple(compiled(f, dynamic=False, fullgraph=True, mode=compile_mode) for f in functions)
        (self._lightning, self._recurrent, self._attention_pre, self._attention_post, self._embed,
         self._logits) = functions

    def embed(self, input_ids, position_ids):
        hidden, delta, cos, sin = self._embed(self.model.model, input_ids, position_ids)
        return (hidden, delta), cos, sin

    def lightning(self, index, block, stream, position_ids, cos, sin, state):
        return self._lightning(block, *stream, position_ids, cos, sin, state, self.decay, self.scale, self.options,
                               self.fused[index], self.linear)

    def recurrent(self, index, block, stream, position_ids, cos, sin, state):
        return self._recurrent(block, *stream, position_ids, cos, sin, state, self.scale, self.options,
                               self.fused[index], self.linear)

    def attention_in(self, index, block, stream, position_ids, cos, sin, keys, values, positions):
        hidden, x, q, gate = self._attention_pre(block, *stream, position_ids, cos, sin, keys, values, positions,
                                                 self.options, self.fused[index], self.linear)
        return hidden, q, (x, gate)

    def attention_out(self, index, block, stream, carry, attention_output):
        x, gate = carry
        return self._attention_post(block, stream, x, attention_output, gate, self.fused[index], self.linear)

    def logits(self, stream):
        return self._logits(self.model.model, self.model.lm_head, *stream, self.linear)


# The triton-fused step: hyla's kernels (`kernels`: a hyla.ops.matvec.gpu.MatvecKernels), batch 1.

def _mlp_kernels(block, hidden, folded: FoldedWeights, kernels):
    """hidden + MLP(RMSNorm(hidden)) in two kernels: normed gate/up with the SiLU gating as its epilogue, then
    down_proj with the residual add as its epilogue."""
    down = block.mlp.down_proj
    act = kernels.fused(hidden, folded.mlp_weight, folded.mlp_bias, prologue=NORM,
                        eps=block.post_attention_layernorm.eps, glu=True)
    return kernels.fused(act, down.weight, down.bias, residual=hidden)


def lightning_block_decode_kernels(block, hidden, cos, sin, state, decay, scale, folded: FoldedWeights, kernels,
                                   step_launch: tuple[int, int]):
    """lightning_block_decode in 5 kernels: normed fused projection, the Lightning step (norms, RoPE, state update,
    read-out, gate; `hyla.ops.lightning_step.gpu`), o_proj scaled by the output norm plus the residual, then the
    MLP (`_mlp_kernels`). decay: [H]; step_launch: the step kernel's (block_v, num_warps). Returns the block's
    output hidden."""
    from hyla.ops.lightning_step.gpu import lightning_step_triton

    mixer = block.mixer
    y = kernels.fused(hidden, folded.mixer_weight, folded.mixer_bias, prologue=NORM, eps=block.input_layernorm.eps)
    # state_ready: only this kernel touches the layer's state, once a step, and every step ends with the argmax of
    # its logits, an ATen kernel launched plainly, which waits for all earlier work: under programmatic dependent
    # launch the state can be read before waiting for the projection.
    u, partials = lightning_step_triton(
        y, cos if mixer.use_rope else None, sin if mixer.use_rope else None,
        mixer.q_norm.weight if mixer.q_norm is not None else None,
        mixer.k_norm.weight if mixer.k_norm is not None else None, state, decay, scale=scale,
        eps=mixer.q_norm.eps if mixer.q_norm is not None else 0.0, has_gate=mixer.z_proj is not None,
        block_v=step_launch[0], num_warps=step_launch[1], pdl=kernels.pdl, state_ready=True)
    hidden = kernels.fused(u, folded.o_weight, mixer.o_proj.bias, prologue=SCALED, partials=partials,
                           eps=mixer.o_norm.eps, residual=hidden)
    return _mlp_kernels(block, hidden, folded, kernels)


def attention_block_decode_pre_kernels(block, hidden, position_ids, cos, sin, keys, values, positions, options,
                                       folded: FoldedWeights, kernels):
    """attention_block_decode_pre with the RMSNorm in the product's prologue. Returns (q [B, H, D], output-gate
    pre-activation or None). The one fused function torch.compile traces (q/k norms, RoPE or logit scaling and the
    cache writes fuse around the product): its product is launched without programmatic dependent launch."""
    y = kernels.fused(hidden, folded.mixer_weight, folded.mixer_bias, prologue=NORM, eps=block.input_layernorm.eps,
                      pdl=False)
    parts = y.split(folded.mixer_sizes, dim=-1)
    q, k, v = block.mixer.prepare_qkv(parts[0], parts[1], parts[2],
                                      MixerContext(position_ids=position_ids, rope=(cos, sin), options=options))
    write_kv(keys, values, k, v, positions)
    return q[:, 0].contiguous(), parts[3] if len(parts) > 3 else None


def attention_block_decode_post_kernels(block, hidden, attention_output, gate, folded: FoldedWeights, kernels):
    """attention_block_decode_post: the output gate in o_proj's prologue, the residual in its epilogue, then the
    MLP. Returns the block's output hidden."""
    o_proj = block.mixer.o_proj
    output = attention_output.reshape(hidden.shape[0], 1, -1)
    hidden = kernels.fused(output, folded.o_weight, o_proj.bias, prologue=SIGMOID_GATE if gate is not None else PLAIN,
                           x2=gate, residual=hidden)
    return _mlp_kernels(block, hidden, folded, kernels)


def decode_logits_kernels(model, lm_head, hidden, kernels):
    """decode_logits with the final RMSNorm (its weight read beside the input) in the LM head's prologue."""
    return kernels.fused(hidden, lm_head.weight, lm_head.bias, prologue=NORM, norm_weight=model.norm.weight,
                         eps=model.norm.eps)[:, 0]


class KernelDecodeStep:
    """The "triton-fused" decode step (module docstring)."""

    def __init__(self, model, *, kernels, decay, scale: float, compile_decode: bool, compile_mode: str,
                 step_launch: tuple[int, int], options):
        self.name, self.model, self.kernels, self.options = "triton-fused", model, kernels, options
        self.folded = [fold_block_weights(block) for block in model.model.layers]
        self.decay, self.scale = decay.reshape(-1).contiguous(), scale
        self.step_launch, self.launch_pdl = step_launch, kernels.pdl
        # The Lightning block, attention output block and logits are hyla's kernels only, nothing for inductor to
        # fuse: they run as they are (the kernels can then be launched with programmatic dependent launch, which
        # torch.compile does not pass on, and the Lightning state's in-place update stays out of compiled graphs).
        options = dict(dynamic=False, fullgraph=True, mode=compile_mode)
        self._attention_pre = (compiled(attention_block_decode_pre_kernels, **options) if compile_decode
                               else attention_block_decode_pre_kernels)
        self._embed = compiled(decode_embed, **options) if compile_decode else decode_embed

    def embed(self, input_ids, position_ids):
        hidden, _, cos, sin = self._embed(self.model.model, input_ids, position_ids)
        return hidden, cos, sin

    def lightning(self, index, block, stream, position_ids, cos, sin, state):
        return lightning_block_decode_kernels(block, stream, cos, sin, state, self.decay, self.scale,
                                              self.folded[index], self.kernels, self.step_launch)

    def attention_in(self, index, block, stream, position_ids, cos, sin, keys, values, positions):
        q, gate = self._attention_pre(block, stream, position_ids, cos, sin, keys, values, positions, self.options,
                                      self.folded[index], self.kernels)
        return stream, q, gate

    def attention_out(self, index, block, stream, carry, attention_output):
        return attention_block_decode_post_kernels(block, stream, attention_output, carry, self.folded[index],
                                                   self.kernels)

    def logits(self, stream):
        return decode_logits_kernels(self.model.model, self.model.lm_head, stream, self.kernels)


def build_decode_step(model, settings, *, decay, scale: float, device: torch.device, options=DEFAULT_OPTIONS):
    """The decode step `settings.decode_step` names (hyla.inference.settings.EngineSettings), with its kernels, for
    the InferenceOptions `options` (logit scaling)."""
    import os

    from hyla.ops.decode_attention import triton_available

    needs_kernels = settings.decode_step == "triton-fused" or settings.matvec == "triton"
    kernels = None
    if needs_kernels:
        interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
        if not (device.type == "cuda" or interpreted) or not triton_available():
            raise ValueError(f"decode_step={settings.decode_step!r} with matvec={settings.matvec!r} needs a CUDA "
                             f"device with triton; the model is on {device}")
        from hyla.ops.matvec.gpu import MatvecKernels, pdl_supported

        if settings.launch_pdl and not pdl_supported(device):
            raise ValueError(f"launch_pdl needs a CUDA GPU of compute capability 9.0 or later; the model is on "
                             f"{device}")
        fused_step = settings.decode_step == "triton-fused"
        pdl = fused_step and (pdl_supported(device) if settings.launch_pdl is None else settings.launch_pdl)
        kernels = MatvecKernels(settings.matvec_table(), default=settings.matvec_default, pdl=pdl)
    elif settings.launch_pdl:
        raise ValueError(f"launch_pdl applies to decode_step='triton-fused', not {settings.decode_step!r}")
    common = dict(decay=decay, scale=scale, compile_decode=settings.compile_decode,
                  compile_mode=settings.compile_mode, options=options)
    if settings.decode_step == "triton-fused":
        return KernelDecodeStep(model, kernels=kernels, step_launch=tuple(settings.lightning_step), **common)
    layers = model.model.layers
    fused = [fuse_block_projections(block) for block in layers] if settings.decode_step == "fused-projections" \
        else [None] * len(layers)
    return ModuleDecodeStep(model, name=settings.decode_step, fused=fused,
                            linear=kernels.linear if kernels is not None else None, **common)
