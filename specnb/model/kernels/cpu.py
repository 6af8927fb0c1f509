"""CPU feature detection: which instruction-set path the few-row kernels take here (a leaf module).

Three classes of x86 CPU matter for decoding (the README's "The forward pass"): AVX2 + FMA only, AVX512-BF16
(``vdpbf16ps``: bf16 pairs multiplied and summed into fp32) and AMX-BF16 (every AMX CPU also has AVX512-BF16, which the
few-row kernels use: a call of a few rows is bound by reading the weights, not by the dot products).
``SPECNB_CPU_ISA=avx2`` forces the AVX2 path (to compare paths, or to test one on a bigger CPU).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

ISAS = ("avx2", "avx512bf16")  # the kernel's paths, in the order of its ISA_* constants


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of ``/proc/cpuinfo`` (empty where it cannot be read: not Linux, not x86)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def cpu_class(flags: frozenset[str] | None = None) -> str:
    """``"amx"``, ``"avx512bf16"``, ``"avx2"`` or ``"other"``: the class every number is reported with
    (``avx2`` where ``SPECNB_CPU_ISA=avx2`` forces that path on this machine's CPU)."""
    if flags is None and os.environ.get("SPECNB_CPU_ISA") == "avx2" and {"avx2", "fma"} <= cpu_flags():
        return "avx2"
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512bf16"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "other"


def kernel_isa(flags: frozenset[str] | None = None) -> str | None:
    """The kernel path for this CPU (one of :data:`ISAS`), or None where the kernels cannot run."""
    flags = cpu_flags() if flags is None else flags
    if not {"avx2", "fma"} <= flags:
        return None
    forced = os.environ.get("SPECNB_CPU_ISA")
    if forced:
        if forced not in ISAS:
            raise ValueError(f"SPECNB_CPU_ISA={forced!r}; use one of {', '.join(ISAS)}")
        return forced if forced == "avx2" or "avx512_bf16" in flags else "avx2"
    return "avx512bf16" if "avx512_bf16" in flags else "avx2"


def batch_dtype(dtype: str, device_type: str = "cpu") -> str:
    """The dtype (``"bfloat16"``, ``"float32"``, ...) the GEMMs of a many-row call (a prefill, an extraction batch)
    with ``dtype`` weights compute in on ``device_type``: ``"float32"`` for bf16 on a CPU without AMX, else ``dtype``.

    Why: without AMX tiles oneDNN's bf16 GEMM is slower than its fp32 GEMM, several times so on the AVX2 path
    (``specnb kernels bench --backends torch --rows 4096`` in both dtypes; docs/forward_pass.md).
    """
    if device_type == "cpu" and dtype == "bfloat16" and cpu_class() != "amx":
        return "float32"
    return dtype
