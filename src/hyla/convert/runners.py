"""What each conversion stage does, given the shared context of a run (`Run`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from hyla.convert.align import AlignmentTwins, alignment_loss
from hyla.convert.data import heldout_sequences, prepared_corpus, scaling_documents, split_corpus, training_loader
from hyla.convert.distill import StudentWithTeacher, build_student, distill_loss, finetune_loss, mean_loss
from hyla.compile import compile_blocks
from hyla.convert.presets import ConvertPlan, StageBudget
from hyla.convert.stages import Stage
from hyla.convert.transfer import to_hypenet
from hyla.convert.weights import full_state_dict, load_weights, save_weights
from hyla.train import LoopSettings, OptimSettings, run_training
from hyla.train.activations import checkpoint_activations
from hyla.train.distributed import Distributed, barrier
from hyla.train.divergence import UNIFORM_LOSS_TOLERANCE, TrainingDiverged
from hyla.train.fast import FastPath, resolve_fast_path
from hyla.train.parallel import (DataParallelChoice, choose_data_parallel, data_parallel, device_memory_bytes,
                                 replica_bytes)


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

    def twin_config(self):
        """The config the Lightning twins are built with: the teacher's sizes, the plan's Lightning options."""
        if "twin_config" not in self.cache:
            config = copy.deepcopy(self.teacher_equivalent().config)
            for name, value in self.plan.twin_options().items():
                setattr(config, name, value)
            self.cache["twin_config"] = config
        return self.cache["twin_config"]

    def build_student(self, attention_layers: list[int]):
        """The hybrid with attention at `attention_layers` and the stage-1 twins elsewhere (not yet on the device)."""
        return build_student(self.hf_teacher, attention_layers, self.stages["align"].path / "twins.safetensors",
                             **self.plan.student_options())

    def corpus_path(self) -> Path:
        """The conversion corpus, from the data stage's manifest (relative to its folder, so a moved run finds it)."""
        data = self.stages["data"]
        manifest = data.read_manifest()
        if manifest is None:
            raise ValueError(f"the data stage is not complete ({data.manifest_path} is missing); rerun without "
                             f"--from-stage, or with --from-stage data")
        path = data.resolve(manifest["results"]["corpus"])
        if not (path / "manifest.json").is_file():
            raise FileNotFoundError(f"the conversion corpus {path} (the data stage's output) is missing or incomplete; "
                                    f"rerun with --from-stage data")
        return path

    def corpus(self):
        if "corpus" not in self.cache:
            self.cache["corpus"] = split_corpus(self.corpus_path(), self.plan.heldout_tokens)
        return self.cache["corpus"]


# What each stage reads from the stages before it: (stage, file in its folder). All but export read the corpus.
STAGE_INPUTS = {
    "select": [("align", "twins.safetensors")], "distill": [("align", "twins.safetensors")],
    "finetune": [("distill", "student.safetensors")], "scaling": [("finetune", "student.safetensors")],
    "export": [("finetune", "student.safetensors")],
}
READS_CORPUS = ("align", "select", "distill", "finetune", "scaling")


def check_stage_inputs(run: Run, name: str) -> None:
    """Stop with one line naming the file and the stage to redo when an input of stage `name` is missing or damaged,
    before the stage's folder is made."""
    from safetensors import SafetensorError, safe_open

    if name in READS_CORPUS:
        run.corpus()
    for source, file_name in STAGE_INPUTS.get(name, ()):
        path = run.stages[source].path / file_name
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError) as err:
            state = "missing" if not path.exists() else f"damaged or truncated ({err})"
            raise ValueError(f"{path} (the {source} stage's output) is {state}; rerun with --from-stage {source}") \
                from None


def stage_fast_path(run: Run, budget: StageBudget) -> FastPath:
    """The fast-path settings `budget` resolves to on this run's device (printed, and kept in the manifest)."""
    return resolve_fast_path(compile=budget.compile, fused_loss=budget.fused_loss,
                             fused_optimizer=budget.fused_optimizer, micro_batch_size=budget.micro_batch_size,
                             device=run.env.device)


def stage_data_parallel(run: Run, budget: StageBudget, model, teacher=None) -> DataParallelChoice:
    """The data-parallel mode `budget.data_parallel` resolves to for `model` (and its frozen `teacher`) on this
    run's processes (`hyla.train.parallel`: printed, and kept in the manifest)."""
    frozen = [teacher] if teacher is not None else []
    return choose_data_parallel(budget.data_parallel, world_size=run.env.world_size,
                                replica=replica_bytes(model, frozen), device_memory=device_memory_bytes(run.env.device))


