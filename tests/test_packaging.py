"""pyproject.toml and environment.yml list the same dependencies (runtime + dev extras)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement.split("#")[0]).lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_normalise(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    listed = {_normalise(line.strip()[2:]) for line in lines[start + 1:] if line.strip().startswith("- ")}
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject: {wanted - listed}"


def test_nodeps_requirements_are_pinned():
    lines = [ln for ln in (ROOT / "requirements-nodeps.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines and all("==" in ln for ln in lines)
