"""FAISS IVF-PQ against exact search: recall that grows with the lists probed, a code of m bytes a key, shards
merged into the index one build gives, a saved index memory-mapped back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import clustered_unit_vectors

from specnb.datastores.ann import (
    AnnIndex,
    ExactIndex,
    IvfPqIndex,
    IvfPqParams,
    code_bits,
    code_error,
    exact_search,
    recall_at_k,
    unit_vectors,
)

PARAMS = IvfPqParams(nlist=32, m=8, nprobe=4, train_size=4000)


@pytest.fixture(scope="module")
def keys() -> np.ndarray:
    """8000 unit vectors in 16 dims around 64 centres (where an inverted file has lists to find)."""
    return clustered_unit_vectors(8000, 16, centres=64, spread=0.35)


@pytest.fixture(scope="module")
def index(keys) -> IvfPqIndex:
    return IvfPqIndex.build(keys, PARAMS, chunk=3000, progress=False)


def test_recall_grows_with_the_lists_probed_and_codes_are_m_bytes(keys, index):
    queries = unit_vectors(300, 16, seed=1)
    truth, _ = exact_search(queries, keys, 10)
    recalls = [recall_at_k(index.query(queries, 10, ef=nprobe)[0], truth) for nprobe in (1, 4, 32)]
    assert recalls[0] < recalls[1] < recalls[2]
    assert recalls[2] >= 0.6  # every list scanned: only the codes' rounding loses neighbours
    found, sims = index.query(queries, 10, ef=32)
    assert (np.diff(sims, axis=1) <= 1e-6).all() and (found >= 0).all()
    assert len(index) == 8000 and index.dim == 16 and index.describe()["nbits"] == 8
    assert 8000 * PARAMS.m < index.nbytes() < keys.nbytes / 2  # m-byte codes (+ ids, centroids), not the floats


def test_keys_find_themselves(keys, index):
    rows = np.arange(0, 8000, 97)
    found, _ = index.query(keys[rows], 10, ef=32)
    assert (found == rows[:, None]).any(1).mean() >= 0.9


def test_shards_merged_equal_one_build(keys, index):
    """Keys added to copies of one trained index, shard by shard, then merged: the index one build gives."""
    rng = np.random.default_rng(PARAMS.seed)
    sample = keys[np.sort(rng.choice(8000, size=4000, replace=False))]
    merged = IvfPqIndex.trained(sample, 8000, PARAMS)
    for first, last in ((0, 2500), (2500, 8000)):
        shard = IvfPqIndex.trained(sample, 8000, PARAMS)
        shard.add(keys[first:last], first)
        merged.merge(shard)
    queries = unit_vectors(100, 16, seed=2)
    for a, b in zip(merged.query(queries, 10), index.query(queries, 10), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_saved_index_is_read_back_alike(tmp_path, keys, index):
    index.save(tmp_path / "index.ivfpq")
    again = IvfPqIndex.load(tmp_path / "index.ivfpq", PARAMS)
    queries = unit_vectors(50, 16, seed=3)
    np.testing.assert_array_equal(again.query(queries, 5)[0], index.query(queries, 5)[0])
    assert len(again) == len(index)


def test_a_small_store_trains_a_codebook_it_can_fill(keys):
    small = IvfPqIndex.build(keys[:300], PARAMS, progress=False)
    assert small.describe()["nbits"] == 8 and small.index.nlist == 300 // 39  # 2^8 <= 300 points
    tiny = IvfPqIndex.build(keys[:100], PARAMS, progress=False)
    assert tiny.describe()["nbits"] == 6 and len(tiny) == 100  # 2^6 <= 100 < 2^7


def test_the_key_dimension_must_split_into_m_parts(keys):
    with pytest.raises(ValueError, match="divide"):
        IvfPqIndex.trained(keys[:500, :15], 500, PARAMS)


def test_a_stored_key_is_as_precise_as_its_code_bytes(keys, index):
    """What an IVF-PQ code decodes to lies off the key (the precision the index ranks a key's own entry with), the
    less the more bytes a key keeps; hnswlib and exact search keep the float32 keys themselves."""
    rows = keys[:500]
    finer = IvfPqIndex.build(keys, dataclasses.replace(PARAMS, m=16), progress=False)
    coarse, fine = code_error(index, rows), code_error(finer, rows)
    assert 0 < fine.mean() < coarse.mean() < 1 and (coarse < 1).all()
    assert (code_bits(index), code_bits(finer)) == (4.0, 8.0)  # 8 and 16 bytes over 16 dimensions
    hnsw = AnnIndex.build(keys, threads=1)
    for exact in (hnsw, ExactIndex(keys)):
        assert code_bits(exact) == 32.0 and not code_error(exact, rows).any()
