"""Training tokens for a time budget: the distillation tokens a conversion job can have in S seconds, at the
throughput measured for its own shape: `hyla bench train`'s train.json (`cases` of stage, seq_len, batch, path
"eager" or "fast", tok_per_s), or a probe file of the runs of 2026-11 (`compiled` and `checkpointed` flags instead
of `path`)."""

from __future__ import annotations

from hyla.experiment.plan import Plan, PlanError


def convert_settings(plan: Plan, job_name: str) -> tuple[str, list[str]]:
    """The `--preset` and `--set` items of the plan's `hyla convert` job `job_name`."""
    job = plan.jobs.get(job_name)
    if job is None or job.run is None or list(job.run[:2]) != ["hyla", "convert"]:
        raise PlanError(f"{plan.source}: no `hyla convert` job named {job_name}")
    argv = list(job.run)
    pairs = list(zip(argv, argv[1:]))
    presets = [value for flag, value in pairs if flag == "--preset"]
    return (presets[-1] if presets else "smoke"), [value for flag, value in pairs if flag == "--set"]


def distill_tokens(probe: dict, seconds: float, max_tokens: float, preset: str, overrides: list[str]) -> int:
    """Distillation tokens for `seconds` at the probe's rate for this plan's distillation shape and variant,
    rounded down to whole steps (at least one), at most `max_tokens`."""
    from hyla.convert.presets import apply_overrides, make_plan

    distill = apply_overrides(make_plan(preset, 0), overrides).distill
    # The rate of the run's own variant. `hyla bench train` times the eager reference and the fast default (on the
    # GPU unless compile is switched off); the older probes timed compiled cases only where asked.
    fast = distill.compile is not False

    def same_variant(case: dict) -> bool:
        compiled = case["path"] == "fast" if "path" in case else bool(case.get("compiled", False))
        wanted = fast if "path" in case else bool(distill.compile)
        return compiled == wanted and bool(case.get("checkpointed", False)) == distill.checkpoint_activations

    cases = [c for c in probe["cases"] if c["stage"] == "distill" and c["seq_len"] == distill.seq_len
             and "error" not in c and same_variant(c)]
    if not cases:
        variant = (" fast" if fast else " eager") + (" checkpointed" if distill.checkpoint_activations else "")
        raise ValueError(f"the probe has no{variant} distill case at seq_len {distill.seq_len}")
    # The run's own batch size where the probe measured it (a larger step can be faster per token).
    cases = [c for c in cases if c["batch"] == distill.batch_size] or cases
    step = distill.seq_len * distill.batch_size
    tokens = min(max_tokens, cases[0]["tok_per_s"] * seconds)
    return max(1, int(tokens // step)) * step
