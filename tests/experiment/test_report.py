"""`hyla experiment report`: graded NIAH answers, the tables, the plots, and the recorded run's summary remade from
its raw results."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from hyla.cli import main as hyla_main
from hyla.experiment import niah_grading, report

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "smollm2-135m"


def record(pred, needle="1234567", task="SK1", length=4096):
    return {"task": task, "length": length, "outputs": [needle], "pred": pred}


def write_result(run: Path, folder: str, result: dict) -> None:
    (run / "evals" / folder).mkdir(parents=True)
    (run / "evals" / folder / "results.json").write_text(json.dumps(result))


def test_grade_record_by_hand():
    assert niah_grading.grade_record(record(" 1234567.")) == {"exact": True, "digits_right": 1.0, "leading_4": True,
                                                              "number_answer": True, "prefix_4": True}
    near = niah_grading.grade_record(record(" 1234999 and more"))
    assert near == {"exact": False, "digits_right": pytest.approx(4 / 7), "leading_4": True, "number_answer": True,
                    "prefix_4": True}
    shifted = niah_grading.grade_record(record(" 9123456"))  # every digit one place off: none right by position
    assert shifted["digits_right"] == 0.0 and not shifted["leading_4"] and shifted["number_answer"]
    assert niah_grading.grade_record(record(" the key to the key")) == {
        "exact": False, "digits_right": 0.0, "leading_4": False, "number_answer": False, "prefix_4": False}
    # Runs on past the needle: RULER's string match counts it, and the first 7 digits are the needle's.
    assert niah_grading.grade_record(record(" 12345678888"))["exact"]


def test_a_copy_cut_short_reached_the_needle_but_holds_no_7_digit_number():
    # Answers of the 2026-12-05 GLA hybrid: the needle's first digits, then a full stop.
    cut = niah_grading.grade_record(record(" 175488.\nThe grass is green.", needle="1754823"))
    assert cut == {"exact": False, "digits_right": 0.0, "leading_4": False, "number_answer": False, "prefix_4": True}
    assert niah_grading.grade_record(record(" 1,754,8.", needle="1754823"))["prefix_4"]  # commas dropped first
    # The first number decides: a later one does not count, nor a 3-digit start, nor other leading digits.
    assert not niah_grading.grade_record(record(" 403. Then 1754823", needle="1754823"))["prefix_4"]
    assert not niah_grading.grade_record(record(" 175.", needle="1754823"))["prefix_4"]
    assert not niah_grading.grade_record(record(" 1745823", needle="1754823"))["prefix_4"]


def test_grade_means_by_cell_and_skips_non_numeric_tasks():
    records = [record(" 1234567"), record(" 1299999"), record(" nothing"), record(" 1234567", length=8192),
               record(" a uuid", needle="3f2a-...", task="SK3")]
    cells = niah_grading.grade(records)
    assert set(cells) == {("SK1", 4096), ("SK1", 8192)}
    cell = cells[("SK1", 4096)]
    assert cell["n"] == 3 and cell["exact"] == pytest.approx(1 / 3) and cell["leading_4"] == pytest.approx(1 / 3)
    assert cell["number_answer"] == pytest.approx(2 / 3) and cell["digits_right"] == pytest.approx((1 + 2 / 7) / 3)


def test_summary_cells_carry_the_graded_scores(tmp_path):
    write_result(tmp_path, "niah-main-SK1-short", {"kind": "niah", "records": [
        record(" 1234567"), record(" 1234000"), record(" no")], "tasks": {"SK1": {"by_length": {"4096": 1 / 3}}}})
    cell = report.collect_evals(tmp_path)["niah"]["main"]["SK1"][4096]
    assert cell["accuracy"] == pytest.approx(1 / 3) and cell["num_samples"] == 3
    assert cell["number_answers"] == pytest.approx(2 / 3) and cell["near_misses"] == pytest.approx(2 / 3)
    assert cell["needle_prefix"] == pytest.approx(2 / 3)


def test_labels_name_the_model_whatever_the_task_and_span():
    assert report.label_of("niah-main-off-SK1-long") == "main-off"
    assert report.label_of("csr-abl-halo") == "abl-halo"
    assert report.label_of("niah-main-a500-SK3-short") == "main-a500"
    assert report.label_of("niah-gla-nope-eme") == "gla-nope-eme"
    assert report.label_of("niah-distill-SK2-short") == "distill"  # the recipe plan's snapshot of stage 2


def test_ablations_get_their_table_and_plot(tmp_path):
    for name, accuracy in (("niah-main-a500-SK1-long", 0.5), ("niah-abl-halo", 0.0)):
        write_result(tmp_path, name, {"kind": "niah", "records": [record(" 1234567", length=32768)],
                                      "tasks": {"SK1": {"by_length": {"32768": accuracy}}}})
    stage = tmp_path / "abl-halo" / "05-scaling"
    stage.mkdir(parents=True)
    (tmp_path / "abl-halo" / "00-data").mkdir()
    stage.joinpath("manifest.json").write_text(json.dumps({
        "status": "complete", "results": {"chosen_a": None, "loss_by_a": {"None": 2.5, "500": 2.7}, "length": 32768}}))
    summary = report.summarize(tmp_path)
    assert summary["niah"]["main-a500"]["SK1"][32768]["accuracy"] == 0.5
    text = report.markdown(summary)
    row = next(line for line in text.splitlines() if line.startswith("| abl-halo |") and "2.500" in line)
    assert row.split("|")[2:-1] == [" 0.00 ", " - ", " 2.500 "]  # NIAH 32K, no CSR, held-out loss with scaling off
    (tmp_path / "out").mkdir()
    written = report.plot(summary, tmp_path / "out")
    assert {path.name for path in written} == {"niah.png", "ablations.png"}


def niah_result(by_task: dict, **options) -> dict:
    """A `hyla eval niah` result: accuracy by task and length, and the inference options its settings record."""
    return {"kind": "niah", "records": [], "settings": {"model": "m", "lengths": [4096], **options},
            "tasks": {task: {"by_length": by_length} for task, by_length in by_task.items()}}


def test_the_wide_niah_table_has_a_row_per_mode_with_its_options_and_a_column_per_task_and_length(tmp_path):
    swla = {"eme_window": 4096, "eme_stride": 1024}
    log = {"logit_scaling": "per_length", "logit_scaling_train_length": 4096}
    for mode, options, accuracy in (("direct", {"logit_scaling": "off"}, 0.1), ("swla+log", {**swla, **log}, 0.9)):
        write_result(tmp_path, f"niah-gla-{mode}-short", niah_result(
            {"SK1": {"4096": accuracy}, "SK2": {"4096": accuracy / 2}}, **options))
        write_result(tmp_path, f"niah-gla-{mode}-long", niah_result({"SK1": {"65536": accuracy / 4}}, **options))
    # Two evaluations under different options written to one label: the row says so.
    write_result(tmp_path, "niah-gdn-x-SK1-short", niah_result({"SK1": {"4096": 1.0}}))
    write_result(tmp_path, "niah-gdn-x-SK2-short", niah_result({"SK2": {"4096": 0.0}}, logit_scaling="off"))
    jobs = [{"name": name} for name in ("teacher-check", "niah-gla-swla+log-short", "niah-gla-direct-short",
                                        "niah-gla-direct-long")]
    reference = {"columns": ["SK1"], "rows": {"GLA": [0]}, "GLA by mode": {"columns": ["SK1", "SK2"], "SWLA": [97, 0]}}
    (tmp_path / "plan.json").write_text(json.dumps({"name": "p", "jobs": jobs,
                                                    "report": {"niah_table": "wide", "reference": reference}}))
    summary = report.summarize(tmp_path)
    assert summary["niah_options"]["gla-swla+log"] == [{**log, **swla}]
    lines = report.markdown(summary).splitlines()
    table = lines[lines.index("## NIAH accuracy") + 2:]
    assert table[0] == "| model | inference options | SK1 4K | SK1 64K | SK2 4K |"
    # The plan's order first (swla+log before direct), then the labels it does not name.
    assert table[2] == ("| gla-swla+log | logit_scaling=per_length, logit_scaling_train_length=4096, eme_window=4096, "
                        "eme_stride=1024 | 0.90 | 0.23 | 0.45 |")
    assert table[3] == "| gla-direct | logit_scaling=off | 0.10 | 0.03 | 0.05 |"
    assert table[4] == "| gdn-x | mixed: as saved / logit_scaling=off | 1.00 | - | 0.00 |"
    assert any(line.startswith("A row marked mixed") for line in lines)
    # A captioned table of the reference is a table too.
    assert lines[lines.index("GLA by mode:") + 2:][:3] == ["|  | SK1 | SK2 |", "|---|---|---|", "| SWLA | 97 | 0 |"]
    # Without the plan's setting: the long table, a row per label and task.
    del summary["niah_table"]
    assert "| model | task | 4K | 64K |" in report.markdown(summary)


def test_trainings_and_the_plans_reference_reach_the_report(tmp_path, capsys):
    train = tmp_path / "gla-nope" / "train"
    (train / "model").mkdir(parents=True)
    (train / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 10.0 - s, "tok_per_s": 1000.0 * s})
                                                 + "\n" for s in range(1, 5)))
    (tmp_path / "plan.json").write_text(json.dumps({"name": "seed-003", "command": "hyla experiment run x",
                                                    "report": {"reference": {"rows": {"GLA-NoPE-LH": [0, 100]}}}}))
    write_result(tmp_path, "niah-gla-nope-eme", {"kind": "niah", "records": [],
                                                 "tasks": {"SK1": {"by_length": {"1024": 0.0, "16384": 0.0}}}})
    assert hyla_main(["experiment", "report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| gla-nope/train | 4 | 9.000 | 7.500 | 3,000 |" in out and '"GLA-NoPE-LH"' in out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["trainings"]["gla-nope/train"]["steps"] == 4 and summary["plan"]["name"] == "seed-003"
    with tarfile.open(tmp_path / "report" / "results.tar.xz") as archive:
        names = set(archive.getnames())
    assert {"evals/niah-gla-nope-eme/results.json", "gla-nope/train/metrics.jsonl", "plan.json"} <= names
    assert hyla_main(["experiment", "report", str(tmp_path / "nothing")]) == 2


def test_the_recorded_runs_summary_is_remade_from_its_raw_results(tmp_path):
    """Run 2 of docs/results/smollm2-135m.md: the report's numbers equal those of its published summary.json."""
    with tarfile.open(RESULTS / "run2" / "raw.tar.xz") as archive:
        archive.extractall(tmp_path, filter="data")
    published = json.loads((RESULTS / "run2" / "summary.json").read_text())
    summary = json.loads(json.dumps(report.summarize(tmp_path)))  # as written: integer keys become strings
    del summary["conversions"]["main"]["stages"]["05-scaling"]["length"]  # added since, for the ablation plot
    for key in ("csr", "ppl", "conversions"):
        assert summary[key] == published[key], key
    # That summary predates the graded NIAH scores: its cells hold accuracy and sample counts.
    plain = {label: {task: {n: {k: cell[k] for k in ("accuracy", "num_samples")} for n, cell in cells.items()}
                     for task, cells in by_task.items()} for label, by_task in summary["niah"].items()}
    assert plain == published["niah"]
    assert summary["teacher_check"]["passed"]


