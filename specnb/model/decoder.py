"""specnb's decoder: the body of a Llama, Qwen2 or Gemma-3 model as a few screens of explicit tensor code.

:class:`Body` maps token ids to final hidden states (the output head's input) and owns what it computes
with: the embedding, one :class:`Layer` of weights and settings per decoder layer, the final norm, the rotary
tables and the output head. Two loaders build it: :meth:`Body.from_gguf` reads a GGUF file (settings from its
metadata, projections and head as the file's quantized blocks, :mod:`specnb.model.gguf_weights`), the default for
the embedded models; :meth:`Body.from_hf` reads a Hugging Face model's dense weights (any Llama, Qwen2 or
Gemma-3 checkpoint, the tiny test models). The KV cache (:class:`specnb.model.kv_cache.GrowingCache`) and the masks
(:class:`specnb.model.masks.TreeMasks`) are passed in by the caller.

Each step is one kernel call: the norm (:func:`specnb.model.kernels.rms_norm`), the split into heads with the q/k
norm and rotary embedding (:func:`specnb.model.kernels.heads`), the projections (:func:`specnb.model.kernels.linear` on
dense weights, :func:`specnb.model.kernels.quant.linear` on blocks) and the exact attention. Decoding and
verification calls (one row of up to :data:`specnb.model.kernels.MAX_QUERIES` tokens) run the whole stack in one C++
call, :func:`specnb.model.kernels.decoder_layers`: the same steps as :meth:`Layer.__call__` on the same kernels,
so the same bits, without Python between layers. :meth:`Layer.__call__` stays the reference the tests hold
it to and the path of prefills and broadcast batch calls.

The arithmetic is Hugging Face's, rounded at the same places (norms in fp32, bf16 results where its bf16 ops
round), so logits agree with its model to rounding; every step keeps rows bit-independent, so a verified
draft gets the bits of decoding its tokens one at a time. The kernels run on x86 CPUs; on other devices
(and CPUs without them) each step is PyTorch's op instead, on the same path. Hugging Face's decoder runs only
for other architectures and inside :func:`stock` (the reference of the tests).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel

from . import kernels
from .gguf_weights import GGUFWeights, check_matches, gguf_path, read, uses_gguf, uses_int8
from .kernels import memory, quant
from .kernels.quant import FORMATS, QuantizedWeight
from .masks import TreeMasks

ARCHITECTURES = {"llama": False, "qwen2": False, "gemma3_text": True}  # model_type -> Gemma-style norms
Weight = Tensor | QuantizedWeight  # [N, K]: dense in the activations' dtype, or GGUF blocks
Linear = tuple[Weight, Tensor | None]  # a weight and its bias [N] (or None)


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


class Rotary:
    """The rotary tables of each layer type: cos / sin [1, S, D] for positions [1, S], computed as Hugging
    Face's rotary modules compute them (fp32 products of position and inverse frequency, rounded once)."""

    def __init__(self, inv_freq: dict[str, Tensor], scaling: dict[str, float]):
        self.inv_freq, self.scaling = inv_freq, scaling

    @classmethod
    def default(cls, head_dim: int, bases: dict[str, float]) -> Rotary:
        """Plain RoPE of each layer type's base: 1 / base ^ (2i / head_dim)."""
        inv = {kind: 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
               for kind, base in bases.items()}
        return cls(inv, dict.fromkeys(bases, 1.0))

    @classmethod
    def of(cls, module: nn.Module, kinds: list[str]) -> Rotary:
        """The tables of a Hugging Face rotary module (any static RoPE type; NotImplementedError for the
        dynamic ones, whose tables change with the sequence length)."""
        types = module.rope_type if isinstance(module.rope_type, dict) else dict.fromkeys(kinds, module.rope_type)
        if any("dynamic" in t or "longrope" in t for t in types.values()):
            raise NotImplementedError("a RoPE type whose tables depend on the sequence length")
        if isinstance(module.rope_type, dict):  # Gemma 3: one table per layer type
            return cls({k: getattr(module, f"{k}_inv_freq") for k in kinds},
                       {k: getattr(module, f"{k}_attention_scaling") for k in kinds})
        return cls(dict.fromkeys(kinds, module.inv_freq), dict.fromkeys(kinds, module.attention_scaling))

    def __call__(self, positions: Tensor, dtype: torch.dtype) -> dict[str, tuple[Tensor, Tensor]]:
        out = {}
        for kind, inv_freq in self.inv_freq.items():
            freqs = positions[..., None].float() * inv_freq.to(device=positions.device, dtype=torch.float)
            emb = torch.cat((freqs, freqs), dim=-1)
            out[kind] = ((emb.cos() * self.scaling[kind]).to(dtype), (emb.sin() * self.scaling[kind]).to(dtype))
        return out


