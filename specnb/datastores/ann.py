"""Approximate nearest-neighbour search over unit-length keys: an hnswlib inner-product index, a FAISS IVF-PQ
index for stores past what memory holds as float vectors and a graph, the exact (brute-force) search both are
judged against, and the retrieval measures of the notebooks.

DReSD used ScaNN (quantised keys); here hnswlib (HNSW graphs) up to :data:`IVFPQ_FROM` keys and FAISS IVF-PQ
(:class:`IvfPqIndex`: inverted lists over product-quantised codes, ``m`` bytes a key) beyond. hnswlib's build
parameters:

* ``M``: graph degree (links per node; memory grows ~ 2 M x 4 bytes per vector on the base layer);
* ``ef_construction``: candidate list size while inserting (build time vs graph quality);
* ``ef_search``: candidate list size while querying (latency vs recall; raised to k when smaller).

MRR (DReSD Eq. 4) queries the index over the whole datastore with the datastore's own keys: the reciprocal
rank of the queried row itself among its results (0 when it is not returned), averaged over the keys
(:func:`self_ranks`). Below 1 it measures two things: the approximate search missing a key, and exact
duplicates (a duplicate pair's two identical queries get the same result list, so one of the two ranks itself
second at best). Held-out queries, states that are not stored keys, get :func:`held_out_ranks`: the rank of the
first result that is an exact nearest neighbour, which measures the approximate search alone.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import hnswlib
import numpy as np
from tqdm.auto import tqdm


def check_at_least(least: int, values: dict[str, int]) -> None:
    """ValueError (one line) naming the first of ``values`` ({what it is called on the command line: value})
    below ``least``."""
    for flag, value in values.items():
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")


@dataclass(frozen=True)
class IndexParams:
    """hnswlib build / query parameters (see the module docstring); ValueError for a value hnswlib cannot take
    (M < 2 crashed it with a segmentation fault, after the whole extraction)."""

    M: int = 16
    ef_construction: int = 200
    ef_search: int = 64
    seed: int = 100

    def __post_init__(self) -> None:
        check_at_least(2, {"--M": self.M})
        check_at_least(1, {"--ef-construction": self.ef_construction, "--ef-search": self.ef_search})


class AnnIndex:
    """An hnswlib inner-product index over float32 [n, dim] keys; row i of the keys has label i."""

    def __init__(self, index: hnswlib.Index, params: IndexParams, build_seconds: float = 0.0):
        self.index = index
        self.params = params
        self.build_seconds = build_seconds
        self._ef = params.ef_search
        self.index.set_ef(self._ef)

    @classmethod
    def build(cls, keys: np.ndarray, params: IndexParams = IndexParams(), threads: int | None = None,
              chunk: int = 50_000, progress: bool = True) -> AnnIndex:
        """Insert all keys (``chunk`` at a time, for the progress bar) with ``threads`` threads (all cores)."""
        n, dim = keys.shape
        index = hnswlib.Index(space="ip", dim=dim)
        index.init_index(max_elements=max(n, 1), M=params.M, ef_construction=params.ef_construction,
                         random_seed=params.seed)
        start = time.perf_counter()
        for i in tqdm(range(0, n, chunk), desc="hnsw build", disable=not progress or n <= chunk):
            block = np.ascontiguousarray(keys[i:i + chunk], dtype=np.float32)
            index.add_items(block, np.arange(i, i + block.shape[0]), num_threads=threads or os.cpu_count() or 1)
        return cls(index, params, time.perf_counter() - start)

    def __len__(self) -> int:
        return self.index.get_current_count()

    @property
    def dim(self) -> int:
        return self.index.dim

    def query(self, queries: np.ndarray, k: int, threads: int = 1,
              ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [m, k], similarities float32 [m, k]) best first; k is capped at the index size.

        ef: candidate list size for this query (default ``params.ef_search``); hnswlib needs ef >= k.
        """
        k = min(k, len(self))
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        ef = max(ef or self.params.ef_search, k)
        if ef != self._ef:
            self.index.set_ef(ef)
            self._ef = ef
        labels, distances = self.index.knn_query(queries, k=k, num_threads=threads)
        return labels.astype(np.int64), (1.0 - distances).astype(np.float32)  # hnswlib "ip" distance = 1 - dot

    def save(self, path: str | Path) -> None:
        self.index.save_index(str(path))

    @classmethod
    def load(cls, path: str | Path, dim: int, params: IndexParams) -> AnnIndex:
        index = hnswlib.Index(space="ip", dim=dim)
        index.load_index(str(path))
        return cls(index, params)

    def nbytes(self) -> int:
        """Bytes the index holds (its serialised size, which mirrors hnswlib's in-memory layout)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "index.bin"
            self.save(path)
            return path.stat().st_size

    def describe(self) -> dict[str, float | int]:
        return {**asdict(self.params), "n": len(self), "dim": self.dim, "build_seconds": self.build_seconds}

    def label(self) -> str:
        """The index and the parameters its results depend on, for a figure or a table: ``hnswlib (M 16, ef 64)``."""
        return f"hnswlib (M {self.params.M}, ef {self.params.ef_search})"


# ------------------------------------------------------------------------------------------- IVF-PQ

IVFPQ_FROM = 10_000_000  # keys from which ``--index auto`` builds IVF-PQ: hnswlib's vectors + graph pass ~4 GB
PQ_BITS = 8  # bits of a sub-quantiser's code: 256 centroids each, one byte


@dataclass(frozen=True)
class IvfPqParams:
    """FAISS IVF-PQ build / query parameters: ``nlist`` inverted lists (0: 4 sqrt(n), from 16 to 65536), ``m``
    sub-quantisers of :data:`PQ_BITS` bits (a key's code is m bytes), trained on ``train_size`` sampled keys;
    ``nprobe`` lists scanned per query. ValueError for a count below its least."""

    nlist: int = 0
    m: int = 32
    nprobe: int = 32
    train_size: int = 200_000
    seed: int = 0

    def __post_init__(self) -> None:
        check_at_least(0, {"--nlist": self.nlist})
        check_at_least(1, {"--pq-m": self.m, "--nprobe": self.nprobe, "train_size": self.train_size})

    def lists_for(self, n: int) -> int:
        return self.nlist or int(np.clip(4 * np.sqrt(max(n, 1)), 16, 65_536))


class IvfPqIndex:
    """A FAISS IVF-PQ inner-product index over float32 [n, dim] keys, row i labelled i; :class:`AnnIndex`'s query
    interface (``ef`` is the lists probed, ``nprobe``)."""

    def __init__(self, index: faiss.Index, params: IvfPqParams, build_seconds: float = 0.0):
        self.index, self.params, self.build_seconds = index, params, build_seconds

    @classmethod
    def trained(cls, sample: np.ndarray, n: int, params: IvfPqParams = IvfPqParams()) -> IvfPqIndex:
        """An empty index trained on ``sample`` [s, dim] for a store of ``n`` keys (its lists and codebooks)."""
        dim = sample.shape[1]
        if dim % params.m:
            raise ValueError(f"IVF-PQ needs m ({params.m}) to divide the key dimension ({dim})")
        nlist = min(params.lists_for(n), max(1, sample.shape[0] // 39))  # FAISS wants >= 39 points per list
        nbits = min(PQ_BITS, int(np.log2(sample.shape[0])))  # a codebook of at most as many codes as points
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, params.m, nbits, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = params.seed
        index.pq.cp.seed = params.seed
        start = time.perf_counter()
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
        index.nprobe = params.nprobe
        return cls(index, params, time.perf_counter() - start)

    @classmethod
    def build(cls, keys: np.ndarray, params: IvfPqParams = IvfPqParams(), chunk: int = 262_144,
              progress: bool = True) -> IvfPqIndex:
        """Train on a sample of ``keys`` (:func:`specnb.datastores.embed.sample_rows`), then add every key."""
        from .embed import sample_rows

        n = keys.shape[0]
        out = cls.trained(sample_rows(keys, params.train_size, params.seed), n, params)
        start = time.perf_counter()
        for i in tqdm(range(0, n, chunk), desc="ivfpq build", disable=not progress or n <= chunk):
            out.add(keys[i:i + chunk], i)
        out.build_seconds += time.perf_counter() - start
        return out

    def add(self, keys: np.ndarray, first: int) -> None:
        """Add keys [b, dim] labelled ``first`` .. ``first + b - 1``."""
        block = np.ascontiguousarray(keys, dtype=np.float32)
        self.index.add_with_ids(block, np.arange(first, first + block.shape[0], dtype=np.int64))

    def merge(self, other: IvfPqIndex) -> None:
        """Move every key of ``other`` (trained alike: same lists and codebooks) into this index."""
        self.index.merge_from(other.index, 0)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def query(self, queries: np.ndarray, k: int, threads: int = 1,
              ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [m, k], approximate similarities float32 [m, k]) best first; -1 ids where fewer than k keys
        lie in the probed lists. ef: lists probed for this query (default ``params.nprobe``)."""
        k = min(k, len(self))
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        previous = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(threads)
        try:
            sims, ids = self.index.search(queries, k, params=faiss.SearchParametersIVF(nprobe=ef or self.params.nprobe))
        finally:
            faiss.omp_set_num_threads(previous)
        return ids.astype(np.int64), sims.astype(np.float32)

    def save(self, path: str | Path) -> None:
        faiss.write_index(self.index, str(path))

    @classmethod
    def load(cls, path: str | Path, params: IvfPqParams, mmap: bool = True) -> IvfPqIndex:
        """Open a saved index memory-mapped (its lists read from disk as queries need them), or with ``mmap``
        False into memory, to add keys to it."""
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        return cls(faiss.read_index(str(path), flags), params)

    def nbytes(self) -> int:
        """Bytes the index holds: its serialised size (codes, ids, centroids and codebooks)."""
        return int(faiss.serialize_index(self.index).nbytes)

    def describe(self) -> dict[str, float | int]:
        return {**asdict(self.params), "nlist": int(self.index.nlist), "nbits": int(self.index.pq.nbits),
                "n": len(self), "dim": self.dim, "build_seconds": self.build_seconds}

    def label(self) -> str:
        """The index and the parameters its results depend on: ``IVF-PQ (4096 lists, 32 B codes, nprobe 32)``."""
        return (f"IVF-PQ ({int(self.index.nlist)} lists, {int(self.index.pq.M * self.index.pq.nbits) // 8} B codes, "
                f"nprobe {self.params.nprobe})")


# ------------------------------------------------------------------------------------- exact search


class ExactIndex:
    """Brute-force search with :class:`AnnIndex`'s query interface (ground truth; ablations without a build)."""

    def __init__(self, keys: np.ndarray):
        self.keys = np.ascontiguousarray(keys, dtype=np.float32)

    def __len__(self) -> int:
        return self.keys.shape[0]

    @property
    def dim(self) -> int:
        return self.keys.shape[1]

    def query(self, queries: np.ndarray, k: int, threads: int = 1,
              ef: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return exact_search(np.asarray(queries, dtype=np.float32).reshape(-1, self.dim), self.keys, k)


EXACT_BLOCK = 2**26  # scores (float32) of one exact-search block: 256 MiB, whatever the store's size


def exact_search(queries: np.ndarray, keys: np.ndarray, k: int, chunk: int = 1024,
                 progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-k by inner product: (ids int64 [m, k], similarities float32 [m, k]), best first.

    queries float [m, dim], keys float [n, dim]; one [chunk, n] score block at a time, ``chunk`` lowered so that a
    block holds at most :data:`EXACT_BLOCK` scores (a store of millions of keys would otherwise need gigabytes).
    """
    import torch  # here, not at the top: the Ray tasks that fill IVF-PQ indexes run without it

    k = min(k, keys.shape[0])
    chunk = max(1, min(chunk, EXACT_BLOCK // max(keys.shape[0], 1)))
    with warnings.catch_warnings():  # keys may be a read-only memory map: torch warns, but they are only read
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        keys_t = torch.from_numpy(np.ascontiguousarray(keys, dtype=np.float32))
    ids = np.empty((queries.shape[0], k), dtype=np.int64)
    sims = np.empty((queries.shape[0], k), dtype=np.float32)
    for i in tqdm(range(0, queries.shape[0], chunk), desc="exact search", disable=not progress):
        q = torch.from_numpy(np.array(queries[i:i + chunk], dtype=np.float32))  # a writable copy of the chunk
        top = (q @ keys_t.T).topk(k, dim=1)
        ids[i:i + chunk] = top.indices.numpy()
        sims[i:i + chunk] = top.values.numpy()
    return ids, sims


def recall_per_query(found: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """float [m]: the fraction of each query's true top-k ids (int [m, k]) that ``found`` (int [m, k']) contains."""
    return (found[:, :, None] == truth[:, None, :]).any(1).mean(1)


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean fraction of the true top-k ids (int [m, k]) that ``found`` (int [m, k']) contains."""
    return float(recall_per_query(found, truth).mean())


def reciprocal_ranks(found: np.ndarray, true_ids: np.ndarray) -> np.ndarray:
    """float [m]: 1 / (1-based rank of true_ids[i] in found[i]), 0 where it is absent."""
    match = found == true_ids[:, None]
    ranks = match.argmax(1) + 1
    return np.where(match.any(1), 1.0 / ranks, 0.0)


def code_error(index: AnnIndex | IvfPqIndex | ExactIndex, keys: np.ndarray) -> np.ndarray:
    """float [m]: how far what ``index`` stores for each of ``keys`` (float [m, dim], keys it holds) lies from the
    key, over the key's length. An IVF-PQ code decodes to its list's centroid plus the product-quantised residual;
    hnswlib and exact search keep the float32 keys (0). The precision an index ranks a key's own entry with."""
    if not isinstance(index, IvfPqIndex):
        return np.zeros(keys.shape[0], dtype=np.float32)
    x = np.ascontiguousarray(keys, dtype=np.float32)
    decoded = index.index.sa_decode(index.index.sa_encode(x))
    return np.linalg.norm(x - decoded, axis=1) / np.maximum(np.linalg.norm(x, axis=1), 1e-30)


def code_bits(index: AnnIndex | IvfPqIndex | ExactIndex) -> float:
    """Bits a dimension of a key the index keeps: an IVF-PQ code's m x nbits over the dimensions (its 32 bytes are
    8 bits a dimension at 32 dimensions, 2 at 128), 32 where the keys are kept as float32."""
    if not isinstance(index, IvfPqIndex):
        return 32.0
    return float(index.index.pq.M * index.index.pq.nbits) / index.dim


def self_ranks(index: AnnIndex | IvfPqIndex | ExactIndex | None, keys: np.ndarray, rows: np.ndarray,
               k: int = 10) -> np.ndarray:
    """float [len(rows)]: DReSD's reciprocal rank (Eq. 4) of each stored key of ``rows`` (int [m], rows of
    ``keys`` float [n, dim]): ``index`` (built over all n keys, row i labelled i) is queried with key i, and i's own
    position among the top ``k`` results is ranked (0 when it is not among them); ``index=None``: exact search
    over ``keys``, which isolates duplicates from the index's misses. Their mean is DReSD's MRR."""
    queries = np.ascontiguousarray(keys[rows], dtype=np.float32)
    found = exact_search(queries, keys, k)[0] if index is None else \
        index.query(queries, k, threads=os.cpu_count() or 1)[0]
    return reciprocal_ranks(found, np.asarray(rows))


def held_out_ranks(index: AnnIndex | IvfPqIndex | ExactIndex, keys: np.ndarray, queries: np.ndarray, k: int = 10,
                   tolerance: float = 1e-5) -> np.ndarray:
    """float [m]: for each query (float [m, dim], not a stored key: a state decoding would search with), the
    reciprocal rank of the first of ``index``'s top ``k`` results that is an exact nearest neighbour among
    ``keys`` float [n, dim] (its inner product with the query, recomputed from the stored key, within
    ``tolerance`` of the exact best); 0 when none is. Any of several tied keys counts, so duplicates cost
    nothing: it measures the approximate search alone."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    best = exact_search(queries, keys, 1)[1][:, 0]
    found = index.query(queries, k, threads=os.cpu_count() or 1)[0]
    stored = np.asarray(keys[np.clip(found, 0, None).ravel()], dtype=np.float32).reshape(*found.shape, -1)
    sims = np.einsum("mkd,md->mk", stored, queries)
    hit = (found >= 0) & (sims >= best[:, None] - tolerance)
    return np.where(hit.any(1), 1.0 / (hit.argmax(1) + 1), 0.0)


def query_latency(index: AnnIndex, queries: np.ndarray, k: int, ef: int | None = None,
                  warmup: int = 20) -> dict[str, float]:
    """Single-query, single-thread latency as a drafter sees it: median / p90 / mean milliseconds."""
    for q in queries[:warmup]:
        index.query(q[None], k, ef=ef)
    times = np.empty(queries.shape[0])
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        index.query(q[None], k, ef=ef)
        times[i] = time.perf_counter() - t0
    ms = times * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)), "mean_ms": float(ms.mean())}


def unit_vectors(n: int, dim: int, seed: int = 0, spectrum: np.ndarray | None = None,
                 chunk: int = 262_144) -> np.ndarray:
    """float32 [n, dim] random unit vectors: isotropic, or with per-axis standard deviations ``spectrum``
    [dim] (e.g. the square root of real keys' PCA variances, which gives an easier, more realistic cloud)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for i in range(0, n, chunk):
        block = rng.standard_normal((min(chunk, n - i), dim), dtype=np.float32)
        if spectrum is not None:
            block *= spectrum.astype(np.float32)
        out[i:i + block.shape[0]] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out
