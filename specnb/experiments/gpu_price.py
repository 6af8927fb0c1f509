"""Replayed acceptance priced on the papers' GPU class: the ``est_speedup_gpu`` column of notebooks 06, 08 and 09.

The papers time 7B-13B models on V100 / A100 / L4 GPUs, where a call verifying many draft tokens costs about what a
one-token call costs; on this study's CPU it does not (notebook 05). ``data/roofline_gpu.csv`` is the cost of one
target call per (k, w, context) measured on a GPU for the papers' model shapes (``specnb roofline --model
random:llama-2-7b --device cuda --out data/roofline_gpu.csv``: costs need no trained weights). Where it exists,
:func:`add_gpu_column` prices each row's measured tokens per call with it; where it does not, the column is left
out and one line says so.

The estimate: tokens per call over the slow-down of one call of the row's shape (a (k, w) batch, or one row of its
draft nodes) at one context length, on the GPU table. It prices calls only, as the CPU estimates do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.roofline import GPU_CSV, CostModel, load_gpu_table

COLUMN = "est_speedup_gpu"
LABEL = "estimated speedup on the papers' GPU class"
CONTEXT = 256  # tokens of context at which a call is priced (the CPU estimates' call_cost uses the same)
PAPER_SHAPES = {"dresd": "random:llama-2-7b", "crest": "random:llama-2-7b", "ngrammys": "random:mistral-7b"}
"""The model shape whose GPU costs stand for each paper's targets (DReSD and CREST: Llama-2 / CodeLlama 7B;
N-Grammys: Mistral-7B)."""


def gpu_cost_model(model: str, path: str | Path = GPU_CSV) -> tuple[CostModel, str] | None:
    """(cost model, its model and device in words) of ``model``'s rows in the GPU table at ``path`` (any one model
    of the table where ``model`` was not measured), or None when there is no table."""
    table = load_gpu_table(path)
    if table is None or table.empty:
        return None
    if "model" in table:
        chosen = model if model in set(table.model) else str(table.model.iloc[0])
        table = table[table.model == chosen]
    else:
        chosen = "?"
    device = str(table.device.iloc[0]) if "device" in table else "a GPU"
    return CostModel(table), f"{chosen} on {device}"


def add_gpu_column(frame: pd.DataFrame, model: str, nodes: str | None = None, path: str | Path = GPU_CSV,
                   context: int = CONTEXT) -> pd.DataFrame:
    """``frame`` with :data:`COLUMN`: each row's ``tokens_per_call`` over what one of its calls costs in one-token
    calls on the GPU table (:func:`gpu_cost_model` of ``model``) at ``context`` — a (``k``, ``w``) call, or, with
    ``nodes`` (a column of draft tokens per call), one row of that many nodes. Without a GPU table, ``frame``
    unchanged and one printed line saying why the column is absent."""
    found = gpu_cost_model(model, path)
    if found is None:
        where = f"{Path(path).parent.name}/{Path(path).name}"
        print(f"{COLUMN} ({LABEL}) left out: {where} does not exist (`specnb roofline --device cuda --model {model} "
              f"--out {where}` on a GPU writes it)")
        return frame
    cost, _ = found
    one = cost.seconds_at(1, 0, context)
    if nodes is not None:
        counts = np.rint(frame[nodes].fillna(0).to_numpy(float)).astype(np.int64)
        calls = cost.chain_seconds(counts, context) / one
    else:
        calls = np.array([cost.seconds_at(int(k), int(w), context) / one
                          for k, w in zip(frame.k, frame.w, strict=True)])
    return frame.assign(**{COLUMN: frame.tokens_per_call.to_numpy(float) / calls})
