"""In-distribution (ID) data: the target's own greedy responses, for DReSD's ID datastores (DReSD §4.2.1).

The prompts are disjoint from the evaluation sets (HumanEval, MT-Bench):

* ``code``: a stub of a top-level, public, documented function of the CPython standard library (its
  ``def`` line and docstring, the body removed) -- the same shape as a HumanEval prompt, other functions;
* ``chat``: the first user turn of ShareGPT conversations.

Responses are the target's greedy output, decoded by specnb's loop with prompt lookup drafts or several prompts
side by side (both lossless, so equal to plain greedy decoding; see :func:`generate_responses`). The token ids
are written to a JSONL file (one line per prompt: ``id``, ``prompt_ids``, ``response_ids``, ``stop_reason``) next to a
``.meta.json`` sidecar saying what made them (model, dtype, tokenizer, max_new_tokens, prompt source, seed).
Small files like this ship in ``data/``; :func:`id_corpus` turns one into a
:class:`~specnb.datastores.corpus.TokenCorpus` (document = prompt + response) from which hidden states are
recomputed.

    specnb id-data code --model gemma-3-270m --n 150 --out data/id_code_gemma-3-270m.jsonl
"""

from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np
from torch import Tensor
from tqdm.auto import tqdm

from ..atomic import exclusive, write_text
from ..core.drafter import Drafter
from ..core.prompts import Prompt, encode_prompt
from ..model.models import LoadedModel
from ..paths import artifact_path
from .corpus import CorpusError, TokenCorpus, TokenizerInfo, json_records, python_files, sharegpt_path

# Stdlib folders whose functions are tests, demos or GUI code rather than library code.
_SKIP_PARTS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "__pycache__"}
CODE_INSTRUCTION = "Implement the following Python function.\n\n"


STUB_ROOTS = {"stdlib": lambda: Path(sysconfig.get_paths()["stdlib"]),
              "site-packages": lambda: Path(sysconfig.get_paths()["purelib"])}
"""Where :func:`docstring_stubs` finds functions: the standard library, and the installed packages (numpy, torch,
transformers, ...: tens of thousands more documented functions, for ID stores of millions of tokens)."""


def docstring_stubs(n: int, seed: int = 0, min_doc_chars: int = 60, max_files: int | None = None,
                    roots: tuple[str, ...] = ("stdlib",)) -> list[Prompt]:
    """``n`` random stubs (signature + docstring) of public top-level functions of ``roots`` (names of
    :data:`STUB_ROOTS`), in a seeded order.

    Each prompt's text is the stub (for base models); its chat message asks to implement it. ``max_files``
    limits the scan to the first files of each root (parsing the whole standard library takes ~20 s, the installed
    packages ~85 s). A stub's id is its dotted module path and name (prefixed by the root past the first). The
    stubs are kept in the cache under a digest of the arguments and of every scanned file's path, size and
    modification time, so the paper profile's notebooks parse the packages once, and anew when a file changes.
    """
    files = {name: _stub_files(name, max_files) for name in roots}
    key = [_STUBS_FORMAT, n, seed, min_doc_chars,
           [[name, str(root), [(str(path.relative_to(root)), (st := path.stat()).st_size, st.st_mtime_ns)
                               for path in paths]] for name, (root, paths) in files.items()]]
    cached = artifact_path("id_data", f"stubs-{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]}.json")
    if cached.exists():
        chosen = json.loads(cached.read_text())
    else:
        stubs = _parse_stubs(files, min_doc_chars)
        chosen = [stubs[i] for i in np.random.default_rng(seed).permutation(len(stubs))[:n]]
        write_text(cached, json.dumps(chosen))
    return [Prompt(ident, text=stub, messages=({"role": "user", "content": CODE_INSTRUCTION + stub},))
            for ident, stub in chosen]


_STUBS_FORMAT = 1  # part of the cached stubs' key: bump it when _parse_stubs changes what it returns


def _stub_files(name: str, max_files: int | None) -> tuple[Path, list[Path]]:
    """Root ``name`` of :data:`STUB_ROOTS` and the files :func:`docstring_stubs` scans in it, in order."""
    root = STUB_ROOTS[name]()
    skip = ("site-packages", "__pycache__") if name == "stdlib" else ("__pycache__", "specnb")  # not specnb's own
    paths = python_files(root, max_files, skip)
    return root, [path for path in paths if not _SKIP_PARTS.intersection(path.parts)]


