"""The DReSD experiments of notebooks 01-03: datastores sized by profile, projection variants, and the
nearest neighbours of a prompt's state (the drafters themselves run through :func:`specnb.experiments.run`).

Datastores (cached under ``cache_dir()/datastores/dense``, built on first use):

* ``code-OOD``: the CPython standard library (:func:`specnb.datastores.corpus.build_corpus` ``"code"``), truncated;
* ``chat-OOD``: ShareGPT assistant turns (``"chat"``), truncated;
* ``code-ID``: the target's own greedy responses to stdlib docstring stubs (``data/id_code_<model>.jsonl``,
  made by :mod:`specnb.id_data`; for the tiny smoke model a few are generated on the fly).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from ..ann import AnnIndex, ExactIndex, IndexParams, query_latency, recall_at_k
from ..datastores.corpus import CorpusError, TokenCorpus
from ..datastores.dense import (
    BuildConfig,
    DenseDatastore,
    build_datastore,
    datastore_path,
    load_datastore,
    resolve_corpus,
)
from ..embed import Projection
from ..models import LoadedModel, cache_dir
from ..prompts import Prompt

DATA = Path(__file__).resolve().parents[2] / "data"

# Corpus tokens per OOD datastore. Extraction of Gemma-3-270M states runs at roughly 1k tokens/s on 2 cores.
STORE_TOKENS = {
    "smoke": {"code": 2_000, "chat": 1_000},
    "quick": {"code": 100_000, "chat": 10_000},
    "full": {"code": 2_000_000, "chat": 1_000_000},
}


def id_responses(target: LoadedModel, profile: str) -> Path:
    """The ID responses file for ``target``: shipped in ``data/``, or (smoke) generated into the cache."""
    shipped = DATA / f"id_code_{Path(target.name).name}.jsonl"
    if shipped.exists():
        return shipped
    if profile != "smoke":
        raise CorpusError(f"no ID responses for {target.name} in {DATA}; make them with `python -m specnb.id_data "
                          f"code --model {target.name} --out {shipped}`")
    from ..id_data import docstring_stubs, generate_responses

    out = cache_dir() / "id_data" / shipped.name
    if not out.exists():
        generate_responses(target, docstring_stubs(6, max_files=40), out, max_new_tokens=48, source="smoke")
    return out


def build_config(profile: str) -> BuildConfig:
    """Extraction / index settings per profile (small batches for the tiny smoke models)."""
    if profile == "smoke":
        return BuildConfig(dims=16, n_components=64, seq_len=128, overlap=16, batch_tokens=2048)
    return BuildConfig()


def datastores(target: LoadedModel, profile: str, kinds: tuple[str, ...] = ("code-OOD", "code-ID", "chat-OOD"),
               progress: bool = True) -> dict[str, DenseDatastore]:
    """The dense datastores of ``kinds`` for ``target`` at ``profile`` size (built once, then cached)."""
    sizes = STORE_TOKENS[profile]
    stores = {}
    for kind in kinds:
        domain, dist = kind.split("-")
        if dist == "ID":
            source, tokens = str(id_responses(target, profile)), None
            digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:8]  # a grown file is another store
            name = f"id-{domain}-{Path(source).stem}-{digest}"
        else:
            source, tokens = domain, sizes[domain]
            name = f"{domain}-t{tokens}"
        path = datastore_path(name, target.name)
        if path.exists():
            stores[kind] = load_datastore(path)
            stores[kind].check(target)
        else:
            corpus = resolve_corpus(source, target, tokens)
            stores[kind] = build_datastore(target, corpus, path, build_config(profile), progress=progress)
    return stores


def store_corpus(store: DenseDatastore) -> TokenCorpus:
    """The token corpus a dense datastore was built from (so REST can index the very same documents)."""
    return TokenCorpus(np.asarray(store.corpus_tokens()), np.asarray(store.doc_starts()), dict(store.meta["corpus"]))


def with_projection(store: DenseDatastore, projection: Projection, chunk: int = 65536) -> DenseDatastore:
    """The same datastore keyed by another projection, searched exactly (for ablations; no index build)."""
    keys = projection.transform(store.hidden(), chunk=chunk)
    return dataclasses.replace(store, keys=keys, projection=projection, index=ExactIndex(keys))


def prompt_state(target: LoadedModel, prompt: Prompt) -> tuple[np.ndarray, int]:
    """(hidden float32 [d], root token): the target's last hidden state after ``prompt`` and its greedy token."""
    import torch

    from ..forward import forward
    from ..prompts import encode_prompt

    ids = encode_prompt(target, prompt)[None]
    with torch.inference_mode():
        logits, hidden = forward(target.model, ids, last_only=True)
    return hidden[0, -1].float().cpu().numpy(), int(logits[0, -1].argmax())


def neighbours_table(target: LoadedModel, store: DenseDatastore, hidden: np.ndarray, root: int, k: int = 8,
                     context_tokens: int = 16, value_tokens: int = 10) -> pd.DataFrame:
    """The k nearest stored states of ``hidden``: similarity, the corpus text before each, the token it
    predicts, whether that equals ``root`` (the first-token filter), and the value tokens after it."""
    ids, sims = store.index.query(store.projection(hidden), k)
    tokens, positions, decode = store.corpus_tokens(), store.positions(), target.tokenizer.decode
    rows = []
    for rank, (row, sim) in enumerate(zip(ids[0].tolist(), sims[0].tolist(), strict=True), 1):
        pos = int(positions[row])
        value = store.values[row]
        rows.append({"rank": rank, "similarity": round(sim, 4),
                     "context": decode(tokens[max(0, pos - context_tokens + 1):pos + 1].tolist()),
                     "predicts": decode([int(value[0])]), "passes_filter": int(value[0]) == root,
                     "value": decode([int(t) for t in value[1:1 + value_tokens] if t >= 0])})
    return pd.DataFrame(rows)


def hnsw_sweep(keys: np.ndarray, queries: np.ndarray, truth: np.ndarray, Ms: tuple[int, ...] = (8, 16, 32),
               efs: tuple[int, ...] = (10, 16, 32, 64, 128), ef_construction: int = 100) -> pd.DataFrame:
    """hnswlib over a grid of graph degrees ``Ms`` and ``efs`` search widths: recall@10 against ``truth``
    (exact top-10 ids [q, 10] of ``queries``), single-query latency, build seconds and index MiB; one row per
    (M, ef_search)."""
    rows = []
    for M in Ms:
        index = AnnIndex.build(keys, IndexParams(M=M, ef_construction=ef_construction), progress=False)
        size = index.nbytes()
        for ef in efs:
            found, _ = index.query(queries, 10, ef=ef)
            rows.append({"n": keys.shape[0], "M": M, "ef_search": ef, "recall@10": recall_at_k(found, truth),
                         **query_latency(index, queries, 10, ef=ef), "build_seconds": index.build_seconds,
                         "index_MiB": size / 2**20})
    return pd.DataFrame(rows)
