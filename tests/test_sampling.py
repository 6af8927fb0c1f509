"""Multi-candidate speculative sampling (MCSS) preserves the target distribution.

Statistical tests with fixed seeds: 100k independent MCSS problems per case on toy (p, q) pairs, checked
with a chi-square goodness-of-fit test against p; a deliberately broken variant must fail the same test.
End to end on a tiny model (``mcsd`` at several temperatures and schemes, four positions of a block against the
target's exact distributions): tests/test_sampling_positions.py.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specnb.core.accept import CandidateDraft, _normalise, accept_mcss, mcss
from specnb.core.draft import Draft
from specnb.core.sampling import SamplingConfig

DRAWS = 100_000
ALPHA = 1e-4  # p-value below which a distribution test fails


def _dist(*weights: float) -> torch.Tensor:
    w = torch.tensor(weights, dtype=torch.float32)
    return w / w.sum()


PAIRS = {  # name: (p, q) over a vocabulary of 8
    "equal": (_dist(4, 3, 2, 1, 1, 1, 0, 0), _dist(4, 3, 2, 1, 1, 1, 0, 0)),
    "disjoint": (_dist(5, 3, 2, 0, 0, 0, 0, 0), _dist(0, 0, 0, 1, 1, 1, 1, 1)),
    "overlap": (_dist(1, 2, 3, 4, 0, 0, 1, 0), _dist(4, 3, 2, 1, 1, 1, 0, 1)),
    "peaked-q": (_dist(1, 1, 1, 1, 1, 1, 1, 1), _dist(20, 1, 1, 0, 0, 0, 0, 0)),
    "peaked-p": (_dist(30, 1, 0, 0, 1, 0, 0, 0), _dist(1, 1, 1, 1, 1, 1, 1, 1)),
}


def _candidates(q: torch.Tensor, k: int, replacement: bool, generator: torch.Generator) -> torch.Tensor:
    """[DRAWS, k'] candidates from q (k' = k, or q's support size without replacement if smaller)."""
    if not replacement:
        k = min(k, int((q > 0).sum()))
    return torch.multinomial(q.expand(DRAWS, -1), k, replacement=replacement, generator=generator)


def _run(p: torch.Tensor, q: torch.Tensor, k: int, replacement: bool, seed: int = 0,
         bonus_from_p: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Emitted tokens [DRAWS] and acceptance flags [DRAWS] of MCSS on DRAWS independent problems.

    ``bonus_from_p`` is the deliberately broken variant: after rejecting every candidate it emits a fresh
    draw from p instead of the residual, which over-weights the tokens the draft already proposed."""
    generator = torch.Generator().manual_seed(seed)
    candidates = _candidates(q, k, replacement, generator)
    accepted, residual = mcss(p.expand(DRAWS, -1), q.expand(DRAWS, -1), candidates, generator, replacement)
    fallback = p.expand(DRAWS, -1) if bonus_from_p else residual
    bonus = torch.multinomial(fallback, 1, generator=generator).squeeze(1)
    chosen = candidates.gather(1, accepted.clamp(min=0)[:, None]).squeeze(1)
    return torch.where(accepted >= 0, chosen, bonus), accepted >= 0


def _pvalue(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square goodness of fit of the token counts to p (0.0 if a token outside p's support appears)."""
    counts = torch.bincount(tokens, minlength=p.shape[0]).double()
    support = p > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = p[support].double() / p[support].double().sum() * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("replacement", [True, False], ids=["with-replacement", "without-replacement"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_mcss_preserves_target_distribution(pair, k, replacement, one_thread):
    p, q = PAIRS[pair]
    tokens, _ = _run(p, q, k, replacement)
    assert _pvalue(tokens, p) > ALPHA


@pytest.mark.parametrize("replacement", [True, False], ids=["with-replacement", "without-replacement"])
@pytest.mark.parametrize("pair", ["overlap", "peaked-q"])
def test_broken_variant_fails_the_same_test(pair, replacement, one_thread):
    p, q = PAIRS[pair]
    tokens, _ = _run(p, q, 2, replacement, bonus_from_p=True)
    assert _pvalue(tokens, p) < ALPHA


def test_without_replacement_needs_its_own_rule(one_thread):
    """Candidates drawn without replacement but verified as if i.i.d. (q not updated) are biased."""
    p, q = PAIRS["overlap"]
    generator = torch.Generator().manual_seed(1)
    candidates = _candidates(q, 2, False, generator)
    accepted, residual = mcss(p.expand(DRAWS, -1), q.expand(DRAWS, -1), candidates, generator, replacement=True)
    bonus = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    tokens = torch.where(accepted >= 0, candidates.gather(1, accepted.clamp(min=0)[:, None]).squeeze(1), bonus)
    assert _pvalue(tokens, p) < ALPHA


@pytest.mark.parametrize("replacement", [True, False], ids=["with-replacement", "without-replacement"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_more_candidates_accept_at_least_as_often(pair, replacement, one_thread):
    p, q = PAIRS[pair]
    _, single = _run(p, q, 1, replacement, seed=2)
    _, multi = _run(p, q, 4, replacement, seed=3)
    expected_single = float(torch.minimum(p, q).sum())  # speculative sampling's acceptance probability
    assert abs(single.double().mean() - expected_single) < 0.01
    assert multi.double().mean() >= single.double().mean() - 0.01
    if 0 < expected_single < 0.9:  # room to improve: several candidates must actually help
        assert multi.double().mean() > single.double().mean() + 0.02


def test_without_replacement_accepts_at_least_as_often_as_with(one_thread):
    p, q = PAIRS["peaked-p"]
    _, with_ = _run(p, q, 4, True, seed=4)
    _, without = _run(p, q, 4, False, seed=5)
    assert without.double().mean() > with_.double().mean() + 0.02


def test_empty_and_nan_residuals_fall_back():
    fallback = torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])
    weights = torch.tensor([[0.0, 0.0], [float("nan"), 1.0], [2.0, 2.0]])
    out = _normalise(weights, fallback)
    assert torch.equal(out[:2], fallback[:2])
    assert torch.allclose(out[2], torch.tensor([0.5, 0.5]))


# ---------------------------------------------------------------------- acceptance on a tree


def _tree_with_q(root_children: list[int], scheme: str = "mcss-wor") -> CandidateDraft:
    """root -> root_children (drawn from a uniform q over 8); the first child -> {1} (q one-hot on 1)."""
    k = len(root_children)
    q = torch.full((k + 1, 8), 1 / 8)
    q[k] = torch.nn.functional.one_hot(torch.tensor(1), 8).float()
    return CandidateDraft(torch.tensor([*root_children, 1]), torch.tensor([-1] * k + [0]), q, scheme=scheme)


def test_accept_mcss_temperature_zero_is_greedy():
    logits = torch.full((4, 8), -5.0)
    logits[0, 2] = logits[1, 1] = logits[3, 4] = 5.0  # root -> 2 -> 1 -> 4
    for scheme in ("mcss", "mcss-wor", "mcns"):
        acc = accept_mcss(_tree_with_q([2, 5], scheme), logits, SamplingConfig(0.0), None)
        assert acc.nodes.tolist() == [0, 2] and acc.bonus == 4
    logits[0] = -5.0
    logits[0, 7] = 5.0  # the target wants 7 at the root: nothing accepted, bonus is the argmax
    acc = accept_mcss(_tree_with_q([2, 5]), logits, SamplingConfig(0.0), None)
    assert acc.nodes.numel() == 0 and acc.bonus == 7


@pytest.mark.parametrize("scheme", ["mcss", "mcss-wor", "mcns"])
def test_accept_mcss_tree_walk_matches_target_distribution(scheme, one_thread):
    """The first emitted token of a tree walk at temperature 1 follows p at the root (candidates drawn
    from q afresh for every walk, as the drafter does)."""
    logits = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(logits[0], -1)
    generator = torch.Generator().manual_seed(0)
    draws = torch.multinomial(torch.full((2_000, 8), 1 / 8), 2, replacement=scheme == "mcss", generator=generator)
    first = []
    for row in draws.tolist():
        draft = _tree_with_q(row, scheme)
        acc = accept_mcss(draft, logits, SamplingConfig(1.0), generator)
        first.append(int(draft.tokens[acc.nodes[0]]) if acc.nodes.numel() else acc.bonus)
    assert _pvalue(torch.tensor(first), p) > ALPHA


def test_accept_mcss_needs_q():
    with pytest.raises(ValueError, match="draft distributions"):
        accept_mcss(Draft.chain([1, 2]), torch.zeros(3, 8), SamplingConfig(1.0), None)

# End to end on a tiny model (MCSS with and without replacement, mcns, draft temperatures other than the target's,
# tokens 1..4 against the target's exact distributions): tests/test_sampling_positions.py.


def test_accept_mcss_walks_draws_without_replacement_by_their_own_rule(one_thread):
    """accept_mcss on candidates drawn without replacement (scheme ``mcss-wor``) emits p's distribution, where
    the with-replacement rule on the same draws is biased (test_without_replacement_needs_its_own_rule): the
    tree walk must pass the draft's scheme on to the rule. The pair where that rule is most biased (the with-replacement
    rule on these 2,000 walks: a p-value that underflows to 0), so the loop stays short."""
    p, q = PAIRS["peaked-q"]
    logits = torch.zeros(3, 8)
    logits[0] = p.log()
    generator = torch.Generator().manual_seed(4)
    first = []
    for row in _candidates(q, 2, False, generator)[:2_000].tolist():
        draft = CandidateDraft(torch.tensor(row), torch.tensor([-1, -1]), q.expand(2, -1).clone(), scheme="mcss-wor")
        acc = accept_mcss(draft, logits, SamplingConfig(1.0), generator)
        first.append(int(draft.tokens[acc.nodes[0]]) if acc.nodes.numel() else acc.bonus)
    assert _pvalue(torch.tensor(first), p) > ALPHA
