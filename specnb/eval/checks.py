"""Numbers that cannot be true, stopped before they are plotted or concluded from.

Each rule raises :class:`DegenerateData` with what was seen, so a notebook run (smoke or quick) fails at the
cell that produced the number instead of publishing it:

* :func:`check_partial_acceptance`: at temperature > 0 a drafter that is not the target has some draft tokens
  rejected; one that accepts every one of so many drafted tokens that even a draft agreeing with the target
  99% of the time would almost never do it is the target itself (or its acceptance is computed wrong).
* :func:`check_varies`: a figure that compares a series needs the series to vary; a constant or all-zero one
  is a sentence, not a plot.
* :func:`check_effect`: a conclusion that claims an effect needs an interval narrower than the effect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

PLAUSIBLE_RATE = 0.99  # the most a draft that is not the target is assumed to accept per drafted token
CHANCE = 0.01  # full acceptance less likely than this, for such a draft, is refused


class DegenerateData(ValueError):
    """A number a notebook was about to plot or conclude from cannot be true (or says nothing)."""


def check_partial_acceptance(rows: pd.DataFrame, temperature: float, *, exempt: Iterable[str] = ("ar",),
                             plausible_rate: float = PLAUSIBLE_RATE, chance: float = CHANCE) -> None:
    """Raise when, at ``temperature`` > 0, a method accepted every token it drafted, over so many drafted tokens
    that a draft accepting each with probability ``plausible_rate`` would do so with probability below
    ``chance`` (0.99^459 < 1%: 459 tokens at the defaults).

    rows: :func:`specnb.eval.bench.run_bench` rows (``method``, ``accepted``, ``draft_depth``) of one temperature,
    pooled over prompts; ``exempt`` methods (AR, a runner that reports no acceptance) are not judged. Greedy runs
    (temperature 0) are not judged either: a deterministic drafter copying a repetitive output can be right
    every time. A close pair (a draft accepting 95% of tokens, many candidates per level) passes a short run.
    """
    if temperature <= 0 or not {"accepted", "draft_depth"} <= set(rows.columns):
        return
    skip = set(exempt)
    for method, group in rows.groupby("method", sort=False):
        if method in skip or group.draft_depth.isna().all():
            continue
        depth, accepted = group.draft_depth.sum(), group.accepted.sum()
        if depth > 0 and accepted >= depth and plausible_rate ** depth < chance:
            raise DegenerateData(
                f"{method} accepted every one of its {int(depth)} drafted tokens at temperature {temperature:g}: "
                f"a draft agreeing with the target {plausible_rate:.0%} of the time would do that with probability "
                f"{plausible_rate ** depth:.1e}; only a draft that is the target does it (is it?)")


def check_varies(values: Iterable[float] | np.ndarray, what: str) -> None:
    """Raise when the finite ``values`` of a series to compare are all equal (all zero included) or fewer than
    two: say it in a sentence instead of plotting it."""
    finite = np.asarray([v for v in np.ravel(np.asarray(values, dtype=float)) if math.isfinite(v)])
    if finite.size < 2:
        raise DegenerateData(f"{what}: {finite.size} finite value(s), nothing to compare")
    if np.all(finite == finite[0]):
        kind = "all zero" if finite[0] == 0 else f"constant at {finite[0]:.4g}"
        raise DegenerateData(f"{what}: {finite.size} values, {kind}; write a sentence instead of a figure")


def varies(values: Iterable[float] | np.ndarray) -> bool:
    """Whether :func:`check_varies` would pass: at least two finite values, not all equal."""
    try:
        check_varies(values, "")
    except DegenerateData:
        return False
    return True


def check_effect(effect: float, low: float, high: float, what: str) -> None:
    """Raise when the interval [low, high] of a claimed ``effect`` is wider than the effect itself (or missing):
    the claim would rest on noise."""
    if any(math.isnan(x) for x in (effect, low, high)):
        raise DegenerateData(f"{what}: an effect of {effect:.4g} claimed without an interval")
    if high - low > abs(effect):
        raise DegenerateData(f"{what}: the claimed effect {effect:+.4g} is smaller than its 90% interval's width "
                             f"({low:.4g} to {high:.4g}); report it as inconclusive")
