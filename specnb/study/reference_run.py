"""The published reference run: what a reader sees on opening the repository, and what moved between two runs.

``specnb notebooks run --profile quick`` writes every figure, table and ``NN_results.json`` into ``figures/`` and
stamps the run there (``figures/RUN.json``: machine, CPU class and flags, commit, date, wall times). ``specnb
notebooks publish`` then copies the executed notebooks, outputs included, over ``notebooks/NN_*.ipynb`` (each
stamped with the hash of its code cells, so a test can tell outputs that no longer match their code) and writes
``figures/README.md``: the verdicts counted per source, each figure with its takeaway, every verdict, the notation,
and the machine. ``specnb figures compare OLD NEW`` lists every
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
    """The machine a run's numbers belong to: CPU (name, family and model), class, the flags that decide the
    kernels' path, cores, memory, torch."""
    from ..model.kernels.cpu import cpu_class, cpu_flags, cpu_id

    memory = ""
    try:
        memory = next(line.split(":", 1)[1].strip() for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
    except (OSError, StopIteration):
        pass
    import os

    import torch

    relevant = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "avx512_fp16")
    return {"cpu": cpu_id(), "cpu_class": cpu_class(), "flags": [f for f in relevant if f in cpu_flags()],
            "cores": os.cpu_count(), "memory": memory, "torch": torch.__version__, "python": platform.python_version()}


