"""A dense store's IVF-PQ index filled shard by shard on a Ray cluster, resumably.

The index is trained on the driver (a sample of the keys), then tasks add the keys of a shard each to a copy of
the trained, empty index (``<work>/ivfpq-shards/NNNNN.index``), which the driver merges in order: the index one
process builds by adding the keys in order, byte for byte. This module and those its tasks import need neither
torch nor transformers, so a fresh Ray worker starts its task in a fraction of the seconds those take to import.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_file
from .ann import IvfPqIndex, IvfPqParams
from .cluster import Cluster, PlanMismatch, check_plan, die_if_marked, run_tasks
from .manifest import sampled_hash

PLAN_FORMAT = 1


@dataclass(frozen=True)
class _AddKeys:
    work: str
    shard: int
    lo: int
    hi: int
    params: IvfPqParams


def _ivfpq_shard(work: Path, shard: int) -> Path:
    return work / "ivfpq-shards" / f"{shard:05d}.index"


def _add_keys(job: _AddKeys) -> int:
    """Add keys ``lo:hi`` to a copy of the trained index and write it (a Ray task); returns the shard."""
    work = Path(job.work)
    die_if_marked(work, f"ivfpq-{job.shard}")
    index = IvfPqIndex.load(work / "ivfpq-shards" / "trained.index", job.params, mmap=False)
    index.add(np.load(work / "keys.f32.npy", mmap_mode="r")[job.lo:job.hi], job.lo)
    with atomic_file(_ivfpq_shard(work, job.shard)) as tmp:
        index.save(tmp)
    return job.shard


def ivfpq_on_ray(work: Path, trained: IvfPqIndex, cluster: Cluster, progress: bool = True) -> IvfPqIndex:
    """``trained`` (empty) filled with every key of ``work/keys.f32.npy``, shard by shard as Ray tasks, then
    merged in order. Shards left by an interrupted build with the same keys and index are reused."""
    keys = np.load(work / "keys.f32.npy", mmap_mode="r")
    count = cluster.shard_count(keys.shape[0])
    bounds = np.linspace(0, keys.shape[0], count + 1).round().astype(np.int64)
    folder = work / "ivfpq-shards"
    record = {"format": PLAN_FORMAT, "params": {**asdict(trained.params), "nlist": int(trained.index.nlist),
                                                "shards": count},
              "corpus_sha256": sampled_hash(work / "keys.f32.npy")}
    try:
        check_plan(folder, record)
    except PlanMismatch:  # ours, made for other keys or another index: start over
        shutil.rmtree(folder)
        check_plan(folder, record)
    trained.save(folder / "trained.index")
    start = time.perf_counter()
    todo = [_AddKeys(str(work), s, int(bounds[s]), int(bounds[s + 1]), trained.params) for s in range(count)
            if not _ivfpq_shard(work, s).exists()]
    run_tasks(cluster, _add_keys, todo, desc="ivfpq shards", progress=progress)
    for s in range(count):
        trained.merge(IvfPqIndex.load(_ivfpq_shard(work, s), trained.params, mmap=False))
    trained.build_seconds += time.perf_counter() - start
    shutil.rmtree(folder)  # ours: the shards, the trained copy and the plan
    return trained
