"""Does training with the hybrid's activations in bf16 (`use_autocast_activations`: the residual stream and every
RMSNorm's output in the autocast dtype) stay within the error bound of `tests/train/test_bf16_activations.py` on the
real SmolLM2-135M teacher (pretrained weights, with their large residual-stream outliers) and real text?

Part 1, one training step of distill_loss and finetune_loss (fused=True), each as a float64 oracle (no autocast), the
default (float32 weights under CPU bf16 autocast, float32 residual stream) and bf16 activations (the same plus
`use_autocast_activations`): the loss, the distillation's student cross-entropy, every gradient's error against the
oracle (all parameters concatenated, by group, the worst parameter) and its growth (bf16 activations' error over the
default's, which the toy test bounds by 2), and the residual stream's largest |value| after each block. On:
- `as-built`: the student stage 2 builds (`build_student`, the recipe's architecture, `SMOLLM2_ATTENTION_LAYERS`)
  from twins as transferred, with no stage-1 twins (twins_path None);
- `lstsq-twins`: the same from twins at stage 1's initialisation (`plan.model.twin_init`, `calibrate_twins` on 4 x 2
  x 256 tokens), not aligned: closer to what stage 2 starts from (aligned twins are not at hand on a CPU);
- `teacher`: the teacher's own HypeNet form (all softmax attention) trained by finetune_loss: the real weights and
  outliers without untrained mixers;
- `lstsq-twins-distilled`: the lstsq-twins student after part 2's default run.
Part 2, a loss curve: the same seed and batches of real text, distillation of the lstsq-twins student at the recipe's
learning rate with `hyla.train.step.TrainStep` under CPU bf16 autocast, default against bf16 activations, and float32
without autocast as a yardstick of how far precision alone moves the curve.

    PYTHONPATH=src python bench/bf16_activations_real.py --out DIR   # ~20 minutes on 2 CPU cores

Text: windows of the concatenated source (code and docstrings) of a few standard-library modules, the repo's default
corpus. Writes DIR/result.json (numbers, settings, command, versions, git SHA) and DIR/result.md.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import torch

from hyla.bench.train import SMOLLM2_ATTENTION_LAYERS
from hyla.convert.distill import StudentWithTeacher, build_student, distill_loss, hybrid_stage_loss
from hyla.convert.presets import make_plan
from hyla.models.loading import load_teacher
from hyla.models.modeling import use_autocast_activations
from hyla.models.transfer import to_hypenet
from hyla.outputs import run_metadata, write_json

TEACHER = "smollm2-135m"
PRESET = "halo-smollm2"
# tests/train/test_bf16_activations.py: GRADIENT_ERROR_GROWTH and BF16_UNIT_ROUNDOFF (the toy model's bounds).
GRADIENT_ERROR_GROWTH = 2.0
BF16_UNIT_ROUNDOFF = 2.0**-8
# Prose-heavy modules (long docstrings) and plain code, read in order: part 1's windows first, then the twins'
# calibration batches, then part 2's batches.
TEXT_MODULES = ("argparse.py", "difflib.py", "textwrap.py", "statistics.py", "fractions.py", "heapq.py",
                "calendar.py", "string.py", "shlex.py", "configparser.py", "inspect.py", "typing.py")
# Stage 1's calibration shape in docs/convert.md's measurement of the twin inits: 4 batches of 2 x 256 tokens.
CALIBRATION_BATCHES, CALIBRATION_ROWS, CALIBRATION_TOKENS = 4, 2, 256
GROUPS = ("embeddings", "attention", "lightning", "norms")
RUNS = {  # name: (dtype, autocast, bf16 activations)
    "oracle": (torch.float64, False, False),
    "default": (torch.float32, True, False),
    "bf16_activations": (torch.float32, True, True),
}


def real_text_ids(tokenizer, num_tokens: int) -> torch.Tensor:
    """The first `num_tokens` tokens of TEXT_MODULES' sources, each file one document ended by EOS."""
    root = Path(sysconfig.get_paths()["stdlib"])
    ids: list[int] = []
    for name in TEXT_MODULES:
        ids += tokenizer((root / name).read_text(encoding="utf-8"))["input_ids"] + [tokenizer.eos_token_id]
        if len(ids) >= num_tokens:
            return torch.tensor(ids[:num_tokens])
    raise ValueError(f"{len(ids)} tokens of text in {TEXT_MODULES}, {num_tokens} wanted: use fewer tokens or steps")


