"""`hyla experiment {run,status,report,check-teacher,budget}`: thin wrappers over `hyla.experiment`."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    experiment = subparsers.add_parser(
        "experiment", help="run a plan of hyla jobs (dependencies, slots, resume), its status and report",
        description="An experiment is a plan file (JSON or TOML, e.g. configs/experiments/smollm2.json) of jobs: "
                    "hyla commands with their dependencies. `run` works through them, several at once, and resumes "
                    "where it stopped; `status` shows where a run stands; `report` summarizes its results.")
    experiment.set_defaults(handler=lambda args: experiment.print_help())
    verbs = experiment.add_subparsers(dest="experiment_command", metavar="VERB")
    _register_run(verbs)
    status = verbs.add_parser("status", help="where a run stands: each job's state, time and last log line")
    status.add_argument("run", type=Path, metavar="RUN", help="the run folder (`run --out`)")
    status.add_argument("--json", action="store_true", help="print status.json instead of the table")
    status.set_defaults(handler=run_status)
    report = verbs.add_parser("report", help="summary.json, report.md, plots and a tarball of a run's results")
    report.add_argument("run", type=Path, metavar="RUN",
                        help="the run folder (`run --out`), or a folder of `hyla convert` run folders (their stage-1 "
                             "alignment side by side in align.png)")
    report.add_argument("--out", type=Path, default=None, help="report folder (default RUN/report)")
    report.add_argument("--no-plots", action="store_true", help="no PNG plots")
    report.add_argument("--no-tarball", action="store_true", help="no results.tar.xz")
    report.set_defaults(handler=run_report)
    _register_check_teacher(verbs)
    _register_budget(verbs)


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", type=Path, metavar="PLAN", help="plan file (.json or .toml)")
    parser.add_argument("--profile", default=None, help="one of the plan's profiles, e.g. smoke (CPU, toy sizes)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                        help="set a plan variable (repeatable), e.g. teacher=/data/smol.gguf; a list variable takes "
                             "a JSON list")


def _register_run(verbs: argparse._SubParsersAction) -> None:
    run = verbs.add_parser(
        "run", help="run a plan's jobs into a run folder (resumable: run it again to go on)",
        description="Run every job of PLAN whose dependencies have succeeded, at most --parallel at once and "
                    "--train-slots trainings at once; a failed job skips the jobs that need it. Each job logs to "
                    "RUN/logs/NAME.log; RUN/status.json says where the run stands. Running the same command again "
                    "skips the jobs that are done. Ctrl-C (or SIGTERM) stops the running jobs.")
    _plan_arguments(run)
    run.add_argument("--out", type=Path, required=True, metavar="RUN", help="run folder (logs, status, results)")
    run.add_argument("--only", default=None, metavar="JOB,...",
                     help="run only these jobs (names or globs) and what they need")
    run.add_argument("--parallel", type=int, default=None, metavar="N", help="jobs at once (default: the plan's)")
    run.add_argument("--train-slots", type=int, default=None, metavar="N",
                     help="training jobs at once (default: the plan's)")
    run.add_argument("--dry-run", action="store_true", help="print the resolved plan and its commands; run nothing")
    run.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between checks (default 2)")
    run.set_defaults(handler=run_run)


def _register_check_teacher(verbs: argparse._SubParsersAction) -> None:
    check = verbs.add_parser(
        "check-teacher", help="save a teacher as an HF folder and check hyla reproduces its logits",
        description="Load TEACHER, check that its teacher-equivalent HypeNet (every layer attention with RoPE) "
                    "gives the same logits, save it as a plain float HF folder OUT (the evaluations' --model) and "
                    "check that the folder reloads to the same logits and tokenizer. Exit 1 when a check fails.")
    check.add_argument("teacher", help="HF folder, hub id, GGUF file, or alias (smollm2-135m)")
    check.add_argument("--out", type=Path, required=True, help="HF folder to write")
    check.add_argument("--device", default="cpu")
    check.add_argument("--seq-len", type=int, default=1024, help="tokens per compared sequence (default 1024)")
    check.add_argument("--report", type=Path, default=None, help="report JSON (default OUT/teacher-check.json)")
    check.set_defaults(handler=run_check_teacher)


def _register_budget(verbs: argparse._SubParsersAction) -> None:
    budget = verbs.add_parser(
        "budget", help="distillation tokens that fit in a time budget at a measured throughput",
        description="Print the distillation tokens the plan's conversion job can have in --seconds at the rate a "
                    "probe file measured for its shape (distill seq_len, batch size, compiled or not), in whole "
                    "steps; pass the result back with --set.")
    _plan_arguments(budget)
    budget.add_argument("--probe", type=Path, required=True, help="probe JSON of measured training steps")
    budget.add_argument("--seconds", type=float, required=True, help="seconds of distillation")
    budget.add_argument("--max-tokens", type=float, default=80e6, help="at most this many tokens (default 80e6)")
    budget.add_argument("--job", default="convert", help="the conversion job (default convert)")
    budget.set_defaults(handler=run_budget)


def _load(args: argparse.Namespace, run_dir: Path):
    from hyla.experiment.plan import load_plan

    return load_plan(args.plan, run_dir, profile=args.profile, overrides=args.overrides)


def describe(plan) -> str:
    """The resolved plan: variables, settings, and each job with its command."""
    lines = [f"plan {plan.name} ({plan.source}{', profile ' + plan.profile if plan.profile else ''}): "
             f"{len(plan.jobs)} jobs, {plan.parallel} at once, {plan.train_slots} training at once"]
    lines += [f"  {name} = {json.dumps(value)}" for name, value in plan.variables.items()]
    for job in plan.jobs.values():
        order = (f" needs {','.join(job.needs)}" if job.needs else "") + (
            f" after {len(job.after)} jobs" if job.after else "") + (
            f" checked by {','.join(job.checked_by)}" if job.checked_by else "")
        body = shlex.join(job.run) if job.run is not None else f"{job.action} {json.dumps(getattr(job, job.action))}"
        lines.append(f"- {job.name} [{job.kind}]{order}\n    {body}")
    return "\n".join(lines)


def check_commands(plan) -> None:
    """Every `hyla` job's arguments parse with this hyla's command line, before anything runs: a mistake in a job
    that starts late (after a conversion, say) is one line now. Jobs with `${json:...}` arguments (read when they
    start) are left to then."""
    import contextlib
    import io

    from hyla.cli import build_parser

    parser = build_parser()
    for job in plan.jobs.values():
        if job.run is None or job.run[0] != "hyla" or any("${json:" in argument for argument in job.run):
            continue
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                parser.parse_args(list(job.run[1:]))
        except SystemExit:
            lines = errors.getvalue().strip().splitlines()
            raise ValueError(f"job {job.name}: {lines[-1] if lines else 'its hyla command does not parse'}") from None


def run_preflight(plan) -> None:
    """The plan's preflight jobs (`hyla` checks of seconds that read no earlier job's output), each run here in
    this process before anything else (without the plan's or the job's `env`): the first failure is one line
    naming the job."""
    import contextlib
    import io

    from hyla.cli import main

    for job in plan.jobs.values():
        if not job.preflight:
            continue
        errors, output = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(output):
            code = main(list(job.run[1:]))
        if code != 0:
            lines = errors.getvalue().strip().splitlines() or output.getvalue().strip().splitlines()
            raise ValueError(f"job {job.name}: {lines[-1] if lines else f'exit {code}'}")
        said = output.getvalue().strip().splitlines()
        print(f"preflight {job.name}: {said[-1] if said else 'ok'}", flush=True)


def run_run(args: argparse.Namespace) -> int:
    import sys

    from hyla.experiment.plan import keep_only
    from hyla.experiment.runner import Runner, RunnerBusy

    for flag, value in (("--parallel", args.parallel), ("--train-slots", args.train_slots)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1")
    plan = _load(args, args.out)
    if args.only:
        plan = keep_only(plan, args.only.split(","))
    check_commands(plan)
    print(describe(plan), flush=True)
    run_preflight(plan)
    if args.dry_run:
        return 0
    runner = Runner(plan, args.out, parallel=args.parallel, train_slots=args.train_slots, poll_s=args.poll,
                    argv=["hyla", *sys.argv[1:]])
    try:
        outcome = runner.run()
    except RunnerBusy as err:
        raise ValueError(str(err)) from None  # reported as one line, exit 2
    print(f"hyla experiment: {outcome}; `hyla experiment status {args.out}` for each job, "
          f"`hyla experiment report {args.out}` for the results")
    return {"done": 0, "failed": 1, "interrupted": 130}[outcome]


def run_status(args: argparse.Namespace) -> int:
    from hyla.experiment.status import format_status, read_status

    status = read_status(args.run)
    print(json.dumps(status, indent=2) if args.json else format_status(args.run, status))
    return 0


def run_report(args: argparse.Namespace) -> int:
    from hyla.experiment.report import write_report

    result = write_report(args.run, args.out, plots=not args.no_plots, archive=not args.no_tarball)
    print(result["markdown"])
    print("wrote " + ", ".join(result["files"]))
    return 0


def run_check_teacher(args: argparse.Namespace) -> int:
    from hyla.experiment.teacher_check import check_teacher

    result = check_teacher(args.teacher, args.out, device=args.device, seq_len=args.seq_len, report=args.report)
    print(json.dumps({k: result[k] for k in ("max_abs_logit_diff", "relative", "saved_folder_max_abs_logit_diff",
                                              "saved_tokenizer_matches", "passed")}))
    return 0 if result["passed"] else 1


def run_budget(args: argparse.Namespace) -> int:
    from hyla.experiment.budget import convert_settings, distill_tokens

    plan = _load(args, Path("."))
    preset, overrides = convert_settings(plan, args.job)
    probe = json.loads(args.probe.read_text())
    print(distill_tokens(probe, args.seconds, args.max_tokens, preset, overrides))
    return 0
