"""Micro-benchmark of the linear layers a decoding call runs: ``specnb kernels bench``.

For each weight shape and row count it times every available backend on the same inputs, cycling through
enough copies of the weight (>= 256 MB, in 2 MB pages where the OS offers them) that each call streams its
weight from memory as in a real model, and reports ms per call, the weight bytes read per second and that as
a fraction of the machine's read bandwidth (:func:`specnb.model.ceilings.read_bandwidth`). Backends:

* ``fewrow``:  :mod:`specnb.model.kernels` (this project's kernel);
* ``torch``:   ``F.linear`` (MKL / oneDNN as PyTorch dispatches it);
* ``onednn``:  the weight prepacked once for oneDNN (``to_mkldnn``), ``mkldnn_linear``;
* ``inductor``: ``torch.compile(mode="max-autotune-no-cudagraphs")`` of ``F.linear``, one compile per shape
  (minutes on two cores: only with ``--inductor``).

``specnb kernels quant`` times :mod:`specnb.model.kernels.quant` on tensors of the shipped GGUF files in their stored
formats against the bf16 kernel on the same weights dequantized (bandwidth fraction on each one's own bytes).

``specnb kernels topk`` times :func:`specnb.model.kernels.top_k` against PyTorch's ``max`` / ``topk`` on logits rows
(greedy acceptance's argmax, Token Recycling's top 8).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ..ceilings import int8_form, kernel_instruction, peak_macs, read_bandwidth
from . import linear as fewrow_linear
from . import memory, quant
from . import top_k as fewrow_top_k
from .cpu import cpu_class

# (name, N, K): the linear layers that dominate Gemma-3-270M and Qwen2.5-Coder-1.5B
SHAPES = {
    "gemma-mlp-up": (2048, 640),
    "gemma-mlp-down": (640, 2048),
    "gemma-head": (262144, 640),
    "qwen1.5b-mlp-up": (8960, 1536),
    "qwen1.5b-mlp-down": (1536, 8960),
    "qwen1.5b-head": (151936, 1536),
}
ROWS = (1, 2, 4, 8, 16, 32, 64)
STREAM_BYTES = 256 << 20


def _onednn(weight: Tensor) -> Callable[[Tensor], Tensor]:
    packed = weight.to_mkldnn()
    return lambda x: torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed, None).to_dense()


def _inductor(weight: Tensor) -> Callable[[Tensor], Tensor]:
    compiled = torch.compile(lambda x, w: F.linear(x, w), mode="max-autotune-no-cudagraphs", dynamic=False)
    return lambda x: compiled(x, weight)


def _weight(n: int, k: int, dtype: torch.dtype) -> Tensor:
    """A random [n, k] weight in 2 MB pages where the OS offers them, as a model's weights are after
    :func:`specnb.model.kernels.rehome`: every backend streams the same kind of memory."""
    values = torch.randn(n, k).to(dtype)
    return memory.empty(values.shape, dtype).copy_(values) if memory.available() else values


BACKENDS: dict[str, Callable[[Tensor], Callable[[Tensor], Tensor]]] = {
    "fewrow": lambda w: lambda x: fewrow_linear(x, w),
    "torch": lambda w: lambda x: F.linear(x, w),
    "onednn": _onednn,
    "inductor": _inductor,
}


@torch.inference_mode()
def bench_linear(shapes: dict[str, tuple[int, int]] = SHAPES, rows: tuple[int, ...] = ROWS,
                 dtype: torch.dtype = torch.bfloat16, backends: tuple[str, ...] = ("fewrow", "torch", "onednn"),
                 repeats: int = 5, bandwidth: float | None = None, progress: bool = True) -> pd.DataFrame:
    """One row per (shape, backend, rows): ``ms`` (median per call), ``gb_per_s`` (weight bytes / time),
    ``bandwidth_fraction`` and ``vs_one_row`` (this call's time over the same backend's one-row time)."""
    bandwidth = bandwidth or read_bandwidth()
    out = []
    cells = [(s, b, r) for s in shapes for b in backends for r in rows]
    bar = tqdm(total=len(cells), desc="kernels", disable=not progress)
    for name, (n, k) in shapes.items():
        nbytes = n * k * torch.finfo(dtype).bits // 8
        weights = [_weight(n, k, dtype) for _ in range(max(1, -(-STREAM_BYTES // nbytes)))]
        for backend in backends:
            calls = [BACKENDS[backend](w) for w in weights]
            one = None
            for m in rows:
                x = torch.randn(m, k).to(dtype)
                for call in calls:  # warm-up: page in, compile, prepack
                    call(x)
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    for call in calls:
                        call(x)
                    times.append((time.perf_counter() - start) / len(calls))
                seconds = statistics.median(times)
                one = seconds if m == 1 else one
                out.append({"shape": name, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."),
                            "backend": backend, "rows": m, "ms": seconds * 1e3, "gb_per_s": nbytes / seconds / 1e9,
                            "bandwidth_fraction": nbytes / seconds / 1e9 / bandwidth,
                            "vs_one_row": seconds / one if one else float("nan"),
                            "cpu_class": cpu_class(), "threads": torch.get_num_threads(),
                            "read_gb_per_s": bandwidth})
                bar.update()
    bar.close()
    return pd.DataFrame(out)


# (embedded model, GGUF tensor): the largest tensor of each format in the shipped files
QUANT_TENSORS = {
    "gemma-head": ("gemma-3-270m", "token_embd.weight"),  # Q8_0, tied embedding / output head
    "gemma-mlp-gate": ("gemma-3-270m", "blk.0.ffn_gate.weight"),  # Q5_0
    "gemma-attn-out": ("gemma-3-270m", "blk.0.attn_output.weight"),  # Q4_K
    "gemma-mlp-down": ("gemma-3-270m", "blk.0.ffn_down.weight"),  # Q6_K
    "qwen1.5b-mlp-up": ("qwen2.5-coder-1.5b-instruct", "blk.0.ffn_up.weight"),  # Q4_K
    "qwen1.5b-mlp-down": ("qwen2.5-coder-1.5b-instruct", "blk.0.ffn_down.weight"),  # Q6_K
    "qwen1.5b-head": ("qwen2.5-coder-1.5b-instruct", "output.weight"),  # Q6_K
}


def gguf_tensor(model: str, name: str):
    """Tensor ``name`` of embedded model ``model``'s GGUF file (its header entry: name, format, shape, offset);
    ValueError (one line) when the file is not fetched or has no such tensor."""
    from ..gguf_file import open_gguf
    from ..model_names import gguf_file

    path = gguf_file(model)
    if not path.exists():
        raise ValueError(f"{path} is missing; run `specnb models fetch {model}` first")
    for tensor in open_gguf(path).tensors:
        if tensor.name == name:
            return tensor
    raise ValueError(f"{path} has no tensor {name!r}")


def _copies(values: Tensor) -> list[Tensor]:
    """``values`` copied into 2 MB pages enough times that cycling through the copies streams >= 256 MB."""
    count = max(1, -(-STREAM_BYTES // (values.numel() * values.element_size())))
    if not memory.available():
        return [values.clone() for _ in range(count)]
    return [memory.empty(values.shape, values.dtype).copy_(values) for _ in range(count)]


def _median_call_s(calls: list[Callable[[], Tensor]], repeats: int) -> float:
    for call in calls:  # warm-up: page in
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        times.append((time.perf_counter() - start) / len(calls))
    return statistics.median(times)


@torch.inference_mode()
def bench_quant(tensors: dict[str, tuple[str, str]] = QUANT_TENSORS, rows: tuple[int, ...] = (1, 4, 16, 64),
                repeats: int = 5, bandwidth: float | None = None, progress: bool = True) -> pd.DataFrame:
    """One row per (tensor, backend, rows), backends ``quant`` (the stored blocks), ``int8`` (the same with int8
    activations, where :func:`specnb.model.kernels.quant.int8_supported`) and ``bf16``
    (the few-row kernel on the same weights dequantized to bf16): ``ms`` (median per call), ``bytes`` read per
    call, ``gb_per_s``, ``bandwidth_fraction``, ``instruction`` (the multiply-add instruction of that path) with
    ``compute_fraction`` (its multiply-adds at that instruction's peak here, :func:`specnb.model.ceilings.peak_macs`,
    over the time), ``roof_fraction`` (the larger of the two floors over the time), ``form_fraction`` (the int8
    route's multiply-adds at its instruction's rate in the broadcast form its tiles issue, ``int8-vnni-broadcast``
    or, on the AVX2 path, ``int8-avx2``; NaN for the other paths), ``vs_one_row`` and ``vs_bf16`` (this call's time
    over the bf16 kernel's)."""
    bandwidth = bandwidth or read_bandwidth()
    out = []
    bar = tqdm(total=len(tensors) * 3 * len(rows), desc="quantized kernels", disable=not progress)
    for label, (model, name) in tensors.items():
        tensor = gguf_tensor(model, name)
        weight = quant.QuantizedWeight.from_gguf(tensor)
        n, k = weight.shape
        dense = weight.dequantize().bfloat16()
        blocks, int8 = _copies(weight.blocks), quant.int8_supported() and n % quant.INT8_LANES == 0
        backends = {"quant": [quant.QuantizedWeight(b, weight.format) for b in blocks],
                    **({"int8": [quant.QuantizedWeight(b, weight.format, int8=True) for b in blocks]} if int8 else {}),
                    "bf16": _copies(dense)}
        del dense
        bf16_ms = {}
        for backend, weights in backends.items():
            instruction = kernel_instruction(backend != "bf16", backend == "int8", backend == "bf16")
            peak = peak_macs(instruction) or float("nan")
            form_peak = (peak_macs(int8_form()) if backend == "int8" else None) or float("nan")
            nbytes = n * k * 2 if backend == "bf16" else weight.nbytes
            one = None
            for m in rows:
                x = torch.randn(m, k).bfloat16()
                if backend != "bf16":
                    calls = [functools.partial(quant.linear, x, w) for w in weights]
                else:
                    calls = [functools.partial(fewrow_linear, x, w) for w in weights]
                seconds = _median_call_s(calls, repeats)
                one = seconds if m == rows[0] else one
                if backend == "bf16":
                    bf16_ms[m] = seconds
                out.append({"tensor": label, "format": "bf16" if backend == "bf16" else weight.format, "n": n,
                            "k": k, "backend": backend, "rows": m, "ms": seconds * 1e3, "bytes": nbytes,
                            "gb_per_s": nbytes / seconds / 1e9,
                            "bandwidth_fraction": nbytes / seconds / 1e9 / bandwidth, "instruction": instruction,
                            "compute_fraction": n * k * m / peak / seconds,
                            "roof_fraction": max(nbytes / (bandwidth * 1e9), n * k * m / peak) / seconds,
                            "form_fraction": n * k * m / form_peak / seconds,
                            "vs_one_row": seconds / one,
                            "cpu_class": cpu_class(),
                            "threads": torch.get_num_threads(), "read_gb_per_s": bandwidth})
                bar.update()
        bar.update(0 if int8 else len(rows))
        for row in out[-len(backends) * len(rows):]:
            row["vs_bf16"] = row["ms"] / 1e3 / bf16_ms[row["rows"]]
    bar.close()
    return pd.DataFrame(out)


@torch.inference_mode()
def bench_top_k(vocab: int = 262144, rows: tuple[int, ...] = (1, 4, 16, 33), ks: tuple[int, ...] = (1, 8),
                dtype: torch.dtype = torch.bfloat16, repeats: int = 50) -> pd.DataFrame:
    """One row per (k, rows): median ms per call of ``fewrow`` (:func:`specnb.model.kernels.top_k`) and ``torch``
    (``max(-1)`` for k = 1, ``topk`` otherwise) on random logits [rows, vocab], and ``speedup`` (torch / fewrow)."""
    backends = {"fewrow": fewrow_top_k, "torch": lambda x, k: x.max(-1).indices if k == 1 else x.topk(k, -1).indices}
    out = []
    for k in ks:
        for m in rows:
            x = (torch.randn(m, vocab) * 4).to(dtype)
            ms = {}
            for name, fn in backends.items():
                fn(x, k)
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    fn(x, k)
                    times.append(time.perf_counter() - start)
                ms[name] = statistics.median(times) * 1e3
            out.append({"k": k, "rows": m, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."),
                        "fewrow_ms": ms["fewrow"], "torch_ms": ms["torch"], "speedup": ms["torch"] / ms["fewrow"],
                        "cpu_class": cpu_class(), "threads": torch.get_num_threads()})
    return pd.DataFrame(out)
