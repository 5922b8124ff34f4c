"""`hyla bench generate`: NIAH evaluation through hyla's inference engine and through transformers' generate, side by
side, on a random-weight HypeNet of a converted shape (SmolLM2-135M's sizes, 30 layers, 7 NoPE attention layers).

Both paths run the same code as `hyla eval niah` (`hyla.evals.niah.evaluate_samples`, `Generation` "engine" or "hf":
left padding, batches sorted by length, greedy decoding, RULER's scoring) on the same prompts: NIAH prompts of a
synthetic word-level tokenizer (one word one token, so prompt lengths are known exactly, and no tokenizer or haystack
files are needed) with a 7-digit needle at an even spread of depths. The samples keep their token ids, as
`build_samples` keeps those of the tokenization that sized each prompt, so neither path encodes them again. A random
model retrieves nothing; the benchmark measures time. Per length, each path first runs one batch untimed
(compilation, autotuning, graph capture: reported as warm-up), then every prompt, timed; the speedup is hf seconds /
engine seconds. `same_predictions` is the fraction of prompts whose greedy text is equal on both paths (bf16 on a GPU:
random-weight logits have near ties, so some differ; the exact-equality tests run in float32,
tests/inference/test_generate_gpu.py). Each path also reports its host seconds a prompt (`host_seconds_per_prompt`):
outside generation (encoding, the padded tensors, detokenizing, the rest) and, on the engine, inside
`Generation.batch` but outside prefill and decode.

With `rnn_mixers` or `variants` it compares what each inference mode costs: one model per recurrent mixer (Lightning,
GLA or GDN in the 23 layers that are not attention, the same 7 attention layers), each run under seed 003's
inference modes (`VARIANTS`: the options configs/experiments/seed003-smollm2.json gives `hyla eval niah`), a row
per (mixer, variant, length) with the engine's prefill and decode seconds a prompt, its decode milliseconds a step,
and their ratios to the "direct" row (no EME, no logit scaling) of the same mixer and length. SWLA (W = 4K, S = 1K)
runs every recurrent layer over about W / S windows of each token.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, replace

import torch

from hyla.bench import shapes
from hyla.layers.context import InferenceOptions
from hyla.models.configuration import LINEAR_LAYER_TYPES

DEFAULT_LENGTHS = (4096, 16384, 65536)
RNN_MIXERS = LINEAR_LAYER_TYPES
# Seed 003's inference modes, as its experiment names them (docs/experiments.md); ratios are against BASELINE.
VARIANTS = ("direct", "per-query", "log", "swla", "swla+log")
BASELINE = "direct"


def variant_options(variant: str, *, eme_window: int, eme_stride: int, train_length: int) -> InferenceOptions:
    """The InferenceOptions of a mode: "direct" no logit scaling; "per-query" the model's own s_t (a = 500 here);
    "log" c(L) = max(1, log L / log L0) on NoPE attention, L0 = `train_length`; "swla" SWLA with window W =
    `eme_window`, stride S = `eme_stride`, no logit scaling; "swla+log" both (seed 003's EME)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    eme = {"eme_window": eme_window, "eme_stride": eme_stride} if variant.startswith("swla") else {}
    if variant == "per-query":
        return InferenceOptions(logit_scaling="per_query")
    if variant.endswith("log"):
        return InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=train_length, **eme)
    return InferenceOptions(logit_scaling="off", **eme)


