"""SuffixDecoding's drafter and its suffix structures: matches against a brute-force search, the history's
bound, the tree's depth and pruning rules, greedy losslessness and the sampled distribution."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import ARCHS, DTYPES, tiny
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sampling_deterministic import sampling_matches_ar

from specnb import generate
from specnb.core.drafter import DecodeState
from specnb.datastores.history import OutputHistory, earlier_match
from specnb.drafters.suffix import SuffixDrafter
from specnb.eval.methods import OptionError, parse_options


def brute_force_match(context: list[int], max_query: int, min_query: int) -> tuple[int, list[int]]:
    """The definition: longest q whose last-q tokens occur ending before the last token; continuation starts."""
    n = len(context)
    for q in range(min(max_query, n - 1), min_query - 1, -1):
        starts = [e + 1 for e in range(q - 1, n - 1) if context[e - q + 1:e + 1] == context[n - q:]]
        if starts:
            return q, starts
    return 0, []


@settings(max_examples=200, deadline=None)
@given(context=st.lists(st.integers(0, 3), min_size=1, max_size=40), max_query=st.integers(1, 8),
       min_query=st.integers(1, 3))
def test_earlier_match_is_the_longest_earlier_suffix(context, max_query, min_query):
    min_query = min(min_query, max_query)
    q, starts = earlier_match(np.array(context), max_query, min_query)
    assert (q, starts.tolist()) == brute_force_match(context, max_query, min_query)


def test_history_is_bounded_and_matches_do_not_cross_outputs():
    history = OutputHistory(max_tokens=10)
    history.add(np.array([1, 2, 3, 4]))
    history.add(np.array([5, 6, 7]))
    q, ranges = history.match(np.array([9, 4, 5]), max_query=4)
    assert q == 1  # "4 5" spans two outputs: only "5" matches
    assert history.continuations(ranges, q, 10, 3).tolist() == [[6, 7, -1]]
    history.add(np.array([8, 9, 10, 11]))  # 11 tokens: the oldest output goes
    assert history.num_tokens == 7 and [o.tolist() for o in history.outputs] == [[5, 6, 7], [8, 9, 10, 11]]
    assert history.match(np.array([2, 3]), max_query=4)[0] == 0
    assert history.nbytes == 2 * 4 * (7 + 2)  # int32 text with a separator per output, and its suffix array


def state(tokens: list[int], max_depth: int = 20, prompt_len: int = 1) -> DecodeState:
    return DecodeState(torch.tensor(tokens), None, max_depth, prompt_len)


def test_tree_depth_grows_with_the_match_and_rare_branches_are_pruned():
    # "1 2 3" was followed by 4 5 6 7 8 three times and by 9 once; the context ends with "1 2 3".
    body = [1, 2, 3, 4, 5, 6, 7, 8] * 3 + [1, 2, 3, 9, 0]
    drafter = SuffixDrafter(alpha=1.0, min_prob=0.3, max_nodes=50)
    draft = drafter.propose(state(body + [1, 2, 3]))
    report = drafter.report
    assert (report.match_len, report.source, report.occurrences) == (3, "request", 4)
    assert draft.tokens.tolist() == [4, 5, 6] and draft.is_chain  # depth ceil(1.0 * 3); the 1-in-4 branch < 0.3
    drafter = SuffixDrafter(alpha=1.5, min_prob=0.2, max_nodes=50)
    draft = drafter.propose(state(body + [1, 2, 3]))
    assert draft.max_depth == math.ceil(1.5 * 3) and 9 in draft.tokens.tolist()  # 0.25 >= 0.2 keeps the branch
    assert drafter.propose(state(body + [1, 2, 3], max_depth=2)).max_depth == 2


def test_earlier_outputs_are_drafted_from_in_the_next_request():
    drafter = SuffixDrafter(min_prob=0.0)
    drafter.reset(torch.tensor([7]))
    drafter.update(torch.tensor([11, 12, 13, 14, 15]), torch.empty(0, dtype=torch.long))
    assert drafter.propose(state([7, 11, 12])) is None  # nothing recurs in this request, no history yet
    drafter.reset(torch.tensor([8]))  # the first output joins the history
    draft = drafter.propose(state([8, 11, 12]))
    # match "11 12" (q = 2): depth ceil(2.0 * 2) = 4, but that output ended after 15
    assert drafter.report.source == "history" and draft.tokens.tolist() == [13, 14, 15]
    drafter.clear()
    assert drafter.propose(state([8, 11, 12])) is None


def test_options_are_validated():
    with pytest.raises(OptionError, match="min_prob"):
        parse_options("suffix", {"min_prob": "1.5"})
    with pytest.raises(OptionError, match="max_query"):
        parse_options("suffix", {"min_query": "5", "max_query": "2"})


REPETITIVE = [256] + list(range(40, 52)) * 3


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["tree", "batch"])
def test_suffix_is_lossless(arch, dtype, mode):
    target = tiny(arch, dtype)
    reference = generate(target, REPETITIVE, max_new_tokens=40, stop_at_eos=False).tokens
    drafter = SuffixDrafter(min_prob=0.0, max_nodes=16)
    first = generate(target, REPETITIVE, drafter, max_new_tokens=40, verify=mode, stop_at_eos=False)
    second = generate(target, REPETITIVE, drafter, max_new_tokens=40, verify=mode, stop_at_eos=False)
    assert first.tokens == reference and second.tokens == reference
    # Random tiny models rarely repeat themselves, but the second request finds the first one's output.
    assert sum(c.accepted for c in second.stats.calls) > 20
    assert {c.report.source for c in second.stats.calls} & {"history", "both"}


def test_suffix_sampling_keeps_the_target_distribution():
    target = tiny("llama")
    drafter = SuffixDrafter(min_prob=0.0)  # shared: earlier samples are the history it drafts from
    pvalue, accepted = sampling_matches_ar(target, [256, 5, 6, 7], lambda: drafter)
    assert accepted > 50
    assert pvalue > 1e-3
