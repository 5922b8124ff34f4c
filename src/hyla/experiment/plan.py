"""Experiment plans: a JSON or TOML file of jobs (commands with their dependencies), read and checked in full before
anything runs.

A plan file holds:

- `name`, `description`;
- `variables`: values the jobs use as `${name}` (strings, numbers, booleans or lists of strings). A variable given as
  `null`, or as `{"default": null, "help": "..."}`, must be set on the command line (`--set name=value`). Built in:
  `${run}` (the run folder), `${plan_dir}` (the plan file's folder), `${python}` (this interpreter);
- `settings`: `parallel` (jobs at once) and `train_slots` (jobs of kind "train" at once);
- `env`: environment variables for every job, unless the caller's environment sets them already;
- `profiles`: named sets of `variables` and `settings` that replace the plan's own (`--profile smoke`);
- `jobs`: a list of jobs, each with a `name` and one of
  - `run`: a command as a list of arguments; a first argument `hyla` runs this installed hyla, `python` this
    interpreter;
  - `copy`: `{"from": [PATH or GLOB, ...], "into": DIR, "exclude": [PATTERN, ...]}`, each match copied into DIR
    under its own name (what already exists there is kept);
  - `split_largest`: `{"from": DIR, "largest": DIR, "rest": DIR, "count": N}`, the N largest files under a folder
    copied into one new folder and the others into another (e.g. long documents held out of the training text);

  and optionally `needs` (jobs that must have succeeded; a failed one skips this job), `after` (jobs that must have
  ended, whatever their outcome), `checked_by` (checks of what this job relies on whose output it does not read: it
  starts without waiting for them, is stopped or skipped when one fails, and counts as succeeded for the jobs that
  need it only once they have), all by name or glob; `always` (true: runs in every run, even when it succeeded
  before, e.g. a report); `kind` ("train" takes a train slot and, after running out
  of GPU memory, runs once more alone; "data", "eval", "check": labels); `env`; `matrix` (one job per combination of
  its axes' values, e.g. `{"task": ["SK1", "SK2"]}` and a name `niah-${task}`; an axis of objects gives their
  fields as `${axis.field}`; an axis `"${name}"` takes the values of a list variable, and gives no job when it is
  empty); `when` (true or false once substituted, e.g. `"${stage_evals}"`: false leaves the job,
  or that combination of its matrix, out of the plan); `preflight` (true, for a `hyla` check that reads nothing an
  earlier job writes and takes seconds: `hyla experiment run` runs it once more before any job starts, and with
  `--dry-run`, and a failure stops the run there with its error line).

In a job's arguments, `${name}` is replaced by its value; an argument that is exactly `${name}` of a list becomes
that many arguments (none for an empty list); inside a longer string a list is joined with commas. `$$` is a `$`.
`${json:PATH#key.key}` is read when the job starts, from a JSON file an earlier job wrote (PATH relative to the run
folder; a list value is joined with commas).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# PlanError and finish are part of this module's interface too.
from hyla.experiment.substitution import (  # noqa: F401
    PlanError, arguments, bind, finish, list_reference, substitute, variable)

KINDS = ("train", "data", "eval", "check", "task")
ACTIONS = ("run", "copy", "split_largest")
_TOP_KEYS = {"name", "description", "variables", "settings", "env", "profiles", "jobs", "report"}
_JOB_KEYS = {"name", "needs", "after", "checked_by", "kind", "env", "matrix", "always", "when", "description",
             "preflight", *ACTIONS}
_SETTINGS = {"parallel": 14, "train_slots": 4}
_BUILT_IN = ("run", "plan_dir", "python")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@dataclass(frozen=True)
class Job:
    """One job of a plan, its values substituted (but for `${json:...}` references, read when it starts)."""

    name: str
    kind: str = "task"
    run: tuple[str, ...] | None = None
    copy: dict[str, Any] | None = None
    split_largest: dict[str, Any] | None = None
    needs: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    # Jobs that check what this one relies on but write nothing it reads (a teacher's logit check before a
    # conversion): it runs beside them instead of after them, and their failure stops it.
    checked_by: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    always: bool = False  # runs in every run of the plan, done before or not (a report of what the run holds)
    preflight: bool = False  # also run before any job starts (and with --dry-run); its failure stops the run

    @property
    def action(self) -> str:
        return "run" if self.run is not None else "copy" if self.copy is not None else "split_largest"

    def to_dict(self) -> dict[str, Any]:
        body = {"run": list(self.run)} if self.run is not None else {self.action: getattr(self, self.action)}
        return {"name": self.name, "kind": self.kind, **body, "needs": list(self.needs), "after": list(self.after),
                "checked_by": list(self.checked_by), "env": dict(self.env), "always": self.always,
                "preflight": self.preflight}


@dataclass(frozen=True)
class Plan:
    name: str
    description: str
    source: str  # the plan file
    profile: str | None
    variables: dict[str, Any]  # resolved, built-ins included
    parallel: int
    train_slots: int
    env: dict[str, str]
    jobs: dict[str, Job]  # in the file's order (the order jobs start in when several are ready)
    report: dict[str, Any] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()  # the names of jobs a `when` left out of this plan (`--only` may name them)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "source": self.source, "profile": self.profile,
                "variables": self.variables, "settings": {"parallel": self.parallel, "train_slots": self.train_slots},
                "env": self.env, "report": self.report, "jobs": [job.to_dict() for job in self.jobs.values()]}


def read_plan_file(path: Path) -> dict[str, Any]:
    """The plan file as a dict (JSON, or TOML for a `.toml` name)."""
    if not path.is_file():
        raise PlanError(f"{path}: no such plan file")
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise PlanError(f"{path}: TOML plans need Python 3.11 or later; write the plan as JSON") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise PlanError(f"{path}: not valid TOML: {err}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: a plan is a JSON object, found {type(raw).__name__}")
    return raw


def load_plan(path: str | Path, run_dir: str | Path, *, profile: str | None = None,
              overrides: list[str] | tuple[str, ...] = ()) -> Plan:
    """Read, expand and check the plan at `path` for a run in `run_dir`; PlanError (one line) for any mistake."""
    path = Path(path)
    raw = read_plan_file(path)
    where = str(path)
    _check_keys(raw, _TOP_KEYS, where)
    if not isinstance(raw.get("jobs"), list) or not raw["jobs"]:
        raise PlanError(f"{where}: `jobs` must be a non-empty list")
    declared, settings = _profiled(raw, profile, where)
    built_in = {"run": str(Path(run_dir).resolve()), "plan_dir": str(path.resolve().parent),
                "python": sys.executable}
    variables = _resolve_variables(declared, _parse_overrides(overrides, declared, where), built_in, where)
    left_out: list[str] = []
    jobs = _expand_jobs(raw["jobs"], variables, where, left_out)
    _check_graph(jobs, where)
    env = _string_map(raw.get("env", {}), f"{where}: env")
    return Plan(name=str(raw.get("name", path.stem)), description=str(raw.get("description", "")), source=where,
                profile=profile, variables=variables, parallel=settings["parallel"],
                train_slots=settings["train_slots"], env=env, jobs=jobs, report=dict(raw.get("report", {})),
                left_out=tuple(left_out))


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise PlanError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _profiled(raw: dict, profile: str | None, where: str) -> tuple[dict, dict[str, int]]:
    """The declared variables and the settings, with `profile` applied."""
    declared = dict(raw.get("variables", {}))
    settings = {**_SETTINGS, **raw.get("settings", {})}
    if profile is not None:
        profiles = raw.get("profiles", {})
        if profile not in profiles:
            known = ", ".join(profiles) or "none"
            raise PlanError(f"{where}: no profile {profile!r} (the plan's profiles: {known})")
        chosen = profiles[profile]
        _check_keys(chosen, {"variables", "settings", "description"}, f"{where}: profile {profile}")
        for name, value in chosen.get("variables", {}).items():
            if name not in declared:
                raise PlanError(f"{where}: profile {profile} sets {name!r}, which the plan's variables do not declare")
            declared[name] = value
        settings.update(chosen.get("settings", {}))
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise PlanError(f"{where}: unknown setting {unknown[0]!r} (settings: {', '.join(_SETTINGS)})")
    for name, value in settings.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"{where}: setting {name} must be a whole number >= 1, got {value!r}")
    return declared, settings


def _default(value: Any) -> Any:
    return value.get("default") if isinstance(value, dict) else value


def _parse_overrides(items: list[str] | tuple[str, ...], declared: dict, where: str) -> dict[str, Any]:
    """`name=value` items of the command line, typed like the variables they set."""
    values: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise PlanError(f"--set {item!r}: expected NAME=VALUE")
        if name not in declared:
            raise PlanError(f"--set {name}: {where} has no variable {name!r} (its variables: "
                            f"{', '.join(declared) or 'none'})")
        current = _default(declared[name])
        if isinstance(current, list):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                value = None
            if not isinstance(value, list):
                raise PlanError(f"--set {name}: a list variable takes a JSON list, e.g. {name}='[\"a\", \"b\"]'")
        elif isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise PlanError(f"--set {name}: expected true or false, got {text!r}")
            value = text.lower() == "true"
        elif isinstance(current, (int, float)):
            try:
                value = type(current)(float(text)) if isinstance(current, int) else float(text)
            except ValueError:
                raise PlanError(f"--set {name}: expected a number, got {text!r}") from None
            if isinstance(current, int) and float(text) != int(float(text)):
                raise PlanError(f"--set {name}: expected a whole number, got {text!r}")
        else:
            value = text
        values[name] = value
    return values


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _axis_object(value: Any) -> bool:
    """An object of a list variable (a matrix axis's value): strings, numbers, booleans or lists of those."""
    return isinstance(value, dict) and all(
        _plain(item) or isinstance(item, list) and all(_plain(i) for i in item) for item in value.values())


def _resolve_variables(declared: dict, overrides: dict, built_in: dict, where: str) -> dict[str, Any]:
    """Every variable's value, references to other variables substituted; required ones must be set."""
    clash = sorted(set(declared) & set(built_in))
    if clash:
        raise PlanError(f"{where}: variable {clash[0]!r} is built in and cannot be declared")
    raw = {name: overrides.get(name, _default(value)) for name, value in declared.items()}
    missing = [name for name, value in raw.items() if value is None]
    if missing:
        helps = [f"{name} ({declared[name]['help']})" if isinstance(declared[name], dict) and
                 declared[name].get("help") else name for name in missing]
        raise PlanError(f"{where}: set {', '.join(helps)} with --set NAME=VALUE")
    for name, value in raw.items():
        items = value if isinstance(value, list) else [value]
        if not all(_plain(item) or isinstance(value, list) and _axis_object(item) for item in items):
            raise PlanError(f"{where}: variable {name} must be a string, number, boolean or list of those (a list "
                            "may hold objects of those and of lists of those: the values of a matrix axis)")
    resolved: dict[str, Any] = dict(built_in)

    def resolve(name: str, chain: tuple[str, ...]) -> Any:
        if name in resolved:
            return resolved[name]
        if name in chain:
            raise PlanError(f"{where}: variables refer to each other in a loop: {' -> '.join(chain + (name,))}")
        if name not in raw:
            raise PlanError(f"{where}: unknown variable ${{{name}}} in variable {chain[-1]}")
        value = raw[name]
        lookup = lambda ref: resolve(ref, chain + (name,))  # noqa: E731
        if isinstance(value, list):
            # Objects are a matrix axis's values: their strings are substituted where the axis is expanded.
            value = [item if isinstance(item, dict) else substitute(str(item), lookup, f"variable {name}")
                     for item in value]
        elif isinstance(value, str):
            value = substitute(value, lookup, f"variable {name}")
        resolved[name] = value
        return value

    for name in raw:
        resolve(name, ())
    return resolved


def _matrix(spec: Any, where: str, lookup) -> list[dict[str, Any]]:
    """The combinations of a job's matrix axes, in order (the last axis varies fastest). An axis given as
    `"${name}"` takes the values of the list variable `name`; an empty one gives no jobs."""
    if spec is None:
        return [{}]
    if not isinstance(spec, dict) or not spec:
        raise PlanError(f"{where}: matrix must map each axis to a non-empty list of values")
    axes = {}
    for axis, values in spec.items():
        name = list_reference(values)
        if name is not None:
            values = variable(name, lookup, f"{where}: matrix axis {axis}: unknown variable ${{{name}}}")
            if not isinstance(values, list):
                raise PlanError(f"{where}: matrix axis {axis}: ${{{name}}} is not a list")
            if not values:
                return []
        if not isinstance(values, list) or not values:
            raise PlanError(f"{where}: matrix must map each axis to a non-empty list of values")
        axes[axis] = values
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]


