"""The model n-gram tables (N-Grammys §4.1): unigram ranking and bigram table derived from the target's own
weights, cached per model under ``<cache>/ngram/``, with ``specnb ngram-table``. The drafters that read them are
in :mod:`specnb.drafters.model_ngram`.

* **Unigram**: scores from the output embeddings ``u_x`` under the input-embedding covariance
  ``C = E^T E / |X|`` (``<a, b>_V = a^T C b``). Two rules: ``"distance"`` is the paper's §4.1 text,
  ``p(x) ~ exp(-||u_x - mean(u)||_V)``; ``"appendix"`` is its Appendix B.1 code, which ranks tokens by the
  *lowest* ``<mean(u), u_x>_V``. On Gemma-3 the distance rule ranks rare, barely trained tokens first (they
  sit near the mean) while the appendix rule ranks `` ``, ``(``, ``.``, ``,``, ``\n`` first, so it is the
  default. The top-k of the ranking are k one-token drafts, whatever the context.
* **Bigram**: ``p_M(. | x)`` for every token x, i.e. the target run on ``[bos, x]`` alone. The top-K next
  tokens of each x are computed in batches once per model and forward path and cached on disk. Gemma's vocabulary has
  262,144 tokens (hours on 2 CPU cores), so the table may hold rows for only a subset of x ("the tokens
  seen in a corpus / the prompt set"); :func:`bigram_table` computes missing rows on demand and grows
  the cache. A root without a row gets no bigram drafts (reported as ``covered=False``).
* **Extended bigram**: row j of token x is ``[y_j, g(y_j), g(g(y_j)), ...]`` where ``y_j`` is x's j-th
  bigram successor and ``g`` the bigram's top-1 successor (greedy chaining). It is an O(1) lookup table
  ``[N, K, W]`` built from the bigram table at load time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..atomic import atomic_file
from ..model.forward import forward
from ..model.models import LoadedModel
from ..paths import artifact_path, safe_name

TABLE_VERSION = 1
K_MAX = 32  # successors a bigram row keeps unless a drafter's k asks for more


class NgramTableError(ValueError):
    """A missing, corrupt or mismatched n-gram table."""


# ------------------------------------------------------------------------------------------ identity


def model_fingerprint(target: LoadedModel) -> str:
    """A short hash of the embedding shapes and a few embedding rows: tables built for another model
    (or another tokenizer) are refused instead of silently giving useless drafts."""
    emb = target.modules.get_input_embeddings().weight
    out = target.modules.get_output_embeddings().weight
    digest = hashlib.sha1(f"{tuple(emb.shape)}|{tuple(out.shape)}|{len(target.tokenizer)}".encode())
    digest.update(target.embedding_rows(slice(0, 4)).float().cpu().numpy().round(4).tobytes())
    digest.update(target.embedding_rows(slice(out.shape[0] - 4, None), output=True).float().cpu().numpy().round(4)
                  .tobytes())
    return digest.hexdigest()[:16]


def table_dir(target: LoadedModel) -> Path:
    """``<cache>/ngram/<model name>-<fingerprint>``: where this model's unigram and bigram live."""
    return artifact_path("ngram", f"{safe_name(target.name)}-{model_fingerprint(target)}")


