"""Experiments: plan files of `hyla` jobs with their dependencies, run several at once and resumably
(`hyla experiment run`), with a status (`hyla experiment status`) and a report (`hyla experiment report`).

The shipped plans are in configs/experiments/ (docs/experiments.md).
"""

from hyla.experiment.plan import Job, Plan, PlanError, keep_only, load_plan
from hyla.experiment.report import write_report
from hyla.experiment.runner import Runner, RunnerBusy, run_plan
from hyla.experiment.status import format_status, read_status

__all__ = ["Job", "Plan", "PlanError", "Runner", "RunnerBusy", "format_status", "keep_only", "load_plan",
           "read_status", "run_plan", "write_report"]
