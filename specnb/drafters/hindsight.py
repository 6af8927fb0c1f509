"""The hindsight router (:class:`HindsightRouter`): a replay-only drafter that knows each step's outcome.

Contract: model-free members (no logits, no hidden state) and a cost model with ``chain_seconds``
(:class:`specnb.core.roofline.CostModel`); :meth:`HindsightRouter.read_ahead` must hand it each reference (prompt,
greedy output) before :func:`specnb.eval.replay.replay_greedy` replays it. Why: set beside the router
(:class:`specnb.drafters.auto.AutoDrafter`), it measures what the router's estimates cost
(:func:`specnb.eval.replay.router_ceiling`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from .priced import BUDGETS, accepted_by_budget, cut


class HindsightRouter(Drafter):
    """Replay only: a router that knows each step's outcome before it chooses.

    At every root each member proposes its full tree (ranked, so that its first b nodes are its best tree of
    b nodes, as :class:`~specnb.drafters.priced.PricedTreeDrafter` assumes); the router verifies the member's
    first b nodes with the highest *realised* (1 + accepted) / seconds(b + 1), b from ``budgets``, or nothing
    when no draft beats a one-token call. It chooses as :class:`~specnb.drafters.auto.AutoDrafter` does, from
    the same trees and the same cost table, with the expectation replaced by the outcome: the distance
    between the two is what the router's estimates cost, not its members or the machine. It never merges two
    members' trees, which pays only for a router unsure which one is right. (It chooses step by step: a choice
    that accepts less now could, in principle, reach a better root later.)

    members: {name: drafter}, none of which reads the target's logits or hidden state (replay has neither);
    cost: a :class:`specnb.core.roofline.CostModel`. ``picks`` counts the calls each member drafted ("" for none).
    """

    name = "hindsight"

    def __init__(self, members: dict[str, Drafter], cost: Any, budgets: tuple[int, ...] = BUDGETS):
        unreplayable = [name for name, m in members.items() if m.needs_logits or m.needs_hidden_state]
        if unreplayable:
            raise ValueError(f"replay gives drafters neither logits nor hidden states: {', '.join(unreplayable)}")
        self.members, self.cost, self.budgets = members, cost, np.asarray(budgets, dtype=np.int64)
        self.tokens = np.empty(0, dtype=np.int64)  # the reference being replayed: prompt + greedy output
        self.picked, self.picks = "", Counter()

    def read_ahead(self, prompt_ids: Tensor, output: Tensor) -> None:
        """The reference :func:`specnb.eval.replay.replay_greedy` is about to replay (its outcomes are what the
        router knows)."""
        self.tokens = torch.cat([torch.as_tensor(prompt_ids), torch.as_tensor(output)]).numpy()

    def reset(self, prompt_ids: Tensor) -> None:
        for member in self.members.values():
            member.reset(prompt_ids)

    def propose(self, state: DecodeState) -> Draft | None:
        root = state.tokens.shape[0] - 1
        truth = self.tokens[root + 1:root + 1 + state.max_depth]
        seconds = self.cost.chain_seconds(self.budgets, root + 1)
        best_rate, best, self.picked = 1.0 / seconds[0], None, ""  # budgets[0] == 0: a one-token call
        for name, member in self.members.items():
            tree = member.propose(state)
            tree = None if tree is None else tree.truncate(state.max_depth)
            if tree is None or not tree.num_nodes:
                continue
            rate = np.where(self.budgets <= tree.num_nodes,
                            (1 + accepted_by_budget(tree, truth, self.budgets)) / seconds, 0.0)
            i = int(np.argmax(rate))
            if rate[i] > best_rate:
                best_rate, best, self.picked = rate[i], cut(tree, int(self.budgets[i])), name
        self.picks[self.picked] += 1
        return best

    def update(self, committed: Tensor, accepted: Tensor) -> None:
        for name, member in self.members.items():
            member.update(committed, accepted if name == self.picked else accepted[:0])
