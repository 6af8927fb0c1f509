"""Hidden states of a target over a token corpus, and the DReSD key transform (z-score -> PCA -> L2).

Extraction (DReSD §3.1, §3.5). Every position t of a document that has a next token becomes one row:

    hidden.f16   float16 [n, d]      the target's last hidden state (after the final norm, before the LM head)
                                     at position t -- the state that predicts token t+1
    values.i32   int32   [n, 1 + N]  tokens t+1 .. t+1+N of the same document, padded with ``pad_id``
                                     (EOS): column 0 is the token the state predicts (the first-token filter
                                     of the dense drafter), columns 1..N the N tokens a draft is made of
    positions.i64 int64  [n]         t, an index into the corpus tokens

Documents are cut into segments of ``seq_len`` positions; a segment after the first is preceded by
``overlap`` tokens of its document as context (their states are not kept), so states near a cut still
see some history. Segments are sorted by length and packed into batches of about ``batch_tokens`` padded
tokens; the files are memory maps written in place, and ``progress.json`` counts finished batches, so an
interrupted extraction resumes where it stopped -- only with the same parameters and the same corpus (its
sha256): any other run starts over; a complete one (its ``extract.json``) is kept by a build stopped later.
Only the decoder stack runs (no LM head: for Gemma-3 the 262k-row head would be most of the cost).

Key transform (DReSD §3.2-3.4): :class:`Projection` z-scores with a sample's mean and standard deviation
(Eq. 1), projects on the first ``dims`` of ``n_components`` principal components fitted on the same sample,
and scales to unit length (Eq. 2), so inner product = cosine similarity (Eq. 3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..atomic import write_text
from ..model.backend import HFModules
from ..model.models import LoadedModel
from .corpus import TokenCorpus, corpus_digest

N_NEXT = 20  # tokens per value after the predicted one (DReSD stores the next N tokens of each key)


# ------------------------------------------------------------------------------------------- layout


def row_layout(doc_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64 [n], doc_ends int64 [n]): every corpus position with a next token in its document,
    and the end (exclusive) of that document."""
    lengths = np.diff(doc_starts)
    rows = np.maximum(lengths - 1, 0)
    first_row = np.concatenate([[0], np.cumsum(rows)])
    doc_of_row = np.repeat(np.arange(lengths.shape[0]), rows)
    positions = doc_starts[doc_of_row] + (np.arange(first_row[-1]) - first_row[doc_of_row])
    return positions.astype(np.int64), doc_starts[doc_of_row + 1].astype(np.int64)


def next_tokens(tokens: np.ndarray, positions: np.ndarray, doc_ends: np.ndarray, n_next: int,
                pad_id: int) -> np.ndarray:
    """int32 [n, 1 + n_next]: tokens positions+1 .. positions+1+n_next, ``pad_id`` past the document end."""
    index = positions[:, None] + 1 + np.arange(1 + n_next)
    inside = index < doc_ends[:, None]
    return np.where(inside, tokens[np.minimum(index, tokens.shape[0] - 1)], pad_id).astype(np.int32)


@dataclass(frozen=True)
class Segment:
    """One model input: corpus tokens [context, end); hidden states of [keep, end) go to rows [row, ...)."""

    context: int
    keep: int
    end: int
    row: int

    @property
    def length(self) -> int:
        return self.end - self.context


def segments(doc_starts: np.ndarray, seq_len: int, overlap: int) -> list[Segment]:
    """Cut every document's row positions into segments of <= seq_len kept positions (plus context)."""
    out: list[Segment] = []
    row = 0
    for start, stop in zip(doc_starts[:-1].tolist(), doc_starts[1:].tolist(), strict=True):
        last = stop - 1  # the last token has no next token: no row
        for keep in range(start, last, seq_len):
            end = min(keep + seq_len, last)
            out.append(Segment(max(start, keep - overlap), keep, end, row))
            row += end - keep
    return out


def batches(segs: list[Segment], batch_tokens: int) -> list[list[Segment]]:
    """Pack segments, longest first, into batches whose padded size (rows x longest) stays <= batch_tokens."""
    order = sorted(segs, key=lambda s: (-s.length, s.row))
    out: list[list[Segment]] = []
    for seg in order:
        if out and (len(out[-1]) + 1) * out[-1][0].length <= batch_tokens:
            out[-1].append(seg)
        else:
            out.append([seg])
    return out


# --------------------------------------------------------------------------------------- extraction


