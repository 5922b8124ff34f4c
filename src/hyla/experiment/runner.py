"""Run a plan's jobs as subprocesses: in dependency order, several at once, resumable, with one retry for a training
that ran out of GPU memory.

A run folder holds `plan.json` (the plan as resolved, with the command line, versions and commit), `status.json`
(every job's state, rewritten at each change), `runner.log` (one line per event, also printed), `logs/NAME.log` (each
job's output) and `logs/NAME.done` (written when a job succeeds). Running the plan again into the same folder skips
the jobs that are done; a job that failed, was skipped or was stopped runs again (conversions and trainings resume
from their own checkpoints). SIGINT or SIGTERM stops the running jobs (their process groups) and ends the runner;
only one runner works in a folder at a time. On a machine without a GPU each job gets OMP_NUM_THREADS = the cores over
the jobs at once (`cpu_threads_per_job`), or the plan's number if lower, unless the caller or the job sets it.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hyla.experiment import actions
from hyla.experiment.plan import Job, Plan
from hyla.experiment.substitution import PlanError, finish
from hyla.outputs import git_sha, package_versions, write_json
from hyla.outputs import process_alive as outputs_process_alive

STATES = ("waiting", "running", "done", "failed", "skipped")
_OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory")
# How long a stopped job may take to exit after SIGTERM before it gets SIGKILL.
STOP_GRACE_S = 20.0


def available_cores() -> int:
    """The cores this process may run on (its affinity, which containers narrow), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_threads_per_job(parallel: int) -> int | None:
    """OMP_NUM_THREADS for each job on a machine without a GPU, where every job computes on the shared cores: the
    cores over the jobs at once, at least 1. None where a GPU is there (its jobs run on it; their threads are left
    as they are), or where the caller already set OMP_NUM_THREADS. Jobs at once with more threads than cores slow
    one another down many times over: the seed 003 plan's smoke test, two jobs at once on 2 cores with the plan's
    2 threads each, ran its GDN conversion beside an evaluation in 44-49 s, in 8-9 s with one thread each."""
    import torch

    if "OMP_NUM_THREADS" in os.environ or torch.cuda.is_available():
        return None
    return max(1, available_cores() // max(1, parallel))


@dataclass
class JobRun:
    """A job's progress in this run."""

    job: Job
    state: str = "waiting"
    alone: bool = False  # retried after running out of GPU memory: starts when no other training runs
    attempts: int = 0
    note: str = ""
    started: float | None = None  # time.time()
    ended: float | None = None
    returncode: int | None = None
    command: list[str] | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def seconds(self) -> float | None:
        return None if self.started is None else round((self.ended or time.time()) - self.started, 1)


class RunnerBusy(RuntimeError):
    """Another runner, or a job an earlier runner left running, works in the run folder."""


def _utc(stamp: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(stamp or time.time(), datetime.timezone.utc)
    return moment.isoformat(timespec="seconds")


def process_alive(pid: int | None) -> bool:
    """A runner's or job's recorded pid is running (never this process: a pid file reused after a restart)."""
    return pid != os.getpid() and outputs_process_alive(pid)


def command_line(job: Job, run_dir: Path) -> list[str]:
    """The job's final argv: `hyla` and `python` mean this interpreter; `${json:...}` references are read now."""
    argv = [finish(item, run_dir) for item in job.run]
    if argv[0] == "hyla":
        return [sys.executable, "-m", "hyla.cli", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


class Runner:
    """The state of one run of `plan` in `run_dir`; `run()` works until every job has ended or a stop is asked."""

    def __init__(self, plan: Plan, run_dir: Path, *, parallel: int | None = None, train_slots: int | None = None,
                 poll_s: float = 2.0, echo: Callable[[str], None] = print, argv: list[str] | None = None):
        self.plan, self.run_dir = plan, Path(run_dir)
        self.parallel = parallel or plan.parallel
        self.train_slots = train_slots or plan.train_slots
        self.cpu_threads = cpu_threads_per_job(self.parallel)
        self.poll_s, self.echo = poll_s, echo
        self.argv = list(sys.argv if argv is None else argv)
        self.logs = self.run_dir / "logs"
        self.jobs = {name: JobRun(job) for name, job in plan.jobs.items()}
        self.started = time.time()
        self.stop_requested: str | None = None
        self.outcome = "running"

    # --- files -------------------------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        line = f"[{_utc()} +{time.time() - self.started:7.1f} s] {text}"
        self.echo(line)
        with open(self.run_dir / "runner.log", "a") as handle:
            handle.write(line + "\n")

    def counts(self) -> dict[str, int]:
        counts = {state: 0 for state in STATES}
        for run in self.jobs.values():
            counts[run.state] += 1
        return counts

    def progress(self) -> str:
        counts = self.counts()
        return f"{counts['done']}/{len(self.jobs)} done, {counts['running']} running" + "".join(
            f", {counts[state]} {state}" for state in ("failed", "skipped") if counts[state])

    def write_status(self) -> None:
        jobs = {name: {"kind": run.job.kind, "state": run.state, "note": run.note, "needs": list(run.job.needs),
                       "after": list(run.job.after), "checked_by": list(run.job.checked_by),
                       "attempts": run.attempts, "returncode": run.returncode,
                       "seconds": run.seconds, "started_utc": run.started and _utc(run.started),
                       "pid": run.process.pid if run.process is not None and run.state == "running" else None,
                       "log": f"logs/{name}.log"}
                for name, run in self.jobs.items()}
        write_json(self.run_dir / "status.json", {
            "plan": self.plan.name, "source": self.plan.source, "profile": self.plan.profile,
            "runner": {"pid": os.getpid(), "state": self.outcome, "started_utc": _utc(self.started),
                       "updated_utc": _utc(), "seconds": round(time.time() - self.started, 1),
                       "parallel": self.parallel, "train_slots": self.train_slots},
            "counts": self.counts(), "jobs": jobs})

    def _write_plan(self) -> None:
        write_json(self.run_dir / "plan.json", {
            **self.plan.to_dict(), "command": " ".join(self.argv), "versions": package_versions(),
            "git_sha": git_sha(), "created_utc": _utc()})

    # --- preparation -------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Take the folder (or refuse: RunnerBusy), mark finished jobs done, write plan.json and status.json."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self._check_orphans()
        for name, run in self.jobs.items():
            marker = self.logs / f"{name}.done"
            if marker.exists() and not run.job.always:
                run.state, run.note = "done", "done in an earlier run"
                try:
                    planned = json.loads(marker.read_text()).get("planned")
                except (OSError, json.JSONDecodeError):
                    planned = None
                if planned is not None and planned != run.job.to_dict().get("run", planned):
                    self.log(f"kept    {name}: done with another command than the plan's now (delete "
                             f"{marker} to run it again)")
        self._write_plan()
        self.write_status()

    def _take_lock(self) -> None:
        lock = self.run_dir / "runner.pid"
        try:
            pid = int(lock.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if process_alive(pid):
            raise RunnerBusy(f"{self.run_dir} is being run by pid {pid} (see `hyla experiment status "
                             f"{self.run_dir}`); stop it first or wait for it")
        lock.write_text(f"{os.getpid()}\n")

    def _release_lock(self) -> None:
        lock = self.run_dir / "runner.pid"
        try:
            if int(lock.read_text().strip()) == os.getpid():
                lock.unlink()
        except (OSError, ValueError):
            pass

    def _check_orphans(self) -> None:
        """Jobs that an earlier runner started and that still run (that runner was killed outright)."""
        try:
            earlier = json.loads((self.run_dir / "status.json").read_text()).get("jobs", {})
        except (OSError, json.JSONDecodeError):
            return
        orphans = [(name, info["pid"]) for name, info in earlier.items()
                   if info.get("state") == "running" and process_alive(info.get("pid"))]
        if orphans:
            self._release_lock()
            listed = ", ".join(f"{name} (pid {pid})" for name, pid in orphans)
            raise RunnerBusy(f"jobs of an earlier runner still run: {listed}; wait for them to end or stop them "
                             f"(kill -- -PID), then run again")

    # --- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> str:
        """Work until every job has ended ("done": all succeeded, "failed") or a stop was asked ("interrupted")."""
        self.prepare()
        previous = self._install_signal_handlers()
        try:
            self.log(f"plan {self.plan.name}{f' (profile {self.plan.profile})' if self.plan.profile else ''}: "
                     f"{len(self.jobs)} jobs, {self.parallel} at once, {self.train_slots} training at once; "
                     + (f"{self.cpu_threads} CPU thread(s) a job (no GPU); " if self.cpu_threads else "")
                     + f"{self.progress()}; run folder {self.run_dir}")
            while True:
                if self.stop_requested:
                    self._stop_all(self.stop_requested)
                    self.outcome = "interrupted"
                    break
                changed = self.tick()
                if all(run.state in ("done", "failed", "skipped") for run in self.jobs.values()):
                    self.outcome = "done" if all(run.state == "done" for run in self.jobs.values()) else "failed"
                    self.log(f"finished: {self.progress()}")
                    break
                if changed:
                    self.write_status()
                time.sleep(self.poll_s)
        finally:
            self.write_status()
            self._release_lock()
            self._restore_signal_handlers(previous)
        return self.outcome

    def tick(self) -> bool:
        """One pass: collect ended jobs, skip what can no longer run, start what is ready. Whether anything
        changed."""
        changed = self._collect()
        for run in self.jobs.values():
            failed_checks = [n for n in run.job.checked_by if self._ended_badly(n)]
            if failed_checks and run.state in ("waiting", "running"):
                self._stop_checked(run, failed_checks)
                changed = True
            elif run.state == "waiting":
                blocked = [n for n in run.job.needs if self._ended_badly(n)
                           or any(self._ended_badly(check) for check in self.jobs[n].job.checked_by)]
                if blocked:
                    run.state, run.note = "skipped", f"needs {', '.join(blocked)}, which did not succeed"
                    self.log(f"skipped {run.job.name}: {run.note}")
                    changed = True
        return self._start_ready() or changed

    def _ended_badly(self, name: str) -> bool:
        return self.jobs[name].state in ("failed", "skipped")

    def _succeeded(self, name: str) -> bool:
        """Done, and so is every job that checks it (a result is not used before its check passed)."""
        return self.jobs[name].state == "done" and all(self.jobs[check].state == "done"
                                                        for check in self.jobs[name].job.checked_by)

    def _stop_checked(self, run: JobRun, failed_checks: list[str]) -> None:
        """A check of what `run` relies on failed: skip it, stopping it first when it runs."""
        note = f"checked by {', '.join(failed_checks)}, which did not succeed"
        if run.state == "running":
            self._terminate([run])
            run.ended, run.returncode = time.time(), run.process.returncode
            note = "stopped: " + note
        run.state, run.note = "skipped", note
        self.log(f"skipped {run.job.name}: {note}; {self.progress()}")

    def _collect(self) -> bool:
        changed = False
        for run in self.jobs.values():
            if run.state != "running" or run.process.poll() is None:
                continue
            run.ended, run.returncode = time.time(), run.process.returncode
            self._ended(run)
            changed = True
        return changed

    def _ended(self, run: JobRun) -> None:
        name = run.job.name
        if run.returncode == 0:
            run.state, run.note = "done", ""
            write_json(self.logs / f"{name}.done", {"planned": run.job.to_dict().get("run"), "command": run.command,
                                                     "seconds": run.seconds, "ended_utc": _utc(run.ended)})
            self.log(f"done    {name} ({run.seconds:.0f} s); {self.progress()}")
            return
        run.state, run.note = "failed", f"exit {run.returncode}; see logs/{name}.log"
        self.log(f"failed  {name} ({run.seconds:.0f} s, exit {run.returncode}); {self.progress()}")
        if run.job.kind == "train" and not run.alone and self._out_of_memory(name):
            # Trainings resume from their checkpoints: run it again once it can have the GPU alone.
            run.state, run.alone, run.note = "waiting", True, "out of GPU memory beside other jobs: retried alone"
            self.log(f"retry   {name}: out of GPU memory beside other jobs; again once no other training runs")

    def _out_of_memory(self, name: str) -> bool:
        """Whether the job's last lines report CUDA running out of memory."""
        with open(self.logs / f"{name}.log", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 20_000))
            tail = handle.read().decode("utf-8", "replace")
        return any(marker in tail for marker in _OOM_MARKERS)

    def _ready(self, run: JobRun) -> bool:
        ended = all(self.jobs[n].state in ("done", "failed", "skipped") for n in run.job.after)
        return run.state == "waiting" and ended and all(self._succeeded(n) for n in run.job.needs)

    def _start_ready(self) -> bool:
        changed = False
        running = sum(run.state == "running" for run in self.jobs.values())
        training = sum(run.state == "running" and run.job.kind == "train" for run in self.jobs.values())
        # A retried job waits for the running trainings to end, and no new training starts meanwhile.
        draining = any(run.alone and self._ready(run) for run in self.jobs.values())
        for run in self.jobs.values():
            if running >= self.parallel:
                break
            if not self._ready(run):
                continue
            if run.job.kind == "train" and (training >= self.train_slots or (draining and not run.alone)
                                            or (run.alone and training > 0)):
                continue
            self._start(run)
            running += run.state == "running"
            training += run.state == "running" and run.job.kind == "train"
            changed = True
        return changed

    def _start(self, run: JobRun) -> None:
        name = run.job.name
        run.attempts += 1
        run.started, run.ended, run.returncode = time.time(), None, None
        log_path = self.logs / f"{name}.log"
        try:
            if run.job.run is None:
                with open(log_path, "a") as log:
                    self._act(run.job, lambda line: log.write(line + "\n"))
                run.returncode, run.ended = 0, time.time()
                self._ended(run)
                return
            run.command = command_line(run.job, self.run_dir)
            with open(log_path, "a") as log:
                log.write(f"# {_utc()} attempt {run.attempts}\n$ {shlex.join(run.command)}\n")
                log.flush()
                run.process = subprocess.Popen(run.command, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True,
                                               env=self._environment(run.job))
        except (OSError, ValueError, PlanError) as err:
            run.state, run.ended, run.returncode = "failed", time.time(), -1
            run.note = f"could not start: {type(err).__name__}: {err}"
            with open(log_path, "a") as log:
                log.write(run.note + "\n")
            self.log(f"failed  {name}: {run.note}")
            return
        run.state, run.note = "running", ""
        self.log(f"start   {name}{' (alone)' if run.alone else ''}; {self.progress()}")

    def _act(self, job: Job, log: Callable[[str], None]) -> None:
        if job.copy is not None:
            spec = job.copy
            actions.copy_into([finish(s, self.run_dir) for s in spec["from"]], Path(finish(spec["into"], self.run_dir)),
                              exclude=spec["exclude"], log=log)
        else:
            spec = job.split_largest
            folders = [Path(finish(spec[key], self.run_dir)) for key in ("from", "largest", "rest")]
            actions.split_largest(*folders, spec["count"], log=log)

    def _environment(self, job: Job) -> dict[str, str]:
        env = dict(os.environ)
        for key, value in {"PYTHONUNBUFFERED": "1", **self.plan.env}.items():
            env.setdefault(key, value)
        if self.cpu_threads is not None:
            # The plan's thread count is for its GPU machine; here the jobs share the cores: at most their share.
            planned = env.get("OMP_NUM_THREADS", "")
            share = min(int(planned), self.cpu_threads) if planned.isdigit() else self.cpu_threads
            env["OMP_NUM_THREADS"] = str(max(1, share))
        env.update({key: finish(value, self.run_dir) for key, value in job.env.items()})
        return env

    # --- stopping ----------------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict:
        def ask_stop(signum, _frame):
            self.stop_requested = signal.Signals(signum).name

        previous = {}
        try:
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, ask_stop)
        except ValueError:  # not the main thread: the caller stops the runner through `stop_requested`
            pass
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _stop_all(self, reason: str) -> None:
        """Stop every running job's process group: SIGTERM, then SIGKILL after STOP_GRACE_S."""
        running = [run for run in self.jobs.values() if run.state == "running"]
        self.log(f"stop    ({reason}): stopping {len(running)} running jobs")
        self._terminate(running)
        for run in running:
            run.state, run.ended, run.returncode = "waiting", time.time(), run.process.returncode
            run.note = f"stopped by {reason}; runs again when the plan is run again"
        self.log(f"stopped: {self.progress()}; run the plan again to go on")

    @staticmethod
    def _terminate(runs: list[JobRun]) -> None:
        """Stop each job's process group: SIGTERM, then SIGKILL after STOP_GRACE_S; returns once all have exited."""
        for run in runs:
            try:
                os.killpg(run.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + STOP_GRACE_S
        for run in runs:
            try:
                run.process.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(run.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                run.process.wait()


def run_plan(plan: Plan, run_dir: str | Path, **options) -> str:
    """Run `plan` in `run_dir` until it ends: "done" (every job succeeded), "failed" or "interrupted"."""
    return Runner(plan, Path(run_dir), **options).run()
