"""Settings checked before any work starts: every field of a settings dataclass is type-checked from its annotation
(so a field added later is checked too), ranges come from one table of rules per command, and an unknown name is
answered with the closest known ones.

A rule is a function of the value that returns what is wrong with it ("must be >= 1") or None.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import sys
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

Rule = Callable[[Any], "str | None"]
NONE_WORDS = ("none", "off", "null")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the known name closest to `name`, or "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def at_least(low: float) -> Rule:
    return lambda value: None if value >= low else f"must be >= {low:g}"


def greater_than(low: float) -> Rule:
    return lambda value: None if value > low else f"must be > {low:g}"


def one_of(*choices: str) -> Rule:
    return lambda value: None if value in choices else f"must be one of {', '.join(choices)}"


def one_of_or_close(*choices: str) -> Rule:
    """`one_of`, naming the closest choice when the value looks like a typo of one."""
    return lambda value: (None if value in choices
                          else f"must be one of {', '.join(choices)}{did_you_mean(value, choices)}")


def each(rule: Rule, *, allow_empty: bool = False) -> Rule:
    """A rule for every item of a list (None items pass: the annotation says whether they may be None); an empty
    list fails unless `allow_empty` (a list whose emptiness means "off" or "none")."""
    def check(values: list) -> str | None:
        if not values and not allow_empty:
            return "must not be empty"
        for item in values:
            problem = None if item is None else rule(item)
            if problem:
                return f"item {item!r} {problem}"
        return None

    return check


def _parts(annotation: Any) -> tuple[Any, list[Any]]:
    """(origin, args) of an annotation, with `X | None` and Optional[X] both as (Union, [X, NoneType])."""
    origin = typing.get_origin(annotation)
    if origin is types.UnionType:
        origin = typing.Union
    return origin, list(typing.get_args(annotation))


def describe(annotation: Any) -> str:
    origin, args = _parts(annotation)
    if origin is typing.Union:
        return " or ".join(describe(a) for a in args)
    if origin is list:
        return f"a comma-separated list of {describe(args[0])}" if args else "a list"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "text", type(None): "none"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def coerce(value: Any, annotation: Any) -> Any:
    """`value` checked against the annotation (an int passes where a float is wanted; a whole float becomes an int
    where an int is wanted); ValueError naming the expected type otherwise. Annotations this does not know (dicts, paths) pass through."""
    origin, args = _parts(annotation)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg)
            except ValueError:
                continue
        raise ValueError(f"expected {describe(annotation)}, got {value!r}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected {describe(annotation)}, got {value!r}")
        return [coerce(item, args[0]) for item in value] if args else list(value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ValueError(f"expected a finite number, got {value!r}")
            # An int stays an int: a stage's settings hash has always held `--set distill.lr=1` as 1.
            return value
    elif annotation is str:
        if isinstance(value, str):
            return value
    elif annotation is type(None):
        if value is None:
            return None
    else:
        return value
    raise ValueError(f"expected {describe(annotation)}, got {value!r}")


def parse_text(text: str, annotation: Any) -> Any:
    """A command-line value (`--set field=TEXT`) as the annotation's type."""
    origin, args = _parts(annotation)
    allows_none = origin is typing.Union and type(None) in args
    if allows_none and text.strip().lower() in NONE_WORDS:
        return None
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            try:
                return parse_text(text, inner[0])
            except ValueError:
                raise ValueError(f"expected {describe(annotation)}, got {text!r}") from None
    if origin is list:
        item_type = args[0] if args else str
        return [parse_text(item.strip(), item_type) for item in text.split(",") if item.strip()]
    if annotation is bool:
        if text.strip().lower() in ("true", "false"):
            return text.strip().lower() == "true"
        raise ValueError(f"expected true or false, got {text!r}")
    if annotation is str:
        return text
    return coerce(_scalar(text, annotation), annotation)


def _scalar(text: str, annotation: Any) -> Any:
    if text.strip().lower() in NONE_WORDS:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"expected {describe(annotation)}, got {text!r}") from None


def field_types(cls: type) -> dict[str, Any]:
    """Each dataclass field's annotation, resolved (modules use `from __future__ import annotations`); Any for one
    that does not resolve (a name its module imports only for type checking)."""
    try:
        hints = typing.get_type_hints(cls)
    except NameError:
        hints = {}
        for klass in reversed(cls.__mro__):
            namespace = vars(sys.modules.get(klass.__module__, None) or object())
            for name, annotation in vars(klass).get("__annotations__", {}).items():
                try:
                    hints[name] = eval(annotation, dict(namespace)) if isinstance(annotation, str) else annotation
                except Exception:  # noqa: BLE001  an unresolvable annotation is left unchecked
                    hints[name] = Any
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def check_fields(settings: Any, rules: dict[str, Rule], prefix: str = "") -> None:
    """Type-check every field of the dataclass instance `settings` (in place: whole floats become ints where an int
    is wanted) and apply the rule for `prefix.field` or, failing that, for `field`. ValueError names the setting."""
    for name, annotation in field_types(type(settings)).items():
        label = f"{prefix}.{name}" if prefix else name
        value = getattr(settings, name)
        if dataclasses.is_dataclass(value):
            continue
        try:
            value = coerce(value, annotation)
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None
        setattr(settings, name, value)
        rule = rules.get(label) or rules.get(name)
        problem = rule(value) if rule is not None and value is not None else None
        if problem:
            shown = f": {problem} (in {value!r})" if isinstance(value, list) else f" {problem}, got {value!r}"
            raise ValueError(label + shown)
