"""HALO layer selection (docs/method.md, "Layer selection"): which teacher layers stay softmax attention in the
converted hybrid.

For each layer i, M(i) is the teacher with only layer i replaced by its stage-1 RNN twin; R_i and C_i are the recall
(NIAH) and commonsense (CSR) accuracies of M(i). The HALO score

    s_i = (R_max − R_i) / (C_max − C_i + ε),   ε = 1e-6,  R_max, C_max the maxima over the scored variants,

is high when replacing layer i costs much recall and little commonsense; the top k = ⌊L/4⌋ layers stay attention.

The selection rules are pure functions of given scores (`halo_select`, the baselines, `select_layers` by name).
`score_replacements` measures R_i and C_i with scorers supplied by the caller; `default_scorers` builds them from
`hyla.evals.niah` and `hyla.evals.csr`. Reports (JSON, table, plot) live in `hyla.convert.select_report`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

HALO_EPSILON = 1e-6
METHODS = ("halo", "uniform", "latter-half", "jet-nemotron", "kl-ls", "user")
# Layer types of a teacher-equivalent HypeNet: full softmax attention, with RoPE by config or by name.
TEACHER_LAYER_TYPES = ("attention", "attention_rope")

# A scorer maps a model to (accuracy, standard error); the standard error may be None when unknown.
Scorer = Callable[["nn.Module"], tuple[float, "float | None"]]


def default_num_kept(num_layers: int) -> int:
    """k = ⌊L/4⌋ attention layers kept (docs/method.md, "Layer selection")."""
    return _check_num_layers(num_layers) // 4


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_num_layers(num_layers: int) -> int:
    if not _is_int(num_layers) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
    return int(num_layers)


def _check_k(k: int, num_candidates: int, candidates: str = "layers") -> int:
    if not _is_int(k) or not 0 <= k <= num_candidates:
        raise ValueError(f"k must be an integer in [0, {num_candidates}] ({num_candidates} {candidates}), got {k!r}")
    return int(k)


def _check_scores(name: str, scores: Mapping[int, float], num_layers: int | None = None) -> dict[int, float]:
    """The scores as {layer: float}, checked: non-empty, integer layers (in range when num_layers is given), finite."""
    if not isinstance(scores, Mapping) or not scores:
        raise ValueError(f"{name} must be a non-empty mapping layer index → score")
    checked = {}
    for layer, value in scores.items():
        if not _is_int(layer) or layer < 0 or (num_layers is not None and layer >= num_layers):
            limit = f" below {num_layers}" if num_layers is not None else ""
            raise ValueError(f"{name}: layer indices must be integers ≥ 0{limit}, got {layer!r}")
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{name}: the score of layer {layer} must be a finite number, got {value!r}")
        checked[int(layer)] = float(value)
    return checked


def _check_same_layers(recall: dict[int, float], csr: dict[int, float]) -> None:
    if recall.keys() != csr.keys():
        only_recall, only_csr = sorted(recall.keys() - csr.keys()), sorted(csr.keys() - recall.keys())
        raise ValueError(
            f"recall and csr must score the same layers; only in recall: {only_recall}, only in csr: {only_csr}"
        )


def halo_scores(
    recall: Mapping[int, float], csr: Mapping[int, float], eps: float = HALO_EPSILON
) -> dict[int, float]:
    """s_i = (R_max − R_i) / (C_max − C_i + eps) for every scored layer, in layer order.

    The denominator is at least eps, so a layer whose CSR equals the best gets a huge but finite score ΔR / eps.
    """
    if not isinstance(eps, numbers.Real) or not eps > 0:
        raise ValueError(f"eps must be positive, got {eps!r}")
    recall, csr = _check_scores("recall", recall), _check_scores("csr", csr)
    _check_same_layers(recall, csr)
    recall_max, csr_max = max(recall.values()), max(csr.values())
    return {layer: (recall_max - recall[layer]) / (csr_max - csr[layer] + eps) for layer in sorted(recall)}


def halo_select(recall: Mapping[int, float], csr: Mapping[int, float], k: int) -> list[int]:
    """The k layers with the highest HALO score, best first.

    Ties in s_i (exactly equal floats) go to the layer with the lower recall R_i (the larger recall drop), then to
    the lower index, so the ranking never depends on the order of the mappings.
    """
    scores = halo_scores(recall, csr)
    k = _check_k(k, len(scores), "scored layers")
    ranked = sorted(scores, key=lambda layer: (-scores[layer], float(recall[layer]), layer))
    return ranked[:k]


def _evenly_spaced(start: int, span: int, k: int) -> list[int]:
    # The layer nearest the centre of each of k equal segments of [start, start + span), halves rounded up:
    # start + floor((j + 1/2)·span/k), in integer arithmetic so that no rounding mode is involved.
    return [start + (2 * j + 1) * span // (2 * k) for j in range(k)]


def uniform_select(num_layers: int, k: int) -> list[int]:
    """k layers evenly spaced across depth, ascending: i_j = ⌊(2j + 1)·L / 2k⌋ for j = 0 … k−1."""
    num_layers = _check_num_layers(num_layers)
    return _evenly_spaced(0, num_layers, _check_k(k, num_layers))


def latter_half_select(num_layers: int, k: int) -> list[int]:
    """k layers evenly spaced in the latter half, ascending: with h = ⌊L/2⌋ and M = L − h (the middle layer of an
    odd L belongs to the latter half), i_j = h + ⌊(2j + 1)·M / 2k⌋."""
    num_layers = _check_num_layers(num_layers)
    start = num_layers // 2
    span = num_layers - start
    return _evenly_spaced(start, span, _check_k(k, span, "layers in the latter half"))


def jet_nemotron_select(recall: Mapping[int, float], teacher_recall: float, k: int) -> list[int]:
    """The k layers whose replacement drops recall the most versus the teacher (T − R_i), largest drop first;
    ties to the lower index."""
    recall = _check_scores("recall", recall)
    if not isinstance(teacher_recall, numbers.Real) or not math.isfinite(teacher_recall):
        raise ValueError(f"teacher_recall must be a finite number, got {teacher_recall!r}")
    drop = {layer: float(teacher_recall) - value for layer, value in recall.items()}
    k = _check_k(k, len(drop), "scored layers")
    return sorted(drop, key=lambda layer: (-drop[layer], layer))[:k]


def kl_ls_select(kl_by_layer: Mapping[int, float], k: int) -> list[int]:
    """KL-LS: the k layers whose restoration to attention in an all-RNN student reached the lowest KL to the teacher,
    lowest first; ties to the lower index. The KLs are measured elsewhere; this only ranks them."""
    kl_by_layer = _check_scores("kl_by_layer", kl_by_layer)
    k = _check_k(k, len(kl_by_layer), "scored layers")
    return sorted(kl_by_layer, key=lambda layer: (kl_by_layer[layer], layer))[:k]


def user_select(indices: Sequence[int], num_layers: int) -> list[int]:
    """A user-given list of layers, checked (integers in [0, L), no repeats) and kept in the given order."""
    num_layers = _check_num_layers(num_layers)
    if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence):
        raise ValueError(f"layers must be a list of layer indices, got {indices!r}")
    for index in indices:
        if not _is_int(index) or not 0 <= index < num_layers:
            raise ValueError(f"layer indices must be integers in [0, {num_layers}), got {index!r}")
    repeated = sorted(index for index, count in Counter(int(index) for index in indices).items() if count > 1)
    if repeated:
        raise ValueError(f"layers are listed more than once: {repeated}")
    return [int(index) for index in indices]


def normalize_method(method: str) -> str:
    """The canonical method name ("latter_half" and "Latter-Half" both mean "latter-half"); ValueError if unknown."""
    name = method.strip().lower().replace("_", "-") if isinstance(method, str) else method
    if name not in METHODS:
        raise ValueError(f"unknown selection method {method!r}; choose from: {', '.join(METHODS)}")
    return name


def _require(value: Any, what: str, method: str) -> Any:
    if value is None:
        raise ValueError(f"selection method {method!r} needs {what}")
    return value


def select_layers(
    method: str,
    *,
    num_layers: int,
    k: int | None = None,
    recall: Mapping[int, float] | None = None,
    csr: Mapping[int, float] | None = None,
    teacher_recall: float | None = None,
    kl_by_layer: Mapping[int, float] | None = None,
    layers: Sequence[int] | None = None,
) -> list[int]:
    """The layers to keep as attention by the named rule; k defaults to ⌊L/4⌋ (to len(layers) for "user").

    halo: recall + csr; jet-nemotron: recall + teacher_recall; kl-ls: kl_by_layer; user: layers;
    uniform, latter-half: nothing. Ranked rules return best first, the spacing rules ascending depth.
    """
    method = normalize_method(method)
    num_layers = _check_num_layers(num_layers)
    if method == "user":
        chosen = user_select(_require(layers, "layers (the user-given list)", method), num_layers)
        if k is not None and k != len(chosen):
            raise ValueError(f"k={k} does not match the {len(chosen)} user-given layers {chosen}")
        return chosen
    k = default_num_kept(num_layers) if k is None else k
    if method == "uniform":
        return uniform_select(num_layers, k)
    if method == "latter-half":
        return latter_half_select(num_layers, k)
    if method == "kl-ls":
        return kl_ls_select(_check_scores("kl_by_layer", _require(kl_by_layer, "kl_by_layer", method), num_layers), k)
    recall = _check_scores("recall", _require(recall, "recall scores", method), num_layers)
    if method == "jet-nemotron":
        return jet_nemotron_select(recall, _require(teacher_recall, "teacher_recall", method), k)
    return halo_select(recall, _check_scores("csr", _require(csr, "csr scores", method), num_layers), k)


@dataclass
class SelectionScores:
    """R_i and C_i of the single-replacement variants M(i), with standard errors (None when unknown), the seconds each
    variant took, the teacher's own scores when they were measured, and the generation path the recall scores came
    from (`hyla.inference.generate.generation_path_record`; None: not recorded)."""

    num_layers: int
    recall: dict[int, float] = field(default_factory=dict)
    recall_stderr: dict[int, float | None] = field(default_factory=dict)
    csr: dict[int, float] = field(default_factory=dict)
    csr_stderr: dict[int, float | None] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    teacher_recall: float | None = None
    teacher_recall_stderr: float | None = None
    teacher_csr: float | None = None
    teacher_csr_stderr: float | None = None
    generation_path: str | None = None

    @property
    def layers(self) -> list[int]:
        return sorted(self.recall)

    def add(self, layer: int, recall: tuple[float, float | None], csr: tuple[float, float | None], seconds: float):
        self.recall[layer], self.recall_stderr[layer] = recall
        self.csr[layer], self.csr_stderr[layer] = csr
        self.seconds[layer] = seconds

    def to_dict(self) -> dict[str, Any]:
        teacher = None
        if self.teacher_recall is not None:
            teacher = dict(recall=self.teacher_recall, recall_stderr=self.teacher_recall_stderr)
            teacher.update(csr=self.teacher_csr, csr_stderr=self.teacher_csr_stderr)
        rows = [
            dict(layer=layer, recall=self.recall[layer], recall_stderr=self.recall_stderr.get(layer))
            | dict(csr=self.csr[layer], csr_stderr=self.csr_stderr.get(layer), seconds=self.seconds.get(layer))
            for layer in self.layers
        ]
        return {"num_layers": self.num_layers, "teacher": teacher, "layers": rows,
                "generation_path": self.generation_path}

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> SelectionScores:
        """Inverse of `to_dict`; also reads a selection report's JSON, whose rows extend these."""
        scores = cls(num_layers=_check_num_layers(payload["num_layers"]))
        for row in payload["layers"]:
            recall, csr = (row["recall"], row.get("recall_stderr")), (row["csr"], row.get("csr_stderr"))
            scores.add(int(row["layer"]), recall, csr, row.get("seconds"))
        teacher = payload.get("teacher")
        if teacher:
            scores.teacher_recall, scores.teacher_recall_stderr = teacher["recall"], teacher.get("recall_stderr")
            scores.teacher_csr, scores.teacher_csr_stderr = teacher["csr"], teacher.get("csr_stderr")
        scores.generation_path = payload.get("generation_path")
        return scores


