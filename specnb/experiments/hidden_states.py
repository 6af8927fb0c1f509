"""Notebook 01's study: what a dense datastore stores per position against REST's suffix array on the same
documents (:func:`storage_versus_rest`), the nearest stored states of a prompt's state (:func:`neighbours_table`),
and DReSD §5.6's storage numbers (:data:`CLAIMS`) judged by :func:`judge_storage`. The stores themselves are
:mod:`specnb.experiments.dresd`'s."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..datastores.dense import INDEX_FILES, DenseDatastore, index_kind
from ..datastores.rest import disk_bytes
from ..model.models import LoadedModel
from ..study.verdicts import Expect
from .dresd import rest_twin


@dataclass(frozen=True)
class StorageClaims:
    """DReSD §5.6's storage numbers, judged by :func:`judge_storage` (notebook 01 states them in its verdicts)."""

    datastore_bytes: float  # §5.6: the datastore's bytes ...
    datastore_tokens: float  # ... for this many stored tokens
    dense_over_rest: tuple[float, float]  # §5.6: how many times larger than REST's on the same documents

    @property
    def bytes_per_token(self) -> float:
        """Bytes per stored token (6.49 GB / 19 M)."""
        return self.datastore_bytes / self.datastore_tokens

    @property
    def storage_text(self) -> str:
        """``6.49 GB for 19 M tokens``."""
        return f"{self.datastore_bytes / 1e9:g} GB for {self.datastore_tokens / 1e6:g} M tokens"

    @property
    def ratio_text(self) -> str:
        """``30-40``."""
        return f"{self.dense_over_rest[0]:g}-{self.dense_over_rest[1]:g}"


CLAIMS = StorageClaims(datastore_bytes=6.49e9, datastore_tokens=19e6, dense_over_rest=(30.0, 40.0))

REST_BYTES = {"token id bytes": 4, "suffix-array entry bytes": 4}
"""What our REST stores per corpus token (:mod:`specnb.datastores.rest`)."""

INDEX_NAMES = {"hnsw": "hnswlib graph (every key and its links)", "ivfpq": "FAISS IVF-PQ index (compressed codes)"}
"""A dense store's index kind (:func:`specnb.datastores.dense.index_kind`) -> what it keeps, in a cause line."""


def storage_versus_rest(store: DenseDatastore) -> dict[str, float | str]:
    """What drafting reads from disk, dense against sparse on the same documents: dense_bytes (values,
    projection, index, meta: :meth:`DenseDatastore.storage_bytes`), rest_bytes
    (:func:`specnb.experiments.dresd.rest_twin`'s files), rows (stored positions), bytes_per_row and their ratio
    (dense over REST); index (``hnsw`` or ``ivfpq``) and the bytes a position its index and its next tokens take
    (index_bytes_per_row, values_bytes_per_row)."""
    dense, rest = store.storage_bytes(), disk_bytes(rest_twin(store).path)
    kind = index_kind(store.meta)
    return {"dense_bytes": dense, "rest_bytes": rest, "rows": store.rows, "bytes_per_row": dense / store.rows,
            "ratio": dense / rest, "index": kind,
            "index_bytes_per_row": (store.path / INDEX_FILES[kind]).stat().st_size / store.rows,
            "values_bytes_per_row": (store.path / "values.i32.npy").stat().st_size / store.rows}


def extraction(store: DenseDatastore) -> dict[str, float | str | None]:
    """The store's extraction as notebook 01 reports it: extract_seconds and positions_per_s from its meta.json,
    both None where the build resumed an interrupted one (no process saw the whole), and ``extraction``, the
    sentence its text prints."""
    seconds = store.meta["timings"].get("extract_seconds")
    if seconds is None:
        return {"extract_seconds": None, "positions_per_s": None,
                "extraction": "was resumed after an interruption, so its time is not known"}
    return {"extract_seconds": seconds, "positions_per_s": store.rows / seconds,
            "extraction": f"ran at {store.rows / seconds:,.0f} positions/s ({seconds:,.0f} s)"}


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


def judge_storage(report, storage: dict[str, float | str]) -> None:
    """Notebook 01's comparisons on :func:`storage_versus_rest`'s ``storage`` (one build each, so judged as
    points): bytes per stored position against DReSD §5.6's 6.49 GB / 19 M tokens, and the dense store over
    REST's against its 30-40×, both with the published band (:meth:`Expect.published`)."""
    report.compare("bytes_per_token", "bytes on disk per stored position, all drafting needs (one build)",
                   storage["bytes_per_row"], np.nan, np.nan, Expect.published([CLAIMS.bytes_per_token]),
                   f"DReSD §5.6 ({CLAIMS.storage_text})", fmt=".0f", internal=False, direction_only=False,
                   cause=f"index formats differ: our {INDEX_NAMES[storage['index']]} takes "
                         f"{storage['index_bytes_per_row']:.1f} bytes a position and the next tokens "
                         f"{storage['values_bytes_per_row']:.1f}; ScaNN's layout differs",
                   evidence={"index bytes per position": storage["index_bytes_per_row"],
                             "next-token bytes per position": storage["values_bytes_per_row"]})
    rest_per_row = storage["rest_bytes"] / storage["rows"]
    report.compare("dense_over_rest", "dense store's bytes over REST's on the same documents (one build)",
                   storage["ratio"], np.nan, np.nan, Expect.published(CLAIMS.dense_over_rest),
                   f"DReSD §5.6 ({CLAIMS.ratio_text}× larger)", fmt=".1f", internal=False, direction_only=False,
                   cause=f"our REST holds {rest_per_row:.1f} bytes per position ({REST_BYTES['token id bytes']}-byte "
                         f"tokens and {REST_BYTES['suffix-array entry bytes']}-byte suffix-array entries); the dense "
                         "side as above", evidence={"REST bytes per position": rest_per_row, **REST_BYTES})
