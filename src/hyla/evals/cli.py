"""`hyla eval {niah,csr,ppl,babilong,lm-eval,compare}`: thin handlers over the typed functions of `hyla.evals`.

Every evaluation takes `--model SPEC` (an HF folder, a GGUF file, or a teacher alias such as smollm2-135m) and the
same inference overrides, so a teacher and its hybrid are compared by one command; each writes `results.json` and
PNG plots into `--out`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

_DEFAULT_OUT_ROOT = Path("runs") / "eval"
# CLI options passed to hyla.evals.overrides.apply_inference_overrides (hyla.InferenceOptions) under the same names
_OVERRIDE_OPTIONS = ("logit_scaling_a", "logit_scaling", "logit_scaling_train_length", "eme_window", "eme_stride")


def _int_list(text: str) -> list[int]:
    try:
        return [_parse_length(item) for item in text.split(",") if item.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err


def _parse_length(item: str) -> int:
    # 4K means 4096, as lengths are quoted in RULER and the papers.
    item = item.strip()
    if item[-1:] in ("k", "K"):
        return int(item[:-1]) * 1024
    return int(item)


def _scaling_a(text: str) -> float | str:
    if text.strip().lower() in ("off", "none"):
        return "off"
    try:
        return float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected a number > 1 or 'off', got {text!r}") from err


def _str_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _add_model_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument("--model", required=required, help="HF folder, .gguf file, or teacher alias (smollm2-135m)")
    parser.add_argument("--out", type=Path, default=None, help="result folder (default runs/eval/<kind>-<model>)")
    parser.add_argument("--dtype", default="auto",
                        help="parameter dtype: float32, bfloat16, float16; auto: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    add_inference_options(parser)


def add_inference_options(parser: argparse.ArgumentParser) -> None:
    """The inference options of hybrid models (`_OVERRIDE_OPTIONS`), shared by `hyla eval` and `hyla analyze`;
    `inference_overrides(args)` reads them back. Their values are checked together by
    `hyla.evals.overrides.inference_options_of`, as one error line, not by argparse."""
    overrides = parser.add_argument_group("inference options (hyla hybrid models; the saved config is left as it is)")
    overrides.add_argument(
        "--logit-scaling-a", type=_scaling_a, default=None, metavar="A|off",
        help="per-query logit scaling s_t = log(t+a)/log(a) with this a; 'off' runs without scaling",
    )
    overrides.add_argument("--logit-scaling", default=None, metavar="per_query|per_length|off",
                           help="logit scaling mode (per_length: c(L) = log L / log L0 on NoPE attention)")
    overrides.add_argument("--logit-scaling-train-length", type=int, default=None, help="L0 of c(L)")
    overrides.add_argument("--eme-window", type=int, default=None, help="EME: SWLA / sliding window W")
    overrides.add_argument("--eme-stride", type=int, default=None, help="EME: SWLA stride S (default W // 4)")


def inference_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The inference options of parsed arguments (None where not given), by `InferenceOptions` field name."""
    return {name: getattr(args, name) for name in _OVERRIDE_OPTIONS}


def _add_generation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generation", choices=["auto", "engine", "hf"], default="auto",
                        help="how to generate: auto = hyla's inference engine for the HypeNet models it runs, "
                             "transformers' generate otherwise; engine; hf (transformers' generate)")
    parser.add_argument("--engine-settings", metavar="JSON", default=None,
                        help="the engine's settings file (default: the tuned settings shipped for this GPU)")


def _resolved_dtype(args: argparse.Namespace) -> str:
    if args.dtype != "auto":
        return args.dtype
    return "bfloat16" if str(args.device).startswith("cuda") else "float32"


def register(subparsers: Any) -> None:
    evaluation = subparsers.add_parser("eval", help="evaluate a model: NIAH, CSR, loss by position, BABILong")
    verbs = evaluation.add_subparsers(dest="eval_command", metavar="EVAL")
    evaluation.set_defaults(handler=lambda args: evaluation.print_help())
    _register_niah(verbs)
    _register_niah_samples(verbs)
    _register_csr(verbs)
    _register_ppl(verbs)
    _register_babilong(verbs)
    _register_lm_eval(verbs)
    compare = verbs.add_parser("compare", help="print the metrics of several result folders side by side")
    compare.add_argument("results", nargs="+", help="result folders or results.json files")
    compare.set_defaults(handler=_handle_compare)


