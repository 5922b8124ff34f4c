"""`hyla bench data-parallel`: the conversion's training steps under torchrun, timed on 1, 2, 4, ... of the run's
GPUs in one run, at the same batch per GPU (weak scaling), in each data-parallel mode: tokens/s over all the GPUs
used, the speed-up over one GPU and its share of the ideal, and each measurement's loss curve.

Every process joins the run; for a world of n GPUs the first n processes train in a process group of their own while
the others wait at a barrier. Each measurement builds its stage's modules as `hyla bench train` does (the SmolLM2-135M
shape with random weights unless a teacher is given), resolves the fast path for the device, compiles, wraps the model
in the mode (`hyla.train.parallel`) and times the training loop's own step (`TrainStep`: micro-batches under no_sync,
the one host read) on random tokens. Each process draws its own rows from a generator seeded by its rank, so a world
of n trains on the rows of the world of n/2 and as many again.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hyla.bench.train import Case, _attention_layers, _build, _fast_path, _sync, _teacher, path_bf16_activations

STAGES = ("align", "distill")
# Per GPU: the alignment at its default shape; the distillation at the 16 x 512 rows per GPU of the measurement in
# docs/results/multigpu.md (where FSDP2 on two GPUs ran at 0.84x one) and at the long shape of `hyla bench train`.
DEFAULT_CASES = (Case("align", 64, 512), Case("distill", 16, 512), Case("distill", 16, 4096))
TOY_CASES = (Case("align", 2, 64), Case("distill", 2, 128))
MODES = ("ddp", "fsdp", "fsdp-no-reshard")


@dataclass(frozen=True)
class ParallelBenchSettings:
    teacher: str | None = None  # a teacher spec; None: the SmolLM2-135M shape with random weights
    attention_layers: tuple[int, ...] | None = None  # None: SmolLM2's HALO choice, or every fourth layer
    cases: tuple[Case, ...] = DEFAULT_CASES  # batch per GPU
    worlds: tuple[int, ...] = (1, 2, 4, 8)  # GPU counts measured; those above the run's process count are skipped
    modes: tuple[str, ...] = ("ddp", "fsdp")
    path: str = "fast"  # the training path of every measurement: fast (the device's default) or eager
    steps: int = 10
    warmup: int = 3
    toy: bool = False  # tiny sizes, for CPU
    device: str = "cuda"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError("steps must be >= 1 and warmup >= 0")
        if not self.worlds or any(n < 1 for n in self.worlds) or 1 not in self.worlds:
            raise ValueError(f"worlds must be GPU counts >= 1 including 1 (the baseline), got {self.worlds}")
        bad_modes = [mode for mode in self.modes if mode not in MODES]
        if bad_modes or not self.modes:
            raise ValueError(f"modes must be some of {', '.join(MODES)}, got {', '.join(self.modes) or 'none'}")
        bad_stages = [case.label for case in self.cases if case.stage not in STAGES]
        if bad_stages:
            raise ValueError(f"cases must be of the stages {', '.join(STAGES)}, got {', '.join(bad_stages)}")
        if self.path not in ("fast", "eager"):
            raise ValueError(f"path must be fast or eager, got {self.path!r}")


def _group_env(n: int, groups: dict, device: torch.device):
    """This process's place in the world of the first `n` processes (None when it is not one of them)."""
    from hyla.train.distributed import Distributed

    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank >= n:
        return None
    if n == 1:
        return Distributed(device=device)
    return Distributed(rank=rank, world_size=n, device=device, group=groups[n])


def measure(case: Case, mode: str, env, hf_teacher, plan, attention_layers, settings: ParallelBenchSettings) -> dict:
    """Time `settings.steps` steps of `case` (rows per GPU) on `env`'s processes under `mode` after
    `settings.warmup` (the first compiles), on the path's settings as `hyla convert` resolves them (`fast`: on CUDA
    Lightning's kernel inside the compiled blocks and the bf16 teacher); returns what the main process measured."""
    from hyla.ops.lightning import chunk_kernel_as_custom_op

    fast, teacher_bf16 = _fast_path(settings.path, case.stage, env.device)
    with chunk_kernel_as_custom_op(fast.whole_blocks):
        return _measure(case, mode, env, hf_teacher, plan, attention_layers, settings, fast, teacher_bf16)


