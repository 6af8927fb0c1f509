"""specnb's decoder: the body of a Llama, Qwen2 or Gemma-3 model as a few screens of explicit tensor code.

:class:`Body` maps token ids to final hidden states (the output head's input) and owns what it computes
with: the embedding, one :class:`Layer` per decoder layer, the final norm, the rotary tables and the output head.
A layer's weights are typed by format: :class:`DenseProjections` (a checkpoint's weights, q/k/v and gate/up stacked
once at load) or :class:`BlockProjections` (a GGUF file's quantized blocks). Two loaders build it:
:meth:`Body.from_gguf` reads a GGUF file (settings from its metadata, projections and head as the file's blocks,
:mod:`specnb.model.gguf_weights`), the default for the embedded models; :meth:`Body.from_hf` reads a Hugging Face
model's dense weights (any Llama, Qwen2 or Gemma-3 checkpoint, the tiny test models). The KV cache
(:class:`specnb.model.kv_cache.GrowingCache`) and the masks (:class:`specnb.model.masks.TreeMasks`) are passed in by
the caller; :mod:`specnb.model.backend` chooses between this body and Hugging Face's modules.

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
for other architectures and on the ``hf`` backend (:func:`specnb.model.models.stock`, the reference of the tests).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels
from .gguf_weights import GGUFWeights, check_matches, read
from .kernels import memory, quant
from .kernels.quant import FORMATS, QuantizedWeight
from .kv_cache import GrowingCache
from .masks import TreeMasks

if TYPE_CHECKING:  # importing it costs seconds (transformers' modeling code); a type only
    from transformers import PretrainedConfig, PreTrainedModel

ARCHITECTURES = {"llama": False, "qwen2": False, "gemma3_text": True}  # model_type -> Gemma-style norms
MIN_POSITIONS = 512  # positions the rotary tables hold at least (:class:`Rotary`)
Weight = Tensor | QuantizedWeight  # [N, K]: dense in the activations' dtype, or GGUF blocks
Linear = tuple[Tensor, Tensor | None]  # a dense weight [N, K] and its bias [N] (or None)


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
    """The rotary tables of each layer type: cos / sin [B|1, S, D] for positions [B|1, S], computed as Hugging
    Face's rotary modules compute them (fp32 products of position and inverse frequency, rounded once).

    The values of positions 0..n-1 are computed once per dtype and device (n a power of two, doubled when a call
    reaches past it) and each call takes its rows: a decoding step costs a slice instead of ~10 small ops, and a
    position has the same bits in every call, whatever the call's shape."""

    def __init__(self, inv_freq: dict[str, Tensor], scaling: dict[str, float]):
        self.inv_freq, self.scaling = inv_freq, scaling
        self._tables: dict[tuple[torch.dtype, torch.device], dict[str, tuple[Tensor, Tensor]]] = {}

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
        """Each layer type's (cos, sin) [B|1, S, D] in ``dtype`` for ``positions`` [B|1, S] (int, on the model's
        device)."""
        tables = self._table(int(positions.max()) + 1, dtype, positions.device)
        return {kind: (cos[0][positions], sin[0][positions]) for kind, (cos, sin) in tables.items()}

    def span(self, start: int, end: int, dtype: torch.dtype, device: torch.device) -> dict[str, tuple[Tensor, Tensor]]:
        """:meth:`__call__` for positions start..end-1 (a call after ``start`` cached positions): views [1, S, D]."""
        return {kind: (cos[:, start:end], sin[:, start:end])
                for kind, (cos, sin) in self._table(end, dtype, device).items()}

    def _table(self, end: int, dtype: torch.dtype, device: torch.device) -> dict[str, tuple[Tensor, Tensor]]:
        """(cos, sin) [1, n, D] of positions 0..n-1 (n >= end) per layer type."""
        tables = self._tables.get((dtype, device))
        if tables is None or next(iter(tables.values()))[0].shape[1] < end:
            positions = torch.arange(max(1 << (end - 1).bit_length(), MIN_POSITIONS), device=device)[None]
            tables = {}
            for kind, inv_freq in self.inv_freq.items():
                freqs = positions[..., None].float() * inv_freq.to(device=device, dtype=torch.float)
                emb = torch.cat((freqs, freqs), dim=-1)
                tables[kind] = ((emb.cos() * self.scaling[kind]).to(dtype), (emb.sin() * self.scaling[kind]).to(dtype))
            self._tables[(dtype, device)] = tables
        return tables