def write_alignment(conversion: Path, mode: str, losses: list[float], *, complete: bool = True) -> None:
    """A conversion folder's stage 1: metrics of two layers with the teacher's output energy, and the twin init."""
    (conversion / "00-data").mkdir(parents=True)
    align = conversion / "01-align"
    align.mkdir()
    rows = [{"step": step, "loss": loss, "grad_norm": 1.0 / step, "mse_00": loss / 2, "mse_01": loss / 2,
             "energy_00": 4.0, "energy_01": 1.0} for step, loss in enumerate(losses, start=1)]
    (align / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if complete:
        init = {"mode": mode, "relative_error_before": [200.0, 3.0], "relative_error_after": [0.5, 0.4]}
        (align / "manifest.json").write_text(json.dumps({"status": "complete", "results": {"init": init}}))


def test_two_conversions_alignment_curves_side_by_side(tmp_path, capsys):
    """Two `hyla convert --until-stage align` runs in one folder, twin init none and lstsq: one table, one plot."""
    write_alignment(tmp_path / "none", "none", [8.0, 4.0, 2.0])
    write_alignment(tmp_path / "lstsq", "lstsq", [1.0, 0.5], complete=False)
    assert hyla_main(["experiment", "report", str(tmp_path), "--no-tarball"]) == 0
    out = capsys.readouterr().out
    assert "| none | none | 3 | 101.500 -> 0.450 | 8.0000 -> 2.0000 | 2.500 -> 0.625 |" in out
    assert "| lstsq | - | 2 (running) | - -> - |" in out  # no manifest yet: the init is not known
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    none = summary["alignment"]["none"]
    assert none["steps"] == [1, 2, 3] and none["relative_error_last"] == [0.25, 1.0]
    assert (tmp_path / "report" / "align.png").stat().st_size > 0


def test_alignment_metrics_without_energies_still_plot_the_loss(tmp_path):
    conversion = tmp_path / "old"
    (conversion / "00-data").mkdir(parents=True)
    (conversion / "01-align").mkdir()
    (conversion / "01-align" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "mse_00": 3.0}) +
                                                           "\n" + '{"step": 2, "lo')  # the last line cut by a kill
    record = report.summarize(tmp_path)["alignment"]["old"]
    assert record["loss"] == [3.0] and record["relative_error_first"] is None
    (tmp_path / "out").mkdir()
    assert [path.name for path in report.plot(report.summarize(tmp_path), tmp_path / "out")] == ["align.png"]