@dataclass(frozen=True)
class GenerateBenchSettings:
    """lengths: prompt + generation budget (RULER's length: prompt tokens = length - tokens_to_generate);
    num_prompts / batch_sizes: per length (None: 16 prompts in batches of 4 up to 16K, 8 prompts one at a time
    above, as the SmolLM2 run evaluated); paths: "engine", "hf"; decode_step: the engine's decode step for every
    run (None: the tuned settings').
    rnn_mixers / variants: compare inference modes (None for both: one Lightning model as it is built, the rows of
    `lengths`); one model per mixer of RNN_MIXERS (default lightning), run under each of VARIANTS (default
    "per-query", the model as built); eme_window, eme_stride: the W and S of the swla variants;
    logit_scaling_train_length: the L0 of the log variants."""

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    num_prompts: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    max_new_tokens: int = 64
    tokens_to_generate: int = 128
    paths: tuple[str, ...] = ("engine", "hf")
    engine_settings: str | None = None
    toy: bool = False
    device: str = "cuda"
    dtype: str = "bfloat16"
    seed: int = 0
    decode_step: str | None = None
    rnn_mixers: tuple[str, ...] | None = None
    variants: tuple[str, ...] | None = None
    eme_window: int = 4096
    eme_stride: int = 1024
    logit_scaling_train_length: int = 4096

    def __post_init__(self) -> None:
        unknown = sorted(set(self.rnn_mixers or ()) - set(RNN_MIXERS))
        if unknown:
            raise ValueError(f"unknown recurrent mixers {unknown}; choose from {', '.join(RNN_MIXERS)}")
        if (self.rnn_mixers is not None and not self.rnn_mixers) or (self.variants is not None and not self.variants):
            raise ValueError("name at least one recurrent mixer and one variant")
        options = [options for _, options in self.variant_plan()]  # checks names, W, S and L0
        if self.decode_step == "triton-fused" and any(o.eme_window is not None for o in options):
            raise ValueError("decode_step='triton-fused' keeps one Lightning state a layer; the swla variants run "
                             "SWLA's window states (another decode step, or no swla variant)")

    @property
    def compares_variants(self) -> bool:
        return self.rnn_mixers is not None or self.variants is not None

    def mixers(self) -> tuple[str, ...]:
        return self.rnn_mixers or ("lightning",)

    def check_used(self, given: list[str]) -> None:
        """Refuse options given (eme_window, eme_stride, logit_scaling_train_length) that no variant uses."""
        variants = [name for name, _ in self.variant_plan()] if self.compares_variants else []
        for name in given:
            kind = "swla" if name.startswith("eme") else "log"
            if not any(kind in variant for variant in variants):
                raise ValueError(f"--{name.replace('_', '-')} applies to the {kind} variants: none is in --variants")

    def variant_plan(self) -> list[tuple[str, InferenceOptions]]:
        """(variant, its InferenceOptions) per variant."""
        return [(name, variant_options(name, eme_window=self.eme_window, eme_stride=self.eme_stride,
                                       train_length=self.logit_scaling_train_length))
                for name in self.variants or ("per-query",)]

    def plan(self) -> list[tuple[int, int, int]]:
        """(length, prompts, batch size) per length."""
        prompts = self.num_prompts or tuple(16 if length <= 16384 else 8 for length in self.lengths)
        batches = self.batch_sizes or tuple(4 if length <= 16384 else 1 for length in self.lengths)
        if len(prompts) != len(self.lengths) or len(batches) != len(self.lengths):
            raise ValueError("num_prompts and batch_sizes need one entry per length")
        return list(zip(self.lengths, prompts, batches))


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer over `vocab_size` ids: "<pad>" 0, "<eos>" 1, digits "0".."9" 2..11, then "w12"...; any
    other word is "<unk>". Decoding joins words with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{str(digit): 2 + digit for digit in range(10)}, "<unk>": 12}
    vocab.update({f"w{index}": index for index in range(13, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


def synthetic_niah_samples(vocab_size: int, length: int, num_prompts: int, *, tokens_to_generate: int, seed: int,
                           tokenizer=None):
    """NIAH samples: random words, one needle "magic number for wK is 1 2 3 4 5 6 7" (digit tokens) at depth
    i / (n - 1), and the question at the end; each prompt up to 1% shorter than `length - tokens_to_generate`
    tokens, as RULER-style samples land (hyla.evals.niah_samples), so that batches carry some left padding.
    tokenizer: the samples keep their prompts' token ids of it, as `build_samples` keeps those of the tokenization
    that sized each prompt (here one batched encoding of all, where it builds the samples)."""
    from hyla.evals.niah_samples import NiahSample
    from hyla.evals.tokens import kept_prompt_ids

    rng = random.Random(seed * 1_000_003 + length)
    words = [f"w{index}" for index in range(13, vocab_size)]
    samples = []
    for index in range(num_prompts):
        key = rng.choice(words)
        value = [str(rng.randrange(10)) for _ in range(7)]
        needle = ["magic", "number", "for", key, "is", *value]
        question = ["what", "is", "the", "magic", "number", "for", key, "answer"]
        shorter = rng.randrange(max(1, length // 100))
        filler = length - tokens_to_generate - shorter - len(needle) - len(question)
        if filler < 0:
            raise ValueError(f"length {length} leaves no room for the haystack")
        haystack = [rng.choice(words) for _ in range(filler)]
        depth = 0 if num_prompts == 1 else round(100 * index / (num_prompts - 1))
        at = filler * depth // 100
        tokens = haystack[:at] + needle + haystack[at:] + question
        samples.append(NiahSample(task="synthetic", target_length=length, depth_percent=depth, index=index,
                                  input=" ".join(tokens), outputs=[" ".join(value)], num_prompt_tokens=len(tokens),
                                  tokens_to_generate=tokens_to_generate))
    if tokenizer is not None:
        kept = kept_prompt_ids(tokenizer, [sample.input for sample in samples])
        samples = [replace(sample, prompt_ids=ids) for sample, ids in zip(samples, kept)]
    return samples


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_path(model, tokenizer, samples, batch_size: int, settings: GenerateBenchSettings, path: str, log) -> dict:
    """One path over `samples`: a warm-up batch, then all of them, timed."""
    from hyla.evals.generation import Generation
    from hyla.evals.niah import evaluate_samples
    from hyla.inference.settings import load_settings

    engine_settings = load_settings(settings.engine_settings) if settings.engine_settings else None
    overrides = {"decode_step": settings.decode_step} if settings.decode_step else {}
    generation = Generation(model, path, settings=engine_settings, **overrides)
    device = model.device
    kwargs = dict(batch_size=batch_size, max_new_tokens=settings.max_new_tokens)
    started = time.perf_counter()
    evaluate_samples(model, tokenizer, samples[:batch_size], generation=generation, **kwargs)
    _synchronize(device)
    warmup_s = time.perf_counter() - started
    warm = dict(generation.totals)
    started = time.perf_counter()
    records = evaluate_samples(model, tokenizer, samples, generation=generation, **kwargs)
    _synchronize(device)
    seconds = time.perf_counter() - started
    described = generation.describe()
    timed = {name: described[name] - warm[name] for name in warm}
    log(f"  {path:6s} {len(samples)} prompts in {seconds:8.2f} s ({seconds / len(samples):.3f} s a prompt; warm-up "
        f"{warmup_s:.2f} s){' ' + str(described['engine']) if described['engine'] else ''}")
    host = host_seconds_per_prompt(timed, seconds, len(samples), engine=generation.session is not None)
    log("  host a prompt: " + ", ".join(f"{name} {value:.4f} s" for name, value in host.items() if value is not None))
    return {"path": described["path"], "reason": described["reason"], "engine": described["engine"],
            **_ran_with(generation), "seconds": seconds, "seconds_per_prompt": seconds / len(samples),
            "warmup_s": warmup_s, "timed": timed, "host_s_per_prompt": host,
            "predictions": [record["pred"] for record in records],
            "accuracy": sum(record["score"] for record in records) / len(records)}


def host_seconds_per_prompt(timed: dict, seconds: float, num_prompts: int, *, engine: bool) -> dict:
    """Seconds a prompt outside `Generation.batch` (the evaluation's own host work: encoding, the padded tensors and
    their copy to the device, detokenizing, and the rest: scoring, sorting, progress), and on the engine path the
    seconds inside it outside prefill and decode (the session's checks, reset, output assembly), and apart from those
    the seconds building engines and capturing decode graphs among the timed prompts (a batch of another size or a
    longer buffer builds a new engine). None: not measured (a Generation without host timings; the hf path has no
    prefill and decode split)."""
    outside = seconds - timed["seconds"]
    parts = {name: timed.get(f"{name}_s") for name in ("encode", "tensors", "detokenize")}
    measured = [value for value in parts.values() if value is not None]
    rest = outside - sum(measured) if len(measured) == len(parts) else None
    built = timed.get("engine_build_s", 0.0) + timed.get("graph_capture_s", 0.0) if engine else None
    in_batch = timed["seconds"] - timed["prefill_s"] - timed["decode_s"] - built if engine else None
    values = {"outside_generation": outside, **parts, "rest": rest, "engine_outside_prefill_decode": in_batch,
              "engine_build_and_capture": built}
    return {name: None if value is None else value / num_prompts for name, value in values.items()}


def _ran_with(generation) -> dict:
    """The inference options a path ran under, read from what ran them: the engine's own options and the SWLA window
    ring in its cache (None without EME), or the model's options on transformers' path."""
    engine = generation.session.engine if generation.session is not None else None
    if engine is None:
        return {"inference_options": generation.model.inference_options.changes(), "swla": None}
    swla = None
    if engine.swla is not None:
        rings = {tuple(engine.cache.states[index].shape) for index in engine.cache.states}
        swla = {"window": engine.swla[0], "stride": engine.swla[1], "ring_shapes": sorted(rings)}
    return {"inference_options": engine.options.changes(), "swla": swla}


def _build_model(settings: GenerateBenchSettings, rnn_mixer: str):
    from hyla.bench.model import build_hypenet

    config = shapes.converted_135m_config(toy=settings.toy, rnn_mixer=rnn_mixer)
    # the synthetic tokenizer's special tokens (generation stops at <eos> on both paths)
    config.pad_token_id, config.eos_token_id, config.bos_token_id = 0, 1, None
    return build_hypenet(config, device=torch.device(settings.device), dtype=getattr(torch, settings.dtype))


def _describe_model(model) -> dict:
    return {"parameters": sum(p.numel() for p in model.parameters()), "config": model.config.to_dict()}


def _length_row(model, tokenizer, samples, length: int, batch_size: int, settings: GenerateBenchSettings,
                log) -> dict:
    """Every path of `settings` over one length's samples, and the speedup of the engine over hf."""
    counts = [sample.num_prompt_tokens for sample in samples]
    log(f"length {length}: {len(samples)} prompts of {min(counts)}-{max(counts)} tokens, batch {batch_size}, "
        f"up to {settings.max_new_tokens} new tokens")
    row = {"length": length, "num_prompts": len(samples), "batch_size": batch_size,
           "prompt_tokens": [min(counts), max(counts)], "paths": {}}
    for path in settings.paths:
        row["paths"][path] = _run_path(model, tokenizer, samples, batch_size, settings, path, log)
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    if {"engine", "hf"} <= set(row["paths"]):
        engine, hf = row["paths"]["engine"], row["paths"]["hf"]
        row["speedup"] = hf["seconds"] / engine["seconds"]
        row["same_predictions"] = sum(a == b for a, b in zip(engine["predictions"], hf["predictions"])) / len(
            samples)
        log(f"  speedup {row['speedup']:.1f}x (hf / engine), same predictions {row['same_predictions']:.2f}")
    return row


def run_generate_bench(settings: GenerateBenchSettings, *, log=print, save=None) -> dict:
    """Every length of `settings.plan()` through every path (with `settings.compares_variants`: for every mixer and
    variant, `run_variant_bench`); `save(results)` after each row."""
    unknown = sorted(set(settings.paths) - {"engine", "hf"})
    if unknown:
        raise ValueError(f"unknown generation paths {unknown}; choose from engine, hf")
    if settings.compares_variants:
        return run_variant_bench(settings, log=log, save=save)
    device = torch.device(settings.device)
    model = _build_model(settings, "lightning")
    config = model.config
    tokenizer = synthetic_tokenizer(config.vocab_size)
    described = _describe_model(model)
    log(f"generate bench on {_device_name(device)}, {settings.dtype}, HypeNet {described['parameters'] / 1e6:.1f}M "
        f"parameters ({config.num_hidden_layers} layers, {config.layer_types.count('attention')} attention), plan "
        f"{settings.plan()}, paths {list(settings.paths)}")
    results = {"settings": asdict(settings), "model": described, "lengths": []}
    for length, num_prompts, batch_size in settings.plan():
        samples = synthetic_niah_samples(config.vocab_size, length, num_prompts,
                                         tokens_to_generate=settings.tokens_to_generate, seed=settings.seed,
                                         tokenizer=tokenizer)
        results["lengths"].append(_length_row(model, tokenizer, samples, length, batch_size, settings, log))
        if save is not None:
            save(results)
    return results


def _device_name(device: torch.device) -> str:
    return f"{device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'})"


def run_variant_bench(settings: GenerateBenchSettings, *, log=print, save=None) -> dict:
    """For each mixer (one model at a time), length and variant: `_length_row` under the variant's options, the
    engine's costs and their ratios to the baseline variant of the same mixer and length."""
    device = torch.device(settings.device)
    variants = settings.variant_plan()
    log(f"generate bench on {_device_name(device)}, {settings.dtype}, converted 135M shape with recurrent mixers "
        f"{list(settings.mixers())}, variants {[(name, options.changes()) for name, options in variants]}, plan "
        f"{settings.plan()}, paths {list(settings.paths)}")
    results = {"settings": asdict(settings), "models": {}, "rows": []}
    samples_by_length, tokenizer = {}, None
    for mixer in settings.mixers():
        model = _build_model(settings, mixer)
        results["models"][mixer] = _describe_model(model)
        log(f"{mixer}: {results['models'][mixer]['parameters'] / 1e6:.1f}M parameters, layers "
            f"{''.join('A' if kind == 'attention' else '.' for kind in model.config.layer_types)} (A attention)")
        # One tokenizer for every mixer (the same vocabulary): the samples keep their token ids of it.
        tokenizer = tokenizer or synthetic_tokenizer(model.config.vocab_size)
        for length, num_prompts, batch_size in settings.plan():
            if (length, num_prompts) not in samples_by_length:
                samples_by_length[length, num_prompts] = synthetic_niah_samples(
                    model.config.vocab_size, length, num_prompts, tokens_to_generate=settings.tokens_to_generate,
                    seed=settings.seed, tokenizer=tokenizer)
            samples = samples_by_length[length, num_prompts]
            group = []
            for variant, options in variants:
                model.inference_options = options
                log(f"{mixer} {variant} {options.changes()}")
                row = {"rnn_mixer": mixer, "variant": variant, "options": options.changes(),
                       **_length_row(model, tokenizer, samples, length, batch_size, settings, log)}
                row["engine_costs"] = _engine_costs(row)
                group.append(row)
                results["rows"].append(row)
                _set_ratios(group)
                _log_costs(row, log)
                if save is not None:
                    save(results)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def _log_costs(row: dict, log) -> None:
    costs, ratios = row["engine_costs"], row["ratios"] or {}
    if costs is not None:
        step = "n/a" if costs["decode_ms_per_step"] is None else f"{costs['decode_ms_per_step']:.2f} ms a step"
        log(f"  engine a prompt: prefill {costs['prefill_s_per_prompt']:.3f} s, decode "
            f"{costs['decode_s_per_prompt']:.3f} s ({step}), {costs['seconds_per_prompt']:.3f} s in all")
    if ratios:
        log(f"  against {BASELINE}: " + ", ".join(f"{name} {value:.2f}x" for name, value in ratios.items()
                                                  if value is not None))


COSTS = ("prefill_s_per_prompt", "decode_s_per_prompt", "decode_ms_per_step", "seconds_per_prompt")


def _engine_costs(row: dict) -> dict | None:
    """The engine path's seconds a prompt in prefill, in decode and in all (tokenization and scoring included), and
    its milliseconds a decode step (one token in every row; the first new token comes from the prefill). A batch
    whose rows all end at <eos> keeps its positions up to the last end, while the engine may have run up to 7 more
    steps before it checked: then the milliseconds a step are somewhat high."""
    engine = row["paths"].get("engine")
    if engine is None:
        return None
    timed, prompts = engine["timed"], row["num_prompts"]
    steps = timed["new_positions"] - timed["calls"]
    return {"prefill_s_per_prompt": timed["prefill_s"] / prompts, "decode_s_per_prompt": timed["decode_s"] / prompts,
            "decode_ms_per_step": 1e3 * timed["decode_s"] / steps if steps > 0 else None,
            "seconds_per_prompt": engine["seconds_per_prompt"]}


def _set_ratios(group: list[dict]) -> None:
    """Each row's engine costs (and hf's seconds a prompt) over the baseline row's, where both were measured."""
    baseline = next((row for row in group if row["variant"] == BASELINE), None)
    for row in group:
        row["ratios"] = None
        if baseline is None:
            continue
        ratios = {}
        if row["engine_costs"] is not None and baseline["engine_costs"] is not None:
            ratios = {name: _ratio(row["engine_costs"][name], baseline["engine_costs"][name]) for name in COSTS}
        if "hf" in row["paths"] and "hf" in baseline["paths"]:
            ratios["hf_seconds_per_prompt"] = _ratio(row["paths"]["hf"]["seconds_per_prompt"],
                                                     baseline["paths"]["hf"]["seconds_per_prompt"])
        row["ratios"] = ratios or None


def _ratio(value, reference):
    return value / reference if value is not None and reference else None


def generate_markdown(results: dict, command: str) -> str:
    if "rows" in results:
        return variant_markdown(results, command)
    lines = ["# NIAH generation: hyla's engine against transformers' generate", "",
             "| length | prompts | batch | engine s/prompt | hf s/prompt | speedup | same predictions | engine warm-up s "
             "| engine outside generation s/prompt |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in results["lengths"]:
        paths = row["paths"]
        cell = lambda path: f"{paths[path]['seconds_per_prompt']:.3f}" if path in paths else "n/a"  # noqa: E731
        lines.append(f"| {row['length']} | {row['num_prompts']} | {row['batch_size']} | {cell('engine')} | "
                     f"{cell('hf')} | {row.get('speedup', float('nan')):.1f}x | "
                     f"{row.get('same_predictions', float('nan')):.2f} | "
                     f"{paths['engine']['warmup_s'] if 'engine' in paths else float('nan'):.1f} | "
                     f"{_outside_generation(paths.get('engine'))} |")
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"


def _outside_generation(path: dict | None) -> str:
    host = (path or {}).get("host_s_per_prompt") or {}
    return "n/a" if host.get("outside_generation") is None else f"{host['outside_generation']:.3f}"


def variant_markdown(results: dict, command: str) -> str:
    """A row per (mixer, variant, length): the engine's seconds a prompt, milliseconds a decode step, and their
    ratios to the baseline variant; hf's seconds a prompt where that path ran."""
    header = (f"| mixer | variant | length | prompts | batch | decode step | prefill s/prompt | decode s/prompt | "
              f"decode ms/step | engine s/prompt | prefill vs {BASELINE} | decode vs {BASELINE} | "
              f"total vs {BASELINE} | hf s/prompt | engine warm-up s |")
    lines = ["# Generation cost by recurrent mixer and inference mode: hyla's engine", "", header,
             "|---" * header.count(" | ") + "|---|"]

    def number(value, digits=3, suffix=""):
        return "n/a" if value is None else f"{value:.{digits}f}{suffix}"

    for row in results["rows"]:
        costs, ratios = row["engine_costs"] or {}, row["ratios"] or {}
        engine, hf = row["paths"].get("engine"), row["paths"].get("hf")
        step = (engine["engine"] or {}).get("decode_step", "n/a") if engine else "n/a"
        cells = [row["rnn_mixer"], row["variant"], row["length"], row["num_prompts"], row["batch_size"], step,
                 *(number(costs.get(name), 2 if name == "decode_ms_per_step" else 3) for name in COSTS),
                 *(number(ratios.get(name), 2, "x") for name in (COSTS[0], COSTS[1], COSTS[3])),
                 number(hf["seconds_per_prompt"] if hf else None), number(engine["warmup_s"] if engine else None, 1)]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    settings = results["settings"]
    modes = {row["variant"]: row["options"] for row in results["rows"]}
    legend = "; ".join(f"{name} {options or '(the model as built)'}" for name, options in modes.items())
    notes = (f"SWLA window W = {settings['eme_window']}, stride S = {settings['eme_stride']}; c(L)'s L0 = "
             f"{settings['logit_scaling_train_length']}. Ratios are against the {BASELINE} row of the same mixer and "
             "length; \"engine s/prompt\" includes tokenization and scoring.")
    lines += ["", f"Variants (inference options): {legend}", notes, "", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"
