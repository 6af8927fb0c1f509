"""Context n-grams / prompt lookup decoding (N-Grammys §4.2, Saxena 2023).

Find earlier occurrences of the last q tokens anywhere in prompt + generated text and propose the w tokens
that followed them. Continuations are ranked by how often they occur, ties going to the most recent one.
With ``longest_first`` the query lengths are tried from ``max_ngram`` down to ``min_ngram`` and drafts from
longer matches come first; ``k=1`` with ``longest_first`` is classic prompt lookup decoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Report
from ..options import Options as BaseOptions
from ..options import at_least, ordered
from . import Method


@dataclass(frozen=True)
class Options(BaseOptions):
    """Prompt lookup: ``k`` drafts of ``w`` tokens after the longest match of the last max_ngram..min_ngram tokens."""

    k: int = 1
    w: int = 10
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "k", "w")
        ordered(self, "min_ngram", "max_ngram")


@dataclass(frozen=True)
class ContextReport(Report):
    """``matched_rows`` drafts found; ``match_len``: the query length of the first (0: none)."""

    matched_rows: int = 0
    match_len: int = 0

    @property
    def confidence(self) -> int:
        return self.match_len


class ContextNgramDrafter(Drafter):
    """Up to ``k`` drafts of up to ``w`` tokens copied from the context after matches of its last tokens."""

    name = "pld"

    def __init__(self, k: int = 1, w: int = 10, max_ngram: int = 3, min_ngram: int = 1, longest_first: bool = True):
        Options(k, w, max_ngram, min_ngram)  # OptionError for a value out of range
        self.k, self.w = k, w
        self.ngram_sizes = range(max_ngram, min_ngram - 1, -1) if longest_first else [max_ngram]
        self._report = ContextReport()

    def propose(self, state: DecodeState) -> Draft | None:
        rows = self.candidates(state.tokens.numpy(), min(self.w, state.max_depth))
        return Draft.from_rows(rows) if rows else None

    @property
    def report(self) -> ContextReport:
        return self._report

    def candidates(self, context: np.ndarray, w: int) -> list[list[int]]:
        """Up to k distinct continuations (lists of <= w ids) of the context's last tokens, best first."""
        drafts: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        self._report = ContextReport()
        if w < 1:
            return drafts
        for q in self.ngram_sizes:
            for row in continuations(context, q, w):
                key = tuple(row)
                if key not in seen:
                    seen.add(key)
                    drafts.append(row)
                    self._report = ContextReport(len(drafts), self._report.match_len or q)
                    if len(drafts) == self.k:
                        return drafts
        return drafts


def continuations(context: np.ndarray, q: int, w: int) -> list[list[int]]:
    """Distinct w-token continuations of earlier matches of ``context[-q:]``, ranked by count then recency.

    context: int [n]. A match must end before the last token, so every continuation has at least one
    token; continuations cut short by the end of the context are kept at their shorter length.
    """
    n = context.shape[0]
    if n <= q:
        return []
    query = context[n - q:]
    # Match windows context[i:i+q] with i + q <= n - 1; filter candidates one query token at a time.
    starts = np.flatnonzero(context[q - 1:n - 1] == query[-1])
    for back in range(1, q):
        starts = starts[context[starts + q - 1 - back] == query[-1 - back]]
    found: dict[tuple[int, ...], list[int]] = {}  # continuation -> [count, its latest start]
    for begin in (starts + q).tolist():  # np.unique over rows costs more (docs/forward_pass.md)
        entry = found.setdefault(tuple(context[begin:begin + w].tolist()), [0, begin])
        entry[0], entry[1] = entry[0] + 1, begin  # starts ascend: the last seen is the latest
    return [list(row) for row in sorted(found, key=lambda row: (-found[row][0], -found[row][1]))]


def make(target: Any, options: Options) -> ContextNgramDrafter:
    """The ``pld`` drafter."""
    return ContextNgramDrafter(k=options.k, w=options.w, max_ngram=options.max_ngram, min_ngram=options.min_ngram)


METHODS = (
    Method("pld", "prompt lookup: n-gram matches in the prompt and output", "prompt lookup", Options, make,
           routable=True),
)
