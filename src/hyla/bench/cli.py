"""`hyla bench kernels|loss|model|profile|train|data-parallel|report`: thin wrappers over `hyla.bench.*`.
Each writes JSON (with the exact command and environment) and a PNG or a markdown summary, or both, into --out."""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

# hyla.inference.settings.COMPILE_MODES, DECODE_STEPS and MATVEC_KERNELS, written out so that `hyla --help` does not
# import torch (a test keeps them equal)
COMPILE_MODES_CLI = ("default", "max-autotune-no-cudagraphs")
DECODE_STEPS = ("eager", "fused-projections", "triton-fused")
MATVEC_KERNELS = ("cublas", "triton")
# hyla.bench.train.TRAINED_MIXERS, PATHS and hyla.bench.loss.IMPLEMENTATIONS, written out for the same reason
TRAIN_PATHS = ("eager", "fast", "fast-split-blocks", "fast-bf16-teacher", "fast-whole-blocks",
               "fast-whole-blocks-bf16-teacher", "fast-batched", "fast-batched-bf16-teacher", "fast-bf16-activations",
               "fast-fp32-activations", "fast-triton-kl", "fast-torch-kl", "fast-bf16-activations-triton-kl",
               "fast-max-autotune", "fast-bf16-activations-triton-kl-max-autotune", "fast-fused-projections",
               "fast-bf16-activations-fused-projections", "fast-cuda-graphs")
