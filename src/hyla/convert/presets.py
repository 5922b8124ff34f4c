"""Conversion budgets. `paper` is SPEC §2's token counts per stage for a 1.7B teacher, scaled in proportion to the
teacher's size below that; `small` is a tenth of `paper`; `quick` is a fixed ~44M-token budget sized for one GPU and a
~100M-parameter teacher (at the stage throughputs measured for SmolLM2-135M on a shared H200, ~16 minutes); `smoke` is a fixed toy budget that runs every
stage on a laptop CPU in minutes. Every number can be overridden with `--set section.field=value`."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

PAPER_TEACHER_PARAMS = 1.7e9


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
    # Activation checkpointing of the trained hybrid's blocks (distill, finetune): each block keeps its input only
    # and recomputes the rest in the backward pass, one more forward for much less memory (memory only).
    checkpoint_activations: bool = False
    # Windows start at document starts where that keeps a document whole (hyla.data.loader): a recall document's
    # question then always sees its facts.
    align_documents: bool = False

    @property
    def steps(self) -> int:
        return max(1, self.tokens // (self.seq_len * self.batch_size))

    def settings(self) -> dict[str, Any]:
        """What the stage's output depends on: the fast path's settings and `checkpoint_activations` change speed
        and memory, not results (up to float rounding), and are left out (a run can be resumed with them switched
        either way, and earlier runs keep their hash)."""
        settings = {name: value for name, value in self.__dict__.items() if name not in SPEED_ONLY}
        if not self.align_documents:  # earlier runs keep their hash
            del settings["align_documents"]
        return settings


SPEED_ONLY = ("compile", "fused_loss", "fused_optimizer", "micro_batch_size", "checkpoint_activations")


@dataclass
class SelectionPlan:
    method: str = "halo"  # halo | uniform | latter-half | jet-nemotron | kl-ls | a list "3,7,11"
    k: int | None = None  # None: floor(L / 4)
    # Recall on 3 x 34 = 102 prompts at 4K (issue 25: >= 100 over SK1-SK3), the same prompts for every variant.
    niah_tasks: list[str] = field(default_factory=lambda: ["SK1", "SK2", "SK3"])
    niah_lengths: list[int] = field(default_factory=lambda: [4096])
    niah_samples: int = 34
    csr_tasks: list[str] = field(default_factory=lambda: ["hellaswag", "arc_easy", "piqa"])
    csr_limit: int = 500
    batch_size: int = 8
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
    # tokens (SPEC §1: `a` is chosen on long documents).
    data: str | None = None
    per_length: bool = False  # also report EME's c(L) = log L / log L0 (L0: stage 3's length), not chosen from
    # NIAH for every candidate (hyla.convert.scaling), e.g. niah_lengths=32768,65536; [] = off.
    niah_lengths: list[int] = field(default_factory=list)
    niah_tasks: list[str] = field(default_factory=lambda: ["SK1", "SK2", "SK3"])
    niah_samples: int = 5
    niah_max_new_tokens: int = 40

    def settings(self) -> dict[str, Any]:
        """What the stage's output depends on (`data` and the report's extras only when set, so that earlier runs
        keep their hash)."""
        items = dataclasses.asdict(self)
        if items["data"] is None:
            del items["data"]
        if not self.per_length and not self.niah_lengths:
            for name in ("per_length", "niah_lengths", "niah_tasks", "niah_samples", "niah_max_new_tokens"):
                del items[name]
        return items


@dataclass
class ArchitecturePlan:
    """The student's design choices (SPEC §1 defaults); the ablations of seed 000's Tables 3-4 flip them."""

    lightning_rope: bool = True  # RoPE on the Lightning layers' q/k
    lightning_qk_norm: bool = True  # RMSNorm on the Lightning layers' q/k
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
        train = max(b.steps * b.seq_len * b.batch_size for b in stages)
        return train + 1 + self.heldout_tokens

    @property
    def long_data_tokens(self) -> int:
        """Tokens of stage 3's own corpus: `data.long_tokens`, or stage 3's draw."""
        b = self.finetune
        return self.data.long_tokens or b.steps * b.seq_len * b.batch_size + 1

    @property
    def heldout_tokens(self) -> int:
        return self.scaling.length * self.scaling.num_docs + 1

    def twin_options(self) -> dict[str, bool]:
        """The Lightning layers' config fields (what the aligned twins are built with)."""
        return {"lightning_rope": self.model.lightning_rope, "lightning_qk_norm": self.model.lightning_qk_norm}

    def student_options(self) -> dict[str, bool]:
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
    # ~44M tokens. Distillation at the paper's lr 1e-4 (it was 3e-4 until issue 25: the paper's Table 9 has 3e-4
    # among the worst). At the tokens/s measured on an H200 shared with other jobs (align 34K, distill 42K, fine-tune 101K;
    # docs/results/smollm2-135m.md) that is ~16 minutes for a ~135M teacher; alone on the GPU (align 68-84K,
    # distill 56-58K, fine-tune 102K tokens/s; bench/smollm2/probe.py) ~12 minutes.
    return {
        "align": StageBudget(6_000_000, 512, 32, 1e-3, 1e-5, warmup_steps=20, checkpoint_every=100),
        "distill": StageBudget(30_000_000, 512, 32, 1e-4, 1e-5, warmup_steps=50, checkpoint_every=200),
        "finetune": StageBudget(8_000_000, 16384, 4, 1e-5, 1e-5, schedule="constant", warmup_steps=0,
                                checkpoint_every=40),
    }


# halo-smollm2: a recipe (budgets and data for one teacher on one machine), hyla.convert.recipes.
PRESETS = ("smoke", "quick", "small", "paper", "halo-smollm2")


def make_plan(preset: str, teacher_params: int) -> ConvertPlan:
    """The plan of `preset` for a teacher of `teacher_params` parameters."""
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


def _parse_value(text: str, current: Any) -> Any:
    if isinstance(current, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text.lower() == "true"
    if isinstance(current, list):
        return [None if item in ("none", "off") else _scalar(item) for item in text.split(",") if item]
    if current is None or isinstance(current, (int, float)):
        return None if text.lower() in ("none", "off") else _scalar(text)
    return text


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(plan: ConvertPlan, overrides: list[str]) -> ConvertPlan:
    """Apply `section.field=value` (or `field=value` for top-level fields) overrides, e.g.
    `distill.lr=3e-5`, `align.tokens=1e6`, `selection.niah_lengths=2048,4096`, `selection.k=4`,
    `model.lightning_rope=false`."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form section.field=value")
        key, text = item.split("=", 1)
        *path, name = key.strip().split(".")
        target: Any = plan
        for part in path:
            if not hasattr(target, part) or not dataclasses.is_dataclass(getattr(target, part)):
                raise ValueError(f"unknown setting {key!r}; sections: align, distill, finetune, selection, scaling, model")
            target = getattr(target, part)
        if not dataclasses.is_dataclass(target) or name not in {f.name for f in dataclasses.fields(target)}:
            raise ValueError(f"unknown setting {key!r}")
        value = _parse_value(text, getattr(target, name))
        if name == "tokens" and isinstance(value, float):
            value = int(value)
        setattr(target, name, value)
    if plan.align.checkpoint_activations:
        raise ValueError("align.checkpoint_activations: the alignment trains each layer pair on its own and keeps "
                         "little; set it for distill or finetune")
    return plan