class Embedding:
    """Token ids [B, S] -> rows [B, S, d] in ``dtype``: a dense table's rows, or the rows of a table of GGUF
    blocks decoded for the call's tokens only; times ``scale`` in ``dtype`` where set (Gemma's sqrt(d))."""

    def __init__(self, table: Weight, dtype: torch.dtype, scale: float | None = None):
        self.table, self.dtype, self.scale = table, dtype, scale

    def __call__(self, input_ids: Tensor) -> Tensor:
        if isinstance(self.table, QuantizedWeight):
            rows = QuantizedWeight(self.table.blocks[input_ids.reshape(-1)], self.table.format).dequantize()
            x = rows.to(self.dtype).view(*input_ids.shape, -1)
        else:
            x = F.embedding(input_ids, self.table)
        return x if self.scale is None else x * torch.tensor(self.scale, dtype=self.dtype)


class OutputHead:
    """Logits from final hidden states: ``[..., d] -> [..., V]`` (float, softcapping applied where set).

    Calls of up to :data:`specnb.model.kernels.MAX_ROWS` rows (every decoding and verification call) go through
    :func:`specnb.model.kernels.linear`, which streams the head's weight once and gives each row the bits it would
    get alone (Gemma-3's 262k x 640 head is ~60% of its weights). Larger fp32 calls use a copy of the weight
    prepacked for oneDNN, built on the first such call only (one more head-sized buffer). A head of GGUF
    blocks computes every call over them."""

    def __init__(self, weight: Weight, bias: Tensor | None = None, softcap: float | None = None):
        self.weight, self.bias, self.softcap = weight, bias, softcap
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
        if isinstance(self.weight, QuantizedWeight):
            logits = quant.linear(flat, self.weight, self.bias)
        elif kernels.usable(flat, self.weight):  # few rows: stream the weight once, rows exact
            logits = kernels.linear(flat, self.weight, self.bias)
        elif (packed := self._onednn()) is not None:
            logits = torch._C._nn.mkldnn_linear(flat.contiguous().to_mkldnn(), packed, None).to_dense()
        else:
            logits = F.linear(flat, self.weight, self.bias)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.reshape(*hidden.shape[:-1], -1)


# (id of the head's weight, its device, its dtype) -> its OutputHead, dropped with the weight. Device and dtype
# are part of the key because moving or casting a model (``model.to(...)``) keeps the Parameter object and
# replaces its data.
_HEADS: dict[tuple[int, torch.device, torch.dtype], OutputHead] = {}


def dense_head(model: PreTrainedModel) -> OutputHead:
    """The :class:`OutputHead` of the model's own head weight, built once per weight and device (a self-draft
    shares its target's)."""
    module = model.get_output_embeddings()
    weight = module.weight
    key = (id(weight), weight.device, weight.dtype)
    if key not in _HEADS:
        softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        _HEADS[key] = OutputHead(weight.detach(), getattr(module, "bias", None), softcap)
        weakref.finalize(weight, _HEADS.pop, key, None)
    return _HEADS[key]


# the first projection of stacked siblings -> (their stacked weight [sum N, K], bias, sizes), dropped with it
_STACKS: weakref.WeakKeyDictionary[nn.Linear, tuple[Tensor, Tensor | None, list[int]]] = weakref.WeakKeyDictionary()