def _register_niah(verbs: Any) -> None:
    niah_parser = verbs.add_parser("niah", help="RULER needle-in-a-haystack tasks SK1-3, MK1-3, MV, MQ")
    _add_model_options(niah_parser, required=False)
    niah_parser.add_argument("--tasks", type=_str_list, default=None, help="comma-separated, default all eight")
    niah_parser.add_argument("--lengths", type=_int_list, default=[2048, 4096, 8192], help="e.g. 2K,4K,8K")
    niah_parser.add_argument("--num-samples", type=int, default=10, help="samples per task and length")
    niah_parser.add_argument("--num-depths", type=int, default=11, help="needle depths spread evenly over 0-100%%")
    niah_parser.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens to generate (RULER: 128)")
    niah_parser.add_argument(
        "--tokens-to-generate", type=int, default=128, help="generation budget counted in each length (RULER: 128)"
    )
    niah_parser.add_argument("--from-jsonl", type=Path, default=None, help="score a RULER data or prediction file")
    niah_parser.add_argument("--task-name", default=None, help="task of --from-jsonl (default: from the file name)")
    niah_parser.add_argument("--save-predictions", action="store_true", help="also write predictions.jsonl (RULER)")
    niah_parser.add_argument("--samples-cache", type=Path, default=None, metavar="DIR",
                             help="keep the prompts in DIR and read them back in later evaluations with the same "
                                  "tokenizer (a teacher's and its hybrid's); they are built as without it")
    _add_haystack_offset(niah_parser)
    _add_generation_options(niah_parser)
    niah_parser.set_defaults(handler=_handle_niah)


def _register_niah_samples(verbs: Any) -> None:
    samples = verbs.add_parser(
        "niah-samples", help="build NIAH prompts into a samples cache, no model: evaluations that read it skip that")
    samples.add_argument("--tokenizer", required=True,
                         help="HF folder, .gguf file or teacher alias whose tokenizer the evaluated models share")
    samples.add_argument("--samples-cache", type=Path, required=True, metavar="DIR", help="the cache folder")
    samples.add_argument("--tasks", type=_str_list, default=None, help="comma-separated, default all eight")
    samples.add_argument("--lengths", type=_int_list, default=[2048, 4096, 8192], help="e.g. 2K,4K,8K")
    samples.add_argument("--num-samples", type=int, default=10, help="samples per task and length")
    samples.add_argument("--num-depths", type=int, default=11, help="needle depths spread evenly over 0-100%%")
    samples.add_argument("--tokens-to-generate", type=int, default=128,
                         help="generation budget counted in each length (RULER: 128)")
    samples.add_argument("--seed", type=int, default=42)
    _add_haystack_offset(samples)
    samples.set_defaults(handler=_handle_niah_samples)


def _add_haystack_offset(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--haystack-offset", type=int, default=0, metavar="WORDS",
                        help="a diagnostic outside RULER's prompts: essay haystacks (SK2, SK3, MK1, MV, MQ) start "
                             "WORDS words into the essays, the needles and depths unchanged (default 0: RULER's)")


def _handle_niah_samples(args: argparse.Namespace) -> int:
    """Each task and length's prompts, read from the cache or built and left there (`niah_cache.cached_samples`,
    as `hyla eval niah --samples-cache` does): an experiment builds them once, on the CPU, beside its training."""
    import time

    from hyla.evals.niah_cache import cached_samples, tokenizer_fingerprint
    from hyla.models.loading import load_tokenizer

    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be at least 1, got {args.num_samples}")
    _check_haystack_offset(args)
    tasks = _checked_niah_tasks(args.tasks)
    tokenizer = load_tokenizer(args.tokenizer)
    if tokenizer_fingerprint(tokenizer) is None:
        raise ValueError(f"{args.tokenizer}: its tokenizer has no plain backend to fingerprint, so its NIAH "
                         "samples are not cached; evaluations build them themselves")
    for task in tasks:
        for length in args.lengths:
            started, before = time.perf_counter(), set(args.samples_cache.glob("*.npz"))
            samples = cached_samples(args.samples_cache, tokenizer, task, length, args.num_samples, args.seed,
                                     num_depths=args.num_depths, tokens_to_generate=args.tokens_to_generate,
                                     haystack_offset=args.haystack_offset)
            how = "built" if set(args.samples_cache.glob("*.npz")) - before else "read"
            print(f"{task} {length}: {len(samples)} samples {how} in {time.perf_counter() - started:.1f} s",
                  flush=True)
    print(f"samples cache: {args.samples_cache}")
    return 0


