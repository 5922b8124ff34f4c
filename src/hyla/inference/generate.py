"""Generation for HypeNet models on the inference engine: `hyla.generate(model, input_ids, attention_mask, ...)`.

The engine's static hybrid cache, chunked prefill and (on CUDA) graph-captured decode, batched: a left-padded batch
is prefilled without its padding (each row at its own positions, rows of equal length together) and decoded in one
step for all rows, greedily or by sampling (temperature, top-k, top-p, in transformers' order), each row stopping at
its end-of-sequence token. The result has transformers' form: the input ids followed by the new tokens, a finished
row's later positions filled with the pad token, as long as the longest row needed.

Models the engine cannot run (other architectures; HypeNets with layer types it has no fast path for, the
head-wise hybrids: `engine.SUPPORTED_LAYER_TYPES`) go to their own `generate` (transformers'); every InferenceOptions
runs on the engine, EME and logit scaling included. `generation_path(model)` says which path a model takes and why; a
result file names the path its outputs came from as `generation_path_record` writes it. On CUDA
`HypeNetForCausalLM.generate` itself comes here for the requests both paths serve alike (`hf_request_to_engine`;
`engine_request` translates such a request on any device).
`GenerationSession` keeps its engine between calls (an evaluation's batches) while it fits them: a greedy batch of
fewer rows than the engine's runs with filler rows (two pad tokens each, their outputs dropped), and prompts shorter
than its buffer use the front of it, so an evaluation that `reserve`s its largest batch and longest prompt up front
builds one engine and captures one decode graph. A session's engine holds copies of weights it fused, so a session
must not outlive changes to the model's weights (each `generate` rebuilds it when it sees parameters changed).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from hyla.inference.engine import InferenceEngine, unsupported_reason
from hyla.inference.settings import EngineSettings, fit_to_model, tuned_settings

GENERATION_PATHS = ("auto", "engine", "hf")
# How often (in decode steps) the host asks whether every row has finished: each ask waits for the device.
_FINISHED_CHECK_EVERY = 8


def generation_path(model, requested: str = "auto", inference_options=None) -> tuple[str, str]:
    """("engine" or "hf", why) for `model` under `inference_options` (None: the model's own): "auto" takes the
    engine wherever it runs the model."""
    if requested not in GENERATION_PATHS:
        raise ValueError(f"generation path must be one of {', '.join(GENERATION_PATHS)}, got {requested!r}")
    reason = unsupported_reason(model, inference_options)
    if requested == "hf":
        return "hf", "asked for transformers' generate"
    if reason is not None:
        if requested == "engine":
            raise ValueError(f"generation path 'engine' cannot run this model: {reason}")
        return "hf", reason
    return "engine", f"HypeNet on {model.device.type}"


def generation_path_record(*paths: str | None) -> str | None:
    """The `generation_path` a result file records for outputs generated on `paths` (each "engine", "hf", or such a
    record itself, read back from a resumed result; None: nothing generated there): the path they all took, or both
    joined ("engine+hf") where some took each; None where nothing was generated."""
    names = sorted({name for path in paths if path for name in path.split("+")})
    return "+".join(names) or None


@dataclass(frozen=True)
class Sampling:
    """do_sample False: greedy. Else temperature, then top_k (None or 0: off), then top_p (None or 1: off)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"sampling needs temperature > 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def choose(self, logits: torch.Tensor, *, batch_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Next tokens [B] from logits [B, V], as transformers' warpers and sampler compute them (float32).
        batch_rows [B]: the batch row of each row of logits where the two orders differ (None: they do not)."""
        scores = logits.float()
        if not self.do_sample:
            return scores.argmax(-1)
        if batch_rows is not None:
            # One multinomial over [B, V] draws for the rows in turn: drawing in the batch's order gives each row
            # the draw transformers gives it under the same seed. Tokens come back in the order of `logits`.
            return self.choose(_to_batch_order(logits, batch_rows))[batch_rows]
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_k:
            kth = torch.topk(scores, min(self.top_k, scores.shape[-1]))[0][..., -1, None]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, descending=False)
            remove = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= (1 - self.top_p)
            remove[..., -1:] = False
            scores = scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))
        return torch.multinomial(scores.softmax(dim=-1), num_samples=1)[:, 0]


@dataclass
class GenerationStats:
    """What the last `generate` call did: tokens and seconds of prefill and decode, and the engine it used.
    engine_built_s: the seconds the session's engine took to build, whichever call built it; engine_build_s and
    graph_capture_s: this call's seconds building an engine and capturing its decode graph (0 when it reused them;
    decode_s leaves the capture out)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    engine_built_s: float = 0.0
    engine_build_s: float = 0.0
    graph_capture_s: float = 0.0
    settings: dict = field(default_factory=dict)

    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else math.nan

    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else math.nan


