"""The int8-activation route over GGUF blocks (``csrc/quant_int8.h``, ``weights="gguf-int8"``): the blocks repacked 16
rows to a tile, times the input rows rounded to int8 per block of the format (32 values for Q8_0 / Q5_0, 256 for the
K-quants). It computes exactly that product (to fp32 summation error), its rows are bit-independent at every row
count and thread count, and a model over it is another model close to the exact one (speculation over it equals its
own AR: ``test_gguf_weights.py``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import GGUF_ARCHS, kernel_path_exists, tiny_gguf
from test_quant import random_weight, reference

from specnb.model.forward import forward
from specnb.model.kernels import cpu, quant
from specnb.model.kernels.quant import FORMATS, INT8_LANES, QuantizedWeight

pytestmark = pytest.mark.skipif(not kernel_path_exists() or not quant.int8_supported(),
                                reason="needs AVX2 + F16C, or VNNI on the AVX512 path")

ACTIVATION_BLOCK = {"Q8_0": 32, "Q5_0": 32, "Q4_K": 256, "Q6_K": 256}  # int8 values per activation scale


def int8(weight: QuantizedWeight) -> QuantizedWeight:
    return dataclasses.replace(weight, int8=True)


def rounded(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x [M, K] as the kernel rounds it: per block of the format, d = max|x| / 127 and q = round-to-even(x * (127 /
    max|x|)) in fp32; returns d * q in float64."""
    values = x.float().numpy().reshape(x.shape[0], -1, ACTIVATION_BLOCK[fmt])
    top = np.abs(values).max(axis=2, keepdims=True)
    inverse = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.rint(values * inverse)
    assert np.abs(q).max() <= 127
    scale = (top / np.float32(127)).astype(np.float32).astype(np.float64)
    return torch.from_numpy((q * scale).reshape(x.shape[0], -1))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 33, 200])
def test_int8_route_multiplies_the_rounded_rows_with_the_blocks_weights(fmt, rows):
    k = 512
    weight = random_weight(fmt, 48, k, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=g)
    bias = torch.randn(48, generator=g)
    w = reference(weight).double()
    expected = rounded(x, fmt) @ w.T + bias.double()
    out = quant.linear(x, int8(weight), bias)
    assert out.dtype == torch.float32 and out.shape == (rows, 48)
    # exact int32 dots, scaled and summed in fp32 once per block: a few roundings of the sum of magnitudes (offsets
    # included: every weight is scale * code - offset, |scale * code| <= |w| + |offset| <= |w| + 256 max |scale|)
    scale = (x.double().abs() @ (w.abs() + w.abs().amax(dim=1, keepdim=True)).T) + bias.double().abs()
    bound = 16 * 2.0**-24 * scale
    assert ((out.double() - expected).abs() <= bound).all()
    # and it is not the exact product: the rounding of the activations shows, far beyond that bound
    exact = quant.linear(x, weight, bias).double()
    assert ((out.double() - exact).abs() > bound).any()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [5, 100])  # 100: a prefill's rows, rounded to int8 in parallel chunks
def test_bf16_rows_round_the_fp32_result_once(fmt, rows):
    weight = int8(random_weight(fmt, 32, 512, seed=5))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(6))
    bias = torch.randn(32)
    out = quant.linear(x.bfloat16(), weight, bias)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, quant.linear(x.bfloat16().float(), weight, bias).bfloat16())


@pytest.mark.parametrize("fmt", FORMATS)
def test_int8_rows_are_bit_independent_with_every_thread_count(fmt):
    weight = int8(random_weight(fmt, 4096 + 32, 512, seed=1))
    x = torch.randn(100, 512, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)  # 6 x 16 + 4 a pass
    threads = torch.get_num_threads()
    together = quant.linear(x, weight)
    try:
        for n in sorted({1, 2, threads}):
            torch.set_num_threads(n)
            for m in range(0, x.shape[0], 4):
                assert torch.equal(quant.linear(x[m:m + 1], weight), together[m:m + 1])
            for rows in (slice(0, 2), slice(2, 9), slice(3, 19), slice(0, 33), slice(7, 100)):
                assert torch.equal(quant.linear(x[rows], weight), together[rows])
    finally:
        torch.set_num_threads(threads)


