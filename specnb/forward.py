"""One causal-LM call split in two explicit steps: the decoder body, then the output head.

Hugging Face's ``model(...)`` does both, but its head is a plain ``F.linear`` over the whole vocabulary. Here
calls of up to :data:`specnb.kernels.MAX_ROWS` rows (every decoding and verification call) go through
:func:`specnb.kernels.linear`, which streams the head's weight once and gives each row the bits it would get
alone (Gemma-3's 262k x 640 head is ~60% of its weights, so this is the largest single cost of a call).
Larger calls in float32 use a copy of the weight prepacked for oneDNN, built on the first such call only
(one more head-sized buffer, 0.7 GB for Gemma-3 in fp32; ~2.5x faster than ``F.linear`` for many rows).
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor
from transformers import PreTrainedModel

from . import kernels
from .device import model_device


class OutputHead:
    """Logits from final hidden states: ``[..., d] -> [..., V]`` (float, the model's softcapping applied)."""

    def __init__(self, model: PreTrainedModel):
        self.weight = model.get_output_embeddings().weight.detach()
        self.softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.bias = getattr(model.get_output_embeddings(), "bias", None)
        self._packed: Tensor | None = None  # oneDNN's blocked layout of the weight, for many-row fp32 calls

    def _onednn(self) -> Tensor | None:
        weight = self.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or self.bias is not None \
                or not torch.backends.mkldnn.is_available():
            return None
        if self._packed is None:
            self._packed = weight.to_mkldnn()
        return self._packed

    def __call__(self, hidden: Tensor) -> Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        if kernels.usable(flat, self.weight):  # few rows: stream the weight once, rows exact
            logits = kernels.linear(flat, self.weight, self.bias)
        elif (packed := self._onednn()) is not None:
            logits = torch._C._nn.mkldnn_linear(flat.contiguous().to_mkldnn(), packed, None).to_dense()
        else:
            logits = torch.nn.functional.linear(flat, self.weight, self.bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.reshape(*hidden.shape[:-1], -1)


# (id of the head's weight, its device, its dtype) -> its OutputHead, dropped with the weight. Device and dtype
# are part of the key because moving or casting a model (``model.to(...)``) keeps the Parameter object and
# replaces its data.
_HEADS: dict[tuple[int, torch.device, torch.dtype], OutputHead] = {}


def output_head(model: PreTrainedModel) -> OutputHead:
    """The model's :class:`OutputHead`, built once per head weight and device (a self-draft shares its
    target's)."""
    weight = model.get_output_embeddings().weight
    key = (id(weight), weight.device, weight.dtype)
    if key not in _HEADS:
        _HEADS[key] = OutputHead(model)
        weakref.finalize(weight, _HEADS.pop, key, None)
    return _HEADS[key]


def forward(model: PreTrainedModel, input_ids: Tensor, *, last_only: bool = False,
            **kwargs) -> tuple[Tensor, Tensor]:
    """Run ``model`` on ``input_ids`` [B, S] (``kwargs`` go to its decoder: cache, mask, positions).

    The host/device boundary of every model call in specnb: ``input_ids`` and ``position_ids`` may be host
    tensors and are moved to the model's device here (masks from :class:`TreeMasks` are built there).
    Returns ``(logits, hidden)`` on the model's device: logits [B, S, V] (or [B, 1, V] with ``last_only``)
    and the final hidden states [B, S, d] after the last norm, i.e. the LM head's input.
    """
    device = model_device(model)
    if kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = kwargs["position_ids"].to(device, non_blocking=True)
    hidden = model.get_decoder()(input_ids=input_ids.to(device, non_blocking=True), **kwargs).last_hidden_state
    return output_head(model)(hidden[:, -1:] if last_only else hidden), hidden


class TreeMasks:
    """Attention masks for calls whose queries see an arbitrary set of keys (draft trees on a KV cache).

    Hugging Face models accept a float mask [1, 1, q, K] (0 = attend, dtype-min = blocked) in place of the
    causal one, and a dict of them, one per layer type, for models that mix full and sliding-window layers
    (Gemma 3). Positions are absolute, so a sliding-window layer also hides keys more than ``window``
    positions behind the query. Masks are built on the model's device: only the tree block crosses over.
    """

    def __init__(self, model: PreTrainedModel):
        config = model.config.get_text_config()
        self.layer_types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))
        self.sliding_window = getattr(config, "sliding_window", None)
        self.dtype = next(model.parameters()).dtype
        self.device = model_device(model)

    def __call__(self, allowed: Tensor, query_pos: Tensor, key_pos: Tensor,
                 prefix: int = 0) -> Tensor | dict[str, Tensor]:
        """Masks [1, 1, q, prefix + n] on the model's device.

        allowed: bool [q, n] (host), which of the last n keys each query may see; the first ``prefix`` keys
        (the cache, at positions 0..prefix-1) are visible to every query. query_pos [q], key_pos [n]: the
        positions of the queries and of the last n keys (host).
        """
        allowed, query_pos, key_pos = (t.to(self.device, non_blocking=True) for t in (allowed, query_pos, key_pos))
        masks = {kind: self._float_mask(allowed, query_pos, key_pos, prefix, kind) for kind in self.layer_types}
        return masks["full_attention"] if self.layer_types == ["full_attention"] else masks

    def _float_mask(self, allowed: Tensor, query_pos: Tensor, key_pos: Tensor, prefix: int, kind: str) -> Tensor:
        blocked = torch.finfo(self.dtype).min
        mask = torch.zeros(allowed.shape[0], prefix + allowed.shape[1], dtype=self.dtype, device=self.device)
        mask[:, prefix:].masked_fill_(~allowed, blocked)
        if kind == "sliding_attention" and self.sliding_window:
            keys = torch.cat([torch.arange(prefix, device=self.device), key_pos])
            mask.masked_fill_(keys[None, :] <= query_pos[:, None] - self.sliding_window, blocked)
        return mask[None, None]
