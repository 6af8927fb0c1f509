"""REST: retrieval-based speculative decoding over a suffix array (He et al. 2023; the CREST paper's baseline).

The drafter asks its datastore (:class:`specnb.datastores.rest.RestIndex`: the corpus tokens and their suffix
array) for the token tree of the longest suffix of the context that occurs in the corpus and proposes it as is;
the tree is verified with tree attention. The store's format, search and builder are in
:mod:`specnb.datastores.rest`.
"""

from __future__ import annotations

from typing import Any

from ..datastores.rest import DEFAULT_SEARCH, RestIndex, SearchConfig, open_rest
from ..draft import Draft
from ..methods import RestOptions
from .base import DecodeState, Drafter


class RestDrafter(Drafter):
    """Drafts REST's token tree for the last tokens of the context (verified with tree attention)."""

    name = "rest"

    def __init__(self, index: RestIndex, config: SearchConfig = DEFAULT_SEARCH):
        self.index, self.config = index, config
        self._info: dict[str, int] = {}

    def propose(self, state: DecodeState) -> Draft | None:
        context = state.tokens[-self.config.max_query:].numpy()
        tree, q = self.index.search(context, self.config)
        self._info = {"match_len": q, "tree_nodes": tree.num_nodes}
        return tree.to_draft() if tree.num_nodes else None

    @property
    def last_info(self) -> dict[str, int]:
        return self._info


def search_config(options: RestOptions) -> SearchConfig:
    """SearchConfig from the method's options (``w`` is the continuation length)."""
    return SearchConfig(max_query=options.max_query, min_query=options.min_query, max_matches=options.max_matches,
                        length=options.w, max_nodes=options.max_nodes)


def make_rest(target: Any, options: RestOptions) -> RestDrafter:
    """Bench factory: ``--datastore PATH`` or the default code store built for the target."""
    return RestDrafter(open_rest(target, options.datastore), search_config(options))
