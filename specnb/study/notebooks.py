"""Run the numbered notebooks with papermill under a profile.

Executed copies go to ``notebooks/executed/<profile>/`` (git-ignored). Figures go to ``figures/`` for the
default ``quick`` profile and to ``figures/<profile>/`` otherwise, so a smoke run never overwrites them.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .plots import figures_for

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def find_notebooks(names: list[str] | None = None, folder: Path = NOTEBOOKS) -> list[Path]:
    """``NN_*.ipynb`` in ``folder``, sorted; ``names`` filters by prefix or stem (``00``, ``00_quickstart``).
    ValueError for a name that matches none, an empty one, or a prefix of several (``0``: a choice of one was
    meant, and the run would take ten notebooks' time)."""
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return found
    stems = ", ".join(p.stem for p in found)
    if blank := [n for n in names if not n.strip()]:
        raise ValueError(f"empty notebook name {blank[0]!r}: give a number or a name ({stems}), or none for all")
    chosen: set[Path] = set()
    for name in names:
        matches = [p for p in found if p.stem == name or p.name == name or p.stem.startswith(name)]
        if not matches:
            raise ValueError(f"no notebook matches {name}; have: {stems}")
        if len(matches) > 1:
            raise ValueError(f"notebook name {name!r} matches {len(matches)} notebooks "
                             f"({', '.join(p.stem for p in matches)}): give its two-digit number")
        chosen.update(matches)
    return sorted(chosen)


@dataclass
class NotebookRun:
    """One executed notebook: its executed copy, wall seconds, and the error that stopped it (None if it ran)."""

    source: Path
    executed: Path
    seconds: float
    error: str | None = None
    read_gb_per_s: float | None = None  # the machine's read bandwidth just before it ran (a VM's drifts)


def run_notebooks(profile: str = "quick", names: list[str] | None = None, parameters: dict | None = None,
                  output_dir: Path | None = None) -> list[NotebookRun]:
    """Execute notebooks in order, each to the end or to its first failing cell; a failure does not stop the
    others. Figures are saved strictly (:func:`specnb.study.plots.save_figure` refuses overlapping text, legends over
    data and single-value panels). Prints each notebook's wall time as it finishes; stamps the figures folder's
    RUN.json (a whole run, or the first part of one: the rest named as not run) or amends it (some notebooks of a
    stamped run rerun or run at last); a notebook that ran to its end loses the figures an earlier run of it saved
    and it did not (:func:`specnb.study.reference_run.retire_unsaved`); returns one :class:`NotebookRun` per
    notebook. Each kernel's own log goes to ``NN_name.kernel.log`` beside its executed copy.

    Ctrl-C interrupts the running cell (the executed copy shows where), stamps the notebooks that finished, and
    raises KeyboardInterrupt; a second Ctrl-C stops at once."""
    from ..model.ceilings import sample_read_bandwidth
    from .reference_run import amend_run, retire_unsaved, stamp_run

    paths = find_notebooks(names)  # a bad name refused before anything is written
    output_dir = output_dir or NOTEBOOKS / "executed" / profile
    output_dir.mkdir(parents=True, exist_ok=True)
    os.environ["SPECNB_FIGURES"] = str(figures_for(profile))
    os.environ["SPECNB_STRICT_FIGURES"] = "1"  # the kernels inherit it: a figure a reader would trip over fails
    done = []
    with CtrlC() as ctrl_c:
        try:
            for path in paths:
                bandwidth = sample_read_bandwidth(256, 3)  # ~0.5 s: what the notebook's timings ran against
                began, start = time.time(), time.perf_counter()
                out = output_dir / path.name
                error = execute(path, out, {"profile": profile, **(parameters or {})}, ctrl_c, cwd=path.parent)
                if ctrl_c.pressed:
                    print(f"{path.name}: interrupted after {time.perf_counter() - start:.0f} s -> {partial_copy(out)}",
                          flush=True)
                    break
                done.append(NotebookRun(path, out, time.perf_counter() - start, error, bandwidth))
                status = "FAILED" if error else "ok"
                print(f"{path.name}: {status} in {done[-1].seconds:.0f} s (read bandwidth before it {bandwidth:.1f} "
                      f"GB/s) -> {out}", flush=True)
                if not error:
                    for name in retire_unsaved(figures_for(profile), path.stem, began):
                        print(f"  removed {name}.png: an earlier run's figure this run did not save", flush=True)
        except KeyboardInterrupt:  # between notebooks, or a second Ctrl-C
            ctrl_c.pressed = True

    # a whole run: stamp the figures it wrote with the machine and commit; a part of one: amend the run's stamp, or
    # (the first part of a run) stamp it with the notebooks still to run
    ran = ({r.source.stem: r.seconds for r in done}, [r.source.name for r in done if r.error],
           {r.source.stem: r.read_gb_per_s for r in done})
    every, finished = find_notebooks(), [r.source for r in done]
    if done and (len(finished) == len(every) or amend_run(figures_for(profile), profile, *ran) is None):
        stamp_run(figures_for(profile), profile, *ran, not_run=[p.stem for p in every if p not in finished])
    if ctrl_c.pressed:
        raise KeyboardInterrupt
    return done


def execute(path: Path, out: Path, parameters: dict[str, Any], ctrl_c: CtrlC, cwd: Path,
            progress: bool = False) -> str | None:
    """Run the notebook ``path`` under papermill into ``out`` (the kernel's own log beside it, ``.kernel.log``);
    returns None, or the one-line error that stopped it (any failure: a notebook's failure is a result).

    The copy is written to :func:`partial_copy` as it runs and renamed to ``out`` when the notebook ends (at its
    end or its first failing cell); one stopped by Ctrl-C stays there, and an earlier ``out`` stays whole."""
    import papermill

    log, partial = out.with_suffix(".kernel.log"), partial_copy(out)
    ctrl_c.executing = True
    try:
        papermill.execute_notebook(str(path), str(partial), parameters=parameters, kernel_name="python3",
                                   cwd=str(cwd), progress_bar=progress, kernel_manager_class=ctrl_c.manager(log),
                                   on_cell_start=ctrl_c.before_cell)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        dead = f" (its log: {log})" if type(exc).__name__ == "DeadKernelError" else ""
        return f"{type(exc).__name__}: {lines[-1] if lines else ''}{dead}"
    finally:
        ctrl_c.executing, ctrl_c.started, ctrl_c.kernel = False, None, None  # a Ctrl-C from here on: at once
        if not ctrl_c.pressed and partial.exists():
            partial.replace(out)
    return None


def partial_copy(out: Path) -> Path:
    """Where the executed copy ``out`` is written while its notebook runs (a hidden sibling)."""
    return out.with_name(f".{out.stem}.partial.ipynb")


class CtrlC:
    """SIGINT while a notebook runs, as a context: the first sets ``pressed`` and interrupts the kernel's running
    cell (a kernel runs in a session of its own, so a terminal's Ctrl-C reaches only this process), or, pressed
    while the kernel starts or between two cells (an idle kernel ignores SIGINT), stops the notebook before its
    next cell; papermill then saves the executed copy and shuts the kernel down as after any failing cell.
    Outside a notebook, or at a second SIGINT, KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.pressed = False
        self.executing = False  # within :func:`execute`
        self.started: Any = None  # the kernel's manager, once its process runs
        self.kernel: Any = None  # the same, once it has taken a cell

    def manager(self, log: Path) -> type:
        """The kernel manager class for one notebook: it writes the kernel's stderr (ipykernel's own warnings and
        tracebacks, not the cells' output) to ``log``."""
        from jupyter_client.manager import AsyncKernelManager

        ctrl_c = self

        class Manager(AsyncKernelManager):
            async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
                with open(log, "w") as stderr:
                    await super().start_kernel(stderr=stderr, **kw)
                ctrl_c.started = self

        return Manager

    def before_cell(self, cell: Any, cell_index: int) -> None:
        """nbclient's ``on_cell_start``: after a Ctrl-C, the cell fails with a KeyboardInterrupt instead of running;
        otherwise the kernel (ready: it answered nbclient) becomes the one a Ctrl-C interrupts."""
        from nbclient.exceptions import CellExecutionError
        from nbformat import v4

        if self.pressed:
            error = v4.new_output("error", ename="KeyboardInterrupt", evalue="Ctrl-C before this cell ran",
                                  traceback=["KeyboardInterrupt: Ctrl-C before this cell ran"])
            if cell.cell_type == "code":
                cell["outputs"] = [error]  # the notebook's own record of this cell
            raise CellExecutionError("Ctrl-C", error.ename, error.evalue)
        self.kernel = self.started

    def _interrupt(self, signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once
        self.pressed = True
        if not self.executing:
            raise KeyboardInterrupt
        pid = getattr(getattr(self.kernel, "provisioner", None), "pid", None)
        if pid is not None and self.kernel.has_kernel:
            os.kill(pid, signal.SIGINT)

    def __enter__(self) -> CtrlC:
        main = threading.current_thread() is threading.main_thread()  # where Python lets a handler be set
        self._previous = signal.signal(signal.SIGINT, self._interrupt) if main else None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


# ------------------------------------------------------------------------------------ thin notebooks

# Every notebook's first cell after its parameters: the process-wide setup that importing specnb does not do
# (tests/test_side_effects.py). The same in every notebook and no analysis, so :func:`code_lines` leaves it out.
SETUP_CELL = """from specnb import openmp_spin_briefly
from specnb.study.plots import use_style

openmp_spin_briefly()  # before torch is imported: libgomp reads GOMP_SPINCOUNT once, when torch loads it
use_style()"""
PLOT_MODULES = ("matplotlib", "seaborn", "specnb.study.plots")
PLOT_NAMES = frozenset({"plt", "sns", "fig", "ax", "axes"})  # the usual figure handles


def _span(node: ast.AST) -> set[int]:
    return set(range(node.lineno, (node.end_lineno or node.lineno) + 1))


def _loaded(node: ast.AST) -> set[str]:
    """Names ``node`` reads, less those its comprehensions bind."""
    local = {n.id for c in ast.walk(node) if isinstance(c, ast.comprehension) for n in ast.walk(c.target)
             if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local


def _bound(stmt: ast.stmt) -> set[str]:
    """Names a statement binds itself: assignment and ``for`` targets, a ``def``'s name, imported names."""
    if isinstance(stmt, ast.FunctionDef):
        return {stmt.name}
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
        [stmt.target] if isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _is_plot_import(stmt: ast.Import | ast.ImportFrom) -> bool:
    modules = [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else [a.name for a in stmt.names]
    return all(any(m == p or m.startswith(p + ".") for p in PLOT_MODULES) for m in modules)


def _classify(body: list[ast.stmt], plot: set[str]) -> tuple[set[int], set[int]]:
    """(code lines, plotting lines) of the statements ``body``; ``plot`` holds the plotting names and grows.

    An import from :data:`PLOT_MODULES` is plotting. A simple statement is plotting when it reads a plotting
    name; the names it binds become plotting names (``fig, ax = plt.subplots()``). A compound statement
    (``for``, ``if``, ``with``, ``def``) is plotting when everything inside it is (a ``for`` over a plotting
    name binds plotting names inside it; a plotting ``def`` makes its name one); otherwise its header lines are
    code and its inner statements count one by one. Code that rebinds a name makes it a plain name again.
    """
    code: set[int] = set()
    plotting: set[int] = set()
    for stmt in body:
        blocks = [b for b in (getattr(stmt, "body", None), getattr(stmt, "orelse", None),
                              getattr(stmt, "finalbody", None)) if isinstance(b, list) and b]
        blocks += [h.body for h in getattr(stmt, "handlers", [])]
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            is_plot = _is_plot_import(stmt)
        elif not blocks:
            is_plot = bool(_loaded(stmt) & plot)
        else:
            if isinstance(stmt, ast.For):
                plot -= _bound(stmt)
                plot |= _plot_targets(stmt, plot)
            inner_code, inner_plot = set(), set()
            for block in blocks:
                block_code, block_plot = _classify(block, plot)
                inner_code, inner_plot = inner_code | block_code, inner_plot | block_plot
            is_plot = not inner_code
            if not is_plot:
                header = _span(stmt) - set().union(*(_span(s) for block in blocks for s in block))
                code |= header | inner_code
                plotting |= inner_plot
                continue
        if is_plot:
            plot |= _bound(stmt) if not blocks or isinstance(stmt, ast.FunctionDef) else set()
            plotting |= _span(stmt)
        else:
            plot -= _bound(stmt)  # rebound by code
            code |= _span(stmt)
    return code, plotting


def _plot_targets(loop: ast.For, plot: set[str]) -> set[str]:
    """The names a ``for`` loop binds to plotting values: all of them when it iterates over a plotting name,
    and in ``for a, b in zip(x, y)`` those taken from the plotting arguments only."""
    it, target = loop.iter, loop.target
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "zip" \
            and isinstance(target, ast.Tuple) and len(target.elts) == len(it.args):
        return {n.id for elt, arg in zip(target.elts, it.args, strict=True) if _loaded(arg) & plot
                for n in ast.walk(elt) if isinstance(n, ast.Name)}
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if _loaded(it) & plot else set()


def _string_lines(tree: ast.AST, source: list[str]) -> set[int]:
    """Lines that hold nothing but the inside of a multi-line string (Markdown templates, docstrings): every line
    after a string's first, except a last line with code after the string's end."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.JoinedStr) and node.end_lineno and node.end_lineno > node.lineno:
            lines |= set(range(node.lineno + 1, node.end_lineno))
            rest = source[node.end_lineno - 1][node.end_col_offset or 0:]
            if not rest.strip(" ),;"):
                lines.add(node.end_lineno)
    return lines


def code_lines(path: Path) -> dict[str, int]:
    """Lines of a notebook's code cells, the ``parameters`` cell and :data:`SETUP_CELL` left out: ``code``
    (non-plotting) and ``plotting`` (matplotlib / seaborn / ``specnb.study.plots`` calls and figure layout, see
    :func:`_classify`). Blank lines, comments and the inside of multi-line strings (conclusion templates) are not
    counted."""
    counts = {"code": 0, "plotting": 0}
    plot = set(PLOT_NAMES)
    for cell in json.loads(Path(path).read_text())["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] != "code" or "parameters" in cell.get("metadata", {}).get("tags", []) \
                or text == SETUP_CELL:
            continue
        source = text.splitlines()
        tree = ast.parse(text)
        code, plotting = _classify(tree.body, plot)
        blank = {i for i, line in enumerate(source, 1) if not line.strip() or line.strip().startswith("#")}
        strings = _string_lines(tree, source)
        counts["code"] += len(code - blank - strings)
        counts["plotting"] += len(plotting - blank - strings)
    return counts