def stamp_run(folder: Path, profile: str, seconds: dict[str, float], failed: list[str],
              bandwidth: dict[str, float | None] | None = None, not_run: list[str] | None = None) -> Path:
    """Write ``folder/RUN.json``: profile, commit (and whether the tree had changes), date, machine, each
    notebook's wall seconds, the read bandwidth sampled before each (GB/s; a VM's drifts, and times with it),
    the failures and the notebooks a partial run has not run yet (``not_run``, stems)."""
    record = {"profile": profile, "commit": git("rev-parse", "--short", "HEAD"),
              "dirty": _dirty(),
              "date": _now(),
              "machine": machine(), "notebook_seconds": {k: round(v, 1) for k, v in seconds.items()},
              "read_gb_per_s": {k: round(v, 1) for k, v in (bandwidth or {}).items() if v is not None},
              "total_minutes": round(sum(seconds.values()) / 60, 1), "failed": failed, "not_run": list(not_run or [])}
    path = folder / "RUN.json"
    write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def _now() -> str:
    """The time a run or a rerun is stamped with, to the minute, in UTC."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _dirty() -> bool:
    """Whether the run's code is not the commit's: a tracked file outside ``figures/`` differs from it, a notebook
    only where its code does (:func:`code_hash`; publishing writes a run's outputs into the notebooks)."""
    for name in git("diff", "--name-only", "HEAD", "--", ".", ":!figures").splitlines():
        try:
            if not name.endswith(".ipynb") or code_hash(json.loads((ROOT / name).read_text())) != \
                    code_hash(json.loads(git("show", f"HEAD:{name}"))):
                return True
        except (OSError, ValueError, KeyError):  # gone, or not a notebook's JSON: changed
            return True
    return False


def amend_run(folder: Path, profile: str, seconds: dict[str, float], failed: list[str],
              bandwidth: dict[str, float | None] | None = None) -> Path | None:
    """Some notebooks of a whole run rerun alone (one that failed, fixed): ``folder/RUN.json``'s times, bandwidths
    and failures of those notebooks replaced, the others' kept, those of a partial run's ``not_run`` taken off it,
    and each rerun's date and commit recorded under ``rerun``. None (nothing written) where the folder holds no
    RUN.json of ``profile``."""
    path = folder / "RUN.json"
    if not path.exists() or json.loads(path.read_text()).get("profile") != profile:
        return None
    record = json.loads(path.read_text())
    when = {"date": _now(),
            "commit": git("rev-parse", "--short", "HEAD"), "dirty": _dirty()}
    record["notebook_seconds"].update({k: round(v, 1) for k, v in seconds.items()})
    record["read_gb_per_s"].update({k: round(v, 1) for k, v in (bandwidth or {}).items() if v is not None})
    record["total_minutes"] = round(sum(record["notebook_seconds"].values()) / 60, 1)
    rerun = {f"{stem}.ipynb" for stem in seconds}
    record["failed"] = sorted({*(f for f in record["failed"] if f not in rerun), *failed})
    record["not_run"] = [stem for stem in record.get("not_run", []) if stem not in seconds]
    record["rerun"] = {**record.get("rerun", {}), **{stem: when for stem in seconds}}
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
    (ValueError) a notebook whose code differs from its source's, one that failed (a cell's error output, or
    RUN.json's failures), or a run not in quick; then writes ``figures/README.md``. Returns the notebooks
    written."""
    run = _finished_run(executed, figures, "quick")
    if run.get("not_run"):
        raise ValueError(f"publish a whole quick run (not run yet: {', '.join(run['not_run'])})")
    written = []
    for path in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        source_path = notebooks / path.name
        done = _executed(path)
        done["cells"] = [c for c in done["cells"]
                         if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
        if code_hash(done) != code_hash(json.loads(source_path.read_text())):
            raise ValueError(f"{path.name}: its code differs from {source_path} (rerun it before publishing)")
        write_text(source_path, _stamped(done, run))
        written.append(source_path)
    prune_titles(figures)
    write_text(figures / "README.md", index(figures))
    return written


def publish_beside(executed: Path, figures: Path, profile: str) -> list[Path]:
    """A run of another profile than quick (``paper``), published beside the reference run: every executed
    notebook of ``executed``, outputs and papermill's parameters cell included, into ``figures/notebooks/``
    stamped with ``figures/RUN.json``'s run, and ``figures/README.md`` (its own front page, naming the notebooks a
    partial run has not run yet). Refuses (ValueError) a run of another profile or with a failed notebook.
    Returns the notebooks written."""
    run = _finished_run(executed, figures, profile)
    written = []
    for path in sorted(executed.glob("[0-9][0-9]_*.ipynb")):
        written.append(figures / "notebooks" / path.name)
        write_text(written[-1], _stamped(_executed(path), run))
    prune_titles(figures)
    write_text(figures / "README.md", index(figures, where="`notebooks/NN_*.ipynb` in this folder"))
    return written


def _executed(path: Path) -> dict:
    """The executed notebook at ``path``; ValueError where a cell raised (a notebook rerun alone after the whole
    run leaves RUN.json as it was, so the notebook itself says whether it finished)."""
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                raise ValueError(f"{path.name} failed ({output.get('ename')}: {output.get('evalue')}); rerun it "
                                 "before publishing")
    return notebook


def _finished_run(executed: Path, figures: Path, profile: str) -> dict[str, Any]:
    """``figures/RUN.json`` of a whole run of ``profile`` where every notebook ran, its executed notebooks in
    ``executed``; ValueError otherwise (a fresh clone has the committed RUN.json and no executed run)."""
    if not any(executed.glob("[0-9][0-9]_*.ipynb")):
        raise ValueError(f"no executed notebooks in {executed}: run `specnb notebooks run --profile {profile}` "
                         "first")
    run = json.loads((figures / "RUN.json").read_text())
    if run["profile"] != profile or run["failed"]:
        raise ValueError(f"publish a {profile} run where every notebook ran (RUN.json: profile {run['profile']}, "
                         f"failed {run['failed']})")
    return run


def _stamped(notebook: dict, run: dict[str, Any]) -> str:
    """``notebook`` as published: papermill's metadata gone, progress bars at their final text, stamped with
    ``run`` and its code hash (JSON text)."""
    for cell in notebook["cells"]:
        cell.get("metadata", {}).pop("papermill", None)
        cell.get("metadata", {}).pop("execution", None)
    final_progress(notebook)
    notebook["metadata"].pop("papermill", None)
    notebook["metadata"][STAMP] = {"profile": run["profile"], "commit": run["commit"], "date": run["date"],
                                   "cpu_class": run["machine"]["cpu_class"], "code_hash": code_hash(notebook)}
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def final_progress(notebook: dict) -> None:
    """In place: every progress-bar widget output of ``notebook`` becomes the bar's final text (tqdm's notebook
    bar: an HBox of a prefix, a progress and a suffix, read from the saved widget state), and the widget state
    is dropped. A saved widget output's own text is the bar as first displayed (``0/10``), which is what a
    reader would otherwise see; an output whose state is missing is dropped."""
    state = notebook.get("metadata", {}).pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in notebook["cells"]:
        outputs = []
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                outputs.append(output)
            elif (text := _bar_text(state, view.get("model_id", ""))) is not None:
                outputs.append({"output_type": "display_data", "metadata": {}, "data": {"text/plain": [text]}})
        if "outputs" in cell:
            cell["outputs"] = outputs


def _bar_text(state: dict, model_id: str, width: int = 10) -> str | None:
    """tqdm's text for the widget bar ``model_id`` of a saved widget ``state`` (``prompts: 100%|██████████|
    10/10 [...]``), or None when the state does not hold such a bar."""
    import html

    def model(ref: str) -> dict:
        return state.get(ref.removeprefix("IPY_MODEL_"), {}).get("state", {})

    children = [model(c) for c in model(model_id).get("children", [])]
    if len(children) != 3 or "max" not in children[1]:
        return None
    left, bar, right = children
    done = bar.get("value", 0) / bar["max"] if bar["max"] else 1.0
    filled = max(0, min(width, round(done * width)))
    text = f"{left.get('value', '')}|{'█' * filled}{' ' * (width - filled)}|{right.get('value', '')}"
    return html.unescape(text).replace("\u2007", " ")


# ---------------------------------------------------------------------------------------------- index


def _bandwidth_note(run: dict[str, Any]) -> str:
    """" (read bandwidth before each notebook: LOW-HIGH GB/s)", or "" for runs that did not sample it."""
    values = list(run.get("read_gb_per_s", {}).values())
    return f" (read bandwidth before each notebook: {min(values):.1f}-{max(values):.1f} GB/s)" if values else ""


def index(figures: Path, where: str = "`notebooks/NN_*.ipynb`") -> str:
    """``figures/README.md``: the verdicts counted per source, each figure with its takeaway, the verdict tables,
    the notation, then the run's provenance and machine (:func:`front_page`); ``where``: the executed notebooks."""
    run = json.loads((figures / "RUN.json").read_text())
    m = run["machine"]
    reruns = "; ".join(f"{stem} at `{r['commit']}`{' with local changes' if r.get('dirty') else ''} on {r['date']}"
                       for stem, r in run.get("rerun", {}).items())
    machine_lines = [
        f"Every file here comes from one run of the notebooks (profile `{run['profile']}`) at commit `{run['commit']}`"
        f"{' with local changes' if run['dirty'] else ''} on {run['date']}"
        f"{f' (rerun alone since: {reruns})' if reruns else ''}: {m['cpu']}, {m['cores']} cores, CPU "
        f"class `{m['cpu_class']}` (flags: {', '.join(m['flags'])}), torch {m['torch']}; {run['total_minutes']} min "
        f"of notebooks{_bandwidth_note(run)}. The executed notebooks, with these outputs, are {where}. "
        "`specnb figures compare OLD NEW` lists what moved between two runs."]
    title = "The reference run" if run["profile"] == "quick" else f"The {run['profile']}-profile run"
    missing = {stem[:2]: "Not run yet at this profile: no figures or verdicts of it here."
               for stem in run.get("not_run", [])}
    if missing:
        title += f" (partial: {len(missing)} notebook{'' if len(missing) == 1 else 's'} not run yet)"
    return "\n".join(front_page(figures, title, machine_lines, notes=missing)) + "\n"


