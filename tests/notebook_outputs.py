"""What a reader should not meet in an executed notebook, and a notebook run as a reader would run it: the
notebook tests' checks (``test_notebooks.py``, ``test_study_run.py``)."""

from __future__ import annotations

from pathlib import Path

PROGRESS_MARKS = ("%|", "it/s]", "s/it]")
MAX_PROGRESS_LINES = 2  # per output: a finished bar, perhaps its first state


def output_problems(notebook: dict) -> list[str]:
    """What a reader should not meet in an executed notebook's outputs: an error or a traceback, a line that
    reports a warning, or a progress bar that left more than :data:`MAX_PROGRESS_LINES` lines (text-mode
    tqdm writes one per update). One line per problem, with the cell's index."""
    problems = []
    for i, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                problems.append(f"cell {i}: {output.get('ename')}: {output.get('evalue', '')[:120]}")
                continue
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            text = "".join(text) if isinstance(text, list) else text
            lines = [line for line in text.replace("\r", "\n").splitlines() if line.strip()]
            if any("Traceback (most recent call last)" in line for line in lines):
                problems.append(f"cell {i}: a traceback in its output")
            problems += [f"cell {i}: {line.strip()[:160]}" for line in lines if "Warning" in line]
            progress = [line for line in lines if any(mark in line for mark in PROGRESS_MARKS)]
            if len(progress) > MAX_PROGRESS_LINES:
                problems.append(f"cell {i}: a progress bar left {len(progress)} lines ({progress[0].strip()[:60]})")
    return problems


MAX_PNG_BYTES = 150_000  # a committed figure stays small


def run_problems(executed: Path, figures: Path) -> list[str]:
    """What a smoke run of one notebook left wrong, one line each: :func:`output_problems` of ``executed`` (the
    executed notebook, ``NN_name.ipynb``); no ``NN_*.png`` in ``figures`` and no line in a figure's place saying
    why (:func:`specnb.study.plots.constant_instead`: a flat series); a figure over :data:`MAX_PNG_BYTES`; no
    ``NN_results.json`` of profile smoke with headline numbers, a table it names missing, or conclusions not
    rendered from it by a code cell. ``figures`` may hold other notebooks' files: only this one's ``NN_`` are read.
    (Layout: the runs save strictly, ``SPECNB_STRICT_FIGURES``, so a figure with layout problems fails its cell.)"""
    import json

    prefix = executed.name[:2]
    notebook = json.loads(executed.read_text())
    problems = output_problems(notebook)
    pngs = sorted(figures.glob(f"{prefix}_*.png"))
    rendered = ["".join(output["data"]["text/markdown"]) for cell in notebook["cells"] if cell["cell_type"] == "code"
                for output in cell.get("outputs", []) if "text/markdown" in output.get("data", {})]
    said_why = any(text.startswith("*No figure: ") for text in rendered)  # plots.constant_instead: a flat series
    problems += [] if pngs or said_why else ["no figure saved, and no line saying why"]
    problems += [f"{png.name}: {png.stat().st_size // 1000} kB" for png in pngs if png.stat().st_size >= MAX_PNG_BYTES]
    path = figures / f"{prefix}_results.json"
    if not path.exists():
        return [*problems, f"no {path.name}: headline numbers go to NN_results.json"]
    results = json.loads(path.read_text())
    problems += [] if results["profile"] == "smoke" and results["ours"] else [f"{path.name}: no headline numbers"]
    problems += [f"{path.name} names {table}, not written" for table in results["tables"]
                 if not (figures / table).exists()]
    problems += [] if any(path.name in text for text in rendered) else \
        [f"the conclusions are not a code cell rendered from {path.name}"]
    return problems


def run_edited(path: Path, profile: str, cwd: Path, timeout: int = 900) -> dict:
    """Execute ``path`` top to bottom in a fresh kernel as a reader would after editing its ``parameters`` cell to
    ``profile`` (no papermill: its ``profile = ...`` line is rewritten in place); returns the executed notebook
    (nbformat), or raises ``nbclient``'s CellExecutionError at the first failing cell."""
    import re

    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    cell = next(c for c in notebook.cells if "parameters" in c.metadata.get("tags", []))
    cell.source, count = re.subn(r'^profile\s*=\s*["\'][a-z]+["\']', f'profile = "{profile}"', cell.source,
                                 flags=re.MULTILINE)
    if count != 1:
        raise ValueError(f"{path.name}: its parameters cell has no single `profile = \"...\"` line")
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return notebook