def _check_haystack_offset(args: argparse.Namespace) -> None:
    """--haystack-offset: at least 0, and only where NIAH prompts are built here from the essays."""
    if args.haystack_offset < 0:
        raise ValueError(f"--haystack-offset must be >= 0 words, got {args.haystack_offset}")
    if not args.haystack_offset:
        return
    if getattr(args, "from_jsonl", None) is not None:
        raise ValueError("--haystack-offset builds prompts; a --from-jsonl file holds its own")
    from hyla.evals.niah_samples import TASKS, get_task

    tasks = [get_task(task) for task in args.tasks or list(TASKS)]
    if not any(task.type_haystack == "essay" for task in tasks):
        raise ValueError(f"--haystack-offset moves the essay haystack, and none of "
                         f"{', '.join(task.name for task in tasks)} has one (SK2, SK3, MK1, MV and MQ do)")


def _checked_niah_tasks(tasks: list[str] | None) -> list[str]:
    """The NIAH tasks asked for (None: all eight), each known, and the data their prompts are built from installed:
    a missing piece is one error before any model or tokenizer loads."""
    from hyla.evals import niah
    from hyla.evals.haystack import adjective_noun_lists, ruler_package_dir

    names = [niah.get_task(task).name for task in (tasks or list(niah.TASKS))]
    ruler_package_dir()
    adjective_noun_lists()
    return names


def _register_csr(verbs: Any) -> None:
    csr = verbs.add_parser("csr", help="zero-shot HellaSwag, ARC-E/C, PIQA, WinoGrande, LAMBADA")
    _add_model_options(csr)
    csr.add_argument("--tasks", type=_str_list, default=None, help="comma-separated, default all six")
    csr.add_argument("--limit", type=int, default=None, help="first N documents of each task")
    csr.set_defaults(handler=_handle_csr, batch_size=8)


def _register_ppl(verbs: Any) -> None:
    ppl = verbs.add_parser("ppl", help="mean loss per position bucket on long documents")
    _add_model_options(ppl)
    ppl.add_argument("--seq-len", type=_parse_length, default=8192)
    ppl.add_argument("--num-sequences", type=int, default=4)
    ppl.add_argument("--text-files", nargs="*", default=None, help="documents to use (default: RULER's essays)")
    ppl.add_argument("--buckets", type=_int_list, default=None, help="bucket edges, default 0,1K,2K,4K,...")
    ppl.add_argument("--chunk-size", type=int, default=4096, help="positions per forward pass (cache carried)")
    ppl.set_defaults(handler=_handle_ppl)


def _register_babilong(verbs: Any) -> None:
    babilong = verbs.add_parser("babilong", help="bAbI qa1-qa5 facts hidden in long background text")
    _add_model_options(babilong)
    babilong.add_argument("--tasks", type=_str_list, default=["qa1", "qa2", "qa3", "qa4", "qa5"])
    babilong.add_argument("--lengths", type=_int_list, default=[0, 1024, 4096], help="0 = facts only")
    babilong.add_argument("--num-samples", type=int, default=20)
    babilong.add_argument("--max-new-tokens", type=int, default=16)
    _add_generation_options(babilong)
    babilong.set_defaults(handler=_handle_babilong)


