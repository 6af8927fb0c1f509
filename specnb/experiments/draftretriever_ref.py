"""Checking our REST search against ``draftretriever`` from PyPI.

REST's own retriever (``DraftRetriever`` in the REST repository, a suffix array over the concatenated
documents built with libsais) was never published on PyPI. Both PyPI releases of ``draftretriever`` (0.1.0
and 0.1.1) are ADED's fork with the same Python API (``Writer.add_entry``, ``Reader.search(ids, k, choices,
long)``) but another algorithm: the index file is a table of token transitions with probabilities (a tri-gram
matrix) and ``search`` grows drafts with Monte Carlo tree search over it, so it can return sequences that
never follow the query in the corpus. Its candidate sets therefore cannot equal REST's; the comparison below
classifies every difference:

* ``only_theirs_crossing``: a continuation that does follow the query in the corpus when documents are joined
  end to end (draftretriever does not separate documents; our index never crosses a boundary);
* ``only_theirs_invented``: a sequence that follows the query nowhere in the corpus (made by the tri-gram
  chain);
* ``only_ours``: REST candidates that draftretriever's 64-node budget or its search left out.

Our side also indexes the corpus as one joined document to tell the first two apart.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..datastores.corpus import TokenCorpus
from ..datastores.rest import DEFAULT_SEARCH, RestIndex, SearchConfig
from ..datastores.retrieval_tree import build_tree


def write_draftretriever(corpus: TokenCorpus, path: str | Path) -> Path:
    """Index ``corpus`` with draftretriever (one entry per document) into the file ``path``."""
    import draftretriever

    path = Path(path)
    writer = draftretriever.Writer(str(path), vocab_size=int(corpus.meta["tokenizer"]["vocab_size"]) + 1)
    for doc in corpus.docs():
        writer.add_entry(doc.tolist())
    writer.finalize()
    del writer
    return path


def draftretriever_search(reader, context: np.ndarray, config: SearchConfig = DEFAULT_SEARCH):
    """REST's own loop: try the last 16..2 tokens until draftretriever returns a tree.

    Returns (paths int [p, depth] padded with -2, matched length or 0).
    """
    for q in range(min(config.max_query, context.shape[0]), config.min_query - 1, -1):
        paths = reader.search(context[-q:].tolist(), k=config.max_matches, choices=config.max_nodes,
                              long=config.length)[0]
        if paths:
            return paths, q
    return [], 0


def _their_nodes(paths: list[list[int]]) -> set[tuple[int, ...]]:
    """Every prefix of draftretriever's returned paths (each path is itself a kept prefix)."""
    nodes = set()
    for path in paths:
        tokens = [t for t in path if t != -2]
        nodes.update(tuple(tokens[:i]) for i in range(1, len(tokens) + 1))
    return nodes


def _our_nodes(index: RestIndex, context: np.ndarray, config: SearchConfig) -> tuple[set[tuple[int, ...]], int]:
    q, ranges = index.longest_match(context, config.max_query, config.min_query)
    if q == 0:
        return set(), 0
    return build_tree(index.continuations(ranges, q, config.max_matches, config.length),
                      config.max_nodes).sequences(), q


def compare_candidates(corpus: TokenCorpus, contexts: list[np.ndarray], workdir: str | Path,
                       config: SearchConfig = DEFAULT_SEARCH) -> pd.DataFrame:
    """One row per context: matched query length and candidate nodes (each as its token path from the root)
    of our REST search and of draftretriever's REST loop, same corpus and parameters, with every difference
    classified (see the module docstring)."""
    import draftretriever

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    reader = draftretriever.Reader(str(write_draftretriever(corpus, workdir / "draftretriever.idx")))
    ours = RestIndex.build(corpus, progress=False)
    joined = RestIndex.build(TokenCorpus(corpus.tokens, np.array([0, corpus.num_tokens]), corpus.meta),
                             progress=False)
    everything = replace(config, max_nodes=1 << 30)  # every candidate prefix, to classify theirs
    rows = []
    for i, context in enumerate(contexts):
        mine, q_ours = _our_nodes(ours, context, config)
        paths, q_theirs = draftretriever_search(reader, context, config)
        theirs = _their_nodes(paths)
        in_corpus, _ = _our_nodes(joined, context[-q_theirs:] if q_theirs else context[:0], everything)
        extra = theirs - mine
        rows.append({"query": i, "q_ours": q_ours, "q_theirs": q_theirs, "nodes_ours": len(mine),
                     "nodes_theirs": len(theirs), "common": len(mine & theirs), "same": mine == theirs,
                     "only_ours": len(mine - theirs), "only_theirs_crossing": len(extra & in_corpus),
                     "only_theirs_invented": len(extra - in_corpus)})
    return pd.DataFrame(rows)


def compare_latency(index: RestIndex, corpus_file: str | Path, contexts: list[np.ndarray],
                    config: SearchConfig = DEFAULT_SEARCH, repeats: int = 3) -> pd.DataFrame:
    """Per-context search time (ms, best of ``repeats``) of our REST search and of draftretriever's REST loop
    over the index file ``corpus_file`` (from :func:`write_draftretriever` on the same corpus), both producing a
    tree of at most ``config.max_nodes`` nodes from up to ``config.max_matches`` occurrences."""
    import draftretriever

    reader = draftretriever.Reader(str(corpus_file))
    rows = []
    for i, context in enumerate(contexts):
        ours, theirs = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            tree, q = index.search(context, config)
            t1 = time.perf_counter()
            _, q_theirs = draftretriever_search(reader, context, config)
            t2 = time.perf_counter()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
        rows.append({"query": i, "rest_ms": 1e3 * min(ours), "draftretriever_ms": 1e3 * min(theirs),
                     "q_ours": q, "q_theirs": q_theirs, "nodes_ours": tree.num_nodes})
    return pd.DataFrame(rows)
