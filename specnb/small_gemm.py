"""Linear layers for the few rows a decoding call has: ``csrc/small_gemm.c``, compiled once, called by ctypes.

A decoding step multiplies 1 to a few dozen rows by every weight of the model. That is bound by reading
the weights, so verifying a short draft should cost about what one token costs. On this project's AVX2
CPU (no AMX) PyTorch's float32 GEMM does not behave that way: the decoder body's linear layers of
Gemma-3-270M take ~31 ms for one row and ~54 ms for two, and the output head ~28 / ~52 ms. The kernel here
streams each weight once for all rows: body ~20 / ~18 ms, head ~30 / ~33 ms (1 / 2 rows; 8 rows: body
~35 ms, head ~50 ms). It also computes every output element the same way whatever the number of rows,
so logits of a verified draft are bit-identical to those of decoding its tokens one at a time.

The kernel needs gcc (or ``$CC``) and an x86-64 CPU with AVX2 and FMA; it is built on first use into
``<cache>/kernels`` (keyed by the source's hash). Without it, or for other dtypes, devices, more than
:data:`MAX_ROWS` rows or tensors that need gradients, :func:`linear` is ``F.linear``. Set
``SPECNB_SMALL_GEMM=0`` to turn it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import types
import warnings
from importlib.resources import files
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .models import cache_dir

MAX_ROWS = 16  # above this PyTorch's GEMM (oneDNN for the head) is as fast or faster on the CPU measured


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _source() -> bytes:
    return files("specnb").joinpath("csrc/small_gemm.c").read_bytes()


@functools.cache
def _digest() -> str:
    return hashlib.sha256(_source()).hexdigest()[:16]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot run here (a warning says why)."""
    if os.environ.get("SPECNB_SMALL_GEMM", "1") == "0":
        return None
    if not {"avx2", "fma"} <= _cpu_flags():
        return None
    source = _source()
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        warnings.warn("no C compiler found: specnb uses PyTorch's GEMM for small calls", stacklevel=2)
        return None
    out = cache_dir() / "kernels" / f"small_gemm-{_digest()}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src, so = Path(tmp) / "small_gemm.c", Path(tmp) / out.name
            src.write_bytes(source)
            build = subprocess.run([compiler, "-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC",
                                    "-o", str(so), str(src)], capture_output=True, text=True)
            if build.returncode != 0:
                warnings.warn(f"building specnb's small-GEMM kernel failed; using PyTorch's GEMM:\n"
                              f"{build.stderr[-2000:]}", stacklevel=2)
                return None
            so.replace(out)  # atomic: a half-written library is never loaded
    lib = ctypes.CDLL(str(out))
    lib.small_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.small_gemm.restype = None
    return lib


def usable(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`linear` runs the kernel for this input (else it calls ``F.linear``)."""
    return (x.shape[-1] > 0 and x.numel() // x.shape[-1] <= MAX_ROWS and x.dtype == weight.dtype == torch.float32
            and x.device.type == weight.device.type == "cpu" and weight.is_contiguous()
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and library() is not None)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x [..., K], weight [N, K], bias [N] -> [..., N]."""
    if not usable(x, weight):
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    rows, k = flat.shape
    n = weight.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype)
    library().small_gemm(flat.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n, k, torch.get_num_threads())
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], n)


def _linear_forward(self: nn.Linear, x: Tensor) -> Tensor:
    return linear(x, self.weight, self.bias)


def routed(model: nn.Module) -> str:
    """``"small-gemm-<source hash>"`` if ``model``'s linear layers go through the kernel, else ``""``
    (timing tables are cached under names that include it)."""
    uses = any(isinstance(m, nn.Linear) and getattr(m.forward, "__func__", None) is _linear_forward
               for m in model.modules())
    return f"small-gemm-{_digest()}" if uses else ""


def install(model: nn.Module) -> int:
    """Route every ``nn.Linear`` of ``model`` through :func:`linear`; returns how many were routed.

    Only the instances' ``forward`` changes (weights, state dict and other code that calls the modules,
    Hugging Face's ``generate`` included, see the same numbers). Does nothing where the kernel is unusable.
    """
    param = next(model.parameters(), None)
    if param is None or param.dtype != torch.float32 or param.device.type != "cpu" or library() is None:
        return 0
    routed = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_linear_forward, module)
            routed += 1
    return routed