def test_the_layer_selection_reaches_the_report_also_when_the_run_was_cut(tmp_path, capsys):
    from hyla.convert.select_report import build_report
    from hyla.convert.selection import SelectionScores

    scores = SelectionScores(4)
    scores.teacher_recall, scores.teacher_recall_stderr, scores.teacher_csr, scores.teacher_csr_stderr = 0.8, 0.04, 0.5, 0.01
    for layer, recall in enumerate([0.78, 0.2, 0.8, 0.76]):
        scores.add(layer, (recall, 0.05), (0.5, 0.01), 10.0 + layer)
    full = tmp_path / "full" / "02-select"
    full.mkdir(parents=True)
    (tmp_path / "full" / "00-data").mkdir()
    selection = build_report(scores, "halo", k=1, noise_z=2.0, alignment_errors={0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4})
    assert selection.chosen == [1], "layer 1's recall cost (0.6, 12 standard errors) is the only one beyond the noise"
    selection.write_json(full / "selection.json")
    selection.plot(full / "selection.png")
    cut = tmp_path / "cut" / "02-select"
    cut.mkdir(parents=True)
    (tmp_path / "cut" / "00-data").mkdir()
    partial = SelectionScores(4)
    partial.add(0, (0.5, 0.1), (0.4, 0.02), 3.0)
    (cut / "scores.partial.json").write_text(json.dumps(partial.to_dict()))

    assert hyla_main(["experiment", "report", str(tmp_path), "--no-tarball"]) == 0
    out = capsys.readouterr().out
    assert "## Layer selection: full (halo, chosen [1])" in out
    assert "Teacher: recall 0.800 ± 0.040, CSR 0.500 ± 0.010." in out
    assert "| 1 | 0.200 ± 0.050 | 0.500 ± 0.010 |" in out and "| yes | 11.0 |" in out
    assert "## Layer selection: cut (halo, running or cut: 1 of 4 variants scored)" in out
    assert "| 0 | 0.500 ± 0.100 | 0.400 ± 0.020 | - | - | - |  | 3.0 |" in out
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["selection"]["full"]["chosen"] == [1] and not summary["selection"]["cut"]["complete"]
    assert (tmp_path / "report" / "selection-full.png").stat().st_size > 0
    assert not (tmp_path / "report" / "selection-cut.png").exists()


