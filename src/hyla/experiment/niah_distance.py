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


def by_length_and_depth(records: list[dict]) -> dict[str, dict[tuple[int, float], list[float]]]:
    """{task: {(length, depth_percent): [summed score, prompts]}} of NIAH records (their `length` cell and
    `depth_percent`): where a score by distance or position pools lengths, this keeps each prompt's cell. RULER builds
    every length's haystack from the same essays in the same order, so one position holds the same text at every
    length: a failure tied to the text at a position shows in each length's row at the depths that put the needle
    there, one tied to the distance to the question along a diagonal. Records without the fields are left out."""
    cells: dict[str, dict[tuple[int, float], list[float]]] = defaultdict(dict)
    for record in records:
        if "depth_percent" not in record or "length" not in record:
            continue
        cell = cells[record["task"]].setdefault((int(record["length"]), record["depth_percent"]), [0.0, 0])
        cell[0] += record["score"]
        cell[1] += 1
    return {task: dict(sorted(by_cell.items())) for task, by_cell in sorted(cells.items())}

