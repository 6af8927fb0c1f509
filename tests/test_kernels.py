"""specnb.model.kernels: the few-row linear layer and the decoding attention, on every CPU path this machine has.

What they promise: the same numbers as PyTorch up to rounding, and rows that are bit-independent (a row
gives exactly the bits it gives alone), which is what makes bf16 speculative decoding exact.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import kernel_path_exists
from hypothesis import given, settings
from hypothesis import strategies as st

from specnb.model import kernels
from specnb.model.forward import forward
from specnb.model.kernels import cpu, memory
from specnb.model.models import tiny_model

# Skipped only where no kernel path can exist (no AVX2 + FMA, or SPECNB_KERNELS=0); where one exists, a build that
# fails makes these tests fail, starting with test_the_extension_builds.
pytestmark = pytest.mark.skipif(not kernel_path_exists(), reason="no AVX2/FMA CPU (or SPECNB_KERNELS=0)")

# every path the CPU can run: AVX2 everywhere, AVX512-BF16 where present
ISAS = [i for i, name in enumerate(cpu.ISAS) if name == "avx2" or "avx512_bf16" in cpu.cpu_flags()]
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _linear(x, w, b, isa):
    return kernels.extension().linear(x, w, b, isa)


def test_the_extension_builds():
    """This CPU has a kernel path, so the C++ extension must build and load: a compiler or source error is a
    failure here (it was a warning, and every kernel test skipped)."""
    if kernels.extension() is None:
        kernels.extension.cache_clear()  # build again to show why
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            built = kernels.extension()
        assert built is not None, "; ".join(str(w.message) for w in caught) or "the extension did not build"
    assert kernels.isa_code() == cpu.ISAS.index(cpu.kernel_isa())


@pytest.fixture
def all_threads():
    """ATen's pool at every core this process may use (the tests run single-threaded otherwise)."""
    before = torch.get_num_threads()
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    yield threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_are_bit_independent_whatever_the_thread_split(isa, dtype, all_threads):
    """On the real thread count (and on 3 threads, which split the weight's 4099 rows unevenly: the last chunk
    short, one thread with a chunk more), every output is the bits it is on one thread, and each row the bits it
    is alone: the split of the weight among threads never changes a sum. The weight (4099 x 203) is large enough
    to be split (the kernel keeps one thread below 128 KB of weight)."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(67, 203, generator=g).to(dtype), torch.randn(4099, 203, generator=g).to(dtype)
    b = torch.randn(4099, generator=g).to(dtype)
    assert w.numel() * w.element_size() >= 2 * (128 << 10)
    torch.set_num_threads(1)
    one_thread = _linear(x, w, b, isa)
    for threads in sorted({all_threads, 3}):
        torch.set_num_threads(threads)
        assert torch.get_num_threads() == threads
        assert torch.equal(_linear(x, w, b, isa), one_thread), threads
        for rows in (1, 3, 5, 16, 33):
            assert torch.equal(_linear(x[:rows], w, b, isa), one_thread[:rows]), (threads, rows)
        alone = torch.cat([_linear(x[i:i + 1], w, b, isa) for i in range(0, 67, 6)])
        assert torch.equal(alone, one_thread[0:67:6]), threads


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 70), n=st.integers(1, 37), k=st.integers(1, 90), bias=st.booleans(),
       isa=st.sampled_from(ISAS), dtype=st.sampled_from(DTYPES))
def test_linear_matches_torch(rows, n, k, bias, isa, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + n * 10 + k)
    x, w = torch.randn(rows, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    out = _linear(x, w, b, isa)
    assert out.dtype == dtype and out.shape == (rows, n)
    reference = F.linear(x.double(), w.double(), None if b is None else b.double())
    scale = TOL[dtype] * (1 + reference.abs())
    assert ((out.double() - reference).abs() <= scale * max(1, k) ** 0.5).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_rows_are_bit_independent(isa, dtype):
    g = torch.Generator().manual_seed(1)
    # Many outputs: a bf16 output hides most last-bit differences of the fp32 sums (~1 in 20,000 survives the
    # rounding), so a reduction that differed between blocks of 1 and 4 weight rows needs ~10^5 outputs to show.
    x, w = torch.randn(67, 203, generator=g).to(dtype), torch.randn(4099, 203, generator=g).to(dtype)
    b = torch.randn(4099, generator=g).to(dtype)
    together = _linear(x, w, b, isa)
    for rows in (1, 2, 3, 5, 16, 33, 67):
        assert torch.equal(_linear(x[:rows], w, b, isa), together[:rows])
    alone = torch.cat([_linear(x[i:i + 1], w, b, isa) for i in range(x.shape[0])])
    assert torch.equal(alone, together)
    shuffled = torch.randperm(67, generator=g)
    assert torch.equal(_linear(x[shuffled], w, b, isa), together[shuffled])


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_outputs_round_as_torch_rounds(isa):
    # out[r, j] = w[j, r] + bias[j] exactly in fp32 (x one-hot), so the bf16 outputs must carry torch's rounding
    # of those sums bit for bit (ties to even), and NaNs stay NaN with one bit pattern. 1 and 16 rows take the
    # one-at-a-time and the four-at-once stores.
    g = torch.Generator().manual_seed(3)
    n, k = 64, 32
    w = torch.zeros(n, k, dtype=torch.bfloat16)
    low = torch.tensor([0x8000, 0x7FFF, 0x8001, 0x0000, 0xFFFF, 0x18000], dtype=torch.int32)
    bits = (torch.randn(n, generator=g).view(torch.int32) & ~0xFFFF) | low[torch.arange(n) % len(low)] % 0x10000
    bias = bits.view(torch.float32).clone()
    bias[5], bias[6], bias[7] = float("nan"), -float("nan"), float("inf")
    nan = bias.isnan()
    expected = bias.to(torch.bfloat16).view(torch.int16)[~nan]
    outs = [_linear(torch.eye(rows, k, dtype=torch.bfloat16), w, bias, isa) for rows in (1, 16)]
    for out in outs:
        assert torch.equal(out[:, ~nan].view(torch.int16), expected.expand(len(out), -1))
        assert out[:, nan].isnan().all()
    assert torch.equal(outs[0].view(torch.int16), outs[1][:1].view(torch.int16))


def test_paths_differ_only_by_rounding():
    if len(ISAS) < 2:
        pytest.skip("this CPU has one kernel path")
    x, w = torch.randn(9, 640).bfloat16(), torch.randn(130, 640).bfloat16()
    torch.testing.assert_close(_linear(x, w, None, 0), _linear(x, w, None, 1), rtol=2e-2, atol=2e-2)


def test_linear_falls_back_to_torch_where_the_kernel_does_not_apply():
    w = torch.randn(8, 16)
    assert kernels.usable(torch.randn(2, 16), w)
    assert not kernels.usable(torch.randn(kernels.MAX_ROWS + 1, 16), w)  # a prefill: torch's GEMM
    assert not kernels.usable(torch.randn(2, 16, dtype=torch.float16), w.half())
    assert not kernels.usable(torch.randn(2, 16), w.t().contiguous().t())  # a non-contiguous weight
    assert not kernels.usable(torch.randn(2, 0), torch.randn(8, 0))  # nothing to reduce over
    x = torch.randn(2, 16, requires_grad=True)
    assert not kernels.usable(x, w)
    kernels.linear(x, w).sum().backward()  # F.linear, so gradients still flow
    assert x.grad is not None



@pytest.mark.parametrize("faster", ["float32", "bfloat16"])
def test_the_batch_dtype_is_the_faster_gemm_measured_once_per_machine(faster, monkeypatch, tmp_path):
    """The faster of the two timed GEMMs is chosen and written down; a later process reads it, not the clock."""
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    timed = []
    slow = {"float32": 2.0, "bfloat16": 2.0, faster: 1.0}
    monkeypatch.setattr(cpu, "time_batch_gemms", lambda: timed.append(1) or dict(slow))
    cpu.batch_gemm_dtype.cache_clear()
    try:
        assert cpu.batch_gemm_dtype() == faster and cpu.batch_dtype("bfloat16") == faster
        assert cpu.batch_dtype("float32") == "float32" and cpu.batch_dtype("bfloat16", "cuda") == "bfloat16"
        cpu.batch_gemm_dtype.cache_clear()
        assert cpu.batch_gemm_dtype() == faster and timed == [1]
    finally:
        cpu.batch_gemm_dtype.cache_clear()


def test_timing_the_batch_gemms_gives_both_dtypes_a_time():
    seconds = cpu.time_batch_gemms()
    assert set(seconds) == {"float32", "bfloat16"} and all(0 < s < 10 for s in seconds.values())

@pytest.mark.parametrize("measured", ["float32", "bfloat16"])
def test_bf16_prefill_linears_compute_in_the_measured_batch_dtype(measured, monkeypatch):
    """Above MAX_ROWS a bf16 call is the GEMM this machine measured faster: fp32 (rounded to bf16) or bf16."""
    monkeypatch.setattr(cpu, "batch_gemm_dtype", lambda: measured)
    gemms, real = [], F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: gemms.append(x.dtype) or real(x, w, b))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(kernels.MAX_ROWS + 1, 96, generator=g).bfloat16()
    w, b = torch.randn(48, 96, generator=g).bfloat16(), torch.randn(48, generator=g).bfloat16()
    out = kernels.linear(x, w, b)
    bf16 = measured == "bfloat16"
    assert gemms == [torch.bfloat16 if bf16 else torch.float32] and out.dtype == torch.bfloat16
    assert torch.equal(out, real(x, w, b) if bf16 else real(x.float(), w.float(), b.float()).bfloat16())
    kernels.linear(x[:2], w, b)  # few rows: the kernel, no GEMM
    assert len(gemms) == 1


def _attention_inputs(dtype, q=5, s=40, heads=4, kv_heads=2, d=32, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    qs = torch.randn(batch, heads, q, d, generator=g).to(dtype)
    ks = torch.randn(batch, kv_heads, s, d, generator=g).to(dtype)
    vs = torch.randn(batch, kv_heads, s, d, generator=g).to(dtype)
    return qs, ks, vs


def _sdpa(q, k, v, mask=None, causal=False):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    out = F.scaled_dot_product_attention(q.double(), k, v, attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2)

@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 6), vocab=st.integers(1, 1100), k=st.integers(1, 8), levels=st.sampled_from([3, 50, None]),
       dtype=st.sampled_from(DTYPES))
def test_top_k_is_a_stable_sort_prefix(rows, vocab, k, levels, dtype):
    """The k largest of each row, largest first, equal values by index (k = 1: torch's argmax): checked against
    a stable sort, on rows full of ties (``levels`` distinct values) and -inf, any length (vector tails)."""
    k = min(k, vocab)
    g = torch.Generator().manual_seed(rows * 7919 + vocab * 13 + k)
    x = torch.randn(rows, vocab, generator=g)
    if levels:
        x = torch.randint(0, levels, (rows, vocab), generator=g).float()
    x[torch.rand(rows, vocab, generator=g) < 0.1] = float("-inf")
    x = x.to(dtype)
    expected = torch.sort(-x.float(), dim=-1, stable=True).indices[:, :k]
    assert torch.equal(kernels.top_k(x, k), expected)
    assert torch.equal(kernels.top_k(x, 1)[:, 0], x.max(-1).indices)


def test_top_k_leaves_rows_with_nan_to_torch():
    x = torch.randn(3, 300)
    x[1, 7] = float("nan")
    x[2, 290] = float("nan")
    assert torch.equal(kernels.top_k(x, 1)[:, 0], x.max(-1).indices)
    assert torch.equal(kernels.top_k(x, 4)[1:], x[1:].topk(4, dim=-1).indices)



@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_matches_sdpa(dtype, isa):
    q, k, v = _attention_inputs(dtype)
    ext = kernels.extension()
    causal = torch.ones(5, 40, dtype=torch.bool).tril(35)  # queries are the last 5 positions
    tol = dict(rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)
    torch.testing.assert_close(ext.attention(q, k, v, None, 32 ** -0.5, 0.0, isa).double(), _sdpa(q, k, v, causal),
                               **tol)
    tree = torch.rand(5, 40, generator=torch.Generator().manual_seed(3)) < 0.6
    tree[:, 0] = True
    additive = torch.zeros(1, 1, 5, 40).masked_fill_(~tree, torch.finfo(torch.float32).min)
    torch.testing.assert_close(ext.attention(q, k, v, additive, 32 ** -0.5, 0.0, isa).double(), _sdpa(q, k, v, tree),
                               **tol)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [0, 20])
def test_attention_query_gives_the_bits_it_gives_alone(dtype, isa, hidden):
    """A query among others, with extra keys it may not see, equals the same query alone on its own keys; also
    when no query sees the first ``hidden`` keys (a sliding window's call, which reads only the keys after them)."""
    q, k, v = _attention_inputs(dtype, q=6, s=50)
    ext = kernels.extension()
    g = torch.Generator().manual_seed(5)
    visible = torch.rand(6, 50, generator=g) < 0.5
    visible[:, :hidden] = False
    visible[:, hidden] = True
    mask = torch.zeros(1, 1, 6, 50).masked_fill_(~visible, float("-inf"))
    together = ext.attention(q, k, v, mask, 0.17, 0.0, isa)
    for i in range(6):
        keys = visible[i].nonzero().squeeze(1)
        alone = ext.attention(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys], None, 0.17, 0.0, isa)
        assert torch.equal(alone[:, 0], together[:, i])
        softcapped = ext.attention(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys], None, 0.17, 30.0, isa)
        assert torch.equal(softcapped[:, 0], ext.attention(q, k, v, mask, 0.17, 30.0, isa)[:, i])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_splits_give_the_same_bits(dtype, isa):
    """Over a long cache, a call of many rows splits them between the threads, and one query alone splits each
    step instead (no thread reading every key and value): the query gets the same bits either way."""
    q, k, v = _attention_inputs(dtype, q=20, s=600, heads=1, kv_heads=1, d=64)
    ext = kernels.extension()
    together = ext.attention(q, k, v, None, 0.125, 0.0, isa)
    for i in (0, 7, 19):
        keys = 600 - 20 + i + 1  # the causal rule: query i sees the keys up to its own position
        alone = ext.attention(q[:, :, i:i + 1], k[:, :, :keys], v[:, :, :keys], None, 0.125, 0.0, isa)
        assert torch.equal(alone[:, 0], together[:, i])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 30])