def prompt(task, length, index, right, needle=None):
    needle = needle or f"{index:07d}"
    return {"task": task, "length": length, "depth_percent": 10 * (index % 11), "index": index, "outputs": [needle],
            "pred": needle if right else "no", "score": 1.0 if right else 0.0}


def test_sign_test_by_hand():
    from hyla.experiment.niah_pairs import sign_test

    assert sign_test(0, 0) == 1.0
    assert sign_test(5, 0) == pytest.approx(2 / 2**5)  # all five one way: 2 x (1/2)^5
    assert sign_test(9, 2) == pytest.approx(2 * (1 + 11 + 55) / 2**11)  # sitting K's 9 against 2: 0.0654
    assert sign_test(3, 3) == 1.0


def test_every_model_is_compared_with_main_prompt_by_prompt(tmp_path):
    """Two models on the same 8 SK2 prompts (main right on 0-5, other on 4-7) and 2 SK1 prompts, in another batch
    order; a third model shares no prompt with main and gets no row; a prompt main alone has is counted apart."""
    main_records = [prompt("SK2", 4096, i, right=i < 6) for i in range(8)] + [prompt("SK1", 4096, 0, True),
                                                                              prompt("SK1", 4096, 1, True)]
    other = [prompt("SK2", 4096, i, right=i >= 4) for i in reversed(range(8))] + [prompt("SK1", 4096, 0, True)]
    stranger = [prompt("SK2", 4096, i, right=True, needle="9999999") for i in range(8)]
    for label, records in (("main", main_records), ("other", other), ("stranger", stranger)):
        write_result(tmp_path, f"niah-{label}-SK2-short", {"kind": "niah", "records": records,
                                                           "tasks": {"SK2": {"by_length": {"4096": 0.5}}}})
    pairs = report.collect_evals(tmp_path)["niah_pairs"]
    assert set(pairs) == {"other"}
    sk2 = pairs["other"]["SK2"]
    # main right only on 0-3, other only on 6-7; both on 4-5
    assert (sk2["prompts"], sk2["right_a"], sk2["right_b"], sk2["only_a"], sk2["only_b"]) == (8, 6, 4, 4, 2)
    assert sk2["p"] == pytest.approx(2 * (1 + 6 + 15) / 2**6)
    assert pairs["other"]["SK1"]["prompts"] == 1 and pairs["other"]["unmatched"] == 1
    text = report.markdown({**report.collect_evals(tmp_path), "plan": {}, "status": None, "conversions": {},
                            "alignment": {}, "selection": {}, "trainings": {}})
    assert "| other | SK2 | 8 | 6 / 4 | 4 / 2 | 0.6875 |" in text and "left out: other 1" in text


