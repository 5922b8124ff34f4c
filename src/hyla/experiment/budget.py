"""Training tokens for a time budget: the distillation tokens a conversion job can have in S seconds, at the
throughput measured for its own shape (a probe file of measured training steps, `cases` of stage, seq_len, batch,
compiled, checkpointed and tok_per_s)."""

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
    # The rate of the run's own variant: compiled, with activation checkpointing, or neither.
    cases = [c for c in probe["cases"] if c["stage"] == "distill" and c["seq_len"] == distill.seq_len
             and "error" not in c and bool(c.get("compiled", False)) == distill.compile
             and bool(c.get("checkpointed", False)) == distill.checkpoint_activations]
    if not cases:
        variant = (" compiled" if distill.compile else "") + (" checkpointed" if distill.checkpoint_activations else "")
        raise ValueError(f"the probe has no{variant} distill case at seq_len {distill.seq_len}")
    # The run's own batch size where the probe measured it (a larger step can be faster per token).
    cases = [c for c in cases if c["batch"] == distill.batch_size] or cases
    step = distill.seq_len * distill.batch_size
    tokens = min(max_tokens, cases[0]["tok_per_s"] * seconds)
    return max(1, int(tokens // step)) * step
