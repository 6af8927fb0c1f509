"""specnb.eval.replay: the retrieval ceiling (the most tokens per call a drafter retrieving from seen text can reach),
speeds modelled on a cost table, and the router that knows each step's outcome."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import WholeRows
from hypothesis import given, settings
from hypothesis import strategies as st

from specnb.core.draft import Draft
from specnb.core.drafter import DecodeState, Drafter
from specnb.drafters.context import ContextNgramDrafter
from specnb.drafters.hindsight import HindsightRouter
from specnb.drafters.recycle import RecycleDrafter
from specnb.drafters.suffix import SuffixDrafter
from specnb.eval.replay import modelled_speed, replay_greedy, retrieval_ceiling, router_ceiling


def ref(prompt: list[int], output: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(prompt), torch.tensor(output)


def test_the_ceiling_accepts_the_longest_earlier_continuation_up_to_the_depth():
    # The first output token comes from the prefill; root 1 recurs at prompt index 1, whose continuation
    # 2 3 4 agrees with the output for 3 tokens (then 6 != 7): one call of 3 + 1, one of 1 (5 tokens, 2 calls).
    reference = ref([5, 1, 2, 3, 4, 6], [1, 2, 3, 4, 7, 8])
    assert retrieval_ceiling([reference], depth=4) == 2.5
    assert retrieval_ceiling([reference], depth=2) == 5 / 3  # 2 + 1, then root 4 (continued by 6, not 7), 1


def test_the_ceiling_reads_earlier_outputs_but_neither_their_prompts_nor_the_future():
    assert retrieval_ceiling([ref([9], [20, 21, 22, 23])] * 2, depth=4) == 6 / 4  # 3 calls, then 1 from history
    assert retrieval_ceiling([ref([20, 21, 22, 23], [1]), ref([9], [20, 21, 22, 23])], depth=4) == 3 / 3
    # 1 2 3 repeats only later in the output: the first three roots have nothing seen to retrieve from.
    assert retrieval_ceiling([ref([7], [1, 2, 3, 1, 2, 3])], depth=4) == 5 / 4
    with pytest.raises(ValueError, match="depth"):
        retrieval_ceiling([ref([7], [1, 2])], depth=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=12),
                          st.lists(st.integers(0, 4), min_size=2, max_size=30)), min_size=1, max_size=4),
       st.integers(1, 8))
def test_no_retrieval_drafter_beats_the_ceiling_and_a_tree_of_every_continuation_reaches_it(texts, depth):
    references = [ref(prompt, output) for prompt, output in texts]
    ceiling = retrieval_ceiling(references, depth)

    def tokens_per_call(drafter) -> float:
        calls = [c for prompt, output in references for c in replay_greedy(drafter, prompt, output).calls]
        return sum(c.new_tokens for c in calls) / len(calls)

    for drafter in (ContextNgramDrafter(k=1, w=depth), ContextNgramDrafter(k=3, w=depth, max_ngram=2),
                    SuffixDrafter(max_nodes=64, alpha=2, max_depth=depth, min_prob=0.0)):
        assert tokens_per_call(drafter) <= ceiling + 1e-12
    # suffix matching the root token alone, every occurrence, depth-deep, unpruned: the bound's own draft
    every = SuffixDrafter(max_nodes=10**6, alpha=depth, max_depth=depth, min_prob=0.0, max_query=1)
    assert tokens_per_call(every) == pytest.approx(ceiling)


class LinearCost(WholeRows):
    """A cost table whose call of b draft nodes takes base + per_node * b seconds (+ per_context * context)."""

    def __init__(self, base: float = 1.0, per_node: float = 0.25, per_context: float = 0.0):
        self.base, self.per_node, self.per_context = base, per_node, per_context

    def chain_seconds(self, nodes, context_len: int) -> np.ndarray:
        return self.base + self.per_node * np.asarray(nodes, dtype=float) + self.per_context * context_len

    def seconds_at(self, k: int, w: int, context_len: int) -> float:
        assert k == 1, "replay prices one row per call"
        return float(self.chain_seconds([w], context_len)[0])


class Scripted(Drafter):
    """Proposes a fixed chain at given roots (by root token), a wrong one elsewhere."""

    def __init__(self, chains: dict[int, list[int]]):
        self.chains = chains

    def propose(self, state: DecodeState) -> Draft | None:
        return Draft.chain(torch.tensor(self.chains.get(int(state.tokens[-1]), [0, 0])))


def test_modelled_speed_prices_each_call_at_its_node_count_and_context():
    # Nothing ever repeats: one call per token, at contexts 1, 2, 3 (the cache before each call: the prompt, then
    # one token per call; the roofline table's context).
    reference = ref([9], [1, 2, 3, 4])
    per_call, rate = modelled_speed(ContextNgramDrafter(), [reference], LinearCost(base=0.0, per_context=1.0))
    assert per_call == 1.0 and rate == 3 / (1 + 2 + 3)
    # A drafted call is priced at its nodes, accepted or not: root 1 drafts 2 3 (w=2), both accepted, then 4.
    reference = ref([1, 2, 3, 7], [1, 2, 3, 4])
    runs = replay_greedy(ContextNgramDrafter(k=1, w=2), *reference)
    per_call, rate = modelled_speed(ContextNgramDrafter(k=1, w=2), [reference], LinearCost())
    assert per_call == 3 / len(runs.calls) and rate == 3 / sum(1 + 0.25 * c.drafted_nodes for c in runs.calls)


class Fixed(Drafter):
    """Proposes one fixed draft at every call."""

    def __init__(self, draft: Draft):
        self.draft = draft

    def propose(self, state: DecodeState) -> Draft | None:
        return self.draft


@pytest.mark.parametrize(("tokens", "parents", "read"), [
    ([2, 3, 9], [-1, 0, 1], 3),  # a chain: the root's row, then its two passing nodes'
    ([9, 9, 9], [-1, 0, 1], 1),  # nothing passes: the root's row alone
    ([9, 2, 2, 3, 9], [-1, -1, -1, 2, 3], 5),  # a duplicate sibling passes too, and its child is read
    ([2, 2, 9], [-1, -1, 0], 3),  # the accepted path is node 0's; its duplicate, node 1, is read too
    ([2, 9, 3, 9, 9, 9], [-1, -1, 0, 0, 0, 0], 4),  # the accepted leaf's row (its bonus), no later sibling's
])
def test_a_replayed_call_records_the_rows_greedy_acceptance_reads(tokens, parents, read):
    """``rows_read``: the highest row greedy acceptance reads (the root's is 0, node i's is i + 1), plus one."""
    calls = replay_greedy(Fixed(Draft(torch.tensor(tokens), torch.tensor(parents))), *ref([1], [1, 2, 3, 4])).calls
    assert calls[0].rows_read == read and not calls[0].all_rows


def test_the_hindsight_router_takes_at_each_step_the_member_and_budget_that_turn_out_best():
    reference = ref([9], [1, 2, 3, 4, 5, 6, 7])
    members = {"early": Scripted({1: [2, 3, 4]}), "late": Scripted({5: [6, 7]}), "wrong": Scripted({})}
    # Root 1: early's 3 nodes all pass, (1 + 3) / 1.75 beats a one-token call; root 5: one token is left to draft,
    # late's first node passes, (1 + 1) / 1.25; wrong never pays.
    per_call, rate, picks = router_ceiling(members, [reference], LinearCost())
    assert (per_call, rate, picks) == (3.0, 6 / 3.0, {"early": 1, "late": 1})
    # When no draft can pay for its nodes, it drafts nothing: one call per token.
    per_call, rate, picks = router_ceiling(members, [reference], LinearCost(per_node=10.0))
    assert (per_call, rate, picks) == (1.0, 1.0, {"": 6})
    with pytest.raises(ValueError, match="recycle"):
        HindsightRouter({"recycle": RecycleDrafter(vocab_size=16)}, LinearCost())
