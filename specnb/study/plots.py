"""One figure style for every notebook: a colour and a display name per method, sorted bars with their values and
intervals, one colour scale per metric across panels, legends off the data, and saving a figure with its data.

* :data:`STYLES` / :func:`style`: the same method has the same colour and name in every figure (a label such as
  ``"DReSD-OOD 10x6"`` takes its method's by prefix: :func:`method_of`); datasets and temperatures go to
  markers and line styles (:data:`MARKERS`, :data:`LINESTYLES`), never to colour.
* :func:`hbars`: horizontal bars sorted by value, the value printed at the end of each bar, the 90% interval drawn.
* :func:`shared_norm` / :func:`speedup_norm` and :func:`heatmap`: every panel of a figure on one colour scale per
  metric; speedups on a diverging scale centred at 1.
* :func:`legend_outside`, :func:`log_axis` (major ticks only, plain numbers).
* :func:`save_figure`: ``figures/NAME.png`` and ``figures/NAME.csv``, so a reader can re-plot or check any number.
  Under ``specnb notebooks run`` (``SPECNB_STRICT_FIGURES=1``) it first refuses a figure whose text artists
  overlap or whose panel shows a single value (:func:`layout_problems`); with ``SPECNB_FIGURE_DUMP`` set it also
  pickles the figure there, for the test that reopens every saved figure.
"""

from __future__ import annotations

import json
import os
import pickle
import textwrap
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import patheffects  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

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
    "pld": "#1f77b4", "ngram-unigram": "#dbdb8d", "ngram-bigram": "#bcbd22", "mixed": "#9edae5",
    "mixed-adaptive": "#17becf",
    # retrieval: one hue each, the priced form lighter
    "rest": "#ff7f0e", "rest-priced": "#ffbb78", "crest": "#2ca02c", "crest-priced": "#98df8a",
    "dense": "#d62728", "dense-id": "#8b1a1a", "dense-priced": "#ff9896",
    # draft models
    "sd": "#c5b0d5", "mcsd": "#9467bd",
    # beyond the seed papers
    "suffix": "#e377c2", "recycle": "#8c564b", "auto": "#111111",
    # a router's picks
    "-": "#e8e8e8", "merged": "#6f6f6f",
}
"""Method key (the bench's name) -> its colour in every figure of every notebook; the order is the legends'."""

NOT_METHODS = {"dense-id": "DReSD, ID store", "-": "no draft", "merged": "two members merged"}
"""Display names of the keys that are not methods of the registry: DReSD on its ID store, a router's picks."""

STYLES: dict[str, MethodStyle] = {key: MethodStyle(NOT_METHODS[key] if key in NOT_METHODS else METHODS[key].label,
                                                   color) for key, color in COLORS.items()}
"""Method key -> its display name (the registry's, :data:`specnb.eval.methods.METHODS`) and colour."""

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
    (``"DReSD-OOD 10x6"`` -> ``dense``, ``"REST priced"`` -> ``rest-priced``, ``"mixed (10,10)"`` -> ``mixed``).
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
    """The display name of a method key (``pld`` -> ``prompt lookup``); any other label is kept."""
    return STYLES[name].label if name in STYLES else name


# ------------------------------------------------------------------------------------------------ bars


_BAR_PANELS: weakref.WeakSet[plt.Axes] = weakref.WeakSet()  # the axes hbars has drawn on


