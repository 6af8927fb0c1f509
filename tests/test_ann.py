"""hnswlib index vs exact search, recall and MRR."""

from __future__ import annotations

import numpy as np
import pytest

from specnb.ann import (
    AnnIndex,
    IndexParams,
    exact_search,
    mrr,
    query_latency,
    recall_at_k,
    reciprocal_ranks,
    self_mrr,
    unit_vectors,
)


@pytest.fixture(scope="module")
def clustered() -> np.ndarray:
    """Easy data: 2000 unit vectors in 16 dims around 40 well-separated centres."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 16))
    x = centres[rng.integers(0, 40, 2000)] + 0.3 * rng.standard_normal((2000, 16))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_exact_search_is_a_sorted_inner_product_top_k(clustered):
    queries = clustered[:37]
    ids, sims = exact_search(queries, clustered, k=5, chunk=8)
    ref = np.argsort(-(queries @ clustered.T), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(ids, ref)
    np.testing.assert_allclose(sims, np.take_along_axis(queries @ clustered.T, ref, 1), rtol=1e-5)


def test_hnswlib_agrees_with_exact_search_on_easy_data(clustered):
    index = AnnIndex.build(clustered, IndexParams(M=16, ef_construction=100, ef_search=50), progress=False)
    assert len(index) == 2000 and index.dim == 16 and index.build_seconds > 0 and index.nbytes() > 2000 * 16 * 4
    queries = unit_vectors(200, 16, seed=1)
    truth, _ = exact_search(queries, clustered, 10)
    found, sims = index.query(queries, 10, threads=2)
    assert recall_at_k(found, truth) >= 0.98
    assert (np.diff(sims, axis=1) <= 1e-6).all()  # best first
    assert self_mrr(index, clustered, np.arange(0, 2000, 7)) >= 0.98
    assert self_mrr(None, clustered, np.arange(0, 2000, 7)) == 1.0  # distinct vectors find themselves first
    assert index.query(queries[:1], 5000)[0].shape == (1, 2000)  # k capped at the index size
    latency = query_latency(index, queries[:50], 10)
    assert 0 < latency["median_ms"] <= latency["p90_ms"]


def test_index_round_trip(tmp_path, clustered):
    params = IndexParams(M=8, ef_construction=40, ef_search=20)
    index = AnnIndex.build(clustered[:300], params, progress=False)
    index.save(tmp_path / "i.hnsw")
    again = AnnIndex.load(tmp_path / "i.hnsw", 16, params)
    np.testing.assert_array_equal(again.query(clustered[:20], 3)[0], index.query(clustered[:20], 3)[0])


def test_rank_measures():
    found = np.array([[3, 1, 2], [0, 4, 5], [7, 8, 9]])
    truth = np.array([1, 0, 6])
    np.testing.assert_allclose(reciprocal_ranks(found, truth), [0.5, 1.0, 0.0])
    assert mrr(found, truth) == pytest.approx(0.5)
    assert recall_at_k(found[:, :2], np.array([[1, 3], [4, 6], [1, 2]])) == pytest.approx(0.5)


def test_unit_vectors():
    x = unit_vectors(1000, 8, seed=2, spectrum=np.linspace(3, 0.1, 8))
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, rtol=1e-5)
    assert x[:, 0].std() > x[:, -1].std()
