"""CREST's compaction analysis (notebook 04): the target's reference outputs, accepted length by replay, how
much storage CREST needs to match REST's accepted length, and lookup latency."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..datastores.atomic import write_text
from ..decode import generate
from ..drafters.base import Drafter
from ..drafters.crest import CrestStore
from ..drafters.rest import RestIndex
from ..models import LoadedModel
from ..prompts import Prompt, encode_prompt
from ..replay import replay_greedy
from .draftretriever_ref import compare_latency


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


Reference = tuple[np.ndarray, np.ndarray]  # (prompt ids [L], the target's greedy output [T])


def greedy_references(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int, saved: Path
                      ) -> list[Reference]:
    """The target's greedy outputs for ``prompts``, kept in the JSON file ``saved`` (greedy outputs are
    deterministic, so a rerun reuses them)."""
    if saved.exists():
        return [(np.array(p), np.array(g)) for p, g in json.loads(saved.read_text())]
    refs = []
    for prompt in prompts:
        ids = encode_prompt(target, prompt)
        refs.append((ids.numpy(), np.asarray(generate(target, ids, max_new_tokens=max_new_tokens).tokens)))
    write_text(saved, json.dumps([(p.tolist(), g.tolist()) for p, g in refs]))
    return refs


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
