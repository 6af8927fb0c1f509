"""One figure style for every notebook, and saving a figure together with the data behind it.

``save_figure(fig, "05_roofline_bf16", table)`` writes ``figures/05_roofline_bf16.png`` and
``figures/05_roofline_bf16.csv`` so a reader can re-plot or check any number.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

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
