"""Turning logits into the distribution the target samples from: temperature and nucleus (top-p).

Temperature 0 means greedy decoding everywhere in specnb. The acceptance rules that use these distributions
are in :mod:`specnb.core.accept`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingConfig:
    """How the target picks its next token. ``temperature == 0`` is greedy (argmax, ties to the lower id)."""

    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: Tensor, config: SamplingConfig) -> Tensor:
    """Float32 probabilities [..., V] after temperature and top-p (the smallest set of tokens whose
    probability reaches ``top_p``; the token that crosses the threshold is kept)."""
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    if config.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
        sorted_probs = sorted_probs.masked_fill(before >= config.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: Tensor, generator: torch.Generator | None) -> int:
    """One token id drawn from a probability vector [V] (``generator`` on ``probs``' device)."""
    return int(torch.multinomial(probs, 1, generator=generator))
