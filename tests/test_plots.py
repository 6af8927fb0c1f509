"""The one figure style (specnb.study.plots): one colour and name per method, sorted bars with values and intervals,
shared colour scales, and the layout audit that fails a figure a reader would trip over."""

from __future__ import annotations

import warnings

import matplotlib.collections
import matplotlib.colors
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from specnb.eval.checks import DegenerateData
from specnb.study import plots


@pytest.fixture(autouse=True)
def notebook_style():
    """The style the notebooks set (``plots.use_style()``), undone after each test."""
    with plt.rc_context():
        plots.use_style()
        yield


def test_every_label_of_a_method_gets_its_colour():
    assert plots.method_of("DReSD 10×6, OOD store") == "dense"
    assert plots.method_of("DReSD 10×6 votes, OOD store, priced") == "dense-priced"
    assert plots.method_of("REST, ID store") == "rest-id" and plots.method_of("REST, OOD store") == "rest"
    assert plots.method_of("prompt lookup") == "pld" and plots.method_of("pld") == "pld"
    assert plots.method_of("mixed (10,10)") == "mixed" and plots.method_of("mixed-adaptive") == "mixed-adaptive"
    assert plots.method_of("crest-priced") == "crest-priced" and plots.method_of("CREST") == "crest"
    assert plots.style("dense").label == "DReSD"
    assert plots.style("DReSD 10×6, OOD store").label == "DReSD 10×6, OOD store"
    assert plots.color("REST, OOD store") == plots.color("rest") != plots.color("crest")
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
        ("mixed-adaptive", "mixed, adaptive"), ("rest", "REST"), ("rest-id", "REST, ID store"),
        ("rest-priced", "REST, priced"), ("crest", "CREST"),
        ("crest-priced", "CREST, priced"), ("dense", "DReSD"), ("dense-id", "DReSD, ID store"),
        ("dense-priced", "DReSD, priced"), ("sd", "SD"), ("mcsd", "MCSD"), ("suffix", "SuffixDecoding"),
        ("recycle", "Token Recycling"), ("auto", "auto"), ("-", "no draft")]


def test_a_self_draft_is_named_by_its_layers():
    assert plots.model_label("gemma-3-270m:self:12") == "gemma-3-270m's first 12 layers"
    assert plots.model_label("qwen2.5-coder-0.5b-instruct") == "qwen2.5-coder-0.5b-instruct"


