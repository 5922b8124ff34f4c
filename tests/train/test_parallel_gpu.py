"""The data-parallel wrappers on CUDA, on one GPU (a process group of one over NCCL): the fast path (compiled blocks,
fused LM-head loss, fused AdamW, micro-batches) under DDP and FSDP2 follows the unwrapped fast path's loss curve, at
SmolLM2-135M's widths (6 layers). Several GPUs: `hyla bench data-parallel` (docs/results/multigpu.md)."""

import dataclasses
import os
import socket

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.train import SMOLLM2_135M, Case, _build, _fast_path
from hyla.compile import compile_blocks
from hyla.convert.presets import make_plan
from hyla.train.distributed import Distributed
from hyla.train.optim import OptimSettings, build_optimizer
from hyla.train.parallel import DataParallelChoice, data_parallel
from hyla.train.step import TrainStep

pytestmark = pytest.mark.gpu

STEPS = 10
# DDP on one process reduces nothing but runs the same products (compiled per bucket-sized piece): rounding order
# only. FSDP2 casts the weights to bf16 once per step where autocast casts them per product: the same values, and
# float32 gradient reduction. As in test_fast_path_gpu.py: ~1e-3 at the first step, ~1% drift over the curve.
FIRST_STEP_RTOL = 5e-3
CURVE_RTOL = 3e-2


@pytest.fixture(scope="module")
def one_process_group():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield Distributed(device=torch.device("cuda", 0))
    dist.destroy_process_group()


def loss_curve(case: Case, mode: str, env: Distributed, teacher, plan) -> list[float]:
    torch.manual_seed(0)
    fast, _ = _fast_path("fast-split-blocks", case.stage, env.device)
    fast = dataclasses.replace(fast, fused_loss=fast.fused_loss and case.stage != "align", micro_batch_size=2)
    built = _build(case, teacher, plan, (1, 4), fast.fused_loss, env.device)
    compile_blocks([*built.blocks, *built.frozen_blocks])
    built.model.train()
    parallel = data_parallel(built.model, built.loss_fn, built.blocks, DataParallelChoice(mode, "test", 1), env)
    budget = getattr(plan, case.stage)
    optim = OptimSettings(lr=budget.lr, min_lr=budget.min_lr, warmup_steps=1, schedule=budget.schedule)
    optimizer, scheduler = build_optimizer(built.model.parameters(), optim, STEPS, fused=True)
    step = TrainStep(built.model, parallel, optimizer, scheduler, optim, env, micro_batch_rows=fast.micro_batch_size,
                     sync=parallel.sync)
    generator = torch.Generator(device=env.device).manual_seed(0)
    losses = []
    for _ in range(STEPS):
        ids = torch.randint(0, teacher.config.vocab_size, (case.batch, case.seq_len + 1), device=env.device,
                            generator=generator)
        losses.append(step({"input_ids": ids[:, :-1], "labels": ids[:, 1:]}).loss)
    return losses


@pytest.mark.parametrize("case", [Case("align", 4, 512), Case("distill", 4, 1024)], ids=lambda case: case.stage)
def test_ddp_and_fsdp_follow_the_unwrapped_fast_path(one_process_group, case):
    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(**dict(SMOLLM2_135M, num_hidden_layers=6))).cuda().eval()
    plan = make_plan("quick", sum(p.numel() for p in teacher.parameters()))
    curves = {mode: torch.tensor(loss_curve(case, mode, one_process_group, teacher, plan), dtype=torch.float64)
              for mode in ("none", "ddp", "fsdp")}
    reference = curves["none"]
    for mode in ("ddp", "fsdp"):
        curve = curves[mode]
        assert torch.isfinite(curve).all(), mode
        assert abs(curve[0] - reference[0]) <= FIRST_STEP_RTOL * abs(reference[0]), mode
        assert ((curve - reference).abs() / reference.abs()).max() <= CURVE_RTOL, (mode, curves)
