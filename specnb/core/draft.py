"""The Draft: a token tree rooted at the token the target just produced.

Indexing convention used everywhere in specnb: *node i* (0-based) is ``tokens[i]``; its parent is
``parents[i]`` with -1 meaning the root. In verification the root is prepended, so "full" index ``i + 1``
is node ``i`` and full index 0 is the root; ``parents[i] + 1`` is then the parent's full index.
Parents always come before their children (``parents[i] < i``), so one pass over the nodes in order
visits every parent before its children.

A k x w batch of drafts is stored as a trie: rows that share a prefix share nodes. This is exact for
verification (two nodes with the same prefix see the same context) and never costs extra target work.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class Acceptance:
    """The outcome of one verification: accepted node indices (0-based, root excluded, in path order) and
    the bonus token the target produces after the last accepted node."""

    nodes: Tensor
    bonus: int


class DraftError(ValueError):
    """An invalid draft shape or content."""


@dataclass(frozen=True)
class Draft:
    """A token tree.

    tokens:  int64 [n], the proposed token ids. tokens, parents and source_row are host tensors.
    parents: int64 [n], parent node index or -1 for a child of the root; ``parents[i] < i``.
    q:       float [n, V] or None (on any device): the draft distribution each token was drawn from (at its parent),
             needed for speculative sampling with a draft model. Deterministic drafters leave it None.
    source_row: int64 [n] or None: for drafts built from rows, the first row that proposed the node
             (used to report which of the k drafts was accepted).
    all_rows: the drafter expects most of the draft accepted (it cut the draft to what pays): the verifier's
             output head then computes every node's logits in one call, not the first few first
             (:mod:`specnb.core.head_rows`).
    """

    tokens: Tensor
    parents: Tensor
    q: Tensor | None = None
    source_row: Tensor | None = None
    all_rows: bool = False

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if self.tokens.dim() != 1 or self.parents.shape != (n,):
            raise DraftError(f"tokens and parents must be 1-D of equal length, got {tuple(self.tokens.shape)} "
                             f"and {tuple(self.parents.shape)}")
        if not (self.tokens.is_cpu and self.parents.is_cpu):
            raise DraftError("draft tokens and parents must be host tensors")
        parents = self.parents.numpy()  # checked in numpy: less overhead per small operation than torch (every step)
        if n and (parents.min() < -1 or (parents >= np.arange(n)).any()):
            raise DraftError("every parent must be -1 (the root) or an earlier node")
        if n and self.tokens.numpy().min() < 0:
            raise DraftError("draft tokens must be non-negative ids")
        if self.q is not None and self.q.shape[0] != n:
            raise DraftError(f"q must have one row per node, got {self.q.shape[0]} rows for {n} nodes")

    # ------------------------------------------------------------------ construction

    @classmethod
    def empty(cls) -> Draft:
        """A draft with no nodes: verification then decodes one token, like plain AR decoding."""
        return cls(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))

    @classmethod
    def chain(cls, tokens: Tensor | list[int]) -> Draft:
        """A single path root -> tokens[0] -> tokens[1] -> ..."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        return cls(tokens, torch.arange(tokens.shape[0]) - 1)

    @classmethod
    def from_rows(cls, rows: Tensor | list[list[int]], pad: int = -1) -> Draft:
        """Build the trie of k drafts.

        rows: int [k, w] (or a list of lists of any lengths); entries equal to ``pad`` (and everything after
        the first pad of a row) are ignored. Nodes are numbered in order of first appearance, row by row,
        so equal inputs give equal trees.
        """
        if isinstance(rows, Tensor):
            if rows.dim() != 2:
                raise DraftError(f"rows must be a [k, w] tensor, got shape {tuple(rows.shape)}")
            rows = rows.tolist()
        node_of: dict[tuple[int, ...], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        source: list[int] = []
        for r, row in enumerate(rows):
            parent, prefix = -1, ()
            for token in row:
                if token == pad:
                    break
                prefix = (*prefix, token)
                node = node_of.get(prefix)
                if node is None:
                    node = node_of[prefix] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                    source.append(r)
                parent = node
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        return cls(as_long(tokens), as_long(parents), source_row=as_long(source))

    # ------------------------------------------------------------------ shape

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[0]

    @cached_property
    def depth(self) -> Tensor:
        """int64 [n]: 1 for children of the root, 2 for their children, ... (cached: a router prices, cuts and
        scores every member's tree at every step). Do not modify it in place."""
        depth: list[int] = []
        for parent in self.parents.tolist():  # parents come first: one pass over the nodes
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return torch.tensor(depth, dtype=torch.long)

    @cached_property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.num_nodes else 0

    @property
    def is_chain(self) -> bool:
        """True when the tree is one path in node order (plain causal attention verifies it)."""
        return bool((self.parents == torch.arange(self.num_nodes) - 1).all())

    @cached_property
    def _ancestors(self) -> Tensor:
        """bool [n+1, n+1] over full indices: ``A[i, j]`` is True when j is i itself or an ancestor of i.

        Cached: depth, attention and paths all derive from it, once per draft.
        """
        n = self.num_nodes
        parent_full = np.concatenate([[0], self.parents.numpy() + 1])  # the root is its own parent
        anc = np.eye(n + 1, dtype=bool)
        everyone, cur = np.arange(n + 1), np.arange(n + 1)
        # One step up the tree per iteration: O(depth) vector operations, in numpy (less overhead per small
        # operation than torch; the verified tree's attention mask is built from it at every step).
        while True:
            nxt = parent_full[cur]
            if np.array_equal(nxt, cur):
                break
            anc[everyone, nxt] = True
            cur = nxt
        return torch.from_numpy(anc)

    def attention(self) -> tuple[Tensor, Tensor]:
        """Tree attention over [root, nodes]: (bool mask [n+1, n+1] of ancestor-or-self, depth [n+1] from 0)."""
        anc = self._ancestors
        return anc, anc.sum(1) - 1

    def paths(self) -> Tensor:
        """int64 [num_leaves, max_depth]: full indices (1-based) of each root-to-leaf path, -1 padded.

        Leaves are ordered by node index, so the first path is the one through the earliest nodes.
        """
        n = self.num_nodes
        if n == 0:
            return torch.empty(0, 0, dtype=torch.long)
        anc = self._ancestors
        depth = anc.sum(1) - 1
        has_child = torch.zeros(n + 1, dtype=torch.bool)
        has_child[self.parents + 1] = True
        leaves = torch.nonzero(~has_child[1:]).squeeze(1) + 1
        out = torch.full((leaves.shape[0], int(depth.max())), -1, dtype=torch.long)
        rows, cols = torch.nonzero(anc[leaves][:, 1:], as_tuple=True)
        out[rows, depth[cols + 1] - 1] = cols + 1
        return out

    # ------------------------------------------------------------------ edits

    def truncate(self, max_depth: int, max_nodes: int | None = None) -> Draft:
        """Drop nodes deeper than ``max_depth`` and, if given, every node past the first ``max_nodes``.

        Keeping a prefix of the node order keeps every kept node's parent, since parents come first; the cut
        tree shares the kept nodes' memory and depths with this one.
        """
        depth = self.depth.numpy()
        keep = depth <= max_depth  # a new array
        if max_nodes is not None:
            keep[max_nodes:] = False
        if keep.all():
            return self
        index = np.flatnonzero(keep)
        m = index.shape[0]
        if m == 0 or index[-1] == m - 1:  # the first m nodes (a router's budget cut): their parents stand
            tokens, parents, rows = self.tokens[:m], self.parents[:m], slice(m)
        else:
            renumbered = np.cumsum(keep) - 1
            parents = self.parents.numpy()[index]
            parents = torch.from_numpy(np.where(parents >= 0, renumbered[np.maximum(parents, 0)], parents))
            rows = torch.from_numpy(keep)
            tokens = self.tokens[rows]
        cut = Draft(tokens, parents, None if self.q is None else self.q[rows],
                    None if self.source_row is None else self.source_row[rows], self.all_rows)
        cut.__dict__["depth"] = torch.from_numpy(depth[index])  # the cached_property's slot: depths carry over
        return cut

    def merge(self, other: Draft) -> Draft:
        """The trie of both trees: this tree's nodes first, in their order, then those of ``other`` that do not
        lie on a path of this one, in ``other``'s order (so the result's first nodes are this tree, and a
        router's node budget still cuts it). Deterministic drafts only: a node drawn from two draft
        distributions has no single q."""
        if self.q is not None or other.q is not None:
            raise DraftError("only deterministic drafts (q is None) can be merged")
        tokens, parents = self.tokens.tolist(), self.parents.tolist()
        node_of = {(parent, token): i for i, (parent, token) in enumerate(zip(parents, tokens, strict=True))}
        merged_index: list[int] = []  # other's node j -> its node in the merged tree (parents come first)
        for token, parent in zip(other.tokens.tolist(), other.parents.tolist(), strict=True):
            key = (merged_index[parent] if parent >= 0 else -1, token)
            if key not in node_of:
                node_of[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
            merged_index.append(node_of[key])
        if len(tokens) == self.num_nodes:
            return self
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     all_rows=self.all_rows or other.all_rows)
