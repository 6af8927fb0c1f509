"""Interrupt a real specnb process at a chosen call, for the tests of what an interruption leaves behind.

:func:`interrupted` starts ``python -m tests.interrupting SPEC`` in a child process. The child wraps the functions
the spec names so that their n-th call sends the child a real signal (SIGKILL: nothing of the child runs after
it, as a ``kill -9`` or a power cut; SIGINT: Python's own handler, a KeyboardInterrupt, as a Ctrl-C), then runs
``specnb ARGV`` (:func:`specnb.cli.main`) or a Python snippet. Nothing is timed and specnb has no hook: the
moment is a call, counted in the child.

    result = interrupted(["datastore", "build", ...], at="specnb.datastores.crest:encode_tree", nth=3)
    assert result.fired and result.returncode == -signal.SIGKILL

``at`` names one function or several (their calls count together) as ``module:attribute`` (``Class.method``
allowed; ``os:rename`` patches the ``os`` module, which every caller of ``os.rename`` and ``Path.rename`` reaches).
``within``: count only calls made while that function runs. ``after``: signal once the n-th call has returned
(else before it runs). ``mid_write``: instead of ``at``, the n-th file opened for writing whose name matches
the glob gets half of its first write, flushed to the file, then the signal -- a kill in the middle of a write.

The child is forked from a server process that imported torch, transformers and specnb's model code once
(multiprocessing's forkserver, :data:`PRELOAD`), so each child skips the ~5 s of imports a fresh interpreter
pays; it runs the same code after them, with the environment, folder and signal handling given here, and its
output goes to files read back. ``SPECNB_FRESH_CHILD=1``: a fresh ``python -m tests.interrupting`` instead.
"""

from __future__ import annotations

import builtins
import contextlib
import fnmatch
import functools
import importlib
import io
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Interrupted:
    """What the child did: its exit status (negative: the signal that ended it), its output, whether the trap
    fired (else the command ran to its end)."""

    returncode: int
    stdout: str
    stderr: str
    fired: bool

    @property
    def killed(self) -> bool:
        return self.fired and self.returncode == -signal.SIGKILL


def interrupted(argv: Sequence[str] | None = None, *, code: str | None = None, at: str | Sequence[str] = (),
                nth: int = 1, after: bool = False, within: str | None = None, mid_write: str | None = None,
                sig: str = "KILL", env: dict[str, str] | None = None, timeout: float = 120) -> Interrupted:
    """Run ``specnb ARGV`` (or the snippet ``code``) in a child process that signals itself at the chosen call."""
    marker = Path(tempfile.gettempdir()) / f"specnb-trap-{uuid.uuid4().hex}"
    spec = {"argv": list(argv) if argv is not None else None, "code": code,
            "at": [at] if isinstance(at, str) else list(at), "nth": nth, "after": after, "within": within,
            "mid_write": mid_write, "signal": sig, "marker": str(marker)}
    env = {**os.environ, **(env or {})}
    child_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}
    child_env.setdefault("TQDM_DISABLE", "1")
    if os.environ.get("SPECNB_FRESH_CHILD") == "1":
        out = subprocess.run([sys.executable, "-m", "tests.interrupting", json.dumps(spec)], capture_output=True,
                             text=True, env=child_env, cwd=ROOT, timeout=timeout)
        returncode, stdout, stderr = out.returncode, out.stdout, out.stderr
    else:
        returncode, stdout, stderr = _forked(spec, child_env, timeout)
    fired = marker.exists()
    marker.unlink(missing_ok=True)
    return Interrupted(returncode, stdout, stderr, fired)


# the imports every command of the tests pays before it runs (the server pays them once)
PRELOAD = ["tests.interrupting", "specnb.cli", "specnb.model.models", "transformers.tokenization_utils_fast"]


