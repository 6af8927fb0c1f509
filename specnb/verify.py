"""One target forward call over a Draft, the acceptance rules, and keeping the accepted KV entries.

Two executions of the same tree give the same logits (up to floating-point rounding):

* ``tree``:  one row ``[root, nodes...]`` with a 4D attention mask (each node sees the cache and its
  ancestors) and per-node position ids. Sliding-window layers (Gemma 3) get their own mask.
* ``batch``: one row per root-to-leaf path, the KV cache broadcast to that many rows, plain causal
  attention. Works with any attention kernel; costs k times the cache reads, and each layer's attention
  input is one transient ``[P, H, past + D + 1, head_dim]`` concatenation (the cache buffer itself stays
  one row; see :mod:`specnb.kv_cache`).

A chain (one path) needs no mask at all, so both modes run it as a plain causal call.

The KV cache (:class:`~specnb.kv_cache.GrowingCache`: a config-less ``DynamicCache`` that appends in
place) keeps every position in every layer; sliding windows are enforced by the masks. After acceptance
:meth:`Verifier.keep` leaves exactly the root and the accepted nodes in the cache, compacted in place:
nothing is recomputed.

Host and device: drafts and the acceptance bookkeeping are host tensors; :func:`~specnb.forward.forward`
moves ids and positions to the model's device and :class:`~specnb.masks.TreeMasks` builds the masks
there. Logits and hidden states stay on the device; greedy acceptance reads one host copy of the argmax
per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from transformers import PreTrainedModel

from .device import model_device
from .draft import Acceptance, Draft
from .forward import forward
from .kv_cache import GrowingCache
from .masks import TreeMasks
from .sampling import SamplingConfig, probabilities, sample

VerifyMode = Literal["tree", "batch"]


@dataclass
class Verification:
    """What one target call says about a draft.

    logits: [n+1, V] target logits at the root (row 0) and at every node (row i+1 = node i).
    hidden: [n+1, d] last hidden states at the same places, or None if not requested.
    batch_paths: for batch mode, the [P, D] path matrix that was run (full indices), else None.
    """

    logits: Tensor
    hidden: Tensor | None
    batch_paths: Tensor | None = None


class Verifier:
    """Runs the target on drafts and maintains its KV cache. One instance per generation."""

    def __init__(self, model: PreTrainedModel, mode: VerifyMode = "tree", want_hidden: bool = False):
        if mode not in ("tree", "batch"):
            raise ValueError(f"verification mode must be 'tree' or 'batch', got {mode!r}")
        self.model = model
        self.mode = mode
        self.want_hidden = want_hidden
        self.device = model_device(model)
        self.cache = GrowingCache()
        self.masks = TreeMasks(model)

    @property
    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    def _call(self, input_ids: Tensor, last_only: bool = False, **kwargs) -> tuple[Tensor, Tensor | None]:
        logits, hidden = forward(self.model, input_ids, last_only=last_only, past_key_values=self.cache,
                                 use_cache=True, **kwargs)
        return logits, (hidden if self.want_hidden else None)

    @torch.inference_mode()
    def prefill(self, prompt_ids: Tensor) -> Verification:
        """Run the prompt (int64 [L], host) through the target; logits/hidden of the last position only."""
        logits, hidden = self._call(prompt_ids[None], last_only=True)
        return Verification(logits[0], None if hidden is None else hidden[0, -1:])

    @torch.inference_mode()
    def forward(self, root: int, draft: Draft) -> Verification:
        """One target call over ``[root] + draft`` (host tensors) appended to the cache; the result's
        logits [n+1, V] and hidden states [n+1, d] are on the model's device."""
        if draft.num_nodes and int(draft.tokens.max()) >= self.model.get_output_embeddings().weight.shape[0]:
            raise ValueError("draft contains a token id outside the target's vocabulary")
        ids = torch.cat([torch.tensor([root]), draft.tokens])
        if draft.is_chain:
            logits, hidden = self._call(ids[None])
            return Verification(logits[0], None if hidden is None else hidden[0])
        if self.mode == "tree":
            return self._forward_tree(ids, draft)
        return self._forward_batch(ids, draft)

    def _forward_tree(self, ids: Tensor, draft: Draft) -> Verification:
        past = self.cache_len
        visible, depth = draft.attention()  # [n+1, n+1], [n+1]
        positions = past + depth
        # Every node sees the whole cache and, among the new entries, exactly itself and its ancestors.
        mask = self.masks(visible, positions, positions, prefix=past)
        logits, hidden = self._call(ids[None], attention_mask=mask, position_ids=positions[None])
        return Verification(logits[0], None if hidden is None else hidden[0])

    def _forward_batch(self, ids: Tensor, draft: Draft) -> Verification:
        paths = draft.paths()  # [P, D] full indices, -1 padded
        padded = torch.cat([torch.zeros(paths.shape[0], 1, dtype=torch.long), paths], dim=1)  # root first
        rows = ids[padded.clamp(min=0)]  # padding repeats the root token; its outputs are never read
        logits, hidden = self._call(rows)  # the cache broadcasts to the rows (see kv_cache)
        # Every node's outputs, taken from the first path that contains it.
        n = draft.num_nodes
        flat = padded.flatten()
        valid = torch.nonzero(flat >= 0).squeeze(1)
        first = torch.full((n + 1,), flat.numel(), dtype=torch.long).scatter_reduce_(
            0, flat[valid], valid, reduce="amin").to(self.device)
        pick = lambda t: t.flatten(0, 1)[first]  # noqa: E731
        return Verification(pick(logits), None if hidden is None else pick(hidden), batch_paths=paths)

    # ------------------------------------------------------------------ KV bookkeeping

    def keep(self, past: int, verification: Verification, accepted: Tensor) -> None:
        """Keep root + accepted nodes (0-based node indices in path order) after a call that began at
        cache length ``past``; drop every other entry the call added."""
        paths = verification.batch_paths
        if paths is not None:  # batch: the row of the path holding the accepted nodes, root included
            self.cache.keep_row(_row_of(paths, accepted), 1 + accepted.shape[0])
        else:
            self.cache.keep(past + 1, past + 1 + accepted)


