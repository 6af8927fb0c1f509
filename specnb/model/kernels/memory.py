"""Model weights in 2 MB pages (Linux transparent huge pages), for the few-row kernels to stream.

A decoding call reads every weight once, front to back. In 4 KB pages that stream crosses a page boundary
every 4 KB: the hardware prefetchers stop there and the TLB misses every page. Most Linux machines hand out
2 MB pages only to memory that asks for them (``/sys/kernel/mm/transparent_hugepage/enabled`` =
``madvise``), and PyTorch's allocator asks only when ``THP_MEM_ALLOC_ENABLE=1`` was set before torch was
imported. What it saves, measured: docs/forward_pass.md, "Measurements behind the code".

:func:`rehome` copies a model's large weights into such memory (an anonymous ``mmap`` advised with
``MADV_HUGEPAGE``, 2 MB-aligned) in place of their old storage: same Parameters, same values, ties kept.
Where the OS has no such advice (not Linux, THP ``never``) it does nothing.
"""

from __future__ import annotations

import mmap

import torch
from torch import Tensor, nn

HUGE_PAGE = 2 << 20
MIN_BYTES = HUGE_PAGE  # smaller weights fit in one page either way


def available() -> bool:
    """Whether this OS lets a mapping ask for transparent huge pages."""
    return hasattr(mmap, "MADV_HUGEPAGE")


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> Tensor:
    """An uninitialised CPU tensor of ``shape`` and ``dtype`` whose storage starts on a 2 MB boundary of a
    mapping advised for huge pages (the mapping lives as long as the tensor)."""
    numel = 1
    for size in shape:
        numel *= size
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared would be shmem
    region.madvise(mmap.MADV_HUGEPAGE)
    start = torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr()
    return torch.frombuffer(region, dtype=dtype, count=numel, offset=-start % HUGE_PAGE).view(shape)


def rehome(model: nn.Module) -> int:
    """Move every CPU parameter of at least 2 MB into huge-page memory (values, Parameters and ties kept);
    returns the bytes moved (0 where :func:`available` is False)."""
    if not available():
        return 0
    moved = 0
    for param in model.parameters():  # each Parameter once, so tied weights stay one tensor
        data = param.data
        nbytes = data.numel() * data.element_size()
        if data.device.type != "cpu" or nbytes < MIN_BYTES or not data.is_contiguous():
            continue
        copy = empty(data.shape, data.dtype)
        copy.copy_(data)
        param.data = copy
        moved += nbytes
    return moved