def test_a_prefill_query_gives_the_bits_it_gives_alone(dtype, isa, window):
    """A prefill's query rows are scored in chunks, each against the keys up to the last any of its rows sees:
    a query of a call of many (more rows than a chunk, causal or through a sliding window's mask) gives the bits
    it gives alone on its visible keys, and the call matches SDPA."""
    q, k, v = _attention_inputs(dtype, q=90, s=90, heads=4, kv_heads=2)  # 180 rows per KV head
    ext = kernels.extension()
    i = torch.arange(90)
    visible = i[None, :] <= i[:, None]
    if window:
        visible &= i[:, None] - i[None, :] < window
    mask = torch.zeros(1, 1, 90, 90).masked_fill_(~visible, float("-inf")) if window else None
    together = ext.attention(q, k, v, mask, 32 ** -0.5, 0.0, isa)
    torch.testing.assert_close(together.double(), _sdpa(q, k, v, visible), rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)
    for row in (0, 31, 32, 63, 64, 89):
        keys = visible[row].nonzero().squeeze(1)
        alone = ext.attention(q[:, :, row:row + 1], k[:, :, keys], v[:, :, keys], None, 32 ** -0.5, 0.0, isa)
        assert torch.equal(alone[:, 0], together[:, row])


def test_attention_accepts_expanded_batches_and_bool_masks():
    q, k, v = _attention_inputs(torch.float32, q=3, s=20, batch=1)
    rows = 4
    qb = torch.randn(rows, 4, 3, 32)
    kb, vb = k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)  # batch verification's shared cache
    bool_mask = torch.ones(rows, 1, 3, 20, dtype=torch.bool).tril(17)
    out, _ = kernels.attention(None, qb, kb, vb, bool_mask, scaling=32 ** -0.5)
    torch.testing.assert_close(out.double(), _sdpa(qb, kb.contiguous(), vb.contiguous(), bool_mask[:, 0:1]),
                               rtol=1e-5, atol=1e-5)


