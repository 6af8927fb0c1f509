"""``specnb study run``: the numbered notebooks on your model and your data, into one folder.

    specnb study run --target qwen2.5-coder-0.5b-instruct --prompts mine.jsonl --corpus src/ --out study/ 00 09

Every notebook runs with papermill under the profile and the given parameters (the notebooks' ``parameters``
cell: :data:`specnb.study.profiles.OVERRIDABLE`), all checked before any model loads, in the directory the
command was started from (so relative paths mean what they meant at the prompt). ``DIR`` receives the
executed notebooks, ``DIR/figures/`` their figures, tables and ``NN_results.json``, and ``DIR/README.md`` in the
reference run's form: the verdicts counted per source, per notebook its figures, every verdict, the notation, then
the setup (target, draft, prompts, corpus) and the machine. A notebook
that cannot apply (07 and 08 without a draft for the given target) is skipped with one line there saying why.

Resumable: ``DIR/study.json`` records each finished notebook under a key of its code and parameters; a rerun
keeps a notebook whose key is unchanged and reruns the others (``-p NN:NAME=VALUE`` sets a parameter of one
notebook, so changing it reruns that notebook alone). Ctrl-C keeps every notebook that finished.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ..atomic import write_text
from .notebooks import CtrlC, execute, find_notebooks
from .profiles import OVERRIDABLE, Profile, get_profile
from .reference_run import code_hash, front_page, machine

STATE = "study.json"
SIZES = ("timed_prompts", "timed_tokens", "n_prompts", "max_new_tokens")


def skip_reason(stem: str, p: Profile) -> str | None:
    """Why notebook ``stem`` cannot run on ``p`` (one line), or None."""
    if stem.startswith(("07", "08")) and p.draft is None:
        return "no draft for the given target (`--draft`: a model sharing its tokenizer, or self:L)"
    return None


def notebook_parameters(given: list[str]) -> dict[str, dict[str, Any]]:
    """``-p NN:NAME=VALUE`` options -> {NN: {NAME: value}}; a value is a Python literal (``3``, ``False``,
    ``'x'``) or else a string. ValueError on a malformed option or a name given twice."""
    out: dict[str, dict[str, Any]] = {}
    for item in given:
        prefix, sep, rest = item.partition(":")
        name, eq, text = rest.partition("=")
        if not sep or not eq or len(prefix) != 2 or not prefix.isdigit() or not name.isidentifier():
            raise ValueError(f"-p {item!r}: expected NN:NAME=VALUE (e.g. 05:llamacpp=False)")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if name in out.get(prefix, {}):
            raise ValueError(f"-p {item!r}: {prefix}:{name} is already given ({out[prefix][name]!r})")
        out.setdefault(prefix, {})[name] = value
    return out


def check_notebook_parameters(notebook: Path, profile: str, given: dict[str, Any], own: dict[str, Any]) -> None:
    """ValueError unless every parameter of ``own`` (``-p NN:NAME=VALUE`` of ``notebook``) is one of the notebook's
    ``parameters`` cell (:func:`papermill.inspect_notebook`) and those of
    :data:`~specnb.study.profiles.OVERRIDABLE` (and ``profile``) pass :func:`~specnb.study.profiles.get_profile`
    with ``given``; the notebook's own parameters take a value of their default's type (a bool for a bool)."""
    import papermill

    names = papermill.inspect_notebook(str(notebook))
    for name, value in own.items():
        if name not in names:
            raise ValueError(f"-p {notebook.name[:2]}:{name}=...: {notebook.name} has no parameter {name!r}; its "
                             f"parameters: {', '.join(names) or 'none'}")
        try:
            default = ast.literal_eval(names[name]["default"])
        except (ValueError, SyntaxError):  # a default computed in the cell: its type is not known here
            continue
        if name not in OVERRIDABLE and not _same_kind(value, default):
            raise ValueError(f"-p {notebook.name[:2]}:{name}={value!r}: {notebook.name} expects type "
                             f"{type(default).__name__} (its default: {default!r})")
    overridden = {name: value for name, value in own.items() if name in OVERRIDABLE}
    if overridden or "profile" in own:
        try:
            get_profile(own.get("profile", profile), **{**given, **overridden})
        except ValueError as exc:
            raise ValueError(f"-p {notebook.name[:2]}:...: {exc}") from None


def _same_kind(value: Any, default: Any) -> bool:
    """Whether ``value`` may stand where the parameters cell has ``default`` (None: anything; an int for a float)."""
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def run_key(notebook: Path, parameters: dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the notebook's code cells and the parameters it runs with."""
    code = code_hash(json.loads(notebook.read_text()))
    return hashlib.sha256((code + json.dumps(parameters, sort_keys=True)).encode()).hexdigest()[:16]


STATUS_FIELDS = {"ok": ("seconds",), "skipped": ("reason",), "failed": ("seconds", "error")}
"""A study folder's notebook record: its ``key``, ``status`` and that status' fields (what :func:`readme` shows)."""


def read_state(out: Path) -> dict[str, dict]:
    """``DIR/study.json``'s notebooks ({} for a new folder). ValueError, with nothing of the folder changed, for a
    folder with other files and no state, or whose state is not one :func:`run_study` writes: it is not a study
    folder."""
    path = out / STATE
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder (give a new or empty folder)")
    if path.exists():
        return _state(path)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} holds files and no {STATE}: not a study folder (give a new or empty folder)")
    return {}


