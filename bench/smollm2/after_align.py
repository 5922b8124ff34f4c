"""Where does the converted hybrid lose retrieval before any distillation? Scores, with the same NIAH prompts and
essay windows, four models built from one `hyla convert` run that has finished stage 1 (align):

- `teacher`: the teacher-equivalent HypeNet (every layer attention with RoPE; the teacher's exact logits);
- `teacher, NoPE at S`: the same, with RoPE removed from the attention layers S only (nothing else changed);
- `aligned, attention RoPE at S`: Lightning twins from stage 1 everywhere but S, attention with RoPE at S;
- `aligned, attention NoPE at S`: the same with NoPE at S: the HypeNet that stage 3 (distill) starts from.

    python bench/smollm2/after_align.py --run RUN --teacher smollm2-135m --layers 0,1,7,16,18,19,23 \
        --tasks SK1,SK2 --length 2048 --samples 20 --out OUT.json

For each model: NIAH recall (mean RULER score and its standard error over prompts) and the mean next-token loss on
RULER's essays at `--length` (first half / second half of the window). Prints a table last and writes OUT.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from hyla.convert.distill import build_student
from hyla.convert.selection import mean_and_stderr
from hyla.convert.teacher import load_teacher
from hyla.convert.transfer import to_hypenet
from hyla.evals import niah as niah_eval
from hyla.evals.ppl import long_token_sequences, token_losses
from hyla.outputs import write_json


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="hyla convert output folder with 01-align done")
    parser.add_argument("--teacher", required=True, help="the run's teacher spec")
    parser.add_argument("--layers", required=True, help="attention layers S, comma separated")
    parser.add_argument("--tasks", default="SK1,SK2", help="NIAH tasks (default SK1,SK2)")
    parser.add_argument("--length", type=int, default=2048, help="NIAH and loss window length (default 2048)")
    parser.add_argument("--samples", type=int, default=20, help="NIAH prompts per task (default 20)")
    parser.add_argument("--loss-windows", type=int, default=4, help="essay windows for the loss (default 4)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lightning-rope", choices=("true", "false"), default="true",
                        help="the run's model.lightning_rope (default true)")
    parser.add_argument("--lightning-qk-norm", choices=("true", "false"), default="true",
                        help="the run's model.lightning_qk_norm (default true)")
    parser.add_argument("--out", type=Path, required=True, help="JSON report to write")
    return parser.parse_args(argv)


def build_models(hf_teacher, twins: Path, layers: list[int], options: dict[str, bool]):
    """(name, builder) pairs; each builder returns a fresh float32 model in eval mode."""

    def teacher():
        return to_hypenet(hf_teacher, attention_rope=True)

    def teacher_nope():
        model = to_hypenet(hf_teacher, attention_rope=True)
        for index in layers:
            model.model.layers[index].mixer.use_rope = False
        return model

    def aligned(rope: bool):
        return lambda: build_student(hf_teacher, layers, twins, attention_rope=rope, **options)

    at = ",".join(map(str, layers))
    return [
        ("teacher", teacher),
        (f"teacher, NoPE at {at}", teacher_nope),
        (f"aligned, attention RoPE at {at}", aligned(True)),
        (f"aligned, attention NoPE at {at}", aligned(False)),
    ]


def score_model(model, tokenizer, samples, windows, *, batch_size: int, num_examples: int) -> dict:
    """NIAH recall per task (mean and standard error over prompts) and the mean next-token loss over `windows`
    (whole, first half, second half), with the first `num_examples` predictions."""
    records = niah_eval.evaluate_samples(model, tokenizer, samples, batch_size=batch_size)
    by_task: dict[str, list[float]] = {}
    for sample, record in zip(samples, records):
        by_task.setdefault(sample.task, []).append(record["score"])
    stats = {task: mean_and_stderr(values) for task, values in by_task.items()}
    losses = token_losses(model, windows)
    half = losses.shape[1] // 2
    return {"recall": {task: mean for task, (mean, _) in stats.items()},
            "recall_stderr": {task: stderr for task, (_, stderr) in stats.items()},
            "loss": losses.mean().item(),
            "loss_first_half": losses[:, :half].mean().item(),
            "loss_second_half": losses[:, half:].mean().item(),
            "examples": [record["pred"] for record in records[:num_examples]]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    twins = args.run / "01-align" / "twins.safetensors"
    if not twins.is_file():
        print(f"after_align: {twins} not found: run `hyla convert ... --until-stage align` first", file=sys.stderr)
        return 2
    layers = sorted({int(item) for item in args.layers.split(",") if item})
    options = {"lightning_rope": args.lightning_rope == "true", "lightning_qk_norm": args.lightning_qk_norm == "true"}
    torch.manual_seed(args.seed)
    loaded = load_teacher(args.teacher)
    tokenizer = loaded.tokenizer
    samples = [sample for task in args.tasks.split(",")
               for sample in niah_eval.build_samples(tokenizer, task, args.length, args.samples, args.seed)]
    windows = long_token_sequences(tokenizer, args.length, args.loss_windows)
    rows = []
    for name, build in build_models(loaded.model, twins, layers, options):
        started = time.time()
        model = build().float().eval()
        row = {"model": name, **score_model(model, tokenizer, samples, windows, batch_size=args.batch_size,
                                            num_examples=3),
               "seconds": round(time.time() - started, 1)}
        rows.append(row)
        print(f"[after_align] {name}: recall {row['recall']}, loss {row['loss']:.3f} ({row['seconds']} s)",
              flush=True)
        del model
    report = {"run": str(args.run), "teacher": args.teacher, "layers": layers, "tasks": args.tasks.split(","),
              "length": args.length, "samples_per_task": args.samples, "loss_windows": args.loss_windows,
              "seed": args.seed, "rows": rows}
    write_json(args.out, report)
    tasks = args.tasks.split(",")
    print(f"\n{'model':<44}" + "".join(f"{task:>8}" for task in tasks) + f"{'loss':>8}{'1st½':>8}{'2nd½':>8}")
    for row in rows:
        print(f"{row['model']:<44}" + "".join(f"{row['recall'][t]:>8.2f}" for t in tasks)
              + f"{row['loss']:>8.3f}{row['loss_first_half']:>8.3f}{row['loss_second_half']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