def hbars(ax: plt.Axes, labels: Sequence[str], values: Sequence[float], low: Sequence[float] | None = None,
          high: Sequence[float] | None = None, *, fmt: str = "{:.2f}", reference: float | None = None,
          colors: Sequence[str] | None = None, xlabel: str = "") -> plt.Axes:
    """Horizontal bars sorted by value (largest on top), each value printed past its bar (and past its interval),
    the 90% interval [low, high] drawn as an error bar; ``reference`` draws a thin vertical line (1 for speedups),
    always in view. Negative values extend left of 0 (a difference, a gain). On a panel sharing its x axis with
    one drawn before, the axis only grows, so every panel's labels stay in view.
    Colours: the methods' (:func:`color` of each label) unless ``colors`` are given. Labels are display names."""
    from ..eval.checks import check_varies

    frame = pd.DataFrame({"label": list(labels), "value": np.asarray(values, dtype=float)})
    frame["low"] = np.asarray(low, dtype=float) if low is not None else np.nan
    frame["high"] = np.asarray(high, dtype=float) if high is not None else np.nan
    frame["color"] = list(colors) if colors is not None else [color(x) for x in frame.label]
    check_varies(frame.value, f"bars of {xlabel or ax.get_title() or 'a panel'}")
    frame = frame.sort_values("value", ascending=True, kind="stable").reset_index(drop=True)
    y = np.arange(len(frame))
    ax.barh(y, frame.value, color=frame.color, edgecolor="0.3", linewidth=0.4, height=0.7)
    has = frame.low.notna() & frame.high.notna()
    if has.any():
        err = np.vstack([(frame.value - frame.low)[has].clip(lower=0), (frame.high - frame.value)[has].clip(lower=0)])
        bars = ax.errorbar(frame.value[has], y[has], xerr=err, fmt="none", ecolor="0.1", elinewidth=0.9, capsize=2.5)
        for line in [*bars.lines[1], *bars.lines[2]]:  # a white rim: visible on dark bars too
            line.set_path_effects([patheffects.withStroke(linewidth=2.4, foreground="white")])
    right = np.fmax(frame.value, frame.high.fillna(-np.inf))  # where a positive bar's label goes
    left = np.fmin(frame.value, frame.low.fillna(np.inf))  # and a negative one's
    marks = np.asarray([0.0, *right, *left] + ([reference] if reference is not None else []), dtype=float)
    marks = marks[np.isfinite(marks)]  # a missing value (NaN, no bar) has no end
    lo, hi = float(marks.min()), float(marks.max())
    span = max(hi - lo, 1e-12)
    for yi, r, le, value in zip(y, right, left, frame.value, strict=True):
        if not np.isfinite(value):
            continue
        ax.text(r + 0.015 * span if value >= 0 else le - 0.015 * span, yi, fmt.format(value), va="center",
                ha="left" if value >= 0 else "right", fontsize=7)
    if reference is not None:
        ax.axvline(reference, color="0.2", lw=0.8, zorder=0)
    ax.set_yticks(y, [label(x) for x in frame.label])
    left, right = lo - (0.18 * span if lo < 0 else 0), hi + (0.18 * span if hi > 0 else 0)
    if any(other in _BAR_PANELS for other in ax.get_shared_x_axes().get_siblings(ax) if other is not ax):
        shown = ax.get_xlim()  # a panel sharing this x axis was drawn: keep what it shows in view
        left, right = min(left, shown[0]), max(right, shown[1])
    _BAR_PANELS.add(ax)
    ax.set_xlim(left, right)
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", visible=False)
    return ax


# ---------------------------------------------------------------------------------------- colour scales


def constant_instead(values: Iterable[float] | np.ndarray | pd.Series, what: str) -> bool:
    """Whether the series a figure would compare is constant or all zero (:func:`specnb.eval.checks.varies` fails):
    then one Markdown sentence saying so is displayed in the figure's place and True is returned (skip the
    figure). A model that accepts no draft (a random tiny Llama) gives such a series."""
    from ..eval.checks import varies

    if varies(values):
        return False
    from IPython.display import Markdown, display

    finite = [float(v) for v in np.ravel(np.asarray(values, dtype=float)) if np.isfinite(v)]
    value = f"{finite[0]:.3g}" if finite else "undefined"
    display(Markdown(f"*No figure: {what} is {value} for every bar, so there is nothing to compare.*"))
    return True


def shared_norm(values: Iterable[float] | np.ndarray, *, log: bool = False) -> Normalize:
    """One colour scale for every panel that shows this metric (the finite ``values`` of all of them)."""
    finite = np.asarray([v for v in np.ravel(np.asarray(list(values) if not isinstance(values, np.ndarray)
                                                         else values, dtype=float)) if np.isfinite(v)])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if log and lo > 0 and hi > 2 * lo:
        return LogNorm(lo, hi)
    return Normalize(lo, max(hi, lo + 1e-9))


