"""One causal-LM call split in two explicit steps: the decoder body, then the output head.

Hugging Face's ``model(...)`` does both, but its head is a plain ``F.linear`` over the whole vocabulary. For
Llama, Qwen2 and Gemma-3 models both steps are specnb's own (:func:`specnb.model.decoder.body`), on every device;
for other architectures, and inside :func:`specnb.model.decoder.stock`, Hugging Face's decoder runs and the model's
head weight goes through :class:`specnb.model.decoder.OutputHead` all the same.
"""

from __future__ import annotations

import functools
import inspect

from torch import Tensor
from transformers import PreTrainedModel

from .decoder import OutputHead, body, dense_head
from .device import model_device


def output_head(model: PreTrainedModel) -> OutputHead:
    """The head :func:`forward` applies to ``model``'s hidden states: specnb's decoder's where it runs, else
    one over the model's own head weight."""
    lean = body(model)
    return lean.head if lean is not None else dense_head(model)


def forward(model: PreTrainedModel, input_ids: Tensor, *, last_only: bool = False,
            **kwargs) -> tuple[Tensor, Tensor]:
    """Run ``model`` on ``input_ids`` [B, S] (``kwargs`` go to its decoder: cache, mask, positions).

    The host/device boundary of every model call in specnb: ``input_ids`` and ``position_ids`` may be host
    tensors and are moved to the model's device here (masks from :class:`specnb.model.masks.TreeMasks` are built there).
    The KV cache is passed as ``past_key_values`` (specnb's name for it everywhere); Hugging Face's decoder gets
    it under the name its transformers release takes.
    Returns ``(logits, hidden)`` on the model's device: logits [B, S, V] (or [B, 1, V] with ``last_only``)
    and the final hidden states [B, S, d] after the last norm, i.e. the LM head's input.
    """
    device = model_device(model)
    if kwargs.get("position_ids") is not None:
        kwargs["position_ids"] = kwargs["position_ids"].to(device, non_blocking=True)
    input_ids = input_ids.to(device, non_blocking=True)
    if (lean := body(model)) is not None:  # specnb's decoder: explicit tensor code, the same cache and masks
        hidden, head = lean(input_ids, **kwargs), lean.head
    else:
        decoder = model.get_decoder()
        if "past_key_values" in kwargs and _takes_cache(type(decoder)):
            kwargs["cache"] = kwargs.pop("past_key_values")
        hidden, head = decoder(input_ids=input_ids, **kwargs).last_hidden_state, dense_head(model)
    return head(hidden[:, -1:] if last_only else hidden), hidden


@functools.cache
def _takes_cache(decoder: type) -> bool:
    """Whether Hugging Face's decoder class takes its KV cache as ``cache``: transformers 5.x renamed
    ``past_key_values`` to it and removes the old name in 5.40 (a FutureWarning on every call until then); older
    5.x releases know only ``past_key_values``."""
    return "cache" in inspect.signature(decoder.forward).parameters
