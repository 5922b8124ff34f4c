"""The scaling stage: choose the logit-scaling constant `a` (docs/method.md, "Attention layer and logit scaling") by
the lowest held-out loss on long documents (`scaling.criterion=loss`, the method's choice) or by the lowest loss on
the answer tokens of long-range recall documents (`scaling.criterion=recall`, `hyla.convert.scaling_recall`), and
report for every candidate, and for EME's per-length factor c(L) = log L / log L0 (docs/method.md, "EME"), the loss
by position, the recall documents' answer scores when `scaling.recall_source` is set, and, when asked, NIAH at long
lengths.

Where the documents come from, first found: `scaling.data` (a prepared corpus folder), the data stage's `scaling`
corpus (`data.scaling_sources`, e.g. held-out AA-LCR bundles), the main corpus's held-out tail; the recall documents
are built in this stage from `scaling.recall_source`. The choice is among the `a` candidates, by either criterion;
both are reported whichever chose, and c(L) and NIAH are reported beside them, not chosen from. A student whose every
held-out loss is non-finite or that of a uniform prediction stops the run (`TrainingDiverged`) instead of being
exported, whichever the criterion. Losses are computed under the training loop's autocast, one document at a time, the
LM head in row chunks (no [T, V] logits); NIAH runs after every loss, on the model cast to bfloat16 (as `hyla eval`).
Each candidate is an `InferenceOptions` the student runs under; its config is left as loaded (the export writes the
chosen a into it).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hyla.convert.data import heldout_sequences, scaling_documents
from hyla.models import InferenceOptions
from hyla.train.divergence import UNIFORM_LOSS_TOLERANCE, TrainingDiverged

PER_LENGTH = "c(L)"
# LM-head rows at once: 4096 x 49K float32 logits = 0.8 GB.
HEAD_CHUNK_ROWS = 4096


@torch.no_grad()
def position_scores(model, sequences,
                    options: InferenceOptions | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each sequence (the rows of [N, T], or a list of [T_i] of any lengths), its per-token next-token loss [T-1]
    (float32, on CPU) and whether the greedy prediction is that token [T-1] (bool); one sequence at a time, the model
    running under `options` (None: its own)."""
    from hyla.train.loop import training_autocast

    scores = []
    for row in sequences:
        ids = row[None].to(model.device)
        losses, hits = [], []
        with training_autocast(model.device):
            hidden = model.model(ids, use_cache=False, inference_options=options).last_hidden_state[0, :-1]
            targets = ids[0, 1:]
            for start in range(0, targets.numel(), HEAD_CHUNK_ROWS):
                logits = model.lm_head(hidden[start:start + HEAD_CHUNK_ROWS]).float()
                chunk = targets[start:start + HEAD_CHUNK_ROWS]
                losses.append(F.cross_entropy(logits, chunk, reduction="none"))
                hits.append(logits.argmax(dim=-1) == chunk)
        scores.append((torch.cat(losses).cpu(), torch.cat(hits).cpu()))
    return scores


def position_losses(model, sequences: torch.Tensor, options: InferenceOptions | None = None) -> torch.Tensor:
    """Per-token next-token loss [N, T-1] (float32, on CPU) of [N, T] sequences (`position_scores`)."""
    return torch.stack([losses for losses, _ in position_scores(model, sequences, options)])


def candidate_options(plan, train_length: int) -> dict[str, InferenceOptions]:
    """Label → how the student runs for each candidate: every `a` (per-query s_t with that a; None = off), then
    c(L) with L0 = `train_length`."""
    candidates = {str(a): InferenceOptions(logit_scaling="off") if a is None else InferenceOptions(logit_scaling_a=a)
                  for a in plan.candidates}
    if plan.per_length:
        candidates[PER_LENGTH] = InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=train_length)
    return candidates


