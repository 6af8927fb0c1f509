"""The DReSD experiments of notebooks 01-03: datastores sized by profile, projection variants, the nearest
neighbours of a prompt's state, hnswlib parameters, MRR per datastore, and DReSD vs REST (Fig. 4; the drafters
themselves run through :func:`specnb.experiments.run` or greedy replay).

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

from ..ann import AnnIndex, ExactIndex, IndexParams, exact_search, query_latency, recall_at_k, self_mrr, unit_vectors
from ..datastores.corpus import CorpusError, TokenCorpus
from ..datastores.dense import (
    BuildConfig,
    DenseDatastore,
    build_datastore,
    datastore_path,
    load_datastore,
    resolve_corpus,
)
from ..datastores.rest import RestIndex
from ..drafters.dense import DenseDrafter
from ..drafters.priced import PricedTreeDrafter
from ..drafters.rest import RestDrafter
from ..embed import Projection, fit_projection
from ..models import LoadedModel, cache_dir
from ..prompts import Prompt
from ..replay import Reference, replay_many
from .grids import replay_summary
from .runner import run, summarize

DATA = Path(__file__).resolve().parents[2] / "data"

# Corpus tokens per OOD datastore (whole documents up to the budget). Extraction of Gemma-3-270M states runs at
# roughly 1k tokens/s on 2 cores. quick code: the stdlib corpus's first 12 files (27k tokens); the next file alone
# is 64k tokens, and the store it would add cost more than a minute of `make figures`' 30.
STORE_TOKENS = {
    "smoke": {"code": 2_000, "chat": 1_000},
    "quick": {"code": 30_000, "chat": 10_000},
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


# ------------------------------------------------------------------------------- notebook 03's studies


def hnsw_on_real_keys(ood: DenseDatastore, queries_from: DenseDatastore, n_queries: int = 500,
                      seed: int = 0) -> pd.DataFrame:
    """:func:`hnsw_sweep` on ``ood``'s keys with realistic queries: ``n_queries`` states of another corpus
    (``queries_from``) under ``ood``'s transform, against their exact top 10."""
    hidden = queries_from.hidden()
    rows = np.sort(np.random.default_rng(seed).choice(hidden.shape[0], min(n_queries, hidden.shape[0]),
                                                      replace=False))
    queries = ood.projection(np.asarray(hidden[rows]))
    truth, _ = exact_search(queries, ood.keys, 10)
    return hnsw_sweep(np.asarray(ood.keys), queries, truth)


def hnsw_at_scale(n: int, dims: int, efs: tuple[int, ...] = (16, 32, 64, 128)) -> pd.DataFrame:
    """:func:`hnsw_sweep` (M = 16) on ``n`` random unit vectors of ``dims`` dims with a PCA-like spectrum
    (variance of axis i ~ 1/i) and 500 queries from the same distribution."""
    spectrum = 1 / np.sqrt(np.arange(1, dims + 1))
    vectors = unit_vectors(n, dims, seed=0, spectrum=spectrum)
    queries = unit_vectors(500, dims, seed=1, spectrum=spectrum)
    truth, _ = exact_search(queries, vectors, 10)
    return hnsw_sweep(vectors, queries, truth, Ms=(16,), efs=efs)


def cheapest_at_recall(sweep: pd.DataFrame, recall: float = 0.99) -> pd.Series:
    """The fastest row of a :func:`hnsw_sweep` table reaching ``recall``@10 (else the most accurate row)."""
    good = sweep[sweep["recall@10"] >= recall].sort_values("median_ms")
    return (good if len(good) else sweep.sort_values("recall@10", ascending=False)).iloc[0]


