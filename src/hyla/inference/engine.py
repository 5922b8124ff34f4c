"""Fast inference for HypeNet-family models: chunked prefill into a static hybrid cache, and single-token decode that
can be captured once in a CUDA graph (and optionally compiled) for any batch size.

It runs the model's own modules and weights (norms, projections, mixer tails, MLPs); only the sequence mixing is
re-routed: Lightning layers carry their fp32 state between prefill chunks through `initial_state` and update it with
one outer product per decode step; attention layers write into the static KV buffers and read them through chunked
attention (prefill) or split-K flash decoding with a device-side length (decode).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F

from hyla.compile import raise_recompile_limits
from hyla.inference.cache import StaticHybridCache
from hyla.inference.decode_attention import decode_attention, triton_available
from hyla.inference.prefill_attention import chunk_attention, pick_attention_backend
from hyla.layers.context import MixerContext
from hyla.ops.lightning import lightning_attention

# Global softmax attention (NoPE or RoPE) and Lightning; the other mixers have no fast path here yet.
SUPPORTED_LAYER_TYPES = ("lightning", "attention", "attention_rope")
# torch.compile modes for the decode blocks: the engine captures the whole step in one CUDA graph itself.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# Kernels for the decode step's matrix-vector products: cuBLAS through F.linear, or hyla's Triton kernel at batch 1
# (`hyla.inference.matvec_triton`; with fused projections, on CUDA); "triton-fused" also moves the residual adds,
# RMSNorms, SiLU and output gates into the products' prologues and epilogues and each Lightning layer's step into one
# kernel (`FoldedWeights`, `lightning_block_decode_kernels`).
MATVEC_KERNELS = ("cublas", "triton", "triton-fused")


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


def _concatenate(linears) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    weight = torch.cat([linear.weight for linear in linears]).contiguous()
    bias = None
    if any(linear.bias is not None for linear in linears):
        bias = torch.cat([linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
                          for linear in linears])
    return weight, bias, tuple(linear.out_features for linear in linears)


@torch.no_grad()
def fuse_block_projections(block) -> FusedProjections:
    mixer, mlp = block.mixer, block.mlp
    gate = mixer.gate_projection()
    mixer_linears = [mixer.q_proj, mixer.k_proj, mixer.v_proj] + ([gate] if gate is not None else [])
    return FusedProjections(*_concatenate(mixer_linears), *_concatenate([mlp.gate_proj, mlp.up_proj]))


class FoldedWeights(NamedTuple):
    """One block's weights for matvec="triton-fused": the fused mixer map (as `FusedProjections`) and the MLP's
    gate/up map with the preceding RMSNorm's weight folded into their columns (W diag(w): the norm's scalar factor
    is applied by the kernel after the product), the gate/up rows interleaved for the kernel's GLU epilogue
    (`hyla.inference.matvec.interleave_glu`), and o_proj with the Lightning output norm's weight folded in
    (attention: o_proj's own weight). Copies, taken when the engine is built."""

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
    from hyla.inference.matvec import interleave_glu

    mixer, mlp = block.mixer, block.mlp
    gate = mixer.gate_projection()
    mixer_weight, mixer_bias, mixer_sizes = _concatenate(
        [mixer.q_proj, mixer.k_proj, mixer.v_proj] + ([gate] if gate is not None else []))
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


def _project(mixer, x, context, fused: FusedProjections | None, linear=None):
    """(q, k, v, output-gate pre-activation or None) for the decode step, through the fused map when given;
    `linear` (F.linear's signature; None: F.linear) computes the fused product."""
    if fused is None:
        return (*mixer._project(x, context), None)
    parts = (linear or F.linear)(x, fused.mixer_weight, fused.mixer_bias).split(fused.mixer_sizes, dim=-1)
    q, k, v = mixer._finish_projection(parts[0], parts[1], parts[2], context)
    return q, k, v, parts[3] if len(parts) > 3 else None


def _mlp(block, hidden, fused: FusedProjections | None, linear=None):
    x = block.post_attention_layernorm(hidden)
    if fused is None:
        return block.mlp(x)
    linear = linear or F.linear
    gate, up = linear(x, fused.mlp_weight, fused.mlp_bias).split(fused.mlp_sizes, dim=-1)
    down = block.mlp.down_proj
    return linear(block.mlp.act_fn(gate) * up, down.weight, down.bias)


# The decode step's residual stream travels as (hidden, delta): each block returns its MLP output as `delta`
# without adding it, and the next block (or the final norm) adds it first, so that the add and the next RMSNorm are
# one fused kernel when compiled, instead of an add at the end of one compiled block and a norm at the start of the
# next.


def decode_embed(model, input_ids, position_ids):
    """The decode step's input: embeddings [B, 1, hidden], a zero `delta`, and RoPE's cos/sin at the positions."""
    hidden = model.embed_tokens(input_ids)
    cos, sin = model.rotary_emb(position_ids, hidden.dtype)
    return hidden, torch.zeros_like(hidden), cos, sin


def decode_logits(model, lm_head, hidden, delta, linear=None):
    """Logits [B, V] of the decode step from the last block's (hidden, delta); `linear` as in `_project`."""
    x = model.norm(hidden + delta)
    return (lm_head(x) if linear is None else linear(x, lm_head.weight, lm_head.bias))[:, 0]


def lightning_block_decode(block, hidden, delta, position_ids, cos, sin, state, decay, scale, fused=None,
                           linear=None):
    """One Lightning block for one token on input `hidden + delta`: S = gamma S + k^T v (fp32, written back in
    place), o = scale q S, then the mixer's own tail and the MLP. hidden, delta: [B, 1, hidden]; state:
    [B, H, D, D]; decay: [H, 1, 1] = exp(log-decay). `linear`: the matrix-vector products of the fused path (None:
    F.linear). Returns (hidden after the mixer, the MLP's output): their sum is the block's output."""
    hidden = hidden + delta
    x = block.input_layernorm(hidden)
    q, k, v, gate = _project(block.mixer, x, MixerContext(position_ids=position_ids, rope=(cos, sin)), fused, linear)
    acc = state.dtype
    # Written as a product and a sum rather than a batched matrix-vector product, so that compiled, the update, its
    # write back and q S are one kernel that reads the state once.
    updated = state * decay + k[:, 0, :, :, None].to(acc) * v[:, 0, :, None, :].to(acc)
    state.copy_(updated)
    output = (q[:, 0, :, :, None].to(acc) * updated).sum(-2, keepdim=True) * scale
    hidden = hidden + block.mixer._output(output.transpose(1, 2).to(hidden.dtype), x, gate, linear)
    return hidden, _mlp(block, hidden, fused, linear)


def attention_block_decode_pre(block, hidden, delta, position_ids, cos, sin, keys, values, position, fused=None,
                               linear=None):
    """On input `hidden + delta`: norm, projections (q/k norms, RoPE or logit scaling as the layer has them), cache
    write at `position` ([1] int64 device tensor). Returns (the block's input hidden + delta, mixer input x,
    q [B, H, D], output-gate pre-activation or None)."""
    hidden = hidden + delta
    x = block.input_layernorm(hidden)
    q, k, v, gate = _project(block.mixer, x, MixerContext(position_ids=position_ids, rope=(cos, sin)), fused, linear)
    keys.index_copy_(2, position, k.transpose(1, 2))
    values.index_copy_(2, position, v.transpose(1, 2))
    return hidden, x, q[:, 0].contiguous(), gate


def attention_block_decode_post(block, hidden, x, attention_output, gate=None, fused=None, linear=None):
    """Returns (hidden after the mixer, the MLP's output), as lightning_block_decode."""
    hidden = hidden + block.mixer._output(attention_output[:, None], x, gate, linear)
    return hidden, _mlp(block, hidden, fused, linear)


# matvec="triton-fused": the same blocks through hyla's Triton kernels (`kernels`: a MatvecKernels), batch 1. The
# residual stream is `hidden` alone: o_proj and down_proj add their output to it in their epilogue, and each
# RMSNorm is the prologue of the product that follows it.

def _mlp_kernels(block, hidden, folded: FoldedWeights, kernels):
    """hidden + MLP(RMSNorm(hidden)) in two kernels: normed gate/up with the SiLU gating as its epilogue, then
    down_proj with the residual add as its epilogue."""
    from hyla.inference.matvec import NORM

    down = block.mlp.down_proj
    act = kernels.fused(hidden, folded.mlp_weight, folded.mlp_bias, prologue=NORM,
                        eps=block.post_attention_layernorm.eps, glu=True)
    return kernels.fused(act, down.weight, down.bias, residual=hidden)


def lightning_block_decode_kernels(block, hidden, cos, sin, state, decay, scale, folded: FoldedWeights, kernels):
    """lightning_block_decode in 5 kernels: normed fused projection, the Lightning step (norms, RoPE, state update,
    read-out, gate; `hyla.inference.lightning_step_triton`), o_proj scaled by the output norm plus the residual,
    then the MLP (`_mlp_kernels`). decay: [H]. Returns the block's output hidden."""
    from hyla.inference.lightning_step_triton import lightning_step_triton
    from hyla.inference.matvec import NORM, SCALED

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
        pdl=kernels.pdl, state_ready=True)
    hidden = kernels.fused(u, folded.o_weight, mixer.o_proj.bias, prologue=SCALED, partials=partials,
                           eps=mixer.o_norm.eps, residual=hidden)
    return _mlp_kernels(block, hidden, folded, kernels)


