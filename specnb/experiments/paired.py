"""One method against another on the same prompts, as (value, 90% low, 90% high) ready for
:meth:`specnb.study.results.Results.compare`.

Both functions read :func:`specnb.eval.bench.run_bench` rows (timed runs) or
:func:`specnb.experiments.grids.replay_rows` (replayed runs): one row per (method, prompt). They pair the two
methods prompt by prompt and resample prompts (:mod:`specnb.core.metrics`), so a difference shared by every prompt
shows even when the prompts themselves differ a lot.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..core.metrics import bootstrap_interval
from ..eval.runner import RATIOS, ratio_intervals


def versus(rows: pd.DataFrame, method: str, baseline: str, metric: str | tuple[str, str]) -> tuple[float, float, float]:
    """``method``'s ``metric`` over ``baseline``'s on the prompts both ran: (ratio, low, high).

    metric: a name of :data:`specnb.eval.runner.RATIOS` (``tokens_per_s``, ``tokens_per_call``,
    ``accepted_length``: ratios of totals over prompts, as :func:`~specnb.experiments.summarize` computes them)
    or a (numerator, denominator) pair of columns; ``("one", "seconds")`` is the speedup (the baseline's seconds
    over the method's). The interval is :func:`~specnb.eval.runner.ratio_intervals`' (paired by prompt).
    NaN when the two share fewer than two prompts."""
    numerator, denominator = RATIOS[metric] if isinstance(metric, str) else metric
    runs = rows.assign(one=1.0, new_tokens_after_prefill=rows.new_tokens - 1)
    a = runs[runs.method == method].drop_duplicates("prompt_id").set_index("prompt_id")
    b = runs[runs.method == baseline].drop_duplicates("prompt_id").set_index("prompt_id")
    shared = a.index.intersection(b.index)
    if len(shared) < 2:
        return math.nan, math.nan, math.nan
    a, b = a.loc[shared], b.loc[shared]
    with np.errstate(invalid="ignore", divide="ignore"):  # a method that never drafted: NaN, not a warning
        value = np.float64(a[numerator].sum()) / a[denominator].sum() / (np.float64(b[numerator].sum())
                                                                         / b[denominator].sum())
    low, high = ratio_intervals(rows, baseline, metric).get(method, (math.nan, math.nan))
    return float(value), float(low), float(high)


def mean_versus(rows: pd.DataFrame, method: str, baseline: str, column: str) -> tuple[float, float, float]:
    """The mean over prompts of ``method``'s per-prompt ``column`` over the baseline's (e.g. MAR, which its
    definition averages per prompt): (ratio, low, high), on the prompts where both are finite, the 90% interval
    resampling those prompts in pairs (:func:`specnb.core.metrics.bootstrap_interval`)."""
    wide = rows.drop_duplicates(["method", "prompt_id"]).pivot(index="prompt_id", columns="method", values=column)
    pairs = wide[[method, baseline]].astype(float).replace([np.inf, -np.inf], np.nan).dropna()
    a, b = pairs[method].to_numpy(), pairs[baseline].to_numpy()
    if len(a) < 2 or b.mean() == 0:
        return math.nan, math.nan, math.nan
    low, high = bootstrap_interval(lambda x, y, axis=-1: x.mean(axis) / y.mean(axis), a, b)
    return float(a.mean() / b.mean()), low, high


def mean_across(rows: pd.DataFrame, method: str, baseline: str, column: str) -> tuple[float, float, float]:
    """The mean over its prompts of ``method``'s per-prompt ``column`` over the mean over *its own* prompts of the
    baseline's, where the two ran on different prompt sets (MT-Bench against HumanEval), so nothing pairs them:
    (ratio, low, high), non-finite values dropped, the 90% interval resampling each side's prompts on its own
    (:func:`specnb.core.metrics.bootstrap_interval`, unpaired). NaN with fewer than two prompts on a side."""
    def values(name: str) -> np.ndarray:
        per_prompt = rows[rows.method == name].drop_duplicates("prompt_id")[column].astype(float).to_numpy()
        return per_prompt[np.isfinite(per_prompt)]

    a, b = values(method), values(baseline)
    if min(len(a), len(b)) < 2 or b.mean() == 0:
        return math.nan, math.nan, math.nan
    low, high = bootstrap_interval(lambda x, y, axis=-1: x.mean(axis) / y.mean(axis), a, b, paired=False)
    return float(a.mean() / b.mean()), low, high


def difference(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """mean(a - b) over paired samples a, b [n] (queries, prompts): (difference, low, high), the 90% interval
    resampling the pairs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    low, high = bootstrap_interval(lambda x, y, axis=-1: (x - y).mean(axis), a, b)
    return float((a - b).mean()), low, high


FINDING_WORDS = {"higher": "higher", "lower": "lower", "tie": "within the tolerance band (a tie)",
                 "unclear": "unclear (the interval crosses an edge of the band)"}
"""How a conclusion names a comparison's finding (:attr:`specnb.study.verdicts.Comparison.finding`)."""


def findings(report) -> dict[str, str]:
    """{key: words} for every comparison recorded so far in ``report`` (a :class:`specnb.study.results.Results`): where
    our interval sits against the reference, in :data:`FINDING_WORDS`; add it to the results
    (``report.add(finding=findings(report))``) so a template picks its words (``{ours[finding][key]}``) from
    the numbers."""
    return {key: "not measured (no value)" if math.isnan(comparison.ours) else FINDING_WORDS[comparison.finding]
            for key, comparison in report.comparisons.items()}
