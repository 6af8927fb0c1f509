"""Dense stores built shard by shard on Ray (a two-node cluster simulated on this machine): two workers give the
single-process store's files, a killed worker costs only its shard, a stopped build resumes from its finished
shards, a folder planned with other parameters is refused; IVF-PQ stores draft losslessly."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import ray
from conftest import tiny
from ray.cluster_utils import Cluster as RayCluster

from specnb.core.generate import generate
from specnb.datastores import shards
from specnb.datastores.ann import IndexParams, IvfPqIndex, IvfPqParams, exact_search
from specnb.datastores.corpus import TokenCorpus, TokenizerInfo
from specnb.datastores.dense import BuildConfig, build_datastore, load_datastore
from specnb.datastores.shards import Cluster, PlanMismatch, check_plan
from specnb.drafters.dense import DenseDrafter

CONFIG = BuildConfig(n_next=8, dims=16, seq_len=24, overlap=4, batch_tokens=64, sample_size=5000,
                     index=IndexParams(M=8, ef_construction=60, ef_search=32), index_kind="hnsw")
# Every data file of a store; the hnswlib graph is built by several threads, in an order that varies from build
# to build, so the index is compared by what it retrieves instead.
DATA_FILES = ("hidden.f16.npy", "values.i32.npy", "positions.i64.npy", "corpus_tokens.i32.npy",
              "doc_starts.i64.npy", "keys.f32.npy", "projection.npz")


PROMPTS = ("def add(a, b):", "hello world, hello", "the cat sat on", "zq")


@functools.cache
def corpus(arch: str = "llama") -> TokenCorpus:
    """The target's own greedy continuations of four prompts (drafted from, as ID data is) and 30 random
    documents of 10..60 tokens: a few hundred rows, a dozen batches."""
    target = tiny(arch)
    rng = np.random.default_rng(0)
    docs = [np.asarray(g.prompt_ids + g.tokens, dtype=np.int32)
            for g in (generate(target, p, max_new_tokens=40) for p in PROMPTS)]
    docs += [rng.integers(3, 200, rng.integers(10, 60)).astype(np.int32) for _ in range(30)]
    info, _ = TokenizerInfo.of(target)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenCorpus(np.concatenate(docs), starts, {"name": "random", "tokenizer": info.__dict__})


@pytest.fixture(scope="module")
def cluster():
    nodes = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    yield Cluster(address=nodes.address, workers=2, threads=1, shards=4)
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    target = tiny("llama")
    return build_datastore(target, corpus(), tmp_path_factory.mktemp("one") / "store", CONFIG, progress=False)


def same_store(store, reference) -> None:
    for name in DATA_FILES:
        assert store.meta["files"][name]["sha256"] == reference.meta["files"][name]["sha256"], name
    rows = np.arange(0, reference.rows, 3)
    truth = exact_search(np.asarray(reference.keys)[rows], np.asarray(reference.keys), 1)[0][:, 0]
    assert (store.index.query(np.asarray(store.keys)[rows], 1)[0][:, 0] == truth).mean() >= 0.95


def test_two_workers_on_two_nodes_build_the_single_process_store(cluster, single, tmp_path):
    target = tiny("llama")
    store = build_datastore(target, corpus(), tmp_path / "store", CONFIG, progress=False, cluster=cluster)
    same_store(store, single)
    assert not (tmp_path / "store" / "shards").exists() and not (tmp_path / "store" / "plan.json").exists()


def test_a_killed_worker_costs_only_its_shard(cluster, single, tmp_path):
    target = tiny("llama")
    work = tmp_path / "store.partial"
    work.mkdir()
    (work / "kill-worker-at-2").touch()  # the first actor to reach shard 2 dies; Ray runs it again elsewhere
    store = build_datastore(target, corpus(), tmp_path / "store", CONFIG, progress=False, cluster=cluster)
    assert not (tmp_path / "store" / "kill-worker-at-2").exists()  # it was reached, and the actor died
    same_store(store, single)


def test_a_stopped_build_resumes_from_its_finished_shards(cluster, single, tmp_path, monkeypatch, capsys):
    target = tiny("llama")
    calls = []

    def stop_after_two(self, n=1):  # the driver stops (Ctrl-C) once two shards are reported done
        calls.append(n)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(shards.tqdm, "update", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        build_datastore(target, corpus(), tmp_path / "store", CONFIG, progress=True, cluster=cluster)
    monkeypatch.undo()
    done = shards.finished(tmp_path / "store.partial", 4)
    assert 2 <= len(done) <= 4
    store = build_datastore(target, corpus(), tmp_path / "store", CONFIG, progress=True, cluster=cluster)
    assert f"{len(done)} of 4 shards done, {4 - len(done)} to run on Ray" in capsys.readouterr().out
    same_store(store, single)


def test_a_partial_made_with_other_parameters_is_refused(tmp_path):
    record = {"format": 1, "params": {"seq_len": 24, "rows": 100}, "corpus_sha256": "abc", "shards": 4}
    check_plan(tmp_path, record)
    check_plan(tmp_path, record)  # the same plan: resumed
    with pytest.raises(PlanMismatch, match="seq_len"):
        check_plan(tmp_path, {**record, "params": {"seq_len": 32, "rows": 100}})
    with pytest.raises(PlanMismatch, match="the corpus"):
        check_plan(tmp_path, {**record, "corpus_sha256": "def"})


def test_an_ivfpq_store_drafts_losslessly(single, tmp_path):
    target = tiny("llama")
    config = BuildConfig(**{**CONFIG.__dict__, "index_kind": "ivfpq", "ivfpq": IvfPqParams(m=8, nprobe=8)})
    store = build_datastore(target, corpus(), tmp_path / "store", config, progress=False)
    assert isinstance(load_datastore(tmp_path / "store").index, IvfPqIndex) and store.meta["index"]["kind"] == "ivfpq"
    assert store.storage_bytes() < single.storage_bytes()
    prompt = PROMPTS[0]
    ar = generate(target, prompt, max_new_tokens=24)
    out = generate(target, prompt, DenseDrafter(store, 4, 8), max_new_tokens=24)
    assert out.tokens == ar.tokens
    assert sum(c.accepted for c in out.stats.calls) > 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--ray", "--workers", "0"], "--workers must be >= 1, got 0"),
    (["--index", "ivfpq", "--dims", "8", "--pq-m", "32"], "--pq-m (32) must divide --dims (8)"),
])
def test_bad_cluster_or_index_flags_are_one_line_errors(tmp_path, capsys, flags, message):
    from specnb.cli import main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    argv = ["datastore", "build", "dense", str(tmp_path / "src"), "--model", "tiny-llama", "--out"]
    assert main([*argv, str(tmp_path / "ds"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "ds").exists()
