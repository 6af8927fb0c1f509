"""Attention masks for calls whose queries see an arbitrary set of keys: draft trees on a KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .device import model_device

if TYPE_CHECKING:  # importing it costs seconds (transformers' modeling code); a type only
    from transformers import PretrainedConfig, PreTrainedModel


class TreeMasks:
    """Attention masks for calls whose queries see an arbitrary set of keys (draft trees on a KV cache).

    Hugging Face models accept a float mask [1, 1, q, K] (0 = attend, dtype-min = blocked) in place of the
    causal one, and a dict of them, one per layer type, for models that mix full and sliding-window layers
    (Gemma 3). Positions are absolute, so a sliding-window layer also hides keys more than ``window``
    positions behind the query. Masks are built on the model's device: only the tree block crosses over.
    """

    def __init__(self, config: PretrainedConfig, dtype: torch.dtype, device: torch.device):
        """Masks of a model of (text) ``config`` whose activations are ``dtype`` on ``device``."""
        self.layer_types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))
        self.sliding_window = getattr(config, "sliding_window", None)
        self.dtype, self.device = dtype, device

    @classmethod
    def of(cls, model: PreTrainedModel) -> TreeMasks:
        """The masks of a Hugging Face model with its weights."""
        return cls(model.config.get_text_config(), next(model.parameters()).dtype, model_device(model))

    def __call__(self, allowed: Tensor, query_pos: Tensor, key_pos: Tensor,
                 prefix: int = 0) -> Tensor | dict[str, Tensor]:
        """Masks [1, 1, q, prefix + n] on the model's device.

        allowed: bool [q, n] (host), which of the last n keys each query may see; the first ``prefix`` keys
        (the cache, at positions 0..prefix-1) are visible to every query. query_pos [q], key_pos [n]: the
        positions of the queries and of the last n keys (host).
        """
        allowed, query_pos, key_pos = (t.to(self.device, non_blocking=True) for t in (allowed, query_pos, key_pos))
        masks = {kind: self.mask(allowed, query_pos, key_pos, prefix, kind) for kind in self.layer_types}
        return masks["full_attention"] if self.layer_types == ["full_attention"] else masks

    def mask(self, allowed: Tensor, query_pos: Tensor, key_pos: Tensor, prefix: int, kind: str) -> Tensor:
        """The mask [1, 1, q, prefix + n] of layers of type ``kind`` (arguments as for ``__call__``, on the
        model's device)."""
        blocked = torch.finfo(self.dtype).min
        mask = torch.zeros(allowed.shape[0], prefix + allowed.shape[1], dtype=self.dtype, device=self.device)
        mask[:, prefix:].masked_fill_(~allowed, blocked)
        if kind == "sliding_attention" and self.sliding_window:
            keys = torch.cat([torch.arange(prefix, device=self.device), key_pos])
            mask.masked_fill_(keys[None, :] <= query_pos[:, None] - self.sliding_window, blocked)
        return mask[None, None]
