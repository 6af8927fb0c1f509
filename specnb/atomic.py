"""Atomic writes, for every artifact specnb writes (a leaf module: no torch, no specnb imports): a file or a
folder is built under a temporary sibling name and renamed into place only when complete, so an interrupted write
never leaves a half file under the final name (and never deletes the old one before the new one is whole).
Before the rename every new file and folder is flushed to the disk (``fsync``), and the folder holding the
name after it: a power cut, not only a killed process, then finds the old version or the whole new one.

    with atomic_file(path) as tmp:      # write tmp; on success it replaces path
        np.save(tmp, array)
    with atomic_folder(path, replace=is_store) as tmp:   # fill the folder tmp; on success it becomes path
        ...

``atomic_folder`` replaces an existing path only when told to, after :func:`check_replaceable` has made sure it
holds one of the project's own stores, so a mistyped ``--out`` never deletes a user's files. A file that grows
line by line as a run goes (a resumable log) is appended to in place instead: only whole-file writes come here.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import errno
import fcntl
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


class ExistsError(ValueError):
    """An output path that exists and may not be replaced."""


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block succeeds it replaces ``path`` (else it is removed).

    The temporary name keeps ``path``'s suffix, so writers that append one (``np.save``) see it already there.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.partial-{os.getpid()}{path.suffix}")  # with_suffix would drop the pid
    try:
        yield tmp
        _sync(tmp)
        os.replace(tmp, path)
        _sync(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_csv(path: str | Path, frame: pd.DataFrame, index: bool = False) -> None:
    """Write ``frame`` to ``path`` as CSV atomically."""
    with atomic_file(path) as tmp:
        frame.to_csv(tmp, index=index)


def check_output_file(path: str | Path, ours: Callable[[Path], bool], what: str, flag: str = "--out") -> Path:
    """``path`` as a Path if a command may write its output file there; ValueError (one line) saying why not
    (``what``: the file with its article, "a roofline CSV").

    Checked before any heavy work: ``path`` must name a file (not a folder, not empty) in an existing folder where
    a file can really be created (a probe file of a fresh name is made and removed: ``os.access`` says yes on
    read-only mounts and ``/proc``); an existing non-empty file is replaced only when ``ours(path)`` says this
    command wrote it (e.g. :func:`csv_has_columns`), never a user's file.
    """
    if not str(path).strip():
        raise ValueError(f"{flag} is empty; name a file")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; name a file in it")
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {path}: folder {path.parent} does not exist")
    try:  # a new file of a fresh name (never one already there), removed at once
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot write in {path.parent} ({exc.strerror or exc})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path} is not writable")
    if path.is_file() and path.stat().st_size and not ours(path):
        raise ValueError(f"{flag} {path} exists and is not {what} of specnb; refusing to replace it: name another "
                         "file")
    if path.exists() and not path.is_file():
        raise ValueError(f"{flag} {path} exists and is not a regular file; name another file")
    return path


def csv_has_columns(path: Path, columns: frozenset[str]) -> bool:
    """Whether ``path`` starts with a CSV header holding every one of ``columns`` (how a command knows the file
    is one it wrote)."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader([f.readline(1 << 16)]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return columns <= {column.strip() for column in header}


def check_replaceable(path: str | Path, is_store: Callable[[Path], bool], overwrite: bool, what: str) -> bool:
    """Whether writing a store at ``path`` replaces one (True) or creates it (False).

    Raises ExistsError when ``path`` holds anything but a store of this kind (``is_store(path)``), or a store
    and ``overwrite`` is false: a build never deletes what the project did not create.
    """
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return False
    if not is_store(path):
        raise ExistsError(f"{path} exists and is not a {what}; refusing to replace it (choose another --out)")
    if not overwrite:
        raise ExistsError(f"{path} already holds a {what}; pass --overwrite to replace it (the old one is kept "
                          "until the new one is complete)")
    return True


