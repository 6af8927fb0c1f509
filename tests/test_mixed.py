"""Mixed strategy allocation, greedy replay, the adaptive draft shape and their losslessness."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny

from specnb.core.drafter import DecodeState
from specnb.core.generate import generate
from specnb.core.metrics import CallStats
from specnb.core.roofline import CostModel
from specnb.datastores.ngram_tables import BigramTable, bigram_table
from specnb.drafters.mixed import (
    AdaptiveShapeDrafter,
    MixedDrafter,
    MixedReport,
    ShapeStatistics,
    accepted_rank,
    accepted_strategy,
    longest_suffix_match,
    match_lengths,
)
from specnb.eval.replay import replay_greedy

PROMPT = list(b"for i in range(10):\n    print(i)\nfor i in range(10):\n")


pytestmark = pytest.mark.usefixtures("isolated_cache")


def toy_table(vocab: int = 10, k: int = 4) -> BigramTable:
    """Token x is followed by x+1, x+2, ... (mod vocab), best first."""
    tokens = np.arange(vocab)
    topk = (tokens[:, None] + np.arange(1, k + 1)[None]) % vocab
    return BigramTable(tokens, topk, np.zeros(topk.shape, np.float32), tokens.copy())


class FakeCost:
    """Four shapes with hand-picked call times (seconds), whatever the context length."""

    shapes = np.array([[1, 0], [1, 2], [4, 1], [4, 2]])

    def seconds(self, context_len: int) -> np.ndarray:
        return np.array([1.0, 1.2, 1.3, 1.6])


def state(tokens: list[int], max_depth: int = 10) -> DecodeState:
    return DecodeState(torch.tensor(tokens), None, max_depth, 1)


def test_context_rows_first_then_bigram_without_duplicates():
    drafter = MixedDrafter(toy_table(), k=4, w=2)
    draft = drafter.propose(state([1, 2, 3, 1, 2, 4, 1]))
    # context: after "1" came [2, 4] (most recent) and [2, 3]; the bigram's [2, 3] is a duplicate
    assert drafter.last_rows == [[2, 4], [2, 3], [3, 4], [4, 5]]
    assert drafter.report == MixedReport(k=4, w=2, context_rows=2, bigram_rows=2)
    assert draft.num_nodes == 7  # the two context rows share their first token
    drafter.propose(state([7, 8, 9]))  # no earlier "9": the bigram takes every row
    assert drafter.report.context_rows == 0 and drafter.last_rows == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert MixedDrafter(toy_table(), k=2, w=5).propose(state([5, 5], max_depth=0)) is None


def test_accepted_strategy_and_rank():
    call = lambda row: CallStats(10, 2, 1, 2, 0, 0, 0, accepted_row=row, report=MixedReport(context_rows=2))  # noqa: E731
    assert (accepted_strategy(call(1)), accepted_rank(call(1))) == ("context", 1)
    assert (accepted_strategy(call(3)), accepted_rank(call(3))) == ("bigram", 1)
    assert accepted_strategy(call(None)) is None


def test_replay_matches_real_decoding():
    target = tiny("gemma3")
    drafter = MixedDrafter(bigram_table(target, progress=False), k=4, w=4)
    real = generate(target, PROMPT, drafter, max_new_tokens=32)
    replay = replay_greedy(drafter, torch.tensor(real.prompt_ids), torch.tensor(real.tokens))
    assert [c.accepted for c in replay.calls] == [c.accepted for c in real.stats.calls]
    assert [c.accepted_row for c in replay.calls] == [c.accepted_row for c in real.stats.calls]
    read = [c.rows_read for c in real.stats.calls]  # by the live call's HeadRows (two rows computed first here)
    assert [c.rows_read for c in replay.calls] == read and min(read) == 1 and max(read) > 2, read
    assert replay.tokens_per_call == real.stats.tokens_per_call


def test_counterfactual_match_lengths():
    assert match_lengths([[5, 6, 7], [5, 9], [1]], torch.tensor([5, 6, 8]), 3).tolist() == [2, 1, 0]
    stats = ShapeStatistics(buckets=1, k_max=3, w_max=3)
    stats.observe(0, np.array([0, 2, 1]), 3)
    assert stats.hits[0, 1:, 1:].tolist() == [[0, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert stats.trials[0, 1:, 1:].tolist() == [[1, 1, 1]] * 3


def test_adaptive_chooser_picks_the_hand_computed_shape():
    # Observed per-row match lengths (4 rows offered, w = 2), each pattern repeated 100 times:
    # best of 1 row >= 1 in 50%, >= 2 in 10%; best of 4 rows >= 1 in 90%, >= 2 in 20%.
    patterns = [[2, 0, 0, 0]] + [[0, 2, 0, 0]] + [[1, 0, 0, 0]] * 4 + [[0, 0, 1, 0]] * 3 + [[0, 0, 0, 0]]
    adaptive = AdaptiveShapeDrafter(MixedDrafter(toy_table(), k=1, w=1), FakeCost())
    for pattern in patterns * 100:
        adaptive.stats.observe(0, np.array(pattern), 2)
    # expected tokens / seconds: (1,0) 1/1 = 1.00; (1,2) 1.6/1.2 = 1.33; (4,1) 1.9/1.3 = 1.46; (4,2) 2.1/1.6 = 1.31
    shape, rate = adaptive.choose(bucket=0, context_len=100, max_depth=10)
    assert shape == (4, 1) and rate == pytest.approx(1.9 / 1.3, rel=0.01)
    # where nothing is ever accepted, not drafting at all is best
    hopeless = AdaptiveShapeDrafter(MixedDrafter(toy_table(), k=1, w=1), FakeCost())
    for _ in range(200):
        hopeless.stats.observe(1, np.zeros(4, dtype=np.int64), 2)
    assert hopeless.choose(bucket=1, context_len=100, max_depth=10)[0] == (1, 0)
    assert hopeless.propose(state([3, 4, 3])) is None  # "3" occurred before: bucket 1, shape (1, 0)
    assert (hopeless.report.bucket, hopeless.report.w) == (1, 0)


def cost_frame() -> pd.DataFrame:
    """A made-up roofline table: time grows with the block's token count."""
    rows = [dict(context=c, k=k, w=w, seconds=0.01 * (1 + 0.05 * k * (w + 1)))
            for c in (25, 100) for k in (1, 2, 4) for w in (0, 1, 3)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_greedy_lossless(tiny_target, verify):
    table = bigram_table(tiny_target, progress=False)
    reference = generate(tiny_target, PROMPT, None, max_new_tokens=20).tokens
    for drafter in (MixedDrafter(table, k=4, w=4, max_ngram=3),
                    AdaptiveShapeDrafter(MixedDrafter(table, k=1, w=1), CostModel(cost_frame()))):
        out = generate(tiny_target, PROMPT, drafter, max_new_tokens=20, verify=verify)
        assert out.tokens == reference, type(drafter).__name__


def test_adaptive_learns_while_not_drafting(tiny_target):
    """With drafting priced out it never drafts, yet scores its shadow drafts against the output."""
    table = bigram_table(tiny_target, progress=False)
    pricey = cost_frame().assign(seconds=lambda f: np.where(f.w > 0, 1.0, 0.01))
    adaptive = AdaptiveShapeDrafter(MixedDrafter(table, k=1, w=1), CostModel(pricey))
    out = generate(tiny_target, PROMPT, adaptive, max_new_tokens=20)
    assert out.stats.tokens_per_call == 1.0  # nothing drafted
    w_max = adaptive.stats.hits.shape[2] - 1
    assert adaptive.stats.trials.sum() > 0 and len(adaptive.hindsight.pending) == w_max - 1
    # the shadows are scored against the true output: same statistics as scoring them by hand
    tokens = torch.tensor(out.prompt_ids + out.tokens)
    manual = ShapeStatistics(*adaptive.stats.hits.shape[:1], adaptive.stats.hits.shape[1] - 1, w_max)
    base = MixedDrafter(table, k=1, w=1)
    for g in range(1, len(out.tokens) - w_max + 1):
        state = DecodeState(tokens[:len(out.prompt_ids) + g], None, w_max, len(out.prompt_ids))
        base.propose_shape(state, adaptive._shadow_shape[0], w_max)
        if base.last_rows:
            truth = np.asarray(out.tokens[g:g + w_max])
            manual.observe(longest_suffix_match(state.tokens.numpy()), match_lengths(base.last_rows, truth, w_max),
                           w_max)
    assert np.array_equal(manual.trials, adaptive.stats.trials) and np.array_equal(manual.hits, adaptive.stats.hits)
