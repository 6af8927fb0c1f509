"""Drafters from N-grams derived from the target's own weights (N-Grammys §4.1): unigram and (extended) bigram.

* **Unigram**: the top-k tokens of the model unigram's ranking are k one-token drafts, whatever the context.
* **Bigram**: k drafts of w tokens after the root from the extended model bigram (row j: the root's j-th
  bigram successor, then greedy top-1 chaining); a root without a row gets no drafts (``covered=False``).

The tables, how they are computed and cached, and ``specnb ngram-table`` are in
:mod:`specnb.datastores.ngram_tables`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Report
from ..datastores.ngram_tables import K_MAX, BigramTable, bigram_table, default_restriction, unigram_ranking
from ..model.models import LoadedModel
from ..options import Options, at_least
from . import Method


@dataclass(frozen=True)
class UnigramOptions(Options):
    """Model unigrams: the ``k`` top tokens of the ``unigram`` ranking rule."""

    k: int = 10
    unigram: Literal["appendix", "distance"] = "appendix"

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "k")


@dataclass(frozen=True)
class BigramOptions(Options):
    """Model bigrams: ``k`` drafts of ``w`` tokens; ``bigram_tokens=all`` builds every row of the table."""

    k: int = 10
    w: int = 1
    bigram_tokens: Literal["default", "all"] = "default"

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "k", "w")


@dataclass(frozen=True)
class BigramReport(Report):
    """Whether the table has a row for the root (without one there is no draft)."""

    covered: bool = False

    @property
    def confidence(self) -> int:
        return int(self.covered)


class UnigramDrafter(Drafter):
    """k one-token drafts: the model unigram's top-k tokens (the same at every step)."""

    name = "ngram-unigram"

    def __init__(self, ranking: np.ndarray, k: int = 10):
        if k < 1:
            raise ValueError(f"unigram drafter needs k >= 1, got {k}")
        self.rows = [[int(t)] for t in ranking[:k]]

    def propose(self, state: DecodeState) -> Draft | None:
        return Draft.from_rows(self.rows) if state.max_depth >= 1 else None


class BigramDrafter(Drafter):
    """k drafts of w tokens from the extended model bigram of the root (w = 1: the plain bigram)."""

    name = "ngram-bigram"

    def __init__(self, table: BigramTable, k: int = 10, w: int = 1):
        if not 1 <= k <= table.k_max or w < 1:
            raise ValueError(f"bigram drafter needs 1 <= k <= {table.k_max} and w >= 1, got k={k}, w={w}")
        self.table, self.k, self.w = table, k, w
        self._report = BigramReport()

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def propose(self, state: DecodeState) -> Draft | None:
        w = min(self.w, state.max_depth)
        rows = self.table.rows(state.root, self.k, w) if w >= 1 else None
        self._report = BigramReport(rows is not None)
        return None if rows is None else Draft.from_rows(rows)

    @property
    def report(self) -> BigramReport:
        return self._report


def table_for(target: LoadedModel, bigram_tokens: str, k: int = 1) -> BigramTable:
    """The bigram table a method uses: every row for ``bigram_tokens="all"``, else the default restriction; at
    least ``k`` successors a row (a table built narrower is rebuilt wider). ValueError for ``k`` past the
    vocabulary, before any row is computed."""
    if k > target.vocab_size:
        raise ValueError(f"k={k} exceeds the vocabulary ({target.vocab_size} tokens)")
    tokens = None if bigram_tokens == "all" else default_restriction(target)[0]
    return bigram_table(target, tokens, k_max=max(k, K_MAX))


def make_unigram(target: LoadedModel, options: UnigramOptions) -> UnigramDrafter:
    """The ``ngram-unigram`` drafter (k one-token drafts)."""
    return UnigramDrafter(unigram_ranking(target, rule=options.unigram), k=options.k)


def make_bigram(target: LoadedModel, options: BigramOptions) -> BigramDrafter:
    """The ``ngram-bigram`` drafter."""
    return BigramDrafter(table_for(target, options.bigram_tokens, options.k), k=options.k, w=options.w)


METHODS = (
    Method("ngram-unigram", "model-derived unigrams (N-Grammys)", "model unigram", UnigramOptions, make_unigram,
           routable=True),
    Method("ngram-bigram", "model-derived bigram chains (N-Grammys)", "model bigram", BigramOptions, make_bigram,
           routable=True),
)