class Embedding:
    """Token ids [B, S] -> rows [B, S, d] in ``dtype``: a dense table's rows, or the rows of a table of GGUF
    blocks decoded for the call's tokens only; times ``scale`` in ``dtype`` where set (Gemma's sqrt(d))."""

    def __init__(self, table: Weight, dtype: torch.dtype, scale: float | None = None):
        self.table, self.dtype = table, dtype
        self.scale = None if scale is None else torch.tensor(scale, dtype=dtype)

    def __call__(self, input_ids: Tensor) -> Tensor:
        if isinstance(self.table, QuantizedWeight):
            rows = quant.dequantize(self.table.blocks.index_select(0, input_ids.reshape(-1)), self.table.format)
            x = rows.to(self.dtype).view(*input_ids.shape, -1)
        else:
            x = F.embedding(input_ids, self.table)
        return x if self.scale is None else x * self.scale


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

    def rows_exact(self, hidden: Tensor) -> bool:
        """Whether a call on ``hidden`` [m, d] gives each row the bits it gets alone (the kernels' paths)."""
        return isinstance(self.weight, QuantizedWeight) or kernels.usable(hidden, self.weight)

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


def head_of(model: PreTrainedModel) -> OutputHead:
    """An :class:`OutputHead` over ``model``'s own head weight (shared, not copied), with its logit softcapping."""
    module = model.get_output_embeddings()
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return OutputHead(module.weight.detach(), getattr(module, "bias", None), softcap)


@dataclass(frozen=True)
class Stacked:
    """Sibling projections that read the same input (q/k/v, gate/up) as one weight [sum N, K], its bias [sum N]
    (or None) and their output sizes, so that a call streams them in one kernel call."""

    weight: Tensor
    bias: Tensor | None
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, siblings: list[nn.Linear]) -> Stacked:
        """The siblings stacked, once, at load. Their weights become row slices (views) of the stacked buffer
        (huge pages, :func:`specnb.model.kernels.memory.empty_weight`): nothing is stored twice, and Hugging Face's
        modules compute what they computed (the same values, in the same Parameters)."""
        weights = [layer.weight.detach() for layer in siblings]
        sizes = tuple(w.shape[0] for w in weights)
        shape, dtype = (sum(sizes), weights[0].shape[1]), weights[0].dtype
        biases = [layer.bias for layer in siblings]
        # the stack is the kind of tensor the weights were (made inside inference mode or not): autograd may use
        # ordinary weights later
        with torch.inference_mode(weights[0].is_inference()):
            out = memory.empty_weight(shape, dtype) if weights[0].device.type == "cpu" else None
            weight = torch.cat(weights, out=out)
            bias = None if all(b is None for b in biases) else torch.cat(
                [b.detach() if b is not None else weight.new_zeros(n) for b, n in zip(biases, sizes, strict=True)])
        start = 0
        for layer, size in zip(siblings, sizes, strict=True):
            layer.weight.data = weight[start:start + size]
            if layer.bias is not None:
                layer.bias.data = bias[start:start + size]
            start += size
        return cls(weight, bias, sizes)

    def __call__(self, h: Tensor) -> list[Tensor]:
        """h [..., K] -> each sibling's output [..., N_i]."""
        return list(kernels.linear(h, self.weight, self.bias).split(self.sizes, dim=-1))