def codes(weight: QuantizedWeight) -> dict[str, np.ndarray]:
    """The integers of ``weight``'s blocks, as ggml stores them: ``values`` [N, K] (the code less the format's offset;
    Q4_K's unsigned codes), per block ``d`` (and Q4_K's ``dmin``) as float32 [N, blocks], per group of the K-quants
    ``sc`` (and Q4_K's mins ``m``) [N, groups]."""
    fmt, n = weight.format, weight.shape[0]
    _, per_block, nbytes = FORMATS[fmt]
    b = weight.blocks.numpy().reshape(-1, nbytes)

    def half(offset: int) -> np.ndarray:
        return b[:, offset:offset + 2].copy().view(np.float16).astype(np.float32).reshape(n, -1)

    if fmt == "Q8_0":
        return {"values": b[:, 2:].view(np.int8).astype(np.int64).reshape(n, -1), "d": half(0)}
    if fmt == "Q5_0":
        high = b[:, 2:6].copy().view(np.uint32)
        low = np.concatenate([b[:, 6:22] & 0x0F, b[:, 6:22] >> 4], axis=1).astype(np.int64)
        values = low | (((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int64) << 4)
        return {"values": (values - 16).reshape(n, -1), "d": half(0)}
    if fmt == "Q4_K":
        s = b[:, 4:16].astype(np.int64)
        sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
        m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
        qs = b[:, 16:144].reshape(-1, 4, 32).astype(np.int64)
        values = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)
        return {"values": values.reshape(n, -1), "d": half(0), "dmin": half(2), "sc": sc.reshape(n, -1),
                "m": m.reshape(n, -1)}
    ql, qh = b[:, :128].reshape(-1, 2, 64).astype(np.int64), b[:, 128:192].reshape(-1, 2, 32).astype(np.int64)
    quarters = [(ql[:, :, :32] & 0x0F) | ((qh & 3) << 4), (ql[:, :, 32:] & 0x0F) | (((qh >> 2) & 3) << 4),
                (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4), (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4)]
    values = np.stack(quarters, axis=2).reshape(-1, 256) - 32
    return {"values": values.reshape(n, -1), "d": half(208),
            "sc": b[:, 192:208].view(np.int8).astype(np.int64).reshape(n, -1)}


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once (through float64, where a * b is exact: a double rounding is ~2^-29 rare)."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def int8_steps(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor) -> torch.Tensor:
    """The int8 route's fp32 steps, emulated: per block an exact integer dot of the rounded row with the codes, then
    acc = fma(float(dot), d * dx, acc) (Q4_K: then acc -= float(mins' dot) * (dmin * dx), fused), bias last."""
    fmt, block = weight.format, ACTIVATION_BLOCK[weight.format]
    c, sub = codes(weight), {"Q8_0": 32, "Q5_0": 32, "Q4_K": 32, "Q6_K": 16}[fmt]
    values = x.float().numpy().reshape(x.shape[0], -1, block)
    top = np.abs(values).max(axis=2)
    q = np.rint(values * np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0)[..., None]
                .astype(np.float32)).astype(np.int64).reshape(x.shape[0], -1)
    dx = (top / np.float32(127)).astype(np.float32)
    groups = lambda a: a.reshape(*a.shape[:-1], -1, sub)  # noqa: E731
    dots = np.einsum("mgs,ngs->mng", groups(q), groups(c["values"]))  # [M, N, groups], exact
    per_block = block // sub
    if "sc" in c:
        dots = dots * c["sc"][None]
    acc = np.zeros((x.shape[0], weight.shape[0]), np.float32)
    for j in range(c["d"].shape[1]):
        blockdot = dots[:, :, j * per_block:(j + 1) * per_block].sum(axis=2).astype(np.float32)
        acc = fma(blockdot, (c["d"][None, :, j] * dx[:, None, j]).astype(np.float32), acc)
        if fmt == "Q4_K":
            mins = np.einsum("mg,ng->mn", groups(q)[:, j * 8:(j + 1) * 8].sum(axis=2), c["m"][:, j * 8:(j + 1) * 8])
            acc = fma(-mins.astype(np.float32), (c["dmin"][None, :, j] * dx[:, None, j]).astype(np.float32), acc)
    return torch.from_numpy(acc + bias.numpy())


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("isa", [i for i, name in enumerate(cpu.ISAS) if name == "avx2" or cpu.kernel_isa() == name])
def test_the_tiles_take_these_fp32_steps_on_every_path(fmt, isa):
    """Bit for bit on each path: the AVX2 tiles (vpmaddubsw; Q8_0 through vpsignb) and the AVX512-VNNI ones sum the
    same integers and take the same fp32 steps, so an AVX2 CPU runs the same int8 linears."""
    weight = int8(random_weight(fmt, 48, 512, seed=7))
    g = torch.Generator().manual_seed(8)
    bias = torch.randn(48, generator=g)
    for rows in (1, 2, 3, 4, 5, 16, 37):
        x = torch.randn(rows, 512, generator=g) * torch.rand(rows, 1, generator=g) * 10
        assert torch.equal(quant.linear(x, weight, bias, isa=isa), int8_steps(x, weight, bias))
        assert torch.equal(quant.linear(x.bfloat16(), weight, bias, isa=isa),
                           int8_steps(x.bfloat16(), weight, bias).bfloat16())


def test_int8_needs_whole_tiles_of_rows():
    with pytest.raises(ValueError, match=f"multiple of {INT8_LANES}"):
        QuantizedWeight(torch.zeros(8, 34, dtype=torch.uint8), "Q8_0", int8=True)
    weight = QuantizedWeight(torch.zeros(16, 68, dtype=torch.uint8), "Q8_0", int8=True)
    assert weight.packed.shape == (1, 16 * 68)  # the file's bytes, 16 rows interleaved
    assert QuantizedWeight(torch.zeros(16, 144, dtype=torch.uint8), "Q4_K", int8=True).packed.shape == (1, 16 * 148)


@pytest.mark.parametrize("arch", GGUF_ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_over_int8_activations_is_close_to_the_exact_one(arch, dtype):
    target, exact = tiny_gguf(arch, dtype, int8=True), tiny_gguf(arch, dtype)
    weights = [w for layer in target.decoder.layers for w, _ in layer.projections.linears()]
    assert all(w.int8 == (w.shape[0] % INT8_LANES == 0) for w in weights)
    assert any(w.int8 for w in weights)
    assert target.decoder.call_path().endswith("-gguf-int8") and exact.decoder.call_path().endswith("-gguf")
    prompt = [256] + list(range(40, 60)) * 3
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        ours, theirs = forward(target, ids)[0].double(), forward(exact, ids)[0].double()
    assert not torch.equal(ours, theirs)  # the int8 route really runs
    # and nearly the same model (the kernel tests above pin what it computes; these random 4-layer models amplify
    # rounding)
    assert (ours - theirs).abs().mean() <= 0.2 * theirs.abs().mean()
