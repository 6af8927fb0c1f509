"""Token Recycling: the table records the target's top-k after every verified position, the tree follows it
best paths first, greedy output equals AR's and sampling keeps the target's distribution."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, DTYPES, tiny
from test_sampling_deterministic import sampling_matches_ar

from specnb import generate
from specnb.core.drafter import DecodeState
from specnb.drafters.recycle import RecycleDrafter


def logits_ranking(*rankings: list[int], vocab: int = 10) -> torch.Tensor:
    """float [n, vocab]: row i ranks rankings[i] first, in order (everything else below)."""
    out = torch.zeros(len(rankings), vocab)
    for row, ranking in enumerate(rankings):
        out[row, ranking] = torch.arange(len(ranking), 0, -1, dtype=torch.float)
    return out


def test_observe_writes_each_positions_top_k_and_the_last_occurrence_wins():
    drafter = RecycleDrafter(10, k=2, widths=(2,))
    drafter.observe(torch.tensor([3, 5, 3]), logits_ranking([1, 2], [7, 8], [4, 6]))
    assert drafter.table[5].tolist() == [7, 8]
    assert drafter.table[3].tolist() == [4, 6]  # position 2 overwrote position 0
    assert (drafter.table[[0, 1, 2, 4, 6, 7, 8, 9]] == -1).all()
    drafter.clear()
    assert (drafter.table == -1).all()


def state(root: int, max_depth: int = 10) -> DecodeState:
    return DecodeState(torch.tensor([0, root]), None, max_depth, 1)


def test_tree_follows_the_table_best_paths_first():
    drafter = RecycleDrafter(10, k=3, widths=(2, 2, 1), max_nodes=50)
    drafter.table[1] = [2, 3, 9]
    drafter.table[2] = [4, 5, -1]
    drafter.table[3] = [6, -1, -1]  # one known successor: one child
    drafter.table[4] = [7, 8, -1]
    assert drafter.propose(state(0)) is None  # a root never seen
    draft = drafter.propose(state(1))
    paths = {}
    for i, (token, parent) in enumerate(zip(draft.tokens.tolist(), draft.parents.tolist(), strict=True)):
        paths[i] = (paths[parent] if parent >= 0 else ()) + (token,)
    assert list(paths.values()) == [(2,), (2, 4), (2, 4, 7), (3,), (2, 5), (3, 6)]  # by summed rank, then level
    assert drafter.propose(state(1, max_depth=1)).tokens.tolist() == [2, 3]
    small = RecycleDrafter(10, k=3, widths=(2, 2, 1), max_nodes=3)
    small.table[:] = drafter.table
    assert small.propose(state(1)).tokens.tolist() == [2, 4, 7]  # the top-1 chain survives a cut


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["tree", "batch"])
def test_recycle_is_lossless(arch, dtype, mode):
    target = tiny(arch, dtype)
    prompt = [256] + list(range(40, 52)) * 2
    reference = generate(target, prompt, max_new_tokens=40, stop_at_eos=False).tokens
    drafter = RecycleDrafter(target.vocab_size, max_nodes=32)  # wide trees, not only the top-1 chain
    runs = [generate(target, prompt, drafter, max_new_tokens=40, verify=mode, stop_at_eos=False) for _ in range(2)]
    assert all(run.tokens == reference for run in runs)
    assert sum(c.accepted for c in runs[1].stats.calls) >= 5  # the table kept the first run's predictions


def test_recycle_sampling_keeps_the_target_distribution():
    target = tiny("llama")
    drafter = RecycleDrafter(target.vocab_size, max_nodes=32)  # shared: the table learns across the runs
    pvalue, accepted = sampling_matches_ar(target, [256, 5, 6, 7], lambda: drafter)
    assert accepted > 50
    assert pvalue > 1e-3
