"""CREST's compaction analysis (notebook 04): corpora and their REST indexes, n-gram statistics (CREST Table 1,
Fig. 4), accepted length by replay against storage for REST on corpus fractions and CREST top-t stores (Figs.
6-9), tree sizes (Table 2), the replay checked by real decoding, and lookup latency.

Every store lives under ``cache_dir()/nb04/<profile>`` and is built once: a rerun opens what is there (REST
indexes, CREST stores, draftretriever indexes) and only replays, which takes milliseconds per point.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..datastores.corpus import TokenCorpus, build_corpus, stdlib_files
from ..datastores.crest import CrestStore, NgramCounter, NgramTrees, ngram_trees, store_meta, write_store
from ..datastores.rest import DEFAULT_SEARCH, RestIndex, disk_bytes
from ..drafters.base import Drafter
from ..drafters.crest import CrestDrafter
from ..drafters.priced import PricedTreeDrafter
from ..drafters.rest import RestDrafter
from ..models import LoadedModel
from ..prompts import Prompt
from ..replay import Reference, replay_greedy
from .draftretriever_ref import compare_latency, write_draftretriever
from .grids import replay_table
from .runner import run, summarize
from .stores import rest_store

FRACTIONS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0)  # REST on nested document samples (CREST Figs. 6-7)
CHECKED = {"code": 2, "chat": 1}  # prompts per task decoded for real to check the replay (quick)


@dataclass(frozen=True)
class Sizes:
    """One profile's run: the code corpus source, chat corpus tokens (None: all of ShareGPT), prompts per task,
    CREST's top-t grid and largest n."""

    code: str | list[Path]
    chat_tokens: int | None
    prompts: int
    t_grid: tuple[int, ...]
    m: int
    checked: dict[str, int] = field(default_factory=lambda: dict(CHECKED))


def sizes_for(profile: str, n_prompts: int) -> Sizes:
    """``smoke``: six stdlib files and 30k ShareGPT tokens; ``quick``: the whole stdlib (~9.4M Gemma tokens) and
    3M ShareGPT tokens; ``full``: all of ShareGPT. ``n_prompts``: the profile's prompts per set."""
    if profile == "smoke":
        return Sizes(stdlib_files()[:6], 30_000, 2, (10, 40, 160), 4, {"code": 1, "chat": 1})
    if profile == "quick":
        return Sizes("code", 3_000_000, min(n_prompts, 6), (250, 500, 1000, 2000, 4000, 8000), 5)
    return Sizes("code", None, n_prompts, (1000, 4000, 16000, 64000), 5, {"code": 5, "chat": 2})


def corpora_and_indexes(target: LoadedModel, sizes: Sizes, work: Path
                        ) -> tuple[dict[str, TokenCorpus], dict[str, RestIndex], pd.DataFrame]:
    """The code and chat corpora (cached by :func:`specnb.datastores.corpus.build_corpus`), their 100% REST
    indexes (built once under ``work``) and a table: task, docs, tokens, REST bytes, build s (of the index)."""
    corpora = {"code": build_corpus(sizes.code, target, out=work / "corpus-code" if isinstance(sizes.code, list)
                                    else None),
               "chat": build_corpus("chat", target, max_tokens=sizes.chat_tokens)}
    indexes = {task: rest_store(c, work / f"rest-{task}-100") for task, c in corpora.items()}
    table = pd.DataFrame([{"task": t, "docs": c.num_docs, "tokens": c.num_tokens,
                           "REST bytes": disk_bytes(indexes[t].path), "build s": indexes[t].meta["build_seconds"]}
                          for t, c in corpora.items()])
    return corpora, indexes, table


def ngram_statistics(indexes: dict[str, RestIndex], m: int
                     ) -> tuple[dict[str, NgramCounter], pd.DataFrame, pd.DataFrame]:
    """(counters per task, CREST Table 1: distinct n-grams per n (rows "1".."m" and "1-m") x task, CREST Fig. 4:
    rows task, n, fraction_of_ngrams, fraction_of_occurrences at ~60 log-spaced points per curve, most frequent
    n-grams first)."""
    counters = {task: NgramCounter(index) for task, index in indexes.items()}
    table1, curves = {}, []
    for task, counter in counters.items():
        counts = [counter.counts(n) for n in range(1, m + 1)]
        table1[task] = [len(c) for c in counts] + [sum(len(c) for c in counts)]
        for n, c in enumerate(counts, 1):
            pick = np.unique(np.geomspace(1, len(c), 60).astype(int)) - 1
            curves.append(pd.DataFrame({"task": task, "n": n, "fraction_of_ngrams": (pick + 1) / len(c),
                                        "fraction_of_occurrences": (np.cumsum(c) / c.sum())[pick]}))
    index = pd.Index([str(n) for n in range(1, m + 1)] + [f"1-{m}"], name="n")
    return counters, pd.DataFrame(table1, index=index), pd.concat(curves, ignore_index=True)