@dataclass(frozen=True)
class DenseProjections:
    """A layer's projections over dense weights in the activations' dtype: q/k/v and gate/up stacked
    (:class:`Stacked`), the output projections as they are; every call through :func:`specnb.model.kernels.linear`."""

    qkv: Stacked
    gate_up: Stacked
    o: Linear
    down: Linear

    @classmethod
    def of(cls, attn: nn.Module, mlp: nn.Module) -> DenseProjections:
        """The projections of a Hugging Face attention and MLP module (their weights shared, siblings stacked; the
        output projections' weights moved into huge pages where :func:`specnb.model.kernels.memory.rehome` left
        them, being smaller than one)."""
        for linear in (attn.o_proj, mlp.down_proj):
            linear.weight.data = memory.settled(linear.weight.data)
        return cls(Stacked.of([attn.q_proj, attn.k_proj, attn.v_proj]), Stacked.of([mlp.gate_proj, mlp.up_proj]),
                   (attn.o_proj.weight, attn.o_proj.bias), (mlp.down_proj.weight, mlp.down_proj.bias))

    @property
    def q_size(self) -> int:
        return self.qkv.sizes[0]

    def q_k_v(self, h: Tensor) -> list[Tensor]:
        return self.qkv(h)

    def gate_and_up(self, h: Tensor) -> list[Tensor]:
        return self.gate_up(h)

    def attention_out(self, x: Tensor) -> Tensor:
        return kernels.linear(x, *self.o)

    def mlp_out(self, x: Tensor) -> Tensor:
        return kernels.linear(x, *self.down)

    def linears(self) -> list[Linear]:
        """Every weight a call streams, with its bias: the stacked siblings as one."""
        return [(self.qkv.weight, self.qkv.bias), (self.gate_up.weight, self.gate_up.bias), self.o, self.down]



BlockLinear = tuple[QuantizedWeight, Tensor | None]  # a weight of GGUF blocks and its bias [N] (or None)


@dataclass(frozen=True)
class BlockProjections:
    """A layer's projections over a GGUF file's blocks, one :func:`specnb.model.kernels.quant.linear` call each
    (siblings are not stacked: their block formats may differ)."""

    q: BlockLinear
    k: BlockLinear
    v: BlockLinear
    gate: BlockLinear
    up: BlockLinear
    o: BlockLinear
    down: BlockLinear

    @classmethod
    def of(cls, weights: GGUFWeights, index: int, dtype: torch.dtype) -> BlockProjections:
        """Layer ``index``'s projections as the file stores them (each must be in a block format), biases
        rounded to ``dtype`` as a checkpoint loaded in it rounds them."""
        def linear(name: str) -> BlockLinear:
            weight = weights.tensor(f"blk.{index}.{name}.weight")
            if not isinstance(weight, QuantizedWeight):
                raise ValueError(f"GGUF weights: {weights.path}'s blk.{index}.{name} is stored dense; specnb's "
                                 f"decoder multiplies block formats ({', '.join(FORMATS)})")
            bias = weights.optional(f"blk.{index}.{name}.bias")
            return weight, None if bias is None else bias.to(dtype)

        return cls(q=linear("attn_q"), k=linear("attn_k"), v=linear("attn_v"), gate=linear("ffn_gate"),
                   up=linear("ffn_up"), o=linear("attn_output"), down=linear("ffn_down"))

    @property
    def q_size(self) -> int:
        return self.q[0].shape[0]

    def q_k_v(self, h: Tensor) -> list[Tensor]:
        return [quant.linear(h, *linear) for linear in (self.q, self.k, self.v)]

    def gate_and_up(self, h: Tensor) -> list[Tensor]:
        return [quant.linear(h, *linear) for linear in (self.gate, self.up)]

    def attention_out(self, x: Tensor) -> Tensor:
        return quant.linear(x, *self.o)

    def mlp_out(self, x: Tensor) -> Tensor:
        return quant.linear(x, *self.down)

    def linears(self) -> list[BlockLinear]:
        """Every projection's (weight, bias): q, k, v, gate, up, o, down."""
        return [self.q, self.k, self.v, self.gate, self.up, self.o, self.down]



Projections = DenseProjections | BlockProjections


@dataclass(frozen=True)
class Activation:
    """The MLP's activation and the extension's constant for it (None: the one-call stack cannot run it)."""

    fn: Callable[[Tensor], Tensor]
    code: str | None

    @classmethod
    def of(cls, act: nn.Module) -> Activation:
        """A Hugging Face activation module; the extension computes it with the same ATen op where it is SiLU or
        Gemma's tanh GELU (unless set to its Python formula)."""
        name, inner = type(act).__name__, getattr(act, "act", None)
        if name in ("SiLUActivation", "SiLU"):
            return cls(act, "ACT_SILU")
        if name == "GELUTanh" and isinstance(inner, functools.partial) and inner.func is F.gelu \
                and inner.keywords == {"approximate": "tanh"}:
            return cls(act, "ACT_GELU_TANH")
        return cls(act, None)


