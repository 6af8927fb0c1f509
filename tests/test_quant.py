"""The linear layer over GGUF blocks: decoding equal to the gguf package's, products within fp32 summation error of
an fp32 matmul over those weights, rows bit-independent."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from conftest import kernel_path_exists

from specnb.model.gguf_file import open_gguf
from specnb.model.kernels import cpu, quant
from specnb.model.kernels.quant import FORMATS, QuantizedWeight
from specnb.model.model_names import gguf_file

pytestmark = pytest.mark.skipif(not kernel_path_exists(), reason="needs an x86 CPU with AVX2 + FMA")

# every path the CPU can run: AVX2 everywhere, AVX512-BF16 where present
ISAS = [i for i, name in enumerate(cpu.ISAS) if name == "avx2" or "avx512_bf16" in cpu.cpu_flags()]
# byte offsets of each block's fp16 scales, by format (random bytes there could be NaN or huge)
SCALES = {"Q8_0": (0,), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}


def random_weight(fmt: str, n: int, k: int, seed: int = 0) -> QuantizedWeight:
    """Random blocks of ``fmt`` for an [n, k] weight, every code in range and scales in [1e-3, 0.1)."""
    _, weights, nbytes = FORMATS[fmt]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n * k // weights, nbytes), dtype=np.uint8)
    for offset in SCALES[fmt]:
        blocks[:, offset:offset + 2] = rng.uniform(1e-3, 0.1, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return QuantizedWeight(torch.from_numpy(blocks.reshape(n, -1)), fmt)


def reference(weight: QuantizedWeight) -> torch.Tensor:
    """The gguf package's dequantization: float32 [N, K]."""
    qtype = gguf.GGMLQuantizationType[weight.format]
    return torch.from_numpy(gguf.quants.dequantize(weight.blocks.numpy(), qtype).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_decode_to_the_gguf_packages_values(fmt):
    weight = random_weight(fmt, 24, 512)
    assert weight.shape == (24, 512)
    assert torch.equal(weight.dequantize(), reference(weight))


def magnitudes(weight: QuantizedWeight) -> torch.Tensor:
    """|d q| + |min| per weight: what the summation error scales with (Q4_K's d q - min cancels)."""
    if weight.format != "Q4_K":
        return reference(weight).abs()
    flipped = weight.blocks.clone().view(-1, 144)
    flipped[:, 3] ^= 0x80  # the sign bit of dmin: d q + min (d, min > 0 in random_weight)
    return reference(QuantizedWeight(flipped.view(weight.blocks.shape), "Q4_K")).abs()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 7])
@pytest.mark.parametrize("isa", ISAS)
def test_linear_matches_an_fp32_matmul_of_the_dequantized_weight(fmt, dtype, rows, isa):
    weight = random_weight(fmt, 40, 768, seed=rows)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 768, generator=g).to(dtype)
    bias = torch.randn(40, generator=g)
    exact = x.double() @ reference(weight).double().T + bias.double()
    # fp32 sums of 768 products in another order: within K * 2^-24 of the sum of magnitudes (a loose bound)
    bound = 768 * 2.0**-24 * (x.double().abs() @ magnitudes(weight).double().T + bias.double().abs())
    out = quant.linear(x, weight, bias, isa=isa)
    assert out.dtype == dtype and out.shape == (rows, 40)
    if dtype == torch.float32:
        assert ((out.double() - exact).abs() <= bound).all()
    else:  # one rounding to bf16 on top: within half a bf16 ulp of the fp32 result, plus its error
        assert ((out.double() - exact).abs() <= bound + exact.abs() * 2.0**-8).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", [512, 1024])
def test_rows_are_bit_independent_with_every_thread_count(fmt, dtype, isa, k):
    weight = random_weight(fmt, 4099, k, seed=1)  # enough rows of weight for every thread to take a run
    # 19 rows: past every path's fused-row limit (AVX2: 3, then a buffer; AVX512: chunks of 16 rows at K = 512,
    # 16 + 3, and of 8 at K = 1024, 8 + 8 + 3)
    x = torch.randn(19, k, generator=torch.Generator().manual_seed(2)).to(dtype)
    threads = torch.get_num_threads()
    together = quant.linear(x, weight, isa=isa)
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            for m in range(x.shape[0]):
                assert torch.equal(quant.linear(x[m:m + 1], weight, isa=isa), together[m:m + 1])
            for rows in (slice(0, 2), slice(2, 7), slice(3, 15)):  # 4, 2 and 1 weight rows a pass
                assert torch.equal(quant.linear(x[rows], weight, isa=isa), together[rows])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", [512, 8192])
