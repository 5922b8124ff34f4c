"""Training throughput of each conversion stage at SmolLM2-135M's shape, alone on the GPU, with random weights (no
teacher file needed): what a GPU session's budget of tokens can be planned from (docs/results/smollm2-135m.md).

    python bench/smollm2/probe.py --out probe.json [--steps 12] [--warmup 3]
    python bench/smollm2/probe.py --out /tmp/probe.json --smoke     # tiny sizes on CPU: plumbing only

Each case builds the stage's real modules (`AlignmentTwins` + `alignment_loss`, `StudentWithTeacher` +
`distill_loss` / `finetune_loss`), runs `--warmup` steps (kernel compilation) and then `--steps` timed steps of
the training loop's own step function (bf16 autocast, AdamW, clipping) on random tokens, and reports tokens/s and
peak memory. Weights are random: speed depends on shapes, not values.

Then the COMPILED cases (`--compiled`, default the distillation at 4x4096 and the fine-tuning) run again with
every block compiled as `--set STAGE.compile=true` does it (`hyla.compile.compile_blocks`: the trained model's
blocks and the teacher's), marked `"compiled": true`: the A/B of torch.compile for training, in one run. A
compiled case that fails is reported with its error, and the probe goes on. Then the CHECKPOINTED cases
(`--checkpointed`, default distillation at 16x4096 and 32x4096 and the fine-tuning) run with activation
checkpointing as `--set STAGE.checkpoint_activations=true` does it, marked `"checkpointed": true`: what the
recomputation costs per token and how much memory it frees for larger steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.profile import profile_steps
from hyla.compile import compile_blocks
from hyla.convert.align import AlignmentTwins, alignment_loss
from hyla.convert.distill import StudentWithTeacher, distill_loss, finetune_loss
from hyla.convert.transfer import to_hypenet
from hyla.outputs import write_json
from hyla.train.activations import checkpoint_activations
from hyla.train.distributed import Distributed
from hyla.train.loop import _step
from hyla.train.optim import OptimSettings, build_optimizer

# SmolLM2-135M's sizes (its GGUF / HF config).
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)
ATTENTION = [0, 1, 7, 16, 18, 19, 23]  # the recorded HALO choice
# Distillation at 4x4096 (16K tokens a step) and at 2x and 4x that: whether a larger step buys throughput (the
# 16K-token cases of 2026-11-30 ran at ~8% of the GPU's bf16 peak, a sign of per-kernel overheads). A case that
# runs out of memory is reported and the probe goes on.
CASES = [("align", 32, 512), ("distill", 32, 512), ("distill", 8, 2048), ("distill", 4, 4096),
         ("distill", 8, 4096), ("distill", 16, 4096), ("finetune", 4, 16384)]
PROFILED = ("distill", 4, 4096)
COMPILED = [("distill", 4, 4096), ("finetune", 4, 16384)]
# Activation checkpointing (`STAGE.checkpoint_activations=true`): memory for one more forward a step; whether the
# larger steps it allows (16x4096 took 103 GiB without) buy more than the recomputation costs.
CHECKPOINTED = [("distill", 16, 4096), ("distill", 32, 4096), ("finetune", 4, 16384)]


def build(stage: str, teacher_hf, device, compiled: bool = False, checkpointed: bool = False):
    teacher = to_hypenet(teacher_hf, attention_rope=True).to(device).eval()
    if stage == "align":
        model = AlignmentTwins(teacher, teacher_hf).to(device)
        for param in model.parameters():
            param.data = param.data.float()
        if compiled:
            compile_blocks(model.twins)
        return model, alignment_loss
    layer_types = ["attention" if i in ATTENTION else "lightning" for i in range(teacher_hf.config.num_hidden_layers)]
    student = to_hypenet(teacher_hf, layer_types, attention_output_gate=True).to(device).float()
    pair = StudentWithTeacher(student, teacher if stage == "distill" else None)
    if compiled:  # as hyla.convert.runners.train_budget does for `compile=true`
        compile_blocks([*student.model.layers, *(teacher.model.layers if stage == "distill" else [])])
    if checkpointed:  # and for `checkpoint_activations=true`
        checkpoint_activations(student)
    return pair, distill_loss if stage == "distill" else finetune_loss


def _sync(env) -> None:
    if env.device.type == "cuda":
        torch.cuda.synchronize()


def measure(stage: str, batch: int, seq_len: int, teacher_hf, env, steps: int, warmup: int,
            profiled_steps: int = 0, compiled: bool = False, checkpointed: bool = False) -> dict:
    if env.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, loss_fn = build(stage, teacher_hf, env.device, compiled, checkpointed)
    label = f"{stage} {batch}x{seq_len}" + (" compiled" if compiled else "") + (" checkpointed" if checkpointed else "")
    model.train()
    optim = OptimSettings(lr=1e-4, min_lr=1e-5, warmup_steps=1)
    optimizer, scheduler = build_optimizer([p for p in model.parameters() if p.requires_grad], optim, steps + warmup)
    vocab = teacher_hf.config.vocab_size

    def train_step():
        ids = torch.randint(0, vocab, (batch, seq_len + 1), device=env.device)
        data = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
        return _step(model, loss_fn, data, optimizer, scheduler, optim, env)[0]

    times = []
    for step in range(warmup + steps):
        _sync(env)
        started = time.perf_counter()
        loss = train_step().item()
        _sync(env)
        times.append(time.perf_counter() - started)
        print(f"  {label} step {step + 1}: {times[-1]:.3f} s, "
              f"loss {loss:.3f}", flush=True)
    timed = sorted(times[warmup:])
    median = timed[len(timed) // 2]
    result = {"stage": stage, "batch": batch, "seq_len": seq_len, "compiled": compiled,
              "checkpointed": checkpointed, "median_step_s": median,
              "tok_per_s": batch * seq_len / median, "first_step_s": times[0],
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if env.device.type == "cuda" else None}
    if profiled_steps:  # where a training step's time goes: kernels (CPU: operators) by cost
        profiled = profile_steps(train_step, profiled_steps, env.device)
        result["profile"] = {"steps": profiled_steps, "wall_ms_per_step": profiled["wall_ms_per_step"],
                             "kernel_ms_per_step": profiled["kernel_ms_per_step"],
                             "kernels_per_step": profiled["calls_per_step"], "rows": profiled["rows"][:30]}
    return result


def parse_cases(parser, flag: str, text: str, stages: set[str]) -> list[tuple[str, int, int]]:
    """`STAGE:BATCHxLEN,...` (or 'none') as (stage, batch, seq_len) cases; one error line for anything else."""
    wanted = [] if text in ("", "none") else text.split(",")
    try:
        cases = [(s, int(b), int(t)) for s, shape in (c.split(":") for c in wanted) for b, t in [shape.split("x")]]
    except ValueError:
        parser.error(f"{flag}: expected STAGE:BATCHxLEN items or 'none', got {text!r}")
    unknown = sorted({s for s, _, _ in cases} - stages)
    if unknown:
        parser.error(f"{flag}: stages {unknown} cannot run this way; choose from {sorted(stages)}")
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (checks the plumbing, times nothing)")
    parser.add_argument("--profile-steps", type=int, default=3,
                        help="also profile this many distillation steps at 4x4096 (kernels by device time; 0: no)")
    parser.add_argument("--compiled", default=",".join(f"{s}:{b}x{t}" for s, b, t in COMPILED),
                        help="cases to run again with compiled blocks, STAGE:BATCHxLEN comma list ('none': none)")
    parser.add_argument("--checkpointed", default=",".join(f"{s}:{b}x{t}" for s, b, t in CHECKPOINTED),
                        help="distill/finetune shapes to run with activation checkpointing, STAGE:BATCHxLEN comma "
                        "list ('none': none)")
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        print("error: probe.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    sizes = dict(SMOLLM2_135M, num_hidden_layers=24, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512) if args.smoke else SMOLLM2_135M
    teacher_hf = LlamaForCausalLM(LlamaConfig(**sizes)).eval()
    env = Distributed(device=torch.device("cpu" if args.smoke else "cuda"))
    smoke = (lambda case: (case[0], max(1, case[1] // 4), case[2] // 64)) if args.smoke else (lambda case: case)
    compiled = parse_cases(parser, "--compiled", args.compiled, {s for s, _, _ in CASES})
    checkpointed = parse_cases(parser, "--checkpointed", args.checkpointed, {"distill", "finetune"})
    runs = ([(case, False, False) for case in CASES] + [(case, True, False) for case in compiled]
            + [(case, False, True) for case in checkpointed])
    results = []
    device = torch.cuda.get_device_name() if env.device.type == "cuda" else "cpu"
    for case, with_compile, with_checkpoints in runs:
        stage, batch, seq_len = smoke(case)
        profiled = args.profile_steps if case == PROFILED and not (with_compile or with_checkpoints) else 0
        try:
            results.append(measure(stage, batch, seq_len, teacher_hf, env, args.steps, args.warmup, profiled,
                                   with_compile, with_checkpoints))
        except Exception as err:  # noqa: BLE001  (a compiled case may fail; the probe reports it and goes on)
            if not with_compile and not isinstance(err, torch.OutOfMemoryError):
                raise
            results.append({"stage": stage, "batch": batch, "seq_len": seq_len, "compiled": with_compile,
                            "checkpointed": with_checkpoints,
                            "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"})
            print(f"  {stage} {batch}x{seq_len}{' compiled' if with_compile else ''}"
                  f"{' checkpointed' if with_checkpoints else ''}: {results[-1]['error']}", flush=True)
            if env.device.type == "cuda":
                torch.cuda.empty_cache()
        write_json(Path(args.out), {"device": device, "torch": torch.__version__, "cases": results})
    print(f"{'stage':9s} {'shape':>9s} {'variant':>12s} {'tok/s':>9s} {'step s':>7s} {'first s':>8s} "
          f"{'peak GiB':>8s}")
    for r in results:
        variant = "compiled" if r["compiled"] else "checkpointed" if r.get("checkpointed") else "eager"
        if "error" in r:
            print(f"{r['stage']:9s} {r['batch']:>3d}x{r['seq_len']:<5d} {variant:>12s} {r['error']}")
            continue
        print(f"{r['stage']:9s} {r['batch']:>3d}x{r['seq_len']:<5d} {variant:>12s} "
              f"{r['tok_per_s']:9.0f} {r['median_step_s']:7.3f} {r['first_step_s']:8.1f} {r['peak_gib'] or 0:8.1f}")
    for r in results:
        if "profile" in r:
            p = r["profile"]
            kernels = "" if p["kernel_ms_per_step"] is None else f", kernels {p['kernel_ms_per_step']:.1f} ms"
            print(f"\nprofile of {r['stage']} {r['batch']}x{r['seq_len']}: wall {p['wall_ms_per_step']:.1f} ms/step"
                  f"{kernels}, {p['kernels_per_step']:.0f} kernels/step; top 15:")
            for row in p["rows"][:15]:
                print(f"  {row['us_per_step'] / 1e3:8.2f} ms  {row['calls_per_step']:6.0f}x  {row['name'][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
