"""One figure style for every notebook, one heatmap (seaborn) and the roofline's row of them, and saving a figure
with the data behind it.

``save_figure(fig, "05_roofline_bf16", table)`` writes ``figures/05_roofline_bf16.png`` and
``figures/05_roofline_bf16.csv`` so a reader can re-plot or check any number.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402

STYLE = {
    "figure.figsize": (6.4, 4.0),
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 10,
    "legend.frameon": False,
}
plt.rcParams.update(STYLE)


def heatmap(table: pd.DataFrame, ax: plt.Axes, *, fmt: str = ".2f", cmap: str = "viridis", log: bool = False,
            vmin: float | None = None, vmax: float | None = None, label: str = "",
            outline: np.ndarray | None = None, hatch_missing: bool = True) -> plt.Axes:
    """A grid such as (k, w) -> value as an annotated seaborn heatmap, first row of ``table`` at the bottom.

    table: index = y values, columns = x values (``frame.pivot(index="k", columns="w", values=...)``); NaN
    cells stay blank over a hatched background (not measured). log: a logarithmic colour scale (when the
    values span more than a factor 2). outline: bool [rows, columns], cells to frame in cyan (e.g. past a
    threshold). label: the colour bar's label.
    """
    values = table.to_numpy(dtype=float)
    lo = np.nanmin(values) if vmin is None else vmin
    hi = np.nanmax(values) if vmax is None else vmax
    norm = LogNorm(lo, hi) if log and lo > 0 and hi > 2 * lo else Normalize(lo, max(hi, lo + 1e-9))
    if hatch_missing:
        ax.add_patch(plt.Rectangle((0, 0), values.shape[1], values.shape[0], hatch="//", fill=False, color="0.6",
                                   lw=0, zorder=0))
    sns.heatmap(table, ax=ax, annot=True, fmt=fmt, cmap=cmap, norm=norm, annot_kws={"fontsize": 7},
                cbar_kws={"label": label})
    ax.invert_yaxis()
    if outline is not None:
        for i, j in zip(*np.nonzero(outline), strict=True):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, ec="tab:cyan", lw=1.0))
    ax.grid(False)
    return ax


def slowdown_heatmaps(frame: pd.DataFrame, title: str, threshold: float) -> plt.Figure:
    """One :func:`heatmap` per context length of a roofline table (:func:`specnb.roofline.measure` rows: context,
    k, w, slowdown): the slow-down of each (k, w) call over (1, 0) on a log colour scale from 1, cells above
    ``threshold`` outlined (past the memory-bound regime), unmeasured cells hatched."""
    from .roofline import heatmap_table

    contexts = sorted(frame.context.unique())
    ks, ws = sorted(frame.k.unique()), sorted(frame.w.unique())
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.6 * len(contexts), 4.2), squeeze=False)
    vmax = float(np.nanmax(frame.slowdown))
    for ax, context in zip(axes[0], contexts, strict=True):
        table = heatmap_table(frame, context).reindex(index=ks, columns=ws)
        heatmap(table, ax, fmt=".1f", cmap="magma_r", log=True, vmin=1.0, vmax=max(vmax, 1.01),
                label="slow-down vs (1, 0)", outline=table.to_numpy() > threshold)
        ax.set(xlabel="w (speculated tokens)", ylabel="k (drafts)", title=f"ℓ = {context}")
    fig.suptitle(title)
    return fig


def figures_dir() -> Path:
    """``$SPECNB_FIGURES`` or ``figures/`` at the repository root (created on demand)."""
    default = Path(__file__).resolve().parent.parent / "figures"
    path = Path(os.environ.get("SPECNB_FIGURES", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_figure(fig: plt.Figure, name: str, data: pd.DataFrame | None = None) -> Path:
    """Save ``fig`` as ``figures/NAME.png`` and ``data`` as ``figures/NAME.csv``; returns the PNG path."""
    out = figures_dir() / f"{name}.png"
    fig.savefig(out)
    if data is not None:
        data.to_csv(out.with_suffix(".csv"), index=False)
    return out
