"""CREST's datastore: REST compacted into a dictionary n-gram -> precomputed token tree (CREST paper, §3.3-4.2),
with its builder and ``specnb datastore build crest``. The drafter is :mod:`specnb.drafters.crest`.

Build: count every n-gram (n = 1..m, never across a document boundary) with the REST suffix array (an n-gram's
occurrences are one suffix-array range; ranges are cut where the LCP drops below n), keep the ``t`` most
frequent n-grams of each n (or of a single n), compute each one's REST tree with exactly that n-gram as the
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

import argparse
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
from .corpus import CorpusError, TokenizerInfo
from .rest import (
    DEFAULT_SEARCH,
    SEPARATOR,
    RestIndex,
    SearchConfig,
    add_source_arguments,
    default_store,
    disk_bytes,
    ensure_rest,
    require_store,
    source_tag,
    store_path,
)
from .retrieval_tree import RetrievalTree, build_tree

FORMAT_VERSION = 1


# ------------------------------------------------------------------------------------ n-gram counting


class NgramCounter:
    """Distinct n-grams of a REST datastore and their counts, from its suffix array and LCP array."""

    def __init__(self, index: RestIndex):
        from pydivsufsort import kasai

        self.index = index
        text = np.asarray(index.text, dtype=np.int32)
        sa = np.array(index.sa)  # kasai needs a writable array
        self.lcp = kasai(text, sa)  # lcp[i] = common prefix of suffixes sa[i] and sa[i + 1]
        # Tokens before the next separator, for each suffix in suffix-array order.
        separators = np.flatnonzero(text == SEPARATOR)
        self.room = separators[np.searchsorted(separators, sa)] - sa

    def groups(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(first suffix-array row, count) of every distinct n-gram that lies inside one document."""
        cut = np.flatnonzero(self.lcp[:-1] < n) + 1  # row i starts a new n-gram when lcp(i-1, i) < n
        starts = np.concatenate([[0], cut])
        sizes = np.diff(np.concatenate([starts, [self.lcp.shape[0]]]))
        valid = self.room[starts] >= n
        return starts[valid], sizes[valid]

    def counts(self, n: int) -> np.ndarray:
        """int64 [distinct n-grams]: occurrence counts, most frequent first (Table 1 is its length)."""
        return -np.sort(-self.groups(n)[1])

    def top(self, n: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """(first row, count) of the ``t`` most frequent n-grams, ties in suffix-array (lexicographic) order."""
        starts, sizes = self.groups(n)
        order = np.lexsort((starts, -sizes))[:t]
        return starts[order], sizes[order]


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
    starts, sizes = counter.top(n, t)
    sa = index.sa
    keys, blobs, nodes = [], [], np.zeros(starts.shape[0], dtype=np.int64)
    for i, (start, size) in enumerate(tqdm(zip(starts.tolist(), sizes.tolist(), strict=True), total=starts.shape[0],
                                           desc=f"trees n={n}", disable=not progress, mininterval=2)):
        position = int(sa[start])
        tree = build_tree(index.continuations(start, start + size, n, config.max_matches, config.length),
                          config.max_nodes)
        keys.append(index.text[position:position + n].tobytes())  # text is big-endian int32: already the key
        blobs.append(encode_tree(tree))
        nodes[i] = tree.num_nodes
    return NgramTrees(n, keys, blobs, nodes, sizes)


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


def build_crest(index: RestIndex, path: str | Path, ns: Sequence[int] = (1, 2, 3, 4, 5), t: int = 10_000,
                config: SearchConfig = DEFAULT_SEARCH, progress: bool = True, overwrite: bool = True) -> CrestStore:
    """Build a CREST store with the top ``t`` n-grams for every n in ``ns`` (one n = the single-n variant);
    ``overwrite`` as in :func:`write_store` (checked before the trees are computed)."""
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
            self.meta = {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}
            self.db.execute("SELECT ngram, tree FROM trees LIMIT 1").fetchall()
            # every page's structure (SQLite's quick_check: ~10 ms for a 7 MB store): a damaged page would
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


def open_crest(target: Any, path: str | Path | None) -> CrestStore:
    """Load a CREST store (default: the code store of ``target``) and check it matches its tokenizer."""
    path = store_path(target.name, "crest", path)
    store = CrestStore(path)
    store.tokenizer.check(target, f"CREST store {path}")
    return store


# ---------------------------------------------------------------------------------------------- CLI


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``specnb datastore build crest [code|chat|PATH] --model NAME [--m 5 | --single-n N] [--t T]`` (hangs under
    ``datastore build``). Uses (or first builds) the REST store of the same corpus."""
    parser = subparsers.add_parser("crest", help="CREST store: top-t n-grams -> precomputed REST trees, SQLite")
    add_source_arguments(parser)
    parser.add_argument("--rest", default=None, help="REST store to compute the trees from (default: the "
                        "default REST store of this corpus and model, built if missing); must match --model's "
                        "tokenizer")
    parser.add_argument("--m", type=int, default=5, help="keep n-grams of n = 1..m")
    parser.add_argument("--single-n", type=int, default=None, help="keep only n-grams of this n")
    parser.add_argument("--t", type=int, default=10_000, help="n-grams kept per n (the most frequent)")
    parser.set_defaults(func=_cli_build)
    return parser


def _cli_build(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out else default_store(args.model, "crest", source_tag(args.source))
    check_replaceable(out, is_crest_store, args.overwrite, "CREST store")  # before any work
    if args.m < 1 or args.t < 1 or (args.single_n is not None and args.single_n < 1):
        raise ValueError(f"--m, --t and --single-n must be >= 1, got {args.m}, {args.t}, {args.single_n}")
    index = ensure_rest(args.source, args.model, args.max_tokens, args.rest)
    ns = [args.single_n] if args.single_n else list(range(1, args.m + 1))
    store = build_crest(index, out, ns=ns, t=args.t, overwrite=True)
    print(f"CREST {out}: {len(store):,} n-grams (n in {ns}, t={args.t}), {store.storage_bytes:,} bytes "
          f"(REST: {index.storage_bytes:,})")
    return 0