GELU_TANH = Activation(functools.partial(F.gelu, approximate="tanh"), "ACT_GELU_TANH")
SILU = Activation(F.silu, "ACT_SILU")


@dataclass(frozen=True)
class LayerNorms:
    """A layer's norms: before attention and after it; Gemma also before and after the MLP (``pre_mlp`` /
    ``post_mlp``, else None) and on each query / key head (``q`` / ``k``, else None)."""

    input: Norm
    post_attention: Norm
    pre_mlp: Norm | None = None
    post_mlp: Norm | None = None
    q: Norm | None = None
    k: Norm | None = None

    def all(self) -> list[Norm]:
        return [n for n in (self.input, self.post_attention, self.pre_mlp, self.post_mlp, self.q, self.k)
                if n is not None]



def _blocks(ext: Any, weight: QuantizedWeight, bias: Tensor | None) -> Any:
    """A projection of GGUF blocks as the extension's ``Blocks``."""
    out = ext.Blocks()
    out.blocks = weight.packed if weight.int8 else weight.blocks
    out.type, out.bias, out.int8 = FORMATS[weight.format][0], bias, weight.int8
    return out


class _Grouped(nn.Module):
    """What :func:`specnb.model.kernels.attention`'s fallback (Hugging Face's SDPA function, where the kernel does not
    run) reads from an attention module: causal, and how many query heads share a key / value head."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


@dataclass
class Layer:
    """One decoder layer: its projections (dense or GGUF blocks), activation, norms and attention settings
    (``heads`` / ``kv_heads`` query and key-value heads, the score ``scaling`` and ``softcap``)."""

    index: int
    kind: str  # "full_attention" | "sliding_attention"
    projections: Projections
    activation: Activation
    norms: LayerNorms
    heads: int
    kv_heads: int
    scaling: float
    softcap: float | None = None

    def __post_init__(self) -> None:
        self.grouped = _Grouped(self.heads // self.kv_heads)

    @classmethod
    def from_hf(cls, layer: nn.Module, index: int, kind: str, gemma: bool) -> Layer:
        """A Hugging Face decoder layer over its own weights, q/k/v and gate/up stacked (:class:`Stacked`)."""
        attn, mlp = layer.self_attn, layer.mlp
        projections = DenseProjections.of(attn, mlp)
        config = attn.config
        heads = config.num_attention_heads

        def norm(name: str, owner: nn.Module = layer) -> Norm | None:
            return Norm.of(getattr(owner, name), gemma) if hasattr(owner, name) else None

        sandwich = hasattr(layer, "pre_feedforward_layernorm")
        norms = LayerNorms(norm("input_layernorm"), norm("post_attention_layernorm"),
                           pre_mlp=norm("pre_feedforward_layernorm") if sandwich else None,
                           post_mlp=norm("post_feedforward_layernorm") if sandwich else None,
                           q=norm("q_norm", attn), k=norm("k_norm", attn))
        scaling = attn.scaling if attn.scaling is not None else (projections.q_size // heads) ** -0.5
        return cls(index, kind, projections, Activation.of(mlp.act_fn), norms, heads=heads,
                   kv_heads=config.num_key_value_heads, scaling=scaling,
                   softcap=getattr(config, "attn_logit_softcapping", None))

    @classmethod
    def from_gguf(cls, weights: GGUFWeights, index: int, kind: str, dtype: torch.dtype) -> Layer:
        """Layer ``index`` of a GGUF file: projections as stored (:meth:`BlockProjections.of`), norms in fp32."""
        s = weights.settings

        def norm(name: str) -> Norm | None:
            scale = weights.optional(f"blk.{index}.{name}.weight")
            return None if scale is None else Norm(scale, s.eps, not s.gemma)

        norms = LayerNorms(norm("attn_norm"), norm("post_attention_norm") if s.gemma else norm("ffn_norm"),
                           pre_mlp=norm("ffn_norm") if s.gemma else None, post_mlp=norm("post_ffw_norm"),
                           q=norm("attn_q_norm"), k=norm("attn_k_norm"))
        return cls(index, kind, BlockProjections.of(weights, index, dtype), GELU_TANH if s.gemma else SILU, norms,
                   heads=s.heads, kv_heads=s.kv_heads, scaling=s.scaling, softcap=s.attn_softcap)

    def spec(self, ext: Any) -> Any | None:
        """This layer as the extension's ``LayerSpec`` (for :func:`specnb.model.kernels.decoder_layers`), or None
        where the one-call stack cannot run it (an activation other than SiLU / tanh-GELU)."""
        if self.activation.code is None:
            return None
        spec, p, norms = ext.LayerSpec(), self.projections, self.norms
        if isinstance(p, BlockProjections):  # one Blocks per projection
            spec.qkv_blocks = [_blocks(ext, *linear) for linear in (p.q, p.k, p.v)]
            spec.gate_up_blocks = [_blocks(ext, *linear) for linear in (p.gate, p.up)]
            spec.o_blocks, spec.down_blocks = [_blocks(ext, *p.o)], [_blocks(ext, *p.down)]
            spec.q_size, spec.k_size, spec.gate_size = p.q_size, p.k[0].shape[0], p.gate[0].shape[0]
        else:
            spec.qkv, spec.qkv_bias, (spec.q_size, spec.k_size, _) = p.qkv.weight, p.qkv.bias, p.qkv.sizes
            spec.gate_up, spec.gate_up_bias, (spec.gate_size, _) = p.gate_up.weight, p.gate_up.bias, p.gate_up.sizes
            spec.o, spec.o_bias = p.o
            spec.down, spec.down_bias = p.down
        spec.input_norm, spec.post_attention_norm = norms.input.spec(ext), norms.post_attention.spec(ext)
        if norms.pre_mlp is not None:
            spec.pre_mlp_norm = norms.pre_mlp.spec(ext)
        if norms.post_mlp is not None:
            spec.post_mlp_norm = norms.post_mlp.spec(ext)
        if norms.q is not None:
            spec.q_norm = norms.q.spec(ext)
        if norms.k is not None:
            spec.k_norm = norms.k.spec(ext)
        spec.heads, spec.kv_heads, spec.act = self.heads, self.kv_heads, getattr(ext, self.activation.code)
        spec.scaling, spec.softcap = self.scaling, float(self.softcap or 0.0)
        return spec

    def __call__(self, x: Tensor, rotary: tuple[Tensor, Tensor], mask: Tensor | None,
                 cache: GrowingCache | None) -> Tensor:
        """x [B, S, d] -> [B, S, d]; appends the call's keys and values to ``cache`` (None: no cache)."""
        B, S, _ = x.shape
        cos, sin = rotary
        norms, projections = self.norms, self.projections
        h = norms.input(x)
        q, k, v = projections.q_k_v(h)
        q = self._heads(q, self.heads, norms.q, cos, sin)  # [B, H, S, D]
        k = self._heads(k, self.kv_heads, norms.k, cos, sin)  # [B, Hk, S, D]
        v = v.view(B, S, self.kv_heads, -1).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        out, _ = kernels.attention(self.grouped, q, k, v, mask, scaling=self.scaling, softcap=self.softcap)
        out = projections.attention_out(out.reshape(B, S, -1))  # [B, S, H, D] -> [B, S, d]
        if norms.pre_mlp is None:  # Llama, Qwen2
            x = x + out
            h = norms.post_attention(x)
        else:  # Gemma
            x = x + norms.post_attention(out)
            h = norms.pre_mlp(x)
        gate, up = projections.gate_and_up(h)
        out = projections.mlp_out(self.activation.fn(gate) * up)
        return x + (out if norms.post_mlp is None else norms.post_mlp(out))

    @staticmethod
    def _heads(x: Tensor, heads: int, norm: Norm | None, cos: Tensor, sin: Tensor) -> Tensor:
        if norm is None:
            return kernels.heads(x, heads, None, 0.0, False, cos, sin)
        return kernels.heads(x, heads, norm.scale, norm.eps, norm.round_first, cos, sin)