def mixer_layer_type(mixer: nn.Module) -> str:
    """The `layer_types` name of a mixer module ("lightning" for a `LightningAttention`)."""
    from hyla.models.modeling import MIXERS

    # The exact class: a subclass (RoPE attention of attention) names a different layer type. Some entries are
    # factories of head-wise mixers, not classes; those never serve as twins.
    for name, mixer_class in MIXERS.items():
        if type(mixer) is mixer_class:
            return name
    raise ValueError(f"{type(mixer).__name__} is not a HypeNet mixer; known: {', '.join(MIXERS)}")


def _check_twin(layer: int, twin: nn.Module) -> str:
    layer_type = mixer_layer_type(twin)
    built_for = getattr(twin, "layer_idx", layer)
    if built_for != layer:
        # The mixer reads and writes the cache slot of its own layer_idx.
        raise ValueError(f"the twin given for layer {layer} was built for layer {built_for}")
    return layer_type


def _placed_like(mixer: nn.Module, reference: nn.Module) -> nn.Module:
    target, current = next(reference.parameters(), None), next(mixer.parameters(), None)
    if target is None or current is None or (current.device, current.dtype) == (target.device, target.dtype):
        return mixer
    # A converted copy: moving the caller's twin in place and back would round fp32 weights through bf16.
    return copy.deepcopy(mixer).to(device=target.device, dtype=target.dtype)


