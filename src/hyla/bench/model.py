"""`hyla bench model`: HypeNet-2B against the Qwen3-1.7B shape, random bf16 weights, on one GPU.

Systems: `hypenet` and `qwen3-engine` run through hyla's inference engine (chunked prefill, CUDA-graph decode), the
latter being the Qwen3 network itself (weights copied from the HF model, checked against it); `qwen3-hf-default` is
HF transformers as users get it (SDPA, DynamicCache, eager), `qwen3-hf-graph` HF's StaticCache decode under a CUDA
graph. Every system is checked against its reference before it is timed; a failed check stops the benchmark.
"""

from __future__ import annotations

import copy
import gc
from dataclasses import asdict, dataclass, replace

import torch

from hyla.bench import hf_baseline, shapes
from hyla.bench.floors import ModelShape
from hyla.bench.timing import CheckFailed, allocated_gib, peak_memory_gib, relative_error, reset_peak_memory, time_ms
from hyla.inference import InferenceEngine
from hyla.inference.settings import OVERRIDABLE, EngineSettings, fit_to_model, resolve_settings
from hyla.models.modeling import cache_argument
from hyla.ops.dispatch import use_backend

SYSTEMS = ("hypenet", "qwen3-engine", "qwen3-hf-default", "qwen3-hf-graph")
# An expert comparison, run only when named: the HypeNet shape with the decode step forced to fused projections through
# cuBLAS, beside "hypenet" (the tuned settings) on the same built model. It differs from "hypenet" only where the tuned
# settings choose another step: batch 1 on a GPU whose file picks triton-fused (the H200), and CPU (eager); above
# batch 1, and on GPUs that run default.json, the tuned settings are that step already.
EXTRA_SYSTEMS = ("hypenet-fused",)
# bf16 weights and activations; the engine and the reference round at different points (chunked attention merged in
# fp32, fp32 recurrent state vs fla's chunk kernel, split-K decode): ~1e-2 relative on logits, as the model's own
# GPU test allows for fla vs reference in bf16. See check_engine for the bar actually applied.
CHECK_TOLERANCE = 2e-2
MARGIN = 256  # decode positions past the longest context


@dataclass(frozen=True)
class ModelSettings:
    contexts: tuple[int, ...] = (2**13, 2**15, 2**17, 2**19, 2**20)
    systems: tuple[str, ...] = SYSTEMS
    qwen3_engine_max_prefill: int = 2**19  # its 1M prefill would take ~4 minutes of device time
    hypenet_max_prefill: int = 2**20
    hf_max_prefill: int = 2**17
    hf_max_default_decode: int = 2**19
    hf_graph_contexts: tuple[int, ...] = (2**15, 2**17, 2**19)
    large_batch: int = 32
    large_batch_contexts: tuple[int, ...] = (2**13, 2**15)
    decode_steps: int = 20
    repeats: int = 3  # timed repetitions of each measurement (fewer when one takes seconds)
    long_prefill_repeats: int = 1  # timed prefills at >= 128K (median reported, every time kept)
    # The engine's settings: a settings file (None: the tuned settings shipped for this GPU, hyla.inference.settings)
    # and expert overrides of its fields (None: the file's value). The values a run used are in its results: "engine"
    # as resolved for the device, and each system's "engine" / "engine_batched" as fitted to its model and batch.
    engine_settings: str | None = None
    prefill_chunk: int | None = None
    attention_backend: str | None = None  # the prefill attention kernel: auto (cuDNN on CUDA), cudnn, flash, torch
    decode_step: str | None = None
    matvec: str | None = None
    compile_decode: bool | None = None
    compile_prefill: bool | None = None
    compile_mode: str | None = None
    launch_pdl: bool | None = None
    check_length: int = 2000
    toy: bool = False
    device: str = "cuda"
    dtype: str = "bfloat16"


def engine_settings(settings, model, batch_size: int):
    """(EngineSettings, notes) of a benchmark's `settings` (ModelSettings or ProfileSettings) for `model` at
    `batch_size`: its settings file or the tuned settings, its overrides, fitted to the model and batch
    (`hyla.inference.settings.fit_to_model`: above batch 1, the file's batched settings)."""
    return fit_to_model(resolved_settings(settings, model.device), model, batch_size)


def resolved_settings(settings, device) -> EngineSettings:
    """The EngineSettings a benchmark's `settings` name on `device`, before they are fitted to a model: its settings
    file or the tuned settings of the device, with the overrides it sets."""
    overrides = {name: getattr(settings, name, None) for name in OVERRIDABLE}
    return resolve_settings(device, path=settings.engine_settings, **overrides)


