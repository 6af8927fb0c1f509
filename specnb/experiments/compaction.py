"""CREST's compaction analysis (notebook 04): how much storage CREST needs to match REST's accepted length."""

from __future__ import annotations

import numpy as np
import pandas as pd


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
