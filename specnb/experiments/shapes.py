"""Draft-shape ablations (notebook 08): every drafter family over one width x depth grid, a few shapes measured
in both verification modes, and MCSD's shape order.

A *shape* (k, w) is k drafts of up to w tokens for the batch drafters (context n-grams, model bigram, mixed,
DReSD), a ranked tree cut to depth w and k * w nodes for REST and CREST (their node order is rank order, so
the first b nodes are the best b-node tree), and a k x 1 x ... x 1 tree (k candidates, then chains) for a draft
model. Trees above ``MAX_NODES`` nodes are left out, as in the papers' 64-node verification budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..datastores.crest import CrestStore
from ..datastores.dense import load_datastore
from ..datastores.ngram_tables import BigramTable
from ..datastores.rest import DEFAULT_SEARCH, RestIndex
from ..draft import Draft
from ..drafters.base import DecodeState, Drafter
from ..drafters.context import ContextNgramDrafter
from ..drafters.crest import CrestDrafter
from ..drafters.dense import DenseDrafter
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.mixed import MixedDrafter
from ..drafters.model_ngram import BigramDrafter
from ..drafters.rest import RestDrafter
from ..models import LoadedModel
from ..prompts import Prompt
from ..replay import Reference
from .grids import replay_table
from .runner import Variant, run, summarize

GRID_K = (1, 2, 4, 8, 16)
GRID_W = (1, 2, 4, 8, 16)
MAX_NODES = 64


def grid_shapes(ks: tuple[int, ...] = GRID_K, ws: tuple[int, ...] = GRID_W, max_nodes: int = MAX_NODES,
                max_k: int | None = None) -> list[tuple[int, int]]:
    """Every (k, w) with k * w <= ``max_nodes`` (and k <= ``max_k``)."""
    return [(k, w) for k in ks for w in ws if k * w <= max_nodes and (max_k is None or k <= max_k)]


class Shaped(Drafter):
    """A tree drafter whose proposals are cut to depth ``w`` and the first ``k * w`` nodes."""

    def __init__(self, base: Drafter, k: int, w: int):
        self.base, self.k, self.w = base, k, w
        self.name = f"{getattr(base, 'name', 'tree')}-{k}x{w}"

    def propose(self, state: DecodeState) -> Draft | None:
        draft = self.base.propose(state)
        return None if draft is None else draft.truncate(self.w, self.k * self.w)

    @property
    def last_info(self) -> dict[str, Any]:
        return self.base.last_info


def families(target: LoadedModel, stores: dict[str, Path], table: BigramTable,
             draft: LoadedModel | None = None) -> dict[str, Callable[[int, int], Drafter]]:
    """{family: make(k, w)} for the context n-gram, model bigram, mixed, REST, CREST, DReSD (OOD store) and,
    with ``draft``, draft-model families; the stores are :func:`specnb.experiments.stores.study_stores`'."""
    rest, crest, dense = RestIndex.load(stores["rest"]), CrestStore(stores["crest"]), load_datastore(stores["dense"])
    made = {
        "context n-gram": lambda k, w: ContextNgramDrafter(k=k, w=w),
        "model bigram": lambda k, w: BigramDrafter(table, k, w),
        "mixed": lambda k, w: MixedDrafter(table, k, w),
        "REST": lambda k, w: RestDrafter(rest, dataclasses.replace(DEFAULT_SEARCH, length=w, max_nodes=k * w)),
        "CREST": lambda k, w: Shaped(CrestDrafter(crest), k, w),
        "DReSD": lambda k, w: DenseDrafter(dense, k, w),
    }
    if draft is not None:
        made["draft model"] = lambda k, w: DraftModelDrafter(draft, (k,) + (1,) * (w - 1), target.vocab_size)
    return made


