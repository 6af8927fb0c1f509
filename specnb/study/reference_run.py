"""The published reference run: what a reader sees on opening the repository, and what moved between two runs.

``specnb notebooks run --profile quick`` writes every figure, table and ``NN_results.json`` into ``figures/`` and
stamps the run there (``figures/RUN.json``: machine, CPU class and flags, commit, date, wall times). ``specnb
notebooks publish`` then copies the executed notebooks, outputs included, over ``notebooks/NN_*.ipynb`` (each
stamped with the hash of its code cells, so a test can tell outputs that no longer match their code) and writes
``figures/README.md``, one line per figure and every verdict. ``specnb figures compare OLD NEW`` lists every
headline number that moved beyond its 90% interval between two runs (folders, or git revisions of ``figures/``),
so a change's effect on the study is visible in review.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import platform
import subprocess
from pathlib import Path
from typing import Any

from ..atomic import write_text

ROOT = Path(__file__).resolve().parents[2]
STAMP = "specnb"  # the notebook metadata key of a published notebook's stamp


def git(*args: str) -> str:
    """Output of a git command in the repository ('' where git or the repository is missing)."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine() -> dict[str, Any]:
    """The machine a run's numbers belong to: CPU model, class, the flags that decide the kernels' path,
    cores, memory, torch."""
    from ..model.kernels.cpu import cpu_class, cpu_flags

    model, memory = platform.processor() or "cpu", ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        memory = next(line.split(":", 1)[1].strip() for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    import os

    import torch

    relevant = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx512_fp16")
    return {"cpu": model, "cpu_class": cpu_class(), "flags": [f for f in relevant if f in cpu_flags()],
            "cores": os.cpu_count(), "memory": memory, "torch": torch.__version__, "python": platform.python_version()}


def stamp_run(folder: Path, profile: str, seconds: dict[str, float], failed: list[str],
              bandwidth: dict[str, float | None] | None = None) -> Path:
    """Write ``folder/RUN.json``: profile, commit (and whether the tree had changes), date, machine, each
    notebook's wall seconds, the read bandwidth sampled before each (GB/s; a VM's drifts, and times with it)
    and the failures."""
    record = {"profile": profile, "commit": git("rev-parse", "--short", "HEAD"),
              "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!figures")),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(), "notebook_seconds": {k: round(v, 1) for k, v in seconds.items()},
              "read_gb_per_s": {k: round(v, 1) for k, v in (bandwidth or {}).items() if v is not None},
              "total_minutes": round(sum(seconds.values()) / 60, 1), "failed": failed}
    path = folder / "RUN.json"
    write_text(path, json.dumps(record, indent=1) + "\n")
    return path


# ------------------------------------------------------------------------------------------ notebooks


def code_hash(notebook: dict) -> str:
    """sha256 (16 hex digits) of a notebook's code cells, papermill's injected parameters cell left out."""
    digest = hashlib.sha256()
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code" and "injected-parameters" not in cell.get("metadata", {}).get("tags", []):
            digest.update("".join(cell["source"]).encode() + b"\0")
    return digest.hexdigest()[:16]


