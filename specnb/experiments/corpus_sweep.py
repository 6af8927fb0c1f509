"""DReSD vs REST over corpus size, on the same documents (notebook 03; it reconciles notebooks 03 and 04).

Notebook 03 compares DReSD with REST on its dense store's corpus (the first documents of the stdlib, sized by
the profile); notebook 04 studies REST on the whole stdlib, so their REST numbers differ by the corpus alone.
Here both methods are built on nested random document samples of the dense store's corpus, the largest
being the store itself (a sample's dense store reuses the store's hidden states:
:func:`specnb.datastores.dense.subset_datastore`), and REST also on the whole stdlib, notebook 04's corpus, of
which the dense store's documents are the first (DReSD there would need hours of extraction on a CPU). Every
store is built once into the cache. Acceptance comes from greedy replay; the predicted speedup prices every
replayed call with the roofline table (a tree-attention call of its drafted nodes:
:func:`specnb.experiments.grids.estimated_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from torch import Tensor

from ..datastores.corpus import build_corpus
from ..datastores.dense import DenseDatastore, subset_datastore
from ..datastores.rest import RestIndex, disk_bytes
from ..drafters.base import Drafter
from ..drafters.dense import DenseDrafter
from ..drafters.rest import RestDrafter
from ..models import LoadedModel
from ..replay import Reference, replay_many
from .dresd import build_config, datastores, store_corpus
from .grids import ar_estimated_seconds, replay_summary
from .stores import rest_store, study_folder

FRACTIONS = {"smoke": (0.5, 1.0), "quick": (0.1, 0.3, 1.0), "full": (0.1, 0.3, 1.0)}
"""Nested document samples of the dense store's corpus per profile (1.0: the store itself)."""
WHOLE_STDLIB = {"smoke": False, "quick": True, "full": True}  # add REST on the whole stdlib (notebook 04's)
DRESD_SHAPE = (10, 6)  # DReSD's controlled comparison with REST's trees (about as many nodes: notebook 03)


@dataclass
class SweepPoint:
    """One corpus: its name, token count and stores (``dense`` None: REST only)."""

    corpus: str
    tokens: int
    rest: RestIndex
    dense: DenseDatastore | None


def sweep_points(target: LoadedModel, profile: str, progress: bool = False) -> list[SweepPoint]:
    """The corpora of the sweep for ``target`` at ``profile`` size, smallest first, their stores built once."""
    parent = datastores(target, profile, kinds=("code-OOD",), progress=progress)["code-OOD"]
    corpus = store_corpus(parent)
    points = []
    for fraction in FRACTIONS[profile]:
        if fraction == 1.0:
            docs, dense, name = np.arange(corpus.num_docs), parent, f"rest-{parent.path.name}"  # the study's REST
        else:
            docs = corpus.sample_docs(fraction, seed=0)
            name = f"rest-f{fraction}-{parent.path.name}"
            dense = subset_datastore(parent, docs, study_folder() / f"dense-f{fraction}-{parent.path.name}",
                                     build_config(profile), progress=progress)
        sample = corpus.select(docs)
        points.append(SweepPoint(f"{fraction:.0%} of the dense store's", sample.num_tokens,
                                 rest_store(sample, study_folder() / name, progress), dense))
    if WHOLE_STDLIB[profile]:
        stdlib = build_corpus("code", target, progress=progress)  # cached; notebook 04's code corpus
        whole = rest_store(stdlib, study_folder() / f"rest-{stdlib.meta['name']}", progress)
        points.append(SweepPoint("whole stdlib", stdlib.num_tokens, whole, None))
    return points


def corpus_sweep(points: list[SweepPoint], references: list[Reference], hidden: list[Tensor], cost) -> pd.DataFrame:
    """Replay REST and DReSD (:data:`DRESD_SHAPE`) on every corpus over the same greedy references.

    hidden: the teacher-forced states of the references (DReSD's queries). Returns one row per (corpus,
    method): corpus, corpus_tokens, method ("REST" / "DReSD 10x6"), storage_bytes (what drafting reads from
    disk), calls, tokens_per_call, accepted_length, acceptance_rate (MAR, per depth), nodes_per_call and
    est_speedup (roofline-priced AR time / priced time of the replayed calls).
    """
    ar_seconds = ar_estimated_seconds(references, cost)
    rows = []
    for point in points:
        methods: dict[str, tuple[Callable[[], Drafter], int, list[Tensor] | None]] = {
            "REST": (lambda p=point: RestDrafter(p.rest), disk_bytes(point.rest.path), None)}
        if point.dense is not None:
            methods["DReSD {}x{}".format(*DRESD_SHAPE)] = (lambda p=point: DenseDrafter(p.dense, *DRESD_SHAPE),
                                                          point.dense.storage_bytes(), hidden)
        for method, (make, storage, states) in methods.items():
            runs = replay_many(make, references, states)
            rows.append({"corpus": point.corpus, "corpus_tokens": point.tokens, "method": method,
                         "storage_bytes": storage, **replay_summary(method, runs, cost, ar_seconds)})
    return pd.DataFrame(rows)


TIE = 0.02  # predicted speedups closer than this (relative) call neither method faster


def sweep_summary(sweep: pd.DataFrame) -> dict[str, object]:
    """Headline numbers of :func:`corpus_sweep`'s table: per corpus with both methods (lists in corpus order:
    corpora, tokens, rest_accepted, dresd_accepted, ratio = DReSD's accepted length over REST's, rest_speedup,
    dresd_speedup, winner = the method predicted faster, or "neither" within ``tie`` = :data:`TIE`);
    ``largest_shared``: the largest corpus both were built on (tokens, rest_accepted, dresd_accepted);
    ``rest_only``: the largest corpus REST alone was built on (tokens, accepted, speedup)."""
    dresd = sweep[sweep.method != "REST"].set_index("corpus")
    rest = sweep[sweep.method == "REST"].set_index("corpus")
    both = dresd.index
    out: dict[str, object] = {
        "tie": TIE, "corpora": list(both), "tokens": rest.corpus_tokens[both].tolist(),
        "ratio": (dresd.accepted_length / rest.accepted_length[both]).tolist(),
        "rest_accepted": rest.accepted_length[both].tolist(), "dresd_accepted": dresd.accepted_length.tolist(),
        "winner": ["neither" if abs(d - r) <= TIE * max(d, r) else "DReSD" if d > r else "REST"
                   for d, r in zip(dresd.est_speedup, rest.est_speedup[both], strict=True)],
        "dresd_speedup": dresd.est_speedup.tolist(), "rest_speedup": rest.est_speedup[both].tolist()}
    shared = rest.corpus_tokens[both].idxmax()
    out["largest_shared"] = {"tokens": rest.corpus_tokens[shared], "rest_accepted": rest.accepted_length[shared],
                             "dresd_accepted": dresd.accepted_length[shared]}
    only = rest.drop(index=both)
    if len(only):
        largest = only.loc[only.corpus_tokens.idxmax()]
        out["rest_only"] = {"tokens": largest.corpus_tokens, "accepted": largest.accepted_length,
                            "speedup": largest.est_speedup}
    return out