MIN_SPEEDUP_REACH = 1.5  # the least a speedup scale spans on each side of its centre (x 1.5 and / 1.5)


def speedup_norm(values: Iterable[float] | np.ndarray, center: float = 1.0) -> LogNorm:
    """A diverging scale centred at ``center`` (1: as fast as the baseline) spanning every panel's ``values``,
    linear in log(value) and symmetric about ``center`` (×2 and ×0.5 equally strong): a LogNorm from
    center / r to center × r, whose midpoint is ``center``; r is at least :data:`MIN_SPEEDUP_REACH`, so that
    values near ``center`` stay pale (a near-tie does not look like a strong result) and the bar has room for
    ticks."""
    finite = np.asarray([v for v in np.ravel(np.asarray(list(values) if not isinstance(values, np.ndarray)
                                                         else values, dtype=float)) if np.isfinite(v) and v > 0])
    reach = float(np.max(np.abs(np.log(finite / center)))) if finite.size else 0.0
    reach = max(reach, np.log(MIN_SPEEDUP_REACH))
    return LogNorm(center * np.exp(-reach), center * np.exp(reach))


SPEEDUP_CMAP = "RdBu"  # red: slower than the baseline, blue: faster
SEQUENTIAL_CMAP = "viridis"


def heatmap(table: pd.DataFrame, ax: plt.Axes, *, norm: Normalize, fmt: str = ".2f", cmap: str = SEQUENTIAL_CMAP,
            label: str = "", colorbar: bool = True, outline: np.ndarray | None = None,
            hatch_missing: bool = True) -> plt.Axes:
    """A grid such as (k, w) -> value as an annotated seaborn heatmap, first row of ``table`` at the bottom.

    table: index = y values, columns = x values (``frame.pivot(index="k", columns="w", values=...)``); NaN
    cells stay blank over a hatched background (not measured). norm: the colour scale, shared by every panel of
    the figure that shows this metric (:func:`shared_norm`, :func:`speedup_norm`). colorbar: draw this panel's
    colour bar (one per metric is enough: :func:`shared_colorbar`). outline: bool [rows, columns], cells to
    frame in cyan (e.g. past a threshold).
    """
    values = table.to_numpy(dtype=float)
    if hatch_missing:
        ax.add_patch(plt.Rectangle((0, 0), values.shape[1], values.shape[0], hatch="//", fill=False, color="0.6",
                                   lw=0, zorder=0))
    sns.heatmap(table, ax=ax, annot=True, fmt=fmt, cmap=cmap, norm=norm, annot_kws={"fontsize": 6.5},
                cbar=colorbar, cbar_kws={"label": label} if colorbar else None)
    ax.invert_yaxis()
    ax.tick_params(axis="y", rotation=0)
    if outline is not None:
        for i, j in zip(*np.nonzero(outline), strict=True):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, ec="tab:cyan", lw=1.0))
    ax.grid(False)
    return ax


def shared_colorbar(fig: plt.Figure, axes: Sequence[plt.Axes] | np.ndarray, norm: Normalize, cmap: str,
                    label: str) -> None:
    """One colour bar for ``axes`` that share ``norm`` (placed beside them by constrained layout); a log scale
    gets plain 1-2-5 ticks (0.5, 1, 2, 5, ...), not powers of ten."""
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(np.ravel(axes)), label=label,
                       shrink=0.9)
    if isinstance(norm, LogNorm):
        bar.set_ticks(_log_ticks(norm.vmin, norm.vmax))
        bar.ax.yaxis.set_major_formatter(ScalarFormatter())
        bar.ax.yaxis.set_minor_formatter(NullFormatter())


def _log_ticks(lo: float, hi: float) -> list[float]:
    """The 1-2-5 values (…, 0.2, 0.5, 1, 2, 5, 10, …) within [lo, hi]; every other decade's when there are many."""
    ticks = [m * 10.0**e for e in range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1)
             for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
    return ticks if len(ticks) <= 7 else [t for t in ticks if str(t).lstrip("0.").startswith("1")]


