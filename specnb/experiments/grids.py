"""Draft-shape grids by greedy replay (:mod:`specnb.replay`), priced with a roofline cost model.

Greedy replay gives every call's accepted length from the target's greedy output alone, so a grid of draft
shapes costs only the drafters' own proposals. With a :class:`specnb.roofline.CostModel` each replayed run
is priced call by call at its context length, which estimates the speedup over AR (drafting and acceptance
time excluded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd
from torch import Tensor

from ..drafters.base import Drafter
from ..drafters.mixed import MixedDrafter
from ..drafters.model_ngram import BigramTable
from ..metrics import RunStats
from ..replay import Reference, replay_many
from .runner import generation_row, summarize


def estimated_seconds(stats: RunStats, cost, k: int, w: int) -> float:
    """Sum over the calls of the roofline cost of a (k, w) call at that call's context length
    (drafting and acceptance time excluded); (k, w) = (1, 0) prices AR decoding."""
    context = stats.prompt_tokens + np.cumsum([0] + [c.new_tokens for c in stats.calls[:-1]])
    return float(sum(cost.seconds_at(k, w, int(ell)) for ell in context))


def ar_estimated_seconds(references: list[Reference], cost) -> float:
    """Roofline-priced time of AR decoding the references (one (1, 0) call per output token)."""
    total = 0.0
    for prompt, output in references:
        context = prompt.shape[0] + np.arange(output.shape[0] - 1)
        total += sum(cost.seconds_at(1, 0, int(ell)) for ell in context)
    return total


def replay_rows(name: str, runs: list[RunStats]) -> pd.DataFrame:
    """Replayed runs (one per reference) as :func:`specnb.experiments.run` rows of method ``name`` (prompt_id =
    the reference's index; times are 0), ready for :func:`specnb.experiments.summarize`."""
    return pd.DataFrame([{"method": name, "prompt_id": i, **generation_row(stats)} for i, stats in enumerate(runs)])


def replay_table(makers: Mapping[str, Callable[[], Drafter]], references: list[Reference],
                 hidden: list[Tensor] | None = None) -> pd.DataFrame:
    """Replay a fresh ``make()`` drafter of every method on every reference; one row per (method, reference)."""
    return pd.concat([replay_rows(name, replay_many(make, references, hidden)) for name, make in makers.items()],
                     ignore_index=True)


def replay_grid(make: Callable[[int, int], Drafter], references: list[Reference],
                shapes: Iterable[tuple[int, int]], cost=None, hidden: list[Tensor] | None = None) -> pd.DataFrame:
    """Replayed acceptance of ``make(k, w)`` for every (k, w) in ``shapes`` over the same references.

    One row per shape: k, w and the :func:`specnb.experiments.summarize` columns that replay gives (calls,
    tokens_per_call, accepted_length, acceptance_rate), nodes per call, and with a cost model ``est_speedup``
    (roofline-priced AR time / the priced time of the replayed (k, w) calls).
    """
    ar_seconds = ar_estimated_seconds(references, cost) if cost is not None else None
    rows = []
    for k, w in shapes:
        runs = replay_many(lambda k=k, w=w: make(k, w), references, hidden)
        frame = replay_rows(f"{k}x{w}", runs)
        summary = summarize(frame, baseline="").iloc[0]
        row = {"k": k, "w": w, **summary[["calls", "tokens_per_call", "accepted_length", "acceptance_rate"]],
               "nodes_per_call": frame.drafted_nodes.sum() / max(1, frame.calls.sum())}
        if cost is not None:
            row["est_speedup"] = ar_seconds / sum(estimated_seconds(run, cost, k, w) for run in runs)
        rows.append(row)
    return pd.DataFrame(rows)


def mixed_grid(table: BigramTable, references: list[Reference], ks: list[int], ws: list[int],
               cost=None, max_ngram: int = 1) -> pd.DataFrame:
    """:func:`replay_grid` of the mixed strategy (N-Grammys) over every (k, w) of ``ks`` x ``ws``."""
    return replay_grid(lambda k, w: MixedDrafter(table, k, w, max_ngram=max_ngram), references,
                       [(k, w) for k in ks for w in ws], cost)
