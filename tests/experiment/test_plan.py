"""Plan files: read, expanded and checked before anything runs; one-line errors for mistakes."""

from __future__ import annotations

import json

import pytest
from experiment_helpers import job

from hyla.experiment.plan import PlanError, finish, keep_only, load_plan


def test_variables_profiles_and_sets_fill_the_commands(tmp_path, write_plan):
    path = write_plan([{"name": "a", "run": ["hyla", "eval", "niah", "--model", "${model}", "--out", "${run}/evals/a",
                                             "--lengths=${lengths}", "${lengths}", "${extra}"]}],
                      variables={"model": {"default": None, "help": "the model folder"}, "lengths": ["1K", "4K"],
                                 "extra": [], "steps": 10},
                      profiles={"smoke": {"variables": {"extra": ["--device", "cpu"]}}})
    plan = load_plan(path, tmp_path / "run", overrides=["model=/m"])
    assert plan.jobs["a"].run == ("hyla", "eval", "niah", "--model", "/m", "--out", f"{tmp_path / 'run'}/evals/a",
                                  "--lengths=1K,4K", "1K", "4K")
    smoke = load_plan(path, tmp_path / "run", profile="smoke", overrides=["model=/m", "steps=20"])
    assert smoke.jobs["a"].run[-2:] == ("--device", "cpu") and smoke.variables["steps"] == 20


def test_a_matrix_makes_one_job_per_combination(tmp_path, write_plan):
    path = write_plan([
        job("prep"),
        {"name": "niah-${model}-${task}", "needs": ["${model.needs}"],
         "matrix": {"model": [{"name": "teacher", "needs": "", "path": "${root}/t", "extra": []},
                              {"name": "main", "needs": "prep", "path": "${root}/m", "extra": ["--x", "${root}"]}],
                    "task": ["SK1", "SK2"]},
         "run": ["hyla", "eval", "niah", "--model", "${model.path}", "--tasks", "${task}", "${model.extra}"]}],
        variables={"root": "/r"})
    plan = load_plan(path, tmp_path)
    assert list(plan.jobs) == ["prep", "niah-teacher-SK1", "niah-teacher-SK2", "niah-main-SK1", "niah-main-SK2"]
    assert plan.jobs["niah-teacher-SK2"].needs == () and plan.jobs["niah-main-SK1"].needs == ("prep",)
    assert plan.jobs["niah-main-SK2"].run[4:] == ("/r/m", "--tasks", "SK2", "--x", "/r")


def test_a_matrix_axis_can_take_a_list_variable_of_objects(tmp_path, write_plan):
    path = write_plan([
        job("convert"),
        {"name": "convert-${b}", "needs": ["convert"], "matrix": {"b": "${branches}"},
         "run": ["hyla", "convert", "--out", "${root}/${b}", "--from-stage", "${b.from}", "${common}", "${b.args}"]},
        {"name": "niah-${b}-${task}", "needs": ["convert-${b}"], "matrix": {"b": "${branches}", "task": ["SK1", "SK2"]},
         "run": ["python", "-c", "${b}"]}],
        variables={"root": "/r", "common": ["--set", "x=1"], "branches": []})
    assert list(load_plan(path, tmp_path).jobs) == ["convert"]  # an empty list: no job
    branches = '[{"name": "d", "from": "distill", "args": ["--set", "y=${root}"]}, {"name": "f", "from": "x", "args": []}]'
    plan = load_plan(path, tmp_path, overrides=[f"branches={branches}"])
    assert list(plan.jobs) == ["convert", "convert-d", "convert-f", "niah-d-SK1", "niah-d-SK2", "niah-f-SK1",
                               "niah-f-SK2"]
    assert plan.jobs["convert-d"].run == ("hyla", "convert", "--out", "/r/d", "--from-stage", "distill", "--set", "x=1",
                                          "--set", "y=/r")
    assert plan.jobs["convert-f"].run[-3:] == ("x", "--set", "x=1") and plan.jobs["niah-f-SK2"].needs == ("convert-f",)
    with pytest.raises(PlanError, match=r"matrix axis b: \$\{root\} is not a list"):
        load_plan(write_plan([{"name": "a-${b}", "matrix": {"b": "${root}"}, "run": ["python", "-c", "1"]}],
                             variables={"root": "/r"}), tmp_path)
    with pytest.raises(PlanError, match="a list may hold objects"):
        load_plan(write_plan([job("a")], variables={"x": [{"name": {"nested": 1}}]}), tmp_path)


