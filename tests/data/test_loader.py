"""Packed sequences and the resumable loader: windows, seeded orders, rank slices, cu_seqlens, exact resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from hyla.data.loader import PackedDataset, TokenCorpus, TokenLoader
from hyla.data.tokenize import PrepareSettings, prepare_corpus


@pytest.fixture
def corpus_dir(tmp_path, tokenizer_dir, text_folder):
    # Small shards so that sequences cross shard ends.
    settings = PrepareSettings(tokenizer=str(tokenizer_dir), sources=(str(text_folder),), shard_tokens=97)
    return prepare_corpus(tmp_path / "corpus", settings, show_progress=False).path


def _batches(loader: TokenLoader, count: int) -> list[torch.Tensor]:
    return [next(loader)["input_ids"] for _ in range(count)]


def test_sequences_are_overlapping_windows_of_the_stream(corpus_dir):
    dataset = PackedDataset(corpus_dir, seq_len=16)
    stream = dataset.corpus.read(0, dataset.corpus.num_tokens)
    assert len(dataset) == (len(stream) - 1) // 16
    for index in (0, 5, len(dataset) - 1):
        item = dataset[index]
        assert item["input_ids"].tolist() == stream[index * 16:(index + 1) * 16].tolist()
        assert item["labels"].tolist() == stream[index * 16 + 1:(index + 1) * 16 + 1].tolist()
        assert item["input_ids"].dtype == torch.long


def test_each_epoch_visits_a_seeded_permutation(corpus_dir):
    loader = TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=1)
    first, second = loader.sequence_order(0), loader.sequence_order(1)
    assert len(set(first.tolist())) == len(first) == loader.num_batches_per_epoch * 4
    assert first.tolist() != second.tolist()
    same_seed = TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=1)
    other_seed = TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=2)
    assert same_seed.sequence_order(0).tolist() == first.tolist() != other_seed.sequence_order(0).tolist()
    batch = next(loader)
    expected = torch.stack([loader.dataset[int(index)]["input_ids"] for index in first[:4]])
    assert batch["input_ids"].shape == (4, 8) and torch.equal(batch["input_ids"], expected)


def test_ranks_take_disjoint_equal_slices(corpus_dir):
    loaders = [TokenLoader(corpus_dir, seq_len=8, batch_size=3, rank=rank, world_size=3) for rank in range(3)]
    orders = [set(loader.sequence_order(0).tolist()) for loader in loaders]
    assert len({len(order) for order in orders}) == 1
    assert not (orders[0] & orders[1] or orders[0] & orders[2] or orders[1] & orders[2])
    with pytest.raises(ValueError, match="rank 3 outside"):
        TokenLoader(corpus_dir, seq_len=8, batch_size=3, rank=3, world_size=3)


def test_resume_continues_at_the_same_sequence_across_epochs(corpus_dir):
    loader = TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=7)
    steps_before = loader.num_batches_per_epoch - 2
    _batches(loader, steps_before)
    state = json.loads(json.dumps(loader.state_dict()))
    continued = _batches(loader, 5)
    resumed = TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=7)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(continued, _batches(resumed, 5), strict=True))
    assert resumed.epoch == 1 and resumed.num_tokens_seen == loader.num_tokens_seen


def test_state_of_another_order_is_refused(corpus_dir):
    state = TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=7).state_dict()
    with pytest.raises(ValueError, match="seed 7 in the state, 8 here"):
        TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=8).load_state_dict(state)
    with pytest.raises(ValueError, match="corpus_id"):
        TokenLoader(corpus_dir, seq_len=8, batch_size=4, seed=7).load_state_dict(dict(state, corpus_id="other"))


def test_cu_seqlens_mark_document_starts_in_the_flattened_batch(corpus_dir):
    loader = TokenLoader(corpus_dir, seq_len=64, batch_size=3, with_cu_seqlens=True)
    separator_id = loader.dataset.corpus.manifest["separator_token_id"]
    for _ in range(loader.num_batches_per_epoch):
        batch = next(loader)
        flat, boundaries = batch["input_ids"].reshape(-1), batch["cu_seqlens"]
        assert boundaries.dtype == torch.int32 and boundaries[0] == 0 and boundaries[-1] == flat.numel()
        assert set(range(0, flat.numel() + 1, 64)) <= set(boundaries.tolist())
        assert bool((boundaries[1:] > boundaries[:-1]).all())
        inner = [int(b) for b in boundaries[1:-1] if b % 64]
        assert all(int(flat[b - 1]) == separator_id for b in inner)
        row_starts_after_separator = [b for b in range(64, flat.numel(), 64) if flat[b - 1] == separator_id]
        assert set(row_starts_after_separator) <= set(boundaries.tolist())


def test_too_small_corpus_and_missing_folder_are_clear_errors(corpus_dir, tmp_path):
    num_tokens = TokenCorpus(corpus_dir).num_tokens
    with pytest.raises(ValueError, match="too few for one sequence"):
        PackedDataset(corpus_dir, seq_len=num_tokens)
    with pytest.raises(ValueError, match="too few for one batch"):
        TokenLoader(corpus_dir, seq_len=num_tokens // 2, batch_size=4)
    with pytest.raises(FileNotFoundError, match="not a prepared corpus"):
        TokenCorpus(tmp_path / "nowhere")


def test_loader_killed_mid_epoch_resumes_at_the_same_sequence(corpus_dir, tmp_path):
    # A child process saves the loader state after every batch, the way a training loop checkpoints, and is
    # SIGKILLed mid-epoch; a fresh loader started from the last saved state must yield the batch that came next.
    state_path = tmp_path / "state.json"
    child = textwrap.dedent(f"""
        import json, os, signal
        from hyla.data.loader import TokenLoader
        loader = TokenLoader({str(corpus_dir)!r}, seq_len=8, batch_size=2, seed=3)
        for step in range(5):
            next(loader)
            with open({str(state_path)!r} + ".tmp", "w") as file:
                json.dump(loader.state_dict(), file)
            os.replace({str(state_path)!r} + ".tmp", {str(state_path)!r})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr
    reference = TokenLoader(corpus_dir, seq_len=8, batch_size=2, seed=3)
    expected = _batches(reference, 8)[5:]
    resumed = TokenLoader(corpus_dir, seq_len=8, batch_size=2, seed=3)
    resumed.load_state_dict(json.loads(state_path.read_text()))
    assert resumed.batch_index == 5
    assert all(torch.equal(a, b) for a, b in zip(expected, _batches(resumed, 3), strict=True))


