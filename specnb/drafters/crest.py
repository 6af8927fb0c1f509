"""CREST: REST compacted into a dictionary n-gram -> precomputed token tree (CREST paper, §3.3-4.2).

The drafter looks up the longest n-gram ending at the root in its store
(:class:`specnb.datastores.crest.CrestStore`) and proposes the stored tree, optionally cut to its most common
nodes. The store's format and builder are in :mod:`specnb.datastores.crest`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..datastores.crest import CrestStore, open_crest
from ..draft import Draft
from ..methods import CrestOptions
from .base import DecodeState, Drafter


class CrestDrafter(Drafter):
    """Drafts the precomputed tree of the longest stored n-gram ending at the root."""

    name = "crest"

    def __init__(self, store: CrestStore, max_nodes: int | None = None):
        self.store, self.max_nodes = store, max_nodes
        self._info: dict[str, int] = {}

    @property
    def nbytes(self) -> int:
        """The store's size on disk (it is memory-mapped by SQLite, not held whole in memory)."""
        return self.store.path.stat().st_size

    def propose(self, state: DecodeState) -> Draft | None:
        tokens, parents, n = self.store.lookup(state.tokens[-self.store.ns[0]:].numpy())
        tokens, parents = tokens[:self.max_nodes], parents[:self.max_nodes]  # rank order: a prefix is the top-k tree
        self._info = {"match_len": n, "tree_nodes": int(tokens.shape[0])}
        if tokens.shape[0] == 0:
            return None
        return Draft(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(parents))

    @property
    def last_info(self) -> dict[str, int]:
        return self._info


def make_crest(target: Any, options: CrestOptions) -> CrestDrafter:
    """Bench factory: ``--datastore PATH.sqlite`` or the default code store built for the target;
    ``-o max_nodes=K`` cuts the stored trees to their K most common nodes."""
    return CrestDrafter(open_crest(target, options.datastore), options.max_nodes)
