"""Conversion budgets. `paper` is the token counts (docs/method.md, "HALO conversion") per stage for a 1.7B teacher,
scaled in proportion to the teacher's size below that; `small` is a tenth of `paper`; `quick` is a fixed ~44M-token
budget sized for one GPU and a ~100M-parameter teacher (at the stage throughputs measured for SmolLM2-135M on a shared
H200, ~16 minutes); `smoke` is a fixed toy budget that runs every stage on a laptop CPU in minutes; `halo-smollm2` is a
recipe that fixes the data as well as the budgets (`hyla.convert.recipes`). Every number can be overridden with
`--set section.field=value`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hyla.validation import (Rule, at_least, check_fields, did_you_mean, each, field_types, greater_than, one_of,
                             one_of_or_close, parse_text)

PAPER_TEACHER_PARAMS = 1.7e9
# hyla.train.optim.SCHEDULES and hyla.train.parallel.MODES, not imported from there: those import torch, and
# `hyla --help` reads this module (a test keeps them equal).
SCHEDULES = ("cosine", "constant")
DATA_PARALLEL_MODES = ("auto", "ddp", "fsdp", "fsdp-no-reshard")
# The mixers the layers not kept as attention may have (`model.rnn_mixer`): the keys of
# hyla.models.transfer.TWIN_BUILDERS, not imported from there for the same reason (a test keeps them equal).
RNN_MIXERS = ("lightning", "gla", "gdn", "swa")
# The fused KL's kernels (`StageBudget.kl_kernel`): hyla.ops.linear_loss.KL_KERNELS, for the same reason.
KL_KERNELS = ("torch", "triton")
# torch.compile's modes for the trained blocks (`StageBudget.compile_mode`): hyla.inference.settings.COMPILE_MODES.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# Mixers whose twins are the teacher's own attention: nothing to align, stage 1 only measures them.
UNALIGNED_MIXERS = ("swa",)


@dataclass
class StageBudget:
    tokens: int
    seq_len: int
    batch_size: int
    lr: float
    min_lr: float
    schedule: str = "cosine"
    warmup_steps: int = 50
    checkpoint_every: int = 100
    # The training fast path (hyla.train.fast; speed and memory only, None = the device's default: all on for CUDA).
    compile: bool | None = None  # torch.compile each block of the trained model and of its teacher
    fused_loss: bool | None = None  # LM head + loss in row chunks, no [tokens, vocabulary] logits (distill, finetune)
    fused_optimizer: bool | None = None  # torch's fused AdamW
    micro_batch_size: int | None = None  # sequences per forward/backward pass and process; None: the most that fit
    # Stage 1 only: every Lightning twin in one batched problem (hyla.convert.align_batched) instead of the per-twin
    # loop. Off until it is measured on a GPU: `hyla bench train --paths fast,fast-batched` times both.
    batched_twins: bool = False
    # Activation checkpointing of the trained hybrid's blocks (distill, finetune): each block keeps its input only
    # and recomputes the rest in the backward pass, one more forward for much less memory (memory only).
    checkpoint_activations: bool = False
    # Windows start at document starts where that keeps a document whole (hyla.data.loader): a recall document's
    # question then always sees its facts.
    align_documents: bool = False
    # Lightning's kernel inside the compiled blocks as a custom op, one graph per block; in stage 1 each twin
    # compiled with its loss (hyla.train.fast.FastPath.whole_blocks; None: on wherever blocks are compiled).
    whole_blocks: bool | None = None
    # Stages 1-2: the frozen teacher held in bf16 (its weights cast once, its residual stream in bf16) instead of
    # float32 weights under bf16 autocast (each step casts them), and on the fast path its blocks compiled in stage 1
    # too (stage 2 compiles them either way). Changes the targets by bf16 rounding. None: on for CUDA, off on CPU
    # (hyla.train.fast.resolve_teacher_bf16); measured on an H200 with whole blocks (`hyla bench train`,
    # docs/results/train-speed.md): alignment 594K tokens/s against 400K with split blocks.
    teacher_bf16: bool | None = None
    # Stages 2-3: the trained hybrid's activations in bf16 under the stage's bf16 autocast, the residual stream from
    # the embeddings on and every RMSNorm's output (hyla.models.modeling.use_autocast_activations), where float32
    # weights and embeddings otherwise promote them to float32. Weights, gradients and AdamW stay float32. Changes
    # the result by bf16 rounding of activations and of the backward pass's residual gradient (in the stage's hash,
    # as the frozen teacher's precision is). None: on for CUDA, off on CPU, which trains without autocast
    # (hyla.train.fast.resolve_bf16_activations). Measured on an H100 (`hyla bench train --paths
    # fast,fast-fp32-activations`, docs/results/train-speed.md): distillation +4.6%. Its loss curves follow float32
    # activations' (tests/train/test_fast_path_gpu.py). On the real SmolLM2-135M (bench/bf16_activations_real.py)
    # the gradients' error grows 1.02-1.76x in trained states, more on one batch of an unaligned student. Always off
    # in alignment (single mixers).
    bf16_activations: bool | None = None
    # Stage 2: the fused KL's per-chunk arithmetic, "torch" (compiled torch) or "triton" (hyla's kernel,
    # hyla.ops.linear_loss.gpu: each logit read twice instead of three times; CUDA and the fused loss only). Speed
    # only (float rounding). None: triton on CUDA with the fused loss, torch elsewhere (hyla.train.fast.
    # resolve_fast_path; measured on an H200, docs/convert.md: the loss 34.8 against 37.0 ms, distillation +0.8%,
    # and its 30-step loss curve follows torch's, tests/train/test_fast_path_gpu.py).
    kl_kernel: str | None = None
    # Stages 2-3: torch.compile's mode for the hybrid's and the frozen teacher's blocks on the fast path: "default",
    # or "max-autotune-no-cudagraphs" (inductor times its own matrix-product kernels against cuBLAS for each shape
    # at the first step and may fuse the elementwise work around them; minutes of compiling, kept in inductor's disk
    # cache). Speed only. "default" until `hyla bench train --paths fast,fast-max-autotune` measures the other faster.
    compile_mode: str = "default"
    # Stages 2-3: each softmax/Lightning mixer's q/k/v and output-gate maps and each MLP's gate/up maps computed as
    # one product with their concatenated weights, in the hybrid and its frozen teacher
    # (hyla.models.modeling.use_fused_projections): the same outputs and gradients up to float rounding, fewer and
    # larger matrix products; parameters and checkpoints unchanged. Speed only. None: the device's default
    # (hyla.train.fast.FUSED_PROJECTIONS_BY_DEFAULT: off, measured slower on an H200, docs/convert.md).
    fused_projections: bool | None = None
    # Stage 1 on the fast path (compiled twins with their losses, on one CUDA device): each twin's compiled step
    # replayed as CUDA graphs (hyla.train.fast.FastPath.cuda_graphs), for hosts too slow to launch the twins' few
    # thousand small kernels as fast as the GPU runs them. Speed only. None: the device's default
    # (hyla.train.fast.CUDA_GRAPHS_BY_DEFAULT).
    cuda_graphs: bool | None = None
    # Stages 2-3: train the hybrid with its NoPE attention's per-query logit scaling on, s_t = log(t + a) / log(a)
    # at position t of each document (HypeNetConfig.attention_logit_scaling_a), instead of without it as HypeNet
    # trains (None); the scaling stage then chooses the a the model is exported with, as always.
    logit_scaling_a: float | None = None
    # Stages 2-3: weights kept as they come into the stage: "attention" (the mixers of the layers kept as softmax
    # attention: their q, k, v, o and q/k norms, the teacher's unless aligned; the new output gate trains),
    # "attention-layers" (those layers whole: mixer, MLP and both norms) or "none" (everything trains). The
    # optimizer holds only the rest (`hyla.convert.distill.freeze`).
    freeze: str = "none"
    # Under torchrun: a replica per process (ddp), FSDP2 sharding (fsdp), or FSDP2 keeping the gathered weights from
    # forward to backward (fsdp-no-reshard); auto: ddp when the replica takes at most half the device's memory, else
    # fsdp (hyla.train.parallel). Speed and memory only.
    data_parallel: str = "auto"

    @property
    def steps(self) -> int:
        # 0 tokens (allowed for finetune only: the stage is skipped) is 0 steps; any other budget at least one.
        if self.tokens == 0:
            return 0
        return max(1, self.tokens // (self.seq_len * self.batch_size))

    def settings(self) -> dict[str, Any]:
        """What the stage's output depends on: the fast path's settings, `checkpoint_activations` and
        `data_parallel` change speed and memory, not results (up to float rounding), and are left out (a run can be
        resumed with them switched either way, and earlier runs keep their hash)."""
        settings = {name: value for name, value in self.__dict__.items() if name not in SPEED_ONLY}
        for name in ("align_documents", "teacher_bf16", "bf16_activations", "logit_scaling_a"):
            if not settings[name]:  # earlier runs keep their hash (None: the device's default)
                del settings[name]
        if settings["freeze"] == "none":
            del settings["freeze"]
        return settings


# What a stage's `freeze` may keep fixed (hyla.convert.distill.freeze).
FREEZE_PARTS = ("none", "attention", "attention-layers")
SPEED_ONLY = ("compile", "fused_loss", "fused_optimizer", "micro_batch_size", "checkpoint_activations",
              "data_parallel", "batched_twins", "whole_blocks", "kl_kernel", "compile_mode", "fused_projections",
              "cuda_graphs")


@dataclass
class SelectionPlan:
    method: str = "halo"  # halo | uniform | latter-half | jet-nemotron | kl-ls | a list "3,7,11"
    k: int | None = None  # None: floor(L / 4)
    # Recall on 3 x 34 = 102 prompts at 4K (at least 100 over SK1-SK3), the same prompts for every variant.
    niah_tasks: list[str] = field(default_factory=lambda: ["SK1", "SK2", "SK3"])
    niah_lengths: list[int] = field(default_factory=lambda: [4096])
    niah_samples: int = 34
    niah_max_new_tokens: int = 40  # as the experiment plans' NIAH evaluations (SK3's UUID answer is ~25 tokens)
    csr_tasks: list[str] = field(default_factory=lambda: ["hellaswag", "arc_easy", "piqa"])
    csr_limit: int = 500
    batch_size: int = 8
    # CSR's documents are short (~100-250 tokens): None scores them batch_size at a time, a larger number launches
    # fewer forwards of the whole model.
    csr_batch_size: int | None = None
    kl_ls_steps: int = 50  # KL-LS: distillation steps per single-attention student (at the distill stage's shape)
    # halo: gaps below noise_z standard errors count as zero in s_i (hyla.convert.noise_select; 0 = HALO as
    # published); layers of equal s_i go by their stage-1 alignment error ("alignment") or HALO's raw s_i ("halo").
    noise_z: float = 2.0
    tie_break: str = "alignment"


@dataclass
class DataPlan:
    """The corpora the data stage prepares, each from `hyla data prepare` source specs (hyla.data.sources) and
    optional weights (shares of the text). `sources` is the main corpus (stages 1-2, KL-LS, the held-out tail);
    empty: the command's --data (default stdlib). `long_sources`: stage 3's corpus (long documents, long-range
    recall documents); empty: stage 3 reads the main corpus. `scaling_sources`: long documents held out for choosing
    `a` (scaling.data, a prepared folder, wins when set). Token counts: None = what the plan draws."""

    sources: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    long_sources: list[str] = field(default_factory=list)
    long_weights: list[float] = field(default_factory=list)
    long_tokens: int | None = None
    scaling_sources: list[str] = field(default_factory=list)
    # The main corpus's tokens to prepare at least (None: the largest stage's draw), e.g. the largest draw of the
    # variants that will reuse this data stage from a copy of the run (a branch with more distillation tokens finds
    # the corpus it would have made itself; the data stage's settings include its token count).
    min_tokens: int | None = None

    def settings(self) -> dict[str, Any]:
        """The parts beyond the main corpus, when set (earlier runs keep their hash)."""
        return {name: value for name, value in dataclasses.asdict(self).items()
                if name not in ("sources", "weights") and value not in ([], None)}


@dataclass
class ScalingPlan:
    candidates: list[float | None] = field(default_factory=lambda: [None, 5.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0])
    length: int = 4096
    num_docs: int = 8
    # None: the data stage's scaling corpus (data.scaling_sources) or windows of the main corpus's held-out tail. A
    # prepared corpus folder: the first `length` tokens of its first `num_docs` documents of at least `length`
    # tokens (`a` is chosen on long documents: docs/method.md, "Attention layer and logit scaling").
    data: str | None = None
    per_length: bool = False  # also report EME's c(L) = log L / log L0 (L0: `trained_seq_len`), not chosen from
    # NIAH for every candidate (hyla.convert.scaling), e.g. niah_lengths=32768,65536; [] = off.
    niah_lengths: list[int] = field(default_factory=list)
    niah_tasks: list[str] = field(default_factory=lambda: ["SK1", "SK2", "SK3"])
    niah_samples: int = 5
    niah_max_new_tokens: int = 40
    # How `a` is chosen: "loss" (the lowest held-out loss) or "recall" (the lowest loss on the answer tokens of
    # recall documents, which needs recall_source; hyla.convert.scaling_recall). Both are reported when measured.
    criterion: str = "loss"
    # Recall documents, scored for every candidate whichever the criterion: a `recall[-repeat][-lead][-long]:SPEC`
    # source spec (SPEC: the haystack text, e.g. recall-lead:docs@26-30:aa-lcr); None = none.
    recall_source: str | None = None
    recall_lengths: list[int] = field(default_factory=list)  # tokens per document; [] = `length`
    recall_docs: int = 8  # documents of each length

    def settings(self) -> dict[str, Any]:
        """What the stage's output depends on (`data`, the report's extras and the recall documents only when set, so
        that earlier runs keep their hash)."""
        items = dataclasses.asdict(self)
        if items["data"] is None:
            del items["data"]
        if not self.per_length and not self.niah_lengths:
            for name in ("per_length", "niah_lengths", "niah_tasks", "niah_samples", "niah_max_new_tokens"):
                del items[name]
        if self.recall_source is None:  # then the criterion is "loss" (check_plan) and the rest unused
            for name in ("criterion", "recall_source", "recall_lengths", "recall_docs"):
                del items[name]
        return items


@dataclass
class ArchitecturePlan:
    """The student's design choices (docs/method.md, "HypeNet" defaults); the ablations of seed 000's Tables 3-4 flip
    them."""

    # The mixer of every layer not kept as attention (docs/convert.md, "RNN mixer"): lightning (HypeNet), gla, gdn,
    # or swa (the teacher's own attention restricted to `swa_window` tokens, RoPE kept: the baseline without
    # alignment). The lightning_* fields below apply to lightning only, gla_rope to gla, gdn_rope to gdn, swa_window
    # to swa.
    rnn_mixer: str = "lightning"
    swa_window: int = 128
    lightning_rope: bool = True  # RoPE on the Lightning layers' q/k
    lightning_qk_norm: bool = True  # RMSNorm on the Lightning layers' q/k
    # RoPE on the GLA / GDN layers' q/k (HyPE's RoPE in the RNN layers); off: the gates are their only position signal
    gla_rope: bool = False
    gdn_rope: bool = False
    attention_rope: bool = False  # keep RoPE in the attention layers (HypeNet: NoPE)
    # Stage 1 starts the twins' output norm at the teacher's output scale (hyla.convert.calibrate): lstsq | rms | none
    twin_init: str = "lstsq"
    twin_init_batches: int = 4  # calibration batches of the align stage's shape
    # Beyond the paper: before distilling, train the kept NoPE attention layers to the teacher's RoPE attention
    # outputs (hyla.convert.align_attention), with the `attn_align` budget.
    align_attention: bool = False


@dataclass
class ConvertPlan:
    preset: str
    align: StageBudget
    distill: StageBudget
    finetune: StageBudget
    selection: SelectionPlan
    scaling: ScalingPlan
    model: ArchitecturePlan = field(default_factory=ArchitecturePlan)
    seed: int = 0
    # The attention alignment's budget (used with model.align_attention); None: `default_attn_align(align)`.
    attn_align: StageBudget | None = None
    data: DataPlan = field(default_factory=DataPlan)
    token_scale: float = 1.0  # every stage's tokens times this (hyla.convert.recipes.scale_tokens), after --set

    def __post_init__(self) -> None:
        if self.attn_align is None:
            self.attn_align = default_attn_align(self.align)

    @property
    def data_tokens(self) -> int:
        """Tokens to prepare: the largest stage's draw (stages reuse the corpus) plus the held-out documents."""
        stages = [self.align, self.distill] + ([self.attn_align] if self.model.align_attention else [])
        # Stage 3 draws from the main corpus unless it has one of its own.
        stages += [] if self.data.long_sources else [self.finetune]
        train = max([b.steps * b.seq_len * b.batch_size for b in stages] + [self.data.min_tokens or 0])
        return train + 1 + self.heldout_tokens

    @property
    def long_data_tokens(self) -> int:
        """Tokens of stage 3's own corpus: `data.long_tokens`, or stage 3's draw."""
        b = self.finetune
        return self.data.long_tokens or b.steps * b.seq_len * b.batch_size + 1

    @property
    def finetune_skipped(self) -> bool:
        """`finetune.tokens=0`: stage 3 trains nothing and passes the distilled weights on unchanged."""
        return self.finetune.tokens == 0

    @property
    def trained_seq_len(self) -> int:
        """The longest window the student trained on: stage 3's, or stage 2's when stage 3 is skipped (L0 of c(L))."""
        return self.distill.seq_len if self.finetune_skipped else self.finetune.seq_len

    @property
    def heldout_tokens(self) -> int:
        return self.scaling.length * self.scaling.num_docs + 1

    def twin_options(self) -> dict[str, bool | int]:
        """The config fields the stage-1 twins are built with: the Lightning layers' options, the window of SWA
        twins, and GLA's or GDN's RoPE when it is on (each only then: earlier runs keep their hash)."""
        options: dict[str, bool | int] = {"lightning_rope": self.model.lightning_rope,
                                          "lightning_qk_norm": self.model.lightning_qk_norm}
        if self.model.rnn_mixer == "swa":
            options["swa_window"] = self.model.swa_window
        for name in ("gla_rope", "gdn_rope"):
            if getattr(self.model, name):
                options[name] = True
        return options

    def student_options(self) -> dict[str, bool | int]:
        """Config fields of the hybrid beyond the teacher's sizes."""
        return {**self.twin_options(), "attention_rope": self.model.attention_rope}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_attn_align(align: StageBudget) -> StageBudget:
    """An eighth of stage 1's tokens at its shape, at distillation's learning rate: the layers being aligned are the
    teacher's own, trained already, and only lose RoPE."""
    return StageBudget(max(align.tokens // 8, align.seq_len * align.batch_size), align.seq_len, align.batch_size,
                       1e-4, 1e-5, warmup_steps=min(align.warmup_steps, 20), checkpoint_every=align.checkpoint_every)


def _paper(scale: float) -> dict[str, StageBudget]:
    def tokens(count: float) -> int:
        return int(count * scale)

    return {
        "align": StageBudget(tokens(320e6), 512, 96, 1e-3, 1e-5),
        "distill": StageBudget(tokens(1e9), 512, 96, 1e-4, 1e-5),
        "finetune": StageBudget(tokens(1e9), 16384, 4, 1e-5, 1e-5, schedule="constant"),
    }


def _smoke() -> dict[str, StageBudget]:
    # Sized for a 2-core CPU and a ~100M-parameter teacher: every stage runs, none learns much.
    return {
        "align": StageBudget(8 * 2 * 256, 256, 2, 1e-3, 1e-5, warmup_steps=1, checkpoint_every=4),
        "distill": StageBudget(8 * 2 * 256, 256, 2, 1e-4, 1e-5, warmup_steps=1, checkpoint_every=4),
        "finetune": StageBudget(3 * 1 * 1024, 1024, 1, 1e-5, 1e-5, schedule="constant", warmup_steps=0,
                                checkpoint_every=3),
    }


def _quick() -> dict[str, StageBudget]:
    # ~44M tokens. Distillation at the paper's lr 1e-4 (it was 3e-4 before 2026-12-01: the paper's Table 9 has
    # 3e-4 among the worst). At the tokens/s measured on an H200 shared with other jobs (align 34K, distill 42K,
    # fine-tune 101K; docs/results/smollm2-135m.md) that is ~16 minutes for a ~135M teacher; alone on the GPU
    # (align 68-84K, distill 56-58K, fine-tune 102K tokens/s, eager, measured 2026-11-30) ~12 minutes.
    return {
        "align": StageBudget(6_000_000, 512, 32, 1e-3, 1e-5, warmup_steps=20, checkpoint_every=100),
        "distill": StageBudget(30_000_000, 512, 32, 1e-4, 1e-5, warmup_steps=50, checkpoint_every=200),
        "finetune": StageBudget(8_000_000, 16384, 4, 1e-5, 1e-5, schedule="constant", warmup_steps=0,
                                checkpoint_every=40),
    }


# halo-smollm2: a recipe (budgets and data for one teacher on one machine), hyla.convert.recipes.
PRESETS = ("smoke", "quick", "small", "paper", "halo-smollm2")


def make_plan(preset: str, teacher_params: int) -> ConvertPlan:
    """The plan of `preset` for a teacher of `teacher_params` parameters, checked (`check_plan`)."""
    return check_plan(_preset_plan(preset, teacher_params))


def _preset_plan(preset: str, teacher_params: int) -> ConvertPlan:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if preset == "halo-smollm2":
        from hyla.convert.recipes import RECIPES

        return RECIPES[preset]()
    if preset == "smoke":
        return ConvertPlan(
            preset, **_smoke(),
            selection=SelectionPlan(niah_tasks=["SK1"], niah_lengths=[512], niah_samples=2,
                                    csr_tasks=["arc_easy"], csr_limit=6, batch_size=4, kl_ls_steps=2),
            scaling=ScalingPlan(candidates=[None, 20.0, 500.0], length=2048, num_docs=1),
        )
    if preset == "quick":
        return ConvertPlan(preset, **_quick(), selection=SelectionPlan(batch_size=16),
                           scaling=ScalingPlan(length=32768, num_docs=4))
    scale = min(1.0, teacher_params / PAPER_TEACHER_PARAMS) * (0.1 if preset == "small" else 1.0)
    return ConvertPlan(preset, **_paper(scale), selection=SelectionPlan(), scaling=ScalingPlan())


# Range rules, one table for every section: "field" applies wherever the field appears, "section.field" to that
# section only. Every field is also type-checked from its annotation, so fields added later are checked too.
def _selection_method(value: str) -> str | None:
    from hyla.convert.selection import METHODS, normalize_method

    if all(part.strip().isdigit() for part in value.split(",")):
        return None  # a layer list; checked against the teacher's layer count once its config is read
    try:
        normalize_method(value)
    except ValueError:
        rules = [m for m in METHODS if m != "user"]
        return f"must be one of {', '.join(rules)} or a layer list like 3,7,11{did_you_mean(value, rules)}"
    return None


def _niah_task(name: str) -> str | None:
    from hyla.evals.niah_samples import TASKS, get_task

    try:
        get_task(name)
    except ValueError:
        return f"is not a NIAH task ({', '.join(TASKS)}){did_you_mean(name.upper(), TASKS)}"
    return None


def _csr_task(name: str) -> str | None:
    from hyla.evals.csr import TASK_FILES

    if name in TASK_FILES:
        return None
    return f"is not a CSR task ({', '.join(TASK_FILES)}){did_you_mean(name, TASK_FILES)}"


def _twin_init(value: str) -> str | None:
    from hyla.convert.calibrate import TWIN_INITS

    return one_of(*TWIN_INITS)(value)


def _recall_source(spec: str) -> str | None:
    # hyla.data.recall, not hyla.convert.scaling_recall: that imports torch
    from hyla.data.recall import parse_recall_spec

    try:
        recall = parse_recall_spec(spec)
    except ValueError as err:
        return str(err).removeprefix(f"source {spec}: ")
    if recall.dense:
        return "asks every fact (-dense), but the scaling stage scores one answer a document: drop -dense"
    if "@" in spec.split(":", 1)[0]:
        return (f"sets haystack characters ({recall.min_chars}-{recall.max_chars}), but the scaling stage sizes "
                f"each document in tokens (scaling.recall_lengths): drop the @MIN-MAX")
    return None


def _tie_break(value: str) -> str | None:
    from hyla.convert.noise_select import TIE_BREAKS

    return one_of(*TIE_BREAKS)(value)


RULES: dict[str, Rule] = {
    "tokens": at_least(1), "seq_len": at_least(1), "batch_size": at_least(1), "lr": greater_than(0),
    "min_lr": at_least(0), "schedule": one_of(*SCHEDULES), "warmup_steps": at_least(0),
    "checkpoint_every": at_least(1), "data_parallel": one_of_or_close(*DATA_PARALLEL_MODES),
    # 0 skips stage 3: the distilled weights go on to the scaling stage unchanged (a 4K-only conversion).
    "finetune.tokens": at_least(0),
    "selection.method": _selection_method, "selection.k": at_least(1), "selection.niah_tasks": each(_niah_task),
    "selection.niah_lengths": each(at_least(1)), "selection.niah_samples": at_least(1),
    "selection.csr_tasks": each(_csr_task), "selection.csr_limit": at_least(1), "selection.kl_ls_steps": at_least(1),
    "selection.csr_batch_size": at_least(1), "selection.niah_max_new_tokens": at_least(1),
    # a = 1 would divide by log(1) = 0 (HypeNetConfig.attention_logit_scaling_a must be > 1); None is "off".
    "scaling.candidates": each(greater_than(1)), "scaling.length": at_least(2), "scaling.num_docs": at_least(1),
    "logit_scaling_a": greater_than(1),  # a stage's (distill, finetune): as the candidates
    "freeze": one_of_or_close(*FREEZE_PARTS), "kl_kernel": one_of_or_close(*KL_KERNELS),
    "compile_mode": one_of_or_close(*COMPILE_MODES),
    # Empty lists switch the scaling stage's NIAH off (`[]` or `--set scaling.niah_lengths=`).
    "scaling.niah_lengths": each(at_least(1), allow_empty=True), "scaling.niah_tasks": each(_niah_task),
    "scaling.niah_samples": at_least(0), "scaling.niah_max_new_tokens": at_least(1),
    "scaling.criterion": one_of_or_close("loss", "recall"), "scaling.recall_source": _recall_source,
    "scaling.recall_lengths": each(at_least(64), allow_empty=True), "scaling.recall_docs": at_least(1),
    "selection.noise_z": at_least(0), "selection.tie_break": _tie_break,
    "model.twin_init": _twin_init, "model.twin_init_batches": at_least(1), "model.rnn_mixer": one_of_or_close(*RNN_MIXERS),
    "model.swa_window": at_least(1),
    # Data sources are checked to exist before the data stage runs (`hyla.convert.pipeline.check_data_sources`).
    "data.weights": each(greater_than(0), allow_empty=True),
    "data.long_weights": each(greater_than(0), allow_empty=True), "data.long_tokens": at_least(1),
    "data.min_tokens": at_least(1),
    "seed": at_least(0), "token_scale": greater_than(0),
}
SECTIONS = ("align", "distill", "finetune", "attn_align", "selection", "scaling", "model", "data")


def check_plan(plan: ConvertPlan) -> ConvertPlan:
    """Type- and range-check every setting of `plan` (ValueError naming the first bad one); returns the plan."""
    check_fields(plan, RULES)
    for section in SECTIONS:
        check_fields(getattr(plan, section), RULES, section)
    for name in ("align", "attn_align"):
        if getattr(plan, name).checkpoint_activations:
            raise ValueError(f"{name}.checkpoint_activations: the alignment trains each layer pair on its own and "
                             f"keeps little; set it for distill or finetune")
        if getattr(plan, name).bf16_activations:
            raise ValueError(f"{name}.bf16_activations: the alignment trains single mixers, not the hybrid's "
                             f"residual stream; set it for distill or finetune")
        if getattr(plan, name).freeze != "none":
            raise ValueError(f"{name}.freeze: the alignment trains the twins (or the attention layers) alone; set it "
                             f"for distill or finetune")
        if getattr(plan, name).compile_mode != "default":
            raise ValueError(f"{name}.compile_mode: the alignment compiles each twin with its loss in the default "
                             f"mode; set it for distill or finetune")
        if getattr(plan, name).fused_projections:
            raise ValueError(f"{name}.fused_projections: the alignment trains single mixers with their own maps; set "
                             f"it for distill or finetune")
        if getattr(plan, name).logit_scaling_a is not None:
            raise ValueError(f"{name}.logit_scaling_a: the alignment trains single mixers, not the hybrid's NoPE "
                             f"attention; set it for distill or finetune")
    for name in ("attn_align", "distill", "finetune"):
        if getattr(plan, name).cuda_graphs:
            raise ValueError(f"{name}.cuda_graphs: CUDA graphs replay stage 1's twins; set it for align")
    if plan.align.cuda_graphs and plan.align.batched_twins:
        raise ValueError("align.cuda_graphs replays the per-twin loop, which align.batched_twins=true replaces; set "
                         "one of them")
    for name in ("align", "attn_align", "finetune"):
        if getattr(plan, name).kl_kernel not in (None, "torch"):
            raise ValueError(f"{name}.kl_kernel: the KL is stage 2's loss; set it for distill")
    if plan.distill.kl_kernel not in (None, "torch") and plan.distill.fused_loss is False:
        raise ValueError(f"distill.kl_kernel={plan.distill.kl_kernel} is a kernel of the fused LM head + loss, and "
                         f"distill.fused_loss=false takes the whole logits; leave distill.kl_kernel at torch")
    _check_mixer_options(plan.model)
    _check_recall_options(plan.scaling)
    if plan.finetune_skipped and plan.data.long_sources:
        raise ValueError("finetune.tokens=0 skips stage 3, the only reader of data.long_sources "
                         f"({', '.join(plan.data.long_sources)}); set data.long_sources= (empty) too")
    for name, weights, sources in (("data.weights", plan.data.weights, plan.data.sources),
                                   ("data.long_weights", plan.data.long_weights, plan.data.long_sources)):
        if weights and len(weights) != len(sources):
            raise ValueError(f"{name} gives {len(weights)} numbers for {len(sources)} sources")
    return plan


def _check_mixer_options(model: ArchitecturePlan) -> None:
    """A mixer option set away from its default for another mixer would be ignored: refused instead."""
    default = ArchitecturePlan()
    applies = {"lightning_rope": "lightning", "lightning_qk_norm": "lightning", "swa_window": "swa",
               "gla_rope": "gla", "gdn_rope": "gdn"}
    for name, mixer in applies.items():
        if getattr(model, name) != getattr(default, name) and model.rnn_mixer != mixer:
            raise ValueError(f"model.{name} applies to {mixer} layers only, and model.rnn_mixer is "
                             f"{model.rnn_mixer!r}: drop it or set model.rnn_mixer={mixer}")


def _check_recall_options(scaling: ScalingPlan) -> None:
    """The recall criterion and the recall documents' settings need `scaling.recall_source`: refused without it."""
    if scaling.recall_source is not None:
        return
    if scaling.criterion == "recall":
        raise ValueError("scaling.criterion=recall needs scaling.recall_source, the haystack text of the recall "
                         "documents (e.g. scaling.recall_source=recall-lead:docs@26-30:aa-lcr)")
    default = ScalingPlan()
    for name in ("recall_lengths", "recall_docs"):
        if getattr(scaling, name) != getattr(default, name):
            raise ValueError(f"scaling.{name} applies to the recall documents only, and scaling.recall_source is "
                             f"not set: drop it or set scaling.recall_source")


def setting_names(plan: ConvertPlan) -> list[str]:
    """Every name `--set` accepts: `section.field`, and the top-level `seed` and `token_scale`."""
    names = [f"{section}.{f.name}" for section in SECTIONS for f in dataclasses.fields(getattr(plan, section))]
    return names + [f.name for f in dataclasses.fields(plan) if f.name not in (*SECTIONS, "preset")]


def apply_overrides(plan: ConvertPlan, overrides: list[str]) -> ConvertPlan:
    """Apply `section.field=value` (or `field=value` for top-level fields) overrides, e.g.
    `distill.lr=3e-5`, `align.tokens=1e6`, `selection.niah_lengths=2048,4096`, `selection.k=4`,
    `model.lightning_rope=false`; then check every setting (`check_plan`). Values are parsed as the field's type."""
    known = setting_names(plan)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form section.field=value")
        key, text = (part.strip() for part in item.split("=", 1))
        if key not in known:
            raise ValueError(f"unknown setting {key!r}{did_you_mean(key, known)}; sections: {', '.join(SECTIONS)}")
        *path, name = key.split(".")
        target: Any = getattr(plan, path[0]) if path else plan
        try:
            value = parse_text(text, field_types(type(target))[name])
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None
        setattr(target, name, value)
    return check_plan(plan)


def check_plan_for_teacher(plan: ConvertPlan, num_layers: int) -> None:
    """The checks that need the teacher's layer count (read from its config, before its weights load)."""
    method, k = str(plan.selection.method), plan.selection.k
    if all(part.strip().isdigit() for part in method.split(",")):
        layers = [int(part) for part in method.split(",")]
        outside = [layer for layer in layers if layer >= num_layers]
        if outside or len(set(layers)) != len(layers):
            raise ValueError(f"selection.method {method!r}: the teacher's layers are 0-{num_layers - 1}, each named "
                             f"once")
    if k is not None and k > num_layers:
        raise ValueError(f"selection.k {k} is more than the teacher's {num_layers} layers")
