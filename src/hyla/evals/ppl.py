"""Loss by position on long documents: does the model keep using its context as the context grows?

Each sequence is run through the model in chunks that carry the model's cache forward, so logits never exist for
more than `chunk_size` positions at once (64K positions × a 49K vocabulary would be 12.9 GB in fp32); the result equals
one full forward pass. Loss at position p is the loss of predicting token p from tokens 0…p−1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hyla.evals.generation import model_device
from hyla.evals.haystack import load_essay_text
from hyla.models.modeling import cache_argument, output_cache
from hyla.progress import progress

DEFAULT_CHUNK_SIZE = 4096
_MAX_CURVE_POINTS = 256


def default_bucket_edges(seq_len: int) -> list[int]:
    """Position buckets 0-1K, 1-2K, 2-4K, … up to `seq_len` (eighths, quarters, halves below 4K tokens)."""
    edges, edge = [0], 1024 if seq_len >= 4096 else max(seq_len // 8, 1)
    while edge < seq_len:
        edges.append(edge)
        edge *= 2
    return edges + [seq_len]


def long_token_sequences(
    tokenizer, seq_len: int, num_sequences: int, text_files: list[str | Path] | None = None
) -> torch.Tensor:
    """`num_sequences` rows of `seq_len` consecutive tokens from `text_files` (default: RULER's essays).

    Files are read in order and joined by the eos token; the essays are one concatenation of essays, so a long
    row spans several of them.
    """
    if text_files:
        missing = [str(path) for path in text_files if not Path(path).is_file()]
        if missing:
            raise FileNotFoundError(f"text file not found: {missing[0]}")
        separator = tokenizer.eos_token or "\n\n"
        text = separator.join(Path(path).read_text(errors="replace") for path in text_files)
    else:
        text = load_essay_text()
    needed = seq_len * num_sequences
    # Tokenize only as much text as needed: ~4 characters per token, with margin.
    token_ids = tokenizer(text[: needed * 6], add_special_tokens=False)["input_ids"]
    if len(token_ids) < needed:
        raise ValueError(f"the text has {len(token_ids)} tokens; {num_sequences} × {seq_len} = {needed} are needed")
    return torch.tensor(token_ids[:needed]).view(num_sequences, seq_len)


@torch.inference_mode()
def token_losses(model: Any, input_ids: torch.Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Per-token loss [B, T-1] (fp32): entry p-1 is the loss of predicting token p."""
    device = model_device(model)
    input_ids = input_ids.to(device)
    seq_len = input_ids.shape[1]
    losses, cache = [], None
    # Every chunk, the last included, must run with use_cache: some models ignore a cache passed without it.
    use_cache = seq_len - 1 > chunk_size
    for start in range(0, seq_len - 1, chunk_size):
        end = min(start + chunk_size, seq_len - 1)
        outputs = model(input_ids=input_ids[:, start:end], **cache_argument(cache), use_cache=use_cache)
        cache = output_cache(outputs)
        log_probs = outputs.logits.float().log_softmax(dim=-1)
        targets = input_ids[:, start + 1 : end + 1]
        losses.append(-log_probs.gather(-1, targets[..., None]).squeeze(-1))
    return torch.cat(losses, dim=1).cpu()


def bucket_means(losses: torch.Tensor, bucket_edges: list[int]) -> list[dict[str, Any]]:
    """Mean loss and perplexity of the positions in each [start, end) bucket; `losses` is [B, T-1]."""
    mean_by_position = losses.mean(dim=0)
    buckets = []
    for start, end in zip(bucket_edges[:-1], bucket_edges[1:]):
        # losses[:, p-1] belongs to position p; position 0 has no loss.
        values = mean_by_position[max(start, 1) - 1 : end - 1]
        if values.numel() == 0:
            continue
        mean_loss = values.mean().item()
        perplexity = float(torch.tensor(mean_loss).exp())
        buckets.append({"start": start, "end": end, "loss": mean_loss, "perplexity": perplexity})
    return buckets


def _loss_curve(losses: torch.Tensor) -> dict[str, list[float]]:
    mean_by_position = losses.mean(dim=0)
    block = max(1, mean_by_position.numel() // _MAX_CURVE_POINTS)
    num_blocks = mean_by_position.numel() // block
    blocks = mean_by_position[: num_blocks * block].view(num_blocks, block)
    positions = (torch.arange(num_blocks) * block + (block + 1) / 2).tolist()
    return {"position": positions, "loss": blocks.mean(dim=1).tolist()}


def ppl_by_position(
    model: Any,
    input_ids: torch.Tensor,
    *,
    bucket_edges: list[int] | None = None,
    batch_size: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> dict[str, Any]:
    """Mean loss per position bucket over the rows of `input_ids` [N, T]; returns summary, buckets and a curve."""
    num_sequences, seq_len = input_ids.shape
    edges = bucket_edges or default_bucket_edges(seq_len)
    if edges[0] != 0 or edges[-1] > seq_len or sorted(edges) != edges:
        raise ValueError(f"bucket edges must rise from 0 to at most {seq_len}, got {edges}")
    batches = [input_ids[start : start + batch_size] for start in range(0, num_sequences, batch_size)]
    losses = torch.cat(
        [token_losses(model, batch, chunk_size=chunk_size) for batch in progress(batches, desc="ppl", leave=False)]
    )
    buckets = bucket_means(losses, edges)
    summary = {"loss": losses.mean().item()}
    summary.update({f"loss/{bucket['start']}-{bucket['end']}": bucket["loss"] for bucket in buckets})
    return {
        "summary": summary,
        "num_sequences": num_sequences,
        "seq_len": seq_len,
        "buckets": buckets,
        "curve": _loss_curve(losses),
    }


def plot_loss_by_position(result: dict[str, Any], path: Path) -> None:
    """Loss against position (log scale), with the bucket means as steps."""
    from hyla.evals.report import new_figure, save_figure

    figure, axes = new_figure()
    axes.plot(result["curve"]["position"], result["curve"]["loss"], linewidth=1.0, label="mean loss")
    for bucket in result["buckets"]:
        axes.hlines(bucket["loss"], max(bucket["start"], 1), bucket["end"], colors="C1", linewidth=2.0)
    axes.set_xscale("log")
    axes.set_xlabel("position (tokens)")
    axes.set_ylabel("loss (nats)")
    axes.set_title(f"loss by position ({result['num_sequences']} × {result['seq_len']} tokens)")
    axes.legend()
    save_figure(figure, path)
