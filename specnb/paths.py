"""Where specnb keeps what it builds: a leaf module (no torch, no specnb imports) every other module can use."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The folder for converted models, corpora, datastores and compiled kernels (``$SPECNB_CACHE`` or
    ``~/.cache/specnb``)."""
    return Path(os.environ.get("SPECNB_CACHE") or Path.home() / ".cache" / "specnb").expanduser()
