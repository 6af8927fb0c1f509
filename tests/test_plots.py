"""The one figure style (specnb.study.plots): one colour and name per method, sorted bars with values and intervals,
shared colour scales, and the layout audit that fails a figure a reader would trip over."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from specnb.eval.checks import DegenerateData
from specnb.study import plots


def test_every_label_of_a_method_gets_its_colour():
    assert plots.method_of("DReSD-OOD 10x6") == "dense"
    assert plots.method_of("DReSD-OOD 10x6 votes priced") == "dense-priced"
    assert plots.method_of("REST-ID") == "rest"
    assert plots.method_of("prompt lookup") == "pld" and plots.method_of("pld") == "pld"
    assert plots.method_of("mixed (10,10)") == "mixed" and plots.method_of("mixed-adaptive") == "mixed-adaptive"
    assert plots.method_of("crest-priced") == "crest-priced" and plots.method_of("CREST") == "crest"
    assert plots.style("dense").label == "DReSD" and plots.style("DReSD-OOD 10x6").label == "DReSD-OOD 10x6"
    assert plots.color("REST-OOD") == plots.color("rest") != plots.color("crest")
    with pytest.raises(KeyError, match="add it to specnb.study.plots.COLORS"):
        plots.method_of("a method nobody mapped")
    colors = [s.color for s in plots.STYLES.values()]
    assert len(colors) == len(set(colors)), "two methods share a colour"


def test_display_names_come_from_the_method_registry():
    """Every method of the registry has a colour, and its figures' name is the registry's label, in the legends'
    order of before the registry."""
    from specnb.eval.methods import METHODS

    assert set(METHODS) <= set(plots.COLORS)
    assert all(plots.STYLES[name].label == method.label for name, method in METHODS.items())
    assert [(key, s.label) for key, s in plots.STYLES.items()] == [
        ("ar", "AR (ours)"), ("hf", "HF generate"), ("hf-pld", "HF prompt lookup"), ("hf-assisted", "HF assisted"),
        ("llamacpp", "llama.cpp"), ("llamacpp-pld", "llama.cpp lookup"), ("pld", "prompt lookup"),
        ("ngram-unigram", "model unigram"), ("ngram-bigram", "model bigram"), ("mixed", "mixed"),
        ("mixed-adaptive", "mixed, adaptive"), ("rest", "REST"), ("rest-priced", "REST, priced"), ("crest", "CREST"),
        ("crest-priced", "CREST, priced"), ("dense", "DReSD"), ("dense-id", "DReSD, ID store"),
        ("dense-priced", "DReSD, priced"), ("sd", "SD"), ("mcsd", "MCSD"), ("suffix", "SuffixDecoding"),
        ("recycle", "Token Recycling"), ("auto", "auto (router)"), ("-", "no draft"), ("merged", "two members merged")]


def test_bars_are_sorted_labelled_and_carry_their_interval():
    fig, ax = plt.subplots()
    plots.hbars(ax, ["pld", "rest", "auto"], [1.2, 0.8, 2.0], [1.1, 0.7, 1.8], [1.3, 0.9, 2.2], reference=1.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["REST", "prompt lookup", "auto (router)"]
    assert sorted(t.get_text() for t in ax.texts) == ["0.80", "1.20", "2.00"]
    assert plots.layout_problems(fig) == []
    with pytest.raises(DegenerateData, match="constant"):
        plots.hbars(ax, ["pld", "rest"], [1.0, 1.0])
    fig, ax = plt.subplots()
    plots.hbars(ax, ["pld", "rest"], [-0.2, 0.3], reference=0.8)  # a loss, a gain, a reference past both
    lo, hi = ax.get_xlim()
    assert lo < -0.2 and hi > 0.8 and plots.layout_problems(fig) == []
    plt.close("all")


def test_bars_on_panels_sharing_x_keep_every_panels_labels_in_view():
    """Panels sharing their x axis: a later panel with shorter bars must not shrink the axis under an earlier
    panel's labels (which then ran into the next panel's tick labels: notebook 06's timed figure, by timing)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.6), sharex=True)
    plots.hbars(axes[0], ["pld", "mixed", "auto"], [1.93, 1.2, 1.5], [1.6, 1.0, 1.3], [2.4, 1.4, 1.7], reference=1.0)
    axes[0].set_xlim(0, max(axes[0].get_xlim()[1], 2.9))  # what a notebook adds on top (an estimate's marker)
    plots.hbars(axes[1], ["pld", "mixed", "auto"], [0.9, 1.1, 1.05], [0.8, 1.0, 0.95], [1.0, 1.2, 1.15],
                reference=1.0)
    assert axes[1].get_xlim()[1] >= 2.9 and plots.layout_problems(fig) == []
    plt.close("all")


