"""`hyla generate`: text from a model for a person, streamed as it is generated, with prompt and decode tokens/s.

    hyla generate --model DIR --prompt "Once upon a time" [--max-new-tokens 256] [--sample --temperature 0.8]
    hyla generate --model DIR --prompt-file prompt.txt --device cuda

HypeNet models generate on hyla's inference engine (the tuned settings of the GPU, or --engine-settings); other
models (teachers) through transformers' generate. The resolved settings are printed first, the speeds last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate text from a model, streamed, with tokens/s")
    parser.add_argument("--model", required=True, help="HF folder, .gguf file, or teacher alias (smollm2-135m)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="a file holding the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when there is one, else cpu)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16; auto: bfloat16 on CUDA")
    parser.add_argument("--generation", choices=["auto", "engine", "hf"], default="auto",
                        help="auto: hyla's engine for the HypeNet models it runs, transformers' generate otherwise")
    parser.add_argument("--engine-settings", metavar="JSON", help="the engine's settings file (default: the tuned "
                                                                 "settings shipped for this GPU)")
    parser.add_argument("--no-compile", action="store_true",
                        help="no torch.compile (starts faster; decodes a little slower)")
    parser.set_defaults(handler=run_generate)


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if not args.prompt_file.is_file():
        raise FileNotFoundError(f"no prompt file {args.prompt_file}")
    return args.prompt_file.read_text()


def _prompt_ids(tokenizer, text: str, chat: bool):
    import torch

    if chat:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("--chat needs a tokenizer with a chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return torch.tensor([list(ids)])
    return torch.tensor([tokenizer(text)["input_ids"]])


def run_generate(args: argparse.Namespace) -> int:
    import time

    import torch
    from transformers import TextStreamer

    from hyla.inference.generate import GenerationSession, Sampling, generation_path, hf_generate
    from hyla.inference.settings import load_settings
    from hyla.models.loading import load_model

    text = _prompt_text(args)
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    settings = load_settings(args.engine_settings) if args.engine_settings else None
    model, tokenizer = load_model(args.model, dtype=dtype, device=device)
    path, reason = generation_path(model, args.generation)
    sampling = Sampling(do_sample=args.sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    input_ids = _prompt_ids(tokenizer, text, args.chat)
    eos = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    session = None
    if path == "engine":
        overrides = {"compile_decode": False, "compile_prefill": False} if args.no_compile else {}
        session = GenerationSession(model, settings=settings, **overrides)
    print(f"hyla generate: model={args.model} device={device} dtype={dtype} path={path} ({reason}) "
          f"prompt={input_ids.shape[1]} tokens, max_new_tokens={args.max_new_tokens}, "
          + (f"sampling T={args.temperature} top_k={args.top_k} top_p={args.top_p} seed={args.seed}"
             if args.sample else "greedy"), file=sys.stderr, flush=True)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    if session is not None:
        output = session.generate(input_ids, max_new_tokens=args.max_new_tokens, sampling=sampling,
                                  eos_token_id=eos, pad_token_id=pad, streamer=streamer)
        stats = session.stats
        print(f"\nengine: {session.engine.settings.summary()} (built in {stats.engine_built_s:.2f} s)",
              file=sys.stderr)
        print(f"prompt: {stats.prompt_tokens} tokens in {stats.prefill_s:.3f} s ({stats.prompt_tokens_per_s():.1f} "
              f"tokens/s); decode: {stats.new_tokens} tokens in {stats.decode_s:.3f} s "
              f"({stats.decode_tokens_per_s():.1f} tokens/s)", file=sys.stderr)
    else:
        output = hf_generate(model, input_ids.to(model.device), max_new_tokens=args.max_new_tokens,
                             sampling=sampling, eos_token_id=eos, pad_token_id=pad, streamer=streamer)
        seconds = time.perf_counter() - started
        new = output.shape[1] - input_ids.shape[1]
        print(f"\ntransformers' generate: {input_ids.shape[1]} prompt + {new} new tokens in {seconds:.3f} s "
              f"({new / seconds:.1f} new tokens/s, prefill included)", file=sys.stderr)
    return 0
