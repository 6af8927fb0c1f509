"""GrowingCache: in-place appends, crops and compactions give the same tensors as torch.cat / index_select."""

from __future__ import annotations

import torch

from specnb.model.kv_cache import GrowingCache, broadcast_rows


def test_appends_crops_and_compactions_match_concatenation():
    torch.manual_seed(0)
    cache, reference = GrowingCache(), torch.empty(1, 2, 0, 4)
    layer_of = lambda: cache.layers[0]  # noqa: E731
    for step in range(150):  # enough to outgrow the first buffer
        new = torch.randn(1, 2, 1 + step % 5, 4)
        past = reference.shape[2]
        keys, _ = cache.update(new, new.clone(), 0)
        reference = torch.cat([reference, new], dim=2)
        assert torch.equal(keys, reference) and torch.equal(layer_of().values, reference)
        if step % 4 == 1:  # everything accepted
            continue
        # root + the first accepted nodes (a crop), or every other node (out of order: a compaction)
        kept = torch.arange(past + 1, max(past + 1, reference.shape[2] - 1)) if step % 2 else \
            torch.arange(past + 1, reference.shape[2], 2)
        buffer = layer_of().key_buffer
        cache.keep(past + 1, kept)
        reference = torch.cat([reference[:, :, :past + 1], reference[:, :, kept]], dim=2)
        assert layer_of().key_buffer is buffer  # crops and compactions never allocate a new buffer
        assert torch.equal(layer_of().keys, reference) and torch.equal(layer_of().values, reference)
    assert cache.get_seq_length() == reference.shape[2]
    cache.crop(-2)  # Hugging Face's crop assigns the layers' views itself
    new = torch.randn(1, 2, 3, 4)
    keys, _ = cache.update(new, new.clone(), 0)
    reference = torch.cat([reference[:, :, :-2], new], dim=2)
    assert torch.equal(keys, reference) and cache.get_seq_length() == reference.shape[2]
    before = layer_of().key_buffer
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)
    assert layer_of().key_buffer is before  # room left: no new buffer


def test_broadcast_rows_for_batch_verification():
    cache = GrowingCache()
    base = torch.randn(1, 1, 6, 3)
    cache.update(base, base, 0)
    buffer = cache.layers[0].key_buffer
    new = torch.randn(3, 1, 2, 3)
    keys, _ = cache.update(new, new, 0)
    assert torch.equal(keys, torch.cat([base.expand(3, -1, -1, -1), new], dim=2))
    assert torch.equal(broadcast_rows(base, new, copies=True), keys)  # the two copies a GPU takes: the same tensor
    assert cache.get_seq_length() == 6  # the call's entries are held aside
    cache.keep_row(1, 2)
    layer = cache.layers[0]
    assert layer.key_buffer is buffer and layer.keys.shape == (1, 1, 8, 3)
    assert torch.equal(layer.keys, torch.cat([base, new[1:2]], dim=2))
