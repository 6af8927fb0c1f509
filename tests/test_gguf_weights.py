"""specnb's decoder over a GGUF file (``load_model(..., weights="gguf")``): it reads the file's settings and
tensors itself, its blocks are the checkpoint's own weights in Hugging Face's row order, the whole model computes
what the stock fp32 model computes, it streams the file's bytes, and speculative decoding on it is lossless."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import GGUF_ARCHS, gemma, kernel_path_exists, tiny, tiny_gguf
from test_lossless import OracleDrafter

from specnb import generate, load_model
from specnb.core.datasets import humaneval
from specnb.drafters.context import ContextNgramDrafter
from specnb.model import kernels, weights_choice
from specnb.model.ceilings import streamed_bytes
from specnb.model.decoder import BlockProjections, Body, DenseProjections
from specnb.model.forward import forward
from specnb.model.gguf_weights import read
from specnb.model.kernels.quant import QuantizedWeight, dequantize, int8_supported
from specnb.model.model_names import ModelError, gguf_file
from specnb.model.models import resolve_weights, stock
from specnb.paths import cache_dir


def test_bad_weights_are_refused_before_loading():
    with pytest.raises(ModelError, match="unknown weights 'q4'"):
        load_model("tiny-llama", weights="q4")
    with pytest.raises(ModelError, match="needs a GGUF file"):
        load_model("tiny-llama", weights="gguf")
    for dtype, device in (("float16", "cpu"), (torch.float16, "cpu"), ("auto", "cuda")):  # no block kernels there
        with pytest.raises(ModelError, match=r"CPU kernels in float32 or bfloat16 \(asked: dtype"):
            load_model("gemma-3-270m", weights="gguf-int8", dtype=dtype, device=device)


def test_a_file_the_decoder_cannot_run_is_refused(tmp_path):
    import gguf
    import numpy as np

    for arch, extra, refusal in [("phi3", {}, "phi3' model"), ("qwen2", {"rope.scaling.type": "yarn"}, "rotary"),
                                 ("llama", {"rope_freqs": None}, r"rotary embedding \(rope_freqs\)"),
                                 ("llama", {}, "has no llama.block_count")]:
        path = tmp_path / f"{arch}.gguf"
        writer = gguf.GGUFWriter(path, arch)
        for key, value in extra.items():
            if value is None:  # llama.cpp's Llama 3 rope scaling: a tensor of frequency factors
                writer.add_tensor(f"{key}.weight", np.ones(32, dtype=np.float32))
            else:
                writer.add_string(f"{arch}.{key}", value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(ValueError, match=refusal):
            read(str(path))


def test_the_header_reader_reads_what_the_gguf_package_reads(tmp_path):
    """open_gguf against gguf.GGUFReader on a file of every value type (a long string array skipped by its
    length, as a vocabulary is) and tensors of every kind the decoder reads; a file cut short is one line."""
    import gguf
    import numpy as np

    from specnb.model.gguf_file import SkippedArray, open_gguf

    path = tmp_path / "all.gguf"
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_uint32("a.u32", 7)
    writer.add_int64("a.i64", -3)
    writer.add_float32("a.f32", 0.5)
    writer.add_bool("a.bool", True)
    writer.add_string("a.str", "héllo")
    writer.add_array("a.short", [1, 2, 3])
    writer.add_array("a.vocab", [f"token-{i}" for i in range(1000)])
    writer.add_array("a.scores", [float(i) for i in range(100)])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
    for kind in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0):
        blocks = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), kind)
        writer.add_tensor(kind.name, blocks, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        want, got = field.contents(), ours.fields[key]
        if isinstance(want, list) and len(want) > 64:
            want = SkippedArray(got.value_type, len(want))
        assert got == (want if isinstance(want, str | SkippedArray) else pytest.approx(want)), key
    assert ours.fields["a.vocab"].length == 1000 and ours.fields["a.str"] == "héllo"
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and a.shape == tuple(int(d) for d in b.shape)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
    whole = path.read_bytes()
    for cut in (len(whole) - 100, 200):  # into the last tensor (past its padding), into the header
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        with pytest.raises(ValueError, match="truncated file"):
            open_gguf(tmp_path / "cut.gguf")
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        open_gguf(tmp_path / "not.gguf")


needs_kernels = pytest.mark.skipif(not kernel_path_exists(), reason="needs an x86 CPU with AVX2 + FMA")


def weights_table(blocks: str, ms: dict[int, tuple[float, float]]) -> pd.DataFrame:
    """A fake weights table: tokens -> (bf16 ms, blocks ms)."""
    return pd.DataFrame([{"weights": w, "tokens": t, "seconds": pair[i] / 1e3}
                         for t, pair in ms.items() for i, w in enumerate(("bf16", blocks))])


def test_the_blocks_are_chosen_only_where_no_call_of_speculation_is_slower():
    for blocks in ("gguf", "gguf-int8"):
        assert weights_choice.choose(weights_table(blocks, {1: (20, 10), 4: (21, 11), 16: (30, 20)}), blocks) == blocks
        assert weights_choice.choose(weights_table(blocks, {1: (20, 20), 4: (21, 21), 16: (30, 30)}), blocks) == blocks
        # faster at one token, slower at the 16-token verification call: speculation would slow down
        assert weights_choice.choose(weights_table(blocks, {1: (20, 10), 4: (21, 11), 16: (30, 31)}), blocks) == "bf16"
        assert weights_choice.choose(weights_table(blocks, {1: (20, 21), 4: (21, 11), 16: (30, 20)}), blocks) == "bf16"
    with pytest.raises(ValueError, match="no complete timings"):
        weights_choice.choose(weights_table("gguf", {1: (20, 10)}), "gguf-int8")


@needs_kernels
def test_auto_weights_follow_the_machines_table_for_embedded_models(monkeypatch, tmp_path):
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    assert resolve_weights("tiny-llama", "auto", cpu, bf16) == "bf16"  # no GGUF file
    assert resolve_weights("gemma-3-270m", "auto", torch.device("cuda"), bf16) == "bf16"  # no block kernels there
    assert resolve_weights("gemma-3-270m", "auto", cpu, torch.float16) == "bf16"
    assert resolve_weights("gemma-3-270m", "bf16", cpu, bf16) == "bf16"  # asked for: kept
    blocks = weights_choice.blocks_route()
    monkeypatch.setattr(weights_choice, "table_path", lambda name, dtype, route: tmp_path / f"{name}.csv")
    timed = []

    def fake_measure(load, route):
        timed.append(route)
        return weights_table(route, {1: (20, 10), 4: (21, 11), 16: (30, 20)})

    monkeypatch.setattr(weights_choice, "measure", fake_measure)
    assert resolve_weights("gemma-3-270m", "auto", cpu, bf16) == blocks
    assert resolve_weights("gemma-3-270m", "auto", cpu, bf16) == blocks
    assert timed == [blocks] and (tmp_path / "gemma-3-270m.csv").exists()  # timed once, then read
    # a table timed before, where the blocks lose at 16 tokens per call
    weights_table(blocks, {1: (20, 10), 4: (21, 11), 16: (30, 40)}).to_csv(
        tmp_path / "qwen2.5-coder-1.5b-instruct.csv", index=False)
    assert resolve_weights("qwen2.5-coder-1.5b-instruct", "auto", cpu, torch.float32) == "bf16"
    assert timed == [blocks]
    monkeypatch.setenv("SPECNB_CPU_ISA", "avx2")  # the int8 route runs on the AVX2 path too (vpmaddubsw)
    assert weights_choice.blocks_route() == "gguf-int8"
    assert tiny("llama").weights == "bf16"


@needs_kernels
@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_a_tiny_model_over_blocks_computes_the_stock_model_of_their_values(arch):
    target = tiny_gguf(arch)
    lean = target.decoder
    assert isinstance(lean.head.weight, QuantizedWeight)
    assert all(isinstance(layer.projections, BlockProjections) for layer in lean.layers)
    assert "-gguf" in lean.call_path() and target.backend == "gguf"
    settings = lean.source.settings
    if arch == "gemma3":  # the sliding layers, their window and their rotary base from the file's metadata
        assert settings.layer_types == tuple(target.model.config.layer_types) and settings.window == 16
        assert settings.rope_base == {"full_attention": 1e6, "sliding_attention": 1e4}
    ids = torch.randint(0, 256, (1, 150), generator=torch.Generator().manual_seed(1))  # 150 > 128: layer by layer
    for length in (20, 150):
        with torch.inference_mode():
            logits, _ = forward(target, ids[:, :length])
            reference = target.model(ids[:, :length]).logits  # Hugging Face's model of the blocks' values
        # fp32 sums in another order, through 4 layers (a wrong row order or scale is off by far more)
        assert (logits - reference).abs().max() <= 1e-4 * reference.abs().max()


@needs_kernels
@pytest.mark.parametrize("arch", GGUF_ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("int8", [False, True])
def test_speculation_over_blocks_is_lossless_and_accepts(arch, dtype, int8):
    """Drafts mixing AR's own continuation with noise (the verifier accepts them only if its calls compute AR's
    bits), and prompt lookup: both equal AR token for token; over int8 activations too (their own AR)."""
    if int8 and not int8_supported():
        pytest.skip("int8 activations need AVX2 + F16C, or VNNI on the AVX512 path")
    target = tiny_gguf(arch, dtype, int8)
    prompt = [256] + list(range(40, 60)) * 3
    ar = generate(target, prompt, max_new_tokens=40, stop_at_eos=False).tokens
    for mode in ("tree", "batch"):
        out = generate(target, prompt, OracleDrafter(ar, len(prompt), 7, 6, 10, 0.1), max_new_tokens=40,
                       verify=mode, stop_at_eos=False)
        assert out.tokens == ar, mode
        assert max(c.accepted for c in out.stats.calls) >= 5, mode
        lookup = generate(target, prompt, ContextNgramDrafter(k=2, w=6), max_new_tokens=40, verify=mode,
                          stop_at_eos=False)
        assert lookup.tokens == ar, mode


def _mapped_from(path) -> list[tuple[int, int]]:
    """The address ranges this process maps from the file at ``path`` (/proc/self/maps)."""
    ranges = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@needs_kernels
def test_int8_weights_keep_their_blocks_in_the_files_mapping_not_a_copy():
    """A weight over int8 activations streams its repacked tiles; its blocks as stored (read only by dequantization
    and embedding lookups) stay pages of the file's mapping rather than a second copy in memory. The other weights'
    blocks, which their calls stream, are copied out of it."""
    if not int8_supported():
        pytest.skip("int8 activations need AVX2 + F16C, or VNNI on the AVX512 path")
    for int8 in (True, False):
        weights = read(str(tiny_gguf("qwen2", int8=int8).decoder.source.path), int8)  # llama: q, k rows reordered
        mapped = _mapped_from(weights.path)
        blocks = [w for w in weights.tensors.values() if isinstance(w, QuantizedWeight)]
        assert blocks and all(w.int8 == int8 for w in blocks)
        for w in blocks:
            inside = any(start <= w.blocks.data_ptr() < end for start, end in mapped)
            assert inside == int8, (int8, w.format, w.shape)
            if int8:
                assert not any(start <= w.packed.data_ptr() < end for start, end in mapped)


@needs_kernels
@pytest.mark.parametrize("weights", ["gguf", "gguf-int8", "auto"])
def test_a_gguf_file_is_a_model_name(weights, tmp_path, monkeypatch, capsys):
    """A Llama GGUF as llama.cpp's converter writes it (q / k rows permuted, its tokenizer in the metadata) loads by
    its path: converted once for transformers (said once), then run over its own blocks; its AR is the AR of the
    model it was written from over the same blocks, and speculation over it is lossless and accepts."""
    if weights == "gguf-int8" and not int8_supported():
        pytest.skip("int8 activations need AVX2 + F16C, or VNNI on the AVX512 path")
    written = tiny_gguf("llama", int8=weights == "gguf-int8")
    kernels.extension()  # loaded from the real cache before the test's own replaces it (a build takes a minute)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    path = written.decoder.source.path
    mine = load_model(path, dtype="float32", weights=weights)
    assert "converting" in capsys.readouterr().err
    assert mine.weights in ("gguf", "gguf-int8", "bf16") and (weights == "auto" or mine.weights == weights)
    assert load_model(path, dtype="float32", weights="bf16").weights == "bf16"
    assert "converting" not in capsys.readouterr().err  # converted once
    prompt = [256] + list(range(40, 60)) * 3
    ar = generate(mine, prompt, max_new_tokens=30, stop_at_eos=False).tokens
    if weights != "auto":
        assert ar == generate(written, prompt, max_new_tokens=30, stop_at_eos=False).tokens
    out = generate(mine, prompt, OracleDrafter(ar, len(prompt), 7, 6, 10, 0.1), max_new_tokens=30, stop_at_eos=False)
    assert out.tokens == ar and max(c.accepted for c in out.stats.calls) >= 5
    if mine.weights == "bf16":
        return
    # the dense checkpoint is read only when something asks for it (the stock baselines), once
    assert all(p.is_meta for p in mine.modules.parameters())
    assert mine.dense is not None and mine.model is mine.model and not any(p.is_meta for p in mine.model.parameters())
    assert all(p.is_meta for p in mine.modules.parameters())
    if weights == "gguf":  # the converted checkpoint holds the blocks' values: Hugging Face's call of them is ours
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            torch.testing.assert_close(stock(mine).decoder.forward(ids)[0, -1], mine.decoder.forward(ids)[0, -1],
                                       rtol=1e-4, atol=1e-4)


needs_gemma = pytest.mark.skipif(
    not kernel_path_exists() or not (cache_dir() / "models" / "gemma-3-270m" / "config.json").exists()
    or not gguf_file("gemma-3-270m").exists(),
    reason="needs an x86 CPU with AVX2 + FMA and `specnb models fetch gemma-3-270m` (make test does)")


pytestmark = pytest.mark.usefixtures("all_threads")



@pytest.mark.slow
@needs_gemma
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_blocks_are_the_checkpoints_weights_in_its_row_order(dtype):
    target = gemma(dtype, "gguf")
    model = target.model
    lean, dense = target.decoder, Body.from_hf(model)  # the file's, and the converted checkpoint's
    assert len(lean.layers) == model.config.num_hidden_layers
    for ours, theirs in zip(lean.layers, dense.layers, strict=True):
        blocks, stacks = ours.projections, theirs.projections
        assert isinstance(blocks, BlockProjections) and isinstance(stacks, DenseProjections)
        weights = [w.dequantize().to(model.dtype) for w, _ in blocks.linears()]
        stacked = [*stacks.qkv.weight.split(stacks.qkv.sizes), *stacks.gate_up.weight.split(stacks.gate_up.sizes),
                   stacks.o[0], stacks.down[0]]
        assert all(torch.equal(a, b) for a, b in zip(weights, stacked, strict=True))
        assert all(torch.allclose(a.scale, b.scale)
                   for a, b in zip(ours.norms.all(), theirs.norms.all(), strict=True))
    head = lean.head.weight  # every 1,021st of its 262,144 rows: the row order, without decoding 671 MB in fp32
    rows = torch.arange(0, head.shape[0], 1021)
    assert torch.equal(dequantize(head.blocks[rows], head.format).to(model.dtype),
                       model.get_output_embeddings().weight[rows])
    ids = torch.tensor([[2, 100, 5000, 262143]])
    assert torch.equal(lean.embed(ids), model.get_input_embeddings()(ids))  # rows decoded from the blocks
    assert "-gguf" in lean.call_path()  # its timing tables and greedy references are its own
    if dtype == "bfloat16":  # the dense path's model, loaded once (the dtype changes neither)
        assert streamed_bytes(target) == lean.weight_bytes() < streamed_bytes(gemma(dtype, "bf16")) / 2
        assert "-gguf" not in gemma(dtype, "bf16").decoder.call_path()
        assert (gemma(dtype, "gguf").weights, gemma(dtype, "bf16").weights) == ("gguf", "bf16")


def prompts() -> list[str]:
    problems = humaneval(3)
    return [p.text for p in problems]


@pytest.mark.slow
@needs_gemma
def test_fp32_logits_and_greedy_tokens_equal_the_stock_fp32_models():
    """The converted checkpoint holds the file's values in fp32: the stock model is the same model."""
    target = gemma("float32", "gguf")
    ids = target.tokenizer(prompts()[0], return_tensors="pt").input_ids
    logits, _ = forward(target, ids)
    reference = target.model(ids).logits
    assert (logits - reference).abs().max() <= 1e-3 * reference.abs().max()
    for prompt in prompts():
        ours = generate(target, prompt, max_new_tokens=12).tokens
        assert ours == generate(stock(target), prompt, max_new_tokens=12).tokens


@pytest.mark.slow
@needs_gemma
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prompt_lookup_on_the_blocks_equals_ar_on_them(dtype):
    target = gemma(dtype, "gguf")
    prompt = prompts()[1]
    ar = generate(target, prompt, max_new_tokens=24)
    for drafter, mode in [(ContextNgramDrafter(k=1, w=10), "tree"), (ContextNgramDrafter(k=4, w=6), "batch")]:
        out = generate(target, prompt, drafter, max_new_tokens=24, verify=mode)
        assert out.tokens == ar.tokens, (mode, drafter.k)
        assert out.stats.tokens_per_call > 1.2, (mode, out.stats.tokens_per_call)  # drafts were accepted
