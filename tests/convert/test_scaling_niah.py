"""The scaling stage's NIAH report: every candidate's cells on one generation, with the scores a generation per cell
gives."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import hyla.inference.generate as generate_module
from hyla.convert.scaling import niah_scores
from hyla.evals import niah as niah_eval
from hyla.models import HypeNetConfig, HypeNetForCausalLM, InferenceOptions
from hyla.models.loading import load_tokenizer


def _tiny_hybrid(vocab_size: int) -> HypeNetForCausalLM:
    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention"], pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return HypeNetForCausalLM(config).eval()


def test_scaling_niah_builds_one_engine_a_candidate_with_the_scores_of_one_a_cell(tiny_teacher, monkeypatch):
    tokenizer = load_tokenizer(str(tiny_teacher))
    model = _tiny_hybrid(len(tokenizer))
    plan = SimpleNamespace(niah_lengths=[512, 1024], niah_tasks=["SK1", "SK2", "SK3"], niah_samples=2,
                           niah_max_new_tokens=4)
    built = []

    class CountedEngine(generate_module.InferenceEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self.cache.max_length)

    monkeypatch.setattr(generate_module, "InferenceEngine", CountedEngine)
    samples: dict = {}
    # What each cell scored when it made a generation of its own, for two candidates (one engine per cell).
    expected = {}
    for a in (20.0, 500.0):
        model.inference_options = InferenceOptions(logit_scaling_a=a)
        for length in plan.niah_lengths:
            for task in plan.niah_tasks:
                key = f"{task}@{length}"
                samples.setdefault(key, niah_eval.build_samples(tokenizer, task, length, plan.niah_samples, 42))
                records = niah_eval.evaluate_samples(model, tokenizer, samples[key], batch_size=1,
                                                     max_new_tokens=plan.niah_max_new_tokens)
                expected[(a, key)] = [(record["pred"], record["score"]) for record in records]
    assert len(built) == 2 * len(plan.niah_lengths) * len(plan.niah_tasks)
    built.clear()
    paths = set()
    for a in (20.0, 500.0):
        model.inference_options = InferenceOptions(logit_scaling_a=a)
        cells = niah_scores(model, tokenizer, plan, samples, paths)
        for key, cell in cells.items():
            scores = [score for _, score in expected[(a, key)]]
            assert cell["score"] == sum(scores) / len(scores) and cell["num_samples"] == plan.niah_samples
    # One engine a candidate, reserved for the longest length; the 512-token cells score on it as on their own.
    assert built == [1024, 1024]
    assert paths == {"engine"}


def test_scaling_niah_predictions_equal_a_generation_per_cell(tiny_teacher):
    tokenizer = load_tokenizer(str(tiny_teacher))
    model = _tiny_hybrid(len(tokenizer))
    model.inference_options = InferenceOptions(logit_scaling_a=50.0)
    samples = {f"{task}@512": niah_eval.build_samples(tokenizer, task, 512, 2, 42) for task in ("SK1", "SK2")}
    shared = niah_eval.as_generation(model, None)
    for key, cell in samples.items():
        own = niah_eval.evaluate_samples(model, tokenizer, cell, batch_size=1, max_new_tokens=6)
        reused = niah_eval.evaluate_samples(model, tokenizer, cell, batch_size=1, max_new_tokens=6,
                                            generation=shared)
        assert [r["pred"] for r in reused] == [r["pred"] for r in own], key


def test_an_evaluation_of_the_export_gives_the_scaling_stages_niah_for_each_candidate(tiny_teacher, tmp_path):
    # The recipe plan runs each candidate's NIAH as `hyla eval niah --model 06-export --logit-scaling...` beside
    # the other evaluations instead of inside the scaling stage: the same weights (fp32 saved, bf16 loaded, as the
    # stage casts the student), prompts, options and generation, so the same predictions.
    from hyla.evals.runner import load_for_eval

    tokenizer = load_tokenizer(str(tiny_teacher))
    student = _tiny_hybrid(len(tokenizer)).float()
    student.config.attention_logit_scaling_a = 500.0  # the export writes the chosen a
    student.save_pretrained(tmp_path / "export")
    tokenizer.save_pretrained(tmp_path / "export")
    student.config.attention_logit_scaling_a = None
    student.to(torch.bfloat16)
    plan = SimpleNamespace(niah_lengths=[512], niah_tasks=["SK1", "SK2"], niah_samples=2, niah_max_new_tokens=6)
    candidates = {"off": (InferenceOptions(logit_scaling="off"), {"logit_scaling_a": "off"}),
                  "a20": (InferenceOptions(logit_scaling_a=20.0), {"logit_scaling_a": 20.0}),
                  "cL": (InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=128),
                         {"logit_scaling": "per_length", "logit_scaling_train_length": 128})}
    for label, (options, flags) in candidates.items():
        student.inference_options = options
        in_stage = niah_scores(student, tokenizer, plan, {})
        model, eval_tokenizer, _ = load_for_eval(str(tmp_path / "export"), dtype="bfloat16", **flags)
        evaluated = niah_eval.evaluate_niah(model, eval_tokenizer, plan.niah_tasks, plan.niah_lengths,
                                            plan.niah_samples, max_new_tokens=plan.niah_max_new_tokens)
        for key, cell in in_stage.items():
            task, length = key.split("@")
            assert cell["score"] == evaluated["tasks"][task]["by_length"][int(length)], (label, key)
        records = niah_eval.evaluate_samples(student, tokenizer,
                                             niah_eval.build_samples(tokenizer, "SK2", 512, 2, 42), max_new_tokens=6)
        again = [r for r in evaluated["records"] if r["task"] == "SK2"]
        assert [r["pred"] for r in records] == [r["pred"] for r in again], label