SOURCES = {"DReSD": "DReSD", "CREST": "CREST", "N-Grammys": "N-Grammys", "MCSD": "MCSD",
           "other": "other published sources", "internal": "internal checks (ours)"}
"""The rows of the front page's verdict count, in order (:func:`specnb.study.verdicts.source` of each)."""


def results_files(figures: Path, only: list[str] | None = None) -> dict[str, dict]:
    """{``NN``: parsed ``NN_results.json``} of ``figures`` (those of ``only``'s prefixes, when given), each file's
    comparisons scoped (:func:`specnb.study.scope.scoped`: a file written before a claim was found bound to the
    papers' hardware or model reads as one written after)."""
    if not figures.is_dir():
        return {}
    return {prefix: values for prefix, values in load_results(str(figures)).items() if only is None or prefix in only}


def count_table(results: dict[str, dict]) -> list[str]:
    """Markdown: the comparisons of ``results`` counted per source (:data:`SOURCES`): claims tested, agree (of
    which direction only), disagree, inconclusive (leaning to agree / to disagree), and apart from those the
    claims not tested here (bound to the papers' hardware or model: :mod:`specnb.study.scope`); the papers and
    other published sources first, our internal checks in a table of their own."""
    from .scope import UNTESTED
    from .verdicts import source

    counts: dict[str, dict[str, int]] = {}
    for record in (r for values in results.values() for r in values.get("verdicts", {}).values()):
        c = counts.setdefault(source(record), dict.fromkeys(("claims", "agrees", "direction", "disagrees",
                                                              "inconclusive", "lean_agrees", "lean_disagrees",
                                                              UNTESTED), 0))
        c["claims"] += record["verdict"] != UNTESTED
        c[record["verdict"]] += 1
        c["direction"] += record["verdict"] == "agrees" and bool(record.get("direction_only"))
        if isinstance(record.get("lean"), str):
            c[f"lean_{record['lean']}"] += 1
    header = ["| {} | claims tested | agree (direction only) | disagree | inconclusive (leaning agree / disagree) | "
              "not tested here |", "|---|---|---|---|---|---|"]
    lines: list[str] = []
    for group in ([k for k in SOURCES if k != "internal"], ["internal"]):
        rows = [f"| {SOURCES[k]} | {c['claims']} | {c['agrees']} ({c['direction']}) | {c['disagrees']} | "
                f"{c['inconclusive']} ({c['lean_agrees']} / {c['lean_disagrees']}) | {c[UNTESTED]} |"
                for k in group if (c := counts.get(k))]
        if rows:
            lines += [header[0].format("source" if group != ["internal"] else "checks"), header[1], *rows, ""]
    return lines