def test_bars_are_ordered_labelled_and_carry_their_interval():
    fig, ax = plt.subplots()
    plots.hbars(ax, ["pld", "rest", "auto"], [1.2, 0.8, 2.0], [1.1, 0.7, 1.8], [1.3, 0.9, 2.2], reference=1.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["auto", "REST", "prompt lookup"]  # bottom to top
    assert sorted(t.get_text() for t in ax.texts) == ["0.80", "1.20", "2.00"]
    assert plots.layout_problems(fig) == []
    with pytest.raises(DegenerateData, match="constant"):
        plots.hbars(ax, ["pld", "rest"], [1.0, 1.0])
    fig, ax = plt.subplots()
    plots.hbars(ax, ["pld", "rest"], [-0.2, 0.3], reference=0.8)  # a loss, a gain, a reference past both
    lo, hi = ax.get_xlim()
    assert lo < -0.2 and hi > 0.8 and plots.layout_problems(fig) == []
    plt.close("all")


def test_bars_draw_a_second_statistic_as_a_named_tick_and_print_past_it():
    fig, ax = plt.subplots()
    plots.hbars(ax, ["pld", "rest"], [1.0, 2.0], also=("90th percentile", "p90", [3.0, 2.5]), xlabel="ms")
    plots.legend_outside(ax)
    [ticks] = [c for c in ax.collections if c.get_label() == "90th percentile"]
    assert sorted(ticks.get_offsets()[:, 0]) == [2.5, 3.0]
    assert min(t.get_position()[0] for t in ax.texts) > 2.5  # each value printed past its tick
    assert sorted(t.get_text() for t in ax.texts) == ["1.00 · p90 3.00", "2.00 · p90 2.50"]  # both named
    assert plots.layout_problems(fig) == []  # and the longer text inside the panel
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["90th percentile"]
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


def test_every_speedup_heatmap_has_one_fixed_diverging_scale_with_arrows_when_clipped():
    """06 and 08 drew one speedup on two scales; now every speedup is on SPEEDUP_NORM: centred on 1, the same
    limits whatever the data, ticks with two decimals (which side of 1), an arrow where a cell is clipped."""
    norm = plots.SPEEDUP_NORM
    assert norm(1.0) == pytest.approx(0.5) and norm(2.0) - norm(1.0) == pytest.approx(norm(1.0) - norm(0.5))
    assert (norm.vmin, norm.vmax) == (pytest.approx(1 / 3), pytest.approx(3))
    bars = []
    for values in ([[0.9, 1.2], [1.1, 1.05]], [[0.2, 1.2], [5.0, np.nan]]):
        fig, ax = plt.subplots()
        plots.heatmap(pd.DataFrame(values), ax, norm=norm, cmap=plots.SPEEDUP_CMAP, colorbar=False)
        plots.shared_colorbar(fig, [ax], norm, plots.SPEEDUP_CMAP, "speedup")
        bars.append(fig.axes[-1])
        plots.legend_outside(fig, "below")  # names the grey, unmeasured cell
        assert plots.layout_problems(fig) == []
    near, far = bars
    assert near.get_ylim() == far.get_ylim()  # the same limits for a near-tie and for a wide spread
    labels = [t.get_text() for t in near.get_yticklabels()]
    assert {"0.80", "1.00", "1.25"} <= set(labels) and all(len(t.split(".")[1]) == 2 for t in labels)
    assert near.figure.axes[-1].collections and far.figure.colorbar is not None
    assert [c.extend for c in (near._colorbar, far._colorbar)] == ["neither", "both"]
    shared = plots.shared_norm([[1, 2], [3, 8]])
    assert (shared.vmin, shared.vmax) == (1, 8)
    plt.close("all")


def test_one_row_order_per_figure_kept_in_every_panel():
    """03's index-at-scale figure sorted each panel by its own value: a reader matched rows by position and read
    the wrong setup. The first panel's order holds in every later panel of the figure, dots included."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 2.4))
    labels = ["pld", "rest", "auto"]
    plots.hbars(axes[0], labels, [1.2, 0.8, 2.0])
    plots.hbars(axes[1], labels, [5.0, 9.0, 1.0])  # another ranking: rows stay put
    plots.dots(axes[2], labels, [0.9, 0.95, 0.99])
    rows = [[t.get_text() for t in ax.get_yticklabels()] for ax in axes]
    assert rows[0] == rows[1] == rows[2] == ["auto", "REST", "prompt lookup"]
    fig, ax = plt.subplots()  # another figure, other values: methods stay in the study's one order
    plots.dots(ax, ["auto", "rest", "pld"], [5.0, 9.0, 1.0])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["auto", "REST", "prompt lookup"]
    fig, ax = plt.subplots()  # rows that are not methods: by value, largest on top
    plots.hbars(ax, ["hnswlib", "IVF-PQ", "exact"], [5.0, 9.0, 1.0], colors=["0.3"] * 3)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["exact", "hnswlib", "IVF-PQ"]
    fig, axes = plt.subplots(1, 2)  # other labels of the same methods (06's best shape per set): kept by method
    plots.hbars(axes[0], ["mixed (1, 10)", "pld"], [1.6, 1.5])
    plots.hbars(axes[1], ["mixed (1, 6)", "pld"], [1.53, 1.50])
    assert [t.get_text() for t in axes[1].get_yticklabels()] == ["mixed (1, 6)", "prompt lookup"]
    plt.close("all")


def test_near_constant_series_are_told_apart_and_said_not_drawn():
    assert plots.near_constant([1.006, 1.007, 1.0065]) and plots.near_constant([2.0, 2.0])
    assert not plots.near_constant([1.2, 1.5])
    # apart by more than 1%, but every value inside every interval: no row differs measurably (02's MAR)
    assert plots.near_constant([0.134, 0.143], [0.10, 0.11], [0.17, 0.18])
    assert not plots.near_constant([0.134, 0.30], [0.10, 0.25], [0.17, 0.35])
    frame = pd.DataFrame({"task": ["code"] * 4 + ["chat"] * 4, "n": [1, 1, 2, 2] * 2, "x": [1, 2] * 4,
                          "y": [0.4, 0.8, 0.1, 0.3, 0.2, 0.5, 0.0, 0.001]})
    frame = frame.assign(y_low=frame.y - 0.05, y_high=frame.y + 0.05)
    fig, axes = plots.series_panels(frame, panels="task", series="n", x="x", y="y", name="n = {}", offset=1.0,
                                    titles={"code": "code", "chat": "chat"})
    assert axes.shape == (1, 2) and axes[0, 1].get_title() == "chat"
    # capped error bars, no bands; the flat n = 2 on chat is said in the title, not drawn (a flat line)
    assert len(axes[0, 0].containers) == 2 and len(axes[0, 1].containers) == 1
    assert "n = 2 flat at 1.00 on chat" in fig._suptitle.get_text()
    plots.legend_outside(fig)
    assert plots.key_problems(fig) == []
    plt.close("all")


def test_ratios_alike_but_away_from_one_are_drawn_and_ratios_at_one_said(monkeypatch):
    """04's CREST-over-REST bars: 1.48 on code and 1.47 on chat are two gains, not a flat series; ratios at 1 (or
    every interval holding 1) are nothing to see."""
    said = []
    monkeypatch.setattr("IPython.display.display", said.append)
    assert not plots.constant_instead([1.48, 1.47], "gain", [1.17, 1.26], [1.67, 1.95], centre=1.0)
    assert plots.constant_instead([1.48, 1.47], "gain")  # without a centre: the flat-series rule
    assert plots.constant_instead([1.003, 1.004], "gain", centre=1.0)
    assert plots.constant_instead([1.05, 1.06], "gain", [0.9, 0.92], [1.2, 1.21], centre=1.0)
    assert not plots.constant_instead([1.05, 1.06], "gain", [1.01, 1.02], [1.2, 1.21], centre=1.0)
    assert len(said) == 3


def test_dots_near_a_ceiling_with_published_ranges_on_rows_of_their_own():
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    plots.dots(ax, ["code-OOD", "code-ID", "chat-OOD"], [1.0, 0.992, 0.944], [1.0, 0.988, 0.94], [1.0, 0.995, 0.948],
               colors=["C3"] * 3, ranges={"code-OOD": (0.925, 0.939), "chat-OOD": (0.975, 0.975)},
               range_label="DReSD Table 1")
    ticks = [(t.get_text(), t.get_position()[1]) for t in ax.get_yticklabels()]
    assert [name for name, _ in ticks] == ["DReSD Table 1", "chat-OOD", "code-ID", "DReSD Table 1", "code-OOD"]
    assert len({y for _, y in ticks}) == len(ticks)  # every range on a row of its own, not between rows
    assert ax.get_xlim()[0] > 0.8  # not from zero: the differences near 1 are what is shown
    assert sorted(t.get_text() for t in ax.texts) == ["0.944", "0.975", "0.992", "1.000"]  # a published number too
    assert plots.layout_problems(fig) == []
    fig, ax = plt.subplots(figsize=(6.4, 2.0))  # an estimate's interval with its value: a diamond, printed
    plots.dots(ax, ["pld", "mixed"], [1.5, 1.4], [1.3, 1.2], [1.7, 1.6], fmt="×{:.2f}",
               ranges={"pld": (1.46, 2.06, 1.72)}, range_label="estimated")
    assert sorted(t.get_text() for t in ax.texts) == ["×1.40", "×1.50", "×1.72"] and ax.get_xlim()[1] > 2.06
    plt.close("all")


def test_dots_with_published_spans_behind_their_rows_and_a_reference_line():
    """``spans``: a light grey bar on the dot's own row, in view and named once in the legend; ``reference``: a
    line in view (1 token per call) named in the legend; a second panel keeps the first one's row order."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
    labels = ["REST, code", "REST, chat", "DReSD, code"]
    plots.dots(axes[0], labels, [8.6, 1.3, 12.2], [6.9, 0.5, 10.3], [10.2, 2.1, 14.4], fmt="{:.1f}%",
               colors=["C1", "C1", "C3"], keep_order=True, span_label="paper",
               spans={"REST, code": (16.7, 18.0), "REST, chat": (8.0, 9.3), "DReSD, code": (29.0, 31.9)})
    plots.dots(axes[1], labels, [1.27, 1.02, 1.44], [1.22, 1.01, 1.36], [1.33, 1.03, 1.53],
               colors=["C1", "C1", "C3"], reference=1.0, reference_label="AR")
    bars = [patch for patch in axes[0].patches if patch.get_width()]
    assert len(bars) == 3 and [c.get_label() for c in axes[0].containers if c.get_label()[:1] != "_"] == ["paper"]
    rows = {t.get_text(): t.get_position()[1] for t in axes[0].get_yticklabels()}
    assert [rows[name] for name in labels] == [2, 1, 0]  # as given, first on top, no extra rows
    assert {bar.get_y() + bar.get_height() / 2 for bar in bars} == {0, 1, 2}  # on the dots' own rows
    assert axes[0].get_xlim()[1] > 31.9 and axes[1].get_xlim()[0] < 1.0 < axes[1].get_xlim()[1]
    assert [t.get_text() for t in axes[1].get_yticklabels()] == [t.get_text() for t in axes[0].get_yticklabels()]
    plots.legend_outside(fig, "below")
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["AR", "paper"]
    assert plots.layout_problems(fig) == []
    plt.close("all")


def test_paired_ratios_draw_published_ranges_behind_their_rows():
    """``span_label`` with ``span_low`` / ``span_high`` columns: a light grey bar per row, in view, named once."""
    fig, ax = plt.subplots(figsize=(5, 2.4))
    frame = pd.DataFrame({"row": ["a / b", "c / d"], "value": [0.15, 2.1], "low": [0.06, 1.2], "high": [0.26, 4.7],
                          "method": ["REST", "DReSD"], "span_low": [0.44, 1.99], "span_high": [0.56, 2.16]})
    plots.paired_ratios(ax, frame, xlabel="ratio", span_label="paper")
    bars = [patch for patch in ax.patches if patch.get_width()]
    assert [(round(b.get_x(), 2), round(b.get_x() + b.get_width(), 2)) for b in bars] == [(0.44, 0.56), (1.99, 2.16)]
    assert [c.get_label() for c in ax.containers if c.get_label()[:1] != "_"] == ["paper"]
    plots.legend_outside(fig, "below")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["paper"]
    assert plots.layout_problems(fig) == []
    assert not [line for line in ax.lines if line.get_color() == "0.55"]  # both wide enough to be seen as bars
    plt.close("all")


