"""Merge retrieved continuations into a token tree ranked by how many continuations pass through each node.

This is REST's tree construction (He et al. 2023), shared by :mod:`specnb.datastores.rest` (built at every
step) and :mod:`specnb.datastores.crest` (built once per stored n-gram). Given m continuations of up to L
tokens, every distinct prefix of a continuation is a candidate node whose *count* is the number of
continuations starting with it. The tree keeps the ``max_nodes`` nodes with the highest counts, ties broken
first by depth (shallower first) and then by the position of the first continuation holding the node
(lexicographic order when the rows come from a suffix array range). Because a node's count never exceeds its
parent's and the parent is shallower, the kept set is always closed under taking parents: it is a tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch loads with the first draft, not in the Ray tasks that build stores
    from ..core.draft import Draft


@dataclass(frozen=True)
class RetrievalTree:
    """A token tree with its nodes in rank order (most common first, ties as in :func:`build_tree`). Parents
    precede their children, and the first k nodes are exactly the tree :func:`build_tree` makes with budget k,
    so a stored tree can be cut to any smaller budget.

    tokens: int32 [n]; parents: int16 [n], -1 = the root (parents[i] < i); counts: int32 [n], continuations
    through each node.
    """

    tokens: np.ndarray
    parents: np.ndarray
    counts: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    def to_draft(self) -> Draft:
        import torch

        from ..core.draft import Draft

        return Draft(torch.from_numpy(self.tokens.astype(np.int64)), torch.from_numpy(self.parents.astype(np.int64)))

    def sequences(self) -> set[tuple[int, ...]]:
        """Every node as the token sequence from the root to it (for comparing trees built differently)."""
        paths: list[tuple[int, ...]] = []
        for token, parent in zip(self.tokens.tolist(), self.parents.tolist(), strict=True):
            paths.append((*(paths[parent] if parent >= 0 else ()), token))
        return set(paths)

    @classmethod
    def empty(cls) -> RetrievalTree:
        return cls(np.empty(0, np.int32), np.empty(0, np.int16), np.empty(0, np.int32))


def sort_rows(rows: np.ndarray) -> np.ndarray:
    """Rows in lexicographic order (-1 padding sorts first), which makes equal prefixes contiguous."""
    if rows.shape[0] == 0:
        return rows
    return rows[np.lexsort(rows.T[::-1])]


def carry_down(by_depth: np.ndarray) -> None:
    """In place, over a C-contiguous bool [L, m]: each depth's row ORed with every row above it (a prefix that
    differs, or ended, at some depth does so at every deeper one). One vector step a depth: numpy's
    ``logical_or.accumulate`` along axis 0 walks the array in strides."""
    for depth in range(1, by_depth.shape[0]):
        by_depth[depth] |= by_depth[depth - 1]


def build_tree(rows: np.ndarray, max_nodes: int = 64) -> RetrievalTree:
    """The token tree of continuations ``rows`` keeping the ``max_nodes`` most common prefixes.

    rows: int [m, L] continuations, fastest as the transpose of a C-contiguous int64 [L, m]; ``-1`` marks a missing
    token and every entry after a -1 must be -1 too. Rows sharing a prefix must be contiguous (true for rows taken
    from a suffix array range, or after :func:`sort_rows`). Vectorised over rows, and only the kept nodes are
    sorted: a suffix-array range gives up to 5,000 rows, tens of thousands of prefixes, at every REST step.
    """
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    m, length = rows.shape
    if m == 0 or length == 0:
        return RetrievalTree.empty()
    by_depth = np.ascontiguousarray(rows.T, dtype=np.int64)  # [L, m]: cell (row i, depth d) at d * m + i
    # Row i's prefix of length d + 1 starts a run of equal prefixes (rows i, i+1, ...) where row i differs from row
    # i-1 at depth d or above; a run's length is its prefix's count, and the runs of valid tokens are the nodes.
    opens = np.empty((length, m), dtype=bool)
    opens[:, 0] = True
    np.not_equal(by_depth[:, 1:], by_depth[:, :-1], out=opens[:, 1:])
    carry_down(opens)
    starts = np.flatnonzero(opens)  # depth-major: every depth's row 0 starts a run
    runs = np.empty_like(starts)  # a depth's last run ends where the next depth's first begins
    runs[:-1], runs[-1] = starts[1:] - starts[:-1], length * m - starts[-1]
    by_depth = by_depth.ravel()
    node = by_depth[starts] >= 0
    cells, counts = starts[node], runs[node]  # nodes in depth-major order (parents first), and their counts
    rank = (m - counts) * (length * m) + cells  # most common first, then shallower, then earlier (cell = d * m + i)
    keep = np.argpartition(rank, max_nodes - 1)[:max_nodes] if rank.shape[0] > max_nodes else np.arange(rank.shape[0])
    keep = keep[np.argsort(rank[keep])]
    # A node's parent is the node one depth up holding its first row: the last node cell at or before cell - m.
    kept = cells[keep]
    parent = np.where(kept >= m, np.searchsorted(cells, kept - m, side="right") - 1, -1)
    new_index = np.full(cells.shape[0], -1, dtype=np.int64)
    new_index[keep] = np.arange(keep.shape[0])
    parents = np.where(parent >= 0, new_index[np.maximum(parent, 0)], -1)
    return RetrievalTree(by_depth[kept].astype(np.int32), parents.astype(np.int16), counts[keep].astype(np.int32))
