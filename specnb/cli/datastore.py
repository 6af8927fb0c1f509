"""``specnb datastore build rest | crest | dense`` and ``specnb datastore verify PATH``: the retrieval stores
(:mod:`specnb.datastores.rest`, :mod:`specnb.datastores.crest_build`, :mod:`specnb.datastores.dense`) and their
checksums (:mod:`specnb.datastores.manifest`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import check_replaceable

if TYPE_CHECKING:
    from ..datastores.cluster import Cluster


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    datastore = sub.add_parser("datastore", help=help)
    actions = datastore.add_subparsers(metavar="ACTION")
    kinds = actions.add_parser("build", help="build a datastore of one kind").add_subparsers(metavar="KIND")
    for add in (_add_rest, _add_crest, _add_dense):
        add(kinds)
    p = actions.add_parser("verify", help="check every file of a store against its recorded checksums "
                           "(exit 1 and one line when it is damaged)")
    p.add_argument("path", help="a REST or dense store folder, or a CREST .sqlite file")
    p.set_defaults(func=_verify)


def _verify(args: argparse.Namespace) -> int:
    """0 when the store checks out; 1 with one line saying what is wrong when a store there is damaged; a path
    with nothing at it, or with something that is no store (:func:`~specnb.datastores.manifest.verify_store`'s
    plain ValueError), is a user error (2, from :func:`specnb.cli.main`)."""
    from ..datastores import CorpusError
    from ..datastores.manifest import verify_store

    if not Path(args.path).exists():
        raise FileNotFoundError(f"no datastore at {args.path}")
    try:
        print(verify_store(args.path))
    except CorpusError as exc:
        print(f"specnb: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Corpus and output options shared by ``specnb datastore build rest`` and ``... crest``."""
    parser.add_argument("source", nargs="?", default="code", help="corpus: code (stdlib), chat (ShareGPT), a "
                        "directory or a file")
    parser.add_argument("--model", required=True, help="model whose tokenizer the store is for")
    parser.add_argument("--max-tokens", type=int, default=None, help="corpus limit (tokens)")
    parser.add_argument("--out", default=None, help="output path (default: under the specnb cache, where "
                        "`specnb bench --methods rest,crest` looks without --datastore); never replaces what is "
                        "not a store of this kind")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing store at --out (once the "
                        "new one is complete)")
    _add_cluster_arguments(parser, "suffix-array shards, each sorted on its own (without --ray: 1; with it, 0 is 4 per "
                          "worker); for crest also the ranges of first tokens its counts are merged in")


def _add_cluster_arguments(parser: argparse.ArgumentParser, shards_help: str) -> None:
    """``--ray [ADDRESS] --workers N --threads T --shards S`` of the ``datastore build`` commands."""
    parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="build shard by shard on a Ray cluster (no address: a local Ray on this machine)")
    parser.add_argument("--workers", type=int, default=2, help="Ray workers running at a time")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per Ray worker")
    parser.add_argument("--shards", type=int, default=0, help=shards_help)


def _check_max_tokens(args: argparse.Namespace) -> None:
    """ValueError (one line) for a ``--max-tokens`` below 1 (0 was read as no limit)."""
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")


def _cluster(args: argparse.Namespace) -> Cluster | None:
    """The Cluster the flags of :func:`_add_cluster_arguments` ask for (None without ``--ray``); ValueError (one
    line) for a count below its least."""
    for flag, least in (("workers", 1), ("threads", 1), ("shards", 0)):
        if getattr(args, flag) < least:
            raise ValueError(f"--{flag} must be >= {least}, got {getattr(args, flag)}")
    if args.ray is None:
        return None
    from ..datastores.cluster import Cluster

    return Cluster(None if args.ray == "local" else args.ray, args.workers, args.threads, args.shards)


def _add_rest(kinds: argparse._SubParsersAction) -> None:
    """``specnb datastore build rest [code|chat|PATH] --model NAME [--max-tokens N] [--out DIR]`` (hangs under
    ``datastore build``, like the other datastore kinds)."""
    parser = kinds.add_parser("rest", help="REST datastore: token corpus + suffix array")
    _add_source_arguments(parser)
    parser.set_defaults(func=_build_rest)