def test_a_published_range_too_narrow_to_see_gets_a_tick_at_its_middle():
    fig, ax = plt.subplots(figsize=(5, 2.4))
    frame = pd.DataFrame({"row": ["code", "chat"], "value": [1.45, 1.57], "low": [1.17, 1.26], "high": [1.67, 1.95],
                          "method": "crest", "span_low": 1.165, "span_high": 1.171})  # CREST's +16.5-17.1%
    plots.paired_ratios(ax, frame, xlabel="ratio", span_label="paper")
    ticks = [line for line in ax.lines if line.get_color() == "0.55"]
    assert len(ticks) == 2 and all(np.allclose(t.get_xdata(), 1.168) for t in ticks)
    plt.close("all")


def test_a_methods_variants_share_its_hue_in_darker_and_lighter_shades():
    """06's top-k figure drew w = 2 and w = 3 in two pale tints a reader could not tell apart: the variants after a
    method's own colour alternate darker and lighter, each pair of them far apart."""
    colors = plots.method_colors(["unigram", "bigram (w=1)", "extended bigram (w=2)", "extended bigram (w=3)"])
    assert colors["unigram"] == plots.color("model unigram") and colors["bigram (w=1)"] == plots.color("model bigram")
    assert len(set(colors.values())) == 4
    variants = ("bigram (w=1)", "extended bigram (w=2)", "extended bigram (w=3)")
    lightness = [sum(plots.to_rgb(colors[k])) for k in variants]
    assert lightness[1] < lightness[0] < lightness[2]
    assert min(abs(a - b) for i, a in enumerate(lightness) for b in lightness[i + 1:]) > 0.5
    rgb = [np.asarray(plots.to_rgb(c)) for c in colors.values()]  # the unigram (its own hue) apart from all three
    assert min(np.linalg.norm(a - b) for i, a in enumerate(rgb) for b in rgb[i + 1:]) > 0.3


def test_legends_list_methods_in_one_order_and_series_get_distinct_hues():
    fig, ax = plt.subplots()
    for name in ("mcsd", "n = 3", "rest", "pld"):
        ax.plot([1, 2], [1, 2 + len(name)], label=name, color=plots.color(name) if name != "n = 3" else "0.5")
    plots.legend_outside(ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pld", "rest", "mcsd", "n = 3"]
    assert plots.method_rank("prompt lookup") < plots.method_rank("REST, OOD store") < plots.method_rank("MCSS")
    assert plots.method_rank("n = 3") is None
    hues = plots.series_colors(5)
    assert len(set(hues)) == 5 and plots.series_colors(2) == ["0.15", "0.55"]
    plt.close("all")


def test_strict_save_refuses_a_hatch_outline_or_band_no_legend_names(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    x = np.arange(5.0)

    def figure(**marks):
        fig, ax = plt.subplots()
        ax.plot(x, x, color="C0", label="a line")
        if "hatch" in marks:
            ax.add_patch(plt.Rectangle((0, 0), 1, 1, hatch="//", fill=False, lw=0, label=marks["hatch"]))
        if "outline" in marks:
            ax.add_patch(plt.Rectangle((1, 1), 1, 1, fill=False, ec="tab:cyan", lw=1, label=marks["outline"]))
        for i in range(marks.get("bands", 0)):
            ax.fill_between(x, x - 1 - i, x + 1 + i, color=f"C{i}", alpha=0.2, lw=0, label=f"band {i}")
        plots.legend_outside(ax)
        return fig

    for fig, refusal in ((figure(hatch=None), "a hatch that no legend names"),
                         (figure(outline=None), "an outline that no legend names"),
                         (figure(bands=2), "2 translucent bands in one panel")):
        with pytest.raises(plots.FigureLayoutError, match=refusal):
            plots.save_figure(fig, "00_unnamed")
    fig, ax = plt.subplots()
    ax.plot(x, x)
    ax.fill_between(x, x - 1, x + 1, alpha=0.2, lw=0)  # a band without a name
    with pytest.raises(plots.FigureLayoutError, match="a translucent fill that no legend names"):
        plots.save_figure(fig, "00_unnamed")
    assert not (tmp_path / "00_unnamed.png").exists()
    plots.save_figure(figure(hatch="not measured", outline="past the threshold", bands=1), "00_named")
    fig, ax = plt.subplots()  # several series: capped error bars, no band to name
    for i in range(3):
        plots.line_with_interval(ax, x, x + i, x + i - 0.5, x + i + 0.5, band=False, label=f"n = {i}",
                                 color=plots.series_colors(3)[i])
    frame = pd.DataFrame({"x": x, "ms": x})  # a measure without an interval: a plain line, no error bars
    plots.line_with_interval(ax, frame.x, frame.ms, *plots.interval_of(frame, "ms"), band=False, label="ms",
                             color="0.3")
    assert len(ax.containers) == 3 and ax.lines[-1].get_label() == "ms"
    plots.legend_outside(ax)
    plots.save_figure(fig, "00_series")
    assert (tmp_path / "00_named.png").exists() and (tmp_path / "00_series.png").exists()
    plt.close("all")


def test_a_methods_shades_get_a_key_when_saved_and_none_is_refused(tmp_path, monkeypatch):
    """A darker (ID store) or lighter (priced) shade of a method's colour on a bar or a dot is named in a key:
    layout_problems finds one no legend names, and save_figure adds the key (each shade and the method's own
    colour beside it), in the study's method order, so the strict save passes."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    labels = ["REST, OOD store", "REST, ID store", "DReSD 10×6, OOD store", "DReSD 10×6, ID store", "rest-priced"]
    for ax in axes:
        plots.hbars(ax, labels, [1.2, 1.4, 1.3, 1.8, 1.1], xlabel="tokens per call")
    assert any("the shade 'DReSD, ID store'" in p for p in plots.layout_problems(fig))
    assert plots.method_rank("DReSD 10×6, ID store") == plots.method_rank("dense")
    assert plots.method_rank("rest-priced") == plots.method_rank("REST") < plots.method_rank("crest-priced")
    plots.save_figure(fig, "00_shades")
    [key] = fig.legends
    assert [t.get_text() for t in key.get_texts()] == ["DReSD, OOD store", "DReSD, ID store",
                                                       "REST, OOD store, whole tree", "REST, ID store", "REST, priced"]
    assert "dark: the in-distribution (ID) store" in key.get_title().get_text()
    assert plots.layout_problems(fig) == []
    fig, ax = plt.subplots()  # no shade, no key
    plots.hbars(ax, ["pld", "rest"], [1.5, 1.2])
    plots.save_figure(fig, "00_plain")
    assert not fig.legends
    plt.close("all")


def test_stacked_shares_draw_one_opaque_bar_per_row_with_its_shares_printed(tmp_path, monkeypatch):
    """A router's picks: one bar per prompt (first on top), the pooled row set apart at the bottom, segments in the
    members' colours named in the legend, shares of at least 12% printed; the strict save passes."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    shares = pd.DataFrame({"pld": [0.6, 0.1, 0.35], "suffix": [0.3, 0.85, 0.575], "-": [0.1, 0.05, 0.075]},
                          index=["prompt 1", "prompt 2", "all calls"])
    fig, ax = plt.subplots(figsize=(5, 2))
    plots.stacked_shares(ax, shares)
    plots.legend_outside(fig)
    at = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)}
    assert at["prompt 1"] - at["prompt 2"] == 1 and at["prompt 2"] - at["all calls"] > 1  # the pooled row apart
    assert sorted(t.get_text() for t in ax.texts) == ["30%", "35%", "57%", "60%", "85%"]  # not 10%, 5%, 7%
    assert {p.get_facecolor()[:3] for p in ax.patches} == {plt.matplotlib.colors.to_rgb(plots.color(k))
                                                           for k in shares.columns}
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["prompt lookup", "SuffixDecoding", "no draft"]
    plots.save_figure(fig, "00_picks")
    plt.close("all")


