"""A dense store's hidden states extracted shard by shard on a Ray cluster (``--ray [ADDRESS]``), resumably.

The extraction's batches (:func:`specnb.datastores.embed.plan`: the very batches a single process runs) are cut
into ``shards`` contiguous groups. A Ray Data pipeline maps the shards on actors that each load the target once
(one GPU each where the cluster has GPUs, else CPU actors of ``threads`` threads) and write a shard's rows
atomically to ``<work>/shards/NNNNN.npz``. ``<work>/plan.json`` records what every shard is made with (the
extraction's parameters, the corpus's sha256, the shard count): a build killed as a whole resumes from the shards
on disk, and a folder planned with other parameters is refused, never mixed. A worker that dies costs its shard,
which Ray runs again on a new actor. The shards are then gathered into the hidden.f16.npy a single-process
extraction writes, row for row.

The IVF-PQ index over the extracted keys is filled on Ray by :mod:`specnb.datastores.ivfpq_shards`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..atomic import atomic_file
from ..model.models import LoadedModel
from .cluster import Cluster, check_plan, connect, die_if_marked
from .corpus import TokenCorpus
from .embed import Plan, completed, finish, plan, run_batch, write_layout

PLAN_FORMAT = 1


def shard_path(work: Path, shard: int) -> Path:
    return work / "shards" / f"{shard:05d}.npz"


def finished(work: Path, count: int) -> list[int]:
    """The shards of ``work`` already on disk (each was written whole, atomically)."""
    return [s for s in range(count) if shard_path(work, s).exists()]


def batch_shard_bounds(batches: int, count: int) -> np.ndarray:
    """int [count + 1]: shard s runs batches ``bounds[s]:bounds[s + 1]``."""
    return np.linspace(0, batches, count + 1).round().astype(np.int64)


def run_shard(target: LoadedModel, layout: Plan, tokens: np.ndarray, work: Path, shard: int,
              bounds: np.ndarray) -> int:
    """Compute shard ``shard``'s rows and write them atomically; returns its row count."""
    rows, states = [], []
    for batch in layout.work[bounds[shard]:bounds[shard + 1]]:
        for row, state in run_batch(target, tokens, batch):
            rows.append(np.arange(row, row + state.shape[0]))
            states.append(state)
    rows_a = np.concatenate(rows) if rows else np.empty(0, np.int64)
    states_a = np.concatenate(states) if states else np.empty((0, layout.params["hidden_size"]), np.float16)
    with atomic_file(shard_path(work, shard)) as tmp, tmp.open("wb") as f:
        np.savez(f, rows=rows_a, hidden=states_a)
    return int(rows_a.shape[0])


class _ShardActor:
    """A Ray Data actor: loads the target once, then computes the shards it is handed."""

    def __init__(self, model: dict[str, str], threads: int, work: str, corpus: TokenCorpus, layout: Plan,
                 bounds: np.ndarray):
        import torch

        from ..model.models import load_model

        torch.set_num_threads(threads)
        self.target = load_model(model["name"], dtype=model["dtype"], device=model["device"], weights=model["weights"])
        self.work, self.layout, self.bounds = Path(work), layout, bounds
        self.tokens = np.asarray(corpus.tokens)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = []
        for shard in batch["shard"].tolist():
            die_if_marked(self.work, str(shard))
            rows.append(run_shard(self.target, self.layout, self.tokens, self.work, shard, self.bounds))
        return {"shard": batch["shard"], "rows": np.asarray(rows, dtype=np.int64)}


def extract_on_ray(target: LoadedModel, corpus: TokenCorpus, out: str | Path, cluster: Cluster, *,
                   n_next: int, seq_len: int, overlap: int, batch_tokens: int,
                   progress: bool = True) -> dict[str, Any]:
    """:func:`specnb.datastores.embed.extract`'s files in folder ``out``, computed shard by shard on Ray.

    ``target`` names the model the actors load (its name, dtype and weights); the driver runs no forward pass.
    Returns the extraction's parameters, as ``extract`` does.
    """
    import ray

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    layout = plan(target, corpus, n_next=n_next, seq_len=seq_len, overlap=overlap, batch_tokens=batch_tokens)
    if completed(out, layout):  # a build stopped after its extraction (while fitting or indexing)
        return layout.params
    (out / "extract.json").unlink(missing_ok=True)  # another run's mark: its files are about to change
    count = cluster.shard_count(len(layout.work))
    if check_plan(out, {"format": PLAN_FORMAT, "params": layout.params, "corpus_sha256": layout.corpus_sha256,
                        "shards": count}):
        write_layout(out, corpus, layout)  # a new plan: whatever else the folder holds is not this build's
    bounds = batch_shard_bounds(len(layout.work), count)
    done = set(finished(out, count))
    todo = [s for s in range(count) if s not in done]
    if progress:
        print(f"{out}: {count - len(todo)} of {count} shards done, {len(todo)} to run on Ray")
    if todo:
        connect(cluster)
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        model = {"name": target.name, "dtype": target.dtype_name,
                 "weights": target.weights, "device": "cuda" if gpus else "cpu"}
        shards = ray.data.from_items([{"shard": s} for s in todo], override_num_blocks=len(todo))
        results = shards.map_batches(
            _ShardActor, batch_size=1, concurrency=cluster.workers, num_cpus=cluster.threads, num_gpus=gpus,
            fn_constructor_kwargs={"model": model, "threads": cluster.threads, "work": str(out), "corpus": corpus,
                                   "layout": layout, "bounds": bounds})
        with tqdm(total=len(todo), desc="shards", unit="shard", disable=not progress) as bar:
            for _ in results.iter_rows():
                bar.update(1)
    hidden = np.lib.format.open_memmap(out / "hidden.f16.npy", mode="w+", dtype=np.float16,
                                       shape=(layout.params["rows"], layout.params["hidden_size"]))
    for s in range(count):
        with np.load(shard_path(out, s)) as shard:
            hidden[shard["rows"]] = shard["hidden"]
    hidden.flush()
    del hidden
    params = finish(out, layout)
    shutil.rmtree(out / "shards")  # ours: the shards, and any half-written one a killed worker left
    (out / "plan.json").unlink()
    return params
