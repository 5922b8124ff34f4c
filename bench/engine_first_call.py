"""Where an evaluation's first batch on the engine goes, and what compiling buys: `hyla eval niah` as a user runs it,
once per engine-settings variant, each in a fresh process (the first-call costs are per process).

Variants (each the device's shipped settings, `hyla.inference.settings.tuned_settings`, with fields replaced):
`shipped` (as they are), `eager-prefill` (compile_prefill off), `eager` (compile_prefill and compile_decode off;
the decode step is still graph-captured on CUDA), `flash-prefill` (the prefill's attention through flash's kernel
instead of cuDNN's, which plans per shape: RULER's prompts differ in length by a few tokens), `eager-flash-prefill`
(both), `eager-cudnn-padded-prefill` (the prefill uncompiled, cuDNN on lengths padded to a bucket: one plan for
nearby prompt lengths), `eager-flash` (nothing compiled: the decode step's blocks neither, the step still
graph-captured; prefill through flash), `eager-flash-batch8` (the same, 8 prompts a batch: `hyla eval niah
--batch-size 8`, each row prefilled at its own length, the decode steps shared; other variants take --batch-size),
`eager-cudnn-padded[-batch8]` (the same through cuDNN on bucketed lengths).
Each variant's run
writes its `results.json`, whose `generation` record splits the first batch (engine build, first prefill,
decode-graph capture, first decode) from the rest;
this script puts them side by side with the seconds a prompt after the first, and the end-to-end seconds. A variant
whose run fails gets a row saying so, and the others still run (the script then exits 1). With `--profile`, one
more process after them runs the settings of the first variant that ran on 2 prompts under cProfile (apart from
the timed runs, which cProfile would slow) and `first-call-profile.txt` lists its top functions by cumulative time
(dynamo's tracing, inductor's cache loads, cuDNN's and Triton's first calls tell themselves apart there).

Run on the GPU machine holding a converted model and its NIAH samples cache (a few seconds a prompt at 64K):

    python bench/engine_first_call.py --model RUN/main/06-export --samples-cache RUN/niah-samples \
        --tasks SK2 --lengths 64K --num-samples 25 --profile --out $OUT/first-call

Writes OUT/first-call.{json,md}, OUT/<variant>/results.json and (with --profile) OUT/profile/results.json,
OUT/first-call.prof and OUT/first-call-profile.txt. `--device cpu` runs the same on a CPU (the tests do, on a tiny
model).
"""

from __future__ import annotations

import argparse
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "shipped": {},
    "eager-prefill": {"compile_prefill": False},
    "eager": {"compile_prefill": False, "compile_decode": False},
    "flash-prefill": {"attention_backend": "flash"},
    "eager-flash-prefill": {"compile_prefill": False, "attention_backend": "flash"},
    "eager-cudnn-padded-prefill": {"compile_prefill": False, "attention_backend": "cudnn-padded"},
    "eager-flash": {"compile_prefill": False, "compile_decode": False, "attention_backend": "flash"},
    "eager-flash-batch8": {"compile_prefill": False, "compile_decode": False, "attention_backend": "flash",
                           "batch_size": 8},
    "eager-cudnn-padded": {"compile_prefill": False, "compile_decode": False, "attention_backend": "cudnn-padded"},
    "eager-cudnn-padded-batch8": {"compile_prefill": False, "compile_decode": False,
                                  "attention_backend": "cudnn-padded", "batch_size": 8},
}
ROW_FIELDS = ("seconds", "first_batch_s", "reserve_s", "engine_build_s", "first_prefill_s", "graph_capture_s",
              "first_decode_s", "prefill_s", "decode_s", "calls", "engines_built")


def variant_settings(device: str, changes: dict) -> dict:
    """The file form of the device's shipped engine settings with `changes` (also above batch 1; a variant's
    `batch_size` is the evaluation's, not a setting)."""
    from hyla.inference.settings import tuned_settings, with_fields

    changes = {name: value for name, value in changes.items() if name != "batch_size"}
    settings = tuned_settings(device)
    payload = with_fields(settings, changes).to_json()
    payload["batched"] = {name: value for name, value in payload["batched"].items() if name not in changes}
    payload["evaluation"] = {}  # a settings file is used as given: each variant is exactly what it names
    changed = ", ".join(f"{name}={value}" for name, value in changes.items())
    payload["name"] = f"{settings.name} + {changed}" if changes else settings.name
    return payload


def niah_command(args, out: Path, settings_file: Path, batch_size: int | None = None) -> list[str]:
    return ["-m", "hyla.cli", "eval", "niah", "--model", args.model, "--out", str(out), "--device", args.device,
            "--dtype", args.dtype, "--tasks", args.tasks, "--lengths", args.lengths, "--num-samples",
            str(args.num_samples), "--batch-size", str(batch_size or args.batch_size), "--max-new-tokens",
            str(args.max_new_tokens),
            "--generation", "engine", "--engine-settings", str(settings_file),
            *(["--samples-cache", args.samples_cache] if args.samples_cache else [])]


