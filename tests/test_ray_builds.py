"""Stores built shard by shard on Ray (a two-node cluster simulated on this machine). Dense: two workers give the
single-process store's files, a killed worker costs only its shard, a stopped build resumes from its finished
shards, a folder planned with other parameters is refused; IVF-PQ stores draft losslessly. REST and CREST: the
Ray build's files equal the in-process build's with the same shards, its drafts and CREST trees equal one suffix
array's, and a killed worker or a stopped driver costs only unfinished pieces."""

from __future__ import annotations

import contextlib
import functools
import os
import re

import numpy as np
import pytest
import ray
from conftest import WITHOUT_IRI_CHECKS, tiny
from ray.cluster_utils import Cluster as RayCluster

from specnb.atomic import ExistsError
from specnb.core.generate import generate
from specnb.datastores import cluster as cluster_module
from specnb.datastores import crest_build, shards
from specnb.datastores.ann import IndexParams, IvfPqIndex, IvfPqParams, exact_search
from specnb.datastores.cluster import Cluster, PlanMismatch, check_plan
from specnb.datastores.corpus import TokenCorpus, TokenizerInfo
from specnb.datastores.crest import build_crest
from specnb.datastores.crest_build import build_crest_on_ray
from specnb.datastores.dense import BuildConfig, build_datastore, load_datastore
from specnb.datastores.rest import RestIndex
from specnb.drafters.dense import DenseDrafter

pytestmark = pytest.mark.serial  # Ray starts its own worker processes: run alone (make test)

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


