"""Token Recycling (Luo et al. 2024, arXiv 2408.08696): draft from the target's own earlier top-k predictions.

Every target call computes next-token logits at the positions it verifies, accepted or not; plain decoding
throws all but the chosen token away (on a CPU the call computes the rows acceptance reads and those that cost
nothing beside them, :mod:`specnb.core.head_rows`, and the table learns from those). Token Recycling keeps the
top ``k`` of each in a table of V rows (row x: the k tokens the target last ranked highest after x, wherever x
appeared), overwritten as new calls come, and kept across requests. A draft is a tree grown breadth-first from
the root through the table: the root's first ``widths[0]`` candidates, each of their first ``widths[1]``, and so
on; its nodes are ordered by the summed rank of their path (the top-1 chain first), so its first b nodes are the
best tree of b nodes and a priced router can cut it anywhere.

How many nodes pay depends on what a node costs. The paper drafts trees of tens of nodes on GPUs, where it
reports such a call costing about one token's (not measured here); on a CPU every node is a row of the call, and
the default ``max_nodes`` is 8, which is the top-1 chain (8 levels) whenever the table holds it (see
:class:`Options`).

The table is int32 [V, k]: 8 MB for Gemma-3's 262k vocabulary at k = 8 (the paper's < 2 MB is a 32k
vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..model.kernels import top_k
from ..options import OptionError, at_least
from ..options import Options as BaseOptions
from . import Method

# Candidates kept per node at each depth: wide near the root, where the table is least sure, then the top-1
# chain (greedy output follows the target's own top-1, so the long paths that pay are chains).
DEFAULT_WIDTHS = (4, 2, 2, 1, 1, 1, 1, 1)


@dataclass(frozen=True)
class Options(BaseOptions):
    """Token Recycling: the target's top ``k`` successors of every token; breadth-first trees of ``max_nodes``
    (8, not the paper's 32: on a CPU every node is a row of the target's call; docs/drafters.md). The router
    (``auto``) keeps recycle's 32-node tree and cuts it itself."""

    k: int = 8
    max_nodes: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "k", "max_nodes")


class RecycleDrafter(Drafter):
    """Breadth-first trees over the table of the target's last top-k successors of every token."""

    name = "recycle"
    needs_logits = True

    def __init__(self, vocab_size: int, k: int = 8, widths: tuple[int, ...] = DEFAULT_WIDTHS, max_nodes: int = 8):
        Options(k, max_nodes)  # OptionError for a value out of range
        if not widths or min(widths) < 1 or max(widths) > k:
            raise ValueError(f"recycle needs widths of 1..k={k} candidates per level, got {widths}")
        self.k, self.widths, self.max_nodes = k, widths, max_nodes
        self.table = np.full((vocab_size, k), -1, dtype=np.int32)

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def clear(self) -> None:
        """Forget every recorded successor."""
        self.table.fill(-1)

    def observe(self, tokens: Tensor, logits: Tensor) -> None:
        """Row ``tokens[i]`` := the top-k of ``logits[i]`` for every position the call computed; a token seen at
        several positions keeps its last one (the deepest in node order)."""
        top = top_k(logits, self.k).to("cpu", torch.int32).numpy()  # [n+1, k]
        ids = tokens.numpy()
        _, last = np.unique(ids[::-1], return_index=True)  # the last occurrence of each token
        keep = ids.shape[0] - 1 - last
        self.table[ids[keep]] = top[keep]

    def propose(self, state: DecodeState) -> Draft | None:
        tokens, parents, scores = [], [], []
        level = np.array([state.root])  # tokens of the previous level
        level_index = np.array([-1])  # their node indices (-1: the root)
        level_score = np.array([0])  # summed sibling ranks along their paths
        count = 0
        for width in self.widths[:state.max_depth]:
            candidates = self.table[level, :width]  # [P, width]
            parent, rank = np.nonzero(candidates >= 0)
            if parent.size == 0:
                break
            tokens.append(candidates[parent, rank])
            parents.append(level_index[parent])
            scores.append(level_score[parent] + rank)
            level, level_index = tokens[-1], count + np.arange(parent.size)
            level_score = scores[-1]
            count += parent.size
        if not count:
            return None
        tokens, parents, scores = (np.concatenate(a) for a in (tokens, parents, scores))
        order = np.lexsort((np.arange(count), scores))[:self.max_nodes]  # best paths first; parents come first
        # (a child's score is its parent's plus its rank >= 0, and an equal score sorts after its parent by index)
        new_index = np.full(count, -1)
        new_index[order] = np.arange(order.shape[0])
        kept_parents = np.where(parents[order] >= 0, new_index[np.maximum(parents[order], 0)], -1)
        return Draft(torch.from_numpy(tokens[order].astype(np.int64)), torch.from_numpy(kept_parents))

def make(target: Any, options: Options) -> RecycleDrafter:
    """The ``recycle`` drafter: a table of the target's vocabulary, ``k`` successors per token (OptionError for a
    ``k`` past the vocabulary)."""
    if options.k > target.vocab_size:
        raise OptionError(f"option k ({options.k}) exceeds {target.name}'s vocabulary ({target.vocab_size} tokens)")
    return RecycleDrafter(target.vocab_size, k=options.k, max_nodes=options.max_nodes)


METHODS = (
    Method("recycle", "Token Recycling: trees from the target's own earlier top-k successors", "Token Recycling",
           Options, make, routable=True),
)
