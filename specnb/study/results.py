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
:meth:`Results.takeaway` gives a figure its one line for the front page, formatted from the same file.
:func:`uncited` lists the numbers a cause line cites that its results file does not hold.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..atomic import write_csv, write_text
from .plots import figures_dir, use_profile
from .scope import UNTESTED, scoped
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
        self.takeaways: dict[str, str] = {}
        self.start = time.perf_counter()
        self.started = time.time()  # wall clock: a file modified since was written by this run

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
                cause: str = "", fmt: str = ".3g", *, internal: bool, direction_only: bool,
                evidence: dict[str, Any] | None = None) -> str:
        """Record a comparison (our number, its 90% interval [low, high] or NaN ends, what ``against`` expects)
        and return its verdict. ``cause``: the most likely reason for a disagreement, one line, shown only when
        the verdict is not *agrees*; ``evidence``: {name: value} of every measured quantity the cause cites.
        ``internal``: against our own method, baseline or aim rather than a published claim; ``direction_only``:
        the test checks only the sign of an effect whose size the source reports. Both are stated by the caller,
        where the claim is written."""
        comparison = Comparison(claim, float(ours), float(low), float(high), expect, against, cause, fmt,
                                internal, direction_only, {k: _plain(v) for k, v in (evidence or {}).items()})
        self.comparisons[key] = comparison
        return comparison.verdict

    def judged_ratio(self, key: str, what: str) -> str:
        """"``what``: ×0.69 (0.67–0.72), paired": comparison ``key``'s ratio and interval as a figure states it
        beside what it draws ("" where ``key`` was not compared), so a panel of each method over AR also shows
        the ratio its verdict judges."""
        c = self.comparisons.get(key)
        return f"{what}: ×{c.ours:.2f} ({c.low:.2f}–{c.high:.2f}), paired" if c is not None else ""

    def claim(self, key: str, what: str, effect: float, low: float, high: float, fmt: str = "+.3g") -> None:
        """An effect a conclusion states as found (``{ours[key]}``, ``{ours[key_low]}``, ``{ours[key_high]}``);
        :class:`~specnb.eval.checks.DegenerateData` when its 90% interval is wider than the effect."""
        from ..eval.checks import check_effect

        check_effect(effect, low, high, what)
        self.add(**{key: effect, f"{key}_low": low, f"{key}_high": high})

    def takeaway(self, figure: str, template: str) -> None:
        """The one line the front page gives ``figure`` (its file stem, ``"00_quickstart_speed"``): a template
        over the results file's keys, like :meth:`render`'s, formatted when the file is written."""
        self.takeaways[figure] = template

    def setup(self, paper: str, here: dict[str, Any], theirs: dict[str, Any]) -> None:
        """How this run's setup compares with ``paper``'s: {field: value} for both sides, fields from
        :data:`SETUP_FIELDS` first; a field missing on one side renders as ``—``."""
        self.setups[paper] = {"here": {k: str(v) for k, v in here.items()},
                              "paper": {k: str(v) for k, v in theirs.items()}}

    def write(self) -> Path:
        """Write ``figures/NN_results.json``: profile, wall time so far, tables, ``ours``, ``paper``, the
        comparisons with their verdicts, the setup tables and the figures' takeaways (formatted from the rest).
        A table this run wrote whose bytes equal a figure's CSV written by this run too is removed first
        (:meth:`_drop_twins`)."""
        self._drop_twins()
        self.values.update(wall_seconds=round(time.perf_counter() - self.start, 1), tables=self.tables,
                           ours=self.ours, paper=self.papers,
                           verdicts=scoped(self.prefix, {k: c.record() for k, c in self.comparisons.items()},
                                           self.setups), setup=self.setups)
        values = _plain(self.values)
        context = _nan(json.loads(json.dumps(values)))
        values["takeaways"] = {figure: template.format_map(context) for figure, template in self.takeaways.items()}
        write_text(self.path, json.dumps(values, indent=1) + "\n")
        return self.path

    def _drop_twins(self) -> None:
        """Unlink each table CSV of :attr:`tables` (written by this run) whose bytes equal those of a figure's CSV
        (one beside a PNG of the same name) written since this run started; nothing else is touched."""
        folder = figures_dir()
        figures = [f for f in folder.glob(f"{self.prefix}_*.csv") if f.name not in self.tables
                   and f.with_suffix(".png").exists() and f.stat().st_mtime >= self.started]
        for name in list(self.tables):
            table = folder / name
            if table.exists() and table.stat().st_mtime >= self.started and any(
                    f.stat().st_size == table.stat().st_size and f.read_bytes() == table.read_bytes()
                    for f in figures):
                table.unlink()
                self.tables.remove(name)

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


def verdict_words(record: dict) -> str:
    """A comparison's verdict with its kind: ``agrees (direction only)``, ``inconclusive, leans agrees``,
    ``disagrees``, ``not tested here (measured: disagrees)`` (:mod:`specnb.study.scope`), and ``; internal`` for
    our own checks."""
    if record["verdict"] == UNTESTED:
        return f"not tested here (measured: {record['measured_verdict']})"
    words = record["verdict"]
    if record["verdict"] == "agrees" and record.get("direction_only"):
        words += " (direction only)"
    if isinstance(record.get("lean"), str):  # None (NaN once a template reads the file) when not inconclusive
        words += f", leans {record['lean']}"
    return words + ("; internal" if record.get("internal") else "")