def slowdown_heatmaps(frame: pd.DataFrame, title: str, threshold: float) -> plt.Figure:
    """One :func:`heatmap` per context length of a roofline table (:func:`specnb.core.roofline.measure` rows: context,
    k, w, slowdown): the slow-down of each (k, w) call over (1, 0) on one log colour scale from 1 for every
    panel, cells above ``threshold`` outlined (past the memory-bound regime), unmeasured cells hatched."""
    from ..core.roofline import heatmap_table

    contexts = sorted(frame.context.unique())
    ks, ws = sorted(frame.k.unique()), sorted(frame.w.unique())
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts) + 0.8, 3.8), squeeze=False)
    norm = LogNorm(1.0, max(float(np.nanmax(frame.slowdown)), 1.01))
    for ax, context in zip(axes[0], contexts, strict=True):
        table = heatmap_table(frame, context).reindex(index=ks, columns=ws)
        heatmap(table, ax, fmt=".1f", cmap="magma_r", norm=norm, colorbar=False, outline=table.to_numpy() > threshold)
        ax.set(xlabel="w (speculated tokens)", ylabel="k (drafts)", title=f"ℓ = {context}")
    shared_colorbar(fig, axes, norm, "magma_r", "slow-down vs (1, 0)")
    fig.suptitle(title)
    return fig


# --------------------------------------------------------------------------------------- axes and legends


def legend_outside(ax: plt.Axes | plt.Figure, where: str = "right", **kwargs) -> None:
    """A legend beside the data: to the right of the axes (or of the figure's panels), or below them."""
    handles, labels = (ax.get_legend_handles_labels() if isinstance(ax, plt.Axes) else
                       _figure_handles(ax))
    if not handles:
        return
    if where == "right":
        place = {"loc": "center left", "bbox_to_anchor": (1.01, 0.5)}
    else:
        place = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.18), "ncols": min(len(handles), 4)}
    if isinstance(ax, plt.Figure):
        place = {"loc": "outside right center"} if where == "right" else \
            {"loc": "outside lower center", "ncols": min(len(handles), 4)}
    ax.legend(handles, labels, **place, **kwargs)


def _figure_handles(fig: plt.Figure) -> tuple[list, list]:
    """Unique (handle, label) pairs over every panel, in first-seen order."""
    seen: dict[str, object] = {}
    for ax in fig.axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(text, handle)
    return list(seen.values()), list(seen)


def log_axis(ax: plt.Axes, axis: str = "x", base: float = 10, ticks: Sequence[float] | None = None) -> None:
    """A logarithmic ``axis`` with labelled major ticks only (plain numbers; ``ticks`` to choose them)."""
    getattr(ax, f"set_{axis}scale")("log", base=base)
    target = ax.xaxis if axis == "x" else ax.yaxis
    if ticks is not None:
        target.set_ticks(list(ticks))
    formatter = ScalarFormatter()
    formatter.set_scientific(False)
    target.set_major_formatter(formatter)
    target.set_minor_formatter(NullFormatter())


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


def mark_log_axes(fig: plt.Figure) -> None:
    """Append " (log)" to the label of every logarithmic axis of ``fig`` whose label does not say so: a reader
    of a log axis with plain-number ticks must be told. Labels the mark would push into a neighbour's (see
    :func:`layout_problems`) stay as they were."""
    marked = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            label = axis.get_label_text()
            if axis.get_scale() == "log" and label and "log" not in label:
                axis.set_label_text(f"{label} (log)")
                marked.append((axis, label))
    if marked and any("label" in problem for problem in layout_problems(fig)):
        for axis, label in marked:
            axis.set_label_text(label)


