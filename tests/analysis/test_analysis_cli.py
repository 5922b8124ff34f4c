"""`hyla analyze {entropy,hitrate,displacement}` on a tiny HypeNet folder: self-describing results and plots."""

import json

from hyla.cli import main

SAMPLE_OPTIONS = ["--task", "SK1", "--length", "1024", "--num-samples", "2", "--no-progress"]


def read(folder):
    return json.loads((folder / "results.json").read_text())


def test_entropy_writes_per_head_results_and_plots(tiny_model_folder, tmp_path):
    out = tmp_path / "entropy"
    code = main(["analyze", "entropy", "--model", str(tiny_model_folder), "--out", str(out),
                 "--num-query-positions", "64", "--block-size", "16", *SAMPLE_OPTIONS])
    assert code == 0
    results = read(out)
    assert results["kind"] == "analysis/entropy" and results["settings"]["num_query_positions"] == 64
    assert {"command", "versions", "git_sha"} <= set(results)
    assert len(results["heads"]) == 4 * 4
    assert set(results["summary"]) == {"lightning", "attention"}
    assert all(0 <= head["entropy"] <= 1 for head in results["heads"])
    assert (out / "entropy_by_head.png").stat().st_size > 0
    assert (out / "entropy_by_position.png").stat().st_size > 0


def test_hitrate_writes_the_entropy_vs_hit_rate_plot(tiny_model_folder, tmp_path):
    out = tmp_path / "hitrate"
    code = main(["analyze", "hitrate", "--model", str(tiny_model_folder), "--out", str(out), "--top-k", "16",
                 *SAMPLE_OPTIONS])
    assert code == 0
    results = read(out)
    assert len(results["samples"]) == 2 and all(len(sample["needle_positions"]) == 7 for sample in results["samples"])
    assert all(0 <= head["hit_rate"] <= 1 for head in results["heads"])
    assert all(len(head["hit_rate_by_sample"]) == 2 for head in results["heads"])
    assert (out / "entropy_vs_hitrate.png").stat().st_size > 0


def test_displacement_of_a_folder_against_itself_is_zero(tiny_model_folder, tmp_path):
    out = tmp_path / "displacement"
    assert main(["analyze", "displacement", "--before", str(tiny_model_folder), "--after", str(tiny_model_folder),
                 "--out", str(out)]) == 0
    results = read(out)
    assert all(head["r"] == 0 for head in results["heads"])
    assert (out / "displacement_by_layer.png").stat().st_size > 0


def test_bad_model_path_is_one_error_line(tmp_path, capsys):
    code = main(["analyze", "hitrate", "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hyla analyze: error:") and "\n" not in error
    code = main(["analyze", "displacement", "--before", str(tmp_path), "--after", str(tmp_path)])
    assert code == 2