def _save_atomic(path: Path, **arrays: np.ndarray) -> None:
    """Write an .npz next to ``path`` and rename it into place: an interrupted build leaves nothing."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def _meta(target: LoadedModel, **extra) -> np.ndarray:
    meta = dict(version=TABLE_VERSION, model=target.name, fingerprint=model_fingerprint(target),
                tokenizer=getattr(target.tokenizer, "name_or_path", "") or type(target.tokenizer).__name__,
                vocab_size=target.vocab_size, **extra)
    return np.array(json.dumps(meta))


def _load_checked(path: Path, target: LoadedModel) -> tuple[dict, dict[str, np.ndarray]]:
    try:
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError) as exc:
        raise NgramTableError(f"corrupt n-gram table {path}: {exc}; delete it to rebuild") from None
    if meta.get("version") != TABLE_VERSION or meta.get("fingerprint") != model_fingerprint(target):
        raise NgramTableError(f"n-gram table {path} was built for {meta.get('model')!r} "
                              f"(tokenizer {meta.get('tokenizer')!r}), not for {target.name!r}; delete it to rebuild")
    return meta, arrays


# ------------------------------------------------------------------------------------------- unigram


@torch.inference_mode()
def unigram_distances(target: LoadedModel) -> Tensor:
    """d(x) for every token, float32 [V] (smaller = more probable under the model unigram).

    ``d(x)^2 = (u_x - u_bar)^T C (u_x - u_bar)`` with ``C = E^T E / |X|`` (E: input embeddings [V, d],
    u: output embeddings [V, d]); evaluated as a row-wise quadratic form, never forming a V x V matrix.
    """
    emb = target.model.get_input_embeddings().weight.detach().float()  # [V, d]
    out = target.model.get_output_embeddings().weight.detach().float()  # [V, d]
    cov = emb.T @ emb / emb.shape[0]  # [d, d]
    centred = out - out.mean(0, keepdim=True)  # [V, d]
    return ((centred @ cov) * centred).sum(1).clamp(min=0).sqrt()


@torch.inference_mode()
def unigram_scores(target: LoadedModel, rule: str = "appendix") -> Tensor:
    """float32 [V], larger = more probable: ``-d(x)`` (rule ``distance``) or ``-<mean(u), u_x>_V``
    (rule ``appendix``, the paper's code)."""
    if rule == "distance":
        return -unigram_distances(target)
    if rule != "appendix":
        raise ValueError(f"unknown unigram rule {rule!r}; use 'appendix' or 'distance'")
    emb = target.model.get_input_embeddings().weight.detach().float()  # [V, d]
    out = target.model.get_output_embeddings().weight.detach().float()  # [V, d]
    cov = emb.T @ emb / emb.shape[0]  # [d, d]
    return -(out @ (cov @ out.mean(0)))


def unigram_ranking(target: LoadedModel, top: int = 1024, rule: str = "appendix") -> np.ndarray:
    """The ``top`` most probable unigram tokens under ``rule``, int64 [top], best first; cached per model."""
    path = table_dir(target) / f"unigram-{rule}.npz"
    if path.exists():
        meta, arrays = _load_checked(path, target)
        if arrays["ranking"].shape[0] >= top:
            return arrays["ranking"][:top].astype(np.int64)
    scores = unigram_scores(target, rule)
    ranking = torch.topk(scores, min(top, scores.shape[0])).indices.cpu().numpy().astype(np.int32)
    _save_atomic(path, ranking=ranking, meta=_meta(target, kind="unigram", rule=rule))
    return ranking.astype(np.int64)


# -------------------------------------------------------------------------------------------- bigram


@dataclass
class BigramTable:
    """Top-K successors of a set of tokens under the target.

    tokens:   int64 [N] the tokens x that have a row (sorted).
    topk:     int64 [N, K] the K most probable next tokens after ``[bos, x]``, best first.
    logprobs: float32 [N, K] their log-probabilities.
    row_of:   int64 [V] row of token x in the arrays above, -1 when x has no row.
    meta:     how it was built (model, tokenizer, vocab size, K, dtype, prefix).
    """

    tokens: np.ndarray
    topk: np.ndarray
    logprobs: np.ndarray
    row_of: np.ndarray
    meta: dict = field(default_factory=dict)
    _chains: np.ndarray | None = field(default=None, repr=False)

    @property
    def k_max(self) -> int:
        return self.topk.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (the extended chains too, once built)."""
        arrays = (self.tokens, self.topk, self.logprobs, self.row_of, self._chains)
        return sum(a.nbytes for a in arrays if a is not None)

    def extended(self, w: int) -> np.ndarray:
        """The extended-bigram lookup table, int64 [N, K, w]: row j of x is ``y_j`` followed by greedy
        top-1 chaining; -1 once the chain reaches a token without a row. Built once, then sliced."""
        if self._chains is None or self._chains.shape[2] < w:
            top1 = np.full(self.row_of.shape[0] + 1, -1, dtype=np.int64)  # index -1 (last) maps to -1
            top1[self.tokens] = self.topk[:, 0]
            chains = np.empty((*self.topk.shape, max(w, 16)), dtype=np.int64)
            chains[:, :, 0] = self.topk
            for t in range(1, chains.shape[2]):  # one vectorised gather per depth
                chains[:, :, t] = top1[chains[:, :, t - 1]]
            self._chains = chains
        return self._chains[:, :, :w]

    def rows(self, token: int, k: int, w: int) -> np.ndarray | None:
        """Extended-bigram drafts after ``token``: int64 [min(k, K), w] padded with -1, or None (no row)."""
        row = self.row_of[token]
        return None if row < 0 else self.extended(w)[row, :k]


def bigram_path(target: LoadedModel) -> Path:
    """``<table_dir>/bigram-<dtype>-<backend>.npz``: the rows are the target's own logits, so each forward path
    (``bf16`` / ``gguf-int8`` blocks, bfloat16 / float32 activations) keeps its own table."""
    return table_dir(target) / f"bigram-{target.dtype_name}-{target.backend}.npz"


def bigram_table(target: LoadedModel, tokens: np.ndarray | list[int] | None = None, k_max: int = K_MAX,
                 batch_size: int = 256, chain_depth: int = 15, progress: bool = True) -> BigramTable:
    """Load this model's bigram table, computing the rows it lacks for ``tokens`` (None = every token).

    Missing rows are computed in batches of ``batch_size`` (target run on ``[bos, x]``, last-position
    logits only) and the enlarged table is written back atomically. Rows are then added for the top-1
    successors of new rows, ``chain_depth`` times, so that extended-bigram chains from the requested
    tokens do not stop early. ValueError for a ``k_max`` outside [1, vocabulary] or a ``batch_size`` below 1.
    """
    vocab = target.vocab_size
    if not 1 <= k_max <= vocab or batch_size < 1:
        raise ValueError(f"need 1 <= k_max <= {vocab} (the vocabulary) and batch_size >= 1; got {k_max}, {batch_size}")
    wanted = np.arange(vocab) if tokens is None else np.unique(np.asarray(tokens, dtype=np.int64))
    if wanted.size and (wanted.min() < 0 or wanted.max() >= vocab):
        raise NgramTableError(f"bigram tokens must lie in [0, {vocab})")
    path = bigram_path(target)
    have = np.empty(0, np.int64), np.empty((0, k_max), np.int64), np.empty((0, k_max), np.float32)
    if path.exists():
        meta, arrays = _load_checked(path, target)
        if arrays["topk"].shape[1] >= k_max:
            k_max = arrays["topk"].shape[1]
            have = arrays["tokens"].astype(np.int64), arrays["topk"].astype(np.int64), arrays["logprobs"]
    known, topk, logprobs = have
    missing = np.setdiff1d(wanted, known)
    added = False
    for _ in range(chain_depth + 1):
        if missing.size == 0:
            break
        new_topk, new_logprobs = _compute_rows(target, missing, k_max, batch_size, progress)
        known, topk, logprobs = (np.concatenate([known, missing]), np.concatenate([topk, new_topk]),
                                 np.concatenate([logprobs, new_logprobs]))
        added = True
        missing = np.setdiff1d(np.unique(new_topk[:, 0]), known)
    order = np.argsort(known)
    known, topk, logprobs = known[order], topk[order], logprobs[order]
    dtype = target.dtype_name
    meta = dict(kind="bigram", k_max=k_max, prefix="bos" if _bos(target) is not None else "none",
                dtype=dtype, rows=int(known.shape[0]))
    if added:
        _save_atomic(path, tokens=known.astype(np.int32), topk=topk.astype(np.int32),
                     logprobs=logprobs.astype(np.float32), meta=_meta(target, **meta))
    row_of = np.full(vocab, -1, dtype=np.int64)
    row_of[known] = np.arange(known.shape[0])
    return BigramTable(known, topk, logprobs, row_of, meta)


def _bos(target: LoadedModel) -> int | None:
    return target.tokenizer.bos_token_id


@torch.inference_mode()
def _compute_rows(target: LoadedModel, tokens: np.ndarray, k_max: int, batch_size: int,
                  progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Top-k_max of p(. | [bos, x]) for each x in ``tokens`` [n]: (int64 [n, k], float32 [n, k])."""
    bos = _bos(target)
    ids = torch.as_tensor(tokens, dtype=torch.long)[:, None]  # [n, 1]
    if bos is not None:  # condition on the sequence start, as every real context has it
        ids = torch.cat([torch.full_like(ids, bos), ids], dim=1)  # [n, 2]
    out_ids, out_lp = [], []
    bar = tqdm(total=ids.shape[0], desc=f"bigram rows ({target.name})", unit="tok", disable=not progress)
    for start in range(0, ids.shape[0], batch_size):
        batch = ids[start:start + batch_size]
        logits = forward(target, batch, last_only=True)[0][:, -1].float()
        top = torch.topk(torch.log_softmax(logits, -1), k_max, dim=-1)
        out_ids.append(top.indices)
        out_lp.append(top.values)
        bar.update(batch.shape[0])
    bar.close()
    return torch.cat(out_ids).cpu().numpy().astype(np.int64), torch.cat(out_lp).cpu().numpy()


def corpus_tokens(target: LoadedModel, texts: list[str]) -> np.ndarray:
    """Distinct token ids of ``texts`` (int64, sorted): a vocabulary restriction for the bigram table."""
    ids = target.tokenizer(texts, add_special_tokens=False).input_ids
    return np.unique(np.concatenate([np.asarray(x, dtype=np.int64) for x in ids] or [np.empty(0, np.int64)]))


def default_restriction(target: LoadedModel) -> tuple[np.ndarray | None, str]:
    """The bigram rows to build when none are named: every token for vocabularies up to 65,536, else the
    tokens of the HumanEval and MT-Bench prompts (with their chain closure). Returns (tokens, description)."""
    if target.vocab_size <= 65_536:
        return None, "all tokens"
    from ..core.datasets import humaneval, mtbench

    texts = [p.text for p in humaneval() + mtbench() if p.text]
    return corpus_tokens(target, texts), "tokens of the HumanEval + MT-Bench prompts"
