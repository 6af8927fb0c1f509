"""Draft-shape ablations (notebook 08): every drafter family over one width x depth grid by greedy replay, with
per-prompt rows so that every number has its 90% interval over prompts (:func:`grid_rows`, :func:`grid_summary`,
:func:`paired_ratio`); a shape per family timed in both verification modes against the cost model's prediction
(:func:`timed_cells`); MCSD's shape order (:func:`mcsd_shape_rows`); and the comparisons with DReSD and MCSD.

A *shape* (k, w) is k drafts of up to w tokens for the batch drafters (context n-grams, model bigram, mixed,
DReSD), a ranked tree cut to depth w and k * w nodes for REST and CREST (their node order is rank order, so
the first b nodes are the best b-node tree), and a k x 1 x ... x 1 tree (k candidates, then chains) for a draft
model. Trees above ``MAX_NODES`` nodes are left out, as in the papers' 64-node verification budget.

A greedy draft model is replayed from one teacher-forced pass of the draft over each reference
(:func:`draft_ranks`, :func:`draft_replay`) instead of running the draft at every replayed call.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core.drafter import Drafter
from ..core.metrics import CallStats, RunStats, bootstrap_interval, ratio_interval
from ..core.prompts import Prompt
from ..core.report import Report
from ..core.roofline import GPU_CSV
from ..datastores.crest import CrestStore
from ..datastores.dense import load_datastore
from ..datastores.ngram_tables import BigramTable
from ..datastores.rest import DEFAULT_SEARCH, RestIndex
from ..drafters.context import ContextNgramDrafter
from ..drafters.crest import CrestDrafter
from ..drafters.dense import DenseDrafter
from ..drafters.draft_model import DraftModelDrafter, DraftModelReport
from ..drafters.mixed import MixedDrafter
from ..drafters.model_ngram import BigramDrafter
from ..drafters.rest import RestDrafter
from ..drafters.shaped import Shaped
from ..eval.bench import BenchConfig, run_bench
from ..eval.replay import Reference, ar_priced_seconds, priced_seconds, replay_many
from ..eval.runner import Variant
from ..model.device import synchronize
from ..model.forward import forward
from ..model.kv_cache import GrowingCache
from ..model.models import LoadedModel
from ..study.profiles import ParameterError, Profile
from ..study.verdicts import PREDICTION, TIE, Expect
from .endtoend import store_corpus_tokens
from .gpu_price import COLUMN as GPU_COLUMN
from .gpu_price import PAPER_SHAPES, add_gpu_column, gpu_cost_model
from .grids import replay_rows
from .setups import DOCUMENTS, weights_label

GRID_K = (1, 2, 4, 8, 16)
GRID_W = (1, 2, 4, 8, 16)
MAX_NODES = 64


def rank_of(logits: Tensor, token: Tensor) -> Tensor:
    """int64 [n]: the rank of ``token[i]`` in row i of ``logits`` [n, V] as :func:`specnb.model.kernels.top_k` orders
    it (largest first, ties to the lower id): 0 when it is the row's top-1."""
    value = logits.gather(1, token[:, None])
    ids = torch.arange(logits.shape[1])[None]
    return ((logits > value) | ((logits == value) & (ids < token[:, None]))).sum(1)


def call_costs(models: list[LoadedModel], context: int = 128, repeats: int = 9, seed: int = 0) -> list[float]:
    """Median seconds of a one-token call of each of ``models`` at ``context`` cached (random) tokens, the
    models' calls interleaved (one call of each per round, after a warm-up round), so that a busy spell of the
    machine slows them alike and their ratio holds."""
    generator = torch.Generator().manual_seed(seed)
    caches, tokens = [], []
    for model in models:
        vocab = model.vocab_size
        cache = GrowingCache()
        forward(model, torch.randint(vocab, (1, context), generator=generator), last_only=True, cache=cache)
        caches.append(cache)
        tokens.append(torch.randint(vocab, (1, 1), generator=generator))
    times: list[list[float]] = [[] for _ in models]
    for round_ in range(repeats + 1):
        for i, model in enumerate(models):
            caches[i].keep(context, torch.empty(0, dtype=torch.long))
            device = model.device
            synchronize(device)
            start = time.perf_counter()
            forward(model, tokens[i].to(device), cache=caches[i])
            synchronize(device)
            if round_:
                times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def grid_shapes(ks: tuple[int, ...] = GRID_K, ws: tuple[int, ...] = GRID_W, max_nodes: int = MAX_NODES,
                max_k: int | None = None) -> list[tuple[int, int]]:
    """Every (k, w) with k * w <= ``max_nodes`` (and k <= ``max_k``)."""
    return [(k, w) for k in ks for w in ws if k * w <= max_nodes and (max_k is None or k <= max_k)]


DRESD = "DReSD (OOD store)"
"""The DReSD family's name: its store is the code-OOD one (notebook 09 drafts from the ID store too)."""


def families(target: LoadedModel, stores: dict[str, Path], table: BigramTable,
             draft: LoadedModel | None = None) -> dict[str, Callable[[int, int], Drafter]]:
    """{family: make(k, w)} for the context n-gram, model bigram, mixed, DReSD (OOD store), REST, CREST and, with
    ``draft``, draft-model families, in the study's method order; the stores are
    :func:`specnb.experiments.stores.study_stores`'."""
    rest, crest, dense = RestIndex.load(stores["rest"]), CrestStore(stores["crest"]), load_datastore(stores["dense"])
    made = {
        "prompt lookup": lambda k, w: ContextNgramDrafter(k=k, w=w),
        "model bigram": lambda k, w: BigramDrafter(table, k, w),
        "mixed": lambda k, w: MixedDrafter(table, k, w),
        DRESD: lambda k, w: DenseDrafter(dense, k, w),
        "REST": lambda k, w: RestDrafter(rest, dataclasses.replace(DEFAULT_SEARCH, length=w, max_nodes=k * w)),
        "CREST": lambda k, w: Shaped(CrestDrafter(crest), k, w),
    }
    if draft is not None:
        made["draft model"] = lambda k, w: DraftModelDrafter(draft, (k,) + (1,) * (w - 1), target.vocab_size)
    return made


# -------------------------------------------------------------------------- draft models, teacher-forced


@torch.inference_mode()
def draft_ranks(draft: LoadedModel, references: list[Reference], vocab: int, chunk: int = 64) -> list[np.ndarray]:
    """int64 [T] per reference (prompt ids [L], greedy output [T]): the rank of each output token among the
    draft's logits at the position that predicts it, from one teacher-forced pass of ``draft`` over prompt +
    output, ranked as :func:`specnb.model.kernels.top_k` ranks (largest first, ties to the lower id; 0 = the draft's
    top-1). The first entry (the prefill's token, never drafted) is included for alignment. ``vocab``: the
    target's LM-head rows (the draft's logits are cut or padded to them, as the drafter does)."""

    head, out = draft.decoder.head, []
    for prompt, output in references:
        ids = torch.cat([torch.as_tensor(prompt), torch.as_tensor(output)])
        _, hidden = forward(draft, ids[None], last_only=True)
        rows = hidden[0, len(prompt) - 1:ids.shape[0] - 1]  # [T, d]: the states that predict output[0..T-1]
        ranks = []
        for start in range(0, rows.shape[0], chunk):
            logits = head(rows[None, start:start + chunk])[0]  # its own dtype, as the drafter ranks them
            if logits.shape[-1] > vocab:
                logits = logits[:, :vocab]
            elif logits.shape[-1] < vocab:
                logits = torch.cat([logits, logits.new_full((logits.shape[0], vocab - logits.shape[-1]),
                                                            -torch.inf)], dim=-1)
            ranks.append(rank_of(logits, torch.as_tensor(output[start:start + chunk]).long()))
        out.append(torch.cat(ranks).numpy())
    return out