def test_loading_leaves_hugging_faces_model_as_shipped():
    """The kernels run the model through specnb's decoder; Hugging Face's own modules are not patched (no
    instance ``forward``, its stock attention), and its calls compute what a fresh copy computes, also once
    the decoder has stacked the siblings' weights."""
    loaded = tiny_model("qwen2")  # q/k/v projections with biases
    fresh = tiny_model("qwen2")
    assert kernels.routed(loaded.model).startswith("fewrow-")
    ids = torch.randint(0, 256, (1, 9))
    with torch.inference_mode():
        ours = forward(loaded, ids)[0]
        assert loaded.backend == "dense"
        assert all("forward" not in vars(m) for m in loaded.model.modules())
        assert loaded.model.config._attn_implementation == "sdpa"
        assert torch.equal(loaded.model(ids).logits, fresh.model(ids).logits)
        torch.testing.assert_close(ours, fresh.model(ids).logits, rtol=1e-4, atol=1e-4)
    assert not kernels.rehome(tiny_model("llama").model.half())  # other dtypes: PyTorch's ops


@pytest.mark.parametrize("flags,isa,klass", [
    ({"avx2", "fma"}, "avx2", "avx2"),
    ({"avx2", "fma", "avx512f", "avx512_bf16"}, "avx512bf16", "avx512bf16"),
    ({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "avx512bf16", "amx"),
    ({"sse4_2"}, None, "other"),
    (set(), None, "other"),
])
def test_each_cpu_class_takes_its_path(flags, isa, klass, monkeypatch):
    monkeypatch.delenv("SPECNB_CPU_ISA", raising=False)
    assert cpu.kernel_isa(frozenset(flags)) == isa
    assert cpu.cpu_class(frozenset(flags)) == klass
    monkeypatch.setenv("SPECNB_CPU_ISA", "avx2")
    assert cpu.kernel_isa(frozenset(flags)) == (isa and "avx2")
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))
    assert cpu.cpu_class() == ("avx2" if isa else "other")  # the forced path is the class numbers report
    monkeypatch.setenv("SPECNB_CPU_ISA", "sse")
    if isa:
        with pytest.raises(ValueError, match="SPECNB_CPU_ISA"):
            cpu.kernel_isa(frozenset(flags))


