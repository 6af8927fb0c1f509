"""DReSD's datastore (Gritta et al., 2025): the target's hidden state at every position of a token corpus, turned
into a 64-dim unit key (z-score -> PCA -> L2, :class:`specnb.datastores.embed.Projection`) and indexed with
hnswlib (or FAISS IVF-PQ past memory); each key's value is the next tokens of its corpus position. Its builder
and ``specnb datastore build dense`` are here; the drafter is :mod:`specnb.drafters.dense`.

A dense datastore is a folder:

    meta.json            written last: what built it (model, tokenizer, corpus, parameters, timings, sizes)
    values.i32.npy       int32 [n, 1 + N]   (see :mod:`specnb.datastores.embed`)
    keys.f32.npy         float32 [n, dims]  the transformed keys (exact search, MRR)
    projection.npz       the fitted z-score / PCA transform
    index.hnsw | index.ivfpq   the inner-product index over the keys (hnswlib, or FAISS IVF-PQ: meta's index.kind)
    hidden.f16.npy, positions.i64.npy, corpus_tokens.i32.npy, doc_starts.i64.npy   analysis only

It is built in ``<out>.partial`` and renamed into place at the end, so an interrupted build never loads
(and rerunning the build resumes the hidden-state extraction: batch by batch in one process, shard by shard on
Ray, :mod:`specnb.datastores.shards`). meta.json records every other file's checksums,
checked (sizes and a sampled hash) whenever the store is opened. A build never replaces a folder that is not
a dense store, and replaces a store only with ``overwrite``, once the new one is complete.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_folder, check_replaceable
from ..model.models import LoadedModel
from ..paths import artifact_path, safe_name
from .ann import IVFPQ_FROM, AnnIndex, IndexParams, IvfPqIndex, IvfPqParams, check_at_least
from .cluster import Cluster
from .corpus import CorpusError, TokenCorpus, TokenizerInfo, build_corpus, check_recorded_tokenizer, load_corpus
from .embed import N_NEXT, Projection, extract, fit_projection, row_layout, sample_rows, started
from .ivfpq_shards import ivfpq_on_ray
from .manifest import check_files, read_meta, write_meta
from .shards import extract_on_ray

FORMAT_VERSION = 1
RUNTIME_FILES = ("meta.json", "values.i32.npy", "projection.npz")  # and the index file
INDEX_FILES = {"hnsw": "index.hnsw", "ivfpq": "index.ivfpq"}


INDEX_KINDS = ("auto", "hnsw", "ivfpq")


@dataclass
class BuildConfig:
    """Parameters of a dense datastore build (recorded in its meta.json). ValueError (one line, naming the
    ``specnb datastore build dense`` flag) for parameters no build can use, when constructed: the command builds
    its config before the model loads. What depends on the model (``dims`` at most its hidden size) is checked
    by :func:`build_datastore` before the extraction."""

    n_next: int = N_NEXT
    dims: int = 64
    n_components: int = 256
    sample_size: int = 1_000_000
    znorm: bool = True
    l2: bool = True
    seq_len: int = 512
    overlap: int = 64
    batch_tokens: int = 4096
    index: IndexParams = field(default_factory=IndexParams)
    index_kind: str = "auto"  # hnsw | ivfpq | auto (IVF-PQ from ann.IVFPQ_FROM keys)
    ivfpq: IvfPqParams = field(default_factory=IvfPqParams)
    keep_hidden: bool = True  # keep hidden.f16.npy for analyses (PCA ablations); not needed to draft

    def __post_init__(self) -> None:
        check_at_least(1, {"--n-next": self.n_next, "--dims": self.dims, "--seq-len": self.seq_len})
        check_at_least(2, {"--sample": self.sample_size})
        check_at_least(0, {"overlap": self.overlap})
        if self.sample_size < self.n_components:
            raise ValueError(f"--sample ({self.sample_size}) must be >= --components ({self.n_components}): PCA "
                             "fits at most as many components as sample vectors")
        if self.n_components < self.dims:
            raise ValueError(f"--dims ({self.dims}) must be <= --components ({self.n_components}), the PCA "
                             "components fitted")
        if self.batch_tokens < self.seq_len + self.overlap:
            raise ValueError(f"--batch-tokens ({self.batch_tokens}) must be >= --seq-len + overlap ({self.seq_len} "
                             f"+ {self.overlap}): a window and its context must fit one batch")
        if self.index_kind not in INDEX_KINDS:
            raise ValueError(f"--index must be one of {', '.join(INDEX_KINDS)}, got {self.index_kind!r}")
        if self.index_kind == "ivfpq" and self.dims % self.ivfpq.m:
            raise ValueError(f"--pq-m ({self.ivfpq.m}) must divide --dims ({self.dims}) for an IVF-PQ index")


@dataclass
class DenseDatastore:
    """A loaded dense datastore (arrays memory-mapped; see the module docstring for the files)."""

    path: Path
    meta: dict[str, Any]
    values: np.ndarray
    keys: np.ndarray
    projection: Projection
    index: AnnIndex | IvfPqIndex

    @property
    def rows(self) -> int:
        return int(self.values.shape[0])

    @property
    def n_next(self) -> int:
        return int(self.values.shape[1] - 1)

    @property
    def pad_id(self) -> int:
        return int(self.meta["extract"]["pad_id"])

    def hidden(self) -> np.ndarray:
        """float16 [n, d] memory map of the raw hidden states (if the build kept them)."""
        return self._array("hidden.f16.npy")

    def positions(self) -> np.ndarray:
        return self._array("positions.i64.npy")

    def corpus_tokens(self) -> np.ndarray:
        return self._array("corpus_tokens.i32.npy")

    def doc_starts(self) -> np.ndarray:
        return self._array("doc_starts.i64.npy")

    def _array(self, name: str) -> np.ndarray:
        if not (self.path / name).exists():
            raise CorpusError(f"{self.path} has no {name} (built with keep_hidden=False?)")
        return np.load(self.path / name, mmap_mode="r")

    def storage_bytes(self) -> int:
        """Bytes on disk of what drafting needs (values, projection, index, meta)."""
        files = (*RUNTIME_FILES, INDEX_FILES[index_kind(self.meta)])
        return sum((self.path / name).stat().st_size for name in files)

    def check(self, target: LoadedModel) -> None:
        """Raise CorpusError unless ``target`` is the model (and tokenizer) the hidden states came from."""
        TokenizerInfo(**self.meta["tokenizer"]).check(target, f"dense datastore {self.path}")
        model = self.meta["model"]
        hidden_size = target.config.hidden_size
        if model["name"] != target.name or model["hidden_size"] != hidden_size:
            raise CorpusError(f"dense datastore {self.path} holds hidden states of model {model['name']!r} "
                              f"(d={model['hidden_size']}), not of {target.name!r} (d={hidden_size}); "
                              f"rebuild it with --model {target.name}")


def require_store(path: Path) -> None:
    """CorpusError naming the build command where no dense datastore is at ``path`` (existence only)."""
    if not (path / "meta.json").exists():
        hint = " (an interrupted build is in .partial: rerun the build to resume)" if \
            path.with_name(path.name + ".partial").exists() else ""
        raise CorpusError(f"no dense datastore at {path}{hint}; build it with `specnb datastore build dense`")


def _read_meta(path: Path) -> dict[str, Any]:
    """The meta.json of the dense store at ``path`` (nothing else read); CorpusError (one line) when no store is
    there, its build is unfinished, or meta.json is not a dense store's."""
    require_store(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise _corrupt(path, exc) from None
    fields = meta if isinstance(meta, dict) else {}
    if fields.get("format") != FORMAT_VERSION or fields.get("kind") != "dense":
        raise _corrupt(path, f"format {fields.get('format')!r}, kind {fields.get('kind')!r}")
    return meta


def _corrupt(path: Path, why: object) -> CorpusError:
    """The error for the damaged dense store at ``path``."""
    return CorpusError(f"dense datastore at {path} is corrupt ({why}); delete it and build it again")


def check_built_for(path: str | Path, model: str) -> None:
    """CorpusError (one line) unless a sound dense store is at ``path`` (its meta.json, and every file it records
    of the recorded size and sampled hash: milliseconds, nothing loaded) that records the tokenizer of the model
    named ``model`` (its tokenizer only is loaded) and was built from that model's hidden states (by name): what a
    bench checks before the model loads, so that a missing, damaged or foreign store is refused at once. The
    loaded model's hidden size is checked when the store opens (:meth:`DenseDatastore.check`)."""
    path = Path(path)
    meta = _read_meta(path)
    try:
        check_files(path, meta)
    except (KeyError, TypeError, AttributeError) as exc:  # a meta.json whose "files" is not ours
        raise _corrupt(path, exc) from None
    check_recorded_tokenizer(meta, model, f"dense datastore {path}")
    built_by = meta.get("model", {}).get("name") if isinstance(meta.get("model"), dict) else None
    if built_by is not None and built_by != model:  # another model of the same tokenizer: other hidden states
        raise CorpusError(f"dense datastore {path} holds hidden states of model {built_by!r}, not of {model!r}; "
                          f"rebuild it with --model {model}")


def load_datastore(path: str | Path) -> DenseDatastore:
    """Open a dense datastore folder. Raises CorpusError (one line) when it is missing, unfinished or corrupt."""
    path = Path(path)
    meta = _read_meta(path)
    try:
        values = np.load(path / "values.i32.npy", mmap_mode="r")
        keys = np.load(path / "keys.f32.npy", mmap_mode="r")
        projection = Projection.load(path / "projection.npz")
        kind, params = index_kind(meta), {k: v for k, v in meta["index"].items() if k != "kind"}
        index = AnnIndex.load(path / INDEX_FILES["hnsw"], projection.dims, IndexParams(**params)) \
            if kind == "hnsw" else IvfPqIndex.load(path / INDEX_FILES["ivfpq"], IvfPqParams(**params))
        rows = meta["rows"]
        if values.shape[0] != rows or keys.shape != (rows, projection.dims) or len(index) != rows:
            raise ValueError(f"sizes disagree: meta {rows} rows, values {values.shape}, keys {keys.shape}, "
                             f"index {len(index)}")
        check_files(path, meta)
    except CorpusError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise _corrupt(path, exc) from None
    return DenseDatastore(path, meta, values, keys, projection, index)


def build_datastore(target: LoadedModel, corpus: TokenCorpus, out: str | Path, config: BuildConfig | None = None,
                    progress: bool = True, overwrite: bool = False, cluster: Cluster | None = None) -> DenseDatastore:
    """Extract hidden states of ``corpus``, fit the key transform, index the keys, and save atomically.

    cluster: extract shard by shard on Ray actors (:mod:`specnb.datastores.shards`); None: in this process.

    An existing complete datastore at ``out`` is returned as is unless ``overwrite``; then it is replaced once
    the new one is complete. A folder at ``out`` that is not a dense store is never replaced (ExistsError).
    ValueError before any work when ``config.dims`` exceeds the target's hidden size.
    """
    config = config or BuildConfig()
    out = Path(out)
    replace = check_replaceable(out, is_dense_store, True, "dense datastore")  # never what is not a store
    if replace and not overwrite:
        store = load_datastore(out)
        store.check(target)
        return store
    corpus.tokenizer.check(target, f"corpus {corpus.meta.get('name')!r}")
    _check_dims(config, target.config.hidden_size, target.name)
    with atomic_folder(out, replace=replace, keep_partial=True) as tmp:
        _build_into(tmp, target, corpus, config, progress, cluster)
    return load_datastore(out)


def _check_dims(config: BuildConfig, hidden_size: int, model: str) -> None:
    """ValueError unless ``config.dims`` key components can be had from hidden states of ``hidden_size`` (PCA
    gives at most that many; they were cut to it without a word)."""
    if config.dims > hidden_size:
        raise ValueError(f"--dims ({config.dims}) must be <= {hidden_size}, the hidden size of {model}")


def index_kind(meta: dict[str, Any]) -> str:
    """``"hnsw"`` or ``"ivfpq"``: the index a store's meta.json records (stores from before IVF-PQ: hnsw)."""
    return meta["index"].get("kind", "hnsw")


def is_dense_store(path: Path) -> bool:
    """Whether ``path`` is a folder holding a dense store (complete or damaged: it is ours to replace)."""
    meta = read_meta(path)
    return meta is not None and meta.get("kind") == "dense"


def _build_into(tmp: Path, target: LoadedModel, corpus: TokenCorpus, config: BuildConfig, progress: bool,
                cluster: Cluster | None = None) -> None:
    """Every file of a dense store, meta.json last, into the folder ``tmp`` (resuming an extraction there). A
    resumed extraction's ``extract_seconds`` is None: this process saw only its last part."""
    resumed = started(tmp)
    t0 = time.perf_counter()
    sizes = {"n_next": config.n_next, "seq_len": config.seq_len, "overlap": config.overlap,
             "batch_tokens": config.batch_tokens, "progress": progress}
    extracted = extract(target, corpus, tmp, **sizes) if cluster is None else \
        extract_on_ray(target, corpus, tmp, cluster, **sizes)
    info, _ = TokenizerInfo.of(target)
    seconds = None if resumed else time.perf_counter() - t0
    _index_into(tmp, extracted, info.__dict__, corpus.meta, config, {"extract_seconds": seconds}, progress, cluster)


def _index_into(tmp: Path, extracted: dict[str, Any], tokenizer: dict[str, Any], corpus_meta: dict[str, Any],
                config: BuildConfig, times: dict[str, float | None], progress: bool,
                cluster: Cluster | None = None) -> None:
    """Fit the key transform on the hidden states in ``tmp``, write the keys and the index (an IVF-PQ index
    filled on ``cluster`` when given), then meta.json."""
    t0 = time.perf_counter()
    hidden = np.load(tmp / "hidden.f16.npy", mmap_mode="r")
    sample = sample_rows(hidden, config.sample_size)
    projection = fit_projection(sample, config.n_components, config.dims, znorm=config.znorm, l2=config.l2)
    projection.save(tmp / "projection.npz")
    keys = projection.transform(hidden, progress=progress)
    np.save(tmp / "keys.f32.npy", keys)
    times["projection_seconds"] = time.perf_counter() - t0

    kind = config.index_kind if config.index_kind != "auto" else "ivfpq" if len(keys) >= IVFPQ_FROM else "hnsw"
    if kind == "ivfpq" and config.index_kind == "auto":  # chosen here: codes that split the keys evenly
        config = replace(config, ivfpq=replace(config.ivfpq, m=math.gcd(config.ivfpq.m, keys.shape[1])))
    params = config.index if kind == "hnsw" else config.ivfpq
    if kind == "hnsw":
        index = AnnIndex.build(keys, config.index, progress=progress)
    elif cluster is None:
        index = IvfPqIndex.build(keys, config.ivfpq, progress=progress)
    else:  # trained here, filled shard by shard on the cluster
        index = ivfpq_on_ray(tmp, IvfPqIndex.trained(sample_rows(keys, config.ivfpq.train_size, config.ivfpq.seed),
                                                     len(keys), config.ivfpq), cluster, progress)
    index.save(tmp / INDEX_FILES[kind])
    times["index_seconds"] = index.build_seconds
    if kind == "ivfpq":  # the lists built: a count asked for (or 0, its default) is capped by the keys there are
        params = replace(params, nlist=int(index.index.nlist))
    del hidden
    if not config.keep_hidden:
        (tmp / "hidden.f16.npy").unlink()

    meta = {"format": FORMAT_VERSION, "kind": "dense", "rows": int(keys.shape[0]),
            "model": {"name": extracted["model"], "hidden_size": extracted["hidden_size"],
                      "dtype": extracted["dtype"]},
            "tokenizer": tokenizer, "corpus": corpus_meta, "extract": extracted,
            "projection": {**projection.meta, "dims": projection.dims, "l2": projection.l2,
                           "explained_variance_at_dims": float(projection.explained_variance_ratio[
                               :projection.dims].sum())},
            "index": {"kind": kind, **asdict(params)},
            "timings": {k: None if v is None else round(v, 2) for k, v in times.items()},
            "built": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_meta(tmp, meta)  # last: marks completion


def subset_datastore(parent: DenseDatastore, docs: np.ndarray, out: str | Path, config: BuildConfig | None = None,
                     progress: bool = False) -> DenseDatastore:
    """A dense store over the documents ``docs`` (sorted int indices) of ``parent``'s corpus, without the model.

    Extraction cuts every document on its own (:func:`specnb.datastores.embed.segments`), so the parent's rows of those
    documents are the hidden states a fresh extraction would give (up to the rounding of another batch
    layout); the store fits its own key transform and index on them, as a build does. Written atomically; an
    existing store at ``out`` is opened instead. Needs a parent built with its hidden states kept.
    """
    out = Path(out)
    if check_replaceable(out, is_dense_store, True, "dense datastore"):
        return load_datastore(out)
    config = config or BuildConfig()
    _check_dims(config, parent.meta["model"]["hidden_size"], parent.meta["model"]["name"])
    corpus = TokenCorpus(np.asarray(parent.corpus_tokens()), np.asarray(parent.doc_starts()),
                         dict(parent.meta["corpus"])).select(docs)
    positions = np.asarray(parent.positions())
    rows = np.isin(np.searchsorted(parent.doc_starts(), positions, side="right") - 1, docs)  # bool [n]
    new_positions, _ = row_layout(corpus.doc_starts)
    extracted = {**parent.meta["extract"], "rows": int(rows.sum()), "corpus_tokens": corpus.num_tokens,
                 "corpus_docs": corpus.num_docs, "subset_of": parent.path.name}
    with atomic_folder(out) as tmp:
        np.save(tmp / "hidden.f16.npy", parent.hidden()[rows])
        np.save(tmp / "values.i32.npy", np.asarray(parent.values)[rows])  # next tokens never leave a document
        np.save(tmp / "positions.i64.npy", new_positions)
        np.save(tmp / "corpus_tokens.i32.npy", corpus.tokens)
        np.save(tmp / "doc_starts.i64.npy", corpus.doc_starts)
        _index_into(tmp, extracted, parent.meta["tokenizer"], corpus.meta, config, {}, progress)
    return load_datastore(out)


def datastore_path(name: str, model: str) -> Path:
    """Default location of a named dense datastore for ``model`` in the cache."""
    return artifact_path("datastores", "dense", f"{safe_name(name)}-{safe_name(model)}")


def store_path(store: str | Path, model_name: str) -> Path:
    """The dense datastore a method opens: the folder ``store`` (any path with a folder in it), else the store of
    that name in the cache."""
    path = Path(store)
    return path if path.exists() or len(path.parts) > 1 else datastore_path(str(store), model_name)


def open_dense(target: LoadedModel, store: str | Path) -> DenseDatastore:
    """Open the dense datastore ``store`` (a folder, or a name under the cache for ``target``) and check that it
    holds ``target``'s hidden states (CorpusError otherwise)."""
    loaded = load_datastore(store_path(store, target.name))
    loaded.check(target)
    return loaded


def resolve_corpus(source: str, target: LoadedModel, max_tokens: int | None = None) -> TokenCorpus:
    """``code`` / ``chat`` (cached corpora of :mod:`specnb.datastores.corpus`), a responses ``*.jsonl`` with its
    ``.meta.json`` (ID data from :mod:`specnb.datastores.id_data`), a built corpus folder, or a source path for
    :func:`specnb.datastores.corpus.build_corpus` (a folder of text files, a JSONL of texts or token ids).
    ``max_tokens`` truncates (whole documents) for quick builds."""
    path = Path(source)
    if source.endswith(".jsonl") and path.with_suffix(".meta.json").exists():
        from .id_data import id_corpus

        corpus = id_corpus(path)
    elif (path / "meta.json").exists():
        corpus = load_corpus(path)
    else:
        corpus = build_corpus(source, target, max_tokens=max_tokens, progress=True)
    if max_tokens is not None and corpus.num_tokens > max_tokens:
        # whole documents up to max_tokens (build_corpus stops *after* the document that crosses it)
        keep = int(np.searchsorted(corpus.doc_starts, max_tokens, side="right")) - 1
        corpus = corpus.select(np.arange(max(keep, 1)))
    return corpus
