"""A KV cache that appends in place.

Hugging Face's ``DynamicCache`` appends a call's keys and values with ``torch.cat``, which copies the whole
cache at every layer of every call: O(context) bytes per generated token. :class:`GrowingCache` keeps each
layer in a buffer with spare room (doubled when full) and writes new entries into it; ``layer.keys`` and
``layer.values`` stay ordinary tensors — views of the buffer's filled prefix — so cropping them (what
:meth:`specnb.verify.Verifier.keep` does after acceptance) costs nothing and the next call writes right
after the kept entries. Anything else assigned to them (a gathered or expanded tensor) is simply copied
into a fresh buffer on the next append.

Like a config-less ``DynamicCache`` every layer keeps all positions; sliding windows are the masks' job.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # positions allocated at least, so short generations never regrow


class GrowingLayer(DynamicLayer):
    """One layer's keys / values [B, H, S, D] as views of buffers [B, H, capacity, D]."""

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.key_buffer = _append(self.keys, self.key_buffer, key_states)
        self.values, self.value_buffer = _append(self.values, self.value_buffer, value_states)
        return self.keys, self.values


def _append(current: Tensor, buffer: Tensor | None, new: Tensor) -> tuple[Tensor, Tensor]:
    """(current + new along dim 2 as a view of a buffer, that buffer); writes in place when ``current`` is
    still the buffer's prefix view and the buffer has room, else copies into a buffer twice the size."""
    length = current.shape[2] if current.numel() else 0
    total = length + new.shape[2]
    in_place = (buffer is not None and length and current.data_ptr() == buffer.data_ptr()
                and current.shape[:2] == buffer.shape[:2] and current.stride() == buffer.stride()
                and total <= buffer.shape[2])
    if not in_place:
        batch, heads, _, dim = new.shape
        grown = torch.empty(batch, heads, max(2 * total, MIN_CAPACITY), dim, dtype=new.dtype, device=new.device)
        if length:
            grown[:, :, :length] = current
        buffer = grown
    buffer[:, :, length:total] = new
    return buffer[:, :, :total], buffer


class GrowingCache(DynamicCache):
    """A config-less ``DynamicCache`` whose layers are :class:`GrowingLayer`."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer
