"""Verdicts computed from numbers and their intervals: *agrees*, *disagrees* or *inconclusive*, never typed.

A comparison states what would have to hold for a claim to be true, as a region of the measured quantity
(:class:`Expect`): near a paper's value, inside a paper's range, above or below a reference. The tolerance
widens (near, within) or moves (above, below) the region's edges by an amount written next to the verdict, so
a reader sees what counted as agreement. Our number comes with its 90% interval (bootstrap over prompts,
:mod:`specnb.core.metrics`):

* **agrees** when the whole interval lies inside the region,
* **disagrees** when the whole interval lies outside it,
* **inconclusive** otherwise: the interval straddles an edge, so more prompts (or a quieter machine) decide.

Relative to its reference value a number is also *higher*, *lower* or a *tie* (its interval inside the
tolerance band around the reference), or *unclear*; a claim that one thing beats another, measured as a tie,
disagrees. A number without an interval (NaN ends) is judged as a point, and says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

Verdict = Literal["agrees", "disagrees", "inconclusive"]
Finding = Literal["higher", "lower", "tie", "unclear"]
Kind = Literal["near", "within", "above", "below"]


@dataclass(frozen=True)
class Expect:
    """What a claim expects of a quantity.

    kind: ``near`` (``value`` ± ``tolerance``), ``within`` (``[value, high]`` widened by ``tolerance`` on each
    side), ``above`` (more than ``value + tolerance``) or ``below`` (less than ``value - tolerance``).
    ``tolerance`` is in the quantity's units (:meth:`relative` builds one from a fraction of the value).
    """

    kind: Kind
    value: float
    tolerance: float = 0.0
    high: float | None = None

    @classmethod
    def near(cls, value: float, tolerance: float) -> Expect:
        return cls("near", value, tolerance)

    @classmethod
    def within(cls, low: float, high: float, tolerance: float = 0.0) -> Expect:
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        return cls("within", low, tolerance, high)

    @classmethod
    def above(cls, value: float, tolerance: float = 0.0) -> Expect:
        return cls("above", value, tolerance)

    @classmethod
    def below(cls, value: float, tolerance: float = 0.0) -> Expect:
        return cls("below", value, tolerance)

    @classmethod
    def relative(cls, kind: Kind, value: float, fraction: float, high: float | None = None) -> Expect:
        """``kind`` with a tolerance of ``fraction`` of ``value`` (e.g. 0.1: within 10%)."""
        return cls(kind, value, abs(value) * fraction, high)

    @property
    def region(self) -> tuple[float, float]:
        """(low, high) edges of the values for which the claim holds (open ends as ±inf)."""
        t = self.tolerance
        if self.kind == "near":
            return self.value - t, self.value + t
        if self.kind == "within":
            return self.value - t, (self.high if self.high is not None else self.value) + t
        if self.kind == "above":
            return self.value + t, math.inf
        return -math.inf, self.value - t

    def describe(self, fmt: str = ".3g") -> str:
        """The expectation in words: ``≈ 2.5 ± 0.25``, ``in 10.6–13.5 (± 1)``, ``> 1 + 0.05``."""
        v, t = format(self.value, fmt), format(self.tolerance, fmt)
        if self.kind == "near":
            return f"≈ {v} ± {t}"
        if self.kind == "within":
            band = f"{v}–{format(self.high, fmt)}"
            return f"in {band}" + (f" (± {t})" if self.tolerance else "")
        sign = ">" if self.kind == "above" else "<"
        return f"{sign} {v}" + (f" {'+' if sign == '>' else '−'} {t}" if self.tolerance else "")


def judge(low: float, high: float, expect: Expect) -> Verdict:
    """The verdict of an interval [low, high] (a point when both are the same number) against ``expect``."""
    if any(math.isnan(x) for x in (low, high)):
        return "inconclusive"
    lo, hi = sorted((low, high))
    a, b = expect.region
    if a <= lo and hi <= b and not (expect.kind == "above" and lo == a) and not (expect.kind == "below" and hi == b):
        return "agrees"
    if hi < a or lo > b or (expect.kind == "above" and hi <= a) or (expect.kind == "below" and lo >= b):
        return "disagrees"
    return "inconclusive"


def finding(low: float, high: float, reference: float, tolerance: float) -> Finding:
    """Where [low, high] sits against ``reference``: ``tie`` inside reference ± tolerance, ``higher`` /
    ``lower`` wholly beyond it, ``unclear`` across an edge (or without an interval)."""
    if any(math.isnan(x) for x in (low, high, reference)):
        return "unclear"
    lo, hi = sorted((low, high))
    if reference - tolerance <= lo and hi <= reference + tolerance:
        return "tie"
    if lo > reference + tolerance:
        return "higher"
    if hi < reference - tolerance:
        return "lower"
    return "unclear"


@dataclass
class Comparison:
    """One comparison a conclusion makes, with everything its verdict was computed from."""

    claim: str  # what is compared, in words ("CREST storage saving over REST, code")
    ours: float
    low: float  # the ends of our 90% interval; NaN when there is none (a single deterministic number)
    high: float
    expect: Expect
    against: str  # whose claim: "CREST Table 2", "pld (ours)", ...
    cause: str = ""  # the most likely cause of a disagreement, in one line
    fmt: str = ".3g"

    @property
    def verdict(self) -> Verdict:
        low, high = (self.ours, self.ours) if self.point else (self.low, self.high)
        return judge(low, high, self.expect)

    @property
    def point(self) -> bool:
        """No interval: judged as a single number."""
        return math.isnan(self.low) or math.isnan(self.high)

    @property
    def finding(self) -> Finding:
        low, high = (self.ours, self.ours) if self.point else (self.low, self.high)
        reference = self.expect.value if self.expect.kind != "within" else \
            (self.expect.value + (self.expect.high or self.expect.value)) / 2
        tolerance = self.expect.tolerance if self.expect.kind != "within" else \
            ((self.expect.high or self.expect.value) - self.expect.value) / 2 + self.expect.tolerance
        return finding(low, high, reference, tolerance)

    def measured(self) -> str:
        """``1.23 (0.98–1.41)``, or ``1.23 (one number, no interval)``."""
        f = self.fmt
        if self.point:
            return f"{self.ours:{f}} (no interval)"
        return f"{self.ours:{f}} ({self.low:{f}}–{self.high:{f}})"

    def record(self) -> dict:
        """The comparison as the results file keeps it: inputs, region, verdict and finding."""
        return {"claim": self.claim, "ours": self.ours, "low": self.low, "high": self.high,
                "expect": {k: v for k, v in asdict(self.expect).items() if v is not None},
                "expected": self.expect.describe(self.fmt), "region": list(self.expect.region),
                "against": self.against, "verdict": self.verdict, "finding": self.finding,
                "measured": self.measured(), "cause": self.cause if self.verdict != "agrees" else ""}
