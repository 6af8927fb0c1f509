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


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The fields of the first processor in ``text`` (``/proc/cpuinfo``'s format: ``key : value`` lines, one
    block per processor, blocks split by a blank line)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            break
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def cpuinfo() -> dict[str, str]:
    """This CPU's :func:`cpuinfo_fields` (empty where ``/proc/cpuinfo`` cannot be read: not Linux)."""
    try:
        return cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The flags of ``/proc/cpuinfo`` (empty where it cannot be read: not Linux, not x86)."""
    return frozenset(cpuinfo().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string where it cannot be read."""
    return cpuinfo().get("model name") or platform.processor() or "cpu"


def cpu_id(fields: dict[str, str] | None = None) -> str:
    """The CPU's model name with its family and model numbers (``AMD EPYC family 25 model 17``), or the name alone
    where they cannot be read: what tells two CPUs of one name apart (a Zen 4 and a Zen 5 VM both report "AMD
    EPYC", and a measurement cached on one must not decide for the other). ``fields``: :func:`cpuinfo_fields` of
    another CPU (a test), else this one's."""
    fields = cpuinfo() if fields is None else fields
    name = fields.get("model name") or platform.processor() or "cpu"
    if "cpu family" in fields and "model" in fields:
        return f"{name} family {fields['cpu family']} model {fields['model']}"
    return name


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


GEMM_SHAPE = (512, 640, 2048)  # rows x inner x outputs: a prefill's pass through one Gemma-3-270M MLP projection
GEMM_REPEATS = 5


def batch_dtype(dtype: str, device_type: str = "cpu") -> str:
    """The dtype (``"bfloat16"``, ``"float32"``, ...) the GEMMs of a many-row call (a prefill, an extraction batch)
    with ``dtype`` weights compute in on ``device_type``: for bf16 on a CPU, the faster of the two on this machine
    (:func:`batch_gemm_dtype`), else ``dtype``."""
    if device_type == "cpu" and dtype == "bfloat16":
        return batch_gemm_dtype()
    return dtype


@functools.cache
def batch_gemm_dtype() -> str:
    """``"bfloat16"`` or ``"float32"``: which GEMM multiplies bf16 weights by many rows faster here, measured once
    per CPU (:func:`cpu_id`), thread count and torch build and cached under ``<cache>/kernels`` (so every process
    routes alike).

    Why measured: oneDNN's bf16 GEMM ran 1.9x slower than its fp32 GEMM on an AVX512-BF16 Xeon, and 4.5x faster
    on an AVX512-BF16 Zen 4, whose fp32 GEMM (MKL) is the slow one (docs/forward_pass.md).
    """
    import json

    import torch

    from ...atomic import write_text
    from ...paths import artifact_path

    flags = "-".join(os.environ.get(v, "") for v in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "SPECNB_CPU_ISA"))
    host = f"{cpu_id()}-{torch.get_num_threads()}threads-torch{torch.__version__}-{flags}"
    path = artifact_path("kernels", "batch-gemm-" + "".join(c if c.isalnum() or c in "-._" else "_" for c in host)
                         + ".json")
    try:
        return json.loads(path.read_text())["dtype"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    seconds = time_batch_gemms()
    choice = min(seconds, key=seconds.get)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps({"dtype": choice, "seconds": seconds, "shape": GEMM_SHAPE}))
    return choice


def time_batch_gemms() -> dict[str, float]:
    """Best-of-:data:`GEMM_REPEATS` seconds of one :data:`GEMM_SHAPE` GEMM of bf16 inputs and weights, computed in
    ``"bfloat16"`` and in ``"float32"`` (upcast, the output rounded to bf16), the two interleaved."""
    import time

    import torch
    import torch.nn.functional as F

    rows, inner, outputs = GEMM_SHAPE
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, inner, generator=g).bfloat16(), torch.randn(outputs, inner, generator=g).bfloat16()
    runs = {"bfloat16": lambda: F.linear(x, w), "float32": lambda: F.linear(x.float(), w.float()).bfloat16()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(GEMM_REPEATS):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best
