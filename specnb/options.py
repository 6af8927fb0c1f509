"""What every method's options share: the error they raise, the range checks, the check made before loading.

A method's options are a frozen dataclass deriving from :class:`Options`, defined beside its drafter
(``specnb/drafters/<x>.py``): its fields hold typed values (a shape is a tuple, a list of names a tuple, a choice
a ``Literal``); a string a user wrote (``"4x2x2x1"``, ``"pld,suffix"``) is parsed once, at the edge, by
:func:`specnb.eval.methods.parse_options` with the field's :func:`parsed_by` function. ``__post_init__`` checks
the values alone, :meth:`Options.check` what needs the target's name (a store or table on disk, a ``self:L``
draft against the model's depth), before the model loads. A leaf module: no torch, nothing of specnb above it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


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


def parsed_by(parse: Callable[[str], Any], default: Any) -> Any:
    """A dataclass field of typed value ``default`` whose command-line spelling ``parse`` turns into that type
    (ValueError for a bad string)."""
    return field(default=default, metadata={"parse": parse})


def name_list(text: str) -> tuple[str, ...]:
    """``"pld, suffix"`` -> ("pld", "suffix"): comma-separated names, blanks dropped."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def positive_shape(options: Any, name: str) -> None:
    """Raise OptionError unless field ``name`` of ``options`` (if set) is a non-empty tuple of integers >= 1."""
    shape = getattr(options, name)
    if shape is not None and (not isinstance(shape, tuple) or not shape
                              or not all(isinstance(n, int) and n >= 1 for n in shape)):
        raise OptionError(f"option {name} must be a tuple of integers >= 1, got {shape!r}")


@functools.cache
def _choices(cls: type) -> dict[str, tuple]:
    """{field: its choices} of ``cls``'s ``Literal`` fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is Literal}


@dataclass(frozen=True)
class Options:
    """Options of a method that takes none (``ar``, ``hf``, ``llamacpp``); the base of every method's options."""

    def __post_init__(self) -> None:
        """Raise OptionError for a ``Literal`` field whose value is not one of its choices, a number that is not
        finite (``alpha=inf`` overflowed in a drafter), or a ``seed`` outside [0, 2**63) (every subclass's
        ``__post_init__`` calls this first)."""
        for name, choices in _choices(type(self)).items():
            if getattr(self, name) not in choices:
                raise OptionError(f"option {name} must be one of {', '.join(map(str, choices))}, "
                                  f"got {getattr(self, name)!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise OptionError(f"option {f.name} must be a finite number, got {value}")
        seed = getattr(self, "seed", None)
        if seed is not None and not 0 <= seed < 1 << 63:
            raise OptionError(f"option seed must be in [0, 2**63), got {seed}")

    def check(self, model: str) -> None:
        """Raise (one line) for what would fail only after ``model`` loads, judged from its name alone. Here: a
        ``roofline`` table that is not there."""
        roofline = getattr(self, "roofline", "")
        if roofline and not Path(roofline).is_file():
            raise FileNotFoundError(f"roofline table {roofline} does not exist")
