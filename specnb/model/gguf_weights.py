"""A GGUF file as specnb's decoder reads it: the settings in its metadata and its tensors as stored.

The embedded models ship as GGUF files. With ``load_model(..., weights="gguf")`` specnb's decoder
(:meth:`specnb.model.decoder.Body.from_gguf`) runs the model the file holds: every projection and the output head
multiply the file's quantized blocks (:func:`specnb.model.kernels.quant.linear`: ``d * q`` in fp32, not their bf16
rounding), norms and biases are the file's fp32 values, the input embedding decodes the rows of a call's
tokens from their blocks. ``weights="gguf-int8"`` multiplies the same blocks (repacked once for that route)
with input rows rounded to int8 per block: another model, with its own greedy references. The Hugging Face
model beside it gives the config; its dense weights load only when something runs it (the stock baseline,
:func:`specnb.model.models.stock`), and nothing of it is patched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .gguf_file import GGUFTensor, open_gguf
from .kernels.quant import FORMATS, QuantizedWeight

# GGUF architecture -> Hugging Face model_type
ARCHITECTURES = {"gemma3": "gemma3_text", "llama": "llama", "qwen2": "qwen2"}
GEMMA_SWA_PATTERN = 6  # llama.cpp's Gemma 3 default: every 6th layer global, the rest sliding
GEMMA_SWA_BASE = 10_000.0  # llama.cpp's Gemma 3 default rotary base of the sliding layers


@dataclass(frozen=True)
class Settings:
    """The decoder's settings from a GGUF file's metadata (llama.cpp's defaults where a key is absent)."""

    arch: str  # GGUF architecture: one of ARCHITECTURES
    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    layer_types: tuple[str, ...]  # "full_attention" | "sliding_attention" per layer
    rope_base: dict[str, float]  # per layer type
    window: int | None  # sliding layers' window
    scaling: float  # attention score scale
    attn_softcap: float | None
    final_softcap: float | None
    embed_scale: float | None  # Gemma multiplies the embedding rows by sqrt(dim)

    @property
    def gemma(self) -> bool:
        """Gemma-style norms (stored as 1 + w, before and after each block) and GELU-tanh activations."""
        return self.arch == "gemma3"


@dataclass(frozen=True)
class GGUFWeights:
    """A file's settings and tensors: block formats as :class:`QuantizedWeight`, the rest float32 [N, K] / [N]."""

    path: str
    settings: Settings
    tensors: dict[str, QuantizedWeight | Tensor]

    def tensor(self, name: str) -> QuantizedWeight | Tensor:
        if name not in self.tensors:
            raise ValueError(f"GGUF weights: {self.path} has no tensor {name}")
        return self.tensors[name]

    def optional(self, name: str) -> QuantizedWeight | Tensor | None:
        return self.tensors.get(name)

    @property
    def head_name(self) -> str:
        """The output head's tensor: its own, or the token embedding where the two are tied."""
        return "output.weight" if "output.weight" in self.tensors else "token_embd.weight"


def _settings(fields: dict, path: str) -> Settings:
    arch = fields.get("general.architecture")

    def value(key: str, default=None):
        return fields.get(key.format(arch=arch), default)

    def required(key: str):
        if (found := value(key)) is None:
            raise ValueError(f"GGUF weights: {path} has no {key.format(arch=arch)} in its metadata")
        return found

    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF weights: {path} holds a {arch!r} model; supported: {', '.join(ARCHITECTURES)}")
    if value("{arch}.rope.scaling.type", "none") not in ("none", None):
        raise ValueError(f"GGUF weights: {path} scales its rotary embedding, which specnb's decoder does not do")
    layers, dim = required("{arch}.block_count"), required("{arch}.embedding_length")
    heads = required("{arch}.attention.head_count")
    head_dim = value("{arch}.attention.key_length", dim // heads)
    base = float(value("{arch}.rope.freq_base", 10_000.0))
    gemma = arch == "gemma3"
    if gemma:
        pattern = value("{arch}.attention.sliding_window_pattern", GEMMA_SWA_PATTERN)
        types = tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers))
    else:
        types = ("full_attention",) * layers
    rope_base = {"full_attention": base}
    if "sliding_attention" in types:
        rope_base["sliding_attention"] = float(value("{arch}.rope.freq_base_swa", GEMMA_SWA_BASE))
    return Settings(
        arch=arch, layers=int(layers), dim=int(dim), heads=int(heads),
        kv_heads=int(value("{arch}.attention.head_count_kv", heads)), head_dim=int(head_dim),
        eps=float(required("{arch}.attention.layer_norm_rms_epsilon")), layer_types=types, rope_base=rope_base,
        window=value("{arch}.attention.sliding_window") if gemma else None,
        scaling=float(value("{arch}.attention.scale", head_dim ** -0.5)),
        attn_softcap=value("{arch}.attn_logit_softcapping"), final_softcap=value("{arch}.final_logit_softcapping"),
        embed_scale=math.sqrt(dim) if gemma else None)


