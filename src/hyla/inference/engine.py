"""Fast inference for HypeNet-family models: chunked prefill into a static hybrid cache, and single-token decode that
can be captured once in a CUDA graph (and compiled) for any batch size.

It runs the model's own modules and weights (norms, projections, mixer tails, MLPs); only the sequence mixing is
re-routed: the linear mixers (Lightning, GLA, GDN) carry their fp32 state between prefill chunks through their
chunked op's `initial_state` and update it with one step of their recurrence per decode step (Lightning: one outer
product with its fixed decay; GLA and GDN: their data-dependent gates, `hyla.ops.gla.gla_decode_step`,
`hyla.ops.gdn.gdn_decode_step`); attention layers write into the static KV buffers and read them through chunked
attention (prefill, `hyla.ops.chunk_attention`) or split-K flash decoding with per-row lengths on the device
(decode, `hyla.ops.decode_attention`). Sliding-window layers keep a ring of their window's keys
(`hyla.inference.cache`): prefill reads the window's keys in order through the model's windowed softmax attention
(`hyla.ops.attention`), decode the ring's filled slots through the decode kernel.

Under EME (`InferenceOptions.eme_window`, docs/method.md, "EME") every linear mixer runs as SWLA: the cache holds a
ring of its open windows' states (`hyla.ops.swla`), which prefill carries through
`sliding_window_linear_attention_ring` and decode updates on the device (`swla_decode_step`: a window opens at
each multiple of the stride, every open window takes the token, the serving window answers); RoPE attention
layers become sliding-window layers with the EME window, NoPE attention stays global. The decode step itself is one of
three implementations (`hyla.inference.decode_step`), chosen with the rest of the engine's settings
(`hyla.inference.settings`): by default the tuned settings shipped for this GPU.

Rows of a batch may hold prompts of different lengths: `prefill(input_ids, attention_mask)` takes a left-padded
batch, strips the padding and prefills each row's tokens at its own positions 0 .. n - 1 (rows of equal length
together), so Lightning states never see padding and attention needs no padding mask.
"""

from __future__ import annotations

import torch

from hyla.inference.cache import KV_CACHE_LAYER_TYPES, StaticHybridCache
from hyla.inference.decode_step import build_decode_step, compiled
from hyla.inference.settings import (
    EngineSettings,
    fit_to_model,
    triton_fused_obstacles,
    tuned_settings,
    with_fields,
)
from hyla.layers.context import InferenceOptions, MixerContext
from hyla.ops.attention import softmax_attention
from hyla.ops.chunk_attention import chunk_attention, pick_attention_backend
from hyla.ops.decode_attention import decode_attention, resolve_kernel
from hyla.ops.gdn import gdn_attention
from hyla.ops.gla import gla_attention
from hyla.ops.lightning import lightning_attention
from hyla.ops.swla import ring_size, sliding_window_linear_attention_ring

# The linear mixers (Lightning, GLA, GDN), global softmax attention (NoPE or RoPE) and sliding-window attention; the
# head-wise hybrids ("hh_*") have no fast path here yet.
SUPPORTED_LAYER_TYPES = ("lightning", "gla", "gdn", "attention", "attention_rope", "swa")
# The chunked op of each gated linear mixer (their per-token gates from the mixer's `token_inputs`).
GATED_LINEAR_OPS = {"gla": gla_attention, "gdn": gdn_attention}
# Queries per sliding-window prefill call, at least twice the window: each call's mask is
# [queries, queries + window - 1], bounded whatever the chunk's length.
WINDOW_QUERY_BLOCK = 1024


