"""NIAH answers by how far the needle sits from the question (the prompt's tokens after it) and by its position in
the prompt (tokens before it), every length of a model's records pooled. NoPE attention has no notion of distance,
and a Lightning layer's slowest head decays by e^(-1/256) a token (g_h = -2^(-8h/H), h = 1..H: a half-life of ~177
tokens, e^-8 after 2K), so beyond ~2K only the attention layers carry the needle to the question: where retrieval
falls with distance, what the attention layers receive differs with it. A needle's position is `depth_percent` of
the prompt's tokens (RULER's placement, to within a sentence).
"""

from __future__ import annotations

from collections import defaultdict

EDGES = (0, 1024, 4096, 8192, 16384, 32768)
BINS = tuple(f"{low // 1024}-{high // 1024}K" for low, high in zip(EDGES, EDGES[1:])) + (f"{EDGES[-1] // 1024}K+",)


def bin_of(tokens: float) -> str:
    """The BINS label of a token count."""
    for label, high in zip(BINS, EDGES[1:]):
        if tokens < high:
            return label
    return BINS[-1]


def by_distance(records: list[dict], *, measure: str = "distance") -> dict[str, dict[str, list[float]]]:
    """{task: {bin: [summed score, prompts]}} of NIAH records, each with `task`, `depth_percent`,
    `num_prompt_tokens` and `score` (a cell's accuracy is its summed score over its prompts); measure "distance"
    (tokens after the needle) or "position" (tokens before it). Records without the fields (a RULER file's) are
    left out."""
    if measure not in ("distance", "position"):
        raise ValueError(f"measure must be 'distance' or 'position', got {measure!r}")
    cells: dict[str, dict[str, list[float]]] = defaultdict(lambda: {label: [0.0, 0] for label in BINS})
    for record in records:
        if "depth_percent" not in record or "num_prompt_tokens" not in record:
            continue
        tokens = record["num_prompt_tokens"]
        position = record["depth_percent"] / 100 * tokens
        cell = cells[record["task"]][bin_of(tokens - position if measure == "distance" else position)]
        cell[0] += record["score"]
        cell[1] += 1
    return {task: dict(by_bin) for task, by_bin in sorted(cells.items())}
