"""Data parallelism under torchrun, chosen for the model's size.

DDP keeps a whole replica on every process and all-reduces the gradients in 25 MB buckets during the backward pass,
overlapped with the gradients still being computed; the forward pass communicates nothing. FSDP2 (`fully_shard` per
block, then the root) holds a 1/N shard of the weights, gradients and optimizer state, and gathers each block's
weights before its forward and again before its backward, reduce-scattering its gradients: three collectives a block
and a step, the forward's on the critical path, each small for a small model (a SmolLM2-135M block is 3.5M
parameters), where latency rather than bandwidth sets their cost. A 140M model on two H200s ran at 0.84x one GPU's
tokens/s under FSDP2 (docs/results/multigpu.md). So DDP is used whenever the replica fits one device with room to
spare, FSDP2 when not:

    replica bytes = 16 x trainable parameters (float32 weight, gradient, AdamW's two moments) + the frozen weights
    DDP if replica bytes <= DDP_MEMORY_SHARE (1/2) of the device's memory, else FSDP2

The other half is left for activations (which the micro-batches scale down, the replica does not), the caching
allocator's slack, compile workspaces and communication buffers. `fsdp-no-reshard` (FSDP2 keeping each block's
gathered weights from its forward to its backward: one gather a step instead of two, the full weights held) is
there to be asked for.

Whatever the mode, the loss function runs inside the wrapper's forward (`ParallelLoss`), so everything it touches,
the LM head's weight in a fused loss included, is the wrapped model's.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass

import torch
from torch import nn

from hyla.train.distributed import Distributed
from hyla.train.step import GradientSync

MODES = ("auto", "ddp", "fsdp", "fsdp-no-reshard")
# float32 weight, float32 gradient, AdamW's two float32 moments.
TRAINABLE_BYTES_PER_PARAM = 16
DDP_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class DataParallelChoice:
    mode: str  # none (one process), ddp, fsdp, fsdp-no-reshard
    reason: str
    world_size: int = 1
    replica_bytes: int | None = None
    device_bytes: int | None = None

    def describe(self) -> str:
        return f"{self.mode} ({self.reason})"

    def as_dict(self) -> dict:
        return asdict(self)


def _size(count: float) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def replica_bytes(model: nn.Module, frozen: Iterable[nn.Module] = ()) -> int:
    """What one process holds of the model under DDP: 16 bytes per trainable parameter, the frozen parameters at
    their size (those of `model` and of `frozen`, a teacher outside its state, say; shared tensors once)."""
    seen, total = set(), 0
    for module in (model, *frozen):
        for param in module.parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            total += param.numel() * (TRAINABLE_BYTES_PER_PARAM if param.requires_grad else param.element_size())
    return total


def device_memory_bytes(device: torch.device) -> int:
    """The memory one process may count on: the GPU's, or on CPU the host's shared by its processes."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, processes)


def choose_data_parallel(requested: str, *, world_size: int, replica: int, device_memory: int) -> DataParallelChoice:
    """The mode for a run of `world_size` processes whose replica takes `replica` bytes on devices of
    `device_memory` bytes (the module docstring's rule); `requested` other than auto is taken as it is."""
    if requested not in MODES:
        raise ValueError(f"data_parallel {requested!r} must be one of {', '.join(MODES)}")
    sizes = dict(world_size=world_size, replica_bytes=replica, device_bytes=device_memory)
    if world_size == 1:
        return DataParallelChoice("none", "one process", **sizes)
    if requested != "auto":
        return DataParallelChoice(requested, f"data_parallel={requested}", **sizes)
    limit = DDP_MEMORY_SHARE * device_memory
    share = f"{_size(replica)} of weights, gradients and optimizer state per process"
    if replica <= limit:
        return DataParallelChoice("ddp", f"auto: {share} <= {DDP_MEMORY_SHARE:.0%} of the device's "
                                         f"{_size(device_memory)}: a replica per process", **sizes)
    return DataParallelChoice("fsdp", f"auto: {share} > {DDP_MEMORY_SHARE:.0%} of the device's "
                                      f"{_size(device_memory)}: sharded", **sizes)


class _LossModule(nn.Module):
    """The model and its loss as one module, so that the data-parallel wrapper's forward runs the whole loss."""

    def __init__(self, model: nn.Module, loss_fn: Callable):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, batch: dict):
        return self.loss_fn(self.model, batch)


class ParallelLoss:
    """`loss_fn(model, batch)` through the data-parallel wrapper of `model`, and `sync`: how the training step
    defers the gradients' synchronisation over micro-batches (`hyla.train.step.GradientSync`)."""

    def __init__(self, model: nn.Module, loss_fn: Callable, wrapper: nn.Module | None = None,
                 sync: GradientSync = GradientSync()):
        self.model, self.loss_fn, self.wrapper, self.sync = model, loss_fn, wrapper, sync

    def __call__(self, model: nn.Module, batch: dict):
        assert model is self.model, "the loss is called with the model it wraps"
        if self.wrapper is None:
            return self.loss_fn(model, batch)
        return self.wrapper(batch)


def data_parallel(model: nn.Module, loss_fn: Callable, blocks: list[nn.Module], choice: DataParallelChoice,
                  env: Distributed) -> ParallelLoss:
    """Wrap `model` (in place for FSDP2) for `choice.mode`; `blocks` are FSDP2's units. The model's parameters stay
    the ones the optimizer and the checkpoints use (DTensors under FSDP2)."""
    if choice.mode == "none":
        return ParallelLoss(model, loss_fn)
    module = _LossModule(model, loss_fn)
    if choice.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Buffers are constants here (RoPE frequencies): no broadcast before every forward (torch 2.13 renamed the
        # option). The gradients are views of DDP's buckets: no second copy of them.
        no_buffer_sync = ({"forward_sync_buffers": False}
                          if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                          else {"broadcast_buffers": False})
        wrapper = DistributedDataParallel(
            module, device_ids=[env.device.index] if env.device.type == "cuda" else None, process_group=env.group,
            gradient_as_bucket_view=True, **no_buffer_sync)
        return ParallelLoss(model, loss_fn, wrapper, GradientSync(wrapper.no_sync, collective_free=True))
    reshard = choice.mode == "fsdp"
    _fully_shard(module, blocks, env, reshard_after_forward=reshard)
    # Full sharding exists to save memory, and skipping the reduce-scatter would keep every block's unsharded
    # gradient until the last micro-batch: there each micro-batch reduces its own.
    return ParallelLoss(model, loss_fn, module, GradientSync(None if reshard else _without_gradient_sync(module)))


def _without_gradient_sync(module: nn.Module) -> Callable[[], contextlib.AbstractContextManager]:
    """FSDP2's counterpart of DDP's no_sync: the gradients accumulate unsharded until a micro-batch reduces them."""

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return no_sync


def _fully_shard(root: nn.Module, blocks: list[nn.Module], env: Distributed, *, reshard_after_forward: bool) -> None:
    """FSDP2: each block, then the root (embeddings, final norm, head); bf16 compute with float32 gradient reduction
    on CUDA."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict = {"reshard_after_forward": reshard_after_forward}
    if env.device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if env.group is not None:
        from torch.distributed.device_mesh import DeviceMesh

        kwargs["mesh"] = DeviceMesh.from_group(env.group, env.device.type)
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(root, **kwargs)
