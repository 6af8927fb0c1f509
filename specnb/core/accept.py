"""The acceptance rules, behind one call: :func:`accept`.

* **greedy** (temperature 0): the longest root-to-leaf path whose every token is the target's argmax at
  its parent, plus the argmax after it as the bonus token (:func:`accept_greedy`);
* **sampled, deterministic drafts** (no ``q``): one draw from the target per node on the walk, following
  the child that holds the drawn token (:func:`accept_sampled`);
* **MCSS** (drafts with draft distributions ``q``, from a draft LM): multi-candidate speculative sampling,
  with or without replacement (:func:`accept_mcss`, :func:`mcss`).

One "longest accepted path" serves greedy verification, greedy replay (:mod:`specnb.eval.replay`) and the
counterfactual scoring of priced trees (:mod:`specnb.drafters.priced`): a node is accepted when it and
every ancestor pass a per-node test (:func:`path_accepted`), and the accepted path ends at the deepest
such node (:func:`longest_path`). Under greedy decoding the per-node test is "equals the target's argmax at
the parent" during decoding, and "equals the output at its depth" once the output is known
(:func:`matches_output`): the two are the same test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from ..model.kernels import top_k
from .draft import Acceptance, Draft
from .head_rows import HeadRows
from .sampling import SamplingConfig, probabilities, sample

NO_NODES = torch.empty(0, dtype=torch.long)
Logits = Tensor | HeadRows  # [n+1, V], read by rows: a call's logits are computed as acceptance reads them

# ---------------------------------------------------------------------- the longest accepted path


def path_accepted(draft: Draft, ok: Tensor) -> Tensor:
    """bool [n]: node i passes ``ok`` (bool [n], host) and so does every ancestor of it."""
    return torch.from_numpy(passes_with_ancestors(draft.parents.numpy(), ok.numpy()))


def passes_with_ancestors(parents: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """:func:`path_accepted` on numpy arrays: parents int64 [n], ok bool [n] -> bool [n]."""
    # Parents come first, so one pass in node order settles every node, and only the nodes that pass the test
    # themselves need a look: few (against a true continuation at most one child per node passes), each cheaper
    # than a vectorised walk up the tree costs per level. A router scores every member's tree at every step.
    out = np.zeros(ok.shape[0], dtype=bool)
    passing = np.flatnonzero(ok)
    for i, parent in zip(passing.tolist(), parents[passing].tolist(), strict=True):
        out[i] = parent < 0 or out[parent]
    return out


def longest_path(draft: Draft, ok: Tensor) -> Tensor:
    """int64 [a]: the nodes (0-based, path order) from the root down to the deepest node whose whole path
    passes ``ok`` (bool [n]); among equally deep ones the lowest node index wins (deterministic ties)."""
    if draft.num_nodes == 0:
        return torch.empty(0, dtype=torch.long)
    depth = torch.where(path_accepted(draft, ok), draft.depth, 0)
    best = int(depth.argmax())  # the first maximum
    if int(depth[best]) == 0:
        return torch.empty(0, dtype=torch.long)
    parents, path = draft.parents.tolist(), [best]
    while parents[path[-1]] >= 0:  # up to the root: at most depth steps
        path.append(parents[path[-1]])
    return torch.tensor(path[::-1], dtype=torch.long)


def matches_output(draft: Draft, truth: Tensor) -> Tensor:
    """bool [n]: node i's token equals ``truth[depth_i - 1]`` (truth: int64 [T], the tokens that followed
    the root); nodes deeper than T never match."""
    return torch.from_numpy(equals_output(draft.tokens.numpy(), draft.depth.numpy(), truth.numpy()))


def equals_output(tokens: np.ndarray, depth: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """:func:`matches_output` on numpy arrays: tokens and depth int64 [n], truth int [T] -> bool [n]."""
    if truth.shape[0] == 0:
        return np.zeros(tokens.shape[0], dtype=bool)
    return (depth <= truth.shape[0]) & (tokens == truth[np.minimum(depth, truth.shape[0]) - 1])  # depth >= 1


def source_row(draft: Draft, nodes: Tensor) -> int | None:
    """Which of the drafter's rows the accepted ``nodes`` came from (None when nothing was accepted or the
    draft does not record rows)."""
    if draft.source_row is None or nodes.numel() == 0:
        return None
    return int(draft.source_row[nodes[-1]])


# ---------------------------------------------------------------------- one call


def accept(draft: Draft, logits: Logits, config: SamplingConfig, generator: torch.Generator | None) -> Acceptance:
    """The accepted nodes and bonus token of ``draft`` given the target's logits [n+1, V] at the root and at
    every node: greedy at temperature 0, else MCSS for drafts carrying ``q`` and one target draw per node for
    deterministic drafts. ``generator`` must be on the logits' device (unused when greedy)."""
    if config.greedy:
        return accept_greedy(draft, logits)
    if draft.q is None:
        return accept_sampled(draft, logits, config, generator)
    return accept_mcss(draft, logits, config, generator)


