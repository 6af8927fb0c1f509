"""Replayed acceptance priced on the papers' GPU class: the ``est_speedup_gpu`` columns of notebooks 06, 08 and 09.

The papers time 7B-13B models on V100 / A100 / L4 GPUs, where a call verifying many draft tokens costs about what a
one-token call costs; on this study's CPU it does not (notebook 05). ``data/roofline_gpu.csv`` is the cost of one
target call per (k, w, context) measured on a GPU for the papers' model shapes (``specnb roofline --model
random:llama-2-7b --device cuda --grid gpu``: costs need no trained weights), in two modes (``cuda_graphs``): eager
calls, as the papers' Hugging Face code makes them, where a 7B call is bound by its kernel launches and a block of
many tokens costs little more than one token; and calls replayed from CUDA graphs, as a serving stack's decode, where
it costs its kernels (docs/gpu.md). Where the table exists, :func:`add_gpu_column` prices each row's measured tokens
per call with each mode; where it does not, the columns are left out and one line says so.

The estimate: tokens per call over the slow-down of one call of the row's shape (a (k, w) batch, or one row of its
draft nodes) at one context length, on the GPU table. It prices calls only, as the CPU estimates do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.roofline import GPU_CSV, CostModel, load_gpu_table

COLUMN = "est_speedup_gpu"
GRAPHS_COLUMN = "est_speedup_gpu_graphs"
LABEL = "estimated speedup on the papers' GPU class"
COLUMNS = {False: COLUMN, True: GRAPHS_COLUMN}
"""The column of each call mode (``cuda_graphs`` of the table): eager calls, and calls replayed from CUDA graphs."""
CONTEXT = 256  # tokens of context at which a call is priced (the CPU estimates' call_cost uses the same)
PAPER_SHAPES = {"dresd": "random:llama-2-7b", "crest": "random:llama-2-7b", "ngrammys": "random:mistral-7b"}
"""The model shape whose GPU costs stand for each paper's targets (DReSD and CREST: Llama-2 / CodeLlama 7B;
N-Grammys: Mistral-7B)."""


def graphed(table: pd.DataFrame) -> pd.Series:
    """bool per row of a GPU table: timed from CUDA graphs (``cuda_graphs``; a table without it was timed eagerly)."""
    return table.cuda_graphs.astype(bool) if "cuda_graphs" in table else pd.Series(False, index=table.index)


def gpu_cost_model(model: str, path: str | Path = GPU_CSV, graphs: bool = False) -> tuple[CostModel, str] | None:
    """(cost model, its model and device in words) of ``model``'s rows in the GPU table at ``path`` (any one model
    of the table where ``model`` was not measured) timed in one call mode (``graphs``: replayed from CUDA graphs,
    :func:`graphed`), or None when there is no such table or mode."""
    table = load_gpu_table(path)
    if table is None:
        return None
    table = table[graphed(table) == graphs]
    if table.empty:
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
    """``frame`` with a column of :data:`COLUMNS` per call mode the GPU table holds: each row's ``tokens_per_call``
    over what one of its calls costs in one-token calls on that mode's table (:func:`gpu_cost_model` of ``model``)
    at ``context`` — a (``k``, ``w``) call, or, with ``nodes`` (a column of draft tokens per call), one row of that
    many nodes; with ``tokens_per_call_low`` / ``_high``, the column's ``_low`` / ``_high`` from them. Without a GPU
    table, ``frame`` unchanged and one printed line saying why the columns are absent."""
    found = {graphs: gpu_cost_model(model, path, graphs) for graphs in COLUMNS}
    if not any(found.values()):
        where = f"{Path(path).parent.name}/{Path(path).name}"
        print(f"{COLUMN} ({LABEL}) left out: {where} does not exist (`specnb roofline --device cuda --model {model} "
              f"--grid gpu --out {where}` on a GPU writes it)")
        return frame
    columns = {}
    for graphs, model_and_name in found.items():
        if model_and_name is None:
            continue
        cost = model_and_name[0]
        one = cost.seconds_at(1, 0, context)
        if nodes is not None:
            counts = np.rint(frame[nodes].fillna(0).to_numpy(float)).astype(np.int64)
            calls = cost.chain_seconds(counts, context) / one
        else:
            calls = np.array([cost.seconds_at(int(k), int(w), context) / one
                              for k, w in zip(frame.k, frame.w, strict=True)])
        for end in ("", "_low", "_high"):  # the interval: tokens per call's alone (a GPU cell has no prompts)
            if f"tokens_per_call{end}" in frame:
                columns[COLUMNS[graphs] + end] = frame[f"tokens_per_call{end}"].to_numpy(float) / calls
    return frame.assign(**columns)
