"""Evaluation suite: NIAH (RULER), commonsense multiple choice, loss by position, BABILong-style QA.

Every evaluation takes any Hugging Face causal LM (`model(input_ids, attention_mask=...)`, `model.generate`) and its
tokenizer, so a teacher and its hybrid student are measured by the same code. Submodules import their heavy
dependencies lazily; importing this package does no work.

- `hyla.evals.niah`: `build_samples`, `score`, `evaluate_niah`, `evaluate_ruler_jsonl`
- `hyla.evals.csr`: `evaluate_csr`
- `hyla.evals.ppl`: `ppl_by_position`
- `hyla.evals.babilong`: `build_babilong_samples`, `evaluate_babilong`
- `hyla.evals.lm_eval_bridge`: `run_lm_eval`
- `hyla.evals.overrides`: `apply_inference_overrides`
"""