def _row_of(paths: Tensor, accepted: Tensor) -> int:
    """Index of the first path whose prefix is the accepted node sequence."""
    if accepted.numel() == 0:
        return 0
    prefix = paths[:, :accepted.shape[0]]
    return int(torch.nonzero((prefix == accepted[None] + 1).all(1))[0])


# ---------------------------------------------------------------------- acceptance rules


def accept_greedy(draft: Draft, logits: Tensor) -> Acceptance:
    """Longest root-to-leaf prefix whose every token is the target's argmax at its parent.

    Ties between equally long paths go to the path through the earliest nodes. The bonus token is the
    argmax after the last accepted node. logits [n+1, V] may be on any device: the argmax [n+1] is read to
    the host once and the rest runs there.
    """
    predicted = logits.argmax(-1).cpu()  # [n+1]
    if draft.num_nodes == 0:
        return Acceptance(torch.empty(0, dtype=torch.long), int(predicted[0]))
    match = torch.cat([torch.tensor([True]), draft.tokens == predicted[draft.parents + 1]])  # full indices
    paths = draft.paths()
    along = match[paths.clamp(min=0)] & (paths >= 0)  # padding never matches
    lengths = along.cumprod(1).sum(1)
    best = int(lengths.argmax())  # first maximum
    nodes = paths[best, :int(lengths[best])]
    last = int(nodes[-1]) if nodes.numel() else 0
    return Acceptance(nodes - 1, int(predicted[last]))


def accept_sampled(draft: Draft, logits: Tensor, config: SamplingConfig,
                   generator: torch.Generator | None) -> Acceptance:
    """Speculative sampling for deterministic drafts (no q): walk down from the root, drawing one token
    from the target's distribution at the current node; move to the child holding that token if there is
    one (the first such child), else stop and emit the token as the bonus.

    Every emitted token is a fresh draw from the target at its true context, so the output distribution
    is exactly the target's. Only nodes on the walk are sampled (at most depth + 1 draws).
    """
    nodes: list[int] = []
    current = 0  # full index
    while True:
        token = sample(probabilities(logits[current], config), generator)
        children = torch.nonzero((draft.parents + 1 == current) & (draft.tokens == token))
        if children.numel() == 0:
            return Acceptance(torch.tensor(nodes, dtype=torch.long), token)
        node = int(children[0])
        nodes.append(node)
        current = node + 1
