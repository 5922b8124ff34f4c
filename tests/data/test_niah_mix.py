"""The NIAH training mix (`hyla data niah-mix`; CPU, ~30 s; needs the smollm2-135m tokenizer and wonderwords, as
`hyla eval niah` does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyla.cli import main as hyla_main
from hyla.data.loader import PackedDataset, TokenLoader
from hyla.data.niah_docs import CopyDocGenerator, Exclusions, RetrievalDocGenerator, render_doc
from hyla.evals.niah_samples import NEEDLE_TEMPLATE, REPEAT_HAYSTACK_LINE, build_samples


@pytest.fixture(scope="module")
def tokenizer():
    from hyla.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tokenizer):
    from hyla.data.tokenize import PrepareSettings, prepare_corpus

    texts = tmp_path_factory.mktemp("texts")
    for index in range(20):
        (texts / f"doc{index}.txt").write_text(f"Document {index}. " + "Some ordinary words here. " * (40 + index))
    out = tmp_path_factory.mktemp("corpus") / "corpus"
    prepare_corpus(out, PrepareSettings(tokenizer="smollm2-135m", sources=(str(texts),)), show_progress=False)
    return out


def test_training_document_is_the_evaluation_prompt_and_its_answer(tokenizer):
    sample = build_samples(tokenizer, "SK1", 600, 1, seed=7, num_depths=3)[0]
    lines = sample.input.split("\n")[1:-1]
    needle_line = next(i for i, line in enumerate(lines) if line != REPEAT_HAYSTACK_LINE)
    value = sample.outputs[0]
    key = lines[needle_line].removeprefix("One of the special magic numbers for ").removesuffix(f" is: {value}.")
    assert lines[needle_line] == NEEDLE_TEMPLATE.format(type_needle_v="numbers", key=key, value=value)
    assert render_doc(key, value, len(lines) - 1, needle_line) == f"{sample.input} {value}."


def test_documents_fit_their_length_and_avoid_excluded_needles(tokenizer):
    first = RetrievalDocGenerator(tokenizer, max_tokens=300, seed=3, exclusions=Exclusions()).draw_tokenized(40)
    assert all(len(ids) <= 300 for _, ids in first)
    assert min(len(ids) for _, ids in first) < 200 < max(len(ids) for _, ids in first)
    excluded = Exclusions(keys={doc.key for doc, _ in first}, values={doc.value for doc, _ in first})
    # The same seed would draw the same needles; with them excluded none of them comes back.
    again = RetrievalDocGenerator(tokenizer, max_tokens=300, seed=3, exclusions=excluded).draw_tokenized(40)
    assert not {doc.key for doc, _ in again} & excluded.keys
    assert not {doc.value for doc, _ in again} & excluded.values


def test_copy_documents_repeat_their_list_and_avoid_excluded_needles(tokenizer):
    first = CopyDocGenerator(tokenizer, seed=5, exclusions=Exclusions())
    texts = [first.draw_text() for _ in range(20)]
    items = {item for text in texts for item in text.split("\n")[0].removeprefix("List: ").rstrip(".").split(", ")}
    for text in texts:
        head, tail = text.split("\n")
        assert tail == head.replace("List:", "The same list again:")
    excluded = Exclusions(keys={i for i in items if not i.isdigit()}, values={i for i in items if i.isdigit()})
    again = CopyDocGenerator(tokenizer, seed=5, exclusions=excluded)
    for _ in range(20):
        assert not set(again.draw_text().split("\n")[0].removeprefix("List: ").rstrip(".").split(", ")) & items


def _mix_args(corpus: Path, out: Path, share: float = 0.5, copy_share: float = 0.25) -> list[str]:
    return ["data", "niah-mix", "--corpus", str(corpus), "--out", str(out), "--seq-len", "256", "--num-sequences", "12",
            "--retrieval-share", str(share), "--copy-share", str(copy_share), "--eval-lengths", "256,1024",
            "--eval-num-samples", "3", "--eval-num-depths", "2"]


def test_each_retrieval_document_starts_a_training_sequence(tmp_path, corpus, tokenizer):
    out = tmp_path / "mix"
    assert hyla_main(_mix_args(corpus, out)) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_tokens"] == 12 * 256 + 1
    assert manifest["mix"]["exclusions"]["eval_samples"] == 6
    assert manifest["mix"]["num_copy_blocks"] == 3 and manifest["mix"]["copy_tokens"] == 3 * 256
    rows = [json.loads(line) for line in (out / "retrieval-docs.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    dataset = PackedDataset(out, 256)
    assert len(dataset) == 12
    for row in rows:
        window = dataset.window(row["block"])
        text = tokenizer.decode(window[: row["num_tokens"]])
        assert text.startswith("A special magic number is hidden")
        assert text.endswith(f"mentioned in the provided text is {row['value']}.<|im_end|>")
        # the corpus text after the document is a new document in the packed stream
        if row["num_tokens"] < 256:
            assert row["num_tokens"] in dataset.document_starts(row["block"]).tolist()
    kinds = json.loads((out / "block-kinds.json").read_text())
    assert [block for block, kind in enumerate(kinds) if kind == "retrieval"] == [row["block"] for row in rows]
    texts = [tokenizer.decode(dataset.window(block)) for block in range(12)]
    assert all(("ordinary words" in text) == (kind != "copy") for text, kind in zip(texts, kinds))
    assert any("The same list again:" in text for text, kind in zip(texts, kinds) if kind == "copy")
    batch = next(TokenLoader(out, seq_len=256, batch_size=4, seed=0))
    assert batch["input_ids"].shape == (4, 256)


def test_rebuilding_is_a_no_op_and_other_settings_are_refused(tmp_path, corpus, capsys):
    out = tmp_path / "mix"
    assert hyla_main(_mix_args(corpus, out)) == 0
    written = (out / "shard-00000.bin").stat().st_mtime_ns
    assert hyla_main(_mix_args(corpus, out)) == 0
    assert (out / "shard-00000.bin").stat().st_mtime_ns == written
    assert hyla_main(_mix_args(corpus, out, share=0.25)) == 2
    assert "other settings" in capsys.readouterr().err