def test_when_leaves_a_job_or_a_combination_out_of_the_plan(tmp_path, write_plan):
    path = write_plan([
        job("convert"),
        job("snapshot", needs=["convert"], when="${stage_evals}"),
        {"name": "niah-${model}", "when": "${model.when}", "matrix": {"model": [
            {"name": "main", "when": "true"}, {"name": "distill", "when": "${stage_evals}"}]},
         "run": ["python", "-c", "${model}"]},
        job("report", after=["*"])],
        variables={"stage_evals": True})
    assert list(load_plan(path, tmp_path).jobs) == ["convert", "snapshot", "niah-main", "niah-distill", "report"]
    plan = load_plan(path, tmp_path, overrides=["stage_evals=false"])
    assert list(plan.jobs) == ["convert", "niah-main", "report"] and plan.jobs["report"].after == ("convert",
                                                                                                   "niah-main")
    with pytest.raises(PlanError, match=r"job 1 \(a\): when must be true or false once substituted, got 'yes'"):
        load_plan(write_plan([job("a", when="${x}")], variables={"x": "yes"}), tmp_path)


def test_globs_in_after_and_the_escaped_dollar(tmp_path, write_plan):
    path = write_plan([job("train-a"), job("train-b"), job("report", "print('$${HOME}')", after=["*"])])
    plan = load_plan(path, tmp_path)
    assert plan.jobs["report"].after == ("train-a", "train-b")
    assert finish(plan.jobs["report"].run[2], tmp_path) == "print('${HOME}')"


def test_json_references_are_read_when_the_job_starts(tmp_path, write_plan):
    path = write_plan([job("a", "${json:main/manifest.json#results.chosen}")])
    plan = load_plan(path, tmp_path)
    argument = plan.jobs["a"].run[2]
    with pytest.raises(FileNotFoundError, match="cannot read"):
        finish(argument, tmp_path)
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "manifest.json").write_text(json.dumps({"results": {"chosen": [0, 1, 7]}}))
    assert finish(argument, tmp_path) == "0,1,7"


