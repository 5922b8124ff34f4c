"""The training fast path: which of its parts a stage runs with, resolved from the stage's settings (None = the
default for the device) and printed at the stage's start. On CUDA everything is on by default; with every part off
the step is the eager reference path (the same model, loss formulas and update, unfused)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class FastPath:
    compile: bool  # torch.compile each block of the trained model and of its teacher
    fused_loss: bool  # the LM head fused with the loss in row chunks (hyla.ops.linear_loss): no [tokens, V] logits
    fused_optimizer: bool  # torch's fused AdamW
    micro_batch_size: int | None  # sequences per forward/backward pass; None: the most that fit
    # Lightning's chunk kernel called through the custom op `hyla::lightning_chunk`, which torch.compile keeps inside
    # a compiled block (one graph per block instead of pieces around fla's call), and with `compile` in stage 1 each
    # twin compiled with its loss (hyla.ops.lightning.chunk_kernel_as_custom_op). Same kernels.
    whole_blocks: bool = False
    # The fused KL's per-chunk arithmetic (stage 2, with `fused_loss`): "torch" (compiled torch) or "triton" (hyla's
    # kernel, `hyla.ops.linear_loss.gpu`: each logit read twice instead of three times; CUDA only).
    kl_kernel: str = "torch"
    # torch.compile's mode for the blocks ("default" or "max-autotune-no-cudagraphs"; stages 2-3).
    compile_mode: str = "default"
    # Stages 2-3: each softmax/Lightning mixer's q/k/v/output-gate maps and each MLP's gate/up maps as one product
    # (hyla.models.modeling.use_fused_projections), in the trained hybrid and its frozen teacher.
    fused_projections: bool = False
    # Stage 1 with `compile` and `whole_blocks` on one process: each twin's compiled step (its forward and backward
    # with its loss) replayed as CUDA graphs (torch.compile's mode "reduce-overhead"), one launch a graph instead of
    # one a kernel: the twins' part of the step is a few thousand small kernels, which a slow host cannot launch as
    # fast as the GPU runs them. CUDA only.
    cuda_graphs: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        def on(flag: bool) -> str:
            return "on" if flag else "off"

        micro = "the most that fit" if self.micro_batch_size is None else str(self.micro_batch_size)
        blocks = "off" if not self.compile else "whole (Lightning as a custom op)" if self.whole_blocks else "split"
        if self.compile and self.compile_mode != "default":
            blocks += f", mode {self.compile_mode}"
        kernel = f" (KL kernel {self.kl_kernel})" if self.fused_loss and self.kl_kernel != "torch" else ""
        projections = ", fused input projections" if self.fused_projections else ""
        projections += ", under CUDA graphs" if self.cuda_graphs else ""
        return (f"compiled blocks {blocks}{projections}, fused LM head + loss {on(self.fused_loss)}{kernel}, fused "
                f"AdamW {on(self.fused_optimizer)}, micro-batch {micro} sequences")


# torch.compile's modes for the compiled blocks (`FastPath.compile_mode`). The modes with CUDA graphs are left out: a
# step of stages 2-3 is GPU-bound, and stage 1 has its own setting (`FastPath.cuda_graphs`).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# Whether stages 2-3 fuse the input projections where their blocks are compiled, unless a plan says. Off: measured
# slower on an H200 (`hyla bench train --paths fast,fast-fused-projections`, docs/results/train-speed.md,
# 2026-12-06: distillation 237.6K against 243.7K tokens/s, fine-tuning 249.0K against 253.4K), though its loss
# curves follow the default's (tests/train/test_fast_path_gpu.py).
FUSED_PROJECTIONS_BY_DEFAULT = False
# Whether stage 1 replays its compiled twins as CUDA graphs on CUDA, unless a plan says (`FastPath.cuda_graphs`).
CUDA_GRAPHS_BY_DEFAULT = False
EAGER = FastPath(compile=False, fused_loss=False, fused_optimizer=False, micro_batch_size=None)


def resolve_fast_path(*, compile: bool | None, fused_loss: bool | None, fused_optimizer: bool | None,
                      micro_batch_size: int | None, device: torch.device,
                      whole_blocks: bool | None = None, kl_kernel: str | None = "torch",
                      compile_mode: str = "default", fused_projections: bool | None = False,
                      cuda_graphs: bool | None = False) -> FastPath:
    """The settings a stage runs with: each None becomes the device's default (on for CUDA, off on CPU, where
    compiling a step costs more than it saves; the fused loss is on on CPU too, it saves memory everywhere). Every
    part works under each data-parallel mode (`hyla.train.parallel`: the whole loss runs inside the wrapper's
    forward, where the LM head's weight is the gathered one under FSDP2). `whole_blocks` (None: on wherever the
    blocks are compiled; uncompiled, the custom op runs the same kernels eagerly): measured on an H200
    (docs/results/train-speed.md, 2026-12-03) the faster of the two in alignment and distillation. `kl_kernel` (the
    KL's, stage 2: pass "torch" for the other stages): see `check_kl_kernel`; None: "triton" on CUDA with the fused
    loss (measured faster on an H200 and its loss curve checked against torch's: docs/convert.md), else "torch".
    `fused_projections` (stages 2-3: pass False for stage 1): None: `FUSED_PROJECTIONS_BY_DEFAULT` wherever the
    blocks are compiled. `cuda_graphs` (stage 1: pass False for the others): see `check_cuda_graphs`; None: off
    (`CUDA_GRAPHS_BY_DEFAULT`)."""
    cuda = device.type == "cuda"
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1 (or unset: the most that fit), got {micro_batch_size}")
    compile = cuda if compile is None else compile
    fused_loss = True if fused_loss is None else fused_loss
    if kl_kernel is None:
        kl_kernel = "triton" if cuda and fused_loss else "torch"
    check_kl_kernel(kl_kernel, fused_loss=fused_loss, device=device)
    if compile_mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {compile_mode!r}")
    whole_blocks = compile if whole_blocks is None else whole_blocks
    if cuda_graphs is None:
        cuda_graphs = CUDA_GRAPHS_BY_DEFAULT and cuda and compile and whole_blocks
    check_cuda_graphs(cuda_graphs, compile=compile, whole_blocks=whole_blocks, device=device)
    return FastPath(
        compile=compile,
        fused_loss=fused_loss,
        fused_optimizer=cuda if fused_optimizer is None else fused_optimizer,
        micro_batch_size=micro_batch_size,
        whole_blocks=whole_blocks,
        kl_kernel=kl_kernel,
        compile_mode=compile_mode,
        fused_projections=(FUSED_PROJECTIONS_BY_DEFAULT and compile) if fused_projections is None
        else fused_projections,
        cuda_graphs=cuda_graphs,
    )


def check_cuda_graphs(cuda_graphs: bool, *, compile: bool, whole_blocks: bool, device: torch.device | None = None,
                      setting: str = "align.cuda_graphs") -> None:
    """ValueError unless `cuda_graphs` can be on: the graphs are those of the compiled twins with their losses
    (`compile` and `whole_blocks`), on CUDA (`device`, None: unchecked)."""
    if not cuda_graphs:
        return
    if device is not None and device.type != "cuda":
        raise ValueError(f"{setting}=true runs on CUDA, and this device is {device.type}; leave {setting} unset")
    if not (compile and whole_blocks):
        raise ValueError(f"{setting}=true replays the compiled twins with their losses, and compile or whole_blocks "
                         f"is off here; leave {setting} unset")


def resolve_bf16_activations(bf16_activations: bool | None, device: torch.device) -> bool:
    """Whether stages 2-3 train the hybrid with its activations in bf16 (`StageBudget.bf16_activations`; None: on
    CUDA, where the stages run under bf16 autocast, and off on CPU, which trains without it: nothing would change). A
    setting of the stage's result, as the teacher's precision is: the eager reference path trains with the same."""
    return device.type == "cuda" if bf16_activations is None else bf16_activations


def check_kl_kernel(kl_kernel: str, *, fused_loss: bool = True, device: torch.device | None = None,
                    setting: str = "kl_kernel") -> None:
    """ValueError unless `kl_kernel` is one of the fused KL's kernels (`hyla.ops.linear_loss.KL_KERNELS`) that can
    run here: "triton" is a kernel of the fused loss (`fused_loss`) and runs on CUDA (`device`, None: unchecked)."""
    from hyla.ops.linear_loss import KL_KERNELS

    if kl_kernel not in KL_KERNELS:
        raise ValueError(f"{setting}: unknown KL kernel {kl_kernel!r}; choose one of {', '.join(KL_KERNELS)}")
    if kl_kernel == "torch":
        return
    if not fused_loss:
        raise ValueError(f"{setting}={kl_kernel} is a kernel of the fused LM head + loss, which is off here (the "
                         f"unfused loss takes the whole logits); leave {setting} at torch")
    if device is not None and device.type != "cuda":
        raise ValueError(f"{setting}={kl_kernel} runs on CUDA, and this device is {device.type}; leave {setting} at "
                         f"torch")


def resolve_teacher_bf16(teacher_bf16: bool | None, device: torch.device) -> bool:
    """Whether a stage's frozen teacher is held in bf16 (`StageBudget.teacher_bf16`; None: on CUDA, where the
    stages run under bf16 autocast anyway, and off on CPU). A setting of the stage's result, not of its speed: the
    eager reference path reads the same teacher."""
    return device.type == "cuda" if teacher_bf16 is None else teacher_bf16