BodyBackend = Literal["dense", "gguf", "gguf-int8"]


class Body:
    """specnb's decoder: token ids [B, S] -> final hidden states [B, S, d] (after the last norm), with the KV
    cache, mask and positions of a Hugging Face decoder call; :attr:`head` maps them to logits.

    backend: what its projections and head compute over (``dense``: the checkpoint's weights; ``gguf``: a GGUF file's
    blocks; ``gguf-int8``: those blocks times int8-rounded activations). source: the GGUF file's weights it was read
    from (None for dense). dtype / device: the activations' (the weights' where dense).
    """

    def __init__(self, *, embed: Callable[[Tensor], Tensor], layers: list[Layer], norm: Norm, rotary: Rotary,
                 head: OutputHead, masks: TreeMasks, window: int | None, backend: BodyBackend, dtype: torch.dtype,
                 device: torch.device, source: GGUFWeights | None = None):
        self.embed, self.layers, self.norm, self.rotary, self.head = embed, layers, norm, rotary, head
        self.masks, self.window, self.backend, self.source = masks, window, backend, source
        self.dtype, self.device = dtype, device
        self.kinds = sorted(rotary.inv_freq)
        self.head_dim = 2 * len(next(iter(rotary.inv_freq.values())))
        # the layers as one C++ call (kernels.decoder_layers) where the extension runs them all; else None
        specs = [layer.spec(kernels.extension()) for layer in self.layers] if kernels.route(device, dtype) else []
        self.specs = specs if specs and all(spec is not None for spec in specs) else None

    @classmethod
    def from_hf(cls, model: PreTrainedModel) -> Body:
        """Over a Hugging Face model's own weights (shared, not copied: q/k/v and gate/up stacked once,
        :class:`Stacked`) and output head."""
        decoder = model.get_decoder()
        config = model.config.get_text_config()
        gemma = ARCHITECTURES[config.model_type]
        kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        layers = [Layer.from_hf(layer, i, kinds[i], gemma) for i, layer in enumerate(decoder.layers)]
        return cls(embed=decoder.embed_tokens, layers=layers, norm=Norm.of(decoder.norm, gemma),
                   rotary=Rotary.of(decoder.rotary_emb, sorted(set(kinds))), head=head_of(model),
                   masks=TreeMasks.of(model), window=getattr(config, "sliding_window", None), backend="dense",
                   **_placement(model))

    @classmethod
    def from_gguf(cls, config: PretrainedConfig, dtype: torch.dtype, path: str, int8: bool = False) -> Body:
        """Over the GGUF file at ``path`` (``int8``: its blocks take int8-rounded activations) on the CPU: its layers,
        activations in ``dtype``. ``config``, the (text) config of the Hugging Face checkpoint converted from it, gives
        the layer count; the file's settings must agree with it."""
        weights = read(path, int8)
        check_matches(weights.path, weights.settings, config)
        s, cpu = weights.settings, torch.device("cpu")
        layers = [Layer.from_gguf(weights, i, s.layer_types[i], dtype) for i in range(config.num_hidden_layers)]
        head = weights.tensor(weights.head_name)
        head = head if isinstance(head, QuantizedWeight) else head.to(dtype)
        return cls(embed=Embedding(weights.tensor("token_embd.weight"), dtype, s.embed_scale), layers=layers,
                   norm=Norm(weights.tensor("output_norm.weight"), s.eps, not s.gemma),
                   rotary=Rotary.default(s.head_dim, {k: s.rope_base[k] for k in sorted(set(s.layer_types))}),
                   head=OutputHead(head, None, s.final_softcap), masks=TreeMasks(config, dtype, cpu), window=s.window,
                   backend="gguf-int8" if int8 else "gguf", dtype=dtype, device=cpu, source=weights)

    def first_layers(self, layers: int) -> Body:
        """The early-exit model of this body's first ``layers`` layers (a ``self:L`` draft): the same layer objects,
        embedding, final norm and head, no weight copied (the rotary tables too, where it keeps every layer type)."""
        kept = self.layers[:layers]
        kinds = sorted({layer.kind for layer in kept})
        rotary = self.rotary if kinds == self.kinds else \
            Rotary({k: self.rotary.inv_freq[k] for k in kinds}, {k: self.rotary.scaling[k] for k in kinds})
        return Body(embed=self.embed, layers=kept, norm=self.norm, rotary=rotary, head=self.head, masks=self.masks,
                    window=self.window, backend=self.backend, dtype=self.dtype, device=self.device, source=self.source)

    @property
    def uses_gguf(self) -> bool:
        """Whether the projections and head multiply a GGUF file's blocks."""
        return self.backend != "dense"

    @property
    def uses_int8(self) -> bool:
        """Whether those blocks multiply int8-rounded activations."""
        return self.backend == "gguf-int8"

    def call_path(self) -> str:
        """What runs a call: the kernels' :func:`~specnb.model.kernels.routed` name (``"torch"`` where they do not
        run) plus ``-body<hash of this file and the GGUF reader>``, and ``-gguf`` (``-gguf-int8``) over GGUF blocks
        (the routed name hashes their kernels too). Timing tables and greedy references are cached under it, so a
        change to the kernels, the body or the weights measures them again."""
        path = f"{kernels.route(self.device, self.dtype) or 'torch'}-body{_digest()}"
        return path if self.backend == "dense" else f"{path}-{self.backend}"

    def weight_bytes(self) -> int:
        """Bytes of weights one call streams: every projection, norm and the head once (the input embedding
        reads only its tokens' rows)."""
        tensors = [t for layer in self.layers for linear in layer.projections.linears() for t in linear
                   if t is not None]
        tensors += [n.scale for layer in self.layers for n in layer.norms.all()] + [self.norm.scale, self.head.weight]
        return sum(t.nbytes if isinstance(t, QuantizedWeight) else t.numel() * t.element_size() for t in tensors)

    def forward(self, input_ids: Tensor, cache: GrowingCache | None = None, positions: Tensor | None = None,
                mask: Tensor | dict[str, Tensor] | None = None) -> Tensor:
        """Hidden states [B, S, d] in the model's dtype of ids [B, S] (on the model's device).

        cache: the KV cache the call's keys and values are appended to (None: none kept). positions [B|1, S]:
        default, the cache length onwards. mask: None (causal over the cache and the call) or a float mask
        [B|1, 1, S, K] / a dict of them per layer type, as :class:`~specnb.model.masks.TreeMasks` builds.
        """
        past = cache.get_seq_length() if cache is not None else 0
        S = input_ids.shape[1]
        x = self.embed(input_ids)
        if mask is None:
            masks = self._causal(past, S, x)
        elif isinstance(mask, dict):
            masks = mask
        else:
            masks = dict.fromkeys(self.kinds, mask)
        rotary = self.rotary.span(past, past + S, x.dtype, x.device) if positions is None \
            else self.rotary(positions, x.dtype)
        # Decoding and verification calls (a few dozen tokens; rows of their own cache rows, or of one row broadcast;
        # masks none or float; no autograd): every layer in one C++ call, Layer.__call__'s steps with the same bits,
        # no Python between them.
        if self.specs is not None and cache is not None and x.shape[0] * S <= kernels.MAX_QUERIES \
                and not torch.is_grad_enabled() \
                and all(m is None or m.is_floating_point() for m in masks.values()) \
                and (buffers := cache.reserve(len(self.layers), past + S, rows=x.shape[0])) is not None:
            kinds = [layer.kind for layer in self.layers]
            x, keys, values = kernels.decoder_layers(x, self.specs, [rotary[k][0] for k in kinds],
                                                     [rotary[k][1] for k in kinds], [masks[k] for k in kinds],
                                                     *buffers, past)
            if keys:  # rows broadcast on a one-row cache: their entries held aside until keep_row
                cache.hold(keys, values)
            else:
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
        sdpa = S > 1 and past > 0 and not kernels.attends(self.head_dim, x)
        needed = {kind: (kind == "sliding_attention" and self.window is not None and past + S > self.window)
                  or sdpa for kind in self.kinds}
        if not any(needed.values()):
            return dict.fromkeys(self.kinds)
        positions = torch.arange(past, past + S, device=self.masks.device)
        allowed = torch.ones(S, S, dtype=torch.bool, device=self.masks.device).tril_()
        return {kind: self.masks.mask(allowed, positions, positions, past, kind) if needed[kind] else None
                for kind in self.kinds}


def _placement(model: PreTrainedModel) -> dict[str, torch.dtype | torch.device]:
    """The dtype and device of ``model``'s weights, as :class:`Body` takes them."""
    weight = model.get_input_embeddings().weight
    return {"dtype": weight.dtype, "device": weight.device}


@functools.cache
def _digest() -> str:
    digest = hashlib.sha256()
    for source in (__file__, Path(__file__).with_name("gguf_weights.py")):
        digest.update(Path(source).read_bytes())
    return digest.hexdigest()[:8]
