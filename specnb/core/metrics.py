"""Run statistics and the metric definitions used by every notebook and the bench.

Definitions, the only ones every notebook and the bench use, computed from per-call records after prefill:

* **tokens per call** (block efficiency): new tokens / target forward calls after prefill. The token
  produced by prefill is not counted, so AR decoding has exactly 1.0.
* **accepted length**: accepted draft tokens per call (= tokens per call - 1).
* **acceptance rate** (MAR in DReSD): accepted draft tokens / draft depth offered, per call; averaged over
  the calls that offered a draft, then over prompts. The denominator is the *depth* (longest path),
  not the number of nodes: a 10 x 10 batch fully accepted along one row scores 1.0.
* **step acceptance rate** (MCSD): accepted draft tokens / (accepted + rejected draft steps). Levels are
  verified one after another, so a call that stops short of its draft depth had exactly one rejected step.
* **speedup**: AR wall time / method wall time, same process, same prompts and max tokens, after warm-up.
* **storage**: bytes on disk of everything a drafter needs at run time (:func:`specnb.datastores.rest.disk_bytes`).
* **tokens/s**: new tokens (prefill's included) / wall time including prefill.
* **interval** of a ratio of two methods' tokens/s (a speedup): the central 90% of the ratio over bootstrap
  resamples of the prompts, each prompt's two runs kept together (:func:`rate_ratio_interval`). It shows how
  much the ratio owes to which prompts ran, and to timing noise that differs between prompts; it does not
  cover noise shared by the whole run (a slow minute of the machine hits every method of those prompts).
  A metric of one method (tokens per call, accepted length, tokens/s: a ratio of sums over prompts) gets the
  same kind of interval (:func:`ratio_interval`), and so does a mean over prompts (:func:`mean_interval`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .report import NO_REPORT, Report


@dataclass
class CallStats:
    """One target forward call after prefill. Times are in seconds."""

    drafted_nodes: int  # nodes in the (truncated) draft tree
    draft_depth: int  # depth of the deepest node
    accepted: int  # draft tokens accepted
    new_tokens: int  # tokens committed (accepted + bonus, cut at EOS)
    draft_seconds: float  # time in drafter.propose
    verify_seconds: float  # the target call: its forward pass and the output head rows acceptance read
    overhead_seconds: float  # acceptance, KV bookkeeping, drafter.update
    accepted_row: int | None = None  # which of the drafter's rows the accepted path came from
    rows_read: int | None = None  # the highest logits row acceptance read, plus one (the root's row is 0)
    all_rows: bool = False  # the draft asked for every logits row at once (Draft.all_rows)
    report: Report = NO_REPORT  # what the drafter said of its proposal


@dataclass
class RunStats:
    """All calls of one generation plus its wall times (seconds)."""

    prompt_tokens: int = 0
    calls: list[CallStats] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def new_tokens(self) -> int:
        """All generated tokens, the one from prefill included."""
        return 1 + sum(c.new_tokens for c in self.calls)

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_call(self) -> float:
        """Block efficiency: tokens committed per target call after prefill."""
        return sum(c.new_tokens for c in self.calls) / max(1, self.num_calls)

    @property
    def accepted_length(self) -> float:
        """Accepted draft tokens per call."""
        return sum(c.accepted for c in self.calls) / max(1, self.num_calls)

    @property
    def acceptance_rate(self) -> float:
        """Mean over calls that offered a draft of accepted / draft depth (NaN if no draft was offered)."""
        rates = [c.accepted / c.draft_depth for c in self.calls if c.draft_depth > 0]
        return sum(rates) / len(rates) if rates else float("nan")

    @property
    def rejected_steps(self) -> int:
        """Calls that stopped short of the draft depth they offered (one rejected draft step each)."""
        return sum(c.accepted < c.draft_depth for c in self.calls)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("nan")

    @property
    def verify_seconds(self) -> float:
        return sum(c.verify_seconds for c in self.calls)

    @property
    def draft_seconds(self) -> float:
        return sum(c.draft_seconds for c in self.calls)

    @property
    def outside_forward_fraction(self) -> float:
        """Share of decode wall time spent outside the target's forward calls (drafting, acceptance, KV)."""
        if self.decode_seconds <= 0:
            return float("nan")
        return 1.0 - self.verify_seconds / self.decode_seconds

    def summary(self) -> dict[str, float]:
        """The headline numbers of this run as a flat dict."""
        return {
            "new_tokens": self.new_tokens,
            "calls": self.num_calls,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_second,
            "tokens_per_call": self.tokens_per_call,
            "accepted_length": self.accepted_length,
            "acceptance_rate": self.acceptance_rate,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "outside_forward_fraction": self.outside_forward_fraction,
        }


