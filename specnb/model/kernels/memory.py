"""Model weights in 2 MB pages (Linux transparent huge pages), for the few-row kernels to stream.

A decoding call reads every weight once, front to back. In 4 KB pages that stream crosses a page boundary
every 4 KB: the hardware prefetchers stop there and the TLB misses every page. Most Linux machines hand out
2 MB pages only to memory that asks for them (``/sys/kernel/mm/transparent_hugepage/enabled`` =
``madvise``), and PyTorch's allocator asks only when ``THP_MEM_ALLOC_ENABLE=1`` was set before torch was
imported. What it saves, measured: docs/forward_pass.md, "Measurements behind the code".

:func:`rehome` copies a model's large weights into such memory (an anonymous ``mmap`` advised with
``MADV_HUGEPAGE``, 2 MB-aligned) in place of their old storage: same Parameters, same values, ties kept. Weights
from 64 KB to 2 MB share such mappings (:class:`Arena`, :func:`empty_weight`): a model of small projections would
otherwise stream most of its body through 4 KB pages.
Where the OS has no such advice (not Linux, THP ``never``) it does nothing.
"""

from __future__ import annotations

import math
import mmap
import threading

import torch
from torch import Tensor, nn

HUGE_PAGE = 2 << 20
MIN_BYTES = HUGE_PAGE  # weights from this size get a mapping of their own; smaller ones share ARENA's chunks
MIN_SMALL_BYTES = 64 << 10  # below this a weight spans a few 4 KB pages: left where it is


def available() -> bool:
    """Whether this OS lets a mapping ask for transparent huge pages."""
    return hasattr(mmap, "MADV_HUGEPAGE")


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor:
    """An uninitialised CPU tensor of ``shape`` and ``dtype`` whose storage starts on a 2 MB boundary of a
    mapping advised for huge pages (the mapping lives as long as the tensor)."""
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared would be shmem
    region.madvise(mmap.MADV_HUGEPAGE)
    start = torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr()
    return torch.frombuffer(region, dtype=dtype, count=numel, offset=-start % HUGE_PAGE).view(shape)


class Arena:
    """Weights smaller than a huge page, placed one after another in shared huge-page chunks of :data:`CHUNK`
    bytes, each at a 4 KB boundary: a model's small weights (Gemma-3-270M's projections are 0.1-1.3 MB each),
    placed in the order the model is built, become a run of 2 MB pages instead of hundreds of 4 KB ones. A chunk
    lives as long as any tensor in it, so only weights kept for the model's life belong here. Tensors placed in
    inference mode and outside it come from separate chunks (each of the kind its weights are)."""

    CHUNK = 32 << 20
    ALIGN = 4096

    def __init__(self) -> None:
        self.chunks: dict[bool, tuple[Tensor, int]] = {}  # inference mode -> (current chunk, bytes used)
        self.lock = threading.Lock()  # models loaded on two threads at once must not share bytes

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor:
        """An uninitialised tensor of ``shape`` and ``dtype``, at most :data:`CHUNK` bytes, in a chunk."""
        nbytes = _nbytes(shape, dtype)
        if nbytes > self.CHUNK:
            raise ValueError(f"{nbytes} bytes do not fit an arena chunk of {self.CHUNK}")
        mode = torch.is_inference_mode_enabled()
        with self.lock:
            chunk, used = self.chunks.get(mode, (None, 0))
            if chunk is None or used + nbytes > self.CHUNK:
                chunk, used = empty((self.CHUNK,), torch.uint8), 0
            self.chunks[mode] = chunk, used + -(-nbytes // self.ALIGN) * self.ALIGN
        return chunk[used:used + nbytes].view(dtype).view(shape)


ARENA = Arena()


def _nbytes(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def empty_weight(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor | None:
    """An uninitialised CPU tensor for a weight the model keeps, in huge pages: a mapping of its own from
    :data:`MIN_BYTES`, a place in :data:`ARENA` from :data:`MIN_SMALL_BYTES`; None below that, or where
    :func:`available` is False (the caller allocates as usual)."""
    nbytes = _nbytes(shape, dtype)
    if not available() or nbytes < MIN_SMALL_BYTES:
        return None
    return empty(shape, dtype) if nbytes >= MIN_BYTES else ARENA.empty(shape, dtype)


def empty_buffer(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor | None:
    """An uninitialised CPU tensor in a huge-page mapping of its own where it spans at least :data:`MIN_BYTES`
    (a KV cache buffer at a long context), else None (the caller allocates as usual). Unlike :func:`empty_weight`
    it never takes the arena's memory, which a freed buffer could not give back."""
    if not available() or _nbytes(shape, dtype) < MIN_BYTES:
        return None
    return empty(shape, dtype)


def place(weight: Tensor) -> Tensor:
    """A copy of the contiguous CPU tensor ``weight`` in :func:`empty_weight`'s memory, or ``weight`` itself where
    that is None."""
    out = empty_weight(weight.shape, weight.dtype)
    return weight if out is None else out.copy_(weight)


def settled(data: Tensor) -> Tensor:
    """``data`` (a weight the model keeps) copied into :func:`empty_weight`'s memory where it is a contiguous CPU
    tensor smaller than :data:`MIN_BYTES` (:func:`rehome` moves larger ones), in the inference mode it was made in;
    else ``data`` itself."""
    if data.device.type != "cpu" or not data.is_contiguous() or _nbytes(data.shape, data.dtype) >= MIN_BYTES:
        return data
    with torch.inference_mode(data.is_inference()):
        return place(data)


def rehome(model: nn.Module) -> int:
    """Move every CPU parameter of at least 2 MB into huge-page memory (values, Parameters and ties kept);
    returns the bytes moved (0 where :func:`available` is False)."""
    if not available():
        return 0
    moved = 0
    for param in model.parameters():  # each Parameter once, so tied weights stay one tensor
        data = param.data
        nbytes = _nbytes(data.shape, data.dtype)
        if data.device.type != "cpu" or nbytes < MIN_BYTES or not data.is_contiguous():
            continue
        param.data = place(data)  # a mapping of its own at this size
        moved += nbytes
    return moved