def test_a_prompt_twice_in_one_model_is_refused():
    from hyla.experiment.niah_pairs import pair_records

    twice = [prompt("SK1", 4096, 0, True), prompt("SK1", 4096, 0, False)]
    with pytest.raises(ValueError, match="main holds the same prompt twice"):
        pair_records(twice, twice[:1], names=("main", "other"))


def test_a_label_with_a_prompt_twice_is_left_out_of_the_pairs_and_the_report_goes_on(tmp_path, capsys):
    records = [prompt("SK1", 4096, 0, True)]
    write_result(tmp_path, "niah-main-SK1-short", {"kind": "niah", "records": records,
                                                   "tasks": {"SK1": {"by_length": {"4096": 1.0}}}})
    for folder in ("niah-other-SK1-short", "niah-other-SK1"):  # two folders of one label, the same prompt
        write_result(tmp_path, folder, {"kind": "niah", "records": records,
                                        "tasks": {"SK1": {"by_length": {"4096": 1.0}}}})
    assert report.collect_evals(tmp_path)["niah_pairs"] == {}
    assert "other left out: other holds the same prompt twice" in capsys.readouterr().out


def test_the_scaling_stage_table_has_a_row_per_candidate_with_the_chosen_one_marked():
    scaling = {"chosen_a": 5000, "loss_by_a": {"None": 3.5, "5000": 3.25}, "recall_loss_by_a": {"None": 0.9,
                                                                                               "5000": 0.5},
               "recall_exact_by_a": {"None": 0.0, "5000": 1 / 3}}
    lines = report._scaling_lines({"main": {"stages": {"05-scaling": scaling}}, "other": {"stages": {}}})
    assert "| main | off | 3.500 | 0.900 | 0.00 |  |" in lines
    assert "| main | 5000 | 3.250 | 0.500 | 0.33 | chosen |" in lines
    assert len([line for line in lines if line.startswith("| main")]) == 2
    assert report._scaling_lines({"other": {"stages": {}}}) == []


