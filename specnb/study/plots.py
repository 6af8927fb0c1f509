"""One figure style for every notebook: a colour and a display name per method, sorted bars with their values and
intervals, one colour scale per metric across panels, legends off the data, and saving a figure with its data.

* :func:`use_style`: :data:`STYLE` applied to matplotlib (the notebooks call it; importing this module changes no
  setting).
* :data:`STYLES` / :func:`style`: the same method has the same colour and name in every figure (a label such as
  ``"DReSD 10×6, OOD store"`` takes its method's by prefix: :func:`method_of`); datasets and temperatures go to
  markers and line styles (:data:`MARKERS`, :data:`LINESTYLES`), never to colour.
* :func:`hbars`: horizontal bars, the value printed at the end of each bar, the 90% interval drawn; :func:`dots`
  for values near a ceiling (a bar from zero hides their differences). One row order per figure, the first panel's,
  kept in every later panel: methods in the study's one order (:func:`method_rank`, as legends list them), other
  rows sorted by value.
* :func:`stacked_shares`: shares of calls (a router's picks) as stacked horizontal bars, one per row, values printed.
* :func:`series_colors` (distinct hues for three or more series that are not methods) and
  :func:`line_with_interval` (a band for a lone series, capped error bars when several share a panel).
* :func:`shared_norm`, :data:`SPEEDUP_NORM`, :data:`TOKENS_PER_CALL_NORM` and :func:`heatmap`: every panel of a
  figure on one colour scale per metric; every speedup of the study on one fixed diverging scale centred at 1.
* :func:`legend_outside`, :func:`log_axis` (major ticks only, plain numbers).
* :func:`add_shade_key`: a key to every shade of a method's colour (ID store darker, priced lighter) a figure fills.
* :func:`save_figure`: ``figures/NAME.png`` and ``figures/NAME.csv``, so a reader can re-plot or check any number.
  Under ``specnb notebooks run`` (``SPECNB_STRICT_FIGURES=1``) it first refuses a figure whose text artists
  overlap, whose panel shows a single value, or whose hatch, outline or tint no legend names
  (:func:`layout_problems`).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import textwrap
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.axis import Axis
from matplotlib.colors import LogNorm, Normalize, to_hex, to_rgb
from matplotlib.ticker import FuncFormatter, Locator, NullLocator, ScalarFormatter
from PIL import Image

from ..atomic import atomic_file, write_csv, write_text
from ..eval.methods import METHODS

STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 100,
    "figure.constrained_layout.use": True,
    "savefig.dpi": 110,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 9,
    "axes.titlesize": 9,
    "legend.fontsize": 8,
    "legend.frameon": False,
}


def use_style() -> None:
    """Apply :data:`STYLE` to matplotlib's ``rcParams`` for the rest of the process: the notebooks call it in their
    first cell after the parameters, so that importing this module changes no global setting."""
    plt.rcParams.update(STYLE)


@dataclass(frozen=True)
class MethodStyle:
    label: str  # the display name in every figure
    color: str


COLORS: dict[str, str] = {
    # baselines: greys (ours darkest), llama.cpp gold
    "ar": "#636363", "hf": "#a3a3a3", "hf-pld": "#c4c4c4", "hf-assisted": "#dedede",
    "llamacpp": "#b8860b", "llamacpp-pld": "#e3c565",
    # context and model n-grams (N-Grammys)
    "pld": "#1f77b4", "ngram-unigram": "#393b79", "ngram-bigram": "#bcbd22", "mixed": "#9edae5",
    "mixed-adaptive": "#17becf",
    # retrieval: one hue each, the ID store darker, the priced form lighter (:data:`SHADES`: a key names them)
    "rest": "#ff7f0e", "rest-id": "#a64f00", "rest-priced": "#ffa95e", "crest": "#2ca02c", "crest-priced": "#74c476",
    "dense": "#d62728", "dense-id": "#8b1a1a", "dense-priced": "#ef6f6c",
    # draft models
    "sd": "#6a3d9a", "mcsd": "#cab2d6",  # one family, dark and light (ColorBrewer Paired)
    # beyond the seed papers
    "suffix": "#e377c2", "recycle": "#8c564b", "auto": "#111111",
    # a router's calls with no draft
    "-": "#e8e8e8",
}
"""Method key (the bench's name) -> its colour in every figure of every notebook; the order is the legends'."""

NOT_METHODS = {"rest-id": "REST, ID store", "dense-id": "DReSD, ID store", "-": "no draft"}
"""Display names of the keys that are not methods of the registry: REST and DReSD on their ID stores, a router's
calls with no draft."""

SHADES: dict[str, tuple[str, str, str]] = {
    "-id": ("ID store", "OOD store", "dark: the in-distribution (ID) store"),
    "-priced": ("priced", "whole tree", "light: priced, the tree cut to the node budget that pays on this machine"),
}
"""Suffix of a shade's key (``dense-id``, ``rest-priced``) -> (what the shade's row is, what its base colour's row is
then, the legend title's note): a figure that fills a bar or a dot with a shade gets a key naming each shade and the
base colour beside it (:func:`add_shade_key`, called by :func:`save_figure`; :func:`key_problems` refuses one
without)."""

REFERENCES = {"best": "best single", "ceiling": "retrieval ceiling"}
"""What a ratio is taken over when it is not a method (:func:`label`): the fastest single method timed on the
same prompts, the tokens per call no retrieval drafter can beat (notebook 10)."""

STYLES: dict[str, MethodStyle] = {key: MethodStyle(NOT_METHODS[key] if key in NOT_METHODS else METHODS[key].label,
                                                   color) for key, color in COLORS.items()}
"""Method key -> its display name (the registry's, :data:`specnb.eval.methods.METHODS`: one name per method in
every figure, short enough for a tick label) and colour."""

ALIASES = {
    "prompt lookup": "pld", "context n-grams": "pld", "context": "pld", "ar": "ar", "baseline (ar)": "ar",
    "model bigram": "ngram-bigram", "bigram": "ngram-bigram", "extended bigram": "ngram-bigram",
    "model unigram": "ngram-unigram", "unigram": "ngram-unigram", "mixed-adaptive": "mixed-adaptive",
    "mixed": "mixed", "rest": "rest", "crest": "crest", "dresd": "dense", "dense": "dense",
    "draft model": "sd", "sd": "sd", "vanilla sd": "sd", "mcsd": "mcsd", "mcss": "mcsd", "mcns": "mcsd",
    "suffix": "suffix", "recycle": "recycle", "auto": "auto", "hf": "hf", "llamacpp": "llamacpp",
}
"""Labels the notebooks use for a method (lower case) -> its key in :data:`STYLES`."""

MARKERS = ("o", "s", "^", "D", "v", "P")
"""Markers for what is not a method (dataset, temperature, store): the i-th value gets the i-th marker."""
LINESTYLES = ("-", "--", ":", "-.")


def method_of(label: str) -> str:
    """The :data:`STYLES` key of ``label``: itself, or the longest key / alias ``label`` starts with
    (``"DReSD 10×6, OOD store"`` -> ``dense``, ``"REST priced"`` -> ``rest-priced``, ``"mixed (10,10)"`` -> ``mixed``).
    KeyError names the label when nothing matches: every method a figure shows needs its entry."""
    text = label.strip().lower()
    if text in STYLES:
        return text
    names = {**{k: k for k in STYLES}, **ALIASES}
    matches = [name for name in names if text.startswith(name)]
    if not matches:
        raise KeyError(f"no colour for method {label!r}: add it to specnb.study.plots.COLORS (or ALIASES)")
    key = names[max(matches, key=len)]
    if "priced" in text and f"{key}-priced" in STYLES:
        return f"{key}-priced"
    if ("-id" in text or " id" in text) and f"{key}-id" in STYLES:
        return f"{key}-id"
    return key


def style(label: str) -> MethodStyle:
    """The colour of ``label``'s method and ``label``'s display name (the method's own when ``label`` is its key)."""
    key = method_of(label)
    return STYLES[key] if label.strip().lower() == key else MethodStyle(label, STYLES[key].color)


def color(label: str) -> str:
    return style(label).color


def label(name: str) -> str:
    """The display name of a method key (``pld`` -> ``prompt lookup``) or of a :data:`REFERENCES` key (``best`` ->
    ``best single``); any other label is kept."""
    return STYLES[name].label if name in STYLES else REFERENCES.get(name, name)


def model_label(name: str) -> str:
    """A model's name as a figure prints it: a self-draft (``gemma-3-270m:self:12``,
    :func:`specnb.drafters.draft_model.self_draft`) as "gemma-3-270m's first 12 layers", any other name as is."""
    parts = name.rsplit(":", 2)
    return f"{parts[0]}'s first {parts[2]} layers" if len(parts) == 3 and parts[1] == "self" else name


def _method_key(label: str) -> str | None:
    """``label``'s method key (a display name such as ``"Token Recycling"`` included), None for a label that
    names no method."""
    names = {style.label.lower(): key for key, style in METHODS.items()}
    try:
        return names.get(label.strip().lower()) or method_of(label)
    except KeyError:
        return None


def method_rank(label: str) -> int | None:
    """The place of ``label``'s method in the study's one method order (the order of :data:`METHODS`: baselines,
    n-grams, retrieval, draft models, the rest), or None for a label that names no method: legends list methods
    in this order in every figure, so a reader finds a method at the same place everywhere. A shade of a method
    (:data:`SHADES`: ``dense-id``, ``rest-priced``) takes its method's place."""
    key = _method_key(label)
    for suffix in SHADES:  # a shade (DReSD on its ID store, REST priced) sits with its method
        if key is not None and key.endswith(suffix) and key.removesuffix(suffix) in METHODS:
            key = key.removesuffix(suffix)
    return list(METHODS).index(key) if key in METHODS else None


def display_names(keys: Iterable[str]) -> list[str]:
    """The display name of each method key of a figure's rows, as the figure's shade key names it
    (:func:`shade_entries`): a method whose shade is also among ``keys`` (``rest`` beside ``rest-priced``) is
    named with what its own colour's row is then (``REST, whole tree``), so a row and its key entry read alike."""
    keys = list(keys)
    names = []
    for key in keys:
        shown = [base_is for suffix, (_, base_is, _) in SHADES.items() if key in STYLES and f"{key}{suffix}" in keys]
        names.append(", ".join([label(key), *shown]))
    return names


MCSD_SCHEMES: dict[str, str] = {"MCSS w/o replacement": "#3f007d", "MCSS w/ replacement": "#6a51a3",
                                "MCNS (naive sampling)": "#9e9ac8"}
"""MCSD's sampling schemes (:data:`specnb.experiments.mcsd.SCHEMES`' display names) -> one colour each, the same
in every figure: dark to mid purple, MCSD's hue; SD is plum, apart from all three (a scheme is not SD)."""


def scheme_color(scheme: str) -> str:
    """The colour of one of MCSD's sampling schemes (:data:`MCSD_SCHEMES`); KeyError names a scheme without one."""
    if scheme not in MCSD_SCHEMES:
        raise KeyError(f"no colour for MCSD scheme {scheme!r}: add it to specnb.study.plots.MCSD_SCHEMES")
    return MCSD_SCHEMES[scheme]


def darker(hue: str) -> tuple[float, float, float]:
    """``hue`` at 60% of its brightness: an interval's colour beside its dot, seen even when the hue is pale."""
    return tuple(0.6 * np.asarray(to_rgb(hue)))


VARIANT_SHADES = (0.0, -0.45, 0.45, -0.7, 0.7)
"""A method's variants in a figure, in order: its own colour, then darker (negative: towards black) and lighter
(towards white) shades in turn, so that neighbours in a legend differ most."""


def method_colors(labels: Sequence[str]) -> dict[str, str]:
    """label -> colour for series that are methods or variants of one (``"bigram (w=1)"``, ``"extended bigram
    (w=2)"``): each method's first label its own colour (:func:`color`), its later variants the shades of
    :data:`VARIANT_SHADES` of that hue (darker, lighter, ...), so a method reads the same in every figure and its
    variants stay apart (lighter tints alone left the third a near-white line)."""
    colors: dict[str, str] = {}
    seen: dict[str, int] = {}
    for name in labels:
        key = method_of(name)
        shade = VARIANT_SHADES[seen.get(key, 0) % len(VARIANT_SHADES)]
        rgb = np.asarray(to_rgb(color(name)))
        colors[name] = to_hex(rgb * (1 + shade) if shade < 0 else (1 - shade) * rgb + shade)
        seen[key] = seen.get(key, 0) + 1
    return colors


def series_colors(n: int) -> list[str]:
    """Colours for ``n`` series that are not methods (store sizes, n-gram orders, context lengths), in their
    order: dark and mid grey for one or two (a method's hue stays its own), distinct hues from a dark-to-light
    ramp (viridis, its palest end left out) for three or more, so that every series can be told apart."""
    if n <= 2:
        return ["0.15", "0.55"][:n]
    return [to_hex(plt.cm.viridis(x)) for x in np.linspace(0.0, 0.85, n)]


def interval_of(frame: pd.DataFrame, column: str) -> tuple[pd.Series | None, pd.Series | None]:
    """``column``'s 90% interval in ``frame`` (its ``<column>_low`` / ``<column>_high``), or (None, None) where the
    frame has none: what :func:`line_with_interval` takes."""
    return (frame[f"{column}_low"], frame[f"{column}_high"]) if f"{column}_low" in frame else (None, None)


def line_with_interval(ax: plt.Axes, x, y, low, high, *, band: bool, label: str, color: str, **line) -> None:
    """A line with its 90% interval [low, high]: a translucent band when it is the panel's only series
    (``band``; the band is named "<label>, 90% interval" in the legend), else capped error bars, which stay
    readable when several series' intervals overlap (stacked bands blur into one tint). A plain line where ``low``
    is None (a measure without an interval)."""
    if low is None:
        ax.plot(x, y, color=color, label=label, **line)
        return
    x, y, low, high = (np.asarray(v, dtype=float) for v in (x, y, low, high))
    if band:
        ax.plot(x, y, color=color, label=label, **line)
        ax.fill_between(x, low, high, color=color, alpha=0.2, lw=0, label=f"{label}, 90% interval")
    else:
        ax.errorbar(x, y, yerr=[np.clip(y - low, 0, None), np.clip(high - y, 0, None)], color=color, label=label,
                    capsize=2.5, elinewidth=0.8, **line)


# ------------------------------------------------------------------------------------------------ bars


_BAR_PANELS: weakref.WeakSet[plt.Axes] = weakref.WeakSet()  # the axes hbars or dots has drawn on
_ROW_ORDERS: weakref.WeakKeyDictionary[plt.Figure, list[str]] = weakref.WeakKeyDictionary()  # bottom to top
_SERIES_ORDERS: weakref.WeakKeyDictionary[plt.Figure, list[str]] = weakref.WeakKeyDictionary()  # series_panels'


def _value_rows(ax: plt.Axes, labels: Sequence[str], values: Sequence[float], low: Sequence[float] | None,
                high: Sequence[float] | None, colors: Sequence[str] | None, what: str,
                keep_order: bool = False) -> pd.DataFrame:
    """The rows of a bar or dot panel (label, value, low, high, color), bottom to top in the figure's one row
    order. The first panel of a figure sets it: rows that all name methods in the study's one method order
    (:func:`method_rank`, first on top, variants of one method as given), so that a method sits at the same place
    in every figure; other rows sorted by value (largest on top, ties as given). A later panel whose labels that
    order holds keeps it, so a row is at the same height in every panel (one re-sorted per panel reads as another
    ranking); one whose labels differ but name the same methods, one row each (``mixed (1, 10)`` and ``mixed (1,
    6)``), keeps it by method. Raises DegenerateData when the values do not vary. ``keep_order``: the first panel
    keeps the rows as given, first on top (an ordered quantity such as dimensions, or groups a reader compares)."""
    from ..eval.checks import check_varies

    frame = pd.DataFrame({"label": list(labels), "value": np.asarray(values, dtype=float)})
    frame["low"] = np.asarray(low, dtype=float) if low is not None else np.nan
    frame["high"] = np.asarray(high, dtype=float) if high is not None else np.nan
    frame["color"] = list(colors) if colors is not None else [color(x) for x in frame.label]
    check_varies(frame.value, what)
    order = _ROW_ORDERS.get(ax.figure)
    for key in (str, _method_key) if order is not None else ():  # the same labels, else the same methods
        known = {key(name): i for i, name in enumerate(order)}
        rank = frame.label.map(lambda name: known.get(key(name)))  # noqa: B023 (used at once)
        if len(known) == len(order) and rank.notna().all() and rank.is_unique:
            return frame.iloc[np.argsort(rank.to_numpy(), kind="stable")].reset_index(drop=True)
    ranks = frame.label.map(method_rank)
    if not keep_order and ranks.notna().all():
        frame = frame.iloc[np.argsort(ranks.to_numpy(dtype=float), kind="stable")]
    elif not keep_order:
        frame = frame.sort_values("value", ascending=False, kind="stable")
    frame = frame.iloc[::-1].reset_index(drop=True)
    _ROW_ORDERS.setdefault(ax.figure, list(frame.label))
    return frame


def _print_value(ax: plt.Axes, x: float, y: float, text: str, ha: str) -> None:
    """A value printed beside its bar or dot, on a white ground: a reference line through it stays behind it."""
    ax.text(x, y, text, va="center", ha=ha, fontsize=7, zorder=4,
            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"})


def _set_shared_xlim(ax: plt.Axes, left: float, right: float) -> None:
    """Set ``ax``'s x limits; on a panel sharing its x axis with one :func:`hbars` or :func:`dots` drew before, the
    axis only grows, so every panel's values and labels stay in view."""
    if any(other in _BAR_PANELS for other in ax.get_shared_x_axes().get_siblings(ax) if other is not ax):
        shown = ax.get_xlim()
        left, right = min(left, shown[0]), max(right, shown[1])
    _BAR_PANELS.add(ax)
    ax.set_xlim(left, right)


def _print_beside(ax: plt.Axes, y: float, value: float, low: float, high: float, text: str, *, span: float,
                  per_inch: float, reference: float | None, log: bool = False) -> float:
    """Print ``text`` past a dot's interval [low, high] (NaN: none), or before it when the text would cross the
    ``reference`` line there (a value jumped past the line reads as another row's; on its white ground it would
    hide the line). ``span``: the data range (the gap is a share of it); ``per_inch``: data units per inch of text;
    with ``log``, both in decades of a log axis. Returns the leftmost x the text reaches (the axis must hold it)."""
    to, back = (np.log10, lambda v: 10.0**v) if log else (float, float)
    value, low, high = to(value), to(low), to(high)
    reference = None if reference is None else to(reference)
    x, ha, width = np.nanmax([value, high]) + 0.025 * span, "left", (len(text) * 0.6 * 7 / 72 + 0.05) * per_inch
    if reference is not None and x < reference < x + width:
        x, ha = np.nanmin([value, low]) - 0.025 * span, "right"
    _print_value(ax, back(x), y, text, ha)
    return back(x - width if ha == "right" else x)


def hbars(ax: plt.Axes, labels: Sequence[str], values: Sequence[float], low: Sequence[float] | None = None,
          high: Sequence[float] | None = None, *, fmt: str = "{:.2f}", reference: float | None = None,
          colors: Sequence[str] | None = None, xlabel: str = "",
          also: tuple[str, str, Sequence[float]] | None = None, keep_order: bool = False) -> plt.Axes:
    """Horizontal bars in the figure's row order (:func:`_value_rows`: methods in the study's order), each value
    printed past its bar (and past its interval), the 90% interval [low, high] drawn as an error bar;
    ``reference`` draws a thin vertical line (1 for speedups), always in view. Negative values extend left of 0
    (a difference, a gain). On a panel sharing its x axis with one drawn before, the axis only grows, so every
    panel's labels stay in view.
    Colours: the methods' (:func:`color` of each label) unless ``colors`` are given. Labels are display names.
    also: (name, tag, values): a second statistic of each row (a 90th percentile beside a median), drawn as a black
    tick on its row and named ``name`` in the legend (:func:`legend_outside`); the printed text goes past it and
    names both numbers ("0.153 · p90 0.262"): a lone number beside the tick would read as the tick's.
    keep_order: rows as given, first on top (:func:`_value_rows`)."""
    frame = _value_rows(ax, labels, values, low, high, colors, f"bars of {xlabel or ax.get_title() or 'a panel'}",
                        keep_order)
    extra = frame.label.map(dict(zip(labels, np.asarray(also[2], dtype=float), strict=True))) if also else None
    y = np.arange(len(frame))
    ax.barh(y, frame.value, color=frame.color, edgecolor="0.3", linewidth=0.4, height=0.7)
    has = frame.low.notna() & frame.high.notna()
    if has.any():
        err = np.vstack([(frame.value - frame.low)[has].clip(lower=0), (frame.high - frame.value)[has].clip(lower=0)])
        bars = ax.errorbar(frame.value[has], y[has], xerr=err, fmt="none", ecolor="0.1", elinewidth=0.9, capsize=2.5)
        for line in [*bars.lines[1], *bars.lines[2]]:  # a white rim: visible on dark bars too
            line.set_path_effects([patheffects.withStroke(linewidth=2.4, foreground="white")])
    if extra is not None:
        ax.scatter(extra, y, marker="|", s=90, linewidths=1.6, color="black", zorder=3, label=also[0])
    right = np.fmax(frame.value, frame.high.fillna(-np.inf))  # where a positive bar's label goes
    right = right if extra is None else np.fmax(right, extra.fillna(-np.inf))
    left = np.fmin(frame.value, frame.low.fillna(np.inf))  # and a negative one's
    marks = np.asarray([0.0, *right, *left] + ([reference] if reference is not None else []), dtype=float)
    marks = marks[np.isfinite(marks)]  # a missing value (NaN, no bar) has no end
    lo, hi = float(marks.min()), float(marks.max())
    span = max(hi - lo, 1e-12)
    longest = 0
    for i, (yi, r, le, value) in enumerate(zip(y, right, left, frame.value, strict=True)):
        if np.isfinite(value):
            text = fmt.format(value)
            if extra is not None and np.isfinite(extra.iloc[i]):
                text += f" · {also[1]} {fmt.format(extra.iloc[i])}"
            longest = max(longest, len(text))
            _print_value(ax, r + 0.015 * span if value >= 0 else le - 0.015 * span, yi, text,
                         "left" if value >= 0 else "right")
    if reference is not None:
        ax.axvline(reference, color="0.2", lw=0.8, zorder=0)
    ax.set_yticks(y, [label(x) for x in frame.label])
    # room for the printed values (~0.6 em a character at 7 pt) on an axis of span + room data units
    text, width = longest * 0.6 * 7 / 72 + 0.05, ax.get_position().width * ax.figure.get_figwidth()
    room = max(0.18, 0.03 + 1.15 * text / max(width - 1.15 * text, 0.25 * width)) * span
    _set_shared_xlim(ax, lo - (room if lo < 0 else 0), hi + (room if hi > 0 else 0))
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", visible=False)
    return ax


def dots(ax: plt.Axes, labels: Sequence[str], values: Sequence[float], low: Sequence[float] | None = None,
         high: Sequence[float] | None = None, *, fmt: str = "{:.3f}", colors: Sequence[str] | None = None,
         xlabel: str = "", ranges: Mapping[str, tuple[float, float]] | None = None, range_label: str = "",
         keep_order: bool = False, spans: Mapping[str, tuple[float, float]] | None = None, span_label: str = "",
         reference: float | None = None, reference_label: str = "", ceiling: float | None = None) -> plt.Axes:
    """A dot per label with its 90% interval [low, high] as capped error bars and its value printed beside it
    (:func:`_print_beside`), rows in the figure's order as :func:`hbars`: for values near a ceiling (MRR, recall),
    where a bar from zero spends the axis on the part every bar shares. The x axis spans the values, ranges and
    printed values only; on panels sharing it, it only grows (:func:`_set_shared_xlim`).

    ranges: label -> (low, high) of a published value (low == high: a single number, printed beside its diamond
    too), drawn in black on a row of its own right under the label's row, that row named ``range_label``; or
    (low, high, value): an estimate's interval, its value a diamond on the bar, printed beside it.

    spans: label -> (low, high) of a published range drawn instead as a light grey bar (:data:`SPAN_COLOR`) behind
    the label's own dot, named ``span_label`` in the legend (:func:`legend_outside`): a reader compares the dot
    with the range on one row. reference: a thin vertical line (1 for tokens per call: no speculation), always in
    view, named ``reference_label`` in the legend when given. ceiling: the measure's largest possible value (1 for
    MRR): no tick past it, the room there holds printed values only (an axis ticked to 1.1 offers MRRs above 1)."""
    frame = _value_rows(ax, labels, values, low, high, colors, f"dots of {xlabel or ax.get_title() or 'a panel'}",
                        keep_order)
    ranges, spans = dict(ranges or {}), dict(spans or {})
    ticks: list[tuple[float, str, bool]] = []  # (y, tick label, a published range's row)
    y = 0.0
    points: list[tuple[float, float, float, float]] = []  # (y, value, low, high) of the ranges with a value: printed
    for row in frame.itertuples():
        if row.label in ranges:
            lo, hi, *value = ranges[row.label]
            if lo == hi:
                ax.plot([lo], [y], "D", color="black", ms=4)
                points.append((y, lo, lo, lo))
            else:
                ax.plot([lo, hi], [y, y], color="black", lw=3, solid_capstyle="butt")
                if value:
                    ax.plot(value, [y], "D", color="white", mec="black", mew=1, ms=4, zorder=4)
                    points.append((y, value[0], lo, hi))
            ticks.append((y, range_label, True))
            y += 0.8
        if row.label in spans:
            lo, hi = spans[row.label]
            first = not any(bars.get_label() == span_label for bars in ax.containers)
            ax.barh([y], [hi - lo], left=lo, height=0.6, color=SPAN_COLOR, lw=0, zorder=0,
                    label=span_label if first else "_nolegend_")
        if np.isfinite(row.low) and np.isfinite(row.high):  # in a darker shade of the dot's: a pale hue stays seen
            ax.errorbar([row.value], [y], xerr=[[max(row.value - row.low, 0)], [max(row.high - row.value, 0)]],
                        fmt="none", ecolor=darker(row.color), capsize=3, elinewidth=1)
        ticks.append((y, label(row.label), False))
        y += 1.0
    rows = [t for t in ticks if not t[2]]
    ax.scatter(frame.value, [t[0] for t in rows], color=list(frame.color), s=30, zorder=3, edgecolors="0.1",
               linewidths=0.4)
    marks = np.asarray([*frame.value, *frame.low, *frame.high, *(v for r in ranges.values() for v in r),
                        *np.ravel(list(spans.values())), *([reference] if reference is not None else [])], dtype=float)
    marks = marks[np.isfinite(marks)]
    lo, hi = float(marks.min()), float(marks.max())
    span = max(hi - lo, 1e-3 * max(abs(hi), 1e-12))
    if any(other in _BAR_PANELS for other in ax.get_shared_x_axes().get_siblings(ax) if other is not ax):
        span = max(span, float(np.ptp(ax.get_xlim())) / 1.33)  # the shared axis' span: gaps and text widths on it
    per_inch = 1.3 * 1.33 * span / (ax.get_position().width * ax.figure.get_figwidth())
    for (yi, _, _), row in zip(rows, frame.itertuples(), strict=True):
        if np.isfinite(row.value):  # a value not measured (NaN): its row stays empty
            lo = min(lo, _print_beside(ax, yi, row.value, row.low, row.high, fmt.format(row.value), span=span,
                                       per_inch=per_inch, reference=reference))
    for yi, value, low, high in points:
        if np.isfinite(value):
            lo = min(lo, _print_beside(ax, yi, value, low, high, fmt.format(value), span=span, per_inch=per_inch,
                                       reference=reference))
    if reference is not None:
        ax.axvline(reference, color="0.2", lw=0.8, zorder=0, label=reference_label or "_nolegend_")
    ax.set_yticks([t[0] for t in ticks], [t[1] for t in ticks])
    for tick, (_, _, published) in zip(ax.get_yticklabels(), ticks, strict=True):
        if published:
            tick.set(fontsize=7, color="0.3")
    ax.set_ylim(-0.6, y - 0.4)
    _set_shared_xlim(ax, lo - 0.08 * span, hi + 0.25 * span)
    if ceiling is not None:
        left, right = ax.get_xlim()
        ax.set_xticks([t for t in ax.get_xticks() if left <= t <= min(right, ceiling + 1e-9)])
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", visible=False)
    return ax


SPAN_COLOR = "0.85"  # a published range behind a dot (:func:`dots`): light grey, no method's hue


SHARED = "+"
"""Suffix of a :func:`stacked_shares` column holding a method's share of calls it drafted together with another
(a router's merged trees): drawn in the method's colour, hatched with :data:`SHARED_HATCH`, one key entry."""
SHARED_HATCH = "////"


def stacked_shares(ax: plt.Axes, shares: pd.DataFrame, *, min_printed: float = 0.12, fmt: str = "{:.0%}",
                   xlabel: str = "share of calls") -> plt.Axes:
    """One horizontal bar per row of ``shares`` (index: row labels, first on top; columns: method keys such as a
    router's members, ``-`` (no draft) and ``<key>+`` (:data:`SHARED`: that method's share of calls merged with
    another) included; each row sums to 1), split into opaque segments in the methods' colours (named in the
    legend: :func:`legend_outside`) in the columns' order, a shared share hatched (one key entry names the hatch),
    each share of at least ``min_printed`` printed inside its segment (dark text on a light colour, white on a dark
    one). A last row that pools the others (``all calls``) is set off from them by a gap. Where one method took
    every call of every row, the panel says so in a sentence instead: its bars would all be one length."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    taken = [key for key in shares.columns if (shares[key].to_numpy(dtype=float) > 0).any()]
    if len(taken) == 1:
        ax.text(0.5, 0.5, f"every call of every prompt:\n{label(taken[0])}", transform=ax.transAxes,
                ha="center", va="center", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel(xlabel)
        return ax
    rows = list(shares.index)
    gap = 0.6 if len(rows) > 2 and str(rows[-1]).startswith("all") else 0.0
    y = np.array([len(rows) - 1 - i + gap for i in range(len(rows) - 1)] + [0.0]) if gap else \
        np.arange(len(rows))[::-1].astype(float)
    left = np.zeros(len(rows))
    for key in shares.columns:
        width = shares[key].to_numpy(dtype=float)
        shared = key.endswith(SHARED)
        fill = color(key.removesuffix(SHARED))
        ax.barh(y, width, left=left, height=0.8, color=fill, edgecolor="white", linewidth=0.6,
                hatch=SHARED_HATCH if shared else None, label="_nolegend_" if shared else label(key))
        dark = float(np.dot(to_rgb(fill), (0.299, 0.587, 0.114))) < 0.5
        for yi, x0, w in zip(y, left, width, strict=True):
            if w >= min_printed:
                ax.text(x0 + w / 2, yi, fmt.format(w), ha="center", va="center", fontsize=6.5,
                        color="white" if dark else "0.1",
                        bbox={"boxstyle": "round,pad=0.3", "facecolor": fill, "edgecolor": "none"} if shared else None)
        left = left + width
    if any(key.endswith(SHARED) for key in taken):
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor="0.6", edgecolor="white", hatch=SHARED_HATCH, lw=0,
                               label="hatched: calls merged with another member (half to each)"))
    ax.set_yticks(y, rows)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.6, float(y.max()) + 0.6)
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", visible=False)
    return ax


def paired_ratios(ax: plt.Axes, frame: pd.DataFrame, *, xlabel: str, fmt: str = "×{:.2f}",
                  reference: float = 1.0, band: Band | None = None, span_label: str = "") -> plt.Axes:
    """The ratios a claim is about, one method over another on the same prompts, in one panel: a dot per ratio
    with its paired 90% interval (capped error bars), its value printed beside it (:func:`_print_beside`), and a
    reference line at ``reference`` (1: as good as the other). Unpaired bars of the two methods hide a shared
    per-prompt effect under intervals as wide as the prompts differ; the paired ratio shows it. Ratios spanning
    more than :data:`RATIO_SPAN_LOG` are drawn on a log axis (labelled "(log)").

    frame: one row per ratio, columns ``row`` (its tick label, e.g. "SuffixDecoding / prompt lookup"),
    ``value``, ``low``, ``high`` (the interval, NaN when there is none: no bar) and ``method`` (the colour: the
    numerator's, :func:`color`); optional ``group`` (a prompt set, a corpus): every group gets a sub-row of its
    own under each row and a marker (:data:`MARKERS`), named by an entry for :func:`legend_outside`. Rows are
    drawn in the frame's order, first on top (the claims' order, never re-sorted). Raises DegenerateData when
    fewer than one value is finite.

    band: the tolerance a verdict judges some rows by (:class:`Band`: a cost model's prediction within 15% of 1), a
    shaded region behind those rows only, named in the legend (:func:`legend_outside`).

    span_label: with columns ``span_low`` / ``span_high`` (a published ratio's range), each row's range drawn as a
    light grey bar behind its dot (:func:`dots`' ``spans``), named ``span_label`` in the legend; one narrower than
    :data:`NARROW_SPAN` of the axis gets a grey tick of a visible width at its middle too."""
    from matplotlib.lines import Line2D

    from ..eval.checks import DegenerateData

    frame = frame.reset_index(drop=True)
    if "group" in frame and frame.duplicated(["row", "group"]).any():
        raise ValueError(f"two ratios share a row and a group: {frame[frame.duplicated(['row', 'group'])].iloc[0]}")
    values = frame.value.to_numpy(dtype=float)
    if not np.isfinite(values).any():
        raise DegenerateData(f"ratios of {xlabel}: no finite value")
    rows = list(dict.fromkeys(frame.row))
    groups = list(dict.fromkeys(frame.group)) if "group" in frame else [None]
    block = len(groups) + (0.6 if len(groups) > 1 else 0.0)  # a gap between rows of several sub-rows
    top = (len(rows) - 1) * block + len(groups) - 1
    marks = [reference]
    for r in frame.itertuples():
        i, j = rows.index(r.row), groups.index(getattr(r, "group", None))
        y = top - i * block - j
        hue = color(r.method) if isinstance(getattr(r, "method", None), str) else "0.2"
        if np.isfinite(r.low) and np.isfinite(r.high):  # in a darker shade of the dot's: a pale hue stays seen
            ax.errorbar([r.value], [y], xerr=[[max(r.value - r.low, 0)], [max(r.high - r.value, 0)]], fmt="none",
                        ecolor=darker(hue), capsize=3, elinewidth=1.1)
            marks += [r.low, r.high]
        if span_label and np.isfinite(getattr(r, "span_low", np.nan)) and np.isfinite(getattr(r, "span_high", np.nan)):
            first = not any(bars.get_label() == span_label for bars in ax.containers)
            ax.barh([y], [r.span_high - r.span_low], left=r.span_low, height=0.6, color=SPAN_COLOR, lw=0, zorder=0,
                    label=span_label if first else "_nolegend_")
            marks += [r.span_low, r.span_high]
        if np.isfinite(r.value):  # a ratio not measured (NaN): its sub-row stays empty
            ax.scatter([r.value], [y], color=hue, marker=MARKERS[j % len(MARKERS)], s=32, zorder=3,
                       edgecolors="0.1", linewidths=0.4)
            marks.append(r.value)
    marks += [band.low, band.high] if band is not None else []  # the whole band in view
    finite = np.asarray([m for m in marks if np.isfinite(m)], dtype=float)
    log = finite.min() > 0 and finite.max() > RATIO_SPAN_LOG * finite.min()
    to, back = (np.log10, lambda v: 10.0**v) if log else (float, float)
    lo, hi = float(to(finite.min())), float(to(finite.max()))
    span = max(hi - lo, 1e-3 * max(abs(hi), 1e-12))
    # data units (decades on a log axis) per inch of text, with room for the tick labels' share after layout
    per_inch = 1.3 * 1.6 * span / (ax.get_position().width * ax.figure.get_figwidth())
    for r in frame.itertuples():
        if np.isfinite(r.value):
            i, j = rows.index(r.row), groups.index(getattr(r, "group", None))
            lo = min(lo, float(to(_print_beside(ax, top - i * block - j, r.value, r.low, r.high, fmt.format(r.value),
                                                span=span, per_inch=per_inch, reference=reference, log=log))))
    ax.axvline(reference, color="0.2", lw=0.8, zorder=0)
    if band is not None:  # behind the rows it judges, from the top of the first to the bottom of the last
        spans = [i for i, row in enumerate(rows) if band.rows is None or row in band.rows]
        if spans:
            ax.fill_betweenx([top - max(spans) * block - len(groups) + 0.5, top - min(spans) * block + 0.5],
                             band.low, band.high, color=BAND_COLOR, alpha=0.35, lw=0, zorder=0, label=band.label)
    centres = [top - i * block - (len(groups) - 1) / 2 for i in range(len(rows))]
    ax.set_yticks(centres, rows)
    ax.set_ylim(-0.7, top + 0.7)
    if log:
        log_axis(ax, "x", ticks=log_ticks(back(lo - 0.08 * span), back(hi + 0.3 * span)))
    ax.set_xlim(back(lo - 0.08 * span), back(hi + 0.3 * span))
    if span_label and {"span_low", "span_high"} <= set(frame):  # a range narrower than a few pixels: a grey tick too
        for r in frame.itertuples():
            width = float(to(r.span_high) - to(r.span_low)) if np.isfinite([r.span_low, r.span_high]).all() else 1.0
            if width < NARROW_SPAN * span:
                i, j = rows.index(r.row), groups.index(getattr(r, "group", None))
                ax.plot([back((to(r.span_low) + to(r.span_high)) / 2)] * 2, [top - i * block - j - 0.3,
                        top - i * block - j + 0.3], color="0.55", lw=2.5, solid_capstyle="butt", zorder=0)
    ax.set_xlabel(xlabel + (" (log)" if log else ""))
    ax.grid(axis="y", visible=False)
    if groups != [None]:
        for j, group in enumerate(groups):  # a marker per group, in the legend (no data: never over the dots)
            ax.add_line(Line2D([], [], marker=MARKERS[j % len(MARKERS)], ls="none", color="0.45", mec="0.1",
                               mew=0.4, ms=6, label=str(group)))
    return ax


RATIO_SPAN_LOG = 4.0
"""Ratios on one panel spanning more than this factor are drawn on a log axis (a ratio of 0.25 is as far from 1 as
one of 4): on a linear one the small ones crowd against zero and the axis runs below it."""

NARROW_SPAN = 0.01  # a published range narrower than this share of its axis is drawn as a tick (it would not show)


@dataclass(frozen=True)
class Band:
    """A tolerance drawn as a shaded region in :func:`paired_ratios`: [low, high] (a verdict's, from
    :mod:`specnb.study.verdicts`, never typed), its legend entry, and the rows it judges (None: every row)."""

    low: float
    high: float
    label: str
    rows: tuple[str, ...] | None = None


BAND_COLOR = "0.6"  # a tolerance's shaded region: grey (no method's hue), behind the dots


REPEAT = 0.02
"""A curve within this share of the previous series' at every point repeats it: beside it, on a panel a couple of
inches tall spanning about its own level, the two draw as one line. A curve whose whole range is within this share
of its largest value is flat (:func:`flat_curve`): the same rule, against its own level."""


def within(a: Iterable[float] | np.ndarray | pd.Series, b: Iterable[float] | np.ndarray | pd.Series) -> bool:
    """Whether ``a`` and ``b`` (aligned, finite where compared) differ by at most :data:`REPEAT` of the larger at
    every point where both are finite (at least one): two curves, two heatmap columns, that read as one."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    both = np.isfinite(a) & np.isfinite(b)
    return bool(both.any() and np.all(np.abs(a[both] - b[both])
                                      <= REPEAT * np.maximum(np.abs(a[both]), np.abs(b[both]))))


def flat_curve(values: Iterable[float] | np.ndarray | pd.Series) -> bool:
    """Whether a curve is flat: its finite values are constant (:func:`near_constant`) or span at most
    :data:`REPEAT` of their largest (n = 4 on chat, 1.00-1.02 tokens per call) - the rule that says a curve repeats
    another, applied to the curve against its own level."""
    v = np.asarray(values, dtype=float).ravel()
    finite = v[np.isfinite(v)]
    return near_constant(finite) or bool(np.ptp(finite) <= REPEAT * np.max(np.abs(finite)))


def unchanged_series(frame: pd.DataFrame, *, panels: str, series: str, x: str, y: str, offset: float = 0.0,
                     same_at: str | None = None) -> dict[tuple, tuple[str, object]]:
    """The curves of :func:`series_panels` a reader learns nothing more from, per (panel value, series value):
    ``("repeats", drawn)`` for a curve within :data:`REPEAT` at every point (matched on ``same_at``, default ``x``:
    an n-gram store's t, where n ≤ 4 stores more n-grams than n ≤ 3 for the same t) of the last series drawn before
    it in the same panel (in increasing order: a chain n ≤ 3, n ≤ 4, n ≤ 5 of repeats is said against n ≤ 3, the
    curve a reader sees, and a curve drifting away from it step by step is drawn once it is more than 2% away),
    and ``("flat", (low, high))`` for a flat curve (:func:`flat_curve`, values only: an interval says nothing of
    whether a curve moves). The curve holding a panel's largest value is never said to repeat another: it is the
    one a takeaway names ("the best store"), and a reader must find it drawn."""
    key = same_at or x
    out: dict[tuple, tuple[str, object]] = {}
    for row in dict.fromkeys(frame[panels]):
        last: tuple[object, pd.Series] | None = None
        panel = frame[frame[panels] == row]
        best = panel[series].loc[panel[y].astype(float).idxmax()] if panel[y].notna().any() else None
        for value in sorted(frame[series].unique()):
            d = panel[panel[series] == value]
            if d.empty:
                continue
            curve = (d.set_index(key)[y] + offset).astype(float).sort_index()
            if flat_curve(curve):
                out[(row, value)] = ("flat", (float(curve.min()), float(curve.max())))
            elif value != best and last is not None and len(curve) > 1 and last[1].index.equals(curve.index) \
                    and within(curve, last[1]):
                out[(row, value)] = ("repeats", last[0])
            else:
                last = (value, curve)
    return out


def drawn_groups(frame: pd.DataFrame, series: str, said: Mapping[tuple, tuple[str, object]],
                 panel: object) -> list[tuple[int, object, pd.DataFrame]]:
    """(i, value, rows) for each value of ``series`` in ``frame`` (first seen first; ``i`` its place among all of
    them, so its hue and marker stay the same in every panel) that :func:`unchanged_series` did not say for
    ``panel``: the curves a panel draws when the others are said in its title (:func:`unchanged_sentence`)."""
    return [(i, value, rows) for i, (value, rows) in enumerate(frame.groupby(series, sort=False))
            if (panel, value) not in said]


def _level(lo: float, hi: float) -> str:
    """A flat curve's level: one number when both ends print alike ("1.00"), else its range ("1.00–1.02")."""
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"


def unchanged_sentence(said: Mapping[tuple, tuple[str, object]], name: str, rows: Sequence, unit: str = "") -> str:
    """One sentence naming what :func:`unchanged_series` found (``""`` when nothing), each repeat against the
    drawn series it repeats: "Not drawn: n ≤ 4, n ≤ 5 within 2% of n ≤ 3 at every point; n ≤ 3 within 2% of n ≤ 2
    at every point on chat; n = 5 flat at 1.00 tokens per call on chat." A clause names the panels it holds for
    unless it holds for every one of ``rows``."""
    def words(kind: str, detail, where: list) -> str:
        if kind == "repeats":
            return f"within {REPEAT:.0%} of {name.format(detail)} at every point"
        level = _level(min(said[(row, value)][1][0] for value, row in where),
                       max(said[(row, value)][1][1] for value, row in where))
        return f"flat at {level}{' ' + unit if unit else ''}"

    phrases: dict[tuple, dict[object, list]] = {}  # what a curve is (repeats X, flat) -> series value -> its panels
    for (row, value), (kind, detail) in said.items():
        phrases.setdefault((kind, detail if kind == "repeats" else None), {}).setdefault(value, []).append(row)
    clauses = []
    for (kind, detail), values in sorted(phrases.items(), key=lambda kv: min(kv[1])):
        by_rows: dict[tuple, list] = {}
        for value in sorted(values):
            by_rows.setdefault(tuple(r for r in rows if r in values[value]), []).append(value)
        for where, group in by_rows.items():
            text = words(kind, detail, [(v, r) for v in group for r in where])
            text += "" if len(where) == len(rows) else " on " + ", ".join(map(str, where))
            clauses.append(f"{', '.join(name.format(v) for v in group)} {text}")
    return "Not drawn: " + "; ".join(clauses) + "." if clauses else ""


def series_panels(frame: pd.DataFrame, *, panels: str, series: str, x: str, y: str, name: str,
                  titles: Mapping[str, str], offset: float = 0.0, title: str = "", same_at: str | None = None,
                  unit: str = "", dodge: float = 1.0) -> tuple[plt.Figure, np.ndarray]:
    """Curves of ``y`` (and its interval, columns ``y_low`` / ``y_high``; all shifted by ``offset``) over ``x``
    for each value of ``series``, overlaid in one panel per value of ``panels`` (side by side, first seen first,
    titled ``titles[value]``), one y scale for all: distinct hues (:func:`series_colors`, by the series' place
    among all of them) and capped error bars, readable where intervals overlap. ``name``: a series' name, ``{}``
    standing for its value (``"n = {}"``). A curve that repeats an earlier series' or stays flat
    (:func:`unchanged_series`, matched on ``same_at``) is not drawn: the suptitle ``title`` gets a second line
    saying so (:func:`unchanged_sentence`, ``unit`` after a flat level). ``dodge`` > 1 (a log x axis): the i-th
    of the n series is drawn at x × dodge ** (i − (n − 1) / 2), so curves that lie on one another stand apart
    (the x label should say so).
    Returns (figure, axes [1, panels])."""
    rows, values = list(dict.fromkeys(frame[panels])), sorted(frame[series].unique())
    said = unchanged_series(frame, panels=panels, series=series, x=x, y=y, offset=offset, same_at=same_at)
    hues = series_colors(len(values))
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows) + 1.6, 3.0), sharey=True, sharex=True,
                             squeeze=False)
    _SERIES_ORDERS[fig] = [name.format(value) for value in values]
    for ax, row in zip(axes[0], rows, strict=True):
        for i, value in enumerate(values):
            d = frame[(frame[panels] == row) & (frame[series] == value)].sort_values(x)
            if d.empty or (row, value) in said:
                continue
            line_with_interval(ax, d[x] * dodge ** (i - (len(values) - 1) / 2), d[y] + offset,
                               d[f"{y}_low"] + offset, d[f"{y}_high"] + offset, band=False,
                               label=name.format(value), color=hues[i], marker=MARKERS[i % len(MARKERS)], ms=3.5, lw=1)
        ax.set_title(titles[row])
    sentence = unchanged_sentence(said, name, rows, unit)
    if title or sentence:
        fig.suptitle("\n".join(t for t in (title, sentence) if t), fontsize=10)  # two lines, not four
    return fig, axes


# ---------------------------------------------------------------------------------------- colour scales


NEAR = 0.01  # values closer than this share of their largest are one value to a reader


def near_constant(values: Iterable[float] | np.ndarray | pd.Series, low: Iterable[float] | None = None,
                  high: Iterable[float] | None = None) -> bool:
    """Whether a series to compare holds nothing to see: fewer than two finite values, all equal, all within
    :data:`NEAR` of their largest, or (with the 90% intervals [low, high]) every value inside every row's
    interval, so that no row differs measurably from another."""
    from ..eval.checks import varies

    v = np.asarray(values, dtype=float).ravel()
    finite = v[np.isfinite(v)]
    if not varies(finite) or np.ptp(finite) <= NEAR * np.max(np.abs(finite)):
        return True
    if low is None or high is None:
        return False
    lo, hi = np.asarray(low, dtype=float).ravel(), np.asarray(high, dtype=float).ravel()
    return bool(np.all(np.isfinite(lo) & np.isfinite(hi)) and finite.max() <= hi.min() and finite.min() >= lo.max())


def constant_instead(values: Iterable[float] | np.ndarray | pd.Series, what: str, low: Iterable[float] | None = None,
                     high: Iterable[float] | None = None, centre: float | None = None) -> bool:
    """Whether the series a figure (or a panel) would compare is constant or nearly so (:func:`near_constant`):
    then one Markdown sentence saying so is displayed in its place and True is returned (skip it). A model that
    accepts no draft (a random tiny Llama) gives such a series; so do transforms that all draft alike.

    centre: for bars each read against a line of no effect (ratios: 1), that value; bars alike but away from it
    are each a finding (two tasks with the same gain) and are drawn: only a series constant at ``centre`` is
    said in words."""
    v = np.ravel(np.asarray(values, dtype=float))
    if not near_constant(v, low, high):
        return False
    if centre is not None:
        inside = low is not None and high is not None and bool(np.all(
            (np.asarray(low, dtype=float) <= centre) & (centre <= np.asarray(high, dtype=float))))
        if not (inside or near_constant(np.append(v, centre))):
            return False
    from IPython.display import Markdown, display

    finite = [float(x) for x in v if np.isfinite(x)]
    lo, hi = (f"{min(finite):.3g}", f"{max(finite):.3g}") if finite else ("undefined", "undefined")
    if lo == hi:
        said = f"is {lo} for every bar"
    elif max(finite) - min(finite) <= NEAR * max(abs(x) for x in finite):
        said = f"stays within {lo}–{hi} (less than {NEAR:.0%} apart) for every bar"
    else:
        said = f"stays within {lo}–{hi}, every value inside every bar's 90% interval"
    display(Markdown(f"*No figure: {what} {said}, so there is nothing to compare.*"))
    return True


ONE_COLOUR = 0.01  # cells within this share of a colour scale's range are one colour to a reader


def flat_on_scale(values: Iterable[float] | np.ndarray | pd.Series, norm: Normalize) -> bool:
    """Whether a heatmap panel of ``values`` on the shared colour scale ``norm`` shows one colour: the values are
    nearly constant (:func:`near_constant`) or span at most :data:`ONE_COLOUR` of the scale (DReSD's 1.03–1.04
    tokens per call on a 1–5 scale). Say such a panel in words (:func:`flat_words`), do not draw it."""
    v = np.asarray(values, dtype=float).ravel()
    finite = v[np.isfinite(v)]
    if near_constant(finite):
        return True
    scaled = np.asarray(norm(finite), dtype=float)  # a log scale's share of its range too
    return bool(np.ptp(scaled) <= ONE_COLOUR)


def flat_words(values: Iterable[float] | np.ndarray | pd.Series, what: str, fmt: str = ".2f") -> str:
    """The words a panel :func:`flat_on_scale` shows instead of its cells: "tokens per call 1.03–1.04 in every
    cell: not drawn" (one number when both ends print alike)."""
    finite = [float(x) for x in np.ravel(np.asarray(values, dtype=float)) if np.isfinite(x)]
    lo, hi = (format(min(finite), fmt), format(max(finite), fmt)) if finite else ("undefined", "undefined")
    return f"{what}\n{lo if lo == hi else f'{lo}–{hi}'} in every cell:\nnot drawn"


def shared_norm(values: Iterable[float] | np.ndarray, *, log: bool = False) -> Normalize:
    """One colour scale for every panel that shows this metric (the finite ``values`` of all of them)."""
    finite = np.asarray([v for v in np.ravel(np.asarray(list(values) if not isinstance(values, np.ndarray)
                                                         else values, dtype=float)) if np.isfinite(v)])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if log and lo > 0 and hi > 2 * lo:
        return LogNorm(lo, hi)
    return Normalize(lo, max(hi, lo + 1e-9))


SPEEDUP_NORM = LogNorm(1 / 3, 3)
"""The one colour scale of every speedup in the study: diverging, linear in log(speedup), centred on 1 (as fast as
the baseline), from ×1/3 to ×3 whatever a figure holds, so one colour means one speedup in every notebook; values
beyond it take the end colours and the colour bar shows an arrow (:func:`shared_colorbar`)."""
SPEEDUP_TICKS = (1 / 3, 0.5, 2 / 3, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)  # labelled with two decimals: 0.80 | 1.00 | 1.25

TOKENS_PER_CALL_NORM = Normalize(1.0, 5.0)
"""The one colour scale of tokens per call (1: autoregressive decoding) in every heatmap of the study."""

SPEEDUP_CMAP = "RdBu"  # red: slower than the baseline, blue: faster
SEQUENTIAL_CMAP = "viridis"


MISSING = "not measured"  # the legend name of a heatmap's grey (blank) cells
OUTLINE = "tab:cyan"  # the colour of a heatmap's outlined cells
TIE_LABEL = "interval holds 1: a tie"  # the key of a speedup cell so framed
UNSURE = "0.45"  # the dashed frame of a heatmap cell whose interval holds its reference line


def heatmap(table: pd.DataFrame, ax: plt.Axes, *, norm: Normalize, fmt: str = ".2f", cmap: str = SEQUENTIAL_CMAP,
            label: str = "", colorbar: bool = True, outline: np.ndarray | None = None,
            outline_label: str = "", unsure: np.ndarray | None = None, unsure_label: str = "",
            doubtful: np.ndarray | None = None, doubtful_label: str = "") -> plt.Axes:
    """A grid such as (k, w) -> value as an annotated heatmap (a ``pcolormesh``, each cell's value printed in it,
    dark on light colours and white on dark), first row of ``table`` at the bottom. Not seaborn's ``heatmap``: that
    draws the whole figure at every call (to rotate crowded tick labels), so a figure of n panels cost n draws.

    table: index = y values, columns = x values (``frame.pivot(index="k", columns="w", values=...)``), their names
    the axis labels; NaN cells stay blank over a grey background named :data:`MISSING` (for the figure's legend:
    :func:`legend_outside`). norm: the colour scale, shared by every panel of the figure that shows this metric
    (:func:`shared_norm`, :data:`SPEEDUP_NORM`). colorbar: draw this panel's colour bar (one per metric is
    enough: :func:`shared_colorbar`). outline: bool [rows, columns], cells to frame in cyan (e.g. past a
    threshold), named ``outline_label`` in the legend (the strict save refuses an outline no legend names).
    unsure: bool [rows, columns], cells whose interval holds the line the colours are read against (1 for a
    speedup): framed dashed in grey inside the cell and named ``unsure_label``, since a colour shows no interval.
    doubtful: bool [rows, columns], cells whose value is kept though it may not be true (a timing its re-timing did
    not settle): printed with a ``?`` and named ``doubtful_label``.
    """
    values = table.to_numpy(dtype=float)
    rows, columns = values.shape
    if np.isnan(values).any():
        ax.add_patch(plt.Rectangle((0, 0), columns, rows, facecolor="0.88", edgecolor="none",
                                   lw=0, zorder=0, label=MISSING))  # plain grey: a hatch costs tens of kB a PNG
    mesh = ax.pcolormesh(np.ma.masked_invalid(values), cmap=cmap, norm=norm)
    light = _luminance(mesh.cmap(mesh.norm(values))) > 0.408  # [rows, columns]: dark text reads on the cell
    doubt = np.zeros(values.shape, bool) if doubtful is None else doubtful
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            ax.text(j + 0.5, i + 0.5, format(value, fmt) + ("?" if doubt[i, j] else ""), ha="center", va="center",
                    fontsize=6.5, color="0.15" if light[i, j] else "white")
    if doubt.any():
        ax.plot([], [], ls="none", marker="$?$", color="0.15", label=doubtful_label)  # the legend's key
    ax.set(xlim=(0, columns), ylim=(0, rows), xticks=np.arange(columns) + 0.5, yticks=np.arange(rows) + 0.5,
           xlabel=table.columns.name or "", ylabel=table.index.name or "")
    ax.set_xticklabels([str(c) for c in table.columns])
    ax.set_yticklabels([str(r) for r in table.index])
    ax.spines[:].set_visible(False)
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, label=label)
    frames = ((outline, 0.0, {"ec": OUTLINE, "lw": 1.0}, outline_label),
              (unsure, 0.06, {"ec": UNSURE, "lw": 0.9, "ls": (0, (2, 2))}, unsure_label))  # (cells, inset, style, key)
    for cells, inset, style, key in (frame for frame in frames if frame[0] is not None):
        for n, (i, j) in enumerate(zip(*np.nonzero(cells), strict=True)):
            ax.add_patch(plt.Rectangle((j + inset, i + inset), 1 - 2 * inset, 1 - 2 * inset, fill=False, **style,
                                       label=key if n == 0 else None))
    ax.grid(False)
    return ax


def _luminance(rgba: np.ndarray) -> np.ndarray:
    """WCAG relative luminance (0 black .. 1 white) of sRGB(A) colours [..., 3 or 4] -> [...]: which text colour
    reads on each."""
    rgb = np.asarray(rgba, dtype=float)[..., :3]
    linear = np.where(rgb <= 0.03928, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    return linear @ np.array([0.2126, 0.7152, 0.0722])


def tie_cells(frame: pd.DataFrame, table: pd.DataFrame, value: str, norm: Normalize) -> np.ndarray | None:
    """bool [rows, columns] of ``table`` (``frame`` pivoted on ``value``, its index and columns two columns of
    ``frame``): the cells whose ``<value>_low`` / ``<value>_high`` interval holds 1, for :func:`heatmap`'s
    ``unsure``; None unless ``norm`` is the speedups' scale (:data:`SPEEDUP_NORM`) and ``frame`` has the interval."""
    if norm is not SPEEDUP_NORM or not {f"{value}_low", f"{value}_high"} <= set(frame.columns):
        return None
    low, high = (frame.pivot(index=table.index.name, columns=table.columns.name, values=f"{value}_{end}")
                 .reindex_like(table) for end in ("low", "high"))
    return ((low <= 1) & (high >= 1)).to_numpy()


def grid_panels(frame: pd.DataFrame, *, rows: str, panels: str, value: str, label: str, norm: Normalize,
                cmap: str, index: str = "k", columns: str = "w", title: str = "") -> tuple[plt.Figure, np.ndarray]:
    """A (``index`` × ``columns``) :func:`heatmap` of ``value`` per (row value, panel value), one colour scale
    (``norm``, :func:`shared_colorbar` named ``label``), rows and panels in their first-seen order. A panel of
    one colour (:func:`flat_on_scale`) is said in its place (:func:`flat_words`); every other panel draws every
    measured cell, a plateau (prompt lookup's k >= 4 at k = 2's tokens per call) included: its printed values say
    it. A speedup (``norm`` :data:`SPEEDUP_NORM`) with ``<value>_low`` / ``<value>_high`` columns frames the cells
    whose interval holds 1 (:func:`heatmap`'s ``unsure``): their colour says a side of 1 the data do not. Returns
    (figure, axes [rows, panels])."""
    row_values, panel_values = list(dict.fromkeys(frame[rows])), list(dict.fromkeys(frame[panels]))
    fig, axes = plt.subplots(len(row_values), len(panel_values), squeeze=False, sharex=True, sharey=True,
                             figsize=(1.6 * len(panel_values) + 1.2, 2.0 * len(row_values) + 0.5))
    for r, row in enumerate(row_values):
        for c, panel in enumerate(panel_values):
            ax = axes[r, c]
            sub = frame[(frame[panels] == panel) & (frame[rows] == row)]
            if flat_on_scale(sub[value], norm):  # one colour on this figure's scale: said, not drawn
                ax.set_axis_off()
                ax.text(0.5, 0.5, flat_words(sub[value], label), ha="center", va="center", fontsize=7, color="0.3",
                        transform=ax.transAxes, wrap=True)
                continue
            table = sub.pivot(index=index, columns=columns, values=value)
            heatmap(table, ax, norm=norm, cmap=cmap, colorbar=False, unsure=tie_cells(sub, table, value, norm),
                    unsure_label=TIE_LABEL)
            ax.set(title=panel if r == 0 else "", xlabel=columns if r == len(row_values) - 1 else "",
                   ylabel=f"{row}: {index}" if c == 0 else "")
    shared_colorbar(fig, axes, norm, cmap, label)
    legend_outside(fig, "below")  # the grey of cells not measured, if any
    if title:
        fig.suptitle(title)
    return fig, axes


def shared_colorbar(fig: plt.Figure, axes: Sequence[plt.Axes] | np.ndarray, norm: Normalize, cmap: str,
                    label: str) -> None:
    """One colour bar for ``axes`` that share ``norm`` (placed beside them by constrained layout), with an arrow
    at each end that a heatmap cell of ``axes`` lies beyond (its colour is clipped). :data:`SPEEDUP_NORM` gets
    :data:`SPEEDUP_TICKS` with two decimals (which side of 1 a colour is); another log scale plain 1-2-5 ticks
    (0.5, 1, 2, 5, ...), not powers of ten."""
    from matplotlib.collections import QuadMesh

    cells = [np.ma.filled(np.ma.asarray(c.get_array(), dtype=float), np.nan).ravel() for ax in np.ravel(axes)
             for c in ax.collections if isinstance(c, QuadMesh)]
    shown = np.concatenate(cells) if cells else np.array([])
    below, above = bool((shown < norm.vmin).any()), bool((shown > norm.vmax).any())
    extend = {(True, True): "both", (True, False): "min", (False, True): "max"}.get((below, above), "neither")
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(np.ravel(axes)), label=label,
                       shrink=0.9, extend=extend)
    if norm is SPEEDUP_NORM:
        bar.set_ticks(list(SPEEDUP_TICKS), labels=[f"{t:.2f}" for t in SPEEDUP_TICKS])
        bar.ax.yaxis.set_minor_locator(NullLocator())
    elif isinstance(norm, LogNorm):
        bar.set_ticks(log_ticks(norm.vmin, norm.vmax))
        bar.ax.yaxis.set_major_formatter(ScalarFormatter())
        bar.ax.yaxis.set_minor_locator(NullLocator())


def log_ticks(lo: float, hi: float) -> list[float]:
    """The 1-2-5 values (…, 0.2, 0.5, 1, 2, 5, 10, …) within [lo, hi]; over 7 of them, the 1-3 values where at most
    5 (a log axis has no minor ticks here, so two labels a decade keep about two and a half decades readable); else
    the decades alone."""
    decades = range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1)
    for steps, most in (((1, 2, 5), 7), ((1, 3), 5)):
        ticks = [m * 10.0**e for e in decades for m in steps if lo <= m * 10.0**e <= hi]
        if len(ticks) <= most:
            return ticks
    return [10.0**e for e in decades if lo <= 10.0**e <= hi]


class LogTicks(Locator):
    """:func:`log_ticks` over the axis' view at draw time: the labels follow whatever is drawn after the axis was
    made logarithmic."""

    def __call__(self) -> list[float]:
        return self.tick_values(*self.axis.get_view_interval())

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        lo, hi = sorted((vmin, vmax))
        return log_ticks(lo, hi) if lo > 0 else []


def slowdown_heatmaps(frame: pd.DataFrame, title: str, threshold: float, cols: str = "context",
                      rows: str | None = None) -> plt.Figure:
    """One :func:`heatmap` per value of column ``cols`` (and of ``rows``, a grid of panels; every panel one context
    length) of a roofline table (:func:`specnb.eval.timing.measure` rows: context, k, w, slowdown): the slow-down of
    each (k, w) call over (1, 0) on one log colour scale from 1 for every panel, each value to three digits (1.04
    stays apart from 1.00), cells above ``threshold`` outlined (past the memory-bound regime; with ``slowdown_low`` /
    ``slowdown_high`` columns, only those whose interval lies above it, and those whose interval holds it framed
    dashed), unmeasured cells grey, and with a ``settled`` column the cells their re-timing did not settle
    (:func:`specnb.eval.timing.time_cells`) printed with a ``?``."""
    from ..eval.timing import EXTRA_PASSES, heatmap_table

    across = list(dict.fromkeys(frame[cols]))
    down = list(dict.fromkeys(frame[rows])) if rows else [None]
    ks, ws = sorted(frame.k.unique()), sorted(frame.w.unique())
    fig, axes = plt.subplots(len(down), len(across), figsize=(4.2 * len(across) + 0.8, 3.8 * len(down)),
                             squeeze=False)
    norm = LogNorm(1.0, max(float(np.nanmax(frame.slowdown)), 1.01))
    for (row, col), ax in zip(itertools.product(down, across), axes.flat, strict=True):
        part = frame[(frame[cols] == col) & ((frame[rows] == row) if rows else True)]
        context = part.context.iloc[0]
        ends = {"slowdown_low", "slowdown_high"} <= set(frame.columns)
        table, low, high = (heatmap_table(part, context, value).reindex(index=ks, columns=ws) for value in
                            ("slowdown", *(("slowdown_low", "slowdown_high") if ends else ("slowdown",) * 2)))
        past = f"slow-down > {threshold:g}" + (", its interval too" if ends else "")
        doubtful = None
        if "settled" in frame.columns:
            doubtful = ~heatmap_table(part.assign(settled=part.settled.astype(float)), context, "settled") \
                .reindex(index=ks, columns=ws).fillna(1).astype(bool).to_numpy()
        heatmap(table, ax, fmt="#.3g", cmap="magma_r", norm=norm, colorbar=False, outline=(low > threshold).to_numpy(),
                outline_label=past, unsure=((low <= threshold) & (high > threshold)).to_numpy(),
                unsure_label=f"interval holds {threshold:g}", doubtful=doubtful,
                doubtful_label=f"timing unsettled: its passes disagree, or more work costs less, after "
                               f"{EXTRA_PASSES} re-timings")
        name = f"context ℓ = {col}" if cols == "context" else f"{str(col).removeprefix('random:')}, ℓ = {context}"
        ax.set(xlabel="w (speculated tokens)", ylabel="k (drafts)", title=f"{row}: {name}" if rows else name)
    shared_colorbar(fig, axes, norm, "magma_r", "slow-down vs one token, k = 1, w = 0")
    bar = fig.axes[-1]  # plain major ticks, 1.5 and 3 too: most slow-downs lie within one decade
    log_axis(bar, "y", ticks=[t for t in (1, 1.5, 2, 3, 5, 10, 20, 50) if norm.vmin <= t <= norm.vmax])
    legend_outside(fig, "below")
    fig.suptitle(title)
    return fig


def gpu_cost_curves(frame: pd.DataFrame, title: str) -> plt.Figure:
    """A saved GPU table's one-row calls (``k == 1`` rows of one context, with ``calls`` naming each call mode:
    :func:`specnb.experiments.roofline_study.gpu_calls`): one panel per model, ms per call against the tokens it
    verifies, one line per call mode with the spread over its timed passes (``slowdown_low`` / ``_high``) and its
    value printed at the fewest, 16 and the most tokens, and the weights' bandwidth floor and the tokens' compute
    floor (``bandwidth_floor_s``, ``compute_floor_s``) where the table holds them."""
    models = list(dict.fromkeys(frame.model))
    fig, axes = plt.subplots(1, len(models), figsize=(3.6 * len(models), 3.4), squeeze=False)
    modes = list(dict.fromkeys(frame.calls))
    for ax, model in zip(axes[0], models, strict=True):
        part = frame[frame.model == model].sort_values("tokens")
        for i, (calls, line) in enumerate(part.groupby("calls", sort=False)):
            ms = line.seconds * 1e3
            spread = [ms - ms * line.slowdown_low / line.slowdown, ms * line.slowdown_high / line.slowdown - ms] \
                if "slowdown_low" in line else None
            hues = series_colors(max(3, len(modes)))  # hues, not greys: the floors are grey
            ax.errorbar(line.tokens, ms, yerr=spread, marker=MARKERS[i], color=hues[modes.index(calls)], lw=1, ms=3.5,
                        capsize=2, label=calls)
            shown = {line.tokens.min(), 16, line.tokens.max()}
            for x, y in zip(line.tokens, ms, strict=True):
                if x in shown:
                    ax.annotate(f"{y:.1f}", (x, y), textcoords="offset points", xytext=(0, 5), ha="center",
                                fontsize=7)
        if "bandwidth_floor_s" in part:
            floors = part.groupby("tokens")[["bandwidth_floor_s", "compute_floor_s"]].first() * 1e3
            ax.plot(floors.index, floors.bandwidth_floor_s, color="0.6", ls="--", lw=1, label="bandwidth floor")
            ax.plot(floors.index, floors.compute_floor_s, color="0.6", ls=":", lw=1.2, label="compute floor")
            ax.set_ylim(0.5 * min(floors.bandwidth_floor_s.min(), part.seconds.min() * 1e3),  # the compute floor
                        1.6 * part.seconds.max() * 1e3)  # of a few tokens lies decades below every call
        log_axis(ax, "x", base=2, ticks=sorted(part.tokens.unique()))
        log_axis(ax, "y")
        ax.set(xlabel="tokens verified per call", title=f"{model.removeprefix('random:')}, ℓ = {part.context.iloc[0]}")
    axes[0][0].set_ylabel("ms per call")
    legend_outside(fig)
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------- axes and legends


def _filled_keys(fig: plt.Figure) -> list[str]:
    """The :data:`COLORS` keys whose colour fills a bar (a patch) or a dot (a scatter's marker) of ``fig``, first
    seen first."""
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Rectangle

    by_color = {to_hex(c): key for key, c in COLORS.items()}
    seen: dict[str, None] = {}
    for ax in fig.axes:
        faces = [patch.get_facecolor() for patch in ax.patches if isinstance(patch, Rectangle) and patch.get_fill()]
        faces += [face for c in ax.collections if isinstance(c, PathCollection) for face in c.get_facecolors()]
        for face in faces:
            if (key := by_color.get(to_hex(face, keep_alpha=False))) is not None:
                seen.setdefault(key)
    return list(seen)


def shade_entries(fig: plt.Figure) -> tuple[list[tuple[str, str]], list[str]]:
    """What a key to ``fig``'s shades holds: ([(entry, colour)], [title notes]). For every shade (:data:`SHADES`:
    ``dense-id``, ``rest-priced``) filling a bar or a dot, an entry "<method>, <shade>"; for its method's own
    colour beside it, an entry "<method>, <what the base is then>" (``DReSD, OOD store``). Empty when no shade
    is drawn."""
    keys = _filled_keys(fig)
    entries: dict[str, list[str]] = {}  # key -> what its rows are
    notes: list[str] = []
    for suffix, (shade, base_is, note) in SHADES.items():
        for key in keys:
            base = key.removesuffix(suffix)
            if base == key or base not in STYLES:
                continue
            entries.setdefault(key, []).append(shade)
            if base in keys:
                entries.setdefault(base, []).append(base_is)
            if note not in notes:
                notes.append(note)

    def base_of(key: str) -> str:
        return next((key.removesuffix(s) for s in SHADES if key.endswith(s) and key.removesuffix(s) in STYLES), key)

    def rank(key: str) -> tuple[int, int]:  # by method, its own colour first, then its shades in SHADES' order
        base, suffixes = base_of(key), list(SHADES)
        shade = next((1 + suffixes.index(s) for s in suffixes if base != key and key.endswith(s)), 0)
        return (list(METHODS).index(base) if base in METHODS else len(METHODS), shade)

    ordered = sorted(entries, key=lambda k: (*rank(k), keys.index(k)))
    return [(f"{STYLES[base_of(k)].label}, {', '.join(dict.fromkeys(entries[k]))}", COLORS[k]) for k in ordered], notes


def add_shade_key(fig: plt.Figure) -> None:
    """A figure legend naming every shade of a method's colour that fills a bar or a dot of ``fig`` (DReSD on its
    ID store darker, a priced tree lighter) and the method's own colour beside it (:func:`shade_entries`), unless
    a legend of ``fig`` already names each of them: below the panels, or right of them when a figure legend is
    already below. A reader must not have to guess what a darker bar means."""
    from matplotlib.patches import Patch

    entries, notes = shade_entries(fig)
    if not entries or not _unnamed_shades(fig, entries):
        return
    handles = [Patch(facecolor=c, edgecolor="0.3", lw=0.4, label=text) for text, c in entries]
    where = "outside right center" if fig.legends else "outside lower center"
    fig.legend(handles=handles, loc=where, ncols=1 if "right" in where else min(len(handles), 3),
               title="; ".join(notes), title_fontsize=8)


def _legend_colors(fig: plt.Figure) -> list[tuple]:
    """The face colours (patches) and line colours of every legend entry of ``fig``."""
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out = []
    for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]:
        for handle in legend.legend_handles if legend is not None else []:
            if isinstance(handle, Patch):
                out.append(to_rgba(handle.get_facecolor()))
            elif isinstance(handle, Line2D):
                out.append(to_rgba(handle.get_color()))
    return out


