"""One target forward call over a Draft, and keeping the accepted KV entries (the acceptance rules are in
:mod:`specnb.core.accept`).

Two executions of the same tree give the same logits (up to floating-point rounding):

* ``tree``:  one row ``[root, nodes...]`` with a 4D attention mask (each node sees the cache and its
  ancestors) and per-node position ids. Sliding-window layers (Gemma 3) get their own mask.
* ``batch``: one row per root-to-leaf path, the KV cache broadcast to that many rows, plain causal
  attention. Works with any attention kernel; costs k times the cache reads, and each layer's attention
  input is one transient ``[P, H, past + D + 1, head_dim]`` concatenation (the cache buffer itself stays
  one row; see :mod:`specnb.model.kv_cache`).

A chain (one path) needs no mask at all, so both modes run it as a plain causal call.

The KV cache (:class:`~specnb.model.kv_cache.GrowingCache`: a config-less ``DynamicCache`` that appends in
place) keeps every position in every layer; sliding windows are enforced by the masks. After acceptance
:meth:`Verifier.keep` leaves exactly the root and the accepted nodes in the cache, compacted in place:
nothing is recomputed.

Host and device: drafts and the acceptance bookkeeping are host tensors; :func:`~specnb.model.forward.forward`
moves ids and positions to the model's device and :class:`~specnb.model.masks.TreeMasks` builds the masks
there. Logits and hidden states stay on the device; greedy acceptance reads one host copy of the argmax
per call. A call's logits are a :class:`~specnb.core.head_rows.HeadRows`: the output head runs on the rows
acceptance reads, as they are read (the root's and a few more first, then the rest if those passed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..model.forward import forward, hidden_states
from ..model.kv_cache import GrowingCache
from ..model.masks import TreeMasks
from ..model.models import LoadedModel
from .draft import Draft
from .head_rows import HeadRows, first_rows

VerifyMode = Literal["tree", "batch"]


@dataclass
class Verification:
    """What one target call says about a draft.

    logits: [n+1, V] target logits at the root (row 0) and at every node (row i+1 = node i): a tensor after
    :meth:`Verifier.prefill`, rows computed as they are read after :meth:`Verifier.forward`.
    hidden: [n+1, d] last hidden states at the same places, or None if not requested.
    """

    logits: Tensor | HeadRows
    hidden: Tensor | None


class Verifier:
    """Runs the target on drafts and maintains its KV cache. One instance per generation.

    :meth:`forward` remembers where its call began (the cache length, and for batch verification the path
    matrix it ran), so :meth:`keep` needs only the accepted nodes.
    """

    def __init__(self, target: LoadedModel, mode: VerifyMode = "tree", want_hidden: bool = False):
        if mode not in ("tree", "batch"):
            raise ValueError(f"verification mode must be 'tree' or 'batch', got {mode!r}")
        self.target = target
        self.mode = mode
        self.want_hidden = want_hidden
        self.device = target.device
        self.cache = GrowingCache()
        self.masks = TreeMasks(target.config, target.dtype, target.device)
        self._past = 0  # cache length before the last forward call
        self._paths: Tensor | None = None  # batch mode: the [P, D] paths (full indices) the last call ran

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def prefill(self, prompt_ids: Tensor) -> Verification:
        """Run the prompt (int64 [L], host) through the target; logits/hidden of the last position only."""
        logits, hidden = forward(self.target, prompt_ids[None], last_only=True, cache=self.cache)
        return Verification(logits[0], hidden[0, -1:] if self.want_hidden else None)

    def _call(self, input_ids: Tensor, **kwargs) -> Tensor:
        """Final hidden states [B, S, d] of a call appended to the cache."""
        return hidden_states(self.target, input_ids, cache=self.cache, **kwargs)

    def _verification(self, hidden: Tensor, draft: Draft) -> Verification:
        """The call's logits over ``hidden`` [n+1, d], each row computed when acceptance first reads it
        (:func:`~specnb.core.head_rows.first_rows` of them at the first read)."""
        head = self.target.decoder.head
        return Verification(HeadRows(hidden, head, first_rows(head, hidden, draft.all_rows)),
                            hidden if self.want_hidden else None)

    @torch.inference_mode()
    def forward(self, root: int, draft: Draft) -> Verification:
        """One target call over ``[root] + draft`` (host tensors) appended to the cache; the result's
        logits [n+1, V] and hidden states [n+1, d] are on the model's device."""
        if draft.num_nodes and int(draft.tokens.max()) >= self.target.vocab_size:
            raise ValueError("draft contains a token id outside the target's vocabulary")
        ids = torch.cat([torch.tensor([root]), draft.tokens])
        self._past, self._paths = self.cache_len, None
        if draft.is_chain:
            return self._verification(self._call(ids[None])[0], draft)
        if self.mode == "tree":
            return self._forward_tree(ids, draft)
        return self._forward_batch(ids, draft)

    def _forward_tree(self, ids: Tensor, draft: Draft) -> Verification:
        past = self._past
        visible, depth = draft.attention()  # [n+1, n+1], [n+1]
        positions = past + depth
        # Every node sees the whole cache and, among the new entries, exactly itself and its ancestors.
        mask = self.masks(visible, positions, positions, prefix=past)
        return self._verification(self._call(ids[None], mask=mask, positions=positions[None])[0], draft)

    def _forward_batch(self, ids: Tensor, draft: Draft) -> Verification:
        paths = self._paths = draft.paths()  # [P, D] full indices, -1 padded
        padded = torch.cat([torch.zeros(paths.shape[0], 1, dtype=torch.long), paths], dim=1)  # root first
        rows = ids[padded.clamp(min=0)]  # padding repeats the root token; its outputs are never read
        hidden = self._call(rows)  # the cache broadcasts to the rows (see kv_cache)
        # Every node's outputs, taken from the first path that contains it.
        n = draft.num_nodes
        flat = padded.flatten()
        valid = torch.nonzero(flat >= 0).squeeze(1)
        first = torch.full((n + 1,), flat.numel(), dtype=torch.long).scatter_reduce_(
            0, flat[valid], valid, reduce="amin").to(self.device)
        return self._verification(hidden.flatten(0, 1)[first], draft)

    # ------------------------------------------------------------------ KV bookkeeping

    def keep(self, accepted: Tensor) -> None:
        """Keep the root and the ``accepted`` nodes (int64 [a], 0-based node indices in path order) of the
        last :meth:`forward` call; drop every other entry that call added."""
        if self._paths is not None:  # batch: the row of the path holding the accepted nodes, root included
            self.cache.keep_row(_row_of(self._paths, accepted), 1 + accepted.shape[0])
        else:
            self.cache.keep(self._past + 1, self._past + 1 + accepted)


def _row_of(paths: Tensor, accepted: Tensor) -> int:
    """Index of the first path whose prefix is the accepted node sequence."""
    if accepted.numel() == 0:
        return 0
    prefix = paths[:, :accepted.shape[0]]
    return int(torch.nonzero((prefix == accepted[None] + 1).all(1))[0])
