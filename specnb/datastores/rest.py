"""REST's datastore: a token corpus and its suffix array (He et al. 2023; the CREST paper's baseline), with its
search, its builder and ``specnb datastore build rest``. The drafter is :mod:`specnb.drafters.rest`.

The datastore is a token corpus laid out as one array, documents separated by a separator id larger than any
token, plus the suffix array of that array (built with ``pydivsufsort``). Both are stored uncompressed and
memory-mapped:

    <folder>/text.npy   big-endian int32 [N + D]: document tokens, SEPARATOR after each document
    <folder>/sa.npy     int32 (int64 past 2^31 tokens) [N + D]: start of each suffix, in sorted order
    <folder>/meta.json  tokenizer (name, vocab size, fingerprint), corpus and builder parameters, counts, and
                        the checksums of the other files (:mod:`specnb.datastores.manifest`)

A store may be cut into shards of whole documents (format 2, meta ``shards``: the text offsets b_0 = 0 < ... <
b_S = N + D): ``sa[b_s:b_s+1]`` is then the suffix array of ``text[b_s:b_s+1]`` alone, so each shard is sorted
on its own (on a Ray cluster, as tasks of :func:`sort_on_ray`) and searched on its own. A one-shard store
is format 1, the layout every earlier specnb reads.

A build writes a temporary sibling folder and renames it into place when complete; it never replaces a
folder that is not a REST store, and replaces a store only when told to (``--overwrite``).

Search (per draft): take the longest suffix of the context, from ``max_query`` (16) down to ``min_query`` (2)
tokens, that occurs in the datastore; take up to ``max_matches`` (5,000) occurrences in suffix-array order and
the ``length`` (10) tokens after each, cut at the document's end (a match never crosses a separator because
no query contains it); merge them into a token tree of at most ``max_nodes`` (64) nodes
(:func:`~specnb.datastores.retrieval_tree.build_tree`).

The text is stored big-endian so that comparing raw bytes orders suffixes like comparing tokens: the binary
search is ``bisect`` over the suffix array with a bytes key (no Python loop over tokens). Since every
occurrence of a longer query contains one of each shorter suffix, "has a match" is monotone in the query
length, so the longest matching length is itself found by binary search (4 probes for 16..2, one binary search
each), and only its range is then searched in full.

Shards give the same drafts as one suffix array. Within a query's range, suffix-array order sorts the
continuations lexicographically (a document's end after every token) and orders only identical ones by what
follows; so the first ``max_matches`` of the whole range are, as a multiset, the ``max_matches`` smallest of the
shards' first ``max_matches`` each, and sorting those gives the rows one suffix array gives, in its order.
"""

from __future__ import annotations

import bisect
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..atomic import atomic_file, atomic_folder, check_replaceable
from ..paths import artifact_path, safe_name
from .cluster import Cluster, check_plan, die_if_marked, run_tasks
from .corpus import CorpusError, TokenCorpus, TokenizerInfo, build_corpus, check_recorded_tokenizer, corpus_digest
from .manifest import check_files, read_meta, write_meta
from .retrieval_tree import RetrievalTree, build_tree, carry_down

SEPARATOR = np.iinfo(np.int32).max  # after every document; above every token id, never in a query
FORMAT_VERSION = 1  # one suffix array
SHARDED_FORMAT = 2  # one suffix array per shard of documents (meta "shards")
RAY_PLAN_FORMAT = 1  # of a Ray build's plan.json


@dataclass(frozen=True)
class SearchConfig:
    """REST's search parameters (defaults from REST / the CREST paper)."""

    max_query: int = 16  # longest context suffix tried
    min_query: int = 2  # shortest context suffix tried
    max_matches: int = 5000  # occurrences used per search
    length: int = 10  # continuation tokens after each occurrence
    max_nodes: int = 64  # token tree budget

    def __post_init__(self) -> None:
        if not 1 <= self.min_query <= self.max_query:
            raise ValueError(f"need 1 <= min_query <= max_query, got {self.min_query}, {self.max_query}")
        if self.max_matches < 1 or self.length < 1 or self.max_nodes < 1:
            raise ValueError("max_matches, length and max_nodes must be >= 1")


DEFAULT_SEARCH = SearchConfig()