def verdict_sentence(record: dict) -> str:
    """One comparison of a results file in words: ``**agrees** — 1.23 (0.98–1.41) against ≈ 1.2 ± 0.1
    (CREST Table 2)``, and for a disagreement its likely cause."""
    text = f"**{verdict_words(record)}** — {record['measured']} against {record['expected']} ({record['against']})"
    if record["verdict"] == "inconclusive" and not math.isnan(record["low"]):
        text += "; the interval crosses an edge of the expectation"
    if record.get("untested"):
        return text + f"; not tested here: {record['untested']}"
    return text + (f"; likely cause: {record['cause']}" if record.get("cause") else "")


def verdict_table(records: dict[str, dict]) -> str:
    """Every comparison of a results file as a Markdown table (claim, ours with its 90% interval, what was
    expected and by whom, the verdict, the finding against the reference, the likely cause)."""
    if not records:
        return ""
    lines = ["| claim | ours (90% interval) | expected | by | verdict | finding | likely cause |",
             "|---|---|---|---|---|---|---|"]
    for r in records.values():
        lines.append(f"| {r['claim']} | {r['measured']} | {r['expected']} | {r['against']} | **{verdict_words(r)}** | "
                     f"{r['finding']} | {r.get('untested') or r.get('cause') or ''} |")
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


# ------------------------------------------------------------------------------------------- citations

_REFERENCE = re.compile(r"(?:§|\b(?:Figs?|Tables?|Eqs?|Algorithms?)\.?|\bnotebooks?|\bsections?|\bAppendix)"
                        r"\s*\d+(?:\.\d+)*(?:\s*(?:[–,-]|and|or)\s*\d+(?:\.\d+)*)*")
"""A reference to a part of a paper or of the study (``§5.3``, ``Fig. 4``, ``Tables 1 and 5``, ``notebook 05``):
a name, not a number a cause cites."""
_NAME = re.compile(r"\b(?:[A-Za-z][\w.]*\d[\w.]*|\d+[A-Za-z]\w*)")
"""A word that holds digits and letters (``V100``, ``7B``, ``bf16``, ``64D``, ``top-1024``'s ``top`` kept): a name."""
_NUMBER = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s*[–-]\s*(\d[\d,]*(?:\.\d+)?))?\s*(%|k\b|M\b|G\b|MB\b|GB\b|"
                     r"MiB\b|GiB\b)?")
_SCALES = {None: (1.0,), "%": (0.01, 1.0), "k": (1e3,), "M": (1e6,), "G": (1e9,), "MB": (1e6, 2**20, 1.0),
           "GB": (1e9, 2**30, 1.0), "MiB": (2**20, 1.0), "GiB": (2**30, 1.0)}


def cited_numbers(text: str) -> list[tuple[str, float, float, tuple[float, ...]]]:
    """The numbers a line cites, as (as written, value, half a unit of its last digit, scales its unit allows):
    ``27,063`` -> 27063, ``15%`` -> 15 (a share of 0.15 or 15), ``9.4 M`` -> 9.4 × 10⁶, a range ``19–31 M``
    -> both ends at the range's unit. References (``§5.3``, ``Fig. 4``, ``notebook 05``) and names holding
    digits (``V100``, ``7B``) are not numbers."""
    text = _NAME.sub(" ", _REFERENCE.sub(" ", text))
    out = []
    for match in _NUMBER.finditer(text):
        scales = _SCALES[match.group(3)]
        for written in filter(None, match.group(1, 2)):
            digits = written.replace(",", "")
            decimals = len(digits.partition(".")[2])
            out.append((match.group(0).strip(), float(digits), 0.5 * 10.0 ** -decimals, scales))
    return out


def _held_numbers(results: dict) -> list[float]:
    """Every number a results file holds: its numeric values anywhere, and the numbers written in its
    strings (the papers' numbers, setups, expectations), causes and claims left out."""
    numbers: list[float] = []

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if k not in ("cause", "claim", "takeaways"):
                    walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, bool) or value is None:
            return
        elif isinstance(value, int | float):
            numbers.append(float(value))
        elif isinstance(value, str):
            numbers.extend(v * scale for _, v, _, scales in cited_numbers(value) for scale in scales)

    walk(results)
    return numbers


def uncited(results: dict) -> list[str]:
    """Every number in a cause line of ``results`` (a parsed ``NN_results.json``) that the file does not hold
    at the precision the cause writes it, as ``key: number`` (empty when every cited number is held). A cause
    that names a measured quantity should carry it in its comparison's ``evidence``."""
    held = np.asarray(_held_numbers(results))
    missing = []
    for key, record in results.get("verdicts", {}).items():
        for written, value, half, scales in cited_numbers(record.get("cause") or ""):
            if not any(np.any(np.abs(held - value * scale) <= (half + 1e-9) * scale * (1 + 1e-9))
                       or scale == 0.01 and np.any(np.abs(held * 100 - value) <= half + 1e-9) for scale in scales):
                missing.append(f"{key}: {written}")
    return missing
