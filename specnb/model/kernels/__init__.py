"""Few-row linear layers and exact decoding attention for CPUs (``csrc/``, one PyTorch C++ extension).

A decoding step multiplies one row, a verification call a few dozen, by every weight of the model: both are
bound by reading the weights, so a 16-token call should cost about what one token costs. PyTorch's CPU GEMMs
(MKL / oneDNN) are built for many rows: in bf16 they reach about half the memory bandwidth on one row and a
16-row call costs ~1.6x one row (``specnb kernels bench`` measures it here). The extension streams every
weight once per call on ATen's own thread pool, with an AVX2 path (fp32 FMA, bf16 widened in registers) and
an AVX512-BF16 path (``vdpbf16ps``).

Both kernels make the rows of a call **bit-independent**: a row gives exactly the bits it gives alone, so a
verified draft has the logits of decoding its tokens one at a time and greedy speculative output equals
greedy AR token for token in bf16 as in float32. specnb's decoder (:mod:`specnb.model.decoder`) calls them: linear
layers on calls of up to :data:`MAX_ROWS` rows (longer calls, i.e. prefills, go to PyTorch's GEMM: the prefill
is the same call for every method), attention on calls of every length (a prefill's causal half skipped).
Every function here computes the same thing with PyTorch's ops where the kernels do not run (other devices
and dtypes, or no extension), so the decoder has one path on every device. Nothing of Hugging Face's
modules is patched: its model runs as shipped.

The extension is compiled on first use into ``<cache>/kernels`` (needs a C++ compiler and ``ninja``); where
it cannot be built or the CPU lacks AVX2 + FMA, everything falls back to PyTorch. ``SPECNB_KERNELS=0`` turns
it off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import time
import warnings
from importlib.resources import files
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...paths import artifact_path
from . import memory
from .cpu import ISAS, batch_dtype, kernel_isa

MAX_ROWS = 256  # linear calls above this (prefills) go to PyTorch's GEMM, faster for many rows
MAX_QUERIES = 128  # calls of up to this many tokens run every layer in one C++ call (decoder_layers)
STALE_LOCK_S = 600  # a build lock older than this was left by a killed build (a build takes about a minute)


CSRC = Path(str(files("specnb").joinpath("model/kernels/csrc")))  # one source file per kernel, fewrow.h declares them
SLOWEST = ("quant.cpp", "bindings.cpp")  # the longest compiles, started first (docs/kernels.md, "Building")


@functools.cache
def digest() -> str:
    """Hash of the kernel sources ``csrc/*.cpp`` and ``csrc/*.h`` (timing tables and builds are keyed by it)."""
    sources = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))
    return hashlib.sha256(b"".join(path.name.encode() + path.read_bytes() for path in sources)).hexdigest()[:12]


def build(flags: tuple[str, ...] = ()) -> ModuleType | None:
    """The sources in ``csrc`` compiled (once, into ``<cache>/kernels``) and loaded as one extension; None where
    it cannot be built here (a warning says why)."""
    build_dir = artifact_path("kernels", f"fewrow-{digest()}")
    build_dir.mkdir(parents=True, exist_ok=True)
    lock = build_dir / "lock"  # PyTorch's build lock: a build killed mid-way leaves it, and every later one waits
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
        warnings.warn(f"removing {lock}, left by an interrupted build", stacklevel=3)
        lock.unlink(missing_ok=True)
    name = f"specnb_fewrow_{digest()}"
    built = build_dir / f"{name}.so"
    if built.exists() and not lock.exists():  # built from these very sources, perhaps by another checkout
        return load_built(name, built)
    from torch.utils import cpp_extension  # imported to build only: loading a built library needs none of it

    # the longest compiles first: ninja starts the files in this order, and the one started last sets the end
    rank = {name: i for i, name in enumerate(SLOWEST)}
    ordered = sorted(CSRC.glob("*.cpp"), key=lambda path: (rank.get(path.name, len(rank)), path.name))
    sources = [str(path) for path in ordered]
    try:
        return cpp_extension.load(name=name, sources=sources, build_directory=str(build_dir),
                                  extra_cflags=["-O3", "-mavx2", "-mfma", *flags, "-fopenmp"],
                                  extra_ldflags=["-fopenmp"])
    except Exception as exc:  # no compiler, no ninja, a toolchain without AVX512-BF16 intrinsics, ...
        warnings.warn(f"specnb's CPU kernels could not be built ({exc}); PyTorch is used", stacklevel=3)
        return None


def load_built(name: str, path: Path) -> ModuleType:
    """The extension module ``name`` from its built library ``path``. ``cpp_extension.load`` would first rerun
    ninja, whose build file names the sources' absolute paths: two checkouts of the same sources (one digest, one
    build directory) would rebuild it in turn, minutes each."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def extension() -> ModuleType | None:
    """The compiled few-row extension, built on first use; None where it cannot run here."""
    if os.environ.get("SPECNB_KERNELS", "1") == "0" or kernel_isa() is None:
        return None
    return build(("-mf16c",))


def isa_code() -> int:
    """The kernel path as the extension's ISA_* constant."""
    return ISAS.index(kernel_isa() or "avx2")


def usable(x: Tensor, weight: Tensor) -> bool:
    """Whether :func:`linear` runs the kernel for ``x`` [..., K] and ``weight`` [N, K] (else ``F.linear``)."""
    return (x.shape[-1] > 0 and x.numel() // x.shape[-1] <= MAX_ROWS and x.dtype == weight.dtype
            and x.dtype in (torch.float32, torch.bfloat16)
            and x.device.type == weight.device.type == "cpu" and weight.is_contiguous()
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and extension() is not None)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x [..., K], weight [N, K], bias [N] -> [..., N] in x's dtype, each row
    bit-identical to the same row computed alone. Calls of more rows (prefills) go to PyTorch's GEMM, in
    :func:`specnb.model.kernels.cpu.batch_dtype` (for fp32: bf16 inputs and weights upcast, the output rounded to
    bf16 as a bf16 GEMM rounds it)."""
    if not usable(x, weight):
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.numel() // max(x.shape[-1], 1) > MAX_ROWS \
                and batch_dtype("bfloat16") == "float32":
            return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = extension().linear(flat, weight, bias, isa_code())
    return out.reshape(*x.shape[:-1], weight.shape[0])


def attends(head_dim: int, like: Tensor) -> bool:
    """Whether :func:`attention` runs the kernel for heads of ``head_dim`` on ``like``'s device and dtype (else
    PyTorch's SDPA, whose causal rule aligns the first query with the first key: with cached keys such a call
    needs its mask). Prefills too: the kernel skips their causal half, and beat SDPA at every length measured
    (docs/kernels.md)."""
    return (like.device.type == "cpu" and extension() is not None
            and like.dtype in (torch.float32, torch.bfloat16) and head_dim % 8 == 0)


def attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
              dropout: float = 0.0, scaling: float | None = None, softcap: float | None = None,
              **kwargs) -> tuple[Tensor, None]:
    """Hugging Face attention function: query [B, H, Q, D], key / value [B, Hk, S, D] -> ([B, Q, H, D], None).

    Each query visits exactly the keys it may see, in cache order (fp32 scores, softmax and sums), so its
    output does not depend on the other queries or on masked keys of the call. The mask is None (causal),
    bool [B|1, 1|H, Q, S] (True = visible) or float (0 = visible, dtype-min = blocked).
    """
    if not attends(query.shape[-1], query):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      softcap=softcap, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape).masked_fill_(~attention_mask, float("-inf"))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = extension().attention(query, key, value, attention_mask, float(scale), float(softcap or 0.0), isa_code())
    return out, None


def rms_norm(x: Tensor, scale: Tensor, eps: float, round_first: bool) -> Tensor:
    """RMS norm of each row of x [R, d] (last dim contiguous) with a float32 ``scale`` [d] -> [R, d] in x's
    dtype: ``x * rsqrt(mean(x^2) + eps) * scale`` in fp32, rounded once (``round_first``: rounded to x's dtype
    before the scale, then again, as Llama's norm does). One call, rows bit-independent."""
    if _runs(x):
        return extension().rms_norm(x, scale, eps, round_first)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if round_first:
        h = h.to(x.dtype).float()
    return (h * scale.to(h.device)).to(x.dtype)


def heads(x: Tensor, num_heads: int, scale: Tensor | None, eps: float, round_first: bool,
          cos: Tensor | None, sin: Tensor | None) -> Tensor:
    """x [B, S, H * D] (last dim contiguous) -> [B, H, S, D]: each head vector RMS-normed as :func:`rms_norm`
    (where ``scale`` [D] is given), then rotated (``x * cos + rotate_half(x) * sin`` with cos / sin
    [B|1, S, D] in x's dtype, rounded as PyTorch rounds each op). One call instead of ~20 small ops."""
    if _runs(x):
        return extension().heads(x, num_heads, scale, eps, round_first, cos, sin)
    B, S, _ = x.shape
    x = x.reshape(B, S, num_heads, -1)
    if scale is not None:
        x = rms_norm(x, scale, eps, round_first)
    x = x.transpose(1, 2)
    if cos is None:
        return x
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def _runs(x: Tensor) -> bool:
    """Whether the element-wise kernels (norm, heads) run ``x``."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and extension() is not None


def top_k(x: Tensor, k: int) -> Tensor:
    """int64 [R, k]: the indices of the k largest entries of each row of x [R, V], largest first, ties to the
    lower index (k = 1: argmax, the first maximum). One pass of the kernel over CPU float32 / bfloat16 rows
    (~10x PyTorch's max / topk on 262k bf16 logits); PyTorch elsewhere, and for rows that hold a NaN."""
    kernel = extension() if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) else None
    if kernel is None or x.dim() != 2 or not 1 <= k <= x.shape[1]:
        return _torch_top_k(x, k)
    indices, nan = kernel.top_k(x.contiguous(), k)
    if nan.any():
        rows = nan.nonzero().squeeze(1)
        indices[rows] = _torch_top_k(x[rows], k)
    return indices


def _torch_top_k(x: Tensor, k: int) -> Tensor:
    return x.max(-1, keepdim=True).indices if k == 1 else x.topk(k, dim=-1).indices


def decoder_layers(x: Tensor, specs: list, cos: list[Tensor], sin: list[Tensor], masks: list[Tensor | None],
                   keys: list[Tensor], values: list[Tensor], start: int) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """A stack of decoder layers in one call (:class:`specnb.model.decoder.Layer`'s steps, same kernels, same
    bits): x [B, S, d] -> ([B, S, d] before the final norm, [], []). Per layer: its ``LayerSpec``, cos / sin
    [B|1, S, D], a float mask [B|1, 1, S, start + S] or None (causal), and key / value buffers
    [B, Hk, capacity >= start + S, D] holding ``start`` cached positions; the call's keys and values are
    written at start..start + S - 1. With one-row buffers and B > 1 (a broadcast call, :mod:`specnb.model.kv_cache`)
    each row reads the cached row and nothing is written: the lists hold the call's keys and values
    [B, Hk, S, D] per layer."""
    return extension().decoder_layers(x, specs, cos, sin, masks, keys, values, start, isa_code())


def routed(model: nn.Module) -> str:
    """``"fewrow-<source hash>-<isa>-gemm<dtype>"`` if the kernels run ``model``'s calls (its weights on the
    CPU in fp32 / bf16, the extension built), else ``""`` (timing tables and greedy references are cached
    under names that include it; ``<dtype>``: what a bf16 prefill's GEMMs compute in,
    :func:`specnb.model.kernels.cpu.batch_dtype`)."""
    param = next(model.parameters(), None)
    return "" if param is None else route(param.device, param.dtype)


def route(device: torch.device, dtype: torch.dtype) -> str:
    """:func:`routed`'s name for weights of ``dtype`` on ``device``."""
    if dtype not in (torch.float32, torch.bfloat16) or device.type != "cpu" or extension() is None:
        return ""
    gemm = "fp32" if batch_dtype("bfloat16") == "float32" else "bf16"
    return f"fewrow-{digest()}-{kernel_isa()}-gemm{gemm}"


def rehome(model: nn.Module) -> bool:
    """Move the large weights of a model the kernels run into 2 MB pages (:mod:`specnb.model.kernels.memory`: they
    stream faster); returns whether the kernels run it (:func:`routed`). Parameters, values and the state dict
    are unchanged: Hugging Face's own modules still run the model as shipped."""
    if not routed(model):
        return False
    memory.rehome(model)
    return True
