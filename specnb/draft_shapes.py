"""The names and shapes a user gives a drafter on the command line, parsed in one leaf module that both the
option checks (:mod:`specnb.eval.methods`, before anything loads) and the drafters use.

* a tree shape ``"4x2x2x1"`` (draft models, :mod:`specnb.drafters.draft_model`): children per node at each
  draft level, :func:`tree_shape`;
* a retrieval shape ``"KxW"`` (DReSD, :mod:`specnb.drafters.dense`): K drafts of W tokens, or the paper's named
  best shapes, :func:`retrieval_shape`;
* a ``--draft`` value: a model name, or ``self:L`` (the target's first L layers) parsed into a :class:`SelfDraft`,
  :func:`parse_draft`.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class SelfDraft:
    """The draft that is the target's own first ``layers`` decoder layers (with its final norm and head), spelt
    ``self:L`` at the edge; ``str()`` gives that spelling back. A draft model is named by a ``str`` instead."""

    layers: int

    def __post_init__(self) -> None:
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 1:
            raise ValueError(f"invalid self-draft: L must be an integer >= 1, got {self.layers!r}")

    def __str__(self) -> str:
        return f"self:{self.layers}"


def parse_draft(text: str) -> str | SelfDraft:
    """A ``--draft`` value: ``"self:L"`` -> SelfDraft(L) (ValueError unless L is an integer >= 1), any other text
    -> that model name."""
    if not text.startswith("self:"):
        return text
    layers = text.removeprefix("self:")
    if not layers.isdigit() or int(layers) < 1:
        raise ValueError(f"invalid self-draft {text!r}: expected self:L with an integer L >= 1")
    return SelfDraft(int(layers))


def check_self_layers(layers: int, total: int) -> None:
    """ValueError unless a self-draft of ``layers`` layers is shallower than the target's ``total``."""
    if not 1 <= layers < total:
        raise ValueError(f"self-draft needs 1 <= L < {total} (the target's layer count), got L={layers}")
