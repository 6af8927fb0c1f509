"""What runs a target's forward call, chosen once when the model loads: :data:`Backend`.

``hf``: Hugging Face's decoder modules as shipped (PyTorch's GEMM and attention over the dense checkpoint), for the
families specnb's decoder does not cover and as the stock baseline (:func:`specnb.model.models.stock`); ``dense``:
specnb's decoder (:class:`specnb.model.decoder.Body`) over the checkpoint's weights; ``gguf``: over the GGUF file's
quantized blocks; ``gguf-int8``: over those blocks with int8-rounded activations. Either kind of :data:`Decoder` has
one ``forward(ids, cache, positions, mask)`` returning final hidden states, and its own output ``head``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

import torch
from torch import Tensor

from .decoder import ARCHITECTURES, Body, OutputHead, head_of
from .device import model_device
from .kv_cache import GrowingCache

if TYPE_CHECKING:  # importing it costs seconds (transformers' modeling code); a type only
    from transformers import PreTrainedModel

Backend = Literal["hf", "dense", "gguf", "gguf-int8"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)


@dataclass(frozen=True)
class HFModules:
    """Hugging Face's decoder of ``model`` as shipped, then ``head`` (:class:`specnb.model.decoder.OutputHead` over
    the model's own head weight)."""

    model: PreTrainedModel
    head: OutputHead

    @classmethod
    def of(cls, model: PreTrainedModel) -> HFModules:
        return cls(model, head_of(model))

    backend: Literal["hf"] = "hf"
    uses_gguf = False
    uses_int8 = False

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype."""
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        """The weights' device."""
        return model_device(self.model)

    def forward(self, input_ids: Tensor, cache: GrowingCache | None = None, positions: Tensor | None = None,
                mask: Tensor | dict[str, Tensor] | None = None) -> Tensor:
        """Hidden states [B, S, d] after the last norm (arguments as :meth:`specnb.model.decoder.Body.forward`)."""
        decoder = self.model.get_decoder()
        name = "cache" if _takes_cache(type(decoder)) else "past_key_values"
        return decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=cache is not None,
                       **{name: cache}).last_hidden_state

    def call_path(self) -> str:
        """``""``: no timing table or greedy reference is keyed by a specnb code path here."""
        return ""


Decoder = HFModules | Body


def build_decoder(model: PreTrainedModel, backend: Backend, gguf: str | None = None) -> Decoder:
    """The decoder of ``backend`` for ``model`` (``gguf``: the file the ``gguf`` backends read). ValueError where
    specnb's decoder does not cover the model's family, or a GGUF backend is given no file."""
    if backend == "hf":
        return HFModules.of(model)
    if model.config.get_text_config().model_type not in ARCHITECTURES:
        raise ValueError(f"backend {backend!r}: specnb's decoder covers {', '.join(sorted(ARCHITECTURES))}")
    if backend == "dense":
        return Body.from_hf(model)
    if gguf is None:
        raise ValueError(f"backend {backend!r} needs a GGUF file")
    return Body.from_gguf(model.config.get_text_config(), model.dtype, gguf, int8=backend == "gguf-int8")


def dense_backend(model: PreTrainedModel) -> Backend:
    """The backend of ``model``'s dense weights: specnb's decoder where it covers the family, else ``hf``."""
    return "dense" if model.config.get_text_config().model_type in ARCHITECTURES else "hf"


@functools.cache
def _takes_cache(decoder: type) -> bool:
    """Whether Hugging Face's decoder class takes its KV cache as ``cache``: transformers 5.x renamed
    ``past_key_values`` to it and removes the old name in 5.40 (a FutureWarning on every call until then); older
    5.x releases know only ``past_key_values``."""
    return "cache" in inspect.signature(decoder.forward).parameters
