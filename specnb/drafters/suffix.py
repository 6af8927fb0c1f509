"""SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): model-free drafts from the longest suffix match in
the current request and in earlier requests' outputs, as a tree ranked by how often each continuation followed.

Per step: find the longest suffix of the context (up to ``max_query`` tokens) that occurred before, in this
request's prompt + output (:func:`~specnb.datastores.history.earlier_match`) and in the outputs of earlier
requests (:class:`~specnb.datastores.history.OutputHistory`); take the longer match (both when they tie);
read the ``depth`` tokens after each occurrence, where ``depth = ceil(alpha * q)`` capped at ``max_depth``:
a long match is a reliable one, so it may speculate further; merge the continuations into a tree whose nodes
are ranked by the number of continuations through them (REST's tree,
:func:`~specnb.datastores.retrieval_tree.build_tree`) and keep the first ``max_nodes`` nodes whose
empirical probability (continuations through the node / all continuations) is at least ``min_prob``.

A finished request's output joins the history when the next request starts; the history keeps the newest
``history_tokens`` tokens and persists until :meth:`SuffixDrafter.clear`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Report
from ..datastores.history import OutputHistory, earlier_match, rows_after
from ..datastores.retrieval_tree import build_tree, sort_rows
from ..options import OptionError, at_least, ordered
from ..options import Options as BaseOptions
from . import Method


@dataclass(frozen=True)
class Options(BaseOptions):
    """SuffixDecoding: a tree of up to ``max_nodes`` from the longest suffix match (this request and earlier
    outputs), ``alpha`` x match length deep (at most ``max_depth``), nodes below ``min_prob`` pruned; the
    history keeps the last ``history_tokens`` output tokens. Why ``alpha`` and ``max_nodes`` differ from the
    reference implementation's: docs/drafters.md."""

    max_nodes: int = 16
    alpha: float = 2.0
    max_depth: int = 16
    min_prob: float = 0.1
    max_query: int = 32
    min_query: int = 1
    history_tokens: int = 262_144

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "max_nodes", "max_depth", "history_tokens")
        if self.alpha <= 0 or not 0 <= self.min_prob <= 1:
            raise OptionError(f"options alpha > 0 and 0 <= min_prob <= 1 needed, got {self.alpha}, {self.min_prob}")
        ordered(self, "min_query", "max_query")


@dataclass(frozen=True)
class SuffixReport(Report):
    """``match_len`` (0: no match), where the longest match was (``request``, ``history``, ``both``; "" for
    none), its ``occurrences`` and the ``tree_nodes`` kept."""

    match_len: int = 0
    source: str = ""
    occurrences: int = 0
    tree_nodes: int = 0

    @property
    def confidence(self) -> int:
        return self.match_len


class SuffixDrafter(Drafter):
    """SuffixDecoding's drafter; see the module docstring. Reports a :class:`SuffixReport`."""

    name = "suffix"

    def __init__(self, max_nodes: int = 16, alpha: float = 2.0, max_depth: int = 16, min_prob: float = 0.1,
                 max_query: int = 32, min_query: int = 1, max_matches: int = 1000, history_tokens: int = 262_144):
        Options(max_nodes, alpha, max_depth, min_prob, max_query, min_query, history_tokens)  # OptionError if not
        self.max_nodes, self.alpha, self.max_depth, self.min_prob = max_nodes, alpha, max_depth, min_prob
        self.max_query, self.min_query, self.max_matches = max_query, min_query, max_matches
        at_least(self, 1, "max_matches")
        self.history = OutputHistory(history_tokens)
        self.output: list[int] = []
        self._report = SuffixReport()

    def reset(self, prompt_ids: Tensor) -> None:
        """A new request: the previous one's output joins the history."""
        self.history.add(np.asarray(self.output, dtype=np.int64))
        self.output = []

    def clear(self) -> None:
        """Forget every earlier request (the history) and the current output."""
        self.history.clear()
        self.output = []

    def update(self, committed: Tensor, accepted: Tensor) -> None:
        self.output += committed.tolist()

    @property
    def nbytes(self) -> int:
        """Bytes the drafter holds across requests (the history's text and suffix array)."""
        return self.history.nbytes

    def propose(self, state: DecodeState) -> Draft | None:
        context = state.tokens.numpy()
        if not self.output:  # the first step of a request: its first token came from the prefill, not update()
            self.output = context[state.prompt_len:].tolist()
        q_request, starts = earlier_match(context, self.max_query, self.min_query)
        q_history, ranges = self.history.match(context, self.max_query, self.min_query)
        q = max(q_request, q_history)
        depth = min(self.max_depth, state.max_depth, math.ceil(self.alpha * q))
        self._report = SuffixReport(q)
        if q == 0 or depth < 1:
            return None
        parts = []
        if q_request == q:  # the most recent occurrences when there are too many
            parts.append(rows_after(context, starts[-self.max_matches:], depth))
        if q_history == q:
            parts.append(self.history.continuations(ranges, q, self.max_matches, depth))
        rows = np.concatenate(parts)
        rows = rows[rows[:, 0] >= 0]  # an occurrence at the very end of an output has no continuation
        if rows.shape[0] == 0:
            return None
        tree = build_tree(sort_rows(rows), self.max_nodes)
        # Nodes come most frequent first, so the ones above min_prob are a prefix (and a tree).
        keep = int((tree.counts >= self.min_prob * rows.shape[0]).sum())
        source = {1: "request", 2: "history", 3: "both"}[(q_request == q) + 2 * (q_history == q)]
        self._report = SuffixReport(q, source, int(rows.shape[0]), keep)
        return tree.to_draft().truncate(depth, keep) if keep else None

    @property
    def report(self) -> SuffixReport:
        return self._report


def make(target: Any, options: Options) -> SuffixDrafter:
    """The ``suffix`` drafter."""
    return SuffixDrafter(max_nodes=options.max_nodes, alpha=options.alpha, max_depth=options.max_depth,
                         min_prob=options.min_prob, max_query=options.max_query, min_query=options.min_query,
                         history_tokens=options.history_tokens)


METHODS = (
    Method("suffix", "SuffixDecoding: suffix matches in this request and earlier outputs", "SuffixDecoding", Options,
           make, routable=True),
)
