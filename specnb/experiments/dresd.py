"""The DReSD datastores notebooks 01-03 share (each notebook's study is its own module:
:mod:`specnb.experiments.hidden_states`, :mod:`specnb.experiments.pca_variance`,
:mod:`specnb.experiments.ann_index`): the stores sized by profile, re-keyed by another projection, REST's twin on
the same documents, a prompt's state, the replay table per method, and DReSD's setup
(:data:`PAPER_SETUP`; the drafters themselves run through :func:`specnb.eval.bench.run_bench` or greedy replay).

Datastores (cached under ``<cache>/datastores/dense``, built on first use):

* ``code-OOD``: the CPython standard library (:func:`specnb.datastores.corpus.build_corpus` ``"code"``), truncated;
* ``chat-OOD``: ShareGPT assistant turns (``"chat"``), truncated;
* ``code-ID``: the target's own greedy responses: shipped for Gemma-3-270M (``data/id_code_<model>.jsonl``, made by
  :mod:`specnb.datastores.id_data`), else generated once from the held-out prompts of a user's prompt file or from
  stdlib docstring stubs (:func:`id_responses`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.datasets import PROMPT_SETS, load_prompts
from ..core.prompts import Prompt
from ..datastores.ann import ExactIndex
from ..datastores.corpus import TokenCorpus, source_tag
from ..datastores.dense import (
    BuildConfig,
    DenseDatastore,
    build_datastore,
    datastore_path,
    load_datastore,
    resolve_corpus,
)
from ..datastores.embed import Projection
from ..datastores.rest import RestIndex
from ..eval.runner import summarize
from ..model.models import LoadedModel
from ..paths import artifact_path, safe_name
from ..study.profiles import Profile
from .study_folder import rest_store, study_folder

DATA = Path(__file__).resolve().parents[2] / "data"
ID_BATCH = 16  # ID answers decoded side by side: the same tokens as one at a time, in less time


PAPER_SETUP = {"model": "CodeLlama / Llama-2-Chat 7B and 13B (hidden 4096 / 5120)",
               "hardware": "one NVIDIA V100 32 GB GPU", "dtype": "not stated",
               "datastore": "19-57 M tokens (Table 1)",
               "prompts × tokens": "100 CodeAlpaca × up to 128; 80 MT-Bench first turns",
               "task": "code assistant (CodeAlpaca), chat (MT-Bench)"}
"""DReSD's side of the notebooks' setup tables (:meth:`specnb.study.results.Results.setup`): its models, GPU and
prompt sets (§4.1-4.3) and its datastore sizes (Table 1)."""


def held_out_prompts(profile: Profile) -> list[Prompt]:
    """The prompts of a user's prompt file past the ones the notebooks decode (the first ``max(n_prompts,
    timed_prompts)``), at most ``dresd.id_generated[0]`` of them; [] for a built-in prompt set. DReSD's ID store is
    the target's answers to prompts of the timed ones' distribution that are not themselves timed: its answers to
    the timed prompts would hand it the very outputs it is scored on."""
    if profile.prompts in PROMPT_SETS:
        return []
    used = max(profile.n_prompts, profile.timed_prompts)
    return load_prompts(profile.prompts)[used:used + profile.dresd.id_generated[0]]


def id_responses(target: LoadedModel, profile: Profile) -> Path:
    """The ID responses file for ``target``: shipped in ``data/`` when it holds at least ``dresd.id_generated[0]``
    responses, else the target's greedy answers (``dresd.id_generated[1]`` new tokens each) to the held-out prompts
    of the user's prompt file (:func:`held_out_prompts`) when there are at least half of ``dresd.id_generated[0]``,
    else to that many docstring stubs (``dresd.id_stub_roots``, ``dresd.id_stub_files`` files each); generated
    once into the cache (resumable: an interrupted run keeps every answer it wrote), the source said in one line."""
    from ..datastores.id_data import docstring_stubs, generate_responses
    from ..eval.methods import make_drafter

    wanted, tokens = profile.dresd.id_generated
    shipped = DATA / f"id_code_{Path(target.name).name}.jsonl"
    if shipped.exists() and json.loads(shipped.with_suffix(".meta.json").read_text())["num_responses"] >= wanted:
        return shipped
    held_out = held_out_prompts(profile)
    if 2 * len(held_out) >= wanted:
        digest = hashlib.sha256(json.dumps([p.id for p in held_out]).encode()
                                + Path(profile.prompts).read_bytes()).hexdigest()[:8]
        prompts, tag = held_out, f"held-out-{Path(profile.prompts).stem}-{digest}"
        source = f"{len(held_out)} prompts of {profile.prompts} past the first " \
                 f"{max(profile.n_prompts, profile.timed_prompts)}"
    else:
        roots, files = profile.dresd.id_stub_roots, profile.dresd.id_stub_files
        prompts = docstring_stubs(wanted, max_files=files, roots=roots)  # 200 stdlib files ~20 s; every package ~10 min
        tag = f"{wanted}" if roots == ("stdlib",) else f"{wanted}-{'-'.join(roots)}"
        source = f"{len(prompts)} {' and '.join(roots)} docstring stubs"
        if profile.prompts not in PROMPT_SETS:
            source += f" ({len(held_out)} held-out prompts in {profile.prompts}, fewer than {(wanted + 1) // 2})"
    out = artifact_path("id_data", safe_name(f"id_code_{target.name}-{tag}x{tokens}.jsonl"))
    done = out.read_text().count("\n") if out.exists() and out.with_suffix(".meta.json").exists() else 0
    if done < len(prompts):
        print(f"DReSD's ID data: {target.name}'s answers to {source}")
        generate_responses(target, prompts, out, max_new_tokens=tokens, source=source,
                           drafter=make_drafter("pld", target), batch=ID_BATCH)
    return out


def build_config(profile: Profile) -> BuildConfig:
    """Extraction / index settings of ``profile`` (``dresd.build``: small batches for the tiny smoke models)."""
    return BuildConfig(**profile.dresd.build)


def datastores(target: LoadedModel, profile: Profile, kinds: tuple[str, ...] = ("code-OOD", "code-ID", "chat-OOD"),
               progress: bool = True) -> dict[str, DenseDatastore]:
    """The dense datastores of ``kinds`` for ``target`` at ``profile``'s size (``dresd.store_tokens``: corpus tokens
    per OOD store, whole documents up to the budget; with ``dresd.equal_id_ood`` the code-OOD store's budget is the
    code-ID corpus's tokens instead, so the two differ in their text, not their size; built once, then cached, each
    build resumable: :func:`specnb.datastores.dense.build_datastore`). The code-OOD store's source is
    ``profile.corpus`` (``code``: the stdlib, or a folder / JSONL of the user's:
    :func:`specnb.datastores.corpus.build_corpus`); the code-ID store's, :func:`id_responses`."""
    sizes = dict(profile.dresd.store_tokens)
    if profile.dresd.equal_id_ood and "code-OOD" in kinds:
        sizes["code"] = resolve_corpus(str(id_responses(target, profile)), target).num_tokens
    stores = {}
    for kind in kinds:
        domain, dist = kind.split("-")
        if dist == "ID":
            source, tokens = str(id_responses(target, profile)), None
            digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:8]  # a grown file is another store
            name = f"id-{domain}-{Path(source).stem}-{digest}"
        else:
            source, tokens = (profile.corpus if domain == "code" else domain), sizes[domain]
            name = f"{domain if source == domain else source_tag(source)}-t{tokens}"
        path = datastore_path(name, target.name)
        if path.exists():
            stores[kind] = load_datastore(path)
            stores[kind].check(target)
        else:
            corpus = resolve_corpus(source, target, tokens)
            stores[kind] = build_datastore(target, corpus, path, build_config(profile), progress=progress)
    return stores


