"""Mixed strategy (N-Grammys §4.3) and an adaptive draft shape (beyond the paper).

:class:`MixedDrafter` fills the k rows of a k x w batch with context n-gram drafts first (as many as the
context offers, possibly none) and lets the extended model bigram fill the rest. Each call reports how
many rows each strategy got; :func:`accepted_strategy` says which strategy's row the target accepted.

:class:`AdaptiveShapeDrafter` picks (k, w) at every step to maximise expected tokens per second:

    rate(k, w) = E[tokens per call | k, w, bucket] / (T(k, w, context length) + drafting time)

T comes from a roofline table (:mod:`specnb.core.roofline`); E = 1 + sum_{j<=w} S(k, j) where S(k, j) is the
probability that the best of the first k rows matches at least j tokens. S is learned online per
*bucket* (the longest suffix of the context, up to 3 tokens, that occurred before: a long match predicts
long acceptance) from counterfactuals: after a call with shape (k_o, w_o) the committed tokens tell
exactly how many tokens each offered row would have matched, hence the outcome for every smaller shape
(k <= k_o, w <= w_o) - approximately, since a smaller shape's context drafts are the prefixes of the
larger shape's. Unseen cells start from a Beta(1, 1) prior (optimism drives exploration) and each
bucket is shrunk towards the pooled estimate.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from torch import Tensor

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter, Hindsight
from ..core.metrics import CallStats
from ..core.report import Report
from ..datastores.ngram_tables import BigramTable
from ..options import Options, ordered
from . import Method, context
from .context import ContextNgramDrafter, continuations
from .model_ngram import table_for


@dataclass(frozen=True)
class MixedOptions(context.Options):
    """Context n-grams (queries of max_ngram..min_ngram tokens) first, model bigrams fill the remaining rows of a
    k x w batch (k = w = 10, q = 1: the paper's reference shape)."""

    k: int = 10
    max_ngram: int = 1
    bigram_tokens: Literal["default", "all"] = "default"


@dataclass(frozen=True)
class AdaptiveOptions(Options):
    """Mixed drafting with the shape chosen per call from a roofline table (``roofline``: a CSV, or measured once
    and cached)."""

    max_ngram: int = 1
    min_ngram: int = 1
    bigram_tokens: Literal["default", "all"] = "default"
    roofline: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        ordered(self, "min_ngram", "max_ngram")


@dataclass(frozen=True)
class MixedReport(Report):
    """The shape (k, w) proposed and how many of its rows came from the context and from the bigram."""

    k: int = 0
    w: int = 0
    context_rows: int = 0
    bigram_rows: int = 0


@dataclass(frozen=True)
class AdaptiveReport(MixedReport):
    """A mixed report, with the match-length ``bucket`` the shape was chosen for and its ``expected_rate``
    (tokens/s)."""

    bucket: int = 0
    expected_rate: float = 0.0


class MixedDrafter(Drafter):
    """k drafts of up to w tokens: context n-gram continuations first, extended model bigram after.

    Rows ``[0, context_rows)`` come from the context, the rest from the bigram (duplicates of a context
    row are skipped). ``max_ngram`` / ``min_ngram`` are the context query lengths (paper: q = 1).
    """

    name = "mixed"

    def __init__(self, table: BigramTable, k: int = 10, w: int = 10, max_ngram: int = 1, min_ngram: int = 1):
        self.context = ContextNgramDrafter(k=k, w=w, max_ngram=max_ngram, min_ngram=min_ngram)  # checks the values
        if k > table.k_max:
            raise ValueError(f"mixed drafter needs k <= {table.k_max} (the bigram table's rows), got k={k}")
        self.table, self.k, self.w = table, k, w
        self.last_rows: list[list[int]] = []
        self._report = MixedReport()

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def propose(self, state: DecodeState) -> Draft | None:
        return self.propose_shape(state, self.k, self.w)

    def propose_shape(self, state: DecodeState, k: int, w: int) -> Draft | None:
        """The mixed draft of shape (k, w) for this state (None when nothing can be proposed)."""
        w = min(w, state.max_depth)
        self.last_rows = []
        self._report = MixedReport(k, w)
        if w < 1:
            return None
        self.context.k = k
        rows = self.context.candidates(state.tokens.numpy(), w)
        n_context = len(rows)
        bigram = self.table.rows(state.root, k, w)
        if bigram is not None and n_context < k:
            taken = {tuple(r) for r in rows}
            for row in bigram.tolist():
                row = [t for t in row if t >= 0]
                if tuple(row) not in taken:
                    rows.append(row)
                    if len(rows) == k:
                        break
        self.last_rows = rows
        self._report = MixedReport(k, w, n_context, len(rows) - n_context)
        return Draft.from_rows(rows) if rows else None

    @property
    def report(self) -> MixedReport:
        return self._report


def accepted_strategy(call: CallStats) -> str | None:
    """``"context"`` or ``"bigram"``: whose row the accepted path came from (None: nothing accepted).

    A node shared by a context row and a bigram row counts for the context (its row comes first).
    """
    if call.accepted_row is None or not isinstance(call.report, MixedReport):
        return None
    return "context" if call.accepted_row < call.report.context_rows else "bigram"


def accepted_rank(call: CallStats) -> int | None:
    """Rank (0 = best) of the accepted row among its own strategy's rows, or None."""
    strategy = accepted_strategy(call)
    if strategy is None:
        return None
    return call.accepted_row - (0 if strategy == "context" else call.report.context_rows)


# ------------------------------------------------------------------------------------ adaptive shape


def match_lengths(rows: list[list[int]], committed: Tensor | np.ndarray, w: int) -> np.ndarray:
    """How many leading tokens of each row (up to w) equal the committed tokens: int64 [len(rows)]."""
    block = np.full((len(rows), w), -1, dtype=np.int64)
    for r, row in enumerate(rows):
        block[r, :min(w, len(row))] = row[:w]
    truth = np.full(w, -2, dtype=np.int64)
    committed = np.asarray(committed, dtype=np.int64)[:w]
    truth[:committed.shape[0]] = committed
    return np.cumprod(block == truth[None], axis=1).sum(1)


def longest_suffix_match(context: np.ndarray, max_q: int = 3) -> int:
    """Largest q <= max_q such that the context's last q tokens occurred earlier (0 if none)."""
    for q in range(max_q, 0, -1):
        if continuations(context, q, 1):
            return q
    return 0


class ShapeStatistics:
    """Online estimate of S[b, k, j] = P(best of the first k rows matches >= j tokens | bucket b).

    Arrays are [buckets, k_max + 1, w_max + 1]; index 0 of the k and j axes is unused.
    """

    def __init__(self, buckets: int, k_max: int, w_max: int, shrink: float = 2.0):
        self.hits = np.zeros((buckets, k_max + 1, w_max + 1))
        self.trials = np.zeros_like(self.hits)
        self.shrink = shrink

    def observe(self, bucket: int, matches: np.ndarray, w: int) -> None:
        """Record one call: ``matches`` [k_o] per-row match lengths of the offered rows, depth ``w``."""
        k_max, w_max = self.hits.shape[1] - 1, self.hits.shape[2] - 1
        best = np.maximum.accumulate(matches)[:k_max]  # [k]: best of the first k rows
        w = min(w, w_max)
        reached = best[:, None] >= np.arange(1, w + 1)[None]  # [k, w]
        self.hits[bucket, 1:best.shape[0] + 1, 1:w + 1] += reached
        self.trials[bucket, 1:best.shape[0] + 1, 1:w + 1] += 1

    def survival(self, bucket: int) -> np.ndarray:
        """S estimate [k_max + 1, w_max + 1], non-increasing in j and non-decreasing in k."""
        pooled = (self.hits.sum(0) + 1) / (self.trials.sum(0) + 2)  # Beta(1, 1) prior
        s = (self.hits[bucket] + self.shrink * pooled) / (self.trials[bucket] + self.shrink)
        s[0, :], s[:, 0] = 0.0, 1.0  # k = 0 offers nothing; every row "matches" 0 tokens
        s = np.minimum.accumulate(s, axis=1)  # a match of j tokens implies one of j - 1
        return np.maximum.accumulate(s, axis=0)  # more rows never hurt

    def expected_tokens(self, bucket: int) -> np.ndarray:
        """E[tokens per call] for every (k, w): 1 + sum_{j<=w} S(k, j), shape [k_max + 1, w_max + 1]."""
        s = self.survival(bucket)
        s[:, 0] = 0.0
        return 1.0 + np.cumsum(s, axis=1)


class AdaptiveShapeDrafter(Drafter):
    """Wraps a :class:`MixedDrafter`, choosing (k, w) per step from a cost model and learned acceptance.

    cost: any object with ``shapes`` (int [S, 2] of (k, w)) and ``seconds(context_len) -> float [S]``
    (e.g. :class:`specnb.core.roofline.CostModel`). Shapes with w = 0 mean "no draft".

    Acceptance is learned *counterfactually*: at every step the drafter also builds the largest draft it
    could offer (a shadow, never verified) and, once the output has moved ``w_max`` tokens past that step,
    scores each shadow row against what was actually generated. A draft of deterministic tokens is accepted
    exactly as far as it equals the output (greedy, and in distribution when sampling), so this is what
    verification would have reported, and it keeps learning while the chosen shape is "no draft".
    """

    name = "mixed-adaptive"

    def __init__(self, base: MixedDrafter, cost, max_q: int = 3):
        self.base, self.cost, self.max_q = base, cost, max_q
        shapes = np.asarray(cost.shapes)
        self._usable = shapes[:, 0] <= base.table.k_max  # the table cannot offer more rows than k_max
        self.shapes = shapes[self._usable]
        self.stats = ShapeStatistics(max_q + 1, int(self.shapes[:, 0].max()), max(1, int(self.shapes[:, 1].max())))
        self.draft_seconds = 0.0  # running mean of our own proposal time
        self._shadow_shape = (int(self.shapes[:, 0].max()), self.stats.hits.shape[2] - 1)
        self.hindsight = Hindsight()  # shadow rows, keyed by bucket
        self._report = AdaptiveReport()

    @property
    def nbytes(self) -> int:
        return self.base.nbytes

    def reset(self, prompt_ids: Tensor) -> None:
        """A new generation. Acceptance statistics carry over between prompts on purpose (the task rarely
        changes); shadows still waiting for their tokens are dropped."""
        self.hindsight.reset()

    def choose(self, bucket: int, context_len: int, max_depth: int) -> tuple[tuple[int, int], float]:
        """The (k, w) with the highest expected tokens/s, and that rate (tokens per second)."""
        expected = self.stats.expected_tokens(bucket)
        ks, ws = self.shapes[:, 0], np.minimum(self.shapes[:, 1], max_depth)
        seconds = self.cost.seconds(context_len)[self._usable]
        rate = expected[ks, ws] / (seconds + np.where(ws > 0, self.draft_seconds, 0.0))
        best = int(np.argmax(rate))
        return (int(ks[best]), int(ws[best])), float(rate[best])

    def propose(self, state: DecodeState) -> Draft | None:
        context = state.tokens.numpy()
        bucket = longest_suffix_match(context, self.max_q)
        k_max, w_max = self._shadow_shape
        self.base.propose_shape(dataclasses.replace(state, max_depth=w_max), k_max, w_max)
        if self.base.last_rows:  # scored once the w_max tokens after the root are known
            self.hindsight.add(state, bucket, self.base.last_rows, w_max)
        (k, w), rate = self.choose(bucket, context.shape[0], state.max_depth)
        start = time.perf_counter()
        draft = self.base.propose_shape(state, k, w) if w > 0 else None
        if draft is not None:
            self.draft_seconds = 0.9 * self.draft_seconds + 0.1 * (time.perf_counter() - start)
        base = self.base.report
        self._report = AdaptiveReport(k, w, base.context_rows, base.bigram_rows, bucket, rate)
        return draft

    def update(self, committed: Tensor, accepted: Tensor) -> None:
        """Score every shadow whose next ``w_max`` tokens are now known."""
        w_max = self._shadow_shape[1]
        for bucket, rows, truth in self.hindsight.commit(committed):
            self.stats.observe(bucket, match_lengths(rows, np.asarray(truth), w_max), w_max)

    @property
    def report(self) -> AdaptiveReport:
        return self._report


# ----------------------------------------------------------------------------------------- factories


def make_mixed(target: Any, options: MixedOptions) -> MixedDrafter:
    """The ``mixed`` drafter."""
    return MixedDrafter(table_for(target, options.bigram_tokens, options.k), k=options.k, w=options.w,
                        max_ngram=options.max_ngram, min_ngram=options.min_ngram)


def make_adaptive(target: Any, options: AdaptiveOptions) -> AdaptiveShapeDrafter:
    """The ``mixed-adaptive`` drafter: the roofline table of this model/dtype drives the shape choice."""
    from ..core.roofline import cached_cost_model

    base = MixedDrafter(table_for(target, options.bigram_tokens), k=1, w=1, max_ngram=options.max_ngram,
                        min_ngram=options.min_ngram)
    return AdaptiveShapeDrafter(base, cached_cost_model(target, options.roofline))


METHODS = (
    Method("mixed", "context n-grams, then model bigrams (N-Grammys)", "mixed", MixedOptions, make_mixed,
           routable=True),
    Method("mixed-adaptive", "mixed, its shape chosen per call from the roofline", "mixed, adaptive", AdaptiveOptions,
           make_adaptive),
)