def test_head_analyses_are_summarised_per_layer_type_and_tabled(tmp_path):
    def head(layer, index, group, hit_rate, entropy):
        return {"layer": layer, "head": index, "group": group, "layer_type": group, "hit_rate": hit_rate,
                "answer_entropy": entropy}

    heads = [head(0, 0, "gla", 0.0, 0.9), head(0, 1, "gla", 0.25, 0.7), head(1, 0, "attention", 0.75, 0.2),
             head(1, 1, "attention", 0.5, 0.3), head(1, 2, "attention", 0.125, 0.6)]
    write_result(tmp_path, "analyze-gla-4K-eme", {
        "kind": "analysis/hitrate",
        "settings": {"task": "SK1", "length": 4096, "num_samples": 4, "top_k": 64,
                     "inference_options": {"eme_window": 4096, "eme_stride": 1024}},
        # the summary as hyla.analysis.heads.group_means writes it: means over each group's heads
        "summary": {"gla": {"num_heads": 2, "hit_rate": 0.125, "answer_entropy": 0.8},
                    "attention": {"num_heads": 3, "hit_rate": 0.4583, "answer_entropy": 0.3667}},
        "heads": heads})
    evals = report.collect_evals(tmp_path)
    assert set(evals["niah"]) == set() and set(evals["heads"]) == {"gla-4K-eme"}
    found = evals["heads"]["gla-4K-eme"]
    assert (found["task"], found["length"], found["num_samples"]) == ("SK1", 4096, 4)
    attention = found["groups"]["attention"]
    # hit rate >= 0.5 finds the needle: 0.75 and 0.5 do, 0.125 does not
    assert attention["finding"] == 2 and attention["best"] == {"layer": 1, "head": 0, "hit_rate": 0.75}
    assert found["groups"]["gla"]["finding"] == 0 and found["groups"]["gla"]["best"]["head"] == 1
    summary = json.loads(json.dumps(report.summarize(tmp_path)))  # as written
    assert summary["heads"] == evals["heads"]
    lines = report.markdown(summary).splitlines()
    assert "## Head analysis (`hyla analyze hitrate`)" in lines
    assert ("| gla-4K-eme | SK1 4K x4 | eme_stride=1024, eme_window=4096 | attention | 3 | 0.46 | 0.37 | 2 | "
            "1.0: 0.75 |") in lines