def _measure(case: Case, mode: str, env, hf_teacher, plan, attention_layers, settings: ParallelBenchSettings,
             fast, teacher_bf16: bool) -> dict:
    from hyla.bench.timing import peak_memory_gib, reset_peak_memory
    from hyla.compile import compile_blocks
    from hyla.train.optim import OptimSettings, build_optimizer
    from hyla.train.parallel import DataParallelChoice, data_parallel
    from hyla.train.step import TrainStep

    device = env.device
    reset_peak_memory(device)
    torch.manual_seed(settings.seed)  # every world starts from the same weights
    if case.stage == "align":
        fast = dataclasses.replace(fast, fused_loss=False)  # no LM head in stage 1
    bf16_activations = path_bf16_activations(settings.path, case.stage, device)
    built = _build(case, hf_teacher, plan, attention_layers, fast.fused_loss, device, teacher_bf16=teacher_bf16,
                   bf16_activations=bf16_activations, kl_kernel=fast.kl_kernel)
    if fast.compile:
        compile_blocks([*built.blocks, *built.frozen_blocks])
    built.model.train()
    choice = DataParallelChoice(mode if env.enabled else "none", "hyla bench data-parallel", env.world_size)
    parallel = data_parallel(built.model, built.loss_fn, built.blocks, choice, env)
    budget = getattr(plan, case.stage)
    optim = OptimSettings(lr=budget.lr, min_lr=budget.min_lr, warmup_steps=min(budget.warmup_steps, 1),
                          schedule=budget.schedule)
    optimizer, scheduler = build_optimizer(built.model.parameters(), optim, settings.warmup + settings.steps,
                                           fused=fast.fused_optimizer)
    step = TrainStep(built.model, parallel, optimizer, scheduler, optim, env, micro_batch_rows=fast.micro_batch_size,
                     log=lambda line: print(f"  {case.label} x{env.world_size} {mode}: {line}"), sync=parallel.sync)
    vocab = hf_teacher.config.vocab_size
    generator = torch.Generator(device=device).manual_seed(settings.seed * 1000 + env.rank)
    times, losses = [], []
    for index in range(settings.warmup + settings.steps):
        ids = torch.randint(0, vocab, (case.batch, case.seq_len + 1), device=device, generator=generator)
        _sync(device)
        started = time.perf_counter()
        outcome = step({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})
        _sync(device)
        times.append(time.perf_counter() - started)
        losses.append(outcome.loss)
        if env.is_main:
            print(f"  {case.label} x{env.world_size} {choice.mode} step {index + 1}: {times[-1]:.3f} s, loss "
                  f"{outcome.loss:.4f}", flush=True)
    peak = _max_over_processes(peak_memory_gib(device), env)
    median = statistics.median(times[settings.warmup:])
    tokens = env.world_size * case.batch * case.seq_len
    return {"stage": case.stage, "batch_per_gpu": case.batch, "seq_len": case.seq_len, "world_size": env.world_size,
            "mode": choice.mode, "fast_path": fast.as_dict(), "teacher_bf16": teacher_bf16,
            "bf16_activations": bf16_activations, "micro_batch_rows_used": step.micro_batch_rows,
            "median_step_s": median, "step_s": times, "first_step_s": times[0], "tokens_per_step": tokens,
            "tok_per_s": tokens / median, "tok_per_s_per_gpu": tokens / median / env.world_size, "losses": losses,
            "peak_gib": peak}


def _max_over_processes(value: float | None, env) -> float | None:
    if value is None or not env.enabled:
        return value
    shared = torch.tensor([value], device=env.device)
    dist.all_reduce(shared, op=dist.ReduceOp.MAX, group=env.group)
    return shared.item()