def test_two_cpus_of_one_name_are_told_apart():
    """A Zen 4 and a Zen 5 VM both report "AMD EPYC": the caches keyed by the CPU (the weights' cost table, the
    batch GEMM's choice, the roofline tables) must key them apart, from the first processor's fields only."""
    def info(family: int, model: int) -> str:
        block = (f"processor\t: {{}}\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\n"
                 "flags\t\t: avx2 fma\n")
        return block.format(0) + "\n" + block.format(1).replace(f": {model}\n", ": 99\n")

    zen4, zen5 = (cpu.cpuinfo_fields(info(*fm)) for fm in ((25, 17), (26, 2)))
    assert cpu.cpu_id(zen4) == "AMD EPYC family 25 model 17" and cpu.cpu_id(zen5) == "AMD EPYC family 26 model 2"
    assert zen4["flags"] == "avx2 fma" and zen4["processor"] == "0"
    assert cpu.cpu_id({"model name": "Neoverse"}) == "Neoverse"  # no family: the name alone
    from specnb.core.roofline import device_name

    assert cpu.cpu_id() in device_name("cpu") and cpu.cpu_model() in cpu.cpu_id()


def test_auto_dtype_is_bf16_where_the_kernels_run(monkeypatch):
    from specnb.model import models

    monkeypatch.setattr(models, "kernel_isa", lambda: None)  # no AVX2: PyTorch would emulate bf16
    assert models.resolve_dtype("auto") == torch.float32
    assert models.resolve_dtype("auto", "cuda") == torch.bfloat16
    for isa in cpu.ISAS:
        monkeypatch.setattr(models, "kernel_isa", lambda isa=isa: isa)
        assert models.resolve_dtype("auto") == torch.bfloat16


