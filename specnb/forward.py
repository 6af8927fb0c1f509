"""One causal-LM call split in two explicit steps: the decoder body, then the output head.

Hugging Face's ``model(...)`` does both, but its head is a plain ``F.linear`` over the whole vocabulary. Here
calls of up to :data:`specnb.kernels.MAX_ROWS` rows (every decoding and verification call) go through
:func:`specnb.kernels.linear`, which streams the head's weight once and gives each row the bits it would get
alone (Gemma-3's 262k x 640 head is ~60% of its weights, so this is the largest single cost of a call).
Larger calls in float32 use a copy of the weight prepacked for oneDNN, built on the first such call only
(one more head-sized buffer, 0.7 GB for Gemma-3 in fp32; ~2.5x faster than ``F.linear`` for many rows).
A head over GGUF blocks (:mod:`specnb.gguf_weights`) computes every call over them.
"""

from __future__ import annotations

import functools
import inspect
import weakref

import torch
from torch import Tensor
from transformers import PreTrainedModel

from . import kernels
from .decoder import body
from .device import model_device
from .gguf_weights import quantized
from .kernels import quant


class OutputHead:
    """Logits from final hidden states: ``[..., d] -> [..., V]`` (float, the model's softcapping applied)."""

    def __init__(self, model: PreTrainedModel):
        self.weight = model.get_output_embeddings().weight.detach()
        self.softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self.bias = getattr(model.get_output_embeddings(), "bias", None)
        self.blocks = quantized(model.get_output_embeddings())  # GGUF blocks (specnb.gguf_weights), or None
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
        if self.blocks is not None:
            logits = quant.linear(flat, self.blocks, self.bias)
        elif kernels.usable(flat, self.weight):  # few rows: stream the weight once, rows exact
            logits = kernels.linear(flat, self.weight, self.bias)
        elif (packed := self._onednn()) is not None:
            logits = torch._C._nn.mkldnn_linear(flat.contiguous().to_mkldnn(), packed, None).to_dense()
        else:
            logits = torch.nn.functional.linear(flat, self.weight, self.bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.reshape(*hidden.shape[:-1], -1)


# (id of the head's weight, its device, its dtype, id of its GGUF blocks) -> its OutputHead, dropped with the
# weight. Device and dtype are part of the key because moving or casting a model (``model.to(...)``) keeps the
# Parameter object and replaces its data.
_HEADS: dict[tuple[int, torch.device, torch.dtype, int], OutputHead] = {}


def output_head(model: PreTrainedModel) -> OutputHead:
    """The model's :class:`OutputHead`, built once per head weight and device (a self-draft shares its
    target's)."""
    weight = model.get_output_embeddings().weight
    key = (id(weight), weight.device, weight.dtype, id(quantized(model.get_output_embeddings())))
    if key not in _HEADS:
        _HEADS[key] = OutputHead(model)
        weakref.finalize(weight, _HEADS.pop, key, None)
    return _HEADS[key]


def forward(model: PreTrainedModel, input_ids: Tensor, *, last_only: bool = False,
            **kwargs) -> tuple[Tensor, Tensor]:
    """Run ``model`` on ``input_ids`` [B, S] (``kwargs`` go to its decoder: cache, mask, positions).

    The host/device boundary of every model call in specnb: ``input_ids`` and ``position_ids`` may be host
    tensors and are moved to the model's device here (masks from :class:`specnb.masks.TreeMasks` are built there).
    The KV cache is passed as ``past_key_values`` (specnb's name for it everywhere); Hugging Face's decoder gets
    it under the name its transformers release takes.
    Returns ``(logits, hidden)`` on the model's device: logits [B, S, V] (or [B, 1, V] with ``last_only``)
    and the final hidden states [B, S, d] after the last norm, i.e. the LM head's input.
    """
    device = model_device(model)
    if kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = kwargs["position_ids"].to(device, non_blocking=True)
    input_ids = input_ids.to(device, non_blocking=True)
    if (lean := body(model)) is not None:  # explicit tensor code over the same weights, cache and masks
        hidden = lean(input_ids, **kwargs)
    else:
        decoder = model.get_decoder()
        if "past_key_values" in kwargs and _takes_cache(type(decoder)):
            kwargs["cache"] = kwargs.pop("past_key_values")
        hidden = decoder(input_ids=input_ids, **kwargs).last_hidden_state
    return output_head(model)(hidden[:, -1:] if last_only else hidden), hidden


@functools.cache
def _takes_cache(decoder: type) -> bool:
    """Whether Hugging Face's decoder class takes its KV cache as ``cache``: transformers 5.x renamed
    ``past_key_values`` to it and removes the old name in 5.40 (a FutureWarning on every call until then); older
    5.x releases know only ``past_key_values``."""
    return "cache" in inspect.signature(decoder.forward).parameters
