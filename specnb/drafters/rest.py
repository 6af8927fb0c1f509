"""REST: retrieval-based speculative decoding over a suffix array (He et al. 2023; the CREST paper's baseline).

The drafter asks its datastore (:class:`specnb.datastores.rest.RestIndex`: the corpus tokens and their suffix
array) for the token tree of the longest suffix of the context that occurs in the corpus and proposes it as is;
the tree is verified with tree attention. The store's format, search and builder are in
:mod:`specnb.datastores.rest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Matched
from ..datastores.rest import DEFAULT_SEARCH, RestIndex, SearchConfig, open_rest
from ..options import Options as BaseOptions
from ..options import at_least, ordered
from . import Method


@dataclass(frozen=True)
class Options(BaseOptions):
    """REST: ``datastore`` (default: the target's code store); ``w`` continuation tokens per match."""

    datastore: str | None = None
    w: int = 10
    max_query: int = 16
    min_query: int = 2
    max_matches: int = 5000
    max_nodes: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "w", "max_matches", "max_nodes")
        ordered(self, "min_query", "max_query")

    def check(self, model: str) -> None:
        """The store must exist and record the model's tokenizer (its contents are checked when it opens)."""
        from ..datastores import rest

        super().check(model)
        path = rest.store_path(model, "rest", self.datastore)
        rest.require_store(path, "rest")
        rest.check_built_for(path, model)


class RestDrafter(Drafter):
    """Drafts REST's token tree for the last tokens of the context (verified with tree attention)."""

    name = "rest"

    def __init__(self, index: RestIndex, config: SearchConfig = DEFAULT_SEARCH):
        self.index, self.config = index, config
        self._report = Matched()

    def propose(self, state: DecodeState) -> Draft | None:
        context = state.tokens[-self.config.max_query:].numpy()
        tree, q = self.index.search(context, self.config)
        self._report = Matched(q, tree.num_nodes)
        return tree.to_draft() if tree.num_nodes else None

    @property
    def report(self) -> Matched:
        return self._report


def search_config(options: Options) -> SearchConfig:
    """SearchConfig from the method's options (``w`` is the continuation length)."""
    return SearchConfig(max_query=options.max_query, min_query=options.min_query, max_matches=options.max_matches,
                        length=options.w, max_nodes=options.max_nodes)


def make(target: Any, options: Options) -> RestDrafter:
    """The ``rest`` drafter on ``--datastore PATH`` or the default code store built for the target."""
    return RestDrafter(open_rest(target, options.datastore), search_config(options))


METHODS = (
    Method("rest", "REST suffix-array retrieval, token tree", "REST", Options, make, routable=True),
)
