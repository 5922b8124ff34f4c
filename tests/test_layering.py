"""Imports run down the layers only (README, "Layout"): ops -> layers -> inference -> models -> evals -> data ->
train, analysis -> convert -> bench, experiment, with the command line (every area's `cli.py`) on top.

The check reads the source, function-level imports included, so it holds on code paths that no test runs. Imports
under `if TYPE_CHECKING:` are left out: they name types for the checker and never run.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hyla"

# Lowest first. A module may import its own area and the areas of lower tiers; areas of one tier not each other.
TIERS = (
    ("version",),
    ("validation", "outputs", "compile", "progress"),
    ("ops",),
    ("layers",),
    ("inference",),
    ("models",),
    ("evals",),
    ("data",),
    ("train", "analysis"),
    ("convert",),
    ("bench", "experiment"),
    ("cli",),
)
RANK = {area: rank for rank, tier in enumerate(TIERS) for area in tier}
# `import hyla` runs hyla/__init__.py, which imports the models (and the inference engine below them).
ROOT_AREA = "models"


def area_of(path: Path) -> str:
    """The area of a module of the package: its top-level folder or file; "cli" for the command line and for the
    package's front door (hyla/__init__.py, which may gather any area)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return "cli" if parts[-1] == "cli" or parts == ("__init__",) else parts[0]


def imported_areas(source: str) -> list[tuple[int, str]]:
    """(line, area) of every hyla import that runs, at module level or inside a function."""
    found = []
    for node in _running_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for parts in (module.split(".") for module in modules):
            if parts[0] == "hyla":
                area = ROOT_AREA if len(parts) == 1 else "cli" if parts[-1] == "cli" else parts[1]
                found.append((node.lineno, area))
    return found


def _running_nodes(node: ast.AST):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.orelse:
                yield statement
                yield from _running_nodes(statement)
            continue
        yield child
        yield from _running_nodes(child)


def _is_type_checking(test: ast.expr) -> bool:
    name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
    return name == "TYPE_CHECKING"


def test_the_scan_sees_function_level_imports_and_skips_type_checking_ones():
    source = textwrap.dedent("""
        from typing import TYPE_CHECKING
        import hyla
        from hyla.ops import dispatch
        if TYPE_CHECKING:
            from hyla.convert import pipeline
        def load():
            from hyla.train.loop import run
            import hyla.evals.cli
    """)
    assert imported_areas(source) == [(3, "models"), (4, "ops"), (8, "train"), (9, "cli")]


def test_every_area_has_a_tier():
    areas = {area_of(path) for path in PACKAGE.rglob("*.py")}
    assert areas <= set(RANK), f"areas without a tier: {sorted(areas - set(RANK))}"


def test_no_import_runs_up_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        area = area_of(path)
        for line, target in imported_areas(path.read_text()):
            if area != "cli" and target != area and RANK[target] >= RANK[area]:
                upward.append(f"{path.relative_to(PACKAGE)}:{line}: {area} imports {target}")
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)
