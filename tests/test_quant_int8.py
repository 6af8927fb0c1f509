"""The int8-activation route over GGUF blocks (``csrc/quant_int8.h``, ``weights="gguf-int8"``): it computes the
blocks' weights times the input rows rounded to int8 per chunk of 64 values (not the exact product), its rows are
bit-independent, and a model over it is another model close to the exact one (speculation over it equals its own
AR: ``test_gguf_weights.py``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import GGUF_ARCHS, kernel_path_exists, tiny_gguf
from test_quant import random_weight, reference

from specnb.model.decoder import body, call_path
from specnb.model.forward import forward
from specnb.model.kernels import quant
from specnb.model.kernels.quant import INT8_CHUNK, INT8_FORMATS, QuantizedWeight

pytestmark = pytest.mark.skipif(not kernel_path_exists() or not quant.int8_supported(),
                                reason="needs an AVX512 CPU with VNNI")


def int8(weight: QuantizedWeight) -> QuantizedWeight:
    return dataclasses.replace(weight, int8=True)


def stored_order(fmt: str, k: int) -> np.ndarray:
    """Natural indices in the order the kernel keeps a row's activations: Q4_K's 64-byte loads hold weights
    [0-31, 64-95] then [32-63, 96-127] of each 128; the other formats keep the natural order."""
    if fmt != "Q4_K":
        return np.arange(k)
    half = np.concatenate([np.arange(0, 32), np.arange(64, 96), np.arange(32, 64), np.arange(96, 128)])
    return np.concatenate([base + half for base in range(0, k, 128)])


def rounded(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [M, K] as the kernel rounds it: per chunk of 64 values in stored order, d = max|x| / 127 and
    q = round-to-even(x * (127 / max|x|)) in fp32; returns d * q in float64, natural order."""
    order = stored_order(fmt, x.shape[1])
    stored = x.float().numpy()[:, order].reshape(x.shape[0], -1, INT8_CHUNK)
    top = np.abs(stored).max(axis=2, keepdims=True)
    inverse = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.rint(stored * inverse)
    assert np.abs(q).max() <= 127
    values = (q * (top / np.float32(127)).astype(np.float32).astype(np.float64)).reshape(x.shape[0], -1)
    out = np.empty_like(values)
    out[:, order] = values
    return torch.from_numpy(out)


@pytest.mark.parametrize("fmt", INT8_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_int8_route_multiplies_the_rounded_rows_with_the_blocks_weights(fmt, dtype, rows):
    k = 768
    weight = random_weight(fmt, 40, k, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g).to(dtype)
    bias = torch.randn(40, generator=g)
    w = reference(weight).double()
    expected = rounded(x, fmt) @ w.T + bias.double()
    out = quant.linear(x, int8(weight), bias)
    assert out.dtype == dtype and out.shape == (rows, 40)
    # fp32 sums of the chunks' scaled integer dots: a few roundings of the sum of magnitudes (offsets included:
    # every weight is scale * code - offset, so |scale * code| <= |w| + |offset| <= |w| + 256 max |scale|)
    scale = (x.double().abs() @ (w.abs() + w.abs().amax(dim=1, keepdim=True)).T) + bias.double().abs()
    bound = 64 * 2.0**-24 * scale + (expected.abs() * 2.0**-8 if dtype == torch.bfloat16 else 0)
    assert ((out.double() - expected).abs() <= bound).all()
    # and it is not the exact product: the rounding of the activations shows, far beyond that bound
    exact = quant.linear(x, weight, bias).double()
    assert ((out.double() - exact).abs() > bound).any()


@pytest.mark.parametrize("fmt", INT8_FORMATS)
@pytest.mark.parametrize("k", [512, 1024])
def test_int8_rows_are_bit_independent_with_every_thread_count(fmt, k):
    weight = int8(random_weight(fmt, 4099, k, seed=1))
    x = torch.randn(19, k, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)  # 8 + 8 + 3 rows a pass
    threads = torch.get_num_threads()
    together = quant.linear(x, weight)
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            for m in range(x.shape[0]):
                assert torch.equal(quant.linear(x[m:m + 1], weight), together[m:m + 1])
            for rows in (slice(0, 2), slice(2, 7), slice(3, 15)):
                assert torch.equal(quant.linear(x[rows], weight), together[rows])
    finally:
        torch.set_num_threads(threads)


def test_int8_needs_its_formats_and_whole_chunks():
    with pytest.raises(ValueError, match="multiple of 64"):
        QuantizedWeight(torch.zeros(2, 22, dtype=torch.uint8), "Q5_0", int8=True)  # K = 32
    with pytest.raises(ValueError, match="Q8_0 has no int8"):
        QuantizedWeight(torch.zeros(2, 68, dtype=torch.uint8), "Q8_0", int8=True)


@pytest.mark.parametrize("arch", GGUF_ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_over_int8_activations_is_close_to_the_exact_one(arch, dtype):
    target, exact = tiny_gguf(arch, dtype, int8=True), tiny_gguf(arch, dtype)
    weights = [w for layer in body(target.model).layers for w, _ in layer.weights()]
    assert all(w.int8 == (w.format == "Q5_0") for w in weights)  # Q8_0 keeps the exact path
    assert any(w.int8 for w in weights)
    assert call_path(target.model).endswith("-gguf-int8") and call_path(exact.model).endswith("-gguf")
    prompt = [256] + list(range(40, 60)) * 3
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        ours, theirs = forward(target.model, ids)[0].double(), forward(exact.model, ids)[0].double()
    assert not torch.equal(ours, theirs)  # the int8 route really runs
    # and nearly the same model (the kernel tests above pin what it computes; these random 4-layer models amplify
    # rounding, up to ~9% of a logit on average for Qwen2's)
    assert (ours - theirs).abs().mean() <= 0.2 * theirs.abs().mean()
