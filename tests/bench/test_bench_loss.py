"""`hyla bench loss` on toy shapes on CPU: hyla's chunked loss and the materialised reference are checked and timed,
hyla's Triton KL, Liger and fla are skipped with their reasons (the Triton KL also in the cross-entropy case, which
it does not compute), and an implementation that fails its check is not timed. The Triton KL's check passing runs
under Triton's interpreter (tests/ops/test_kernels_interpreted.py)."""

import json
import sys

import pytest
import torch

from hyla.bench import loss
from hyla.bench.loss import LossBenchSettings, LossCase, TOY_SETTINGS
from hyla.cli import main


def test_bench_loss_toy_times_hyla_and_the_reference_and_skips_the_libraries_with_their_reasons(tmp_path):
    assert main(["bench", "loss", "--toy", "--device", "cpu", "--repeats", "1", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "loss.json").read_text())
    timed = {(row["case"], row["implementation"]) for row in results["results"]}
    assert timed == {(case, name) for case in ("kl:2x64", "ce:1x128") for name in ("hyla-chunked", "eager")}
    assert all(check["passed"] for check in results["checks"]) and len(results["checks"]) == 4
    for check in results["checks"]:  # float32 on CPU: summation order only
        assert max(check["relative_errors"].values()) < 1e-5
    for row in results["results"]:
        assert row["median_ms"] > 0 and row["rows"] == 128
        assert row["time_vs_hyla"] == (1.0 if row["implementation"] == "hyla-chunked" else pytest.approx(
            row["median_ms"] / next(r["median_ms"] for r in results["results"]
                                    if r["case"] == row["case"] and r["implementation"] == "hyla-chunked")))
    assert {skip["implementation"]: skip["reason"].split(" (")[0] for skip in results["skipped"]} == {
        "hyla-triton": "needs CUDA", "liger": "needs CUDA", "fla": "needs CUDA"}
    assert results["liger"] is None and results["fla"] is None
    assert results["environment"]["torch"] == torch.__version__
    markdown = (tmp_path / "loss.md").read_text()
    assert "| kl:2x64 | hyla-chunked |" in markdown and "- liger: needs CUDA" in markdown
    assert "- fla: needs CUDA" in markdown and "- hyla-triton: needs CUDA" in markdown


def test_the_triton_kl_is_skipped_without_cuda_or_triton_and_in_the_cross_entropy_case(monkeypatch):
    assert "CUDA" in loss.hyla_triton_unavailable(torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "triton", None)  # an import of triton fails as if not installed
    assert loss.hyla_triton_unavailable(torch.device("cuda")) == "triton is not installed (pip install triton)"
    monkeypatch.undo()
    lines = []
    settings = LossBenchSettings(**TOY_SETTINGS, device="cpu", implementations=("hyla-triton", "eager"))
    checks, skipped = loss.check_case(LossCase("ce", 1, 16), settings.implementations, settings,
                                      torch.device("cpu"), lines.append)
    assert [check["implementation"] for check in checks] == ["eager"] and checks[0]["passed"]
    assert skipped == [{"case": "ce:1x16", "implementation": "hyla-triton", "reason": "computes the kl loss only"}]
    assert "ce:1x16 hyla-triton: skipped (computes the kl loss only)" in lines
    with pytest.raises(ValueError, match="kl loss only"):
        loss.loss_function("ce", "hyla-triton")


def test_liger_is_skipped_with_the_reason_it_cannot_run(monkeypatch):
    assert "CUDA" in loss.liger_unavailable(torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of liger_kernel fails as if not installed
    assert loss.liger_unavailable(torch.device("cuda")).startswith("liger_kernel is not installed")
    settings = LossBenchSettings(**TOY_SETTINGS, device="cuda", implementations=("hyla-chunked", "liger"))
    runnable, skipped = loss.runnable_implementations(settings, torch.device("cuda"))
    assert runnable == ["hyla-chunked"]
    assert skipped == [{"case": None, "implementation": "liger",
                        "reason": "liger_kernel is not installed (pip install liger-kernel)"}]


def test_fla_is_skipped_with_the_reason_it_cannot_run(monkeypatch):
    assert "CUDA" in loss.fla_unavailable(torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "fla", None)  # an import of fla fails as if not installed
    assert loss.fla_unavailable(torch.device("cuda")) == "fla is not installed (pip install flash-linear-attention)"
    settings = LossBenchSettings(**TOY_SETTINGS, device="cuda", implementations=("hyla-chunked", "fla", "eager"))
    runnable, skipped = loss.runnable_implementations(settings, torch.device("cuda"))
    assert runnable == ["hyla-chunked", "eager"] and [skip["implementation"] for skip in skipped] == ["fla"]


def test_an_error_inside_a_library_is_reported_and_one_inside_hyla_is_raised():
    def broken():
        raise RuntimeError("addmm: out= is not supported under autocast")

    for library in loss.LIBRARIES:
        assert loss._guarded(library, torch.device("cpu"), broken) == (
            None, "RuntimeError: addmm: out= is not supported under autocast")
    with pytest.raises(RuntimeError, match="out="):
        loss._guarded("hyla-chunked", torch.device("cpu"), broken)


def test_an_implementation_that_fails_its_check_is_not_timed(monkeypatch):
    right = loss.loss_function

    def wrong_hyla(name, implementation):
        fn = right(name, implementation)
        return (lambda x: 1.01 * fn(x)) if implementation == "hyla-chunked" else fn

    monkeypatch.setattr(loss, "loss_function", wrong_hyla)
    settings = LossBenchSettings(**{**TOY_SETTINGS, "cases": (LossCase("kl", 1, 16),)}, repeats=1, device="cpu",
                                 implementations=("hyla-chunked", "eager"))
    results = loss.run_loss_bench(settings, log=lambda line: None)
    assert [row["implementation"] for row in results["results"]] == ["eager"]
    assert results["results"][0]["time_vs_hyla"] is None  # no baseline timed in this case
    [failed] = results["skipped"]
    assert failed["implementation"] == "hyla-chunked" and failed["reason"].startswith("check failed")
    assert "hyla-chunked: check failed" in loss.loss_markdown({**results, "environment": {}}, "hyla bench loss")


def test_loss_cases_parse_and_refuse_what_they_cannot_run():
    assert LossCase.parse("kl:16x4096") == LossCase("kl", 16, 4096) and LossCase.parse("ce:4x16384").rows == 65536
    for text in ("kl:16", "align:2x64", "ce:0x64", "kl16x4096"):
        with pytest.raises(ValueError, match="case"):
            LossCase.parse(text)
    with pytest.raises(ValueError, match="unknown implementations"):
        LossBenchSettings(implementations=("apex",), device="cpu")


def test_the_command_line_lists_the_implementations_the_bench_knows():
    from hyla.bench import cli

    assert cli.LOSS_IMPLEMENTATIONS == loss.IMPLEMENTATIONS
