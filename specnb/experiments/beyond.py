"""Beyond the seed papers (notebook 10): SuffixDecoding (``suffix``), Token Recycling (``recycle``) and the router
(``auto``) against prompt lookup, N-Grammys' adaptive mix and priced CREST, on code, chat, multi-turn chat and
repeated code requests, where what a drafter remembers from earlier requests can pay.

Each prompt set runs in one process with every method's drafter made once for the whole set
(:func:`specnb.experiments.endtoend.run_specs`), so cross-request structures (the suffix history, the recycle
table, the router's learned rates) grow over the set as they would in a server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..methods import SuffixOptions, make_drafter
from ..models import LoadedModel
from ..prompts import Prompt
from ..replay import modelled_speed, retrieval_ceiling, router_ceiling
from ..roofline import cost_model_for
from .endtoend import run_specs
from .references import greedy_references
from .runner import speedup_intervals, summarize

METHODS = ("ar", "pld", "mixed-adaptive", "crest-priced", "suffix", "recycle", "auto")
SINGLE = ("pld", "mixed-adaptive", "suffix", "recycle", "crest-priced")  # what the router must match
SETS = {"code": "humaneval", "chat": "mtbench", "multi-turn chat": "mtbench2", "repeated code": "humaneval2"}
MULTI_TURN = ("multi-turn chat", "repeated code")
CEILING_DEPTH = SuffixOptions.max_depth  # the retrieval ceiling drafts as deep as suffix may


def method_specs(crest_store: Path) -> dict[str, tuple[str, dict]]:
    """{label: (bench method, {option: value})} of :data:`METHODS`; CREST (priced, and as a router member)
    reads ``crest_store``."""
    specs: dict[str, tuple[str, dict]] = {name: (name, {}) for name in METHODS}
    specs["crest-priced"] = ("crest-priced", {"datastore": str(crest_store)})
    specs["auto"] = ("auto", {"crest": str(crest_store)})
    return specs


def beyond(target: LoadedModel, sets: dict[str, list[Prompt]], specs: dict[str, tuple], *, max_new_tokens: int,
           warmup: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Greedy runs of ``specs`` on every prompt set.

    Returns (summary, picks): summary has one row per (set, method) (:func:`specnb.experiments.summarize`:
    tokens/s, tokens per call, ``speedup_vs_ar``, ``identical_to_ar``, ``held_bytes`` = the most a drafter
    kept beyond the context, in bytes; ``retired``: the members a router had retired by the end of the set,
    comma-separated; ``vs_best_single_low`` / ``_high`` and ``vs_pld_low`` / ``_high``: the 90% interval of the
    method's speed over the best single method's (:data:`SINGLE`) and over pld's, resampling the set's prompts,
    :func:`specnb.metrics.rate_ratio_interval`); picks has one row per target call of ``auto`` (set, step from 0
    over the whole set, ``picked`` member or ``-`` for no draft).
    """
    summaries, picks = [], []
    for name, prompts in sets.items():
        rows = run_specs(target, prompts, specs, temperature=0.0, max_new_tokens=max_new_tokens, warmup=warmup)
        summary = summarize(rows).assign(set=name)
        best = summary[summary.method.isin(SINGLE)].set_index("method").tokens_per_s.idxmax()
        for label, baseline in (("best_single", best), ("pld", "pld")):  # the two comparisons
            intervals = speedup_intervals(rows, baseline)
            for end, index in (("_low", 0), ("_high", 1)):
                summary[f"vs_{label}{end}"] = summary.method.map({m: v[index] for m, v in intervals.items()})
        if "retired" in rows:
            summary["retired"] = summary.method.map(rows.groupby("method").retired.last())
        summaries.append(summary)
        if "picks" in rows:
            steps = " ".join(rows.loc[rows.picks.notna(), "picks"]).split()
            picks.append(pd.DataFrame({"set": name, "step": range(len(steps)), "picked": steps}))
    return pd.concat(summaries, ignore_index=True), pd.concat(picks, ignore_index=True) if picks else pd.DataFrame()


MERGED = "merged"  # the picks' label, in the charts, for every pair of members whose trees were verified together


def pick_shares(picks: pd.DataFrame, window: int = 25) -> dict[str, pd.DataFrame]:
    """{set: [steps, members]} share of the last ``window`` calls each member drafted (``-``: none; ``merged``:
    two members' trees together, whichever), for a stacked-area chart of what the router picked over a run; the
    same columns, in the same order, for every set (so that a member keeps its colour)."""
    picked = picks.picked.where(~picks.picked.str.contains("+", regex=False), MERGED)
    members = ["-", *sorted(set(picked) - {"-"})]
    shares = {}
    for name, group in picks.assign(picked=picked).groupby("set", sort=False):
        onehot = pd.get_dummies(group.set_index("step").picked).reindex(columns=members, fill_value=0).astype(float)
        shares[name] = onehot.rolling(window, min_periods=1).mean()
    return shares