def test_a_fused_model_can_be_cast_and_copied():
    import copy

    loaded = tiny_model("qwen2")
    ids = torch.randint(0, 256, (1, 7))
    with torch.inference_mode():
        fp32 = loaded.model(ids).logits
        clone = copy.deepcopy(loaded.model).to(torch.bfloat16)  # what notebook 05 used to do
        scale = float(fp32.abs().max())
        torch.testing.assert_close(clone(ids).logits.float(), fp32, rtol=0.05, atol=0.05 * scale)
        assert torch.equal(loaded.model(ids).logits, fp32)  # the original is untouched


def _huge_pages_of(address: int) -> int:
    """AnonHugePages (kB) of the mapping that holds ``address`` in this process."""
    mapped, pages = False, 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                mapped = lo <= address < hi
            elif mapped and head == "AnonHugePages:":
                pages = int(line.split()[1])
    return pages


@pytest.mark.skipif(not memory.available(), reason="no transparent huge pages on this OS")
def test_small_weights_share_huge_pages_in_the_order_they_are_placed():
    """Weights between 64 KB and 2 MB (most of Gemma-3-270M's projections) go one after another into the arena's
    2 MB pages, each at a 4 KB boundary, values kept; smaller ones stay; inference tensors get their own chunk."""
    arena = memory.Arena()
    a, b = arena.empty((300, 1000), torch.uint8), arena.empty((64, 1024), torch.bfloat16)
    assert b.data_ptr() - a.data_ptr() == 74 * 4096 and a.data_ptr() % memory.HUGE_PAGE == 0  # 300,000 bytes
    with torch.inference_mode():
        c = arena.empty((10,), torch.float32)
    assert c.is_inference() and not a.is_inference() and c.data_ptr() % memory.HUGE_PAGE == 0
    with pytest.raises(ValueError, match="arena chunk"):
        arena.empty((memory.Arena.CHUNK + 1,), torch.uint8)
    import threading

    placed = []  # a model loading on another thread waits for the arena's lock: no two get the same bytes
    with arena.lock:
        loader = threading.Thread(target=lambda: placed.append(arena.empty((4096,), torch.uint8)))
        loader.start()
        loader.join(0.2)
        assert loader.is_alive() and not placed
    loader.join()
    assert placed[0].data_ptr() == b.data_ptr() + 64 * 1024 * 2  # after b, in the chunk outside inference mode
    linear, norm = torch.nn.Linear(640, 256, bias=False), torch.nn.LayerNorm(640)
    values, small = linear.weight.detach().clone(), norm.weight.data_ptr()
    linear.weight.data, norm.weight.data = memory.settled(linear.weight.data), memory.settled(norm.weight.data)
    assert torch.equal(linear.weight, values) and norm.weight.data_ptr() == small
    chunk = linear.weight.untyped_storage().data_ptr()
    assert chunk % memory.HUGE_PAGE == 0 and linear.weight.data_ptr() % memory.Arena.ALIGN == 0
    buffer = memory.empty_buffer((1, 1, 8192, 256), torch.bfloat16)  # a KV buffer of a long context: its own pages
    assert buffer.data_ptr() % memory.HUGE_PAGE == 0 and memory.empty_buffer((1, 1, 512, 256), torch.bfloat16) is None
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    if "[never]" not in mode:
        assert _huge_pages_of(linear.weight.data_ptr()) >= 2048


