"""pyproject.toml declares what the code imports, with the lower bounds that CI pins and tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# Declared without hyla importing them: transformers imports them for hyla (GGUF teachers, lm-eval's HF model);
# the tests import pytest.
NOT_IMPORTED_BY_HYLA = {"gguf", "accelerate", "pytest"}
# Distribution name -> the module hyla imports, where they differ beyond "-" and "_".
MODULES = {"fla-core": "fla"}


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [item for items in project["optional-dependencies"].values() for item in items]
    return [Requirement(item) for item in project["dependencies"] + extras if not item.startswith("hyla[")]


def pinned() -> dict[str, Version]:
    lines = (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(name): Version(version) for name, version in pins}


def test_every_lower_bound_is_the_version_ci_pins():
    pins = pinned()
    for requirement in declared():
        bounds = {spec.operator: Version(spec.version) for spec in requirement.specifier}
        name = canonicalize_name(requirement.name)
        # "==" is pinned in pyproject.toml itself; torch's floor is the GPU machine's (CI has the CPU 2.13.0 only).
        if "==" in bounds or ">=" not in bounds or name == "torch":
            continue
        pin = pins.get(name)
        assert pin == bounds[">="], f"{name}: lower bound {bounds['>=']}, constraints/cpu.txt pins {pin}"


def test_every_declared_dependency_is_imported():
    sources = [path.read_text() for path in (ROOT / "src" / "hyla").rglob("*.py")]
    for requirement in declared():
        if requirement.name in NOT_IMPORTED_BY_HYLA:
            continue
        module = MODULES.get(requirement.name, requirement.name.replace("-", "_"))
        pattern = re.compile(rf"^\s*(import|from) {module}(\.|\s|$)", re.MULTILINE)
        assert any(pattern.search(source) for source in sources), f"{requirement.name} is declared, never imported"


def test_the_package_version_is_the_one_pyproject_declares():
    from hyla.version import __version__

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__