def first_divergence(reference: list[int], other: list[int]) -> int | None:
    """Index of the first position where two token lists differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


def bootstrap_interval(statistic, *samples: np.ndarray, level: float = 0.9,
                       resamples: int = 2000, paired: bool = True) -> tuple[float, float]:
    """(low, high): the ``level`` percentile bootstrap interval of ``statistic(*samples, axis=-1)`` (vectorised
    over resamples), resampling the prompts (the entries of every sample together: paired). Seeded, so a
    summary is reproducible; (NaN, NaN) with fewer than two prompts (in any sample) or a statistic that is NaN on
    the data. An interval of identical values is (value, value). ``paired=False``: samples of different prompts
    (two prompt sets, possibly of different sizes), each resampled on its own."""
    from scipy import stats  # here, not at the top: slow to import, and only summaries need it

    arrays = [np.asarray(a, dtype=np.float64) for a in samples]
    if min(a.shape[0] for a in arrays) < 2:
        return float("nan"), float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        value = statistic(*arrays, axis=-1)
        if not np.isfinite(value):
            return float("nan"), float("nan")
        if all(np.all(a == a[0]) for a in arrays):  # no spread: scipy would warn about a degenerate sample
            return float(value), float(value)
        result = stats.bootstrap(arrays, statistic, paired=paired, vectorized=True, n_resamples=resamples,
                                 confidence_level=level, method="percentile", rng=np.random.default_rng(0))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def ratio_interval(numerator: np.ndarray, denominator: np.ndarray, level: float = 0.9) -> tuple[float, float]:
    """The interval of sum(numerator) / sum(denominator) over prompts ([P] each, paired): tokens per call
    (new tokens after prefill / calls), accepted length (accepted / calls), tokens/s (tokens / seconds)."""
    return bootstrap_interval(lambda n, d, axis=-1: n.sum(axis) / d.sum(axis), numerator, denominator, level=level)


def mean_interval(values: np.ndarray, level: float = 0.9) -> tuple[float, float]:
    """The interval of the mean over prompts of ``values`` [P] (NaN entries dropped)."""
    values = np.asarray(values, dtype=np.float64)
    return bootstrap_interval(lambda v, axis=-1: v.mean(axis), values[np.isfinite(values)], level=level)


def rate_ratio_interval(tokens: np.ndarray, seconds: np.ndarray, base_tokens: np.ndarray, base_seconds: np.ndarray,
                        level: float = 0.9, resamples: int = 2000) -> tuple[float, float]:
    """(low, high): the ``level`` percentile bootstrap interval of a method's tokens/s over a baseline's,
    (sum tokens / sum seconds) / (sum base_tokens / sum base_seconds), resampling prompts with replacement.

    All four arrays are [P], one entry per prompt, in the same prompt order (paired: a resample keeps each
    prompt's two runs together). With equal token counts the ratio is the speedup, sum base_seconds / sum
    seconds. Seeded, so a summary is reproducible; (NaN, NaN) with fewer than two prompts.
    """
    def ratio(t, s, bt, bs, axis=-1):
        return t.sum(axis) / s.sum(axis) / (bt.sum(axis) / bs.sum(axis))

    return bootstrap_interval(ratio, tokens, seconds, base_tokens, base_seconds, level=level, resamples=resamples)
