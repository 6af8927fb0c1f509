"""The target's greedy outputs: the references greedy replay scores drafters against (:mod:`specnb.replay`).

Greedy decoding is deterministic for one model, dtype, device and forward path, so each (prompt, max new tokens)
is decoded once and cached under ``cache_dir()/references/<machine key>/`` (:func:`specnb.roofline.machine_key`):
the notebooks that replay the same prompts (02, 03, 04, 06, 07, 08) share them, and a rerun decodes nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from ..datastores.atomic import write_text
from ..decode import generate
from ..models import LoadedModel
from ..paths import cache_dir
from ..prompts import Conversation, Prompt, check_follow_ups, encode_prompt
from ..replay import Reference, teacher_forced_hidden
from ..roofline import machine_key


def reference_path(target: LoadedModel, prompt_ids: torch.Tensor, max_new_tokens: int) -> Path:
    """The cache file of one reference: keyed by the prompt's token ids and the token budget."""
    digest = hashlib.sha256(np.asarray(prompt_ids, dtype=np.int64).tobytes() + str(max_new_tokens).encode())
    return cache_dir() / "references" / machine_key(target) / f"{digest.hexdigest()[:20]}.json"


def greedy_references(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int) -> list[Reference]:
    """(prompt ids int64 [L], greedy output int64 [T <= max_new_tokens]) per prompt, from the cache or decoded
    (plain AR through :func:`specnb.decode.generate`) and cached. A follow-up prompt (:attr:`Prompt.follows`)
    sees its earlier turn's reference as the answer, as in :func:`specnb.experiments.run`."""
    check_follow_ups(prompts)
    references, conversation = [], Conversation(target)
    for prompt in prompts:
        prompt = conversation.resolve(prompt)
        ids = encode_prompt(target, prompt)
        path = reference_path(target, ids, max_new_tokens)
        if path.exists():
            output = json.loads(path.read_text())["output"]
        else:
            output = generate(target, ids, max_new_tokens=max_new_tokens).tokens
            write_text(path, json.dumps({"prompt": prompt.id, "max_new_tokens": max_new_tokens, "output": output}))
        conversation.record(prompt.id, output)
        references.append((ids, torch.tensor(output, dtype=torch.long)))
    return references


def references_and_states(target: LoadedModel, prompts: list[Prompt], max_new_tokens: int
                          ) -> tuple[list[Reference], list[torch.Tensor]]:
    """:func:`greedy_references` and, for drafters that read the target's state (DReSD), the hidden states of
    one teacher-forced pass over each (float32 [L + T, d])."""
    references = greedy_references(target, prompts, max_new_tokens)
    return references, [teacher_forced_hidden(target, ids, output) for ids, output in references]
