"""CREST: REST compacted into a dictionary n-gram -> precomputed token tree (CREST paper, §3.3-4.2).

The drafter looks up the longest n-gram ending at the root in its store
(:class:`specnb.datastores.crest.CrestStore`) and proposes the stored tree, optionally cut to its most common
nodes. The store's format and builder are in :mod:`specnb.datastores.crest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Matched
from ..datastores.crest import CrestStore, open_crest
from ..options import Options as BaseOptions
from ..options import at_least
from . import Method


@dataclass(frozen=True)
class Options(BaseOptions):
    """CREST: ``datastore`` (default: the target's code store); ``max_nodes`` cuts the stored trees."""

    datastore: str | None = None
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "max_nodes")

    def check(self, model: str) -> None:
        """The store must exist and record the model's tokenizer (its contents are checked when it opens)."""
        from ..datastores import crest, rest

        super().check(model)
        path = rest.store_path(model, "crest", self.datastore)
        rest.require_store(path, "crest")
        crest.check_built_for(path, model)


class CrestDrafter(Drafter):
    """Drafts the precomputed tree of the longest stored n-gram ending at the root."""

    name = "crest"

    def __init__(self, store: CrestStore, max_nodes: int | None = None):
        self.store, self.max_nodes = store, max_nodes
        self._report = Matched()

    @property
    def nbytes(self) -> int:
        """The store's size on disk (it is memory-mapped by SQLite, not held whole in memory)."""
        return self.store.path.stat().st_size

    def propose(self, state: DecodeState) -> Draft | None:
        tokens, parents, n = self.store.lookup(state.tokens[-self.store.ns[0]:].numpy())
        tokens, parents = tokens[:self.max_nodes], parents[:self.max_nodes]  # rank order: a prefix is the top-k tree
        self._report = Matched(n, int(tokens.shape[0]))
        if tokens.shape[0] == 0:
            return None
        return Draft(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(parents))

    @property
    def report(self) -> Matched:
        return self._report


def make(target: Any, options: Options) -> CrestDrafter:
    """The ``crest`` drafter on ``--datastore PATH.sqlite`` or the default code store built for the target,
    its trees cut to their ``max_nodes`` most common nodes."""
    return CrestDrafter(open_crest(target, options.datastore), options.max_nodes)


METHODS = (
    Method("crest", "CREST n-gram -> precomputed tree store", "CREST", Options, make, routable=True),
)
