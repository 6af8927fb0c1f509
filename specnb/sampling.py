"""Turning logits into the distribution the target samples from: temperature and nucleus (top-p).

Temperature 0 means greedy decoding everywhere in specnb.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from .draft import Acceptance, Draft


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


# ---------------------------------------------------------------------- multi-candidate speculative sampling
#
# MCSD (Yang et al. 2024) on top of speculative sampling (Leviathan et al. 2023). At a tree node the draft
# proposed candidates x_1..x_k from its distribution q; the target's distribution there is p. Candidate i is
# accepted with probability min(1, p(x_i) / q(x_i)); on rejection p <- norm(max(p - q, 0)) and the next
# candidate is tried against the new p. Without replacement (candidates drawn one after another from q with
# the earlier ones removed) a rejected x_i is also removed from q, which is renormalised. If every candidate
# is rejected, the token emitted is drawn from the final residual p. Each step is an exact speculative
# sampling step of p_i against q_i, so the token emitted at the node is distributed as p.

Scheme = Literal["mcss", "mcss-wor", "mcns"]
SCHEMES: tuple[str, ...] = ("mcss", "mcss-wor", "mcns")
"""``mcss``: candidates drawn with replacement; ``mcss-wor``: without replacement; ``mcns``: naive
multi-candidate sampling (draw y from p, accept the candidate equal to y if there is one, else emit y)."""


@dataclass(frozen=True)
class CandidateDraft(Draft):
    """A Draft sampled from a draft LM: ``q[i]`` is the distribution node i's sibling group was drawn from
    (siblings share it; their order is the drawing order) and ``scheme`` says how they were drawn and
    therefore how :func:`accept_mcss` must verify them."""

    scheme: Scheme = "mcss"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown acceptance scheme {self.scheme!r}; use one of {', '.join(SCHEMES)}")
        if self.q is None:
            raise ValueError("a CandidateDraft needs the draft distributions q")

    def truncate(self, max_depth: int, max_nodes: int | None = None) -> CandidateDraft:
        """As :meth:`Draft.truncate`, keeping the scheme. Dropping the last candidates of a sibling group
        keeps the rest a valid draw (a shorter with- or without-replacement sequence)."""
        cut = super().truncate(max_depth, max_nodes)
        return cut if cut is self else replace(self, tokens=cut.tokens, parents=cut.parents, q=cut.q,
                                               source_row=cut.source_row)


def _normalise(weights: Tensor, fallback: Tensor) -> Tensor:
    """Rows of ``weights`` [N, V] scaled to sum 1; rows whose sum is 0 or not finite become ``fallback``.

    An empty residual only arises from rounding (in exact arithmetic a rejection implies p(x) < q(x), so
    max(p - q, 0) has mass); falling back to the current p is then the best available answer.
    """
    total = weights.sum(-1, keepdim=True)
    ok = torch.isfinite(total) & (total > 0)
    return torch.where(ok, weights / torch.where(ok, total, 1.0), fallback)


def mcss(p: Tensor, q: Tensor, candidates: Tensor, generator: torch.Generator | None,
         replacement: bool = True) -> tuple[Tensor, Tensor]:
    """Multi-candidate speculative sampling for N independent problems at once.

    p, q: float [N, V] target and draft distributions; candidates: int64 [N, k] drawn from q (i.i.d. if
    ``replacement``, else one after another without replacement), in drawing order, on any device (moved
    to p's). ``generator`` must be on p's device.
    Returns (accepted int64 [N]: index in 0..k-1 of the accepted candidate or -1 if all were rejected,
    residual float [N, V]: the distribution to draw the emitted token from where accepted == -1).
    The loop runs over the k candidates only; each step is vectorised over N and V.
    """
    n, k = candidates.shape
    device = p.device
    candidates = candidates.to(device)
    rows = torch.arange(n, device=device)
    accepted = torch.full((n,), -1, dtype=torch.long, device=device)
    u = torch.rand(n, k, generator=generator, device=device)
    p, q = p.float(), q.float().to(device)
    for i in range(k):
        x = candidates[:, i]
        px, qx = p[rows, x], q[rows, x]
        open_ = accepted < 0
        take = open_ & (u[:, i] * qx < px)  # probability min(1, p/q), no division by a zero q
        accepted = torch.where(take, i, accepted)
        reject = (open_ & ~take)[:, None]
        p = torch.where(reject, _normalise((p - q).clamp(min=0), p), p)
        if not replacement:
            q = torch.where(reject, _normalise(q.scatter(1, x[:, None], 0.0), q), q)
    return accepted, p


def target_probabilities(logits: Tensor, config: SamplingConfig) -> Tensor:
    """:func:`probabilities`, with temperature 0 as a one-hot at the argmax.

    With a one-hot p every MCSS step is deterministic: the candidate equal to the argmax is accepted, the
    others rejected, and the residual stays on the argmax. So at temperature 0 MCSS reduces to greedy
    matching, as the MCSD paper notes (with replacement it is vanilla SD, without it equals MCNS)."""
    if config.greedy:
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0)
    return probabilities(logits, config)


def accept_mcss(draft: Draft, logits: Tensor, config: SamplingConfig,
                generator: torch.Generator | None) -> Acceptance:
    """Walk a candidate tree from the root with multi-candidate speculative sampling.

    draft: a Draft carrying ``q`` (a :class:`CandidateDraft` says its scheme; a plain Draft is taken as
    ``mcss``, i.e. drawn with replacement); logits: [n+1, V] target logits at the root and every node.
    At each node its children (in node order = drawing order) are the candidates; an accepted child
    becomes the next node; at a leaf, or when every child is rejected, the bonus token is drawn from the
    target's (residual) distribution. Returns the accepted nodes (path order, host) and the bonus token.
    The tree walk runs on the host; p, q and the draws stay on the logits' device (``generator`` there too).
    """
    if draft.q is None:
        raise ValueError("accept_mcss needs a draft with draft distributions q")
    scheme = getattr(draft, "scheme", "mcss")
    child_of = draft.parents + 1  # full index of each node's parent
    path: list[int] = []
    current = 0  # full index of the node whose children are being verified
    while True:
        p = target_probabilities(logits[current], config)
        children = torch.nonzero(child_of == current).squeeze(1)
        if children.numel() == 0:
            return Acceptance(torch.tensor(path, dtype=torch.long), sample(p, generator))
        tokens = draft.tokens[children]
        if scheme == "mcns":
            token = sample(p, generator)
            hit = torch.nonzero(tokens == token).squeeze(1)
            if hit.numel() == 0:
                return Acceptance(torch.tensor(path, dtype=torch.long), token)
            choice = int(hit[0])
        else:
            q = draft.q[children[0]]
            accepted, residual = mcss(p[None], q[None], tokens[None], generator, replacement=scheme == "mcss")
            choice = int(accepted[0])
            if choice < 0:
                return Acceptance(torch.tensor(path, dtype=torch.long), sample(residual[0], generator))
        node = int(children[choice])
        path.append(node)
        current = node + 1
