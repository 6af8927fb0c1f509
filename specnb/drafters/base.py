"""The drafter protocol: what the decoding loop asks of every speculation method."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor
from transformers import PreTrainedModel

from ..draft import Draft


@dataclass
class DecodeState:
    """What a drafter may look at when proposing.

    tokens: int64 [L], prompt + generated tokens so far; ``tokens[-1]`` is the root of the next draft
            (the token the target just produced; it is not yet in the target's KV cache).
    hidden: float [d], the target's last hidden state at the position that produced the root, or None
            unless the drafter sets ``needs_hidden_state``.
    target: the target model (for drafters derived from it). A drafter must never touch its KV cache.
    max_depth: the deepest draft worth proposing (tokens left before ``max_new_tokens``, minus the bonus).
    prompt_len: number of prompt tokens at the start of ``tokens``.
    """

    tokens: Tensor
    hidden: Tensor | None
    target: PreTrainedModel
    max_depth: int
    prompt_len: int

    @property
    def root(self) -> int:
        return int(self.tokens[-1])


@dataclass
class DraftInfo:
    """Optional per-call facts a drafter reports (strategy allocation, lookup kind...)."""

    values: dict[str, Any] = field(default_factory=dict)


class Drafter:
    """Base class of every drafter. Subclasses implement :meth:`propose`.

    ``propose`` returns a :class:`~specnb.draft.Draft` rooted at ``state.root`` or None (no speculation
    this step: the loop then decodes one token). ``reset`` is called once per generation with the prompt,
    ``update`` after each verification with the tokens just committed (accepted draft tokens and bonus).
    ``last_info`` may carry per-call details into the run statistics.
    """

    name = "drafter"
    needs_hidden_state = False

    def reset(self, prompt_ids: Tensor) -> None:  # noqa: B027 - optional hook
        """Forget everything about the previous generation."""

    def propose(self, state: DecodeState) -> Draft | None:
        raise NotImplementedError

    def update(self, committed: Tensor) -> None:  # noqa: B027 - optional hook
        """Learn from the tokens the target just committed (int64 [m])."""

    @property
    def last_info(self) -> dict[str, Any]:
        """Details of the last proposal for the run statistics (empty by default)."""
        return {}
