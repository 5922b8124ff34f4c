"""`hyla bench generate`: NIAH evaluation through hyla's inference engine and through transformers' generate, side by
side, on a random-weight HypeNet of a converted shape (SmolLM2-135M's sizes, 30 layers, 7 NoPE attention layers).

Both paths run the same code as `hyla eval niah` (`hyla.evals.niah.evaluate_samples`, `Generation` "engine" or "hf":
tokenization, left padding, batches sorted by length, greedy decoding, RULER's scoring) on the same prompts: NIAH
prompts of a synthetic word-level tokenizer (one word one token, so prompt lengths are known exactly, and no tokenizer
or haystack files are needed) with a 7-digit needle at an even spread of depths. A random model retrieves nothing; the
benchmark measures time. Per length, each path first runs one batch untimed (compilation, autotuning, graph capture:
reported as warm-up), then every prompt, timed; the speedup is hf seconds / engine seconds. `same_predictions` is the
fraction of prompts whose greedy text is equal on both paths (bf16 on a GPU: random-weight logits have near ties, so
some differ; the exact-equality tests run in float32, tests/inference/test_generate_gpu.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import torch

from hyla.bench import shapes

DEFAULT_LENGTHS = (4096, 16384, 65536)


@dataclass(frozen=True)
class GenerateBenchSettings:
    """lengths: prompt + generation budget (RULER's length: prompt tokens = length - tokens_to_generate);
    num_prompts / batch_sizes: per length (None: 16 prompts in batches of 4 up to 16K, 8 prompts one at a time
    above, as the SmolLM2 run evaluated); paths: "engine", "hf"."""

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


def synthetic_niah_samples(vocab_size: int, length: int, num_prompts: int, *, tokens_to_generate: int, seed: int):
    """NIAH samples: random words, one needle "magic number for wK is 1 2 3 4 5 6 7" (digit tokens) at depth
    i / (n - 1), and the question at the end; each prompt up to 1% shorter than `length - tokens_to_generate`
    tokens, as RULER-style samples land (hyla.evals.niah_samples), so that batches carry some left padding."""
    from hyla.evals.niah_samples import NiahSample

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
    generation = Generation(model, path, settings=engine_settings)
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
    return {"path": described["path"], "reason": described["reason"], "engine": described["engine"],
            "seconds": seconds, "seconds_per_prompt": seconds / len(samples), "warmup_s": warmup_s,
            "timed": timed, "predictions": [record["pred"] for record in records],
            "accuracy": sum(record["score"] for record in records) / len(records)}


def run_generate_bench(settings: GenerateBenchSettings, *, log=print, save=None) -> dict:
    """Every length of `settings.plan()` through every path; `save(results)` after each length."""
    from hyla.bench.model import build_hypenet

    device, dtype = torch.device(settings.device), getattr(torch, settings.dtype)
    unknown = sorted(set(settings.paths) - {"engine", "hf"})
    if unknown:
        raise ValueError(f"unknown generation paths {unknown}; choose from engine, hf")
    config = shapes.converted_135m_config(toy=settings.toy)
    # the synthetic tokenizer's special tokens (generation stops at <eos> on both paths)
    config.pad_token_id, config.eos_token_id, config.bos_token_id = 0, 1, None
    model = build_hypenet(config, device=device, dtype=dtype)
    tokenizer = synthetic_tokenizer(config.vocab_size)
    params = sum(p.numel() for p in model.parameters())
    log(f"generate bench on {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"{settings.dtype}, HypeNet {params / 1e6:.1f}M parameters ({config.num_hidden_layers} layers, "
        f"{config.layer_types.count('attention')} attention), plan {settings.plan()}, paths {list(settings.paths)}")
    results = {"settings": asdict(settings), "model": {"parameters": params, "config": config.to_dict()},
               "lengths": []}
    for length, num_prompts, batch_size in settings.plan():
        samples = synthetic_niah_samples(config.vocab_size, length, num_prompts,
                                         tokens_to_generate=settings.tokens_to_generate, seed=settings.seed)
        counts = [sample.num_prompt_tokens for sample in samples]
        log(f"length {length}: {num_prompts} prompts of {min(counts)}-{max(counts)} tokens, batch {batch_size}, "
            f"up to {settings.max_new_tokens} new tokens")
        row = {"length": length, "num_prompts": num_prompts, "batch_size": batch_size,
               "prompt_tokens": [min(counts), max(counts)], "paths": {}}
        for path in settings.paths:
            row["paths"][path] = _run_path(model, tokenizer, samples, batch_size, settings, path, log)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if {"engine", "hf"} <= set(row["paths"]):
            engine, hf = row["paths"]["engine"], row["paths"]["hf"]
            row["speedup"] = hf["seconds"] / engine["seconds"]
            row["same_predictions"] = sum(a == b for a, b in zip(engine["predictions"], hf["predictions"])) / len(
                samples)
            log(f"  speedup {row['speedup']:.1f}x (hf / engine), same predictions {row['same_predictions']:.2f}")
        results["lengths"].append(row)
        if save is not None:
            save(results)
    return results


def generate_markdown(results: dict, command: str) -> str:
    lines = ["# NIAH generation: hyla's engine against transformers' generate", "",
             "| length | prompts | batch | engine s/prompt | hf s/prompt | speedup | same predictions | engine warm-up s |",
             "|---|---|---|---|---|---|---|---|"]
    for row in results["lengths"]:
        paths = row["paths"]
        cell = lambda path: f"{paths[path]['seconds_per_prompt']:.3f}" if path in paths else "n/a"  # noqa: E731
        lines.append(f"| {row['length']} | {row['num_prompts']} | {row['batch_size']} | {cell('engine')} | "
                     f"{cell('hf')} | {row.get('speedup', float('nan')):.1f}x | "
                     f"{row.get('same_predictions', float('nan')):.2f} | "
                     f"{paths['engine']['warmup_s'] if 'engine' in paths else float('nan'):.1f} |")
    lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"
