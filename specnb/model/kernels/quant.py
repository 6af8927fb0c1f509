"""Linear layers over GGUF's quantized weight blocks (``csrc/quant.h``, built into the kernels' extension).

The embedded models ship as GGUF files whose weights are blocks of 4.5-8.5 bits per weight (Q8_0, Q5_0, Q4_K,
Q6_K). A decoding call is bound by reading its weights, so a call that streams the blocks as stored reads
2-3.5x fewer bytes than one over their bf16 dequantization. :func:`linear` does that for a few rows: each
group of 32 weights is decoded in registers with the fp32 operations of the ``gguf`` package's dequantization
(the same values) and multiplied with a few input rows at once in fp32, in a fixed order, so rows are
bit-independent (a verified draft gets the bits of decoding its tokens one at a time). Activations are not
quantized, unless a weight asks for int8 activations (``QuantizedWeight.int8``, ``csrc/quant_int8.h``): then the
blocks are repacked once, 16 weight rows interleaved, and their integer codes multiply each row rounded to int8 per
block (VNNI or AVX2 integer dot products, every code decoded once per call for all its rows): another model, still with
bit-independent rows, whose calls of several rows cost a fraction of the exact path's (docs/kernels.md).
``specnb kernels quant`` times it against the bf16 kernel on the shipped tensors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from . import extension, isa_code, memory
from .cpu import cpu_flags, kernel_isa

# ggml type id and (weights, bytes) per block of each format the kernel decodes
FORMATS: dict[str, tuple[int, int, int]] = {"Q8_0": (8, 32, 34), "Q5_0": (6, 32, 22), "Q4_K": (12, 256, 144),
                                            "Q6_K": (14, 256, 210)}


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight [N, K] as GGUF stores it: ``blocks`` uint8 [N, K / block weights * block bytes], row n holding
    output n's K weights; ``format``: one of :data:`FORMATS`; ``int8``: multiply it with the input rows rounded to
    int8 (:func:`int8_supported` CPUs, N a multiple of :data:`INT8_LANES`), over ``packed``, the blocks repacked
    for that route (uint8 [N / 16, tile bytes]: 16 rows interleaved, built from ``blocks`` when not given)."""

    blocks: Tensor
    format: str
    int8: bool = False
    packed: Tensor | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unsupported weight format {self.format!r}; supported: {', '.join(FORMATS)}")
        _, weights, nbytes = FORMATS[self.format]
        if self.blocks.dtype != torch.uint8 or self.blocks.dim() != 2 or self.blocks.shape[1] % nbytes:
            raise ValueError(f"{self.format} blocks must be uint8 [N, a multiple of {nbytes} bytes], "
                             f"got {self.blocks.dtype} {tuple(self.blocks.shape)}")
        if self.int8 and self.shape[0] % INT8_LANES:
            raise ValueError(f"int8 activations need N a multiple of {INT8_LANES}, got {self.shape[0]}")
        if not self.int8:
            object.__setattr__(self, "packed", None)
        elif self.packed is None:
            object.__setattr__(self, "packed", memory.place(  # huge pages: a call streams them front to back
                _extension().block_repack(self.blocks, FORMATS[self.format][0])))

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): outputs and inputs."""
        _, weights, nbytes = FORMATS[self.format]
        return self.blocks.shape[0], self.blocks.shape[1] // nbytes * weights

    @property
    def nbytes(self) -> int:
        """Bytes a call streams: the blocks as stored."""
        return self.blocks.numel()

    @classmethod
    def from_gguf(cls, tensor, int8: bool = False) -> QuantizedWeight:
        """The weight of a ``gguf.GGUFReader`` tensor (its ``data``: uint8 [N, row bytes], memory-mapped); ``int8``:
        with int8 activations where its rows make whole tiles (N a multiple of :data:`INT8_LANES`). The blocks of
        such a weight stay where the reader holds them, the file's read-only mapping (pages the kernel may drop) but
        for rows the reader reordered: its calls stream the repacked copy, and only dequantization and embedding
        lookups read the blocks. Others are copied once into memory (huge pages where it can), where their calls
        stream them."""
        name = tensor.tensor_type.name
        data = np.asarray(tensor.data)
        with warnings.catch_warnings():  # PyTorch warns that the mapping is read-only: nothing writes a weight
            warnings.simplefilter("ignore", UserWarning)
            mapped = torch.from_numpy(data.reshape(data.shape[0], -1))
        if int8 and data.shape[0] % INT8_LANES == 0:
            return cls(mapped, name, True)
        placed = memory.place(mapped)
        return cls(placed if placed is not mapped else mapped.clone(), name)

    def dequantize(self) -> Tensor:
        """float32 [N, K]: the weights :func:`linear` multiplies with (equal to ``gguf.quants.dequantize``'s)."""
        return dequantize(self.blocks, self.format)


def dequantize(blocks: Tensor, format: str) -> Tensor:
    """Rows of ``format`` blocks (uint8 [n, row bytes], e.g. some rows of a :class:`QuantizedWeight`'s) as float32
    [n, K]."""
    return _extension().block_dequantize(blocks, FORMATS[format][0])


INT8_LANES = 16  # weight rows interleaved per tile of the int8 route (quant_int8.h's LANES)


def int8_supported() -> bool:
    """Whether this CPU runs the int8-activation route: every CPU the kernels run on (AVX2 + FMA + F16C), with
    VNNI on the AVX512 path."""
    isa = kernel_isa()
    return isa == "avx2" and "f16c" in cpu_flags() or isa == "avx512bf16" and "avx512_vnni" in cpu_flags()


INT8_PATHS = (3, 2)  # the extension's ISA_INT8_AVX2 / ISA_INT8: the int8 route's tiles on each path of ISAS


def _extension() -> ModuleType:
    if kernel_isa() is None:
        raise RuntimeError("the quantized kernels need an x86 CPU with AVX2 and FMA")
    ext = extension()
    if ext is None:
        raise RuntimeError("the quantized kernels are part of specnb's CPU kernels, which are off or could not be "
                           "built (SPECNB_KERNELS=0, or see the warning above)")
    return ext


def linear(x: Tensor, weight: QuantizedWeight, bias: Tensor | None = None, isa: int | None = None) -> Tensor:
    """x [..., K] float32 or bfloat16 times ``weight`` [N, K] (+ bias [N]) -> [..., N] in x's dtype, each row
    bit-identical to the same row computed alone. ``isa``: the path (:data:`specnb.model.kernels.cpu.ISAS` index;
    default this CPU's). Both paths multiply the blocks' fp32 weights (:meth:`QuantizedWeight.dequantize`'s values)
    with fp32 FMAs, bf16 rows widened exactly; the AVX512 path sums in zmm, the AVX2 path in ymm (another fixed
    order, so the two paths' bits differ). A weight with ``int8`` set takes the int8-activation route instead:
    each row rounded to int8 per block of the format, times the blocks' integer codes, scaled per block in fp32
    (on the AVX512 path with VNNI, on the AVX2 path with ``vpmaddubsw``: the same bits; ValueError where
    :func:`int8_supported` is false)."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {k}")
    if weight.int8 and not int8_supported():
        raise ValueError("int8 activations need a CPU with AVX2, FMA and F16C (and VNNI on the AVX512 path)")
    flat = x.reshape(-1, k).contiguous()
    isa = isa_code() if isa is None else isa
    path = INT8_PATHS[isa] if weight.int8 else isa
    blocks = weight.packed if weight.int8 else weight.blocks
    out = _extension().block_linear(flat, blocks, FORMATS[weight.format][0], bias, path)
    return out.reshape(*x.shape[:-1], n)