@pytest.mark.skipif(not memory.available(), reason="no transparent huge pages on this OS")
def test_rehome_moves_large_weights_into_huge_pages_and_keeps_ties():
    model = torch.nn.Sequential(torch.nn.Embedding(2048, 1024), torch.nn.Linear(1024, 2048, bias=False),
                                torch.nn.LayerNorm(1024))
    model[1].weight = model[0].weight  # tied, as Gemma's head and embedding are
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    small = model[2].weight.data_ptr()
    assert memory.rehome(model) == 2048 * 1024 * 4  # the tied weight once, the small norm not at all
    assert model[1].weight is model[0].weight
    assert model[0].weight.data_ptr() % memory.HUGE_PAGE == 0 and model[2].weight.data_ptr() == small
    for name, p in model.state_dict().items():
        assert torch.equal(p, before[name])
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    if "[never]" not in mode:  # the OS honours the advice: the weight's mapping holds 2 MB pages
        assert _huge_pages_of(model[0].weight.data_ptr()) >= 2048
    with torch.inference_mode():  # and the kernels read it like any tensor
        x = torch.randn(3, 1024)
        torch.testing.assert_close(kernels.linear(x, model[1].weight), x @ before["0.weight"].T, rtol=1e-4, atol=1e-4)


def test_top_k_bench_times_both_backends(monkeypatch):
    """On a clock where every reading advances 1 ms and the few-row top-k 2 ms more per call, each row reports
    the median of its calls: fewrow 3 ms, torch 1 ms, speedup torch / fewrow = 1/3, for every (k, rows) asked."""
    import types

    from specnb.model.kernels import bench

    now = [0.0]

    def tick() -> float:
        now[0] += 1e-3
        return now[0]

    real = bench.fewrow_top_k

    def slow_fewrow(x, k):
        now[0] += 2e-3
        return real(x, k)

    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=tick))
    monkeypatch.setattr(bench, "fewrow_top_k", slow_fewrow)
    table = bench.bench_top_k(vocab=300, rows=(1, 3), ks=(1, 4), repeats=3)
    assert table[["k", "rows"]].values.tolist() == [[1, 1], [1, 3], [4, 1], [4, 3]]
    assert table.fewrow_ms.tolist() == pytest.approx([3.0] * 4) and table.torch_ms.tolist() == pytest.approx([1.0] * 4)
    assert table.speedup.tolist() == pytest.approx([1 / 3] * 4)


