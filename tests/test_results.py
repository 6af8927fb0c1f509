"""specnb.study.results: tables and numbers go to figures/, and conclusions are rendered from the file, not memory."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from specnb.study.results import Results


def test_render_reads_the_results_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    results = Results("42", "smoke")
    results.table("grid", pd.DataFrame({"k": [1, 2], "tokens_per_call": [1.5, 2.0]}))
    results.add(tokens_per_call=np.float32(1.75), missing=math.nan, shape=(4, 2), by_k={1: 0.5, 16: 2.5})
    results.paper(tokens_per_call=2.1)
    original = results.write

    def tampered():  # the file, not the object, is what the conclusion states
        path = original()
        values = json.loads(path.read_text())
        values["ours"]["tokens_per_call"] = 9.0
        path.write_text(json.dumps(values))
        return path

    results.write = tampered
    text = results.render("ours {ours[tokens_per_call]:.2f} vs paper {paper[tokens_per_call]}, "
                          "{ours[missing]:.1f}, shape {ours[shape][0]}x{ours[shape][1]}, k=16: {ours[by_k][16]}").data
    assert text.startswith("ours 9.00 vs paper 2.1, nan, shape 4x2, k=16: 2.5")
    assert "42_results.json" in text and "smoke profile" in text
    saved = json.loads((tmp_path / "42_results.json").read_text())
    assert saved["tables"] == ["42_grid.csv"] and saved["wall_seconds"] >= 0
    assert pd.read_csv(tmp_path / "42_grid.csv").tokens_per_call.tolist() == [1.5, 2.0]


def test_a_template_naming_an_unrecorded_number_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    with pytest.raises(KeyError):
        Results("42", "smoke").render("{ours[typed_by_hand]}")


def test_an_interrupted_write_keeps_the_previous_table_whole(tmp_path, monkeypatch):
    """Tables, results files and figures are written to a temporary sibling and renamed into place: a run
    stopped mid-write leaves the last complete file, not half of a new one."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    results = Results("42", "smoke")
    results.table("grid", pd.DataFrame({"k": [1, 2]}))
    written = {p.name: p.read_text() for p in tmp_path.rglob("*.csv")}
    assert len(written) == 1

    def stopped(self, target, *args, **kwargs):
        with open(target, "w") as f:
            f.write("k\n1\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", stopped)
    with pytest.raises(KeyboardInterrupt):
        results.table("grid", pd.DataFrame({"k": [3, 4, 5]}))
    assert {p.name: p.read_text() for p in tmp_path.rglob("*.csv")} == written  # no partial file left either