def windows(ids: torch.Tensor, start: int, rows: int, length: int) -> dict:
    """`rows` consecutive windows of `length` + 1 tokens from `start`: inputs and next-token labels."""
    block = ids[start:start + rows * (length + 1)].view(rows, length + 1)
    return {"input_ids": block[:, :-1].contiguous(), "labels": block[:, 1:].contiguous()}


def load(preset: str) -> tuple:
    """The teacher (float32 HF model) with its tokenizer, the plan, and the teacher's HypeNet form in float32 and
    float64."""
    loaded = load_teacher(TEACHER)
    loaded.model.eval()
    plan = make_plan(preset, sum(p.numel() for p in loaded.model.parameters()))
    teacher = to_hypenet(loaded.model, attention_rope=True).float().eval()
    return loaded, plan, {torch.float32: teacher, torch.float64: copy.deepcopy(teacher).double()}


def build_students(hf_teacher, plan, teacher, calibration: list[dict], seed: int) -> tuple[dict, dict]:
    """The stage-2 students `as-built` (no stage-1 twins) and `lstsq-twins` (twins at stage 1's initialisation,
    saved and loaded as stage 2 loads stage 1's twins), float32, each built from `seed` (the new output gates are
    random); and the calibration's report."""
    from safetensors.torch import save_file

    from hyla.convert.align import AlignmentTwins
    from hyla.convert.calibrate import calibrate_twins

    def student(twins_path):
        torch.manual_seed(seed)
        return build_student(hf_teacher, list(SMOLLM2_ATTENTION_LAYERS), twins_path, rnn_mixer=plan.model.rnn_mixer,
                             **plan.student_options()).float()

    config = copy.deepcopy(teacher.config)
    for name, value in plan.twin_options().items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    twins = AlignmentTwins.for_training(teacher, hf_teacher, config, torch.device("cpu"),
                                        rnn_mixer=plan.model.rnn_mixer)
    report = calibrate_twins(twins, calibration, plan.model.twin_init)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "twins.safetensors"
        save_file({k: v.contiguous() for k, v in twins.twin_state_dict().items()}, str(path))
        students = {"as-built": student(None), "lstsq-twins": student(path)}
    summary = {"mode": plan.model.twin_init, "median_error_before": statistics.median(report["relative_error_before"]),
               "median_error_after": statistics.median(report["relative_error_after"]),
               "relative_error_after": report["relative_error_after"]}
    return students, summary


def parameter_group(name: str, layer_types: list[str]) -> str:
    if "embed_tokens" in name or "lm_head" in name:
        return "embeddings"
    if "norm" in name:  # block norms, the final norm, the Lightning q/k/output norms
        return "norms"
    return layer_types[int(name.split(".")[2])]


def one_step(student, teachers: dict, batch: dict, stage: str, run: str) -> dict:
    """Loss, metric, every gradient and each block's largest |output| of one training step of `stage` as `run`
    (RUNS) computes it, on a fresh copy of `student`."""
    dtype, autocast, bf16_activations = RUNS[run]
    student = copy.deepcopy(student).to(dtype).train()
    use_autocast_activations(student, bf16_activations)
    residual_max, dtypes = [0.0] * len(student.model.layers), set()

    def record(index):
        def hook(module, inputs, output):
            residual_max[index] = max(residual_max[index], output.detach().abs().max().item())
            dtypes.add(str(output.dtype).removeprefix("torch."))
        return hook

    hooks = [block.register_forward_hook(record(i)) for i, block in enumerate(student.model.layers)]
    pair = StudentWithTeacher(student, teachers[dtype] if stage == "distill" else None)
    started = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, metric = hybrid_stage_loss(pair, batch, stage, fused=True)
    loss.backward()
    metric = None if metric is None else metric.item()
    seconds = time.perf_counter() - started
    for hook in hooks:
        hook.remove()
    grads = {name: p.grad.double() for name, p in student.named_parameters()}
    return {"loss": loss.item(), "metric": metric, "grads": grads, "residual_max": residual_max,
            "residual_dtypes": sorted(dtypes), "seconds": seconds}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def gradient_errors(grads: dict, oracle: dict, layer_types: list[str]) -> dict:
    """The relative error (and cosine) of all gradients concatenated; by group, the error of the group concatenated
    and of its worst parameter (that parameter's own relative error)."""
    names = list(oracle)

    def flat(grads_by_name: dict, keys: list[str]) -> torch.Tensor:
        return torch.cat([grads_by_name[k].flatten() for k in keys])

    got, want = flat(grads, names), flat(oracle, names)
    result = {"all": relative_error(got, want), "cosine": torch.nn.functional.cosine_similarity(got, want, 0).item(),
              "oracle_norm": want.norm().item(), "groups": {}}
    for group in GROUPS:
        members = [n for n in names if parameter_group(n, layer_types) == group]
        per_parameter = {n: relative_error(grads[n], oracle[n]) for n in members if oracle[n].norm() > 0}
        if not per_parameter:  # (the teacher has no Lightning layers)
            continue
        worst = max(per_parameter, key=per_parameter.get)
        result["groups"][group] = {"error": relative_error(flat(grads, members), flat(oracle, members)),
                                   "worst_parameter": worst, "worst_error": per_parameter[worst],
                                   "parameters": len(members)}
    return result