TRAINED_MIXERS = ("lightning", "gla", "gdn")
LOSS_IMPLEMENTATIONS = ("hyla-chunked", "hyla-triton", "liger", "fla", "eager")
# The argument group of the options that override the engine's settings file for an experiment.
EXPERT_OPTIONS = "expert options (experiments against the engine's settings)"


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="kernel and whole-model speed benchmarks")
    bench.set_defaults(handler=lambda args: bench.print_help())
    verbs = bench.add_subparsers(dest="bench_command", metavar="VERB")
    kernels = verbs.add_parser("kernels", help="mixers (Lightning, SDPA flash/cuDNN, sliding window) over lengths")
    kernels.add_argument("--lengths", type=_lengths, default=None, help="comma list, e.g. 4K,64K,1M (default 4K..1M)")
    kernels.add_argument("--mixers", default=None, help="comma list of mixers (default: all available)")
    kernels.add_argument("--heads", type=int, default=16)
    kernels.add_argument("--head-dim", type=int, default=128)
    kernels.add_argument("--softmax-max-length", type=_count, default=2**18, help="longest softmax run (quadratic)")
    kernels.add_argument("--repeats", type=int, default=5)
    _common(kernels)
    kernels.set_defaults(handler=run_kernels)
    _register_loss(verbs)
    model = verbs.add_parser("model", help="HypeNet-2B vs the Qwen3-1.7B shape: prefill, decode, memory")
    model.add_argument("--contexts", type=_lengths, default=None, help="comma list (default 8K,32K,128K,512K,1M)")
    model.add_argument("--systems", default=None,
                       help="comma list of hypenet, qwen3-engine, qwen3-hf-default, qwen3-hf-graph (default: these "
                            "four); and, as an expert comparison, hypenet-fused: hypenet with the decode step "
                            "forced to fused-projections through cuBLAS (the tuned settings run that step above "
                            "batch 1 and on GPUs without a tuned file, so it differs from hypenet only at batch 1 "
                            "where they choose another: triton-fused on the H200, eager on CPU)")
    model.add_argument("--qwen3-engine-max-prefill", type=_count, default=2**19)
    model.add_argument("--hypenet-max-prefill", type=_count, default=2**20)
    model.add_argument("--hf-max-prefill", type=_count, default=2**17)
    model.add_argument("--hf-graph-contexts", type=_lengths, default=None, help="default 32K,128K,512K")
    model.add_argument("--large-batch", type=int, default=32)
    model.add_argument("--large-batch-contexts", type=_lengths, default=None,
                       help="default 8K,32K; an empty string: no large-batch decode")
    model.add_argument("--decode-steps", type=int, default=20, help="graph replays per timed decode measurement")
    model.add_argument("--repeats", type=int, default=3, help="timed repetitions of each measurement")
    model.add_argument("--long-prefill-repeats", type=_positive, default=1,
                       help="timed prefills at contexts >= 128K, each after the same one-chunk warm-up (median "
                            "reported, every time kept in the JSON)")
    expert = _engine_options(model)
    expert.add_argument("--prefill-chunk", type=_count, default=None,
                        help="tokens per engine prefill call (default: the engine settings')")
    _common(model)
    model.set_defaults(handler=run_model)
    profile = verbs.add_parser("profile", help="one decode step or one prefill chunk, kernel by kernel "
                                               "(torch.profiler), beside its floor")
    profile.add_argument("--system", default="hypenet", choices=("hypenet", "qwen3-engine", "converted-135m"),
                         help="converted-135m: the shape hyla converts SmolLM2-135M to (random weights): what "
                              "`hyla eval niah` prefills")
    profile.add_argument("--phase", default="decode", choices=("decode", "prefill"),
                         help="decode: one token after CONTEXT cached positions; prefill: one chunk of CHUNK tokens "
                              "after CONTEXT cached positions")
    profile.add_argument("--context", type=_count, default=2**19,
                         help="cached positions (default 512K; --phase prefill takes 0: a whole prompt)")
    profile.add_argument("--chunk", type=_count, default=2**16, help="prefill chunk length (--phase prefill)")
    profile.add_argument("--batch", type=int, default=1)
    profile.add_argument("--steps", type=int, default=None,
                         help="profiled steps after warm-up (default 10 decode steps, 2 prefill chunks)")
    profile.add_argument("--top", type=int, default=40, help="kernels listed, most expensive first")
    _engine_options(profile)
    profile.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    _common(profile)
    profile.set_defaults(handler=run_profile)
    train = verbs.add_parser("train", help="the conversion's training steps (align, distill, finetune) as hyla convert "
                                           "runs them: eager reference vs the fast default, tokens/s, MFU, memory")
    train.add_argument("--teacher", default=None,
                       help="teacher spec (default: the SmolLM2-135M shape with random weights, no file needed)")
    train.add_argument("--cases", default=None,
                       help="comma list of STAGE:BATCHxLEN (default align:128x512,distill:16x4096,finetune:4x16384, "
                            "the halo-smollm2 recipe's shapes; --toy: align:2x64,distill:2x128,finetune:1x256)")
    train.add_argument("--paths", default="eager,fast",
                       help=f"comma list of {', '.join(TRAIN_PATHS)} (default eager,fast; fast: the default of "
                            "`hyla convert` on the device, on CUDA whole compiled blocks, the bf16 teacher, the bf16 "
                            "activations and the KL's Triton kernel; eager: the reference, every fast-path part off, "
                            "the same teacher and activations; the others pin one setting each, described in "
                            "hyla.bench.train's PATH_SETTINGS, and are timed in the stages that setting applies to)")
    train.add_argument("--attention-layers", default=None,
                       help="comma list of the hybrid's attention layers (default: SmolLM2's HALO choice for a "
                            "30-layer teacher, else every fourth layer)")
    train.add_argument("--steps", type=_positive, default=8, help="timed steps per case (median reported)")
    train.add_argument("--warmup", type=int, default=3, help="steps before timing (the first compiles)")
    train.add_argument("--no-profile", action="store_true", help="skip the profiled step of each fast case")
    train.add_argument("--no-losses", action="store_true", help="skip the LM-head losses measured alone")
    train.add_argument("--toy", action="store_true", help="tiny sizes (a 4-layer teacher of width 64): for CPU")
    train.add_argument("--rnn-mixer", default="lightning", choices=TRAINED_MIXERS,
                       help="the twins' and the hybrid's mixer outside the attention layers, as hyla convert's "
                            "model.rnn_mixer (default lightning)")
    _common(train)
    train.set_defaults(handler=run_train)
    _register_data_parallel(verbs)
    _register_generate(verbs)
    _register_sweep(verbs)
    report = verbs.add_parser("report", help="merge model.json files of several runs into one table and plot")
    report.add_argument("results", nargs="+", help="model.json files (later files win for the same system)")
    report.add_argument("--out", required=True, help="folder for the merged model.json, model.png and model.md")
    report.set_defaults(handler=run_report)