def ceilings(target: LoadedModel, sets: dict[str, list[Prompt]], *, max_new_tokens: int,
             depth: int = CEILING_DEPTH) -> dict[str, float]:
    """{set: the most tokens per call any drafter retrieving from text it has seen could reach}
    (:func:`specnb.replay.retrieval_ceiling` over the target's greedy outputs, ``depth`` deep: suffix's
    depth cap by default), for the same prompts in the same order as :func:`beyond` runs them."""
    return {name: retrieval_ceiling(greedy_references(target, prompts, max_new_tokens), depth)
            for name, prompts in sets.items()}


def router_gap(target: LoadedModel, sets: dict[str, list[Prompt]], auto_options: dict[str, Any], *,
               max_new_tokens: int) -> tuple[dict[str, dict[str, float]], list[str]]:
    """How far the router's estimates leave it from a router that knew each step's outcome, per set.

    Replays the target's greedy outputs (the prompts in :func:`beyond`'s order) priced on this machine's cost
    table (:func:`specnb.replay.modelled_speed`: no noise, no overheads) for ``auto`` (made with
    ``auto_options``) restricted to the members that replay without the target (all but those reading its
    logits or hidden state: recycle, dense), and for :class:`specnb.replay.HindsightRouter` over the same
    members. Returns ({set: {``auto_vs_pld``, ``hindsight_vs_pld``: each one's modelled tokens/s over pld's}},
    the members replayed).
    """
    cost = cost_model_for(target)
    seated = make_drafter("auto", target, auto_options).members
    members = [name for name, m in seated.items() if not (m.needs_logits or m.needs_hidden_state)]
    options = {**auto_options, "members": ",".join(members)}
    out = {}
    for name, prompts in sets.items():
        references = greedy_references(target, prompts, max_new_tokens)
        pld = modelled_speed(make_drafter("pld", target), references, cost)[1]
        auto = modelled_speed(make_drafter("auto", target, options), references, cost)[1]
        bases = {member: priced.base for member, priced in make_drafter("auto", target, options).members.items()}
        hindsight = router_ceiling(bases, references, cost)[1]
        out[name] = {"auto_vs_pld": auto / pld, "hindsight_vs_pld": hindsight / pld}
    return out, members


# The method whose colour a router member takes in the charts (the model bigram is mixed-adaptive's second half).
MEMBER_METHOD = {"pld": "pld", "suffix": "suffix", "recycle": "recycle", "crest": "crest-priced",
                 "ngram-bigram": "mixed-adaptive"}


def member_colors(palette: dict[str, Any], members: list[str]) -> list[Any]:
    """The colour of each router member (``members``, as :func:`pick_shares` orders them): its method's in
    ``palette`` ({method: colour}), light grey for ``-`` (no draft), dim grey for ``merged`` (two members' trees),
    black for a member with no method there."""
    fixed = {"-": "lightgrey", MERGED: "dimgrey"}
    return [fixed.get(m) or palette.get(MEMBER_METHOD.get(m, m), "black") for m in members]


def verdicts(summary: pd.DataFrame, ceiling: dict[str, float]) -> dict[str, dict[str, float]]:
    """The issue's ratios per set: ``auto_vs_best`` (auto's tokens/s over the best single method's, and
    which), ``auto_vs_pld``, ``suffix_vs_pld_tokens_per_call`` and, to read it against,
    ``ceiling_vs_pld_tokens_per_call``: the retrieval ceiling (:func:`ceilings`) over pld's tokens per call;
    ``retired``: the members auto retired (``none``); ``auto_vs_best_low`` / ``_high`` and ``auto_vs_pld_low`` /
    ``_high``: the 90% intervals of the two speed ratios over the set's prompts (:func:`beyond`)."""
    out = {}
    for name, group in summary.groupby("set", sort=False):
        rate = group.set_index("method").tokens_per_s
        per_call = group.set_index("method").tokens_per_call
        auto = group.set_index("method").loc["auto"]
        singles = rate[rate.index.isin(SINGLE)]
        out[name] = {"best_single": singles.idxmax(), "auto_vs_best": rate["auto"] / singles.max(),
                     "auto_vs_best_low": auto.vs_best_single_low, "auto_vs_best_high": auto.vs_best_single_high,
                     "auto_vs_pld": rate["auto"] / rate["pld"],
                     "auto_vs_pld_low": auto.vs_pld_low, "auto_vs_pld_high": auto.vs_pld_high,
                     "suffix_vs_pld_tokens_per_call": per_call["suffix"] / per_call["pld"],
                     "ceiling_vs_pld_tokens_per_call": ceiling[name] / per_call["pld"],
                     "retired": _retired(group)}
    return out


def _retired(group: pd.DataFrame) -> str:
    """The members ``auto`` retired on one set (summary rows of :func:`beyond`), or ``none``."""
    value = group.loc[group.method == "auto", "retired"].iloc[0] if "retired" in group else None
    return value if isinstance(value, str) and value else "none"
