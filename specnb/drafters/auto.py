"""The router: at every step, offer the draft of whichever drafter buys the most tokens per second now.

Every member drafter proposes its full tree; each is wrapped in a
:class:`~specnb.drafters.priced.PricedTreeDrafter`, which knows for its member

    rate(b) = (1 + E[accepted | member, bucket, b]) / seconds(b + 1 tokens)

for every node budget b: the seconds from this machine's roofline table, the expectation learned
counterfactually (once the output passed it) from every tree the member proposed, bucketed by the member's own
confidence signal. The router verifies the member's cut tree with the highest rate, or nothing when no member
beats one token for one call. It may verify the winner's and the runner-up's trees merged, when the tokens the
merge added in hindsight for that pair pay for its nodes (``merge_z``), and it retires, every ``window`` steps,
the member whose running costs most exceed the seconds its wins saved. Why each rule, and what it measured:
``docs/drafters.md``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter, Hindsight
from ..core.report import Report
from ..options import OptionError, at_least, name_list, parsed_by
from ..options import Options as BaseOptions
from . import DRAFTERS, Method
from .priced import PricedTreeDrafter, accepted_by_budget, cut

NO_NODES = torch.empty(0, dtype=torch.long)

ROUTABLE = tuple(name for name, method in DRAFTERS.items() if method.routable)
"""Methods the router can choose among: model-free ones (draft models and already-priced methods excluded)."""


@dataclass(frozen=True)
class Options(BaseOptions):
    """The router: ``members`` (methods, e.g. ``("pld", "suffix")``, ``pld,suffix`` at the edge; default pld, suffix,
    recycle, ngram-bigram and crest where its store exists), ``crest`` / ``dense`` store paths for those members,
    ``roofline`` CSV, ``window`` (steps between two reviews of whether each member pays for its seat; 0: keep every
    member), ``merge`` (whether the best two members' trees may be verified together when that is expected to pay),
    ``merge_z`` (standard errors below its mean that what a merge adds is taken at; 0: the mean)."""

    members: tuple[str, ...] = parsed_by(name_list, ())
    crest: str = ""
    dense: str = ""
    roofline: str = ""
    window: int = 256
    merge: bool = True
    merge_z: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 0, "window", "merge_z")
        for name in self.members:
            if name not in ROUTABLE:
                raise OptionError(f"option members: {name!r} cannot be routed; use some of {', '.join(ROUTABLE)}")

    def check(self, model: str) -> None:
        """The stores given for members must be sound and record the model's tokenizer."""
        from ..datastores import crest, dense

        super().check(model)
        if self.crest:
            crest.check_built_for(Path(self.crest), model)
        if self.dense:
            dense.check_built_for(Path(self.dense), model)


@dataclass(frozen=True)
class Routed(Report):
    """The member that drafted (``winner+runner-up`` for a merged tree, "" for no draft), its expected rate
    (tokens/s), the nodes verified and the members retired so far (comma-separated)."""

    picked: str = ""
    expected_rate: float = 0.0
    nodes: int = 0
    retired: str = ""


class AutoDrafter(Drafter):
    """Routes each step to the member whose priced tree has the best expected tokens/s (or to none).

    members: {method name: drafter}; cost: a :class:`specnb.core.roofline.CostModel` of the target; window: steps
    between two seat reviews (0: never retire a member); merge: whether the winner's and the runner-up's trees
    may be verified together; merge_z: standard errors below the mean that what a merge adds is taken at;
    shrink: weight of the all-pairs estimate of what a merge adds in each pair's.
    Reports a :class:`Routed`.
    """

    name = "auto"

    def __init__(self, members: dict[str, Drafter], cost: Any, window: int = Options.window,
                 merge: bool = Options.merge, merge_z: float = Options.merge_z, shrink: float = 4.0):
        if not members:
            raise ValueError("the router needs at least one member drafter")
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self.members = {name: PricedTreeDrafter(d, cost) for name, d in members.items()}
        self.cost, self.window, self.merge, self.merge_z, self.shrink = cost, window, merge, merge_z, shrink
        self.retired: list[str] = []
        # (winner's, runner-up's) cut trees, until the output shows how each would have done: the runner-up's
        # settles the winner's saving (seat reviews), the pair's what merging the two adds
        self.runner_ups = Hindsight()
        self.added: dict[tuple[str, str], np.ndarray] = {}  # pair -> [tokens a merge added, their squares, steps]
        self.record: dict[str, Any] | None = None  # this step's winner, its call's seconds and its runner-up's
        self.picked: str = ""
        self._report = Routed()
        self._new_window()

    def _new_window(self) -> None:
        self.steps = 0
        self.spent = dict.fromkeys(self.members, 0.0)  # seconds spent running each member
        self.saved = dict.fromkeys(self.members, 0.0)  # seconds its wins saved against the runner-up, realised

    @property
    def seated(self) -> dict[str, PricedTreeDrafter]:
        return {name: member for name, member in self.members.items() if name not in self.retired}

    @property
    def needs_hidden_state(self) -> bool:
        return any(m.needs_hidden_state for m in self.members.values())

    @property
    def nbytes(self) -> int:
        """What the members keep (histories, tables, stores), summed."""
        return sum(m.nbytes for m in self.members.values())

    @property
    def needs_logits(self) -> bool:
        return any(m.needs_logits for m in self.seated.values())

    def reset(self, prompt_ids: Tensor) -> None:
        for member in self.members.values():
            member.reset(prompt_ids)
        self.runner_ups.reset()

    def clear(self) -> None:
        for member in self.members.values():
            member.clear()

    def propose(self, state: DecodeState) -> Draft | None:
        offers = []  # (rate, name, full tree, budget) of every seated member that would draft
        for name, member in self.seated.items():
            start = time.perf_counter()
            tree, budget, rate = member.price(state)
            self.spent[name] += time.perf_counter() - start
            if budget:
                offers.append((rate, name, tree, budget))
        offers.sort(key=lambda offer: -offer[0])  # stable: ties go to the earlier member
        self.picked, self.record, best_rate, draft = "", None, 0.0, None
        if offers:
            best_rate, winner, tree, budget = offers[0]
            alone, context, self.picked = cut(tree, budget), state.tokens.shape[0], winner
            draft = alone
            runner_up = cut(offers[1][2], offers[1][3]) if len(offers) > 1 else None  # None: one-token call
            pair = (winner, offers[1][1]) if runner_up is not None else None
            if pair is not None and self.merge:
                tokens = best_rate * self._seconds(budget, context) + self._added(pair)  # 1 + E[accepted], merged
                if tokens / self._seconds(budget + 1, context) > best_rate:  # could a merge pay? (one node more)
                    merged = alone.merge(runner_up)
                    rate = tokens / self._seconds(merged.num_nodes, context)
                    if merged.num_nodes > budget and rate > best_rate:
                        best_rate, draft, self.picked = rate, merged, "+".join(pair)
            # the seat reviews credit the winner with its step (merged or not) against the runner-up alone
            self.record = {"member": winner, "seconds": self._seconds(draft.num_nodes, context), "pair": pair,
                           "runner_up": runner_up,
                           "runner_up_seconds": self._seconds(runner_up.num_nodes if runner_up else 0, context)}
            if runner_up is not None:
                self.runner_ups.add(state, self.record, (alone, runner_up), max(alone.max_depth, runner_up.max_depth))
        self._report = Routed(self.picked, best_rate, draft.num_nodes if draft is not None else 0,
                              ",".join(self.retired))
        return draft

    def _added(self, pair: tuple[str, str]) -> float:
        """A lower bound on the tokens the runner-up's tree adds to the winner's, for ``pair``: its mean less
        ``merge_z`` standard errors (0 at least), mean and spread both shrunk toward every pair's."""
        total = sum(self.added.values(), np.zeros(3))
        pooled = total[:2] / max(total[2], 1.0)  # first and second moment over every pair
        *sums, steps = self.added.get(pair, np.zeros(3))
        mean, square = (np.asarray(sums) + self.shrink * pooled) / (steps + self.shrink)
        error = np.sqrt(max(square - mean * mean, 0.0) / (steps + self.shrink))
        return float(max(mean - self.merge_z * error, 0.0))

    def _seconds(self, nodes: int, context_len: int) -> float:
        return float(self.cost.chain_seconds(np.array([nodes]), context_len)[0])

    def observe(self, tokens: Tensor, logits: Tensor) -> None:
        for name, member in self.seated.items():
            if member.needs_logits:
                start = time.perf_counter()
                member.observe(tokens, logits)
                self.spent[name] += time.perf_counter() - start

    def update(self, committed: Tensor, accepted: Tensor) -> None:
        """Every member learns the committed tokens (only the picked one had its nodes accepted); then the
        winners' realised savings are settled and, every ``window`` steps, the seats reviewed."""
        for name, member in self.members.items():
            start = time.perf_counter()
            member.update(committed, accepted if name == self.picked else NO_NODES)
            self.spent[name] += time.perf_counter() - start
        if self.record is not None:
            self.record["tokens"] = committed.shape[0]
            if self.record["runner_up"] is None:  # the alternative was a one-token call
                self._settle(self.record, 1)
        for record, (winner, runner_up), truth in self.runner_ups.commit(committed):
            second = _accepted(runner_up, truth)
            self._settle(record, 1 + second)
            if self.merge:  # what the runner-up's tree would have added to the winner's
                added = max(second - _accepted(winner, truth), 0)
                self.added[record["pair"]] = self.added.get(record["pair"], np.zeros(3)) + (added, added * added, 1)
        self.steps += 1
        if self.window and self.steps >= self.window:
            self._review()

    def _settle(self, record: dict[str, Any], runner_up_tokens: int) -> None:
        """Credit the winner with what its tokens would have cost at the runner-up's realised rate, less
        what they cost."""
        instead = record["tokens"] * record["runner_up_seconds"] / runner_up_tokens
        self.saved[record["member"]] += instead - record["seconds"]

    def _review(self) -> None:
        """Retire the seated member whose running cost most exceeds what its wins saved, if any does."""
        deficit = {name: self.spent[name] - self.saved[name] for name in self.seated}
        worst = max(deficit, key=deficit.__getitem__)
        if deficit[worst] > 0 and len(deficit) > 1:
            self.retired.append(worst)
        self._new_window()

    @property
    def report(self) -> Routed:
        return self._report


def _accepted(tree: Draft, truth: list[int]) -> int:
    """How many tokens of the whole ``tree`` the target would have accepted, given the true next tokens."""
    return int(accepted_by_budget(tree, np.asarray(truth, dtype=np.int64), np.array([tree.num_nodes]))[0])


def default_members(target: Any) -> list[str]:
    """pld, suffix, recycle and the model bigram; CREST too where the target's default code store exists."""
    from ..datastores.rest import default_store

    members = ["pld", "suffix", "recycle", "ngram-bigram"]
    return members + ["crest"] if default_store(target.name, "crest").exists() else members


# Member options the router sets (the others keep their method's defaults): bigram chains 4 deep, so that
# its rank-ordered tree can be cut to a chain; recycle's whole 32-node tree, which the router cuts to what pays
# (recycle alone stops at its top-1 chain of 8).
MEMBER_OPTIONS: dict[str, dict[str, Any]] = {"ngram-bigram": {"k": 4, "w": 4}, "recycle": {"max_nodes": 32}}


def make(target: Any, options: Options) -> AutoDrafter:
    """The ``auto`` router over ``members`` (default :func:`default_members`; a given ``crest`` / ``dense`` store
    makes its method a member), each with its method's default options but for :data:`MEMBER_OPTIONS`."""
    from ..core.roofline import cached_cost_model

    names = list(options.members) if options.members else default_members(target)
    stores = {"crest": options.crest, "dense": options.dense}
    names += [name for name, path in stores.items() if path and name not in names]  # a given store adds its member
    members = {}
    for name in names:
        values = dict(MEMBER_OPTIONS.get(name, {}))
        if stores.get(name):
            if not Path(stores[name]).exists():
                raise OptionError(f"auto: the {name} store {stores[name]} does not exist")
            values["datastore"] = stores[name]
        method = DRAFTERS[name].method()
        members[name] = method.make(target, method.options(**values))
    return AutoDrafter(members, cached_cost_model(target, options.roofline), options.window, options.merge,
                       options.merge_z)


METHODS = (
    Method("auto", "router: each step, the drafter with the best expected tokens/s on this machine", "auto",
           Options, make),
)
