"""Linear layers over GGUF's quantized weight blocks (``csrc/quant.h``, built into the kernels' extension).

The embedded models ship as GGUF files whose weights are blocks of 4.5-8.5 bits per weight (Q8_0, Q5_0, Q4_K,
Q6_K). A decoding call is bound by reading its weights, so a call that streams the blocks as stored reads
2-3.5x fewer bytes than one over their bf16 dequantization. :func:`linear` does that for a few rows: each
group of 32 weights is decoded in registers with the fp32 operations of the ``gguf`` package's dequantization
(the same values) and multiplied with a few input rows at once in fp32, in a fixed order, so rows are
bit-independent (a verified draft gets the bits of decoding its tokens one at a time). Activations are not
quantized. ``specnb kernels quant`` times it against the bf16 kernel on the shipped tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from . import extension, isa_code
from .cpu import kernel_isa

# ggml type id and (weights, bytes) per block of each format the kernel decodes
FORMATS: dict[str, tuple[int, int, int]] = {"Q8_0": (8, 32, 34), "Q5_0": (6, 32, 22), "Q4_K": (12, 256, 144),
                                            "Q6_K": (14, 256, 210)}


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight [N, K] as GGUF stores it: ``blocks`` uint8 [N, K / block weights * block bytes], row n holding
    output n's K weights; ``format``: one of :data:`FORMATS`."""

    blocks: Tensor
    format: str

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unsupported weight format {self.format!r}; supported: {', '.join(FORMATS)}")
        _, weights, nbytes = FORMATS[self.format]
        if self.blocks.dtype != torch.uint8 or self.blocks.dim() != 2 or self.blocks.shape[1] % nbytes:
            raise ValueError(f"{self.format} blocks must be uint8 [N, a multiple of {nbytes} bytes], "
                             f"got {self.blocks.dtype} {tuple(self.blocks.shape)}")

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
    def from_gguf(cls, tensor) -> QuantizedWeight:
        """The weight of a ``gguf.GGUFReader`` tensor (its ``data``: uint8 [N, row bytes], memory-mapped)."""
        name = tensor.tensor_type.name
        data = np.array(tensor.data, copy=True)  # out of the read-only memory map
        return cls(torch.from_numpy(data.reshape(data.shape[0], -1)), name)

    def dequantize(self) -> Tensor:
        """float32 [N, K]: the weights :func:`linear` multiplies with (equal to ``gguf.quants.dequantize``'s)."""
        return _extension().block_dequantize(self.blocks, FORMATS[self.format][0])


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
    bit-identical to the same row computed alone. ``isa``: the path (:data:`specnb.kernels.cpu.ISAS` index;
    default this CPU's). Both paths multiply the blocks' fp32 weights (:meth:`QuantizedWeight.dequantize`'s values)
    with fp32 FMAs, bf16 rows widened exactly; the AVX512 path sums in zmm, the AVX2 path in ymm (another fixed
    order, so the two paths' bits differ)."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {k}")
    flat = x.reshape(-1, k).contiguous()
    out = _extension().block_linear(flat, weight.blocks, FORMATS[weight.format][0], bias,
                              isa_code() if isa is None else isa)
    return out.reshape(*x.shape[:-1], n)
