"""The cost model: seconds of one target call per draft shape and context length, on this machine.

A call of shape (k, w) verifies k rows of w + 1 tokens over a KV cache of ``context`` tokens. Its seconds come
from a *roofline table* (:func:`specnb.eval.timing.measure` rows: context, k, w, seconds, ...) timed once per
model, dtype, machine and forward path and cached at :func:`cost_table_path`. :class:`CostModel` prices any
shape at any context from such a table; the priced drafters, the router and the replayed speeds use it.
Nothing here times a call: :mod:`specnb.eval.timing` measures, this module reads.
"""

from __future__ import annotations

import bisect
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..model.kernels.cpu import cpu_id
from ..model.models import LoadedModel
from ..paths import artifact_path, safe_name


def device_name(device: torch.device | str) -> str:
    """GPU name, or the CPU (:func:`~specnb.model.kernels.cpu.cpu_id`: its name, family and model) with the number
    of threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_id()}, {torch.get_num_threads()} torch threads"


class CostModel:
    """Seconds of one call for each (k, w) in a measured table, at any context length.

    shapes: int64 [S, 2] the (k, w) measured at every context length of the table. ``table``: float64 [C, S],
    the measured seconds made non-decreasing in w for each k at each context (isotonic least squares,
    scikit-learn's): a call of more tokens in as many rows never costs less, but a table timed through a slow
    spell can say so, and a router pricing on it would take the larger tree for being the cheaper one
    (docs/forward_pass.md, "Measurements behind the code").

    A table of a path whose output head computes a call's rows as acceptance reads them
    (:class:`specnb.core.head_rows.HeadRows`) also holds the head's own seconds per row count (``head_seconds``)
    and the rows it computes at the first read (``head_first``): :meth:`head_correction` prices a replayed call's
    head as it runs. ``head_first`` is None for other tables (a GPU's, PyTorch's GEMM): their calls compute every
    row.

    ``timed_at``: (smallest, largest) read bandwidth in GB/s sampled while a CPU table was timed
    (:func:`specnb.eval.timing.time_cells`), None for a table without it: what a comparison with a later
    measurement checks the host's state against.
    """

    def __init__(self, frame: pd.DataFrame):
        required = {"context", "k", "w", "seconds"}
        if not required <= set(frame.columns):
            raise ValueError(f"a roofline table needs columns {sorted(required)}, got {sorted(frame.columns)}")
        table = frame.pivot_table(index="context", columns=["k", "w"], values="seconds", aggfunc="median")
        table = table.dropna(axis=1)
        if table.shape[1] == 0 or (1, 0) not in table.columns:
            raise ValueError("roofline table has no shape measured at every context, or lacks (k, w) = (1, 0)")
        self.contexts = table.index.to_numpy(dtype=np.float64)  # [C]
        self.shapes = np.array(table.columns.tolist(), dtype=np.int64)  # [S, 2]
        self.table = table.to_numpy(dtype=np.float64, copy=True)  # [C, S]
        from sklearn.isotonic import isotonic_regression  # slow to import: only where a table is priced

        for k in np.unique(self.shapes[:, 0]):
            columns = np.flatnonzero(self.shapes[:, 0] == k)
            columns = columns[np.argsort(self.shapes[columns, 1])]  # by w
            for row in self.table:
                row[columns] = isotonic_regression(row[columns])
        self.head_first, self.head_rows, self.head_curve = _head_curve(frame)
        self.timed_at = (float(frame.read_gb_per_s_low.min()), float(frame.read_gb_per_s_high.max())) \
            if "read_gb_per_s_low" in frame and frame.read_gb_per_s_low.notna().any() else None
        self._context_list = self.contexts.tolist()  # bisect on a list: faster than numpy's searchsorted on a scalar
        self._chains: dict[bytes, np.ndarray] = {}  # chain_seconds' rows [C, B] per budget list
        self._last_chain: tuple[int, bytes, np.ndarray] | None = None  # and its last answer

    def seconds(self, context_len: int) -> np.ndarray:
        """float64 [S]: interpolated linearly in the context length (clamped at the measured ends)."""
        return self._at_context(self.table, context_len)

    def _at_context(self, rows: np.ndarray, context_len: int) -> np.ndarray:
        """rows [C, X], one per measured context -> [X] at ``context_len`` (linear, clamped at the ends)."""
        if self.contexts.shape[0] == 1:
            return rows[0].copy()
        contexts = self._context_list
        i = min(max(bisect.bisect_left(contexts, context_len) - 1, 0), len(contexts) - 2)
        t = min(max((context_len - contexts[i]) / (contexts[i + 1] - contexts[i]), 0.0), 1.0)
        return (1 - t) * rows[i] + t * rows[i + 1]

    def seconds_at(self, k: int, w: int, context_len: int) -> float:
        """Seconds of one (k, w) call: the measured shape, else interpolated in the block's token count
        k * (w + 1) between measured shapes (on CPUs the cost depends mostly on that count); beyond the
        largest measured block, proportional to the token count (compute-bound). One row (k = 1) is priced
        from one-row shapes only, as :meth:`chain_seconds` prices it."""
        if k == 1:
            return float(self.chain_seconds(np.array([w]), context_len)[0])
        seconds = self.seconds(context_len)
        hit = np.flatnonzero((self.shapes[:, 0] == k) & (self.shapes[:, 1] == w))
        if hit.size:
            return float(seconds[hit[0]])
        tokens = self.shapes[:, 0] * (self.shapes[:, 1] + 1)
        order = np.argsort(tokens, kind="stable")
        tokens, seconds = tokens[order], seconds[order]
        n = k * (w + 1)
        if n > tokens[-1]:
            return float(seconds[-1] * n / tokens[-1])
        return float(np.interp(n, tokens, seconds))

    def head_seconds(self, rows: int) -> float:
        """Seconds of the output head alone on ``rows`` rows: interpolated between the measured row counts, beyond
        the largest proportional to the rows (compute-bound). Only for tables with a head curve."""
        if rows > self.head_rows[-1]:
            return float(self.head_curve[-1] * rows / self.head_rows[-1])
        return float(np.interp(rows, self.head_rows, self.head_curve))

    def head_correction(self, table_rows: int, rows: int, rows_read: int | None, all_rows: bool) -> float:
        """Seconds to add to a measured call, whose head computed ``table_rows`` rows, for a call of ``rows`` logits
        rows of which acceptance read the first ``rows_read`` (:attr:`specnb.core.metrics.CallStats.rows_read`):
        its head computes ``head_first`` rows at the first read and the rest in a second call if acceptance reads
        past them, or every row at once for a draft marked ``all_rows`` (batch verification's rows are its
        nodes', fewer than the table's k x (w + 1)). 0 where the table has no head curve or ``rows_read`` is
        unknown."""
        if self.head_first is None or rows_read is None:
            return 0.0
        if all_rows or rows <= self.head_first:
            computed = self.head_seconds(rows)
        else:
            computed = self.head_seconds(self.head_first)
            if rows_read > self.head_first:
                computed += self.head_seconds(rows - self.head_first)
        return computed - self.head_seconds(table_rows)

    def chain_seconds(self, nodes: np.ndarray, context_len: int) -> np.ndarray:
        """float64 [B]: the seconds of one call verifying b draft nodes and the root, as one row (a chain, or a
        tree under a tree mask: they cost the same), for every b in ``nodes`` (int [B]). Priced drafters ask at
        every step with the same budgets (a router's members all with the same context), so each budget list's
        answer at every measured context is kept, and a new context only interpolates between them (the answer
        is linear in the table's rows); the last answer is kept too."""
        nodes = np.asarray(nodes, dtype=np.int64)
        key = nodes.tobytes()
        if self._last_chain is None or self._last_chain[:2] != (context_len, key):
            rows = self._chains.get(key)
            if rows is None:
                rows = self._chains[key] = np.stack([self._chain_row(seconds, nodes) for seconds in self.table])
            self._last_chain = (context_len, key, self._at_context(rows, context_len))
        return self._last_chain[2].copy()

    def _chain_row(self, seconds: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """:meth:`chain_seconds` at one measured context: seconds [S] of the table's shapes -> [B].

        Interpolated linearly in the token count between the measured one-row shapes (1, w), and beyond the
        longest, proportional to the token count (compute-bound). Shapes of several rows are batch
        verification's, where every row reads the cache again: they cost more than one row of as many tokens,
        so interpolating through them overpriced trees and put unmeasured lengths out of order.
        """
        rows = np.flatnonzero(self.shapes[:, 0] == 1)  # at least (1, 0): the constructor checks it
        order = rows[np.argsort(self.shapes[rows, 1])]
        tokens, row_seconds = self.shapes[order, 1] + 1, seconds[order]
        n = nodes + 1
        return np.where(n > tokens[-1], row_seconds[-1] * n / tokens[-1], np.interp(n, tokens, row_seconds))


def _head_curve(frame: pd.DataFrame) -> tuple[int | None, np.ndarray, np.ndarray]:
    """(head_first, row counts int64 [R], seconds float64 [R] made non-decreasing) of a table's head columns;
    (None, [], []) where it has none."""
    if "head_first" not in frame.columns or frame.head_first.isna().all():
        return None, np.empty(0, np.int64), np.empty(0)
    from sklearn.isotonic import isotonic_regression

    timed = frame.dropna(subset=["head_seconds"])
    curve = timed.groupby(timed.k * (timed.w + 1)).head_seconds.median()
    return (int(frame.head_first.dropna().iloc[0]), curve.index.to_numpy(np.int64),
            np.asarray(isotonic_regression(curve.to_numpy(np.float64))))


def machine_key(target: LoadedModel) -> str:
    """Model, dtype, device (CPU model and threads) and forward path of ``target``, as a file name: what a
    cached timing or output depends on (a table timed with other kernels or another body does not apply). The
    model's whole name is kept (``safe_name(..., whole=True)``): two checkpoints in folders of one name must not
    share cached outputs."""
    dtype = target.dtype_name
    host = device_name(target.device).replace(" ", "_").replace("/", "_")
    kernel = target.decoder.call_path()
    return "-".join(part for part in (safe_name(target.name, whole=True), dtype, host, kernel) if part)


def cost_table_path(target: LoadedModel) -> Path:
    """Where :func:`specnb.eval.timing.cost_table` caches this target's table and :func:`cached_cost_model` reads it;
    ``-states``: timed as :func:`specnb.eval.timing.time_cells` times now, paired, the head's own curve included,
    the cells that could not be true timed again, the read bandwidth sampled before each pass (tables cached before
    that lack one of these, and are measured again rather than read)."""
    return artifact_path("roofline", f"{machine_key(target)}-states.csv")


def cached_cost_model(target: LoadedModel, path: str | Path = "") -> CostModel:
    """A CostModel from the CSV at ``path``, or from this target's cached table (:func:`cost_table_path`).

    Reads, never measures (the drafters that price calls sit below the timing code): FileNotFoundError when the
    table is absent. :func:`specnb.eval.timing.cost_table` measures and caches it; the bench does so before it
    makes a drafter that needs it.
    """
    if path:
        if not Path(path).exists():
            raise FileNotFoundError(f"roofline table {path} does not exist")
        return CostModel(pd.read_csv(path))
    cached = cost_table_path(target)
    if not cached.exists():
        raise FileNotFoundError(f"no roofline table of {target.name} on this machine at {cached}: measure it "
                                "with specnb.eval.timing.cost_table(target), or pass one (-o roofline=table.csv)")
    return CostModel(pd.read_csv(cached))


GPU_CSV = Path(__file__).resolve().parents[2] / "data" / "roofline_gpu.csv"


def load_gpu_table(path: str | Path = GPU_CSV) -> pd.DataFrame | None:
    """A roofline table measured on a GPU (with its provenance columns), or None when none was saved."""
    path = Path(path)
    return pd.read_csv(path) if path.exists() else None