NOTATION = """\
**How to read a verdict.** *Ours* is our number with its 90% interval (bootstrap over prompts, paired where two
methods are compared; over timed passes for one call's cost); "no interval" marks one deterministic number (a size,
one fit), judged as a point. *Expected* is the region where the claim holds: `≈ v ± t` (within t of v),
`in a–b (± t)` (the range a–b widened by t on each side), `> v + t` (above v by more than t: `> 1 + 0.02` means a
ratio must exceed 1 by more than 2%, since a ratio within 2% of 1 is a tie, not a win), `< v − t` (below v by more
than t). A verdict **agrees** when the whole interval lies inside that region, **disagrees** when it lies wholly
outside, and is **inconclusive** when it straddles an edge (more prompts or a quieter machine would decide);
*leans agrees / disagrees* says on which side the interval's centre lies. **Direction only** marks an agreement
that checks only the sign of an effect whose size the source reports; **internal** marks a check against our own
method, baseline or aim rather than a published claim. The likely cause of a disagreement cites the measured
quantities it rests on (their values are in the notebook's `NN_results.json`, under `evidence`). **Not tested
here** marks a claim bound to what the paper ran on, where this run differs: a speed measured on the paper's GPU
(on a CPU a call verifying several tokens costs several one-token calls, so the number measures the CPU) or a
number of the paper's own model (its width, its vocabulary, its draft pair); it is measured and shown with what its
numbers gave, and counted apart (`specnb.study.scope`).

One tolerance per kind of claim (`specnb.study.verdicts`), shared by every notebook making that kind of claim:

| tolerance | value | applies to |
|---|---|---|
"""