def row_of(variant: str, results: dict, wall_s: float) -> dict:
    generation = results["generation"]
    row = {"variant": variant, "process_s": wall_s, **{name: generation.get(name) for name in ROW_FIELDS},
           "settings": (generation.get("engine") or {}).get("settings"), "compile": generation.get("compile"),
           "score": results.get("summary", {}).get("overall")}
    calls = generation["calls"]
    # `seconds` also holds the engine built before the first batch (reserve_s), which is not a later prompt's
    later = generation["seconds"] - generation["first_batch_s"] - (generation.get("reserve_s") or 0.0)
    row["after_first_s_per_prompt"] = later / (calls - 1) if calls > 1 else None
    return row


def profile_text(path: Path, limit: int = 40) -> str:
    """The profile's top functions by cumulative time (imports lead: the process starts under it), then those of
    generation by cumulative and by own time (what the first prompt's host seconds are spent on)."""
    from io import StringIO

    stream = StringIO()
    stats = pstats.Stats(str(path), stream=stream)
    stats.sort_stats("cumulative").print_stats(limit)
    # functions (not module imports) of the engine, its kernels and the compilers
    generation = r"^(?!.*\(<module>\))(?=.*(hyla/inference|hyla/ops|fla/|triton/|cudnn|_inductor|_dynamo))"
    print("\n== generation's functions by cumulative time", file=stream)
    stats.sort_stats("cumulative").print_stats(generation, limit)
    print("\n== generation's functions by own time", file=stream)
    stats.sort_stats("tottime").print_stats(generation, limit)
    return stream.getvalue()


def markdown(rows: list[dict], command: str) -> str:
    def number(value, digits=2):
        return "" if value is None else f"{value:.{digits}f}"

    lines = [f"`{command}`", "",
             "| variant | end to end s | first batch s | build / first prefill / capture / first decode s | "
             "s a prompt after the first | engines | score | process s |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['variant']} | {row['error']} | | | | | | {number(row['process_s'], 1)} |")
            continue
        parts = " / ".join(number(row[name]) for name in ("engine_build_s", "first_prefill_s", "graph_capture_s",
                                                           "first_decode_s"))
        lines.append(f"| {row['variant']} | {number(row['seconds'])} | {number(row['first_batch_s'])} | {parts} | "
                     f"{number(row['after_first_s_per_prompt'], 3)} | {row['engines_built']} | {row['score']} | "
                     f"{number(row['process_s'], 1)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples-cache")
    parser.add_argument("--tasks", default="SK2")
    parser.add_argument("--lengths", default="64K")
    parser.add_argument("--num-samples", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--profile", action="store_true",
                        help="then the first variant's settings on 2 prompts under cProfile, in a process of its own")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if not Path(args.model).exists():
        parser.error(f"no model at {args.model}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for variant in variants:
        settings_file = out / f"{variant}.settings.json"
        settings_file.write_text(json.dumps(variant_settings(args.device, VARIANTS[variant]), indent=1))
        command = [sys.executable, *niah_command(args, out / variant, settings_file,
                                                 VARIANTS[variant].get("batch_size"))]
        print(f"== {variant}: {' '.join(command)}", flush=True)
        started = time.perf_counter()
        finished = subprocess.run(command)
        wall_s = time.perf_counter() - started
        if finished.returncode != 0:  # the other variants still run: one failing setting leaves the rest measured
            print(f"{variant}: hyla eval niah exited {finished.returncode}", file=sys.stderr)
            rows.append({"variant": variant, "process_s": wall_s, "error": f"hyla eval niah exited "
                         f"{finished.returncode} (its output: {out / variant})"})
            continue
        rows.append(row_of(variant, json.loads((out / variant / "results.json").read_text()), wall_s))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "compile"}), flush=True)
    measured = [row for row in rows if "error" not in row]
    if args.profile and measured:
        first = measured[0]["variant"]  # the first variant that ran
        profiled = argparse.Namespace(**{**vars(args), "num_samples": min(2, args.num_samples)})
        command = [sys.executable, "-m", "cProfile", "-o", str(out / "first-call.prof"),
                   *niah_command(profiled, out / "profile", out / f"{first}.settings.json",
                                 VARIANTS[first].get("batch_size"))]
        print(f"== profile: {' '.join(command)}", flush=True)
        if subprocess.run(command).returncode == 0:
            (out / "first-call-profile.txt").write_text(profile_text(out / "first-call.prof"))
    command = "python bench/engine_first_call.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "first-call.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    (out / "first-call.md").write_text(markdown(rows, command))
    print(markdown(rows, command))
    return 1 if len(measured) < len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