def test_stacked_shares_hatch_a_members_merged_calls_and_key_the_hatch(tmp_path, monkeypatch):
    """A member's half of the calls it merged with another (column ``pld+``) is hatched in the member's own colour,
    with one key entry for the hatch, so the strict save (which refuses an unnamed hatch) passes."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    shares = pd.DataFrame({"pld": [0.5, 0.2, 0.35], "pld+": [0.1, 0.2, 0.15], "suffix": [0.3, 0.4, 0.35],
                           "suffix+": [0.1, 0.2, 0.15]}, index=["prompt 1", "prompt 2", "all calls"])
    fig, ax = plt.subplots(figsize=(9, 2))
    plots.stacked_shares(ax, shares)
    plots.legend_outside(fig)
    hatched = [p for p in ax.patches if p.get_hatch() and p.get_width() > 0]
    assert len(hatched) == 6 and {p.get_facecolor()[:3] for p in hatched} == {
        plt.matplotlib.colors.to_rgb(plots.color(k)) for k in ("pld", "suffix")}
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names[:2] == ["prompt lookup", "SuffixDecoding"] and sum("hatched" in n for n in names) == 1
    assert plots.key_problems(fig) == []
    plots.save_figure(fig, "00_merged_picks")
    plt.close("all")


def test_stacked_shares_say_in_a_sentence_when_one_member_took_every_call(tmp_path, monkeypatch):
    """A tiny model's router that always picks one member: no bars all of one length (the strict save refuses a
    panel of a single value), a sentence naming the member."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    shares = pd.DataFrame({"pld": [1.0, 1.0, 1.0], "suffix": [0.0, 0.0, 0.0]},
                          index=["prompt 1", "prompt 2", "all calls"])
    fig, ax = plt.subplots(figsize=(5, 2))
    plots.stacked_shares(ax, shares)
    plots.legend_outside(fig)
    assert not ax.patches and [t.get_text() for t in ax.texts] == ["every call of every prompt:\nprompt lookup"]
    plots.save_figure(fig, "00_one_pick")
    plt.close("all")


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


def test_strict_save_refuses_a_bad_figure_and_saves_the_good_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3.0, 3.0, 3.0])
    with pytest.raises(plots.FigureLayoutError, match="single value"):
        plots.save_figure(fig, "00_bad")
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1.0, 2.0, 3.0])
    plots.save_figure(fig, "00_good", pd.DataFrame({"x": [1]}))
    assert (tmp_path / "figures" / "00_good.png").exists() and (tmp_path / "figures" / "00_good.csv").exists()
    assert not (tmp_path / "figures" / "00_bad.png").exists()
    plt.close("all")


def test_a_notebook_shows_the_saved_png_in_the_figures_place(tmp_path, monkeypatch):
    """Under the inline backend the figure is not drawn a third time: the PNG just saved is shown, at the figure's
    size, and the figure is closed; elsewhere (scripts, tests) nothing is shown and the figure stays open."""
    import IPython.display

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
    ax.plot([1, 2, 3], [1.0, 2.0, 3.0])
    plots.save_figure(fig, "00_script")
    assert shown == [] and plt.fignum_exists(fig.number)
    monkeypatch.setattr(plt, "get_backend", lambda: "module://matplotlib_inline.backend_inline")
    monkeypatch.setitem(plt.rcParams, "savefig.dpi", 110)
    png = plots.save_figure(fig, "00_notebook")
    [image] = shown
    assert image.data == png.read_bytes() and image.width == round(Image.open(png).width * 100 / 110)
    assert not plt.fignum_exists(fig.number)


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


def test_a_log_mark_that_would_collide_is_left_off_and_a_save_lays_out_once(tmp_path, monkeypatch):
    """A " (log)" mark that pushes a label into its neighbour's is put back, and the strict save passes; saving
    lays the figure out once before the PNG (the title fitting and the checks share that draw)."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    fig, (a, b) = plt.subplots(1, 2, figsize=(6, 3), layout="none")  # no layout engine to make room
    fig.subplots_adjust(bottom=0.25)
    a.plot([1, 10, 100], [1, 2, 3])
    a.set(xscale="log", xlabel="tokens of the corpus drafted from, all of them")  # room for it, not for " (log)"
    b.plot([1, 2], [1, 2])
    b.set_xlabel("tokens drafted per call here")
    draws = []
    monkeypatch.setattr(fig, "draw_without_rendering", lambda real=fig.draw_without_rendering: (draws.append(1),
                                                                                                  real())[1])
    plots.save_figure(fig, "00_collide")
    assert a.get_xlabel() == "tokens of the corpus drafted from, all of them" and len(draws) == 2  # the mark's check: 2
    fig, ax = plt.subplots(figsize=(4, 3), layout="constrained")
    ax.plot([1, 10, 100], [1, 2, 3])
    ax.set(xscale="log", xlabel="tokens")
    monkeypatch.setattr(fig, "draw_without_rendering", lambda real=fig.draw_without_rendering: (draws.append(2),
                                                                                                  real())[1])
    plots.save_figure(fig, "00_room")
    assert ax.get_xlabel() == "tokens (log)" and draws.count(2) == 1
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


def test_paired_ratios_draw_one_panel_with_a_line_at_one_values_and_intervals(tmp_path, monkeypatch):
    frame = pd.DataFrame({"row": ["SuffixDecoding / prompt lookup"] * 2 + ["auto / prompt lookup"] * 2,
                          "group": ["code", "chat"] * 2, "value": [1.12, 0.97, 1.30, np.nan],
                          "low": [1.05, 0.90, 1.10, np.nan], "high": [1.20, 1.05, np.nan, np.nan],
                          "method": ["suffix", "suffix", "auto", "auto"]})
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    plots.paired_ratios(ax, frame, xlabel="ratio", fmt="×{:.2f}")
    plots.legend_outside(ax)
    ticks = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    assert list(ticks) == ["SuffixDecoding / prompt lookup", "auto / prompt lookup"]
    assert ticks["SuffixDecoding / prompt lookup"] > ticks["auto / prompt lookup"]  # first on top
    assert sorted(t.get_text() for t in ax.texts) == ["×0.97", "×1.12", "×1.30"]  # every finite value printed
    assert [line.get_xdata()[0] for line in ax.lines if len(line.get_xdata()) == 2] == [1.0]  # the line at 1
    assert len(ax.containers) == 2  # an interval for each row that has one, none invented for the rest
    lo, hi = ax.get_xlim()
    assert lo < 0.90 and hi > 1.30
    dots = [c for c in ax.collections if isinstance(c, matplotlib.collections.PathCollection)]
    assert len({float(c.get_offsets()[0][1]) for c in dots}) == 3  # each group on a sub-row of its own, no NaN dot
    suffix = [c for c in dots if float(c.get_offsets()[0][0]) == 1.12][0]
    assert np.allclose(suffix.get_facecolor()[0][:3], matplotlib.colors.to_rgb(plots.color("suffix")))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["code", "chat"]  # a marker per group, named
    markers = [h.get_marker() for h in ax.get_legend().legend_handles]
    assert len(set(markers)) == 2
    assert plots.layout_problems(fig) == []
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    monkeypatch.setenv("SPECNB_STRICT_FIGURES", "1")
    plots.save_figure(fig, "99_ratios", frame)
    with pytest.raises(DegenerateData):
        plots.paired_ratios(plt.subplots()[1], frame.assign(value=np.nan), xlabel="ratio")
    with pytest.raises(ValueError, match="share a row and a group"):  # one would print over the other
        plots.paired_ratios(plt.subplots()[1], frame.assign(group="code"), xlabel="ratio")
    plt.close("all")


def test_paired_ratios_shade_the_verdicts_tolerance_behind_the_rows_it_judges():
    from specnb.experiments import shapes
    from specnb.study.verdicts import PREDICTION

    measured = pd.DataFrame({"method": ["mixed 2x4 tree", "mixed 2x4 batch"], "family": ["mixed"] * 2,
                             "accuracy": [0.89, 0.68], "accuracy_low": [0.82, 0.60], "accuracy_high": [0.94, 0.74]})
    tree = pd.DataFrame({"family": ["mixed"], "k": [2], "w": [4], "ratio": [1.31], "low": [1.25], "high": [1.38]})
    band = shapes.prediction_band(measured)
    assert (band.low, band.high) == (1 - PREDICTION, 1 + PREDICTION)  # the verdict's constant, not typed
    frame = shapes.timed_ratios(measured, tree)
    assert set(band.rows) == set(frame.row[:2])  # the measured / predicted rows, not tree / batch
    fig, ax = plt.subplots(figsize=(6.4, 2.4))
    plots.paired_ratios(ax, frame, xlabel="ratio", fmt="{:.2f}", band=band)
    plots.legend_outside(fig, "below")
    shaded = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
    assert len(shaded) == 1 and shaded[0].get_label() == band.label
    xs, ys = shaded[0].get_paths()[0].vertices.T
    assert np.isclose(xs.min(), 1 - PREDICTION) and np.isclose(xs.max(), 1 + PREDICTION)
    ticks = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels()}
    assert ys.min() < ticks[frame.row[1]] < ticks[frame.row[0]] < ys.max() < ticks[frame.row[0]] + 1
    assert ys.min() > ticks[frame.row[2]]  # not behind tree / batch rows
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [band.label]
    assert plots.key_problems(fig) == [] and plots.layout_problems(fig) == []
    plt.close(fig)


def test_ratio_tick_labels_are_short_and_use_the_figures_names():
    """Notebook 10's tick labels: each method by its one figure name (plots.label), a ratio on two short lines."""
    from specnb.experiments import beyond

    rows = [beyond.ratio_row(m, o) for ratios in beyond.FIGURE_RATIOS.values() for m, o, _ in ratios]
    assert "auto /\nbest single" in rows and "SuffixDecoding /\nretrieval ceiling" in rows
    assert max(len(line) for row in rows for line in row.split("\n")) <= 18
    assert all(row.split(" /")[0] == plots.label(m) for ratios in beyond.FIGURE_RATIOS.values()
               for (m, o, _), row in zip(ratios, [beyond.ratio_row(*r[:2]) for r in ratios], strict=True))
    assert plots.label("auto") == plots.style("auto").label == "auto"


