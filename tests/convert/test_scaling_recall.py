"""Choosing `a` by the answer loss on recall documents (`scaling.criterion=recall`): the answer's token positions, the
documents' sizes, the score against a hand computation, the choice, the settings' checks and hashes."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from offline_models import teacher_tokenizer
from test_convert_pipeline import convert_args
from test_scaling_niah import _tiny_hybrid

import hyla.convert.runners as runners
import hyla.convert.scaling as scaling
from hyla.cli import main
from hyla.convert.presets import ScalingPlan, apply_overrides, make_plan
from hyla.convert.scaling_recall import (SIZE_SLACK, answer_scores, answer_token_span, recall_sequences,
                                         tokenized_document)
from hyla.convert.stages import settings_hash
from hyla.data.recall import make_document
from hyla.models import InferenceOptions

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _haystack(seed: int, lines: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) + "." for _ in range(lines))


@pytest.fixture()
def text_folder(tmp_path):
    folder = tmp_path / "haystack"
    folder.mkdir()
    for i in range(6):
        (folder / f"{i:02d}.txt").write_text(_haystack(i, 120))
    return folder


def _check_span(tokenizer, text: str, value: str, ids: list[int], answer: slice) -> None:
    """The tokens before `answer` stop short of the value, the answer's tokens reach its end and the last one is
    needed to: exactly the tokens that hold a character of the value."""
    def decoded(stop: int) -> str:
        return tokenizer.decode(ids[:stop], clean_up_tokenization_spaces=False)

    start, end = len(text) - len(value) - 1, len(text) - 1
    assert text.startswith(decoded(answer.start)) and len(decoded(answer.start)) <= start
    assert len(decoded(answer.start + 1)) > start
    assert decoded(answer.stop).startswith(text[:end]) and len(decoded(answer.stop - 1)) < end
    assert decoded(len(ids)) == text


def _tokenizer(name: str):
    if name == "tiny":
        return teacher_tokenizer()
    from hyla.models.loading import load_tokenizer

    try:
        return load_tokenizer("smollm2-135m")
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"SmolLM2's tokenizer is not available: {err}")


@pytest.mark.parametrize("long_values", [False, True])
@pytest.mark.parametrize("tokenizer_name", ["tiny", "smollm2"])
def test_the_answer_tokens_are_exactly_the_values_tokens(tokenizer_name, long_values):
    tokenizer = _tokenizer(tokenizer_name)
    counts = []
    for seed in range(12):
        doc = make_document(_haystack(seed, 8), random.Random(seed), long_values=long_values, lead=seed % 2 == 1)
        value = doc.values[doc.asked]
        sequence = tokenized_document(tokenizer, doc.text, value, 10**6)
        ids = sequence.ids.tolist()
        _check_span(tokenizer, doc.text, value, ids, sequence.answer)
        # these tokenizers' pre-tokenizers keep the period apart (and the space before the value, when merged, with it)
        assert tokenizer.decode(ids[sequence.answer], clean_up_tokenization_spaces=False) in (value, " " + value)
        counts.append(sequence.answer.stop - sequence.answer.start)
    # long codes are split into many tokens
    assert (max(counts) >= 16) if long_values else (min(counts) >= 1), counts


def test_answer_tokens_that_also_hold_a_neighbouring_character_count_as_answer_tokens():
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    alphabet = [chr(c) for c in range(32, 127)]
    vocab = {char: i for i, char in enumerate(alphabet)}
    merges = [("s", " "), ("s ", "4"), ("7", ".")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    # no pre-tokenizer: merges may cross the value's edges
    backend = Tokenizer(models.BPE(vocab, merges))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    text = "Answer: the code is 4827."
    start = text.index("4827")
    ids, answer = answer_token_span(tokenizer, text, start, start + 4)
    pieces = [tokenizer.convert_ids_to_tokens(i) for i in ids]
    assert pieces[answer] == ["s 4", "8", "2", "7."]
    _check_span(tokenizer, text, "4827", ids, answer)


def test_a_slow_tokenizer_is_refused_with_one_line():
    slow = SimpleNamespace(is_fast=False)
    with pytest.raises(ValueError, match="needs a fast tokenizer"):
        answer_token_span(slow, "The code is 1.", 12, 13)


@pytest.mark.parametrize("spec", ["recall-lead-long:{}", "recall:{}", "recall-repeat-lead:{}"])
def test_recall_documents_are_sized_to_each_length_and_the_same_every_time(text_folder, spec):
    tokenizer = teacher_tokenizer()
    # this tokenizer's tokens are about a character each: a long value is ~30 tokens, a document's facts up to ~400
    lengths = [1024, 2048]
    made = recall_sequences(tokenizer, spec.format(text_folder), lengths=lengths, num_docs=2)
    assert [sequence.length for sequence in made] == [1024, 1024, 2048, 2048]
    for sequence in made:
        assert (1 - SIZE_SLACK) * sequence.length <= len(sequence.ids) <= sequence.length
        text = tokenizer.decode(sequence.ids.tolist(), clean_up_tokenization_spaces=False)
        assert text.endswith(sequence.value + ".") and text.count(sequence.value) >= 2  # the fact and the answer
    again = recall_sequences(tokenizer, spec.format(text_folder), lengths=lengths, num_docs=2)
    assert all(torch.equal(a.ids, b.ids) and a.answer == b.answer for a, b in zip(made, again))
    # consecutive haystack text: no two documents alike
    assert len({tuple(sequence.ids[:64].tolist()) for sequence in made}) == len(made) or "repeat" in spec


def test_recall_documents_say_when_their_text_runs_out(text_folder):
    with pytest.raises(ValueError, match=r"the text ran out after \d+ documents"):
        recall_sequences(teacher_tokenizer(), f"recall:{text_folder}", lengths=[4096], num_docs=50)
    with pytest.raises(ValueError, match="no recall document fits in 64 tokens"):
        recall_sequences(teacher_tokenizer(), f"recall-long:{text_folder}", lengths=[64], num_docs=1)


def test_the_recall_score_is_the_cross_entropy_of_the_answer_tokens(text_folder):
    tokenizer = teacher_tokenizer()
    model = _tiny_hybrid(len(tokenizer))
    made = recall_sequences(tokenizer, f"recall-lead-long:{text_folder}", lengths=[768, 1024], num_docs=2)
    options = InferenceOptions(logit_scaling_a=20.0)
    scores = answer_scores(made, scaling.position_scores(model, [sequence.ids for sequence in made], options))
    model.inference_options = options
    losses, right, total, exact = [], 0, 0, 0
    for sequence in made:
        with torch.no_grad():
            logits = model(sequence.ids[None]).logits[0].float()
        # the logits at position t predict token t + 1
        predicted = logits[sequence.answer.start - 1:sequence.answer.stop - 1]
        targets = sequence.ids[sequence.answer]
        log_probs = predicted.log_softmax(dim=-1)
        losses.append(-log_probs.gather(1, targets[:, None]).mean().item())
        hits = predicted.argmax(dim=-1) == targets
        right, total, exact = right + hits.sum().item(), total + hits.numel(), exact + bool(hits.all())
    assert scores["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert scores["token_accuracy"] == pytest.approx(right / total)
    assert scores["exact"] == pytest.approx(exact / len(made))
    assert scores["by_length"]["768"]["loss"] == pytest.approx(sum(losses[:2]) / 2, rel=1e-5)
    assert scores["by_length"]["1024"]["num_docs"] == 2
    # the loss is that of the value's tokens only: the document's mean is another number
    assert F.cross_entropy(logits[:-1], sequence.ids[1:]).item() != pytest.approx(losses[-1])


# Losses the stubbed forward pass gives each candidate: the held-out loss prefers a = 20 (c(L) lower still, but it is
# reported only), the answer loss a = 500.
HELD_OUT = {"off": 4.0, 20.0: 3.0, 500.0: 3.5, "per_length": 2.9}
ANSWER = {"off": 1.5, 20.0: 2.0, 500.0: 1.0, "per_length": 0.5}


def _stub_scores(model, sequences, options=None):
    key = options.logit_scaling_a if options.logit_scaling == "per_query" else options.logit_scaling
    scores = []
    for row in sequences:
        # the held-out windows are all zeros, the recall documents are not
        loss = (HELD_OUT if not row.any() else ANSWER)[key]
        scores.append((torch.full((row.numel() - 1,), loss), torch.arange(row.numel() - 1) % 2 == 0))
    return scores


@pytest.mark.parametrize("criterion,chosen", [("loss", 20.0), ("recall", 500.0)])
def test_the_recall_criterion_chooses_the_lowest_answer_loss(text_folder, tmp_path, monkeypatch, criterion, chosen):
    tokenizer = teacher_tokenizer()
    plan = ScalingPlan(candidates=[None, 20.0, 500.0], length=64, num_docs=2, per_length=True, criterion=criterion,
                       recall_source=f"recall-lead:{text_folder}", recall_lengths=[768], recall_docs=2)
    logged = []
    run = SimpleNamespace(plan=SimpleNamespace(scaling=plan, trained_seq_len=32), tokenizer=tokenizer,
                          log=logged.append, env=SimpleNamespace(is_main=True))
    monkeypatch.setattr(scaling, "scaling_sequences",
                        lambda run, stage, plan: (torch.zeros(2, 64, dtype=torch.long), [64, 64], "windows"))
    monkeypatch.setattr(runners, "load_student", lambda run, name: _tiny_hybrid(len(tokenizer)))
    monkeypatch.setattr(scaling, "position_scores", _stub_scores)
    results = scaling.run_scaling(run, SimpleNamespace(path=tmp_path))
    assert results["chosen_a"] == chosen and results["criterion"] == criterion
    assert results["loss_by_a"] == {"None": 4.0, "20.0": 3.0, "500.0": 3.5}
    assert results["recall_loss_by_a"] == {"None": 1.5, "20.0": 2.0, "500.0": 1.0}
    assert results["recall_accuracy_by_a"]["500.0"] == pytest.approx(
        sum((torch.arange(len(d.ids) - 1) % 2 == 0)[d.answer.start - 1:d.answer.stop - 1].sum().item()
            for d in scaling.scaling_recall_sequences(run, plan))
        / sum(d.answer.stop - d.answer.start for d in scaling.scaling_recall_sequences(run, plan)))
    assert results["recall_per_length"]["loss"] == 0.5 and results["loss_per_length"] == pytest.approx(2.9)
    assert set(results["recall_by_length"]) == {"None", "20.0", "500.0", "c(L)"}
    assert results["recall_documents"]["num_docs"] == 2
    assert set(results["seconds_by_candidate"]["recall"]) == set(results["seconds_by_candidate"]["loss"])
    assert any("a=500.0: held-out loss 3.5000" in line and "recall answer loss 1.0000" in line for line in logged)
    assert (tmp_path / "scaling.png").exists()


def test_the_recall_criterion_keeps_the_divergence_check():
    from hyla.train import TrainingDiverged

    uniform = torch.log(torch.tensor(300.0)).item()
    answer = {"None": 1.0, "20.0": 0.5, "500.0": float("nan")}
    assert scaling.best_scaling([None, 20.0, 500.0], {"None": 3.0, "20.0": 3.1, "500.0": 2.0}, 300,
                                recall_losses=answer) == 20.0
    # a candidate whose held-out loss is not finite is not chosen, whatever its answer loss
    assert scaling.best_scaling([None, 20.0], {"None": 3.0, "20.0": float("inf")}, 300,
                                recall_losses={"None": 1.0, "20.0": 0.1}) is None
    with pytest.raises(TrainingDiverged, match="a uniform prediction scores"):
        scaling.best_scaling([None, 20.0], {"None": uniform, "20.0": uniform}, 300,
                             recall_losses={"None": 1.0, "20.0": 0.1})
    with pytest.raises(TrainingDiverged, match="answer loss on the recall documents is not finite"):
        scaling.best_scaling([None], {"None": 3.0}, 300, recall_losses={"None": float("nan")})


@pytest.mark.parametrize("settings,message", [
    (["scaling.criterion=recall"], "scaling.criterion=recall needs scaling.recall_source"),
    (["scaling.criterion=recal"], "did you mean 'recall'"),
    (["scaling.recall_source=recall@100-200:wordnet"], "drop the @MIN-MAX"),
    (["scaling.recall_source=recall-lead-dense:wordnet"], "drop -dense"),
    (["scaling.recall_source=wordnet"], "expected recall[-repeat][-lead][-long][-dense][-words]:SPEC"),
    (["scaling.recall_docs=3"], "scaling.recall_docs applies to the recall documents only"),
    (["scaling.recall_source=recall-lead:{missing}"], "source not found"),
])
def test_a_bad_recall_setting_fails_with_one_line_before_anything_loads(tiny_teacher, tmp_path, capsys, settings,
                                                                        message):
    out = tmp_path / "run"
    extra = [item for setting in settings for item in ("--set", setting.format(missing=tmp_path / "nothing"))]
    assert main(convert_args(tiny_teacher, out, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_the_default_recall_settings_keep_each_presets_stage_hash():
    # the scaling settings' hashes before the recall criterion existed (commit 7f7a027)
    before = {"halo-smollm2": "cd13795e069e3ba8", "smoke": "c7c768addb03ff02", "quick": "5ca5692000ad427b"}
    # halo-smollm2 has since chosen by recall on a larger grid (sitting H); with the grid and criterion it had then,
    # it gives the hash it had then
    then = {"halo-smollm2": ["scaling.candidates=none,1000.0,5000.0,10000.0,20000.0,100000.0", "scaling.criterion=loss",
                             "scaling.recall_source=none", "scaling.recall_lengths=", "scaling.recall_docs=8"]}
    for preset, expected in before.items():
        plan = apply_overrides(make_plan(preset, 0), then.get(preset, []))
        assert settings_hash(plan.scaling.settings()) == expected, preset
    assert settings_hash(make_plan("halo-smollm2", 0).scaling.settings()) != before["halo-smollm2"]
    plan = apply_overrides(make_plan("halo-smollm2", 0), then["halo-smollm2"] + [
        "scaling.recall_source=recall-lead-long:wordnet"])
    assert settings_hash(plan.scaling.settings()) != before["halo-smollm2"]
    chosen_by_recall = apply_overrides(make_plan("halo-smollm2", 0), then["halo-smollm2"] + [
        "scaling.recall_source=recall-lead-long:wordnet", "scaling.criterion=recall"])
    assert settings_hash(chosen_by_recall.scaling.settings()) != settings_hash(plan.scaling.settings())


def test_the_model_card_says_which_loss_chose_a():
    from hyla.convert.export import scaling_line

    held_out_only = scaling_line({"chosen_a": 20, "loss_by_a": {"20": 3.0}})
    assert held_out_only == "- logit scaling a: 20 (held-out loss by a: {'20': 3.0})"
    line = scaling_line({"chosen_a": 500, "criterion": "recall", "loss_by_a": {"20": 3.0, "500": 3.5},
                         "recall_loss_by_a": {"20": 2.0, "500": 1.0}})
    assert line.endswith("answer loss on recall documents by a: {'20': 2.0, '500': 1.0}; chosen by answer loss)")
