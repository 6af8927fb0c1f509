"""Where and how wide a sharded build runs, and what makes it resumable: the part the Ray builds of dense stores
(:mod:`specnb.datastores.shards`, :mod:`specnb.datastores.ivfpq_shards`), REST stores
(:func:`specnb.datastores.rest.sort_on_ray`) and CREST stores (:mod:`specnb.datastores.crest_build`) share.

A build's work folder holds ``plan.json`` (what every piece of work is made with: parameters and the input's
sha256) and one file or folder per finished piece, each written atomically. A build killed as a whole resumes
from the pieces on disk; a folder planned with other parameters is refused, never mixed. Ray reruns the task of
a worker that dies, so a killed worker costs only its piece.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tqdm.auto import tqdm

from ..atomic import write_text

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Cluster:
    """Where and how wide to run: a Ray ``address`` (None: a local Ray on this machine), ``workers`` actors or
    tasks at a time of ``threads`` CPU threads each (one GPU each where the cluster has them, for model work),
    ``shards`` pieces of work (0: 4 per worker)."""

    address: str | None = None
    workers: int = 2
    threads: int = 1
    shards: int = 0

    def shard_count(self, pieces: int) -> int:
        """Shards for work that splits into at most ``pieces`` pieces."""
        return max(1, min(pieces, self.shards or 4 * self.workers))


class PlanMismatch(ValueError):
    """A work folder whose pieces were planned with other parameters or another input."""


def check_plan(work: Path, record: dict[str, Any]) -> bool:
    """Record ``record`` (``params``, ``corpus_sha256``, ...) as ``work``'s plan (True: a new plan, nothing of it
    on disk yet), or find it there (False); raise PlanMismatch when the folder holds another one."""
    path = work / "plan.json"
    if path.exists():
        held = json.loads(path.read_text())
        if held != record:
            changed = sorted(k for k in {**held.get("params", {}), **record["params"]}
                             if held.get("params", {}).get(k) != record["params"].get(k))
            what = ", ".join(changed) or ("the corpus" if held.get("corpus_sha256") != record["corpus_sha256"]
                                          else "the shard count")
            raise PlanMismatch(f"{work} holds an interrupted build made with other parameters ({what}); rerun with "
                               "the same ones to resume it, or remove that folder")
        return False
    work.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1))
    return True


def die_if_marked(work: Path, piece: str) -> None:
    """How a test kills a worker mid-build: the first worker to reach a piece whose ``kill-worker-at-<piece>``
    marker is in ``work`` removes it and dies."""
    marker = work / f"kill-worker-at-{piece}"
    if marker.exists():
        marker.unlink()
        os._exit(1)


_joined = False  # whether connect() started this process's Ray


def connect(cluster: Cluster) -> None:
    """Join the cluster at ``cluster.address`` (or start a local Ray) unless this process already has."""
    global _joined
    import ray

    if not ray.is_initialized():
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        _joined = True


def disconnect() -> None:
    """Leave the Ray that :func:`connect` started (a local one stops), deaf to Ctrl-C meanwhile: Ray's own exit
    handler, run after the command, printed a traceback at a Ctrl-C and could leave Ray's processes behind."""
    global _joined
    if not _joined:
        return
    import ray

    main = threading.current_thread() is threading.main_thread()  # where Python lets a handler be set
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        ray.shutdown()
        _joined = False
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def run_tasks(cluster: Cluster, fn: Callable[[T], R], items: Sequence[T], *, desc: str,
              progress: bool = True) -> list[R]:
    """``fn(item)`` for every item as Ray tasks, at most ``cluster.workers`` at a time of ``cluster.threads`` CPUs
    each (a task whose worker dies is run again); results in ``items``' order. ``fn`` writes its piece of work
    atomically, so an interrupted call loses only the pieces in flight."""
    import ray

    if not items:
        return []
    connect(cluster)
    remote = ray.remote(num_cpus=cluster.threads, max_retries=3)(fn)
    results: dict[int, R] = {}
    running: dict[Any, int] = {}
    queue = deque(enumerate(items))
    with tqdm(total=len(items), desc=desc, unit="piece", disable=not progress) as bar:
        while queue or running:
            while queue and len(running) < cluster.workers:
                i, item = queue.popleft()
                running[remote.remote(item)] = i
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                results[running.pop(ref)] = ray.get(ref)
                bar.update(1)
    return [results[i] for i in range(len(items))]