def test_a_value_left_of_the_line_at_one_is_printed_before_its_interval():
    """Token Recycling's ×0.85 (0.76-0.95): printed past its interval it would sit across the line at 1 on a white
    ground and hide it; past the line it would read as another row's: it goes before its interval, in view. A value
    whose interval ends right of 1 stays past its interval."""
    frame = pd.DataFrame({"row": ["a", "b", "c"], "value": [0.85, 1.01, 0.5], "low": [0.76, 0.99, 0.45],
                          "high": [0.95, 1.03, 0.55], "method": ["recycle", "suffix", "pld"]})
    fig, ax = plt.subplots(figsize=(7.2, 3.0))
    plots.paired_ratios(ax, frame, xlabel="ratio")
    where = {t.get_text(): t.get_position()[0] for t in ax.texts}
    assert where["×0.85"] < 0.76 and ax.texts[0].get_horizontalalignment() == "right"  # before its interval
    assert 1.03 < where["×1.01"] < 1.1 and 0.55 < where["×0.50"] < 0.7  # beside their intervals
    fig.canvas.draw()
    line = ax.transData.transform((1.0, 0))[0]
    for text in ax.texts:
        box = text.get_window_extent()
        assert not box.x0 < line < box.x1, text.get_text()
    assert plots.layout_problems(fig) == []
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.2, 2.2))  # dots keep the same rule (07's speedups)
    plots.dots(ax, ["SD 1x1", "MCSD 4x2"], [1.05, 0.95], [1.0, 0.93], [1.1, 0.97], fmt="×{:.2f}", reference=1.0)
    where = {t.get_text(): t.get_position()[0] for t in ax.texts}
    assert where["×0.95"] < 0.93 and where["×1.05"] > 1.1 and plots.layout_problems(fig) == []
    plt.close(fig)