def _unnamed_shades(fig: plt.Figure, entries: list[tuple[str, str]]) -> list[str]:
    """The entries of :func:`shade_entries` whose colour no legend entry of ``fig`` carries."""
    from matplotlib.colors import to_rgba

    named = _legend_colors(fig)
    return [text for text, c in entries if not any(np.allclose(to_rgba(c), k, atol=1e-3) for k in named)]



def legend_outside(ax: plt.Axes | plt.Figure, where: str = "right", **kwargs) -> None:
    """A legend beside the data: to the right of the axes (or of the figure's panels), or below them. Methods are
    listed in the study's one order (:func:`method_rank`), whatever order the panels drew them in; other entries
    keep theirs, after the methods (a :func:`series_panels` figure's series in their order, whichever panel drew
    each first). Below, in up to four columns, fewer when the labels are too long for the figure's width."""
    handles, labels = (ax.get_legend_handles_labels() if isinstance(ax, plt.Axes) else
                       _figure_handles(ax))
    if not handles:
        return
    ranks = [method_rank(text) for text in labels]
    series = _SERIES_ORDERS.get(ax if isinstance(ax, plt.Figure) else ax.figure, [])
    places = [series.index(text) if text in series else len(series) for text in labels]
    order = sorted(range(len(labels)), key=lambda i: (ranks[i] is None, ranks[i] or 0, places[i], i))
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    if where == "right":
        place = {"loc": "center left", "bbox_to_anchor": (1.01, 0.5)}
    else:
        place = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.18), "ncols": min(len(handles), 4)}
    if isinstance(ax, plt.Figure):
        place = {"loc": "outside right center"} if where == "right" else \
            {"loc": "outside lower center", "ncols": min(len(handles), 4)}
    legend = ax.legend(handles, labels, **{**place, **kwargs})  # kwargs may override the placement (ncols)
    figure = ax if isinstance(ax, plt.Figure) else ax.figure
    while "ncols" not in kwargs and place.get("ncols", 1) > 1 and \
            legend.get_window_extent(figure.canvas.get_renderer()).width > figure.bbox.width:
        legend.remove()  # below: no more columns than the figure's width holds (long labels at a larger scale)
        place["ncols"] -= 1
        legend = ax.legend(handles, labels, **{**place, **kwargs})