@contextlib.contextmanager
def replaced_mixer(model: nn.Module, layer: int, mixer: nn.Module) -> Iterator[nn.Module]:
    """`model` (a HypeNetForCausalLM) with the mixer of `layer` replaced by `mixer`, for the duration of the block.

    The layer's entry in `config.layer_types` is switched too, because the model builds its cache from it. On exit,
    also after an error, the original mixer, block type and layer types come back. Yields the mixer in use: `mixer`
    itself, or a copy of it on the model's device and dtype when those differ.
    """
    blocks = model.model.layers
    if not _is_int(layer) or not 0 <= layer < len(blocks):
        raise ValueError(f"layer must be in [0, {len(blocks)}), got {layer!r}")
    layer_type = _check_twin(layer, mixer)
    block = blocks[layer]
    configs = list({id(config): config for config in (model.config, model.model.config)}.values())
    original_mixer, original_block_type = block.mixer, block.layer_type
    original_layer_types = [config.layer_types for config in configs]
    mixer = _placed_like(mixer, original_mixer)
    try:
        block.mixer, block.layer_type = mixer, layer_type
        for config, layer_types in zip(configs, original_layer_types):
            config.layer_types = [layer_type if i == layer else kind for i, kind in enumerate(layer_types)]
        yield mixer
    finally:
        block.mixer, block.layer_type = original_mixer, original_block_type
        for config, layer_types in zip(configs, original_layer_types):
            config.layer_types = layer_types


