"""The machine's limits a decoding call is measured against: read bandwidth, compute roofs, bytes per call.

One target call must at least stream the model's weights once (:func:`streamed_bytes` / :func:`read_bandwidth`
seconds: the *bandwidth floor*) and do parameters x tokens multiply-adds with the instruction its path uses
(:func:`path_instruction`, at :func:`peak_macs`: the *compute floor*; :func:`gemm_flops` is PyTorch's GEMM at its
best, the practical ceiling of a prefill). A call's cost sits above the larger of the two; how far above is the
loop's inefficiency. These are what ``specnb bench`` and ``specnb roofline`` report beside every time.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .kernels import memory

if TYPE_CHECKING:
    from .models import LoadedModel


@functools.cache
def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """The machine's read bandwidth in GB/s, measured once per process (:func:`sample_read_bandwidth`)."""
    return sample_read_bandwidth(megabytes, repeats)


def sample_read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """The machine's read bandwidth now, in GB/s (1e9 bytes): median of ``repeats`` sums over ``megabytes`` of
    float32 on all of torch's threads, after one untimed pass (a stream-like read). The buffer sits in 2 MB
    pages where the OS offers them, as the kernels' weights do (:mod:`specnb.model.kernels.memory`), so it reads
    at the ceiling the kernels see (4 KB pages read slower). A VM's bandwidth drifts from one minute to the next,
    so long runs sample it more than once (how far, measured: ``docs/forward_pass.md``)."""
    shape = (megabytes << 18,)  # 4 bytes each
    data = memory.empty(shape, torch.float32).fill_(1.0) if memory.available() else torch.ones(shape)
    data.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times) / 1e9


@functools.cache
def gemm_flops(dtype: torch.dtype = torch.bfloat16, size: int = 2048, repeats: int = 5, budget: float = 0.1) -> float:
    """FLOP/s of PyTorch's CPU GEMM on a large square product in ``dtype`` (oneDNN / MKL at their best):
    the practical compute ceiling of a many-token call. Products of side 256, 512, ... up to ``size``, each the median
    of ``repeats`` after one untimed call, stopping at the first whose median takes over ``budget`` seconds: where
    this CPU has no native instruction for ``dtype`` (bf16 without AVX512-BF16) a 2048 product takes a minute."""
    side = min(256, size)
    while True:
        a, b = torch.randn(side, side).to(dtype), torch.randn(side, side).to(dtype)
        torch.mm(a, b)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        if side >= size or seconds > budget:
            return 2 * side**3 / seconds
        side = min(2 * side, size)


def cuda_ceilings(device: torch.device, dtype: torch.dtype = torch.bfloat16, gigabytes: int = 4,
                  side: int = 8192, repeats: int = 5) -> tuple[float, float]:
    """(read bytes/s, GEMM FLOP/s in ``dtype``) of a CUDA device: a sum over ``gigabytes`` GB and a product of
    side ``side``, each the median of ``repeats`` after an untimed one: the floors of a GPU cost table."""

    def seconds(work: Callable[[], object]) -> float:
        work()
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            work()
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    data = torch.ones(gigabytes << 28, dtype=torch.float32, device=device)
    read = data.numel() * 4 / seconds(data.sum)
    del data
    a, b = (torch.randn(side, side, device=device, dtype=dtype) for _ in range(2))
    return read, 2 * side**3 / seconds(lambda: a @ b)


INSTRUCTIONS = {"fp32-fma": 0, "bf16-dot": 1, "int8-vnni": 2, "int8-vnni-broadcast": 3, "int8-avx2": 4}
"""The multiply-add instructions of the kernels' paths: fp32 FMAs (the exact GGUF path, fp32 weights, the AVX2
path), ``vdpbf16ps`` (the bf16 kernel on the AVX512 path), ``vpdpbusd`` (the int8 route over GGUF blocks); and
``vpdpbusd`` as the int8 tiles issue it, one operand a 4-byte broadcast from memory (16 accumulators), which
reaches less than the register form on some CPUs (docs/kernels.md, fourth pass); and the int8 route's step on AVX2
(``vpmaddubsw``, ``vpmaddwd``, ``vpaddd`` on a broadcast row, as its half tiles issue it)."""


@functools.cache
def peak_macs(instruction: str) -> float | None:
    """Multiply-adds per second that ``instruction`` (one of :data:`INSTRUCTIONS`) reaches on all of torch's
    threads here, from registers alone (the extension's ``peak_rate``: 12 independent chains a thread, ~0.2 s;
    ``int8-vnni-broadcast``: 16, one operand from L1), or None where this CPU or build lacks it."""
    from .kernels import extension
    from .kernels.cpu import cpu_flags, kernel_isa

    flags, ext = cpu_flags(), extension()
    needs = {"fp32-fma": {"avx2", "fma"}, "bf16-dot": {"avx512_bf16"}, "int8-vnni": {"avx512_vnni"},
             "int8-vnni-broadcast": {"avx512_vnni"}, "int8-avx2": {"avx2"}}[instruction]
    if ext is None or not needs <= flags:
        return None
    return ext.peak_rate(INSTRUCTIONS[instruction], kernel_isa() == "avx512bf16", 0.2)


def kernel_instruction(blocks: bool, int8: bool, bf16: bool) -> str:
    """The multiply-add instruction (one of :data:`INSTRUCTIONS`) of specnb's kernels on this CPU's path for a linear
    over GGUF blocks (``blocks``; ``int8``: times int8-rounded activations) or over dense weights (``bf16``: in bf16,
    else fp32)."""
    from .kernels.cpu import kernel_isa

    avx512 = kernel_isa() == "avx512bf16"
    if blocks:
        return ("int8-vnni" if avx512 else "int8-avx2") if int8 else "fp32-fma"
    return "bf16-dot" if bf16 and avx512 else "fp32-fma"


def int8_form() -> str:
    """The int8 route's instruction as its tiles issue it on this CPU's path (one operand a broadcast row):
    ``int8-vnni-broadcast``, or on the AVX2 path ``int8-avx2``."""
    from .kernels.cpu import kernel_isa

    return "int8-vnni-broadcast" if kernel_isa() == "avx512bf16" else "int8-avx2"


def path_instruction(target: LoadedModel) -> str | None:
    """The instruction ``target``'s projections multiply with (:func:`kernel_instruction`), or None where
    specnb's kernels do not run it (PyTorch's GEMMs: :func:`gemm_flops` is their roof)."""
    from .kernels import route

    if target.decoder.uses_gguf:
        return kernel_instruction(True, target.decoder.uses_int8, False)
    if not route(target.device, target.dtype):
        return None
    return kernel_instruction(False, False, target.dtype == torch.bfloat16)


def streamed_bytes(target: LoadedModel) -> int:
    """Bytes of weights one call of ``target`` reads: every parameter once (a tied head counted once), less an input
    embedding that is not also the output head (a call reads only the rows of its tokens); over a GGUF file's blocks
    (:mod:`specnb.model.gguf_weights`), the bytes the blocks hold."""
    from .decoder import Body

    if isinstance(target.decoder, Body) and target.decoder.uses_gguf:
        return target.decoder.weight_bytes()
    model = target.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embedding is not None and head is not None and embedding.weight is not head.weight:
        total -= embedding.weight.numel() * embedding.weight.element_size()
    return total


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that multiply every token of a call (the weights :func:`streamed_bytes` counts)."""
    total = sum(p.numel() for p in model.parameters())
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embedding is not None and head is not None and embedding.weight is not head.weight:
        total -= embedding.weight.numel()
    return total