def _figure_handles(fig: plt.Figure) -> tuple[list, list]:
    """Unique (handle, label) pairs over every panel, in first-seen order."""
    seen: dict[str, object] = {}
    for ax in fig.axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(text, handle)
    return list(seen.values()), list(seen)


def log_axis(ax: plt.Axes, axis: str = "x", base: float = 10, ticks: Sequence[float] | None = None,
             compact: bool = False) -> None:
    """A logarithmic ``axis`` with labelled major ticks and no minor ones (plain numbers): ``ticks`` where given, else
    :class:`LogTicks` (1-2-5 values over the range shown, so no end of the data lies far past the last label);
    ``compact``: counts as 300, 3k, 1M, so a narrow panel's labels do not run into each other."""
    getattr(ax, f"set_{axis}scale")("log", base=base)
    target = ax.xaxis if axis == "x" else ax.yaxis
    if min(target.get_view_interval()) <= 0:  # linear limits set below 0: the data's extent instead
        ax.autoscale(axis=axis)
    if ticks is not None:
        target.set_ticks(list(ticks))
    elif base == 10:
        target.set_major_locator(LogTicks())
    if compact:
        target.set_major_formatter(FuncFormatter(lambda v, _: compact_count(v)))
    else:
        formatter = ScalarFormatter()
        formatter.set_scientific(False)
        target.set_major_formatter(formatter)
    target.set_minor_locator(NullLocator())  # major ticks only: unlabelled marks between them read as values