def tree_nodes(shape: tuple[int, ...], depth: int) -> int:
    """Nodes of a draft-model tree of ``shape`` (children per node at each level) cut to ``depth`` levels."""
    return int(sum(np.prod(shape[:level + 1]) for level in range(depth)))


def draft_replay(shape: tuple[int, ...], references: list[Reference], ranks: list[np.ndarray]) -> list[RunStats]:
    """:func:`specnb.eval.replay.replay_greedy` of a greedy :class:`DraftModelDrafter` of ``shape`` (top-k
    candidates per level) on each reference, from the draft's ranks of the output tokens (:func:`draft_ranks`)
    instead of running the draft at every call: the node on the accepted path at each level has the reference
    as its context, so it is accepted when the reference's next token ranks below that level's k. Equal to the
    drafter's replay up to rounding between the draft's call shapes; calls carry ``draft_calls`` in ``info``,
    and the rows greedy acceptance reads (a level's nodes follow their parents' order, then the draft's ranks)."""
    runs = []
    for (prompt, output), rank in zip(references, ranks, strict=True):
        n_prompt, n_out = len(prompt), len(output)
        stats, pos = RunStats(prompt_tokens=n_prompt), 0  # pos: index in output of the current root
        while pos < n_out - 1:
            depth = min(len(shape), n_out - 1 - pos - 1)
            accepted, at, rows_read = 0, 0, 1  # at: the accepted node's place in its level (levels in node order)
            while accepted < depth and rank[pos + 1 + accepted] < shape[accepted]:
                at = at * shape[accepted] + int(rank[pos + 1 + accepted])
                rows_read = tree_nodes(shape, accepted) + at + 2  # its row, the last greedy acceptance reads
                accepted += 1
            stats.calls.append(CallStats(drafted_nodes=tree_nodes(shape, depth), draft_depth=depth,
                                         accepted=accepted, new_tokens=accepted + 1, draft_seconds=0.0,
                                         verify_seconds=0.0, overhead_seconds=0.0, rows_read=rows_read,
                                         report=DraftModelReport(draft_calls=depth)))
            pos += accepted + 1
        runs.append(stats)
    return runs


# ------------------------------------------------------------------------------------------- shape grids


def _draft_calls(report: Report) -> int:
    return report.draft_calls if isinstance(report, DraftModelReport) else 0


def draft_seconds(stats: RunStats, cost, ratio: float) -> float:
    """The draft model's time in ``stats``: each of its calls (a call's report's ``draft_calls``) priced at
    ``ratio`` times the target's one-token call at that context on ``cost`` (``ratio``: a draft call's measured
    time over a target call's, both timed alike)."""
    new = np.array([c.new_tokens for c in stats.calls], dtype=np.int64)
    context = stats.prompt_tokens + np.cumsum(new) - new
    return float(sum(ratio * _draft_calls(call.report) * cost.seconds_at(1, 0, int(ell))
                     for call, ell in zip(stats.calls, context, strict=True)))


def priced_rows(name: str, runs: list[RunStats], references: list[Reference], cost, shape: tuple[int, int] | None,
                draft_ratio: float = 0.0, ar_seconds: list[float] | None = None) -> pd.DataFrame:
    """:func:`specnb.experiments.grids.replay_rows` of ``runs`` with ``est_seconds`` (each call priced as a
    ``shape`` call at its context on ``cost``, or with ``shape`` None as one row of its drafted nodes: a tree
    verified under a tree mask, :func:`specnb.eval.replay.priced_seconds`; plus its draft-model calls at
    ``draft_ratio`` one-token target calls each: :func:`draft_seconds`) and ``ar_seconds`` (the reference priced
    as AR decoding, or as given), per prompt."""
    frame = replay_rows(name, runs)
    frame["est_seconds"] = [priced_seconds(run, cost, shape) + draft_seconds(run, cost, draft_ratio)
                            for run in runs]
    frame["ar_seconds"] = ar_seconds if ar_seconds is not None else [ar_priced_seconds([ref], cost)
                                                                     for ref in references]
    return frame


def grid_rows(make: Callable[[int, int], Drafter] | None, references: list[Reference],
              shapes: list[tuple[int, int]], cost, hidden: list[Tensor] | None = None,
              ranks: list[np.ndarray] | None = None, draft_ratio: float = 0.0) -> pd.DataFrame:
    """Per-prompt replay rows of every (k, w) of ``shapes`` (columns k, w and :func:`priced_rows`'): a fresh
    ``make(k, w)`` replayed on every reference, or, with ``ranks``, a greedy draft model drafting k candidates
    continued as chains to depth w (:func:`draft_replay`), each draft call priced at ``draft_ratio`` one-token
    target calls."""
    frames, ar = [], [ar_priced_seconds([ref], cost) for ref in references]
    for k, w in shapes:
        runs = (draft_replay((k,) + (1,) * (w - 1), references, ranks) if ranks is not None else
                replay_many(lambda k=k, w=w: make(k, w), references, hidden))
        frames.append(priced_rows(f"({k}, {w})", runs, references, cost, (k, w), draft_ratio, ar).assign(k=k, w=w))
    return pd.concat(frames, ignore_index=True)


def grid_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (family, set, k, w) of :func:`grid_rows` rows: :func:`priced_summary`'s columns."""
    return priced_summary(rows, ["family", "set", "k", "w"])


