"""The names and shapes a user gives a drafter on the command line, parsed in one leaf module that both the
option checks (:mod:`specnb.eval.methods`, before anything loads) and the drafters use.

* a tree shape ``"4x2x2x1"`` (draft models, :mod:`specnb.drafters.draft_model`): children per node at each
  draft level, :func:`tree_shape`;
* a retrieval shape ``"KxW"`` (DReSD, :mod:`specnb.drafters.dense`): K drafts of W tokens, or the paper's named
  best shapes, :func:`retrieval_shape`;
* a ``self:L`` draft name: the target's first L layers, :func:`self_layers`.
"""

from __future__ import annotations

SAMPLING_SHAPE = (10, 10)  # k drafts x w tokens: DReSD's best shape for nucleus sampling
GREEDY_SHAPE = (3, 20)  # DReSD's best shape for greedy decoding


def tree_shape(text: str) -> tuple[int, ...]:
    """``"4x2x2x1"`` -> (4, 2, 2, 1): children per node at each draft level (``"1x1x1"`` = vanilla SD)."""
    try:
        shape = tuple(int(part) for part in str(text).lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ValueError(f"invalid draft shape {text!r}: expected positive integers joined by 'x', e.g. 4x2x2x1")
    return shape


def retrieval_shape(shape: str) -> tuple[int, int]:
    """``"3x20"`` -> (3, 20); ``greedy`` / ``sampling`` name DReSD's best shapes."""
    named = {"greedy": GREEDY_SHAPE, "sampling": SAMPLING_SHAPE}
    if shape in named:
        return named[shape]
    try:
        k, w = (int(x) for x in shape.lower().split("x"))
    except ValueError:
        raise ValueError(f"invalid dense draft shape {shape!r}; use KxW (e.g. 3x20), greedy or sampling") from None
    return k, w


def self_layers(name: str) -> int | None:
    """L of a ``self:L`` draft name (ValueError unless L is a positive integer), None for any other name."""
    if not name.startswith("self:"):
        return None
    layers = name.removeprefix("self:")
    if not layers.isdigit() or int(layers) < 1:
        raise ValueError(f"invalid self-draft {name!r}: expected self:L with an integer L >= 1")
    return int(layers)


def check_self_layers(layers: int, total: int) -> None:
    """ValueError unless a self-draft of ``layers`` layers is shallower than the target's ``total``."""
    if not 1 <= layers < total:
        raise ValueError(f"self-draft needs 1 <= L < {total} (the target's layer count), got L={layers}")
