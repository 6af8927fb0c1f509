"""DReSD: dense retrieval for speculative decoding (Gritta et al., 2025).

The target's last hidden state -- the one that produced the root token -- is turned into a 64-dim unit key
(z-score -> PCA -> L2, :class:`specnb.datastores.embed.Projection`) and looked up in an hnswlib index over the keys of
every position of a token corpus. Each neighbour's value is the next tokens of its corpus position; only
neighbours whose first value token equals the root (the token the target actually produced) are kept, and
the tokens after it become up to ``k`` de-duplicated drafts of ``w`` tokens, best neighbour first.
Verification takes them as a batch (``verify="batch"``) or as the trie of the rows (``verify="tree"``).
The datastore's format and builder are in :mod:`specnb.datastores.dense`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Report
from ..datastores.dense import DenseDatastore, open_dense
from ..datastores.retrieval_tree import build_tree, sort_rows
from ..draft_shapes import SAMPLING_SHAPE, retrieval_shape
from ..model.models import LoadedModel
from ..options import OptionError, at_least, parsed_by, positive_shape
from ..options import Options as BaseOptions
from . import Method


@dataclass(frozen=True)
class Options(BaseOptions):
    """DReSD: ``datastore`` (required), a ``draft_shape`` (k, w) (``KxW``, ``greedy`` or ``sampling`` at the edge)
    or ``k``/``w`` (default 10x10), ``neighbours`` and hnswlib's ``ef`` per query, ``merge`` rows|votes (see
    :class:`DenseDrafter`)."""

    datastore: str | None = None
    draft_shape: tuple[int, int] | None = parsed_by(retrieval_shape, None)
    k: int | None = None
    w: int | None = None
    neighbours: int | None = None
    ef: int | None = None
    merge: Literal["rows", "votes"] = "rows"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.datastore is None:
            raise OptionError("dense needs --datastore (a folder from `specnb datastore build dense`)")
        at_least(self, 1, "k", "w", "neighbours", "ef")
        positive_shape(self, "draft_shape")
        if self.draft_shape is not None and len(self.draft_shape) != 2:
            raise OptionError(f"option draft_shape must be (k, w), got {self.draft_shape!r}")

    def check(self, model: str) -> None:
        """The store must be sound (sampled checksums) and record the model's tokenizer (its model is checked when
        it opens)."""
        from ..datastores import dense

        super().check(model)
        dense.check_built_for(dense.store_path(self.datastore, model), model)


@dataclass(frozen=True)
class DenseReport(Report):
    """``neighbours`` fetched, ``first_token_matches`` of them whose value starts with the root, ``drafts``
    distinct rows proposed (rows merge only)."""

    neighbours: int = 0
    first_token_matches: int = 0
    drafts: int = 0

    @property
    def confidence(self) -> int:
        return self.first_token_matches


class DenseDrafter(Drafter):
    """Up to ``k`` drafts of ``w`` tokens from the values of the nearest stored hidden states.

    merge: ``"rows"`` (DReSD's drafts: the first k distinct continuations, best neighbour first, as the trie
    of the rows) or ``"votes"`` (every continuation that passes the filter merged into one token tree of at
    most k * w nodes ranked by how many continuations pass through each node, REST's construction
    (:mod:`specnb.datastores.retrieval_tree`), so its first b nodes are the best-supported tree of b nodes:
    what :mod:`specnb.drafters.priced` needs to cut it).
    neighbours: how many nearest keys to fetch before the first-token filter (default max(4k, 128): most
    neighbours fail the filter, so fetching more buys accepted tokens for little search time; the numbers are
    in ``docs/forward_pass.md``);
    ef: hnswlib's ``ef_search`` for this drafter (default: the datastore's).
    """

    name = "dense"
    needs_hidden_state = True

    def __init__(self, store: DenseDatastore, k: int = SAMPLING_SHAPE[0], w: int = SAMPLING_SHAPE[1],
                 neighbours: int | None = None, ef: int | None = None, merge: Literal["rows", "votes"] = "rows"):
        Options(datastore=str(store.path), k=k, w=w, neighbours=neighbours, ef=ef, merge=merge)  # the checks
        if w > store.n_next:
            raise ValueError(f"draft length w={w} exceeds the {store.n_next} tokens stored per value in "
                             f"{store.path}; rebuild it with a larger --n-next")
        self.store, self.k, self.w, self.merge = store, k, w, merge
        self.neighbours = neighbours or max(4 * k, 128)
        self.ef = ef
        self._report = DenseReport()

    def propose(self, state: DecodeState) -> Draft | None:
        if state.hidden is None:
            raise ValueError("DenseDrafter needs the target's hidden state; run it through specnb.generate")
        w = min(self.w, state.max_depth)
        if w < 1:
            return None
        if self.merge == "votes":
            rows = self.continuations(state.hidden, state.root, w)
            return build_tree(sort_rows(rows), self.k * self.w).to_draft() if rows.shape[0] else None
        rows = self.candidates(state.hidden, state.root, w)
        return Draft.from_rows(torch.from_numpy(rows)) if rows.shape[0] else None

    @property
    def report(self) -> DenseReport:
        return self._report

    def continuations(self, hidden: torch.Tensor | np.ndarray, root: int, w: int) -> np.ndarray:
        """int64 [m, w]: the next ``w`` tokens of every neighbour whose value starts with ``root``, nearest
        first (−1 after an end of document; duplicates kept).

        hidden: the target's state [d] that produced ``root``.
        """
        ids, _ = self.store.index.query(self.store.projection(hidden), self.neighbours, ef=self.ef)
        values = self.store.values[ids[0]]  # [K, 1 + N], nearest first
        rows = values[values[:, 0] == root, 1:1 + w].astype(np.int64)
        pad = self.store.pad_id
        # Everything after the first pad is past the document's end; an EOS pad itself stays (a real ending).
        is_pad = rows == pad
        rows[(np.cumsum(is_pad, axis=1) - is_pad) > 0] = -1
        rows = rows[rows[:, 0] >= 0]
        self._report = DenseReport(int(ids.shape[1]), int(rows.shape[0]))
        return rows

    def candidates(self, hidden: torch.Tensor | np.ndarray, root: int, w: int) -> np.ndarray:
        """int64 [r <= k, w] distinct drafts (−1 padded after an end of document), best neighbour first."""
        rows = self.continuations(hidden, root, w)
        _, first = np.unique(rows, axis=0, return_index=True)
        rows = rows[np.sort(first)[:self.k]]
        self._report = dataclasses.replace(self._report, drafts=int(rows.shape[0]))
        return rows


def make(target: LoadedModel, options: Options) -> DenseDrafter:
    """The ``dense`` drafter on ``--datastore PATH|NAME`` (a folder, or a name under the cache)."""
    store = open_dense(target, options.datastore)
    k, w = options.draft_shape or SAMPLING_SHAPE
    return DenseDrafter(store, k=options.k or k, w=options.w or w, neighbours=options.neighbours, ef=options.ef,
                        merge=options.merge)


METHODS = (
    Method("dense", "DReSD dense retrieval of hidden states (needs --datastore)", "DReSD", Options, make,
           routable=True),
)