def priced_summary(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per ``keys`` of priced replay rows (:func:`priced_rows`, one per prompt): tokens_per_call and
    est_speedup (priced AR seconds / priced seconds) with 90% intervals over prompts (``_low``, ``_high``),
    nodes_per_call, prompts."""
    out = []
    for values, g in rows.groupby(keys, sort=False):
        new, calls = (g.new_tokens - 1).to_numpy(float), g.calls.to_numpy(float)
        ar, est = g.ar_seconds.to_numpy(float), g.est_seconds.to_numpy(float)
        out.append({**dict(zip(keys, values, strict=True)), "prompts": len(g),
                    "tokens_per_call": new.sum() / calls.sum(), **_ends("tokens_per_call", ratio_interval(new, calls)),
                    "est_speedup": ar.sum() / est.sum(), **_ends("est_speedup", ratio_interval(ar, est)),
                    "nodes_per_call": g.drafted_nodes.sum() / calls.sum()})
    return pd.DataFrame(out)


def _ends(name: str, interval: tuple[float, float]) -> dict[str, float]:
    return {f"{name}_low": interval[0], f"{name}_high": interval[1]}


def best_shapes(grids: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the shape with the best estimated speedup, the shape with the most tokens per call) per (family, set) of
    a :func:`grid_summary` table."""
    by = grids.groupby(["family", "set"], sort=False)
    return grids.loc[by.est_speedup.idxmax()], grids.loc[by.tokens_per_call.idxmax()]


def paired_ratio(rows: pd.DataFrame, a: dict, b: dict, metric: str = "tokens_per_call") -> tuple[float, float, float]:
    """(value, low, high): the ratio of the cell selected by ``a`` ({column: value} of :func:`grid_rows` rows)
    over the cell selected by ``b`` on ``metric`` (``tokens_per_call``, or ``est_speed``: the inverse of the
    priced seconds), paired by prompt, with its 90% interval over prompts."""
    pick = lambda sel: rows.loc[np.logical_and.reduce([rows[c] == v for c, v in sel.items()])]  # noqa: E731
    left, right = pick(a).set_index("prompt_id"), pick(b).set_index("prompt_id")
    right = right.loc[left.index]
    if metric == "tokens_per_call":
        arrays = [(left.new_tokens - 1), left.calls, (right.new_tokens - 1), right.calls]
    else:
        arrays = [right.est_seconds, right.est_seconds * 0 + 1, left.est_seconds, left.est_seconds * 0 + 1]
    arrays = [np.asarray(x, dtype=float) for x in arrays]

    def stat(n1, d1, n2, d2, axis=-1):
        return n1.sum(axis) / d1.sum(axis) / (n2.sum(axis) / d2.sum(axis))

    low, high = bootstrap_interval(stat, *arrays)
    return float(stat(*arrays)), low, high


def mcsd_tree_rows(shape: str, references: list[Reference], ranks: list[np.ndarray], cost=None,
                   draft_ratio: float = 0.0, ar_seconds: list[float] | None = None) -> pd.DataFrame:
    """Per-prompt replay rows (:func:`specnb.experiments.grids.replay_rows`) of a greedy draft model drafting the
    tree ``shape`` ("4x2x1": top-k candidates per level, :func:`draft_replay`), with ``shape`` and ``nodes`` (the
    full tree's); with ``cost``, priced as :func:`priced_rows` prices a tree (one row of its nodes under a tree
    mask, as MCSD verifies it; each draft call at ``draft_ratio`` one-token target calls)."""
    levels = tuple(int(x) for x in shape.split("x"))
    runs = draft_replay(levels, references, ranks)
    frame = replay_rows(shape, runs) if cost is None else \
        priced_rows(shape, runs, references, cost, None, draft_ratio, ar_seconds)
    return frame.assign(shape=shape, nodes=tree_nodes(levels, len(levels)))


def mcsd_shape_rows(references: list[Reference], ranks: list[np.ndarray],
                    pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """MCSD Fig. 4's shape order by greedy replay: :func:`mcsd_tree_rows` of every tree shape of ``pairs``
    ((decreasing, increasing) with the same number of leaves, e.g. ("4x2", "2x4")), with ``order`` and ``pair``."""
    return pd.concat([mcsd_tree_rows(shape, references, ranks).assign(order=order, pair=" vs ".join(pair))
                      for pair in pairs for order, shape in zip(("decreasing", "increasing"), pair, strict=True)],
                     ignore_index=True)


MCSD_BUDGETS = {16: ("16x1x1x1", "8x2x1x1", "4x4x1x1", "4x2x2x1", "2x2x2x2"),
                32: ("32x1x1x1", "16x2x1x1", "8x4x1x1", "8x2x2x1", "4x4x2x1", "4x2x2x2")}
"""MCSD §4.4 / Fig. 4's budget groups: the budget is a tree's leaves (the product of its levels' candidates, at
most 32 in the paper), its depth fixed (§4.4 fixes γ; four levels here, the depth of most of its Table 2 shapes).
The paper's text does not list Fig. 4's labels, so each group holds every shape of powers of two that follows
its monotonic rule (candidates never increase with depth) at that budget."""


def mcsd_budget_rows(references: list[Reference], ranks: list[np.ndarray], cost, draft_ratio: float,
                     budgets: dict[int, tuple[str, ...]] = MCSD_BUDGETS) -> pd.DataFrame:
    """MCSD Fig. 4's budget groups by greedy replay, priced on ``cost``: :func:`mcsd_tree_rows` of every shape
    of ``budgets`` ({budget: shapes}), with ``budget``; AR priced once per reference."""
    ar = [ar_priced_seconds([ref], cost) for ref in references]
    return pd.concat([mcsd_tree_rows(shape, references, ranks, cost, draft_ratio, ar).assign(budget=budget)
                      for budget, group in budgets.items() for shape in group], ignore_index=True)


def budget_groups(rows: pd.DataFrame) -> pd.DataFrame:
    """Each budget group of :func:`mcsd_budget_rows` rows pooled per prompt (columns set, budget, prompt_id):
    new_tokens - 1, calls and drafted_nodes summed over the group's shapes (its tokens per call: all its calls'),
    est_seconds their mean (its speed: the mean shape's; every shape decodes the same tokens), ar_seconds."""
    keys = ["set", "budget", "prompt_id"]
    grouped = rows.assign(new_tokens=rows.new_tokens - 1).groupby(keys, sort=False)
    out = grouped[["new_tokens", "calls", "drafted_nodes"]].sum().join(grouped[["est_seconds", "ar_seconds"]].mean())
    return out.reset_index().assign(new_tokens=lambda f: f.new_tokens + 1)


def budget_points(rows: pd.DataFrame) -> pd.DataFrame:
    """What notebook 08's budget figure draws, per set: every shape of :func:`mcsd_budget_rows` rows and each
    budget group pooled (:func:`budget_groups`, ``shape`` "all of B"), with :func:`priced_summary`'s columns and
    ``label`` ("B: shape")."""
    shapes_ = priced_summary(rows, ["set", "budget", "shape"])
    groups = priced_summary(budget_groups(rows), ["set", "budget"])
    groups["shape"] = "all of " + groups.budget.astype(str)
    out = pd.concat([shapes_, groups], ignore_index=True).sort_values(["set", "budget"], kind="stable")
    return out.assign(label=out.budget.astype(str) + ": " + out["shape"]).reset_index(drop=True)


# ------------------------------------------------------------------------------------------ timed cells


def timed_cells(target: LoadedModel, makers: dict[str, Callable[[int, int], Drafter]],
                cells: list[tuple[str, int, int]], prompts: list[Prompt], references: list[Reference],
                hidden: list[Tensor], cost, max_new_tokens: int) -> pd.DataFrame:
    """Real decoding of every (family, k, w) of ``cells`` in both verification modes (tree attention, one batch
    row per path) on the same drafts, AR alongside (:func:`specnb.eval.bench.run_bench`), next to the cost model's
    prediction for the same prompts and tokens (replayed on ``references``, the target's greedy outputs of
    ``prompts`` cut to ``max_new_tokens``, with their ``hidden`` states).

    Returns one row per (method, prompt): family, k, w, mode, decode_seconds and ar_decode_seconds (measured,
    prefill excluded as the prediction excludes it), est_seconds and ar_seconds (predicted), new_tokens, calls,
    identical_to_ar, and on a CPU read_gb_per_s (the bandwidth sampled after the prompt: the host's state).
    """
    methods = {f"{family} ({k}, {w}) {mode}": Variant(makers[family](k, w), mode)
               for family, k, w in cells for mode in ("tree", "batch")}
    rows = run_bench(target, prompts, BenchConfig([], max_new_tokens=max_new_tokens, made=methods, warmup_tokens=4))
    ar = rows[rows.method == "ar"].set_index("prompt_id").decode_seconds
    out = []
    for family, k, w in cells:
        runs = replay_many(lambda family=family, k=k, w=w: makers[family](k, w), references, hidden)
        priced = priced_rows("", runs, references, cost, (k, w))
        for mode in ("tree", "batch"):
            part = rows[rows.method == f"{family} ({k}, {w}) {mode}"].reset_index(drop=True)
            columns = ["method", "prompt_id", "decode_seconds", "new_tokens", "calls", "identical_to_ar",
                       *(["read_gb_per_s"] if "read_gb_per_s" in part else [])]
            out.append(part[columns].assign(
                family=family, k=k, w=w, mode=mode, ar_decode_seconds=part.prompt_id.map(ar).to_numpy(),
                est_seconds=priced.est_seconds.to_numpy(), ar_seconds=priced.ar_seconds.to_numpy()))
    return pd.concat(out, ignore_index=True)


def timed_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per timed method of :func:`timed_cells`: measured and predicted speedup over AR (decode time),
    their ratio measured / predicted with its 90% interval over prompts (paired), the measured speedup's
    interval, tokens per call, identical_to_ar and (where the rows have it) the median read_gb_per_s."""
    out = []
    for method, g in rows.groupby("method", sort=False):
        ar_m, m, ar_p, p = (g[c].to_numpy(float) for c in ("ar_decode_seconds", "decode_seconds", "ar_seconds",
                                                            "est_seconds"))

        def accuracy(a, b, c, d, axis=-1):
            return a.sum(axis) / b.sum(axis) / (c.sum(axis) / d.sum(axis))

        ones = np.ones_like(m)
        out.append({"method": method, "family": g.family.iloc[0], "k": g.k.iloc[0], "w": g.w.iloc[0],
                    "mode": g["mode"].iloc[0], "measured": ar_m.sum() / m.sum(),
                    **_ends("measured", bootstrap_interval(accuracy, ar_m, m, ones, ones)),
                    "predicted": ar_p.sum() / p.sum(), "accuracy": accuracy(ar_m, m, ar_p, p),
                    **_ends("accuracy", bootstrap_interval(accuracy, ar_m, m, ar_p, p)),
                    "tokens_per_call": (g.new_tokens - 1).sum() / g.calls.sum(),
                    "identical_to_ar": g.identical_to_ar.astype(float).mean(),
                    "read_gb_per_s": g.read_gb_per_s.median() if "read_gb_per_s" in g else np.nan})
    return pd.DataFrame(out)


def tree_over_batch(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (family, k, w) of :func:`timed_cells` rows: tree attention's decode speed over batch verification's
    on the same prompts (``ratio``, ``low``, ``high``: paired, 90% interval over prompts)."""
    out = []
    for (family, k, w), g in rows.groupby(["family", "k", "w"], sort=False):
        tree = g[g["mode"] == "tree"].set_index("prompt_id").decode_seconds
        batch = g[g["mode"] == "batch"].set_index("prompt_id").decode_seconds.loc[tree.index]
        low, high = ratio_interval(batch.to_numpy(float), tree.to_numpy(float))
        out.append({"family": family, "k": k, "w": w, "ratio": batch.sum() / tree.sum(), "low": low, "high": high})
    return pd.DataFrame(out)


def cut(references: list[Reference], hidden: list[Tensor], prompts: int, tokens: int
        ) -> tuple[list[Reference], list[Tensor]]:
    """The first ``prompts`` references with their outputs cut to ``tokens`` (greedy decoding to a shorter
    budget gives the first tokens), and their hidden states cut alike."""
    refs = [(ids, output[:tokens]) for ids, output in references[:prompts]]
    return refs, [h[:len(ids) + tokens] for (ids, _), h in zip(refs, hidden[:prompts], strict=True)]


def grid_headlines(grids: pd.DataFrame) -> dict[str, Any]:
    """The results-file numbers of a :func:`grid_summary` table: ``best`` and ``most`` ({"family, set": shape,
    est_speedup / tokens_per_call} of :func:`best_shapes`) and ``larger_for_acceptance`` (the share of (family,
    set) whose shape with the most tokens per call has more nodes than the one with the best estimated
    speedup)."""
    best, most = best_shapes(grids)
    return {"best": {f"{r.family}, {r.set}": {"shape": f"({r.k}, {r.w})", "est_speedup": r.est_speedup,
                                              "est_speedup_low": r.est_speedup_low,
                                              "est_speedup_high": r.est_speedup_high,
                                              "tokens_per_call": r.tokens_per_call} for _, r in best.iterrows()},
            "most": {f"{r.family}, {r.set}": {"shape": f"({r.k}, {r.w})", "tokens_per_call": r.tokens_per_call}
                     for _, r in most.iterrows()},
            "larger_for_acceptance": float(np.mean((most.k * most.w).to_numpy() > (best.k * best.w).to_numpy()))}


# ---------------------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class ShapeClaims:
    """The papers' best draft shapes, (k candidates, depth w), judged by :func:`compare_dresd` and stated beside
    ours by notebook 08 (``report.paper(**sh.CLAIMS.stated())``)."""

    dresd_greedy: tuple[int, int]  # DReSD §5.4 / Fig. 7: best for greedy decoding, narrow and deep
    dresd_sampling: tuple[int, int]  # DReSD §5.4 / Fig. 7: best for nucleus sampling
    source: str

    def stated(self) -> dict[str, object]:
        """{name: the paper's shape as the notebook's text states it, ``3x20``} (``{paper[name]}``)."""
        return {"dresd_greedy": "{}x{}".format(*self.dresd_greedy),
                "dresd_sampling": "{}x{}".format(*self.dresd_sampling), "source": self.source}


CLAIMS = ShapeClaims(dresd_greedy=(3, 20), dresd_sampling=(10, 10),
                     source="DReSD §5.4 and Fig. 7 (V100 GPU), MCSD Fig. 4")


def grid_takeaways(report, grids: pd.DataFrame) -> None:
    """The front page's lines for the two grid figures, per set the family and shape with the best estimated
    speedup and with the most tokens per call (:func:`grid_headlines`' ``best`` / ``most``, which the results
    file holds)."""
    best, most = [], []
    for name, sub in grids.groupby("set", sort=False):
        top = sub.loc[sub.est_speedup.idxmax()]
        best.append(f"{top.family} {{ours[best][{top.family}, {name}][shape]}} at "
                    f"×{{ours[best][{top.family}, {name}][est_speedup]:.2f}} "
                    f"({{ours[best][{top.family}, {name}][est_speedup_low]:.2f}}–"
                    f"{{ours[best][{top.family}, {name}][est_speedup_high]:.2f}}) on {name}")
        top = sub.loc[sub.tokens_per_call.idxmax()]
        most.append(f"{top.family} {{ours[most][{top.family}, {name}][shape]}} with "
                    f"{{ours[most][{top.family}, {name}][tokens_per_call]:.2f}} on {name}")
    report.takeaway("08_grid_est_speedup", "the fastest estimated shape: " + ", ".join(best)
                    + "; the shape with the most tokens per call is larger than the fastest for "
                      "{ours[larger_for_acceptance]:.0%} of families × sets")
    report.takeaway("08_grid_tokens_per_call", "the most tokens per call: " + ", ".join(most))


def compare_dresd(report, rows: pd.DataFrame, grids: pd.DataFrame, cost, context: int = 256,
                  gpu_table: str | Path = GPU_CSV) -> None:
    """DReSD §5.4 / Fig. 7 (greedy decoding: the best shape is :data:`CLAIMS`' 3 x 20, narrow and deep) on
    :func:`grid_rows` rows of HumanEval (the code task, as the paper's CodeAlpaca):

    * ``dresd_deep_vs_wide``: tokens per call of 4 x 16 over 16 x 4 (same nodes) above 1 + TIE (the direction of
      Fig. 7's gap);
    * ``dresd_paper_shape``: estimated speed of 4 x 16 (the grid's shape nearest 3 x 20) over the best estimated
      DReSD shape here, a tie with 1 (the paper's shape is as good as the best here). Its likely cause names
      what a 4 x 16 call costs in one-token calls on ``cost`` at ``context``, this machine's table;
    * ``gpu_dresd_paper_shape``, where ``rows`` were priced on the GPU table (``est_speedup_gpu``, at
      ``gpu_table``, read for its device): the same ratio with both calls priced there (Llama-2-7B's shapes, eager
      calls: the paper's hardware class), against the best shape by that price (its tokens per call over its
      call's price): tokens per call of 4 x 16 over that shape's, paired by prompt, times the ratio of their calls'
      prices (target calls only, as ``est_speedup_gpu``)."""
    grid_takeaways(report, grids)
    code = rows[(rows.family == DRESD) & (rows.set == "HumanEval")]
    greedy = "{} x {}".format(*CLAIMS.dresd_greedy)
    if code.empty or not {(4, 16), (16, 4)} <= set(zip(code.k, code.w, strict=True)):
        return
    report.compare("dresd_deep_vs_wide", "DReSD 4x16 / 16x4 tokens per call, HumanEval",
                   *paired_ratio(code, {"k": 4, "w": 16}, {"k": 16, "w": 4}), Expect.above(1.0, TIE),
                   f"DReSD §5.4, Fig. 7 (narrow and deep best for greedy: {greedy})",
                   cause="the OOD store's neighbours seldom continue for 16 tokens", fmt=".3f", internal=False,
                   direction_only=True, evidence={"draft depth": 16})
    sub = grids[(grids.family == DRESD) & (grids.set == "HumanEval")]
    best = sub.loc[sub.est_speedup.idxmax()]
    price = cost.seconds_at(4, 16, context) / cost.seconds_at(1, 0, context)
    report.add(dresd_best=f"{best.k}x{best.w}", call_4x16=price)
    report.compare("dresd_paper_shape", f"DReSD estimated speed of 4x16 / the best shape here ({best.k}x{best.w}), "
                   "HumanEval", *paired_ratio(code, {"k": 4, "w": 16}, {"k": best.k, "w": best.w}, "est_speed"),
                   Expect.near(1.0, TIE), f"DReSD §5.4 ({greedy} best for greedy, V100 GPU)",
                   cause=f"a 4x16 call costs {price:.1f} one-token calls on this CPU's cost table", fmt=".3f",
                   internal=False, direction_only=False, evidence={"4x16 call cost over a one-token call": price})
    if GPU_COLUMN not in code:
        return
    device = gpu_cost_model(PAPER_SHAPES["dresd"], gpu_table)[1]
    totals = code.assign(accepted=code.new_tokens - 1, price=code.tokens_per_call / code[GPU_COLUMN]) \
        .groupby(["k", "w"]).agg(accepted=("accepted", "sum"), calls=("calls", "sum"), price=("price", "first"))
    prices = {(int(k), int(w)): r.price for (k, w), r in totals.iterrows()}  # a call's, in one-token calls
    top = max(prices, key=lambda shape: totals.accepted[shape] / totals.calls[shape] / prices[shape])
    ratio = [x * prices[top] / prices[4, 16]
             for x in paired_ratio(code, {"k": 4, "w": 16}, {"k": top[0], "w": top[1]})]
    report.compare("gpu_dresd_paper_shape", f"DReSD estimated speed of 4x16 / the best shape by the same price "
                   f"({top[0]}x{top[1]}), calls priced on the GPU table ({device}, eager calls), HumanEval", *ratio,
                   Expect.near(1.0, TIE), f"DReSD §5.4 ({greedy} best for greedy, V100 GPU)",
                   cause=f"on the GPU table a 4x16 call costs {prices[4, 16]:.2f} one-token calls and a "
                         f"{top[0]}x{top[1]} call {prices[top]:.2f}: the shapes part on this store's acceptance, not "
                         "on their price", fmt=".3f", internal=False, direction_only=False,
                   evidence={"4x16 call cost over a one-token call (GPU)": prices[4, 16],
                             "best shape's call cost over a one-token call (GPU)": prices[top]})


def compare_mcsd_order(report, rows: pd.DataFrame) -> None:
    """MCSD Fig. 4's monotonic rule on :func:`mcsd_shape_rows` rows (one per set, column ``set``): for every
    (decreasing, increasing) pair, the decreasing shape's tokens per call over the increasing one's above
    1 + TIE, paired by prompt (a tie does not confirm "beats"; the direction of Fig. 4's gaps only). The likely
    cause cites the draft's top-1 rate, ``report.ours["draft_top1"]`` (:meth:`ShapeStudy.headlines`)."""
    top1 = report.ours["draft_top1"]
    for (name, pair), group in rows.groupby(["set", "pair"], sort=False):
        dec, inc = pair.split(" vs ")
        report.compare(f"order {pair} {name}", f"tokens per call {dec} / {inc} (same leaves), {name}",
                       *paired_ratio(group, {"shape": dec}, {"shape": inc}), Expect.above(1.0, TIE),
                       "MCSD Fig. 4 (monotonic rule, LLaMA-13B, Alpaca)",
                       cause=f"the draft's top-1 is the target's token at {top1:.1%} of positions; where it is not, "
                             "the token is seldom among the next few candidates, so wider levels add little",
                       fmt=".3f", internal=False, direction_only=True, evidence={"draft top-1 rate": top1})
    report.takeaway("08_mcsd_shape_order", "tokens per call, decreasing over increasing shape: " + ", ".join(
        f"{{verdicts[order {pair} {name}][ours]:.2f}} for {pair} on {name}"
        for name, pair in rows[["set", "pair"]].drop_duplicates().itertuples(index=False))
        + " (MCSD Fig. 4: decreasing better); the draft's top-1 is right at {ours[draft_top1]:.1%} of positions")


def compare_mcsd_budgets(report, rows: pd.DataFrame, cost, context: int = 256) -> pd.DataFrame:
    """MCSD §4.4 / Fig. 4's budget claims on :func:`mcsd_budget_rows` rows (one per set, column ``set``), every
    ratio paired by prompt with its 90% interval:

    * ``budget B alike SET``, (b) equal budgets perform alike: in each budget group, the tokens per call of its
      shape with the most over its shape with the fewest, a tie with 1 (within TIE);
    * ``budget L vs S tokens SET``, (c) the larger group (L = 32) has the higher block efficiency: its pooled
      tokens per call (:func:`budget_groups`) over the smaller group's (S = 16) above 1 + TIE (direction only);
    * ``budget L vs S speed SET``, (c) yet it is slower: its estimated speed (the mean shape's priced seconds) over
      the smaller group's below 1 - TIE (direction only). The estimate prices calls with this CPU's cost table,
      where a call of many tokens costs far more than on the paper's GPU; claim and cause say so, the cause citing
      what a call verifying each group's mean tree costs in one-token calls at ``context``.

    Causes cite the draft's top-1 rate, ``report.ours["draft_top1"]`` (:meth:`ShapeStudy.headlines`). Returns the
    judged ratios for :func:`specnb.study.plots.paired_ratios` (columns row, group: the set, value, low, high,
    method), so the figure draws what the verdicts judge."""
    top1 = report.ours["draft_top1"]
    budgets = sorted(int(b) for b in rows.budget.unique())
    small, large = budgets[0], budgets[-1]
    one = cost.seconds_at(1, 0, context)
    nodes = {b: int(round(rows[rows.budget == b].groupby("shape").nodes.first().mean())) for b in (small, large)}
    price = {b: float(cost.chain_seconds(np.array([n]), context)[0] / one) for b, n in nodes.items()}
    against = "MCSD §4.4, Fig. 4 (LLaMA-68M → LLaMA-13B, Alpaca, GPU)"
    judged = []

    def ratio(row: str, name: str, values: tuple[float, float, float]) -> tuple[float, float, float]:
        judged.append({"row": row, "group": name, **dict(zip(("value", "low", "high"), values, strict=True)),
                       "method": "mcsd"})
        return values

    for name, sub in rows.groupby("set", sort=False):
        for budget, group in sub.groupby("budget", sort=False):
            tpc = priced_summary(group, ["shape"]).set_index("shape").tokens_per_call
            hi, lo = tpc.idxmax(), tpc.idxmin()
            report.compare(f"budget {budget} alike {name}", f"tokens per call of the {budget}-budget shapes, the "
                           f"most ({hi}) / the fewest ({lo}), {name}",
                           *ratio(f"{budget}-budget shapes: most / fewest\ntokens per call", name,
                                  paired_ratio(group, {"shape": hi}, {"shape": lo})),
                           Expect.near(1.0, TIE), f"{against}: equal budgets perform alike",
                           cause=f"how the leaves spread over the levels decides the tokens per call: {hi} reaches "
                                 f"{tpc[hi]:.2f}, {lo} {tpc[lo]:.2f}, where the draft's top-1 is the target's token "
                                 f"at {top1:.1%} of positions", fmt=".3f", internal=False, direction_only=False,
                           evidence={f"tokens per call, {hi}": tpc[hi], f"tokens per call, {lo}": tpc[lo],
                                     "budget": budget, "draft top-1 rate": top1})
        pooled = budget_groups(sub)
        evidence = {"smaller budget": small, "larger budget": large, "draft top-1 rate": top1,
                    **{f"{b}-budget mean tree nodes": nodes[b] for b in (small, large)},
                    **{f"{b}-budget call cost over a one-token call": price[b] for b in (small, large)}}
        report.compare(f"budget {large} vs {small} tokens {name}", f"tokens per call, the {large}-budget group / "
                       f"the {small}-budget group, {name}",
                       *ratio(f"{large}-budget / {small}-budget group:\ntokens per call", name,
                              paired_ratio(pooled, {"budget": large}, {"budget": small})),
                       Expect.above(1.0, TIE), f"{against}: the {large}-budget group has the higher block efficiency",
                       cause=f"the {large}-budget trees' extra candidates are seldom the target's token: the draft's "
                             f"top-1 is right at {top1:.1%} of positions", fmt=".3f", internal=False,
                       direction_only=True, evidence=evidence)
        report.compare(f"budget {large} vs {small} speed {name}", f"estimated speed on this CPU's cost table, the "
                       f"{large}-budget group / the {small}-budget group, {name}",
                       *ratio(f"{large}-budget / {small}-budget group:\nestimated speed", name,
                              paired_ratio(pooled, {"budget": large}, {"budget": small}, "est_speed")),
                       Expect.below(1.0, TIE), f"{against}: the {large}-budget group is slower",
                       cause=f"priced with this CPU's cost table, where a call verifying the {large}-budget trees' "
                             f"{nodes[large]} nodes costs {price[large]:.1f} one-token calls and the {small}-budget "
                             f"trees' {nodes[small]} nodes {price[small]:.1f} (on the paper's GPU a call of many "
                             "tokens costs little more than one)", fmt=".3f", internal=False, direction_only=True,
                       evidence=evidence)
    sets = list(dict.fromkeys(rows.set))
    report.takeaway("08_mcsd_budgets", f"the {large}-budget group over the {small}-budget group: tokens per call " +
                    ", ".join(f"×{{verdicts[budget {large} vs {small} tokens {n}][ours]:.2f}} on {n}" for n in sets)
                    + ", estimated speed on this CPU's cost table (calls of many tokens cost far more than on the "
                      "paper's GPU) " + ", ".join(f"×{{verdicts[budget {large} vs {small} speed {n}][ours]:.2f}} "
                                                   f"on {n}" for n in sets)
                    + "; within one budget the most over the fewest tokens per call: " + ", ".join(
                        f"×{{verdicts[budget {b} alike {n}][ours]:.2f}} ({b}, {n})" for n in sets
                        for b in (small, large)) + " (MCSD Fig. 4: equal budgets alike, the larger budget slower)")
    return pd.DataFrame(judged)


STATE_SLACK = 1.15  # a run's read bandwidth this far outside the cost table's: the host was in another state


def host_state_note(timed_at: tuple[float, float] | None, run_gb_per_s: float) -> str:
    """"" where a timed run's read bandwidth (GB/s) lies within the range its cost table was timed at (``timed_at``
    of :class:`specnb.core.roofline.CostModel`, widened by :data:`STATE_SLACK`) or either is unknown; else a clause
    saying both: a table timed in one state of a VM prices the other's calls wrongly (docs/kernels.md, "The VM
    switches between two placements")."""
    if timed_at is None or not np.isfinite(run_gb_per_s):
        return ""
    if timed_at[0] / STATE_SLACK <= run_gb_per_s <= timed_at[1] * STATE_SLACK:
        return ""
    return (f"; the cost table was timed at {timed_at[0]:.0f}-{timed_at[1]:.0f} GB/s of read bandwidth and this run at "
            f"{run_gb_per_s:.0f}: the host in another state, whose calls the table misprices")


def compare_timed(report, summary: pd.DataFrame, ratios: pd.DataFrame,
                  timed_at: tuple[float, float] | None = None) -> None:
    """The cost model against measurement and tree attention against batch verification, on
    :func:`timed_summary` and :func:`tree_over_batch` tables: ``model MEthod``: measured / predicted speedup
    within :data:`~specnb.study.verdicts.PREDICTION` of 1 (what it takes to rank the grid's shapes by their
    estimate; internal), its cause naming the host's state where the run's bandwidth lies outside ``timed_at``
    (:func:`host_state_note`); ``tree FAMILY kxw``: tree attention's decode speed over batch verification's above
    1 + TIE (MCSD Table 4: x1.91 with tree attention, x1.61 without; the direction only)."""
    for _, r in summary.iterrows():
        run = float(r.get("read_gb_per_s", np.nan))
        report.compare(f"model {r.method}", f"measured / predicted speedup, {r.method}", r.accuracy, r.accuracy_low,
                       r.accuracy_high, Expect.near(1.0, PREDICTION), "the cost model (notebook 05's table, replay)",
                       internal=True, direction_only=False,
                       cause=("drafting and acceptance time, which the cost model leaves out" if r.accuracy < 1
                              else "the grid prices a call as k batch rows; tree attention verifies the k·w nodes in "
                                   "one row, which costs less here" if r["mode"] == "tree"
                              else "the cost table prices a call above what it costs in this run")
                       + host_state_note(timed_at, run), fmt=".2f",
                       evidence={"read GB/s, this run": run, "read GB/s, cost table timed at": timed_at})
    for _, r in ratios.iterrows():
        report.compare(f"tree {r.family} {r.k}x{r.w}", f"tree attention / batch rows, decode speed, {r.family} "
                       f"({r.k}, {r.w})", r.ratio, r.low, r.high, Expect.above(1.0, TIE),
                       "MCSD Table 4 (x1.91 with tree attention, x1.61 without)",
                       cause="on this CPU a k-row batch call costs no more than one row of the same nodes",
                       fmt=".2f", internal=False, direction_only=True)
    report.takeaway("08_predicted_vs_measured", "measured over predicted speedup: " + ", ".join(
        f"{{verdicts[model {m}][ours]:.2f}} for {m} ({{verdicts[model {m}][verdict]}})" for m in summary.method)
        + f" (the cost model's aim: within {PREDICTION:.0%} of 1); tree attention's decode speed over batch rows': "
        + ", ".join(f"×{{verdicts[tree {r.family} {r.k}x{r.w}][ours]:.2f}} for {r.family} ({r.k}, {r.w})"
                    for r in ratios.itertuples()))


def tie_band() -> Any:
    """The band within which :func:`compare_mcsd_order` calls a ratio a tie (:data:`~specnb.study.verdicts.TIE`
    of 1: neither order beats the other), as :func:`specnb.study.plots.paired_ratios` shades it."""
    from ..study.plots import Band

    return Band(1 - TIE, 1 + TIE, f"±{TIE:.0%}: a tie")


def budget_band(judged: pd.DataFrame) -> Any:
    """The tolerance :func:`compare_mcsd_budgets` judges "equal budgets perform alike" by (within
    :data:`~specnb.study.verdicts.TIE` of 1), shaded behind those rows of its returned ratios (the groups' ratios
    are judged by direction only)."""
    from ..study.plots import Band

    return Band(1 - TIE, 1 + TIE, f"±{TIE:.0%}: alike", tuple(r for r in dict.fromkeys(judged.row) if "most" in r))


def prediction_band(summary: pd.DataFrame) -> Any:
    """The tolerance :func:`compare_timed` judges a measured over predicted speedup by (within
    :data:`~specnb.study.verdicts.PREDICTION` of 1), as :func:`specnb.study.plots.paired_ratios` shades it behind
    :func:`timed_ratios`' measured / predicted rows (not the tree / batch rows, judged against 1)."""
    from ..study.plots import Band

    return Band(1 - PREDICTION, 1 + PREDICTION, f"±{PREDICTION:.0%}: the prediction agrees",
                tuple(f"{m}: measured / predicted" for m in summary.method))


def timed_ratios(summary: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """The paired ratios :func:`compare_timed` judges, one row each for
    :func:`specnb.study.plots.paired_ratios`: every timed method's measured over predicted speedup
    (:func:`timed_summary`), then every shape's tree attention over batch rows (:func:`tree_over_batch`);
    columns row, value, low, high and method (the family: its colour)."""
    rows = [{"row": f"{r.method}: measured / predicted", "value": r.accuracy, "low": r.accuracy_low,
             "high": r.accuracy_high, "method": r.family} for r in summary.itertuples()]
    rows += [{"row": f"{r.family} ({r.k}, {r.w}): tree / batch rows", "value": r.ratio, "low": r.low, "high": r.high,
              "method": r.family} for r in ratios.itertuples()]
    return pd.DataFrame(rows, columns=["row", "value", "low", "high", "method"])


PREDICTED_COLOR = "black"  # the cost model's predicted speedup beside a measured one: no method's hue


def measured_and_predicted(summary: pd.DataFrame) -> pd.DataFrame:
    """What notebook 08's predicted-vs-measured figure draws beside the ratios, from :func:`timed_summary`: for
    each timed method, its measured speedup (with its 90% interval; the method's colour) and, on the row under it,
    the cost model's predicted one (no interval; :data:`PREDICTED_COLOR`). Columns row, value, low, high, color,
    for :func:`specnb.study.plots.dots` with ``keep_order`` (first row on top)."""
    from ..study.plots import color

    rows = []
    for r in summary.itertuples():
        rows += [{"row": f"{r.method}: measured", "value": r.measured, "low": r.measured_low,
                  "high": r.measured_high, "color": color(r.family)},
                 {"row": f"{r.method}: predicted", "value": r.predicted, "low": np.nan, "high": np.nan,
                  "color": PREDICTED_COLOR}]
    return pd.DataFrame(rows, columns=["row", "value", "low", "high", "color"])


# ------------------------------------------------------------------------------------------ the study


@dataclass
class ShapeStudy:
    """Everything notebook 08 replays and times: the target, its greedy references of HumanEval and MT-Bench
    (``n_prompts`` x ``max_new_tokens`` of the profile, cached) with their hidden states, the drafter families
    over the study stores, the draft model and its ranks of the references' tokens (:func:`draft_ranks`), the
    cost model (notebook 05's table) and one-token call times of the draft and the target (seconds, timed
    interleaved: :func:`call_costs`)."""

    profile: Profile
    target: LoadedModel
    sets: dict[str, list[Prompt]]
    refs: dict[str, list[Reference]]
    hidden: dict[str, list[Tensor]]
    draft: LoadedModel
    ranks: dict[str, list[np.ndarray]]
    stores: dict[str, Path]
    makers: dict[str, Callable[[int, int], Drafter]]
    cost: Any
    draft_call: float
    target_call: float

    @classmethod
    def load(cls, p: Profile) -> ShapeStudy:
        """Load (or build once, into the cache) everything for the profile ``p`` (its target, weights, draft and
        corpus: the notebook's parameters in place, :func:`specnb.study.profiles.get_profile`)."""
        from ..core.datasets import load_prompts
        from ..core.roofline import CostModel
        from ..drafters.draft_model import load_draft
        from ..eval.timing import cost_table
        from ..model.models import load_model
        from .ngrams import restricted_bigram_table
        from .references import references_and_states
        from .stores import study_stores

        if p.draft is None:
            raise ParameterError("parameter draft: the draft-shape study needs a draft for the given target "
                                 "(a model sharing its tokenizer, or self:L)")
        target = load_model(p.target, dtype=p.dtype, device=p.device, weights=p.weights)
        sets = {"HumanEval": load_prompts("humaneval", p.n_prompts), "MT-Bench": load_prompts("mtbench", p.n_prompts)}
        pairs = {name: references_and_states(target, prompts, p.max_new_tokens) for name, prompts in sets.items()}
        refs, hidden = {n: r for n, (r, _) in pairs.items()}, {n: h for n, (_, h) in pairs.items()}
        draft = load_draft(target, p.draft)
        stores = study_stores(target, p)
        return cls(p, target, sets, refs, hidden, draft,
                   {name: draft_ranks(draft, refs[name], target.vocab_size) for name in sets}, stores,
                   families(target, stores, restricted_bigram_table(target, refs)[0]),
                   CostModel(cost_table(target, p.cost_grid)),
                   *call_costs([draft, target]))

    def headlines(self) -> dict[str, Any]:
        """The setup's numbers for the results file: target, dtype, draft, sizes, the stores' corpus tokens
        (:func:`~specnb.experiments.endtoend.store_corpus_tokens`: REST's, which CREST shares, and DReSD's), the
        draft's top-1 agreement with the references' tokens and its call cost over the target's."""
        ranks = np.concatenate([r[1:] for rs in self.ranks.values() for r in rs])
        return {"target": self.target.name, "draft": self.draft.name,
                "dtype": weights_label(self.target),
                "prompts": self.profile.n_prompts, "max_new_tokens": self.profile.max_new_tokens,
                "timed_prompts": self.profile.timed_prompts, "timed_tokens": self.profile.timed_tokens,
                "store_tokens": store_corpus_tokens(self.stores), "draft_top1": float(np.mean(ranks == 0)),
                "draft_call_ratio": self.draft_call / self.target_call}

    def grid(self, shapes: list[tuple[int, int]] | None = None) -> pd.DataFrame:
        """:func:`grid_rows` of every family on both sets (the draft model's from its ranks, each of its calls
        priced at its measured cost over a target call), with ``family`` and ``set``, and ``est_speedup_gpu``
        where a GPU cost table exists (:func:`specnb.experiments.gpu_price.add_gpu_column`: target calls only)."""
        shapes = shapes or grid_shapes()
        frames = [grid_rows(make, self.refs[name], shapes, self.cost,
                            self.hidden[name] if family == DRESD else None).assign(family=family, set=name)
                  for name in self.sets for family, make in self.makers.items()]
        frames += [grid_rows(None, self.refs[name], shapes, self.cost, ranks=self.ranks[name],
                             draft_ratio=self.draft_call / self.target_call).assign(family="draft model", set=name)
                   for name in self.sets]
        return add_gpu_column(pd.concat(frames, ignore_index=True), PAPER_SHAPES["dresd"])

    def timed(self, grids: pd.DataFrame, timed_families: tuple[str, ...]) -> pd.DataFrame:
        """:func:`timed_cells` of each family's best estimated HumanEval shape with at least two drafts in
        ``grids`` (a :func:`grid_summary` table; with one draft both verification modes make the same call) on
        the profile's timed prompts x tokens."""
        from ..core.datasets import load_prompts
        from .references import references_and_states

        code = grids[(grids.set == "HumanEval") & (grids.k >= 2)]
        cells = [(f, *(int(x) for x in code[code.family == f].nlargest(1, "est_speedup")[["k", "w"]].iloc[0]))
                 for f in timed_families]
        n, tokens = self.profile.timed_prompts, self.profile.timed_tokens
        if n <= len(self.refs["HumanEval"]):
            prompts = self.sets["HumanEval"][:n]
            refs, hidden = cut(self.refs["HumanEval"], self.hidden["HumanEval"], n, tokens)
        else:  # more timed prompts than replayed ones: their references too (cached once decoded)
            prompts = load_prompts("humaneval", n)
            refs, hidden = references_and_states(self.target, prompts, tokens)
        return timed_cells(self.target, self.makers, cells, prompts, refs, hidden, self.cost, tokens)

    def mcsd_order(self, pairs: list[tuple[str, str]]) -> pd.DataFrame:
        """:func:`mcsd_shape_rows` on both sets, with ``set``."""
        return pd.concat([mcsd_shape_rows(self.refs[name], self.ranks[name], pairs).assign(set=name)
                          for name in self.sets], ignore_index=True)

    def mcsd_budgets(self, budgets: dict[int, tuple[str, ...]] = MCSD_BUDGETS) -> pd.DataFrame:
        """:func:`mcsd_budget_rows` on both sets, with ``set``: each draft call priced at its measured cost over a
        target call, as :meth:`grid` prices the draft model's."""
        return pd.concat([mcsd_budget_rows(self.refs[name], self.ranks[name], self.cost,
                                           self.draft_call / self.target_call, budgets).assign(set=name)
                          for name in self.sets], ignore_index=True)

    def record_setup(self, report) -> None:
        """The setup tables of DReSD (Fig. 7) and MCSD (Fig. 4) against this run, on ``report``."""
        o, p = self.headlines(), self.profile
        sizes = f"{p.n_prompts} × {p.max_new_tokens} per set, greedy replay; timed {p.timed_prompts} × {p.timed_tokens}"
        tokens = o["store_tokens"]
        stores = (f"DReSD: {tokens['dense']:,} tokens of {DOCUMENTS['code-OOD']}; REST and CREST: "
                  f"{tokens['rest']:,} tokens of {DOCUMENTS[p.study_stores.rest_store]}")
        report.setup("DReSD", here={
            "model": f"{o['target']}", "hardware": "this machine's CPU", "dtype": o["dtype"],
            "datastore": stores, "prompts × tokens": sizes,
            "task": "HumanEval, MT-Bench"}, theirs={
            "model": "CodeLlama 7B / 13B, Llama-2-Chat 7B / 13B", "hardware": "one NVIDIA V100 GPU",
            "datastore": "EvolInstructCode, about 19 M tokens (Fig. 7: an ID store of greedy outputs)",
            "prompts × tokens": "100 CodeAlpaca prompts × up to 128 tokens, decoded", "task": "CodeAlpaca, MT-Bench"})
        report.setup("MCSD", here={
            "model": f"{o['draft']} → {o['target']} (a draft call costs {o['draft_call_ratio']:.2f} of a target call)",
            "hardware": "this machine's CPU", "dtype": o["dtype"], "prompts × tokens": sizes,
            "task": "HumanEval, MT-Bench, greedy"}, theirs={
            "model": "LLaMA-68M → LLaMA-13B (about 1/190 of its parameters)", "hardware": "NVIDIA RTX A6000 GPU",
            "dtype": "fp16", "prompts × tokens": "Alpaca × up to 128 tokens, decoded", "task": "Alpaca"})


def order_ratios(order: pd.DataFrame) -> pd.DataFrame:
    """One row per (set, pair) of :func:`mcsd_shape_rows` rows: ``pair`` ("4x2 vs 2x4, HumanEval"), its ``shapes``
    ("4x2 vs 2x4") and ``set``, and the decreasing shape's tokens per call over the increasing one's (``ratio``,
    ``low``, ``high``: paired by prompt)."""
    out = []
    for (name, pair), group in order.groupby(["set", "pair"], sort=False):
        dec, inc = pair.split(" vs ")
        out.append({"pair": f"{pair}, {name}", "shapes": pair, "set": name, **dict(zip(("ratio", "low", "high"),
                                                          paired_ratio(group, {"shape": dec}, {"shape": inc}),
                                                          strict=True))})
    return pd.DataFrame(out)


def cost_model_sentence(report) -> str:
    """What the timed cells say about the cost model, chosen from ``report``'s ``model ...`` verdicts."""
    verdicts = [c.verdict for key, c in report.comparisons.items() if key.startswith("model ")]
    if verdicts and all(v == "agrees" for v in verdicts):
        return "the cost model's prediction agreed with the measured speedup on every timed cell (verdicts below)"
    return ("the cost model's prediction did not agree with the measured speedup on every timed cell (verdicts "
            "below), so the estimated-speedup grid ranks shapes by a model this run does not confirm")
