"""Prompt representation and encoding: plain text, chat messages or token ids -> int64 token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.models import LoadedModel


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: ``text`` for completion models, ``messages`` for chat models (either or both).

    When both are given, chat models use ``messages`` and base models ``text``.

    A follow-up turn names in ``follows`` the id of the earlier prompt whose generated answer it continues;
    its ``messages`` are the user turns without that answer, which :func:`with_answer` inserts before the last
    one (the runner does it with the reference method's output, so every method sees the same conversation).
    """

    id: str
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    follows: str | None = None

    def __post_init__(self) -> None:
        if self.text is None and not self.messages:
            raise ValueError(f"prompt {self.id!r} has neither text nor messages")
        if self.follows is not None and (not self.messages or len(self.messages) < 2):
            raise ValueError(f"follow-up prompt {self.id!r} needs the earlier user turn and its own in messages")


def check_follow_ups(prompts: Sequence[Prompt]) -> None:
    """ValueError naming every follow-up whose ``follows`` is not an earlier prompt of ``prompts``."""
    seen: set[str] = set()
    orphans = []
    for prompt in prompts:
        if prompt.follows is not None and prompt.follows not in seen:
            orphans.append(f"{prompt.id} (follows {prompt.follows})")
        seen.add(prompt.id)
    if orphans:
        raise ValueError(f"follow-up prompts without their earlier turn before them: {', '.join(orphans)}")


def with_answer(prompt: Prompt, answer: str) -> Prompt:
    """The follow-up ``prompt`` with the earlier turn's ``answer`` in place: messages (..., user, assistant
    answer, user) for chat models, the turns and the answer separated by blank lines as text for base models."""
    *before, last = prompt.messages
    messages = (*before, {"role": "assistant", "content": answer}, last)
    return Prompt(prompt.id, text="\n\n".join(m["content"] for m in messages), messages=messages)


class Conversation:
    """The answers given so far in a prompt list, by prompt id, so that a follow-up sees its earlier turn's
    answer (:func:`with_answer`): the runner and the greedy references keep one each, and the same decoding of
    the answer makes a replay see the conversation the bench ran."""

    def __init__(self, target: LoadedModel):
        self.tokenizer = target.tokenizer
        self.answers: dict[str, str] = {}

    def resolve(self, prompt: Prompt) -> Prompt:
        """``prompt`` itself, or the follow-up with its earlier turn's recorded answer in place."""
        return prompt if prompt.follows is None else with_answer(prompt, self.answers[prompt.follows])

    def record(self, prompt_id: str, tokens: Sequence[int]) -> None:
        """The answer to ``prompt_id``: its new token ids, as text without special tokens."""
        self.answers[prompt_id] = self.tokenizer.decode(list(tokens), skip_special_tokens=True)


PromptLike = str | Prompt | Sequence[dict[str, str]] | Sequence[int] | Tensor


def encode_prompt(target: LoadedModel, prompt: PromptLike) -> Tensor:
    """Token ids (int64 [L]) for ``prompt``; chat models get their chat template with a generation prompt.

    Raises ValueError for an empty prompt.
    """
    if isinstance(prompt, Prompt):
        if prompt.follows is not None:
            raise ValueError(f"prompt {prompt.id!r} follows {prompt.follows!r}: put that prompt's answer in first "
                             "(specnb.core.prompts.with_answer; the runner does it)")
        if prompt.messages and (target.chat or prompt.text is None):
            prompt = list(prompt.messages)
        else:
            prompt = prompt.text
    if isinstance(prompt, Tensor):
        ids = prompt.flatten().long()
    elif isinstance(prompt, str):
        if not prompt:
            raise ValueError("empty prompt")
        if target.chat:
            ids = _chat_ids(target, [{"role": "user", "content": prompt}])
        else:
            ids = torch.tensor(target.tokenizer(prompt).input_ids, dtype=torch.long)
    elif len(prompt) and isinstance(prompt[0], dict):
        ids = _chat_ids(target, list(prompt))
    else:
        ids = torch.tensor(list(prompt), dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("empty prompt")
    if int(ids.min()) < 0 or int(ids.max()) >= target.vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {target.vocab_size})")
    return ids


def _chat_ids(target: LoadedModel, messages: list[dict[str, str]]) -> Tensor:
    if target.tokenizer.chat_template is None:  # base model: join the turns as plain text
        text = "\n\n".join(m["content"] for m in messages)
        return torch.tensor(target.tokenizer(text).input_ids, dtype=torch.long)
    ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
    return torch.tensor(ids, dtype=torch.long).flatten()
