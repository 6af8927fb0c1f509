"""Beyond the seed papers (notebook 10): SuffixDecoding (``suffix``), Token Recycling (``recycle``) and the router
(``auto``) against prompt lookup, N-Grammys' adaptive mix and priced CREST, on code, chat, multi-turn chat and
repeated code requests, where what a drafter remembers from earlier requests can pay.

Each prompt set runs in one process with every method's drafter made once for the whole set
(:func:`specnb.eval.bench.run_bench`), so cross-request structures (the suffix history, the recycle
table, the router's learned rates) grow over the set as they would in a server.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.metrics import rate_ratio_interval
from ..core.prompts import Prompt
from ..drafters import suffix
from ..drafters.auto import Options as AutoOptions
from ..eval.bench import BenchConfig, run_bench
from ..eval.methods import make_drafter
from ..eval.replay import longest_retrieved, modelled_speed, retrieval_ceiling, router_ceiling
from ..eval.runner import ratio_intervals, speedup_intervals, summarize
from ..eval.timing import cost_model_for
from ..model.models import LoadedModel
from ..study.verdicts import TIE, Expect
from .endtoend import call_cost, per_call_cause
from .references import greedy_references

METHODS = ("ar", "pld", "mixed-adaptive", "crest-priced", "suffix", "recycle", "auto")
SINGLE = ("pld", "mixed-adaptive", "suffix", "recycle", "crest-priced")  # what the router must match
TIMED = ("ar", "pld", "suffix", "recycle", "auto")
"""Notebook 10's timed methods: what its comparisons need. The router's other members are timed elsewhere: the
model bigram's mixed drafts (``mixed-adaptive``) in notebook 06, CREST priced for this machine
(``crest-priced``) in notebook 09."""
SETS = {"code": "humaneval", "chat": "mtbench", "multi-turn chat": "mtbench2", "repeated code": "humaneval2"}
TIMED_SETS = ("code", "multi-turn chat", "repeated code")
"""Notebook 10's timed sets: single-turn chat is left out (its prompts are the first turns of ``multi-turn chat``;
prompt lookup on MT-Bench first turns is timed in notebook 06)."""
CEILING_DEPTH = suffix.Options.max_depth  # the retrieval ceiling drafts as deep as suffix may


def beyond_config(crest_store: Path, methods: tuple[str, ...] = METHODS, *, max_new_tokens: int,
                  warmup: int = 8) -> BenchConfig:
    """The greedy :class:`~specnb.eval.bench.BenchConfig` of ``methods`` (of :data:`METHODS`); CREST (priced, and
    as a router member) reads ``crest_store``."""
    options: dict[str, dict] = {name: {} for name in methods}
    if "crest-priced" in options:
        options["crest-priced"] = {"datastore": str(crest_store)}
    if "auto" in options:
        options["auto"] = {"crest": str(crest_store)}
    return BenchConfig(list(methods), max_new_tokens=max_new_tokens, options=options, warmup_tokens=warmup)


def beyond(target: LoadedModel, sets: dict[str, list[Prompt]], config: BenchConfig, *, progress: bool = False,
           ceiling: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Greedy runs of ``config`` (:func:`beyond_config`) on every prompt set, each set in one
    :func:`specnb.eval.bench.run_bench` (every drafter made once per set).

    Returns (summary, picks): summary has one row per (set, method) (:func:`specnb.eval.runner.summarize`:
    tokens/s, tokens per call, ``speedup_vs_ar``, ``identical_to_ar``, ``held_bytes`` = the most a drafter
    kept beyond the context, in bytes; ``retired``: the members a router had retired by the end of the set,
    comma-separated; ``vs_best_single_low`` / ``_high`` and ``vs_pld_low`` / ``_high``: the 90% interval of the
    method's speed over the best single method's (:data:`SINGLE`) and over pld's, resampling the set's prompts,
    :func:`specnb.core.metrics.rate_ratio_interval`); ``tpc_vs_pld_low`` / ``_high``: the same for the method's tokens
    per call over pld's; picks has one row per target call of ``auto`` (set, step from 0 over the whole set,
    the call's ``prompt_id``, ``picked`` member or ``-`` for no draft). ``progress``: a bar over the sets. ``ceiling``:
    :func:`ceiling_prompts`' rows for the same sets and budget, which add ``tpc_vs_ceiling`` with its ``_low`` /
    ``_high``: the method's tokens per call over the retrieval ceiling's, paired by prompt.
    """
    summaries, picks = [], []
    for name, prompts in tqdm(sets.items(), desc="prompt sets", disable=not progress):
        rows = run_bench(target, prompts, config, progress=False)
        summary = summarize(rows).assign(set=name)
        nodes = rows.groupby("method").drafted_nodes.sum(min_count=1) / rows.groupby("method").calls.sum(min_count=1)
        summary["draft_nodes_per_call"] = summary.method.map(nodes)
        best = summary[summary.method.isin(SINGLE)].set_index("method").tokens_per_s.idxmax()
        for label, baseline in (("best_single", best), ("pld", "pld")):  # the two comparisons
            intervals = speedup_intervals(rows, baseline)
            for end, index in (("_low", 0), ("_high", 1)):
                summary[f"vs_{label}{end}"] = summary.method.map({m: v[index] for m, v in intervals.items()})
        if "pld" in config.methods:
            per_call = ratio_intervals(rows, "pld", "tokens_per_call")
            for end, index in (("_low", 0), ("_high", 1)):
                summary[f"tpc_vs_pld{end}"] = summary.method.map({m: v[index] for m, v in per_call.items()})
        if ceiling is not None:
            _against_ceiling(summary, rows, ceiling[ceiling.set == name])
        if "retired" in rows:
            summary["retired"] = summary.method.map(rows.groupby("method").retired.last())
        summaries.append(summary)
        if "picks" in rows:
            runs = rows.loc[rows.picks.notna(), ["prompt_id", "picks"]]
            per_prompt = [(prompt, step) for prompt, text in zip(runs.prompt_id, runs.picks, strict=True)
                          for step in text.split()]
            picks.append(pd.DataFrame({"set": name, "step": range(len(per_prompt)),
                                       "prompt_id": [p for p, _ in per_prompt], "picked": [s for _, s in per_prompt]}))
    return pd.concat(summaries, ignore_index=True), pd.concat(picks, ignore_index=True) if picks else pd.DataFrame()