def test_many_rows_keep_each_rows_bits(fmt, isa, k):
    """41 rows take the AVX512 path's buffered tiles (6 input x 4 weight rows, input rows in blocks of ~1 MB: one
    block at K = 512, 30 + 11 rows at K = 8192); each row's bits are those it gets alone."""
    weight = random_weight(fmt, 70, k, seed=3)
    x = torch.randn(41, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    together = quant.linear(x, weight, isa=isa)
    alone = torch.cat([quant.linear(x[m:m + 1], weight, isa=isa) for m in range(x.shape[0])])
    assert torch.equal(together, alone)
    reference = x.float() @ weight.dequantize().T
    assert (together.float() - reference).abs().max() <= 2**-7 * reference.abs().max()


def test_bad_weights_and_inputs_are_refused():
    with pytest.raises(ValueError, match="unsupported weight format"):
        QuantizedWeight(torch.zeros(2, 34, dtype=torch.uint8), "Q2_K")
    with pytest.raises(ValueError, match="multiple of 34"):
        QuantizedWeight(torch.zeros(2, 35, dtype=torch.uint8), "Q8_0")
    with pytest.raises(ValueError, match="takes 64"):
        quant.linear(torch.zeros(1, 32), QuantizedWeight(torch.zeros(2, 68, dtype=torch.uint8), "Q8_0"))


@pytest.mark.slow
@pytest.mark.skipif(not gguf_file("gemma-3-270m").exists(), reason="run `specnb models fetch gemma-3-270m`")
def test_the_shipped_gemma_tensors_decode_as_the_gguf_package_decodes_them():
    """One tensor of each format in Gemma-3-270M's GGUF (all four occur in it)."""
    seen = {}
    for tensor in open_gguf(gguf_file("gemma-3-270m")).tensors:
        if tensor.tensor_type.name in FORMATS and tensor.tensor_type.name not in seen:
            seen[tensor.tensor_type.name] = tensor
    assert set(seen) == set(FORMATS)
    for fmt, tensor in seen.items():
        weight = QuantizedWeight.from_gguf(tensor)
        rows = weight.blocks[:512] if weight.shape[0] > 512 else weight.blocks
        part = QuantizedWeight(rows.contiguous(), fmt)
        assert part.shape[1] == int(tensor.shape[0])
        assert torch.equal(part.dequantize(), reference(part)), fmt
        x = torch.randn(3, part.shape[1]).bfloat16()
        assert torch.equal(quant.linear(x, part)[1:2], quant.linear(x[1:2], part))


@pytest.mark.parametrize("argv, message", [
    (["--tensors", "gemma-head,nope"], "unknown tensor 'nope'"),
    (["--rows", "1,x"], "--rows must be comma-separated integers"),
    (["--rows", "0"], "--rows must be in [1, 8192]"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_the_benchmark_refuses_bad_arguments_in_one_line(argv, message, capsys):
    from specnb.cli import main

    assert main(["kernels", "quant", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specnb: error: ") and message in err and "\n" not in err


@pytest.mark.slow
@pytest.mark.skipif(not gguf_file("gemma-3-270m").exists(), reason="run `specnb models fetch gemma-3-270m`")
def test_the_benchmark_states_the_int8_route_against_its_instruction_form():
    """``form_fraction``: the int8 route's multiply-adds over its instruction's rate in the broadcast form its tiles
    issue (``int8-vnni-broadcast``; on the AVX2 path ``int8-avx2``, its own form), the same time as
    ``compute_fraction`` over another peak; NaN for the paths that issue other instructions."""
    from specnb.model import ceilings
    from specnb.model.kernels.bench import bench_quant
    from specnb.model.kernels.cpu import kernel_isa
    from specnb.model.kernels.quant import int8_supported

    table = bench_quant({"o": ("gemma-3-270m", "blk.0.attn_output.weight")}, rows=(2,), repeats=1, bandwidth=40.0,
                        progress=False).set_index("backend")
    assert table.loc[["quant", "bf16"], "form_fraction"].isna().all()
    if int8_supported():
        avx512 = kernel_isa() == "avx512bf16"
        form = ceilings.peak_macs("int8-vnni-broadcast" if avx512 else "int8-avx2")
        register = ceilings.peak_macs("int8-vnni" if avx512 else "int8-avx2")
        assert 0 < table.loc["int8", "form_fraction"] == pytest.approx(
            table.loc["int8", "compute_fraction"] * register / form)