def _build_rest(args: argparse.Namespace) -> int:
    from ..datastores.rest import default_store, disk_bytes, ensure_rest, is_rest_store, source_tag

    path = Path(args.out) if args.out else default_store(args.model, "rest", source_tag(args.source))
    check_replaceable(path, is_rest_store, args.overwrite, "REST datastore")  # an explicit build builds
    _check_max_tokens(args)
    cluster = _cluster(args)
    index = ensure_rest(args.source, args.model, args.max_tokens, path, overwrite=True, shards=args.shards or 1,
                        cluster=cluster)
    print(f"REST {index.path}: {index.meta['num_tokens']:,} tokens in {index.bounds.shape[0] - 1} suffix-array "
          f"shard(s), {disk_bytes(index.path):,} bytes")
    return 0


def _add_crest(kinds: argparse._SubParsersAction) -> None:
    """``specnb datastore build crest [code|chat|PATH] --model NAME [--m 5 | --single-n N] [--t T] [--ray ...]``
    (hangs under ``datastore build``). Uses (or first builds) the REST store of the same corpus."""
    parser = kinds.add_parser("crest", help="CREST store: top-t n-grams -> precomputed REST trees, SQLite")
    _add_source_arguments(parser)
    parser.add_argument("--rest", default=None, help="REST store to compute the trees from (default: the "
                        "default REST store of this corpus and model); built there if missing; must match --model's "
                        "tokenizer")
    parser.add_argument("--m", type=int, default=5, help="keep n-grams of n = 1..m")
    parser.add_argument("--single-n", type=int, default=None, help="keep only n-grams of this n")
    parser.add_argument("--t", type=int, default=10_000, help="n-grams kept per n (the most frequent)")
    parser.set_defaults(func=_build_crest)


def _build_crest(args: argparse.Namespace) -> int:
    from ..datastores.crest import build_crest, check_ns, is_crest_store
    from ..datastores.crest_build import build_crest_on_ray
    from ..datastores.rest import default_store, ensure_rest, source_tag

    out = Path(args.out) if args.out else default_store(args.model, "crest", source_tag(args.source))
    check_replaceable(out, is_crest_store, args.overwrite, "CREST store")  # before any work
    if args.m < 1 or args.t < 1 or (args.single_n is not None and args.single_n < 1):
        raise ValueError(f"--m, --t and --single-n must be >= 1, got {args.m}, {args.t}, {args.single_n}")
    ns = [args.single_n] if args.single_n else list(range(1, args.m + 1))
    check_ns(ns)
    _check_max_tokens(args)
    cluster = _cluster(args)
    index = ensure_rest(args.source, args.model, args.max_tokens, args.rest, shards=args.shards or 1,
                        cluster=cluster)
    store = build_crest(index, out, ns=ns, t=args.t, overwrite=True) if cluster is None else \
        build_crest_on_ray(index, out, cluster, ns=ns, t=args.t, overwrite=True)
    print(f"CREST {out}: {len(store):,} n-grams (n in {ns}, t={args.t}), {store.storage_bytes:,} bytes "
          f"(REST: {index.storage_bytes:,})")
    return 0


