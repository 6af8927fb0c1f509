"""What a notebook concludes from, written where a reader (and a rerun) finds it, and its conclusions rendered
from that file.

A notebook makes one :class:`Results` at its start (``Results("03", profile)``). Every table it concludes
from goes through :meth:`Results.table` (``figures/03_<name>.csv``), every headline number through
:meth:`Results.add`, and the paper's numbers beside ours through :meth:`Results.paper`. Its conclusions are
one code cell, ``results.render(TEMPLATE)``: the numbers are written to ``figures/03_results.json``, read
back from that file and formatted into the Markdown template (``{ours[tokens_per_call]:.2f}``,
``{paper[tokens_per_call]}``), so a conclusion can only state what the results file holds, and a rerun
updates it by itself. The render also reports the notebook's wall time.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .plots import figures_dir


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars and arrays to Python, NaN to None, mappings and sequences recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray | pd.Series):
        return [_plain(v) for v in list(value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _nan(value: Any) -> Any:
    """Inverse of :func:`_plain`: None back to NaN (so a template's ``:.2f`` prints nan) and integer keys back
    to ints (``str.format`` reads ``{ours[grid][64]}`` as the integer 64)."""
    if isinstance(value, dict):
        return {int(k) if k.isdigit() else k: _nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan(v) for v in value]
    return math.nan if value is None else value


class Results:
    """The tables and headline numbers of notebook ``prefix`` (``"03"``) for one run under ``profile``."""

    def __init__(self, prefix: str, profile: str):
        self.prefix = prefix
        self.values: dict[str, Any] = {"profile": profile}
        self.ours: dict[str, Any] = {}
        self.papers: dict[str, Any] = {}
        self.tables: list[str] = []
        self.start = time.perf_counter()

    @property
    def path(self) -> Path:
        """``figures/NN_results.json`` (``$SPECNB_FIGURES`` decides the folder)."""
        return figures_dir() / f"{self.prefix}_results.json"

    def table(self, name: str, frame: pd.DataFrame, index: bool = False) -> pd.DataFrame:
        """Write ``frame`` as ``figures/NN_<name>.csv`` and return it (to display)."""
        frame.to_csv(figures_dir() / f"{self.prefix}_{name}.csv", index=index)
        self.tables.append(f"{self.prefix}_{name}.csv")
        return frame

    def add(self, **numbers: Any) -> None:
        """Headline numbers measured by this run (``{ours[name]}`` in a template)."""
        self.ours.update(numbers)

    def paper(self, **numbers: Any) -> None:
        """The papers' numbers to state beside ours (``{paper[name]}`` in a template), with their source."""
        self.papers.update(numbers)

    def write(self) -> Path:
        """Write ``figures/NN_results.json``: profile, wall time so far, tables, ``ours`` and ``paper``."""
        self.values.update(wall_seconds=round(time.perf_counter() - self.start, 1), tables=self.tables,
                           ours=self.ours, paper=self.papers)
        self.path.write_text(json.dumps(_plain(self.values), indent=1) + "\n")
        return self.path

    def render(self, template: str) -> Any:
        """Write the results file, read it back and format ``template`` (Markdown, ``str.format`` fields over
        its keys) with it; returns an ``IPython.display.Markdown`` ending with the run's provenance."""
        from IPython.display import Markdown

        values = _nan(json.loads(self.write().read_text()))
        text = template.format_map(values)
        print(f"{self.prefix}: wall time {values['wall_seconds']:.0f} s")
        return Markdown(f"{text}\n\n*Rendered from `{self.path.name}` ({values['profile']} profile, "
                        f"{values['wall_seconds']:.0f} s of wall time).*")