@contextlib.contextmanager
def stopped_after_two_pieces(monkeypatch, module):
    """The driver stops (Ctrl-C) once ``module``'s progress bar reports two pieces done."""
    calls = []

    def stop_after_two(self, n=1):
        calls.append(n)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(module.tqdm, "update", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        yield
    monkeypatch.undo()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Without Ray's usage statistics: Ray Data's poller of them queries a Prometheus server no test starts, from a
    # thread that outlives pytest's output and prints a "Logging error" traceback at the end of the run. Every Ray
    # process (a dozen, and each actor) imports jsonschema: without its iri checks, as the tests' (conftest.py).
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(WITHOUT_IRI_CHECKS + "\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
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


@pytest.mark.repeat  # make test-full: the killed-worker build below is this build with a death in it
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
    assert not (tmp_path / "store" / "shards").exists() and not (tmp_path / "store" / "plan.json").exists()


def test_a_stopped_build_resumes_from_its_finished_shards(cluster, single, tmp_path, monkeypatch, capsys):
    target = tiny("llama")
    with stopped_after_two_pieces(monkeypatch, shards):
        build_datastore(target, corpus(), tmp_path / "store", CONFIG, progress=True, cluster=cluster)
    done = shards.finished(tmp_path / "store.partial", 4)
    assert 2 <= len(done) <= 4
    store = build_datastore(target, corpus(), tmp_path / "store", CONFIG, progress=True, cluster=cluster)
    assert f"{len(done)} of 4 shards done, {4 - len(done)} to run on Ray" in capsys.readouterr().out
    same_store(store, single)
    assert store.meta["timings"]["extract_seconds"] is None  # no process saw the whole extraction


def test_a_partial_made_with_other_parameters_is_refused(tmp_path):
    record = {"format": 1, "params": {"seq_len": 24, "rows": 100}, "corpus_sha256": "abc", "shards": 4}
    check_plan(tmp_path, record)
    check_plan(tmp_path, record)  # the same plan: resumed
    with pytest.raises(PlanMismatch, match="seq_len"):
        check_plan(tmp_path, {**record, "params": {"seq_len": 32, "rows": 100}})
    with pytest.raises(PlanMismatch, match="the corpus"):
        check_plan(tmp_path, {**record, "corpus_sha256": "def"})


class RayStarted(Exception):
    """Where a build would start Ray."""


def start_ray(cluster) -> None:
    raise RayStarted


def test_a_rerun_sends_to_ray_only_the_shards_not_on_disk(single, tmp_path, monkeypatch, capsys):
    """The dense extraction's resume without a cluster: a build stopped where it starts Ray leaves its plan; with
    two of its four shards then on disk (each computed here as an actor computes it) a rerun finds those two and
    sends the other two to Ray; with all four on disk it starts no Ray at all and gathers them into the
    single-process store's hidden states, byte for byte; a complete extraction (a build stopped while fitting or
    indexing) is kept as it is."""
    from specnb.datastores import embed
    from specnb.datastores.manifest import full_hash

    target, data, out = tiny("llama"), corpus(), tmp_path / "work"
    cluster = Cluster(workers=2, threads=1, shards=4)
    sizes = {"n_next": CONFIG.n_next, "seq_len": CONFIG.seq_len, "overlap": CONFIG.overlap,
             "batch_tokens": CONFIG.batch_tokens}
    monkeypatch.setattr(shards, "connect", start_ray)
    with pytest.raises(RayStarted):
        shards.extract_on_ray(target, data, out, cluster, progress=False, **sizes)
    layout = embed.plan(target, data, **sizes)
    bounds, tokens = shards.batch_shard_bounds(len(layout.work), 4), np.asarray(data.tokens)
    for shard in (0, 1):
        shards.run_shard(target, layout, tokens, out, shard, bounds)
    assert shards.finished(out, 4) == [0, 1]
    capsys.readouterr()
    with pytest.raises(RayStarted):
        shards.extract_on_ray(target, data, out, cluster, **sizes)
    assert "2 of 4 shards done, 2 to run on Ray" in capsys.readouterr().out
    for shard in (2, 3):
        shards.run_shard(target, layout, tokens, out, shard, bounds)
    shards.extract_on_ray(target, data, out, cluster, progress=False, **sizes)  # would raise RayStarted
    assert full_hash(out / "hidden.f16.npy") == single.meta["files"]["hidden.f16.npy"]["sha256"]
    shards.extract_on_ray(target, data, out, cluster, progress=False, **sizes)  # complete: nothing runs again


def test_an_ivfpq_store_drafts_losslessly(single, tmp_path):
    target = tiny("llama")
    config = BuildConfig(**{**CONFIG.__dict__, "index_kind": "ivfpq", "ivfpq": IvfPqParams(m=8, nprobe=8)})
    store = build_datastore(target, corpus(), tmp_path / "store", config, progress=False)
    assert isinstance(load_datastore(tmp_path / "store").index, IvfPqIndex) and store.meta["index"]["kind"] == "ivfpq"
    assert 0 < store.meta["index"]["nlist"] == store.index.index.nlist  # the lists built, not the 0 asked for
    assert store.storage_bytes() < single.storage_bytes()
    prompt = PROMPTS[0]
    ar = generate(target, prompt, max_new_tokens=24)
    out = generate(target, prompt, DenseDrafter(store, 4, 8), max_new_tokens=24)
    assert out.tokens == ar.tokens
    assert sum(c.accepted for c in out.stats.calls) > 0


def test_an_ivfpq_index_filled_on_ray_is_the_in_process_one(cluster, tmp_path):
    """Trained on the driver, filled shard by shard by tasks (one killed), merged in order: the same file."""
    target = tiny("llama")
    config = BuildConfig(**{**CONFIG.__dict__, "index_kind": "ivfpq", "ivfpq": IvfPqParams(m=8, nprobe=8)})
    one = build_datastore(target, corpus(), tmp_path / "one", config, progress=False)
    (tmp_path / "ray.partial").mkdir()
    (tmp_path / "ray.partial" / "kill-worker-at-ivfpq-1").touch()
    store = build_datastore(target, corpus(), tmp_path / "ray", config, progress=False,
                            cluster=Cluster(cluster.address, workers=2, threads=1, shards=3))
    assert store.meta["files"]["index.ivfpq"]["sha256"] == one.meta["files"]["index.ivfpq"]["sha256"]
    assert not [p.name for p in (tmp_path / "ray").iterdir() if p.name.startswith(("ivfpq-", "kill-"))]


@pytest.mark.parametrize(("kind", "flags", "message"), [
    ("dense", ["--ray", "--workers", "0"], "--workers must be >= 1, got 0"),
    ("dense", ["--index", "ivfpq", "--dims", "8", "--pq-m", "32"], "--pq-m (32) must divide --dims (8)"),
    ("rest", ["--shards", "-1"], "--shards must be >= 0, got -1"),
    ("crest", ["--ray", "--threads", "0"], "--threads must be >= 1, got 0"),
])
def test_bad_cluster_or_index_flags_are_one_line_errors(tmp_path, capsys, kind, flags, message):
    from specnb.cli import main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    argv = ["datastore", "build", kind, str(tmp_path / "src"), "--model", "tiny-llama", "--out"]
    assert main([*argv, str(tmp_path / "ds"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "ds").exists()


# ------------------------------------------------------------------------------------------ REST and CREST

NS, T = (1, 2, 3), 40


@pytest.fixture(scope="module")
def rest_in_process(tmp_path_factory):
    """The same corpus in one suffix array, and in four shards sorted in this process."""
    root = tmp_path_factory.mktemp("rest")
    return (RestIndex.build(corpus(), root / "one", progress=False),
            RestIndex.build(corpus(), root / "four", progress=False, shards=4))


def same_files(a: dict, b: dict) -> None:
    assert {k: v["sha256"] for k, v in a["files"].items()} == {k: v["sha256"] for k, v in b["files"].items()}


def test_rest_on_two_nodes_equals_the_in_process_shards(cluster, rest_in_process, tmp_path):
    one, four = rest_in_process
    index = RestIndex.build(corpus(), tmp_path / "rest", progress=False, cluster=cluster)
    same_files(index.meta, four.meta)
    assert index.bounds.tolist() == four.bounds.tolist() and len(index.bounds) == 5
    assert index.meta["files"]["text.npy"] == one.meta["files"]["text.npy"]  # the suffix array is cut, the text not
    tokens = np.asarray(corpus().tokens)
    for start in range(0, tokens.shape[0] - 16, 37):  # contexts from the corpus: long matches, long ranges
        a, b = one.search(tokens[start:start + 16])[0], index.search(tokens[start:start + 16])[0]
        assert (a.tokens.tolist(), a.parents.tolist()) == (b.tokens.tolist(), b.parents.tolist())
    assert not (tmp_path / "rest.partial").exists() and sorted(p.name for p in (tmp_path / "rest").iterdir()) == \
        ["meta.json", "sa.npy", "text.npy"]


def test_crest_on_ray_equals_the_in_process_store(cluster, rest_in_process, tmp_path, monkeypatch):
    one, four = rest_in_process
    monkeypatch.setattr(crest_build, "TREES_PER_TASK", 7)  # several tree tasks per n
    reference = build_crest(one, tmp_path / "one.sqlite", ns=NS, t=T, progress=False)
    store = build_crest_on_ray(four, tmp_path / "four.sqlite", cluster, ns=NS, t=T, progress=False)
    assert store.meta["trees_sha256"] == reference.meta["trees_sha256"] and len(store) == len(reference) > 2 * T
    assert not (tmp_path / "four.sqlite.partial").exists()


def test_killed_rest_and_crest_workers_cost_only_their_pieces(cluster, rest_in_process, tmp_path, monkeypatch):
    one, four = rest_in_process
    read_trees, left = crest_build._read_trees, []

    def markers_left(work, *args):  # the driver's last step before the work folder goes
        left.extend(p.name for p in work.glob("kill-worker-at-*"))
        return read_trees(work, *args)

    monkeypatch.setattr(crest_build, "_read_trees", markers_left)
    reference = build_crest(one, tmp_path / "one.sqlite", ns=NS, t=T, progress=False)
    (tmp_path / "rest.partial").mkdir()
    (tmp_path / "rest.partial" / "kill-worker-at-sort-1").touch()
    index = RestIndex.build(corpus(), tmp_path / "rest", progress=False, cluster=cluster)
    same_files(index.meta, four.meta)
    work = tmp_path / "c.sqlite.partial"
    check_plan_of_crest = crest_build.check_plan

    def plan_then_mark(folder, record):  # markers go in once the build has made its work folder
        made = check_plan_of_crest(folder, record)
        for piece in ("count-2", "merge-2-1", "trees-3-0"):
            (folder / f"kill-worker-at-{piece}").touch()
        return made

    monkeypatch.setattr(crest_build, "check_plan", plan_then_mark)
    store = build_crest_on_ray(index, tmp_path / "c.sqlite", cluster, ns=NS, t=T, progress=False)
    assert store.meta["trees_sha256"] == reference.meta["trees_sha256"] and not work.exists()
    assert left == []  # every marked piece was reached: its worker died and Ray ran the piece again


def test_stopped_rest_and_crest_builds_resume_from_their_pieces(cluster, rest_in_process, tmp_path, monkeypatch,
                                                               capsys):
    one, four = rest_in_process
    with stopped_after_two_pieces(monkeypatch, cluster_module):
        RestIndex.build(corpus(), tmp_path / "rest", progress=True, cluster=cluster)
    assert 2 <= len(list((tmp_path / "rest.partial" / "shards").iterdir())) <= 4
    index = RestIndex.build(corpus(), tmp_path / "rest", progress=True, cluster=cluster)
    assert " of 4 shards sorted, " in capsys.readouterr().out and not (tmp_path / "rest.partial").exists()
    same_files(index.meta, four.meta)

    with stopped_after_two_pieces(monkeypatch, cluster_module):  # stops in the first step: counting
        build_crest_on_ray(index, tmp_path / "c.sqlite", cluster, ns=NS, t=T, progress=True)
    assert len(list((tmp_path / "c.sqlite.partial" / "counts").iterdir())) >= 2
    assert not (tmp_path / "c.sqlite").exists()
    capsys.readouterr()
    store = build_crest_on_ray(index, tmp_path / "c.sqlite", cluster, ns=NS, t=T, progress=True)
    # At least the two pieces finished before the stop are reused. Not an exact count: a task of the stopped
    # driver may still finish on the cluster (and its temporary file sit in the folder) before the rerun looks.
    found = re.search(r"count: (\d) of 4 done, (\d) to run on Ray", capsys.readouterr().out)
    assert found and int(found[1]) >= 2 and int(found[1]) + int(found[2]) == 4
    assert store.meta["trees_sha256"] == build_crest(one, tmp_path / "one.sqlite", ns=NS, t=T,
                                                     progress=False).meta["trees_sha256"]
    with pytest.raises(PlanMismatch, match="t"):  # a work folder left with other parameters is refused
        (tmp_path / "d.sqlite.partial").mkdir()
        check_plan(tmp_path / "d.sqlite.partial", {"format": 1, "corpus_sha256": "x", "params": {"t": 1}})
        build_crest_on_ray(index, tmp_path / "d.sqlite", cluster, ns=NS, t=T, progress=False)


def test_a_folder_not_made_by_a_build_is_never_used_as_crest_work(rest_in_process, tmp_path):
    (tmp_path / "c.sqlite.partial").mkdir()
    (tmp_path / "c.sqlite.partial" / "notes.txt").write_text("mine")
    with pytest.raises(ExistsError, match="no build's plan.json"):
        build_crest_on_ray(rest_in_process[1], tmp_path / "c.sqlite", Cluster(), ns=NS, t=T, progress=False)
    assert (tmp_path / "c.sqlite.partial" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "c.sqlite").exists()


def test_the_command_line_builds_rest_and_crest_on_ray(cluster, isolated_cache, tmp_path, capsys):
    from specnb.cli import main

    (tmp_path / "src").mkdir()
    for i in range(6):
        (tmp_path / "src" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * (i + 2))
    argv = ["datastore", "build", "crest", str(tmp_path / "src"), "--model", "tiny-llama", "--rest",
            str(tmp_path / "rest"), "--out", str(tmp_path / "c.sqlite"), "--m", "2", "--t", "10",
            "--ray", cluster.address, "--shards", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "CREST " in out and RestIndex.load(tmp_path / "rest").bounds.shape[0] == 4
