"""What a notebook concludes from, written where a reader (and a rerun) finds it, and its conclusions rendered
from that file.

A notebook makes one :class:`Results` at its start (``Results("03", profile)``). Every table it concludes
from goes through :meth:`Results.table` (``figures/03_<name>.csv``), every headline number through
:meth:`Results.add`, and the paper's numbers beside ours through :meth:`Results.paper`. Its conclusions are
one code cell, ``results.render(TEMPLATE)``: the numbers are written to ``figures/03_results.json``, read
back from that file and formatted into the Markdown template (``{ours[tokens_per_call]:.2f}``,
``{paper[tokens_per_call]}``), so a conclusion can only state what the results file holds, and a rerun
updates it by itself. The render also reports the notebook's wall time.

Every comparison a conclusion makes goes through :meth:`Results.compare`: our number, its 90% interval and
what the claim expects (:class:`specnb.study.verdicts.Expect`, tolerance included) are written to the results file
with the verdict computed from them (*agrees*, *disagrees*, *inconclusive*); ``{verdicts}`` in a template
renders them as a table, ``{verdict[key]}`` one of them in a sentence, ``{finding[key]}`` where our number
lies against the reference (higher, lower, tie, unclear). :meth:`Results.setup` records how far
this run's setup is from a paper's (model, hardware, datastore, prompts × tokens, task), ``{setup}`` renders
it. :meth:`Results.claim` states an effect of our own and refuses one whose interval is wider than it.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..atomic import write_csv, write_text
from .plots import figures_dir, use_profile
from .verdicts import Comparison, Expect

SETUP_FIELDS = ("model", "hardware", "dtype", "datastore", "prompts × tokens", "task")
"""The rows of a setup table, in order (others follow in the order given)."""


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
        use_profile(profile)  # figures go to figures/ for quick, figures/<profile>/ otherwise
        self.values: dict[str, Any] = {"profile": profile}
        self.ours: dict[str, Any] = {}
        self.papers: dict[str, Any] = {}
        self.tables: list[str] = []
        self.comparisons: dict[str, Comparison] = {}
        self.setups: dict[str, dict[str, dict[str, str]]] = {}
        self.start = time.perf_counter()

    @property
    def path(self) -> Path:
        """``figures/NN_results.json`` (``$SPECNB_FIGURES`` decides the folder)."""
        return figures_dir() / f"{self.prefix}_results.json"

    def table(self, name: str, frame: pd.DataFrame, index: bool = False) -> pd.DataFrame:
        """Write ``frame`` as ``figures/NN_<name>.csv`` and return it (to display)."""
        write_csv(figures_dir() / f"{self.prefix}_{name}.csv", frame, index=index)
        self.tables.append(f"{self.prefix}_{name}.csv")
        return frame

    def add(self, **numbers: Any) -> None:
        """Headline numbers measured by this run (``{ours[name]}`` in a template)."""
        self.ours.update(numbers)

    def paper(self, **numbers: Any) -> None:
        """The papers' numbers to state beside ours (``{paper[name]}`` in a template), with their source."""
        self.papers.update(numbers)

    def compare(self, key: str, claim: str, ours: float, low: float, high: float, expect: Expect, against: str,
                cause: str = "", fmt: str = ".3g") -> str:
        """Record a comparison (our number, its 90% interval [low, high] or NaN ends, what ``against`` expects)
        and return its verdict. ``cause``: the most likely reason for a disagreement, one line, shown only when
        the verdict is not *agrees*."""
        comparison = Comparison(claim, float(ours), float(low), float(high), expect, against, cause, fmt)
        self.comparisons[key] = comparison
        return comparison.verdict

    def claim(self, key: str, what: str, effect: float, low: float, high: float, fmt: str = "+.3g") -> None:
        """An effect a conclusion states as found (``{ours[key]}``, ``{ours[key_low]}``, ``{ours[key_high]}``);
        :class:`~specnb.eval.checks.DegenerateData` when its 90% interval is wider than the effect."""
        from ..eval.checks import check_effect

        check_effect(effect, low, high, what)
        self.add(**{key: effect, f"{key}_low": low, f"{key}_high": high})

    def setup(self, paper: str, here: dict[str, Any], theirs: dict[str, Any]) -> None:
        """How this run's setup compares with ``paper``'s: {field: value} for both sides, fields from
        :data:`SETUP_FIELDS` first; a field missing on one side renders as ``—``."""
        self.setups[paper] = {"here": {k: str(v) for k, v in here.items()},
                              "paper": {k: str(v) for k, v in theirs.items()}}

    def write(self) -> Path:
        """Write ``figures/NN_results.json``: profile, wall time so far, tables, ``ours``, ``paper``, the
        comparisons with their verdicts and the setup tables."""
        self.values.update(wall_seconds=round(time.perf_counter() - self.start, 1), tables=self.tables,
                           ours=self.ours, paper=self.papers,
                           verdicts={k: c.record() for k, c in self.comparisons.items()}, setup=self.setups)
        write_text(self.path, json.dumps(_plain(self.values), indent=1) + "\n")
        return self.path

    def render(self, template: str) -> Any:
        """Write the results file, read it back and format ``template`` (Markdown, ``str.format`` fields over
        its keys) with it; returns an ``IPython.display.Markdown`` ending with the run's provenance."""
        from IPython.display import Markdown

        values = _nan(json.loads(self.write().read_text()))
        values.update(verdict={k: verdict_sentence(v) for k, v in values["verdicts"].items()},
                      finding={k: v["finding"] for k, v in values["verdicts"].items()},
                      verdicts=verdict_table(values["verdicts"]), setup=setup_table(values["setup"]))
        text = template.format_map(values)
        print(f"{self.prefix}: wall time {values['wall_seconds']:.0f} s")
        return Markdown(f"{text}\n\n*Rendered from `{self.path.name}` ({values['profile']} profile, "
                        f"{values['wall_seconds']:.0f} s of wall time).*")


