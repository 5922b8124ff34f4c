"""The training step across processes, run by tests/train/test_parallel.py under torchrun (2 gloo processes): each
process writes what it saw to OUT/RANK.json. A tiny distillation pair in float64 with the fused loss.

Cases: `sync` (every data-parallel mode, one micro-batch and four: final weights, and under DDP how many gradient
buckets were all-reduced), `oom` (the automatic micro-batch when only process 1 runs out of memory), `skip` (a
non-finite loss on process 1 at step 2, without and with the divergence monitor), `resume` (every mode: a checkpoint
after step 1 restored into a fresh model and optimizer, then the remaining steps).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.convert.distill import StudentWithTeacher, build_student, distill_loss
from hyla.models.transfer import to_hypenet
from hyla.train.checkpoint import resume_checkpoint, save_checkpoint
from hyla.train.distributed import init_distributed
from hyla.train.divergence import DivergenceMonitor, TrainingDiverged
from hyla.train.optim import OptimSettings, build_optimizer
from hyla.train.parallel import DataParallelChoice, data_parallel
from hyla.train.step import TrainStep

VOCAB, ROWS, LENGTH, STEPS = 64, 8, 17, 3


def make_pair() -> StudentWithTeacher:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    teacher = LlamaForCausalLM(config).double().eval()
    student = build_student(teacher, [1], None, lightning_rope=True, lightning_qk_norm=True).double().train()
    return StudentWithTeacher(student, to_hypenet(teacher, attention_rope=True).double().eval())


def global_batch(step: int) -> dict:
    ids = torch.randint(0, VOCAB, (ROWS, LENGTH + 1), generator=torch.Generator().manual_seed(100 + step))
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


def local_rows(batch: dict, rank: int, world_size: int) -> dict:
    per = ROWS // world_size
    return {key: value[rank * per:(rank + 1) * per] for key, value in batch.items()}


def train(env, mode: str, loss_fn, *, micro_batch_rows=None, monitor: bool = False, hook=None,
          checkpoints: Path | None = None, save_at: int | None = None) -> dict:
    """STEPS steps of a fresh pair under `mode`: each step's outcome and the final trainable weights. With
    `checkpoints`: resume from the newest checkpoint there, and write one after step `save_at`."""
    pair = make_pair()
    parallel = data_parallel(pair, loss_fn, list(pair.student.model.layers),
                             DataParallelChoice(mode, "test", env.world_size), env)
    if hook is not None:
        parallel.wrapper.register_comm_hook(None, hook)
    settings = OptimSettings(lr=1e-2, warmup_steps=0, schedule="constant")
    optimizer, scheduler = build_optimizer(pair.parameters(), settings, STEPS)
    step = TrainStep(pair, parallel, optimizer, scheduler, settings, env, micro_batch_rows=micro_batch_rows,
                     log=lambda line: None, sync=parallel.sync)
    state = dict(model=pair, optimizer=optimizer, scheduler=scheduler, env=env)
    found = resume_checkpoint(checkpoints, **state) if checkpoints is not None else None
    checks = DivergenceMonitor(None, description="test")
    outcomes, stopped = [], None
    for index in range(found.step if found else 0, STEPS if save_at is None else save_at):
        batch = local_rows(global_batch(index), env.rank, env.world_size)
        try:
            outcome = step(batch, check=functools.partial(checks.check, index + 1) if monitor else None)
        except TrainingDiverged:
            stopped = index + 1
            break
        outcomes.append({"loss": outcome.loss, "grad_norm": outcome.grad_norm, "applied": outcome.applied,
                         "micro_batch_rows": outcome.micro_batch_rows})
    if save_at is not None:
        save_checkpoint(checkpoints, save_at, loader_state={}, meta={}, keep_last=1, **state)
    return {"outcomes": outcomes, "stopped_at": stopped, "weights": trainable_weights(pair)}


def trainable_weights(pair: StudentWithTeacher) -> list[float]:
    values = []
    for param in pair.parameters():
        if param.requires_grad:
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            values.extend(full.detach().flatten().tolist())
    return values


def counting_allreduce(calls: list):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(None, bucket)

    return hook


def nan_on_process_1_at_step_2(rank: int):
    calls = {"count": 0}

    def loss_fn(model, batch):
        calls["count"] += 1
        loss, metrics = distill_loss(model, batch, fused=True)
        return (loss * float("nan") if rank == 1 and calls["count"] == 2 else loss), metrics

    return loss_fn


def out_of_memory_on_process_1(rank: int):
    def loss_fn(model, batch):
        if rank == 1 and batch["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return distill_loss(model, batch, fused=True)

    return loss_fn


def main(out: Path) -> None:
    env = init_distributed("cpu")
    fused = functools.partial(distill_loss, fused=True)
    results: dict = {"sync": {}}
    for mode in ("ddp", "fsdp", "fsdp-no-reshard"):
        for rows in (4, 1):
            calls: list = []
            run = train(env, mode, fused, micro_batch_rows=rows,
                        hook=counting_allreduce(calls) if mode == "ddp" else None)
            results["sync"][f"{mode}/{rows}"] = {**run, "allreduce_calls": len(calls)}
    results["oom"] = train(env, "ddp", out_of_memory_on_process_1(env.rank))
    results["skip"] = train(env, "ddp", nan_on_process_1_at_step_2(env.rank), micro_batch_rows=4)
    results["stop"] = train(env, "ddp", nan_on_process_1_at_step_2(env.rank), micro_batch_rows=4, monitor=True)
    results["resume"] = {}
    for mode in ("ddp", "fsdp", "fsdp-no-reshard"):
        train(env, mode, fused, micro_batch_rows=4, checkpoints=out / mode, save_at=1)
        results["resume"][mode] = train(env, mode, fused, micro_batch_rows=4, checkpoints=out / mode)
    (out / f"{env.rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