def test_a_toml_plan_reads_like_the_json_one(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text('name = "t"\n[variables]\nx = "1"\n[[jobs]]\nname = "a"\nrun = ["python", "-c", "${x}"]\n'
                    '[[jobs]]\nname = "b"\nneeds = ["a"]\nkind = "train"\nrun = ["python", "-c", "2"]\n')
    plan = load_plan(path, tmp_path)
    assert plan.jobs["a"].run == ("python", "-c", "1") and plan.jobs["b"].needs == ("a",)
    assert plan.jobs["b"].kind == "train"


@pytest.mark.parametrize("jobs, top, overrides, message", [
    ([job("a")], {"varibles": {}}, [], "unknown key 'varibles'"),
    ([job("a", "${nope}")], {}, [], r"unknown variable \$\{nope\}"),
    ([job("a", "${t}")], {"variables": {"t": {"default": None, "help": "the teacher"}}}, [], r"set t \(the teacher\)"),
    ([job("a")], {"variables": {"t": "x"}}, ["u=1"], "has no variable 'u'"),
    ([job("a")], {"variables": {"n": 3}}, ["n=x"], "expected a number"),
    ([job("a")], {"variables": {"l": []}}, ["l=x"], "takes a JSON list"),
    ([job("a", needs=["b"])], {}, [], "no job matches 'b'"),
    ([job("a", needs=["b"]), job("b", after=["a"])], {}, [], "loop: a -> b -> a"),
    ([job("a", checked_by=["a"])], {}, [], "job a is checked by itself"),
    ([job("a", checked_by=["b"])], {}, [], "checked_by: no job matches 'b'"),
    ([job("a"), job("a")], {}, [], "two jobs are named a"),
    ([job("a", kind="gpu")], {}, [], "unknown kind 'gpu'"),
    ([{"name": "a"}], {}, [], "give exactly one of run, copy, split_largest"),
    ([job("a b")], {}, [], "must be letters, digits"),
    ([job("a")], {"settings": {"parallel": 0}}, [], "parallel must be a whole number >= 1"),
    ([job("a")], {"variables": {"x": "${y}", "y": "${x}"}}, [], "in a loop"),
    ([{"name": "a", "copy": {"from": "x"}}], {}, [], "copy needs into"),
    ([job("a", preflight=True)], {}, [], "a preflight job runs a hyla command and waits for no other job"),
    ([job("a"), {"name": "b", "run": ["hyla", "x"], "needs": ["a"], "preflight": True}], {}, [],
     "a preflight job runs a hyla command"),
    ([{"name": "a", "run": ["hyla", "x"], "preflight": "yes"}], {}, [], "preflight must be true or false"),
])
def test_mistakes_are_one_line_errors(tmp_path, write_plan, jobs, top, overrides, message):
    with pytest.raises(PlanError, match=message) as error:
        load_plan(write_plan(jobs, **top), tmp_path, overrides=overrides)
    assert "\n" not in str(error.value)


def test_an_unknown_profile_and_broken_json_are_named(tmp_path, write_plan):
    with pytest.raises(PlanError, match="no profile 'gpu' .*profiles: smoke"):
        load_plan(write_plan([job("a")], profiles={"smoke": {}}), tmp_path, profile="gpu")
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "x",\n "jobs": [}')
    with pytest.raises(PlanError, match="not valid JSON: .* line 2"):
        load_plan(broken, tmp_path)
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.json", tmp_path)


def test_only_keeps_the_jobs_named_and_what_they_need(tmp_path, write_plan):
    path = write_plan([job("corpus"), job("check"), job("convert", needs=["corpus"], checked_by=["check"]),
                       job("csr-main", needs=["convert"], after=["convert", "other"]), job("other"),
                       job("report", after=["*"])])
    plan = keep_only(load_plan(path, tmp_path), ["csr-*"])
    assert list(plan.jobs) == ["corpus", "check", "convert", "csr-main"]
    assert plan.jobs["csr-main"].after == ("convert",)
    with pytest.raises(PlanError, match="no job matches 'nothing'"):
        keep_only(plan, ["nothing"])


def test_only_passes_over_a_job_its_when_left_out_and_still_refuses_a_typo(tmp_path, write_plan, capsys):
    # Sitting P's --only named the warm-up jobs; with warm_engine=false (an H100) they are not in the plan.
    path = write_plan([job("convert"), job("csr-main", needs=["convert"]),
                       {"name": "warm-${candidate}", "when": "${warm}", "matrix": {"candidate": ["a5000"]},
                        "run": ["python", "-c", "${candidate}"]}],
                      variables={"warm": True})
    assert list(keep_only(load_plan(path, tmp_path), ["csr-main", "warm-a5000"]).jobs) == [
        "convert", "csr-main", "warm-a5000"]
    plan = load_plan(path, tmp_path, overrides=["warm=false"])
    assert plan.left_out == ("warm-a5000",)
    assert list(keep_only(plan, ["csr-main", "warm-a5000"]).jobs) == ["convert", "csr-main"]
    assert "--only: warm-a5000 names only jobs this plan's settings leave out" in capsys.readouterr().err
    with pytest.raises(PlanError, match="no job matches 'warm-a500'"):
        keep_only(plan, ["csr-main", "warm-a500"])
    with pytest.raises(PlanError, match="every pattern names only jobs this plan's settings leave out"):
        keep_only(plan, ["warm-*"])
