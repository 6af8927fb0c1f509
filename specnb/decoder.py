"""The decoder body as a few screens of explicit tensor code over a Hugging Face model's own weights.

A decoding step of a small model is mostly dispatch: Hugging Face's Gemma-3 layer spends ~10 PyTorch ops on
each of its six RMS norms and ~20 on the rotary embedding, and each op and module call costs microseconds of
Python and dispatcher time. For Gemma-3-270M at one token that was ~10 ms of a ~34 ms call (the weights
take ~14 ms to stream). :class:`Body` runs the same layers with one kernel call per step that matters: the
norm (:func:`specnb.kernels.rms_norm`), the split into heads with the q/k norm and rotary embedding
(:func:`specnb.kernels.heads`), the fused q/k/v and gate/up projections, and the exact attention. The
weights, the KV cache (any ``transformers`` ``Cache``, :class:`specnb.kv_cache.GrowingCache` in practice)
and the masks (:class:`specnb.masks.TreeMasks`) are the ones the Hugging Face model uses.

Decoding and verification calls (one row of up to :data:`specnb.kernels.MAX_QUERIES` tokens) then run the
whole stack in one C++ call, :func:`specnb.kernels.decoder_layers`: the same steps as :meth:`Layer.__call__`
on the same kernels and ATen ops, so the same bits, without ~75 us of Python per layer between them (~1.3 ms
of a Gemma-3-270M token). :class:`Layer` stays the reference the tests hold it to, and the path for
prefills, broadcast batch calls and activations the C++ stack does not know.

The arithmetic is Hugging Face's, rounded at the same places (norms in fp32, bf16 results where its bf16 ops
round), so logits agree with ``model(...)`` to rounding; and every step keeps rows bit-independent, so a
verified draft still gets the bits of decoding its tokens one at a time. Supported: Llama, Qwen2 and Gemma-3
text models on the CPU with specnb's kernels (:func:`body` returns None otherwise and the Hugging Face
decoder runs).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel

from . import kernels
from .gguf_weights import quantized, uses_gguf, uses_int8
from .kernels import quant
from .kernels.quant import FORMATS, QuantizedWeight
from .masks import TreeMasks

ARCHITECTURES = {"llama": False, "qwen2": False, "gemma3_text": True}  # model_type -> Gemma-style norms


@dataclass
class Norm:
    """An RMS norm: y = x * rsqrt(mean(x^2) + eps) * scale (fp32 scale [d]; Gemma's is 1 + w, applied before
    rounding; Llama's and Qwen2's is w, applied after rounding to the model's dtype)."""

    scale: Tensor
    eps: float
    round_first: bool

    @classmethod
    def of(cls, module: nn.Module, gemma: bool) -> Norm:
        weight = module.weight.detach().float()
        eps = getattr(module, "eps", None) or module.variance_epsilon
        return cls(1.0 + weight if gemma else weight, float(eps), not gemma)

    def spec(self, ext: Any) -> Any:
        """This norm as the extension's ``Norm``."""
        spec = ext.Norm()
        spec.scale, spec.eps, spec.round_first = self.scale, self.eps, self.round_first
        return spec

    def __call__(self, x: Tensor) -> Tensor:
        """x [..., d] -> [..., d] in x's dtype."""
        return kernels.rms_norm(x.reshape(-1, x.shape[-1]), self.scale, self.eps, self.round_first).view(x.shape)


class Layer:
    """One decoder layer's weights and settings, read from the Hugging Face layer."""

    def __init__(self, layer: nn.Module, index: int, kind: str, gemma: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.index, self.kind, self.attn = index, kind, attn
        self.gguf = quantized(attn.q_proj) is not None  # projections over GGUF blocks (specnb.gguf_weights)
        if self.gguf:  # one call per projection: its blocks, formats differ between siblings
            self.qkv = [(quantized(m), m.bias) for m in (attn.q_proj, attn.k_proj, attn.v_proj)]
            self.gate_up = [(quantized(m), m.bias) for m in (mlp.gate_proj, mlp.up_proj)]
            if any(w is None for w, _ in self.qkv + self.gate_up) or quantized(attn.o_proj) is None \
                    or quantized(mlp.down_proj) is None:
                raise NotImplementedError("a layer with projections both dense and over GGUF blocks")
            self.o = quantized(attn.o_proj), attn.o_proj.bias
            self.down = quantized(mlp.down_proj), mlp.down_proj.bias
        else:
            # the weights as the kernels take them: q/k/v and gate/up stacked (kernels.FusedSiblings), so each
            # is one kernel call without the nn.Module machinery around it
            self.qkv, self.gate_up = kernels.stacked(attn.q_proj), kernels.stacked(mlp.gate_proj)
            if self.qkv is None or self.gate_up is None:
                raise NotImplementedError("q/k/v or gate/up not fused by specnb.kernels.install")
            self.o = attn.o_proj.weight, attn.o_proj.bias
            self.down = mlp.down_proj.weight, mlp.down_proj.bias
        self.act = mlp.act_fn
        config = attn.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scaling = attn.scaling
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        self.q_norm = Norm.of(attn.q_norm, gemma) if hasattr(attn, "q_norm") else None
        self.k_norm = Norm.of(attn.k_norm, gemma) if hasattr(attn, "k_norm") else None
        self.input_norm = Norm.of(layer.input_layernorm, gemma)
        self.post_attention_norm = Norm.of(layer.post_attention_layernorm, gemma)
        sandwich = hasattr(layer, "pre_feedforward_layernorm")  # Gemma: norms before and after each block
        self.pre_mlp_norm = Norm.of(layer.pre_feedforward_layernorm, gemma) if sandwich else None
        self.post_mlp_norm = Norm.of(layer.post_feedforward_layernorm, gemma) if sandwich else None

    def spec(self, ext: Any) -> Any | None:
        """This layer as the extension's ``LayerSpec`` (for :func:`specnb.kernels.decoder_layers`), or None
        where the one-call stack cannot run it (an activation other than SiLU / tanh-GELU)."""
        act = _activation(self.act)
        if act is None:
            return None
        spec = ext.LayerSpec()
        if self.gguf:  # one Blocks per projection
            def blocks(weight: QuantizedWeight, bias: Tensor | None) -> Any:
                out = ext.Blocks()
                out.blocks, out.type, out.bias, out.int8 = weight.blocks, FORMATS[weight.format][0], bias, weight.int8
                return out

            spec.qkv_blocks = [blocks(*wb) for wb in self.qkv]
            spec.gate_up_blocks = [blocks(*wb) for wb in self.gate_up]
            spec.o_blocks, spec.down_blocks = [blocks(*self.o)], [blocks(*self.down)]
            spec.q_size, spec.k_size = self.qkv[0][0].shape[0], self.qkv[1][0].shape[0]
            spec.gate_size = self.gate_up[0][0].shape[0]
        else:
            spec.qkv, spec.qkv_bias, (spec.q_size, spec.k_size, _) = self.qkv
            spec.o, spec.o_bias = self.o
            spec.gate_up, spec.gate_up_bias, (spec.gate_size, _) = self.gate_up
            spec.down, spec.down_bias = self.down
        spec.heads, spec.kv_heads, spec.act = self.heads, self.kv_heads, getattr(ext, act)
        spec.scaling = self.scaling if self.scaling is not None else (spec.q_size // self.heads) ** -0.5
        spec.softcap = float(self.softcap or 0.0)
        for name in ("q_norm", "k_norm", "input_norm", "post_attention_norm", "pre_mlp_norm", "post_mlp_norm"):
            norm = getattr(self, name)
            if norm is not None:
                setattr(spec, name, norm.spec(ext))
        return spec

    def __call__(self, x: Tensor, rotary: tuple[Tensor, Tensor], mask: Tensor | None, cache) -> Tensor:
        """x [B, S, d] -> [B, S, d]; appends the call's keys and values to ``cache`` (None: no cache)."""
        B, S, _ = x.shape
        attn, (cos, sin) = self.attn, rotary
        h = self.input_norm(x)
        q, k, v = self._siblings(h, self.qkv)
        q = self._heads(q, self.heads, self.q_norm, cos, sin)  # [B, H, S, D]
        k = self._heads(k, self.kv_heads, self.k_norm, cos, sin)  # [B, Hk, S, D]
        v = v.view(B, S, self.kv_heads, -1).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        out, _ = kernels.attention(attn, q, k, v, mask, scaling=self.scaling, softcap=self.softcap)
        out = self._linear(out.reshape(B, S, -1), *self.o)  # [B, S, H, D] -> [B, S, d]
        if self.pre_mlp_norm is None:  # Llama, Qwen2
            x = x + out
            h = self.post_attention_norm(x)
        else:  # Gemma
            x = x + self.post_attention_norm(out)
            h = self.pre_mlp_norm(x)
        gate, up = self._siblings(h, self.gate_up)
        out = self._linear(self.act(gate) * up, *self.down)
        return x + (out if self.post_mlp_norm is None else self.post_mlp_norm(out))

    def _linear(self, x: Tensor, weight: Any, bias: Tensor | None) -> Tensor:
        return quant.linear(x, weight, bias) if self.gguf else kernels.linear(x, weight, bias)

    def _siblings(self, h: Tensor, weights: Any) -> list[Tensor]:
        """q, k, v (or gate, up) of h: one call over the stacked weight, or one per projection's blocks."""
        if self.gguf:
            return [quant.linear(h, weight, bias) for weight, bias in weights]
        weight, bias, sizes = weights
        return list(kernels.linear(h, weight, bias).split(sizes, dim=-1))

    @staticmethod
    def _heads(x: Tensor, heads: int, norm: Norm | None, cos: Tensor, sin: Tensor) -> Tensor:
        if norm is None:
            return kernels.heads(x, heads, None, 0.0, False, cos, sin)
        return kernels.heads(x, heads, norm.scale, norm.eps, norm.round_first, cos, sin)


def _activation(act: nn.Module) -> str | None:
    """The extension's constant for a Hugging Face activation module that it computes with the same ATen op
    (SiLU; Gemma's tanh GELU unless set to its Python formula), else None."""
    name, inner = type(act).__name__, getattr(act, "act", None)
    if name in ("SiLUActivation", "SiLU"):
        return "ACT_SILU"
    if name == "GELUTanh" and isinstance(inner, functools.partial) and inner.func is F.gelu \
            and inner.keywords == {"approximate": "tanh"}:
        return "ACT_GELU_TANH"
    return None


class Body:
    """``model.get_decoder()`` for decoding and verification: ``input_ids`` [B, S] -> final hidden states
    [B, S, d] (after the last norm), with the same cache, mask and position arguments."""

    def __init__(self, model: PreTrainedModel):
        decoder = model.get_decoder()
        config = model.config.get_text_config()
        gemma = ARCHITECTURES[config.model_type]
        kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        self.embed = decoder.embed_tokens  # Gemma's scales by sqrt(d) in the model's dtype
        self.rotary = decoder.rotary_emb
        self.per_kind_rotary = "layer_type" in inspect.signature(self.rotary.forward).parameters
        layers = decoder.layers[:config.num_hidden_layers]  # a self-draft runs the first layers of its target
        self.layers = [Layer(layer, i, kinds[i], gemma) for i, layer in enumerate(layers)]
        self.norm = Norm.of(decoder.norm, gemma)
        self.kinds = sorted(set(kinds))
        self.window = getattr(config, "sliding_window", None)
        self.masks = TreeMasks(model)
        # the layers as one C++ call (kernels.decoder_layers) where the extension runs them all; else None
        specs = [layer.spec(kernels.extension()) for layer in self.layers]
        self.specs = specs if all(spec is not None for spec in specs) and self.layers else None

    def __call__(self, input_ids: Tensor, past_key_values=None, attention_mask: Tensor | dict | None = None,
                 position_ids: Tensor | None = None, use_cache: bool = True) -> Tensor:
        """Hidden states [B, S, d] in the model's dtype.

        attention_mask: None (causal over the cache and the call) or a float mask [1, 1, S, K] / a dict of them
        per layer type, as :class:`~specnb.masks.TreeMasks` builds. position_ids [1, S]: default, the cache
        length onwards.
        """
        cache = past_key_values if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        S = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past, past + S, device=input_ids.device)[None]
        x = self.embed(input_ids)
        if attention_mask is None:
            masks = self._causal(past, S)
        elif isinstance(attention_mask, dict):
            masks = attention_mask
        else:
            masks = dict.fromkeys(self.kinds, attention_mask)
        if self.per_kind_rotary:
            rotary = {kind: self.rotary(x, position_ids, kind) for kind in self.kinds}
        else:
            rotary = dict.fromkeys(self.kinds, self.rotary(x, position_ids))
        # Decoding and verification calls (one row, a few dozen tokens, masks none or float, no autograd): every
        # layer in one C++ call, the same steps as Layer.__call__ with the same bits, without ~75 us of Python each.
        if self.specs is not None and cache is not None and x.shape[0] == 1 and S <= kernels.MAX_QUERIES \
                and not torch.is_grad_enabled() \
                and all(m is None or m.is_floating_point() for m in masks.values()) \
                and (buffers := cache.reserve(len(self.layers), past + S)) is not None:
            kinds = [layer.kind for layer in self.layers]
            x = kernels.decoder_layers(x, self.specs, [rotary[k][0] for k in kinds], [rotary[k][1] for k in kinds],
                                       [masks[k] for k in kinds], *buffers, past)
            cache.extend(past + S)
            return self.norm(x)
        for layer in self.layers:
            x = layer(x, rotary[layer.kind], masks[layer.kind], cache)
        return self.norm(x)

    def _causal(self, past: int, S: int) -> dict[str, Tensor | None]:
        """Masks for a causal call of S queries after ``past`` cached positions. None where the attention's
        own causal rule is right: our kernel aligns the queries with the last keys; PyTorch's SDPA (calls of
        more than kernels.MAX_QUERIES) only without a cache. Sliding layers need one once keys fall out of the
        window."""
        needed = {kind: (kind == "sliding_attention" and self.window is not None and past + S > self.window)
                  or (S > kernels.MAX_QUERIES and past > 0) for kind in self.kinds}
        if not any(needed.values()):
            return dict.fromkeys(self.kinds)
        positions = torch.arange(past, past + S)
        allowed = torch.ones(S, S, dtype=torch.bool).tril_()
        return {kind: self.masks.mask(allowed, positions, positions, past, kind) if needed[kind] else None
                for kind in self.kinds}


def body(model: PreTrainedModel) -> Body | None:
    """The model's :class:`Body`; None where it does not apply (another architecture, or the model not routed
    through specnb's kernels, e.g. inside :func:`specnb.kernels.stock`). Built once per model object, weights'
    device and dtype, and layer count, and kept on the model (its norm scales are fp32 copies, ~100 KB). The
    model object and the layer count are part of the key because a self-draft is a shallow copy of its target
    (same weights, fewer layers): it must never run the target's body."""
    config = model.config.get_text_config()
    if config.model_type not in ARCHITECTURES or not kernels.routed(model):
        return None
    weight = model.get_input_embeddings().weight
    key = (id(model), weight.device, weight.dtype, weight.data_ptr(), config.num_hidden_layers,
           tuple(getattr(config, "layer_types", None) or ()), uses_gguf(model), uses_int8(model))
    cached = getattr(model, "_specnb_body", None)
    if cached is None or cached[0] != key:
        try:
            lean = Body(model)
        except NotImplementedError:  # layers the kernels did not fuse: Hugging Face's decoder runs them
            lean = None
        cached = model._specnb_body = (key, lean)
    return cached[1]


@functools.cache
def _digest() -> str:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:8]


def call_path(model: PreTrainedModel) -> str:
    """What runs a call of ``model``: ``""`` for PyTorch / Hugging Face alone, else the kernels'
    :func:`~specnb.kernels.routed` name plus ``-body<hash of this file>`` where the :class:`Body` runs and
    ``-gguf`` where layers compute over GGUF blocks (``-gguf-int8`` with int8 activations; the routed name hashes
    their kernels too). Timing tables and greedy
    references are cached under it, so a change to the kernels, the body or the weights measures them again."""
    kernel = kernels.routed(model)
    path = f"{kernel}-body{_digest()}" if kernel and body(model) is not None else kernel
    if not kernel or not uses_gguf(model):
        return path
    return f"{path}-gguf-int8" if uses_int8(model) else f"{path}-gguf"
