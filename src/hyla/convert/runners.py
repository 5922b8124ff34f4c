"""What each conversion stage does, given the shared context of a run (`Run`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from hyla.compile import compile_blocks, release_cuda_graphs
from hyla.convert.align import AlignmentTwins, alignment_loss
from hyla.convert.align_batched import choose_alignment_path
from hyla.convert.data import corpus_mix, prepared_corpus, split_corpus, training_loader
from hyla.convert.distill import (StudentWithTeacher, bf16_teacher, build_student, distill_loss, finetune_loss,
                                  freeze)
from hyla.convert.presets import UNALIGNED_MIXERS, ConvertPlan, StageBudget
from hyla.convert.stages import Stage
from hyla.models.modeling import use_autocast_activations, use_fused_projections
from hyla.models.transfer import to_hypenet
from hyla.ops.lightning import chunk_kernel_as_custom_op
from hyla.train import LoopSettings, OptimSettings, run_training
from hyla.train.activations import checkpoint_activations
from hyla.train.distributed import Distributed, barrier
from hyla.train.fast import FastPath, resolve_fast_path
from hyla.train.parallel import (DataParallelChoice, choose_data_parallel, data_parallel, device_memory_bytes,
                                 replica_bytes)
from hyla.train.weights import full_state_dict, load_weights, save_weights


@dataclass
class Run:
    """Everything the stages share: the teacher, its tokenizer, the plan, the process group, the stage folders."""

    teacher_spec: str
    hf_teacher: Any
    tokenizer: Any
    plan: ConvertPlan
    env: Distributed
    stages: dict[str, Stage]
    data_sources: list[str]
    log: Any = print
    cache: dict = field(default_factory=dict)

    def teacher_equivalent(self):
        """The teacher as a HypeNet with attention (and RoPE) in every layer: exact logits of the teacher."""
        if "teacher_eq" not in self.cache:
            self.cache["teacher_eq"] = to_hypenet(self.hf_teacher, attention_rope=True).to(self.env.device).eval()
        return self.cache["teacher_eq"]

    def frozen_teacher(self, budget: StageBudget):
        """The teacher a training stage reads (`budget.teacher_bf16`: a bf16 copy, made once; else the
        teacher-equivalent itself)."""
        if not budget.teacher_bf16:
            return self.teacher_equivalent()
        if "teacher_bf16" not in self.cache:
            self.cache["teacher_bf16"] = bf16_teacher(self.teacher_equivalent())
        return self.cache["teacher_bf16"]

    def twin_config(self):
        """The config the stage-1 twins are built with: the teacher's sizes, the plan's twin options."""
        if "twin_config" not in self.cache:
            config = copy.deepcopy(self.teacher_equivalent().config)
            for name, value in self.plan.twin_options().items():
                setattr(config, name, value)
            self.cache["twin_config"] = config
        return self.cache["twin_config"]

    def build_student(self, attention_layers: list[int], **config_fields):
        """The hybrid with attention at `attention_layers` and the stage-1 twins elsewhere (not yet on the device)."""
        return build_student(self.hf_teacher, attention_layers, self.stages["align"].path / "twins.safetensors",
                             **self.student_build_options(), **config_fields)

    def student_build_options(self) -> dict:
        """`build_student`'s options of this plan: the RNN mixer and the student options."""
        return {"rnn_mixer": self.plan.model.rnn_mixer, **self.plan.student_options()}

    def _data_results(self) -> dict:
        data = self.stages["data"]
        manifest = data.read_manifest()
        if manifest is None:
            raise ValueError(f"the data stage is not complete ({data.manifest_path} is missing); rerun without "
                             f"--from-stage, or with --from-stage data")
        return manifest["results"]

    def _checked_corpus(self, stored: str, what: str) -> Path:
        """A corpus path from the data stage's manifest (relative to its folder, so a moved run finds it)."""
        path = self.stages["data"].resolve(stored)
        if not (path / "manifest.json").is_file():
            raise FileNotFoundError(f"the {what} {path} (the data stage's output) is missing or incomplete; "
                                    f"rerun with --from-stage data")
        return path

    def corpus_path(self) -> Path:
        """The conversion corpus (the main one)."""
        return self._checked_corpus(self._data_results()["corpus"], "conversion corpus")

    def corpus(self):
        if "corpus" not in self.cache:
            self.cache["corpus"] = split_corpus(self.corpus_path(), self.plan.heldout_tokens)
        return self.cache["corpus"]

    def extra_corpus(self, name: str):
        """The data stage's `long` or `scaling` corpus (a TokenCorpus), or None when the plan has none."""
        from hyla.data.loader import TokenCorpus

        corpora = self._data_results().get("corpora", {})
        if name not in corpora:
            return None
        return TokenCorpus(self._checked_corpus(corpora[name]["path"], f"{name} corpus"))

    def training_corpus(self, name: str):
        """(name, corpus) a training stage draws from: `long` for stage 3 when there is one, else the main head."""
        if name == "long" and (corpus := self.extra_corpus("long")) is not None:
            return "long", corpus
        return "main", self.corpus()[0]


