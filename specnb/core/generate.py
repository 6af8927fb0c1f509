"""generate(): prefill, then draft -> verify -> accept -> keep KV, until EOS or max_new_tokens.

With ``drafter=None`` the same loop is the autoregressive baseline: every draft is empty, so each call
verifies just the root and produces one token.

The token buffer, drafts and EOS ids live on the host; logits and hidden states on the model's device (see
:mod:`specnb.core.verify`). On a GPU the draft / verify / overhead split of every call is measured between
``synchronize`` points, so ``verify_seconds`` is the device's work, not its kernel launches. The output head runs
as acceptance reads its rows (:mod:`specnb.core.head_rows`); its seconds count as verification.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..model.device import generator as make_generator
from ..model.device import synchronize
from ..model.models import LoadedModel
from .accept import accept, source_row
from .draft import Draft
from .drafter import DecodeState, Drafter
from .metrics import CallStats, RunStats
from .prompts import PromptLike, encode_prompt
from .report import NO_REPORT
from .sampling import SamplingConfig, probabilities, sample
from .verify import Verifier, VerifyMode

CallHook = Callable[[Tensor], None]
"""Called once after prefill and once after every target call with the logits [m, V] (model's device) of
the positions that produced the tokens just committed (prefill: its last position; a call: the root and
every accepted node), e.g. to record the target's top-2 margins where a divergence could come from rounding."""


@dataclass
class Generation:
    """The result of one :func:`generate` call.

    prompt_ids: the encoded prompt; tokens: the new tokens (EOS included if one was produced);
    text: the decoded new tokens; stats: per-call statistics and wall times (see :mod:`specnb.core.metrics`);
    stop_reason: ``"eos"`` or ``"max_new_tokens"``.
    """

    prompt_ids: list[int]
    tokens: list[int]
    text: str
    stats: RunStats
    stop_reason: str


@torch.inference_mode()
def generate(target: LoadedModel, prompt: PromptLike, drafter: Drafter | None = None, *,
             max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
             verify: VerifyMode = "tree", seed: int = 0, stop_at_eos: bool = True,
             on_call: CallHook | None = None) -> Generation:
    """Decode up to ``max_new_tokens`` new tokens from ``prompt`` (text, chat messages or token ids).

    Greedy (``temperature=0``) output equals the target's own greedy output token for token; sampled
    output follows the target's distribution (after temperature and top-p) whatever the drafter.
    on_call: an optional :data:`CallHook` (its time counts as overhead).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    config = SamplingConfig(temperature, top_p)
    prompt_ids = encode_prompt(target, prompt)
    if prompt_ids.shape[0] + max_new_tokens > target.max_context:
        raise ValueError(f"prompt ({prompt_ids.shape[0]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"model's context of {target.max_context} tokens")
    eos = torch.tensor(sorted(target.eos_token_ids) if stop_at_eos else [], dtype=torch.long)
    device = target.device
    generator = make_generator(device, seed)  # sampling draws from probabilities on the model's device
    verifier = Verifier(target, verify, want_hidden=bool(drafter and drafter.needs_hidden_state))
    # One buffer for prompt + output; drafters see a view of its filled part (no copies per step).
    buffer = torch.empty(prompt_ids.shape[0] + max_new_tokens, dtype=torch.long)
    buffer[:prompt_ids.shape[0]] = prompt_ids
    length = prompt_ids.shape[0]
    stats = RunStats(prompt_tokens=length)

    start = time.perf_counter()
    first = verifier.prefill(prompt_ids)
    if on_call is not None:
        on_call(first.logits[-1:])
    logits = first.logits[-1]
    root = int(logits.max(-1).indices) if config.greedy else sample(probabilities(logits, config), generator)
    hidden = None if first.hidden is None else first.hidden[-1]
    synchronize(device)
    stats.prefill_seconds = time.perf_counter() - start
    buffer[length] = root
    length += 1
    if drafter is not None:
        drafter.reset(prompt_ids)
    stop_reason = "eos" if root in target.eos_token_ids and stop_at_eos else "max_new_tokens"

    while stop_reason != "eos" and length - prompt_ids.shape[0] < max_new_tokens:
        remaining = max_new_tokens - (length - prompt_ids.shape[0])
        t0 = time.perf_counter()
        draft = None
        if drafter is not None:
            draft = drafter.propose(DecodeState(buffer[:length], hidden, remaining - 1, prompt_ids.shape[0]))
        draft = Draft.empty() if draft is None else draft.truncate(remaining - 1)
        synchronize(device)
        t1 = time.perf_counter()
        result = verifier.forward(root, draft)
        synchronize(device)
        t2 = time.perf_counter()
        acceptance = accept(draft, result.logits, config, generator)
        rows_read = result.logits.read
        if drafter is not None and drafter.needs_logits:
            seen = result.logits[:result.logits.computed]  # the rows acceptance read, and those computed with them
            drafter.observe(torch.cat([torch.tensor([root]), draft.tokens])[:seen.shape[0]], seen)
        verifier.keep(acceptance.nodes)
        if on_call is not None:
            on_call(result.logits[torch.cat([torch.zeros(1, dtype=torch.long), acceptance.nodes + 1]).to(device)])

        committed = torch.cat([draft.tokens[acceptance.nodes], torch.tensor([acceptance.bonus])])
        hits = torch.nonzero(torch.isin(committed, eos))
        if hits.numel():  # EOS accepted mid-block: keep it, drop what follows
            committed = committed[:int(hits[0]) + 1]
            stop_reason = "eos"
        buffer[length:length + committed.shape[0]] = committed
        length += committed.shape[0]
        root = int(committed[-1])
        if result.hidden is not None:
            last = int(acceptance.nodes[-1]) + 1 if acceptance.nodes.numel() else 0
            hidden = result.hidden[last]
        if drafter is not None:
            drafter.update(committed, acceptance.nodes[:committed.shape[0]])
        synchronize(device)
        t3 = time.perf_counter()
        stats.calls.append(CallStats(
            drafted_nodes=draft.num_nodes, draft_depth=draft.max_depth, accepted=int(acceptance.nodes.numel()),
            new_tokens=int(committed.shape[0]), draft_seconds=t1 - t0, verify_seconds=t2 - t1 + result.logits.seconds,
            overhead_seconds=t3 - t2 - result.logits.seconds,
            accepted_row=source_row(draft, acceptance.nodes), rows_read=rows_read, all_rows=draft.all_rows,
            report=drafter.report if drafter is not None else NO_REPORT))
    stats.decode_seconds = time.perf_counter() - start - stats.prefill_seconds

    tokens = buffer[prompt_ids.shape[0]:length].tolist()
    text = target.tokenizer.decode(tokens, skip_special_tokens=True)
    return Generation(prompt_ids.tolist(), tokens, text, stats, stop_reason)
