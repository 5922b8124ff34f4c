"""The runner on fake jobs (short Python commands): dependency order, slots, failures, resume after a stop or a
kill, the out-of-memory retry, environments, file steps, status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from experiment_helpers import job

from hyla.cli import main as hyla_main
from hyla.experiment.actions import split_largest
from hyla.experiment.plan import load_plan
from hyla.experiment.runner import Runner, RunnerBusy
from hyla.experiment.status import format_status, read_status

def stamping(tmp_path: Path, name: str, seconds: float = 0.0) -> str:
    """Code that records its start and end (`NAME:end`) in tmp_path/stamps.jsonl."""
    path = str(tmp_path / "stamps.jsonl")

    def stamp(label: str) -> str:
        return f"open({path!r}, 'a').write(json.dumps([{label!r}, time.time()]) + chr(10))"

    return f"import json, time; {stamp(name)}; time.sleep({seconds}); {stamp(name + ':end')}"


def stamps(tmp_path: Path) -> dict[str, float]:
    lines = (tmp_path / "stamps.jsonl").read_text().splitlines()
    return {name: moment for name, moment in map(json.loads, lines)}


def run(plan_path: Path, run_dir: Path, **options) -> Runner:
    runner = Runner(load_plan(plan_path, run_dir), run_dir, poll_s=0.05, echo=lambda line: None, **options)
    runner.run()
    return runner


def states(runner: Runner) -> dict[str, str]:
    return {name: job_run.state for name, job_run in runner.jobs.items()}


def test_jobs_start_once_what_they_need_has_succeeded(tmp_path, write_plan):
    plan = write_plan([job("c", stamping(tmp_path, "c"), needs=["b"]), job("b", stamping(tmp_path, "b", 0.3),
                       needs=["a"]), job("a", stamping(tmp_path, "a", 0.3)), job("free", stamping(tmp_path, "free"))])
    runner = run(plan, tmp_path / "run")
    assert runner.outcome == "done" and set(states(runner).values()) == {"done"}
    times = stamps(tmp_path)
    assert times["a:end"] <= times["b"] and times["b:end"] <= times["c"]
    assert times["free"] < times["a:end"]  # nothing held it back
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["counts"]["done"] == 4 and status["runner"]["state"] == "done"
    assert (tmp_path / "run" / "logs" / "c.done").is_file() and (tmp_path / "run" / "plan.json").is_file()


def test_a_failure_skips_what_needs_it_but_not_what_only_comes_after(tmp_path, write_plan):
    plan = write_plan([job("broken", "raise SystemExit(3)"), job("needs-it", needs=["broken"]),
                       job("later", needs=["needs-it"]), job("after-it", after=["broken"])])
    runner = run(plan, tmp_path / "run")
    assert runner.outcome == "failed"
    assert states(runner) == {"broken": "failed", "needs-it": "skipped", "later": "skipped", "after-it": "done"}
    assert runner.jobs["broken"].returncode == 3


def test_a_checked_job_runs_beside_its_check_and_its_dependents_wait_for_both(tmp_path, write_plan):
    plan = write_plan([job("check", stamping(tmp_path, "check", 0.6)),
                       job("convert", stamping(tmp_path, "convert", 0.2), checked_by=["check"]),
                       job("eval", stamping(tmp_path, "eval"), needs=["convert"])])
    runner = run(plan, tmp_path / "run")
    assert runner.outcome == "done" and set(states(runner).values()) == {"done"}
    times = stamps(tmp_path)
    assert times["convert"] < times["check:end"]  # it did not wait for its check
    assert times["eval"] >= times["check:end"]  # a checked result is used only once its check has passed
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["jobs"]["convert"]["checked_by"] == ["check"]


def test_a_failed_check_stops_the_job_it_checks_and_skips_what_needs_it(tmp_path, write_plan):
    pid_file = tmp_path / "convert.pid"
    slow = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(30)"
    plan = write_plan([job("check", "import time; time.sleep(0.5); raise SystemExit(1)"),
                       job("convert", slow, checked_by=["check"]), job("eval", needs=["convert"]),
                       job("later", "import time; time.sleep(2)", kind="train"),
                       job("queued", checked_by=["check"], needs=["later"])])
    started = time.time()
    runner = run(plan, tmp_path / "run")
    assert time.time() - started < 20  # convert was stopped, not waited for
    assert states(runner) == {"check": "failed", "convert": "skipped", "eval": "skipped", "later": "done",
                              "queued": "skipped"}
    assert runner.jobs["convert"].note == "stopped: checked by check, which did not succeed"
    assert not _pid_alive(int(pid_file.read_text()))
    assert "skipped convert: stopped: checked by check" in (tmp_path / "run" / "runner.log").read_text()


def test_at_most_parallel_jobs_and_train_slots_trainings_run_at_once(tmp_path, write_plan):
    jobs = [job(f"e{i}", stamping(tmp_path, f"e{i}", 0.4)) for i in range(3)]
    jobs += [job(f"t{i}", stamping(tmp_path, f"t{i}", 0.4), kind="train") for i in range(2)]
    runner = run(write_plan(jobs), tmp_path / "run", parallel=3, train_slots=1)
    assert runner.outcome == "done"
    times = stamps(tmp_path)
    spans = [(times[n], times[n + ":end"]) for n in ("e0", "e1", "e2", "t0", "t1")]
    most = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert most <= 3
    assert times["t0:end"] <= times["t1"] or times["t1:end"] <= times["t0"]  # one training at a time


def test_a_training_that_ran_out_of_gpu_memory_runs_again_alone(tmp_path, write_plan):
    marker = tmp_path / "tried"
    oom = (f"import pathlib, sys, time; m = pathlib.Path({str(marker)!r}); first = not m.exists(); m.touch(); "
           "time.sleep(0.3); print('torch.OutOfMemoryError: CUDA out of memory.' if first else 'ok'); "
           "sys.exit(1 if first else 0)")
    plan = write_plan([job("a", oom, kind="train"), job("b", "import time; time.sleep(2)", kind="train"),
                       job("c", needs=["a"]), job("broken", "raise SystemExit(3)", kind="train"),
                       job("eval-oom", "print('CUDA out of memory'); raise SystemExit(1)")])
    runner = run(plan, tmp_path / "run", parallel=4, train_slots=3)
    assert states(runner) == {"a": "done", "b": "done", "c": "done", "broken": "failed", "eval-oom": "failed"}
    assert runner.jobs["a"].attempts == 2 and runner.jobs["broken"].attempts == 1
    assert runner.jobs["eval-oom"].attempts == 1  # only trainings resume from checkpoints: no retry
    log = (tmp_path / "run" / "runner.log").read_text()
    assert "retry   a" in log and "retry   broken" not in log
    assert runner.jobs["a"].started >= runner.jobs["b"].ended  # the second attempt waited for `b`


def test_a_rerun_skips_finished_jobs_and_retries_the_others(tmp_path, write_plan):
    counter, gate = tmp_path / "count", tmp_path / "gate"
    count = f"open({str(counter)!r}, 'a').write('x')"
    flaky = f"import os, sys; sys.exit(0 if os.path.exists({str(gate)!r}) else 1)"
    plan = write_plan([job("first", count), job("flaky", flaky, needs=["first"]), job("last", needs=["flaky"])])
    assert run(plan, tmp_path / "run").outcome == "failed"
    gate.touch()
    again = run(plan, tmp_path / "run")
    assert again.outcome == "done" and counter.read_text() == "x"  # `first` ran once
    assert again.jobs["first"].note == "done in an earlier run"


def _start_runner(plan: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hyla.cli", "experiment", "run", str(plan), "--out", str(run_dir),
                             "--poll", "0.1", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"


@pytest.mark.slow
def test_a_stopped_run_stops_its_jobs_and_goes_on_when_run_again(tmp_path, write_plan, capsys):
    pid_file = tmp_path / "slow.pid"
    slow = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(float('${{seconds}}'))"
    plan = write_plan([job("quick"), job("slow", slow, needs=["quick"]), job("after", needs=["slow"])],
                      variables={"seconds": "60"})
    run_dir = tmp_path / "run"
    runner = _start_runner(plan, run_dir)
    _wait_for(pid_file.exists)
    slow_pid = int(pid_file.read_text())
    # A second runner in the same folder is refused while the first works.
    assert hyla_main(["experiment", "run", str(plan), "--out", str(run_dir)]) == 2
    assert "is being run by pid" in capsys.readouterr().err.strip().splitlines()[-1]
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=60) == 130
    assert not _pid_alive(slow_pid)  # the job's process group was stopped with the runner
    status = read_status(run_dir)
    assert status["runner"]["state"] == "interrupted"
    assert status["jobs"]["slow"]["state"] == "waiting" and "stopped by SIGTERM" in status["jobs"]["slow"]["note"]
    again = _start_runner(plan, run_dir, "--set", "seconds=0")
    assert again.wait(timeout=120) == 0, again.stdout.read()
    done = read_status(run_dir)
    assert done["counts"]["done"] == 3 and done["jobs"]["quick"]["attempts"] == 0  # `quick` did not run again


@pytest.mark.slow
def test_jobs_left_running_by_a_killed_runner_are_not_started_twice(tmp_path, write_plan):
    pid_file = tmp_path / "slow.pid"
    slow = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    plan = write_plan([job("slow", slow)])
    run_dir = tmp_path / "run"
    runner = _start_runner(plan, run_dir)
    _wait_for(lambda: pid_file.exists() and read_status(run_dir)["jobs"]["slow"]["state"] == "running")
    runner.kill()
    runner.wait(timeout=30)
    orphan = int(pid_file.read_text())
    try:
        assert read_status(run_dir)["runner"]["state"] == "gone"
        with pytest.raises(RunnerBusy, match=f"slow \\(pid {orphan}\\)"):
            Runner(load_plan(plan, run_dir), run_dir, echo=lambda line: None).prepare()
    finally:
        os.killpg(orphan, signal.SIGKILL)
    _wait_for(lambda: not _pid_alive(orphan))
    Runner(load_plan(plan, run_dir), run_dir, echo=lambda line: None).prepare()  # now it may go on


def test_environments_reach_each_job(tmp_path, write_plan, monkeypatch):
    monkeypatch.setenv("HYLA_TEST_CALLER", "caller")
    show = "import os; print('A', os.environ.get('HYLA_TEST_A'), 'C', os.environ.get('HYLA_TEST_CALLER'))"
    plan = write_plan([job("with", show, env={"HYLA_TEST_A": "${run}"}), job("without", show)],
                      env={"HYLA_TEST_A": "plan", "HYLA_TEST_CALLER": "plan"})
    run(plan, tmp_path / "run")
    logs = tmp_path / "run" / "logs"
    assert f"A {tmp_path / 'run'} C caller" in (logs / "with.log").read_text()
    # The plan's env gives defaults: the caller's environment wins.
    assert "A plan C caller" in (logs / "without.log").read_text()


def test_jobs_on_a_machine_without_a_gpu_share_its_cores(tmp_path, write_plan, monkeypatch):
    import torch

    from hyla.experiment import runner as runner_module

    show = "import os; print('threads', os.environ.get('OMP_NUM_THREADS'))"
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runner_module, "available_cores", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plan = write_plan([job("a", show), job("b", show)])
    run(plan, tmp_path / "two", parallel=2)
    assert "threads 4" in (tmp_path / "two" / "logs" / "a.log").read_text()  # 8 cores, 2 jobs at once
    run(plan, tmp_path / "many", parallel=16)
    assert "threads 1" in (tmp_path / "many" / "logs" / "b.log").read_text()
    # The caller's setting is kept, and so is the plan's (below).
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    run(plan, tmp_path / "caller", parallel=2)
    assert "threads 6" in (tmp_path / "caller" / "logs" / "a.log").read_text()
    # With a GPU the jobs' threads are left alone.
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    run(plan, tmp_path / "gpu", parallel=2)
    assert "threads None" in (tmp_path / "gpu" / "logs" / "a.log").read_text()
    # A plan's own number (the shipped plans ask for 2, for their GPU machine) is kept where it is lower than the
    # share, lowered where it is higher; a job's own setting is kept.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    planned = write_plan([job("a", show), job("b", show, env={"OMP_NUM_THREADS": "5"})], env={"OMP_NUM_THREADS": "3"})
    run(planned, tmp_path / "planned", parallel=2)
    assert "threads 3" in (tmp_path / "planned" / "logs" / "a.log").read_text()
    assert "threads 5" in (tmp_path / "planned" / "logs" / "b.log").read_text()
    monkeypatch.setattr(runner_module, "available_cores", lambda: 2)
    run(planned, tmp_path / "small", parallel=2)
    assert "threads 1" in (tmp_path / "small" / "logs" / "a.log").read_text()


def test_a_job_that_cannot_start_fails_alone(tmp_path, write_plan):
    plan = write_plan([{"name": "missing", "run": ["/no/such/program"]}, job("fine"),
                       job("reads", "${json:nothing.json#a}")])
    runner = run(plan, tmp_path / "run")
    assert states(runner) == {"missing": "failed", "fine": "done", "reads": "failed"}
    assert "could not start" in runner.jobs["reads"].note


def test_copy_and_split_largest_steps(tmp_path, write_plan):
    text = tmp_path / "text"
    (text / "a").mkdir(parents=True)
    for name, size in {"a/small.txt": 10, "a/big.txt": 500, "mid.txt": 300, "largest.txt": 900}.items():
        (text / name).write_text("x" * size)
    (tmp_path / "stage" / "checkpoints").mkdir(parents=True)
    (tmp_path / "stage" / "manifest.json").write_text("{}")
    plan = write_plan([
        {"name": "split", "split_largest": {"from": str(text), "largest": "${run}/long", "rest": "${run}/train",
                                            "count": 2}},
        {"name": "copy", "copy": {"from": [str(tmp_path / "st*")], "into": "${run}/copy", "exclude": ["checkpoints"]}}])
    runner = run(plan, tmp_path / "run")
    assert runner.outcome == "done"
    run_dir = tmp_path / "run"
    assert sorted(p.name for p in (run_dir / "long").iterdir()) == ["a__big.txt", "largest.txt"]
    assert sorted(str(p.relative_to(run_dir / "train")) for p in (run_dir / "train").rglob("*.txt")) == [
        "a/small.txt", "mid.txt"]
    assert len(list(text.rglob("*.txt"))) == 4  # the source is left as it was
    assert (run_dir / "copy" / "stage" / "manifest.json").is_file()
    assert not (run_dir / "copy" / "stage" / "checkpoints").exists()
    assert split_largest(text, run_dir / "long", run_dir / "train", 2, log=lambda line: None) == (-1, -1)
    with pytest.raises(ValueError, match="would leave none"):
        split_largest(text, tmp_path / "l2", tmp_path / "r2", 4, log=lambda line: None)


def test_status_lists_every_job_with_its_last_log_line(tmp_path, write_plan, capsys):
    plan = write_plan([job("ok", "print('step 3/3 loss 2.5')"), job("bad", "print('boom'); raise SystemExit(4)"),
                       job("never", needs=["bad"])])
    run(plan, tmp_path / "run")
    status = read_status(tmp_path / "run")
    text = format_status(tmp_path / "run", status)
    assert "finished, some jobs did not succeed" in text and "1/3 done" in text
    bad = next(line for line in text.splitlines() if line.startswith("bad "))
    assert bad.split()[2:6] == ["failed", "0", "s", "4"] and bad.endswith("boom")
    assert "needs bad, which did not succeed" in next(line for line in text.splitlines() if line.startswith("never"))
    assert hyla_main(["experiment", "status", str(tmp_path / "run")]) == 0
    assert "never" in capsys.readouterr().out
    assert hyla_main(["experiment", "status", str(tmp_path)]) == 2
    assert "holds no experiment run" in capsys.readouterr().err


def test_a_failing_preflight_job_stops_the_run_before_any_job_and_in_a_dry_run(tmp_path, write_plan, capsys,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    # A branch check as the recipe plan's check-N runs it: stage 3 with its own corpus, a longer stage 3 in the branch.
    check = ["hyla", "convert", "check-branch", "--out", "b", "--preset", "halo-smollm2", "--device", "cpu",
             "--set", "data.long_sources=docs@0-26:aa-lcr", "--from-stage", "finetune", "--branch"]
    bad = {"name": "check-b", "kind": "check", "preflight": True, "run": check + ["--set", "finetune.tokens=100e6"]}
    plan = write_plan([job("a", "open('ran', 'w')"), bad])
    for extra in (["--dry-run"], []):
        assert hyla_main(["experiment", "run", str(plan), "--out", str(tmp_path / "run"), *extra]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("hyla experiment: error: job check-b: hyla convert: error: a branch from finetune "
                                "takes over stages data, align, select, distill unchanged") and "\n" not in error
        assert not (tmp_path / "ran").exists() and not (tmp_path / "run").exists()
    # The same check passing: said before the run, which then runs every job (the check again, on its own record).
    good = {**bad, "run": check + ["--set", "finetune.lr=1e-4"]}
    plan = write_plan([job("a", "open('ran', 'w')"), good])
    assert hyla_main(["experiment", "run", str(plan), "--out", str(tmp_path / "run")]) == 0
    assert ("preflight check-b: branch from finetune: the stages before it have the same settings as the base's"
            in capsys.readouterr().out)
    assert (tmp_path / "ran").exists() and (tmp_path / "run" / "logs" / "check-b.log").is_file()


def test_a_bad_plan_is_refused_before_anything_runs(tmp_path, write_plan, capsys, monkeypatch):
    plan = write_plan([job("a", "open('ran', 'w')"), job("b", needs=["typo"])])
    monkeypatch.chdir(tmp_path)
    assert hyla_main(["experiment", "run", str(plan), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == f"hyla experiment: error: {plan}: job b: needs: no job matches 'typo'"
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run").exists()
    # A hyla command that would only fail when its job starts (after the others): refused now, in one line.
    plan = write_plan([job("a", "open('ran', 'w')"),
                       {"name": "late", "needs": ["a"], "run": ["hyla", "convert", "--out", "x", "--from-stage", "bogus"]}])
    assert hyla_main(["experiment", "run", str(plan), "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("hyla experiment: error: job late: hyla convert: error: argument --from-stage: invalid "
                            "choice: 'bogus'") and "\n" not in error
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run").exists()
