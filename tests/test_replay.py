"""specnb.replay.retrieval_ceiling: the most tokens per call a drafter retrieving from seen text can reach."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specnb.drafters.context import ContextNgramDrafter
from specnb.drafters.suffix import SuffixDrafter
from specnb.replay import replay_greedy, retrieval_ceiling


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
