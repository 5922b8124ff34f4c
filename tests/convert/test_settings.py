"""Conversion settings: every preset passes its own checks; `--set` values are parsed as their field's type and
range-checked, fields added later included; unknown names get the closest known one."""

from __future__ import annotations

import dataclasses

import pytest

from hyla.convert.presets import (DATA_PARALLEL_MODES, PRESETS, SCHEDULES, StageBudget, apply_overrides, check_plan,
                                  make_plan)
from hyla.validation import at_least, check_fields


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_passes_the_checks(preset):
    check_plan(make_plan(preset, 135_000_000))


def test_schedules_are_the_optimizers():
    from hyla.train.optim import SCHEDULES as OPTIMIZER_SCHEDULES

    assert SCHEDULES == OPTIMIZER_SCHEDULES


def test_data_parallel_modes_are_the_trainers():
    from hyla.train.parallel import MODES

    assert DATA_PARALLEL_MODES == MODES


def test_set_values_are_parsed_as_their_fields_type():
    plan = apply_overrides(make_plan("smoke", 0), [
        "align.tokens=1e6", "distill.lr=1", "selection.niah_lengths=2048,4096", "scaling.candidates=none,20",
        "selection.k=none", "selection.method=3,7", "scaling.data=off", "model.attention_rope=true", "seed=3",
        "model.rnn_mixer=swa", "model.swa_window=64",
    ])
    assert plan.align.tokens == 1_000_000 and isinstance(plan.align.tokens, int)
    assert plan.distill.lr == 1  # kept as written: the settings hash of earlier runs stays
    assert plan.selection.niah_lengths == [2048, 4096] and plan.scaling.candidates == [None, 20]
    assert plan.selection.k is None and plan.selection.method == "3,7" and plan.scaling.data is None
    assert plan.model.attention_rope is True and plan.seed == 3
    assert plan.model.rnn_mixer == "swa" and plan.model.swa_window == 64


@pytest.mark.parametrize("setting,message", [
    ("distill.lr=abc", "distill.lr: expected a number, got 'abc'"),
    ("distill.lr=NaN", "distill.lr: expected a finite number, got nan"),
    ("distill.compile=yes", "distill.compile: expected true or false or none, got 'yes'"),
    ("distill.data_parallel=dpp", "distill.data_parallel must be one of auto, ddp, fsdp, fsdp-no-reshard (did you "
                                  "mean 'ddp'?), got 'dpp'"),
    ("align.tokens=0.5", "align.tokens: expected an integer, got 0.5"),
    ("distill.min_lr=-1", "distill.min_lr must be >= 0, got -1"),
    ("selection.method=hallo", "(did you mean 'halo'?)"),
    ("selection.niah_tasks=SK1,XX", "selection.niah_tasks: item 'XX' is not a NIAH task"),
    ("selection.csr_tasks=arc_easi", "(did you mean 'arc_easy'?)"),
    ("scaling.candidates=none,1", "scaling.candidates: item 1 must be > 1"),
    ("scaling.candidates=", "scaling.candidates: must not be empty"),
    ("modle.attention_rope=true", "unknown setting 'modle.attention_rope' (did you mean 'model.attention_rope'?)"),
    ("model.rnn_mixer=mamba2", "model.rnn_mixer must be one of lightning, gla, gdn, swa, got 'mamba2'"),
    ("model.swa_window=0", "model.swa_window must be >= 1, got 0"),
    ("selection.csr_batch_size=0", "selection.csr_batch_size must be >= 1, got 0"),
    ("selection.niah_max_new_tokens=0", "selection.niah_max_new_tokens must be >= 1, got 0"),
    ("preset=paper", "unknown setting 'preset'"),
    ("distill.lr", "is not of the form section.field=value"),
    ("align.bf16_activations=true", "align.bf16_activations: the alignment trains single mixers"),
    ("align.logit_scaling_a=2000", "align.logit_scaling_a: the alignment trains single mixers"),
    ("finetune.logit_scaling_a=1", "finetune.logit_scaling_a must be > 1, got 1"),
])
def test_bad_set_values_are_one_clear_error(setting, message):
    with pytest.raises(ValueError) as error:
        apply_overrides(make_plan("smoke", 0), [setting])
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("settings,message", [
    (["model.rnn_mixer=gla", "model.lightning_rope=false"],
     "model.lightning_rope applies to lightning layers only, and model.rnn_mixer is 'gla'"),
    (["model.lightning_qk_norm=false", "model.rnn_mixer=swa"],
     "model.lightning_qk_norm applies to lightning layers only, and model.rnn_mixer is 'swa'"),
    (["model.swa_window=64"], "model.swa_window applies to swa layers only, and model.rnn_mixer is 'lightning'"),
    (["model.gla_rope=true"], "model.gla_rope applies to gla layers only, and model.rnn_mixer is 'lightning'"),
    (["model.rnn_mixer=gla", "model.gdn_rope=true"],
     "model.gdn_rope applies to gdn layers only, and model.rnn_mixer is 'gla'"),
])
def test_a_mixer_option_for_another_mixer_is_one_clear_error(settings, message):
    with pytest.raises(ValueError) as error:
        apply_overrides(make_plan("smoke", 0), settings)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not apply_overrides(make_plan("smoke", 0), ["model.lightning_rope=false"]).model.lightning_rope


def test_a_field_added_to_the_stage_budget_is_type_checked_too():
    """The lead adds speed-only fields to StageBudget; the checks read the annotations, so they need no change."""
    @dataclasses.dataclass
    class WiderBudget(StageBudget):
        micro_batch_size: int = 1

    budget = WiderBudget(1024, 64, 4, 1e-3, 1e-5)
    check_fields(budget, {})
    budget.micro_batch_size = "two"
    with pytest.raises(ValueError, match="distill.micro_batch_size: expected an integer, got 'two'"):
        check_fields(budget, {}, "distill")
    budget.micro_batch_size = 0
    with pytest.raises(ValueError, match="distill.micro_batch_size must be >= 1, got 0"):
        check_fields(budget, {"micro_batch_size": at_least(1)}, "distill")