def _register_loss(verbs) -> None:
    loss = verbs.add_parser(
        "loss", help="the LM head fused with its loss (distillation's KL, fine-tuning's cross-entropy), forward + "
                     "backward under bf16 autocast: hyla's chunked loss, Liger's fused linear losses, materialised "
                     "logits; each checked against float32 first, then timed, with ratios to hyla's")
    loss.add_argument("--cases", default=None,
                      help="comma list of LOSS:BATCHxLEN, LOSS kl or ce (default kl:16x4096,ce:4x16384, the "
                           "halo-smollm2 recipe's distillation and fine-tuning; --toy: kl:2x64,ce:1x128)")
    loss.add_argument("--implementations", default=",".join(LOSS_IMPLEMENTATIONS),
                      help=f"comma list of {', '.join(LOSS_IMPLEMENTATIONS)} (default: all; hyla-triton, liger and fla "
                           "are skipped, with the reason, without CUDA or the library; hyla-triton for the KL only)")
    loss.add_argument("--hidden-size", type=_positive, default=None, help="H (default 576, SmolLM2-135M's)")
    loss.add_argument("--vocab-size", type=_positive, default=None, help="V (default 49152, SmolLM2-135M's)")
    loss.add_argument("--check-rows", type=_positive, default=None,
                      help="rows of the check against float32 (default 12289; --toy: 37)")
    loss.add_argument("--repeats", type=_positive, default=5, help="timed calls per implementation (median)")
    loss.add_argument("--teacher-dtype", default=None, choices=("bfloat16", "float32"),
                      help="the teacher's hidden states and head (default bfloat16 on CUDA, as distillation runs "
                           "it there; float32 elsewhere)")
    loss.add_argument("--toy", action="store_true", help="tiny sizes (H=64, V=512): for CPU")
    _common(loss)
    loss.set_defaults(handler=run_loss)


def _register_data_parallel(verbs) -> None:
    parallel = verbs.add_parser(
        "data-parallel", help="the conversion's training steps on 1, 2, 4, ... of torchrun's GPUs in one run, same "
                              "batch per GPU, per data-parallel mode: tokens/s, speed-up over one GPU, loss curves",
        description="Run under torchrun (torchrun --nproc-per-node 8 -m hyla.cli bench data-parallel --out DIR); "
                    "every GPU count up to the run's process count is measured.")
    parallel.add_argument("--teacher", default=None,
                          help="teacher spec (default: the SmolLM2-135M shape with random weights, no file needed)")
    parallel.add_argument("--cases", default=None,
                          help="comma list of STAGE:BATCHxLEN per GPU, stages align and distill (default "
                               "align:64x512,distill:16x512,distill:16x4096; --toy: align:2x64,distill:2x128)")
    parallel.add_argument("--worlds", default="1,2,4,8", help="comma list of GPU counts, 1 included (default "
                                                              "1,2,4,8; counts above the process count are skipped)")
    parallel.add_argument("--modes", default="ddp,fsdp", help="comma list of ddp, fsdp, fsdp-no-reshard (default "
                                                              "ddp,fsdp)")
    parallel.add_argument("--path", default="fast", choices=("fast", "eager"),
                          help="fast: the training fast path as the device defaults it (default); eager: the "
                               "reference path")
    parallel.add_argument("--steps", type=_positive, default=10, help="timed steps per measurement (median)")
    parallel.add_argument("--warmup", type=int, default=3, help="steps before timing (the first compiles)")
    parallel.add_argument("--toy", action="store_true", help="tiny sizes (a 4-layer teacher of width 64): for CPU")
    _common(parallel)
    parallel.set_defaults(handler=run_data_parallel)