@contextmanager
def atomic_folder(path: str | Path, replace: bool = False, keep_partial: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; when the block succeeds it takes ``path``'s place.

    An existing ``path`` is replaced only when ``replace`` (see :func:`check_replaceable`), and only after the
    new folder is complete: the two are exchanged in one step (:func:`_swap_in`), then the old one deleted.
    keep_partial: leave the temporary folder ``<path>.partial`` on failure, for a build that resumes from it.
    """
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not replace:
        raise ExistsError(f"{path} exists; refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial") if keep_partial else _temporary(path)
    with _exclusive(tmp) if keep_partial else contextlib.nullcontext():
        if not keep_partial:
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(exist_ok=True)
        try:
            yield tmp
        except BaseException:
            if not keep_partial:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        _swap_in(tmp, path)


@contextmanager
def work_folder(path: str | Path) -> Iterator[Path]:
    """Yield ``<path>.partial``, the folder a resumable build of the file ``path`` keeps its finished pieces in:
    held by one build at a time, kept when the block fails (a rerun resumes from it), removed when it succeeds
    (the block has then written ``path``). A folder of that name that holds files but no build's ``plan.json``
    is not ours: ExistsError, never touched."""
    path = Path(path)
    work = path.with_name(f"{path.name}.partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(work):
        if work.is_dir() and any(work.iterdir()) and not (work / "plan.json").is_file():
            raise ExistsError(f"{work} holds files but no build's plan.json; move it away to build {path}")
        work.mkdir(exist_ok=True)
        yield work
        shutil.rmtree(work)


@contextmanager
def exclusive(path: str | Path, busy: str, finished: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Hold ``<path>.lock`` for the block, so that a second process doing the same work on ``path`` at the same time
    gets ExistsError (``busy``: what to say) instead of writing beside the first. The lock file is removed at the
    end when ``finished()`` (default: always), else left for a run that resumes."""
    path = Path(path)
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExistsError(busy) from None
        try:
            yield
        finally:
            if finished():
                lock.unlink(missing_ok=True)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _exclusive(partial: Path) -> contextlib.AbstractContextManager[None]:
    """:func:`exclusive` for a resumable build filling ``partial`` (a name shared by every build of one store, so
    that a killed build resumes): its lock stays until the build has completed."""
    return exclusive(partial, f"another process is building {partial.with_suffix('')} right now; wait for it to "
                     "finish (its result will be reused)", finished=lambda: not partial.exists())


def _swap_in(tmp: Path, path: Path) -> None:
    """Rename the complete ``tmp`` to ``path``. An existing ``path`` is exchanged with ``tmp`` in one step
    (Linux ``renameat2(RENAME_EXCHANGE)``), so that ``path`` holds the old store or the new one at every instant
    (a kill -9 between two renames left no store there), and the old one is deleted last. Where the kernel or
    file system cannot exchange, the old one is moved aside first (a moment without ``path``). Everything in
    ``tmp`` reaches the disk before the rename, the parent folder's entries after it."""
    _sync_tree(tmp)
    if not (path.exists() or path.is_symlink()):
        tmp.rename(path)
    elif _exchange(tmp, path):
        _sync(path.parent)
        _remove(tmp)  # now the old store
    else:
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        path.rename(old)
        tmp.rename(path)
        _sync(path.parent)
        _remove(old)
    _sync(path.parent)


def _sync(path: Path) -> None:
    """Flush the file or folder ``path`` (a folder: its entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder``, then ``folder`` itself (a file: just it)."""
    if folder.is_dir() and not folder.is_symlink():
        for root, dirs, files in os.walk(folder):
            for name in files:
                if not os.path.islink(os.path.join(root, name)):
                    _sync(Path(root, name))
            for name in dirs:
                _sync(Path(root, name))
    _sync(folder)


def _remove(path: Path) -> None:
    """Delete a folder, or a file or a symbolic link (never what a link points to)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` atomically (both must exist); False where this system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # an old kernel, a file system without it
        return False
    raise OSError(code, os.strerror(code), str(b))


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """glibc's ``renameat2`` (Linux, glibc >= 2.28), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function