def scaling_sequences(run, stage, plan):
    """(sequences [N, length], longest document span per window, where they came from: `scaling.data` as given, the
    data stage's scaling corpus relative to this stage's folder, or "held-out tail")."""
    if plan.data is not None:
        return (*scaling_documents(plan), plan.data)
    corpus = run.extra_corpus("scaling")
    if corpus is not None:
        from hyla.convert.data import long_documents

        return (*long_documents(corpus, length=plan.length, num_docs=plan.num_docs), stage.relative(corpus.path))
    return (*heldout_sequences(run.corpus()[1], length=plan.length, num_docs=plan.num_docs), "held-out tail")


def niah_scores(model, tokenizer, plan, samples_cache: dict,
                generation_paths: set[str] | None = None) -> dict[str, dict]:
    """Mean NIAH score per `TASK@LENGTH` cell over `plan.niah_samples` prompts (built once, shared by every
    candidate), with its standard error. The cells share one generation, as `hyla eval niah`'s do: one engine,
    reserved for the longest length, serves every cell (a prompt's positions in a longer buffer are computed as in
    one of its own size). generation_paths: the generation's path is added to it."""
    from hyla.convert.selection import mean_and_stderr
    from hyla.evals import niah as niah_eval
    from hyla.evals.generation import Generation

    generation = Generation(model)
    if generation_paths is not None:
        generation_paths.add(generation.path)
    cells = {}
    if plan.niah_samples > 0 and plan.niah_lengths and plan.niah_tasks:
        generation.reserve(1, niah_eval.niah_positions(plan.niah_lengths, plan.niah_max_new_tokens))
    for length in plan.niah_lengths:
        for task in plan.niah_tasks:
            key = f"{task}@{length}"
            if key not in samples_cache:
                samples_cache[key] = niah_eval.build_samples(tokenizer, task, length, plan.niah_samples, 42)
            records = niah_eval.evaluate_samples(model, tokenizer, samples_cache[key], batch_size=1,
                                                 max_new_tokens=plan.niah_max_new_tokens, generation=generation)
            mean, stderr = mean_and_stderr([record["score"] for record in records])
            cells[key] = {"score": mean, "stderr": stderr, "num_samples": len(records)}
    return cells


def run_scaling(run, stage) -> dict:
    """Choose `a`; report loss curves (recall answer scores, NIAH) for every candidate and c(L)."""
    from hyla.convert.runners import load_student
    from hyla.evals.generation import compile_record
    from hyla.inference.generate import generation_path_record

    plan = run.plan.scaling
    trained = run.plan.trained_seq_len
    if plan.length <= trained:
        run.log(f"[scaling] note: held-out length {plan.length} is not beyond the {trained} tokens the student "
                f"trained on")
    sequences, spans, source = scaling_sequences(run, stage, plan)
    if max(spans) < plan.length // 4:
        run.log(f"[scaling] note: no held-out window holds more than {max(spans)} tokens of one document, so the "
                f"choice sees no dependency longer than that; set data.scaling_sources to long documents")
    recall_docs = scaling_recall_sequences(run, plan)
    student = load_student(run, "finetune").eval()
    candidates = candidate_options(plan, trained)
    # Where the stage's time goes (sitting D's took 129 s, sitting C's 85 s, the same grid): each pass's seconds.
    seconds: dict[str, dict[str, float]] = {"loss": {}, "niah": {}}
    losses, curves, recall = score_candidates(run, student, candidates, sequences, recall_docs, seconds)
    niah, generation_paths = {}, set()
    if plan.niah_lengths and plan.niah_samples > 0:
        student.to(torch.bfloat16)
        samples_cache: dict = {}
        for label, options in candidates.items():
            # the evaluation generates through the model's own options (the engine, or transformers' generate)
            student.inference_options = options
            started = time.perf_counter()
            niah[label] = niah_scores(student, run.tokenizer, plan, samples_cache, generation_paths)
            seconds["niah"][label] = round(time.perf_counter() - started, 2)
            run.log(f"[scaling] {label}: NIAH " + ", ".join(f"{key} {cell['score']:.2f}"
                                                             for key, cell in niah[label].items()))
        student.inference_options = InferenceOptions()
    recall_losses = {label: scores["loss"] for label, scores in recall.items()}
    best = best_scaling(plan.candidates, losses, student.config.vocab_size,
                        recall_losses=recall_losses if plan.criterion == "recall" else None)
    run.log(f"[scaling] chosen a = {best} by the lowest "
            + ("answer loss on the recall documents" if plan.criterion == "recall" else "held-out loss"))
    if run.env.is_main:
        plot_scaling(losses, curves, niah, stage.path / "scaling.png", plan.length, recall_losses)
    return {"chosen_a": best, "criterion": plan.criterion,
            "loss_by_a": {str(a): losses[str(a)] for a in plan.candidates},
            "loss_per_length": losses.get(PER_LENGTH), "per_length_train_length": trained if plan.per_length else None,
            "loss_by_position": curves, **recall_results(plan, recall, recall_docs), "niah": niah,
            "generation_path": generation_path_record(*generation_paths),
            "length": plan.length, "num_docs": len(sequences), "source": source, "longest_document_tokens": spans,
            "seconds_by_candidate": seconds, "compile": compile_record()}