def compact_count(value: float) -> str:
    """A count as a short tick label: 300, 3k, 250k, 1M."""
    for size, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


# ------------------------------------------------------------------------------------------------ saving


_PROFILE = {"name": "quick"}  # the running notebook's profile (set by specnb.study.results.Results)


def use_profile(profile: str) -> None:
    """Save this process's figures where ``profile``'s belong (:func:`figures_for`)."""
    _PROFILE["name"] = profile


def figures_for(profile: str) -> Path:
    """``figures/`` at the repository root for the quick profile (the published reference run), else
    ``figures/<profile>/``, so a smoke or full run never overwrites the reference run."""
    root = Path(__file__).resolve().parents[2] / "figures"
    return root if profile == "quick" else root / profile


def figures_dir() -> Path:
    """``$SPECNB_FIGURES``, else :func:`figures_for` the running profile (created on demand)."""
    path = Path(os.environ.get("SPECNB_FIGURES") or figures_for(_PROFILE["name"]))
    path.mkdir(parents=True, exist_ok=True)
    return path


class FigureLayoutError(ValueError):
    """A figure about to be saved has overlapping text or a panel that shows one value."""


def mark_log_axes(fig: plt.Figure) -> list[tuple[Axis, str]]:
    """Append " (log)" to the label of every logarithmic axis of ``fig`` whose label does not say so: a reader
    of a log axis with plain-number ticks must be told. Returns the (axis, former label) pairs marked, for
    :func:`save_figure` to put back where the mark pushes a label into a neighbour's."""
    marked = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.get_label_text()
            if axis.get_scale() == "log" and label and "log" not in label:
                axis.set_label_text(f"{label} (log)")
                marked.append((axis, label))
    return marked