def attention_block_decode_pre_kernels(block, hidden, position_ids, cos, sin, keys, values, position,
                                       folded: FoldedWeights, kernels):
    """attention_block_decode_pre with the RMSNorm in the product's prologue. Returns (q [B, H, D], output-gate
    pre-activation or None). The one fused function torch.compile traces (q/k norms, RoPE or logit scaling and the
    cache writes fuse around the product): its product is launched without programmatic dependent launch."""
    from hyla.inference.matvec import NORM

    y = kernels.fused(hidden, folded.mixer_weight, folded.mixer_bias, prologue=NORM, eps=block.input_layernorm.eps,
                      pdl=False)
    parts = y.split(folded.mixer_sizes, dim=-1)
    q, k, v = block.mixer._finish_projection(parts[0], parts[1], parts[2],
                                             MixerContext(position_ids=position_ids, rope=(cos, sin)))
    keys.index_copy_(2, position, k.transpose(1, 2))
    values.index_copy_(2, position, v.transpose(1, 2))
    return q[:, 0].contiguous(), parts[3] if len(parts) > 3 else None


def attention_block_decode_post_kernels(block, hidden, attention_output, gate, folded: FoldedWeights, kernels):
    """attention_block_decode_post: the output gate in o_proj's prologue, the residual in its epilogue, then the
    MLP. Returns the block's output hidden."""
    from hyla.inference.matvec import PLAIN, SIGMOID_GATE

    o_proj = block.mixer.o_proj
    output = attention_output.reshape(hidden.shape[0], 1, -1)
    hidden = kernels.fused(output, folded.o_weight, o_proj.bias, prologue=SIGMOID_GATE if gate is not None else PLAIN,
                           x2=gate, residual=hidden)
    return _mlp_kernels(block, hidden, folded, kernels)


