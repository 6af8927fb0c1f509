"""hnswlib index vs exact search, recall and MRR (DReSD Eq. 4 on stored keys; held-out queries)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import clustered_unit_vectors

from specnb.datastores.ann import (
    AnnIndex,
    ExactIndex,
    IndexParams,
    IvfPqIndex,
    IvfPqParams,
    exact_search,
    held_out_ranks,
    query_latency,
    recall_at_k,
    reciprocal_ranks,
    self_ranks,
    unit_vectors,
)


@pytest.fixture(scope="module")
def clustered() -> np.ndarray:
    """Easy data: 2000 unit vectors in 16 dims around 40 well-separated centres."""
    return clustered_unit_vectors(2000, 16, centres=40, spread=0.3)


def test_exact_search_is_a_sorted_inner_product_top_k(clustered):
    queries = clustered[:37]
    ids, sims = exact_search(queries, clustered, k=5, chunk=8)
    ref = np.argsort(-(queries @ clustered.T), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(ids, ref)
    np.testing.assert_allclose(sims, np.take_along_axis(queries @ clustered.T, ref, 1), rtol=1e-5)


def test_hnswlib_agrees_with_exact_search_on_easy_data(clustered):
    # one thread: the same graph every run (built on two, its recall moved between 0.9795 and 0.9815)
    index = AnnIndex.build(clustered, IndexParams(M=16, ef_construction=100, ef_search=50), threads=1,
                           progress=False)
    assert len(index) == 2000 and index.dim == 16 and index.build_seconds > 0 and index.nbytes() > 2000 * 16 * 4
    queries = unit_vectors(200, 16, seed=1)
    truth, _ = exact_search(queries, clustered, 10)
    found, sims = index.query(queries, 10, threads=2)
    assert recall_at_k(found, truth) >= 0.97  # a broken graph or distance falls far below
    assert (np.diff(sims, axis=1) <= 1e-6).all()  # best first
    assert self_ranks(index, clustered, np.arange(0, 2000, 7)).mean() >= 0.98
    assert self_ranks(None, clustered, np.arange(0, 2000, 7)).tolist() == [1.0] * 286  # distinct keys: first
    assert index.query(queries[:1], 5000)[0].shape == (1, 2000)  # k capped at the index size
    latency = query_latency(index, queries[:50], 10)
    assert 0 < latency["median_ms"] <= latency["p90_ms"] < float("inf")


def test_query_latency_is_the_time_of_each_timed_query(monkeypatch, clustered):
    """On a clock where the i-th timed query (of 50, after the untimed warm-up ones) takes i ms: median 25.5 ms,
    mean 25.5 ms, 90th percentile 45.1 ms (linear interpolation between the 45th and 46th)."""
    import types

    import specnb.datastores.ann as ann

    index = AnnIndex.build(clustered[:300], IndexParams(M=8, ef_construction=40, ef_search=20), progress=False)
    queried = []
    real_query = index.query
    monkeypatch.setattr(index, "query", lambda *args, **kwargs: queried.append(1) or real_query(*args, **kwargs))
    # the clock readings around timed query i (0-based): 10 i s and 10 i s + (i + 1) ms
    times = iter(np.concatenate([[10.0 * i, 10.0 * i + (i + 1) * 1e-3] for i in range(50)]))
    monkeypatch.setattr(ann, "time", types.SimpleNamespace(perf_counter=lambda: next(times)))
    latency = query_latency(index, unit_vectors(50, 16, seed=3), 5, warmup=20)
    assert len(queried) == 20 + 50
    assert latency == pytest.approx({"median_ms": 25.5, "p90_ms": 45.1, "mean_ms": 25.5})


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
    assert recall_at_k(found[:, :2], np.array([[1, 3], [4, 6], [1, 2]])) == pytest.approx(0.5)


def test_recall_comes_with_its_interval_over_the_queries():
    from specnb.experiments.ann_index import recall_columns

    truth = np.arange(40).reshape(4, 10)
    found = truth.copy()
    found[0, :5] = -1  # one query finds half of its ten
    columns = recall_columns(found, truth)
    assert columns["recall@10"] == pytest.approx(0.875)
    assert 0.75 <= columns["recall@10_low"] < 0.875 < columns["recall@10_high"] <= 1.0
    assert recall_columns(truth, truth) == {"recall@10": 1.0, "recall@10_low": 1.0, "recall@10_high": 1.0}


def test_unit_vectors():
    """Unit length; with a spectrum, each axis spreads in the spectrum's order (a normalised Gaussian cloud: the
    spread of an axis grows with its standard deviation), without one every axis alike."""
    spectrum = np.linspace(3, 0.1, 8)
    x = unit_vectors(4000, 8, seed=2, spectrum=spectrum)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, rtol=1e-5)
    spread = x.std(0)
    assert (np.diff(spread) < 0).all() and spread[0] > 10 * spread[-1]
    iso = unit_vectors(4000, 8, seed=2).std(0)
    assert iso.max() < 1.15 * iso.min()
    assert unit_vectors(5, 8, seed=4).tolist() == unit_vectors(5, 8, seed=4).tolist()  # seeded


def test_exact_search_splits_a_large_store_into_blocks_that_fit(monkeypatch, clustered):
    """A store too large for one [chunk, n] score block is searched a few queries at a time, with the results a
    single block gives."""
    import specnb.datastores.ann as ann

    whole = exact_search(clustered[:50], clustered, 5)
    monkeypatch.setattr(ann, "EXACT_BLOCK", 3 * 2000)  # three queries' scores at a time
    blocks = []
    real_topk = torch.Tensor.topk
    monkeypatch.setattr(torch.Tensor, "topk", lambda self, *a, **kw: blocks.append(self.shape) or
                        real_topk(self, *a, **kw))
    split = exact_search(clustered[:50], clustered, 5)
    assert max(shape[0] for shape in blocks) == 3 and len(blocks) == 17
    np.testing.assert_array_equal(split[0], whole[0])


@pytest.fixture(scope="module")
def doubled(clustered) -> np.ndarray:
    """The clustered keys stored twice: row i and row 2000 + i are the same key."""
    return np.concatenate([clustered, clustered])


@pytest.mark.parametrize("kind", ["exact", "hnswlib", "IVF-PQ"])
def test_duplicate_keys_lower_mrr_by_the_papers_definition(doubled, kind):
    """DReSD Eq. 4 ranks each key's own row among the results of the index over the whole store: two identical
    keys get one result list, so one of them ranks itself second (1 + 1/2 per pair) and MRR is 0.75, below 1 for
    a perfect search. Ranking any equal key as correct would give 1; so would an index over the queried rows
    alone, which the two halves queried apart would each find first. IVF-PQ's codes may also tie other keys with
    a pair, below 0.75."""
    index = {"exact": None,
             "hnswlib": AnnIndex.build(doubled, IndexParams(M=16, ef_construction=100, ef_search=64), progress=False),
             "IVF-PQ": IvfPqIndex.build(doubled, IvfPqParams(nlist=16, m=16, nprobe=16, train_size=4000),
                                        progress=False)}[kind]
    rows = np.arange(0, 2000, 7)
    first, second = self_ranks(index, doubled, rows), self_ranks(index, doubled, rows + 2000)
    pair = first + second
    assert (pair <= 1.5 + 1e-9).all() and (pair == 1.5).mean() >= (1.0 if kind != "IVF-PQ" else 0.95)
    assert 0.7 < np.concatenate([first, second]).mean() <= 0.75  # IVF-PQ: equal codes may rank other keys first


def test_held_out_queries_rank_the_first_exact_neighbour(doubled):
    """Held-out queries count any exact nearest neighbour, so duplicates cost nothing (1 under exact search); an
    index that returns the true top 10 worst first ranks the nearest pair 9th and 10th (1/9); IVF-PQ probing one
    list of many misses some."""
    queries = unit_vectors(200, 16, seed=5)
    assert held_out_ranks(ExactIndex(doubled), doubled, queries).tolist() == [1.0] * 200

    class WorstFirst(ExactIndex):
        def query(self, queries, k, threads=1, ef=None):
            ids, sims = super().query(queries, k)
            return ids[:, ::-1], sims[:, ::-1]

    np.testing.assert_allclose(held_out_ranks(WorstFirst(doubled), doubled, queries, k=10), 1 / 9)
    coarse = IvfPqIndex.build(doubled, IvfPqParams(nlist=64, m=8, nprobe=1, train_size=4000), progress=False)
    assert 0.2 < held_out_ranks(coarse, doubled, queries).mean() < 0.95