def fit_titles(fig: plt.Figure) -> bool:
    """Wrap the suptitle and every panel title that would run off the figure (a user's long model path in it)
    onto lines that fit its width (measured after a draw: a layout engine moves titles). Returns whether any was
    wrapped (else the figure is as that draw laid it out)."""
    fig.draw_without_rendering()  # the layout and every text's extent, no pixels
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    wrapped = False
    for text in [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle is not None else []):
        content = text.get_text()
        box = text.get_window_extent(renderer)
        if not content.strip() or (box.x0 >= edge.x0 and box.x1 <= edge.x1):
            continue
        room = 2 * min((box.x0 + box.x1) / 2 - edge.x0, edge.x1 - (box.x0 + box.x1) / 2)  # centred on its spot
        longest = max(len(line) for line in content.splitlines())
        chars = max(20, int(longest * 0.9 * room / box.width))
        text.set_text("\n".join(textwrap.fill(_unbroken(line), chars, break_on_hyphens=False)
                                 for line in content.splitlines()))
        wrapped = True
    return wrapped


def _unbroken(line: str) -> str:
    """``line`` with the spaces around ≤, = and × made non-breaking: ``n ≤ 3`` and ``10 × 64`` stay on one line
    when :func:`fit_titles` wraps (as ``MT-Bench`` does, hyphens never being break points)."""
    return re.sub(r" ([≤=×]) ", "\u00a0\\1\u00a0", line)


