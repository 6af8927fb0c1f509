"""Per-file checksums of a store, recorded when it is built and checked when it is opened.

A folder store (corpus, REST, dense) records in its ``meta.json`` (written last, so its presence marks a
complete build) ``"files": {name: {"bytes", "sha256", "sample_sha256"}}`` for every other file. Opening a
store checks every file's size and its *sampled* hash (16 chunks of 4 KiB at fixed offsets: milliseconds
even for gigabytes, and it catches a file overwritten or truncated); ``specnb datastore verify PATH`` checks
the full hashes (:func:`verify_store`). A CREST store is one SQLite file and records the same two
hashes over its trees table (see :mod:`specnb.datastores.crest`). Stores built before checksums existed carry
no ``files`` and are not checked.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..atomic import write_text
from . import CorpusError

SAMPLES = 16
CHUNK = 4096
META = "meta.json"
# How each kind of store is opened: "module:attribute" under specnb.datastores, imported only when a store of that
# kind is verified. Every kind imports this module to record its files, so the table names them, never imports.
OPENERS = {"rest": "rest:RestIndex.load", "dense": "dense:load_datastore", "corpus": "corpus:load_corpus",
           "crest": "crest:CrestStore"}


def full_hash(path: Path) -> str:
    """sha256 of a whole file."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sampled_hash(path: Path) -> str:
    """sha256 of ``SAMPLES`` chunks of ``CHUNK`` bytes spread evenly over the file (first and last included)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        for i in range(SAMPLES):
            f.seek(max(0, size - CHUNK) * i // (SAMPLES - 1))
            digest.update(f.read(CHUNK))
    return digest.hexdigest()


def record_files(folder: Path) -> dict[str, dict[str, Any]]:
    """{name: {bytes, sha256, sample_sha256}} for every file of ``folder`` but its meta.json."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": full_hash(p), "sample_sha256": sampled_hash(p)}
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != META}


def meta_hash(meta: dict[str, Any]) -> str:
    """sha256 of ``meta`` (its own checksum left out) as canonical JSON: meta.json's check of itself."""
    body = {key: value for key, value in meta.items() if key != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_meta(folder: str | Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``meta`` plus the checksums of the folder's other files, and its own (``meta_sha256``), as
    ``folder/meta.json`` (last, atomically); returns what was written."""
    folder = Path(folder)
    meta = json.loads(json.dumps({**meta, "files": record_files(folder)}, default=str))  # as it reads back
    meta["meta_sha256"] = meta_hash(meta)
    write_text(folder / META, json.dumps(meta, indent=1))
    return meta


def check_files(folder: str | Path, meta: dict[str, Any], full: bool = False) -> int:
    """Raise CorpusError unless ``meta`` matches its own checksum and every file recorded in ``meta["files"]``
    has its size and sampled hash (and with ``full``, its sha256). Returns the bytes checked (0 for a store that
    records no checksums)."""
    folder = Path(folder)
    if "meta_sha256" in meta and meta["meta_sha256"] != meta_hash(meta):
        raise CorpusError(f"{folder / META} does not match its own checksum: damaged; build the store again")
    checked = 0
    for name, record in meta.get("files", {}).items():
        path = folder / name
        if not path.is_file():
            raise CorpusError(f"{folder} is missing {name}; build it again")
        size = path.stat().st_size
        if size != record["bytes"]:
            raise CorpusError(f"{path} holds {size:,} bytes, {record['bytes']:,} recorded: damaged; build it again")
        if sampled_hash(path) != record["sample_sha256"] or (full and full_hash(path) != record["sha256"]):
            raise CorpusError(f"{path} does not match its recorded checksum: damaged; build it again")
        checked += size
    return checked


def read_meta(path: str | Path) -> dict[str, Any] | None:
    """The meta.json of a folder store, or None when ``path`` is not a folder with a readable one."""
    try:
        meta = json.loads((Path(path) / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def opener(kind: str) -> Callable[[Path], Any]:
    """The function that opens (and checks) a store of ``kind`` from its path."""
    module, attribute = OPENERS[kind].split(":")
    found: Any = importlib.import_module(f"{__package__}.{module}")
    for name in attribute.split("."):
        found = getattr(found, name)
    return found


SQLITE_HEADER = b"SQLite format 3\0"  # the first bytes of every SQLite file, a CREST store's among them
FOLDER_KINDS = ("rest", "dense")  # the "kind" a folder store's meta.json records; a corpus's records its counts
CORPUS_KEYS = frozenset({"tokenizer", "num_docs", "num_tokens"})


def verify_store(path: str | Path) -> str:
    """``specnb datastore verify``: check every byte of the store at ``path`` (any kind) against its recorded
    checksums, then open it. Returns a one-line report; raises CorpusError when a store there is damaged, and a
    plain ValueError when ``path`` holds no store at all (a file that is not SQLite, or SQLite without a CREST
    meta table; a folder without meta.json, or whose meta.json is no store's): a user error, not damage."""
    path = Path(path)
    if path.is_file():
        _check_is_crest(path)
        store = opener("crest")(path)
        store.verify()
        return f"ok: CREST store {path}, {len(store):,} n-grams, {store.storage_bytes:,} bytes checked"
    meta = read_meta(path)
    if meta is None and (path / META).is_file():
        raise CorpusError(f"{path / META} is not readable JSON: damaged; build the store again")
    if meta is None or not (meta.get("kind") in FOLDER_KINDS or CORPUS_KEYS <= meta.keys()):
        raise ValueError(f"{path} is not a datastore (a folder with a store's meta.json, or a CREST .sqlite file)")
    if "files" not in meta:
        raise CorpusError(f"{path} records no checksums (built by an older specnb); build it again to verify it")
    checked = check_files(path, meta, full=True)
    kind = meta.get("kind") if meta.get("kind") in FOLDER_KINDS else "corpus"
    opener(kind)(path)
    return f"ok: {kind} store {path}, {len(meta['files'])} files, {checked:,} bytes checked"


def _check_is_crest(path: Path) -> None:
    """ValueError unless the file ``path`` may be a CREST store: SQLite, with a ``meta`` table that says so or
    that cannot be read (a damaged store, for the store's own checks to report)."""
    with path.open("rb") as f:
        if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            raise ValueError(f"{path} is not a datastore (not an SQLite file, as a CREST store is)")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            kind = db.execute("SELECT value FROM meta WHERE key = 'kind'").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            return  # damaged: CrestStore says how
        kind = None
    except sqlite3.DatabaseError:
        return
    if kind is None or kind[0] != json.dumps("crest"):
        raise ValueError(f"{path} is an SQLite file but not a CREST store (no kind 'crest' in a meta table)")
