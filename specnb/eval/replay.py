"""Greedy replay: what a drafter would achieve, computed from the target's greedy output, without the target.

Greedy speculative decoding reproduces the target's greedy output exactly, so once that output is known
(from one AR run) every call's outcome is too: the accepted length is the longest draft path that equals
the output from the root on, and the next root follows it. Replaying a drafter therefore costs only its
own proposals — grids of draft shapes and datastore sizes become cheap. Wall times are not replayed; a
roofline table can price the calls instead (:func:`modelled_speed`), and then a router that knows every
step's outcome (:class:`specnb.drafters.hindsight.HindsightRouter`) shows what a router's estimates cost.

Drafters that read the target's hidden state (DReSD) get the states of one teacher-forced forward pass
over prompt + output (:func:`teacher_forced_hidden`): the same states decoding would hand them, up to
float rounding between call shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.accept import longest_path, matches_output, passes_with_ancestors, source_row
from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.metrics import CallStats, RunStats
from ..datastores.history import rows_after
from ..drafters.hindsight import HindsightRouter
from ..drafters.priced import BUDGETS
from ..model.forward import forward
from ..model.models import LoadedModel

Reference = tuple[Tensor, Tensor]  # (prompt ids [L], the target's greedy output [T])


def replay_greedy(drafter: Drafter, prompt_ids: Tensor, output: Tensor | list[int],
                  hidden: Tensor | None = None) -> RunStats:
    """Per-call statistics of ``drafter`` under greedy decoding of ``output`` after ``prompt_ids``.

    hidden: float [L + T, d], the target's last hidden state at every position of prompt + output (needed
    only by drafters with ``needs_hidden_state``). Returns a RunStats whose calls carry drafted nodes, depth,
    accepted length, accepted row, the rows greedy acceptance reads and the drafter's report; all times are 0.
    """
    if drafter.needs_hidden_state and hidden is None:
        raise ValueError(f"{type(drafter).__name__} reads the target's hidden state: pass hidden= "
                         "(see teacher_forced_hidden)")
    output = torch.as_tensor(output, dtype=torch.long)
    tokens = torch.cat([torch.as_tensor(prompt_ids, dtype=torch.long), output])
    n_prompt, n_out = tokens.shape[0] - output.shape[0], output.shape[0]
    stats = RunStats(prompt_tokens=n_prompt)
    drafter.reset(tokens[:n_prompt])
    pos = n_prompt  # index of the current root in ``tokens`` (the first output token comes from prefill)
    while pos < n_prompt + n_out - 1:
        remaining = n_prompt + n_out - 1 - pos  # tokens still to produce after the root
        state_hidden = None if hidden is None else hidden[pos - 1]  # the state that produced the root
        draft = drafter.propose(DecodeState(tokens[:pos + 1], state_hidden, remaining - 1, n_prompt))
        draft = Draft.empty() if draft is None else draft.truncate(remaining - 1)
        matches = matches_output(draft, tokens[pos + 1:pos + 1 + draft.max_depth])
        nodes = longest_path(draft, matches)
        accepted = nodes.shape[0]
        # greedy acceptance reads the root's row and every passing node's: what a CPU's head computes depends on it
        passing = np.flatnonzero(passes_with_ancestors(draft.parents.numpy(), matches.numpy()))
        rows_read = int(passing[-1]) + 2 if passing.size else 1
        drafter.update(tokens[pos + 1:pos + 2 + accepted], nodes)
        stats.calls.append(CallStats(drafted_nodes=draft.num_nodes, draft_depth=draft.max_depth,
                                     accepted=accepted, new_tokens=accepted + 1, draft_seconds=0.0,
                                     verify_seconds=0.0, overhead_seconds=0.0,
                                     accepted_row=source_row(draft, nodes), rows_read=rows_read,
                                     all_rows=draft.all_rows, report=drafter.report))
        pos += accepted + 1
    return stats


def replay_many(make: Callable[[], Drafter], references: list[Reference],
                hidden: list[Tensor] | None = None) -> list[RunStats]:
    """:func:`replay_greedy` of a fresh ``make()`` drafter on each reference (with its hidden states)."""
    hidden = hidden or [None] * len(references)
    return [replay_greedy(make(), prompt, output, h) for (prompt, output), h in zip(references, hidden, strict=True)]


@torch.inference_mode()
def teacher_forced_hidden(target: LoadedModel, prompt_ids: Tensor, output: Tensor) -> Tensor:
    """float32 [L + T, d]: the target's last hidden states over prompt + output in one forward pass."""
    ids = torch.cat([torch.as_tensor(prompt_ids, dtype=torch.long), torch.as_tensor(output, dtype=torch.long)])
    _, hidden = forward(target, ids[None], last_only=True)
    return hidden[0].float()


