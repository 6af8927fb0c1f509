"""Where specnb keeps what it builds: a leaf module (no torch, no specnb imports) every other module can use.

Every cache path is ``artifact_path(kind, *key)``, ``<cache>/<kind>/<key>...``; a model name or a corpus source
becomes a key's file name through :func:`safe_name`, the one sanitiser. Files are written there through
:mod:`specnb.atomic`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The folder for converted models, corpora, datastores and compiled kernels (``$SPECNB_CACHE`` or
    ``~/.cache/specnb``)."""
    return Path(os.environ.get("SPECNB_CACHE") or Path.home() / ".cache" / "specnb").expanduser()


def artifact_path(kind: str, *key: str) -> Path:
    """``<cache>/<kind>/<key[0]>/<key[1]>/...``: where an artifact of ``kind`` (``models``, ``corpora``,
    ``datastores``, ...) is cached. Each part must be one file name (ValueError otherwise; see :func:`safe_name`)."""
    for part in (kind, *key):
        if part in ("", ".", "..") or "/" in part or os.sep in part:
            raise ValueError(f"{part!r} is not a file name; pass model names and sources through safe_name")
    return cache_dir().joinpath(kind, *key)


def safe_name(text: str, whole: bool = False) -> str:
    """A model name, local model folder or corpus source as one file name: its last path component (``whole``:
    every component, ``/`` spelled ``--``), every character but letters, digits and ``-._`` replaced by ``_``."""
    name = text.replace("/", "--") if whole else Path(text).name
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in name)