def test_reads_across_shard_ends_match_the_whole_stream(corpus_dir):
    corpus = TokenCorpus(corpus_dir)
    assert len(corpus.shards) > 2
    stream = np.concatenate([np.asarray(shard) for shard in corpus.shards]).astype(np.int64)
    for start, stop in [(90, 110), (0, corpus.num_tokens), (97, 97 * 2), (corpus.num_tokens - 3, corpus.num_tokens)]:
        assert corpus.read(start, stop).tolist() == stream[start:stop].tolist()


def test_document_aligned_starts_by_hand():
    from hyla.data.loader import document_aligned_starts

    # Documents [0, 3), [3, 12), [12, 14), [14, 30) in a 30-token stream; windows of 8 + 1 tokens.
    documents = np.array([0, 3, 12, 14])
    # 0; end 8 is in [3, 12) (9 tokens, fits 9): restart at 3; end 11 still in it (began at 3, not after): 11;
    # end 19 is in [14, 30) (16 tokens, does not fit): 19; 27 + 9 > 30: stop.
    assert document_aligned_starts(documents, 30, 8).tolist() == [0, 3, 11, 19]
    # One long document: plain windows.
    assert document_aligned_starts(np.array([0]), 30, 8).tolist() == [0, 8, 16]


def test_aligned_windows_never_cut_a_document_that_fits(corpus_dir):
    dataset = PackedDataset(corpus_dir, seq_len=16, align_documents=True)
    corpus = dataset.corpus
    starts = np.concatenate([[0], corpus.document_starts_within(0, corpus.num_tokens)])
    ends = np.append(starts[1:], corpus.num_tokens)
    covered = set()
    for index in range(len(dataset)):
        begin = dataset.start(index)
        covered.update(range(begin, begin + 17))
        assert dataset[index]["input_ids"].tolist() == corpus.read(begin, begin + 16).tolist()
    for start, end in zip(starts, ends):
        if end - start > 17 or end + 17 > corpus.num_tokens:
            continue
        # Some window holds the whole document.
        assert any(dataset.start(i) <= start and end <= dataset.start(i) + 17 for i in range(len(dataset)))
    assert len(covered) >= 0.95 * corpus.num_tokens, "no stretch of the stream is skipped"


def test_aligned_loader_state_is_its_own(corpus_dir):
    aligned = TokenLoader(corpus_dir, seq_len=16, batch_size=2, align_documents=True)
    plain = TokenLoader(corpus_dir, seq_len=16, batch_size=2)
    assert aligned.state_dict()["align_documents"] is True and "align_documents" not in plain.state_dict()
    with pytest.raises(ValueError, match="align_documents"):
        plain.load_state_dict(aligned.state_dict())
    next(aligned)
    fresh = TokenLoader(corpus_dir, seq_len=16, batch_size=2, align_documents=True)
    fresh.load_state_dict(aligned.state_dict())
    assert torch.equal(next(fresh)["input_ids"], next(aligned)["input_ids"])