def save_figure(fig: plt.Figure, name: str, data: pd.DataFrame | None = None) -> Path:
    """Save ``fig`` as ``figures/NAME.png`` and ``data`` as ``figures/NAME.csv``; returns the PNG path. In a notebook
    the PNG is shown in the figure's place and the figure closed (:func:`_show_saved`).

    A key to the shades of methods' colours it fills is added first (:func:`add_shade_key`), and titles that would
    run off the figure are wrapped (:func:`fit_titles`). With ``SPECNB_STRICT_FIGURES=1``
    (set by ``specnb notebooks run`` and ``specnb study run``) a figure with :func:`layout_problems` raises
    :class:`FigureLayoutError` instead."""
    add_shade_key(fig)
    marked = mark_log_axes(fig)
    wrapped = fit_titles(fig)
    strict = os.environ.get("SPECNB_STRICT_FIGURES") == "1"
    if marked or strict:  # one layout for both checks: a draw is most of a small figure's saving time
        problems = layout_problems(fig, drawn=not wrapped)
        if marked and any("label" in problem for problem in problems):  # the marks collide: labels as they were
            for axis, label in marked:
                axis.set_label_text(label)
            problems = layout_problems(fig) if strict else []
        if problems and strict:
            raise FigureLayoutError(f"figure {name}: " + "; ".join(problems[:5]))
    out = figures_dir() / f"{name}.png"
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    # a 256-colour palette: a third of the bytes of RGBA for the same picture (committed figures stay small)
    image = Image.open(buffer).convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    with atomic_file(out) as tmp:
        image.save(tmp, format="png", optimize=True)
    _record_title(out.parent, name, fig)
    if data is not None:
        write_csv(out.with_suffix(".csv"), data)
    _show_saved(fig, out, image.width)
    return out