def disk_bytes(path: str | Path) -> int:
    """Bytes on disk of a datastore: a file's size, or the sum over a folder's files (the same measure for
    REST and CREST: *storage* in :mod:`specnb.core.metrics`)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class RestIndex:
    """A suffix-array datastore; see the module docstring for the layout."""

    def __init__(self, text: np.ndarray, sa: np.ndarray, meta: dict[str, Any], path: Path | None = None):
        if text.dtype != np.dtype(">i4") or sa.shape != text.shape:
            raise CorpusError("REST datastore arrays are inconsistent (text must be big-endian int32, sa as long)")
        self.text, self.sa, self.meta, self.path = text, sa, meta, path
        self.bounds = np.asarray(meta.get("shards", [0, text.shape[0]]), dtype=np.int64)  # [S + 1]
        self._bytes = memoryview(np.ascontiguousarray(text).view(np.uint8))
        # What bisect indexes: Python ints, no numpy scalars (memoryview reads only native byte order)
        self._starts = memoryview(np.ascontiguousarray(sa, dtype=sa.dtype.newbyteorder("=")))

    # ------------------------------------------------------------------ build / load

    @classmethod
    def build(cls, corpus: TokenCorpus, path: str | Path | None = None, progress: bool = True,
              overwrite: bool = True, shards: int = 1, cluster: Cluster | None = None) -> RestIndex:
        """Index ``corpus`` in ``shards`` suffix arrays (on Ray with ``cluster``: ``cluster.shard_count`` of them,
        sorted by its workers); with ``path``, write the datastore there atomically and return it memory-mapped.

        An existing REST store at ``path`` is replaced (once the new one is complete) only with ``overwrite``;
        anything else there is never replaced (ExistsError). A Ray build needs ``path``: its finished shards are
        kept in ``<path>.partial`` until the store is whole, and a rerun resumes from them.
        """
        replace = path is not None and check_replaceable(path, is_rest_store, overwrite, "REST datastore")
        start = time.perf_counter()
        text = layout_text(corpus)
        bounds = corpus_shard_bounds(corpus, cluster.shard_count(corpus.num_docs) if cluster else shards)
        meta = {"format": FORMAT_VERSION if bounds.shape[0] == 2 else SHARDED_FORMAT, "kind": "rest",
                "tokenizer": corpus.meta["tokenizer"], "corpus": corpus.meta.get("name"),
                "fraction": corpus.meta.get("fraction", 1.0),
                "builder": {"source": corpus.meta.get("source"), "max_tokens": corpus.meta.get("max_tokens"),
                            "max_docs": corpus.meta.get("max_docs"), "suffix_array": "pydivsufsort"},
                "num_docs": corpus.num_docs, "num_tokens": corpus.num_tokens}
        if bounds.shape[0] > 2:
            meta["shards"] = bounds.tolist()
        if cluster is not None:
            if path is None:
                raise ValueError("a REST build on Ray writes a store: give it a path")
            with atomic_folder(path, replace=replace, keep_partial=True) as tmp:
                sort_on_ray(text, bounds, corpus_digest(corpus), tmp, cluster, progress)
                write_meta(tmp, {**meta, "build_seconds": round(time.perf_counter() - start, 2)})
            return cls.load(path)
        pieces = tqdm(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True), total=bounds.shape[0] - 1,
                      desc="rest index", unit="shard", disable=not progress)
        sa = np.concatenate([sort_shard(text, lo, hi) for lo, hi in pieces])
        meta["build_seconds"] = round(time.perf_counter() - start, 2)
        if path is None:
            return cls(text, sa, meta)
        with atomic_folder(path, replace=replace) as tmp:
            np.save(tmp / "text.npy", text)
            np.save(tmp / "sa.npy", sa)
            write_meta(tmp, meta)
        return cls.load(path)

    @classmethod
    def load(cls, path: str | Path) -> RestIndex:
        """Open a datastore folder (memory-mapped). Raises CorpusError if missing or corrupt."""
        path = Path(path)
        require_store(path, "rest")
        try:
            meta = json.loads((path / "meta.json").read_text())
            if meta.get("kind") != "rest" or meta.get("format") not in (FORMAT_VERSION, SHARDED_FORMAT):
                raise CorpusError(f"{path} is not a REST datastore of format {FORMAT_VERSION} or {SHARDED_FORMAT}; "
                                  "build it again")
            check_files(path, meta)
            text = np.load(path / "text.npy", mmap_mode="r")
            sa = np.load(path / "sa.npy", mmap_mode="r")
        except FileNotFoundError:
            raise CorpusError(f"no REST datastore at {path}; build it with `specnb datastore build rest`") from None
        except CorpusError:
            raise
        except (ValueError, OSError, AttributeError) as exc:
            raise CorpusError(f"REST datastore at {path} is corrupt ({exc}); build it again") from None
        return cls(text, sa, meta, path)

    # ------------------------------------------------------------------ facts

    @property
    def tokenizer(self) -> TokenizerInfo:
        return TokenizerInfo(**self.meta["tokenizer"])

    @property
    def storage_bytes(self) -> int:
        """Bytes of tokens + suffix array, uncompressed (the saved folder's size, less headers and meta)."""
        return int(self.text.nbytes + self.sa.nbytes)

    def __len__(self) -> int:
        return int(self.text.shape[0])

    # ------------------------------------------------------------------ search

    def find(self, query: np.ndarray, shards: list[int] | None = None) -> np.ndarray:
        """int64 [S, 2]: per shard, the suffix-array range [lo, hi) of the suffixes that start with ``query``
        (int [q], q >= 1); only ``shards`` are searched when given (the others' ranges are empty)."""
        needle, key = self._key(query)
        ranges = np.zeros((self.bounds.shape[0] - 1, 2), dtype=np.int64)
        for s in range(ranges.shape[0]) if shards is None else shards:
            first, end = int(self.bounds[s]), int(self.bounds[s + 1])
            lo = bisect.bisect_left(self._starts, needle, lo=first, hi=end, key=key)
            ranges[s] = lo, bisect.bisect_right(self._starts, needle, lo=lo, hi=end, key=key)
        return ranges

    def holding(self, query: np.ndarray, shards: list[int] | None = None) -> list[int]:
        """The shards (of ``shards``, default all) whose text holds ``query``: one binary search each, where
        :meth:`find` makes two."""
        needle, key = self._key(query)
        found = []
        for s in range(self.bounds.shape[0] - 1) if shards is None else shards:
            end = int(self.bounds[s + 1])
            lo = bisect.bisect_left(self._starts, needle, lo=int(self.bounds[s]), hi=end, key=key)
            if lo < end and key(self._starts[lo]) == needle:
                found.append(s)
        return found

    def _key(self, query: np.ndarray) -> tuple[bytes, Callable[[int], bytes]]:
        """``query`` as comparable bytes, and the key giving a suffix's first ``len(query)`` tokens as such."""
        width, data = 4 * query.shape[0], self._bytes
        return np.asarray(query, dtype=">i4").tobytes(), lambda start: data[4 * start:4 * start + width].tobytes()

    def longest_match(self, context: np.ndarray, max_query: int = 16, min_query: int = 2) -> tuple[int, np.ndarray]:
        """(q, ranges): the longest q in [min_query, max_query] whose last-q-token query occurs, and its ranges
        (:meth:`find`). Returns (0, an empty [0, 2]) when even ``min_query`` tokens do not occur."""
        low, high = min_query, min(max_query, context.shape[0])
        best, shards = 0, None  # shards: those that may hold a longer query, the ones holding the longest so far
        while low <= high:  # "occurs" is monotone in q: binary search for the largest q that occurs
            q = (low + high) // 2
            if holding := self.holding(context[-q:], shards):
                best, low, shards = q, q + 1, holding
            else:
                high = q - 1
        return (best, self.find(context[-best:], shards)) if best else (0, np.empty((0, 2), dtype=np.int64))

    def continuations(self, ranges: np.ndarray, q: int, max_matches: int = 5000, length: int = 10) -> np.ndarray:
        """int64 [m, length]: the tokens after the first ``max_matches`` occurrences of a q-token query whose
        ranges (:meth:`find`) are ``ranges``, in suffix-array order (over shards: the order one suffix array
        gives; module docstring); -1 after a document's end. Rows sharing a prefix are contiguous."""
        parts = [self._after(lo, hi, q, max_matches, length) for lo, hi in np.asarray(ranges).tolist() if hi > lo]
        if len(parts) <= 1:
            return parts[0] if parts else np.empty((0, length), dtype=np.int64)
        rows = np.concatenate(parts)
        ended_last = np.where(rows < 0, np.iinfo(np.int64).max, rows)  # a document's end sorts after every token
        return rows[np.lexsort(ended_last.T[::-1])[:max_matches]]

    def _after(self, lo: int, hi: int, q: int, max_matches: int, length: int) -> np.ndarray:
        """The continuations of the first ``max_matches`` suffixes of ``sa[lo:hi]`` (one shard's range): the
        transpose of a C-contiguous [length, m] array, the layout :func:`build_tree` reads."""
        starts = np.asarray(self.sa[lo:min(hi, lo + max_matches)], dtype=np.int64) + q
        index = np.arange(length)[:, None] + starts  # [length, m]
        outside = index >= len(self)
        by_depth = self.text[np.minimum(index, len(self) - 1)].astype(np.int64)
        ended = outside | (by_depth == SEPARATOR)
        carry_down(ended)
        by_depth[ended] = -1
        return by_depth.T

    def search(self, context: np.ndarray, config: SearchConfig = DEFAULT_SEARCH) -> tuple[RetrievalTree, int]:
        """REST's draft for ``context`` (int [L], last token = the root): (tree, matched query length or 0)."""
        q, ranges = self.longest_match(context, config.max_query, config.min_query)
        if q == 0:
            return RetrievalTree.empty(), 0
        rows = self.continuations(ranges, q, config.max_matches, config.length)
        return build_tree(rows, config.max_nodes), q

    def tree_of(self, ngram: np.ndarray, config: SearchConfig = DEFAULT_SEARCH) -> RetrievalTree:
        """The tree for exactly ``ngram`` (no shorter fallback): what CREST stores for that n-gram."""
        return build_tree(self.continuations(self.find(ngram), ngram.shape[0], config.max_matches, config.length),
                          config.max_nodes)


def layout_text(corpus: TokenCorpus) -> np.ndarray:
    """Big-endian int32 [N + D]: the corpus's documents back to back, SEPARATOR after each."""
    lengths = np.diff(corpus.doc_starts)
    text = np.empty(corpus.num_tokens + corpus.num_docs, dtype=">i4")
    # Document i moves right by i slots (the separators before it); separators fill the gaps.
    text[corpus.doc_starts[1:] + np.arange(corpus.num_docs)] = SEPARATOR
    text[np.arange(corpus.num_tokens) + np.repeat(np.arange(corpus.num_docs), lengths)] = corpus.tokens
    return text


def corpus_shard_bounds(corpus: TokenCorpus, count: int) -> np.ndarray:
    """int64 [S + 1]: text offsets cutting the corpus into S <= ``count`` shards of whole documents, of about
    equal tokens (fewer where documents are fewer or long)."""
    if count < 1:
        raise ValueError(f"shards must be >= 1, got {count}")
    doc_starts = np.asarray(corpus.doc_starts, dtype=np.int64)
    targets = np.linspace(0, corpus.num_tokens, count + 1)[1:-1]
    after = np.searchsorted(doc_starts, targets)  # the first document starting at or after each target
    nearer = np.where(doc_starts[after] - targets <= targets - doc_starts[np.maximum(after - 1, 0)], after, after - 1)
    docs = np.unique(np.concatenate([[0], nearer, [corpus.num_docs]]))
    return doc_starts[docs] + docs  # document d starts at its tokens' offset plus the d separators before it


def sort_shard(text: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The suffix array of ``text[lo:hi]`` as offsets into ``text``: int32, int64 past 2^31 tokens."""
    from pydivsufsort import divsufsort

    sa = divsufsort(np.asarray(text[lo:hi], dtype=np.int32))
    dtype = np.dtype(np.int64) if text.shape[0] >= 2**31 else sa.dtype
    return sa.astype(dtype, copy=False) + dtype.type(lo)


# ------------------------------------------------------------------------------------------- on Ray


@dataclass(frozen=True)
class _Sort:
    work: str
    shard: int
    lo: int
    hi: int


def _sort(job: _Sort) -> int:
    """Sort one shard's suffixes (a Ray task); returns the shard."""
    work = Path(job.work)
    die_if_marked(work, f"sort-{job.shard}")
    sa = sort_shard(np.load(work / "text.npy", mmap_mode="r"), job.lo, job.hi)
    with atomic_file(_sorted(work, job.shard)) as tmp:
        np.save(tmp, sa)
    return job.shard


def _sorted(work: Path, shard: int) -> Path:
    return work / "shards" / f"{shard:05d}.npy"


def sort_on_ray(text: np.ndarray, bounds: np.ndarray, corpus_sha256: str, work: Path, cluster: Cluster,
                progress: bool = True) -> None:
    """Write ``work/text.npy`` (``text``) and ``work/sa.npy``, the suffix arrays of the shards ``bounds`` (int64
    [S + 1] text offsets) end to end, sorting the shards not yet on disk as Ray tasks."""
    record = {"format": RAY_PLAN_FORMAT, "params": {"kind": "rest", "shards": bounds.tolist()},
              "corpus_sha256": corpus_sha256}
    if check_plan(work, record) or not (work / "text.npy").exists():
        with atomic_file(work / "text.npy") as tmp:
            np.save(tmp, text)
    count = bounds.shape[0] - 1
    todo = [_Sort(str(work), s, int(bounds[s]), int(bounds[s + 1])) for s in range(count)
            if not _sorted(work, s).exists()]
    if progress:
        print(f"{work}: {count - len(todo)} of {count} shards sorted, {len(todo)} to run on Ray")
    run_tasks(cluster, _sort, todo, desc="suffix arrays", progress=progress)
    first = np.load(_sorted(work, 0), mmap_mode="r")
    sa = np.lib.format.open_memmap(work / "sa.npy", mode="w+", dtype=first.dtype, shape=text.shape)
    for s in range(count):
        sa[bounds[s]:bounds[s + 1]] = np.load(_sorted(work, s), mmap_mode="r")
    sa.flush()
    del sa, first
    shutil.rmtree(work / "shards")  # ours: the sorted shards
    (work / "plan.json").unlink()


def default_store(model_name: str, kind: str = "rest", source: str = "code") -> Path:
    """Where ``specnb datastore build rest|crest`` puts a store for (source, model) by default: a folder for
    REST, a ``.sqlite`` file for CREST."""
    suffix = ".sqlite" if kind == "crest" else ""
    return artifact_path("datastores", f"{kind}-{safe_name(source)}-{safe_name(model_name)}{suffix}")


def store_path(model_name: str, kind: str, path: str | Path | None) -> Path:
    """The REST (``kind="rest"``) or CREST (``"crest"``) store a method opens: ``path``, else the model's
    default code store."""
    return Path(path) if path else default_store(model_name, kind)


def require_store(path: Path, kind: str) -> None:
    """CorpusError naming the build command where no REST folder / CREST file is at ``path`` (an existence
    check only: the loaders check contents)."""
    if not ((path / "meta.json").is_file() if kind == "rest" else path.is_file()):
        name = "REST datastore" if kind == "rest" else "CREST store"
        raise CorpusError(f"no {name} at {path}; build it with `specnb datastore build {kind}`")


def check_built_for(path: Path, model: str) -> None:
    """Raise CorpusError (one line) unless the REST folder at ``path`` opens (:meth:`RestIndex.load`: memory maps,
    its files' sizes and sampled hashes) and records the tokenizer of the model named ``model`` (its tokenizer
    only is loaded): run before the model loads, so that a missing, damaged or foreign store is refused at
    once."""
    check_recorded_tokenizer(RestIndex.load(path).meta, model, f"REST datastore {path}")


def is_rest_store(path: Path) -> bool:
    """Whether ``path`` is a folder holding a REST store (complete or damaged: it is ours to replace)."""
    meta = read_meta(path)
    return meta is not None and meta.get("kind") == "rest"


def open_rest(target: Any, path: str | Path | None) -> RestIndex:
    """Load a REST datastore (default: the code store of ``target``) and check it matches its tokenizer."""
    path = store_path(target.name, "rest", path)
    index = RestIndex.load(path)
    index.tokenizer.check(target, f"REST datastore {path}")
    return index




def source_tag(source: str) -> str:
    """Short name of a corpus source for default store names."""
    return source if source in ("code", "chat") else Path(source).stem


def ensure_rest(source: str, model: str, max_tokens: int | None = None, out: str | Path | None = None,
                overwrite: bool = False, shards: int = 1, cluster: Cluster | None = None) -> RestIndex:
    """The REST store for (source, model): loaded if it exists at ``out`` (default path) and not
    ``overwrite``, else built (``shards`` and ``cluster`` as in :meth:`RestIndex.build`). A loaded store must
    match ``model``'s tokenizer (CorpusError otherwise)."""
    path = Path(out) if out else default_store(model, "rest", source_tag(source))
    if path.exists() and not overwrite:
        index = RestIndex.load(path)
        index.tokenizer.check(model, f"REST datastore {path}")
        return index
    check_replaceable(path, is_rest_store, overwrite, "REST datastore")  # before the corpus is tokenised
    return RestIndex.build(build_corpus(source, model, max_tokens=max_tokens), path, overwrite=overwrite,
                           shards=shards, cluster=cluster)