def front_page(figures: Path, title: str, closing: list[str], only: list[str] | None = None, link: str = "",
               headings: dict[str, str] | None = None, notes: dict[str, str] | None = None) -> list[str]:
    """Markdown lines of a study's front page over the results files of ``figures`` (those of ``only``):
    ``title``; the verdicts counted per source (:func:`count_table`); per notebook (heading ``headings[NN]``,
    else the notebook's file name; ``notes[NN]`` a line under it: a skip or a failure) each figure with its
    takeaway (:meth:`~specnb.study.results.Results.takeaway`, else its title; ``link`` + file); the verdict
    tables; the notation and tolerances (:data:`NOTATION`); ``closing`` (the machine, the setup) last."""
    from .verdicts import TOLERANCES

    results = results_files(figures, only)
    titles = json.loads((figures / "titles.json").read_text()) if (figures / "titles.json").exists() else {}
    prefixes = sorted(set(results) | set(notes or {}))
    lines = [f"# {title}", "", "Every comparison with a paper or another source, counted (what each column means: "
             "[notation](#notation)):", "", *count_table(results), "## Figures", ""]
    for prefix in prefixes:
        lines += [f"### {_heading(prefix, headings)}", ""]
        if prefix in (notes or {}):
            lines += [notes[prefix], ""]
        takeaways = results.get(prefix, {}).get("takeaways", {})
        for png in sorted(figures.glob(f"{prefix}_*.png")):
            text = takeaways.get(png.stem) or titles.get(png.stem, "")
            lines.append(f"- [`{png.name}`]({link}{png.name}) — {text}".rstrip(" —"))
        lines.append("")
    lines += ["## Verdicts", ""]
    for prefix in sorted(results):
        if verdicts := results[prefix].get("verdicts", {}):
            lines += [f"### {_heading(prefix, headings)}", "", *verdict_rows(verdicts), ""]
    lines += ["## Notation", "", NOTATION.rstrip("\n")]
    lines += [f"| `{name}` | {value:g} | {what} |" for name, (value, what) in TOLERANCES.items()]
    return lines + ["", "## Setup and machine", "", *closing]


def _heading(prefix: str, headings: dict[str, str] | None) -> str:
    """A notebook's heading: ``headings[NN]``, else its file name in ``notebooks/``, else ``NN``."""
    return (headings or {}).get(prefix) or next(
        (p.name for p in sorted((ROOT / "notebooks").glob(f"{prefix}_*.ipynb"))), prefix)


def verdict_rows(verdicts: dict[str, dict]) -> list[str]:
    """A results file's comparisons as a Markdown table: claim, ours, expected (and whose claim), the verdict in
    words (:func:`specnb.study.results.verdict_words`) and the likely cause where it does not agree (why not,
    for a claim not tested here)."""
    from .results import verdict_words

    lines = ["| claim | ours (90% interval) | expected | verdict | likely cause where not agreeing, or why not "
             "tested |", "|---|---|---|---|---|"]
    return lines + [f"| {v['claim']} | {v['measured']} | {v['expected']} ({v['against']}) | **{verdict_words(v)}** | "
                    f"{v.get('untested') or (v.get('cause', '') if v['verdict'] != 'agrees' else '')} |"
                    for v in verdicts.values()]


def retire_unsaved(figures: Path, notebook: str, since: float) -> list[str]:
    """Remove the figures notebook ``notebook`` (its ``NN`` prefix) saved in an earlier run and not again in the run
    that began at ``since`` (epoch seconds): a panel that run said in words instead (a constant series) must not
    be published beside it as a stale picture. Only names ``titles.json`` records (figures
    :func:`specnb.study.plots.save_figure` wrote) are touched, their PNG and data CSV; returns the names removed."""
    path = figures / "titles.json"
    names = json.loads(path.read_text()) if path.exists() else {}
    retired = []
    for name in sorted(n for n in names if n[:3] == f"{notebook[:2]}_"):
        png = figures / f"{name}.png"
        if png.exists() and png.stat().st_mtime < since:
            for stale in (png, png.with_suffix(".csv")):
                if stale.exists() and stale.stat().st_mtime < since:
                    stale.unlink()  # ours: written by save_figure in an earlier run
            retired.append(name)
    if retired:
        prune_titles(figures)
    return retired


def prune_titles(figures: Path) -> None:
    """Drop from ``figures/titles.json`` the titles of figures whose PNG is no longer there (a renamed or
    retired figure), so nothing names a file that does not exist."""
    path = figures / "titles.json"
    if path.exists():
        titles = json.loads(path.read_text())
        kept = {name: t for name, t in titles.items() if (figures / f"{name}.png").exists()}
        if kept != titles:
            write_text(path, json.dumps(kept, indent=1, ensure_ascii=False) + "\n")


# -------------------------------------------------------------------------------------------- compare


SHOWN = ("claim", "measured", "expected", "against", "verdict")
"""The fields (strings) of a results file's comparison that a front page shows (:func:`verdict_rows`)."""
JUDGED = ("ours", "low", "high")
"""The fields (numbers, or null) of a comparison that :func:`moved` judges: our number and its 90% interval."""