def _buffer_length(needed: int) -> int:
    """The engine's buffer for `needed` positions: rounded up to 1/8 of its power of two (at most 12.5% unused), so
    that prompts of similar length share one engine."""
    step = max(256, 2 ** max(0, math.ceil(math.log2(needed)) - 3))
    return -(-needed // step) * step


def _eos_ids(eos_token_id) -> list[int]:
    if eos_token_id is None:
        return []
    return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]


class GenerationSession:
    """Generation on the engine for one model, reusing the engine while batch size and buffer fit. settings: the
    engine's (None: the tuned settings of the model's device; for an evaluation, `evaluation=True`, with their
    `evaluation` fields: `EngineSettings.for_evaluation`), fitted to each engine's batch size and the model
    (`hyla.inference.settings.fit_to_model`); inference_options: how the model runs (None: the model's
    own, as they are when each engine is built); overrides: EngineSettings fields on top."""

    def __init__(self, model, *, settings: EngineSettings | None = None, inference_options=None,
                 evaluation: bool = False, **overrides):
        reason = unsupported_reason(model, inference_options)
        if reason is not None:
            raise ValueError(reason)
        self.model, self.settings, self.overrides = model, settings, overrides
        self.evaluation = evaluation
        self.inference_options = inference_options
        self.engine: InferenceEngine | None = None
        self._fingerprint = None
        self._build_s = 0.0  # the current call's seconds building an engine
        self.builds = 0  # engines built so far
        self.stats = GenerationStats()

    def _weights_fingerprint(self) -> tuple:
        # In-place updates (an optimizer step, load_state_dict) bump a tensor's version; a swapped module brings
        # other tensors: either way the engine's fused copies of the weights are stale.
        return (tuple((id(p), p._version) for p in self.model.parameters()) + (tuple(self.model.config.layer_types),)
                + (self._options(),))

    def _options(self):
        return self.inference_options if self.inference_options is not None else self.model.inference_options

    def reserve(self, batch_size: int, positions: int) -> float:
        """Make the engine serve greedy batches of up to `batch_size` rows of up to `positions` positions each
        (prompt and new tokens) now, building it unless the current one does: an evaluation that knows its largest
        batch and longest prompt builds one engine, one decode graph and one set of compiled shapes for all its
        batches. Returns the seconds spent building (0 when the engine was kept)."""
        self._engine(batch_size, positions, fillers=True)
        return self._build_s

    def _engine(self, batch_size: int, needed: int, *, fillers: bool) -> InferenceEngine:
        """An engine of at least `needed` positions a row and `batch_size` rows (more rows where `fillers`: the
        caller fills the rest), the current one where it fits and the weights are unchanged."""
        fingerprint = self._weights_fingerprint()
        engine = self.engine
        self._build_s = 0.0
        rows_fit = engine is not None and (engine.batch_size == batch_size
                                           or (fillers and engine.batch_size > batch_size))
        if not rows_fit or fingerprint != self._fingerprint or engine.cache.max_length < needed:
            self.engine = engine = None
            if self.model.device.type == "cuda":
                torch.cuda.empty_cache()
            started = time.perf_counter()
            settings = self.settings
            if settings is None:
                settings = tuned_settings(self.model.device)
                if self.evaluation:
                    settings = settings.for_evaluation(self.model)
            # given or tuned, a settings' `batched` fields apply above batch 1 (a file's batch-1 triton-fused step
            # would otherwise refuse an evaluation's batch of 8), and what the model cannot run falls back
            settings, notes = fit_to_model(settings, self.model, batch_size, self._options())
            engine = InferenceEngine(self.model, batch_size=batch_size, max_length=_buffer_length(needed),
                                     settings=settings, inference_options=self._options(), **self.overrides)
            engine.notes = notes
            self.engine, self._fingerprint = engine, fingerprint
            self.stats.engine_built_s = self._build_s = _synchronized(self.model.device) - started
            self.builds += 1
        engine.reset()
        return engine

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int = 32, sampling: Sampling = Sampling(), eos_token_id=None,
                 pad_token_id: int | None = None, streamer=None) -> torch.Tensor:
        """input ids [B, T] (left-padded, with attention_mask [B, T]) followed by up to max_new_tokens new tokens
        per row, [B, T + steps]; rows stop at an eos_token_id (int or list), their later tokens pad_token_id. The
        random draws of sampling come from torch's global generator on the model's device (torch.manual_seed)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        eos = _eos_ids(eos_token_id)
        if eos and pad_token_id is None:
            pad_token_id = eos[0]
        device = self.model.device
        ids = input_ids.to(device)
        mask = attention_mask.to(device) if attention_mask is not None else None
        rows = ids.shape[0]
        counts = mask.long().sum(-1) if mask is not None else torch.full((rows,), ids.shape[1], device=device)
        engine = self._engine(rows, int(counts.max()) + max_new_tokens, fillers=not sampling.do_sample)
        self.stats = GenerationStats(prompt_tokens=int(counts.sum()), engine_built_s=self.stats.engine_built_s,
                                     engine_build_s=self._build_s, settings=engine.settings.summary())
        if engine.batch_size > rows:  # greedy on a larger engine: filler rows after the batch's, dropped below
            ids, mask = _with_fillers(ids, mask, engine.batch_size - rows, 0 if pad_token_id is None else pad_token_id)
            counts = mask.long().sum(-1)
        # Rows of equal length next to each other: the engine prefills each run of them together.
        order = torch.argsort(counts, stable=True)
        batch_rows = None if torch.equal(order, torch.arange(len(order), device=device)) else order
        fillers = order >= rows if engine.batch_size > rows else None  # in the engine's row order
        sorted_mask = mask[order] if mask is not None else None
        if streamer is not None:
            streamer.put(input_ids.cpu())
        started = _synchronized(device)
        logits = engine.prefill(ids[order], sorted_mask)
        tokens = sampling.choose(logits, batch_rows=batch_rows)
        prefilled = _synchronized(device)
        new = self._decode(engine, tokens, max_new_tokens, sampling, eos, pad_token_id, streamer, batch_rows,
                           fillers=fillers)
        self.stats.prefill_s = prefilled - started
        self.stats.decode_s = _synchronized(device) - prefilled - self.stats.graph_capture_s
        if streamer is not None:
            streamer.end()
        output = _to_batch_order(new, order)[:rows]
        self.stats.new_tokens = _num_generated(output, eos)
        return torch.cat([input_ids, output.to(input_ids.device)], dim=1)

    def _decode(self, engine, tokens, max_new_tokens, sampling, eos, pad_token_id, streamer,
                batch_rows=None, *, fillers=None) -> torch.Tensor:
        """[B, steps] new tokens from the prefill's choice `tokens` [B] on, rows in the engine's order (batch_rows:
        the batch row of each, as `Sampling.choose` takes it); steps <= max_new_tokens (fewer once every row has
        ended, as transformers stops). fillers [B]: the engine's rows that are no batch row (greedy only): ended
        from the start, never streamed."""
        batch, device = tokens.shape[0], tokens.device
        if device.type == "cuda" and not engine.graph_captured and max_new_tokens > 1:
            started = _synchronized(device)
            engine.capture_graph()
            self.stats.graph_capture_s = _synchronized(device) - started
        new = torch.empty(batch, max_new_tokens, dtype=torch.long, device=device)
        eos_ids = torch.tensor(eos, device=device) if eos else None
        finished = torch.zeros(batch, dtype=torch.bool, device=device) if fillers is None else fillers.clone()
        real = batch if fillers is None else batch - int(fillers.sum())
        for step in range(max_new_tokens):
            if eos_ids is not None:
                tokens = torch.where(finished, pad_token_id, tokens)
            new[:, step] = tokens
            if streamer is not None:  # in the batch's row order
                streamer.put((tokens if batch_rows is None else _to_batch_order(tokens, batch_rows))[:real].cpu())
            if eos_ids is not None:
                finished |= torch.isin(tokens, eos_ids)
                if (step + 1) % _FINISHED_CHECK_EVERY == 0 and bool(finished.all()):
                    break
            if step == max_new_tokens - 1:
                break
            # Greedy: the engine feeds its own argmax back (inside the graph); sampling feeds the drawn token.
            logits = engine.decode(tokens[:, None] if sampling.do_sample else None)
            tokens = sampling.choose(logits, batch_rows=batch_rows) if sampling.do_sample else engine.next_tokens[:, 0]
        new = new[:, : step + 1]
        if eos_ids is not None:
            # Checked every few steps: cut at the step where the last row ended, where transformers stops.
            rows = new if fillers is None else new[~fillers]
            ended = (torch.cumsum(torch.isin(rows, eos_ids).long(), dim=1) > 0).all(dim=0)
            if bool(ended.any()):
                new = new[:, : int(ended.long().argmax()) + 1]
        return new


def _with_fillers(ids: torch.Tensor, mask: torch.Tensor | None, count: int,
                  fill_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] and their mask (None: no padding) with `count` filler rows after them: two real tokens of
    `fill_id` each at the right (one where T is 1), so that their prefill is one more run of rows of a length that
    compiled prefill functions take symbolically (dynamo specialises a one-token run)."""
    width = ids.shape[1]
    filler_mask = torch.zeros(count, width, dtype=torch.long, device=ids.device)
    filler_mask[:, width - min(2, width):] = 1
    mask = torch.ones_like(ids, dtype=torch.long) if mask is None else mask.long()
    return (torch.cat([ids, torch.full((count, width), fill_id, dtype=ids.dtype, device=ids.device)]),
            torch.cat([mask, filler_mask]))


