"""What every method's options share: the error they raise, the range checks, the check made before loading.

A method's options are a frozen dataclass deriving from :class:`Options`, defined beside its drafter
(``specnb/drafters/<x>.py``): ``__post_init__`` checks the values alone, :meth:`Options.check` what needs the
target's name (a store or table on disk, a ``self:L`` draft against the model's depth), before the model
loads. A leaf module: no torch, nothing of specnb above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class OptionError(ValueError):
    """A method or method option that is unknown, unused, out of range or of the wrong type."""


def at_least(options: Any, minimum: int | float, *names: str) -> None:
    """Raise OptionError naming the first of ``names`` (fields of ``options``) that is set and below ``minimum``."""
    for name in names:
        value = getattr(options, name)
        if value is not None and value < minimum:
            raise OptionError(f"option {name} must be >= {minimum}, got {value}")


def ordered(options: Any, low: str, high: str) -> None:
    """Raise OptionError unless field ``low`` <= field ``high`` (both >= 1)."""
    at_least(options, 1, low, high)
    if getattr(options, low) > getattr(options, high):
        raise OptionError(f"option {low} ({getattr(options, low)}) must not exceed {high} ({getattr(options, high)})")


@dataclass(frozen=True)
class Options:
    """Options of a method that takes none (``ar``, ``hf``, ``llamacpp``); the base of every method's options."""

    def check(self, model: str) -> None:
        """Raise (one line) for what would fail only after ``model`` loads, judged from its name alone. Here: a
        ``roofline`` table that is not there."""
        roofline = getattr(self, "roofline", "")
        if roofline and not Path(roofline).is_file():
            raise FileNotFoundError(f"roofline table {roofline} does not exist")
