"""Draft-shape grids by greedy replay (:mod:`specnb.eval.replay`), priced with a roofline cost model.

Greedy replay gives every call's accepted length from the target's greedy output alone, so a grid of draft
shapes costs only the drafters' own proposals. With a :class:`specnb.core.roofline.CostModel` each replayed run
is priced call by call at its context length, which estimates the speedup over AR (drafting and acceptance
time excluded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd
from torch import Tensor

from ..core.drafter import Drafter
from ..core.metrics import RunStats, ratio_interval
from ..drafters.mixed import MixedDrafter
from ..drafters.model_ngram import BigramTable
from ..eval.replay import Reference, ar_priced_seconds, priced_seconds, replay_many
from ..eval.runner import generation_row, summarize


def replay_rows(name: str, runs: list[RunStats]) -> pd.DataFrame:
    """Replayed runs (one per reference) as :func:`specnb.eval.bench.run_bench` rows of method ``name`` (prompt_id =
    the reference's index; times are 0), ready for :func:`specnb.experiments.summarize`."""
    return pd.DataFrame([{"method": name, "prompt_id": i, **generation_row(stats)} for i, stats in enumerate(runs)])


def replay_summary(name: str, runs: list[RunStats], cost=None, ar_seconds: float | None = None,
                   shape: tuple[int, int] | None = None, ar_per_prompt: list[float] | None = None
                   ) -> dict[str, float]:
    """One row for the replayed ``runs`` of one drafter: the :func:`specnb.experiments.summarize` columns replay
    gives (calls, tokens_per_call, accepted_length, acceptance_rate), nodes_per_call and, with a cost model and
    the references' priced AR time ``ar_seconds``, ``est_speedup`` (that time / the priced time of the replayed
    calls, each priced as a ``shape`` call or, without one, by its drafted nodes:
    :func:`specnb.eval.replay.priced_seconds`).
    With ``ar_per_prompt`` (the priced AR time of each reference, in the order of ``runs``) the row also holds
    the 90% intervals over prompts of tokens per call and of the estimated speedup (``tokens_per_call_low`` /
    ``_high``, ``est_speedup_low`` / ``_high``)."""
    frame = replay_rows(name, runs)
    summary = summarize(frame, baseline="").iloc[0]
    row = {**summary[["calls", "tokens_per_call", "accepted_length", "acceptance_rate"]],
           "nodes_per_call": frame.drafted_nodes.sum() / max(1, frame.calls.sum())}
    if ar_per_prompt is not None:
        row.update(tokens_per_call_low=summary.tokens_per_call_low, tokens_per_call_high=summary.tokens_per_call_high)
    if cost is not None and ar_seconds is not None:
        seconds = [priced_seconds(run, cost, shape) for run in runs]
        row["est_speedup"] = ar_seconds / sum(seconds)
        if ar_per_prompt is not None:
            row["est_speedup_low"], row["est_speedup_high"] = ratio_interval(np.asarray(ar_per_prompt),
                                                                             np.asarray(seconds))
    return row


def replay_grid(make: Callable[[int, int], Drafter], references: list[Reference],
                shapes: Iterable[tuple[int, int]], cost=None, hidden: list[Tensor] | None = None,
                intervals: bool = False) -> pd.DataFrame:
    """Replayed acceptance of ``make(k, w)`` for every (k, w) in ``shapes`` over the same references: one
    :func:`replay_summary` row per shape, with k and w (a call priced as a (k, w) call); ``intervals``: with the
    90% intervals over prompts of tokens per call and of the estimated speedup."""
    ar_seconds = ar_priced_seconds(references, cost) if cost is not None else None
    ar_per_prompt = [ar_priced_seconds([r], cost) if cost is not None else 0.0 for r in references] \
        if intervals else None
    return pd.DataFrame([{"k": k, "w": w, **replay_summary(f"{k}x{w}", replay_many(lambda k=k, w=w: make(k, w),
                                                                                  references, hidden),
                                                           cost, ar_seconds, (k, w), ar_per_prompt)}
                         for k, w in shapes])


def mixed_grid(table: BigramTable, references: list[Reference], ks: list[int], ws: list[int],
               cost=None, max_ngram: int = 1, intervals: bool = False) -> pd.DataFrame:
    """:func:`replay_grid` of the mixed strategy (N-Grammys) over every (k, w) of ``ks`` x ``ws``."""
    return replay_grid(lambda k, w: MixedDrafter(table, k, w, max_ngram=max_ngram), references,
                       [(k, w) for k in ks for w in ws], cost, intervals=intervals)
