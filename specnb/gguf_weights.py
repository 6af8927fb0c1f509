"""A model's linear layers over its GGUF file's quantized blocks: ``load_model(..., weights="gguf")``.

The embedded models ship as GGUF files; ``specnb models fetch`` converts each to a float32 safetensors checkpoint
for Hugging Face's model, which specnb loads in bf16 or fp32. With ``weights="gguf"``, every projection of the
decoder and the output head whose tensor the file stores in a block format of
:data:`specnb.kernels.quant.FORMATS` computes over those blocks instead (:func:`specnb.kernels.quant.linear`):
a call streams the bytes the file holds, and multiplies with the file's own values (``d * q`` in fp32), not
their bf16 rounding. Norms, biases and the input embedding's row lookup stay dense. ``weights="gguf-int8"``
multiplies the same blocks (those of :data:`~specnb.kernels.quant.INT8_FORMATS`) with input rows rounded to int8
(:mod:`specnb.kernels.quant`): another model, with its own greedy references. Hugging Face's modules keep
their dense weights, so ``kernels.stock`` still runs the stock model.
"""

from __future__ import annotations

import types
from pathlib import Path

from torch import Tensor, nn
from transformers import PreTrainedModel

from .kernels import quant
from .kernels.quant import FORMATS, INT8_FORMATS, QuantizedWeight

# Hugging Face module (under model.layers.<i>.) -> GGUF tensor (blk.<i>.<name>.weight)
PROJECTIONS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
# whose GGUF rows are in Hugging Face's order (llama.cpp permutes Llama's q / k rows for its rotary layout)
ARCHITECTURES = ("gemma3_text", "qwen2")


def quantized(module: nn.Module) -> QuantizedWeight | None:
    """The blocks a linear layer computes over, or None where it runs on its dense weight."""
    return getattr(module, "_specnb_blocks", None)


def _forward(self: nn.Linear, x: Tensor) -> Tensor:
    return quant.linear(x, self._specnb_blocks, self.bias)


def attach(model: PreTrainedModel, path: str | Path, int8: bool = False) -> int:
    """Route ``model``'s projections and output head through the blocks of the GGUF file at ``path`` (``int8``:
    with int8 activations where the format has that route).

    Each tensor is checked against its module's shape before any is attached. Returns the bytes of the blocks
    attached. Raises ValueError for an architecture whose rows GGUF permutes, a missing tensor or a shape
    that does not match.
    """
    import gguf

    config = model.config.get_text_config()
    if config.model_type not in ARCHITECTURES:
        raise ValueError(f"GGUF weights: {config.model_type} is not supported; use one of {', '.join(ARCHITECTURES)}")
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    layers = model.get_decoder().layers
    wanted: list[tuple[nn.Linear, str]] = [(layers[i].get_submodule(module), f"blk.{i}.{name}.weight")
                                           for i in range(len(layers)) for module, name in PROJECTIONS.items()]
    head_name = "output.weight" if "output.weight" in tensors else "token_embd.weight"  # tied: the embedding
    wanted.append((model.get_output_embeddings(), head_name))
    blocks = []
    for module, name in wanted:
        if name not in tensors:
            raise ValueError(f"GGUF weights: {path} has no tensor {name}")
        if tensors[name].tensor_type.name not in FORMATS:  # stored dense (F32 / F16): the module's weight
            continue
        weight = QuantizedWeight.from_gguf(tensors[name], int8 and tensors[name].tensor_type.name in INT8_FORMATS)
        if weight.shape != tuple(module.weight.shape):
            raise ValueError(f"GGUF weights: {name} is {weight.shape}, the model's layer {tuple(module.weight.shape)}")
        blocks.append((module, weight))
    for module, weight in blocks:
        module._specnb_blocks = weight
        module.forward = types.MethodType(_forward, module)
    model._specnb_gguf = str(path)
    model._specnb_int8 = int8
    return sum(weight.nbytes for _, weight in blocks)


def gguf_bytes(model: nn.Module) -> tuple[int, int]:
    """(bytes of the attached blocks, dense bytes of the layers they replace): what a call streams less."""
    stored = dense = 0
    for module in {id(m): m for m in model.modules()}.values():
        if (weight := quantized(module)) is not None:
            stored += weight.nbytes
            dense += module.weight.numel() * module.weight.element_size()
    return stored, dense


def uses_gguf(model: nn.Module) -> bool:
    """Whether ``model`` computes over a GGUF file's blocks (:func:`attach`)."""
    return getattr(model, "_specnb_gguf", None) is not None


def uses_int8(model: nn.Module) -> bool:
    """Whether ``model``'s blocks multiply int8-rounded activations (``attach(..., int8=True)``)."""
    return getattr(model, "_specnb_int8", False)