def mrr_table(stores: dict[str, DenseDatastore], sample: int = 2000, seed: int = 0) -> pd.DataFrame:
    """DReSD Table 1: one row per datastore (datastore, tokens, keys, MRR (hnswlib), MRR (exact), storage_MiB),
    MRR of ``sample`` of its own keys as queries (Eq. 4)."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, store in stores.items():
        picked = np.sort(rng.choice(store.rows, min(sample, store.rows), replace=False))
        rows.append({"datastore": name, "tokens": store.meta["extract"]["corpus_tokens"], "keys": store.rows,
                     "MRR (hnswlib)": self_mrr(store.index, np.asarray(store.keys), picked),
                     "MRR (exact)": self_mrr(None, np.asarray(store.keys), picked),
                     "storage_MiB": store.storage_bytes() / 2**20})
    return pd.DataFrame(rows)


FIG4_SHAPES = {"10x6": (10, 6, "rows"), "10x6 votes": (10, 6, "votes"), "10x10": (10, 10, "rows"),
               "3x20": (3, 20, "rows")}
"""DReSD's shapes in Fig. 4: 10x6 matches REST's tree size; 10x10 and 3x20 are the paper's best for sampling and
greedy decoding; "votes" merges every neighbour passing the first-token filter into one ranked tree."""


def dresd_vs_rest(stores: dict[str, DenseDatastore], references: list[Reference], hidden: list) -> pd.DataFrame:
    """DReSD Fig. 4 by greedy replay: REST on each store's own documents and DReSD in :data:`FIG4_SHAPES`.

    stores: {"code-OOD": ..., "code-ID": ...}; hidden: the references' teacher-forced states. Returns one row per
    method ("REST-OOD", "DReSD-OOD 10x6", ...; index ``method``) with calls, acceptance_rate, accepted_length,
    tokens_per_call and nodes_per_call.
    """
    rows = {}
    for name, store in stores.items():
        suffix = name.split("-")[-1]
        index = RestIndex.build(store_corpus(store), progress=False)
        makers = {f"REST-{suffix}": lambda index=index: RestDrafter(index)}
        makers.update({f"DReSD-{suffix} {label}": lambda store=store, k=k, w=w, merge=merge:
                       DenseDrafter(store, k, w, merge=merge) for label, (k, w, merge) in FIG4_SHAPES.items()})
        for method, make in makers.items():
            rows[method] = replay_summary(method, replay_many(make, references, hidden))
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


def timed_rest_vs_dresd(target: LoadedModel, prompts: list[Prompt], store: DenseDatastore, cost,
                        max_new_tokens: int) -> pd.DataFrame:
    """Real decoding side by side (tree verification, :func:`specnb.experiments.run`): AR, REST and DReSD 10x6 on
    ``store``'s documents, and their priced forms (verify only the part of each ranked tree that pays under the
    roofline ``cost``; DReSD's neighbours merged by votes there). :func:`specnb.experiments.summarize` rows."""
    rest = RestDrafter(RestIndex.build(store_corpus(store), progress=False))
    methods = {"ar": None, "REST-OOD": rest, "DReSD-OOD 10x6": DenseDrafter(store, 10, 6),
               "REST-OOD priced": PricedTreeDrafter(rest, cost),
               "DReSD-OOD votes priced": PricedTreeDrafter(DenseDrafter(store, 10, 6, merge="votes"), cost,
                                                           bucket_key="first_token_matches")}
    return summarize(run(target, prompts, methods, max_new_tokens=max_new_tokens, verify="tree"))


# ------------------------------------------------------------------------------- notebook 02's ablation


def projection_variants(sample: np.ndarray, full: Projection, dims: tuple[int, ...] = (32, 64, 96, 128)
                        ) -> dict[str, Projection]:
    """DReSD Table 2's key transforms: ``full`` (z-score, PCA, L2) at each of ``dims`` (those it has), and at 64
    dimensions (or fewer) a fit without the z-score ("64D, no z-score") and one without the L2 norm."""
    grid = [d for d in dims if d <= full.components.shape[0]]
    base = min(64, max(grid))
    variants = {f"{d}D": full.with_dims(d) for d in grid}
    variants["64D, no z-score"] = fit_projection(sample, n_components=max(grid), dims=base, znorm=False)
    variants["64D, no L2"] = full.with_dims(base, l2=False)
    return variants


def projection_ablation(ood: DenseDatastore, ind: DenseDatastore, variants: dict[str, Projection],
                        references: list[Reference], hidden: list, n_queries: int = 2000, seed: int = 0
                        ) -> pd.DataFrame:
    """One row per variant (index ``variant``): MRR of ``n_queries`` of ``ood``'s own states under the variant
    (exact search, so only the transform is judged), then the greedy replay of a 10 x 10 DReSD drafter over the
    ID store ``ind`` keyed by the variant (acceptance_rate, accepted_length, tokens_per_call) on the references
    (with their teacher-forced ``hidden`` states), and the variance its dimensions explain."""
    rows = np.sort(np.random.default_rng(seed).choice(ood.rows, min(n_queries, ood.rows), replace=False))
    table = {}
    for name, projection in variants.items():
        store = with_projection(ind, projection)
        replayed = replay_summary(name, replay_many(lambda store=store: DenseDrafter(store, 10, 10), references,
                                                    hidden))
        table[name] = {"MRR": self_mrr(None, with_projection(ood, projection).keys, rows, k=10),
                       **{key: replayed[key] for key in ("acceptance_rate", "accepted_length", "tokens_per_call")},
                       "explained_variance": float(projection.explained_variance_ratio[:projection.dims].sum())}
    return pd.DataFrame.from_dict(table, orient="index").rename_axis("variant")