def ngram_tables(indexes: dict[str, RestIndex], counters: dict[str, NgramCounter], m: int, t: int
                 ) -> Tables:
    """REST's tree of each of the top ``t`` n-grams of every n <= ``m``, per task (CREST's precomputation)."""
    return {task: {n: ngram_trees(index, counters[task], n, t, progress=False) for n in range(1, m + 1)}
            for task, index in indexes.items()}


def crest_point(task: str, ns: list[int], t: int, tables: Tables,
                indexes: dict[str, RestIndex], references: dict[str, list[Reference]], work: Path) -> dict:
    """One CREST store (the top ``t`` n-grams of every n in ``ns``; written once under ``work``) replayed over
    the task's references: task, ns, m, t, entries, bytes, accepted_length."""
    path = work / f"crest-{task}-{'m' if len(ns) > 1 else 'n'}{max(ns)}-t{t}.sqlite"
    if not path.exists():
        write_store(path, [tables[task][n] for n in ns], t, store_meta(indexes[task], DEFAULT_SEARCH, 0.0))
    store = CrestStore(path)
    row = {"task": task, "ns": "-".join(map(str, ns)), "m": max(ns), "t": t, "entries": len(store),
           "bytes": disk_bytes(path), "accepted_length": accepted_length(CrestDrafter(store), references[task])}
    store.close()
    return row


Tables = dict[str, dict[int, NgramTrees]]  # task -> n -> the precomputed trees of its top n-grams


def compaction(corpora: dict[str, TokenCorpus], indexes: dict[str, RestIndex], tables: Tables,
               references: dict[str, list[Reference]], sizes: Sizes, work: Path) -> pd.DataFrame:
    """CREST Figs. 6-7: one row per REST datastore on a :data:`FRACTIONS` sample of each corpus (task, method
    "REST", fraction, tokens, bytes, accepted_length) and per CREST store with every n <= m at each t of the
    grid (method "CREST" and :func:`crest_point`'s columns)."""
    rows = []
    for task, corpus in corpora.items():
        for fraction in FRACTIONS:
            index = indexes[task] if fraction == 1 else rest_store(corpus.sample(fraction, seed=0),
                                                                     work / f"rest-{task}-{fraction}")
            rows.append({"task": task, "method": "REST", "fraction": fraction, "tokens": index.meta["num_tokens"],
                         "bytes": disk_bytes(index.path),
                         "accepted_length": accepted_length(RestDrafter(index), references[task])})
    ns = list(range(1, sizes.m + 1))
    rows += [dict(crest_point(task, ns, t, tables, indexes, references, work), method="CREST")
             for task in indexes for t in sizes.t_grid]
    return pd.DataFrame(rows)