def read(path: str, int8: bool = False) -> GGUFWeights:
    """The settings and tensors of the file at ``path`` (``int8``: block weights take int8 activations,
    :meth:`QuantizedWeight.from_gguf`): blocks as stored, the rest decoded to float32. Raises ValueError for an
    unsupported architecture or setting."""
    import gguf
    import numpy as np

    file = open_gguf(path)
    if any(t.name == "rope_freqs.weight" for t in file.tensors):  # llama.cpp's form of Llama 3's rope scaling
        raise ValueError(f"GGUF weights: {path} scales its rotary embedding (rope_freqs), which specnb's decoder "
                         "does not do")
    settings = _settings(file.fields, path)
    tensors: dict[str, QuantizedWeight | Tensor] = {}
    for t in file.tensors:
        if settings.arch == "llama" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            t = unpermute_rows(t, settings.heads if t.name.endswith("q.weight") else settings.kv_heads)
        kind = t.tensor_type.name
        if kind in FORMATS:
            tensors[t.name] = QuantizedWeight.from_gguf(t, int8)
        elif kind in ("F32", "F16", "BF16"):
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            tensors[t.name] = torch.from_numpy(np.array(data, dtype=np.float32, copy=True))
        else:
            raise ValueError(f"GGUF weights: {path}'s {t.name} is {kind}; specnb decodes {', '.join(FORMATS)}, "
                             f"F32, F16 and BF16")
    return GGUFWeights(path, settings, tensors)


def unpermute_rows(tensor: GGUFTensor, heads: int) -> GGUFTensor:
    """A Llama q or k projection in Hugging Face's row order. llama.cpp's converter stores each head's rows with
    the two rotary halves interleaved (row ``2j + t`` of a head holds Hugging Face's ``t * head_dim / 2 + j``);
    rows are whole, so blocks move with them."""
    import numpy as np

    rows = tensor.data.shape[0]
    order = np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(rows)
    return replace(tensor, data=tensor.data[order])


def check_matches(path: str, s: Settings, config) -> None:
    """Raise ValueError unless the settings ``s`` of the file at ``path`` agree with the Hugging Face ``config``
    (the tokenizer's and the stock baseline's model) on the shapes that matter."""
    expected = {"model_type": ARCHITECTURES[s.arch], "hidden_size": s.dim, "num_attention_heads": s.heads,
                "num_key_value_heads": s.kv_heads}
    got = {key: getattr(config, key, None) for key in expected}
    if got != expected:
        raise ValueError(f"GGUF weights: {path} holds {expected}, the model's config says {got}")
    if config.num_hidden_layers > s.layers:
        raise ValueError(f"GGUF weights: {path} has {s.layers} layers, the model {config.num_hidden_layers}")
    types = tuple(getattr(config, "layer_types", None) or ("full_attention",) * config.num_hidden_layers)
    if types[:config.num_hidden_layers] != s.layer_types[:config.num_hidden_layers] \
            or (s.window is not None and getattr(config, "sliding_window", None) != s.window):
        raise ValueError(f"GGUF weights: {path}'s sliding layers or window differ from the model's config")
