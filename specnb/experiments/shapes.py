"""Draft-shape ablations (notebook 08): every drafter family over one width x depth grid.

A *shape* (k, w) is k drafts of up to w tokens for the batch drafters (context n-grams, model bigram, mixed,
DReSD), a ranked tree cut to depth w and k * w nodes for REST and CREST (their node order is rank order, so
the first b nodes are the best b-node tree), and a k x 1 x ... x 1 tree (k candidates, then chains) for a draft
model. Trees above ``MAX_NODES`` nodes are left out, as in the papers' 64-node verification budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..datastores.crest import CrestStore
from ..datastores.dense import load_datastore
from ..datastores.ngram_tables import BigramTable
from ..datastores.rest import DEFAULT_SEARCH, RestIndex
from ..draft import Draft
from ..drafters.base import DecodeState, Drafter
from ..drafters.context import ContextNgramDrafter
from ..drafters.crest import CrestDrafter
from ..drafters.dense import DenseDrafter
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.mixed import MixedDrafter
from ..drafters.model_ngram import BigramDrafter
from ..drafters.rest import RestDrafter
from ..models import LoadedModel

GRID_K = (1, 2, 4, 8, 16)
GRID_W = (1, 2, 4, 8, 16)
MAX_NODES = 64


def grid_shapes(ks: tuple[int, ...] = GRID_K, ws: tuple[int, ...] = GRID_W, max_nodes: int = MAX_NODES,
                max_k: int | None = None) -> list[tuple[int, int]]:
    """Every (k, w) with k * w <= ``max_nodes`` (and k <= ``max_k``)."""
    return [(k, w) for k in ks for w in ws if k * w <= max_nodes and (max_k is None or k <= max_k)]


class Shaped(Drafter):
    """A tree drafter whose proposals are cut to depth ``w`` and the first ``k * w`` nodes."""

    def __init__(self, base: Drafter, k: int, w: int):
        self.base, self.k, self.w = base, k, w
        self.name = f"{getattr(base, 'name', 'tree')}-{k}x{w}"

    def propose(self, state: DecodeState) -> Draft | None:
        draft = self.base.propose(state)
        return None if draft is None else draft.truncate(self.w, self.k * self.w)

    @property
    def last_info(self) -> dict[str, Any]:
        return self.base.last_info


def families(target: LoadedModel, stores: dict[str, Path], table: BigramTable,
             draft: LoadedModel | None = None) -> dict[str, Callable[[int, int], Drafter]]:
    """{family: make(k, w)} for the context n-gram, model bigram, mixed, REST, CREST, DReSD (OOD store) and,
    with ``draft``, draft-model families; the stores are :func:`specnb.experiments.stores.study_stores`'."""
    rest, crest, dense = RestIndex.load(stores["rest"]), CrestStore(stores["crest"]), load_datastore(stores["dense"])
    made = {
        "context n-gram": lambda k, w: ContextNgramDrafter(k=k, w=w),
        "model bigram": lambda k, w: BigramDrafter(table, k, w),
        "mixed": lambda k, w: MixedDrafter(table, k, w),
        "REST": lambda k, w: RestDrafter(rest, dataclasses.replace(DEFAULT_SEARCH, length=w, max_nodes=k * w)),
        "CREST": lambda k, w: Shaped(CrestDrafter(crest), k, w),
        "DReSD": lambda k, w: DenseDrafter(dense, k, w),
    }
    if draft is not None:
        made["draft model"] = lambda k, w: DraftModelDrafter(draft, (k,) + (1,) * (w - 1), target.vocab_size)
    return made