def build_engine(model, settings, *, batch_size: int, max_length: int, **overrides) -> InferenceEngine:
    resolved, _ = engine_settings(settings, model, batch_size)
    return InferenceEngine(model, batch_size=batch_size, max_length=max_length, settings=resolved, **overrides)


def _free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_hypenet(config, *, device, dtype):
    from hyla.models.modeling import HypeNetForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = HypeNetForCausalLM(config)
    return model.to(dtype).eval()


def _random_ids(model, batch, length, seed):
    generator = torch.Generator(device=model.device).manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), device=model.device, generator=generator)


@torch.no_grad()
def check_engine(model, reference, settings: ModelSettings) -> dict:
    """Engine prefill (>= 3 chunks, so merged chunk attention runs) and graph decode against a float32 copy of
    `reference` over the same tokens. The bar is the reference's own forward in the benchmark dtype: random-weight
    models at these widths amplify bf16 rounding (measured on CPU, 8 of HypeNet-2B's layers: bf16 forward 3.7% from
    float32; the engine in float32 within 4e-6 of the model in float32), so the engine may not add more than half
    again the error the model's own bf16 forward has, nor exceed CHECK_TOLERANCE when that is larger."""
    length, steps = settings.check_length, 8
    ids = _random_ids(model, 1, length + steps, seed=1)
    exact = copy.deepcopy(reference).float()
    # Pure-torch mixers for the float32 copy: no kernel compilation and autotuning for a second dtype.
    with use_backend("torch"):
        expected = exact(ids, use_cache=False).logits[:, length - 1 :].float()
    del exact
    _free()
    own = reference(ids, use_cache=False).logits[:, length - 1 :].float()
    engine = build_engine(model, settings, batch_size=1, max_length=length + steps, prefill_chunk=-(-length // 3))
    logits = [engine.prefill(ids[:, :length]).float()]
    if model.device.type == "cuda":
        engine.capture_graph()
    for t in range(length, length + steps):
        logits.append(engine.decode(ids[:, t : t + 1]).float())
    got = torch.stack(logits, dim=1)
    errors = {"prefill": relative_error(got[:, 0], expected[:, 0]),
              "decode": relative_error(got[:, 1:], expected[:, 1:])}
    reference_error = relative_error(own, expected)
    bar = max(CHECK_TOLERANCE, 1.5 * reference_error)
    if not max(errors.values()) <= bar:
        raise CheckFailed(f"engine logits vs float32 reference: {errors} > {bar:.3g} (the reference's own "
                          f"{settings.dtype} forward: {reference_error:.3g})")
    return {"length": length, "decode_steps": steps, "bar": bar, "relative_errors": errors,
            "reference_own_dtype_error": reference_error}


def _prefill_row(shape: ModelShape, context: int, batch: int, ms: float, device) -> dict:
    floor_s = shape.prefill_floor_s(context) * batch
    return {"context": context, "batch": batch, "ms": ms, "us_per_token": 1e3 * ms / (context * batch),
            "floor_s": floor_s, "ratio_to_floor": ms * 1e-3 / floor_s,
            "tflops": shape.prefill_flops(context) * batch / (ms * 1e-3) / 1e12, "peak_gib": peak_memory_gib(device)}


def _decode_row(shape: ModelShape, context: int, batch: int, ms: float, device, **extra) -> dict:
    floor = shape.decode_floor_ms(context, batch)
    return {"context": context, "batch": batch, "ms_per_token": ms, "floor_ms": floor, "ratio_to_floor": ms / floor,
            "tokens_per_s": 1e3 * batch / ms, "weights_plus_cache_gib": shape.decode_bytes(context, batch) / 2**30,
            "peak_gib": peak_memory_gib(device), **extra}


def time_engine_prefill(engine, shape, context, log, repeats, long_repeats: int = 1) -> dict:
    """Prefill time at `context`: the median of `repeats` runs after a warm-up run; at >= 128K of `long_repeats`
    runs (default one) after a one-chunk warm-up. The row keeps every timed run (`times_ms`)."""
    ids = _random_ids(engine.model, engine.batch_size, context, seed=context)

    def run():
        engine.reset()
        engine.prefill(ids)

    long = context >= 2**17
    if long:  # one chunk instead of a whole warm-up run: compilation (compile_prefill) and first-use costs
        engine.reset()
        engine.prefill(ids[:, : engine.settings.prefill_chunk])
    reset_peak_memory(engine.device)
    before = allocated_gib(engine.device)
    if long:
        timing = time_ms(run, device=engine.device, warmup=0, repeats=long_repeats, budget_s=None)
    else:
        timing = time_ms(run, device=engine.device, warmup=1, repeats=repeats)
    row = _prefill_row(shape, context, engine.batch_size, timing["median_ms"], engine.device)
    row["times_ms"] = timing["times_ms"]
    # The static cache is sized for the longest context: what this length needs is weights + its KV + temporaries.
    row["allocated_before_gib"] = before
    log(f"  prefill T={context:>8d} B={engine.batch_size}: {row['ms'] / 1e3:8.3f} s  {row['us_per_token']:7.2f} us/tok"
        f"  {row['tflops']:5.0f} TFLOP/s  floor x{row['ratio_to_floor']:.2f}  peak {row['peak_gib']} GiB")
    return row


def decode_at(engine, context: int, steps: int) -> None:
    """`steps` decode steps starting at position `context` of an already filled cache (benchmarks: the same positions
    every time, so repetitions measure the same work)."""
    engine.cache.length.fill_(context)
    engine.num_cached = context
    for _ in range(steps):
        engine.decode()


def time_engine_decode(engine, shape, context, steps, log, repeats, **extra) -> dict:
    timing = time_ms(lambda: decode_at(engine, context, steps), device=engine.device, warmup=1, repeats=repeats)
    row = _decode_row(shape, context, engine.batch_size, timing["median_ms"] / steps, engine.device, **extra)
    log(f"  decode  T={context:>8d} B={engine.batch_size}: {row['ms_per_token']:8.3f} ms/tok  floor "
        f"{row['floor_ms']:.3f} ms (x{row['ratio_to_floor']:.2f})  {row['tokens_per_s']:9.1f} tok/s")
    return row


def bench_engine(name, model, shape, settings, *, batch, contexts, prefill_contexts, log) -> tuple[list, list]:
    """Prefill (largest first: later lengths reuse the attention plans it builds) then graph decode. The longest
    prefilled context is decoded right after its real prefill; the others over a synthetic cache."""
    device = model.device
    engine = build_engine(model, settings, batch_size=batch, max_length=max(contexts) + MARGIN)
    log(f"  engine B={batch}: {engine.settings.summary()}")
    prefill, decode = [], []
    for context in sorted(prefill_contexts, reverse=True):
        prefill.append(time_engine_prefill(engine, shape, context, log, settings.repeats,
                                           settings.long_prefill_repeats))
        if context == max(prefill_contexts) and device.type == "cuda":
            engine.capture_graph()
            decode.append(time_engine_decode(engine, shape, context, settings.decode_steps, log, settings.repeats,
                                             after_real_prefill=True, launch_pdl=engine.launch_pdl))
    if device.type == "cuda" and not engine.graph_captured:
        engine.capture_graph()
    engine.fill_synthetic(max(contexts))
    for context in sorted(set(contexts) - {row["context"] for row in decode}):
        decode.append(time_engine_decode(engine, shape, context, settings.decode_steps, log, settings.repeats,
                                         after_real_prefill=False, launch_pdl=engine.launch_pdl))
    del engine
    _free()
    return prefill, decode


def _run_guarded(rows_out: list, skipped: list, what: dict, fn, log):
    try:
        rows_out.extend(fn())
    except torch.OutOfMemoryError as err:
        skipped.append({**what, "reason": f"out of memory: {str(err).splitlines()[0]}"})
        log(f"  skipped {what}: out of memory")
        _free()


def bench_engine_system(name, model, reference, settings, log) -> dict:
    shape = ModelShape.of(model)
    log(f"{name}: {shape.num_params / 1e9:.3f}B parameters, {shape.num_attention_layers} attention layers, "
        f"KV {shape.kv_bytes_per_token()} B/token, weights {shape.weight_bytes / 2**30:.2f} GiB")
    try:
        check = check_engine(model, reference, settings)
    except (RuntimeError, AssertionError) as err:
        if isinstance(err, CheckFailed):
            raise
        # cuDNN attention and torch.compile are optimisations with fallbacks (flash; plain graph); the check decides.
        log(f"  fast path failed ({type(err).__name__}: {str(err).splitlines()[0][:200]}); trying flash, uncompiled")
        settings = replace(settings, compile_decode=False, compile_prefill=False,
                           attention_backend="flash" if model.device.type == "cuda" else "torch")
        check = check_engine(model, reference, settings)
    result = {"system": name, "shape": asdict(shape), "check": check,
              "engine": engine_settings(settings, model, 1)[0].summary(),
              "engine_batched": engine_settings(settings, model, settings.large_batch)[0].summary(),
              "prefill": [], "decode": [], "skipped": []}
    log(f"  check: {result['check']['relative_errors']}")
    _free()
    max_prefill = settings.qwen3_engine_max_prefill if name == "qwen3-engine" else settings.hypenet_max_prefill
    prefill_contexts = [c for c in settings.contexts if c <= max_prefill]
    decode_contexts = prefill_contexts or settings.contexts[:1]

    def batch_one():
        prefill, decode = bench_engine(name, model, shape, settings, batch=1, contexts=decode_contexts,
                                       prefill_contexts=prefill_contexts, log=log)
        result["prefill"].extend(prefill)
        return decode

    _run_guarded(result["decode"], result["skipped"], {"batch": 1}, batch_one, log)
    longer = [c for c in settings.contexts if c > max(decode_contexts)]
    for context in longer:  # decode only, over a synthetic cache of its own
        _run_guarded(result["decode"], result["skipped"], {"batch": 1, "context": context},
                     lambda c=context: bench_engine(name, model, shape, settings, batch=1, contexts=[c],
                                                    prefill_contexts=[], log=log)[1], log)
    large = list(settings.large_batch_contexts)
    if large:  # an empty list: no large-batch decode
        _run_guarded(result["decode"], result["skipped"], {"batch": settings.large_batch},
                     lambda: bench_engine(name, model, shape, settings, batch=settings.large_batch, contexts=large,
                                          prefill_contexts=[], log=log)[1], log)
    return result


def _hf_eager_step(model, tokens, position_ids, context, dtype):
    """One eager HF decode step over the synthetic DynamicCache of `context` positions, with cache and model in
    `dtype` (the same random KV values as HFGraphDecoder's)."""
    cache = hf_baseline.DynamicCache(config=model.config)
    generator = torch.Generator(device=model.device).manual_seed(context)
    for index, (keys, values) in enumerate(hf_baseline._synthetic_kv(model, 1, context, generator)):
        cache.update(keys.to(dtype), values.to(dtype), index)
    exact = model if dtype == model.dtype else copy.deepcopy(model).to(dtype)
    return exact(tokens, position_ids=position_ids.clone(), **cache_argument(cache)).logits.float()


@torch.no_grad()
def check_hf_graph(model) -> dict:
    """HF's graph-captured StaticCache step against a float32 eager step over the same synthetic cache, with the
    bar of check_engine: the eager step in the model's dtype sets how much rounding is expected."""
    context = 512
    decoder = hf_baseline.HFGraphDecoder(model, batch=1, context=context)
    tokens, positions = decoder.tokens, decoder.position_ids
    expected = _hf_eager_step(model, tokens, positions, context, torch.float32)
    _free()
    reference_error = relative_error(_hf_eager_step(model, tokens, positions, context, model.dtype), expected)
    decoder.capture()
    decoder.step()
    error = relative_error(decoder.logits.float(), expected)
    bar = max(CHECK_TOLERANCE, 1.5 * reference_error)
    if not error <= bar:
        raise CheckFailed(f"HF graph decode vs float32 eager decode: {error:.3g} > {bar:.3g} (eager in "
                          f"{model.dtype}: {reference_error:.3g})")
    return {"context": context, "relative_error": error, "bar": bar, "reference_own_dtype_error": reference_error}


def bench_hf_default(model, shape, settings, log) -> dict:
    result = {"system": "qwen3-hf-default", "shape": asdict(shape), "check": "reference (HF Qwen3 itself)",
              "prefill": [], "decode": [], "skipped": []}
    for context in [c for c in settings.contexts if c <= settings.hf_max_prefill]:
        ids = _random_ids(model, 1, context, seed=context)
        reset_peak_memory(model.device)
        long = context >= 2**17
        timing = time_ms(lambda ids=ids: hf_baseline.hf_prefill(model, ids), device=model.device,
                         warmup=0 if long else 1,
                         repeats=1 if long else settings.repeats)
        row = _prefill_row(shape, context, 1, timing["median_ms"], model.device)
        result["prefill"].append(row)
        log(f"  prefill T={context:>8d}: {row['ms'] / 1e3:8.3f} s  {row['us_per_token']:7.2f} us/tok  peak "
            f"{row['peak_gib']} GiB")
        del ids
        _free()
    plan = [(1, c) for c in settings.contexts if c <= settings.hf_max_default_decode]
    plan += [(settings.large_batch, c) for c in settings.large_batch_contexts]
    for batch, context in plan:
        def run(b=batch, c=context):
            timing = hf_baseline.time_hf_default_decode(model, batch=b, context=c, steps=settings.decode_steps)
            return [_decode_row(shape, c, b, timing["median_ms"], model.device)]

        _run_guarded(result["decode"], result["skipped"], {"batch": batch, "context": context}, run, log)
        if result["decode"] and result["decode"][-1]["context"] == context:
            log(f"  decode  T={context:>8d} B={batch}: {result['decode'][-1]['ms_per_token']:8.3f} ms/tok")
        _free()
    return result


def bench_hf_graph(model, shape, settings, log) -> dict:
    result = {"system": "qwen3-hf-graph", "shape": asdict(shape), "check": check_hf_graph(model),
              "prefill": [], "decode": [], "skipped": []}
    log(f"  check: {result['check']}")
    _free()
    plan = [(1, c) for c in settings.hf_graph_contexts]
    plan += [(settings.large_batch, c) for c in settings.large_batch_contexts]
    for batch, context in plan:
        def run(b=batch, c=context):
            decoder = hf_baseline.HFGraphDecoder(model, batch=b, context=c)
            decoder.capture()
            steps = max(1, settings.decode_steps // 4)

            def replay():
                for _ in range(steps):
                    decoder.step()

            timing = time_ms(replay, device=model.device, warmup=1, repeats=settings.repeats)
            return [_decode_row(shape, c, b, timing["median_ms"] / steps, model.device)]

        _run_guarded(result["decode"], result["skipped"], {"batch": batch, "context": context}, run, log)
        if result["decode"] and result["decode"][-1]["context"] == context:
            log(f"  decode  T={context:>8d} B={batch}: {result['decode'][-1]['ms_per_token']:8.3f} ms/tok")
        _free()
    return result


def run_model_bench(settings: ModelSettings, *, log=print, save=None) -> dict:
    """Run the requested systems; `save(results)` is called after each system so that partial results survive."""
    unknown = sorted(set(settings.systems) - set(SYSTEMS + EXTRA_SYSTEMS))
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS + EXTRA_SYSTEMS)}")
    device, dtype = torch.device(settings.device), getattr(torch, settings.dtype)
    if "qwen3-hf-graph" in settings.systems and device.type != "cuda":
        raise ValueError("qwen3-hf-graph needs a CUDA device")
    engine = resolved_settings(settings, device).summary()
    results = {"settings": asdict(settings), "engine": engine, "systems": {}}
    log(f"model bench on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"{settings.dtype}, contexts {list(settings.contexts)}, systems {list(settings.systems)}")
    log(f"engine settings: {engine}")
    hypenet_systems = [s for s in settings.systems if s in ("hypenet", "hypenet-fused")]
    if hypenet_systems:
        model = build_hypenet(shapes.hypenet_config(toy=settings.toy), device=device, dtype=dtype)
        for name in hypenet_systems:
            own = replace(settings, decode_step="fused-projections", matvec="cublas") if name == "hypenet-fused" \
                else settings
            results["systems"][name] = bench_engine_system(name, model, model, own, log)
            save and save(results)
        del model
        _free()
    qwen3_systems = [s for s in settings.systems if s.startswith("qwen3")]
    if not qwen3_systems:
        return results
    qwen3 = hf_baseline.build_qwen3(shapes.qwen3_hf_config(toy=settings.toy), device=device, dtype=dtype)
    shape = ModelShape.of(qwen3)
    if "qwen3-engine" in settings.systems:
        engine_model = build_hypenet(shapes.qwen3_engine_config(toy=settings.toy), device=device, dtype=dtype)
        hf_baseline.copy_qwen3_weights_into_hypenet(qwen3, engine_model)
        results["systems"]["qwen3-engine"] = bench_engine_system("qwen3-engine", engine_model, qwen3, settings, log)
        del engine_model
        _free()
        save and save(results)
    if "qwen3-hf-default" in settings.systems:
        log("qwen3-hf-default:")
        results["systems"]["qwen3-hf-default"] = bench_hf_default(qwen3, shape, settings, log)
        save and save(results)
    if "qwen3-hf-graph" in settings.systems:
        log("qwen3-hf-graph:")
        try:
            results["systems"]["qwen3-hf-graph"] = bench_hf_graph(qwen3, shape, settings, log)
        except CheckFailed:
            raise
        except RuntimeError as err:
            # A capture HF's forward does not allow is a missing baseline, not a wrong number: say so and go on.
            reason = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            log(f"  HF graph decode unavailable: {reason}")
            results["systems"]["qwen3-hf-graph"] = {"system": "qwen3-hf-graph", "shape": asdict(shape),
                                                    "prefill": [], "decode": [], "skipped": [{"reason": reason}]}
        save and save(results)
    return results