def _run_scorer(scorer: Scorer, model: nn.Module, name: str) -> tuple[float, float | None]:
    import torch

    with torch.no_grad():
        result = scorer(model)
    if not isinstance(result, Sequence) or len(result) != 2:
        raise ValueError(f"{name} must return (score, stderr), got {result!r}")
    score, stderr = result
    if not isinstance(score, numbers.Real) or not math.isfinite(score):
        raise ValueError(f"{name} returned a score that is not a finite number: {score!r}")
    if stderr is not None and (not isinstance(stderr, numbers.Real) or stderr < 0):
        raise ValueError(f"{name} returned a standard error that is not a number ≥ 0 or None: {stderr!r}")
    # NaN (e.g. a standard deviation of one sample) means unknown.
    return float(score), None if stderr is None or math.isnan(stderr) else float(stderr)


def _layers_to_score(twins: Mapping[int, nn.Module], layers: Sequence[int] | None, num_layers: int) -> list[int]:
    layers = sorted(twins) if layers is None else user_select(layers, num_layers)
    if not layers:
        raise ValueError("no layers to score: give twins (and layers) for at least one layer")
    missing = [layer for layer in layers if layer not in twins]
    if missing:
        raise ValueError(f"no twin for layers {missing}")
    for layer in layers:
        if not _is_int(layer) or not 0 <= layer < num_layers:
            raise ValueError(f"twin layer indices must be in [0, {num_layers}), got {layer!r}")
        _check_twin(layer, twins[layer])
    return layers


def _format_score(name: str, value: tuple[float, float | None]) -> str:
    score, stderr = value
    return f"{name}={score:.4f}" + (f"±{stderr:.4f}" if stderr is not None else "")


