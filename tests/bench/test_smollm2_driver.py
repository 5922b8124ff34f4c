"""The job graph of bench/smollm2/driver.py (built, not run): ablation choice, evaluation ordering, --only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "smollm2"))
import driver  # noqa: E402


def graph_of(tmp_path: Path, *extra: str) -> driver.Graph:
    args, sizes = driver.parse_args(["--teacher", "t.gguf", "--run", str(tmp_path / "run"), "--smoke", *extra])
    return driver.build_graph(args, sizes)


def test_every_ablation_by_default_and_none_on_request(tmp_path):
    every = graph_of(tmp_path)
    for name in driver.ABLATIONS:
        assert {f"convert-{name}", f"niah-{name}", f"csr-{name}"} <= every.jobs.keys()
    none = graph_of(tmp_path, "--ablations", "none")
    assert not [name for name in none.jobs if "abl-" in name]
    assert {"convert-main", "niah-main-SK1-long", "niah-teacher-SK3-short", "csr-main-off"} <= none.jobs.keys()
    some = graph_of(tmp_path, "--ablations", "abl-uniform,abl-no-rnn-rope")
    assert {name for name in some.jobs if name.startswith("convert-abl")} == {
        "convert-abl-uniform", "convert-abl-no-rnn-rope"}
    assert "abl-no-rnn-rope-align" in some.jobs


def test_unknown_ablation_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        graph_of(tmp_path, "--ablations", "abl-nope")
    assert "unknown ablations ['abl-nope']" in capsys.readouterr().err


def test_main_set_reaches_the_main_conversion_only(tmp_path):
    graph = graph_of(tmp_path, "--ablations", "abl-uniform", "--main-set", "distill.seq_len=2048")
    main_command = graph.jobs["convert-main"].command()
    assert "distill.seq_len=2048" in main_command
    (tmp_path / "run" / "main" / "00-data").mkdir(parents=True)  # the ablation copies stages 00-01 on start
    (tmp_path / "run" / "main" / "01-align").mkdir()
    assert "distill.seq_len=2048" not in graph.jobs["convert-abl-uniform"].command()


def test_hybrid_evaluations_wait_for_every_conversion_when_asked(tmp_path):
    graph = graph_of(tmp_path, "--ablations", "abl-uniform", "--evals-after-training")
    trainings = {name for name, job in graph.jobs.items() if job.kind == "train"}
    assert trainings == {"convert-select", "convert-main", "convert-abl-uniform"}
    for name in ("niah-main-SK1-short", "niah-main-off-SK3-long", "csr-main", "ppl-main-off", "niah-abl-uniform",
                 "csr-abl-uniform"):
        assert set(graph.jobs[name].after) == trainings, name
    teacher = [name for name in graph.jobs if name.split("-")[1:2] == ["teacher"]]
    assert len(teacher) == 8 and not any(graph.jobs[name].after for name in teacher)
    assert not graph_of(tmp_path).jobs["niah-main-SK1-short"].after


def test_only_keeps_the_jobs_named_and_what_they_need(tmp_path):
    graph = graph_of(tmp_path, "--evals-after-training")
    driver.keep_only(graph, ["csr-main"])
    assert set(graph.jobs) == {"csr-main", "convert-main", "convert-select", "corpus", "teacher-check"}
    assert set(graph.jobs["csr-main"].after) == {"convert-main", "convert-select"}
    with pytest.raises(SystemExit, match="unknown jobs"):
        driver.keep_only(graph, ["csr-nothing"])


def test_recall_documents_join_the_corpus_on_request(tmp_path):
    plain = graph_of(tmp_path, "--text", "/data/text").jobs["corpus"].command()
    assert not any(item.startswith("recall") for item in plain)
    mixed = graph_of(tmp_path, "--text", "/data/text", "--recall", "2000-14000").jobs["corpus"].command()
    assert mixed[mixed.index("/data/text") - 1] == "--source"
    assert "recall@2000-14000:/data/text" in mixed and "stdlib" in mixed


def test_corpus_weights_reach_the_corpus_job(tmp_path):
    plain = graph_of(tmp_path, "--text", "/data/text", "--recall", "2000-14000").jobs["corpus"].command()
    assert "--weights" not in plain
    weighted = graph_of(tmp_path, "--text", "/data/text", "--recall", "2000-14000", "--corpus-weights", "3,1,1")
    command = weighted.jobs["corpus"].command()
    assert command[command.index("--weights") + 1] == "3,1,1"


def test_corpus_tokens_cut_the_corpus(tmp_path):
    command = graph_of(tmp_path, "--corpus-tokens", "3e7").jobs["corpus"].command()
    assert command[command.index("--max-tokens") + 1] == "30000000"
    default = graph_of(tmp_path).jobs["corpus"].command()
    assert default[default.index("--max-tokens") + 1] == driver.SMOKE.corpus_tokens
    assert driver.GPU.corpus_tokens == "200000000" and driver.SMOKE.corpus_tokens == "300000"


def test_scaling_docs_move_the_largest_text_files_into_their_own_corpus(tmp_path):
    text = tmp_path / "text"
    (text / "a").mkdir(parents=True)
    sizes = {"a/small.txt": 10, "a/big.txt": 500, "mid.txt": 300, "largest.txt": 900, "tiny.txt": 5}
    for name, size in sizes.items():
        (text / name).write_text("x" * size)
    graph = graph_of(tmp_path, "--text", str(text), "--scaling-docs", "2", "--ablations", "abl-uniform")
    assert graph.jobs["corpus"].needs == ["scaling-corpus"]
    assert graph.jobs["corpus"].env == graph.jobs["scaling-corpus"].env == {"TOKENIZERS_PARALLELISM": "true"}
    assert graph.jobs["convert-main"].env == {}
    scaling_corpus = str(tmp_path / "run" / "scaling-corpus")
    for name in ("convert-main", "convert-select"):
        assert f"scaling.data={scaling_corpus}" in graph.jobs[name].command()
    command = graph.jobs["scaling-corpus"].command()
    moved = tmp_path / "run" / "scaling-text"
    assert sorted(p.name for p in moved.iterdir()) == ["a__big.txt", "largest.txt"]
    assert sorted(str(p.relative_to(text)) for p in text.rglob("*.txt")) == ["a/small.txt", "mid.txt", "tiny.txt"]
    assert command[command.index("--source") + 1] == str(moved) and command[-1] == scaling_corpus
    graph.jobs["scaling-corpus"].command()  # a rerun moves nothing more
    assert len(list(text.rglob("*.txt"))) == 3
    (tmp_path / "run" / "main" / "00-data").mkdir(parents=True)
    (tmp_path / "run" / "main" / "01-align").mkdir()
    assert f"scaling.data={scaling_corpus}" in graph.jobs["convert-abl-uniform"].command()
    with pytest.raises(SystemExit):
        driver.parse_args(["--teacher", "t", "--run", str(tmp_path), "--scaling-docs", "2"])


def test_several_recall_ranges_give_one_source_each(tmp_path):
    command = graph_of(tmp_path, "--text", "/data/text", "--recall", "1000-12000,20000-60000",
                       "--corpus-weights", "6,2,1,1").jobs["corpus"].command()
    sources = [command[i + 1] for i, item in enumerate(command) if item == "--source"]
    assert sources == ["/data/text", "recall@1000-12000:/data/text", "recall@20000-60000:/data/text", "stdlib"]
    assert command[command.index("--weights") + 1] == "6,2,1,1"


def test_a_jobs_own_environment_reaches_its_process(tmp_path):
    graph = driver.Graph(tmp_path / "run", parallel=2, train_slots=1)
    show = [sys.executable, "-c", "import os; print('X =', os.environ.get('HYLA_DRIVER_TEST'))"]
    graph.add("with", lambda: show, env={"HYLA_DRIVER_TEST": "on"})
    graph.add("without", lambda: show)
    assert graph.run_all()
    assert "X = on" in (tmp_path / "run" / "logs" / "with.log").read_text()
    assert "X = None" in (tmp_path / "run" / "logs" / "without.log").read_text()


def test_ablation_lengths_default_to_the_long_ones(tmp_path):
    def lengths(graph):
        command = graph.jobs["niah-abl-uniform"].command()
        return command[command.index("--lengths") + 1]

    assert lengths(graph_of(tmp_path, "--ablations", "abl-uniform")) == ",".join(driver.SMOKE.long)
    assert lengths(graph_of(tmp_path, "--ablations", "abl-uniform", "--ablation-lengths", "4K,32K")) == "4K,32K"


def test_ablations_share_the_halo_runs_alignment_and_selection_settings(tmp_path):
    graph = graph_of(tmp_path, "--main-set", "selection.method=0,1,7", "--main-set", "align.tokens=4096",
                     "--main-set", "distill.tokens=9999", "--ablation-set", "distill.tokens=1024")
    (tmp_path / "run" / "main" / "00-data").mkdir(parents=True)
    for stage in ("01-align", "02-select"):
        (tmp_path / "run" / "main" / stage).mkdir()
    halo = graph.jobs["convert-abl-halo"].command()
    assert "selection.method=0,1,7" in halo and "align.tokens=4096" in halo
    assert "distill.tokens=9999" not in halo and halo[-1] == "distill.tokens=1024"
    uniform = graph.jobs["convert-abl-uniform"].command()
    methods = [item for item in uniform if item.startswith("selection.method=")]
    assert methods[-1] == "selection.method=uniform"  # its own rule wins over the shared one
    assert "align.tokens=4096" in graph.jobs["abl-no-rnn-rope-align"].command()
    for item in ("selection.k=3", "align.lr=1e-4", "scaling.num_docs=2"):
        with pytest.raises(SystemExit):
            driver.parse_args(["--teacher", "t", "--run", str(tmp_path), "--ablation-set", item])


def test_own_alignment_ablations_need_the_halo_run_only_without_an_explicit_layer_choice(tmp_path):
    explicit = graph_of(tmp_path, "--main-set", "selection.method=0,1,7")
    assert explicit.jobs["convert-abl-no-rnn-rope"].needs == ["abl-no-rnn-rope-align"]
    command = explicit.jobs["convert-abl-no-rnn-rope"].command()  # no HALO run on disk: the layers come from --main-set
    assert [item for item in command if item.startswith("selection.method=")][-1] == "selection.method=0,1,7"
    assert "convert-select" in explicit.jobs["convert-abl-halo"].needs  # it copies the HALO run's stages
    rule = graph_of(tmp_path, "--main-set", "selection.method=uniform")
    assert rule.jobs["convert-abl-no-rnn-rope"].needs == ["convert-select", "abl-no-rnn-rope-align"]


def test_a_training_that_ran_out_of_gpu_memory_runs_again_alone(tmp_path):
    marker = tmp_path / "tried"
    graph = driver.Graph(tmp_path / "run", parallel=4, train_slots=2)
    oom = (f"import pathlib, sys, time; m = pathlib.Path({str(marker)!r}); first = not m.exists(); m.touch(); "
           "time.sleep(0.5); print('torch.OutOfMemoryError: CUDA out of memory.' if first else 'ok'); "
           "sys.exit(1 if first else 0)")
    graph.add("a", lambda: [sys.executable, "-c", oom], kind="train")
    graph.add("b", lambda: [sys.executable, "-c", "import time; time.sleep(4)"], kind="train")
    graph.add("c", lambda: [sys.executable, "-c", "pass"], needs=["a"])
    graph.add("broken", lambda: [sys.executable, "-c", "raise SystemExit(3)"], kind="train")
    assert not graph.run_all()  # `broken` fails for another reason: no retry
    states = {name: job.state for name, job in graph.jobs.items()}
    assert states == {"a": "done", "b": "done", "c": "done", "broken": "failed"}
    log = (tmp_path / "run" / "driver.log").read_text()
    assert "retry   a" in log and "retry   broken" not in log
    assert graph.jobs["a"].started >= graph.jobs["b"].ended  # the second attempt waited for `b`


def test_niah_scaling_adds_long_niah_jobs_for_each_fixed_a(tmp_path):
    graph = graph_of(tmp_path, "--niah-scaling", "100,500", "--evals-after-training")
    command = graph.jobs["niah-main-a500-SK2-long"].command()
    assert command[command.index("--logit-scaling-a") + 1] == "500"
    assert command[command.index("--lengths") + 1] == ",".join(driver.SMOKE.long)
    assert graph.jobs["niah-main-a100-SK1-long"].needs == ["convert-main"]
    assert "convert-main" in graph.jobs["niah-main-a100-SK1-long"].after  # a hybrid's evaluation: after training
    assert not any(name.startswith("niah-main-a") for name in graph_of(tmp_path).jobs)
    for bad in ("1", "x"):
        with pytest.raises(SystemExit):
            driver.parse_args(["--teacher", "t", "--run", str(tmp_path), "--niah-scaling", bad])


def test_gpu_tests_take_the_files_given_or_the_family_ones(tmp_path):
    def files(graph):
        command = graph.jobs["gpu-tests"].command()
        return command[command.index("pytest") + 1 : command.index("-q")]

    assert files(graph_of(tmp_path, "--gpu-tests")) == driver.FAMILY_GPU_TESTS
    given = graph_of(tmp_path, "--gpu-tests", "tests/ops/test_attention_gpu.py,tests/convert/test_mean_loss_gpu.py")
    assert files(given) == ["tests/ops/test_attention_gpu.py", "tests/convert/test_mean_loss_gpu.py"]
    assert "gpu-tests" not in graph_of(tmp_path).jobs
    for path in driver.FAMILY_GPU_TESTS:
        assert (Path(__file__).resolve().parents[2] / path).is_file()


def test_a_recipe_preset_brings_its_own_data_and_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("HYLA_TEXT_DIR", "unset")  # restored after the test; the driver sets it for its jobs
    args, sizes = driver.parse_args(["--teacher", "t.gguf", "--run", str(tmp_path / "run"), "--ablations", "none",
                                     "--preset", "halo-smollm2", "--text-cache", str(tmp_path / "text"),
                                     "--main-set", "token_scale=0.5"])
    graph = driver.build_graph(args, sizes)
    command = graph.jobs["convert-main"].command()
    assert command[command.index("--preset") + 1] == "halo-smollm2" and "--data" not in command
    assert "token_scale=0.5" in command and "distill.tokens=8e6" not in command
    assert "data" not in graph.jobs["corpus"].command()[:4]
    import os

    assert os.environ["HYLA_TEXT_DIR"] == str(tmp_path / "text")