def _add_dense(kinds: argparse._SubParsersAction) -> None:
    """``specnb datastore build dense SOURCE --model M [--out DIR] ...`` (to hang under `datastore build`)."""
    from ..datastores.ann import IVFPQ_FROM
    from ..datastores.dense import BuildConfig

    defaults = BuildConfig()
    parser = kinds.add_parser("dense", help="DReSD datastore: hidden states -> PCA keys -> hnswlib or IVF-PQ")
    parser.add_argument("source", help="code | chat | responses .jsonl (ID data) | corpus folder | path")
    parser.add_argument("--model", required=True, help="target model whose hidden states are stored")
    parser.add_argument("--dtype", default="auto", help="model dtype for extraction (auto: bf16 where fast)")
    parser.add_argument("--out", default=None, help="output folder (default: the cache, named after the source)")
    parser.add_argument("--max-tokens", type=int, default=None, help="use about this many corpus tokens")
    parser.add_argument("--n-next", type=int, default=defaults.n_next, help="draft tokens stored per value")
    parser.add_argument("--dims", type=int, default=defaults.dims, help="PCA components used")
    parser.add_argument("--components", type=int, default=defaults.n_components, help="PCA components fitted")
    parser.add_argument("--sample", type=int, default=defaults.sample_size, help="vectors for z-score / PCA fit")
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len, help="tokens per extraction window")
    parser.add_argument("--batch-tokens", type=int, default=defaults.batch_tokens, help="tokens per forward batch")
    parser.add_argument("--M", type=int, default=defaults.index.M, help="hnswlib graph degree")
    parser.add_argument("--ef-construction", type=int, default=defaults.index.ef_construction,
                        help="hnswlib build-time candidate list")
    parser.add_argument("--ef-search", type=int, default=defaults.index.ef_search,
                        help="hnswlib query-time candidate list")
    parser.add_argument("--index", choices=("auto", "hnsw", "ivfpq"), default=defaults.index_kind,
                        help=f"the key index (auto: FAISS IVF-PQ from {IVFPQ_FROM:,} keys, else hnswlib)")
    parser.add_argument("--nlist", type=int, default=defaults.ivfpq.nlist, help="IVF-PQ lists (0: 4 sqrt(n))")
    parser.add_argument("--pq-m", type=int, default=defaults.ivfpq.m, help="IVF-PQ code bytes per key")
    parser.add_argument("--nprobe", type=int, default=defaults.ivfpq.nprobe, help="IVF-PQ lists scanned per query")
    _add_cluster_arguments(parser, "pieces of the extraction (0: 4 per worker; each Ray actor loads the model "
                          "once)")
    parser.add_argument("--no-hidden", action="store_true", help="delete the raw hidden states after indexing")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dense store at --out (once "
                        "the new one is complete; never a folder that is not one); without it an existing store is "
                        "an error")
    parser.set_defaults(func=_build_dense)


def _build_dense(args: argparse.Namespace) -> int:
    """Check the source, --out, every size (:class:`~specnb.datastores.dense.BuildConfig`) and the cluster flags,
    then load the model and build. An existing store at --out is replaced only with --overwrite, anything else
    there never."""
    from ..datastores.ann import IndexParams, IvfPqParams
    from ..datastores.corpus import check_source
    from ..datastores.dense import BuildConfig, build_datastore, datastore_path, is_dense_store, resolve_corpus
    from ..model.models import load_model

    name = Path(args.source).stem + (f"-t{args.max_tokens}" if args.max_tokens else "")
    out = Path(args.out) if args.out else datastore_path(name, args.model)
    check_source(args.source)  # before the model loads
    check_replaceable(out, is_dense_store, args.overwrite, "dense datastore")
    _check_max_tokens(args)
    config = BuildConfig(n_next=args.n_next, dims=args.dims, n_components=args.components,
                         sample_size=args.sample, seq_len=args.seq_len, batch_tokens=args.batch_tokens,
                         index=IndexParams(args.M, args.ef_construction, args.ef_search), index_kind=args.index,
                         ivfpq=IvfPqParams(nlist=args.nlist, m=args.pq_m, nprobe=args.nprobe),
                         keep_hidden=not args.no_hidden)
    cluster = _cluster(args)
    target = load_model(args.model, dtype=args.dtype)
    corpus = resolve_corpus(args.source, target, args.max_tokens)
    store = build_datastore(target, corpus, out, config, overwrite=args.overwrite, cluster=cluster)
    print(f"{store.path}: {store.rows:,} keys of {store.projection.dims} dims, "
          f"{store.storage_bytes() / 2**20:.1f} MiB to draft, timings {store.meta['timings']}")
    return 0