def _state(path: Path) -> dict[str, dict]:
    """The notebooks of the study state ``path``; ValueError naming what is wrong where it is not
    ``{"notebooks": {stem: {"key": ..., "status": ..., ...}}}`` with each status' fields (:data:`STATUS_FIELDS`)."""
    def refuse(what: str) -> ValueError:
        return ValueError(f"{path}: not a study state ({what}); give another --out (this one is left as it is)")

    try:
        state = json.loads(path.read_bytes().decode())
    except ValueError as exc:  # not UTF-8, or not JSON
        raise refuse(f"not JSON: {exc}") from None
    notebooks = state.get("notebooks") if isinstance(state, dict) else None
    if not isinstance(notebooks, dict):
        raise refuse("no 'notebooks' object")
    for stem, record in notebooks.items():
        status = record.get("status") if isinstance(record, dict) else None
        if status not in STATUS_FIELDS:
            raise refuse(f"notebook {stem!r} has no status among {', '.join(STATUS_FIELDS)}")
        wrong = [f for f in ("key", *STATUS_FIELDS[status])
                 if not isinstance(record.get(f), int | float if f == "seconds" else str)]
        if wrong:
            raise refuse(f"notebook {stem!r}, {status}: {wrong[0]!r} missing or not a "
                         f"{'number' if wrong[0] == 'seconds' else 'string'}")
    return notebooks


def run_study(profile: str, names: list[str] | None, out: Path, given: dict[str, Any],
              per_notebook: dict[str, dict[str, Any]] | None = None, progress: bool = True) -> dict[str, dict]:
    """Run the notebooks ``names`` (all: None) under ``profile`` with the parameters ``given`` (of
    :data:`~specnb.study.profiles.OVERRIDABLE`, checked before anything runs) and ``per_notebook`` ({NN: {name:
    value}}) into ``out``; returns the folder's notebooks {stem: {key, status, seconds, error or reason}} after
    writing ``out/study.json`` (after every notebook) and ``out/README.md``. Raises
    :class:`~specnb.study.profiles.ParameterError` / ValueError on bad input before any notebook starts."""
    p = get_profile(profile, **given)  # every parameter checked here, before any model loads
    paths = find_notebooks(names)
    per_notebook = per_notebook or {}
    if unknown := sorted(set(per_notebook) - {path.name[:2] for path in paths}):
        raise ValueError(f"-p {unknown[0]}:...: notebook {unknown[0]} is not among those run")
    for path in paths:
        check_notebook_parameters(path, profile, given, per_notebook.get(path.name[:2], {}))
    state = read_state(out)
    figures = out / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    env = {"SPECNB_FIGURES": str(figures), "SPECNB_STRICT_FIGURES": "1"}
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        with CtrlC() as ctrl_c:
            for path in paths:
                parameters = {"profile": profile, **given, **per_notebook.get(path.name[:2], {})}
                key = run_key(path, parameters)
                done = state.get(path.stem, {})
                if reason := skip_reason(path.stem, p):
                    state[path.stem] = {"key": key, "status": "skipped", "reason": reason}
                    print(f"{path.name}: skipped: {reason}", flush=True)
                elif done.get("key") == key and done.get("status") == "ok" and (out / path.name).exists():
                    print(f"{path.name}: kept (code and parameters unchanged)", flush=True)
                else:
                    print(f"{path.name}: running", flush=True)
                    start = time.perf_counter()
                    error = execute(path, out / path.name, parameters, ctrl_c, Path.cwd(), progress)
                    if ctrl_c.pressed:
                        raise KeyboardInterrupt  # what finished is in study.json; this notebook reruns next time
                    record = {"status": "failed", "error": error} if error else {"status": "ok"}
                    state[path.stem] = {"key": key, "seconds": round(time.perf_counter() - start, 1), **record}
                    print(f"{path.name}: {record['status']} in {state[path.stem]['seconds']:.0f} s"
                          f"{': ' + record['error'] if 'error' in record else ''}", flush=True)
                write_text(out / STATE, json.dumps({"profile": profile, "parameters": given, "notebooks": state},
                                                   indent=1) + "\n")
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if (out / STATE).exists():
            write_text(out / "README.md", readme(out, p, given))
    return state


def readme(out: Path, p: Profile, given: dict[str, Any]) -> str:
    """``DIR/README.md`` in the reference run's form (:func:`specnb.study.reference_run.front_page`): the verdicts
    counted per source, per notebook its wall time and figures (or why it was skipped or failed), the verdict
    tables, the notation; then the setup table (every parameter, given or the profile's) and the machine."""
    state = json.loads((out / STATE).read_text())["notebooks"]
    m = machine()
    ran = [stem[:2] for stem, record in state.items() if record["status"] == "ok"]
    headings = {stem[:2]: f"[{stem}.ipynb]({stem}.ipynb) ({record['seconds']:.0f} s)" if record["status"] == "ok"
                else f"{stem}.ipynb" for stem, record in state.items()}
    notes = {stem[:2]: f"Skipped: {record['reason']}." if record["status"] == "skipped" else
             f"Failed after {record['seconds']:.0f} s: `{record['error']}`."
             for stem, record in state.items() if record["status"] != "ok"}
    closing = [f"`specnb study run` under profile `{p.name}` on {m['cpu']}, {m['cores']} cores, CPU class "
               f"`{m['cpu_class']}` (flags: {', '.join(m['flags'])}), torch {m['torch']}.", "",
               "| parameter | value |", "|---|---|"]
    closing += [f"| {name} | `{getattr(p, name)}`{' (given)' if name in given else ''} |" for name in OVERRIDABLE]
    return "\n".join(front_page(out / "figures", f"The study on {p.target}", closing, only=ran, link="figures/",
                                headings=headings, notes=notes)) + "\n"