def publish(executed: Path, notebooks: Path, figures: Path) -> list[Path]:
    """Copy every executed notebook of ``executed`` over its source in ``notebooks`` with its outputs, without
    papermill's injected cell and metadata, stamped with its code hash and ``figures/RUN.json``'s run; refuses
    (ValueError) a notebook whose code differs from its source's, one that failed, or a run not in quick; then
    writes ``figures/README.md``. Returns the notebooks written."""
    run = json.loads((figures / "RUN.json").read_text())
    if run["profile"] != "quick" or run["failed"]:
        raise ValueError(f"publish a quick run where every notebook ran (RUN.json: profile {run['profile']}, "
                         f"failed {run['failed']})")
    written = []
    for path in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        source_path = notebooks / path.name
        done = json.loads(path.read_text())
        source = json.loads(source_path.read_text())
        done["cells"] = [c for c in done["cells"]
                         if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
        if code_hash(done) != code_hash(source):
            raise ValueError(f"{path.name}: its code differs from {source_path} (rerun it before publishing)")
        for cell in done["cells"]:
            cell.get("metadata", {}).pop("papermill", None)
            cell.get("metadata", {}).pop("execution", None)
        done["metadata"].pop("papermill", None)
        done["metadata"][STAMP] = {"profile": run["profile"], "commit": run["commit"], "date": run["date"],
                                   "cpu_class": run["machine"]["cpu_class"], "code_hash": code_hash(done)}
        write_text(source_path, json.dumps(done, indent=1, ensure_ascii=False) + "\n")
        written.append(source_path)
    write_text(figures / "README.md", index(figures))
    return written


# ---------------------------------------------------------------------------------------------- index


def _bandwidth_note(run: dict[str, Any]) -> str:
    """" (read bandwidth before each notebook: LOW-HIGH GB/s)", or "" for runs that did not sample it."""
    values = list(run.get("read_gb_per_s", {}).values())
    return f" (read bandwidth before each notebook: {min(values):.1f}-{max(values):.1f} GB/s)" if values else ""


def index(figures: Path) -> str:
    """``figures/README.md``: the run's provenance, then per notebook its figures (one line each: file and what
    it shows, from the figure's title) and its verdicts (claim, ours against the expectation, verdict, and the
    likely cause of a disagreement or an inconclusive one)."""
    run = json.loads((figures / "RUN.json").read_text())
    m = run["machine"]
    lines = ["# The reference run", "",
             f"Every file here comes from one `make figures` run (profile `{run['profile']}`) of commit "
             f"`{run['commit']}`{' with local changes' if run['dirty'] else ''} on {run['date']}: {m['cpu']}, "
             f"{m['cores']} cores, CPU class `{m['cpu_class']}` (flags: {', '.join(m['flags'])}), torch "
             f"{m['torch']}; {run['total_minutes']} min of notebooks{_bandwidth_note(run)}. The executed notebooks, "
             "with these outputs, are `notebooks/NN_*.ipynb`. `specnb figures compare OLD NEW` lists what moved "
             "between two runs.", ""]
    return "\n".join(lines + notebook_sections(figures))


def notebook_sections(figures: Path, link: str = "", only: list[str] | None = None,
                      notebooks: dict[str, str] | None = None) -> list[str]:
    """Markdown lines, per ``NN_results.json`` in ``figures`` (those of ``only``'s prefixes, when given): a heading
    (``notebooks[NN]``, else the notebook's file name), one line per figure (``link`` + file, and what it shows,
    from its title) and its verdicts (claim, ours against the expectation, verdict, and the likely cause of a
    disagreement or an inconclusive one)."""
    titles = json.loads((figures / "titles.json").read_text()) if (figures / "titles.json").exists() else {}
    lines = []
    for results in sorted(figures.glob("[0-9][0-9]_results.json")):
        prefix = results.name[:2]
        if only is not None and prefix not in only:
            continue
        notebook = (notebooks or {}).get(prefix) or next(
            (p.name for p in sorted((ROOT / "notebooks").glob(f"{prefix}_*.ipynb"))), prefix)
        lines += [f"## {notebook}", ""]
        for png in sorted(figures.glob(f"{prefix}_*.png")):
            lines.append(f"- [`{png.name}`]({link}{png.name}) — {titles.get(png.stem, '')}".rstrip(" —"))
        verdicts = json.loads(results.read_text()).get("verdicts", {})
        if verdicts:
            lines += ["", "| claim | ours (90% interval) | expected | verdict | likely cause, where not agreeing |",
                      "|---|---|---|---|---|"]
            lines += [f"| {v['claim']} | {v['measured']} | {v['expected']} ({v['against']}) | **{v['verdict']}** | "
                      f"{v.get('cause', '') if v['verdict'] != 'agrees' else ''} |" for v in verdicts.values()]
        lines.append("")
    return lines


# -------------------------------------------------------------------------------------------- compare


def load_results(where: str) -> dict[str, dict]:
    """{``NN``: results file} of a figures folder, or of ``figures/`` at a git revision (``HEAD~1``, a sha)."""
    folder = Path(where)
    if folder.is_dir():
        return {p.name[:2]: json.loads(p.read_text()) for p in sorted(folder.glob("[0-9][0-9]_results.json"))}
    names = git("ls-tree", "--name-only", f"{where}:figures")
    if not names:
        raise ValueError(f"{where!r} is neither a folder nor a git revision with a figures/ folder")
    return {name[:2]: json.loads(git("show", f"{where}:figures/{name}"))
            for name in names.splitlines() if name.endswith("_results.json") and name[:2].isdigit()}


def moved(old: dict[str, dict], new: dict[str, dict]) -> list[dict[str, Any]]:
    """Every compared number of ``new`` whose value lies outside ``old``'s 90% interval or whose interval
    excludes ``old``'s value, and every verdict that changed: one row per notebook and key, with both values,
    intervals and verdicts. Numbers without an interval are not judged (they cannot move *beyond* one)."""
    rows = []
    for prefix in sorted(set(old) & set(new)):
        before, after = old[prefix].get("verdicts", {}), new[prefix].get("verdicts", {})
        for key in sorted(set(before) & set(after)):
            a, b = before[key], after[key]
            outside = _outside(b["ours"], a["low"], a["high"]) or _outside(a["ours"], b["low"], b["high"])
            if outside or a["verdict"] != b["verdict"]:
                rows.append({"notebook": prefix, "key": key, "claim": b["claim"], "old": a["measured"],
                             "new": b["measured"], "old_verdict": a["verdict"], "new_verdict": b["verdict"]})
    return rows


def _outside(value: float | None, low: float | None, high: float | None) -> bool:
    if value is None or low is None or high is None or any(math.isnan(x) for x in (value, low, high)):
        return False
    return not low <= value <= high