def train_budget(run: Run, folder: Path, name: str, model, loss_fn, budget: StageBudget, blocks, root=None,
                 frozen_blocks=(), fast: FastPath | None = None, vocab_size: int | None = None,
                 teacher=None) -> dict:
    """Train `model` for `budget` in `folder` (checkpoints, metrics). Under torchrun the loss runs through the
    data-parallel mode of `budget.data_parallel` (`stage_data_parallel`; `teacher`, the frozen model the loss
    reads, counts in its memory rule), with `blocks` as FSDP2's units. `vocab_size`: set when the loss is a
    cross-entropy over that many classes (a collapse check). With `fast.compile`, `blocks` and `frozen_blocks` (a
    teacher's, say) are compiled first, block by block; with `budget.checkpoint_activations`, `root` (a
    HypeNetForCausalLM, default `model`) checkpoints its blocks' activations. `loss_fn` must already be the one
    `fast.fused_loss` asks for."""
    fast = fast or stage_fast_path(run, budget)
    choice = stage_data_parallel(run, budget, model, teacher)
    run.log(f"[{name}] fast path: {fast.describe()}")
    run.log(f"[{name}] data parallel: {choice.describe()}")
    if fast.compile:
        count = compile_blocks([*blocks, *frozen_blocks])
        run.log(f"[{name}] torch.compile: {count} blocks")
    if budget.checkpoint_activations:
        run.log(f"[{name}] activation checkpointing: {checkpoint_activations(root or model)} blocks")
    parallel = data_parallel(model, loss_fn, blocks, choice, run.env)
    loader = training_loader(run.corpus()[0], seq_len=budget.seq_len, batch_size=budget.batch_size, seed=run.plan.seed)
    optim = OptimSettings(lr=budget.lr, min_lr=budget.min_lr, warmup_steps=budget.warmup_steps,
                          schedule=budget.schedule)
    loop = LoopSettings(steps=budget.steps, checkpoint_every=budget.checkpoint_every, description=name,
                        micro_batch_rows=fast.micro_batch_size, fused_optimizer=fast.fused_optimizer,
                        vocab_size=vocab_size)
    result = run_training(model, parallel, loader, optim, loop, folder, run.env,
                          meta={"stage": name, "settings": budget.settings()}, sync=parallel.sync)
    last = result.metrics[-1] if result.metrics else {}
    tokens = budget.steps * budget.seq_len * budget.batch_size
    rates = sorted(m["tok_per_s"] for m in result.metrics[result.resumed_from:] if "tok_per_s" in m)
    return {"steps": result.steps, "tokens": tokens, "resumed_from_step": result.resumed_from,
            "first": result.metrics[0] if result.metrics else {}, "last": last,
            "fast_path": {**fast.as_dict(), "micro_batch_rows_used": result.micro_batch_rows},
            "data_parallel": choice.as_dict(),
            "median_tok_per_s": rates[len(rates) // 2] if rates else None}


def run_data(run: Run, stage: Stage) -> dict:
    from hyla.data.tokenize import PrepareSettings, prepare_corpus

    sources = run.data_sources
    corpus = prepared_corpus(sources)
    if corpus is not None:
        run.log(f"[data] using the prepared corpus {corpus}")
    else:
        corpus = stage.path / "corpus"
        settings = PrepareSettings(tokenizer=run.teacher_spec, sources=tuple(sources),
                                   max_tokens=run.plan.data_tokens, seed=run.plan.seed)
        if run.env.is_main:
            prepare_corpus(corpus, settings, log=lambda line: run.log(f"[data] {line}"))
        barrier(run.env)
    manifest = json.loads((corpus / "manifest.json").read_text())
    tokens = manifest.get("num_tokens") or sum(s["num_tokens"] for s in manifest["shards"])
    if tokens < run.plan.data_tokens:
        run.log(f"[data] note: the corpus has {tokens} tokens, fewer than the {run.plan.data_tokens} the plan draws; "
                f"training repeats it (epochs)")
    return {"corpus": stage.relative(corpus), "num_tokens": tokens}


def run_align(run: Run, stage: Stage) -> dict:
    twins = AlignmentTwins.for_training(run.teacher_equivalent(), run.hf_teacher, run.twin_config(), run.env.device)
    # No LM head in the alignment: there is no head loss to fuse.
    fast = dataclasses.replace(stage_fast_path(run, run.plan.align), fused_loss=False)
    summary = train_budget(run, stage.path, stage.name, twins, alignment_loss, run.plan.align, list(twins.twins),
                           fast=fast, teacher=run.teacher_equivalent())
    state = full_state_dict(twins)
    save_weights({k.removeprefix("twins."): v for k, v in state.items()}, stage.path / "twins.safetensors", run.env)
    per_layer = {k: v for k, v in summary["last"].items() if k.startswith("mse_")}
    first = {k: v for k, v in summary["first"].items() if k.startswith("mse_")}
    return {**summary, "mse_first": first, "mse_last": per_layer}


def load_twins(run: Run) -> dict[int, torch.nn.Module]:
    """The aligned twins of stage 1, one LightningAttention per layer."""
    from hyla.convert.transfer import lightning_from_attention

    weights = load_file(str(run.stages["align"].path / "twins.safetensors"))
    config = run.twin_config()
    twins = {}
    for i, layer in enumerate(run.hf_teacher.model.layers):
        twin = lightning_from_attention(layer.self_attn, config, i)
        prefix = f"{i}."
        twin.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
        twins[i] = twin.to(run.env.device).eval()
    return twins


def load_student(run: Run, weights_stage: str | None) -> Any:
    """The hybrid of the selected layout, with the weights a training stage saved (or fresh from the stage-1 twins)."""
    chosen = run.stages["select"].read_manifest()["results"]["chosen"]
    student = run.build_student(chosen)
    if weights_stage is not None:
        load_weights(student, run.stages[weights_stage].path / "student.safetensors")
    return student.to(run.env.device).float()


def _train_student(run: Run, stage: Stage, weights_stage: str | None, loss_fn, budget, teacher,
                   cross_entropy: bool) -> dict:
    student = load_student(run, weights_stage)
    pair = StudentWithTeacher(student, teacher)
    fast = stage_fast_path(run, budget)
    summary = train_budget(run, stage.path, stage.name, pair, functools.partial(loss_fn, fused=fast.fused_loss),
                           budget, list(student.model.layers), root=student,
                           frozen_blocks=list(teacher.model.layers) if teacher is not None else (), fast=fast,
                           vocab_size=student.config.vocab_size if cross_entropy else None, teacher=teacher)
    state = {k.removeprefix("student."): v for k, v in full_state_dict(pair).items()}
    save_weights(state, stage.path / "student.safetensors", run.env)
    return summary


def run_distill(run: Run, stage: Stage) -> dict:
    return _train_student(run, stage, None, distill_loss, run.plan.distill, run.teacher_equivalent(),
                          cross_entropy=False)


def run_finetune(run: Run, stage: Stage) -> dict:
    return _train_student(run, stage, "distill", finetune_loss, run.plan.finetune, None, cross_entropy=True)


def run_scaling(run: Run, stage: Stage) -> dict:
    """Choose the logit-scaling constant a: lowest loss on held-out windows longer than stage 3's sequences."""
    plan = run.plan.scaling
    if plan.length <= run.plan.finetune.seq_len:
        run.log(f"[scaling] note: held-out length {plan.length} is not beyond stage 3's {run.plan.finetune.seq_len}")
    if plan.data is None:
        sequences, spans = heldout_sequences(run.corpus()[1], length=plan.length, num_docs=plan.num_docs)
    else:
        sequences, spans = scaling_documents(plan)
    if max(spans) < plan.length // 4:
        run.log(f"[scaling] note: no held-out window holds more than {max(spans)} tokens of one document, so the "
                f"choice sees no dependency longer than that; set scaling.data to a corpus of long documents")
    student = load_student(run, "finetune").eval()
    losses = {}
    for a in plan.candidates:
        student.config.attn_logits_scaling_a = a
        losses[str(a)] = mean_loss(student, sequences)
        run.log(f"[scaling] a={a}: held-out loss {losses[str(a)]:.4f} over {len(sequences)} x {plan.length} tokens")
    best = _best_scaling(plan.candidates, losses, student.config.vocab_size)
    if run.env.is_main:
        _plot_scaling(losses, stage.path / "scaling.png", plan.length)
    return {"chosen_a": best, "loss_by_a": losses, "length": plan.length, "num_docs": len(sequences),
            "source": plan.data or "held-out tail", "longest_document_tokens": spans}


def _best_scaling(candidates: list, losses: dict[str, float], vocab_size: int):
    """The candidate a of lowest held-out loss; TrainingDiverged when no loss is finite or every one is ln(vocabulary),
    the loss of a uniform prediction (a student that collapsed in training would otherwise be exported)."""
    uniform = math.log(vocab_size)
    finite = [a for a in candidates if math.isfinite(losses[str(a)])]
    if not finite or all(abs(losses[str(a)] - uniform) < UNIFORM_LOSS_TOLERANCE for a in finite):
        shown = ", ".join(f"{losses[str(a)]:.4f}" for a in candidates)
        raise TrainingDiverged(
            f"scaling: the held-out loss is {shown} for a in {candidates}, where a uniform prediction scores "
            f"ln({vocab_size}) = {uniform:.4f}: the student collapsed in training (a learning rate too high?); "
            f"lower distill.lr or finetune.lr and rerun with --from-stage distill"
        )
    return min(finite, key=lambda a: losses[str(a)])


def _plot_scaling(losses: dict, path: Path, length: int) -> None:
    from hyla.outputs import new_figure, save_figure

    figure, axis = new_figure()
    labels = list(losses)
    axis.bar(range(len(labels)), [losses[k] for k in labels])
    axis.set_xticks(range(len(labels)), ["off" if k == "None" else k for k in labels])
    axis.set_xlabel("logit scaling a")
    axis.set_ylabel(f"held-out loss at {length} tokens")
    low, high = min(losses.values()), max(losses.values())
    axis.set_ylim(low - 0.1 * (high - low + 1e-3), high + 0.1 * (high - low + 1e-3))
    save_figure(figure, path)
