"""`hyla convert check-branch`: whether a branch's arguments leave the stages it takes over from its base conversion
as they are, answered before any training (the recipe plan's `check-N` jobs run it at a run's start)."""

from __future__ import annotations

import pytest

from hyla.cli import main
from hyla.convert.pipeline import ConvertRequest, branch_conflicts, planned_settings
from hyla.convert.stages import STAGES, Stage

# Stage 3 with a corpus of its own: its token budget sizes the data stage's long corpus.
BASE = ["token_scale=0.5", "finetune.tokens=25e6", "data.long_sources=docs@0-26:aa-lcr"]


def request(overrides: list[str], from_stage: str | None = None) -> ConvertRequest:
    return ConvertRequest(teacher="", out="unused", preset="halo-smollm2", overrides=overrides,
                          from_stage=from_stage)


@pytest.mark.parametrize("extra, from_stage, expected", [
    (["finetune.tokens=50e6"], "finetune", {"data", "align", "select", "distill"}),  # a longer long corpus
    (["finetune.lr=1e-4"], "finetune", set()),
    (["finetune.tokens=50e6", "data.long_tokens=30e6"], "finetune", {"data", "align", "select", "distill"}),
    (["distill.lr=1e-4"], "finetune", {"distill"}),
    (["distill.lr=1e-4"], "distill", set()),
    (["align.lr=1e-4"], "distill", {"align", "select"}),
    (["finetune.tokens=50e6"], "data", set()),
])
def test_a_branchs_conflicts_are_the_stages_a_resumed_conversion_would_refuse(tmp_path, extra, from_stage,
                                                                             expected):
    base, branch = request(BASE), request(BASE + extra, from_stage)
    conflicts = branch_conflicts(base, branch, "cuda")
    assert set(conflicts) == expected
    # Independently: the base's stage folders as `hyla convert` leaves them, checked by the branch's settings as
    # `hyla convert --from-stage` checks them before reusing a stage.
    ours, theirs = planned_settings(base, "cuda"), planned_settings(branch, "cuda")
    refused = set()
    for name in STAGES[: STAGES.index(from_stage)]:
        Stage(tmp_path, name, ours[name], {"name": "teacher"}).begin()
        try:
            Stage(tmp_path, name, theirs[name], {"name": "teacher"}).check_compatible()
        except ValueError:
            refused.add(name)
    assert refused == expected


def test_a_long_corpus_sized_in_the_common_arguments_serves_a_branch_with_a_longer_stage_three():
    sized = BASE + ["data.long_tokens=25e6"]
    assert branch_conflicts(request(sized), request(sized + ["finetune.tokens=50e6"], "finetune"), "cuda") == {}
    # ... and the difference it removes is the one named without it
    conflicts = branch_conflicts(request(BASE), request(BASE + ["finetune.tokens=50e6"], "finetune"), "cuda")
    assert conflicts["data"] == "long_tokens 12451841 then, 24969217 now"


def test_the_teachers_precision_is_compared_as_each_device_resolves_it():
    # Unset (bf16 on CUDA, float32 on CPU) against an explicit true: the same on CUDA only.
    base, branch = request(BASE), request(BASE + ["distill.teacher_bf16=true"], "finetune")
    assert branch_conflicts(base, branch, "cuda") == {}
    assert set(branch_conflicts(base, branch, "cpu")) == {"distill"}


def cli(*branch: str, common: tuple[str, ...] = ()) -> list[str]:
    sets = [item for value in BASE + list(common) for item in ("--set", value)]
    return ["convert", "check-branch", "--out", "unused", "--preset", "halo-smollm2", "--device", "cuda", *sets,
            "--from-stage", "finetune", "--branch", *branch]


def test_the_command_says_ok_or_names_the_setting_in_one_line(capsys):
    assert main(cli("--set", "finetune.lr=1e-4")) == 0
    assert "the stages before it have the same settings" in capsys.readouterr().out
    assert main(cli("--set", "finetune.tokens=50e6")) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "(data: long_tokens 12451841 then, 24969217 now;" in error and "branch from data" in error
    assert main(cli("--set", "finetune.tokens=50e6", common=("data.long_tokens=25e6",))) == 0
    # A branch with no arguments of its own takes over everything.
    assert main(cli()) == 0


def test_bad_check_branch_commands_fail_with_one_line(capsys):
    assert main(cli("--lr", "1")) == 2
    assert "--branch: --lr 1: a branch's arguments are --set, --data, --select, --seed" in capsys.readouterr().err
    no_from = [arg for arg in cli() if arg not in ("--from-stage", "finetune")]
    assert main(no_from) == 2
    assert "check-branch needs --from-stage STAGE" in capsys.readouterr().err
    assert main(["convert", "--teacher", "t", "--out", "unused", "--branch", "--set", "a.b=1"]) == 2
    assert "--branch belongs to check-branch" in capsys.readouterr().err
    assert main(cli("--set", "finetune.lr=-1")) == 2
    assert "finetune.lr" in capsys.readouterr().err


def test_the_hybrids_activations_resolve_per_device_into_the_hashes_of_stages_two_and_three():
    """`distill.bf16_activations` / `finetune.bf16_activations` unset: bf16 on CUDA, held in those stages' settings
    (a conversion resumed on CUDA with float32 activations set is another conversion); on CPU, which trains without
    autocast, unset and false leave the settings as before; alignment never holds them."""
    cuda, cpu = planned_settings(request(BASE), "cuda"), planned_settings(request(BASE), "cpu")
    for stage in ("distill", "finetune"):
        assert cuda[stage]["budget"]["bf16_activations"] is True
        assert "bf16_activations" not in cpu[stage]["budget"]
    assert "bf16_activations" not in cuda["align"]["budget"]
    pinned = planned_settings(request(BASE + ["distill.bf16_activations=false"]), "cuda")
    assert "bf16_activations" not in pinned["distill"]["budget"]
    assert branch_conflicts(request(BASE), request(BASE + ["finetune.bf16_activations=false"], "finetune"),
                            "cuda") == {}
    assert set(branch_conflicts(request(BASE), request(BASE + ["distill.bf16_activations=false"], "finetune"),
                                "cuda")) == {"distill"}