def _register_sweep(verbs) -> None:
    sweep = verbs.add_parser("sweep", help="kernel launch-setting sweeps that write an engine settings file")
    sweep.add_argument("kernel", choices=("matvec", "fused", "decode-attention"),
                       help="matvec: batch-1 products vs cuBLAS; fused: the triton-fused step's kernels; "
                            "decode-attention: the split-K decode attention kernel")
    sweep.add_argument("--out", required=True, help="folder for the sweep's JSON and markdown and settings.json")
    sweep.add_argument("--base-settings", metavar="JSON",
                       help="settings the sweep's choices are written over (default: the tuned settings of this GPU)")
    sweep.add_argument("--smoke", action="store_true",
                       help="CPU through Triton's interpreter (run with TRITON_INTERPRET=1): toy shapes, plumbing")
    sweep.add_argument("--pdl", action="store_true", help="fused: launch with programmatic dependent launch")
    sweep.add_argument("--step-only", action="store_true", help="fused: the Lightning step kernel only")
    sweep.set_defaults(handler=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.kernel != "fused" and (args.pdl or args.step_only):
        raise ValueError("--pdl and --step-only belong to `hyla bench sweep fused`")
    common = dict(smoke=args.smoke, base_settings=args.base_settings, log=lambda line: print(line, flush=True))
    if args.kernel == "matvec":
        from hyla.bench.sweep.matvec import run_matvec_sweep

        run_matvec_sweep(out, **common)
    elif args.kernel == "fused":
        from hyla.bench.sweep.fused import run_fused_sweep

        run_fused_sweep(out, pdl=args.pdl, step_only=args.step_only, **common)
    else:
        from hyla.bench.sweep.decode_attention import run_decode_attention_sweep

        run_decode_attention_sweep(out, **common)
    print(f"wrote {out / 'settings.json'} (engine settings: --engine-settings {out / 'settings.json'})")
    return 0


def _register_generate(verbs) -> None:
    generate = verbs.add_parser("generate", help="NIAH evaluation through hyla's engine and transformers' generate, "
                                                 "side by side, on a converted-shape HypeNet (random weights)")
    generate.add_argument("--lengths", type=_lengths, default=None, help="comma list (default 4K,16K,64K)")
    generate.add_argument("--num-prompts", type=_lengths, default=None,
                          help="prompts per length, comma list (default 16 up to 16K, 8 above)")
    generate.add_argument("--batch-sizes", type=_lengths, default=None,
                          help="batch size per length, comma list (default 4 up to 16K, 1 above)")
    generate.add_argument("--max-new-tokens", type=_positive, default=64)
    generate.add_argument("--paths", default="engine,hf", help="comma list of engine, hf")
    generate.add_argument("--engine-settings", metavar="JSON", help="the engine's settings file (default: tuned)")
    generate.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    generate.add_argument("--toy", action="store_true", help="tiny shapes (a smoke test of the code path)")
    expert = generate.add_argument_group(EXPERT_OPTIONS)
    expert.add_argument("--decode-step", choices=DECODE_STEPS,
                        help="expert option: the engine's decode step for every run instead of the engine settings' "
                             "(which fall back from triton-fused to fused-projections for GLA/GDN layers and under "
                             "EME)")
    modes = generate.add_argument_group(
        "inference modes (with either option: a row per recurrent mixer, variant and length, and each variant's "
        "costs against direct)")
    modes.add_argument("--rnn-mixer", help="comma list of lightning, gla, gdn: the mixer of every layer that is not "
                                           "attention, one model each (default lightning)")
    modes.add_argument("--variants", help="comma list of direct (no logit scaling), per-query (the model's s_t), log "
                                          "(c(L) on NoPE attention), swla (SWLA, no logit scaling), swla+log (EME): "
                                          "seed 003's modes (default per-query, the model as built)")
    modes.add_argument("--eme-window", type=_count, default=None, help="the swla variants' SWLA window W "
                                                                       "(default 4K)")
    modes.add_argument("--eme-stride", type=_count, default=None, help="the swla variants' SWLA stride S "
                                                                       "(default 1K)")
    modes.add_argument("--logit-scaling-train-length", type=_count, default=None,
                       help="the log variants' L0 of c(L) (default 4K)")
    _common(generate)
    generate.set_defaults(handler=run_generate)


def _comma_list(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(part.strip() for part in text.split(",") if part.strip())


def run_generate(args: argparse.Namespace) -> int:
    from hyla.bench.generate import GenerateBenchSettings, generate_markdown, run_generate_bench

    defaults = GenerateBenchSettings()
    modes = {"eme_window": args.eme_window, "eme_stride": args.eme_stride,
             "logit_scaling_train_length": args.logit_scaling_train_length}
    settings = GenerateBenchSettings(
        lengths=args.lengths or defaults.lengths, num_prompts=args.num_prompts, batch_sizes=args.batch_sizes,
        max_new_tokens=args.max_new_tokens, paths=tuple(args.paths.split(",")), engine_settings=args.engine_settings,
        toy=args.toy, device=args.device, dtype=args.dtype, decode_step=args.decode_step,
        rnn_mixers=_comma_list(args.rnn_mixer), variants=_comma_list(args.variants),
        **{name: value for name, value in modes.items() if value is not None})
    # a bad plan, or an option no variant uses, fails before any model is built
    settings.plan()
    settings.check_used([name for name, value in modes.items() if value is not None])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()

    def save(results: dict) -> None:
        _write_json(out / "generate.json", {"environment": env, **results})

    results = run_generate_bench(settings, save=save)
    save(results)
    (out / "generate.md").write_text(generate_markdown(results, env["command"]))
    print(generate_markdown(results, env["command"]))
    return 0


def _engine_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The engine settings `model` and `profile` share (fields of ModelSettings and ProfileSettings): the tuned
    settings shipped for this GPU unless a settings file or an expert option says otherwise. Returns the expert
    group, for a verb's own expert options."""
    parser.add_argument("--engine-settings", metavar="JSON",
                        help="the engine's settings file (default: the tuned settings shipped for this GPU, "
                             "hyla/inference/tuned/; `hyla bench sweep` writes one)")
    expert = parser.add_argument_group(EXPERT_OPTIONS)
    expert.add_argument("--decode-step", choices=DECODE_STEPS,
                        help="eager: the model's modules; fused-projections: each block's input maps concatenated "
                             "(4 products a block instead of 8); triton-fused: hyla's fused kernels (batch 1)")
    expert.add_argument("--matvec", choices=MATVEC_KERNELS,
                        help="the products of --decode-step fused-projections: cuBLAS or hyla's Triton kernel")
    expert.add_argument("--attention-backend", default=None,
                        choices=("auto", "cudnn", "cudnn-padded", "flash", "torch"),
                        help="the engine's prefill attention kernel (auto: cuDNN on CUDA; default: the engine "
                             "settings')")
    expert.add_argument("--no-compile", action="store_true", help="graph-capture the decode step uncompiled")
    expert.add_argument("--compile-mode", choices=COMPILE_MODES_CLI,
                        help="torch.compile mode of the decode blocks (max-autotune-no-cudagraphs: inductor times "
                             "its matrix-product kernels against cuBLAS per shape while compiling)")
    expert.add_argument("--compile-prefill", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile the engine's prefill around its mixing kernels (norms, projections, "
                             "RoPE, gates, MLP)")
    expert.add_argument("--no-pdl", action="store_true",
                        help="launch the triton-fused kernels without programmatic dependent launch")
    parser.add_argument("--toy", action="store_true", help="tiny shapes (a smoke test of the code path)")
    return expert


def engine_overrides(args: argparse.Namespace) -> dict:
    """ModelSettings / ProfileSettings fields of `_engine_options` (None: the settings file's value)."""
    return {"engine_settings": args.engine_settings, "decode_step": args.decode_step, "matvec": args.matvec,
            "compile_decode": False if args.no_compile else None, "compile_mode": args.compile_mode,
            "compile_prefill": args.compile_prefill, "launch_pdl": False if args.no_pdl else None,
            "attention_backend": args.attention_backend}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="folder for the JSON, PNG and markdown results")
    parser.add_argument("--device", type=_device, default="auto",
                        help="cuda, cuda:N or cpu (default auto: cuda where there is one, else cpu)")


def _device(text: str) -> str:
    """auto -> cuda or cpu; a CUDA device asked for on a machine without CUDA is a usage error (one line)."""
    import torch

    text = text.strip().lower()
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no CUDA device (use --device cpu)")
    try:
        torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"{text}: not a device ({error})") from None
    return text