ALL_CALLS = "all calls"  # the row of :func:`pick_shares` that pools a set's prompts


def _member_calls(picks: pd.DataFrame) -> pd.DataFrame:
    """One row per (call, member who drafted it): columns set, prompt_id, member and share, a call merging k
    members' trees counted 1/k to each, drawn as :data:`specnb.study.plots.SHARED` (``crest+``), a call drafted
    alone 1 to its member, ``-`` (no draft) 1 to ``-``."""
    from ..study.plots import SHARED

    members = picks.picked.str.split("+", regex=False)
    merged = members.str.len() > 1
    rows = picks.assign(member=members, share=1.0 / members.str.len(), merged=merged).explode("member")
    rows["member"] = rows.member.where(~rows.merged, rows.member + SHARED)
    return rows[["set", "prompt_id", "member", "share"]]


def pick_shares(picks: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """{set: [rows, members]} the share of a prompt's target calls each member drafted, one row per prompt in the
    order they ran (``prompt 1`` ...; the router goes on learning from one to the next), then :data:`ALL_CALLS`
    over the set, for a stacked bar per row (:func:`specnb.study.plots.stacked_shares`). A member's calls alone
    are column ``member``, its share of the calls it merged with another (half of each pair's) ``member+``
    beside it, ``-`` the calls with no draft; the same columns, members in the study's method order, for every
    set (so that a member keeps its colour and its place)."""
    from ..study.plots import SHARED, method_rank

    calls = _member_calls(picks)
    drafted = sorted({m.removesuffix(SHARED) for m in calls.member} - {"-"},
                     key=lambda m: (method_rank(m) is None, method_rank(m) or 0, m))
    columns = [c for m in drafted for c in (m, m + SHARED) if (calls.member == c).any()]
    columns += ["-"] if (calls.member == "-").any() else []
    shares = {}
    for name, group in calls.groupby("set", sort=False):
        order = list(dict.fromkeys(group.prompt_id))
        counts = group.pivot_table(index="prompt_id", columns="member", values="share", aggfunc="sum")
        counts = counts.reindex(index=order, columns=columns).fillna(0.0)
        counts.index = [f"prompt {i}" for i in range(1, len(order) + 1)]
        counts.loc[ALL_CALLS] = counts.sum()
        shares[name] = counts.div(counts.sum(axis=1), axis=0).astype(float)
    return shares


def member_shares(picks: pd.DataFrame, merged: bool = True) -> dict[str, dict[str, float]]:
    """{set: {member: share of the set's target calls}}: each member's calls alone plus, with ``merged``, its share
    of the merged ones (a pair's call half to each; each set's shares then sum to 1); ``-`` the calls with no
    draft."""
    from ..study.plots import SHARED

    calls = _member_calls(picks)
    total = calls.groupby("set", sort=False).share.sum()
    calls = calls if merged else calls[~calls.member.str.endswith(SHARED)]
    calls = calls.assign(member=calls.member.str.removesuffix(SHARED))
    return {name: (g.groupby("member").share.sum() / total[name]).to_dict()
            for name, g in calls.groupby("set", sort=False)}


def ceilings(target: LoadedModel, sets: dict[str, list[Prompt]], *, max_new_tokens: int,
             depth: int = CEILING_DEPTH) -> dict[str, float]:
    """{set: the most tokens per call any drafter retrieving from text it has seen could reach}
    (:func:`specnb.eval.replay.retrieval_ceiling` over the target's greedy outputs, ``depth`` deep: suffix's
    depth cap by default), for the same prompts in the same order as :func:`beyond` runs them."""
    return {name: retrieval_ceiling(greedy_references(target, prompts, max_new_tokens), depth)
            for name, prompts in sets.items()}


def ceiling_prompts(target: LoadedModel, sets: dict[str, list[Prompt]], *, max_new_tokens: int,
                    depth: int = CEILING_DEPTH) -> pd.DataFrame:
    """The retrieval ceiling per prompt: one row per (set, prompt, in :func:`beyond`'s order) with ``produced``
    (new tokens after the prefill's) and ``calls`` (target calls the ceiling's drafter needs), so that a set's
    produced.sum() / calls.sum() is :func:`ceilings`' number and a method's tokens per call can be set against it
    prompt by prompt. Each set's history of earlier outputs grows as :func:`specnb.eval.replay.retrieval_ceiling`'s."""
    out = []
    for name, prompts in sets.items():
        history = np.empty(0, dtype=np.int64)  # earlier outputs, each followed by a -1 that matches no token
        for prompt, (prompt_ids, output) in zip(prompts, greedy_references(target, prompts, max_new_tokens),
                                                 strict=True):
            tokens = torch.cat([torch.as_tensor(prompt_ids, dtype=torch.long), torch.as_tensor(output)]).numpy()
            n_prompt, end = tokens.shape[0] - len(output), tokens.shape[0] - 1
            pos, calls = n_prompt, 0
            while pos < end:
                future = tokens[pos + 1:pos + 1 + min(depth, end - pos - 1)]
                calls, pos = calls + 1, pos + 1 + longest_retrieved(tokens[:pos + 1], history, future)
            history = np.concatenate([history, tokens[n_prompt:], [-1]])
            out.append({"set": name, "prompt_id": prompt.id, "produced": end - n_prompt, "calls": calls})
    return pd.DataFrame(out)


def set_ceilings(frame: pd.DataFrame) -> dict[str, float]:
    """{set: produced / calls over its prompts} of :func:`ceiling_prompts`' rows (:func:`ceilings`' numbers)."""
    sums = frame.groupby("set", sort=False)[["produced", "calls"]].sum()
    return (sums.produced / sums.calls).to_dict()


def router_gap(target: LoadedModel, sets: dict[str, list[Prompt]], auto_options: AutoOptions, *,
               max_new_tokens: int) -> tuple[dict[str, dict[str, float]], list[str]]:
    """How far the router's estimates leave it from a router that knew each step's outcome, per set.

    Replays the target's greedy outputs (the prompts in :func:`beyond`'s order) priced on this machine's cost
    table (:func:`specnb.eval.replay.modelled_speed`: no noise, no overheads) for ``auto`` (made with
    ``auto_options``) restricted to the members that replay without the target (all but those reading its
    logits or hidden state: recycle, dense), and for :class:`specnb.drafters.hindsight.HindsightRouter` over the same
    members. Returns ({set: {``auto_vs_pld``, ``hindsight_vs_pld``: each one's modelled tokens/s over pld's}},
    the members replayed).
    """
    cost = cost_model_for(target)
    seated = make_drafter("auto", target, auto_options).members
    members = [name for name, m in seated.items() if not (m.needs_logits or m.needs_hidden_state)]
    options = dataclasses.replace(auto_options, members=tuple(members))
    out = {}
    for name, prompts in sets.items():
        references = greedy_references(target, prompts, max_new_tokens)
        pld = modelled_speed(make_drafter("pld", target), references, cost)[1]
        auto = modelled_speed(make_drafter("auto", target, options), references, cost)[1]
        bases = {member: priced.base for member, priced in make_drafter("auto", target, options).members.items()}
        hindsight = router_ceiling(bases, references, cost)[1]
        out[name] = {"auto_vs_pld": auto / pld, "hindsight_vs_pld": hindsight / pld}
    return out, members


def verdicts(summary: pd.DataFrame, ceiling: dict[str, float]) -> dict[str, dict[str, float]]:
    """The issue's ratios per set: ``auto_vs_best`` (auto's tokens/s over the best single method's, and
    which), ``auto_vs_pld``, ``suffix_vs_pld_tokens_per_call`` and, to read it against,
    ``ceiling_vs_pld_tokens_per_call``: the retrieval ceiling (:func:`ceilings`) over pld's tokens per call;
    ``suffix_vs_ceiling``: suffix's tokens per call over the ceiling; ``suffix_vs_pld``: suffix's tokens/s over
    pld's; ``retired``: the members auto retired (``none``); ``_low`` / ``_high`` of each ratio: its 90% interval
    over the set's prompts, paired by prompt (:func:`beyond`; NaN where the summary carries none)."""
    out = {}
    for name, group in summary.groupby("set", sort=False):
        rows = group.set_index("method")
        rate, per_call = rows.tokens_per_s, rows.tokens_per_call
        get = _getter(rows)
        singles = rate[rate.index.isin(SINGLE)]
        out[name] = {"best_single": singles.idxmax(), "auto_vs_best": rate["auto"] / singles.max(),
                     "auto_vs_best_low": get("auto", "vs_best_single_low"),
                     "auto_vs_best_high": get("auto", "vs_best_single_high"),
                     "auto_vs_pld": rate["auto"] / rate["pld"],
                     "auto_vs_pld_low": get("auto", "vs_pld_low"), "auto_vs_pld_high": get("auto", "vs_pld_high"),
                     "suffix_vs_pld_tokens_per_call": per_call["suffix"] / per_call["pld"],
                     "suffix_vs_pld_tokens_per_call_low": get("suffix", "tpc_vs_pld_low"),
                     "suffix_vs_pld_tokens_per_call_high": get("suffix", "tpc_vs_pld_high"),
                     "ceiling_vs_pld_tokens_per_call": ceiling[name] / per_call["pld"],
                     "suffix_vs_ceiling": per_call["suffix"] / ceiling[name],
                     "suffix_vs_ceiling_low": get("suffix", "tpc_vs_ceiling_low"),
                     "suffix_vs_ceiling_high": get("suffix", "tpc_vs_ceiling_high"),
                     "suffix_vs_pld": rate["suffix"] / rate["pld"],
                     "suffix_vs_pld_low": get("suffix", "vs_pld_low"),
                     "suffix_vs_pld_high": get("suffix", "vs_pld_high"),
                     "retired": _retired(group)}
        for method in ("auto", "recycle"):  # drawn beside the comparisons (:func:`figure_ratios`), not judged
            out[name].update({f"{method}_vs_pld_tokens_per_call": per_call.get(method, math.nan) / per_call["pld"],
                              f"{method}_vs_pld_tokens_per_call_low": get(method, "tpc_vs_pld_low"),
                              f"{method}_vs_pld_tokens_per_call_high": get(method, "tpc_vs_pld_high")})
        out[name].update({"recycle_vs_pld": rate.get("recycle", math.nan) / rate["pld"],
                          "recycle_vs_pld_low": get("recycle", "vs_pld_low"),
                          "recycle_vs_pld_high": get("recycle", "vs_pld_high")})
    return out


FIGURE_RATIOS = {
    "speed": (("auto", "best", "auto_vs_best"), ("auto", "pld", "auto_vs_pld"),
              ("suffix", "pld", "suffix_vs_pld"), ("recycle", "pld", "recycle_vs_pld")),
    "tokens_per_call": (("auto", "pld", "auto_vs_pld_tokens_per_call"),
                        ("suffix", "pld", "suffix_vs_pld_tokens_per_call"),
                        ("recycle", "pld", "recycle_vs_pld_tokens_per_call"),
                        ("suffix", "ceiling", "suffix_vs_ceiling"))}
"""The ratios notebook 10 draws per metric: (method, what it is set over: a method or a
:data:`specnb.study.plots.REFERENCES` key, :func:`verdicts`' key), in one order for both figures (auto, then the
drafters in the study's method order): each a ratio of two runs on the same prompts with its paired 90% interval."""


def ratio_row(method: str, over: str) -> str:
    """A ratio's tick label, on two lines (the figure's names, :func:`specnb.study.plots.label`): "SuffixDecoding /
    prompt lookup" is too long for one."""
    from ..study.plots import label

    return f"{label(method)} /\n{label(over)}"


def figure_ratios(summary: pd.DataFrame, ceiling: dict[str, float], metric: str) -> pd.DataFrame:
    """:data:`FIGURE_RATIOS`' ratios of ``metric`` (``speed``: tokens/s; ``tokens_per_call``) per set, from
    :func:`verdicts` (the numbers :func:`compare_beyond` judges), one row each for
    :func:`specnb.study.plots.paired_ratios`: row ("SuffixDecoding / prompt lookup"), group (the set), value,
    low, high, method; a method the run left out has no row."""
    rows = [{"row": ratio_row(method, over), "group": name, "value": v[key], "low": v.get(f"{key}_low", math.nan),
             "high": v.get(f"{key}_high", math.nan), "method": method}
            for name, v in verdicts(summary, ceiling).items() for method, over, key in FIGURE_RATIOS[metric]
            if np.isfinite(v[key])]
    frame = pd.DataFrame(rows, columns=["row", "group", "value", "low", "high", "method"])
    order = {ratio_row(m, o): i for i, (m, o, _) in enumerate(FIGURE_RATIOS[metric])}
    return frame.sort_values("row", key=lambda r: r.map(order), kind="stable").reset_index(drop=True)


# ArcticInference's documentation of SuffixDecoding, "Key Benchmarks" (vLLM v0.8.4): tokens/s without speculation,
# with vLLM's n-gram (prompt lookup) drafter and with suffix decoding.
ARCTIC = {"HumanEval": {"none": 77.2, "ngram": 100.0, "suffix": 148.0},
          "ShareGPT": {"none": 76.0, "ngram": 91.2, "suffix": 113.0}}
ARCTIC_SET = {"HumanEval": "code", "ShareGPT": "multi-turn chat"}  # our set closest to each of their workloads
RECYCLE_SPEEDUP = 2.0  # Token Recycling's abstract: "approximately 2x speedup across all sizes of LLMs"
RECYCLE_STORAGE_MB = 2.0  # ... and "<2MB of additional storage"
RECYCLE_SET = "multi-turn chat"  # ours closest to Spec-Bench's multi-turn conversation (MT-Bench)

SUFFIX_SETUP = {"model": "Llama-3.1 (8B–70B in the project's blog)", "hardware": "GPUs (vLLM v0.8.4)",
                "dtype": "bf16 / fp8 (vLLM)", "datastore": "outputs of earlier requests (global suffix tree)",
                "prompts × tokens": "benchmark workloads (not stated with the table)",
                "task": "ShareGPT, HumanEval, SWE-Bench, mixed"}
RECYCLE_SETUP = {"model": "Vicuna 7B / 13B / 33B (vocabulary 32,000)", "hardware": "GPU", "dtype": "fp16",
                 "datastore": "the V × k adjacency matrix of earlier top-k tokens",
                 "prompts × tokens": "Spec-Bench (480 prompts, six tasks)",
                 "task": "Spec-Bench: conversation, translation, summarization, QA, math, RAG"}


def compare_beyond(report: Any, summary: pd.DataFrame, ceiling: dict[str, float], router: dict[str, dict[str, float]],
                   cost: Any, setup: dict[str, str]) -> dict[str, dict[str, float]]:
    """Every comparison notebook 10 concludes from, as :meth:`Results.compare` calls on :func:`verdicts`' ratios
    (returned): per set, auto against the best single method and against pld, suffix's tokens per call against
    pld's and under the retrieval ceiling; the published SuffixDecoding and Token Recycling speedups against ours,
    with :meth:`Results.setup` tables. router: :func:`router_gap`'s ratios (a cause when auto falls short); cost:
    notebook 05's cost model (what a call of a method's draft tokens costs here); setup: ours in
    :data:`specnb.study.results.SETUP_FIELDS` words."""
    found = verdicts(summary, ceiling)
    rows = summary.set_index(["set", "method"])
    for name, v in found.items():
        gap = router.get(name, {})
        estimates = (f"replayed on the cost table, auto reaches ×{gap.get('auto_vs_pld', math.nan):.2f} pld's speed "
                     f"and a router that knew each step's outcome ×{gap.get('hindsight_vs_pld', math.nan):.2f}")
        replayed = {"auto over pld, replayed": gap.get("auto_vs_pld", math.nan),
                    "hindsight router over pld, replayed": gap.get("hindsight_vs_pld", math.nan)}
        report.compare(f"auto_vs_best_{name}", f"{name}: auto at least as fast as the fastest single method timed "
                       f"({v['best_single']}), at most {TIE:.0%} slower", v["auto_vs_best"], v["auto_vs_best_low"],
                       v["auto_vs_best_high"], Expect.above(1.0 - TIE), "the router's aim (ours)", cause=estimates,
                       internal=True, direction_only=False, evidence=replayed)
        report.compare(f"auto_vs_pld_{name}", f"{name}: auto faster than prompt lookup", v["auto_vs_pld"],
                       v["auto_vs_pld_low"], v["auto_vs_pld_high"], Expect.above(1.0, TIE), "prompt lookup (ours)",
                       cause=estimates, internal=True, direction_only=False, evidence=replayed)
        little = v["ceiling_vs_pld_tokens_per_call"] < 1 + 0.1
        report.compare(f"suffix_tpc_{name}", f"{name}: SuffixDecoding's tokens per call over prompt lookup's",
                       v["suffix_vs_pld_tokens_per_call"], v["suffix_vs_pld_tokens_per_call_low"],
                       v["suffix_vs_pld_tokens_per_call_high"], Expect.above(1.0, TIE),
                       "SuffixDecoding (earlier requests' outputs searched too)",
                       cause=f"the retrieval ceiling is ×{v['ceiling_vs_pld_tokens_per_call']:.2f} pld's: "
                       + ("little of this set's text repeats earlier text" if little else
                          "suffix's tree leaves out continuations the ceiling's tree holds"),
                       internal=True, direction_only=False,
                       evidence={"ceiling over pld, tokens per call": v["ceiling_vs_pld_tokens_per_call"]})
        report.compare(f"suffix_ceiling_{name}", f"{name}: SuffixDecoding's tokens per call over the retrieval "
                       "ceiling's (it drafts a subtree of the ceiling's tree)", v["suffix_vs_ceiling"],
                       v["suffix_vs_ceiling_low"], v["suffix_vs_ceiling_high"], Expect.within(0.0, 1.0),
                       "the retrieval ceiling (specnb.eval.replay)",
                       cause="above the ceiling: suffix drafted what no earlier text holds (a bug)", internal=True,
                       direction_only=False)
    for workload, ours in ARCTIC_SET.items():
        if (ours, "suffix") not in rows.index:
            continue
        paper = ARCTIC[workload]
        r = rows.loc[(ours, "suffix")]
        here, evidence = per_call_cause(r, cost)
        report.compare(f"suffix_published_{ours}", f"{ours}: SuffixDecoding's speedup over AR (theirs: {workload})",
                       r.speedup_vs_ar, r.speedup_vs_ar_low, r.speedup_vs_ar_high,
                       Expect.published([paper["suffix"] / paper["none"]]), "ArcticInference docs",
                       cause=here + "; theirs: vLLM on GPUs", internal=False, direction_only=False, evidence=evidence)
        v = found[ours]
        pld = rows.loc[(ours, "pld")]
        ours_cost, pld_cost = call_cost(cost, r.draft_nodes_per_call), call_cost(cost, pld.draft_nodes_per_call)
        calls = (f"×{v['suffix_vs_pld_tokens_per_call']:.2f} pld's tokens per call here, from calls of "
                 f"{r.draft_nodes_per_call:.1f} against {pld.draft_nodes_per_call:.1f} draft tokens (×{ours_cost:.2f} "
                 f"against ×{pld_cost:.2f} a one-token call on this CPU); theirs: vLLM on GPUs")
        report.compare(f"suffix_vs_ngram_published_{ours}", f"{ours}: SuffixDecoding's speed over prompt lookup's "
                       f"(theirs: {workload}, vLLM's n-gram drafter)", v["suffix_vs_pld"], v["suffix_vs_pld_low"],
                       v["suffix_vs_pld_high"], Expect.published([paper["suffix"] / paper["ngram"]]),
                       "ArcticInference docs", cause=calls, internal=False, direction_only=False,
                       evidence={"suffix over pld, tokens per call": v["suffix_vs_pld_tokens_per_call"],
                                 "suffix draft tokens per call": r.draft_nodes_per_call,
                                 "pld draft tokens per call": pld.draft_nodes_per_call,
                                 "suffix call cost": ours_cost, "pld call cost": pld_cost})
    if (RECYCLE_SET, "recycle") in rows.index:
        r = rows.loc[(RECYCLE_SET, "recycle")]
        here, evidence = per_call_cause(r, cost)
        report.compare("recycle_published", f"{RECYCLE_SET}: Token Recycling's speedup over AR (theirs: Spec-Bench)",
                       r.speedup_vs_ar, r.speedup_vs_ar_low, r.speedup_vs_ar_high,
                       Expect.published([RECYCLE_SPEEDUP]), "Token Recycling (abstract)",
                       cause=here + "; theirs: wider trees, on a GPU", internal=False, direction_only=False,
                       evidence=evidence)
        held = summary.loc[summary.method == "recycle", "held_bytes"].max() / 2**20
        report.compare("recycle_storage", "Token Recycling's table in MB (a size: no interval)", held, math.nan,
                       math.nan, Expect.below(RECYCLE_STORAGE_MB), "Token Recycling (abstract)",
                       cause="the V × k table grows with the vocabulary: this target's against Vicuna's 32,000",
                       internal=False, direction_only=False)
    report.takeaway("10_beyond_the_seeds", "auto over the fastest single method timed: " + ", ".join(
        f"×{{verdicts[auto_vs_best_{name}][ours]:.2f}} on {name}" for name in found))
    report.takeaway("10_tokens_per_call", "SuffixDecoding's tokens per call over prompt lookup's: " + ", ".join(
        f"×{{verdicts[suffix_tpc_{name}][ours]:.2f}} on {name}" for name in found))
    report.setup("SuffixDecoding (ArcticInference docs)", here=setup, theirs=SUFFIX_SETUP)
    report.setup("Token Recycling (arXiv 2408.08696)", here=setup, theirs=RECYCLE_SETUP)
    return found


def _against_ceiling(summary: pd.DataFrame, rows: pd.DataFrame, ceiling: pd.DataFrame) -> None:
    """Add ``tpc_vs_ceiling`` / ``_low`` / ``_high`` to one set's ``summary`` in place: each method's tokens per
    call over the retrieval ceiling's (``ceiling``: that set's :func:`ceiling_prompts` rows), paired by prompt."""
    values: dict[str, tuple[float, float, float]] = {}
    for method, group in rows.groupby("method", sort=False):
        both = group.merge(ceiling, on="prompt_id", suffixes=("", "_ceiling"))
        made, calls = both.new_tokens.to_numpy(float) - 1, both.calls.to_numpy(float)
        base, base_calls = both.produced.to_numpy(float), both.calls_ceiling.to_numpy(float)
        point = made.sum() / calls.sum() / (base.sum() / base_calls.sum())
        values[method] = (point, *rate_ratio_interval(made, calls, base, base_calls))
    for i, column in enumerate(("tpc_vs_ceiling", "tpc_vs_ceiling_low", "tpc_vs_ceiling_high")):
        summary[column] = summary.method.map({m: v[i] for m, v in values.items()})


def _getter(rows: pd.DataFrame) -> Any:
    """(method, column) -> the value in ``rows`` (indexed by method), NaN where the column or method is missing."""
    return lambda method, column: rows[column].get(method, math.nan) if column in rows else math.nan


def _retired(group: pd.DataFrame) -> str:
    """The members ``auto`` retired on one set (summary rows of :func:`beyond`), or ``none``."""
    value = group.loc[group.method == "auto", "retired"].iloc[0] if "retired" in group else None
    return value if isinstance(value, str) and value else "none"


def router_text(names: Any) -> str:
    """A :meth:`Results.render` template fragment stating :func:`router_gap`'s ratios (``ours[router]``) for each
    set in ``names``: auto's modelled speed over pld's, and the hindsight router's."""
    return "; ".join(f"{name}: auto ×{{ours[router][{name}][auto_vs_pld]:.2f}}, a router knowing each outcome "
                     f"×{{ours[router][{name}][hindsight_vs_pld]:.2f}}" for name in names)


def picks_takeaway(report, picks: pd.DataFrame) -> None:
    """The front page's line for the router's picks figure: per set, the member that drafted the most calls (its
    merged calls counted half, :func:`member_shares`), its calls alone (the figure's solid segment) and the share of
    calls with no draft, from ``ours[picked]`` and ``ours[picked_alone]`` (:func:`member_shares` of ``picks`` with
    and without the merged calls, which the notebook adds)."""
    from ..study.plots import label

    parts = []
    for name, shares in member_shares(picks).items():
        members = {m: v for m, v in shares.items() if m != "-"}
        if not members:
            parts.append(f"no member drafted on {name}")
            continue
        top = max(members, key=members.get)
        part = f"{label(top)} drafted {{ours[picked][{name}][{top}]:.0%}} of calls on {name}, " \
               f"{{ours[picked_alone][{name}][{top}]:.0%}} alone"
        parts.append(part + (f" (no draft: {{ours[picked][{name}][-]:.0%}})" if "-" in shares else ""))
    if parts:
        report.takeaway("10_router_picks", "auto's most used member (a call merging two members' trees counted half "
                        "to each): " + "; ".join(parts))