def store_corpus(store: DenseDatastore) -> TokenCorpus:
    """The token corpus a dense datastore was built from (so REST can index the very same documents)."""
    return TokenCorpus(np.asarray(store.corpus_tokens()), np.asarray(store.doc_starts()), dict(store.meta["corpus"]))


def with_projection(store: DenseDatastore, projection: Projection, chunk: int = 65536,
                    ann: bool = False) -> DenseDatastore:
    """The same datastore keyed by another projection, searched exactly (for ablations; no index build) or, with
    ``ann``, through an index of the store's own kind (hnswlib or IVF-PQ) built with its own parameters (the
    search decoding uses)."""
    keys = np.ascontiguousarray(projection.transform(store.hidden(), chunk=chunk), dtype=np.float32)
    index = type(store.index).build(keys, store.index.params, progress=False) if ann else ExactIndex(keys)
    return dataclasses.replace(store, keys=keys, projection=projection, index=index)


def rest_twin(store: DenseDatastore, progress: bool = False) -> RestIndex:
    """REST's suffix-array index of exactly the documents ``store`` was built from, built once into the study
    folder (the store notebooks 03, 08 and 09 compare DReSD with)."""
    return rest_store(store_corpus(store), study_folder() / f"rest-{store.path.name}", progress)


def prompt_state(target: LoadedModel, prompt: Prompt) -> tuple[np.ndarray, int]:
    """(hidden float32 [d], root token): the target's last hidden state after ``prompt`` and its greedy token."""
    import torch

    from ..core.prompts import encode_prompt
    from ..model.forward import forward

    ids = encode_prompt(target, prompt)[None]
    with torch.inference_mode():
        logits, hidden = forward(target, ids, last_only=True)
    return hidden[0, -1].float().cpu().numpy(), int(logits[0, -1].argmax())


def replay_methods_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per method of replay rows (index ``method``): calls, acceptance_rate, accepted_length,
    tokens_per_call with their 90% intervals over prompts (``_low`` / ``_high``,
    :func:`specnb.experiments.summarize`) and nodes_per_call."""
    summary = summarize(rows, baseline="").set_index("method")
    columns = [f"{m}{end}" for m in ("acceptance_rate", "accepted_length", "tokens_per_call") for end in ("", "_low",
                                                                                                       "_high")]
    table = summary[["calls", *columns]].copy()
    table["nodes_per_call"] = rows.groupby("method").drafted_nodes.sum() / rows.groupby("method").calls.sum()
    return table
