"""The target's greedy outputs: the references greedy replay scores drafters against (:mod:`specnb.eval.replay`).

Greedy decoding is deterministic for one model, dtype, device and forward path, so each prompt is decoded once
and cached under ``cache_dir()/references/<machine key>/`` (:func:`specnb.core.roofline.machine_key`) with the token
budget it was decoded to: a shorter budget is the first tokens of a longer one, so the notebooks that replay the
same prompts (02, 03, 04, 06, 07, 08, 10) share one decode per prompt, and a rerun decodes nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ..atomic import write_text
from ..core.generate import generate
from ..core.prompts import Conversation, Prompt, check_follow_ups, encode_prompt
from ..core.roofline import machine_key
from ..eval.replay import Reference, teacher_forced_hidden
from ..model.models import LoadedModel
from ..paths import artifact_path


def reference_path(target: LoadedModel, prompt_ids: torch.Tensor) -> Path:
    """The cache file of one prompt's reference: keyed by the prompt's token ids."""
    digest = hashlib.sha256(np.asarray(prompt_ids, dtype=np.int64).tobytes())
    return artifact_path("references", machine_key(target), f"{digest.hexdigest()[:20]}.json")


def cached_output(path: Path, max_new_tokens: int) -> list[int] | None:
    """The first ``max_new_tokens`` of the cached output at ``path`` when it was decoded to at least that
    budget (or stopped at EOS before it), else None."""
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    output = stored["output"]
    if stored["max_new_tokens"] >= max_new_tokens or len(output) < stored["max_new_tokens"]:
        return output[:max_new_tokens]
    return None


def greedy_references(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int) -> list[Reference]:
    """(prompt ids int64 [L], greedy output int64 [T <= max_new_tokens]) per prompt, from the cache or decoded
    (plain AR through :func:`specnb.core.generate.generate`) and cached; a cached longer output is cut (greedy decoding
    to a shorter budget gives its first tokens). A follow-up prompt (:attr:`Prompt.follows`)
    sees its earlier turn's reference as the answer, as in :func:`specnb.eval.bench.run_bench`."""
    check_follow_ups(prompts)
    references, conversation = [], Conversation(target)
    for prompt in prompts:
        prompt = conversation.resolve(prompt)
        ids = encode_prompt(target, prompt)
        path = reference_path(target, ids)
        output = cached_output(path, max_new_tokens)
        if output is None:  # not decoded yet, or to a shorter budget: decode, and keep the longer one
            output = generate(target, ids, max_new_tokens=max_new_tokens).tokens
            write_text(path, json.dumps({"prompt": prompt.id, "max_new_tokens": max_new_tokens, "output": output}))
        conversation.record(prompt.id, output)
        references.append((ids, torch.tensor(output, dtype=torch.long)))
    return references


def sampled_references(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int, temperature: float,
                       seed: int = 0) -> list[Reference]:
    """(prompt ids int64 [L], output int64 [T <= max_new_tokens]) per prompt: the target's own output sampled at
    ``temperature`` (plain AR, :func:`specnb.core.generate.generate` with ``seed``), decoded once and cached beside
    the greedy references, keyed by prompt, temperature, seed and budget (a rerun, or a resumed one, decodes only
    what is missing). What decoding at that temperature hands a drafter to continue."""
    check_follow_ups(prompts)
    references = []
    for prompt in prompts:
        ids = encode_prompt(target, prompt)
        path = reference_path(target, ids)
        path = path.with_name(f"{path.stem}-T{temperature:g}-s{seed}-n{max_new_tokens}.json")
        if path.exists():
            output = json.loads(path.read_text())["output"]
        else:
            output = generate(target, ids, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed).tokens
            write_text(path, json.dumps({"prompt": prompt.id, "temperature": temperature, "seed": seed,
                                         "max_new_tokens": max_new_tokens, "output": output}))
        references.append((ids, torch.tensor(output, dtype=torch.long)))
    return references


def references_and_states(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int
                          ) -> tuple[list[Reference], list[torch.Tensor]]:
    """:func:`greedy_references` and, for drafters that read the target's state (DReSD), the hidden states of
    one teacher-forced pass over each (float32 [L + T, d])."""
    references = greedy_references(target, prompts, max_new_tokens)
    return references, [teacher_forced_hidden(target, ids, output) for ids, output in references]
