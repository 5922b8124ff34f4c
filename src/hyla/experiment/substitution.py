"""`${...}` substitution in plan values: variables and matrix fields when the plan is read, `${json:PATH#key}`
when a job starts (see hyla.experiment.plan)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_REFERENCE = re.compile(r"\$(\$|\{([^}]*)\})")


class PlanError(ValueError):
    """A mistake in a plan file or in what the command line sets: one line, reported before anything runs."""


def text_of(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(text_of(item) for item in value)
    return str(value)


def substitute(text: str, lookup, where: str) -> str:
    """`text` with every `${name}` replaced by `lookup(name)` (lists joined with commas); `${json:...}` is kept
    for the runner to read when the job starts."""

    def replace(match: re.Match) -> str:
        if match.group(1) == "$":
            return "$$"  # unescaped by `finish`, after the late references are read
        name = match.group(2)
        if name.startswith("json:"):
            _parse_json_reference(name, where)
            return match.group(0)
        try:
            return text_of(lookup(name))
        except KeyError:
            raise PlanError(f"{where}: unknown variable ${{{name}}}") from None

    return _REFERENCE.sub(replace, text)


def finish(text: str, run_dir: Path) -> str:
    """A substituted argument made final: `${json:PATH#key}` read from the run folder, `$$` made `$`."""

    def replace(match: re.Match) -> str:
        if match.group(1) == "$":
            return "$"
        path, keys = _parse_json_reference(match.group(2), "a job argument")
        source = run_dir / path
        try:
            value: Any = json.loads(source.read_text())
            for key in keys:
                value = value[key] if isinstance(value, dict) else value[int(key)]
        except (OSError, json.JSONDecodeError) as err:
            raise FileNotFoundError(f"${{{match.group(2)}}}: cannot read {source}: {err}") from None
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"${{{match.group(2)}}}: {source} has no {'.'.join(keys)}") from None
        return text_of(value)

    return _REFERENCE.sub(replace, text)


def _parse_json_reference(reference: str, where: str) -> tuple[str, list[str]]:
    path, sep, keys = reference.removeprefix("json:").partition("#")
    if not path or not sep or not keys:
        raise PlanError(f"{where}: ${{{reference}}}: expected ${{json:PATH#key.key}}")
    return path, keys.split(".")


def arguments(items: list, lookup, where: str) -> list[str]:
    """Substituted arguments; an item that is exactly `${name}` of a list becomes its items."""
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise PlanError(f"{where}: arguments must be strings or numbers, got {item!r}")
        item = str(item)
        name = list_reference(item)
        if name is not None:
            value = variable(name, lookup, f"{where}: unknown variable {item}")
            if isinstance(value, list):
                out.extend(text_of(v) for v in value)
                continue
        out.append(substitute(item, lookup, where))
    return out


def list_reference(value: Any) -> str | None:
    """The variable's name when `value` is exactly `${name}` (a list argument spliced, a matrix axis from a list variable)."""
    whole = _REFERENCE.fullmatch(value) if isinstance(value, str) else None
    return whole.group(2) if whole and whole.group(2) and not whole.group(2).startswith("json:") else None


def variable(name: str, lookup, unknown: str) -> Any:
    """The value of variable `name`; PlanError(`unknown`) if the plan has none."""
    try:
        return lookup(name)
    except KeyError:
        raise PlanError(unknown) from None


def bind(value: Any, lookup, where: str) -> Any:
    """A matrix value with the plan's variables substituted in its strings (objects and lists included)."""
    if isinstance(value, dict):
        return {key: bind(item, lookup, where) for key, item in value.items()}
    if isinstance(value, list):
        return arguments(value, lookup, where)
    if isinstance(value, str):
        return substitute(value, lookup, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{where}: matrix values are strings, numbers, lists or objects of those, got {value!r}")
    return value
