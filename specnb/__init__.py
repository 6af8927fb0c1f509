"""specnb: lossless speculative decoding — one loop, many drafters — for research notebooks.

The names below are imported on first use (PEP 562), so that ``import specnb.cli`` stays light: the command
line imports torch only for the commands that need it.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that finish a parallel region spin for a while before sleeping (GNU libgomp: 300k spins by
# default). On a 2-core machine with one other busy process, a spinning thread steals the core its sibling
# needs: a decoding step (~75 short parallel regions for Gemma-3-270M) ran 2.6x slower. Too short a spin
# costs the quiet case instead: the other thread has gone to sleep by the next layer's call and waking it
# (a futex and, on a VM, an idle vCPU) delays every region. Measured on Gemma-3-270M bf16, one-token calls,
# 2-core Zen 4 VM: 1000 spins: quiet ~30 ms, contended ~1.5x; 3000: quiet ~27 ms, contended ~1.9x; 10000:
# quiet ~25 ms, contended ~2.9x. It only takes effect when specnb is imported before torch; an explicit
# GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")

_EXPORTS = {"Draft": "draft", "Generation": "decode", "LoadedModel": "models", "Prompt": "prompts",
            "generate": "decode", "load_model": "models", "tiny_model": "models"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specnb' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