def _parse_stubs(files: dict[str, tuple[Path, list[Path]]], min_doc_chars: int) -> list[list[str]]:
    """[id, stub] of every public documented top-level function in ``files`` (root name -> root, paths), in
    order."""
    stubs = []
    for number, (name, (root, paths)) in enumerate(files.items()):
        for path in paths:
            try:
                source = path.read_text(encoding="utf-8")
                tree = ast.parse(source)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            lines = source.splitlines()
            for node in tree.body:
                if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                    continue
                doc = ast.get_docstring(node)
                if not doc or len(doc) < min_doc_chars:
                    continue
                # From the def line to the end of the docstring statement, as written in the file.
                stub = textwrap.dedent("\n".join(lines[node.lineno - 1:node.body[0].end_lineno])) + "\n"
                ident = ".".join((*([name] if number else []), *path.relative_to(root).with_suffix("").parts,
                                  node.name))
                stubs.append([ident, stub])
    return stubs


def sharegpt_first_turns(n: int, seed: int = 0, max_chars: int = 2000, scan: int = 4000) -> list[Prompt]:
    """``n`` random first user turns (at most ``max_chars`` long) among the first ``scan`` ShareGPT records."""
    turns: list[Prompt] = []
    for number, record in enumerate(json_records(sharegpt_path(), progress=False)):
        if number >= scan:
            break
        conv = record.get("conversations") or ()
        if conv and conv[0].get("from") == "human" and 0 < len(conv[0].get("value", "")) <= max_chars:
            text = conv[0]["value"]
            turns.append(Prompt(f"sharegpt/{record.get('id', number)}", text=text,
                                messages=({"role": "user", "content": text},)))
    order = np.random.default_rng(seed).permutation(len(turns))[:n]
    return [turns[i] for i in order]


PROMPT_SOURCES = {"code": docstring_stubs, "chat": sharegpt_first_turns}


MADE_BY = "specnb.datastores.id_data.generate_responses (specnb.core.generate, greedy)"


def response_meta(target: LoadedModel, max_new_tokens: int, source: str, seed: int, drafts: str = "none") -> dict:
    """The provenance sidecar of a responses file (``drafts``: the drafter that sped it up, which changes nothing
    in it)."""
    info, _ = TokenizerInfo.of(target)
    return {"model": target.name, "dtype": target.dtype_name,
            "weights": target.weights, "tokenizer": info.__dict__, "decoding": "greedy",
            "max_new_tokens": max_new_tokens, "prompts": source, "seed": seed, "chat_template": target.chat,
            "made_by": MADE_BY, "drafts": drafts}


def generate_responses(target: LoadedModel, prompts: list[Prompt], out: str | Path, *, max_new_tokens: int = 128,
                       source: str = "", seed: int = 0, drafter: Drafter | None = None, batch: int = 1) -> Path:
    """Append the target's greedy response to each prompt to the JSONL file ``out`` (resumable).

    Each prompt is decoded by :func:`specnb.core.generate.generate` over the target's own weights, sped up by
    ``drafter`` (lossless: the output is the target's greedy output token for token whatever drafts it). Prompt
    lookup (``specnb.eval.methods.make_drafter("pld", target)``, what ``specnb id-data`` and the notebooks pass)
    answers docstring stubs ~3.7x faster than Hugging Face ``generate`` in batches of 8 on 2 cores (376 against 101
    new tokens a second for Gemma-3-270M). ``batch`` > 1: where :func:`specnb.core.batched.rows_exact`, prompts are
    decoded ``batch`` at a time side by side instead (the same tokens; ``docs/datastores.md`` times it), the next
    ``WINDOW_BATCHES`` batches' prompts grouped by length and written in the given order; prompts over
    ``BATCH_MAX_PROMPT`` tokens are still decoded alone, with ``drafter``. Prompts whose id is
    already in ``out`` are skipped, so an interrupted run continues where it stopped; a file made with other
    settings (model, weights, tokenizer, max_new_tokens, how it was made) is refused (ValueError), and so is a second
    run on the same file while one is writing it (:class:`specnb.atomic.ExistsError`: both would append the same
    answers). The sidecar ``out.meta.json`` records what produced the file. Neither is ever a user's file
    (:func:`check_responses_out`, ValueError before any work).
    """
    out = check_responses_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(out, f"another process is writing answers to {out} right now; wait for it to finish (a rerun "
                   "then resumes after its last answer)"):
        return _write_responses(target, prompts, out, max_new_tokens, source, seed, drafter, batch)