def unsupported_reason(model, options: InferenceOptions | None = None) -> str | None:
    """Why the engine cannot run `model` under `options` (None: the model's own inference options), or None. Every
    InferenceOptions is supported (logit scaling, EME): only the layer types decide."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None or not hasattr(model, "model") or not hasattr(model.model, "layers"):
        return f"{type(model).__name__} is not a HypeNet model"
    unsupported = sorted(set(layer_types) - set(SUPPORTED_LAYER_TYPES))
    if unsupported:
        return f"the inference engine supports {', '.join(SUPPORTED_LAYER_TYPES)} layers, not {unsupported}"
    return None


def block_prefill_pre(block, hidden, position_ids, cos, sin, options):
    """A prefill chunk's block input: norm, then the mixer's projections (q/k norms, RoPE or logit scaling as the
    layer has them under the InferenceOptions `options`) and, for GLA and GDN, their per-token gates. Returns (mixer
    input x, q, k, v, the op's per-token inputs: a dict, empty for the other mixers)."""
    x = block.input_layernorm(hidden)
    context = MixerContext(position_ids=position_ids, rope=(cos, sin), options=options)
    q, k, v = block.mixer.project(x, context)
    inputs = block.mixer.token_inputs(x, context) if block.layer_type in GATED_LINEAR_OPS else {}
    return x, q, k, v, inputs


def block_prefill_post(block, hidden, x, mixed):
    """The block after its sequence mixing: the mixer's tail (gates, output norm, o_proj), residual, MLP."""
    hidden = hidden + block.mixer.project_output(mixed, x)
    return hidden + block.mlp(block.post_attention_layernorm(hidden))


class InferenceEngine:
    """engine = InferenceEngine(model, batch_size=1, max_length=2**20); logits = engine.prefill(ids, mask);
    engine.capture_graph(); logits = engine.decode(next_ids) (or engine.generate_greedy(n)).

    settings: an EngineSettings (used as given); None: the tuned settings of the model's device
    (`hyla.inference.settings.tuned_settings`), fitted to this model, batch size and options (the triton-fused step
    needs batch 1, SiLU MLPs, Lightning and attention layers only, Lightning heads of a multiple of 32 and EME off:
    otherwise fused projections, reason in `self.notes`). overrides: EngineSettings fields replaced on top, e.g.
    decode_step="eager", prefill_chunk=128. inference_options: how the model runs (logit scaling, EME; None: the
    model's own `inference_options`)."""

    def __init__(self, model, *, batch_size: int, max_length: int, settings: EngineSettings | None = None,
                 inference_options: InferenceOptions | None = None, **overrides):
        options = inference_options if inference_options is not None else model.inference_options
        reason = unsupported_reason(model, options)
        if reason is not None:
            raise ValueError(reason)
        self.notes: list[str] = []
        if settings is None:
            settings, self.notes = fit_to_model(tuned_settings(model.device), model, batch_size, options)
        settings = with_fields(settings, overrides)
        if settings.decode_step == "triton-fused":
            problems = triton_fused_obstacles(model.config, batch_size, options)
            if problems:
                raise ValueError(problems[0])
        self.settings, self.options = settings, options
        self.model, self.config = model, model.config
        self.device, self.dtype = model.device, model.dtype
        self.attention_backend = pick_attention_backend(settings.attention_backend, self.device, self.dtype)
        self.decode_kernel = resolve_kernel(settings.decode_attention, self.device, self.config.head_dim)
        # EME: (window, stride) of SWLA, None when off.
        self.swla = (options.eme_window, options.swla_stride) if options.eme_window is not None else None
        self.cache = StaticHybridCache.allocate(
            self.config, batch_size=batch_size, max_length=max_length, device=self.device, dtype=self.dtype,
            windows=attention_windows(model, options),
            swla_slots=ring_size(window=self.swla[0], stride=self.swla[1]) if self.swla else None)
        self._lengths = [0] * batch_size  # host copy of cache.length
        self.scale = self.config.head_dim**-0.5
        lightning = [b.mixer for b in model.model.layers if b.layer_type == "lightning"]
        state_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.decay = (lightning[0].log_decay(self.device).exp().to(state_dtype)[:, None, None] if lightning
                      else torch.ones(1, 1, 1, device=self.device, dtype=state_dtype))
        self.step = build_decode_step(model, settings, decay=self.decay, scale=self.scale, device=self.device,
                                      options=options)
        self.launch_pdl = self.step.launch_pdl
        self._prefill_blocks = (block_prefill_pre, block_prefill_post)
        if settings.compile_prefill:
            # One graph per kind of block (mixer class and its options) for every prompt: the block functions see
            # a chunk's rows as one sequence of rows * length tokens (`_prefill_chunk`), marked symbolic from the
            # first call (`_symbolic_length`), and nothing else is dynamic (dynamic=False: no automatic dynamic
            # shapes, which would recompile every kind of block once more at the second length or row count).
            self._prefill_blocks = tuple(compiled(f, dynamic=False, fullgraph=True) for f in self._prefill_blocks)
        self._tokens = torch.zeros(batch_size, 1, dtype=torch.long, device=self.device)
        self._logits = None
        self._graph = None

    @property
    def batch_size(self) -> int:
        return self.cache.batch_size

    @property
    def graph_captured(self) -> bool:
        """Whether `capture_graph` recorded the decode step: `decode` then replays it."""
        return self._graph is not None

    @property
    def lengths(self) -> list[int]:
        """Positions cached in each row."""
        return list(self._lengths)

    @property
    def num_cached(self) -> int:
        """The longest row's cached positions (every row's, in a batch of equal lengths)."""
        return max(self._lengths)

    @num_cached.setter
    def num_cached(self, length: int) -> None:
        """Benchmarks: every row holds `length` positions (the buffers are not touched)."""
        self._lengths = [length] * self.batch_size
        self.cache.length.fill_(length)

    def reset(self) -> None:
        self.cache.reset()
        self._lengths = [0] * self.batch_size

    def _check_room(self, num_new: int) -> None:
        if self.num_cached + num_new > self.cache.max_length:
            raise ValueError(f"{self.num_cached} cached + {num_new} new tokens exceed max_length "
                             f"{self.cache.max_length}")

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Append each row's tokens to what its row holds, chunk by chunk; returns each row's last logits [B, V].
        input_ids [B, T]; attention_mask [B, T] (1 at real tokens): rows left-padded, every row at least one real
        token; None: every token real."""
        batch, width = input_ids.shape
        if batch != self.batch_size:
            raise ValueError(f"input_ids has batch {batch}, the engine was built for {self.batch_size}")
        counts = [width] * batch if attention_mask is None else _left_padded_counts(attention_mask)
        for row, count in enumerate(counts):
            if self._lengths[row] + count > self.cache.max_length:
                raise ValueError(f"row {row}: {self._lengths[row]} cached + {count} new tokens exceed max_length "
                                 f"{self.cache.max_length}")
        logits = None
        for first, last in _runs([(self._lengths[row], counts[row]) for row in range(batch)]):
            rows, start, count = slice(first, last), self._lengths[first], counts[first]
            hidden = self._prefill_rows(rows, input_ids[rows, width - count:], start)
            run_logits = self.model.lm_head(self.model.model.norm(hidden[:, -1:]))[:, 0]
            if logits is None:
                logits = run_logits.new_empty(batch, run_logits.shape[-1])
            logits[rows] = run_logits
        self._lengths = [length + count for length, count in zip(self._lengths, counts)]
        self.cache.length.copy_(torch.tensor(self._lengths, device=self.device))
        self._tokens.copy_(logits.argmax(-1, keepdim=True))
        return logits

    def _prefill_rows(self, rows: slice, input_ids: torch.Tensor, start: int) -> torch.Tensor:
        """input_ids [n, T] at positions start .. start + T - 1 of cache rows `rows`, in chunks of at most
        prefill_chunk tokens summed over the rows. Returns the last chunk's hidden states."""
        chunk = max(1, self.settings.prefill_chunk // input_ids.shape[0])
        for first, last in _chunk_bounds(input_ids.shape[1], chunk):
            hidden = self._prefill_chunk(rows, input_ids[:, first:last], start + first)
        return hidden

    def _prefill_chunk(self, rows: slice, input_ids: torch.Tensor, start: int) -> torch.Tensor:
        """input_ids [n, T] at positions start .. start + T - 1 of cache rows `rows`. Returns the hidden states [n,
        T, hidden]. The block functions take the n rows as one sequence [1, n * T] (every step but the mixing is
        per token), so that a chunk's shape is its token count alone, whatever the rows; the mixers take
        [n, T, ...]."""
        model = self.model.model
        num_rows, length = input_ids.shape
        position_ids = torch.arange(start, start + length, device=self.device).repeat(num_rows)[None]
        hidden = _one_sequence(model.embed_tokens(input_ids))
        cos, sin = model.rotary_emb(position_ids, hidden.dtype)
        pre, post = self._prefill_blocks
        symbolic = self._symbolic_length if self.settings.compile_prefill else lambda *tensors: None

        def by_row(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.view(num_rows, length, *tensor.shape[2:])

        for index, block in enumerate(model.layers):
            symbolic(hidden, position_ids, cos, sin)
            x, q, k, v, inputs = pre(block, hidden, position_ids, cos, sin, self.options)
            q, k, v = by_row(q), by_row(k), by_row(v)
            inputs = {name: by_row(value) for name, value in inputs.items()}
            if block.layer_type == "lightning":
                mixed = self._lightning_mix(block.mixer, q, k, v, self.cache.states[index][rows], start)
            elif block.layer_type in GATED_LINEAR_OPS:
                mixed = self._linear_mix(GATED_LINEAR_OPS[block.layer_type], q, k, v, inputs,
                                         self.cache.states[index][rows], start)
            elif index in self.cache.window_slots:
                mixed = self._window_mix(q, k, v, self.cache.keys[index][rows], self.cache.values[index][rows],
                                         start, block.mixer.window(self.options))
            else:
                mixed = self._attention_mix(q, k, v, self.cache.keys[index][rows], self.cache.values[index][rows],
                                            start)
            # The ops return their output in layouts of their own (a [.., heads, D] view of a head-major buffer,
            # say): one layout for all, as dynamo guards on strides.
            mixed = _one_sequence(mixed)
            symbolic(hidden, x, mixed)
            hidden = post(block, hidden, x, mixed)
        return by_row(hidden)

    @staticmethod
    def _symbolic_length(*tensors: torch.Tensor) -> None:
        """Mark dimension 1 (the chunk's tokens, rows * length) of the compiled prefill functions' inputs symbolic.
        A hint (`maybe_mark_dynamic`): a single token (a one-token prompt) stays a graph of its own, as dynamo
        specialises sizes 0 and 1."""
        for tensor in tensors:
            if tensor.shape[1] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 1)

    def _lightning_mix(self, mixer, q, k, v, state, start):
        return self._linear_mix(lightning_attention, q, k, v, {}, state, start,
                                log_decay=mixer.log_decay(q.device), chunk_safe=mixer.chunk_safe)

    def _linear_mix(self, op, q, k, v, inputs, state, start, **constants):
        """A linear mixer's op over a chunk at positions start .. start + T - 1, carrying the cache's state [rows,
        H, D, D] (under EME the window ring [rows, slots, H, D, D], through SWLA)."""
        # As the model's forward (`run_linear_op`): q and k in v's dtype (under autocast the projections differ).
        q, k = q.to(v.dtype), k.to(v.dtype)
        if self.swla is not None:
            window, stride = self.swla
            return sliding_window_linear_attention_ring(op, q, k, v, window=window, stride=stride, ring=state,
                                                        start=start, token_inputs=inputs, scale=self.scale,
                                                        **constants)
        output, final_state = op(q, k, v, **inputs, **constants, scale=self.scale, initial_state=state,
                                 output_final_state=True)
        state.copy_(final_state)
        return output

    def _window_mix(self, q, k, v, keys, values, start, window):
        """Sliding-window attention of a chunk at positions start .. start + T - 1 over the ring buffers keys/values
        [n, Hkv, slots, D]: the earlier keys the chunk's queries reach (the last window - 1 positions, in order)
        before the chunk's own, then the chunk's last keys written to their slots."""
        slots, length = keys.shape[2], q.shape[1]
        earlier = torch.arange(max(0, start - (window - 1)), start, device=q.device) % slots
        all_keys = torch.cat([keys[:, :, earlier].transpose(1, 2), k.to(keys.dtype)], dim=1)
        all_values = torch.cat([values[:, :, earlier].transpose(1, 2), v.to(values.dtype)], dim=1)
        kept = min(length, slots)
        written = torch.arange(start + length - kept, start + length, device=q.device) % slots
        keys[:, :, written] = all_keys[:, -kept:].transpose(1, 2)
        values[:, :, written] = all_values[:, -kept:].transpose(1, 2)
        num_earlier, block = earlier.numel(), max(WINDOW_QUERY_BLOCK, 2 * window)
        outputs = []
        for first in range(0, length, block):
            last = min(length, first + block)
            # Queries first .. last - 1 sit at key index num_earlier + i and see the window - 1 keys before it.
            lowest = max(0, num_earlier + first - (window - 1))
            outputs.append(softmax_attention(q[:, first:last], all_keys[:, lowest : num_earlier + last],
                                             all_values[:, lowest : num_earlier + last], scale=self.scale,
                                             window=window))
        return torch.cat(outputs, dim=1)

    def _attention_mix(self, q, k, v, keys, values, start):
        end = start + q.shape[1]
        keys[:, :, start:end] = k.transpose(1, 2)
        values[:, :, start:end] = v.transpose(1, 2)
        return chunk_attention(q, keys, values, start=start, scale=self.scale, backend=self.attention_backend)

    def _decode_forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One token per row at the row's position cache.length[b]; graph-safe (no host reads). Logits [B, V]."""
        model, cache, step = self.model.model, self.cache, self.step
        positions = cache.length
        position_ids = positions[:, None]
        stream, cos, sin = step.embed(input_ids, position_ids)
        valid_lengths = positions + 1
        # Sliding-window layers: position p in slot p % slots; a query reads the ring's filled slots.
        rings = {slots: (positions % slots, valid_lengths.clamp(max=slots))
                 for slots in set(cache.window_slots.values())}
        for index, block in enumerate(model.layers):
            if block.layer_type == "lightning":
                stream = step.lightning(index, block, stream, position_ids, cos, sin, cache.states[index])
                continue
            if block.layer_type in GATED_LINEAR_OPS:
                stream = step.recurrent(index, block, stream, position_ids, cos, sin, cache.states[index])
                continue
            keys, values = cache.keys[index], cache.values[index]
            write_at, lengths = rings[cache.window_slots[index]] if index in cache.window_slots else (positions,
                                                                                                     valid_lengths)
            stream, q, carry = step.attention_in(index, block, stream, position_ids, cos, sin, keys, values, write_at)
            output = decode_attention(q, keys, values, lengths,
                                      scale=self.scale, kernel=self.decode_kernel,
                                      config=self.settings.decode_attention_config)
            stream = step.attention_out(index, block, stream, carry, output)
        cache.length.add_(1)
        return step.logits(stream)

    def _step(self) -> None:
        self._logits = self._decode_forward(self._tokens)
        self._tokens.copy_(self._logits.argmax(-1, keepdim=True))

    @torch.no_grad()
    def capture_graph(self, *, warmup_steps: int = 2) -> None:
        """Record one decode step (greedy next token fed back) in a CUDA graph; the cache is left as it was."""
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need the model on a CUDA device")
        self._check_room(warmup_steps)
        # The warm-up steps write states, and ring slots that still hold keys of the window: both are restored.
        # (The other KV buffers are written past each row's length only, where the next steps overwrite them.)
        saved_rings = {i: (self.cache.keys[i].clone(), self.cache.values[i].clone()) for i in self.cache.window_slots}
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
        for index, (keys, values) in saved_rings.items():
            self.cache.keys[index].copy_(keys)
            self.cache.values[index].copy_(values)
        self.cache.length.copy_(length)
        self._tokens.copy_(tokens)

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Append one token per row (input_ids [B, 1]; None = the greedy token from the last step) and return the
        logits [B, V] of the new position. Replays the CUDA graph when one was captured. The returned tensor is the
        engine's own buffer under a graph: the next call overwrites it."""
        self._check_room(1)
        if input_ids is not None:
            self._tokens.copy_(input_ids)
        if self._graph is not None:
            self._graph.replay()
        else:
            self._step()
        self._lengths = [length + 1 for length in self._lengths]
        return self._logits

    @property
    def next_tokens(self) -> torch.Tensor:
        """[B, 1]: the greedy tokens of the last prefill or decode step (the next decode's input by default)."""
        return self._tokens

    @torch.no_grad()
    def generate_greedy(self, num_tokens: int) -> torch.Tensor:
        """Greedy continuation of the prefilled prompt: [B, num_tokens] token ids."""
        tokens = []
        for _ in range(num_tokens):
            tokens.append(self._tokens.clone())
            self.decode()
        return torch.cat(tokens, dim=1)

    def fill_synthetic(self, length: int, *, seed: int = 0) -> None:
        """Benchmarks only: pretend `length` positions are cached in every row (random unit-scale KV, small random
        states), so that decode at a long context is timed without paying its prefill."""
        self._check_room(length - self.num_cached)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        for buffer in (*self.cache.keys.values(), *self.cache.values.values()):
            buffer[:, :, :length].normal_(generator=generator)
        for state in self.cache.states.values():
            state.normal_(std=0.01, generator=generator)
        self.num_cached = length


def attention_windows(model, options: InferenceOptions) -> dict[int, int]:
    """Layer index -> window of each attention layer that runs as sliding-window attention under `options` ("swa";
    RoPE attention under EME), from the layers themselves (`Attention.window`)."""
    windows = {}
    for index, block in enumerate(model.model.layers):
        window = block.mixer.window(options) if block.layer_type in KV_CACHE_LAYER_TYPES else None
        if window is not None:
            windows[index] = window
    return windows


def _left_padded_counts(attention_mask: torch.Tensor) -> list[int]:
    """Real tokens per row of a left-padded mask [B, T]; a mask with padding elsewhere, or an empty row, is refused."""
    mask = attention_mask.bool()
    counts = mask.sum(-1)
    width = mask.shape[-1]
    expected = torch.arange(width, device=mask.device)[None, :] >= (width - counts)[:, None]
    if not torch.equal(mask, expected):
        raise ValueError("the engine takes left-padded batches: every row's real tokens last, padding first")
    counts = counts.tolist()
    if min(counts) < 1:
        raise ValueError("every row needs at least one real token")
    return counts


def _one_sequence(tensor: torch.Tensor) -> torch.Tensor:
    """[n, T, ...] -> [1, n * T, ...] with contiguous strides, the leading dimension's included (dynamo guards on
    every stride, and `contiguous()` leaves a size-1 dimension's as it is): a view where the layout allows."""
    flat = tensor.reshape(1, -1, *tensor.shape[2:])
    strides, step = [], 1
    for size in reversed(flat.shape):
        strides.append(step)
        step *= max(size, 1)
    if flat.stride() != tuple(reversed(strides)):
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat


def _chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """[first, last) of each prefill chunk of `length` tokens: `chunk` tokens each, the rest last. A rest of one
    token takes one more from the chunk before it (.., chunk - 1, 2): a one-token chunk would be a compiled graph
    of its own (`InferenceEngine._symbolic_length`)."""
    bounds = [(first, min(length, first + chunk)) for first in range(0, length, chunk)]
    if len(bounds) > 1 and chunk > 2 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], length - 2), (length - 2, length)]
    return bounds


def _runs(keys: list) -> list[tuple[int, int]]:
    """[first, last) ranges of consecutive equal keys."""
    runs, first = [], 0
    for index in range(1, len(keys) + 1):
        if index == len(keys) or keys[index] != keys[first]:
            runs.append((first, index))
            first = index
    return runs