def _lookup_in(variables: dict, binding: dict):
    def lookup(name: str) -> Any:
        head, _, rest = name.partition(".")
        if head in binding:
            value = binding[head]
            if isinstance(value, dict):
                if not rest:
                    if "name" not in value:
                        raise PlanError(f"${{{name}}}: an object axis value needs a `name` field to stand alone")
                    return value["name"]
                if rest not in value:
                    raise PlanError(f"${{{name}}}: the matrix value has no field {rest!r}")
                return value[rest]
            if rest:
                raise KeyError(name)
            return value
        return variables[name]

    return lookup


def _expand_jobs(entries: list, variables: dict, where: str, left_out: list[str] | None = None) -> dict[str, Job]:
    """The plan's jobs, each matrix combination one job; the names of those a `when` leaves out go to `left_out`."""
    jobs: dict[str, Job] = {}
    for index, entry in enumerate(entries):
        label = f"{where}: job {index + 1}" + (f" ({entry.get('name')})" if isinstance(entry, dict) else "")
        if not isinstance(entry, dict):
            raise PlanError(f"{label}: a job is an object with a name and a command")
        _check_keys(entry, _JOB_KEYS, label)
        actions = [key for key in ACTIONS if key in entry]
        if len(actions) != 1:
            raise PlanError(f"{label}: give exactly one of {', '.join(ACTIONS)}")
        if "name" not in entry:
            raise PlanError(f"{label}: no name")
        kind = entry.get("kind", "task")
        if kind not in KINDS:
            raise PlanError(f"{label}: unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
        plain = _lookup_in(variables, {})
        for binding in _matrix(entry.get("matrix"), label, plain):
            binding = {axis: bind(value, plain, f"{label}: matrix") for axis, value in binding.items()}
            if not _wanted(entry, _lookup_in(variables, binding), label):
                if left_out is not None:
                    left_out.append(substitute(str(entry["name"]), _lookup_in(variables, binding), label))
                continue
            job = _expand_one(entry, actions[0], kind, _lookup_in(variables, binding), label)
            if job.name in jobs:
                raise PlanError(f"{where}: two jobs are named {job.name}")
            jobs[job.name] = job
    return jobs


def _wanted(entry: dict, lookup, label: str) -> bool:
    """The job's `when`, substituted: "true" (or no `when`) keeps it, "false" leaves it out of the plan."""
    when = entry.get("when", True)
    if isinstance(when, bool):
        return when
    value = substitute(str(when), lookup, f"{label}: when")
    if value not in ("true", "false"):
        raise PlanError(f"{label}: when must be true or false once substituted, got {value!r}")
    return value == "true"


def _expand_one(entry: dict, action: str, kind: str, lookup, label: str) -> Job:
    name = substitute(str(entry["name"]), lookup, label)
    if not _NAME.fullmatch(name):
        raise PlanError(f"{label}: job name {name!r} must be letters, digits and . _ + - (it names its log file)")
    label = f"{label.split(': job')[0]}: job {name}"

    def names(key: str) -> tuple[str, ...]:
        items = entry.get(key, [])
        if not isinstance(items, list):
            raise PlanError(f"{label}: {key} must be a list of job names")
        return tuple(item for item in arguments(items, lookup, f"{label}: {key}") if item)

    env = {key: substitute(value, lookup, f"{label}: env")
           for key, value in _string_map(entry.get("env", {}), f"{label}: env").items()}
    body: dict[str, Any] = {}
    if action == "run":
        if not isinstance(entry["run"], list) or not entry["run"]:
            raise PlanError(f"{label}: run must be a non-empty list of arguments")
        command = arguments(entry["run"], lookup, f"{label}: run")
        if not command:
            raise PlanError(f"{label}: run is empty once its variables are substituted")
        body["run"] = tuple(command)
    else:
        body[action] = _action_spec(action, entry[action], lookup, label)
    always, preflight = entry.get("always", False), entry.get("preflight", False)
    if not isinstance(always, bool):
        raise PlanError(f"{label}: always must be true or false")
    if not isinstance(preflight, bool):
        raise PlanError(f"{label}: preflight must be true or false")
    needs, after = names("needs"), names("after")
    if preflight and (body.get("run", ("",))[0] != "hyla" or needs or after):
        raise PlanError(f"{label}: a preflight job runs a hyla command and waits for no other job")
    return Job(name=name, kind=kind, needs=needs, after=after, checked_by=names("checked_by"),
               env=env, always=always, preflight=preflight, **body)


def _action_spec(action: str, spec: Any, lookup, label: str) -> dict[str, Any]:
    fields = {"copy": ({"from", "into"}, {"exclude"}),
              "split_largest": ({"from", "largest", "rest", "count"}, set())}[action]
    if not isinstance(spec, dict):
        raise PlanError(f"{label}: {action} must be an object")
    missing = sorted(fields[0] - set(spec))
    if missing:
        raise PlanError(f"{label}: {action} needs {', '.join(missing)}")
    _check_keys(spec, fields[0] | fields[1], f"{label}: {action}")
    where = f"{label}: {action}"
    if action == "copy":
        sources = spec["from"] if isinstance(spec["from"], list) else [spec["from"]]
        return {"from": arguments(sources, lookup, where), "into": substitute(str(spec["into"]), lookup, where),
                "exclude": arguments(spec.get("exclude", []), lookup, where)}
    count = spec["count"]
    if isinstance(count, str):
        count = substitute(count, lookup, where)
    try:
        count = int(count)
    except ValueError:
        raise PlanError(f"{where}: count must be a whole number, got {count!r}") from None
    if count < 1:
        raise PlanError(f"{where}: count must be at least 1, got {count}")
    return {key: substitute(str(spec[key]), lookup, where) for key in ("from", "largest", "rest")} | {"count": count}


def _string_map(values: Any, where: str) -> dict[str, str]:
    if not isinstance(values, dict):
        raise PlanError(f"{where} must map names to strings")
    out = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise PlanError(f"{where}: {key} must be a string, got {value!r}")
        out[str(key)] = str(value)
    return out


def match_names(patterns: tuple[str, ...] | list[str], names, where: str) -> list[str]:
    """The job names that `patterns` (names or globs) pick, in the plan's order; a pattern that picks none is an
    error."""
    names = list(names)
    picked: list[str] = []
    for pattern in patterns:
        found = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not found:
            raise PlanError(f"{where}: no job matches {pattern!r}")
        picked.extend(name for name in found if name not in picked)
    return picked


def _check_graph(jobs: dict[str, Job], where: str) -> None:
    """`needs`, `after` and `checked_by` name existing jobs (globs expanded in place); no job waits for, or is checked
    by, itself."""
    for name, job in list(jobs.items()):
        needs = match_names(job.needs, jobs, f"{where}: job {name}: needs")
        after = [other for other in match_names(job.after, jobs, f"{where}: job {name}: after") if other != name]
        checked_by = match_names(job.checked_by, jobs, f"{where}: job {name}: checked_by")
        if name in needs:
            raise PlanError(f"{where}: job {name} needs itself")
        if name in checked_by:
            raise PlanError(f"{where}: job {name} is checked by itself")
        jobs[name] = dataclasses.replace(job, needs=tuple(needs), after=tuple(after), checked_by=tuple(checked_by))
    state: dict[str, int] = {}  # 1: on the current path, 2: checked

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            loop = path[path.index(name):] + [name]
            raise PlanError(f"{where}: jobs wait for each other in a loop: {' -> '.join(loop)}")
        state[name] = 1
        for other in (*jobs[name].needs, *jobs[name].after):
            visit(other, path + [name])
        state[name] = 2

    for name in jobs:
        visit(name, [])


def keep_only(plan: Plan, patterns: list[str]) -> Plan:
    """The plan reduced to the jobs `patterns` pick and what they need and are checked by, transitively (their
    `after` orderings are kept among the jobs that stay). A pattern that picks only jobs a `when` left out of the plan
    (say `warm-*` with `warm_engine=false`) is passed over with a note on stderr; one that picks nothing is an
    error."""
    def picks(pattern: str, names) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for name in names)

    kept = []
    for pattern in patterns:
        if not picks(pattern, plan.jobs) and picks(pattern, plan.left_out):
            print(f"--only: {pattern} names only jobs this plan's settings leave out (their `when`): passed over",
                  file=sys.stderr)
        else:
            kept.append(pattern)
    wanted: set[str] = set()
    stack = match_names(kept, plan.jobs, "--only")
    if not stack:
        raise PlanError("--only: every pattern names only jobs this plan's settings leave out")
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend((*plan.jobs[name].needs, *plan.jobs[name].checked_by))
    jobs = {name: dataclasses.replace(job, after=tuple(n for n in job.after if n in wanted))
            for name, job in plan.jobs.items() if name in wanted}
    return dataclasses.replace(plan, jobs=jobs)
