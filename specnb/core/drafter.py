"""The drafter protocol: what the decoding loop asks of every speculation method."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .draft import Draft
from .report import NO_REPORT, Report


@dataclass
class DecodeState:
    """What a drafter may look at when proposing.

    tokens: int64 [L] on the host, prompt + generated tokens so far; ``tokens[-1]`` is the root of the next
            draft (the token the target just produced; it is not yet in the target's KV cache).
    hidden: float [d] on the target's device, its last hidden state at the position that produced the root,
            or None unless the drafter sets ``needs_hidden_state``.
    max_depth: the deepest draft worth proposing (tokens left before ``max_new_tokens``, minus the bonus).
    prompt_len: number of prompt tokens at the start of ``tokens``.

    A drafter returns a Draft of host tensors (its ``q``, if any, may stay on the device). Drafters derived
    from the target take it when they are made; none touches the target's KV cache.
    """

    tokens: Tensor
    hidden: Tensor | None
    max_depth: int
    prompt_len: int

    @property
    def root(self) -> int:
        return int(self.tokens[-1])


class Drafter:
    """Base class of every drafter. Subclasses implement :meth:`propose`.

    ``propose`` returns a :class:`~specnb.core.draft.Draft` rooted at ``state.root`` or None (no speculation
    this step: the loop then decodes one token). ``reset`` is called once per generation with the prompt,
    ``update`` after each verification with the tokens just committed (accepted draft tokens and bonus) and
    the accepted node indices of the draft it proposed.
    Drafters that set ``needs_logits`` also get :meth:`observe` after every target call, with the logits of
    the positions it computed (Token Recycling keeps their top tokens).
    ``report`` describes the last proposal (a :class:`Report`) for the run statistics.
    """

    name = "drafter"
    needs_hidden_state = False
    needs_logits = False

    def reset(self, prompt_ids: Tensor) -> None:  # noqa: B027 - optional hook
        """Forget everything about the previous generation."""

    def clear(self) -> None:  # noqa: B027 - optional hook
        """Forget what carries over from one request to the next (earlier outputs, learned tables). The
        runner calls it after its warm-up, so that a warm-up on the first prompt does not leak into that
        prompt's measured run."""

    def propose(self, state: DecodeState) -> Draft | None:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes of what the drafter keeps beyond the context (tables, histories, stores on disk); 0 for
        drafters that read only the context."""
        return 0

    def update(self, committed: Tensor, accepted: Tensor) -> None:  # noqa: B027 - optional hook
        """Learn from the tokens the target just committed (int64 [m]: the accepted draft tokens, then the
        bonus token, cut after an EOS) and the accepted nodes of the last draft (int64 [a], 0-based node
        indices in path order, a <= m; empty when nothing was accepted or nothing was drafted)."""

    def observe(self, tokens: Tensor, logits: Tensor) -> None:  # noqa: B027 - optional hook
        """See the target's verdict on the positions of the last call it computed (only if ``needs_logits``).

        tokens: int64 [m] on the host, the root then the draft's first m - 1 nodes (node order, whether accepted or
        not); logits: float [m, V] on the model's device, row i the target's next-token logits after ``tokens[i]`` in
        the context of its own path (root and ancestors). The call's head computes only the rows acceptance reads and
        those that cost no more beside them (:mod:`specnb.core.head_rows`), so m covers the root and every accepted
        node, and on a GPU all n + 1. Called before :meth:`update`.
        """

    @property
    def report(self) -> Report:
        """What the drafter says of its last proposal (nothing by default)."""
        return NO_REPORT


class Hindsight:
    """Proposals kept until the output has moved far enough past them to say how they would have done.

    A draft of fixed tokens is accepted exactly as far as it equals what the target then generates (greedy,
    and in distribution when sampling), so a draft that was never verified can still be scored once those
    tokens are known. Drafters that learn their shape or size use this to keep learning while they choose
    not to draft.
    """

    def __init__(self) -> None:
        self.output: list[int] = []  # tokens generated so far in this generation, the first root included
        self.pending: list[tuple[Any, Any, int, int]] = []  # (key, proposal, output index after root, horizon)

    def reset(self) -> None:
        """A new generation: proposals still waiting for their tokens are dropped."""
        self.output, self.pending = [], []

    def add(self, state: DecodeState, key: Any, proposal: Any, horizon: int) -> None:
        """Keep ``proposal`` (for the root of ``state``) until the ``horizon`` tokens after its root are known."""
        generated = state.tokens.shape[0] - state.prompt_len  # the root is the last of them
        if len(self.output) != generated:  # nothing added yet in this generation: take the output so far
            self.output = state.tokens[state.prompt_len:].tolist()
        self.pending.append((key, proposal, generated, horizon))

    def commit(self, committed: Tensor) -> list[tuple[Any, Any, list[int]]]:
        """Record the committed tokens; returns (key, proposal, true next tokens) for every proposal whose
        horizon is now complete, in the order they were added."""
        self.output.extend(committed.tolist())
        ready = [p for p in self.pending if len(self.output) - p[2] >= p[3]]
        self.pending = [p for p in self.pending if len(self.output) - p[2] < p[3]]
        return [(key, proposal, self.output[begin:begin + horizon]) for key, proposal, begin, horizon in ready]
