"""specnb: lossless speculative decoding — one loop, many drafters — for research notebooks.

The names below are imported on first use (PEP 562), so that ``import specnb.cli`` stays light: the command
line imports torch only for the commands that need it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_EXPORTS = {"Draft": "core.draft", "Generation": "core.generate", "LoadedModel": "model.models",
            "Prompt": "core.prompts", "generate": "core.generate", "load_model": "model.models",
            "tiny_model": "model.models"}

__all__ = sorted([*_EXPORTS, "openmp_spin_briefly"])


def openmp_spin_briefly() -> None:
    """Let OpenMP threads spin only briefly before sleeping: ``GOMP_SPINCOUNT=3000`` in this process's environment
    (and so its children's), unless ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` is already set.

    libgomp spins 300k times by default, which steals the sibling's core when another process is busy; 3000 trades
    that against waking a sleeping thread at every layer (docs/forward_pass.md, "OpenMP spinning"). libgomp reads
    the variable once, when torch loads it: call this before torch is imported (the ``specnb`` command, each
    notebook's first cell after its parameters and the tests' conftest do), never at import.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "3000")


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specnb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