def compare_stage(student, teachers: dict, batch: dict, stage: str, label: str) -> dict:
    """Part 1 for one model and stage: the three RUNS and their errors against the oracle."""
    runs = {}
    for run in RUNS:
        runs[run] = one_step(student, teachers, batch, stage, run)
        print(f"  {label} {stage} {run}: loss {runs[run]['loss']:.6f}, {runs[run]['seconds']:.0f} s", flush=True)
    oracle, layer_types = runs["oracle"], [block.layer_type for block in student.model.layers]
    result = {"oracle_loss": oracle["loss"], "oracle_metric": oracle["metric"], "runs": {}}
    for run, outcome in runs.items():
        peak = max(range(len(outcome["residual_max"])), key=outcome["residual_max"].__getitem__)
        row = {"loss": outcome["loss"], "residual_max": outcome["residual_max"], "residual_max_layer": peak,
               "residual_max_value": outcome["residual_max"][peak], "residual_dtypes": outcome["residual_dtypes"],
               "seconds": outcome["seconds"]}
        if run != "oracle":
            row["loss_error"] = abs(outcome["loss"] - oracle["loss"]) / abs(oracle["loss"])
            row["loss_within_bf16_roundoff"] = row["loss_error"] <= BF16_UNIT_ROUNDOFF
            if outcome["metric"] is not None:
                row["metric"] = outcome["metric"]
                row["metric_error"] = abs(outcome["metric"] - oracle["metric"]) / abs(oracle["metric"])
            row["gradient"] = gradient_errors(outcome["grads"], oracle["grads"], layer_types)
        result["runs"][run] = row
    default, half = result["runs"]["default"]["gradient"], result["runs"]["bf16_activations"]["gradient"]
    result["growth"] = half["all"] / default["all"]
    result["group_growth"] = {g: half["groups"][g]["error"] / default["groups"][g]["error"] for g in default["groups"]}
    result["within_bound"] = result["growth"] <= GRADIENT_ERROR_GROWTH
    print(f"  {label} {stage}: gradient error {default['all']:.3e} (default) -> {half['all']:.3e} (bf16 activations), "
          f"growth {result['growth']:.2f}x", flush=True)
    return result


def compare_model(student, teachers: dict, batches: list[dict], stages: tuple[str, ...], label: str) -> dict:
    """Part 1 for one model on every batch: by stage, each batch's comparison and the growth over the batches (one
    batch's growth is a noisy statistic where the default's error is large)."""
    result = {}
    for stage in stages:
        parts = [compare_stage(student, teachers, batch, stage, f"{label} batch {i}")
                 for i, batch in enumerate(batches)]
        growth = [part["growth"] for part in parts]
        result[stage] = {"batches": parts, "growth": growth, "growth_median": statistics.median(growth),
                         "growth_max": max(growth), "within_bound": all(part["within_bound"] for part in parts)}
        print(verdict(label, stage, result[stage]), flush=True)
    return result