def stacked(siblings: list[nn.Linear]) -> tuple[Tensor, Tensor | None, list[int]]:
    """Sibling projections that read the same input (q/k/v, gate/up) as one weight [sum N, K], its bias [sum N]
    (or None) and their output sizes, so that a call streams them in one pass.

    The siblings' weights become row slices (views) of the stacked buffer (huge pages where large,
    :mod:`specnb.model.kernels.memory`): nothing is stored twice, the state dict and Hugging Face's own modules are
    unchanged, and a self-draft shares its target's stack. Stacked again when the model was moved or cast."""
    first = siblings[0]
    done = _STACKS.get(first)
    if done is not None and first.weight.data_ptr() == done[0].data_ptr() and first.weight.dtype == done[0].dtype:
        return done
    weights = [layer.weight.detach() for layer in siblings]
    sizes = [w.shape[0] for w in weights]
    shape, dtype = (sum(sizes), weights[0].shape[1]), weights[0].dtype
    huge = weights[0].device.type == "cpu" and memory.available() \
        and shape[0] * shape[1] * weights[0].element_size() >= memory.MIN_BYTES
    biases = [layer.bias for layer in siblings]
    # the stack is the kind of tensor the weights were (made inside inference mode or not): autograd may use
    # ordinary weights later
    with torch.inference_mode(weights[0].is_inference()):
        weight = torch.cat(weights, out=memory.empty(shape, dtype) if huge else None)
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else weight.new_zeros(n) for b, n in zip(biases, sizes, strict=True)])
    start = 0
    for layer, size in zip(siblings, sizes, strict=True):
        layer.weight.data = weight[start:start + size]
        if layer.bias is not None:
            layer.bias.data = bias[start:start + size]
        start += size
    _STACKS[first] = weight, bias, sizes
    return _STACKS[first]


