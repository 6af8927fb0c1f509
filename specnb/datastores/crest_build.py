"""``specnb datastore build crest``: a CREST store built in this process (:func:`specnb.datastores.crest.build_crest`)
or, with ``--ray [ADDRESS]``, as a map-reduce on a Ray cluster over a REST store, sharded or not:

1. count: a task per suffix-array shard writes that shard's n-gram tables (:class:`~specnb.datastores.crest.
   NgramTable`, one per n, in key order) to ``<work>/counts/NNNNN/``;
2. merge: a task per (n, range of first tokens) sums that slice of every shard's table and keeps its ``t`` most
   frequent; the driver merges the ranges' lists, exactly (an n-gram lives in one range);
3. trees: tasks of :data:`TREES_PER_TASK` n-grams compute their REST trees to ``<work>/trees/``.

The trees are the in-process build's, byte for byte. Workers open the REST store (memory-mapped) and the work
folder ``<out>.partial`` by path: both must be on a filesystem every node sees. Every piece is written atomically
and ``plan.json`` holds the parameters with the REST store's checksums, so a build killed as a whole resumes from
the pieces it finished (:mod:`specnb.datastores.cluster`); the REST store itself is sharded on Ray by
:meth:`specnb.datastores.rest.RestIndex.build`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_file, atomic_folder, check_replaceable, work_folder
from .cluster import Cluster, check_plan, die_if_marked, run_tasks
from .crest import (
    CrestStore,
    NgramTable,
    NgramTrees,
    ShardCounter,
    check_ns,
    is_crest_store,
    merge_tables,
    most_frequent,
    ranges_of,
    store_meta,
    trees_of,
    write_store,
)
from .rest import (
    DEFAULT_SEARCH,
    SEPARATOR,
    RestIndex,
    SearchConfig,
)

PLAN_FORMAT = 1
TREES_PER_TASK = 2000


@dataclass(frozen=True)
class _Count:
    work: str
    store: str
    shard: int
    ns: tuple[int, ...]


def _count(job: _Count) -> int:
    """Write one shard's n-gram tables (a Ray task); returns the shard."""
    work = Path(job.work)
    die_if_marked(work, f"count-{job.shard}")
    counter = ShardCounter(RestIndex.load(job.store), job.shard)
    with atomic_folder(_counted(work, job.shard), replace=True) as tmp:
        for n in job.ns:
            table = counter.table(n)
            for name in ("keys", "counts", "first"):
                np.save(tmp / f"{name}{n}.npy", getattr(table, name))
    return job.shard


def _counted(work: Path, shard: int) -> Path:
    return work / "counts" / f"{shard:05d}"


def _table(work: Path, shard: int, n: int) -> NgramTable:
    """Shard ``shard``'s table of n-grams, memory-mapped."""
    folder = _counted(work, shard)
    return NgramTable(*(np.load(folder / f"{name}{n}.npy", mmap_mode="r") for name in ("keys", "counts", "first")))


def _first_token_key(token: int, n: int) -> np.ndarray:
    """The smallest key of n tokens starting with ``token`` (void [1], 4n bytes)."""
    return np.array([[token] + [0] * (n - 1)], dtype=">i4").view(f"V{4 * n}").ravel()


@dataclass(frozen=True)
class _Merge:
    work: str
    shards: int
    n: int
    part: int
    tokens: tuple[int, int]  # first tokens [lo, hi) of this range
    t: int


def _merge(job: _Merge) -> int:
    """Sum one range of first tokens over every shard's n-gram table, keep its t most frequent (a Ray task)."""
    work = Path(job.work)
    die_if_marked(work, f"merge-{job.n}-{job.part}")
    lo_key, hi_key = (_first_token_key(token, job.n) for token in job.tokens)
    pieces = []
    for shard in range(job.shards):
        table = _table(work, shard, job.n)
        a, b = (int(np.searchsorted(table.keys, key)[0]) for key in (lo_key, hi_key))
        pieces.append((np.asarray(table.keys[a:b]), np.asarray(table.counts[a:b])))
    keys, counts = most_frequent(*merge_tables(pieces), job.t)
    with atomic_file(_merged(work, job.n, job.part)) as tmp, tmp.open("wb") as f:
        np.savez(f, keys=keys, counts=counts)
    return job.part


def _merged(work: Path, n: int, part: int) -> Path:
    return work / "top" / f"n{n}-{part:05d}.npz"


@dataclass(frozen=True)
class _Trees:
    work: str
    store: str
    n: int
    chunk: int
    keys: np.ndarray
    counts: np.ndarray
    ranges: np.ndarray
    config: SearchConfig