def test_speedups_share_one_diverging_scale_centred_at_one():
    norm = plots.speedup_norm(np.array([[0.5, 1.5], [2.0, np.nan]]))
    assert norm.vmin == pytest.approx(0.5) and norm.vmax == pytest.approx(2.0)
    assert norm(1.0) == pytest.approx(0.5) and norm(2.0) - norm(1.0) == pytest.approx(norm(1.0) - norm(0.5))
    near_ties = plots.speedup_norm([0.97, 1.08])  # a scale of its own would make a near-tie look strong
    assert near_ties.vmin == pytest.approx(1 / plots.MIN_SPEEDUP_REACH)
    assert near_ties.vmax == pytest.approx(plots.MIN_SPEEDUP_REACH)
    shared = plots.shared_norm([[1, 2], [3, 8]])
    assert (shared.vmin, shared.vmax) == (1, 8)


def test_layout_audit_finds_overlaps_legends_on_data_and_single_values():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.bar(range(8), range(1, 9))
    ax.set_xticks(range(8), [f"a long label {i}" for i in range(8)])
    assert any("tick labels" in p for p in plots.layout_problems(fig))

    fig, ax = plt.subplots()
    for i in range(4):
        ax.plot(range(10), np.arange(10.0) + i, label=f"series {i}")  # diagonals through the centre
    ax.legend(loc="center")
    assert any("legend is drawn over data" in p for p in plots.layout_problems(fig))
    plots.legend_outside(ax)
    assert not any("legend" in p for p in plots.layout_problems(fig))

    fig, ax = plt.subplots()
    ax.plot([1, 2, 4], [0.0, 0.0, 0.0])
    ax.axhline(1.0)  # a reference line is not data
    assert any("single value (0)" in p for p in plots.layout_problems(fig))

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2], [1, 2])
    fig.suptitle("a suptitle far too long for the figure it is the title of, running off both of its edges")
    assert any("runs off the figure" in p for p in plots.layout_problems(fig))

    fig, (left, right) = plt.subplots(1, 2)
    left.annotate("one note", (0.5, 0.5))
    left.annotate("one note, again", (0.5, 0.5))
    right.plot([1, 2], [1, 2])
    assert any("overlap" in p for p in plots.layout_problems(fig))
    plt.close("all")


def test_strict_save_refuses_a_bad_figure_and_dumps_the_good_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("SPECNB_FIGURE_DUMP", str(tmp_path / "dump"))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3.0, 3.0, 3.0])
    with pytest.raises(plots.FigureLayoutError, match="single value"):
        plots.save_figure(fig, "00_bad")
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1.0, 2.0, 3.0])
    plots.save_figure(fig, "00_good", pd.DataFrame({"x": [1]}))
    assert (tmp_path / "figures" / "00_good.png").exists() and (tmp_path / "figures" / "00_good.csv").exists()
    assert (tmp_path / "dump" / "00_good.pickle").exists() and not (tmp_path / "figures" / "00_bad.png").exists()
    plt.close("all")


def test_saved_log_axes_say_they_are_logarithmic(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([1, 10, 100], [1, 2, 3])
    plots.log_axis(a, "x")
    a.set(xlabel="corpus tokens", ylabel="speedup")
    b.plot([1, 10], [1, 100])
    b.set_yscale("log")
    b.set(ylabel="seconds (log scale)")
    plots.save_figure(fig, "00_log")
    assert (a.get_xlabel(), a.get_ylabel(), b.get_ylabel()) == ("corpus tokens (log)", "speedup", "seconds (log scale)")
    plt.close("all")


def test_a_title_with_a_long_model_path_is_wrapped_to_fit(tmp_path, monkeypatch):
    """A user's model path makes titles long: saved strictly, they wrap onto lines inside the figure."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    name = "/home/someone/models/" + "my-org_llama-3.2-1b-instruct-finetuned-on-our-code" * 2
    fig, (left, ax) = plt.subplots(1, 2, figsize=(6.4, 2.6), layout="constrained")
    left.plot([0, 1, 2], [1, 2, 3])
    ax.plot([0, 1, 2], [1, 3, 2])
    ax.set_title(f"{name}: MRR per datastore, 90% intervals over queries")  # centred on the right-hand panel
    fig.suptitle(f"{name}, 10 prompts × 64 new tokens, greedy")
    assert any("runs off the figure" in problem for problem in plots.layout_problems(fig))
    plots.save_figure(fig, "long_title")
    assert ax.get_title().count("\n") >= 1 and plots.layout_problems(fig) == []
    plt.close(fig)
