"""The router: at every step, offer the draft of whichever drafter buys the most tokens per second now.

Every member drafter proposes its full tree; each is wrapped in a
:class:`~specnb.drafters.priced.PricedTreeDrafter`, which knows for its member

    rate(b) = (1 + E[accepted | member, bucket, b]) / seconds(b + 1 tokens)

for every node budget b: the seconds from this machine's roofline table, the expectation learned
counterfactually from every tree the member proposed (verified or not) once the output passed it, bucketed by
the member's own confidence signal (the match length of context n-grams, suffix matches and CREST; whether
the model bigram covers the root; how many DReSD neighbours agree). The router verifies the member's cut tree
with the highest rate; when no member's best beats b = 0 (one token for one call), it offers nothing and the
step costs what an AR step costs plus the members' proposals (``draft_seconds`` in the run statistics).

Since every member scores every step in hindsight, the router learns about all of them while it verifies
only one; the learned expectations persist across requests (same task, same machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..draft import Draft
from ..methods import AutoOptions, OptionError, make_drafter
from .base import DecodeState, Drafter
from .priced import PricedTreeDrafter, cut

# The last_info entry each member buckets its steps by (a member without one uses a single bucket).
BUCKET_KEYS = {"pld": "match_len", "suffix": "match_len", "crest": "match_len", "rest": "match_len",
               "ngram-bigram": "covered", "dense": "first_token_matches"}
NO_NODES = torch.empty(0, dtype=torch.long)


class AutoDrafter(Drafter):
    """Routes each step to the member whose priced tree has the best expected tokens/s (or to none).

    members: {method name: drafter}; cost: a :class:`specnb.roofline.CostModel` of the target.
    ``last_info``: ``picked`` (member name, "" for no draft), ``expected_rate`` (tokens/s) and ``nodes``.
    """

    name = "auto"

    def __init__(self, members: dict[str, Drafter], cost: Any):
        if not members:
            raise ValueError("the router needs at least one member drafter")
        self.members = {name: PricedTreeDrafter(d, cost, bucket_key=BUCKET_KEYS.get(name, "")) for name, d in
                        members.items()}
        self.picked: str = ""
        self._info: dict[str, Any] = {}

    @property
    def needs_hidden_state(self) -> bool:
        return any(m.needs_hidden_state for m in self.members.values())

    @property
    def nbytes(self) -> int:
        """What the members keep (histories, tables, stores), summed."""
        return sum(m.nbytes for m in self.members.values())

    @property
    def needs_logits(self) -> bool:
        return any(m.needs_logits for m in self.members.values())

    def reset(self, prompt_ids: Tensor) -> None:
        for member in self.members.values():
            member.reset(prompt_ids)

    def clear(self) -> None:
        for member in self.members.values():
            member.clear()

    def propose(self, state: DecodeState) -> Draft | None:
        best, best_budget, best_rate, self.picked = None, 0, 0.0, ""
        for name, member in self.members.items():
            tree, budget, rate = member.price(state)
            if budget and rate > best_rate:
                best, best_budget, best_rate, self.picked = tree, budget, rate, name
        self._info = {"picked": self.picked, "expected_rate": best_rate, "nodes": best_budget}
        return cut(best, best_budget)  # only the winner's tree is cut

    def observe(self, tokens: Tensor, logits: Tensor) -> None:
        for member in self.members.values():
            if member.needs_logits:
                member.observe(tokens, logits)

    def update(self, committed: Tensor, accepted: Tensor) -> None:
        """Every member learns the committed tokens; only the picked one had its nodes accepted."""
        for name, member in self.members.items():
            member.update(committed, accepted if name == self.picked else NO_NODES)

    @property
    def last_info(self) -> dict[str, Any]:
        return self._info


def default_members(target: Any) -> list[str]:
    """pld, suffix, recycle and the model bigram; CREST too where the target's default code store exists."""
    from ..datastores.rest import default_store

    members = ["pld", "suffix", "recycle", "ngram-bigram"]
    return members + ["crest"] if default_store(target.name, "crest").exists() else members


# Member options the router sets (the others keep their method's defaults): bigram chains 4 deep, so that
# its rank-ordered tree can be cut to a chain.
MEMBER_OPTIONS: dict[str, dict[str, Any]] = {"ngram-bigram": {"k": 4, "w": 4}}


def make_auto(target: Any, options: AutoOptions) -> AutoDrafter:
    """Bench factory ``auto``: ``-o members=pld,suffix,...`` (default :func:`default_members`), ``-o crest=PATH``
    and ``-o dense=PATH`` for those members' stores (a given store makes its method a member), ``-o roofline=CSV``
    for the cost table."""
    from ..roofline import cost_model_for

    names = options.members.split(",") if options.members else default_members(target)
    stores = {"crest": options.crest, "dense": options.dense}
    names += [name for name, path in stores.items() if path and name not in names]  # a given store adds its member
    members = {}
    for name in names:
        values = dict(MEMBER_OPTIONS.get(name, {}))
        if stores.get(name):
            if not Path(stores[name]).exists():
                raise OptionError(f"auto: the {name} store {stores[name]} does not exist")
            values["datastore"] = stores[name]
        members[name] = make_drafter(name, target, values)
    return AutoDrafter(members, cost_model_for(target, options.roofline))
