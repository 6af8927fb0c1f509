"""specnb: lossless speculative decoding — one loop, many drafters — for research notebooks.

The names below are imported on first use (PEP 562), so that ``import specnb.cli`` stays light: the command
line imports torch only for the commands that need it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that finish a parallel region spin before sleeping (GNU libgomp: 300k spins by default), which
# steals the sibling's core when another process is busy; 3000 spins trades that against waking a sleeping
# thread at every layer (docs/forward_pass.md, "OpenMP spinning"). Set before torch is imported; an explicit
# GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")

_EXPORTS = {"Draft": "core.draft", "Generation": "core.generate", "LoadedModel": "model.models",
            "Prompt": "core.prompts", "generate": "core.generate", "load_model": "model.models",
            "tiny_model": "model.models"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specnb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
