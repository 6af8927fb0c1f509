"""``specnb datastore verify``: every byte of a store of any kind against its recorded checksums, then open it.

It sits above the store kinds (it opens each), so that :mod:`specnb.datastores.manifest`, which every kind
uses to record and check its files, imports none of them.
"""

from __future__ import annotations

from pathlib import Path

from . import CorpusError
from .corpus import load_corpus
from .crest import CrestStore
from .dense import load_datastore
from .manifest import check_files, read_meta
from .rest import RestIndex


def verify_store(path: str | Path) -> str:
    """Check every byte of the store at ``path`` (any kind) against its recorded checksums, then open it.
    Returns a one-line report; raises CorpusError when anything is wrong."""
    path = Path(path)
    if path.is_file():
        store = CrestStore(path)
        store.verify()
        return f"ok: CREST store {path}, {len(store):,} n-grams, {store.storage_bytes:,} bytes checked"
    meta = read_meta(path)
    if meta is None:
        raise CorpusError(f"{path} is not a datastore (no readable meta.json)")
    if "files" not in meta:
        raise CorpusError(f"{path} records no checksums (built by an older specnb); build it again to verify it")
    checked = check_files(path, meta, full=True)
    kind = meta.get("kind")
    if kind == "rest":
        RestIndex.load(path)
    elif kind == "dense":
        load_datastore(path)
    else:
        load_corpus(path)
        kind = "corpus"
    return f"ok: {kind} store {path}, {len(meta['files'])} files, {checked:,} bytes checked"
