"""Where the first prefill of a fresh process goes: the engine prefills a sequence of prompt lengths in order (default
256, 256, 65403, 65406, 65408, 65403) in one process, each timed alone (synchronized), with the CUDA memory the
caching allocator reserved before and after it. A per-process cost (libraries, kernels loaded on their first call)
lands on the first 256-token prefill and leaves the first 64K one at the later ones' time; a cost tied to the size
(large allocations, kernels chosen per length) stays on the first 64K prefill after the short ones. With `--profile`
the first prefill and the first long one each run under cProfile: their top functions by own time.

    python bench/first_prefill_probe.py --model DIR --out OUT [--settings FILE] [--lengths 256,256,65403]

--settings: an engine settings file (as `hyla eval niah --engine-settings`; default the device's shipped settings
for an evaluation, `EngineSettings.for_evaluation`). Writes OUT/first-prefill.{json,md}; `--device cpu` runs the same
on a CPU (the tests do, on a tiny model).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reserved_gib(device: torch.device) -> float | None:
    return torch.cuda.memory_reserved(device) / 2**30 if device.type == "cuda" else None


def _own_time(profile: cProfile.Profile, limit: int = 25) -> str:
    stream = io.StringIO()
    pstats.Stats(profile, stream=stream).sort_stats("tottime").print_stats(limit)
    return stream.getvalue()


def probe(model_dir: str, lengths: list[int], *, device: str, dtype: str, settings_file: str | None,
          profile: bool) -> dict:
    from hyla.inference import InferenceEngine
    from hyla.inference.settings import load_settings, tuned_settings
    from hyla.models import HypeNetForCausalLM

    where = torch.device(device)
    started = time.perf_counter()
    model = HypeNetForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(where).eval()
    load_s = time.perf_counter() - started
    settings = load_settings(settings_file) if settings_file else tuned_settings(where).for_evaluation(model)
    started = time.perf_counter()
    engine = InferenceEngine(model, batch_size=1, max_length=max(lengths) + 1, settings=settings)
    _sync(where)
    build_s = time.perf_counter() - started
    generator = torch.Generator().manual_seed(0)
    rows, profiles = [], {}
    profiled = {0, next((i for i, n in enumerate(lengths) if n > lengths[0]), 0)} if profile else set()
    for index, length in enumerate(lengths):
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator).to(where)
        engine.reset()
        before = _reserved_gib(where)
        runner = cProfile.Profile() if index in profiled else None
        _sync(where)
        started = time.perf_counter()
        with torch.inference_mode():
            if runner is not None:
                runner.enable()
            engine.prefill(ids)
            _sync(where)
            if runner is not None:
                runner.disable()
        seconds = time.perf_counter() - started
        rows.append({"index": index, "length": length, "seconds": seconds, "reserved_gib_before": before,
                     "reserved_gib_after": _reserved_gib(where)})
        if runner is not None:
            profiles[f"{index}: {length} tokens"] = _own_time(runner)
        print(json.dumps(rows[-1]), flush=True)
    return {"model": model_dir, "device": torch.cuda.get_device_name(where) if where.type == "cuda" else device,
            "dtype": dtype, "settings": settings.name, "attention_backend": engine.attention_backend,
            "load_s": load_s, "engine_build_s": build_s, "prefills": rows, "profiles": profiles}


def markdown(result: dict, command: str) -> str:
    def gib(value):
        return "" if value is None else f"{value:.2f}"

    lines = [f"`{command}`", "", f"{result['device']}, {result['dtype']}, settings {result['settings']} (prefill "
             f"attention {result['attention_backend']}); model load {result['load_s']:.2f} s, engine build "
             f"{result['engine_build_s']:.2f} s.", "",
             "| # | length | seconds | reserved GiB before / after |", "|---|---|---|---|"]
    for row in result["prefills"]:
        lines.append(f"| {row['index']} | {row['length']} | {row['seconds']:.3f} | "
                     f"{gib(row['reserved_gib_before'])} / {gib(row['reserved_gib_after'])} |")
    for name, text in result["profiles"].items():
        lines += ["", f"Prefill {name}, top functions by own time:", "", "```", text.strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--settings", help="an engine settings file (default: the device's, for an evaluation)")
    parser.add_argument("--lengths", default="256,256,65403,65406,65408,65403")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    try:
        lengths = [int(item) for item in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths: comma-separated token counts, got {args.lengths!r}")
    if not lengths or min(lengths) < 1:
        parser.error(f"--lengths: each at least 1, got {args.lengths!r}")
    if not Path(args.model).exists():
        parser.error(f"no model at {args.model}")
    if args.settings and not Path(args.settings).exists():
        parser.error(f"no settings file at {args.settings}")
    result = probe(args.model, lengths, device=args.device, dtype=args.dtype, settings_file=args.settings,
                   profile=args.profile)
    command = "python bench/first_prefill_probe.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first-prefill.json").write_text(json.dumps({"command": command, **result}, indent=1))
    (out / "first-prefill.md").write_text(markdown(result, command))
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
