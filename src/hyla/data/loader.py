"""Read a prepared corpus: memory-mapped shards, fixed-length packed sequences, a resumable batch loader.

Sequence `i` is the window of `seq_len + 1` tokens starting at `i * seq_len`: `input_ids` are its first `seq_len`
tokens and `labels` its last `seq_len` (windows overlap by one token, so every token is a label once). Documents are
packed back to back; `cu_seqlens` marks where they start inside each window, for kernels that keep them apart.

With `align_documents`, a window that would start inside a document which began inside the previous window starts
at that document's beginning instead (`document_aligned_starts`): a document no longer than a window is never cut
in two, so a recall document's question always sees its facts; longer documents run on from window to window. The
price is that those documents' first tokens are seen twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyla.data.tokenize import FORMAT, FORMAT_VERSION, MANIFEST, check_shards


class TokenCorpus:
    """A prepared corpus folder (see `hyla.data.tokenize`), its shards memory-mapped as one token stream."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{self.path} is not a prepared corpus (no {MANIFEST}); "
                                    f"make one with: hyla data prepare --out {self.path} ...")
        try:
            self.manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        except ValueError as err:
            raise ValueError(f"damaged corpus manifest {manifest_path} ({err}); prepare the corpus again") from None
        if not isinstance(self.manifest, dict) or (self.manifest.get("format"), self.manifest.get("version")) != (
                FORMAT, FORMAT_VERSION):
            raise ValueError(f"{self.path} holds a corpus of another format or version; prepare it again")
        check_shards(self.path, self.manifest)
        dtype = np.dtype(self.manifest["dtype"])
        self.shards = [np.memmap(self.path / shard["file"], dtype=dtype, mode="r", shape=(shard["num_tokens"],))
                       for shard in self.manifest["shards"]]
        # shard k holds stream positions [shard_starts[k], shard_starts[k + 1])
        self.shard_starts = np.cumsum([0] + [len(shard) for shard in self.shards])
        self.document_starts = np.load(self.path / self.manifest["document_starts"])
        self.num_tokens = int(self.shard_starts[-1])

    @property
    def corpus_id(self) -> str:
        return self.manifest["corpus_id"]

    @property
    def vocab_size(self) -> int:
        return self.manifest["tokenizer"]["vocab_size"]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens `[start, stop)` of the stream as int64, read across shard ends when needed."""
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"tokens [{start}, {stop}) outside the corpus of {self.num_tokens}")
        pieces = []
        first = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        for shard_index in range(first, len(self.shards)):
            offset = int(self.shard_starts[shard_index])
            if offset >= stop:
                break
            pieces.append(self.shards[shard_index][max(start - offset, 0):stop - offset])
        return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)

    def document_starts_within(self, start: int, stop: int) -> np.ndarray:
        """Offsets (relative to `start`) of the documents that begin strictly inside `(start, stop)`."""
        low, high = np.searchsorted(self.document_starts, [start + 1, stop])
        return self.document_starts[low:high] - start


def document_aligned_starts(document_starts: np.ndarray, num_tokens: int, seq_len: int) -> np.ndarray:
    """Window starts (int64) over a stream of `num_tokens` tokens whose documents begin at the sorted
    `document_starts` (0 among them): each window of `seq_len + 1` tokens begins where the previous one's inputs
    ended, unless the document holding that token began inside the previous window and fits in one window; then it
    begins at that document's start. Every window fits in the stream."""
    ends = np.append(document_starts[1:], num_tokens)
    starts, current = [], 0
    while current + seq_len + 1 <= num_tokens:
        starts.append(current)
        end = current + seq_len
        holder = int(np.searchsorted(document_starts, end, side="right")) - 1
        begin = int(document_starts[holder])
        fits = ends[holder] - begin <= seq_len + 1
        current = begin if begin > current and fits else end
    return np.asarray(starts, dtype=np.int64)


class PackedDataset(torch.utils.data.Dataset):
    """Fixed-length sequences over a corpus; item `i` is a dict of `input_ids` and `labels`, LongTensor [seq_len].
    `align_documents`: windows start at document starts where that keeps a document whole (module docstring)."""

    def __init__(self, corpus: TokenCorpus | str | Path, seq_len: int, *, align_documents: bool = False):
        self.corpus = corpus if isinstance(corpus, TokenCorpus) else TokenCorpus(corpus)
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.seq_len = seq_len
        self.align_documents = align_documents
        self.starts = None
        if align_documents:
            # The stream's own start counts as a document start (a corpus range may begin inside one).
            documents = np.concatenate([[0], self.corpus.document_starts_within(0, self.corpus.num_tokens)])
            self.starts = document_aligned_starts(documents.astype(np.int64), self.corpus.num_tokens, seq_len)
        self.num_sequences = len(self.starts) if self.starts is not None else (self.corpus.num_tokens - 1) // seq_len
        if self.num_sequences < 1:
            raise ValueError(f"{self.corpus.path} has {self.corpus.num_tokens} tokens, too few for one sequence "
                             f"of {seq_len} (+1 for the labels)")

    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.window(index)
        return {"input_ids": torch.from_numpy(window[:-1]), "labels": torch.from_numpy(window[1:])}

    def start(self, index: int) -> int:
        """Stream position of sequence `index`'s first token."""
        if not 0 <= index < self.num_sequences:
            raise IndexError(f"sequence {index} outside 0..{self.num_sequences - 1}")
        return int(self.starts[index]) if self.starts is not None else index * self.seq_len

    def window(self, index: int) -> np.ndarray:
        start = self.start(index)
        return self.corpus.read(start, start + self.seq_len + 1)

    def document_starts(self, index: int) -> np.ndarray:
        """Positions in sequence `index`'s inputs where a new document begins (0 excluded)."""
        start = self.start(index)
        return self.corpus.document_starts_within(start, start + self.seq_len)


