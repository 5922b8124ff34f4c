"""`hyla bench train`: the conversion's training steps timed as `hyla convert` runs them, the eager reference path
and the fast default side by side in one run.

Each case builds its stage's real modules (stage 1: `AlignmentTwins` + the loss `hyla convert` chooses,
`choose_alignment_path`; stage 2: the hybrid and the teacher-equivalent + `distill_loss`; stage 3: the hybrid +
`finetune_loss`), resolves the fast path as a stage does (`hyla.train.fast`), compiles what a stage compiles, and
times the training loop's own step (`TrainStep`: micro-batches, clipping, AdamW, one host read) on random tokens.
Weights are random unless a teacher is given: speed depends on shapes, not values. The twins and the hybrid's layers
outside attention are Lightning, GLA or GDN (`rnn_mixer`, hyla convert's `model.rnn_mixer`). Reported per case and
path: tokens/s (median step), model FLOPs per token (counted from the shapes: `training_flops_per_token`), the FLOP
rate and MFU, peak memory, the first step's time (compilation), and for the fast path the top kernels of one
profiled step. A second table times the LM-head losses alone at the distillation shape (materialised logits, hyla's
chunked fused loss, and flash-linear-attention's fused KL / cross-entropy where installed): the measurement behind
the fused loss's default.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from hyla.bench.floors import LIGHTNING_CHUNK
from hyla.bench.shapes import parse_case

STAGES = ("align", "distill", "finetune")


class PathSettings(NamedTuple):
    """A path's stage settings; None = the stage's default on the device, as `hyla convert` resolves it
    (hyla.train.fast: on CUDA whole blocks and the bf16 teacher)."""

    whole_blocks: bool | None
    teacher_bf16: bool | None
    batched_twins: bool = False
    bf16_activations: bool | None = None  # distill/finetune.bf16_activations (None: the device's default, bf16 on CUDA)
    kl_kernel: str | None = None  # distill.kl_kernel (None: the device's default, triton on CUDA)
    compile_mode: str = "default"  # distill.compile_mode, finetune.compile_mode
    fused_projections: bool | None = None  # distill/finetune.fused_projections (None: the device's default)
    cuda_graphs: bool | None = None  # align.cuda_graphs (None: the device's default)


# `eager` is the reference: every fast-path part off, the default teacher and activations (the stage's result
# settings, bf16 on CUDA since 2026-12-06: both paths train the same model). The named variants pin their settings,
# and otherwise run the default's activations:
# fast-split-blocks: Lightning's fla call outside the compiled graphs (each block compiled in five pieces), the
#   float32 teacher under autocast (the fast path until 2026-12-03).
# fast-bf16-teacher: split blocks, the frozen teacher in bf16 (align.teacher_bf16, distill.teacher_bf16).
# fast-whole-blocks: Lightning's chunk kernel through the custom op that torch.compile keeps inside a compiled block
#   (hyla.ops.lightning.chunk_kernel_as_custom_op), one graph per block; in stage 1 each twin compiled with its loss
#   (`choose_alignment_path(whole_twins=True)`); the float32 teacher. fast-whole-blocks-bf16-teacher: and the bf16
#   teacher (the default on CUDA).
# fast-batched[-bf16-teacher]: stage 1's batched twins (align.batched_twins); align cases only.
# fast-bf16-activations: the default on CUDA (whole blocks, bf16 teacher) with the trained hybrid's activations in
#   bf16 (distill.bf16_activations, finetune.bf16_activations: the default on CUDA since 2026-12-06);
#   fast-fp32-activations: the same with its residual stream and norm outputs in float32 (the default before);
#   distill and finetune cases only.
# fast-triton-kl: whole blocks, the bf16 teacher and the fused KL's chunks through hyla's Triton kernel
#   (distill.kl_kernel=triton: the default on CUDA since 2026-12-06); fast-bf16-activations-triton-kl: and the bf16
#   activations; fast-torch-kl: the KL's chunks in compiled torch (distill.kl_kernel=torch: the default on CUDA
#   before); distill cases only, the first two on CUDA only.
# fast-max-autotune: the default on CUDA with the blocks compiled in mode max-autotune-no-cudagraphs
#   (distill.compile_mode, finetune.compile_mode); fast-bf16-activations-triton-kl-max-autotune: every candidate
#   together (in distillation; the KL's kernel is stage 2's); distill and finetune cases only.
# fast-fused-projections: the default on CUDA with each mixer's q/k/v/output-gate maps and each MLP's gate/up maps as
#   one product in the hybrid and its teacher (distill.fused_projections, finetune.fused_projections);
#   fast-bf16-activations-fused-projections: and the bf16 activations; distill and finetune cases only.
# fast-cuda-graphs: the default on CUDA with stage 1's compiled twins replayed as CUDA graphs (align.cuda_graphs);
#   align cases only, on CUDA.
PATH_SETTINGS = {
    "eager": PathSettings(False, None),
    "fast": PathSettings(None, None),
    "fast-split-blocks": PathSettings(False, False),
    "fast-bf16-teacher": PathSettings(False, True),
    "fast-whole-blocks": PathSettings(True, False),
    "fast-whole-blocks-bf16-teacher": PathSettings(True, True),
    "fast-batched": PathSettings(False, False, batched_twins=True),
    "fast-batched-bf16-teacher": PathSettings(False, True, batched_twins=True),
    "fast-bf16-activations": PathSettings(True, True, bf16_activations=True),
    "fast-fp32-activations": PathSettings(True, True, bf16_activations=False),
    "fast-triton-kl": PathSettings(True, True, kl_kernel="triton"),
    "fast-torch-kl": PathSettings(True, True, kl_kernel="torch"),
    "fast-bf16-activations-triton-kl": PathSettings(True, True, bf16_activations=True, kl_kernel="triton"),
    "fast-max-autotune": PathSettings(True, True, compile_mode="max-autotune-no-cudagraphs"),
    "fast-bf16-activations-triton-kl-max-autotune": PathSettings(True, True, bf16_activations=True, kl_kernel="triton",
                                                                 compile_mode="max-autotune-no-cudagraphs"),
    "fast-fused-projections": PathSettings(True, True, fused_projections=True),
    "fast-bf16-activations-fused-projections": PathSettings(True, True, bf16_activations=True, fused_projections=True),
    "fast-cuda-graphs": PathSettings(True, True, cuda_graphs=True),
}
PATHS = tuple(PATH_SETTINGS)
BATCHED_PATHS = tuple(path for path, settings in PATH_SETTINGS.items() if settings.batched_twins)
TEACHER_STAGES = ("align", "distill")
HYBRID_STAGES = ("distill", "finetune")  # the stages that train the whole hybrid


def path_measures_stage(path: str, stage: str) -> bool:
    """Whether `path` is timed in `stage`: the batched twins are stage 1's; the bf16 activations the hybrid's (stages
    2-3); the KL's kernel stage 2's; a bf16 teacher by name needs a teacher (stages 1-2: a float32 one pinned is no
    teacher in stage 3 either)."""
    settings = PATH_SETTINGS[path]
    if settings.cuda_graphs is not None:
        return stage == "align"
    if settings.kl_kernel is not None:
        return stage == "distill"
    if settings.compile_mode != "default" or settings.fused_projections:
        return stage in HYBRID_STAGES
    if settings.batched_twins:
        return stage == "align"
    if settings.bf16_activations is not None:
        return stage in HYBRID_STAGES
    return stage in TEACHER_STAGES or not settings.teacher_bf16


# SmolLM2-135M's sizes (its GGUF / HF config) and the attention layers HALO chose for it.
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)
SMOLLM2_ATTENTION_LAYERS = (0, 1, 7, 16, 18, 19, 23)
TOY = dict(SMOLLM2_135M, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
           num_attention_heads=4, num_key_value_heads=2)
# Dense bf16 matrix rate by the vendor's datasheet, by device name: MFU's denominator.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
# The targets of a fast path at the SmolLM2-135M shape on one H200 (stage: minimum tokens/s).
TARGETS = {"align": 500e3, "distill": 250e3, "finetune": 200e3}
DISTILL_MEMORY_TARGET_GIB = 60.0  # distillation with 64K tokens a step


@dataclass(frozen=True)
class Case:
    stage: str
    batch: int
    seq_len: int

    @property
    def label(self) -> str:
        return f"{self.stage} {self.batch}x{self.seq_len}"

    @classmethod
    def parse(cls, text: str) -> Case:
        """`STAGE:BATCHxLEN`, e.g. `distill:16x4096`."""
        return cls(*parse_case(text, STAGES, what="stage", example="distill:16x4096", min_length=2))


# The mixers whose twins stages 1-2 train (`model.rnn_mixer`; SWA twins are the teacher's attention: nothing to time).
TRAINED_MIXERS = ("lightning", "gla", "gdn")
# Each stage at the halo-smollm2 recipe's shape (hyla.convert.recipes).
DEFAULT_CASES = (Case("align", 128, 512), Case("distill", 16, 4096), Case("finetune", 4, 16384))


@dataclass(frozen=True)
class TrainBenchSettings:
    teacher: str | None = None  # a teacher spec; None: the SmolLM2-135M shape with random weights
    cases: tuple[Case, ...] = DEFAULT_CASES
    paths: tuple[str, ...] = PATHS
    attention_layers: tuple[int, ...] | None = None  # None: SmolLM2's HALO choice, or every fourth layer
    steps: int = 8
    warmup: int = 3
    profile: bool = True  # one profiled step of each fast case
    losses: bool = True  # the LM-head losses alone at the distillation case's shape
    toy: bool = False  # tiny sizes, for CPU
    device: str = "cuda"
    seed: int = 0
    rnn_mixer: str = "lightning"  # the mixer of the twins and of the hybrid's other layers (`model.rnn_mixer`)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise ValueError("steps must be >= 1 and warmup >= 0")
        if self.rnn_mixer not in TRAINED_MIXERS:
            raise ValueError(f"rnn_mixer must be one of {', '.join(TRAINED_MIXERS)}, got {self.rnn_mixer!r}")
        if not self.paths:
            raise ValueError(f"no path given; choose some of {', '.join(PATHS)}")
        unknown = [path for path in self.paths if path not in PATHS]
        if unknown:
            raise ValueError(f"unknown path{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; choose among "
                             f"{', '.join(PATHS)}")


def training_flops_per_token(stage: str, trained, seq_len: int, teacher=None) -> dict[str, float]:
    """Model FLOPs per token of one training step, counted from the shapes: 2 per matrix parameter per token
    forward, twice that backward (the trained model three times, a frozen teacher's forward once); causal softmax
    attention 2 T H D per token and layer forward (QK^T and PV over the lower triangle), Lightning's chunked form
    4 C D + 4 D^2 per token and head; the LM head's product for every token; embedding lookups free. Stage 1 trains
    each layer's twin on the teacher's recorded input: the teacher's decoder forward (no head) and every twin
    forward and backward, where the maps that read the recorded input need no gradient for it (two FLOPs per
    parameter and token fewer). Recomputation (activation checkpointing) is not counted: these are model FLOPs."""
    if stage == "align":
        teacher_forward = _forward_flops_per_token(teacher, seq_len, head=False)
        twins = sum(3 * _mixer_forward_flops(twin, seq_len) - 2.0 * _input_side_params(twin) for twin in trained.twins)
        return {"trained": twins, "teacher": teacher_forward, "total": twins + teacher_forward}
    trained_flops = 3 * _forward_flops_per_token(trained, seq_len, head=True)
    teacher_flops = _forward_flops_per_token(teacher, seq_len, head=True) if teacher is not None else 0.0
    return {"trained": trained_flops, "teacher": teacher_flops, "total": trained_flops + teacher_flops}


def _linear_params(module: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def _input_side_params(mixer: torch.nn.Module) -> int:
    """Parameters of the maps that read the mixer's input (every linear map but the output projection)."""
    return _linear_params(mixer) - mixer.o_proj.weight.numel()


def _mixer_forward_flops(mixer: torch.nn.Module, seq_len: int) -> float:
    """Per token: the linear maps, then the token mixing. Lightning's and GLA's chunked forms share their products
    (q k^T and its product with v inside a chunk, the state read and write: 4 C D + 4 D^2 a head; GLA's gates are
    elementwise); GDN adds the chunk's k k^T and the keys' read of the state (6 C D + 6 D^2; its triangular solve,
    C D, is left out as torch's FLOP counter leaves it out)."""
    from hyla.layers.gdn import GatedDeltaNet
    from hyla.layers.gla import GatedLinearAttention
    from hyla.layers.lightning import LightningAttention

    flops = 2.0 * _linear_params(mixer)
    heads, head_dim = mixer.num_heads, mixer.head_dim
    chunked = 4.0 * LIGHTNING_CHUNK * head_dim + 4.0 * head_dim**2
    if isinstance(mixer, (LightningAttention, GatedLinearAttention)):
        return flops + heads * chunked
    if isinstance(mixer, GatedDeltaNet):
        return flops + heads * 1.5 * chunked
    return flops + 2.0 * seq_len * heads * head_dim


def _forward_flops_per_token(model, seq_len: int, *, head: bool) -> float:
    flops = sum(_mixer_forward_flops(block.mixer, seq_len) + 2.0 * _linear_params(block.mlp)
                for block in model.model.layers)
    return flops + (2.0 * model.lm_head.weight.numel() if head else 0.0)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((rate for key, rate in PEAK_BF16.items() if key in name), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Built:
    model: torch.nn.Module
    loss_fn: object
    blocks: list
    frozen_blocks: list
    flops: dict = field(default_factory=dict)
    alignment: object = None  # stage 1: the loss `hyla convert` chooses (hyla.convert.align_batched.AlignmentPath)


def _build(case: Case, hf_teacher, plan, attention_layers, fused_loss: bool, device,
           compile: bool = False, batched: bool = False, teacher_bf16: bool = False,
           whole_twins: bool = False, bf16_activations: bool = False, kl_kernel: str = "torch",
           fused_projections: bool = False, cuda_graphs: bool = False) -> _Built:
    """The stage's modules exactly as `hyla convert` builds them (hyla.convert.runners); stage 1's loss as it
    chooses it for `compile` on one process (`whole_twins`: each twin compiled with its loss); `teacher_bf16`,
    `bf16_activations`, `kl_kernel`, `fused_projections` and `cuda_graphs`: the stage's settings of those names."""
    import copy

    from hyla.convert.align import AlignmentTwins
    from hyla.convert.align_batched import choose_alignment_path
    from hyla.convert.distill import StudentWithTeacher, bf16_teacher, build_student, distill_loss, finetune_loss
    from hyla.models.modeling import use_autocast_activations, use_fused_projections
    from hyla.models.transfer import to_hypenet

    teacher = to_hypenet(hf_teacher, attention_rope=True).to(device).eval()
    if teacher_bf16:
        teacher = bf16_teacher(teacher)
    if case.stage == "align":
        config = copy.deepcopy(teacher.config)
        for name, value in plan.twin_options().items():
            setattr(config, name, value)
        twins = AlignmentTwins.for_training(teacher, hf_teacher, config, device, rnn_mixer=plan.model.rnn_mixer)
        path = choose_alignment_path(twins, compile=compile, batched=batched, whole_twins=whole_twins,
                                     cuda_graphs=cuda_graphs)
        return _Built(twins, path.loss_fn, list(twins.twins), list(teacher.model.layers) if teacher_bf16 else [],
                      training_flops_per_token("align", twins, case.seq_len, teacher), alignment=path)
    student = build_student(hf_teacher, list(attention_layers), None, rnn_mixer=plan.model.rnn_mixer,
                            **plan.student_options()).to(device).float()
    use_autocast_activations(student, bf16_activations)
    use_fused_projections(student, fused_projections)
    if case.stage == "distill":
        use_fused_projections(teacher, fused_projections)
        loss_fn = functools.partial(distill_loss, fused=fused_loss, kernel=kl_kernel)
        return _Built(StudentWithTeacher(student, teacher), loss_fn, list(student.model.layers),
                      list(teacher.model.layers), training_flops_per_token("distill", student, case.seq_len, teacher))
    return _Built(StudentWithTeacher(student, None), functools.partial(finetune_loss, fused=fused_loss),
                  list(student.model.layers), [], training_flops_per_token("finetune", student, case.seq_len))


def _fast_path(path: str, stage: str, device: torch.device):
    """The fast-path settings and the teacher's precision `path` runs `stage` with on `device`."""
    from hyla.train.fast import EAGER, resolve_fast_path, resolve_teacher_bf16

    settings = PATH_SETTINGS[path]
    teacher_bf16 = stage in TEACHER_STAGES and resolve_teacher_bf16(settings.teacher_bf16, device)
    if path == "eager":
        return EAGER, teacher_bf16
    return resolve_fast_path(compile=None, fused_loss=None, fused_optimizer=None, micro_batch_size=None,
                             device=device, whole_blocks=settings.whole_blocks,
                             kl_kernel=settings.kl_kernel if stage == "distill" else "torch",
                             compile_mode=settings.compile_mode if stage in HYBRID_STAGES else "default",
                             fused_projections=settings.fused_projections if stage in HYBRID_STAGES else False,
                             cuda_graphs=settings.cuda_graphs if stage == "align" else False), \
        teacher_bf16


def path_bf16_activations(path: str, stage: str, device: torch.device) -> bool:
    """Whether `path` trains `stage` with the hybrid's activations in bf16: the path's setting, or the device's default
    (`hyla.train.fast.resolve_bf16_activations`), in the stages that train the whole hybrid."""
    from hyla.train.fast import resolve_bf16_activations

    return stage in HYBRID_STAGES and resolve_bf16_activations(PATH_SETTINGS[path].bf16_activations, device)


def measure_case(case: Case, path: str, hf_teacher, plan, attention_layers, settings: TrainBenchSettings) -> dict:
    """Time `settings.steps` training steps of `case` on `path` after `settings.warmup` (the first compiles), from an
    empty compile cache; the result's `compiled` counts the graphs this case compiled and its graph breaks."""
    import torch._dynamo

    from hyla.ops.lightning import chunk_kernel_as_custom_op

    # Each path compiles its own graphs. Code compiled for an earlier path is reused wherever its guards pass, and
    # the custom op's switch is guarded only in the frame of `lightning_attention`, not in the block frames split
    # around fla's call: without the reset a whole-blocks path after the fast path ran the fast path's pieces.
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    device = torch.device(settings.device)
    fast, teacher_bf16 = _fast_path(path, case.stage, device)
    bf16_activations = path_bf16_activations(path, case.stage, device)
    with chunk_kernel_as_custom_op(fast.whole_blocks):
        result = _measure_case(case, path, hf_teacher, plan, attention_layers, settings, fast, teacher_bf16,
                               bf16_activations)
    result["compiled"] = {"graphs": counters["stats"]["unique_graphs"],
                          "graph_breaks": sum(counters["graph_break"].values())}
    return result


def _measure_case(case: Case, path: str, hf_teacher, plan, attention_layers, settings: TrainBenchSettings,
                  fast, teacher_bf16: bool, bf16_activations: bool) -> dict:
    from hyla.bench.timing import peak_memory_gib, reset_peak_memory
    from hyla.compile import compile_blocks
    from hyla.train.distributed import Distributed
    from hyla.train.optim import OptimSettings, build_optimizer
    from hyla.train.step import TrainStep

    device = torch.device(settings.device)
    reset_peak_memory(device)
    torch.manual_seed(settings.seed)  # both paths start from the same weights and see the same batches
    if case.stage == "align":
        fast = dataclasses.replace(fast, fused_loss=False)  # no LM head in stage 1 (as hyla convert runs it)
    built = _build(case, hf_teacher, plan, attention_layers, fast.fused_loss, device, compile=fast.compile,
                   batched=path in BATCHED_PATHS, teacher_bf16=teacher_bf16, whole_twins=fast.whole_blocks,
                   bf16_activations=bf16_activations, kl_kernel=fast.kl_kernel,
                   fused_projections=fast.fused_projections, cuda_graphs=fast.cuda_graphs)
    if built.alignment is not None:
        print(f"  {case.label} {path}: alignment loss: {built.alignment.describe()}", flush=True)
    if fast.compile:  # the batched twins' loss compiles itself; a bf16 teacher's blocks are compiled either way
        trained = built.blocks if built.alignment is None or built.alignment.compile_twins else []
        compile_blocks([*trained, *built.frozen_blocks], mode=fast.compile_mode)
    built.model.train()
    budget = getattr(plan, case.stage)  # the stage's learning rate and schedule, as the plan trains it
    optim = OptimSettings(lr=budget.lr, min_lr=budget.min_lr, warmup_steps=min(budget.warmup_steps, 1),
                          schedule=budget.schedule)
    total = settings.warmup + settings.steps + (1 if settings.profile else 0)
    optimizer, scheduler = build_optimizer(built.model.parameters(), optim, total, fused=fast.fused_optimizer)
    step = TrainStep(built.model, built.loss_fn, optimizer, scheduler, optim, Distributed(device=device),
                     micro_batch_rows=fast.micro_batch_size, log=lambda line: print(f"  {case.label} {path}: {line}"))
    vocab = hf_teacher.config.vocab_size
    generator = torch.Generator(device=device).manual_seed(settings.seed)

    def one_step():
        ids = torch.randint(0, vocab, (case.batch, case.seq_len + 1), device=device, generator=generator)
        return step({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})

    times, losses = [], []
    for index in range(settings.warmup + settings.steps):
        _sync(device)
        started = time.perf_counter()
        outcome = one_step()
        _sync(device)
        times.append(time.perf_counter() - started)
        losses.append(outcome.loss)
        print(f"  {case.label} {path} step {index + 1}: {times[-1]:.3f} s, loss {outcome.loss:.4f}", flush=True)
    median = statistics.median(times[settings.warmup:])
    tokens = case.batch * case.seq_len
    flops = built.flops["total"]
    rate = peak_flops(device)
    result = {"stage": case.stage, "batch": case.batch, "seq_len": case.seq_len, "path": path,
              "fast_path": fast.as_dict(), "whole_blocks": fast.whole_blocks, "teacher_bf16": teacher_bf16,
              "bf16_activations": bf16_activations, "kl_kernel": fast.kl_kernel, "compile_mode": fast.compile_mode,
              "fused_projections": fast.fused_projections,
              "micro_batch_rows_used": step.micro_batch_rows,
              "median_step_s": median, "step_s": times, "first_step_s": times[0], "losses": losses,
              "tok_per_s": tokens / median, "flops_per_token": built.flops,
              "tflop_per_s": flops * tokens / median / 1e12, "mfu": flops * tokens / median / rate if rate else None,
              "peak_gib": peak_memory_gib(device)}
    if built.alignment is not None:
        result["alignment_loss"] = built.alignment.as_dict()
    if settings.profile and path != "eager":
        result["profile"] = _profile(one_step, device)
    return result


def _profile(one_step, device: torch.device, top: int = 100) -> dict:
    """One profiled step: wall and kernel time, time by kind of kernel, and the `top` kernels (JSON; the markdown
    shows fewer): enough rows to account for the elementwise share kernel by kernel."""
    from hyla.bench.profile import kernel_kinds, profile_steps

    profiled = profile_steps(one_step, 1, device)
    return {"wall_ms": profiled["wall_ms_per_step"], "kernel_ms": profiled["kernel_ms_per_step"],
            "kernels": profiled["calls_per_step"],
            "by_kind_ms": {kind: us / 1e3 for kind, us in kernel_kinds(profiled["rows"]).items()},
            "top": profiled["rows"][:top]}


def measure_losses(batch_tokens: int, hidden_size: int, vocab_size: int, device: torch.device,
                   repeats: int = 5) -> list[dict]:
    """The LM-head losses alone, forward and backward, at `batch_tokens` rows: time (median) and peak memory of
    each implementation, and its loss's relative difference from the materialised one."""
    from hyla.bench.timing import peak_memory_gib, reset_peak_memory, time_ms
    from hyla.convert.distill import cross_entropy, kl_divergence
    from hyla.ops.linear_loss import linear_cross_entropy_chunked, linear_kl_divergence_chunked
    from hyla.train.step import training_autocast

    generator = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(batch_tokens, hidden_size, device=device, generator=generator, requires_grad=True)
    teacher_hidden = torch.randn(batch_tokens, hidden_size, device=device, generator=generator)
    weight = (torch.randn(vocab_size, hidden_size, device=device, generator=generator) * 0.05).requires_grad_()
    teacher_weight = torch.randn(vocab_size, hidden_size, device=device, generator=generator) * 0.05
    labels = torch.randint(0, vocab_size, (batch_tokens,), device=device, generator=generator)
    variants = {
        ("kl", "logits"): lambda: kl_divergence(teacher_hidden @ teacher_weight.T, hidden @ weight.T),
        ("kl", "hyla-chunked"): lambda: linear_kl_divergence_chunked(hidden, weight, teacher_hidden,
                                                                      teacher_weight, labels)[0],
        ("ce", "logits"): lambda: cross_entropy(hidden @ weight.T, labels),
        ("ce", "hyla-chunked"): lambda: linear_cross_entropy_chunked(hidden, weight, labels),
    }
    variants.update(_fla_losses(hidden, weight, teacher_hidden, teacher_weight, labels))
    rows, reference = [], {}
    for (loss, name), fn in variants.items():
        def run():
            hidden.grad, weight.grad = None, None
            with training_autocast(device):
                value = fn()
            value.backward()
            return value

        reset_peak_memory(device)
        try:
            value = run().item()
            timing = time_ms(run, device=device, warmup=1, repeats=repeats)
        except Exception as err:  # noqa: BLE001  (an implementation that fails is reported; the others still run)
            if not (isinstance(err, torch.OutOfMemoryError) or name.startswith("fla")):
                raise
            rows.append({"loss": loss, "implementation": name, "error": f"{type(err).__name__}: {err}"[:300]})
            print(f"  {loss} {name}: {rows[-1]['error']}", flush=True)
            continue
        reference.setdefault(loss, value)
        rows.append({"loss": loss, "implementation": name, "rows": batch_tokens, "median_ms": timing["median_ms"],
                     "peak_gib": peak_memory_gib(device), "value": value,
                     "relative_difference": abs(value - reference[loss]) / abs(reference[loss])})
        print(f"  {loss} {name}: {timing['median_ms']:.2f} ms, peak {rows[-1]['peak_gib'] or 0:.1f} GiB, "
              f"value {value:.6f}", flush=True)
    return rows


def _fla_losses(hidden, weight, teacher_hidden, teacher_weight, labels) -> dict:
    """flash-linear-attention's fused LM-head losses, where it is installed and the tensors are on CUDA."""
    if not hidden.is_cuda:
        return {}
    try:
        from fla.modules import FusedKLDivLoss, FusedLinearCrossEntropyLoss
    except ImportError:
        return {}
    kl, ce = FusedKLDivLoss(), FusedLinearCrossEntropyLoss()
    return {("kl", "fla-fused"): lambda: kl(hidden, teacher_hidden, weight, teacher_weight),
            ("ce", "fla-fused"): lambda: ce(hidden, labels, weight)}


def _teacher(settings: TrainBenchSettings, device: torch.device):
    if settings.teacher is not None:
        from hyla.models.loading import load_teacher

        return load_teacher(settings.teacher, device=device)[0].eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(settings.seed)
    return LlamaForCausalLM(LlamaConfig(**(TOY if settings.toy else SMOLLM2_135M))).to(device).eval()


def _attention_layers(settings: TrainBenchSettings, num_layers: int) -> tuple[int, ...]:
    if settings.attention_layers is not None:
        bad = [i for i in settings.attention_layers if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"attention layers {bad} outside the teacher's {num_layers} layers")
        return settings.attention_layers
    if num_layers == SMOLLM2_135M["num_hidden_layers"]:
        return SMOLLM2_ATTENTION_LAYERS
    return tuple(range(0, num_layers, 4))


def run_train_bench(settings: TrainBenchSettings, save=lambda results: None) -> dict:
    """Every case on every path (eager first), then the losses alone; `save(results)` after each measurement, so
    that a run cut short keeps what it measured."""
    from hyla.convert.presets import apply_overrides, make_plan

    device = torch.device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("hyla bench train: no CUDA device here; use --device cpu (with --toy for a quick check)")
    for what, off_device in (("the KL's Triton kernel", [path for path in settings.paths
                                                         if PATH_SETTINGS[path].kl_kernel == "triton"]),
                             ("CUDA graphs", [path for path in settings.paths if PATH_SETTINGS[path].cuda_graphs])):
        if off_device and device.type != "cuda":
            raise ValueError(f"paths {', '.join(off_device)} run {what}, on CUDA only; this device is {device.type}")
    hf_teacher = _teacher(settings, device)
    attention_layers = _attention_layers(settings, hf_teacher.config.num_hidden_layers)
    plan = apply_overrides(make_plan("quick", sum(p.numel() for p in hf_teacher.parameters())),
                           [f"model.rnn_mixer={settings.rnn_mixer}"])
    results = {"settings": {**dataclasses.asdict(settings), "attention_layers": list(attention_layers)},
               "teacher": {"spec": settings.teacher or ("toy" if settings.toy else "smollm2-135m shape, random"),
                           "num_params": sum(p.numel() for p in hf_teacher.parameters())},
               "peak_flops": peak_flops(device), "cases": [], "losses": []}
    for case in settings.cases:
        for path in settings.paths:
            if not path_measures_stage(path, case.stage):
                continue
            print(f"{case.label} {path}", flush=True)
            try:
                results["cases"].append(measure_case(case, path, hf_teacher, plan, attention_layers, settings))
            except torch.OutOfMemoryError as err:
                results["cases"].append({"stage": case.stage, "batch": case.batch, "seq_len": case.seq_len,
                                         "path": path, "error": f"out of memory: {str(err).splitlines()[0]}"})
            except Exception as err:  # a path that fails (a kernel, a compile) leaves the others measured
                traceback.print_exc()
                first_line = (str(err).splitlines() or [""])[0]
                results["cases"].append({"stage": case.stage, "batch": case.batch, "seq_len": case.seq_len,
                                         "path": path, "error": f"{type(err).__name__}: {first_line}"[:300]})
            if device.type == "cuda":
                torch.cuda.empty_cache()
            save(results)
    distill = next((c for c in settings.cases if c.stage == "distill"), None)
    if settings.losses and distill is not None:
        print(f"LM-head losses at {distill.batch * distill.seq_len} rows", flush=True)
        results["losses"] = measure_losses(distill.batch * distill.seq_len, hf_teacher.config.hidden_size,
                                           hf_teacher.config.vocab_size, device)
        save(results)
    return results
