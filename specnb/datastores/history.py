"""The two suffix structures of SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975): where the current
request's context and the outputs of earlier requests are searched for the longest suffix of the context.

* :func:`earlier_match` searches the current request (prompt + output so far) directly: the context grows by
  a few tokens per step, and a vectorised scan over it costs far less than rebuilding a suffix array at every
  step (docs/forward_pass.md, "Measurements behind the code").
* :class:`OutputHistory` holds the outputs of earlier requests of this process in one suffix array (the
  in-memory form of REST's store, :class:`~specnb.datastores.rest.RestIndex`), at most ``max_tokens``
  tokens: when a new output would pass that, the oldest outputs are evicted whole. It is rebuilt once per
  added output (pydivsufsort), and searched by binary search at every step.

Both answer the same question, a suffix tree's: the longest ``q`` such that the last ``q`` tokens of the
context occurred before (with at least one token after them), and where. The drafter that turns the
occurrences into a frequency-ranked tree is :mod:`specnb.drafters.suffix`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .rest import SEPARATOR, RestIndex


def earlier_match(context: np.ndarray, max_query: int, min_query: int = 1) -> tuple[int, np.ndarray]:
    """The longest suffix of ``context`` (int [n], its last token the root) that occurs earlier in it.

    Returns (q, starts): q in [min_query, max_query] the longest length with an occurrence ending before the
    last token, and starts int64 [m] the positions just after each such occurrence (where its continuation
    begins), oldest first; (0, empty) when not even ``min_query`` tokens recur.
    """
    n = context.shape[0]
    ends = np.flatnonzero(context[:n - 1] == context[n - 1])  # occurrences of the last token, itself excluded
    q, best = 1, ends
    while ends.size and q < min(max_query, n - 1):  # lengthen the query one token to the left per pass
        ends = ends[ends >= q]
        ends = ends[context[ends - q] == context[n - 1 - q]]
        if ends.size:
            q, best = q + 1, ends
    if best.size == 0 or q < min_query:
        return 0, np.empty(0, dtype=np.int64)
    return q, best.astype(np.int64) + 1


def rows_after(text: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """int64 [m, length]: the ``length`` tokens of ``text`` (int [n]) from each start, -1 past its end."""
    index = starts[:, None] + np.arange(length)
    rows = text[np.minimum(index, text.shape[0] - 1)].astype(np.int64)
    rows[index >= text.shape[0]] = -1
    return rows


class OutputHistory:
    """Earlier requests' outputs in one suffix array, at most ``max_tokens`` tokens (oldest evicted whole)."""

    def __init__(self, max_tokens: int = 262_144):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.outputs: deque[np.ndarray] = deque()
        self.index: RestIndex | None = None

    @property
    def num_tokens(self) -> int:
        return sum(o.shape[0] for o in self.outputs)

    @property
    def nbytes(self) -> int:
        """Bytes held: the token text and its suffix array (int32 each, one separator per output)."""
        return 0 if self.index is None else int(self.index.text.nbytes + self.index.sa.nbytes)

    def add(self, tokens: np.ndarray) -> None:
        """Remember one finished output (int [m]); evict the oldest outputs past ``max_tokens``; re-index."""
        tokens = np.asarray(tokens, dtype=np.int64)[-self.max_tokens:]
        if tokens.shape[0] == 0:
            return
        self.outputs.append(tokens)
        while self.num_tokens > self.max_tokens:
            self.outputs.popleft()
        text = np.concatenate([np.append(o, SEPARATOR) for o in self.outputs]).astype(">i4")
        from pydivsufsort import divsufsort

        self.index = RestIndex(text, divsufsort(text.astype(np.int32)), {"kind": "output-history"})

    def clear(self) -> None:
        self.outputs.clear()
        self.index = None

    def match(self, context: np.ndarray, max_query: int, min_query: int = 1) -> tuple[int, np.ndarray]:
        """(q, ranges): the longest suffix of ``context`` (q tokens, in [min_query, max_query]) found in the
        history and its suffix-array ranges (:meth:`RestIndex.find`); q = 0 when none is."""
        if self.index is None:
            return 0, np.empty((0, 2), dtype=np.int64)
        return self.index.longest_match(context, max_query, min_query)

    def continuations(self, ranges: np.ndarray, q: int, max_matches: int, length: int) -> np.ndarray:
        """int64 [m, length]: the tokens after up to ``max_matches`` occurrences, -1 past an output's end."""
        assert self.index is not None
        return self.index.continuations(ranges, q, max_matches, length)
