"""A KV cache that appends in place and compacts the accepted entries in place.

Hugging Face's ``DynamicCache`` appends a call's keys and values with ``torch.cat``, which copies the whole
cache at every layer of every call: O(context) bytes per generated token. :class:`GrowingCache` keeps each
layer in a buffer with spare room (doubled when full) and writes new entries into it; ``layer.keys`` and
``layer.values`` are always views of the buffer's filled prefix. After acceptance :meth:`GrowingCache.keep`
moves the kept entries of the last call down to close the gaps (a gather of only those entries, written
back into the same buffer) and shortens the views: the next call writes right after them, nothing else
is copied.

A call with more rows than the cache (batch verification: one row per draft path on a one-row cache)
attends to the cache broadcast to its rows plus its own entries; those are held aside, not written, until
:meth:`GrowingCache.keep_row` writes the accepted row's entries into the buffer. The buffer itself is never
expanded, so a batch call costs one transient ``[P, H, past + s, D]`` concatenation per layer (what a plain
attention kernel needs), not a persistent P-row cache.

Like a config-less ``DynamicCache`` every layer keeps all positions; sliding windows are the masks' job.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .kernels import memory

MIN_CAPACITY = 256  # positions allocated at least, so short generations never regrow


class _View:
    """A :class:`GrowingLayer`'s ``keys`` or ``values``: read, sliced from its buffer to the layer's recorded length
    first; assigned (as Hugging Face's layer methods do), stored as given."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, layer: GrowingLayer | None, owner: type | None = None) -> Any:
        if layer is None:
            return self
        layer._sliced()
        return layer._views.get(self.name)

    def __set__(self, layer: GrowingLayer, value: Tensor | None) -> None:
        layer._sliced()
        layer._views[self.name] = value


def broadcast_rows(past: Tensor, own: Tensor, copies: bool | None = None) -> Tensor:
    """``past`` [1, H, L, D] read by each of ``own``'s rows, then that row's own entries: [P, H, L + s, D] for own
    [P, H, s, D]. ``copies`` (default: off a CPU) writes it with two copies into one new tensor, else ``torch.cat`` of
    the expanded past; the same bits. On CUDA the concatenation is a slow copy (12 of a 20 ms batch call on an H200,
    docs/gpu.md); on a CPU it is the faster (40 against 48 us for ten rows of Gemma-3-270M's layer at 256 positions)."""
    if copies is None:
        copies = own.device.type != "cpu"
    if not copies:
        return torch.cat([past.expand(own.shape[0], -1, -1, -1), own], dim=2)
    out = own.new_empty(own.shape[0], own.shape[1], past.shape[2] + own.shape[2], own.shape[3])
    out[:, :, :past.shape[2]] = past
    out[:, :, past.shape[2]:] = own
    return out


class GrowingLayer(DynamicLayer):
    """One layer's keys / values [B, H, S, D] as views of buffers [B, H, capacity, D].

    key_buffer / value_buffer: None until the first write. pending: (keys, values) [P, H, s, D] of the last
    broadcast call (P rows on a B = 1 cache), or None. :meth:`truncate` records the length only; ``keys`` and
    ``values`` are sliced from the buffers when next read (most calls never read them: specnb's decoder writes the
    buffers directly), which spares two slicing ops per layer per call.
    """

    keys = _View()
    values = _View()

    def __init__(self, **kwargs) -> None:
        self._views: dict[str, Tensor | None] = {}  # "keys" / "values" as last sliced or assigned
        self._end: int | None = None  # the filled length where they are not yet sliced to it
        super().__init__(**kwargs)
        self.key_buffer: Tensor | None = None
        self.value_buffer: Tensor | None = None
        self.pending: tuple[Tensor, Tensor] | None = None

    def _sliced(self) -> None:
        """Make ``keys`` / ``values`` the buffers' first ``_end`` positions, where a write or crop recorded one."""
        if self._end is not None:
            end, self._end = self._end, None
            self._views = {"keys": self.key_buffer[:, :, :end], "values": self.value_buffer[:, :, :end]}

    def get_seq_length(self) -> int:
        return self._end if self._end is not None else super().get_seq_length()

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.key_buffer is not None and key_states.shape[0] != self.key_buffer.shape[0]:
            # broadcast call: the cache read as rows, the new entries held aside
            self.pending = (key_states, value_states)
            return broadcast_rows(self.keys, key_states), broadcast_rows(self.values, value_states)
        self._write(self.get_seq_length(), key_states, value_states)
        return self.keys, self.values

    def _write(self, start: int, key_states: Tensor, value_states: Tensor) -> None:
        """Write entries [B, H, s, D] at positions start..start+s-1 and end the layer there."""
        end = start + key_states.shape[2]
        if self.key_buffer is None:
            self.key_buffer, self.value_buffer = _grow(None, 0, end, key_states), _grow(None, 0, end, value_states)
        self.reserve(end, keep=start)
        self.key_buffer[:, :, start:end] = key_states
        self.value_buffer[:, :, start:end] = value_states
        self.truncate(end)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (a view: no copy)."""
        self._end, self.pending = length, None

    def reserve(self, end: int, keep: int | None = None) -> tuple[Tensor, Tensor]:
        """The key / value buffers with room for positions up to ``end``: when they are too short, new ones
        holding the first ``keep`` positions (default: every filled one)."""
        if end > self.key_buffer.shape[2]:
            keep = self.get_seq_length() if keep is None else keep
            self.key_buffer = _grow(self.key_buffer, keep, end, self.key_buffer)
            self.value_buffer = _grow(self.value_buffer, keep, end, self.value_buffer)
        return self.key_buffer, self.value_buffer

    def compact(self, start: int, sources: Tensor) -> None:
        """Move the entries at positions ``sources`` (int64 [m] on the cache's device, increasing, all
        >= start) to start..start+m-1 inside the buffer and end the layer there."""
        self._write(start, self.key_buffer.index_select(2, sources), self.value_buffer.index_select(2, sources))

    def keep_row(self, row: int, count: int) -> None:
        """Append the first ``count`` entries of row ``row`` of the last broadcast call."""
        keys, values = self.pending
        self._write(self.get_seq_length(), keys[row:row + 1, :, :count], values[row:row + 1, :, :count])


def _grow(buffer: Tensor | None, length: int, total: int, new: Tensor) -> Tensor:
    """A buffer [B, H, capacity, D] shaped and placed like ``new`` with room for ``total`` positions (twice
    that, at least MIN_CAPACITY), holding the first ``length`` positions of ``buffer``; in 2 MB pages where it
    spans several (:func:`specnb.model.kernels.memory.empty_buffer`: a long context's attention streams it)."""
    batch, heads, _, dim = new.shape
    shape = (batch, heads, max(2 * total, MIN_CAPACITY), dim)
    grown = memory.empty_buffer(shape, new.dtype) if new.device.type == "cpu" else None
    if grown is None:
        grown = torch.empty(shape, dtype=new.dtype, device=new.device)
    if length:
        grown[:, :, :length] = buffer[:, :, :length]
    return grown


class GrowingCache(DynamicCache):
    """A config-less ``DynamicCache`` whose layers are :class:`GrowingLayer`: the cache every model call in specnb
    takes (Hugging Face's decoder reads it as a ``DynamicCache``; specnb's decoder also writes its buffers directly,
    :meth:`reserve` / :meth:`extend`)."""

    layers: list[GrowingLayer]

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer

    def _initialized(self) -> list[GrowingLayer]:
        return [layer for layer in self.layers if layer.is_initialized]

    def reserve(self, layers: int, end: int, rows: int = 1) -> tuple[list[Tensor], list[Tensor]] | None:
        """For code that writes a call's entries into the buffers itself (:mod:`specnb.model.decoder`'s one-call
        layer stack): the key and value buffers of all ``layers`` layers for a call of ``rows`` rows, or None
        unless every layer holds a buffer of that many rows or of one. Buffers of ``rows`` rows are made to hold
        positions up to ``end``: follow the writes with :meth:`extend`. One-row buffers for more rows are read as
        the rows' shared past (a broadcast call, see the module docstring): follow the call with :meth:`hold`."""
        held = {layer.key_buffer.shape[0] if layer.key_buffer is not None else 0 for layer in self.layers}
        if len(self.layers) != layers or len(held) != 1 or held.pop() not in (rows, 1):
            return None
        if self.layers[0].key_buffer.shape[0] != rows:  # broadcast: nothing written, no room needed
            return [layer.key_buffer for layer in self.layers], [layer.value_buffer for layer in self.layers]
        buffers = [layer.reserve(end) for layer in self.layers]
        return [k for k, _ in buffers], [v for _, v in buffers]

    def hold(self, keys: list[Tensor], values: list[Tensor]) -> None:
        """After a broadcast call written by other code: each layer's new entries [P, H, s, D], held aside for
        :meth:`keep_row` as :meth:`GrowingLayer.update` holds them."""
        for layer, key, value in zip(self.layers, keys, values, strict=True):
            layer.pending = (key, value)

    def extend(self, end: int) -> None:
        """Every layer now ends at ``end`` (its entries up to there written into its buffer)."""
        for layer in self.layers:
            layer.truncate(end)

    def keep(self, start: int, sources: Tensor) -> None:
        """Keep positions 0..start-1 and then ``sources`` (int64 [m] on the host, increasing, >= start),
        dropping every other entry: a view when ``sources`` is start..start+m-1, else an in-place compaction
        (the index crosses to the device once for all layers)."""
        m = sources.shape[0]
        if m == 0 or bool((sources == torch.arange(start, start + m)).all()):
            if self.get_seq_length() != start + m:  # else the layers already end there (a one-token call)
                for layer in self._initialized():
                    layer.truncate(start + m)
            return
        layers = self._initialized()
        on_device = sources.to(layers[0].key_buffer.device) if layers else sources
        for layer in layers:
            layer.compact(start, on_device)

    def keep_row(self, row: int, count: int) -> None:
        """After a broadcast call (see the module docstring): keep row ``row``'s first ``count`` entries."""
        for layer in self._initialized():
            layer.keep_row(row, count)
