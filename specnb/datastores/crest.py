"""CREST's datastore: REST compacted into a dictionary n-gram -> precomputed token tree (CREST paper, §3.3-4.2),
with its builder and ``specnb datastore build crest``. The drafter is :mod:`specnb.drafters.crest`.

Build: count every n-gram (n = 1..m, never across a document boundary) with the REST suffix array (an n-gram's
occurrences are one suffix-array range; ranges are cut where the LCP drops below n), shard by shard for a
sharded REST store, and sum the counts of each n-gram over shards; keep the ``t`` most frequent n-grams of
each n (or of a single n; ties in token order), compute each one's REST tree with exactly that n-gram as the
query, and store them in SQLite:

    CREATE TABLE trees (ngram BLOB PRIMARY KEY, tree BLOB NOT NULL) WITHOUT ROWID
        ngram: the n token ids as big-endian int32 bytes (n = len / 4)
        tree:  zlib(tokens as little-endian int32 [k] + parent index + 1 as uint8 [k])   (k <= max_nodes)
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)   tokenizer, m, t, REST parameters, counts, checksums

Lookups go to the file through SQLite's B-tree (the store is never loaded whole); the drafter asks for all
suffixes of the context of stored lengths in one query and uses the longest one found. The build writes to a
temporary file and renames it, so an interrupted build leaves no store under the final name; it never replaces
a file that is not a CREST store. The meta records ``trees_sha256`` (every row, in key order) and ``sample``
(the hash of 16 evenly spaced rows): opening a store checks the sample and SQLite's page structure
(``PRAGMA quick_check``: a damaged page is refused at once, not met in the middle of decoding), ``verify()``
every tree's bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..atomic import atomic_file, check_replaceable
from .corpus import CorpusError, TokenizerInfo, check_recorded_tokenizer
from .rest import (
    DEFAULT_SEARCH,
    SEPARATOR,
    RestIndex,
    SearchConfig,
    disk_bytes,
    require_store,
    store_path,
)
from .retrieval_tree import RetrievalTree, build_tree

FORMAT_VERSION = 1


# ------------------------------------------------------------------------------------ n-gram counting


@dataclass(frozen=True)
class NgramTable:
    """One shard's distinct n-grams of one n, in key order.

    keys: void [g] of 4n bytes, the tokens as big-endian int32 (the store's key; byte order = token order);
    counts: int64 [g] occurrences; first: int64 [g] suffix-array row of the first occurrence (the occurrences
    are ``sa[first:first + count]``).
    """

    keys: np.ndarray
    counts: np.ndarray
    first: np.ndarray


class ShardCounter:
    """The distinct n-grams of one suffix-array shard of a REST store, from the shard's LCP array."""

    def __init__(self, index: RestIndex, shard: int = 0):
        from pydivsufsort import kasai

        lo, hi = (int(b) for b in index.bounds[shard:shard + 2])
        self.offset = lo
        self.text = np.asarray(index.text[lo:hi], dtype=np.int32)
        self.sa = np.array(index.sa[lo:hi])  # kasai needs a writable array
        self.sa -= self.sa.dtype.type(lo)
        self.lcp = kasai(self.text, self.sa)  # lcp[i] = common prefix of suffixes sa[i] and sa[i + 1]
        # Tokens before the next separator, for each suffix in suffix-array order.
        separators = np.flatnonzero(self.text == SEPARATOR)
        self.room = separators[np.searchsorted(separators, self.sa)] - self.sa

    def groups(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(first suffix-array row in the shard, count) of every distinct n-gram inside one document."""
        cut = np.flatnonzero(self.lcp[:-1] < n) + 1  # row i starts a new n-gram when lcp(i-1, i) < n
        starts = np.concatenate([[0], cut])
        sizes = np.diff(np.concatenate([starts, [self.lcp.shape[0]]]))
        valid = self.room[starts] >= n
        return starts[valid], sizes[valid]

    def table(self, n: int) -> NgramTable:
        """This shard's n-grams in suffix-array order, which is key order."""
        starts, sizes = self.groups(n)
        at = self.sa[starts].astype(np.int64)[:, None] + np.arange(n)
        keys = np.ascontiguousarray(self.text[at], dtype=">i4").view(f"V{4 * n}").ravel()
        return NgramTable(keys, sizes.astype(np.int64), starts.astype(np.int64) + self.offset)


def merge_tables(tables: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(keys, counts): the distinct n-grams of all (keys, counts) ``tables`` (each in key order) in key order, and
    their summed counts."""
    if len(tables) == 1:
        return tables[0]
    keys = np.concatenate([keys for keys, _ in tables])
    counts = np.concatenate([counts for _, counts in tables])
    if keys.shape[0] == 0:
        return keys, counts
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return keys[starts], np.add.reduceat(counts, starts)


def most_frequent(keys: np.ndarray, counts: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``t`` most frequent of ``keys`` (in key order) and their counts; ties in key order."""
    order = np.argsort(-counts, kind="stable")[:t]
    return keys[order], counts[order]


def ranges_of(keys: np.ndarray, tables: Sequence[NgramTable]) -> np.ndarray:
    """int64 [len(keys), S, 2]: each key's suffix-array range in each shard's table (empty where it is not)."""
    ranges = np.zeros((keys.shape[0], len(tables), 2), dtype=np.int64)
    for s, table in enumerate(tables):
        if table.keys.shape[0] == 0:
            continue
        at = np.minimum(np.searchsorted(table.keys, keys), table.keys.shape[0] - 1)
        hit = table.keys[at] == keys
        ranges[hit, s, 0] = table.first[at[hit]]
        ranges[hit, s, 1] = table.first[at[hit]] + table.counts[at[hit]]
    return ranges


class NgramCounter:
    """Distinct n-grams of a REST datastore and their counts: counted per suffix-array shard, then merged."""

    def __init__(self, index: RestIndex):
        self.shards = [ShardCounter(index, s) for s in range(index.bounds.shape[0] - 1)]

    def tables(self, n: int) -> list[NgramTable]:
        return [shard.table(n) for shard in self.shards]

    def counts(self, n: int) -> np.ndarray:
        """int64 [distinct n-grams]: occurrence counts, most frequent first (Table 1 is its length)."""
        return -np.sort(-merge_tables([(table.keys, table.counts) for table in self.tables(n)])[1])

    def top(self, n: int, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys, counts, ranges) of the ``t`` most frequent n-grams, ties in key order; ranges as
        :func:`ranges_of`, what :meth:`RestIndex.continuations` takes."""
        tables = self.tables(n)
        keys, counts = most_frequent(*merge_tables([(table.keys, table.counts) for table in tables]), t)
        return keys, counts, ranges_of(keys, tables)


# ----------------------------------------------------------------------------------------- encoding


def encode_key(ngram: np.ndarray) -> bytes:
    return np.asarray(ngram, dtype=">i4").tobytes()


def encode_tree(tree: RetrievalTree) -> bytes:
    if tree.num_nodes > 255:
        raise ValueError("CREST trees hold at most 255 nodes (parents are stored as uint8)")
    raw = tree.tokens.astype("<i4").tobytes() + (tree.parents.astype(np.int16) + 1).astype(np.uint8).tobytes()
    return zlib.compress(raw, 9)


def decode_tree(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [k], parents int64 [k] with -1 = root) of an encoded tree."""
    raw = zlib.decompress(blob)
    k = len(raw) // 5
    tokens = np.frombuffer(raw, dtype="<i4", count=k)
    parents = np.frombuffer(raw, dtype=np.uint8, offset=4 * k).astype(np.int64) - 1
    return tokens, parents


@dataclass
class NgramTrees:
    """Precomputed (key, encoded tree, nodes) for the top n-grams of one n, most frequent first, so that stores
    of any ``t`` up to the computed one are written without recomputing trees."""

    n: int
    keys: list[bytes]
    blobs: list[bytes]
    nodes: np.ndarray  # int [t]: tree size of each n-gram
    counts: np.ndarray  # int [t]: occurrences of each n-gram


def ngram_trees(index: RestIndex, counter: NgramCounter, n: int, t: int, config: SearchConfig = DEFAULT_SEARCH,
                progress: bool = True) -> NgramTrees:
    """REST's tree for each of the ``t`` most frequent n-grams (query = exactly the n-gram)."""
    keys, counts, ranges = counter.top(n, t)
    return trees_of(index, n, keys, counts, ranges, config, progress)


def trees_of(index: RestIndex, n: int, keys: np.ndarray, counts: np.ndarray, ranges: np.ndarray,
             config: SearchConfig = DEFAULT_SEARCH, progress: bool = True) -> NgramTrees:
    """The encoded REST tree of each n-gram ``keys[i]`` (void, 4n bytes), whose suffix-array ranges are
    ``ranges[i]`` (int64 [S, 2])."""
    blobs, nodes = [], np.zeros(keys.shape[0], dtype=np.int64)
    for i, found in enumerate(tqdm(ranges, desc=f"trees n={n}", disable=not progress, mininterval=2)):
        tree = build_tree(index.continuations(found, n, config.max_matches, config.length), config.max_nodes)
        blobs.append(encode_tree(tree))
        nodes[i] = tree.num_nodes
    return NgramTrees(n, [key.tobytes() for key in keys], blobs, nodes, counts)


# -------------------------------------------------------------------------------------------- store


def write_store(path: str | Path, tables: Sequence[NgramTrees], t: int | Sequence[int], meta: dict[str, Any],
                overwrite: bool = True) -> Path:
    """Write the first ``t`` entries of each table (``t`` per table or one for all) to SQLite at ``path``,
    atomically (temporary file + rename). An existing CREST store is replaced only with ``overwrite``; any
    other file there never (ExistsError)."""
    path = Path(path)
    check_replaceable(path, is_crest_store, overwrite, "CREST store")
    ts = [t] * len(tables) if isinstance(t, int) else list(t)
    entries = sorted((k, b) for table, tt in zip(tables, ts, strict=True)
                     for k, b in zip(table.keys[:tt], table.blobs[:tt], strict=True))
    with atomic_file(path) as tmp:
        db = sqlite3.connect(tmp)
        try:
            db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;"
                             "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                             "CREATE TABLE trees (ngram BLOB PRIMARY KEY, tree BLOB NOT NULL) WITHOUT ROWID;")
            db.executemany("INSERT INTO trees VALUES (?, ?)", entries)  # sorted keys: a compact B-tree
            full = {**meta, "format": FORMAT_VERSION, "kind": "crest", "ns": [table.n for table in tables],
                    "t": ts, "num_entries": len(entries), "trees_sha256": _rows_hash(entries),
                    "sample": _sample(entries)}
            db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in full.items()])
            db.commit()
        finally:
            db.close()
    return path


def _rows_hash(rows: Sequence[tuple[bytes, bytes]]) -> str:
    """sha256 over (key, tree) rows in key order."""
    digest = hashlib.sha256()
    for key, blob in rows:
        digest.update(len(key).to_bytes(4, "little") + key + len(blob).to_bytes(4, "little") + blob)
    return digest.hexdigest()


def _sample(entries: Sequence[tuple[bytes, bytes]], count: int = 16) -> dict[str, str]:
    """{key hex: sha256 of its tree} for ``count`` evenly spaced entries (the open-time check)."""
    picks = sorted({i * (len(entries) - 1) // max(1, count - 1) for i in range(count)}) if entries else []
    return {entries[i][0].hex(): hashlib.sha256(entries[i][1]).hexdigest() for i in picks}


def is_crest_store(path: Path) -> bool:
    """Whether ``path`` is a file holding a CREST store's meta (it is ours to replace)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'kind'").fetchone()
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return False
    return row is not None and json.loads(row[0]) == "crest"


def check_ns(ns: Sequence[int], config: SearchConfig = DEFAULT_SEARCH) -> None:
    """ValueError unless every n of a store's n-grams lies in 1..``config.max_query``: its keys are REST queries, and
    a search never tries a longer suffix."""
    if not ns or min(ns) < 1 or max(ns) > config.max_query:
        raise ValueError(f"CREST n-grams need 1 <= n <= {config.max_query} (the longest suffix a REST search tries), "
                         f"got n in {list(ns)}")


def build_crest(index: RestIndex, path: str | Path, ns: Sequence[int] = (1, 2, 3, 4, 5), t: int = 10_000,
                config: SearchConfig = DEFAULT_SEARCH, progress: bool = True, overwrite: bool = True) -> CrestStore:
    """Build a CREST store with the top ``t`` n-grams for every n in ``ns`` (one n = the single-n variant), in this
    process (on Ray: :func:`specnb.datastores.crest_build.build_crest_on_ray`); ``overwrite`` as in
    :func:`write_store` (checked before the trees are computed); ``ns`` as :func:`check_ns` allows."""
    check_ns(ns, config)
    check_replaceable(path, is_crest_store, overwrite, "CREST store")
    start = time.perf_counter()
    counter = NgramCounter(index)
    tables = [ngram_trees(index, counter, n, t, config, progress) for n in ns]
    write_store(path, tables, t, store_meta(index, config, time.perf_counter() - start), overwrite)
    return CrestStore(path)


def store_meta(index: RestIndex, config: SearchConfig, seconds: float) -> dict[str, Any]:
    """What a CREST store records about how it was built."""
    return {"tokenizer": index.meta["tokenizer"], "rest_corpus": index.meta.get("corpus"),
            "rest_path": str(index.path) if index.path else None, "rest_builder": index.meta.get("builder"),
            "rest_tokens": index.meta["num_tokens"], "max_matches": config.max_matches, "length": config.length,
            "max_nodes": config.max_nodes, "codec": "zlib", "build_seconds": round(seconds, 2)}


class CrestStore:
    """A read-only CREST store on disk. ``lookup(context)`` returns the tree of its longest stored suffix."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        require_store(self.path, "crest")
        try:
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            page_size, pages = (self.db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count"))
            if page_size * pages != self.path.stat().st_size:
                raise sqlite3.DatabaseError(f"file holds {self.path.stat().st_size} bytes, header says "
                                            f"{page_size * pages}")
            self.meta = _meta_table(self.db)
            self.db.execute("SELECT ngram, tree FROM trees LIMIT 1").fetchall()
            # every page's structure (SQLite's quick_check, one read of the file): a damaged page would
            # otherwise surface as an error in the middle of decoding, or as lookups that find nothing
            problems = [row[0] for row in self.db.execute("PRAGMA quick_check(1)")]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError(" ".join("; ".join(map(str, problems)).split()))  # one line
        except (sqlite3.DatabaseError, json.JSONDecodeError) as exc:
            raise CorpusError(f"{self.path} is not a valid CREST store (corrupt or not SQLite: {exc})") from None
        if self.meta.get("kind") != "crest" or self.meta.get("format") != FORMAT_VERSION:
            raise CorpusError(f"{self.path} is not a CREST store of format {FORMAT_VERSION}; build it again")
        self.ns = sorted(self.meta["ns"], reverse=True)  # longest first
        for key, digest in self.meta.get("sample", {}).items():
            rows = self._query("SELECT tree FROM trees WHERE ngram = ?", (bytes.fromhex(key),))
            if not rows or hashlib.sha256(rows[0][0]).hexdigest() != digest:
                raise CorpusError(f"{self.path} does not match its recorded checksums: damaged; build it again")

    def verify(self) -> None:
        """Check every stored tree against the recorded ``trees_sha256`` (CorpusError if it differs)."""
        if "trees_sha256" not in self.meta:
            raise CorpusError(f"{self.path} records no checksums (built by an older specnb); build it again")
        rows = self._query("SELECT ngram, tree FROM trees ORDER BY ngram", ())
        if len(rows) != len(self) or _rows_hash(rows) != self.meta["trees_sha256"]:
            raise CorpusError(f"{self.path} does not match its recorded checksums: damaged; build it again")

    @property
    def tokenizer(self) -> TokenizerInfo:
        return TokenizerInfo(**self.meta["tokenizer"])

    @property
    def storage_bytes(self) -> int:
        return disk_bytes(self.path)

    def __len__(self) -> int:
        return int(self.meta["num_entries"])

    def get(self, ngram: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens, parents) stored for exactly ``ngram``, or None."""
        rows = self._query("SELECT tree FROM trees WHERE ngram = ?", (encode_key(np.asarray(ngram)),))
        return None if not rows else decode_tree(rows[0][0])

    def lookup(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(tokens, parents, n) for the longest stored suffix of ``context`` (int [L]); n = 0 if none."""
        raw = np.asarray(context[-self.ns[0]:], dtype=">i4").tobytes()
        keys = [raw[len(raw) - 4 * n:] for n in self.ns if 4 * n <= len(raw)]
        if not keys:
            return np.empty(0, np.int32), np.empty(0, np.int64), 0
        marks = ",".join("?" * len(keys))
        rows = self._query(f"SELECT ngram, tree FROM trees WHERE ngram IN ({marks})", keys)
        if not rows:
            return np.empty(0, np.int32), np.empty(0, np.int64), 0
        key, blob = max(rows, key=lambda row: len(row[0]))
        tokens, parents = decode_tree(blob)
        return tokens, parents, len(key) // 4

    def _query(self, sql: str, parameters: Sequence[Any]) -> list[tuple]:
        """The rows of one query; a page SQLite finds damaged is a CorpusError naming the store (one line)."""
        try:
            return self.db.execute(sql, parameters).fetchall()
        except sqlite3.DatabaseError as exc:
            raise CorpusError(f"{self.path} is damaged ({exc}); build it again") from None

    def close(self) -> None:
        self.db.close()


def _meta_table(db: sqlite3.Connection) -> dict[str, Any]:
    """A CREST store's ``meta`` table: {key: JSON value}."""
    return {key: json.loads(value) for key, value in db.execute("SELECT key, value FROM meta")}


def check_built_for(path: Path, model: str) -> None:
    """Raise CorpusError (one line) unless the CREST file at ``path`` opens (:class:`CrestStore`'s checks: SQLite's
    page structure, the sampled trees) and records the tokenizer of the model named ``model`` (its tokenizer only
    is loaded): run before the model loads, so that a missing, damaged or foreign store is refused at once."""
    with contextlib.closing(CrestStore(path)) as store:
        check_recorded_tokenizer(store.meta, model, f"CREST store {path}")


def open_crest(target: Any, path: str | Path | None) -> CrestStore:
    """Load a CREST store (default: the code store of ``target``) and check it matches its tokenizer."""
    path = store_path(target.name, "crest", path)
    store = CrestStore(path)
    store.tokenizer.check(target, f"CREST store {path}")
    return store