def _count(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (use e.g. 4096, 4K, 1M)") from err


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _lengths(text: str) -> tuple[int, ...]:
    return tuple(_count(part) for part in text.split(",") if part.strip())


def environment() -> dict:
    import torch

    info = {"command": " ".join(shlex.quote(a) for a in ["hyla", *sys.argv[1:]]), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    try:
        import transformers

        info["transformers"] = transformers.__version__
        import triton

        info["triton"] = triton.__version__
        import fla

        info["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        pass
    try:
        info["git_sha"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                         check=False).stdout.strip() or None
    except OSError:
        info["git_sha"] = None
    return info


def _write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=1))


def run_kernels(args: argparse.Namespace) -> int:
    from hyla.bench.kernels import KernelSettings, run_kernel_bench
    from hyla.bench.report import plot_kernels

    settings = KernelSettings(
        lengths=args.lengths or KernelSettings.lengths, num_heads=args.heads, head_dim=args.head_dim,
        softmax_max_length=args.softmax_max_length, repeats=args.repeats, device=args.device,
        mixers=tuple(args.mixers.split(",")) if args.mixers else None,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(), **run_kernel_bench(settings)}
    _write_json(out / "kernels.json", results)
    plot_kernels(results, out / "kernels.png")
    print(f"wrote {out / 'kernels.json'} and {out / 'kernels.png'}")
    return 0


def run_loss(args: argparse.Namespace) -> int:
    import dataclasses

    from hyla.bench.loss import TOY_SETTINGS, LossBenchSettings, LossCase, loss_markdown, run_loss_bench

    defaults = LossBenchSettings(**(TOY_SETTINGS if args.toy else {}))
    chosen = {"cases": tuple(LossCase.parse(item) for item in args.cases.split(",") if item.strip())
              if args.cases else None,
              "implementations": _comma_list(args.implementations), "hidden_size": args.hidden_size,
              "vocab_size": args.vocab_size, "check_rows": args.check_rows, "teacher_dtype": args.teacher_dtype}
    settings = dataclasses.replace(defaults, repeats=args.repeats, device=args.device,
                                   **{name: value for name, value in chosen.items() if value is not None})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()

    def save(results: dict) -> None:
        _write_json(out / "loss.json", {"environment": env, **results})

    results = run_loss_bench(settings, log=lambda line: print(line, flush=True), save=save)
    save(results)
    markdown = loss_markdown(results, env["command"])
    (out / "loss.md").write_text(markdown)
    print(markdown)
    print(f"wrote {out / 'loss.json'} and {out / 'loss.md'}")
    return 0


def _check_engine_options(args: argparse.Namespace) -> None:
    """Refuse up front what the engine would refuse after building the model: a bad settings file, hyla's Triton
    kernels off CUDA."""
    from hyla.inference.settings import load_settings

    if args.engine_settings is not None:
        load_settings(args.engine_settings)
    if args.matvec == "triton" and args.decode_step != "fused-projections":
        raise ValueError("--matvec triton sets the products of --decode-step fused-projections")
    if (args.decode_step == "triton-fused" or args.matvec == "triton") and not args.device.startswith("cuda"):
        raise ValueError(f"hyla's Triton decode kernels need a CUDA device, not {args.device}")


def run_model(args: argparse.Namespace) -> int:
    from hyla.bench.model import ModelSettings, run_model_bench
    from hyla.bench.report import model_markdown, plot_model

    _check_engine_options(args)

    defaults = ModelSettings()
    settings = ModelSettings(
        contexts=args.contexts or defaults.contexts,
        systems=tuple(args.systems.split(",")) if args.systems else defaults.systems,
        qwen3_engine_max_prefill=args.qwen3_engine_max_prefill, hypenet_max_prefill=args.hypenet_max_prefill,
        hf_max_prefill=args.hf_max_prefill,
        hf_graph_contexts=args.hf_graph_contexts or defaults.hf_graph_contexts, large_batch=args.large_batch,
        large_batch_contexts=(defaults.large_batch_contexts if args.large_batch_contexts is None
                              else args.large_batch_contexts),
        decode_steps=args.decode_steps, repeats=args.repeats, long_prefill_repeats=args.long_prefill_repeats,
        prefill_chunk=args.prefill_chunk, **engine_overrides(args),
        toy=args.toy, device=args.device, check_length=40 if args.toy else defaults.check_length,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()

    def save(results: dict) -> None:
        _write_json(out / "model.json", {"environment": env, **results})

    results = run_model_bench(settings, save=save)
    save(results)
    plot_model(results, out / "model.png")
    (out / "model.md").write_text(model_markdown(results, env["command"]))
    print(model_markdown(results, env["command"]))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    from hyla.bench.profile import ProfileSettings, profile_decode, profile_markdown, profile_prefill

    _check_engine_options(args)

    prefill = args.phase == "prefill"
    steps = args.steps if args.steps is not None else (2 if prefill else 10)
    settings = ProfileSettings(system=args.system, phase=args.phase, context=args.context, chunk=args.chunk,
                               batch=args.batch, steps=steps, **engine_overrides(args), toy=args.toy,
                               device=args.device, dtype=args.dtype, top=args.top)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = profile_prefill(settings) if prefill else profile_decode(settings)
    decode_step = result["engine"]["decode_step"]
    system = settings.system + ("" if prefill or decode_step == "eager" else f"-{decode_step}")
    system += "-compiled" if result["engine"]["compile_prefill"] and prefill else ""
    what = f"prefill{settings.chunk}-" if prefill else ""
    stem = f"profile-{system}-{what}{settings.context}-b{settings.batch}"
    _write_json(out / f"{stem}.json", {"environment": environment(), **result})
    (out / f"{stem}.md").write_text(profile_markdown(result))
    print(profile_markdown(result))
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
    return 0


TOY_TRAIN_CASES = "align:2x64,distill:2x128,finetune:1x256"


def run_train(args: argparse.Namespace) -> int:
    from hyla.bench.train import DEFAULT_CASES, Case, TrainBenchSettings, run_train_bench
    from hyla.bench.train_report import plot_train, train_markdown

    cases = args.cases or (TOY_TRAIN_CASES if args.toy else None)
    try:
        layers = (tuple(int(i) for i in args.attention_layers.split(",")) if args.attention_layers else None)
    except ValueError:
        raise ValueError(f"--attention-layers: expected a comma list of layer numbers, got {args.attention_layers!r}")
    settings = TrainBenchSettings(
        teacher=args.teacher,
        cases=tuple(Case.parse(item) for item in cases.split(",")) if cases else DEFAULT_CASES,
        paths=tuple(item for item in args.paths.split(",") if item), attention_layers=layers,
        steps=args.steps, warmup=args.warmup, profile=not args.no_profile, losses=not args.no_losses,
        toy=args.toy, device=args.device, rnn_mixer=args.rnn_mixer,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()

    def save(results: dict) -> None:
        _write_json(out / "train.json", {"environment": env, **results})

    results = run_train_bench(settings, save=save)
    save(results)
    plot_train(results, out / "train.png")
    markdown = train_markdown({"environment": env, **results}, env["command"])
    (out / "train.md").write_text(markdown)
    print(markdown)
    print(f"wrote {out / 'train.json'}, {out / 'train.md'} and {out / 'train.png'}")
    # A path that ran out of memory is a measurement (it does not fit); one that failed otherwise is a fault.
    failed = [f"{case['stage']} {case['path']}" for case in results["cases"]
              if "error" in case and not case["error"].startswith("out of memory")]
    if failed:
        print(f"hyla bench train: failed: {', '.join(failed)} (the error in each row)", file=sys.stderr)
    return 1 if failed else 0


def run_data_parallel(args: argparse.Namespace) -> int:
    import os

    from hyla.bench.data_parallel import DEFAULT_CASES, TOY_CASES, ParallelBenchSettings, run_parallel_bench
    from hyla.bench.data_parallel_report import parallel_markdown, plot_parallel
    from hyla.bench.train import Case

    try:
        worlds = tuple(int(part) for part in args.worlds.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--worlds: expected a comma list of GPU counts, got {args.worlds!r}") from None
    default = TOY_CASES if args.toy else DEFAULT_CASES
    settings = ParallelBenchSettings(
        teacher=args.teacher, worlds=worlds, modes=tuple(part for part in args.modes.split(",") if part),
        cases=tuple(Case.parse(item) for item in args.cases.split(",")) if args.cases else default,
        path=args.path, steps=args.steps, warmup=args.warmup, toy=args.toy, device=args.device)
    out = Path(args.out)
    env = environment()
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    env["command"] = f"torchrun --nproc-per-node {processes} -m hyla.cli {env['command'].removeprefix('hyla ')}"
    main = int(os.environ.get("RANK", "0")) == 0
    if main:
        out.mkdir(parents=True, exist_ok=True)

    def save(results: dict) -> None:
        _write_json(out / "data-parallel.json", {"environment": env, **results})

    results = run_parallel_bench(settings, save=save)
    if not main:
        return 0
    save(results)
    plot_parallel(results, out / "data-parallel.png")
    markdown = parallel_markdown({"environment": env, **results}, env["command"])
    (out / "data-parallel.md").write_text(markdown)
    print(markdown)
    print(f"wrote {out / 'data-parallel.json'}, {out / 'data-parallel.md'} and {out / 'data-parallel.png'}")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from hyla.bench.report import model_markdown, plot_model

    merged = {"systems": {}, "runs": []}
    for name in args.results:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"no results file {path}")
        results = json.loads(path.read_text())
        merged["systems"].update(results.get("systems", {}))
        merged["runs"].append({"file": str(path), "environment": results.get("environment"),
                               "settings": results.get("settings"), "engine": results.get("engine")})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "model.json", merged)
    plot_model(merged, out / "model.png")
    commands = "; ".join(run["environment"]["command"] for run in merged["runs"] if run.get("environment"))
    (out / "model.md").write_text(model_markdown(merged, commands))
    print(model_markdown(merged, commands))
    return 0
