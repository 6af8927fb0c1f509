"""Priced trees: verify only as much of a ranked draft tree as pays for itself.

REST and CREST return trees whose nodes come in rank order (a node's count never exceeds its parent's), so
the first b nodes are the best tree of b nodes. Verifying b nodes costs one target call on b + 1 tokens,
which on a CPU is far from free (notebook 05; docs/forward_pass.md, "Measurements behind the code"), so
:class:`PricedTreeDrafter` cuts every tree to the node budget b with the highest
expected tokens per second,

    (1 + E[accepted | bucket, b]) / seconds(b + 1 tokens),

b = 0 meaning "do not draft". The bucket is the base drafter's own confidence signal (its report's
``confidence``): for REST and CREST how long a context suffix the retriever matched (long matches are the
reliable ones), for DReSD how many of the nearest neighbours continue with the root token (its neighbours'
continuations are merged into a vote-ranked tree,
``DenseDrafter(merge="votes")``, so that a cut keeps the best-supported nodes). The expectations are learned
counterfactually, like :class:`specnb.drafters.mixed.AdaptiveShapeDrafter`'s: every step's full tree is
scored against the output once the tokens it covers are known, for all budgets at once, whether or not
it was verified. Drafting deterministic tokens, its acceptance is exactly how far it matches the output.

A lookup is not free either (a suffix-array search, an ANN query: a few percent of a step on a CPU), and where
the store has little for the text (a code store under chat prompts) every step pays it for drafts that barely pay
or none. So a looked-up step counts as a miss when its tokens per second, the lookup's measured seconds included,
are not expected to beat a one-token call's by :data:`PAY_MARGIN` (what the cost table cannot resolve: a draft
expected to gain less can cost more); from the second miss in a row the priced drafter skips the next 1, 2, ... up
to :data:`MAX_SKIP` steps' lookups, starting over at the first lookup that pays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from torch import Tensor

from ..core.accept import equals_output, passes_with_ancestors
from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter, Hindsight
from ..core.report import NO_REPORT, Report
from . import Method, crest, dense, rest

BUDGETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MAX_BUCKET = 16  # match lengths above this share a bucket
MAX_SKIP = 4  # the most steps a run of lookups that did not pay makes the priced drafter skip
LOOKUP_WEIGHT = 0.2  # weight of the latest lookup in the running mean of a lookup's seconds
# The gain over a one-token call a lookup must be expected to bring to count as paid: a call of a few tokens costs
# a few percent more than one, and the cost table's 90% intervals there are about that wide, while a drafted step
# also pays acceptance and cache bookkeeping the table does not time (docs/kernels.md)
PAY_MARGIN = 0.05


def accepted_by_budget(draft: Draft, truth: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """Greedy accepted length of the tree's first b nodes against the true next tokens, for each b.

    truth: int [T], the tokens that followed the root. Returns int64 [len(budgets)].
    """
    depth = draft.depth.numpy()  # numpy throughout: a router scores every member's tree at every step
    matched = passes_with_ancestors(draft.parents.numpy(), equals_output(draft.tokens.numpy(), depth, truth))
    best = np.maximum.accumulate(np.where(matched, depth, 0))  # [n]: best of the first i + 1
    return np.where(budgets > 0, best[np.minimum(budgets, best.shape[0]) - 1], 0)  # (budget 0 reads best[-1])


def cut(tree: Draft | None, budget: int) -> Draft | None:
    """The first ``budget`` nodes of a ranked tree (None for budget 0: no draft), marked ``all_rows``: a cut is
    what is expected to pay, so acceptance reads most of its logits rows."""
    return replace(tree.truncate(tree.max_depth, budget), all_rows=True) if budget and tree is not None else None


@dataclass(frozen=True)
class PricedReport(Report):
    """The base drafter's report, the ``bucket`` its step was priced in, the node ``budget`` verified (0: none)
    and its ``expected_rate`` (tokens/s)."""

    base: Report = NO_REPORT
    bucket: int = 0
    budget: int = 0
    expected_rate: float = 0.0


class PricedTreeDrafter(Drafter):
    """Wraps a ranked-tree drafter (REST, CREST, vote-merged DReSD) and verifies the budget with the best
    expected tokens/s.

    cost: a :class:`specnb.core.roofline.CostModel` (``chain_seconds(nodes, context_len)``) of this target.
    shrink: weight of the pooled (all-bucket) estimate in each bucket's estimate.
    Steps are bucketed by the base drafter's report's ``confidence`` (clipped to MAX_BUCKET).
    """

    def __init__(self, base: Drafter, cost: Any, budgets: tuple[int, ...] = BUDGETS, shrink: float = 4.0):
        self.base, self.cost, self.shrink = base, cost, shrink
        self.budgets = np.asarray(budgets, dtype=np.int64)
        self.name = f"{getattr(base, 'name', 'tree')}-priced"
        self.accepted = np.zeros((MAX_BUCKET + 1, self.budgets.shape[0]))  # summed over scored steps
        self.steps = np.zeros(MAX_BUCKET + 1)
        self.hindsight = Hindsight()  # full trees, keyed by bucket
        self._expected: np.ndarray | None = None  # expected() of every bucket until the next scored tree
        self._report = PricedReport()
        self._misses = 0  # lookups in a row that did not pay
        self._skip = 0  # steps left before the next lookup
        self.lookup_seconds = 0.0  # running mean of the base drafter's propose()

    def reset(self, prompt_ids: Tensor) -> None:
        """A new generation; the learned expectations carry over (same task and datastore)."""
        self.base.reset(prompt_ids)
        self.hindsight.reset()
        self._misses = self._skip = 0

    def clear(self) -> None:
        """The base drafter forgets earlier requests; the learned expectations stay."""
        self.base.clear()

    def expected(self, bucket: int) -> np.ndarray:
        """E[accepted tokens] for each budget in ``bucket``, shrunk toward the pooled estimate: [B]."""
        if self._expected is None:  # every bucket's, recomputed only after a tree was scored (routers ask often)
            pooled = self.accepted.sum(0) / max(self.steps.sum(), 1.0)
            self._expected = (self.accepted + self.shrink * pooled) / (self.steps[:, None] + self.shrink)
        return self._expected[bucket]

    def choose(self, bucket: int, nodes: int, context_len: int) -> tuple[int, float]:
        """(budget, expected tokens per second) for a tree of ``nodes`` nodes."""
        usable = self.budgets <= nodes
        seconds = self.cost.chain_seconds(self.budgets, context_len)[usable]
        rate = (1.0 + self.expected(bucket)[usable]) / seconds
        best = int(np.argmax(rate))
        return int(self.budgets[usable][best]), float(rate[best])

    def price(self, state: DecodeState) -> tuple[Draft | None, int, float]:
        """The base drafter's full tree, the budget it should be cut to (0: do not draft) and that budget's
        expected tokens per second; the tree is kept for scoring once its tokens are known."""
        start = time.perf_counter()
        full = self.base.propose(state)
        seconds = time.perf_counter() - start
        self.lookup_seconds += LOOKUP_WEIGHT * (seconds - self.lookup_seconds) if self.lookup_seconds else seconds
        bucket = min(self.base.report.confidence, MAX_BUCKET)
        budget, rate = 0, 0.0
        if full is not None and full.num_nodes:
            self.hindsight.add(state, bucket, full, full.max_depth)
            budget, rate = self.choose(bucket, full.num_nodes, state.tokens.shape[0])
        self._report = PricedReport(self.base.report, bucket, budget, rate)
        return full, budget, rate

    def propose(self, state: DecodeState) -> Draft | None:
        """The priced cut of this step's tree, or None: nothing pays, or this step's lookup is skipped (after
        ``n >= 2`` lookups in a row that did not pay (:meth:`paid`), the next ``min(2 ** (n - 2), MAX_SKIP)``
        steps')."""
        if self._skip:
            self._skip -= 1
            self._report = PricedReport()
            return None
        full, budget, rate = self.price(state)
        self._misses = 0 if self.paid(budget, rate, state.tokens.shape[0]) else self._misses + 1
        self._skip = min(2 ** (self._misses - 2), MAX_SKIP) if self._misses >= 2 else 0
        return cut(full, budget)

    def paid(self, budget: int, rate: float, context_len: int) -> bool:
        """Whether a step's lookup paid for itself: the chosen budget's expected tokens (``rate`` tokens/s over its
        call's seconds) over that call and :attr:`lookup_seconds` beat one token over a one-token call by
        :data:`PAY_MARGIN`."""
        one, call = self.cost.chain_seconds(np.asarray([0, budget]), context_len)
        return budget > 0 and rate * call / (call + self.lookup_seconds) > (1.0 + PAY_MARGIN) / one

    def update(self, committed: Tensor, accepted: Tensor) -> None:
        """Score every pending tree whose covered tokens are now all known."""
        self.base.update(committed, accepted)
        for bucket, tree, truth in self.hindsight.commit(committed):
            self.accepted[bucket] += accepted_by_budget(tree, np.asarray(truth, dtype=np.int64), self.budgets)
            self.steps[bucket] += 1
            self._expected = None

    @property
    def report(self) -> PricedReport:
        return self._report

    @property
    def needs_hidden_state(self) -> bool:
        return self.base.needs_hidden_state

    @property
    def nbytes(self) -> int:
        return self.base.nbytes

    @property
    def needs_logits(self) -> bool:
        return self.base.needs_logits

    def observe(self, tokens: Tensor, logits: Tensor) -> None:
        self.base.observe(tokens, logits)


@dataclass(frozen=True)
class RestPricedOptions(rest.Options):
    """REST's tree cut to the node budget that pays on this machine's roofline (``roofline``: CSV or measured)."""

    roofline: str = ""


@dataclass(frozen=True)
class CrestPricedOptions(crest.Options):
    """CREST's stored tree cut to the node budget that pays."""

    roofline: str = ""


@dataclass(frozen=True)
class DensePricedOptions(dense.Options):
    """DReSD's neighbours merged into one vote-ranked tree of at most k * w nodes, cut to the budget that pays."""

    merge: Literal["rows", "votes"] = "votes"
    roofline: str = ""


def _priced(base: Drafter, target: Any, roofline: str) -> PricedTreeDrafter:
    from ..core.roofline import cached_cost_model

    return PricedTreeDrafter(base, cached_cost_model(target, roofline))


def make_rest(target: Any, options: RestPricedOptions) -> PricedTreeDrafter:
    """The ``rest-priced`` drafter."""
    return _priced(rest.make(target, options), target, options.roofline)


def make_crest(target: Any, options: CrestPricedOptions) -> PricedTreeDrafter:
    """The ``crest-priced`` drafter."""
    return _priced(crest.make(target, options), target, options.roofline)


def make_dense(target: Any, options: DensePricedOptions) -> PricedTreeDrafter:
    """The ``dense-priced`` drafter."""
    return _priced(dense.make(target, options), target, options.roofline)


METHODS = (
    Method("rest-priced", "REST's tree cut to the budget that pays", "REST, priced", RestPricedOptions, make_rest),
    Method("crest-priced", "CREST's tree cut to the budget that pays", "CREST, priced", CrestPricedOptions, make_crest),
    Method("dense-priced", "DReSD vote-merged tree cut to the budget that pays", "DReSD, priced", DensePricedOptions,
           make_dense),
)