def _format_seconds(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def _measure(model, recall_fn: Scorer, csr_fn: Scorer):
    start = time.perf_counter()
    recall, csr = _run_scorer(recall_fn, model, "recall_fn"), _run_scorer(csr_fn, model, "csr_fn")
    return recall, csr, time.perf_counter() - start


def score_replacements(
    teacher: nn.Module,
    twins: Mapping[int, nn.Module],
    recall_fn: Scorer,
    csr_fn: Scorer,
    layers: Sequence[int] | None = None,
    progress: bool = True,
    *,
    score_teacher: bool = True,
    resume_from: SelectionScores | None = None,
    on_scored: Callable[[SelectionScores], None] | None = None,
) -> SelectionScores:
    """R_i and C_i of every M(i): `teacher` with only layer i replaced by `twins[i]`, measured by the two scorers.

    teacher: a HypeNetForCausalLM with attention in every layer (the teacher-equivalent model); its layers are
    swapped in place one at a time and always restored. layers: which to score (default: every layer with a twin).
    score_teacher: also score the unmodified teacher (first), for the report and the jet-nemotron rule.
    resume_from: scores of an interrupted run; what it holds is not measured again. on_scored: called with the
    scores so far after each measurement (e.g. to save them), so that a long run can resume.
    """
    num_layers = len(teacher.model.layers)
    not_attention = [i for i, kind in enumerate(teacher.config.layer_types) if kind not in TEACHER_LAYER_TYPES]
    if not_attention:
        raise ValueError(f"the teacher must have full attention in every layer; layers {not_attention} are not")
    layers = _layers_to_score(twins, layers, num_layers)
    scores = copy.deepcopy(resume_from) if resume_from is not None else SelectionScores(num_layers)
    if scores.num_layers != num_layers:
        raise ValueError(f"resume_from has {scores.num_layers} layers, the teacher {num_layers}")
    log = print if progress else lambda *args, **kwargs: None
    if score_teacher and scores.teacher_recall is None:
        recall, csr, seconds = _measure(teacher, recall_fn, csr_fn)
        scores.teacher_recall, scores.teacher_recall_stderr = recall
        scores.teacher_csr, scores.teacher_csr_stderr = csr
        log(f"[select] teacher: {_format_score('R', recall)} {_format_score('C', csr)} ({seconds:.1f} s)", flush=True)
        if on_scored is not None:
            on_scored(scores)
    remaining = [layer for layer in layers if layer not in scores.recall]
    log(f"[select] {len(remaining)} of {len(layers)} variants to score ({num_layers} layers)", flush=True)
    start = time.perf_counter()
    for done, layer in enumerate(remaining, start=1):
        with replaced_mixer(teacher, layer, twins[layer]):
            recall, csr, seconds = _measure(teacher, recall_fn, csr_fn)
        scores.add(layer, recall, csr, seconds)
        if on_scored is not None:
            on_scored(scores)
        eta = (time.perf_counter() - start) / done * (len(remaining) - done)
        log(
            f"[select] {done}/{len(remaining)} layer {layer}: {_format_score('R', recall)} "
            f"{_format_score('C', csr)} ({seconds:.1f} s, ETA {_format_seconds(eta)})",
            flush=True,
        )
    return scores


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and its standard error (sample standard deviation / √n); the error is None for fewer than 2 values."""
    if not values:
        raise ValueError("no values to average")
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None
    variance = math.fsum((value - mean) ** 2 for value in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def combine_task_scores(results: Sequence[tuple[float, float | None]]) -> tuple[float, float | None]:
    """The unweighted mean of per-task scores, with stderr √(Σ se_t²) / T (tasks independent); None if any is."""
    if not results:
        raise ValueError("no task scores to combine")
    mean = math.fsum(score for score, _ in results) / len(results)
    stderrs = [stderr for _, stderr in results]
    if any(stderr is None or math.isnan(stderr) for stderr in stderrs):
        return mean, None
    return mean, math.sqrt(math.fsum(stderr**2 for stderr in stderrs)) / len(results)


def default_scorers(
    tokenizer: Any,
    niah_tasks: Sequence[str] = ("SK1", "SK2", "SK3"),
    niah_lengths: Sequence[int] = (4096,),
    niah_samples: int = 20,
    csr_tasks: Sequence[str] = ("hellaswag", "arc_easy", "arc_challenge", "piqa", "winogrande", "lambada"),
    csr_limit: int | None = 200,
    batch_size: int = 8,
    *,
    csr_batch_size: int | None = None,
    csr_metric: str = "acc",
    seed: int = 42,
    niah_max_new_tokens: int | None = None,
    log: Callable[[str], None] | None = None,
    generation_paths: set[str] | None = None,
) -> tuple[Scorer, Scorer]:
    """(recall_fn, csr_fn) over `hyla.evals.niah` and `hyla.evals.csr`, scoring every variant on the same data.

    recall_fn: the mean RULER score over `niah_samples` prompts per task × length, stderr over prompts; the prompts
    are built once, on the first call. csr_fn: the unweighted mean of each task's `csr_metric` ("acc" or
    "acc_norm"; LAMBADA has only acc) over its first `csr_limit` documents, stderr as in `combine_task_scores`,
    `csr_batch_size` (None: `batch_size`) pairs a forward; each pair is tokenized once, on the first call.
    niah_max_new_tokens: the answer's length limit (None: hyla.evals.niah's). log: told, after each recall_fn call,
    the generation path it took and its prefill and decode seconds. generation_paths: recall_fn adds to it the path
    each call generated on.
    """
    from hyla.evals import csr as csr_eval
    from hyla.evals import niah as niah_eval
    from hyla.evals.generation import Generation
    from hyla.evals.loglik import encode_pair, encoded_scores

    if not niah_tasks or not niah_lengths or not csr_tasks:
        raise ValueError("the scorers need at least one NIAH task, one NIAH length and one CSR task")
    niah_tasks = [niah_eval.get_task(task).name for task in niah_tasks]
    unknown = sorted(set(csr_tasks) - set(csr_eval.TASK_FILES))
    if unknown:
        raise ValueError(f"unknown CSR tasks {unknown}; choose from {', '.join(csr_eval.TASK_FILES)}")
    if csr_metric not in ("acc", "acc_norm"):
        raise ValueError(f"csr_metric must be 'acc' or 'acc_norm', got {csr_metric!r}")
    cached: dict[str, Any] = {}

    def recall_fn(model) -> tuple[float, float | None]:
        if "samples" not in cached:
            cached["samples"] = [
                sample
                for task in niah_tasks
                for length in niah_lengths
                for sample in niah_eval.build_samples(tokenizer, task, length, niah_samples, seed)
            ]
        generation = Generation(model)
        limit = {} if niah_max_new_tokens is None else {"max_new_tokens": niah_max_new_tokens}
        records = niah_eval.evaluate_samples(model, tokenizer, cached["samples"], batch_size=batch_size,
                                             generation=generation, **limit)
        if generation_paths is not None:
            generation_paths.add(generation.path)
        if log is not None:
            spent = generation.describe()
            batches = f"{spent['calls']} batch" + ("" if spent["calls"] == 1 else "es")
            log(f"[select] NIAH on the {spent['path']} path: {batches}, prefill {spent['prefill_s']:.1f} s, "
                f"decode {spent['decode_s']:.1f} s, {spent['seconds']:.1f} s in all")
        return mean_and_stderr([record["score"] for record in records])

    def csr_fn(model) -> tuple[float, float | None]:
        if "documents" not in cached:
            cached["documents"] = {task: csr_eval.load_documents(task, csr_limit) for task in csr_tasks}
            cached["encoded"] = {
                task: [encode_pair(tokenizer, *pair) for document in documents
                       for pair in zip(document.contexts, document.continuations)]
                for task, documents in cached["documents"].items()
            }
        per_task = []
        for task, documents in cached["documents"].items():
            scores = encoded_scores(model, tokenizer, cached["encoded"][task], batch_size=csr_batch_size or batch_size,
                                    description=task)
            result = csr_eval.score_documents(task, documents, scores)
            metric = csr_metric if csr_metric in result else "acc"
            per_task.append((result[metric], result[f"{metric}_stderr"]))
        return combine_task_scores(per_task)

    return recall_fn, csr_fn
