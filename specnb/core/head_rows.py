"""A verification call's logits, computed by the output head only as far as acceptance reads them.

On a CPU the output head is a large share of a verification call (Gemma-3's 262k x 640 head is two thirds of its
weights): streamed once, it costs about as much for a few rows as for one, but the multiply-adds of sixteen rows
take several one-row passes. Acceptance reads the root's row first and then only the rows of nodes that passed,
and most calls stop within a few tokens. So :class:`HeadRows` computes, at the first read, the rows asked for
and the following ones up to :func:`rows_at_one_price` (measured once per head), and at any later read every row
still missing. A drafter that cuts its drafts to what it expects accepted (the priced ones) marks them
``all_rows``: those calls compute every row at once, which costs less when most are read. The head gives each row
the bits it gets alone (:meth:`specnb.model.decoder.OutputHead.rows_exact`), so how the rows were split never
changes a logit. Where it does not (another device, PyTorch's GEMM) every row is computed at the first read.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from ..model.decoder import OutputHead
from ..model.device import synchronize

PROBE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)  # call sizes timed by rows_at_one_price
PROBE_REPEATS = 3
ONE_PRICE = 1.15  # a call costs "about one row's price" up to this multiple of one row's

_measured: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head -> rows_at_one_price


def cheapest_rows(seconds: dict[int, float]) -> int:
    """The most rows whose call costs at most :data:`ONE_PRICE` times a one-row call's (``seconds``: rows ->
    seconds of one call, row 1 included)."""
    limit = ONE_PRICE * seconds[1]
    return max(rows for rows, s in seconds.items() if s <= limit)


def rows_at_one_price(head: OutputHead, like: Tensor) -> int:
    """How many rows ``head`` computes for about one row's price on this machine: each of :data:`PROBE_ROWS` timed
    :data:`PROBE_REPEATS` times (interleaved, after one warm-up pass) on rows shaped like ``like`` [m, d], then
    :func:`cheapest_rows` of the medians. Measured once per head object (about 0.4 s for Gemma-3-270M)."""
    if head in _measured:
        return _measured[head]
    rows = torch.randn(max(PROBE_ROWS), like.shape[-1], generator=torch.Generator().manual_seed(0)).to(like)
    times: dict[int, list[float]] = {r: [] for r in PROBE_ROWS}
    for repeat in range(PROBE_REPEATS + 1):
        for r in PROBE_ROWS:
            start = time.perf_counter()
            head(rows[:r])
            if repeat:
                times[r].append(time.perf_counter() - start)
    _measured[head] = cheapest_rows({r: statistics.median(s) for r, s in times.items()})
    return _measured[head]


def splits(head: OutputHead, hidden: Tensor) -> bool:
    """Whether a call's head rows (``hidden`` [n+1, d], the head's input) may be computed in two calls: on the CPU,
    where the head gives every row the bits it gets alone."""
    return hidden.device.type == "cpu" and head.rows_exact(hidden)


def first_rows(head: OutputHead, hidden: Tensor, all_rows: bool) -> int:
    """How many of a call's rows (``hidden`` [n+1, d], the head's input) :class:`HeadRows` computes at its first
    read: :func:`rows_at_one_price` on the CPU where the head's rows are exact, else (or ``all_rows``) all of them."""
    if all_rows or len(hidden) == 1 or not splits(head, hidden):
        return len(hidden)
    return rows_at_one_price(head, hidden)


class HeadRows:
    """Logits [n+1, V] of ``hidden`` [n+1, d] (the head's input), computed on first read in at most two head calls:
    rows ``0 .. max(first, the highest row read) - 1``, then the rest. Index it as a tensor's rows (an int, a slice
    of step 1, or an int64 tensor of row indices); the result is on ``hidden``'s device, a view where the rows were
    computed together."""

    def __init__(self, hidden: Tensor, head: Callable[[Tensor], Tensor], first: int):
        self.hidden, self.head, self.first = hidden, head, first
        self._parts: list[Tensor] = []  # [rows 0..p), then [rows p..n+1)
        self.seconds = 0.0  # spent in the head so far, its device's work included
        self.read = 0  # the highest row read so far, plus one (what a replay prices: CallStats.rows_read)

    @property
    def device(self) -> torch.device:
        return self.hidden.device

    def __len__(self) -> int:
        return self.hidden.shape[0]

    @property
    def computed(self) -> int:
        """How many rows (a prefix) the head has computed so far."""
        return sum(part.shape[0] for part in self._parts)

    def _cover(self, end: int) -> None:
        """Compute rows up to ``end`` (exclusive), by the rule in the class docstring."""
        self.read = max(self.read, end)
        done = self.computed
        if end <= done:
            return
        stop = min(max(end, self.first), len(self)) if done == 0 else len(self)
        start = time.perf_counter()
        self._parts.append(self.head(self.hidden[done:stop]))
        synchronize(self.device)  # free: whoever reads the rows waits for them anyway
        self.seconds += time.perf_counter() - start

    def __getitem__(self, index: int | slice | Tensor) -> Tensor:
        n = len(self)
        if isinstance(index, int):
            if not -n <= index < n:
                raise IndexError(f"row {index} of {n}")
            return self[index % n:index % n + 1][0]
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                raise IndexError("HeadRows takes slices of step 1")
            self._cover(max(stop, 1))
            first = self._parts[0]
            split = first.shape[0]
            if stop <= split:
                return first[start:stop]
            if start >= split:  # rows of the second call only: a view, no copy of the others
                return self._parts[1][start - split:stop - split]
            return torch.cat([first[start:], self._parts[1][:stop - split]])
        index = index.to(self.device)
        self._cover(int(index.max()) + 1 if index.numel() else 1)
        first = self._parts[0]
        if len(self._parts) == 1:
            return first[index]
        low = index < first.shape[0]  # rows of the first call; the others come from the second
        out = first.new_empty(index.shape[0], first.shape[1])
        out[low] = first[index[low]]
        out[~low] = self._parts[1][index[~low] - first.shape[0]]
        return out