def decode_logits_kernels(model, lm_head, hidden, kernels):
    """decode_logits with the final RMSNorm (its weight read beside the input) in the LM head's prologue."""
    from hyla.inference.matvec import NORM

    return kernels.fused(hidden, lm_head.weight, lm_head.bias, prologue=NORM, norm_weight=model.norm.weight,
                         eps=model.norm.eps)[:, 0]


def block_prefill_pre(block, hidden, position_ids, cos, sin):
    """A prefill chunk's block input: norm, then the mixer's projections (q/k norms, RoPE or logit scaling as the
    layer has them). Returns (mixer input x, q, k, v), each [B, T, heads, D] but x."""
    x = block.input_layernorm(hidden)
    q, k, v = block.mixer._project(x, MixerContext(position_ids=position_ids, rope=(cos, sin)))
    return x, q, k, v


def block_prefill_post(block, hidden, x, mixed):
    """A prefill chunk's block output: the mixer's tail (output norm, gate, o_proj) on `mixed` [B, T, H, D], the
    residual, then the MLP and its residual."""
    hidden = hidden + block.mixer._output(mixed, x)
    return hidden + block.mlp(block.post_attention_layernorm(hidden))


class InferenceEngine:
    """engine = InferenceEngine(model, batch_size=1, max_length=2**20); logits = engine.prefill(ids);
    engine.capture_graph(); logits = engine.decode(next_ids) (or engine.generate_greedy(n))."""

    def __init__(self, model, *, batch_size: int, max_length: int, prefill_chunk: int = 65536,
                 attention_backend: str = "auto", compile_blocks: bool = False, fuse_projections: bool = False,
                 compile_prefill: bool = False, compile_mode: str = "default", matvec: str = "cublas",
                 matvec_table=None, launch_pdl: bool | None = None):
        """compile_blocks: torch.compile the decode step's block functions, in torch.compile's `compile_mode`
        ("default"; "max-autotune-no-cudagraphs" times inductor's matrix-product kernels against cuBLAS for each
        shape while compiling and keeps the fastest; the step is graph-captured by `capture_graph` either way, so
        the modes that capture graphs themselves are refused). fuse_projections: decode through each
        block's input-side maps concatenated (`FusedProjections`: 4 matrix-vector products a block instead of 8;
        costs a copy of those weights, ~2/3 of a block's). compile_prefill: torch.compile what surrounds the sequence
        mixing in a prefill chunk (`block_prefill_pre`, `block_prefill_post`: norms, projections, RoPE, gates,
        MLP), fusing their elementwise work; the mixing kernels themselves run as they are. matvec: "cublas"
        (F.linear) or "triton": the decode step's matrix-vector products (fused maps, o_proj, down_proj, LM head)
        through hyla's Triton kernel where it applies (batch 1; needs fuse_projections and CUDA; measured against
        cuBLAS by bench/matvec_sweep.py); "triton-fused": batch 1 only, the products with the residual adds,
        RMSNorms, SiLU and output gates in their prologues (norm weights folded into copies of the maps:
        `FoldedWeights`) and each Lightning layer's step as one kernel: 5 kernels a Lightning block.
        matvec_table: with the Triton kernels, their settings per weight shape
        {(N, K): MatvecConfig, or None for cuBLAS} (`hyla.inference.matvec.load_table` reads them from the
        sweep's result); None: the kernel's default settings for every shape. launch_pdl: with "triton-fused",
        launch the Lightning blocks', attention output blocks' and LM head's kernels with programmatic dependent
        launch (each reads its weights while the previous kernel finishes); None: where the GPU supports it
        (compute capability 9.0 or later)."""
        config = model.config
        unsupported = sorted(set(config.layer_types) - set(SUPPORTED_LAYER_TYPES))
        if unsupported:
            supported = ", ".join(SUPPORTED_LAYER_TYPES)
            raise ValueError(f"the inference engine supports {supported} layers, not {unsupported}")
        if getattr(config, "eme_window", None) is not None:
            raise ValueError("the inference engine runs global attention and full Lightning state: turn EME "
                             "(eme_window) off or use the model's own forward")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        attention_backend = pick_attention_backend(attention_backend, model.device, model.dtype)
        self.model, self.config = model, config
        self.prefill_chunk, self.attention_backend = prefill_chunk, attention_backend
        self.device, self.dtype = model.device, model.dtype
        self.cache = StaticHybridCache.allocate(
            config, batch_size=batch_size, max_length=max_length, device=self.device, dtype=self.dtype
        )
        self.num_cached = 0
        self.scale = config.head_dim**-0.5
        lightning = [b.mixer for b in model.model.layers if b.layer_type == "lightning"]
        log_decay = lightning[0].log_decay(self.device) if lightning else None
        state_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.decay = None if log_decay is None else log_decay.exp().to(state_dtype)[:, None, None]
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {compile_mode!r}")
        kernels = self._matvec_kernels(matvec, fuse_projections, self.device, matvec_table, launch_pdl)
        # F.linear's signature for the decode products (None: F.linear itself), and the kernels of "triton-fused".
        self.linear = kernels.linear if kernels is not None else None
        self.kernels = kernels if matvec == "triton-fused" else None
        self.launch_pdl = self.kernels is not None and self.kernels.pdl
        if self.kernels is not None:
            self._check_fused_kernels(model, batch_size)
        self._blocks = self._block_functions(compile_blocks, compile_mode, fused_kernels=self.kernels is not None)
        self._prefill_blocks = self._prefill_functions(compile_prefill)
        if self.kernels is not None:
            self.fused = [fold_block_weights(block) for block in model.model.layers]
        else:
            self.fused = [fuse_block_projections(block) if fuse_projections else None for block in model.model.layers]
        self.decay_flat = None if self.decay is None else self.decay.reshape(-1).contiguous()
        self._tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)
        self._logits = None
        self._graph = None

    @staticmethod
    def _block_functions(compile_blocks: bool, mode: str = "default", fused_kernels: bool = False):
        functions = (lightning_block_decode, attention_block_decode_pre, attention_block_decode_post, decode_embed,
                     decode_logits)
        if fused_kernels:
            functions = (lightning_block_decode_kernels, attention_block_decode_pre_kernels,
                         attention_block_decode_post_kernels, decode_embed, decode_logits_kernels)
        if not compile_blocks:
            return functions
        raise_recompile_limits()
        compiled = tuple(torch.compile(f, dynamic=False, fullgraph=True, mode=mode) for f in functions)
        # The fused Lightning block, attention output block and logits are hyla's kernels only, nothing for inductor
        # to fuse: they run as they are (the kernels can then be launched with programmatic dependent launch, which
        # torch.compile does not pass on, and the Lightning state's in-place update stays out of compiled graphs).
        if fused_kernels:
            return functions[0], compiled[1], functions[2], compiled[3], functions[4]
        return compiled

    @staticmethod
    def _check_fused_kernels(model, batch_size: int) -> None:
        config = model.config
        if batch_size != 1:
            raise ValueError(f"matvec='triton-fused' decodes one sequence (batch_size=1), got batch_size={batch_size}")
        if config.hidden_act != "silu":
            raise ValueError(f"matvec='triton-fused' computes the MLP's SiLU in its kernel; this model's activation "
                             f"is {config.hidden_act!r}")
        if "lightning" in config.layer_types and config.head_dim % 32:
            raise ValueError(f"matvec='triton-fused' runs Lightning heads whose dimension is a multiple of 32, got "
                             f"{config.head_dim}")

    @staticmethod
    def _matvec_kernels(matvec: str, fuse_projections: bool, device: torch.device, table=None, launch_pdl=None):
        """None (F.linear) for cuBLAS, else hyla's Triton matrix-vector kernels (a MatvecKernels)."""
        if matvec not in MATVEC_KERNELS:
            raise ValueError(f"matvec must be one of {', '.join(MATVEC_KERNELS)}, got {matvec!r}")
        if launch_pdl and matvec != "triton-fused":
            raise ValueError(f"launch_pdl applies to matvec='triton-fused', not {matvec!r}")
        if matvec == "cublas":
            if table is not None:
                raise ValueError("matvec_table sets the Triton kernel per shape: it needs matvec='triton'")
            return None
        if not fuse_projections:
            raise ValueError(f"matvec={matvec!r} decodes through the fused projections: set fuse_projections=True")
        interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
        if not (device.type == "cuda" or interpreted) or not triton_available():
            raise ValueError(f"matvec={matvec!r} needs a CUDA device with triton; the model is on {device}")
        from hyla.inference.matvec_triton import MatvecKernels, pdl_supported

        if launch_pdl and not pdl_supported(device):
            raise ValueError(f"launch_pdl needs a CUDA GPU of compute capability 9.0 or later; the model is on "
                             f"{device}")
        pdl = pdl_supported(device) if launch_pdl is None else launch_pdl
        return MatvecKernels(table, pdl=pdl and matvec == "triton-fused")

    @staticmethod
    def _prefill_functions(compile_prefill: bool):
        functions = (block_prefill_pre, block_prefill_post)
        if not compile_prefill:
            return functions
        raise_recompile_limits()
        # Chunk lengths vary (the last chunk of a prompt is shorter): dynamic=None compiles the first length as it
        # is and turns the length symbolic when a second one arrives, instead of one compilation per length.
        return tuple(torch.compile(f, dynamic=None, fullgraph=True) for f in functions)

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    def reset(self) -> None:
        self.cache.reset()
        self.num_cached = 0

    def _check_room(self, num_new: int) -> None:
        if self.num_cached + num_new > self.cache.max_length:
            raise ValueError(
                f"{self.num_cached} cached + {num_new} new tokens exceed max_length {self.cache.max_length}"
            )

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Append input_ids [B, T] to the cache, chunk by chunk; returns the last position's logits [B, V]."""
        if input_ids.shape[0] != self.batch_size:
            raise ValueError(f"input_ids has batch {input_ids.shape[0]}, the engine was built for {self.batch_size}")
        self._check_room(input_ids.shape[1])
        for first in range(0, input_ids.shape[1], self.prefill_chunk):
            hidden = self._prefill_chunk(input_ids[:, first : first + self.prefill_chunk], self.num_cached)
            self.num_cached += hidden.shape[1]
            self.cache.length.fill_(self.num_cached)
        logits = self.model.lm_head(self.model.model.norm(hidden[:, -1:]))[:, 0]
        self._tokens.copy_(logits.argmax(-1, keepdim=True))
        return logits

    def _prefill_chunk(self, input_ids: torch.Tensor, start: int) -> torch.Tensor:
        model = self.model.model
        position_ids = torch.arange(start, start + input_ids.shape[1], device=self.device)[None]
        position_ids = position_ids.expand(input_ids.shape[0], -1)
        hidden = model.embed_tokens(input_ids)
        cos, sin = model.rotary_emb(position_ids, hidden.dtype)
        pre, post = self._prefill_blocks
        for index, block in enumerate(model.layers):
            x, q, k, v = pre(block, hidden, position_ids, cos, sin)
            if block.layer_type == "lightning":
                mixed = self._lightning_mix(block.mixer, q, k, v, index)
            else:
                mixed = self._attention_mix(q, k, v, index, start)
            hidden = post(block, hidden, x, mixed)
        return hidden

    def _lightning_mix(self, mixer, q, k, v, index):
        state = self.cache.states[index]
        output, final_state = lightning_attention(
            q, k, v, log_decay=mixer.log_decay(q.device), scale=self.scale, initial_state=state,
            output_final_state=True,
        )
        state.copy_(final_state)
        return output

    def _attention_mix(self, q, k, v, index, start):
        end = start + q.shape[1]
        keys, values = self.cache.keys[index], self.cache.values[index]
        keys[:, :, start:end] = k.transpose(1, 2)
        values[:, :, start:end] = v.transpose(1, 2)
        return chunk_attention(q, keys, values, start=start, scale=self.scale, backend=self.attention_backend)

    def _decode_forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One token per row at position cache.length; graph-safe (no host reads). Returns logits [B, V]."""
        model, cache = self.model.model, self.cache
        lightning_step, attention_pre, attention_post, embed, logits = self._blocks
        position = cache.length.view(1)
        position_ids = position.view(1, 1).expand(input_ids.shape[0], 1)
        hidden, delta, cos, sin = embed(model, input_ids, position_ids)
        valid_length = cache.length + 1
        if self.kernels is not None:
            return self._decode_forward_kernels(hidden, position, position_ids, cos, sin, valid_length)
        for index, block in enumerate(model.layers):
            fused = self.fused[index]
            if block.layer_type == "lightning":
                state = cache.states[index]
                hidden, delta = lightning_step(block, hidden, delta, position_ids, cos, sin, state, self.decay,
                                               self.scale, fused, self.linear)
                continue
            keys, values = cache.keys[index], cache.values[index]
            hidden, x, q, gate = attention_pre(block, hidden, delta, position_ids, cos, sin, keys, values, position,
                                               fused, self.linear)
            output = decode_attention(q, keys, values, valid_length, scale=self.scale)
            hidden, delta = attention_post(block, hidden, x, output, gate, fused, self.linear)
        cache.length.add_(1)
        return logits(model, self.model.lm_head, hidden, delta, self.linear)

    def _decode_forward_kernels(self, hidden, position, position_ids, cos, sin, valid_length):
        """_decode_forward's blocks under matvec="triton-fused"."""
        model, cache, kernels = self.model.model, self.cache, self.kernels
        lightning_step, attention_pre, attention_post, _, logits = self._blocks
        for index, block in enumerate(model.layers):
            folded = self.fused[index]
            if block.layer_type == "lightning":
                hidden = lightning_step(block, hidden, cos, sin, cache.states[index], self.decay_flat, self.scale,
                                        folded, kernels)
                continue
            keys, values = cache.keys[index], cache.values[index]
            q, gate = attention_pre(block, hidden, position_ids, cos, sin, keys, values, position, folded, kernels)
            output = decode_attention(q, keys, values, valid_length, scale=self.scale)
            hidden = attention_post(block, hidden, output, gate, folded, kernels)
        cache.length.add_(1)
        return logits(model, self.model.lm_head, hidden, kernels)

    def _step(self) -> None:
        self._logits = self._decode_forward(self._tokens)
        self._tokens.copy_(self._logits.argmax(-1, keepdim=True))

    @torch.no_grad()
    def capture_graph(self, *, warmup_steps: int = 2) -> None:
        """Record one decode step (greedy next token fed back) in a CUDA graph; the cache is left as it was."""
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self._check_room(warmup_steps)
        saved = {i: s.clone() for i, s in self.cache.states.items()}, self.cache.length.clone(), self._tokens.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup_steps):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._step()
        states, length, tokens = saved
        for index, state in states.items():
            self.cache.states[index].copy_(state)
        self.cache.length.copy_(length)
        self._tokens.copy_(tokens)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Append one token per row (input_ids [B, 1]; None = the greedy token from the last step) and return the
        logits [B, V] of the new position. Replays the CUDA graph when one was captured."""
        self._check_room(1)
        if input_ids is not None:
            self._tokens.copy_(input_ids)
        if self._graph is not None:
            self._graph.replay()
        else:
            self._step()
        self.num_cached += 1
        return self._logits

    @torch.no_grad()
    def generate_greedy(self, num_tokens: int) -> torch.Tensor:
        """Greedy continuation of the prefilled prompt: [B, num_tokens] token ids."""
        tokens = []
        for _ in range(num_tokens):
            tokens.append(self._tokens.clone())
            self.decode()
        return torch.cat(tokens, dim=1)

    def fill_synthetic(self, length: int, *, seed: int = 0) -> None:
        """Benchmarks only: pretend `length` positions are cached (random unit-scale KV, small random states), so that
        decode at a long context is timed without paying its prefill."""
        self._check_room(length - self.num_cached)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        for buffer in (*self.cache.keys.values(), *self.cache.values.values()):
            buffer[:, :, :length].normal_(generator=generator)
        for state in self.cache.states.values():
            state.normal_(std=0.01, generator=generator)
        self.cache.length.fill_(length)
        self.num_cached = length