def _register_lm_eval(verbs: Any) -> None:
    lm_eval = verbs.add_parser("lm-eval", help="lm-eval-harness tasks through its HFLM wrapper")
    _add_model_options(lm_eval)
    lm_eval.add_argument("--tasks", type=_str_list, required=True)
    lm_eval.add_argument("--limit", type=int, default=None)
    lm_eval.add_argument("--num-fewshot", type=int, default=None)
    lm_eval.add_argument("--include-path", default=None, help="folder of extra task YAML files")
    lm_eval.add_argument(
        "--only-included", action="store_true", help="use only the tasks under --include-path (faster start-up)"
    )
    _add_generation_options(lm_eval)
    lm_eval.set_defaults(handler=_handle_lm_eval)


def _settings(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _out_dir(args: argparse.Namespace, kind: str) -> Path:
    from hyla.evals.runner import model_label

    return args.out or _DEFAULT_OUT_ROOT / f"{kind}-{model_label(args.model or 'predictions')}"


def _start(args: argparse.Namespace, kind: str, names: list[str]) -> tuple[Any, Any, dict[str, Any], Path]:
    """Print the settings, load the model with its overrides; returns (model, tokenizer, settings, out_dir)."""
    from hyla.evals.overrides import eme_window_note, inference_options_of
    from hyla.evals.runner import load_for_eval, print_settings

    common = ["model", "dtype", "device", "batch_size", "seed"]
    args.dtype = _resolved_dtype(args)
    settings = _settings(args, common + list(_OVERRIDE_OPTIONS) + names)
    out_dir = _out_dir(args, kind)
    print_settings(kind, {**settings, "out": out_dir})
    overrides = inference_overrides(args)
    inference_options_of(**overrides)  # values that do not go together fail before the model loads
    model, tokenizer, applied = load_for_eval(args.model, dtype=args.dtype, device=args.device, **overrides)
    config = getattr(model, "config", None)
    if (note := eme_window_note(getattr(model, "inference_options", None), getattr(config, "layer_types", None) or [],
                                getattr(config, "num_attention_heads", 0))):
        print(note, file=sys.stderr, flush=True)
    return model, tokenizer, {**settings, "inference_options": applied}, out_dir


def _generation(args: argparse.Namespace, model: Any):
    """The Generation of a generating evaluation (--generation, --engine-settings), its path printed first."""
    from hyla.evals.generation import Generation
    from hyla.inference.settings import load_settings

    settings = load_settings(args.engine_settings) if args.engine_settings else None
    generation = Generation(model, args.generation, settings=settings)
    print(f"generation: {generation.path} ({generation.reason})", flush=True)
    return generation


def _finish(kind: str, args: argparse.Namespace, settings: dict, result: dict, out_dir: Path) -> None:
    from hyla.evals.runner import model_label, print_summary, save_run

    if "generation" in result:
        result = {"generation_path": result["generation"]["path"], **result}
    path = save_run(out_dir, kind, model_label(args.model or str(args.from_jsonl)), settings, result)
    print_summary(result["summary"], path)


def _handle_niah(args: argparse.Namespace) -> int:
    from hyla.evals import niah
    from hyla.evals.runner import print_settings, save_jsonl

    names = ["tasks", "lengths", "num_samples", "num_depths", "max_new_tokens", "tokens_to_generate"]
    names += ["from_jsonl", "task_name", "generation", "engine_settings", "samples_cache", "haystack_offset"]
    _check_haystack_offset(args)
    if args.from_jsonl is None:
        _checked_niah_tasks(args.tasks)  # fail on missing data before spending time loading the model
    if args.from_jsonl is not None and args.model is None:
        settings, out_dir, model, tokenizer = _settings(args, names), _out_dir(args, "niah"), None, None
        print_settings("niah", {**settings, "out": out_dir})
    elif args.model is None:
        raise ValueError("hyla eval niah needs --model (or --from-jsonl with a file that has predictions)")
    else:
        model, tokenizer, settings, out_dir = _start(args, "niah", names)
    common = {"batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens}
    if model is not None:
        common["generation"] = _generation(args, model)
    if args.from_jsonl is not None:
        result = niah.evaluate_ruler_jsonl(args.from_jsonl, model, tokenizer, task=args.task_name, **common)
    else:
        result = niah.evaluate_niah(
            model, tokenizer, args.tasks or list(niah.TASKS), args.lengths, args.num_samples,
            num_depths=args.num_depths, tokens_to_generate=args.tokens_to_generate, seed=args.seed,
            keep_inputs=args.save_predictions, samples_cache=args.samples_cache, haystack_offset=args.haystack_offset,
            **common,
        )
    if args.save_predictions:
        save_jsonl(out_dir / "predictions.jsonl", result["records"])
        for record in result["records"]:
            for ruler_field in ("input", "others", "length_tokens"):
                record.pop(ruler_field, None)
    niah.plot_heatmap(result["overall"]["by_length_depth"], "NIAH accuracy (all tasks)", out_dir / "heatmap.png")
    for task, task_result in result["tasks"].items():
        niah.plot_heatmap(task_result["by_length_depth"], f"NIAH {task}", out_dir / f"heatmap_{task}.png")
    _finish("niah", args, settings, result, out_dir)
    return 0


def _handle_csr(args: argparse.Namespace) -> int:
    from hyla.evals import csr

    tasks = args.tasks or list(csr.TASK_FILES)
    for task in tasks:
        csr.load_documents(task, limit=1)
    model, tokenizer, settings, out_dir = _start(args, "csr", ["tasks", "limit"])
    result = csr.evaluate_csr(model, tokenizer, tasks, args.limit, args.batch_size)
    csr.plot_csr(result["tasks"], out_dir / "csr.png")
    _finish("csr", args, settings, result, out_dir)
    return 0


def _handle_ppl(args: argparse.Namespace) -> int:
    from hyla.evals import ppl
    from hyla.evals.haystack import load_essay_text

    names = ["seq_len", "num_sequences", "text_files", "buckets", "chunk_size"]
    if not args.text_files:
        load_essay_text()
    model, tokenizer, settings, out_dir = _start(args, "ppl", names)
    input_ids = ppl.long_token_sequences(tokenizer, args.seq_len, args.num_sequences, args.text_files)
    result = ppl.ppl_by_position(
        model, input_ids, bucket_edges=args.buckets, batch_size=args.batch_size, chunk_size=args.chunk_size
    )
    ppl.plot_loss_by_position(result, out_dir / "loss_by_position.png")
    _finish("ppl", args, settings, result, out_dir)
    return 0


def _handle_babilong(args: argparse.Namespace) -> int:
    from hyla.evals import babilong
    from hyla.evals.haystack import load_essay_text

    names = ["tasks", "lengths", "num_samples", "max_new_tokens", "generation", "engine_settings"]
    unknown = [task for task in args.tasks if task not in babilong.TASK_LABELS]
    if unknown:
        known = ", ".join(babilong.TASK_LABELS)
        raise ValueError(f"unknown BABILong task(s) {', '.join(unknown)}; choose from {known}")
    load_essay_text()
    model, tokenizer, settings, out_dir = _start(args, "babilong", names)
    result = babilong.evaluate_babilong(
        model, tokenizer, args.tasks, args.lengths, args.num_samples, args.batch_size,
        max_new_tokens=args.max_new_tokens, seed=args.seed, generation=_generation(args, model),
    )
    babilong.plot_babilong(result["tasks"], out_dir / "babilong.png")
    _finish("babilong", args, settings, result, out_dir)
    return 0


def _handle_lm_eval(args: argparse.Namespace) -> int:
    from hyla.evals import lm_eval_bridge

    lm_eval_bridge._import_lm_eval()
    names = ["tasks", "limit", "num_fewshot", "include_path", "generation", "engine_settings"]
    model, tokenizer, settings, out_dir = _start(args, "lm-eval", names)
    result = lm_eval_bridge.run_lm_eval(
        model, tokenizer, args.tasks, limit=args.limit, batch_size=args.batch_size,
        num_fewshot=args.num_fewshot, include_path=args.include_path, include_default_tasks=not args.only_included,
        generation=_generation(args, model),
    )
    _finish("lm-eval", args, settings, result, out_dir)
    return 0


def _handle_compare(args: argparse.Namespace) -> int:
    from hyla.evals.report import compare_results, print_comparison

    print_comparison(compare_results(args.results))
    return 0
