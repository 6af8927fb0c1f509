"""One target call: the decoder the target loaded with (``decoder`` of
:class:`specnb.model.models.LoadedModel`), then its output head.

Hugging Face's ``model(...)`` does both, but its head is a plain ``F.linear`` over the whole vocabulary; every decoder
here ends in :class:`specnb.model.decoder.OutputHead` (the model's own head weight, or the GGUF file's blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from .kv_cache import GrowingCache

if TYPE_CHECKING:
    from .models import LoadedModel


def forward(target: LoadedModel, input_ids: Tensor, *, cache: GrowingCache | None = None,
            positions: Tensor | None = None, mask: Tensor | dict[str, Tensor] | None = None,
            last_only: bool = False) -> tuple[Tensor, Tensor]:
    """Run ``target`` on ``input_ids`` [B, S] (:func:`hidden_states`, then the head).

    Returns ``(logits, hidden)`` on the model's device: logits [B, S, V] (or [B, 1, V] with ``last_only``) and the
    final hidden states [B, S, d] after the last norm, i.e. the head's input.
    """
    hidden = hidden_states(target, input_ids, cache=cache, positions=positions, mask=mask)
    return target.decoder.head(hidden[:, -1:] if last_only else hidden), hidden


def hidden_states(target: LoadedModel, input_ids: Tensor, *, cache: GrowingCache | None = None,
                  positions: Tensor | None = None, mask: Tensor | dict[str, Tensor] | None = None) -> Tensor:
    """The final hidden states [B, S, d] of ``target`` on ``input_ids`` [B, S] (after the last norm: the head's input),
    on the model's device.

    cache: the KV cache the call reads and appends to (None: none). positions [1, S]: position ids (default: the
    cache length onwards). mask: None (causal) or float masks from :class:`specnb.model.masks.TreeMasks`.
    The host/device boundary of every model call in specnb: ``input_ids`` and ``positions`` may be host tensors and
    are moved to the model's device here (the masks are built there).
    """
    device = target.device
    if positions is not None:
        positions = positions.to(device, non_blocking=True)
    return target.decoder.forward(input_ids.to(device, non_blocking=True), cache, positions, mask)
