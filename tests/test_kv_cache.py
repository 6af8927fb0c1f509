"""GrowingCache: in-place appends give the same tensors as torch.cat, across crops, gathers and expands."""

from __future__ import annotations

import torch

from specnb.kv_cache import GrowingCache


def test_appends_crops_and_reassignments_match_concatenation():
    torch.manual_seed(0)
    cache, reference = GrowingCache(), torch.empty(1, 2, 0, 4)
    layer_of = lambda: cache.layers[0]  # noqa: E731
    for step in range(40):
        new = torch.randn(1, 2, 1 + step % 5, 4)
        keys, _ = cache.update(new, new.clone(), 0)
        reference = torch.cat([reference, new], dim=2)
        assert torch.equal(keys, reference) and torch.equal(layer_of().values, reference)
        if step % 3 == 0:  # crop (a view: the next append writes in place)
            layer_of().keys, layer_of().values = keys[:, :, :-1], layer_of().values[:, :, :-1]
            reference = reference[:, :, :-1]
        if step % 7 == 0:  # gather (a new tensor: the next append copies it into a new buffer)
            keep = torch.arange(0, reference.shape[2], 2)
            layer_of().keys = layer_of().keys.index_select(2, keep)
            layer_of().values = layer_of().values.index_select(2, keep)
            reference = reference.index_select(2, keep)
    assert cache.get_seq_length() == reference.shape[2]
    before = layer_of().key_buffer
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)
    assert layer_of().key_buffer is before  # room left: no new buffer


def test_expanded_rows_for_batch_verification():
    cache = GrowingCache()
    base = torch.randn(1, 1, 6, 3)
    cache.update(base, base, 0)
    layer = cache.layers[0]
    layer.keys, layer.values = layer.keys.expand(3, -1, -1, -1), layer.values.expand(3, -1, -1, -1)
    new = torch.randn(3, 1, 2, 3)
    keys, _ = cache.update(new, new, 0)
    assert torch.equal(keys, torch.cat([base.expand(3, -1, -1, -1), new], dim=2))