# What each stage reads from the stages before it: (stage, file in its folder). All but export read the corpus.
STAGE_INPUTS = {
    "select": [("align", "twins.safetensors")], "distill": [("align", "twins.safetensors")],
    "finetune": [("distill", "student.safetensors")], "scaling": [("finetune", "student.safetensors")],
    "export": [("finetune", "student.safetensors")],
}
READS_CORPUS = ("align", "select", "distill", "finetune", "scaling")
# The data stage's other corpora, when the plan has them: stage 3's long documents, the scaling stage's.
EXTRA_CORPUS = {"finetune": "long", "scaling": "scaling"}


def check_stage_inputs(run: Run, name: str) -> None:
    """Stop with one line naming the file and the stage to redo when an input of stage `name` is missing or damaged,
    before the stage's folder is made."""
    if name in READS_CORPUS:
        run.corpus()
    if name in EXTRA_CORPUS:
        run.extra_corpus(EXTRA_CORPUS[name])
    for source, file_name in STAGE_INPUTS.get(name, ()):
        check_weights_file(run.stages[source].path / file_name, source)


def check_weights_file(path: Path, source: str) -> None:
    """One line naming the stage to redo when `path`, a safetensors file the stage `source` wrote, is missing or
    damaged (its header is read, not its tensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt"):
            pass
    except (SafetensorError, OSError) as err:
        state = "missing" if not path.exists() else f"damaged or truncated ({err})"
        raise ValueError(f"{path} (the {source} stage's output) is {state}; rerun with --from-stage {source}") \
            from None


def stage_fast_path(run: Run, budget: StageBudget, kl: bool = False, hybrid: bool = False,
                    twins: bool = False) -> FastPath:
    """The fast-path settings `budget` resolves to on this run's device (printed, and kept in the manifest); `kl`:
    the stage's loss is the fused KL (stage 2), the only one whose kernel `budget.kl_kernel` chooses; `hybrid`: the
    stage trains the whole hybrid (stages 2-3), the only ones whose input projections `budget.fused_projections`
    fuses; `twins`: the stage trains stage 1's twins, the only one that `budget.cuda_graphs` replays."""
    return resolve_fast_path(compile=budget.compile, fused_loss=budget.fused_loss,
                             fused_optimizer=budget.fused_optimizer, micro_batch_size=budget.micro_batch_size,
                             device=run.env.device, whole_blocks=budget.whole_blocks,
                             kl_kernel=budget.kl_kernel if kl else "torch", compile_mode=budget.compile_mode,
                             fused_projections=budget.fused_projections if hybrid else False,
                             cuda_graphs=budget.cuda_graphs if twins else False)


def stage_data_parallel(run: Run, budget: StageBudget, model, teacher=None) -> DataParallelChoice:
    """The data-parallel mode `budget.data_parallel` resolves to for `model` (and its frozen `teacher`) on this
    run's processes (`hyla.train.parallel`: printed, and kept in the manifest)."""
    frozen = [teacher] if teacher is not None else []
    return choose_data_parallel(budget.data_parallel, world_size=run.env.world_size,
                                replica=replica_bytes(model, frozen), device_memory=device_memory_bytes(run.env.device))


def train_budget(run: Run, folder: Path, name: str, model, loss_fn, budget: StageBudget, blocks, root=None,
                 frozen_blocks=(), fast: FastPath | None = None, vocab_size: int | None = None,
                 corpus: str = "main", teacher=None, loss_compiled: bool = False) -> dict:
    """Train `model` for `budget` in `folder` (checkpoints, metrics) on the run's training corpus `corpus`. Under
    torchrun the loss runs through the data-parallel mode of `budget.data_parallel` (`stage_data_parallel`;
    `teacher`, the frozen model the loss reads, counts in its memory rule), with `blocks` as FSDP2's units.
    `vocab_size`: set when the loss is a cross-entropy over that many classes (a collapse check). With
    `fast.compile`, `blocks` and `frozen_blocks` (a teacher's, say) are compiled first, block by block; with
    `budget.checkpoint_activations`, `root` (a HypeNetForCausalLM, default `model`) checkpoints its blocks'
    activations. `loss_fn` must already be the one `fast.fused_loss` asks for; `loss_compiled`: it compiles itself
    under `fast.compile`, and the blocks stay as they are."""
    fast = fast or stage_fast_path(run, budget)
    choice = stage_data_parallel(run, budget, model, teacher)
    run.log(f"[{name}] fast path: {fast.describe()}")
    if teacher is not None and budget.teacher_bf16 is not None:
        run.log(f"[{name}] frozen teacher: {'bf16' if budget.teacher_bf16 else 'float32 weights under bf16 autocast'}")
    run.log(f"[{name}] data parallel: {choice.describe()}")
    if fast.compile and loss_compiled:
        # The loss compiles itself; a frozen teacher's blocks (a bf16 copy's, in stage 1) are compiled as blocks.
        count = compile_blocks(frozen_blocks) if frozen_blocks else 0
        teacher_blocks = f", and {count} frozen teacher blocks" if count else " (no block compiled on its own)"
        run.log(f"[{name}] torch.compile: the loss function, whole{teacher_blocks}")
    elif fast.compile:
        count = compile_blocks([*blocks, *frozen_blocks], mode=fast.compile_mode)
        run.log(f"[{name}] torch.compile: {count} blocks")
    if budget.checkpoint_activations:
        run.log(f"[{name}] activation checkpointing: {checkpoint_activations(root or model)} blocks")
    parallel = data_parallel(model, loss_fn, blocks, choice, run.env)
    corpus_name, corpus_data = run.training_corpus(corpus)
    loader = training_loader(corpus_data, seq_len=budget.seq_len, batch_size=budget.batch_size, seed=run.plan.seed,
                             align_documents=budget.align_documents)
    optim = OptimSettings(lr=budget.lr, min_lr=budget.min_lr, warmup_steps=budget.warmup_steps,
                          schedule=budget.schedule)
    loop = LoopSettings(steps=budget.steps, checkpoint_every=budget.checkpoint_every, description=name,
                        micro_batch_rows=fast.micro_batch_size, fused_optimizer=fast.fused_optimizer,
                        vocab_size=vocab_size)
    with chunk_kernel_as_custom_op(fast.whole_blocks):
        result = run_training(model, parallel, loader, optim, loop, folder, run.env,
                              meta={"stage": name, "settings": budget.settings()}, sync=parallel.sync)
    last = result.metrics[-1] if result.metrics else {}
    tokens = budget.steps * budget.seq_len * budget.batch_size
    rates = sorted(m["tok_per_s"] for m in result.metrics[result.resumed_from:] if "tok_per_s" in m)
    return {"steps": result.steps, "tokens": tokens, "resumed_from_step": result.resumed_from,
            "first": result.metrics[0] if result.metrics else {}, "last": last,
            "fast_path": {**fast.as_dict(), "micro_batch_rows_used": result.micro_batch_rows},
            "data_parallel": choice.as_dict(),
            "median_tok_per_s": rates[len(rates) // 2] if rates else None,
            "data": {"corpus": corpus_name, "windows": len(loader.dataset), "align_documents": budget.align_documents,
                     "epochs": round(budget.steps * budget.batch_size / len(loader.dataset), 3)}}


def run_data(run: Run, stage: Stage) -> dict:
    """The main corpus, and stage 3's and the scaling stage's own when the plan names their sources; each with the
    tokens per source it holds (the mix training draws from)."""
    plan, data = run.plan, run.plan.data
    wanted = [("main", "corpus", run.data_sources, data.weights, plan.data_tokens)]
    if data.long_sources:
        wanted.append(("long", "long", data.long_sources, data.long_weights, plan.long_data_tokens))
    if data.scaling_sources:
        wanted.append(("scaling", "scaling", data.scaling_sources, [], None))
    corpora = {}
    for name, folder, sources, weights, tokens in wanted:
        path = prepare_conversion_corpus(run, stage.path / folder, sources, weights, tokens)
        # Stored relative to the stage folder (absolute only for a prepared corpus elsewhere): the run can move.
        corpora[name] = {**corpus_mix(path), "path": stage.relative(path)}
        if tokens is not None and corpora[name]["num_tokens"] < tokens:
            run.log(f"[data] note: the {name} corpus has {corpora[name]['num_tokens']} tokens, fewer than the "
                    f"{tokens} the plan draws; training repeats it (epochs)")
        for source in corpora[name]["sources"]:
            run.log(f"[data] {name}: {source['num_tokens']:,} tokens ({source['share']:.1%}) from {source['spec']}")
    main = corpora["main"]
    return {"corpus": main["path"], "num_tokens": main["num_tokens"], "corpora": corpora}


def prepare_conversion_corpus(run: Run, folder: Path, sources: list[str], weights: list[float],
                              max_tokens: int | None) -> Path:
    """`sources` tokenized into `folder` (by the main process), or the prepared corpus they name."""
    from hyla.data.tokenize import PrepareSettings, prepare_corpus

    corpus = prepared_corpus(sources)
    if corpus is not None:
        run.log(f"[data] using the prepared corpus {corpus}")
        return corpus
    settings = PrepareSettings(tokenizer=run.teacher_spec, sources=tuple(sources), max_tokens=max_tokens,
                               seed=run.plan.seed, weights=tuple(weights) if weights else None)
    if run.env.is_main:
        prepare_corpus(folder, settings, log=lambda line: run.log(f"[data] {line}"))
    barrier(run.env)
    return folder


def run_align(run: Run, stage: Stage) -> dict:
    rnn_mixer = run.plan.model.rnn_mixer
    teacher = run.frozen_teacher(run.plan.align)
    twins = AlignmentTwins.for_training(teacher, run.hf_teacher, run.twin_config(), run.env.device,
                                        rnn_mixer=rnn_mixer)
    if rnn_mixer in UNALIGNED_MIXERS:
        return measure_unaligned_twins(run, stage, twins)
    init = initialise_twins(run, twins)
    # No LM head in the alignment: there is no head loss to fuse.
    fast = dataclasses.replace(stage_fast_path(run, run.plan.align, twins=True), fused_loss=False)
    parallel = stage_data_parallel(run, run.plan.align, twins, teacher)
    # With align.batched_twins: every twin in one batched problem where the twins allow it
    # (hyla.convert.align_batched); else the per-twin loop, compiled twin by twin on the fast path, and with
    # align.cuda_graphs replayed as CUDA graphs on one process.
    path = choose_alignment_path(twins, compile=fast.compile, data_parallel_mode=parallel.mode,
                                 batched=run.plan.align.batched_twins, whole_twins=fast.whole_blocks,
                                 cuda_graphs=fast.cuda_graphs)
    fast = dataclasses.replace(fast, cuda_graphs=path.cuda_graphs)
    run.log(f"[{stage.name}] alignment loss: {path.describe()}")
    # align.teacher_bf16: the teacher's blocks are compiled too (they record the mixers themselves), on either path.
    frozen = list(teacher.model.layers) if run.plan.align.teacher_bf16 else []
    try:
        summary = train_budget(run, stage.path, stage.name, twins, path.loss_fn, run.plan.align, list(twins.twins),
                               frozen_blocks=frozen, fast=fast, teacher=teacher,
                               loss_compiled=path.compiled and not path.compile_twins)
    finally:
        if path.cuda_graphs:  # the graphs' memory pool would otherwise stay reserved through the later stages
            release_cuda_graphs(run.env.device)
    state = full_state_dict(twins)
    save_weights({k.removeprefix("twins."): v for k, v in state.items()}, stage.path / "twins.safetensors", run.env)
    per_layer = {k: v for k, v in summary["last"].items() if k.startswith("mse_")}
    first = {k: v for k, v in summary["first"].items() if k.startswith("mse_")}
    return {**summary, "alignment_loss": path.as_dict(), "mse_first": first, "mse_last": per_layer, "init": init}


def measure_unaligned_twins(run: Run, stage: Stage, twins: AlignmentTwins) -> dict:
    """Stage 1 for twins that are the teacher's own attention (SWA): no training, no output-scale init. The twins
    are saved as built and their alignment error is measured on `model.twin_init_batches` batches of the stage's
    shape (the fraction of each layer's output energy that the window loses; 0 on sequences within the window):
    the selection's tie-break reads it."""
    budget = run.plan.align
    loader = training_loader(run.corpus()[0], seq_len=budget.seq_len, batch_size=budget.batch_size,
                             seed=run.plan.seed + 1)
    num_layers = len(twins.twins)
    mse, energy = torch.zeros(num_layers, dtype=torch.float64), torch.zeros(num_layers, dtype=torch.float64)
    with torch.no_grad():
        for _ in range(run.plan.model.twin_init_batches):
            batch = next(loader)
            _, metrics = alignment_loss(twins, {"input_ids": batch["input_ids"].to(run.env.device)})
            mse += torch.tensor([metrics[f"mse_{i:02d}"].item() for i in range(num_layers)], dtype=torch.float64)
            energy += torch.tensor([metrics[f"energy_{i:02d}"].item() for i in range(num_layers)], dtype=torch.float64)
    relative = (mse / energy.clamp(min=1e-30)).tolist()
    run.log(f"[align] {run.plan.model.rnn_mixer} twins are the teacher's attention (window "
            f"{run.plan.model.swa_window}): no alignment; error / teacher output energy on "
            f"{run.plan.model.twin_init_batches} x {budget.batch_size} x {budget.seq_len} tokens, median over layers "
            f"{statistics.median(relative):.3g}")
    save_weights(twins.twin_state_dict(), stage.path / "twins.safetensors", run.env)
    mse_by_layer = {f"mse_{i:02d}": value / run.plan.model.twin_init_batches for i, value in enumerate(mse.tolist())}
    return {"steps": 0, "tokens": 0, "aligned": False, "first": {}, "last": {}, "mse": mse_by_layer,
            "relative_error": relative}


def initialise_twins(run: Run, twins: AlignmentTwins) -> dict:
    """Set the twins' output scale from a few batches of the training corpus (`model.twin_init`); what it changed."""
    from hyla.convert.calibrate import calibrate_twins

    model, budget = run.plan.model, run.plan.align
    loader = training_loader(run.corpus()[0], seq_len=budget.seq_len, batch_size=budget.batch_size,
                             seed=run.plan.seed + 1)
    batches = [next(loader) for _ in range(model.twin_init_batches)]
    report = calibrate_twins(twins, batches, model.twin_init)
    before, after = report["relative_error_before"], report["relative_error_after"]
    run.log(f"[align] twin init {model.twin_init} on {len(batches)} x {budget.batch_size} x {budget.seq_len} tokens: "
            f"error / teacher output energy, median over layers {statistics.median(before):.3g} -> "
            f"{statistics.median(after):.3g}, layer 0 {before[0]:.3g} -> {after[0]:.3g}")
    return {"mode": model.twin_init, "batches": len(batches), **report}


def load_twins(run: Run) -> dict[int, torch.nn.Module]:
    """The aligned twins of stage 1, one mixer of the plan's `model.rnn_mixer` per layer."""
    from hyla.models.transfer import TWIN_BUILDERS

    weights = load_file(str(run.stages["align"].path / "twins.safetensors"))
    config = run.twin_config()
    build = TWIN_BUILDERS[run.plan.model.rnn_mixer]
    twins = {}
    for i, layer in enumerate(run.hf_teacher.model.layers):
        twin = build(layer.self_attn, config, i)
        prefix = f"{i}."
        twin.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
        twins[i] = twin.to(run.env.device).eval()
    return twins


def load_student(run: Run, weights_stage: str | None, **config_fields) -> Any:
    """The hybrid of the selected layout, with the weights a training stage saved (or fresh from the stage-1 twins);
    `config_fields` on top of the plan's (the export's chosen attention_logit_scaling_a)."""
    student = stage_student(run.hf_teacher, run.stages, weights_stage, **run.student_build_options(), **config_fields)
    return student.to(run.env.device).float()


def stage_student(hf_teacher, stages: dict[str, Stage], weights_stage: str | None, **build_options) -> Any:
    """The hybrid with attention where the select stage chose and the align stage's twins elsewhere, with the weights
    `weights_stage` saved (None: as built), on the teacher's device. `build_options`: `build_student`'s (rnn_mixer, the
    student options the run was made with, more config fields). It reads the stage folders and no plan, so that
    `hyla convert snapshot` builds a stage's student from what the run recorded."""
    chosen = stages["select"].read_manifest()["results"]["chosen"]
    student = build_student(hf_teacher, chosen, stages["align"].path / "twins.safetensors", **build_options)
    if weights_stage is not None:
        load_weights(student, stages[weights_stage].path / "student.safetensors")
    return student


def _train_student(run: Run, stage: Stage, weights_stage: str | None, loss_fn, budget, teacher,
                   cross_entropy: bool, prepare=None, corpus: str = "main") -> dict:
    scaling = {} if budget.logit_scaling_a is None else {"attention_logit_scaling_a": budget.logit_scaling_a}
    student = load_student(run, weights_stage, **scaling)
    if scaling:
        run.log(f"[{stage.name}] trains with the NoPE attention's logit scaling on: s_t = log(t + a) / log(a), "
                f"a = {budget.logit_scaling_a:g}")
    # `prepare(student)`: the attention alignment on the fresh student, before distillation; its result is reported.
    prepared = prepare(student) if prepare is not None else None
    frozen = freeze(student, budget.freeze)
    if frozen:
        count = sum(p.numel() for name, p in student.named_parameters() if not p.requires_grad)
        run.log(f"[{stage.name}] freeze={budget.freeze}: {len(frozen)} tensors ({count / 1e6:.2f}M weights) of the "
                f"attention layers stay as they come into the stage")
    use_autocast_activations(student, bool(budget.bf16_activations))
    run.log(f"[{stage.name}] activations: " + ("bf16 under autocast (the residual stream and every norm's output)"
                                              if budget.bf16_activations else "float32 residual stream and norms"))
    pair = StudentWithTeacher(student, teacher)
    fast = stage_fast_path(run, budget, kl=not cross_entropy, hybrid=True)
    # The teacher is shared by the stages: its maps are fused for this stage only (the same outputs either way).
    use_fused_projections(student, fast.fused_projections)
    if teacher is not None:
        use_fused_projections(teacher, fast.fused_projections)
    loss = functools.partial(loss_fn, fused=fast.fused_loss)
    if not cross_entropy:  # the KL's kernel (stage 2)
        loss = functools.partial(loss, kernel=fast.kl_kernel)
    summary = train_budget(run, stage.path, stage.name, pair, loss,
                           budget, list(student.model.layers), root=student,
                           frozen_blocks=list(teacher.model.layers) if teacher is not None else (), fast=fast,
                           vocab_size=student.config.vocab_size if cross_entropy else None, corpus=corpus,
                           teacher=teacher)
    if teacher is not None:
        use_fused_projections(teacher, False)
    state = {k.removeprefix("student."): v for k, v in full_state_dict(pair).items()}
    save_weights(state, stage.path / "student.safetensors", run.env)
    return summary if prepared is None else {**summary, "attention_align": prepared}


def run_distill(run: Run, stage: Stage) -> dict:
    prepare = None
    if run.plan.model.align_attention:
        from hyla.convert.align_attention import align_attention_layers

        prepare = functools.partial(align_attention_layers, run, stage)
    return _train_student(run, stage, None, distill_loss, run.plan.distill, run.frozen_teacher(run.plan.distill),
                          cross_entropy=False, prepare=prepare)


def run_finetune(run: Run, stage: Stage) -> dict:
    if run.plan.finetune_skipped:
        return pass_distilled_weights(run, stage)
    return _train_student(run, stage, "distill", finetune_loss, run.plan.finetune, None, cross_entropy=True,
                          corpus="long")


def pass_distilled_weights(run: Run, stage: Stage) -> dict:
    """Stage 3 with `finetune.tokens=0`: no training; the distilled weights become the stage's output unchanged
    (a hard link where the file system allows, else a copy), so the later stages read them as usual."""
    source = run.stages["distill"].path / "student.safetensors"
    target = stage.path / "student.safetensors"
    run.log(f"[finetune] skipped (finetune.tokens=0): the distilled weights {source} go on unchanged")
    if run.env.is_main:
        partial = target.with_name(target.name + ".partial")
        partial.unlink(missing_ok=True)
        try:
            os.link(source, partial)
        except OSError:
            shutil.copyfile(source, partial)
        os.replace(partial, target)
    barrier(run.env)
    return {"skipped": True, "steps": 0, "tokens": 0, "weights_from": stage.relative(source), "first": {}, "last": {}}