def _write_responses(target: LoadedModel, prompts: list[Prompt], out: Path, max_new_tokens: int, source: str,
                     seed: int, drafter: Drafter | None, batch: int) -> Path:
    """:func:`generate_responses`' work, its file held by this process."""
    from ..core.batched import rows_exact

    meta_path = out.with_suffix(".meta.json")
    batched = batch > 1 and rows_exact(target)
    drafts = f"none (batches of {batch})" if batched else type(drafter).__name__ if drafter else "none"
    meta = response_meta(target, max_new_tokens, source, seed, drafts)
    done: set[str] = set()
    if out.exists() and out.stat().st_size:  # answers of an earlier run, and their sidecar (check_responses_out)
        old = json.loads(meta_path.read_text())
        same = ("model", "weights", "tokenizer", "max_new_tokens", "made_by")
        if {k: old.get(k) for k in same} != {k: meta[k] for k in same}:
            raise ValueError(f"{out} was made with other settings ({old.get('model')}, weights "
                             f"{old.get('weights')}, max_new_tokens={old.get('max_new_tokens')}, by "
                             f"{old.get('made_by')}); choose another --out")
        done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()}
    write_text(meta_path, json.dumps(meta, indent=1) + "\n")  # first, so a stopped run still has its provenance
    todo = [p for p in prompts if p.id not in done]
    start = time.perf_counter()
    step = batch * WINDOW_BATCHES if batched else 1
    with out.open("a") as f, tqdm(total=len(todo), desc=f"responses ({target.name})", unit="prompt") as bar:
        for first in range(0, len(todo), step):
            window = todo[first:first + step]
            answers = _batched(target, window, max_new_tokens, batch, drafter, seed) if batched else \
                [_alone(target, prompt, drafter, max_new_tokens, seed) for prompt in window]
            for prompt, (prompt_ids, tokens, stop_reason) in zip(window, answers, strict=True):
                f.write(json.dumps({"id": prompt.id, "prompt_ids": prompt_ids, "response_ids": tokens,
                                    "stop_reason": stop_reason}) + "\n")
            f.flush()
            bar.update(len(window))
    meta["num_responses"] = len(done) + len(todo)
    meta["seconds_last_run"] = round(time.perf_counter() - start, 1)
    write_text(meta_path, json.dumps(meta, indent=1) + "\n")
    return out


def check_responses_out(out: str | Path, source: str | None = None) -> Path:
    """``out`` as a Path if :func:`generate_responses` may write its responses there and its sidecar beside it;
    ValueError (one line) saying why not, checked before the model loads (``specnb id-data`` calls it first).

    ``out`` must name a file (not a folder) below folders that exist or can be made; an existing non-empty ``out``
    must be a responses file of an earlier run (its sidecar :func:`responses_sidecar` beside it), which a run
    resumes; and an existing ``out.meta.json`` must be such a sidecar: a user's file is never appended to or
    replaced. ``source`` (a key of :data:`PROMPT_SOURCES`): an ``out`` holding answers to another source's
    prompts is refused too, so that a rerun resumes one source and never mixes two.
    """
    if not str(out).strip():
        raise ValueError("--out is empty; name a .jsonl file")
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; name a .jsonl file in it")
    meta_path = out.with_suffix(".meta.json")
    folder = next(parent for parent in out.absolute().parents if parent.exists())
    if not folder.is_dir():
        raise ValueError(f"--out {out}: {folder} is not a folder")
    meta = responses_sidecar(meta_path)
    if (meta_path.exists() or meta_path.is_symlink()) and meta is None:
        raise ValueError(f"{meta_path} exists and is not the sidecar of a responses file of `specnb id-data`; "
                         "refusing to replace it: choose another --out")
    if out.exists() and (not out.is_file() or (out.stat().st_size and meta is None)):
        raise ValueError(f"--out {out} exists and is not a responses file of `specnb id-data` (no {meta_path.name} "
                         "of one beside it); refusing to append to it: choose another --out")
    made = str((meta or {}).get("prompts", ""))
    other = next((name for name in PROMPT_SOURCES if name != source and made.startswith(f"{name}:")), None)
    if source is not None and other is not None:
        raise ValueError(f"{out} holds answers to {other} prompts, not {source}; choose another --out")
    return out