class TokenLoader:
    """Endless batches of packed sequences in a seeded order that changes every epoch; resumable exactly.

    Each epoch visits a permutation of all sequences (seed and epoch fix it); rank `r` of `world_size` takes the
    `r`-th of `world_size` equal slices of it; the few sequences left over after whole batches are skipped in
    that epoch (the next epoch's permutation differs). A batch is `input_ids`, `labels` (LongTensor [B, T]) and,
    with `with_cu_seqlens`, `cu_seqlens` (int32 [N + 1]): document boundaries in the flattened [B * T] batch,
    every row end included, the layout varlen kernels take with the batch reshaped to [1, B * T].
    """

    def __init__(self, corpus: TokenCorpus | PackedDataset | str | Path, *, seq_len: int, batch_size: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1, with_cu_seqlens: bool = False,
                 align_documents: bool = False):
        if isinstance(corpus, PackedDataset):
            corpus = corpus.corpus
        self.dataset = PackedDataset(corpus, seq_len, align_documents=align_documents)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.with_cu_seqlens = with_cu_seqlens
        self.num_batches_per_epoch = len(self.dataset) // world_size // batch_size
        if self.num_batches_per_epoch < 1:
            raise ValueError(f"{len(self.dataset)} sequences of {seq_len} tokens are too few for one batch of "
                             f"{batch_size} on each of {world_size} ranks")
        self.epoch, self.batch_index = 0, 0
        self._order_epoch, self._order = -1, np.zeros(0, dtype=np.int64)

    def __iter__(self) -> TokenLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.batch_index == self.num_batches_per_epoch:
            self.epoch, self.batch_index = self.epoch + 1, 0
        order = self.sequence_order(self.epoch)
        indices = order[self.batch_index * self.batch_size:(self.batch_index + 1) * self.batch_size]
        self.batch_index += 1
        return self.collate(indices)

    def sequence_order(self, epoch: int) -> np.ndarray:
        """This rank's sequence indices for `epoch`, in visiting order."""
        if self._order_epoch != epoch:
            permutation = np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))
            per_rank = self.num_batches_per_epoch * self.batch_size
            self._order = permutation[self.rank * per_rank:(self.rank + 1) * per_rank]
            self._order_epoch = epoch
        return self._order

    def collate(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        windows = torch.from_numpy(np.stack([self.dataset.window(int(index)) for index in indices]))
        batch = {"input_ids": windows[:, :-1].contiguous(), "labels": windows[:, 1:].contiguous()}
        if self.with_cu_seqlens:
            batch["cu_seqlens"] = self.cu_seqlens(indices)
        return batch

    def cu_seqlens(self, indices: np.ndarray) -> torch.Tensor:
        seq_len = self.dataset.seq_len
        boundaries = [np.concatenate([[0], self.dataset.document_starts(int(index))]) + row * seq_len
                      for row, index in enumerate(indices)]
        boundaries.append(np.array([len(indices) * seq_len]))
        return torch.from_numpy(np.concatenate(boundaries).astype(np.int32))

    @property
    def num_tokens_seen(self) -> int:
        """Input tokens this rank has yielded since the start of epoch 0."""
        batches = self.epoch * self.num_batches_per_epoch + self.batch_index
        return batches * self.batch_size * self.dataset.seq_len

    def state_dict(self) -> dict[str, Any]:
        """The position (next batch to yield) and what it depends on; JSON-serializable."""
        state = {"epoch": self.epoch, "batch_index": self.batch_index, "seed": self.seed,
                 "seq_len": self.dataset.seq_len, "batch_size": self.batch_size, "world_size": self.world_size,
                 "rank": self.rank, "corpus_id": self.dataset.corpus.corpus_id}
        if self.dataset.align_documents:  # states of unaligned loaders stay as they were
            state["align_documents"] = True
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was taken; the order must be the same one (corpus, seed, shapes, world size)."""
        mine = self.state_dict()
        keys = ("corpus_id", "seed", "seq_len", "batch_size", "world_size", "align_documents")
        differences = [f"{key} {state.get(key)!r} in the state, {mine.get(key)!r} here" for key in keys
                       if state.get(key) != mine.get(key)]
        if differences:
            raise ValueError(f"loader state does not fit this loader: {'; '.join(differences)}")
        if not 0 <= state["batch_index"] <= self.num_batches_per_epoch or state["epoch"] < 0:
            raise ValueError(f"loader state position out of range: epoch {state['epoch']}, "
                             f"batch {state['batch_index']} of {self.num_batches_per_epoch}")
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])