def auto_choice(case: Case, hf_teacher, plan, attention_layers, device: torch.device, world_size: int) -> dict:
    """What `data_parallel=auto` picks for `case`'s model on this device at `world_size` GPUs."""
    from hyla.train.parallel import choose_data_parallel, device_memory_bytes, replica_bytes

    built = _build(case, hf_teacher, plan, attention_layers, False, device)
    choice = choose_data_parallel("auto", world_size=max(2, world_size), device_memory=device_memory_bytes(device),
                                  replica=replica_bytes(built.model, built.model.teacher))
    return choice.as_dict()


def add_scaling(results: dict) -> None:
    """Each measurement's speed-up over the same case on one GPU, and that as a share of the ideal (n x)."""
    for row in results["measurements"]:
        if "tok_per_s" not in row:
            continue
        base = next((other for other in results["measurements"] if other["world_size"] == 1
                     and other["stage"] == row["stage"] and other["batch_per_gpu"] == row["batch_per_gpu"]
                     and other["seq_len"] == row["seq_len"] and "tok_per_s" in other), None)
        if base is not None:
            row["speedup"] = row["tok_per_s"] / base["tok_per_s"]
            row["scaling_efficiency"] = row["speedup"] / row["world_size"]


def run_parallel_bench(settings: ParallelBenchSettings, save=lambda results: None) -> dict:
    """Every case on every world (one GPU first) in every mode; `save(results)` on the main process after each
    measurement, so that a run cut short keeps what it measured."""
    from hyla.convert.presets import make_plan
    from hyla.train.distributed import init_distributed

    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("hyla bench data-parallel: no CUDA device here; use --device cpu (with --toy)")
    # One measurement on the first GPU can outlast the default 10-minute collective timeout of the processes
    # waiting for it (compilation on a fresh machine).
    run_env = init_distributed(settings.device, timeout=datetime.timedelta(hours=1))
    worlds = sorted(n for n in set(settings.worlds) if n <= run_env.world_size)
    skipped = sorted(n for n in set(settings.worlds) if n > run_env.world_size)
    # Every process creates every group, in the same order, members or not.
    groups = {n: dist.new_group(list(range(n))) for n in worlds if n > 1}
    hf_teacher = _teacher(settings, run_env.device)
    attention_layers = _attention_layers(settings, hf_teacher.config.num_hidden_layers)
    plan = make_plan("quick", sum(p.numel() for p in hf_teacher.parameters()))
    results = {"settings": {**dataclasses.asdict(settings), "attention_layers": list(attention_layers)},
               "processes": run_env.world_size, "worlds": worlds, "worlds_skipped": skipped,
               "teacher": {"spec": settings.teacher or ("toy" if settings.toy else "smollm2-135m shape, random"),
                           "num_params": sum(p.numel() for p in hf_teacher.parameters())},
               "auto": {}, "measurements": []}
    for case in settings.cases:
        results["auto"][case.label] = auto_choice(case, hf_teacher, plan, attention_layers, run_env.device,
                                                  run_env.world_size)
        for n in worlds:
            for mode in settings.modes if n > 1 else ("none",):
                env = _group_env(n, groups, run_env.device)
                if env is not None:
                    if env.is_main:
                        print(f"{case.label} per GPU, {n} GPU{'s' if n > 1 else ''}, {mode}", flush=True)
                    results["measurements"].append(_measured(case, mode, env, hf_teacher, plan,
                                                             attention_layers, settings))
                _release(run_env)
                if run_env.is_main:
                    add_scaling(results)
                    save(results)
    return results


def _measured(case, mode, env, hf_teacher, plan, attention_layers, settings) -> dict:
    try:
        return measure(case, mode, env, hf_teacher, plan, attention_layers, settings)
    except torch.OutOfMemoryError as err:
        return {"stage": case.stage, "batch_per_gpu": case.batch, "seq_len": case.seq_len,
                "world_size": env.world_size, "mode": mode, "error": f"out of memory: {str(err).splitlines()[0]}"}


def _release(run_env) -> None:
    """Free one measurement's modules before the next, and line every process up."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if run_env.enabled:
        dist.barrier()
