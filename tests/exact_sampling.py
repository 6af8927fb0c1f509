"""A distribution test of sampled speculative decoding at several positions of a block, against the target's
exact conditional distributions (tests/test_sampling_positions.py, and ``sampling_matches_ar`` for suffix, recycle,
auto and fixed drafts).

:func:`sample_and_test` samples ``runs`` generations of ``POSITIONS + 1`` tokens through the speculative loop
(token 0 comes from the prefill, tokens 1..POSITIONS from speculative calls, where drafts are accepted and rejected
at several depths) and tests tokens 1..POSITIONS against the target's *exact* conditional distributions: for
every run and position, the target's probabilities given the prompt and the tokens sampled before (one fresh
causal call per distinct sequence; temperature and top-p applied by this file's own code, not
:mod:`specnb.core.sampling`). A token outside the target's top-p set fails at once. Otherwise each sampled token is
classed by its rank under its exact distribution (1st, 2nd, 3rd, any other); under the null each class indicator
less its probability is a martingale difference, so per position the observed minus expected class counts have
the covariance ``sum_i diag(pi_i) - pi_i pi_i^T`` and their Mahalanobis norm is chi-square with 3 degrees of
freedom. Two statistics: the sum over positions (df ``3 * POSITIONS``: a deviation at any one position) and the
classes pooled over positions (df 3: a small deviation common to all positions). Either below ``ALPHA / 2`` fails.

Power (scipy's noncentral chi-square, :func:`detectable_shift`): with 300 runs and 4 positions, each statistic
tested at ALPHA / 2 = 5e-5, a deviation is caught with probability 0.9 once its noncentrality reaches 34.2
(pooled, df 3) or 46.9 (by position, df 12). Probability ``delta`` moved between the likeliest two classes
(p0, p1) has noncentrality ``n delta^2 (1/p0 + 1/p1)``: for the tiny models' typical p0 = 0.4, p1 = 0.15 (0.6,
0.2), the pooled statistic (n = 1200) detects delta = 0.056 (0.065) at every speculative position, the
by-position one (n = 300) delta = 0.13 (0.15) at a single position. Callers also assert that many draft tokens
were accepted past the first speculative position, so the power is spent on speculative tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from specnb.core.drafter import Drafter
from specnb.core.generate import generate
from specnb.model.forward import forward

RUNS = 300
POSITIONS = 4  # speculative positions tested: tokens 1..4
ALPHA = 1e-4
CLASSES = 4  # rank 1, 2, 3, any other
SHORT = [256, 5, 6, 7]
LONG = [256, *range(60, 80)]  # 21 tokens: past the tiny Gemma's window (16)


def exact_probabilities(logits: torch.Tensor, temperature: float, top_p: float) -> np.ndarray:
    """float64 [V]: softmax(logits / T), cut to the smallest set of most likely tokens whose mass reaches top_p
    (the token crossing it kept), renormalised. Written here independently of specnb.core.sampling."""
    p = torch.softmax(logits.double() / temperature, -1).numpy()
    order = np.argsort(-p, kind="stable")
    above = np.cumsum(p[order]) - p[order]  # mass strictly before each token in rank order
    keep = np.zeros_like(p, dtype=bool)
    keep[order[above < top_p]] = True
    p = np.where(keep, p, 0.0)
    return p / p.sum()


@dataclass
class Result:
    """Both p-values, the accepted draft tokens beyond the first speculative position, and the classes seen."""

    pvalue_by_position: float
    pvalue_pooled: float
    deep_accepts: int
    observed: np.ndarray


def rank_classes(p: np.ndarray, token: int) -> tuple[int, np.ndarray]:
    """(class of ``token``, class probabilities [CLASSES]) under ``p``: rank 0, 1, 2, or any other."""
    order = np.argsort(-p, kind="stable")
    rank = int(np.nonzero(order == token)[0][0])
    pi = np.append(p[order[:CLASSES - 1]], p[order[CLASSES - 1:]].sum())
    return min(rank, CLASSES - 1), pi


def mahalanobis(observed: np.ndarray, expected: np.ndarray, covariance: np.ndarray) -> tuple[float, int]:
    """(statistic, degrees of freedom) of observed - expected under ``covariance`` (pseudo-inverse)."""
    rank = np.linalg.matrix_rank(covariance, tol=1e-9)
    diff = observed - expected
    return float(diff @ np.linalg.pinv(covariance, rcond=1e-9) @ diff), int(rank)


def sample_and_test(target, prompt: list[int], make_drafter: Callable[[], Drafter | None], *, temperature: float = 1.0,
                    top_p: float = 1.0, verify: str = "tree", runs: int = RUNS) -> Result:
    """Sample ``runs`` speculative generations and test their tokens 1..POSITIONS against the exact conditionals."""
    samples, deep = [], 0
    for seed in range(runs):
        out = generate(target, prompt, make_drafter(), max_new_tokens=POSITIONS + 1, temperature=temperature,
                       top_p=top_p, verify=verify, seed=seed, stop_at_eos=False)
        samples.append(tuple(out.tokens))
        depth = 1  # tokens produced so far (the prefill's)
        for call in out.stats.calls:  # accepted nodes that landed on position 2 or later
            deep += sum(1 for i in range(call.accepted) if depth + i >= 2)
            depth += call.new_tokens

    @functools.cache
    def conditionals(sequence: tuple[int, ...]) -> np.ndarray:
        """float64 [POSITIONS + 1, V]: the target's exact distributions of each token of ``sequence``."""
        with torch.inference_mode():
            logits = forward(target, torch.tensor([prompt + list(sequence[:-1])]))[0][0, len(prompt) - 1:]
        return np.stack([exact_probabilities(row.float(), temperature, top_p) for row in logits])

    observed = np.zeros((POSITIONS, CLASSES))
    expected = np.zeros((POSITIONS, CLASSES))
    covariance = np.zeros((POSITIONS, CLASSES, CLASSES))
    for sequence in samples:
        probs = conditionals(sequence)
        for j in range(1, POSITIONS + 1):
            p = probs[j]
            assert p[sequence[j]] > 0, f"position {j}: token {sequence[j]} is outside the target's top-p set"
            cls, pi = rank_classes(p, sequence[j])
            observed[j - 1, cls] += 1
            expected[j - 1] += pi
            covariance[j - 1] += np.diag(pi) - np.outer(pi, pi)
    per = [mahalanobis(observed[j], expected[j], covariance[j]) for j in range(POSITIONS)]
    by_position = float(stats.chi2.sf(sum(s for s, _ in per), sum(d for _, d in per)))
    pooled_stat, pooled_df = mahalanobis(observed.sum(0), expected.sum(0), covariance.sum(0))
    return Result(by_position, float(stats.chi2.sf(pooled_stat, pooled_df)), deep, observed)


def detectable_shift(n: int, df: int, p0: float, p1: float, power: float = 0.9, alpha: float = ALPHA / 2) -> float:
    """The probability moved between two classes (p0, p1) that a chi-square test of ``df`` degrees of freedom on
    ``n`` observations detects with ``power``: the noncentrality lambda = n delta^2 (1/p0 + 1/p1) it needs."""
    critical = stats.chi2.isf(alpha, df)
    lam = 0.0
    while stats.ncx2.sf(critical, df, lam + 1e-9) < power:
        lam += 0.1
    return float(np.sqrt(lam / n / (1 / p0 + 1 / p1)))


def assert_matches(result: Result, min_deep: int) -> None:
    """Both p-values above ALPHA / 2, and at least ``min_deep`` draft tokens accepted past position 1."""
    assert result.deep_accepts >= min_deep, f"only {result.deep_accepts} accepted tokens past position 1"
    assert result.pvalue_by_position > ALPHA / 2, result
    assert result.pvalue_pooled > ALPHA / 2, result


