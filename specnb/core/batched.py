"""Greedy decoding of several prompts side by side, each row with the bits of decoding it alone.

specnb's decoder on its CPU kernels keeps the rows of a call bit-independent (:mod:`specnb.model.decoder`), and its
attention gives a query the bits it gets over only the keys it sees, blocked keys adding exact zeros. So prompts
left-padded to one length, each row with its own positions and a mask hiding its padding (and, on sliding-window
layers, the keys behind the window), decode to the tokens :func:`specnb.core.generate.generate` gives each prompt
alone, greedy, while every call streams the weights once for all rows. Where rows are not bit-independent (Hugging
Face's decoder, other devices) :func:`rows_exact` is false and callers decode one prompt at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import kernels
from ..model.decoder import Body
from ..model.kv_cache import GrowingCache
from ..model.models import LoadedModel


def rows_exact(target: LoadedModel) -> bool:
    """Whether :func:`greedy_batch` gives each row the bits of decoding it alone: specnb's decoder on its kernels."""
    decoder = target.decoder
    return isinstance(decoder, Body) and bool(kernels.route(decoder.device, decoder.dtype))


def greedy_batch(target: LoadedModel, prompts: list[Tensor], max_new_tokens: int,
                 stop_at_eos: bool = True) -> list[tuple[list[int], str]]:
    """The greedy continuation of each prompt (int64 [P_i] token ids): (new tokens, ``"eos"`` or
    ``"max_new_tokens"``) per prompt, in order, as :func:`~specnb.core.generate.generate` returns them (an EOS
    ends a row and is kept). The rows run until every one has stopped. ValueError where a prompt and
    ``max_new_tokens`` exceed the target's context, or :func:`rows_exact` is false."""
    if not rows_exact(target):
        raise ValueError(f"{target.name}: rows decoded side by side would not have the bits of each alone here")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    body: Body = target.decoder
    lengths = torch.tensor([p.shape[0] for p in prompts])
    width = int(lengths.max())
    if width + max_new_tokens > target.max_context:
        raise ValueError(f"a prompt of {width} tokens + max_new_tokens ({max_new_tokens}) exceeds the model's "
                         f"context of {target.max_context} tokens")
    pads = width - lengths  # [B]: row r's tokens sit at width - P_r .. width - 1
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, (prompt, pad) in enumerate(zip(prompts, pads.tolist(), strict=True)):
        ids[row, pad:] = prompt
    eos = torch.tensor(sorted(target.eos_token_ids) if stop_at_eos else [], dtype=torch.long)
    cache = GrowingCache()
    out = torch.empty(len(prompts), max_new_tokens, dtype=torch.long)
    stopped = torch.zeros(len(prompts), dtype=torch.bool)
    queries, steps = torch.arange(width), 0
    with torch.inference_mode():
        while steps < max_new_tokens and not bool(stopped.all()):
            positions = (queries[None] - pads[:, None]).clamp_(min=0)  # padding's positions are never seen
            hidden = body.forward(ids, cache, positions, _masks(body, pads, queries))
            token = kernels.top_k(body.head(hidden[:, -1]), 1)[:, 0]  # argmax, ties to the lower id (as generate)
            out[:, steps] = token
            stopped |= torch.isin(token, eos)
            ids, queries, steps = token[:, None], queries[-1:] + 1, steps + 1
    results = []
    for row in out[:, :steps].tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in target.eos_token_ids), None) \
            if stop_at_eos else None
        results.append((row[:end], "eos") if end is not None else (row, "max_new_tokens"))
    return results


def _masks(body: Body, pads: Tensor, queries: Tensor) -> dict[str, Tensor]:
    """Float masks [B, 1, S, K] per layer type for queries at padded indices ``queries`` [S] (K = the last + 1):
    causal, each row's padding blocked, and keys a window or more behind the query on sliding-window layers."""
    keys = torch.arange(int(queries[-1]) + 1)
    seen = (keys <= queries[:, None])[None] & (keys >= pads[:, None, None])  # [B, S, K]
    blocked = torch.finfo(body.dtype).min
    masks = {}
    for kind in body.kinds:
        visible = seen
        if kind == "sliding_attention" and body.window is not None:
            visible = seen & (keys > queries[:, None] - body.window)[None]
        masks[kind] = torch.zeros(visible.shape, dtype=body.dtype).masked_fill_(~visible, blocked)[:, None]
    return masks