def _forked(spec: dict[str, Any], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run the child forked from the preloaded server: (exit status, stdout, stderr), as ``subprocess.run``
    gives them (a negative status: the signal that ended it)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory(prefix="specnb-child-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        child = context.Process(target=_forked_child, args=(spec, env, str(out), str(err)))
        # the server, started by the first child, reads the environment once as it imports (tqdm its TQDM_
        # defaults): the child's
        with mock.patch.dict(os.environ, {"TQDM_DISABLE": env["TQDM_DISABLE"]}):
            child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(["tests.interrupting", json.dumps(spec)], timeout)
        return child.exitcode, out.read_text(), err.read_text()


def _forked_child(spec: dict[str, Any], env: dict[str, str], out: str, err: str) -> None:
    """The child's start in the forked process: the given environment (torch's thread count too: it read
    ``OMP_NUM_THREADS`` when the server imported it), folder, output files and Ctrl-C handling, then
    :func:`_child`; its return is the exit status, and a Ctrl-C it lets through ends it by SIGINT, as Python
    ends a fresh interpreter."""
    import torch

    os.environ.clear()
    os.environ.update(env)
    if env.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    os.chdir(ROOT)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code = _child(spec)
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


# ------------------------------------------------------------------------------------------- the child


class _Trap:
    def __init__(self, spec: dict[str, Any]):
        self.nth, self.after, self.marker = spec["nth"], spec["after"], Path(spec["marker"])
        self.signal = getattr(signal, f"SIG{spec['signal']}")
        self.calls = 0
        self.active = spec["within"] is None

    def fire(self) -> None:
        self.marker.touch()
        if self.signal == signal.SIGKILL:
            os.kill(os.getpid(), signal.SIGKILL)
        signal.raise_signal(self.signal)  # in this thread; Python raises KeyboardInterrupt on return

    def counted(self) -> bool:
        if not self.active:
            return False
        self.calls += 1
        return self.calls == self.nth


def _resolve(name: str) -> tuple[Any, str]:
    module, _, attribute = name.partition(":")
    owner: Any = importlib.import_module(module)
    *path, last = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, last


def _patch(name: str, make) -> None:
    """Replace ``name`` by ``make(original)``, keeping a classmethod or staticmethod one."""
    owner, attribute = _resolve(name)
    raw = owner.__dict__.get(attribute) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        setattr(owner, attribute, type(raw)(make(raw.__func__)))
    else:
        setattr(owner, attribute, make(getattr(owner, attribute)))


def _install(spec: dict[str, Any]) -> None:
    trap = _Trap(spec)

    def counting(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if not trap.counted():
                return function(*args, **kwargs)
            if not trap.after:
                trap.fire()
            result = function(*args, **kwargs)
            trap.fire()
            return result
        return wrapper

    for name in spec["at"]:
        _patch(name, counting)
    if spec["mid_write"]:
        _patch_open(spec["mid_write"], trap)
    if spec["within"]:
        def scoping(function):
            @functools.wraps(function)
            def wrapper(*args, **kwargs):
                trap.active = True
                try:
                    return function(*args, **kwargs)
                finally:
                    trap.active = False
            return wrapper
        _patch(spec["within"], scoping)


class _DyingFile:
    """A file whose first write stops half-way: half the data reaches the file, then the signal."""

    def __init__(self, file, trap: _Trap):
        self._file, self._trap = file, trap

    def write(self, data):
        half = len(data) // 2
        self._file.write(data[:half])
        self._file.flush()
        self._trap.fire()
        return self._file.write(data[half:])

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._file.__exit__(*exc)


def _patch_open(pattern: str, trap: _Trap) -> None:
    real_open = io.open

    def opening(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        writing = any(flag in mode for flag in "wax+")
        with contextlib.suppress(TypeError):
            if writing and fnmatch.fnmatch(Path(file).name, pattern) and trap.counted():
                return _DyingFile(handle, trap)
        return handle

    io.open = builtins.open = opening


def _child(spec: dict[str, Any]) -> int:
    _install(spec)
    if spec["code"] is not None:
        exec(compile(spec["code"], "<interrupted>", "exec"), {"__name__": "__main__"})
        return 0
    from specnb.cli import main

    return main(spec["argv"])


if __name__ == "__main__":
    # a shell starts background jobs (CI, `make test &`) with SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: the child takes Ctrl-C as a terminal's foreground process would
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(_child(json.loads(sys.argv[1])))
