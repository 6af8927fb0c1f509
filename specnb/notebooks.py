"""Run the numbered notebooks with papermill under a profile.

Executed copies go to ``notebooks/executed/<profile>/`` (git-ignored). Figures go to ``figures/`` for the
default ``quick`` profile and to ``figures/<profile>/`` otherwise, so a smoke run never overwrites them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def find_notebooks(names: list[str] | None = None, folder: Path = NOTEBOOKS) -> list[Path]:
    """``NN_*.ipynb`` in ``folder``, sorted; ``names`` filters by prefix or stem (``00``, ``00_quickstart``)."""
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return found
    chosen = [p for p in found if any(p.stem == n or p.stem.startswith(n) or p.name == n for n in names)]
    missing = [n for n in names if not any(p.stem == n or p.stem.startswith(n) or p.name == n for p in found)]
    if missing:
        raise ValueError(f"no notebook matches {', '.join(missing)}; have: {', '.join(p.stem for p in found)}")
    return chosen


def figures_for(profile: str) -> Path:
    return ROOT / "figures" if profile == "quick" else ROOT / "figures" / profile


@dataclass
class NotebookRun:
    """One executed notebook: its executed copy, wall seconds, and the error that stopped it (None if it ran)."""

    source: Path
    executed: Path
    seconds: float
    error: str | None = None


def run_notebooks(profile: str = "quick", names: list[str] | None = None, parameters: dict | None = None,
                  output_dir: Path | None = None) -> list[NotebookRun]:
    """Execute notebooks in order, each to the end or to its first failing cell; a failure does not stop the
    others. Prints each notebook's wall time as it finishes; returns one :class:`NotebookRun` per notebook."""
    import papermill

    output_dir = output_dir or NOTEBOOKS / "executed" / profile
    output_dir.mkdir(parents=True, exist_ok=True)
    os.environ["SPECNB_FIGURES"] = str(figures_for(profile))
    done = []
    for path in find_notebooks(names):
        start = time.perf_counter()
        out = output_dir / path.name
        error = None
        try:
            papermill.execute_notebook(str(path), str(out), parameters={"profile": profile, **(parameters or {})},
                                       kernel_name="python3", cwd=str(path.parent), progress_bar=False)
        except Exception as exc:  # any failure of one notebook is reported; the others still run
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        done.append(NotebookRun(path, out, time.perf_counter() - start, error))
        status = "FAILED" if error else "ok"
        print(f"{path.name}: {status} in {done[-1].seconds:.0f} s -> {out}", flush=True)
    return done
