"""Priced trees: accepted length per node budget, the budget chooser, counterfactual learning, losslessness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specnb.core.draft import Draft
from specnb.core.drafter import DecodeState, Drafter, Hindsight
from specnb.core.generate import generate
from specnb.datastores.rest import RestIndex
from specnb.drafters.priced import PricedTreeDrafter, accepted_by_budget
from specnb.drafters.rest import RestDrafter
from tests.conftest import WholeRows, tiny
from tests.test_rest import self_corpus


class LinearCost(WholeRows):
    """seconds_at(k, w) = 1 + per_token * k * w: what a (k, w + 1) block costs beyond one token."""

    def __init__(self, per_token: float):
        self.per_token = per_token

    def seconds_at(self, k: int, w: int, context_len: int) -> float:
        return 1.0 + self.per_token * k * w

    def chain_seconds(self, nodes: np.ndarray, context_len: int) -> np.ndarray:
        return 1.0 + self.per_token * np.asarray(nodes, dtype=np.float64)


def test_accepted_length_of_every_node_prefix():
    # rank order: 5, 9 (children of the root), 6 and 8 (children of 5), 7 (child of 6)
    tree = Draft(torch.tensor([5, 9, 6, 8, 7]), torch.tensor([-1, -1, 0, 0, 2]))
    budgets = np.arange(6)
    assert accepted_by_budget(tree, np.array([5, 6, 7, 1]), budgets).tolist() == [0, 1, 1, 2, 2, 3]
    assert accepted_by_budget(tree, np.array([9, 6]), budgets).tolist() == [0, 0, 1, 1, 1, 1]
    assert accepted_by_budget(tree, np.array([5]), budgets).tolist() == [0, 1, 1, 1, 1, 1]  # output ended


def test_chooser_prices_budgets():
    priced = PricedTreeDrafter(RestDrafter.__new__(RestDrafter), LinearCost(0.05), budgets=(0, 2, 8))
    priced.accepted[3], priced.steps[3] = [0.0, 150.0, 400.0], 100  # E = 0, 1.5, 4.0 accepted tokens
    # tokens / second: b=0 1/1; b=2 2.5/1.1 = 2.27; b=8 5/1.4 = 3.57
    assert priced.choose(3, nodes=64, context_len=100) == (8, pytest.approx(5 / 1.4))
    assert priced.choose(3, nodes=4, context_len=100)[0] == 2  # the tree has only 4 nodes
    priced.cost = LinearCost(1.0)  # b=2: 2.5/3; b=8: 5/9 -> not drafting is best
    assert priced.choose(3, nodes=64, context_len=100)[0] == 0


def test_a_lookup_pays_only_with_its_own_seconds_counted():
    priced = PricedTreeDrafter(RestDrafter.__new__(RestDrafter), LinearCost(0.05), budgets=(0, 2, 8))
    rate = 5 / 1.4  # b = 8: 4 tokens expected beyond the bonus over a 1.4 s call; one token takes 1 s
    priced.lookup_seconds = 3.3  # 5 tokens over 4.7 s: 1.064 tokens/s, above one token's by more than the margin
    assert priced.paid(8, rate, context_len=100)
    priced.lookup_seconds = 3.5  # 5 tokens over 4.9 s: 1.02 tokens/s, a gain within the margin
    assert not priced.paid(8, rate, context_len=100)
    priced.lookup_seconds = 3.7  # 5 tokens over 5.1 s: below
    assert not priced.paid(8, rate, context_len=100)
    priced.lookup_seconds = 0.0
    assert not priced.paid(0, 1.0, context_len=100)  # drafting nothing never pays for a lookup


@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_greedy_lossless_and_learns_while_not_drafting(verify):
    target = tiny("llama")
    prompts = ["def add(a, b):", "import numpy as np\n"]
    index = RestIndex.build(self_corpus(target, prompts), progress=False)
    free = PricedTreeDrafter(RestDrafter(index), LinearCost(0.0))  # verifying is free: drafts
    pricey = PricedTreeDrafter(RestDrafter(index), LinearCost(100.0))  # never worth it
    for prompt in prompts:
        ar = generate(target, prompt, max_new_tokens=40)
        assert generate(target, prompt, free, max_new_tokens=40, verify=verify).tokens == ar.tokens
        out = generate(target, prompt, pricey, max_new_tokens=40, verify=verify)
        assert out.tokens == ar.tokens and out.stats.tokens_per_call == 1.0
    assert free.steps.sum() > 0 and free.accepted[:, -1].sum() > 0
    assert pricey.steps.sum() > 0 and pricey.accepted[:, -1].sum() > 0  # learned from unverified trees


def test_hindsight_aligns_when_the_first_steps_propose_nothing():
    hindsight = Hindsight()
    prompt, output = [1, 2], [10, 11, 12, 13, 14]
    hindsight.commit(torch.tensor(output[1:3]))  # two steps with no proposal (the first token came from prefill)
    state = DecodeState(torch.tensor(prompt + output[:3]), None, 4, len(prompt))
    hindsight.add(state, "key", "tree", horizon=2)
    assert hindsight.commit(torch.tensor([13])) == []
    assert hindsight.commit(torch.tensor([14])) == [("key", "tree", [13, 14])]


class OneToken(Drafter):
    """A one-node tree every step, counting its lookups: the greedy output's next token (``output``) or token 0."""

    def __init__(self, output: list[int] | None = None):
        self.output, self.lookups = output, 0

    def propose(self, state: DecodeState) -> Draft:
        self.lookups += 1
        done = state.tokens.shape[0] - state.prompt_len
        token = self.output[done] if self.output and done < len(self.output) else 0
        return Draft(torch.tensor([token]), torch.tensor([-1]))


def test_lookups_back_off_where_nothing_pays_and_not_where_it_does():
    target = tiny("llama")
    ar = generate(target, "def add(a, b):", max_new_tokens=40)
    right, wrong = OneToken(ar.tokens), OneToken()
    out = generate(target, "def add(a, b):", PricedTreeDrafter(right, LinearCost(0.01)), max_new_tokens=40)
    assert out.tokens == ar.tokens and out.stats.tokens_per_call > 1.5
    assert right.lookups == out.stats.num_calls  # its trees pay (from the second step on): a lookup every step
    out = generate(target, "def add(a, b):", PricedTreeDrafter(wrong, LinearCost(0.01)), max_new_tokens=40)
    assert out.tokens == ar.tokens and out.stats.num_calls == 40 - 1  # the first token comes from the prefill
    # lookups at steps 1, 2, 4, 7, 12, 17, ..., 37: none, 1, 2, 4, 4, ... skipped after each
    assert wrong.lookups == 10
