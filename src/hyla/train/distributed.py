"""The process group of a run: torchrun sets the environment, every process takes its rows of the global batch;
`hyla.train.parallel` replicates (DDP) or shards (FSDP2) the model from outside the model code. A single process runs
the same code with world size 1."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    # The processes' group (None: every process of the run); `rank` and `world_size` are within it.
    group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None, timeout: datetime.timedelta | None = None) -> Distributed:
    """Join the process group when started by torchrun (gloo on CPU, nccl on CUDA); otherwise a world of one.
    `timeout`: how long a collective may wait (None: torch's default, 10 minutes)."""
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Distributed(device=torch.device("cuda" if use_cuda else "cpu"))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", **({"timeout": timeout} if timeout else {}))
    return Distributed(rank, world_size, torch.device(f"cuda:{local_rank}" if use_cuda else "cpu"))


def all_reduce_mean(value: torch.Tensor, env: Distributed) -> torch.Tensor:
    if env.enabled:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=env.group)
        value /= env.world_size
    return value


def barrier(env: Distributed) -> None:
    if env.enabled:
        dist.barrier(group=env.group)


@contextlib.contextmanager
def exclusive_run_folder(folder: Path, env: Distributed) -> Iterator[None]:
    """One writer per run folder (`hyla.outputs.exclusive_folder`): the main process holds the lock and tells the
    others whether it got it, so that all stop together when another run holds it."""
    from hyla.outputs import FolderInUse, exclusive_folder

    with contextlib.ExitStack() as stack:
        error = None
        if env.is_main:
            try:
                stack.enter_context(exclusive_folder(folder))
            except ValueError as err:  # FolderInUse, or --out names a file
                error = str(err)
        error = from_main(error, env)
        if error:
            raise FolderInUse(error)
        yield


def from_main(value, env: Distributed):
    """The main process's `value` (a picklable object), on every process."""
    if not env.enabled:
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=dist.get_global_rank(env.group, 0) if env.group is not None else 0,
                               group=env.group)
    return shared[0]