def scaling_recall_sequences(run, plan) -> list:
    """The recall documents every candidate's answer loss is measured on (`hyla.convert.scaling_recall`); [] when
    `scaling.recall_source` is not set."""
    from hyla.convert.scaling_recall import recall_sequences

    if plan.recall_source is None:
        return []
    lengths = plan.recall_lengths or [plan.length]
    sequences = recall_sequences(run.tokenizer, plan.recall_source, lengths=lengths, num_docs=plan.recall_docs)
    answers = [seq.answer.stop - seq.answer.start for seq in sequences]
    run.log(f"[scaling] recall documents: {plan.recall_docs} of each of {lengths} tokens (made: "
            f"{min(len(seq.ids) for seq in sequences)}-{max(len(seq.ids) for seq in sequences)}), answers of "
            f"{min(answers)}-{max(answers)} tokens, on {plan.recall_source}")
    return sequences


def score_candidates(run, student, candidates: dict, sequences, recall_docs: list, seconds: dict):
    """Per candidate label: the held-out loss, its loss by position, and (with recall documents) the answer scores
    (`hyla.convert.scaling_recall.answer_scores`); `seconds` gets each pass's time."""
    from hyla.convert.scaling_recall import answer_scores
    from hyla.evals.ppl import bucket_means, default_bucket_edges

    losses, curves, recall = {}, {}, {}
    edges = default_bucket_edges(sequences.shape[1])
    for label, options in candidates.items():
        started = time.perf_counter()
        token_losses = position_losses(student, sequences, options)
        seconds["loss"][label] = round(time.perf_counter() - started, 2)
        losses[label] = token_losses.mean().item()
        curves[label] = bucket_means(token_losses, edges)
        line = (f"[scaling] {'a=' + label if label != PER_LENGTH else label}: held-out loss {losses[label]:.4f} "
                f"over {len(sequences)} x {sequences.shape[1]} tokens")
        if recall_docs:
            started = time.perf_counter()
            recall[label] = answer_scores(recall_docs, position_scores(student, [d.ids for d in recall_docs], options))
            seconds.setdefault("recall", {})[label] = round(time.perf_counter() - started, 2)
            line += (f"; recall answer loss {recall[label]['loss']:.4f}, tokens right "
                     f"{recall[label]['token_accuracy']:.3f}, exact {recall[label]['exact']:.2f} over "
                     f"{len(recall_docs)} documents")
        run.log(line)
    return losses, curves, recall


def recall_results(plan, recall: dict, recall_docs: list) -> dict:
    """The recall documents' part of the stage's results (none without `scaling.recall_source`)."""
    if not recall:
        return {}
    by_a = {name: {str(a): recall[str(a)][key] for a in plan.candidates}
            for name, key in (("recall_loss_by_a", "loss"), ("recall_accuracy_by_a", "token_accuracy"),
                              ("recall_exact_by_a", "exact"))}
    return {**by_a, "recall_per_length": recall.get(PER_LENGTH),
            "recall_by_length": {label: scores["by_length"] for label, scores in recall.items()},
            "recall_documents": {"source": plan.recall_source, "num_docs": len(recall_docs),
                                 "tokens": [len(doc.ids) for doc in recall_docs],
                                 "answer_tokens": [doc.answer.stop - doc.answer.start for doc in recall_docs]}}