def _trees(job: _Trees) -> int:
    """Compute and write the REST trees of a chunk of top n-grams (a Ray task); returns the chunk."""
    work = Path(job.work)
    die_if_marked(work, f"trees-{job.n}-{job.chunk}")
    trees = trees_of(RestIndex.load(job.store), job.n, job.keys, job.counts, job.ranges, job.config, progress=False)
    lengths = np.array([len(blob) for blob in trees.blobs], dtype=np.int64)
    with atomic_file(_treed(work, job.n, job.chunk)) as tmp, tmp.open("wb") as f:
        np.savez(f, blobs=np.frombuffer(b"".join(trees.blobs), dtype=np.uint8), lengths=lengths, nodes=trees.nodes)
    return job.chunk


def _treed(work: Path, n: int, chunk: int) -> Path:
    return work / "trees" / f"n{n}-{chunk:05d}.npz"


def _read_trees(work: Path, n: int, chunks: int, keys: np.ndarray, counts: np.ndarray) -> NgramTrees:
    blobs, nodes = [], []
    for chunk in range(chunks):
        with np.load(_treed(work, n, chunk)) as data:
            raw, ends = data["blobs"].tobytes(), np.cumsum(data["lengths"])
            blobs += [raw[end - length:end] for end, length in zip(ends.tolist(), data["lengths"].tolist(),
                                                                     strict=True)]
            nodes.append(data["nodes"])
    return NgramTrees(n, [key.tobytes() for key in keys], blobs, np.concatenate(nodes), counts)


def trees_on_ray(index: RestIndex, work: Path, ns: tuple[int, ...] | list[int], t: int, config: SearchConfig,
                 cluster: Cluster, progress: bool = True) -> list[NgramTrees]:
    """The trees of the ``t`` most frequent n-grams of each n in ``ns`` over the REST store ``index`` (on disk),
    as :func:`specnb.datastores.crest.ngram_trees` gives them, computed as Ray tasks with their pieces in
    ``work`` (module docstring)."""
    if index.path is None:
        raise ValueError("a CREST build on Ray reads its REST store from disk: save the REST index first")
    store, shards, ns = str(Path(index.path).resolve()), index.bounds.shape[0] - 1, tuple(ns)
    vocab = int(index.tokenizer.vocab_size)
    parts = cluster.shard_count(vocab)
    edges = np.linspace(0, vocab, parts + 1).round().astype(np.int64).tolist()
    edges[-1] = int(SEPARATOR)  # above every token
    check_plan(work, {"format": PLAN_FORMAT, "corpus_sha256": json.dumps(index.meta.get("files"), sort_keys=True),
                      "params": {"kind": "crest", "ns": list(ns), "t": t, "search": asdict(config),
                                 "ranges": parts}})

    def stage(what: str, jobs: list, fn, done) -> None:  # run the jobs whose piece is not on disk yet
        todo = [job for job in jobs if not done(job)]
        if progress:
            print(f"{work}: {what}: {len(jobs) - len(todo)} of {len(jobs)} done, {len(todo)} to run on Ray")
        run_tasks(cluster, fn, todo, desc=what, progress=progress)

    stage("count", [_Count(str(work), store, s, ns) for s in range(shards)], _count,
          lambda job: _counted(work, job.shard).exists())
    stage("merge", [_Merge(str(work), shards, n, p, (edges[p], edges[p + 1]), t) for n in ns for p in range(parts)],
          _merge, lambda job: _merged(work, job.n, job.part).exists())
    tops = {}
    for n in ns:
        ranged = []
        for p in range(parts):
            with np.load(_merged(work, n, p)) as data:
                ranged.append((data["keys"], data["counts"]))
        keys, counts = most_frequent(*merge_tables(ranged), t)
        tops[n] = keys, counts, ranges_of(keys, [_table(work, s, n) for s in range(shards)])
    jobs = [_Trees(str(work), store, n, c, *(a[c * TREES_PER_TASK:(c + 1) * TREES_PER_TASK] for a in tops[n]), config)
            for n in ns for c in range(-(-tops[n][0].shape[0] // TREES_PER_TASK))]
    stage("trees", jobs, _trees, lambda job: _treed(work, job.n, job.chunk).exists())
    return [_read_trees(work, n, -(-tops[n][0].shape[0] // TREES_PER_TASK), tops[n][0], tops[n][1]) for n in ns]


def build_crest_on_ray(index: RestIndex, path: str | Path, cluster: Cluster, ns: Sequence[int] = (1, 2, 3, 4, 5),
                       t: int = 10_000, config: SearchConfig = DEFAULT_SEARCH, progress: bool = True,
                       overwrite: bool = True) -> CrestStore:
    """:func:`specnb.datastores.crest.build_crest` as Ray tasks (module docstring), resumable from
    ``<path>.partial``; ``index`` must be a REST store on disk that the workers can open."""
    check_ns(ns, config)
    check_replaceable(path, is_crest_store, overwrite, "CREST store")
    start = time.perf_counter()
    with work_folder(path) as work:
        tables = trees_on_ray(index, work, tuple(ns), t, config, cluster, progress)
        write_store(path, tables, t, store_meta(index, config, time.perf_counter() - start), overwrite)
    return CrestStore(path)