def _num_generated(new: torch.Tensor, eos: list[int]) -> int:
    """Tokens generated over all rows: each row's up to and including its first end-of-sequence token."""
    if not eos:
        return new.numel()
    is_eos = torch.isin(new, torch.tensor(eos, device=new.device))
    before_end = torch.cumsum(is_eos.long(), dim=1) - is_eos.long() == 0
    return int(before_end.sum())


def _synchronized(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()



def _to_batch_order(rows: torch.Tensor, batch_rows: torch.Tensor) -> torch.Tensor:
    """`rows` in the engine's order (engine row i is batch row batch_rows[i]) put back in the batch's order."""
    out = torch.empty_like(rows)
    out[batch_rows] = rows
    return out

def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
             max_new_tokens: int = 32, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, eos_token_id=None, pad_token_id: int | None = None, streamer=None,
             path: str = "auto", settings: EngineSettings | None = None, inference_options=None,
             **engine_overrides) -> torch.Tensor:
    """Generate for `model`: on the inference engine for HypeNet models (CPU or CUDA), else the model's own
    `generate`. input_ids [B, T] left-padded with attention_mask [B, T] (None: no padding). Returns [B, T + steps]
    as transformers does (`GenerationSession.generate`). path: "auto", "engine" (refused where it cannot run) or
    "hf" (transformers' generate); settings / engine_overrides: the engine's (`hyla.inference.settings`);
    inference_options: how a HypeNet runs (`hyla.InferenceOptions`; None: the model's own)."""
    chosen, _ = generation_path(model, path, inference_options)
    sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p)
    if chosen == "hf":
        return hf_generate(model, input_ids, attention_mask, max_new_tokens=max_new_tokens, sampling=sampling,
                           eos_token_id=eos_token_id, pad_token_id=pad_token_id, streamer=streamer,
                           inference_options=inference_options)
    session = GenerationSession(model, settings=settings, inference_options=inference_options, **engine_overrides)
    return session.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens, sampling=sampling,
                            eos_token_id=eos_token_id, pad_token_id=pad_token_id, streamer=streamer)