def loss_curve(student, teacher, batches: list[dict], lr: float, arm: str) -> tuple[dict, torch.nn.Module]:
    """Distillation from `student`'s weights over `batches` at a constant `lr` (AdamW, the plan's betas and clip),
    under CPU bf16 autocast (arms "default", "bf16_activations") or in float32 without it ("float32"); the curve
    and the trained student."""
    from hyla.train.distributed import Distributed
    from hyla.train.optim import OptimSettings, build_optimizer
    from hyla.train.step import TrainStep

    torch.manual_seed(0)
    student = copy.deepcopy(student).float().train()
    use_autocast_activations(student, arm == "bf16_activations")
    # Constant, no warmup: the recipe spends nearly all its steps near its peak rate; a 20-step cosine would not.
    settings = OptimSettings(lr=lr, min_lr=lr, warmup_steps=0, schedule="constant")
    model = StudentWithTeacher(student, teacher)
    optimizer, scheduler = build_optimizer(model.parameters(), settings, len(batches), fused=False)
    step = TrainStep(model, functools.partial(distill_loss, fused=True), optimizer, scheduler, settings,
                     Distributed(device=torch.device("cpu")), micro_batch_rows=len(batches[0]["input_ids"]))
    losses, ce, grad_norms, started = [], [], [], time.perf_counter()
    for index, batch in enumerate(batches):
        # training_autocast is CUDA-only: the CPU autocast is set here, around the whole step.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=arm != "float32"):
            outcome = step(batch)
        losses.append(outcome.loss)
        ce.append(outcome.metrics["student_ce"])
        grad_norms.append(outcome.grad_norm)
        print(f"  curve {arm} step {index + 1}/{len(batches)}: KL {outcome.loss:.4f}, CE {ce[-1]:.4f}, "
              f"grad norm {outcome.grad_norm:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    curve = {"kl": losses, "student_ce": ce, "grad_norm": grad_norms, "seconds": time.perf_counter() - started}
    return curve, student


def curve_differences(curves: dict) -> dict:
    def max_relative(a: list[float], b: list[float]) -> dict:
        diffs = [abs(x - y) / abs(x) for x, y in zip(a, b)]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        return {"max": diffs[worst], "step": worst + 1, "last": diffs[-1]}

    pairs = {"bf16_activations_vs_default": ("default", "bf16_activations")}
    if "float32" in curves:
        pairs["default_vs_float32"] = ("float32", "default")
        pairs["bf16_activations_vs_float32"] = ("float32", "bf16_activations")
    return {pair: {key: max_relative(curves[a][key], curves[b][key]) for key in ("kl", "student_ce", "grad_norm")}
            for pair, (a, b) in pairs.items()}


def run_curves(args, plan, student, teacher, ids: torch.Tensor, offset: int) -> tuple[dict, torch.nn.Module]:
    """Part 2: the loss curves of every arm on the same batches; the default arm's trained student."""
    size = args.curve_rows * (args.curve_tokens + 1)
    batches = [windows(ids, offset + i * size, args.curve_rows, args.curve_tokens) for i in range(args.steps)]
    arms = ["default", "bf16_activations"] + ([] if args.no_float32_curve else ["float32"])
    curves, trained = {}, None
    for arm in arms:
        curves[arm], model = loss_curve(student, teacher, batches, plan.distill.lr, arm)
        trained = model if arm == "default" else trained
    return {"rows": args.curve_rows, "seq_len": args.curve_tokens, "lr": plan.distill.lr, "student": "lstsq-twins",
            "batch_offsets": [offset + i * size for i in range(args.steps)], "curves": curves,
            "differences": curve_differences(curves)}, trained


def verdict(label: str, stage: str, summary: dict) -> str:
    outside = sum(not part["within_bound"] for part in summary["batches"])
    status = "within" if not outside else f"OUTSIDE on {outside} of {len(summary['batches'])} batches"
    default = ", ".join(f"{p['runs']['default']['gradient']['all']:.2e}" for p in summary["batches"])
    half = ", ".join(f"{p['runs']['bf16_activations']['gradient']['all']:.2e}" for p in summary["batches"])
    growth = ", ".join(f"{g:.2f}" for g in summary["growth"])
    loss = max(p["runs"][run]["loss_error"] for p in summary["batches"] for run in ("default", "bf16_activations"))
    return (f"- {label} {stage}: gradient error [{default}] (default) -> [{half}] (bf16 activations), growth "
            f"[{growth}]x, median {summary['growth_median']:.2f}x: {status} the toy bound {GRADIENT_ERROR_GROWTH}x; "
            f"loss rel. error at most {loss:.1e} (toy bound {BF16_UNIT_ROUNDOFF:.1e})")


def markdown(result: dict) -> str:
    settings = result["settings"]
    twins = result["twin_init"]
    lines = [f"# bf16 activations on the real {TEACHER} teacher and real text (CPU)", "",
             f"`{result['command']}` ({result['seconds'] / 60:.1f} min, {settings['threads']} CPU threads)", "",
             (f"Teacher {Path(result['teacher_source']).name}; students: preset {settings['preset']}, attention layers "
              f"{settings['attention_layers']}; lstsq twins: stage 1's `{twins['mode']}` init, median error / "
              f"teacher output energy over layers {twins['median_error_before']:.3g} -> "
              f"{twins['median_error_after']:.3g}. One step on each of {settings['batches']} batches of "
              f"{settings['rows']} x {settings['tokens']} tokens of stdlib source. Gradient error: "
              f"||g - g_oracle|| / ||g_oracle|| against a float64 oracle, all parameters concatenated (cos: cosine "
              f"with the oracle), by group, and the worst single parameter; "
              f"growth: bf16 activations' error over the default's (toy bound {GRADIENT_ERROR_GROWTH}x)."), "",
             *summary_table(result), "", "Batch 0 in detail:", "",
             ("| model | stage | run | loss rel. err | CE rel. err | grad err | cos | embeddings | attention | "
              "lightning | norms | worst parameter (err) | max abs residual (layer) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, stages in result["models"].items():
        for stage, summary in stages.items():
            lines += [table_row(label, stage, run, row) for run, row in summary["batches"][0]["runs"].items()]
    lines.append("")
    lines += [verdict(label, stage, summary) for label, stages in result["models"].items()
              for stage, summary in stages.items()]
    curve = result.get("curve")
    if curve:
        lines += ["", (f"Loss curve: distillation of the {curve['student']} student, {len(curve['batch_offsets'])} "
                       f"steps of {curve['rows']} x {curve['seq_len']} tokens, AdamW at constant lr {curve['lr']}, "
                       f"one seed, the same batches ({curve['curves']['default']['seconds']:.0f} s an arm)."),
                  "", "| step | " + " | ".join(f"KL {arm}" for arm in curve["curves"]) + " |",
                  "|---|" + "---|" * len(curve["curves"])]
        for index in range(len(curve["batch_offsets"])):
            values = " | ".join(f"{c['kl'][index]:.5f}" for c in curve["curves"].values())
            lines.append(f"| {index + 1} | {values} |")
        lines.append("")
        for pair, keys in curve["differences"].items():
            parts = ", ".join(f"{key} {d['max']:.2e} (step {d['step']}; last {d['last']:.2e})"
                              for key, d in keys.items())
            lines.append(f"- {pair}, max relative difference: {parts}")
    return "\n".join(lines) + "\n"


def summary_table(result: dict) -> list[str]:
    lines = [("| model | stage | grad err default | grad err bf16 act. | growth | median growth | "
              "max loss rel. err | max CE rel. err | max abs residual (layer) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for label, stages in result["models"].items():
        for stage, summary in stages.items():
            rows = [part["runs"] for part in summary["batches"]]
            errors = {run: ", ".join(f"{r[run]['gradient']['all']:.2e}" for r in rows)
                      for run in ("default", "bf16_activations")}
            loss = max(r[run]["loss_error"] for r in rows for run in ("default", "bf16_activations"))
            metric = [r[run]["metric_error"] for r in rows for run in ("default", "bf16_activations")
                      if "metric_error" in r[run]]
            peak = max((r["oracle"]["residual_max_value"], r["oracle"]["residual_max_layer"]) for r in rows)
            lines.append(f"| {label} | {stage} | {errors['default']} | {errors['bf16_activations']} | "
                         f"{', '.join(f'{g:.2f}' for g in summary['growth'])} | {summary['growth_median']:.2f} | "
                         f"{loss:.2e} | {f'{max(metric):.2e}' if metric else ''} | {peak[0]:.0f} ({peak[1]}) |")
    return lines


def table_row(label: str, stage: str, run: str, row: dict) -> str:
    residual = f"{row['residual_max_value']:.0f} ({row['residual_max_layer']}, {','.join(row['residual_dtypes'])})"
    if run == "oracle":
        return f"| {label} | {stage} | oracle (loss {row['loss']:.4f}) | | | | | | | | | | {residual} |"
    grad = row["gradient"]
    groups = " | ".join(f"{grad['groups'][g]['error']:.2e}" if g in grad["groups"] else "" for g in GROUPS)
    worst = max(grad["groups"].values(), key=lambda g: g["worst_error"])
    metric = f"{row['metric_error']:.2e}" if "metric_error" in row else ""
    return (f"| {label} | {stage} | {run} | {row['loss_error']:.2e} | {metric} | {grad['all']:.2e} | "
            f"{grad['cosine']:.3f} | {groups} | {worst['worst_parameter']} ({worst['worst_error']:.2e}) | "
            f"{residual} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for result.json and result.md")
    parser.add_argument("--tokens", type=int, default=512, help="tokens a sequence in part 1")
    parser.add_argument("--rows", type=int, default=2, help="sequences in part 1")
    parser.add_argument("--batches", type=int, default=3, help="part 1's batches (each of --rows x --tokens)")
    parser.add_argument("--steps", type=int, default=16, help="loss-curve steps (0: no part 2)")
    parser.add_argument("--curve-rows", type=int, default=4)
    parser.add_argument("--curve-tokens", type=int, default=256)
    parser.add_argument("--no-float32-curve", action="store_true", help="no float32 yardstick arm in part 2")
    parser.add_argument("--preset", default=PRESET)
    parser.add_argument("--seed", type=int, default=0, help="the students' new output gates")
    args = parser.parse_args(argv)
    if min(args.tokens, args.rows, args.batches, args.curve_rows, args.curve_tokens) < 1 or args.steps < 0:
        parser.error("--tokens, --rows, --batches, --curve-rows and --curve-tokens must be >= 1, --steps >= 0")
    started = time.perf_counter()
    settings = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "teacher": TEACHER, "attention_layers": list(SMOLLM2_ATTENTION_LAYERS),
                "threads": torch.get_num_threads(), "text_modules": list(TEXT_MODULES)}
    print(json.dumps(settings), flush=True)
    loaded, plan, teachers = load(args.preset)
    batch_size = args.rows * (args.tokens + 1)
    part1 = args.batches * batch_size
    calibration = CALIBRATION_BATCHES * CALIBRATION_ROWS * (CALIBRATION_TOKENS + 1)
    ids = real_text_ids(loaded.tokenizer, part1 + calibration + args.steps * args.curve_rows * (args.curve_tokens + 1))
    size = CALIBRATION_ROWS * (CALIBRATION_TOKENS + 1)
    students, twin_init = build_students(
        loaded.model, plan, teachers[torch.float32],
        [windows(ids, part1 + i * size, CALIBRATION_ROWS, CALIBRATION_TOKENS) for i in range(CALIBRATION_BATCHES)],
        args.seed)
    print(f"teacher {loaded.source}; {len(ids)} tokens of text; students' layers "
          f"{''.join(b.layer_type[0] for b in students['as-built'].model.layers)}, options {plan.student_options()}; "
          f"twin init {twin_init['mode']}: median error {twin_init['median_error_before']:.3g} -> "
          f"{twin_init['median_error_after']:.3g}", flush=True)
    batches = [windows(ids, i * batch_size, args.rows, args.tokens) for i in range(args.batches)]
    result = {**run_metadata(settings), "teacher_source": loaded.source, "student_options": plan.student_options(),
              "twin_init": twin_init, "models": {}}
    for label, student in students.items():
        result["models"][label] = compare_model(student, teachers, batches, ("distill", "finetune"), label)
    result["models"]["teacher"] = compare_model(teachers[torch.float32], teachers, batches, ("finetune",), "teacher")
    if args.steps:
        result["curve"], trained = run_curves(args, plan, students["lstsq-twins"], teachers[torch.float32], ids,
                                              part1 + calibration)
        label = f"lstsq-twins-distilled-{args.steps}"
        result["models"][label] = compare_model(trained, teachers, batches, ("distill", "finetune"), label)
    result["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "result.json", result)
    (args.out / "result.md").write_text(markdown(result))
    print("\n".join(verdict(label, stage, summary) for label, stages in result["models"].items()
                    for stage, summary in stages.items()))
    print(f"wrote {args.out} ({result['seconds'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
