"""A tree drafter cut to a draft shape: the shape grids' way of giving a fixed-tree drafter a (k, w).

Contract: :class:`Shaped` wraps a drafter whose tree's node order is rank order (its first b nodes are its best
b-node tree, as CREST's stored trees are) and proposes that tree cut to depth ``w`` and its first ``k * w``
nodes; it reports what its base reports. Why: a store's trees have no (k, w) of their own, and
the grids compare every family at the same shapes (:mod:`specnb.experiments.shapes`).
"""

from __future__ import annotations

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Report


class Shaped(Drafter):
    """A tree drafter whose proposals are cut to depth ``w`` and the first ``k * w`` nodes."""

    def __init__(self, base: Drafter, k: int, w: int):
        self.base, self.k, self.w = base, k, w
        self.name = f"{getattr(base, 'name', 'tree')}-{k}x{w}"

    def propose(self, state: DecodeState) -> Draft | None:
        draft = self.base.propose(state)
        return None if draft is None else draft.truncate(self.w, self.k * self.w)

    @property
    def report(self) -> Report:
        return self.base.report