def _reference_attention(q, k, v, visible, scale, softcap):
    """float64 attention [B, Q, H, D] with the model's scaling and logit softcap (tanh(s / c) * c), from scratch."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    scores = q.double() @ k.transpose(-1, -2) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    return (scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_applies_the_models_scaling_and_softcap(dtype):
    """The Hugging Face attention function hands the model's scaling (Gemma-3's is query_pre_attn_scalar ** -0.5,
    not the head size's) and attention-logit softcap on to the kernel: against a float64 reference for the default,
    a scaling of its own and a softcap, each of which moves the output far beyond the tolerance."""
    q, k, v = _attention_inputs(dtype)
    visible = torch.ones(5, 40, dtype=torch.bool).tril(35)
    mask = torch.zeros(1, 1, 5, 40).masked_fill_(~visible, torch.finfo(torch.float32).min)
    tolerance = TOL[dtype] * 2
    outputs = []
    for scaling, softcap in [(None, None), (0.5, None), (0.5, 2.0)]:
        out, _ = kernels.attention(None, q, k, v, mask, scaling=scaling, softcap=softcap)
        want = _reference_attention(q, k, v, visible, 32 ** -0.5 if scaling is None else scaling, softcap)
        torch.testing.assert_close(out.double(), want, rtol=tolerance, atol=tolerance)
        outputs.append(want)
    for before, after in zip(outputs, outputs[1:], strict=False):
        assert (before - after).abs().max() > 10 * tolerance  # each setting matters at this tolerance


def test_a_stale_build_lock_is_removed(tmp_path, monkeypatch):
    """A build killed mid-way leaves PyTorch's lock file, on which every later build would wait forever: one
    older than STALE_LOCK_S is removed (with a warning) before building; a fresh one is left to its owner."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECNB_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "kernel_isa", lambda: "avx2")
    lock = tmp_path / "kernels" / f"fewrow-{kernels.digest()}" / "lock"
    lock.parent.mkdir(parents=True)
    seen = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: seen.append(lock.exists()) or "built")
    lock.touch()
    assert kernels.extension.__wrapped__() == "built" and seen == [True]  # a build in progress: left alone
    old = time.time() - kernels.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="interrupted build"):
        assert kernels.extension.__wrapped__() == "built"
    assert seen == [True, False]


def test_the_longest_compiles_are_handed_to_ninja_first(tmp_path, monkeypatch):
    """ninja starts the sources in the order given: the slowest files first, then every other one, each once."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECNB_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "kernel_isa", lambda: "avx2")
    given = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: given.extend(kwargs["sources"]) or "built")
    assert kernels.extension.__wrapped__() == "built"
    names = [os.path.basename(path) for path in given]
    assert names[:len(kernels.SLOWEST)] == list(kernels.SLOWEST)
    assert sorted(names) == sorted(path.name for path in kernels.CSRC.glob("*.cpp"))


def test_a_library_built_from_these_sources_is_loaded_without_ninja(tmp_path, monkeypatch):
    """Another checkout of the same sources (one digest, one build directory) built the library: it is loaded as
    is, where cpp_extension.load would rebuild it (its ninja file names the other checkout's paths). While a build
    holds the lock, the build, which waits on it, runs instead."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECNB_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "kernel_isa", lambda: "avx2")
    built = tmp_path / "kernels" / f"fewrow-{kernels.digest()}" / f"specnb_fewrow_{kernels.digest()}.so"
    built.parent.mkdir(parents=True)
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: "built")
    monkeypatch.setattr(kernels, "load_built", lambda name, path: ("loaded", path))
    assert kernels.extension.__wrapped__() == "built"  # nothing built yet
    built.touch()
    assert kernels.extension.__wrapped__() == ("loaded", built)
    (built.parent / "lock").touch()
    assert kernels.extension.__wrapped__() == "built"