def best_shapes(grids: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the shape with the best estimated speedup, the shape with the most tokens per call) per (family, set) of
    a grid table (:func:`specnb.experiments.grids.replay_grid` rows with ``family`` and ``set``)."""
    by = grids.groupby(["family", "set"])
    return grids.loc[by.est_speedup.idxmax()], grids.loc[by.tokens_per_call.idxmax()]


def measured_shapes(target: LoadedModel, grids: pd.DataFrame, makers: dict[str, Callable[[int, int], Drafter]],
                    timed_families: tuple[str, ...], prompts: list[Prompt], max_new_tokens: int) -> pd.DataFrame:
    """Real decoding of three shapes per family of ``timed_families`` (the best estimated one, the widest, the
    deepest of its HumanEval grid) in both verification modes on the same drafts, AR alongside
    (:func:`specnb.experiments.run`).

    Returns one row per (family, k, w, mode): predicted (the grid's est_speedup), measured (speedup vs AR),
    tokens_per_call and identical_to_ar.
    """
    rows = []
    for family in timed_families:
        sub = grids[(grids.family == family) & (grids.set == "HumanEval")]
        picks = {tuple(sub.loc[i, ["k", "w"]]) for i in (sub.est_speedup.idxmax(), sub.k.idxmax(), sub.w.idxmax())}
        methods = {"ar": None} | {f"{family} {k}x{w} {mode}": Variant(makers[family](k, w), mode)
                                  for k, w in sorted(picks) for mode in ("tree", "batch")}
        timed = summarize(run(target, prompts, methods, max_new_tokens=max_new_tokens, warmup=4, progress=False))
        predicted = sub.set_index(["k", "w"]).est_speedup
        for _, r in timed[timed.method != "ar"].iterrows():
            _, shape, mode = r.method.rsplit(" ", 2)
            k, w = map(int, shape.split("x"))
            rows.append({"family": family, "k": k, "w": w, "mode": mode, "predicted": predicted[k, w],
                         "measured": r.speedup_vs_ar, "tokens_per_call": r.tokens_per_call,
                         "identical_to_ar": r.identical_to_ar})
    return pd.DataFrame(rows)


def mcsd_shape_order(target: LoadedModel, draft: LoadedModel, references: list[Reference],
                     pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """MCSD Fig. 4 by greedy replay: for each (decreasing, increasing) pair of draft-model tree shapes with the
    same node budget, one row: decreasing, increasing, and each one's tokens per call."""
    makers = {s: (lambda s=s: DraftModelDrafter(draft, s, target.vocab_size)) for pair in pairs for s in pair}
    tpc = summarize(replay_table(makers, references), baseline="").set_index("method").tokens_per_call
    return pd.DataFrame([{"decreasing": d, "increasing": i, "decreasing_tokens_per_call": tpc[d],
                          "increasing_tokens_per_call": tpc[i]} for d, i in pairs])


def grid_headlines(grids: pd.DataFrame) -> dict[str, Any]:
    """The results-file numbers of a shape grid: ``best`` and ``most`` ({"family set": shape, est_speedup /
    tokens_per_call} of :func:`best_shapes`) and ``larger_for_acceptance`` (the share of (family, set) whose
    shape with the most tokens per call has more nodes than the one with the best estimated speedup)."""
    best, most = best_shapes(grids)
    return {"best": {f"{r.family} {r.set}": {"shape": f"{r.k}x{r.w}", "est_speedup": r.est_speedup,
                                             "tokens_per_call": r.tokens_per_call} for _, r in best.iterrows()},
            "most": {f"{r.family} {r.set}": {"shape": f"{r.k}x{r.w}", "tokens_per_call": r.tokens_per_call}
                     for _, r in most.iterrows()},
            "larger_for_acceptance": float(np.mean((most.k * most.w).to_numpy() > (best.k * best.w).to_numpy()))}


def measured_headlines(measured: pd.DataFrame) -> dict[str, Any]:
    """The results-file numbers of :func:`measured_shapes`: ``tree_over_batch`` (mean speed ratio of tree to batch
    verification on the same drafts), ``identical_rate``, ``correlation`` of predicted and measured speedups
    (tree), ``cells`` (shapes timed) and ``timed`` ({"family kxw": {mode: speedup}})."""
    modes = measured.pivot_table(index=["family", "k", "w"], columns="mode", values="measured")
    return {"tree_over_batch": float((modes["tree"] / modes["batch"]).mean()),
            "identical_rate": float(measured.identical_to_ar.mean()),
            "correlation": float(measured[measured["mode"] == "tree"][["predicted", "measured"]].corr().iloc[0, 1]),
            "cells": len(modes), "timed": {f"{f} {k}x{w}": {m: modes.loc[(f, k, w), m] for m in modes}
                                           for f, k, w in modes.index}}
