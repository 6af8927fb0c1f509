"""specnb: lossless speculative decoding — one loop, many drafters — for research notebooks.

The names below are imported on first use (PEP 562), so that ``import specnb.cli`` stays light: the command
line imports torch only for the commands that need it.
"""

from __future__ import annotations

import importlib
from typing import Any

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
