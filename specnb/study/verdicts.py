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
disagrees. A number without an interval (NaN ends) is judged as a point, and says so. An inconclusive verdict
*leans* to the side its interval's centre lies on.

Each comparison also says what kind of test it is, where the claim is written: *internal* (against our own
method, baseline or aim, not a published claim) and *direction only* (it checks only the sign of an effect whose
size the source reports). Every claim of one kind shares one tolerance, named below (:data:`TOLERANCES`), so a
number judged in two notebooks is judged alike.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

Verdict = Literal["agrees", "disagrees", "inconclusive"]
Finding = Literal["higher", "lower", "tie", "unclear"]
Kind = Literal["near", "within", "above", "below"]
Lean = Literal["agrees", "disagrees"]

TIE = 0.02
"""A ratio within 2% of 1 (a difference within 0.02 of 0) is a tie: "A beats B" needs ``> 1 + TIE``."""
PUBLISHED = 0.10
"""A published speedup, size or range: widened by 10% of the published value (the range's mean); papers
report a median or one run, no interval."""
TOKENS_PER_CALL = 0.1
"""A published tokens per call (or its gain): ± 0.1 token per call."""
ACCEPTANCE = 0.1
"""A published acceptance rate: ± 0.1."""
MRR = 0.03
"""A published MRR: ± 0.03 (DReSD Table 1 spreads one store's MRR by about 0.02 over its models)."""
SHARE = 0.05
"""A published share or relative gain (a fraction: variance held, a gain over a baseline): ± 0.05."""
PREDICTION = 0.15
"""A cost model's prediction against the measurement it predicts: within 15%."""
EXACT = 0.0
"""Exact claims (lossless output, replay equal to real decoding): no tolerance."""

TOLERANCES = {"TIE": (TIE, "a ratio within this of 1 (a difference within this of 0) is a tie, not a win"),
              "PUBLISHED": (PUBLISHED, "a published speedup, size or range, widened by this fraction of its "
                                       "value (a range: of its mean)"),
              "TOKENS_PER_CALL": (TOKENS_PER_CALL, "a published tokens per call, ± this many tokens"),
              "ACCEPTANCE": (ACCEPTANCE, "a published acceptance rate, ± this"),
              "MRR": (MRR, "a published MRR, ± this"),
              "SHARE": (SHARE, "a published share or relative gain (a fraction), ± this"),
              "PREDICTION": (PREDICTION, "a cost model's prediction against its measurement, within this fraction"),
              "EXACT": (EXACT, "lossless output and replay equal to real decoding: exact")}
"""Every named tolerance with what it applies to (the front page's notation section lists them)."""


@dataclass(frozen=True)
class Expect:
    """What a claim expects of a quantity.

    kind: ``near`` (``value`` ± ``tolerance``), ``within`` (``[value, high]`` widened by ``tolerance`` on each
    side), ``above`` (more than ``value + tolerance``) or ``below`` (less than ``value - tolerance``).
    ``tolerance`` is in the quantity's units (:meth:`published` builds one from a fraction of a published value).
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
    def published(cls, values: tuple[float, ...] | list[float]) -> Expect:
        """A published number or range (the spread of ``values``, e.g. over a paper's models) widened by
        :data:`PUBLISHED` of their mean: the one band every notebook judging that number uses."""
        low, high = min(values), max(values)
        tolerance = PUBLISHED * abs(sum(values) / len(values))
        return cls.near(low, tolerance) if low == high else cls.within(low, high, tolerance)

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


def lean(low: float, high: float, expect: Expect) -> Lean:
    """The side of ``expect``'s region the centre of [low, high] lies on: ``agrees`` inside, ``disagrees``
    outside (the way an inconclusive verdict leans)."""
    a, b = expect.region
    centre = (low + high) / 2
    inside = a < centre < b if expect.kind in ("above", "below") else a <= centre <= b
    return "agrees" if inside else "disagrees"


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
    internal: bool = False  # against our own method, baseline or aim, not a published claim
    direction_only: bool = False  # checks only the sign of an effect whose size the source reports
    evidence: dict[str, float] = field(default_factory=dict)  # the named quantities the cause cites

    @property
    def verdict(self) -> Verdict:
        low, high = (self.ours, self.ours) if self.point else (self.low, self.high)
        return judge(low, high, self.expect)

    @property
    def point(self) -> bool:
        """No interval: judged as a single number."""
        return math.isnan(self.low) or math.isnan(self.high)

    @property
    def lean(self) -> Lean | None:
        """Which way an inconclusive verdict leans (the side its interval's centre lies on); None otherwise."""
        if self.verdict != "inconclusive" or self.point:  # a point is inconclusive only when it is NaN
            return None
        return lean(self.low, self.high, self.expect)

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
        """The comparison as the results file keeps it: inputs, region, verdict, its lean, finding, the kind of
        test (internal, direction only) and the evidence its cause cites."""
        return {"claim": self.claim, "ours": self.ours, "low": self.low, "high": self.high,
                "expect": {k: v for k, v in asdict(self.expect).items() if v is not None},
                "expected": self.expect.describe(self.fmt), "region": list(self.expect.region),
                "against": self.against, "verdict": self.verdict, "finding": self.finding,
                "measured": self.measured(), "cause": self.cause if self.verdict != "agrees" else "",
                "lean": self.lean, "internal": self.internal, "direction_only": self.direction_only,
                "evidence": dict(self.evidence)}


PAPERS = ("DReSD", "CREST", "N-Grammys", "MCSD")
"""The four papers the study tests, as the ``against`` of their comparisons begins."""


def source(record: dict) -> str:
    """Whose claim a results file's comparison tests: one of :data:`PAPERS`, ``internal`` (our own checks) or
    ``other`` (another published source)."""
    if record.get("internal"):
        return "internal"
    return next((paper for paper in PAPERS if record["against"].startswith(paper)), "other")