def retrieval_ceiling(references: list[Reference], depth: int) -> float:
    """The most tokens per call any drafter that retrieves from text it has seen can reach at depth ``depth``.

    Text seen at a step: this request's prompt and output up to the root, and the outputs of the references
    before it in the list (what SuffixDecoding searches; pld and suffix draft subtrees of it). At each root the
    best such draft is the tree of every earlier continuation of the root token, ``depth`` tokens deep and of
    any size: it accepts the most, and taking the most at every step is optimal, because the occurrence that
    gave ``b`` tokens at one root still gives the rest of them at any root it passes, so accepting fewer never
    lets a later call reach further.

    references: in request order, as :func:`replay_greedy` takes them. Returns (new tokens - one prefill token
    per reference) / calls, as :mod:`specnb.core.metrics` counts tokens per call.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    history = np.empty(0, dtype=np.int64)  # earlier outputs, each followed by a -1 that matches no token
    calls = produced = 0
    for prompt_ids, output in references:
        tokens = torch.cat([torch.as_tensor(prompt_ids, dtype=torch.long), torch.as_tensor(output)]).numpy()
        n_prompt, end = tokens.shape[0] - len(output), tokens.shape[0] - 1
        pos = n_prompt  # the current root; the first output token came from the prefill
        while pos < end:
            future = tokens[pos + 1:pos + 1 + min(depth, end - pos - 1)]
            calls, pos = calls + 1, pos + 1 + longest_retrieved(tokens[:pos + 1], history, future)
        history = np.concatenate([history, tokens[n_prompt:], [-1]])
        produced += end - n_prompt
    return produced / calls if calls else float("nan")


def longest_retrieved(context: np.ndarray, history: np.ndarray, future: np.ndarray) -> int:
    """How many tokens of ``future`` follow some earlier occurrence of the root (``context[-1]``) in
    ``context`` (int [n]) or in ``history`` (int [h], -1 between texts)."""
    best = 0
    for text, seen in ((context, context.shape[0] - 1), (history, history.shape[0])):  # the root itself excluded
        starts = np.flatnonzero(text[:seen] == context[-1]) + 1
        if starts.size and future.size:  # a continuation stops where the seen text ends (-1): no look ahead
            agree = rows_after(text, starts, future.size) == future
            best = max(best, int(np.logical_and.accumulate(agree, axis=1).sum(axis=1).max()))
    return best


# ------------------------------------------------------------------ modelled speed and the hindsight router


def modelled_speed(drafter: Drafter, references: list[Reference], cost: Any) -> tuple[float, float]:
    """(tokens per call, tokens per second) of ``drafter`` replayed over ``references`` in request order.

    One drafter throughout, so what it keeps across requests grows as in a run. Every call is priced at
    ``cost.chain_seconds`` (a :class:`specnb.core.roofline.CostModel`) of its draft's node count at its context
    length: the target's time as this machine's roofline table models it, with no prefill, drafting or loop
    overhead and none of the machine's noise. Tokens per call counts as :mod:`specnb.core.metrics` does (the
    prefill's token is not a call's).
    """
    return _priced([replay_greedy(drafter, prompt, output) for prompt, output in references], references, cost)


def _priced(runs: list[RunStats], references: list[Reference], cost: Any) -> tuple[float, float]:
    produced = sum(call.new_tokens for stats in runs for call in stats.calls)
    calls = sum(len(stats.calls) for stats in runs)
    seconds = sum(priced_seconds(stats, cost) for stats in runs)
    return (produced / calls, produced / seconds) if calls else (float("nan"), float("nan"))


def priced_seconds(stats: RunStats, cost: Any, shape: tuple[int, int] | None = None) -> float:
    """The roofline price of a replayed run's target calls (drafting, acceptance and prefill excluded): each
    call as ``cost.seconds_at`` (a :class:`specnb.core.roofline.CostModel`) prices a ``shape`` (k, w) call, or by
    default one row of the call's drafted nodes after the root, at the call's context length: what the KV cache
    holds before it (the prompt, then every call's new tokens), as the table measured it; plus
    ``cost.head_correction``: the table's call computed every logits row, where the call's head computes those
    its acceptance read (and the ones computed with them). (1, 0) prices AR."""
    new = np.array([call.new_tokens for call in stats.calls], dtype=np.int64)
    context = stats.prompt_tokens + np.cumsum(new) - new
    seconds = 0.0
    for call, ell in zip(stats.calls, context, strict=True):
        k, w = shape or (1, call.drafted_nodes)
        seconds += cost.seconds_at(k, w, int(ell)) + cost.head_correction(
            k * (w + 1), call.drafted_nodes + 1, call.rows_read, call.all_rows)
    return seconds


def ar_priced_seconds(references: list[Reference], cost: Any) -> float:
    """The roofline price of AR decoding the references: one (1, 0) call per output token after the first (which
    the prefill produces), as :func:`priced_seconds` prices a run."""
    return sum(cost.seconds_at(1, 0, int(ell)) for prompt, output in references
               for ell in prompt.shape[0] + np.arange(output.shape[0] - 1))


def router_ceiling(members: dict[str, Drafter], references: list[Reference], cost: Any,
                   budgets: tuple[int, ...] = BUDGETS) -> tuple[float, float, dict[str, int]]:
    """(tokens per call, tokens per second, calls each member drafted) of
    :class:`~specnb.drafters.hindsight.HindsightRouter` over ``members`` replayed over ``references`` in request
    order, priced as :func:`modelled_speed` prices."""
    router = HindsightRouter(members, cost, budgets)
    runs = []
    for prompt, output in references:
        router.read_ahead(prompt, output)
        runs.append(replay_greedy(router, prompt, output))
    return (*_priced(runs, references, cost), dict(router.picks))