@torch.inference_mode()
def last_hidden_states(target: LoadedModel, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """float [B, T, d]: final-norm hidden states of right-padded ids [B, T] (the decoder only, no LM head).

    Computed by the decoder the decoding loop runs (``decoder`` of :class:`specnb.model.models.LoadedModel`), so
    they are what it hands a drafter: right padding needs no mask on specnb's decoder, as causal attention never
    lets a token see the pads after it; Hugging Face's modules get ``attention_mask`` [B, T] (1 = token, 0 = pad).
    """
    if isinstance(target.decoder, HFModules):
        return target.decoder.forward(ids, mask=attention_mask)
    return target.decoder.forward(ids)


@dataclass(frozen=True)
class Plan:
    """An extraction's layout: its ``params`` (recorded in extract.json), every row's corpus ``positions`` and
    document ends, the batches of segments in the order they run, and the corpus's sha256."""

    params: dict[str, Any]
    positions: np.ndarray
    doc_ends: np.ndarray
    work: list[list[Segment]]
    corpus_sha256: str


def check_sizes(seq_len: int, overlap: int, batch_tokens: int) -> None:
    """ValueError unless segments of ``seq_len`` after ``overlap`` tokens of context fit batches of
    ``batch_tokens``."""
    if seq_len < 1 or overlap < 0 or batch_tokens < seq_len + overlap:
        raise ValueError(f"need --seq-len >= 1, --overlap >= 0 and --batch-tokens >= --seq-len + --overlap; got "
                         f"{seq_len}, {overlap}, {batch_tokens}")


def plan(target: LoadedModel, corpus: TokenCorpus, *, n_next: int = N_NEXT, seq_len: int = 512, overlap: int = 64,
         batch_tokens: int = 4096) -> Plan:
    """The layout of extracting ``corpus`` with ``target`` (ValueError for impossible sizes or an empty corpus)."""
    check_sizes(seq_len, overlap, batch_tokens)
    d = target.config.hidden_size
    pad_id = min(target.eos_token_ids) if target.eos_token_ids else -1
    positions, doc_ends = row_layout(corpus.doc_starts)
    n = int(positions.shape[0])
    if n == 0:
        raise ValueError("the corpus has no position with a next token (all documents have one token)")
    params = {"model": target.name, "dtype": target.dtype_name,
              "hidden_size": d, "rows": n, "n_next": n_next, "pad_id": pad_id, "seq_len": seq_len,
              "overlap": overlap, "batch_tokens": batch_tokens, "corpus": corpus.meta.get("name"),
              "corpus_tokens": corpus.num_tokens, "corpus_docs": corpus.num_docs}
    work = batches(segments(corpus.doc_starts, seq_len, overlap), batch_tokens)
    return Plan(params, positions, doc_ends, work, corpus_digest(corpus))


def write_layout(out: Path, corpus: TokenCorpus, layout: Plan) -> None:
    """Every file of the extraction but the hidden states: values, positions, corpus tokens, document starts."""
    tokens = np.asarray(corpus.tokens)
    p = layout.params
    np.save(out / "values.i32.npy", next_tokens(tokens, layout.positions, layout.doc_ends, p["n_next"], p["pad_id"]))
    np.save(out / "positions.i64.npy", layout.positions)
    np.save(out / "corpus_tokens.i32.npy", tokens)
    np.save(out / "doc_starts.i64.npy", corpus.doc_starts)


def run_batch(target: LoadedModel, tokens: np.ndarray, batch: list[Segment]) -> list[tuple[int, np.ndarray]]:
    """One forward pass over a batch of segments: (first row, float16 states [rows, d]) of each segment."""
    device = target.device
    width = batch[0].length
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for b, seg in enumerate(batch):
        ids[b, :seg.length] = torch.from_numpy(tokens[seg.context:seg.end].astype(np.int64))
        mask[b, :seg.length] = 1
    states = last_hidden_states(target, ids.to(device), mask.to(device)).float().cpu().numpy()
    return [(seg.row, states[b, seg.keep - seg.context:seg.length].astype(np.float16)) for b, seg in enumerate(batch)]


def extract(target: LoadedModel, corpus: TokenCorpus, out: str | Path, *, n_next: int = N_NEXT,
            seq_len: int = 512, overlap: int = 64, batch_tokens: int = 4096, progress: bool = True) -> dict[str, Any]:
    """Write hidden.f16, values.i32 and positions.i64 for ``corpus`` into folder ``out`` (resumable).

    Returns the extraction's parameters and counts (also written to ``out/extract.json`` when complete).
    The folder is a work area: the caller renames it into place once everything else is built.
    """
    layout = plan(target, corpus, n_next=n_next, seq_len=seq_len, overlap=overlap, batch_tokens=batch_tokens)
    out = Path(out)
    if completed(out, layout):  # a build stopped after its extraction (while fitting or indexing)
        return layout.params
    out.mkdir(parents=True, exist_ok=True)
    (out / "extract.json").unlink(missing_ok=True)  # another run's mark: its files are about to change
    tokens = np.asarray(corpus.tokens)
    n, d, work = layout.params["rows"], layout.params["hidden_size"], layout.work
    progress_file = out / "progress.json"
    state = {"params": layout.params, "corpus_sha256": layout.corpus_sha256}  # what the files in ``out`` hold
    done = _batches_done(progress_file, state)
    if not done:  # starting over: a record of another run's batches must not outlive the files it describes
        progress_file.unlink(missing_ok=True)
    hidden = np.lib.format.open_memmap(out / "hidden.f16.npy", mode="r+" if done else "w+", dtype=np.float16,
                                       shape=(n, d))
    if not done:
        write_layout(out, corpus, layout)
    bar = tqdm(total=n, initial=sum(s.end - s.keep for b in work[:done] for s in b), unit="tok",
               desc=f"hidden states ({target.name})", disable=not progress, smoothing=0.1)
    for i in range(done, len(work)):
        for row, states in run_batch(target, tokens, work[i]):
            hidden[row:row + states.shape[0]] = states
            bar.update(states.shape[0])
        if i % 8 == 7 or i == len(work) - 1:  # flush, then record progress: never ahead of the data
            hidden.flush()
            write_text(progress_file, json.dumps({**state, "batches_done": i + 1}))  # atomic: never half
    bar.close()
    hidden.flush()
    del hidden
    params = finish(out, layout)
    progress_file.unlink(missing_ok=True)
    return params


def finish(out: Path, layout: Plan) -> dict[str, Any]:
    """Check the hidden states in ``out`` and write extract.json (the mark of a complete extraction: its
    parameters and the corpus's sha256)."""
    n = layout.params["rows"]
    if not np.isfinite(np.load(out / "hidden.f16.npy", mmap_mode="r")[:: max(1, n // 4096)]).all():
        raise ValueError("hidden states overflow float16; extract in a smaller-range dtype is not supported")
    write_text(out / "extract.json", json.dumps(_complete_record(layout), indent=1))
    for stale in out.glob(".*.partial-*"):  # a progress, extract.json or shard write killed half-way
        stale.unlink(missing_ok=True)
    return layout.params


def completed(out: Path, layout: Plan) -> bool:
    """Whether ``out`` holds a complete extraction of ``layout``: its extract.json and all its hidden states."""
    try:
        record = json.loads((out / "extract.json").read_text())
    except (OSError, ValueError):
        return False
    return record == _complete_record(layout) and _hidden_fits(out, layout.params)


def started(out: Path) -> bool:
    """Whether ``out`` holds any part of an extraction (one in this process, or sharded on Ray)."""
    return any((out / name).exists() for name in ("progress.json", "plan.json", "extract.json"))


def _complete_record(layout: Plan) -> dict[str, Any]:
    return {**layout.params, "corpus_sha256": layout.corpus_sha256}


def _hidden_fits(out: Path, params: dict[str, Any]) -> bool:
    """Whether ``out/hidden.f16.npy`` has the shape ``params`` give (rows x hidden size)."""
    try:
        header = np.load(out / "hidden.f16.npy", mmap_mode="r")
    except (OSError, ValueError):
        return False
    return header.shape == (params["rows"], params["hidden_size"])


def _batches_done(progress_file: Path, state: dict[str, Any]) -> int:
    """Batches an interrupted extraction finished with the same parameters and corpus (0: start over)."""
    try:
        recorded = json.loads(progress_file.read_text())
        done = recorded.pop("batches_done")
    except (OSError, ValueError, KeyError, AttributeError, TypeError):  # none, or unreadable: start over
        return 0
    if recorded != state or not isinstance(done, int) or done < 0:
        return 0
    return done if _hidden_fits(progress_file.parent, state["params"]) else 0


# ------------------------------------------------------------------------------------ key transform


@dataclass
class Projection:
    """DReSD's key transform: z-score (Eq. 1) -> first ``dims`` principal components -> L2 norm (Eq. 2).

    mean, scale: float32 [d] (scale = sqrt(var + eps); all ones when fitted with ``znorm=False``, in which
    case PCA still centres the data as PCA does). components: float32 [c, d], principal axes of the scaled
    data, largest variance first, each with its largest-magnitude entry positive (a fixed sign).
    explained_variance_ratio: float32 [c] (of the total variance of the scaled data). dims: components used.
    l2: unit-normalise the projected keys.
    """

    mean: np.ndarray
    scale: np.ndarray
    components: np.ndarray
    explained_variance_ratio: np.ndarray
    dims: int = 64
    l2: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.dims <= self.components.shape[0]:
            raise ValueError(f"dims must be in [1, {self.components.shape[0]}] (components fitted), got {self.dims}")

    def with_dims(self, dims: int, l2: bool | None = None) -> Projection:
        """The same fit using the first ``dims`` components (and optionally another ``l2`` setting)."""
        return Projection(self.mean, self.scale, self.components, self.explained_variance_ratio, dims,
                          self.l2 if l2 is None else l2, self.meta)

    def __call__(self, x: np.ndarray | torch.Tensor) -> np.ndarray:
        """float32 [n, dims] keys of hidden states x [n, d] (or [d] -> [1, dims])."""
        if isinstance(x, torch.Tensor):
            x = x.detach().float().cpu().numpy()
        x = np.asarray(x, dtype=np.float32).reshape(-1, self.mean.shape[0])
        keys = ((x - self.mean) / self.scale) @ self.components[:self.dims].T
        if self.l2:
            keys /= np.maximum(np.linalg.norm(keys, axis=1, keepdims=True), 1e-12)
        return keys.astype(np.float32, copy=False)

    def transform(self, hidden: np.ndarray, chunk: int = 65536, progress: bool = False) -> np.ndarray:
        """float32 [n, dims] keys of a (memory-mapped) float16 [n, d] array, ``chunk`` rows at a time."""
        out = np.empty((hidden.shape[0], self.dims), dtype=np.float32)
        for i in tqdm(range(0, hidden.shape[0], chunk), desc="project", disable=not progress):
            out[i:i + chunk] = self(hidden[i:i + chunk])
        return out

    def save(self, path: str | Path) -> None:
        np.savez(path, mean=self.mean, scale=self.scale, components=self.components,
                 explained_variance_ratio=self.explained_variance_ratio, dims=self.dims, l2=self.l2,
                 meta=json.dumps(self.meta))

    @classmethod
    def load(cls, path: str | Path) -> Projection:
        with np.load(path) as f:
            return cls(f["mean"], f["scale"], f["components"], f["explained_variance_ratio"], int(f["dims"]),
                       bool(f["l2"]), json.loads(str(f["meta"])))


def sample_rows(hidden: np.ndarray, size: int = 1_000_000, seed: int = 0) -> np.ndarray:
    """float32 [min(size, n), d]: a random subset of rows (sorted, so a memory map is read in order)."""
    n = hidden.shape[0]
    if size >= n:
        return np.asarray(hidden, dtype=np.float32)
    rows = np.sort(np.random.default_rng(seed).choice(n, size, replace=False))
    return np.asarray(hidden[rows], dtype=np.float32)


def fit_projection(sample: np.ndarray, n_components: int = 256, dims: int = 64, *, znorm: bool = True,
                   l2: bool = True, eps: float = 1e-6, chunk: int = 65536,
                   max_bytes: int = 2 * 2**30) -> Projection:
    """Fit mean / std and PCA on ``sample`` float [m, d] (DReSD fits both on ~1M stored states).

    scikit-learn does the fitting: ``StandardScaler`` (mean and variance, ``chunk`` rows at a time; scale =
    sqrt(var + eps), so a constant dimension cannot divide by zero) and ``PCA`` of the scaled sample in
    float64 (the eigen-decomposition of its d x d covariance), or ``IncrementalPCA`` over ``chunk``-row
    batches when the float64 copy would exceed ``max_bytes``. ``n_components`` and ``dims`` are capped at d.
    Each component's sign is fixed so that its largest-magnitude entry is positive.
    """
    from sklearn.decomposition import PCA, IncrementalPCA
    from sklearn.preprocessing import StandardScaler

    m, d = sample.shape
    if m < 2:
        raise ValueError(f"need at least 2 sample vectors to fit a projection, got {m}")
    c = min(n_components, d)
    if m < c:
        raise ValueError(f"{m} sample vectors cannot fit {c} principal components (--components); give a larger "
                         "corpus or fewer components")
    scaler = StandardScaler()
    for i in range(0, m, chunk):
        scaler.partial_fit(np.asarray(sample[i:i + chunk], dtype=np.float64))
    mean = scaler.mean_
    scale = np.sqrt(scaler.var_ + eps) if znorm else np.ones(d)
    scaled = lambda rows: (np.asarray(rows, dtype=np.float64) - mean) / scale  # noqa: E731
    if m * d * 8 <= max_bytes:
        pca = PCA(n_components=c, svd_solver="covariance_eigh").fit(scaled(sample))
    else:
        pca = IncrementalPCA(n_components=c)
        for rows in np.array_split(np.arange(m), -(-m // chunk)):  # near-equal batches of <= chunk rows
            pca.partial_fit(scaled(sample[rows[0]:rows[-1] + 1]))
    components = pca.components_.copy()
    components *= np.sign(components[np.arange(c), np.abs(components).argmax(1)])[:, None]
    meta = {"sample_size": int(m), "znorm": znorm, "eps": eps, "n_components": c}
    return Projection(mean.astype(np.float32), scale.astype(np.float32), components.astype(np.float32),
                      pca.explained_variance_ratio_.astype(np.float32), min(dims, c), l2, meta)