def hf_generate(model, input_ids, attention_mask=None, *, max_new_tokens: int, sampling: Sampling = Sampling(),
                eos_token_id=None, pad_token_id=None, streamer=None, inference_options=None) -> torch.Tensor:
    """transformers' generate with the same request (for models hyla does not own, and the "hf" path);
    inference_options reach a HypeNet's forward (a model without them refuses any)."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=sampling.do_sample, num_beams=1, pad_token_id=pad_token_id,
                  streamer=streamer)
    if inference_options is not None:
        if not hasattr(model, "inference_options"):
            raise ValueError(f"inference options need a HypeNet model, not {type(model).__name__}")
        kwargs["inference_options"] = inference_options
    if eos_token_id is not None:
        kwargs["eos_token_id"] = eos_token_id
    if sampling.do_sample:
        kwargs.update(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p or 1.0)
    generate_fn = getattr(model, "hf_generate", model.generate)
    return generate_fn(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


# GenerationConfig fields the engine serves; a request that sets any other field away from its default (beams,
# repetition penalties, stop strings, returned scores, ...) stays with transformers' generate.
_ENGINE_FIELDS = {"max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
                  "pad_token_id", "bos_token_id", "use_cache", "num_beams", "num_return_sequences",
                  "transformers_version", "_from_model_config", "_commit_hash", "_original_object_hash"}
_ENGINE_KWARGS = {"input_ids", "attention_mask", "use_cache"}
_GLOBAL_DEFAULTS = {"max_length": 20, "do_sample": False, "use_cache": True, "num_beams": 1, "temperature": 1.0,
                    "top_k": 50, "top_p": 1.0, "num_return_sequences": 1}


def hf_request_to_engine(model, inputs, generation_config, kwargs: dict, inference_options=None) -> dict | None:
    """The arguments of `GenerationSession.generate` for a `model.generate(inputs, generation_config, **kwargs)`
    call on CUDA that the engine serves exactly as transformers would (`engine_request`), else None."""
    if model.device.type != "cuda":
        return None
    return engine_request(model, inputs, generation_config, kwargs, inference_options)


def engine_request(model, inputs, generation_config, kwargs: dict, inference_options=None) -> dict | None:
    """The arguments of `GenerationSession.generate` for a `model.generate(inputs, generation_config, **kwargs)`
    call the engine serves exactly as transformers would on any device (a supported HypeNet under
    `inference_options`, greedy or plain sampling, one beam and sequence), else None. `streamer` rides along."""
    import copy

    from transformers import GenerationConfig

    if unsupported_reason(model, inference_options) is not None:
        return None
    kwargs = dict(kwargs)
    streamer = kwargs.pop("streamer", None)
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    unused = config.update(**kwargs)
    input_ids = inputs if inputs is not None else unused.get("input_ids")
    if set(unused) - _ENGINE_KWARGS or not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return None
    # transformers resolves unset fields to these when it generates (5.x: GenerationConfig's global defaults).
    defaults = getattr(GenerationConfig, "_get_default_generation_params", lambda: _GLOBAL_DEFAULTS)()
    for name, value in config.to_dict().items():
        neutral = value is None or value is False or (name in defaults and value == defaults[name])
        if name not in _ENGINE_FIELDS and not neutral:
            return None

    def setting(name):
        value = getattr(config, name, None)
        return defaults.get(name) if value is None else value

    if setting("num_beams") != 1 or setting("num_return_sequences") != 1 or setting("use_cache") is False:
        return None
    max_new_tokens = config.max_new_tokens
    if max_new_tokens is None:
        max_new_tokens = setting("max_length") - input_ids.shape[1]
    if max_new_tokens < 1:
        return None
    eos = config.eos_token_id
    pad = config.pad_token_id if config.pad_token_id is not None else (_eos_ids(eos) or [None])[0]
    sampling = Sampling()
    if setting("do_sample"):
        sampling = Sampling(do_sample=True, temperature=setting("temperature"), top_k=setting("top_k"),
                            top_p=setting("top_p"))
    return {"input_ids": input_ids, "attention_mask": unused.get("attention_mask"), "max_new_tokens": max_new_tokens,
            "sampling": sampling, "eos_token_id": eos, "pad_token_id": pad, "streamer": streamer}
