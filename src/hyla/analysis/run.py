"""The analyses end to end: load the model, build the sequences, measure, and write a self-describing folder
(`results.json` with settings, command, versions and git SHA, plus PNG plots; every file written atomically).

`entropy` and `hitrate` run a HypeNet under inference options (logit scaling, EME) as `hyla eval niah` does: options
that change none of the model's layers, or any option on a model without them (a teacher), fail before the model
loads, from its config alone."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hyla.analysis.displacement import compare_checkpoints, load_checkpoint, summarize_displacement
from hyla.analysis.heads import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_TOP_K,
    entropy_by_position,
    group_means,
    head_records,
    measure_probes,
)
from hyla.analysis.plots import (
    plot_displacement_by_layer,
    plot_entropy_by_head,
    plot_entropy_by_position,
    plot_entropy_vs_hit_rate,
)
from hyla.analysis.probes import niah_probes, text_probes
from hyla.evals.overrides import check_options_change_layers, no_inference_options
from hyla.evals.report import RESULTS_FILE
from hyla.layers.context import InferenceOptions
from hyla.models.loading import load_model, resolve_spec
from hyla.outputs import run_metadata, write_json


@dataclass
class ProbeSettings:
    """Which sequences to analyse: NIAH prompts of `task` at `length` tokens (RULER's definition), or windows of
    `length` tokens of `text_file` when given. Needle depths: `num_depths` spread evenly over 0-100% (default: one
    per sample)."""

    task: str = "SK2"
    length: int = 2048
    num_samples: int = 4
    seed: int = 42
    num_depths: int | None = None
    text_file: str | None = None


def build_probes(tokenizer: Any, settings: ProbeSettings, *, with_needles: bool):
    if settings.text_file is not None:
        if with_needles:
            raise ValueError("the hit rate needs NIAH prompts: drop the text file")
        return text_probes(tokenizer, settings.text_file, length=settings.length, num_samples=settings.num_samples)
    return niah_probes(tokenizer, task=settings.task, length=settings.length, num_samples=settings.num_samples,
                       seed=settings.seed, num_depths=settings.num_depths or settings.num_samples)


def _check_out(out: Path) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output folder {out} exists and is not a folder")
    return out


def _hypenet_layer_types(model_spec: str) -> list[str] | None:
    """The layer types of a HypeNet from its config alone (no weights); None for any other model."""
    from transformers import AutoConfig

    from hyla.models.hf import register

    source = resolve_spec(model_spec)
    if source.gguf_file:
        return None
    register()
    try:
        config = AutoConfig.from_pretrained(source.location)
    except (OSError, ValueError, KeyError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"cannot read the config of {model_spec}: {reason}") from None
    return list(config.layer_types) if config.model_type == "hypenet" else None


def _checked_options(model_spec: str, options: InferenceOptions | None) -> dict[str, Any] | None:
    """What results.json records of `options` (their changes from the default, the SWLA stride in use), after
    checking from the model's config that each of them changes one of its layers."""
    if options is None:
        return None
    changes = options.changes()
    layer_types = _hypenet_layer_types(model_spec)
    if layer_types is None:
        raise no_inference_options(changes, model_spec)
    check_options_change_layers(options, layer_types, model_spec)
    if options.eme_window is not None:
        changes["eme_stride"] = options.swla_stride
    return changes


def _load(model_spec: str, options: InferenceOptions | None, **kwargs):
    model, tokenizer = load_model(model_spec, **kwargs)
    if options is not None:
        model.inference_options = options
    return model, tokenizer


def _options_title(recorded: dict[str, Any] | None) -> str:
    """The inference options in a plot title: SWLA's window and stride, the logit scaling."""
    if not recorded:
        return ""
    parts = []
    if "eme_window" in recorded:
        parts.append(f"EME W={recorded['eme_window']}, S={recorded['eme_stride']}")
    if "logit_scaling_train_length" in recorded:
        parts.append(f"c(L), L0={recorded['logit_scaling_train_length']}")
    elif "logit_scaling_a" in recorded:
        parts.append(f"s_t, a={recorded['logit_scaling_a']:g}")
    elif recorded.get("logit_scaling") == "off":
        parts.append("no logit scaling")
    return "\n" + ", ".join(parts)


def _print_settings(kind: str, settings: dict[str, Any]) -> None:
    print(f"hyla analyze {kind}: " + ", ".join(f"{name}={value}" for name, value in settings.items()), flush=True)


def run_entropy(
    model_spec: str,
    out: Path,
    probe_settings: ProbeSettings,
    *,
    tokenizer: str | None = None,
    inference_options: InferenceOptions | None = None,
    num_query_positions: int = 256,
    block_size: int = DEFAULT_BLOCK_SIZE,
    normalizer: str = "length",
    dtype: str = "float32",
    device: str = "cpu",
    progress: bool = True,
) -> dict[str, Any]:
    """Normalized entropy of every head's α~ at `num_query_positions` evenly spread query positions (0 = all), the
    model run under `inference_options` (None: as its config describes it)."""
    out = _check_out(out)
    recorded = _checked_options(model_spec, inference_options)
    settings = dict(model=model_spec, tokenizer=tokenizer, **asdict(probe_settings),
                    num_query_positions=num_query_positions, block_size=block_size, normalizer=normalizer,
                    dtype=dtype, device=device, inference_options=recorded)
    _print_settings("entropy", settings)
    started = time.perf_counter()
    model, loaded_tokenizer = _load(model_spec, inference_options, tokenizer=tokenizer, dtype=dtype, device=device)
    probes = build_probes(loaded_tokenizer, probe_settings, with_needles=False)
    per_probe = measure_probes(model, probes, progress=progress, num_query_positions=num_query_positions,
                               block_size=block_size, normalizer=normalizer)
    records = head_records(per_probe)
    curves = entropy_by_position(per_probe, probes, num_query_positions)
    results = {
        "kind": "analysis/entropy",
        "model_label": model_spec,
        **run_metadata(settings),
        "num_tokens": [probe.length for probe in probes],
        "summary": group_means(records, ["entropy"]),
        "entropy_by_position": curves,
        "heads": records,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    write_json(out / RESULTS_FILE, results)
    title = (f"{Path(model_spec).name or model_spec}: {len(probes)} × {max(results['num_tokens'])} tokens"
             + _options_title(recorded))
    plot_entropy_by_head(records, title=title, path=out / "entropy_by_head.png")
    plot_entropy_by_position(curves, title=title, path=out / "entropy_by_position.png")
    return results


def run_hitrate(
    model_spec: str,
    out: Path,
    probe_settings: ProbeSettings,
    *,
    tokenizer: str | None = None,
    inference_options: InferenceOptions | None = None,
    top_k: int = DEFAULT_TOP_K,
    normalizer: str = "length",
    dtype: str = "float32",
    device: str = "cpu",
    progress: bool = True,
) -> dict[str, Any]:
    """Top-k hit rate of every head on the needle's value tokens and its entropy, both at the answer position, the
    model run under `inference_options` (None: as its config describes it)."""
    out = _check_out(out)
    recorded = _checked_options(model_spec, inference_options)
    settings = dict(model=model_spec, tokenizer=tokenizer, **asdict(probe_settings), top_k=top_k,
                    normalizer=normalizer, dtype=dtype, device=device, inference_options=recorded)
    _print_settings("hitrate", settings)
    started = time.perf_counter()
    model, loaded_tokenizer = _load(model_spec, inference_options, tokenizer=tokenizer, dtype=dtype, device=device)
    probes = build_probes(loaded_tokenizer, probe_settings, with_needles=True)
    per_probe = measure_probes(model, probes, progress=progress, num_query_positions=None, top_k=top_k,
                               normalizer=normalizer)
    records = head_records(per_probe)
    results = {
        "kind": "analysis/hitrate",
        "model_label": model_spec,
        **run_metadata(settings),
        "samples": [{"label": probe.label, "num_tokens": probe.length,
                     "needle_positions": probe.needle_positions.tolist()} for probe in probes],
        "summary": group_means(records, ["hit_rate", "answer_entropy"]),
        "heads": records,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    write_json(out / RESULTS_FILE, results)
    title = (f"{Path(model_spec).name or model_spec}: {probe_settings.task} at {probe_settings.length} tokens"
             + _options_title(recorded))
    plot_entropy_vs_hit_rate(records, top_k=top_k, title=title, path=out / "entropy_vs_hitrate.png")
    return results


def run_displacement(before: str, after: str, out: Path) -> dict[str, Any]:
    """r_Q, r_K, r_V, r_O per head from checkpoint `before` to checkpoint `after`, averaged per layer type."""
    out = _check_out(out)
    settings = dict(before=before, after=after)
    _print_settings("displacement", settings)
    started = time.perf_counter()
    records = compare_checkpoints(load_checkpoint(before), load_checkpoint(after))
    summary = summarize_displacement(records)
    results = {
        "kind": "analysis/displacement",
        **run_metadata(settings),
        "summary": summary["by_group"],
        "by_layer": summary["by_layer"],
        "heads": records,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    write_json(out / RESULTS_FILE, results)
    plot_displacement_by_layer(summary["by_layer"], title=f"{Path(before).name} → {Path(after).name}",
                               path=out / "displacement_by_layer.png")
    return results