SIDECAR_KEYS = frozenset({"model", "tokenizer", "max_new_tokens", "made_by"})  # in every version's sidecar


def responses_sidecar(path: Path) -> dict | None:
    """The provenance sidecar of a responses file at ``path`` (:func:`response_meta`; an older specnb's, made by
    another decoding, too: a JSON object with every one of :data:`SIDECAR_KEYS`), or None where ``path`` holds
    none."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and SIDECAR_KEYS <= meta.keys() else None


WINDOW_BATCHES = 16  # batches whose prompts are grouped by length before they are decoded (and then written)
BATCH_MAX_PROMPT = 768  # longer prompts decode alone: past ~1,000 tokens attention costs more than batching saves


def _alone(target: LoadedModel, prompt: Prompt | Tensor, drafter: Drafter | None, max_new_tokens: int,
           seed: int) -> tuple[list[int], list[int], str]:
    """(prompt ids, response ids, stop reason) of one prompt decoded by itself."""
    from ..core.generate import generate

    result = generate(target, prompt, drafter, max_new_tokens=max_new_tokens, seed=seed)
    return result.prompt_ids, result.tokens, result.stop_reason


def _batched(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int, batch: int, drafter: Drafter | None,
             seed: int) -> list[tuple[list[int], list[int], str]]:
    """:func:`_alone` of every prompt, in order: prompts of up to :data:`BATCH_MAX_PROMPT` tokens ``batch`` at a
    time, those of similar length side by side (little of a call is padding), the longer ones alone."""
    from ..core.batched import greedy_batch

    ids = [encode_prompt(target, prompt) for prompt in prompts]
    short = sorted((i for i in range(len(prompts)) if ids[i].shape[0] <= BATCH_MAX_PROMPT),
                   key=lambda i: ids[i].shape[0])
    answers = {i: _alone(target, ids[i], drafter, max_new_tokens, seed) for i in range(len(prompts))
               if ids[i].shape[0] > BATCH_MAX_PROMPT}
    for start in range(0, len(short), batch):
        rows = short[start:start + batch]
        for i, (tokens, stop) in zip(rows, greedy_batch(target, [ids[i] for i in rows], max_new_tokens), strict=True):
            answers[i] = (ids[i].tolist(), tokens, stop)
    return [answers[i] for i in range(len(prompts))]


def id_corpus(path: str | Path, responses_only: bool = False) -> TokenCorpus:
    """The documents of a responses file as an in-memory corpus: prompt + response ids (or the response only).

    The corpus carries the tokenizer recorded in the sidecar, so datastores built from it check the model.
    """
    path = Path(path)
    meta_path = path.with_suffix(".meta.json")
    if not path.exists() or not meta_path.exists():
        raise CorpusError(f"no responses file {path} (with {meta_path.name}); make it with `specnb id-data`")
    meta = json.loads(meta_path.read_text())
    docs = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            ids = record["response_ids"] if responses_only else record["prompt_ids"] + record["response_ids"]
            if ids:
                docs.append(np.asarray(ids, dtype=np.int32))
    if not docs:
        raise CorpusError(f"{path} holds no responses")
    lengths = np.array([d.shape[0] for d in docs], dtype=np.int64)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    corpus_meta = {"format": 1, "name": f"id-{path.stem}", "kind": "id", "source": str(path),
                   "tokenizer": meta["tokenizer"], "num_docs": len(docs), "num_tokens": int(doc_starts[-1]),
                   "generated_by": meta["model"]}
    return TokenCorpus(np.concatenate(docs), doc_starts, corpus_meta)