def top_t_grids(indexes: dict[str, RestIndex], tables: Tables, references: dict[str, list[Reference]],
                sizes: Sizes, work: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(CREST Fig. 8: single-n stores, CREST Fig. 9: all-n <= m stores) over the t grid, :func:`crest_point`
    rows."""
    single = pd.DataFrame([crest_point(task, [n], t, tables, indexes, references, work) for task in indexes
                           for n in range(1, sizes.m + 1) for t in sizes.t_grid])
    upto = pd.DataFrame([crest_point(task, list(range(1, m + 1)), t, tables, indexes, references, work)
                         for task in indexes for m in range(1, sizes.m + 1) for t in sizes.t_grid])
    return single, upto


def tree_sizes(tables: Tables) -> pd.DataFrame:
    """CREST Table 2: task, n, n-grams, avg tree nodes, avg occurrences of the precomputed top n-grams."""
    return pd.DataFrame([{"task": task, "n": n, "n-grams": len(trees.nodes), "avg tree nodes": trees.nodes.mean(),
                          "avg occurrences": trees.counts.mean()}
                         for task in tables for n, trees in tables[task].items()])


def real_decoding_check(target: LoadedModel, indexes: dict[str, RestIndex], crest: dict[str, CrestStore],
                        references: dict[str, list[Reference]], cost, sizes: Sizes, max_new_tokens: int
                        ) -> pd.DataFrame:
    """Greedy speculative decoding for real (:func:`specnb.experiments.run`, AR alongside) of the first
    ``sizes.checked[task]`` references' prompts with full REST and CREST trees and their priced forms (the
    roofline ``cost``; they learn across prompts). :func:`specnb.experiments.summarize` rows with task,
    prompts and the replay's tokens per call (``replay_tokens_per_call``; none for the priced forms, whose
    choices depend on their history)."""
    out = []
    for task, index in indexes.items():
        refs = references[task][:sizes.checked[task]]
        base = {"REST": lambda index=index: RestDrafter(index), "CREST": lambda task=task: CrestDrafter(crest[task])}
        methods = {"ar": None} | {n: make() for n, make in base.items()} | \
            {f"{n} priced": PricedTreeDrafter(make(), cost) for n, make in base.items()}
        rows = run(target, [Prompt(str(i), p.tolist()) for i, (p, _) in enumerate(refs)], methods,
                   max_new_tokens=max_new_tokens, warmup=0, progress=False)
        replayed = summarize(replay_table(base, refs), baseline="").set_index("method").tokens_per_call
        summary = summarize(rows)
        out.append(summary.assign(task=task, prompts=len(refs), replay_tokens_per_call=summary.method.map(replayed)))
    return pd.concat(out, ignore_index=True)


def lookup_contexts(references: list[Reference], per_reference: int = 20) -> list[np.ndarray]:
    """int [L + i] contexts: each reference's prompt followed by ~``per_reference`` evenly spaced prefixes of its
    output (the queries of the latency and candidate comparisons)."""
    return [np.concatenate([p, g])[:len(p) + i] for p, g in references
            for i in range(1, len(g), max(1, len(g) // per_reference))]


def latency_table(corpora: dict[str, TokenCorpus], indexes: dict[str, RestIndex], crest: dict[str, CrestStore],
                  contexts: dict[str, list[np.ndarray]], m: int, work: Path) -> pd.DataFrame:
    """:func:`lookup_latency` per task (draftretriever's index of the corpus written once under ``work``)."""
    rows = []
    for task, index in indexes.items():
        path = work / f"draftretriever-{task}.idx"
        if not path.exists():
            write_draftretriever(corpora[task], path)
        rows.append({"task": task, **lookup_latency(index, crest[task], path, contexts[task], m)})
    return pd.DataFrame(rows)


def storage_summary(compaction: pd.DataFrame, task: str) -> dict[str, float]:
    """REST's best accepted length on ``task`` and the CREST storage that reaches it.

    compaction: rows with task, method ("REST" over corpus fractions, "CREST" over top-t), bytes and
    accepted_length (CREST rows in increasing storage). The crossing point is interpolated in log(bytes)
    between the two CREST grid points around it; "at equal storage" compares CREST with REST's curve
    interpolated in log(bytes) at CREST's sizes.
    """
    rest = compaction[(compaction.task == task) & (compaction.method == "REST")]
    crest = compaction[(compaction.task == task) & (compaction.method == "CREST")]
    best = rest.loc[rest.accepted_length.idxmax()]
    reach = crest[crest.accepted_length >= best.accepted_length]
    smallest = reach.loc[reach.bytes.idxmin()] if len(reach) else None
    rest_at = np.interp(np.log(crest.bytes), np.log(rest.bytes), rest.accepted_length)
    cross = np.nan
    if len(reach):
        above = int(np.argmax(crest.accepted_length.to_numpy() >= best.accepted_length))
        if above == 0:
            cross = crest.bytes.iloc[0]
        else:
            a0, a1 = crest.accepted_length.iloc[above - 1], crest.accepted_length.iloc[above]
            b0, b1 = np.log(crest.bytes.iloc[above - 1]), np.log(crest.bytes.iloc[above])
            cross = float(np.exp(b0 + (best.accepted_length - a0) / (a1 - a0) * (b1 - b0)))
    return {"task": task, "rest_best_accepted": best.accepted_length, "rest_best_mb": best.bytes / 1e6,
            "crest_best_accepted": crest.accepted_length.max(),
            "crest_mb_reaching_rest_best": np.nan if smallest is None else smallest.bytes / 1e6,
            "storage_ratio_grid": np.nan if smallest is None else best.bytes / smallest.bytes,
            "storage_ratio_interpolated": best.bytes / cross,
            "crest_gain_at_equal_storage": float(np.mean(crest.accepted_length.to_numpy() - rest_at)),
            "crest_gain_over_rest_best": crest.accepted_length.max() / best.accepted_length - 1}


def storage_table(compaction: pd.DataFrame) -> pd.DataFrame:
    """:func:`storage_summary` of every task of a :func:`compaction` table, one row each."""
    return pd.DataFrame([storage_summary(compaction, task) for task in compaction.task.unique()])


def accepted_length(drafter: Drafter, references: list[Reference]) -> float:
    """Accepted draft tokens per target call of ``drafter`` replayed over ``references`` (ratio of totals)."""
    runs = [replay_greedy(drafter, prompt, output) for prompt, output in references]
    return sum(c.accepted for run in runs for c in run.calls) / max(1, sum(run.num_calls for run in runs))


def lookup_latency(index: RestIndex, crest: CrestStore, draftretriever_file: Path, contexts: list[np.ndarray],
                   max_n: int) -> dict[str, float]:
    """Median lookup milliseconds of REST, ``draftretriever`` and CREST (its last ``max_n`` tokens as the key)
    over the same contexts, and CREST's 90th percentile."""
    both = compare_latency(index, draftretriever_file, contexts)
    crest_ms = []
    for context in contexts:
        start = time.perf_counter()
        crest.lookup(context[-max_n:])
        crest_ms.append(1e3 * (time.perf_counter() - start))
    return {"queries": len(both), "REST median ms": both.rest_ms.median(),
            "draftretriever median ms": both.draftretriever_ms.median(),
            "CREST median ms": float(np.median(crest_ms)), "CREST p90 ms": float(np.percentile(crest_ms, 90))}