def load_results(where: str, judged: bool = False) -> dict[str, dict]:
    """{``NN``: results file} of a figures folder, or of ``figures/`` at a git revision (``HEAD~1``, a sha), each
    file's comparisons scoped as :func:`results_files` scopes them (two runs then differ only where they do).
    ValueError naming the file and what is wrong where one is not a results file whose comparisons hold
    :data:`SHOWN` (and :data:`JUDGED` where ``judged``: what :func:`moved` reads), or where ``where`` is
    neither."""
    from .scope import scoped

    folder = Path(where)
    if folder.is_dir():
        texts = {str(p): p.read_bytes() for p in sorted(folder.glob("[0-9][0-9]_results.json"))}
    else:
        names = git("ls-tree", "--name-only", f"{where}:figures")
        if not names:
            raise ValueError(f"{where!r} is neither a folder nor a git revision with a figures/ folder")
        texts = {f"{where}:figures/{name}": git("show", f"{where}:figures/{name}").encode()
                 for name in names.splitlines() if name.endswith("_results.json") and name[:2].isdigit()}
    results = {}
    for name, text in texts.items():
        values, prefix = _results_file(name, text, SHOWN + JUDGED if judged else SHOWN), Path(name).name[:2]
        results[prefix] = {**values, "verdicts": scoped(prefix, values["verdicts"], values["setup"])}
    return results


def _results_file(name: str, text: bytes, fields: tuple[str, ...]) -> dict[str, Any]:
    """The results file ``name`` parsed from ``text``, its ``verdicts`` and ``setup`` present ({} where absent);
    ValueError ``NAME: not a results file (what is wrong)`` where it is not JSON of the shape
    :meth:`specnb.study.results.Results.write` writes, its comparisons holding ``fields`` (those of :data:`SHOWN`
    strings, of :data:`JUDGED` numbers or null; ``verdict`` among them) and a known verdict and lean."""
    from typing import get_args

    from .scope import UNTESTED
    from .verdicts import Lean, Verdict

    def refuse(what: str) -> ValueError:
        return ValueError(f"{name}: not a results file ({what})")

    try:
        values = json.loads(text.decode())
    except ValueError as exc:  # not UTF-8, or not JSON
        raise refuse(f"not JSON: {exc}") from None
    if not isinstance(values, dict):
        raise refuse(f"a JSON {type(values).__name__}, not an object")
    values = {**values, "verdicts": values.get("verdicts", {}), "setup": values.get("setup", {})}
    for part in ("verdicts", "setup", "takeaways"):
        if not isinstance(values.get(part, {}), dict):
            raise refuse(f"{part!r} is a JSON {type(values[part]).__name__}, not an object")
    for paper, sides in values["setup"].items():
        if not paper.strip() or not isinstance(sides, dict) or \
                not all(isinstance(sides.get(side), dict) for side in ("here", "paper")):
            raise refuse(f"setup {paper!r} is not {{'here': {{...}}, 'paper': {{...}}}}")
    verdicts = (*get_args(Verdict), UNTESTED)
    for key, record in values["verdicts"].items():
        if not isinstance(record, dict):
            raise refuse(f"comparison {key!r} is a JSON {type(record).__name__}, not an object")
        if missing := [f for f in fields if f not in record]:
            raise refuse(f"comparison {key!r} has no {', '.join(map(repr, missing))}")
        if wrong := [f for f in fields if not (isinstance(record[f], str) if f in SHOWN else _number(record[f]))]:
            raise refuse(f"comparison {key!r}: {wrong[0]!r} must be "
                         f"{'a string' if wrong[0] in SHOWN else 'a number or null'}, got {record[wrong[0]]!r}")
        if record["verdict"] not in verdicts or record.get("lean") not in (None, *get_args(Lean)):
            raise refuse(f"comparison {key!r}: verdict {record['verdict']!r}, lean {record.get('lean')!r}; "
                         f"a verdict is one of {', '.join(verdicts)}, a lean one of {', '.join(get_args(Lean))} or "
                         "null")
    return values


def _number(value: Any) -> bool:
    """Whether a results file's ``value`` is a number (NaN included) or null."""
    return value is None or isinstance(value, int | float) and not isinstance(value, bool)


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