def accept_greedy(draft: Draft, logits: Logits) -> Acceptance:
    """The longest path whose every token is the target's argmax at its parent, and the argmax after it.

    logits [n+1, V] may be on any device: on an accelerator the argmax of every row is read to the host once;
    on the CPU only the rows whose node passed are reduced. The rest runs on the host.
    """
    if draft.num_nodes == 0:  # a one-token call (AR, or no draft this step)
        return Acceptance(NO_NODES, int(top_k(logits[:1], 1)[0, 0]))
    if logits.device.type == "cpu" and draft.is_chain:  # node i's parent is row i: compare down the chain in ints
        tokens = draft.tokens.tolist()
        n = 0
        while True:
            predicted = int(top_k(logits[n:n + 1], 1)[0, 0])
            if n == len(tokens) or tokens[n] != predicted:
                return Acceptance(torch.arange(n), predicted)
            n += 1
    parent_rows = draft.parents + 1  # [n] the full index of each node's parent
    if logits.device.type != "cpu":  # an accelerator: all rows at once, one device read per call
        predicted = logits[:].max(-1).indices.cpu()
        ok = draft.tokens == predicted[parent_rows]
    else:  # on the CPU each row's argmax is a pass over the whole vocabulary: only rows whose node passed
        # need theirs, read level by level down the passing nodes (the accepted path, and any duplicate sibling's)
        predicted = torch.full((draft.num_nodes + 1,), -1, dtype=torch.long)  # -1: not read
        ok = torch.zeros(draft.num_nodes, dtype=torch.bool)
        rows = torch.zeros(1, dtype=torch.long)
        while rows.numel():
            # one row (a chain's next level) as a view: gathering would copy the row's logits
            level = logits[int(rows):int(rows) + 1] if rows.numel() == 1 else logits[rows]
            predicted[rows] = top_k(level, 1)[:, 0]
            passing = torch.isin(parent_rows, rows) & (draft.tokens == predicted[parent_rows])
            ok |= passing
            rows = torch.nonzero(passing).squeeze(1) + 1
    nodes = longest_path(draft, ok)
    last = int(nodes[-1]) + 1 if nodes.numel() else 0
    return Acceptance(nodes, int(predicted[last]))


def accept_sampled(draft: Draft, logits: Logits, config: SamplingConfig,
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
    """:func:`~specnb.core.sampling.probabilities`, with temperature 0 as a one-hot at the argmax.

    With a one-hot p every MCSS step is deterministic: the candidate equal to the argmax is accepted, the
    others rejected, and the residual stays on the argmax. So at temperature 0 MCSS reduces to greedy
    matching, as the MCSD paper notes (with replacement it is vanilla SD, without it equals MCNS)."""
    if config.greedy:
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(
            -1, logits.max(-1, keepdim=True).indices, 1.0)
    return probabilities(logits, config)


def accept_mcss(draft: Draft, logits: Logits, config: SamplingConfig,
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
