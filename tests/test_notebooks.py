"""Every numbered notebook runs end to end under papermill with profile=smoke (tiny models, seconds)."""

from __future__ import annotations

import json

import pytest

from specnb.notebooks import find_notebooks, run_notebooks

NOTEBOOKS = find_notebooks()


def test_there_are_notebooks():
    assert any(p.name == "00_quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_with_smoke_profile(path, tmp_path, monkeypatch):
    source = json.loads(path.read_text())
    tagged = [c for c in source["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert tagged and "profile" in "".join(tagged[0]["source"]), "needs a tagged parameters cell with profile"
    assert all(not c.get("outputs") for c in source["cells"] if c["cell_type"] == "code"), "commit without outputs"
    monkeypatch.setattr("specnb.notebooks.figures_for", lambda profile: tmp_path / "figures")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel inherits it: tiny models run best on one thread
    [(executed, _)] = run_notebooks("smoke", [path.stem], output_dir=tmp_path)
    assert executed.exists()
    assert list((tmp_path / "figures").glob("*.png")), "a notebook should save at least one figure"