def verdict_sentence(record: dict) -> str:
    """One comparison of a results file in words: ``**agrees** — 1.23 (0.98–1.41) against ≈ 1.2 ± 0.1
    (CREST Table 2)``, and for a disagreement its likely cause."""
    text = f"**{record['verdict']}** — {record['measured']} against {record['expected']} ({record['against']})"
    if record["verdict"] == "inconclusive" and not math.isnan(record["low"]):
        text += "; the interval crosses an edge of the expectation"
    return text + (f"; likely cause: {record['cause']}" if record.get("cause") else "")


def verdict_table(records: dict[str, dict]) -> str:
    """Every comparison of a results file as a Markdown table (claim, ours with its 90% interval, what was
    expected and by whom, the verdict, the finding against the reference, the likely cause)."""
    if not records:
        return ""
    lines = ["| claim | ours (90% interval) | expected | by | verdict | finding | likely cause |",
             "|---|---|---|---|---|---|---|"]
    for r in records.values():
        lines.append(f"| {r['claim']} | {r['measured']} | {r['expected']} | {r['against']} | **{r['verdict']}** | "
                     f"{r['finding']} | {r.get('cause') or ''} |")
    return "\n".join(lines)


def setup_table(setups: dict[str, dict[str, dict[str, str]]]) -> str:
    """The setup tables of a results file as Markdown: one table per paper, a row per field, here vs there."""
    out = []
    for paper, sides in setups.items():
        fields = [f for f in SETUP_FIELDS if f in sides["here"] or f in sides["paper"]]
        fields += [f for f in {**sides["here"], **sides["paper"]} if f not in fields]
        lines = [f"| setup | here | {paper} |", "|---|---|---|"]
        lines += [f"| {f} | {sides['here'].get(f, '—')} | {sides['paper'].get(f, '—')} |" for f in fields]
        out.append("\n".join(lines))
    return "\n\n".join(out)