def fit_titles(fig: plt.Figure) -> None:
    """Wrap the suptitle and every panel title that would run off the figure (a user's long model path in it)
    onto lines that fit its width (measured after a draw: a layout engine moves titles)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    edge = fig.bbox
    for text in [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle is not None else []):
        content = text.get_text()
        box = text.get_window_extent(renderer)
        if not content.strip() or (box.x0 >= edge.x0 and box.x1 <= edge.x1):
            continue
        room = 2 * min((box.x0 + box.x1) / 2 - edge.x0, edge.x1 - (box.x0 + box.x1) / 2)  # centred on its spot
        longest = max(len(line) for line in content.splitlines())
        chars = max(20, int(longest * 0.9 * room / box.width))
        text.set_text("\n".join(textwrap.fill(line, chars) for line in content.splitlines()))


def save_figure(fig: plt.Figure, name: str, data: pd.DataFrame | None = None) -> Path:
    """Save ``fig`` as ``figures/NAME.png`` and ``data`` as ``figures/NAME.csv``; returns the PNG path.

    Titles that would run off the figure are wrapped first (:func:`fit_titles`). With ``SPECNB_STRICT_FIGURES=1``
    (set by ``specnb notebooks run``) a figure with :func:`layout_problems`
    raises :class:`FigureLayoutError` instead; with ``SPECNB_FIGURE_DUMP=DIR`` it is also pickled to
    ``DIR/NAME.pickle``."""
    mark_log_axes(fig)
    fit_titles(fig)
    if os.environ.get("SPECNB_STRICT_FIGURES") == "1" and (problems := layout_problems(fig)):
        raise FigureLayoutError(f"figure {name}: " + "; ".join(problems[:5]))
    out = figures_dir() / f"{name}.png"
    with atomic_file(out) as tmp:
        fig.savefig(tmp, pil_kwargs={"optimize": True})
    _record_title(out.parent, name, fig)
    if data is not None:
        write_csv(out.with_suffix(".csv"), data)
    if dump := os.environ.get("SPECNB_FIGURE_DUMP"):
        with atomic_file(Path(dump) / f"{name}.pickle") as tmp:
            tmp.write_bytes(pickle.dumps(fig))
    return out


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


def layout_problems(fig: plt.Figure, slack: float = 1.0) -> list[str]:
    """What a reader would trip over in ``fig``, from matplotlib's bounding boxes after a draw:

    * tick labels of one axis that overlap each other;
    * titles, axis labels, annotations and legends that overlap each other or another axis' tick labels;
    * a legend drawn over data (a line's vertex, a marker, a bar);
    * a panel whose data (lines, markers, bars, heatmap cells, in data coordinates) hold a single value.

    ``slack``: pixels two boxes may share before they count as overlapping. Returns one line per problem."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems: list[str] = []
    free: list[tuple[str, object]] = []  # (description, bbox) of texts that must not touch each other
    ticks: list[tuple[str, object]] = []
    for i, ax in enumerate(fig.axes):
        name = ax.get_title() or ax.get_label() or f"panel {i}"
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = _drawn_tick_labels(axis)
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
    problems += [f"{a} and {b} overlap" for a, fa in free for b, fb in ticks if _touch(fa, fb, slack)]
    return problems


def _drawn_tick_labels(axis) -> list:
    """The tick labels matplotlib draws: visible, non-empty, at a tick inside the axis' view limits (it also
    keeps labels for ticks just outside them, which are never drawn)."""
    lo, hi = sorted(axis.get_view_interval())
    span = (hi - lo) * 1e-9
    labels = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        inside = lo - span <= tick.get_loc() <= hi + span
        labels += [t for t in (tick.label1, tick.label2) if inside and t.get_visible() and t.get_text().strip()]
    return labels


def _touch(a, b, slack: float) -> bool:
    return a.x0 + slack < b.x1 and b.x0 + slack < a.x1 and a.y0 + slack < b.y1 and b.y0 + slack < a.y1


def _overlapping(boxes: list[tuple[str, object]], slack: float) -> list[tuple[str, str]]:
    return [(boxes[i][0], boxes[j][0]) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
            if _touch(boxes[i][1], boxes[j][1], slack)]


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
            if _touch(artist.get_window_extent(), box, 0.0):
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