class _Grouped(nn.Module):
    """What :func:`specnb.model.kernels.attention`'s fallback (Hugging Face's SDPA function, for long prefills) reads
    from an attention module: causal, and how many query heads share a key / value head."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


@dataclass
class Layer:
    """One decoder layer's weights and settings.

    ``qkv`` / ``gate_up``: over GGUF blocks (``blocks``) a list of one :data:`Linear` per projection (formats
    differ between siblings); dense, the siblings stacked into one weight (:func:`stacked`:
    weight [sum N, K], bias, sizes) so that each is one kernel call."""

    index: int
    kind: str  # "full_attention" | "sliding_attention"
    blocks: bool
    qkv: Any
    gate_up: Any
    o: Linear
    down: Linear
    act: Callable[[Tensor], Tensor]
    act_code: str | None  # the extension's constant for ``act`` (None: the one-call stack cannot run it)
    heads: int
    kv_heads: int
    scaling: float
    softcap: float | None
    input_norm: Norm
    post_attention_norm: Norm
    pre_mlp_norm: Norm | None = None  # Gemma: norms before and after each block
    post_mlp_norm: Norm | None = None
    q_norm: Norm | None = None
    k_norm: Norm | None = None

    def __post_init__(self) -> None:
        self.grouped = _Grouped(self.heads // self.kv_heads)

    @classmethod
    def from_hf(cls, layer: nn.Module, index: int, kind: str, gemma: bool) -> Layer:
        """A Hugging Face decoder layer over its own weights, q/k/v and gate/up stacked (:func:`stacked`)."""
        attn, mlp = layer.self_attn, layer.mlp
        qkv = stacked([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up = stacked([mlp.gate_proj, mlp.up_proj])
        config = attn.config
        heads = config.num_attention_heads
        sandwich = hasattr(layer, "pre_feedforward_layernorm")

        def norm(name: str, owner: nn.Module = layer) -> Norm | None:
            return Norm.of(getattr(owner, name), gemma) if hasattr(owner, name) else None

        return cls(index, kind, False, qkv, gate_up, (attn.o_proj.weight, attn.o_proj.bias),
                   (mlp.down_proj.weight, mlp.down_proj.bias), mlp.act_fn, _activation(mlp.act_fn), heads,
                   config.num_key_value_heads,
                   attn.scaling if attn.scaling is not None else (qkv[2][0] // heads) ** -0.5,
                   getattr(config, "attn_logit_softcapping", None), norm("input_layernorm"),
                   norm("post_attention_layernorm"), norm("pre_feedforward_layernorm") if sandwich else None,
                   norm("post_feedforward_layernorm") if sandwich else None, norm("q_norm", attn), norm("k_norm", attn))

    @classmethod
    def from_gguf(cls, weights: GGUFWeights, index: int, kind: str, dtype: torch.dtype) -> Layer:
        """Layer ``index`` of a GGUF file: projections as stored (each must be in a block format), biases
        rounded to ``dtype`` as a checkpoint loaded in it rounds them, norms in fp32."""
        s = weights.settings

        def linear(name: str) -> Linear:
            weight = weights.tensor(f"blk.{index}.{name}.weight")
            if not isinstance(weight, QuantizedWeight):
                raise ValueError(f"GGUF weights: {weights.path}'s blk.{index}.{name} is stored dense; specnb's "
                                 f"decoder multiplies block formats ({', '.join(FORMATS)})")
            bias = weights.optional(f"blk.{index}.{name}.bias")
            return weight, None if bias is None else bias.to(dtype)

        def norm(name: str) -> Norm | None:
            scale = weights.optional(f"blk.{index}.{name}.weight")
            return None if scale is None else Norm(scale, s.eps, not s.gemma)

        act, code = (functools.partial(F.gelu, approximate="tanh"), "ACT_GELU_TANH") if s.gemma \
            else (F.silu, "ACT_SILU")
        return cls(index, kind, True, [linear(n) for n in ("attn_q", "attn_k", "attn_v")],
                   [linear(n) for n in ("ffn_gate", "ffn_up")], linear("attn_output"), linear("ffn_down"), act,
                   code, s.heads, s.kv_heads, s.scaling, s.attn_softcap, norm("attn_norm"),
                   norm("post_attention_norm") if s.gemma else norm("ffn_norm"),
                   norm("ffn_norm") if s.gemma else None, norm("post_ffw_norm"), norm("attn_q_norm"),
                   norm("attn_k_norm"))

    def weights(self) -> list[Linear]:
        """Every projection's (weight, bias), the stacked siblings as one."""
        siblings = self.qkv + self.gate_up if self.blocks else [self.qkv[:2], self.gate_up[:2]]
        return [*siblings, self.o, self.down]

    def norms(self) -> list[Norm]:
        return [n for n in (self.input_norm, self.post_attention_norm, self.pre_mlp_norm, self.post_mlp_norm,
                            self.q_norm, self.k_norm) if n is not None]

    def spec(self, ext: Any) -> Any | None:
        """This layer as the extension's ``LayerSpec`` (for :func:`specnb.model.kernels.decoder_layers`), or None
        where the one-call stack cannot run it (an activation other than SiLU / tanh-GELU)."""
        if self.act_code is None:
            return None
        spec = ext.LayerSpec()
        if self.blocks:  # one Blocks per projection
            def blocks(weight: QuantizedWeight, bias: Tensor | None) -> Any:
                out = ext.Blocks()
                out.blocks = weight.packed if weight.int8 else weight.blocks
                out.type, out.bias, out.int8 = FORMATS[weight.format][0], bias, weight.int8
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
        spec.heads, spec.kv_heads, spec.act = self.heads, self.kv_heads, getattr(ext, self.act_code)
        spec.scaling, spec.softcap = self.scaling, float(self.softcap or 0.0)
        for name in ("q_norm", "k_norm", "input_norm", "post_attention_norm", "pre_mlp_norm", "post_mlp_norm"):
            norm = getattr(self, name)
            if norm is not None:
                setattr(spec, name, norm.spec(ext))
        return spec

    def __call__(self, x: Tensor, rotary: tuple[Tensor, Tensor], mask: Tensor | None, cache) -> Tensor:
        """x [B, S, d] -> [B, S, d]; appends the call's keys and values to ``cache`` (None: no cache)."""
        B, S, _ = x.shape
        cos, sin = rotary
        h = self.input_norm(x)
        q, k, v = self._siblings(h, self.qkv)
        q = self._heads(q, self.heads, self.q_norm, cos, sin)  # [B, H, S, D]
        k = self._heads(k, self.kv_heads, self.k_norm, cos, sin)  # [B, Hk, S, D]
        v = v.view(B, S, self.kv_heads, -1).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        out, _ = kernels.attention(self.grouped, q, k, v, mask, scaling=self.scaling, softcap=self.softcap)
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

    def _linear(self, x: Tensor, weight: Weight, bias: Tensor | None) -> Tensor:
        return quant.linear(x, weight, bias) if self.blocks else kernels.linear(x, weight, bias)

    def _siblings(self, h: Tensor, weights: Any) -> list[Tensor]:
        """q, k, v (or gate, up) of h: one call over the stacked weight, or one per projection's blocks."""
        if self.blocks:
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
    """Token ids [B, S] -> final hidden states [B, S, d] (after the last norm), with the KV cache, mask and
    position arguments of a Hugging Face decoder; :attr:`head` maps them to logits."""

    def __init__(self, embed: Callable[[Tensor], Tensor], layers: list[Layer], norm: Norm, rotary: Rotary,
                 head: OutputHead, masks: TreeMasks, window: int | None, kernels_run: bool):
        self.embed, self.layers, self.norm, self.rotary, self.head = embed, layers, norm, rotary, head
        self.masks, self.window = masks, window
        self.kinds = sorted(rotary.inv_freq)
        self.head_dim = 2 * len(next(iter(rotary.inv_freq.values())))
        # the layers as one C++ call (kernels.decoder_layers) where the extension runs them all; else None
        specs = [layer.spec(kernels.extension()) for layer in self.layers] if kernels_run else []
        self.specs = specs if specs and all(spec is not None for spec in specs) else None

    @classmethod
    def from_hf(cls, model: PreTrainedModel) -> Body:
        """Over a Hugging Face model's own weights (shared, not copied) and output head."""
        decoder = model.get_decoder()
        config = model.config.get_text_config()
        gemma = ARCHITECTURES[config.model_type]
        kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        layers = decoder.layers[:config.num_hidden_layers]  # a self-draft runs the first layers of its target
        return cls(decoder.embed_tokens, [Layer.from_hf(layer, i, kinds[i], gemma) for i, layer in enumerate(layers)],
                   Norm.of(decoder.norm, gemma), Rotary.of(decoder.rotary_emb, sorted(set(kinds))),
                   dense_head(model), TreeMasks(model), getattr(config, "sliding_window", None),
                   bool(kernels.routed(model)))

    @classmethod
    def from_gguf(cls, model: PreTrainedModel) -> Body:
        """Over the GGUF file ``model`` was loaded with (:func:`specnb.model.gguf_weights.mark`): its first
        ``num_hidden_layers`` layers, activations in the model's dtype. The Hugging Face model gives only the
        dtype, the layer count and the masks' device; the file's settings must agree with its config."""
        weights = read(gguf_path(model), uses_int8(model))
        config = model.config.get_text_config()
        check_matches(weights.path, weights.settings, config)
        s, dtype = weights.settings, model.get_input_embeddings().weight.dtype
        layers = [Layer.from_gguf(weights, i, s.layer_types[i], dtype) for i in range(config.num_hidden_layers)]
        head = weights.tensor(weights.head_name)
        head = head if isinstance(head, QuantizedWeight) else head.to(dtype)
        lean = cls(Embedding(weights.tensor("token_embd.weight"), dtype, s.embed_scale), layers,
                   Norm(weights.tensor("output_norm.weight"), s.eps, not s.gemma),
                   Rotary.default(s.head_dim, {k: s.rope_base[k] for k in sorted(set(s.layer_types))}),
                   OutputHead(head, None, s.final_softcap), TreeMasks(model), s.window,
                   bool(kernels.routed(model)))
        lean.source = weights  # keeps the file's tensors shared while this body lives (gguf_weights.read)
        return lean

    def weight_bytes(self) -> int:
        """Bytes of weights one call streams: every projection, norm and the head once (the input embedding
        reads only its tokens' rows)."""
        tensors = [t for layer in self.layers for linear in layer.weights() for t in linear if t is not None]
        tensors += [n.scale for layer in self.layers for n in layer.norms()] + [self.norm.scale, self.head.weight]
        return sum(t.nbytes if isinstance(t, QuantizedWeight) else t.numel() * t.element_size() for t in tensors)

    def __call__(self, input_ids: Tensor, past_key_values=None, attention_mask: Tensor | dict | None = None,
                 position_ids: Tensor | None = None, use_cache: bool = True) -> Tensor:
        """Hidden states [B, S, d] in the model's dtype.

        attention_mask: None (causal over the cache and the call) or a float mask [1, 1, S, K] / a dict of them
        per layer type, as :class:`~specnb.model.masks.TreeMasks` builds. position_ids [1, S]: default, the cache
        length onwards.
        """
        cache = past_key_values if use_cache else None
        past = cache.get_seq_length() if cache is not None else 0
        S = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past, past + S, device=input_ids.device)[None]
        x = self.embed(input_ids)
        if attention_mask is None:
            masks = self._causal(past, S, x)
        elif isinstance(attention_mask, dict):
            masks = attention_mask
        else:
            masks = dict.fromkeys(self.kinds, attention_mask)
        rotary = self.rotary(position_ids, x.dtype)
        # Decoding and verification calls (one row, a few dozen tokens, masks none or float, no autograd): every
        # layer in one C++ call, the same steps as Layer.__call__ with the same bits, without Python between them.
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

    def _causal(self, past: int, S: int, x: Tensor) -> dict[str, Tensor | None]:
        """Masks for a causal call of S queries (activations ``x``) after ``past`` cached positions. None where
        the attention's own causal rule is right: our kernel aligns the queries with the last keys; PyTorch's
        SDPA (:func:`specnb.model.kernels.attends` false) only without cached keys. Sliding layers need one once keys
        fall out of the window."""
        sdpa = S > 1 and past > 0 and not kernels.attends(S, self.head_dim, x)
        needed = {kind: (kind == "sliding_attention" and self.window is not None and past + S > self.window)
                  or sdpa for kind in self.kinds}
        if not any(needed.values()):
            return dict.fromkeys(self.kinds)
        positions = torch.arange(past, past + S, device=self.masks.device)
        allowed = torch.ones(S, S, dtype=torch.bool, device=self.masks.device).tril_()
        return {kind: self.masks.mask(allowed, positions, positions, past, kind) if needed[kind] else None
                for kind in self.kinds}


