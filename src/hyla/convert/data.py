"""The conversion corpus: prepared once into the `data` stage folder, split into a training head and a held-out
tail, never overlapping. The logit-scaling constant is chosen on the tail's windows, or on the long documents of a
corpus of their own (`scaling.data`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyla.data.loader import TokenCorpus, TokenLoader


def prepared_corpus(sources: list[str]) -> Path | None:
    """The corpus folder when the only source is one prepared by `hyla data prepare`, else None."""
    if len(sources) == 1 and (Path(sources[0]) / "manifest.json").is_file():
        return Path(sources[0]).resolve()
    return None


class CorpusRange(TokenCorpus):
    """Tokens [start, stop) of a prepared corpus, seen as a corpus of its own."""

    def __init__(self, corpus: TokenCorpus, start: int, stop: int):
        if not 0 <= start < stop <= corpus.num_tokens:
            raise ValueError(f"range [{start}, {stop}) outside the corpus of {corpus.num_tokens} tokens")
        self.__dict__.update(corpus.__dict__)
        self.base, self.start, self.num_tokens = corpus, start, stop - start
        self.manifest = dict(corpus.manifest, corpus_id=f"{corpus.corpus_id}[{start}:{stop}]")

    def read(self, start: int, stop: int) -> np.ndarray:
        if not 0 <= start <= stop <= self.num_tokens:
            raise IndexError(f"tokens [{start}, {stop}) outside the range of {self.num_tokens}")
        return self.base.read(self.start + start, self.start + stop)

    def document_starts_within(self, start: int, stop: int) -> np.ndarray:
        return self.base.document_starts_within(self.start + start, self.start + stop)


def split_corpus(path: Path, heldout_tokens: int) -> tuple[CorpusRange, CorpusRange]:
    """(training head, held-out tail) of the prepared corpus at `path`."""
    corpus = TokenCorpus(path)
    if corpus.num_tokens <= 2 * heldout_tokens:
        raise ValueError(
            f"{path} holds {corpus.num_tokens} tokens: too few for {heldout_tokens} held-out tokens and training"
        )
    cut = corpus.num_tokens - heldout_tokens
    return CorpusRange(corpus, 0, cut), CorpusRange(corpus, cut, corpus.num_tokens)


def training_loader(corpus: TokenCorpus, *, seq_len: int, batch_size: int, seed: int,
                    align_documents: bool = False) -> TokenLoader:
    return TokenLoader(corpus, seq_len=seq_len, batch_size=batch_size, seed=seed, align_documents=align_documents)


def corpus_mix(path: Path) -> dict:
    """A prepared corpus's path, size and tokens per source (with its share): the mix a training drawing windows
    uniformly from it trains on."""
    manifest = TokenCorpus(path).manifest
    total = manifest["num_tokens"]
    sources = [{"spec": source["spec"], "description": source["description"], "num_tokens": source["num_tokens"],
                "num_documents": source["num_documents"], "share": source["num_tokens"] / max(total, 1)}
               for source in manifest["sources"]]
    return {"path": str(Path(path).resolve()), "num_tokens": total, "num_documents": manifest["num_documents"],
            "corpus_id": manifest["corpus_id"], "sources": sources}


def longest_document_spans(corpus: TokenCorpus, starts: list[int], length: int) -> list[int]:
    """For each window `[start, start + length)`: the most tokens of one document inside it (a window that holds a
    single document gives `length`), i.e. the longest dependency a loss on that window can measure."""
    spans = []
    for start in starts:
        cuts = np.concatenate([[0], corpus.document_starts_within(start, start + length), [length]])
        spans.append(int(np.diff(cuts).max()))
    return spans


def heldout_sequences(corpus: TokenCorpus, *, length: int, num_docs: int):
    """`num_docs` consecutive windows of `length` tokens from the held-out tail, as LongTensor [N, length], and the
    longest document span in each (`longest_document_spans`)."""
    import torch

    available = (corpus.num_tokens - 1) // length
    if available < 1:
        raise ValueError(f"the held-out tail has {corpus.num_tokens} tokens, fewer than one window of {length}")
    starts = [i * length for i in range(min(num_docs, available))]
    windows = [corpus.read(start, start + length) for start in starts]
    return torch.from_numpy(np.stack(windows)), longest_document_spans(corpus, starts, length)


def scaling_documents(scaling) -> tuple:
    """The windows a `ScalingPlan` with `data` set scores `a` on: `long_documents` of that prepared corpus."""
    return long_documents(TokenCorpus(scaling.data), length=scaling.length, num_docs=scaling.num_docs)


def long_documents(corpus: TokenCorpus, *, length: int, num_docs: int):
    """The first `length` tokens of each of the first `num_docs` documents of `corpus` that are at least `length`
    tokens long, as LongTensor [N, length], and their document spans (all `length`). Raises ValueError when the
    corpus has no such document."""
    import torch

    starts = [int(x) for x in corpus.document_starts] + [corpus.num_tokens]
    picked = [start for start, end in zip(starts[:-1], starts[1:]) if end - start >= length][:num_docs]
    if not picked:
        longest = max((end - start for start, end in zip(starts[:-1], starts[1:])), default=0)
        raise ValueError(f"{corpus.path} has no document of {length} tokens or more (its longest has {longest}); "
                         f"scaling.data needs long documents")
    windows = [corpus.read(start, start + length) for start in picked]
    return torch.from_numpy(np.stack(windows)), [length] * len(picked)