def best_scaling(candidates: list, losses: dict[str, float], vocab_size: int,
                 recall_losses: dict[str, float] | None = None):
    """The candidate a of lowest held-out loss, or with `recall_losses` (`scaling.criterion=recall`) of lowest answer
    loss on the recall documents. Either way TrainingDiverged when no held-out loss is finite or every one is
    ln(vocabulary), the loss of a uniform prediction (a student that collapsed in training would otherwise be
    exported), or when no candidate has a finite loss of both kinds."""
    uniform = math.log(vocab_size)
    finite = [a for a in candidates if math.isfinite(losses[str(a)])]
    if not finite or all(abs(losses[str(a)] - uniform) < UNIFORM_LOSS_TOLERANCE for a in finite):
        shown = ", ".join(f"{losses[str(a)]:.4f}" for a in candidates)
        raise TrainingDiverged(
            f"scaling: the held-out loss is {shown} for a in {candidates}, where a uniform prediction scores "
            f"ln({vocab_size}) = {uniform:.4f}: the student collapsed in training (a learning rate too high?); "
            f"lower distill.lr or finetune.lr and rerun with --from-stage distill"
        )
    if recall_losses is None:
        return min(finite, key=lambda a: losses[str(a)])
    eligible = [a for a in finite if math.isfinite(recall_losses[str(a)])]
    if not eligible:
        raise TrainingDiverged(f"scaling: the answer loss on the recall documents is not finite for any a in "
                               f"{candidates}; lower distill.lr or finetune.lr and rerun with --from-stage distill")
    return min(eligible, key=lambda a: recall_losses[str(a)])


def plot_scaling(losses: dict, curves: dict, niah: dict, path: Path, length: int,
                 recall_losses: dict | None = None) -> None:
    """Loss per candidate (bars; with recall documents their answer loss beside it), loss by position per
    candidate, and NIAH per candidate when measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hyla.outputs import save_figure

    panels = 3 if niah else 2
    figure, axes = plt.subplots(1, panels, figsize=(5.0 * panels, 4.0))
    labels = list(losses)
    names = ["off" if label == "None" else label for label in labels]
    axes[0].bar(range(len(labels)), [losses[label] for label in labels])
    axes[0].set_xticks(range(len(labels)), names)
    axes[0].set_xlabel("logit scaling a (c(L): EME per length)")
    axes[0].set_ylabel(f"held-out loss at {length} tokens")
    low, high = min(losses.values()), max(losses.values())
    axes[0].set_ylim(low - 0.1 * (high - low + 1e-3), high + 0.1 * (high - low + 1e-3))
    if recall_losses:
        # the answer loss on its own scale: a line over the bars
        answer_axis = axes[0].twinx()
        answer_axis.plot(range(len(labels)), [recall_losses[label] for label in labels], "o-", color="tab:red")
        answer_axis.set_ylabel("recall answer loss", color="tab:red")
    for label, name in zip(labels, names):
        buckets = curves[label]
        axes[1].plot([(b["start"] + b["end"]) / 2 for b in buckets], [b["loss"] for b in buckets], marker=".",
                     label=name)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("position (bucket centre)")
    axes[1].set_ylabel("mean loss")
    axes[1].legend(fontsize="small")
    if niah:
        cells = list(next(iter(niah.values())))
        width = 0.8 / max(len(cells), 1)
        for j, cell in enumerate(cells):
            axes[2].bar([i + j * width for i in range(len(labels))], [niah[label][cell]["score"] for label in labels],
                        width, label=cell)
        axes[2].set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], names)
        axes[2].set_ylim(0, 1.05)
        axes[2].set_ylabel("NIAH score")
        axes[2].legend(fontsize="small")
    save_figure(figure, path)