def _curves(values: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    rows = [{"task": task, "n": n, "t": t, "entries": t * n, "y": y, "y_low": y - 0.1, "y_high": y + 0.1}
            for (task, n), ys in values.items() for t, y in zip((250, 500, 1000), ys, strict=True)]
    return pd.DataFrame(rows)


def test_series_panels_say_a_repeated_or_flat_series_instead_of_drawing_it():
    frame = _curves({("code", 1): [0.4, 0.6, 0.8], ("code", 2): [0.5, 0.7, 0.9], ("code", 3): [0.505, 0.702, 0.9],
                     ("chat", 1): [0.2, 0.3, 0.5], ("chat", 2): [0.3, 0.4, 0.6], ("chat", 3): [0.0, 0.0, 0.0]})
    said = plots.unchanged_series(frame, panels="task", series="n", x="entries", y="y", offset=1.0, same_at="t")
    assert said == {("code", 3): ("repeats", 2), ("chat", 3): ("flat", (1.0, 1.0))}
    fig, axes = plots.series_panels(frame, panels="task", series="n", x="entries", y="y", name="n = {}", offset=1.0,
                                    titles={"code": "code", "chat": "chat"}, same_at="t", unit="tokens per call",
                                    title="a title")
    assert fig._suptitle.get_text() == ("a title\nNot drawn: n = 3 within 2% of n = 2 at every point on code; n = 3 "
                                        "flat at 1.00 tokens per call on chat.")
    assert [len(ax.containers) for ax in axes.flat] == [2, 2]  # n = 3 drawn in neither panel
    # a series drawn only in a later panel keeps its place in the legend
    frame = _curves({("code", 1): [0.4, 0.6, 0.8], ("code", 3): [0.5, 0.7, 0.9], ("chat", 2): [0.2, 0.3, 0.5]})
    fig, axes = plots.series_panels(frame, panels="task", series="n", x="entries", y="y", name="n = {}",
                                    titles={"code": "code", "chat": "chat"})
    plots.legend_outside(fig)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["n = 1", "n = 2", "n = 3"]
    # nothing left out: no sentence, every series drawn
    frame = _curves({("code", 1): [0.4, 0.6, 0.8], ("code", 2): [0.5, 0.7, 0.9]})
    fig, axes = plots.series_panels(frame, panels="task", series="n", x="entries", y="y", name="n = {}",
                                    titles={"code": "code"}, title="a title")
    assert fig._suptitle.get_text() == "a title" and len(axes[0, 0].containers) == 2
    # nudged apart for a log axis: the first series' points at x / 1.1 ** 0.5, the second's at x * 1.1 ** 0.5
    fig, axes = plots.series_panels(frame, panels="task", series="n", x="entries", y="y", name="n = {}",
                                    titles={"code": "code"}, dodge=1.1)
    xs = [container.lines[0].get_xdata() for container in axes[0, 0].containers]
    assert np.allclose(xs[0], frame[frame.n == 1].entries / 1.1 ** 0.5)
    assert np.allclose(xs[1], frame[frame.n == 2].entries * 1.1 ** 0.5)
    plt.close("all")


def test_a_chain_of_repeats_is_said_against_the_series_drawn():
    """n ≤ 4 repeats n ≤ 3 (drawn), n ≤ 5 repeats n ≤ 4 (not drawn): the sentence names n ≤ 3 for both, never a
    series a reader cannot see; a curve drifting 1.5% a step is drawn once it is more than 2% from the drawn one."""
    frame = _curves({("code", 1): [0.4, 0.6, 0.8], ("code", 2): [0.5, 0.7, 0.92], ("code", 3): [0.5, 0.7, 0.915],
                     ("code", 4): [0.5, 0.7, 0.915], ("chat", 1): [0.2, 0.3, 0.5], ("chat", 2): [0.2, 0.3, 0.5],
                     ("chat", 3): [0.2, 0.3, 0.53], ("chat", 4): [0.2, 0.3, 0.56]})
    said = plots.unchanged_series(frame, panels="task", series="n", x="entries", y="y", offset=1.0, same_at="t")
    assert said == {("code", 3): ("repeats", 2), ("code", 4): ("repeats", 2), ("chat", 2): ("repeats", 1),
                    ("chat", 3): ("repeats", 1)}  # chat n ≤ 4 is 4% from n ≤ 1 (drawn), 2% from n ≤ 3 (not)
    assert all((row, detail) not in said for (row, _), (kind, detail) in said.items())  # each names a drawn one
    sentence = plots.unchanged_sentence(said, "n ≤ {}", ["code", "chat"])
    assert sentence == ("Not drawn: n ≤ 2, n ≤ 3 within 2% of n ≤ 1 at every point on chat; n ≤ 3, n ≤ 4 within 2% "
                        "of n ≤ 2 at every point on code.")


def test_the_best_curve_is_drawn_even_within_2_percent_of_another():
    """04's all-n figure said n ≤ 3 on chat "within 2% of n ≤ 2" while the takeaway named n ≤ 3 the best store:
    the curve holding a panel's largest value is drawn, and a later one within 2% of it is said against it."""
    frame = _curves({("chat", 2): [0.5, 0.7, 0.9], ("chat", 3): [0.5, 0.7, 0.91], ("chat", 4): [0.5, 0.7, 0.905]})
    said = plots.unchanged_series(frame, panels="task", series="n", x="entries", y="y", offset=1.0, same_at="t")
    assert said == {("chat", 4): ("repeats", 3)}


def test_a_tokens_per_call_curve_within_2_percent_of_its_level_is_flat():
    """One rule for repeated and flat curves: n = 4 on chat, 1.00-1.02 tokens per call, is flat (within 2% of its
    largest), as a curve within 2% of another repeats it; 1.02-1.07 is drawn."""
    assert plots.flat_curve([1.0008, 1.005, 1.0201]) and plots.flat_curve([1.0, 1.0])
    assert not plots.flat_curve([1.0201, 1.05, 1.0735]) and not plots.flat_curve([1.0, 1.021])
    frame = _curves({("chat", 4): [0.0008, 0.005, 0.0201], ("chat", 5): [0.0, 0.0, 0.0],
                     ("code", 4): [0.0201, 0.05, 0.0735], ("code", 5): [0.2, 0.3, 0.4]})
    said = plots.unchanged_series(frame, panels="task", series="n", x="entries", y="y", offset=1.0)
    assert said == {("chat", 4): ("flat", (1.0008, 1.0201)), ("chat", 5): ("flat", (1.0, 1.0))}
    assert plots.unchanged_sentence(said, "n = {}", ["code", "chat"], "tokens per call") == (
        "Not drawn: n = 4, n = 5 flat at 1.00–1.02 tokens per call on chat.")


def test_a_heatmap_plateau_is_drawn_with_its_values():
    """Prompt lookup's k ≥ 4 rows at k = 2's tokens per call and the model bigram's w ≥ 4 columns at w = 2's: every
    measured cell drawn with its value (blanking a plateau made a ragged grid and a title of exclusions), the
    unmeasured one grey; the suptitle is the title alone."""
    lookup = pd.DataFrame({1: [1.64, 1.68, 1.69, 1.69], 2: [2.07, 2.13, 2.16, 2.17], 4: [2.62, 2.79, 2.83, np.nan]},
                          index=pd.Index([1, 2, 4, 8], name="k"))
    lookup.columns.name = "w"
    rows = [{"family": f, "set": "HumanEval", "k": k, "w": w, "tpc": table.loc[k, w]}
            for f, table in (("prompt lookup", lookup), ("model bigram", lookup.T.iloc[:, :3].T)) for k in table.index
            for w in table.columns]
    fig, axes = plots.grid_panels(pd.DataFrame(rows), rows="set", panels="family", value="tpc", label="tokens per call",
                                  norm=plots.TOKENS_PER_CALL_NORM, cmap=plots.SEQUENTIAL_CMAP, title="a title")
    assert fig._suptitle.get_text() == "a title"
    mesh = [c for c in axes[0, 0].collections if isinstance(c, matplotlib.collections.QuadMesh)][0]
    assert np.ma.count(mesh.get_array()) == 11  # every measured cell, the repeated rows too
    assert sorted(t.get_text() for t in axes[0, 0].texts).count("1.69") == 2
    plt.close("all")


def test_the_slowdown_heatmap_keeps_a_few_percent_apart_from_one():
    """A 4-token call at 1.04 one-token calls must not read 1.0 (the memory-bound regime's question is whether it
    costs nothing); a 10.96x call reads 11.0."""
    frame = pd.DataFrame({"context": 100, "k": [1, 1, 2, 2], "w": [0, 3, 0, 3], "slowdown": [1.0, 1.04, 1.2, 10.96]})
    fig = plots.slowdown_heatmaps(frame, "a title", threshold=1.5)
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["1.00", "1.04", "1.20", "11.0"]
    plt.close("all")


def test_dots_at_a_ceiling_draw_no_tick_past_it():
    """02's MRR panel ticked its axis to 1.1 to hold the printed values: a reader sees room for MRRs above 1."""
    fig, ax = plt.subplots(figsize=(6, 2))
    plots.dots(ax, ["32D", "64D, no L2"], [1.0, 0.461], [1.0, 0.44], [1.0, 0.48], colors=["tab:red"] * 2,
               keep_order=True, ceiling=1.0)
    fig.canvas.draw()
    assert ax.get_xlim()[1] > 1.0  # the room for "1.000"
    assert max(ax.get_xticks()) <= 1.0 and "1.0" in [t.get_text() for t in ax.get_xticklabels()]
    plt.close("all")


def test_a_legend_below_takes_no_more_columns_than_the_figure_holds():
    """03's paper run failed its strict save: four long labels ("5,696,849 real keys, M = 8") in a row ran off a
    9-inch figure."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    labels = [*(f"5,696,849 real keys, M = {m}" for m in (8, 16, 32)), "1,000,000 random vectors, M = 16",
              "dotted: 90th percentile (same colour)"]
    for i, text in enumerate(labels):
        axes[i % 2].plot([1, 2], [i, i + 1], label=text)
    plots.legend_outside(fig, "below")
    assert not [p for p in plots.layout_problems(fig) if "runs off" in p]
    assert fig.legends[0]._ncols < 4
    plt.close("all")


def _dashed_cells(ax: plt.Axes) -> set[tuple[int, int]]:
    """(row, column) of the cells :func:`plots.heatmap` frames as unsure (its dashed grey frame)."""
    return {(round(r.get_y()), round(r.get_x())) for r in ax.patches
            if not r.get_fill() and matplotlib.colors.same_color(r.get_edgecolor(), plots.UNSURE)}


def test_a_speedup_cell_whose_interval_holds_one_is_framed_as_a_tie():
    """08's bigram cell at 1.02 (0.97-1.08) coloured as a gain: the heatmap says which cells' intervals hold 1,
    and names the frame in the key (the strict save checks it)."""
    rows = [{"family": "bigram", "set": "HumanEval", "k": k, "w": w, "est": est, "est_low": low, "est_high": high}
            for k, w, est, low, high in ((1, 1, 1.02, 0.97, 1.08), (1, 2, 1.30, 1.12, 1.41),
                                         (2, 1, 0.90, 0.85, 0.95), (2, 2, 0.99, 0.80, 1.00))]
    fig, axes = plots.grid_panels(pd.DataFrame(rows), rows="set", panels="family", value="est", label="speedup",
                                  norm=plots.SPEEDUP_NORM, cmap=plots.SPEEDUP_CMAP)
    assert _dashed_cells(axes[0, 0]) == {(0, 0), (1, 1)}  # k = 1, w = 1 and k = 2, w = 2 (its high end at 1)
    assert plots.TIE_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]
    assert plots.key_problems(fig) == []
    plt.close("all")


def test_the_slowdown_heatmap_outlines_only_cells_past_the_line_beyond_their_interval():
    """A 1.6x cell whose interval reaches 1.4 is not past 1.5 by its data: framed as unsure, not outlined."""
    frame = pd.DataFrame({"context": 100, "k": [1, 1, 2, 2], "w": [0, 3, 0, 3], "slowdown": [1.0, 1.6, 1.2, 3.0],
                          "slowdown_low": [0.9, 1.4, 1.1, 2.8], "slowdown_high": [1.1, 1.7, 1.3, 3.1]})
    fig = plots.slowdown_heatmaps(frame, "a title", threshold=1.5)
    ax = fig.axes[0]
    outlined = {(round(r.get_y()), round(r.get_x())) for r in ax.patches
                if not r.get_fill() and matplotlib.colors.same_color(r.get_edgecolor(), plots.OUTLINE)}
    assert outlined == {(1, 1)} and _dashed_cells(ax) == {(0, 1)}
    assert plots.key_problems(fig) == []
    plt.close("all")


def test_the_slowdown_heatmap_marks_the_cells_its_re_timing_did_not_settle():
    """A cell still implausible after its extra passes is kept as timed: the reader is told which value to doubt."""
    frame = pd.DataFrame({"context": 100, "k": [1, 1, 2, 2], "w": [0, 3, 0, 3], "slowdown": [1.0, 1.6, 1.2, 3.0],
                          "settled": [True, False, True, True]})
    fig = plots.slowdown_heatmaps(frame, "a title", threshold=1.5)
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["1.00", "1.20", "1.60?", "3.00"]
    assert any("timing unsettled" in t.get_text() for t in fig.legends[0].get_texts())
    plt.close("all")
    fig = plots.slowdown_heatmaps(frame.assign(settled=True), "a title", threshold=1.5)
    assert "?" not in "".join(t.get_text() for t in fig.axes[0].texts + fig.legends[0].get_texts())
    plt.close("all")


def test_a_heatmap_panel_of_one_colour_is_said_not_drawn():
    dresd = [1.026, 1.027, 1.036, 1.041]  # DReSD on MT-Bench: 1.03-1.04 on a 1-5 scale, one colour
    assert plots.flat_on_scale(dresd, plots.TOKENS_PER_CALL_NORM)
    assert not plots.flat_on_scale([1.03, 1.10, 1.5], plots.TOKENS_PER_CALL_NORM)
    assert plots.flat_on_scale([0.5, 0.5], plots.SPEEDUP_NORM)
    assert not plots.flat_on_scale([0.9, 1.1], plots.SPEEDUP_NORM)  # either side of 1: two colours
    assert plots.flat_words(dresd, "tokens per call") == "tokens per call\n1.03–1.04 in every cell:\nnot drawn"


def test_the_paired_ratio_frames_hold_what_the_verdicts_judge():
    from specnb.experiments import compaction, corpus_sweep, shapes

    storage = pd.DataFrame({"task": ["code", "chat"], "crest_gain_over_rest_best": [0.45, 0.57],
                            "crest_gain_over_rest_best_low": [0.17, 0.26],
                            "crest_gain_over_rest_best_high": [0.67, 0.95]})
    ratios = compaction.figure_ratios(storage)
    assert ratios.row.tolist() == ["code", "chat"] and np.allclose(ratios.value, [1.45, 1.57])
    assert np.allclose(ratios.low, [1.17, 1.26]) and np.allclose(ratios.high, [1.67, 1.95])
    assert np.allclose(ratios.span_low, 1.165) and np.allclose(ratios.span_high, 1.171)  # the paper's, drawn
    summary = {"tokens": [3839, 27075], "tpc": [1.1, 1.2], "tpc_low": [1.0, 1.1], "tpc_high": [1.2, 1.3],
               "speed": [0.7, 0.8], "speed_low": [0.6, 0.7], "speed_high": [0.75, 0.9]}
    ratios = corpus_sweep.figure_ratios({**summary, "corpora": ["10% of the store's", "the store's"]})
    assert ratios.group.tolist() == ["3,839 tokens (10% of the store's)", "27,075 tokens (the store's)"] * 2
    assert ratios.value.tolist() == [1.1, 1.2, 0.7, 0.8] and ratios.high.tolist() == [1.2, 1.3, 0.75, 0.9]
    measured = pd.DataFrame({"method": ["mixed 2x4 tree"], "family": ["mixed"], "accuracy": [1.27],
                             "accuracy_low": [1.24], "accuracy_high": [1.30]})
    tree = pd.DataFrame({"family": ["mixed"], "k": [2], "w": [4], "ratio": [1.29], "low": [1.27], "high": [1.31]})
    ratios = shapes.timed_ratios(measured, tree)
    assert ratios.row.tolist() == ["mixed 2x4 tree: measured / predicted", "mixed (2, 4): tree / batch rows"]
    assert ratios.value.tolist() == [1.27, 1.29] and ratios.low.tolist() == [1.24, 1.27]


def test_log_ticks_thin_out_over_many_decades_and_read_short():
    """1-2-5 steps over a narrow range, 1-3 over two to three decades, decades alone over a wider one (the paper
    profile's t from 10^3 to 10^6, whose 1-3 labels overlapped in a narrow panel); labels as 3k, 250k, 1M."""
    assert plots.log_ticks(900, 20_000) == [1000, 2000, 5000, 10_000, 20_000]
    assert plots.log_ticks(900, 1.2e6) == [1000, 10_000, 100_000, 1_000_000]
    assert plots.log_ticks(1.2, 700) == pytest.approx([3, 10, 30, 100, 300])  # 05's call costs: 1-3, not 10 and 100
    assert [plots.compact_count(v) for v in (300, 3000, 250_000, 1e6)] == ["300", "3k", "250k", "1M"]


def test_a_dot_not_measured_leaves_its_row_empty():
    """A method that drafted nothing (MAR NaN on a tiny store) keeps its row, with no dot and no printed value, and
    warns of nothing (a notebook's run fails on a warning)."""
    fig, ax = plt.subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.dots(ax, ["REST, OOD store", "DReSD 10×6, OOD store", "DReSD 10×6, ID store"], [0.2, np.nan, 0.3],
                   [0.1, np.nan, 0.2], [0.3, np.nan, 0.4], keep_order=True)
    assert sorted(t.get_text() for t in ax.texts) == ["0.200", "0.300"]
    assert len(ax.get_yticklabels()) == 3
    plt.close(fig)


def test_dots_on_panels_sharing_an_axis_keep_every_panels_values_in_view():
    """07's speedups at T = 0 and T = 1 on one x axis: the second panel's limits never hide the first's values."""
    fig, axes = plt.subplots(1, 2, figsize=(8.8, 2.2), sharex=True)
    plots.dots(axes[0], ["SD 1x1", "MCSD 4x2"], [1.6, 1.9], [1.5, 1.8], [1.7, 2.0], reference=1.0)
    plots.dots(axes[1], ["SD 1x1", "MCSD 4x2"], [1.05, 0.95], [1.0, 0.93], [1.1, 0.97], reference=1.0)
    left, right = axes[0].get_xlim()
    assert left < 0.93 and right > 2.0
    plt.close(fig)


def test_dots_on_a_shared_axis_print_values_clear_of_their_intervals():
    """03's held-out MRR (0.993-0.999) beside the stored keys' (0.93-1.0) on one x axis: the values are printed a
    gap of the shared axis' span past their intervals, not of the panel's own (a hair past the cap, touching it)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 2.4), sharex=True)
    plots.dots(axes[0], ["a", "b"], [0.934, 0.9998], [0.927, 0.999], [0.940, 1.0], colors=["0.3"] * 2,
               keep_order=True)
    plots.dots(axes[1], ["a", "b"], [0.9992, 0.993], [0.9977, 0.989], [1.0, 0.996], colors=["0.3"] * 2,
               keep_order=True)
    width = np.ptp(axes[1].get_xlim())
    gaps = sorted(t.get_position()[0] - high for t, high in zip(axes[1].texts, [0.996, 1.0], strict=True))  # bottom up
    assert gaps[0] > 0.015 * width
    plt.close(fig)


def test_measured_and_predicted_speedups_on_rows_of_their_own():
    """08's speedup panel: each method's measured speedup with its interval in its family's colour, the cost
    model's prediction on the row under it, in black, with no interval."""
    from specnb.experiments import shapes

    measured = pd.DataFrame({"method": ["mixed (2, 4) tree", "mixed (2, 4) batch"], "family": ["mixed"] * 2,
                             "measured": [1.63, 1.46], "measured_low": [1.42, 1.27], "measured_high": [1.89, 1.69],
                             "predicted": [1.08, 1.08]})
    shown = shapes.measured_and_predicted(measured)
    assert shown.row.tolist() == ["mixed (2, 4) tree: measured", "mixed (2, 4) tree: predicted",
                                  "mixed (2, 4) batch: measured", "mixed (2, 4) batch: predicted"]
    assert shown.value.tolist() == [1.63, 1.08, 1.46, 1.08] and shown.low.isna().tolist() == [False, True] * 2
    assert shown.color.tolist() == [plots.color("mixed"), shapes.PREDICTED_COLOR] * 2
    fig, ax = plt.subplots(figsize=(5, 2.4))
    plots.dots(ax, shown.row, shown.value, shown.low, shown.high, fmt="×{:.2f}", colors=shown.color, keep_order=True,
               reference=1.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == shown.row.tolist()[::-1]  # first on top
    assert sorted(t.get_text() for t in ax.texts) == ["×1.08", "×1.08", "×1.46", "×1.63"]
    plt.close(fig)


def test_a_log_axis_labels_the_range_shown_whatever_was_drawn_before():
    """Latencies of 0.02-0.3 ms on a linear axis get limits below 0 (its margins: their log was NaN and a notebook
    failed); the log axis labels 1-2-5 values over the range it shows at draw time, data drawn after it included
    (03's latency panel had no label above 0.1 under values to 0.28)."""
    fig, ax = plt.subplots()
    ax.plot([10, 128], [0.018, 0.05])
    ax.set_ylim(-0.01, 0.06)
    plots.log_axis(ax, "y")
    ax.plot([10, 128], [0.03, 0.28])  # drawn after the axis was made logarithmic
    ax.autoscale_view()
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    assert [t for t in ax.get_yticks() if lo <= t <= hi] == pytest.approx([0.02, 0.05, 0.1, 0.2])
    assert float([t.get_text() for t in ax.get_yticklabels() if t.get_text()][-1]) == 0.2
    assert len(ax.yaxis.get_minorticklocs()) == 0  # major ticks only
    plt.close(fig)


def test_ratios_spanning_a_wide_range_are_drawn_on_a_log_axis():
    """03's chat / code MAR ratios (0.15, 0.22) beside DReSD / REST (2.11, interval to 4.7): on a linear axis the
    small ones crowd against zero and the axis runs below it; on a log one every ratio is in view, above zero."""
    frame = pd.DataFrame({"row": ["REST: chat / code", "DReSD: chat / code", "chat: DReSD / REST"],
                          "value": [0.15, 0.22, 2.11], "low": [0.08, 0.12, 1.2], "high": [0.25, 0.3, 4.7],
                          "method": ["rest", "dense", "dense"]})
    fig, ax = plt.subplots(figsize=(4.8, 2.6))
    plots.paired_ratios(ax, frame, xlabel="MAR ratio")
    assert ax.get_xscale() == "log" and ax.get_xlim()[0] > 0 and ax.get_xlabel() == "MAR ratio (log)"
    fig.canvas.draw()
    line = ax.transData.transform((1.0, 0))[0]
    assert all(not t.get_window_extent().x0 < line < t.get_window_extent().x1 for t in ax.texts)
    assert plots.layout_problems(fig) == []
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.8, 2.6))  # ratios near 1 stay linear
    plots.paired_ratios(ax, frame.assign(value=[0.9, 1.1, 1.3], low=[0.8, 1.0, 1.2], high=[1.0, 1.2, 1.4]),
                        xlabel="ratio")
    assert ax.get_xscale() == "linear"
    plt.close(fig)


def test_drawn_groups_skip_what_was_said_and_keep_each_series_place():
    """06's top-k curves: extended bigram (w=3) repeats w=2 on HumanEval only; there it is not drawn, and every
    other curve keeps its index (its hue and marker) in both panels."""
    frame = pd.DataFrame({"set": ["HumanEval"] * 6 + ["MT-Bench"] * 6, "k": [1, 5] * 6,
                          "strategy": ["unigram"] * 2 + ["w=2"] * 2 + ["w=3"] * 2
                          + ["unigram"] * 2 + ["w=2"] * 2 + ["w=3"] * 2,
                          "y": [1.0, 1.2, 1.1, 1.5, 1.1, 1.5, 1.0, 1.3, 1.1, 1.6, 1.2, 1.8]})
    said = plots.unchanged_series(frame, panels="set", series="strategy", x="k", y="y")
    assert said == {("HumanEval", "w=3"): ("repeats", "w=2")}
    code = frame[frame.set == "HumanEval"]
    assert [(i, v) for i, v, _ in plots.drawn_groups(code, "strategy", said, "HumanEval")] == [(0, "unigram"),
                                                                                                (1, "w=2")]
    chat = frame[frame.set == "MT-Bench"]
    assert [i for i, _, _ in plots.drawn_groups(chat, "strategy", said, "MT-Bench")] == [0, 1, 2]


def test_wrapped_titles_keep_names_and_relations_whole():
    """A title too wide for its figure wraps, but never inside ``MT-Bench`` or between ``n ≤`` and its number."""
    fig, ax = plt.subplots(figsize=(3, 2))
    words = "tokens per call on HumanEval and MT-Bench, " * 3 + "not drawn: n ≤ 3 within 2% of n ≤ 2, 10 × 64"
    ax.set_title(words)
    plots.fit_titles(fig)
    lines = ax.title.get_text().splitlines()
    assert len(lines) > 2 and not any(line.rstrip().endswith(("MT-", "≤", "×")) for line in lines)
    assert "n\u00a0≤\u00a03" in ax.title.get_text()
    plt.close("all")