def body(model: PreTrainedModel) -> Body | None:
    """The model's :class:`Body`: over its GGUF file where it was loaded with one, else over its own weights;
    None for other architectures and inside :func:`stock`, where Hugging Face's decoder runs. Built once per
    model object, weights' device and dtype, layer count, file and kernel path, and kept on the model. The
    model object and the layer count are part of the key because a self-draft is a shallow copy of its target
    (same weights, fewer layers): it must never run the target's body."""
    config = model.config.get_text_config()
    if config.model_type not in ARCHITECTURES or getattr(model, "_specnb_stock", False):
        return None
    weight = model.get_input_embeddings().weight
    key = (id(model), weight.device, weight.dtype, weight.data_ptr(), config.num_hidden_layers,
           tuple(getattr(config, "layer_types", None) or ()), gguf_path(model), uses_int8(model),
           kernels.routed(model))
    cached = getattr(model, "_specnb_body", None)
    if cached is None or cached[0] != key:
        cached = model._specnb_body = (key, Body.from_gguf(model) if uses_gguf(model) else Body.from_hf(model))
    return cached[1]


@contextlib.contextmanager
def stock(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """Within the block, :func:`specnb.model.forward.forward` runs ``model`` on Hugging Face's decoder as shipped
    (PyTorch's GEMM and its own attention, the dense weights): the reference specnb's decoder is tested
    against. Hugging Face's own calls (``model(...)``, ``generate``) run it so at any time."""
    saved = getattr(model, "_specnb_stock", False)
    model._specnb_stock = True
    try:
        yield model
    finally:
        model._specnb_stock = saved


@functools.cache
def _digest() -> str:
    digest = hashlib.sha256()
    for source in (__file__, Path(__file__).with_name("gguf_weights.py")):
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:8]


def call_path(model: PreTrainedModel) -> str:
    """What runs a call of ``model``: the kernels' :func:`~specnb.model.kernels.routed` name (``"torch"`` where they
    do not run) plus ``-body<hash of this file and the GGUF reader>`` where the :class:`Body` runs and
    ``-gguf`` where it computes over GGUF blocks (``-gguf-int8`` with int8 activations; the routed name hashes
    their kernels too); ``""`` where Hugging Face's decoder runs. Timing tables and greedy references are cached
    under it, so a change to the kernels, the body or the weights measures them again."""
    if body(model) is None:
        return ""
    path = f"{kernels.routed(model) or 'torch'}-body{_digest()}"
    if not uses_gguf(model):
        return path
    return f"{path}-gguf-int8" if uses_int8(model) else f"{path}-gguf"