def _show_saved(fig: plt.Figure, png: Path, width: int) -> None:
    """In a notebook (matplotlib's inline backend), show the PNG just saved in the figure's place, at the figure's
    size, and close the figure: the backend would otherwise draw it a third time (after the layout check and the
    PNG); the reader sees what was saved."""
    if "inline" not in plt.get_backend():
        return
    from IPython.display import Image as Shown
    from IPython.display import display

    dpi = plt.rcParams["savefig.dpi"]
    display(Shown(data=png.read_bytes(), width=round(width * fig.dpi / (fig.dpi if dpi == "figure" else dpi))))
    plt.close(fig)


def _record_title(folder: Path, name: str, fig: plt.Figure) -> None:
    """Keep the figure's title (its suptitle, else its panels' titles) in ``folder/titles.json``: what the figure
    shows, for the index of the reference run (:func:`specnb.study.reference_run.index`)."""
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    title = suptitle or "; ".join(t for t in (ax.get_title() for ax in fig.axes) if t)
    path = folder / "titles.json"
    titles = json.loads(path.read_text()) if path.exists() else {}
    titles[name] = " ".join(title.split())
    write_text(path, json.dumps(dict(sorted(titles.items())), indent=1, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------ layout audit


def layout_problems(fig: plt.Figure, slack: float = 1.0, drawn: bool = False) -> list[str]:
    """What a reader would trip over in ``fig``, from matplotlib's bounding boxes after a draw:

    * tick labels of one axis that overlap each other;
    * titles, axis labels, annotations and legends that overlap each other or another axis' tick labels;
    * a legend drawn over data (a line's vertex, a marker, a bar);
    * a panel whose data (lines, markers, bars, heatmap cells, in data coordinates) hold a single value.

    * a hatch, an outline, a translucent tint or a method's shade (ID store, priced) that no legend of the figure
      names, or two translucent bands in one panel (:func:`key_problems`).

    ``slack``: pixels two boxes may share before they count as overlapping; ``drawn``: the figure was drawn since
    its last change (its layout is not drawn again). Returns one line per problem."""
    if not drawn:
        fig.draw_without_rendering()  # the layout and every text's extent, no pixels
    renderer = fig.canvas.get_renderer()
    problems: list[str] = []
    free: list[tuple[str, object]] = []  # (description, bbox) of texts that must not touch each other
    ticks: list[tuple[str, object]] = []
    for i, ax in enumerate(fig.axes):
        name = ax.get_title() or ax.get_label() or f"panel {i}"
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = _lasttick_labels(axis)
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
            problems += [f"{name}: {axis_name} tick labels {a!r} and {b!r} overlap"
                         for a, b in _overlapping(boxes, slack)]
            ticks += [(f"{name}: {axis_name} tick {t!r}", box) for t, box in boxes]
            if axis.label.get_visible() and axis.label.get_text().strip():
                free.append((f"{name}: {axis_name} label", axis.label.get_window_extent(renderer)))
        for title in (ax.title, ax._left_title, ax._right_title):
            if title.get_visible() and title.get_text().strip():
                free.append((f"{name}: title", title.get_window_extent(renderer)))
        for text in ax.texts:
            if text.get_visible() and text.get_text().strip():
                free.append((f"{name}: text {text.get_text()!r}", text.get_window_extent(renderer)))
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            box = legend.get_window_extent(renderer)
            free.append((f"{name}: legend", box))
            if _covers_data(ax, box):
                problems.append(f"{name}: the legend is drawn over data")
        if (single := _single_value(ax)) is not None:
            problems.append(f"{name}: the panel shows a single value ({single:.4g})")
    named = {id(fig._suptitle): "suptitle", id(fig._supxlabel): "x label", id(fig._supylabel): "y label"}
    for text in fig.texts:  # the suptitle and super-labels are figure texts too
        if text.get_visible() and text.get_text().strip():
            free.append((named.get(id(text), f"figure text {text.get_text()!r}"), text.get_window_extent(renderer)))
    for legend in fig.legends:
        if legend.get_visible():
            free.append(("figure legend", legend.get_window_extent(renderer)))
    edge = fig.bbox
    problems += [f"{a} runs off the figure" for a, box in free
                 if box.x0 < edge.x0 - slack or box.x1 > edge.x1 + slack or box.y0 < edge.y0 - slack
                 or box.y1 > edge.y1 + slack]
    problems += [f"{a} and {b} overlap" for a, b in _overlapping(free, slack)]
    problems += [f"{free[i][0]} and {ticks[j][0]} overlap" for i, j in zip(*np.nonzero(_touching(free, ticks, slack)),
                                                                           strict=True)]
    return problems + key_problems(fig)


def key_problems(fig: plt.Figure) -> list[str]:
    """Marks a reader cannot decode: a hatch, an outline (an unfilled patch with a visible edge) or a translucent
    fill (a band, a see-through bar) that no legend of ``fig`` names — a legend entry with the same hatch, the
    same edge colour unfilled, the same fill colour and alpha — and a panel with more than one translucent band
    (stacked bands blur into one tint: :func:`line_with_interval` draws capped error bars instead). One line
    per problem."""
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    keys = [h for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if legend is not None
            for h in legend.legend_handles if isinstance(h, Patch | PolyCollection)]
    same = lambda a, b: np.allclose(to_rgba(a), to_rgba(b), atol=1e-3)  # noqa: E731

    def named(mark: str, artist) -> bool:
        face = np.atleast_2d(artist.get_facecolor())[0]
        if mark == "a hatch":
            return any(k.get_hatch() == artist.get_hatch() for k in keys)
        if mark == "an outline":
            edge = np.atleast_2d(artist.get_edgecolor())[0]
            return any(isinstance(k, Patch) and not k.get_fill() and same(k.get_edgecolor(), edge) for k in keys)
        return any(same(np.atleast_2d(k.get_facecolor())[0], face) for k in keys)

    problems = []
    for i, ax in enumerate(fig.axes):
        name, bands = ax.get_title() or ax.get_label() or f"panel {i}", 0
        for artist in [*ax.patches, *ax.collections]:
            if not artist.get_visible() or not isinstance(artist, Patch | PolyCollection):
                continue
            face = np.atleast_2d(artist.get_facecolor())
            filled = artist.get_fill() if isinstance(artist, Patch) else len(face) > 0
            edge = np.atleast_2d(artist.get_edgecolor())
            width = np.max(np.atleast_1d(artist.get_linewidth())) if np.size(artist.get_linewidth()) else 0.0
            marks = ["a hatch"] if artist.get_hatch() else []
            if isinstance(artist, Patch) and not filled and width > 0 and len(edge) and edge[0, 3] > 0:
                marks.append("an outline")
            if filled and len(face) and 0 < face[0, 3] < 1:
                marks.append("a translucent fill")
                bands += isinstance(artist, PolyCollection)
            problems += [f"{name}: {mark} that no legend names" for mark in marks if not named(mark, artist)]
        if bands > 1:
            problems.append(f"{name}: {bands} translucent bands in one panel (draw capped error bars)")
    problems += [f"the shade {text!r} that no legend names (plots.add_shade_key)"
                 for text in _unnamed_shades(fig, shade_entries(fig)[0])]
    return sorted(set(problems), key=problems.index)


def _lasttick_labels(axis) -> list:
    """The tick labels matplotlib draws: visible, non-empty, at a tick inside the axis' view limits (it also
    keeps labels for ticks just outside them, which are never drawn)."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    labels = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        inside = lo - span <= tick.get_loc() <= hi + span
        labels += [t for t in (tick.label1, tick.label2) if inside and t.get_visible() and t.get_text().strip()]
    return labels


def _touching(a: list[tuple[str, object]], b: list[tuple[str, object]], slack: float) -> np.ndarray:
    """bool [len(a), len(b)]: which boxes of the (name, bbox) pairs ``a`` overlap which of ``b`` by more than
    ``slack`` pixels each way, in one array comparison (a heatmap's value labels are hundreds of boxes)."""
    def corners(boxes: list[tuple[str, object]]) -> np.ndarray:
        return np.array([(box.x0, box.y0, box.x1, box.y1) for _, box in boxes], dtype=float).reshape(-1, 4)

    p, q = corners(a)[:, None], corners(b)[None]
    return (p[..., 0] + slack < q[..., 2]) & (q[..., 0] + slack < p[..., 2]) \
        & (p[..., 1] + slack < q[..., 3]) & (q[..., 1] + slack < p[..., 3])


def _overlapping(boxes: list[tuple[str, object]], slack: float) -> list[tuple[str, str]]:
    """The names of every pair of ``boxes`` that touch, each pair once, in the order of a loop over i < j."""
    return [(boxes[i][0], boxes[j][0]) for i, j in zip(*np.nonzero(np.triu(_touching(boxes, boxes, slack), 1)),
                                                       strict=True)]


def _data_artists(ax: plt.Axes) -> Iterable:
    """Artists drawn in the axes' data coordinates (reference lines such as ``axhline`` are not)."""
    for artist in [*ax.lines, *ax.patches, *ax.collections]:
        if hasattr(artist, "get_offset_transform") and len(artist.get_offsets()):  # markers of a scatter
            transform = artist.get_offset_transform()
        elif hasattr(artist, "get_data_transform"):  # a patch: its data transform, less the patch's own
            transform = artist.get_data_transform()
        else:
            transform = artist.get_transform()
        if artist.get_visible() and transform == ax.transData:
            yield artist


def _covers_data(ax: plt.Axes, box) -> bool:
    """Whether the legend's box holds part of a line, a marker or part of a bar of ``ax``."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    inside = lambda xy: ((xy[:, 0] > box.x0) & (xy[:, 0] < box.x1) & (xy[:, 1] > box.y0)  # noqa: E731
                         & (xy[:, 1] < box.y1)).any()
    for artist in _data_artists(ax):
        if isinstance(artist, Line2D) and len(artist.get_xydata()):
            path = artist.get_transform().transform_path(artist.get_path())
            if inside(path.vertices) or (artist.get_linestyle() not in ("None", "") and
                                         path.intersects_bbox(box, filled=False)):
                return True
        elif isinstance(artist, PathCollection) and len(artist.get_offsets()):
            if inside(ax.transData.transform(np.asarray(artist.get_offsets(), dtype=float))):
                return True
        elif isinstance(artist, Rectangle) and artist.get_fill() and artist.get_width() and artist.get_height():
            if _touching([("bar", artist.get_window_extent())], [("legend", box)], 0.0)[0, 0]:
                return True
    return False


def _single_value(ax: plt.Axes) -> float | None:
    """The one value a panel's data hold, or None when they hold several (or none: an empty panel is a
    layout choice, e.g. a legend-only axes). Bars count their length, lines and markers their y (x for a line
    that is vertical in data), heatmap cells their colour value."""
    from matplotlib.collections import PathCollection, QuadMesh
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    values: list[float] = []
    bars = {id(patch) for container in ax.containers for patch in getattr(container, "patches", [])}
    for container in ax.containers:
        if hasattr(container, "datavalues"):  # a BarContainer: bar lengths
            values += list(np.asarray(container.datavalues, dtype=float))
    for artist in _data_artists(ax):
        if isinstance(artist, Line2D):
            xy = np.asarray(artist.get_xydata(), dtype=float)
            if len(xy) > 1:
                values += list(xy[:, 1])
        elif isinstance(artist, PathCollection):
            values += list(np.asarray(artist.get_offsets(), dtype=float)[:, 1])
        elif isinstance(artist, QuadMesh):
            values += list(np.ma.filled(np.ma.asarray(artist.get_array(), dtype=float), np.nan).ravel())
        elif isinstance(artist, Rectangle) and id(artist) not in bars and artist.get_fill():
            values.append(artist.get_height())
    finite = [v for v in values if np.isfinite(v)]
    if len(finite) < 2:
        return None
    return finite[0] if all(v == finite[0] for v in finite) else None
