"""The study's front page (figures/README.md, a study run's README.md) and what the published run may hold: the
verdicts counted per source with internal checks apart, each figure with its takeaway, the notation once, the
machine last; no name of a file that is not there, no table that is a byte-identical twin of a figure's CSV, no
progress bar frozen at its first state, and no cause citing a number its results file does not hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from specnb.study.reference_run import final_progress, index, publish, publish_beside, retire_unsaved
from specnb.study.results import Results, uncited
from specnb.study.verdicts import Comparison, Expect

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
PUBLISHED = sorted(FIGURES.glob("[0-9][0-9]_results.json"))


def _record(against: str, low: float, high: float, internal: bool = False, direction_only: bool = False) -> dict:
    return Comparison("a claim", (low + high) / 2, low, high, Expect.above(1.0, 0.02), against, "a cause",
                      internal=internal, direction_only=direction_only).record()


def _run(folder: Path, profile: str = "quick", failed: tuple[str, ...] = (), not_run: tuple[str, ...] = ()) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "RUN.json").write_text(json.dumps({
        "profile": profile, "commit": "abc1234", "dirty": False, "date": "2026-01-01 00:00 UTC", "total_minutes": 1.0,
        "machine": {"cpu": "A CPU", "cores": 2, "cpu_class": "avx2", "flags": ["avx2"], "torch": "2.x"},
        "failed": list(failed), "not_run": list(not_run)}))


def test_the_front_page_counts_sources_apart_then_figures_verdicts_notation_machine(tmp_path):
    _run(tmp_path)
    verdicts = {"a": _record("DReSD Fig. 4", 1.1, 1.3, direction_only=True),  # agrees, direction only
                "b": _record("DReSD Table 3", 0.5, 0.9),  # disagrees
                "c": _record("DReSD §5.3", 0.99, 1.3),  # inconclusive, leaning agrees
                "d": _record("AR (ours)", 1.1, 1.2, internal=True),
                "e": _record("ArcticInference docs", 0.9, 1.03)}  # inconclusive, leaning disagrees
    (tmp_path / "00_results.json").write_text(json.dumps({"verdicts": verdicts, "takeaways": {
        "00_speed": "prompt lookup ×1.50 over AR"}}))
    for name in ("00_speed", "00_other"):
        (tmp_path / f"{name}.png").write_bytes(b"png")
    (tmp_path / "titles.json").write_text(json.dumps({"00_other": "a title", "00_speed": "its title",
                                                      "05_gone": "a figure no longer drawn"}))
    page = index(tmp_path)
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert headings == ["## Figures", "## Verdicts", "## Notation", "## Setup and machine"]
    assert page.index("| DReSD | 3 | 1 (1) | 1 | 1 (1 / 0) | 0 |") < page.index("## Figures")
    assert "| other published sources | 1 | 0 (0) | 0 | 1 (0 / 1) | 0 |" in page
    assert "| internal checks (ours) | 1 | 1 (0) | 0 | 0 (0 / 0) | 0 |" in page and "| checks |" in page
    assert "[`00_speed.png`](00_speed.png) — prompt lookup ×1.50 over AR" in page  # the takeaway
    assert "[`00_other.png`](00_other.png) — a title" in page  # no takeaway: the title
    assert "**agrees (direction only)**" in page and "**inconclusive, leans agrees**" in page
    assert "**agrees; internal**" in page
    assert page.count("`> 1 + 0.02`") == 1 and "| `TIE` | 0.02 |" in page  # notation and tolerances, once
    assert page.rstrip().endswith("`specnb figures compare OLD NEW` lists what moved between two runs.")
    assert "05_gone" not in page


def test_a_figure_a_rerun_did_not_save_is_retired_and_nothing_else(tmp_path):
    """After notebook 04 reruns, a figure of 04 an earlier run saved (named in titles.json) that this run did not
    save again (it said a constant series in words) goes with its CSV and title; 04's figures saved again, another
    notebook's old figure and a file no run saved (not in titles.json) stay."""
    import os

    titles = {"04_kept": "t", "04_stale": "t", "05_old": "t"}
    (tmp_path / "titles.json").write_text(json.dumps(titles))
    for name in ("04_stale", "05_old", "04_mine"):
        for suffix in (".png", ".csv"):
            (tmp_path / f"{name}{suffix}").write_text("earlier")
            os.utime(tmp_path / f"{name}{suffix}", (1_000, 1_000))
    since = 2_000.0
    (tmp_path / "04_kept.png").write_text("this run")
    os.utime(tmp_path / "04_kept.png", (3_000, 3_000))
    assert retire_unsaved(tmp_path, "04_sparse_compaction", since) == ["04_stale"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["04_kept.png", "04_mine.csv", "04_mine.png", "05_old.csv",
                                                          "05_old.png", "titles.json"]
    assert json.loads((tmp_path / "titles.json").read_text()) == {"04_kept": "t", "05_old": "t"}
    assert retire_unsaved(tmp_path, "04_sparse_compaction", since) == []


def test_a_table_twin_of_a_figure_csv_is_not_kept(tmp_path, monkeypatch):
    """A table the run wrote whose bytes equal a figure's CSV written by the same run goes; a CSV the run did not
    write stays, whatever its bytes."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    frame = pd.DataFrame({"k": [1, 2], "tokens_per_call": [1.5, 2.0]})
    frame.to_csv(tmp_path / "42_old.csv", index=False)  # an earlier run's: not this run's to delete
    report = Results("42", "smoke")
    report.table("summary", frame)
    report.table("other", frame.assign(k=[3, 4]))
    report.table("old", frame)  # rewritten by this run, but no figure shares its bytes... until one does
    frame.to_csv(tmp_path / "42_speed.csv", index=False)
    (tmp_path / "42_speed.png").write_bytes(b"png")
    report.write()
    assert not (tmp_path / "42_summary.csv").exists() and not (tmp_path / "42_old.csv").exists()
    assert (tmp_path / "42_other.csv").exists() and (tmp_path / "42_speed.csv").exists()
    assert json.loads(report.path.read_text())["tables"] == ["42_other.csv"]


def test_a_published_progress_bar_shows_its_final_state():
    state = {"bar": {"state": {"children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]}},
             "l": {"state": {"value": "prompts:\u2007100%"}}, "p": {"state": {"value": 10.0, "max": 10.0}},
             "r": {"state": {"value": "\u200710/10\u2007[00:59&lt;00:00]"}}}
    view = "application/vnd.jupyter.widget-view+json"
    notebook = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": state}}},
                "cells": [{"cell_type": "code", "source": "", "outputs": [
                    {"output_type": "display_data", "metadata": {},
                     "data": {view: {"model_id": "bar"}, "text/plain": ["prompts:   0%|   | 0/10"]}},
                    {"output_type": "display_data", "metadata": {}, "data": {view: {"model_id": "lost"}}},
                    {"output_type": "stream", "name": "stdout", "text": "kept\n"}]}]}
    final_progress(notebook)
    outputs = notebook["cells"][0]["outputs"]
    assert outputs[0]["data"] == {"text/plain": ["prompts: 100%|██████████| 10/10 [00:59<00:00]"]}
    assert outputs[1]["text"] == "kept\n" and len(outputs) == 2 and "widgets" not in notebook["metadata"]


def test_a_paper_run_is_published_beside_the_reference_run(tmp_path):
    """figures/paper/: the executed notebooks (the parameters cell kept: it says the profile) in its own
    notebooks/ folder, stamped; its own front page; a run of another profile or with a failure is refused."""
    executed, figures = tmp_path / "executed", tmp_path / "paper"
    executed.mkdir()
    _run(figures, "paper")
    for publishes in (lambda: publish_beside(executed, figures, "paper"),
                      lambda: publish(executed, tmp_path / "notebooks", figures)):
        with pytest.raises(ValueError, match="no executed notebooks in .*specnb notebooks run"):
            publishes()  # nothing executed yet (a fresh clone): nothing written
    assert not (figures / "README.md").exists()
    cells = [{"cell_type": "code", "source": 'profile = "paper"', "outputs": [],
              "metadata": {"tags": ["injected-parameters"], "papermill": {"duration": 1.0}}},
             {"cell_type": "code", "source": "x = 1", "outputs": [], "metadata": {}}]
    (executed / "00_a.ipynb").write_text(json.dumps({"metadata": {"papermill": {}}, "cells": cells}))
    (executed / "notes.ipynb").write_text("{}")  # not a numbered notebook: left alone
    _run(figures, "paper", failed=("01_b.ipynb",))
    with pytest.raises(ValueError, match="failed"):
        publish_beside(executed, figures, "paper")
    _run(figures, "quick")
    with pytest.raises(ValueError, match="profile quick"):
        publish_beside(executed, figures, "paper")
    _run(figures, "paper")
    raised = dict(cells[1], outputs=[{"output_type": "error", "ename": "FigureLayoutError", "evalue": "overlap",
                                      "traceback": []}])
    (executed / "00_a.ipynb").write_text(json.dumps({"metadata": {"papermill": {}}, "cells": [cells[0], raised]}))
    with pytest.raises(ValueError, match="00_a.ipynb failed .FigureLayoutError"):  # rerun alone: RUN.json as it was
        publish_beside(executed, figures, "paper")
    (executed / "00_a.ipynb").write_text(json.dumps({"metadata": {"papermill": {}}, "cells": cells}))
    assert publish_beside(executed, figures, "paper") == [figures / "notebooks" / "00_a.ipynb"]
    done = json.loads((figures / "notebooks" / "00_a.ipynb").read_text())
    assert [c["source"] for c in done["cells"]] == ['profile = "paper"', "x = 1"]
    assert "papermill" not in done["metadata"] and "papermill" not in done["cells"][0]["metadata"]
    assert done["metadata"]["specnb"]["profile"] == "paper" and done["metadata"]["specnb"]["commit"] == "abc1234"
    page = (figures / "README.md").read_text()
    assert page.startswith("# The paper-profile run\n") and "`notebooks/NN_*.ipynb` in this folder" in page
    _run(figures, "paper", not_run=("01_hidden_states", "09_end_to_end"))  # a partial run: published, it says so
    publish_beside(executed, figures, "paper")
    page = (figures / "README.md").read_text()
    assert page.startswith("# The paper-profile run (partial: 2 notebooks not run yet)")
    assert "### 01_hidden_states.ipynb\n\nNot run yet at this profile" in page
    assert "### 09_end_to_end.ipynb\n\nNot run yet at this profile" in page
    _run(figures, "paper", not_run=("09_end_to_end",))
    publish_beside(executed, figures, "paper")
    assert (figures / "README.md").read_text().startswith("# The paper-profile run (partial: 1 notebook not run yet)")
    run = json.loads((figures / "RUN.json").read_text())  # a notebook rerun since: the provenance says when
    (figures / "RUN.json").write_text(json.dumps({**run, "rerun": {"00_a": {"commit": "def5678",
                                                                            "date": "2026-01-02 00:00 UTC"}}}))
    publish_beside(executed, figures, "paper")
    assert "(rerun alone since: 00_a at `def5678` on 2026-01-02 00:00 UTC)" in (figures / "README.md").read_text()
    _run(figures, "quick", not_run=("09_end_to_end",))  # the reference run: whole or not at all
    with pytest.raises(ValueError, match="not run yet: 09_end_to_end"):
        publish(executed, tmp_path / "notebooks", figures)


# ----------------------------------------------------------------------------- the published run itself


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_every_cause_cites_only_numbers_its_results_file_holds(path):
    assert uncited(json.loads(path.read_text())) == []


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_every_comparison_says_what_kind_of_test_it_is(path):
    for key, record in json.loads(path.read_text())["verdicts"].items():
        assert {"internal", "direction_only", "evidence", "lean"} <= set(record), key


def test_the_published_front_page_is_rendered_and_names_only_files_that_exist():
    page = (FIGURES / "README.md").read_text()
    assert page == index(FIGURES)
    named = set(re.findall(r"\b(\d\d_[\w.-]+?\.(?:png|csv))\b", page))
    named |= {f"{stem}.png" for stem in json.loads((FIGURES / "titles.json").read_text())}
    assert sorted(name for name in named if not (FIGURES / name).exists()) == []


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.name for p in PUBLISHED])
def test_no_published_table_is_a_twin_of_a_figure_csv(path):
    prefix = path.name[:2]
    figures = {f.read_bytes(): f.name for f in FIGURES.glob(f"{prefix}_*.csv") if f.with_suffix(".png").exists()}
    tables = json.loads(path.read_text())["tables"]
    assert [t for t in tables if (FIGURES / t).exists() and (FIGURES / t).read_bytes() in figures
            and t != figures[(FIGURES / t).read_bytes()]] == []


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.name)
def test_no_published_notebook_keeps_a_progress_widget(path):
    notebook = json.loads(path.read_text())
    views = [o for c in notebook["cells"] for o in c.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views == [] and "widgets" not in notebook["metadata"]


def test_every_published_figure_states_its_finding_not_its_title():
    """Each figure's front-page line is a takeaway rendered from its results file, not the figure's title."""
    missing = [png.name for png in sorted(FIGURES.glob("[0-9][0-9]_*.png"))
               if (results := FIGURES / f"{png.name[:2]}_results.json").exists()
               and png.stem not in json.loads(results.read_text()).get("takeaways", {})]
    assert missing == []


def test_takeaways_render_the_results_files_numbers(tmp_path, monkeypatch):
    from specnb.experiments import beyond, compaction, shapes

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("42", "smoke")
    picks = pd.DataFrame({"set": ["code"] * 4 + ["chat"] * 2, "prompt_id": ["p"] * 6,
                          "picked": ["pld", "pld+suffix", "pld", "-", "-", "-"]})
    report.add(picked=beyond.member_shares(picks), picked_alone=beyond.member_shares(picks, merged=False))
    beyond.picks_takeaway(report, picks)
    grids = pd.DataFrame({"family": ["mixed", "REST"], "set": ["HumanEval"] * 2, "k": [1, 4], "w": [8, 2],
                          "est_speedup": [2.35, 0.9], "est_speedup_low": [2.0, 0.8], "est_speedup_high": [2.7, 1.0],
                          "tokens_per_call": [3.1, 3.4]})
    report.add(**shapes.grid_headlines(grids))
    shapes.grid_takeaways(report, grids)
    cumulative = pd.DataFrame({"task": "code", "n": [1, 1, 2, 2], "fraction_of_ngrams": [0.001, 0.1] * 2,
                               "fraction_of_occurrences": [0.2, 0.8, 0.1, 0.4]})
    compaction.takeaways(report, cumulative)
    takeaways = json.loads(report.write().read_text())["takeaways"]
    assert takeaways["10_router_picks"] == ("auto's most used member (a call merging two members' trees counted half "
                                            "to each): prompt lookup drafted 62% of calls on code, 50% alone (no "
                                            "draft: 25%); no member drafted on chat")
    assert takeaways["08_grid_est_speedup"].startswith("the fastest estimated shape: mixed (1, 8) at ×2.35 (2.00–2.70)")
    assert takeaways["08_grid_tokens_per_call"] == "the most tokens per call: REST (4, 2) with 3.40 on HumanEval"
    assert "25% of occurrences for n = 1" in takeaways["04_ngram_cumulative_frequency"]
