"""`hyla analyze {entropy,hitrate,displacement}`: thin handlers over `hyla.analysis.run`.

Models are HF folders (HypeNet or a teacher), .gguf files or teacher aliases (smollm2-135m); each command writes
`results.json` and PNG plots into `--out`. `entropy` and `hitrate` take the inference options of `hyla eval niah`
(logit scaling, EME), parsed by the same code (`hyla.evals.cli.add_inference_options`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hyla.evals.cli import add_inference_options, inference_overrides

_DEFAULT_OUT_ROOT = Path("runs") / "analysis"


def _length(text: str) -> int:
    # 2K means 2048, as lengths are quoted in RULER and the papers.
    try:
        return int(text[:-1]) * 1024 if text[-1:] in ("k", "K") else int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a length such as 2048 or 2K, got {text!r}") from err


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HypeNet or HF folder, .gguf file, or alias (smollm2-135m)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec when the model folder has none")
    parser.add_argument("--out", type=Path, default=None, help="result folder (default runs/analysis/<kind>-<model>)")
    parser.add_argument("--dtype", default="float32", help="parameter dtype: float32, bfloat16, float16")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--task", default="SK2", help="NIAH task of the prompts (SK1-3, MK1-3, MV, MQ)")
    parser.add_argument("--length", type=_length, default=2048, help="tokens per prompt, RULER's definition (2K)")
    parser.add_argument("--num-samples", type=int, default=4, help="prompts to average over")
    parser.add_argument("--num-depths", type=int, default=None,
                        help="needle depths spread evenly over 0-100%% (default: one per sample)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--normalizer", choices=("length", "visible"), default="length",
                        help="entropy divided by log L (length) or by log(t+1), the keys query t sees (visible)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_inference_options(parser)


def register(subparsers: Any) -> None:
    analyze = subparsers.add_parser("analyze", help="head analyses: Jacobian entropy, needle hit rate, displacement")
    verbs = analyze.add_subparsers(dest="analyze_command", metavar="ANALYSIS")
    analyze.set_defaults(handler=lambda args: analyze.print_help())

    entropy = verbs.add_parser("entropy", help="normalized entropy of each head's Jacobian concentration")
    _add_model_options(entropy)
    entropy.add_argument("--text-file", default=None, help="analyse windows of this text instead of NIAH prompts")
    entropy.add_argument("--num-query-positions", type=int, default=256,
                         help="query positions per sequence, spread evenly (0 = every position)")
    entropy.add_argument("--block-size", type=int, default=128, help="query positions per α~ block (memory)")
    entropy.set_defaults(handler=_handle_entropy)

    hitrate = verbs.add_parser("hitrate", help="top-k hit rate on NIAH needles at the answer position")
    _add_model_options(hitrate)
    hitrate.add_argument("--top-k", type=int, default=64)
    hitrate.set_defaults(handler=_handle_hitrate)

    displacement = verbs.add_parser("displacement", help="per-head relative change of q/k/v/o weights")
    displacement.add_argument("--before", required=True, help="first checkpoint: HF folder, .gguf file or alias")
    displacement.add_argument("--after", required=True, help="second checkpoint: HF folder, .gguf file or alias")
    displacement.add_argument("--out", type=Path, default=None, help="result folder")
    displacement.set_defaults(handler=_handle_displacement)


def _out(args: argparse.Namespace, kind: str, name: str) -> Path:
    return args.out or _DEFAULT_OUT_ROOT / f"{kind}-{Path(name).name or name}"


def _probe_settings(args: argparse.Namespace):
    from hyla.analysis.run import ProbeSettings

    return ProbeSettings(task=args.task, length=args.length, num_samples=args.num_samples, seed=args.seed,
                         num_depths=args.num_depths, text_file=getattr(args, "text_file", None))


def _inference_options(args: argparse.Namespace):
    """The options' InferenceOptions (None when none is given); values that do not go together fail here, as one
    error line, before any model work."""
    from hyla.evals.overrides import inference_options_of

    return inference_options_of(**inference_overrides(args))


def _report(results: dict, out: Path) -> None:
    print(f"hyla analyze: {len(results['heads'])} head records in {results['runtime_s']} s; wrote {out}")
    for group, means in results["summary"].items():
        print(f"  {group}: " + ", ".join(f"{name}={value:.4g}" for name, value in means.items()))


def _handle_entropy(args: argparse.Namespace) -> int:
    from hyla.analysis.run import run_entropy

    out = _out(args, "entropy", args.model)
    results = run_entropy(args.model, out, _probe_settings(args), tokenizer=args.tokenizer,
                          inference_options=_inference_options(args),
                          num_query_positions=args.num_query_positions, block_size=args.block_size,
                          normalizer=args.normalizer, dtype=args.dtype, device=args.device,
                          progress=not args.no_progress)
    _report(results, out)
    return 0


def _handle_hitrate(args: argparse.Namespace) -> int:
    from hyla.analysis.run import run_hitrate

    out = _out(args, "hitrate", args.model)
    results = run_hitrate(args.model, out, _probe_settings(args), tokenizer=args.tokenizer, top_k=args.top_k,
                          inference_options=_inference_options(args),
                          normalizer=args.normalizer, dtype=args.dtype, device=args.device,
                          progress=not args.no_progress)
    _report(results, out)
    return 0


def _handle_displacement(args: argparse.Namespace) -> int:
    from hyla.analysis.run import run_displacement

    out = args.out or _DEFAULT_OUT_ROOT / f"displacement-{Path(args.after).name or args.after}"
    results = run_displacement(args.before, args.after, out)
    print(f"hyla analyze displacement: {len(results['heads'])} head records in {results['runtime_s']} s; wrote {out}")
    for group, means in results["summary"].items():
        print(f"  {group}: " + ", ".join(f"r_{name.upper()}={value:.4g}" for name, value in means.items()))
    return 0
