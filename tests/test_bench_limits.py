"""The bench's machine-limit columns and its peers: numbers that follow their definitions."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from conftest import tiny, tiny_gguf

from specnb.core.prompts import Prompt, encode_prompt
from specnb.eval.bench import BenchConfig, run_bench
from specnb.eval.runner import summarize
from specnb.model import ceilings


def test_short_prompts_share_the_latest_bandwidth_sample(monkeypatch):
    """Prompts that end within RESAMPLE_SECONDS of the last sample carry it instead of taking one each."""
    samples = iter([10.0, 8.0])
    monkeypatch.setattr("specnb.eval.bench.sample_read_bandwidth", lambda: next(samples))
    prompts = [Prompt(name, [256, 40, 41, 42, 40, 41]) for name in "abc"]
    rows = run_bench(tiny("llama"), prompts, BenchConfig(["ar"], max_new_tokens=4, warmup_tokens=2), progress=False)
    assert list(rows.read_gb_per_s) == [10.0] * 3  # the start's sample; 8.0 never taken


def test_bandwidth_columns_follow_their_definition(monkeypatch):
    samples = iter([10.0, 8.0, 12.0, 30.0])  # GB/s: at the start, then after each prompt
    monkeypatch.setattr("specnb.eval.bench.sample_read_bandwidth", lambda: next(samples))
    monkeypatch.setattr("specnb.eval.bench.RESAMPLE_SECONDS", 0.0)  # every prompt: the tiny runs take milliseconds
    target = tiny("llama")
    prompts = [Prompt("a", [256, 40, 41, 42, 40, 41]), Prompt("b", [256, 50, 51, 50, 51, 50])]
    rows = run_bench(target, prompts, BenchConfig(["ar", "pld", "hf"], max_new_tokens=12, warmup_tokens=4),
                     progress=False)
    summary = summarize(rows).set_index("method")
    weight_bytes = ceilings.streamed_bytes(target)
    assert (rows.weight_bytes == weight_bytes).all()  # each row: the sample after its prompt; the summary: median
    assert list(rows[rows.method == "ar"].read_gb_per_s) == [8.0, 12.0] and (summary.read_gb_per_s == 10.0).all()
    for method, group in rows.groupby("method"):
        calls = group.calls.sum() + len(group)  # every call, prefills included
        expected = weight_bytes * calls / group.seconds.sum() / 1e9
        assert summary.loc[method, "weight_gb_per_s"] == pytest.approx(expected)
        assert summary.loc[method, "bandwidth_fraction"] == pytest.approx(expected / 10.0)
        if method == "hf":  # a peer reports no decode time: no decode-only fraction
            assert math.isnan(summary.loc[method, "decode_bandwidth_fraction"])
        else:  # decoding calls over decoding seconds: prefills left out
            decode = weight_bytes * group.calls.sum() / group.decode_seconds.sum() / 1e9 / 10.0
            assert summary.loc[method, "decode_bandwidth_fraction"] == pytest.approx(decode)
            assert (group.decode_seconds < group.seconds).all()  # not: decode fraction > whole (a prefill of 6
            # tokens on a tiny model may take less than a decoding call, so that order is timing, not definition)
    assert summary.loc["ar", "identical_to_ar"] == 1.0 and summary.loc["pld", "identical_to_ar"] == 1.0


def test_streamed_bytes_counts_a_tied_head_once_and_skips_an_untied_embedding():
    target = tiny("llama")  # untied: the input embedding is read a row per token, not streamed
    model = target.model
    everything = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    assert ceilings.streamed_bytes(target) == everything - embedding.numel() * embedding.element_size()
    assert ceilings.matmul_parameters(model) * 4 == ceilings.streamed_bytes(target)


def test_machine_ceilings_are_bytes_and_flops_over_the_median_time(monkeypatch):
    """On a clock whose timed reads take 4, 1 and 2 s (median 2 s), the read bandwidth of 64 MB of float32 is
    64 * 2**20 bytes / 2 s / 1e9 and a 256^3 GEMM's rate 2 * 256**3 / 2 s (the untimed warm-up pass excluded);
    on the real clock both are finite and positive."""
    import types

    durations = iter([4.0, 1.0, 2.0] * 2)
    now = [0.0, False]  # time, whether the next reading ends a timed call

    def clock() -> float:
        if now[1]:
            now[0] += next(durations)
        now[1] = not now[1]
        return now[0]

    real_time = ceilings.time
    monkeypatch.setattr(ceilings, "time", types.SimpleNamespace(perf_counter=clock))
    assert ceilings.sample_read_bandwidth(megabytes=64, repeats=3) == pytest.approx(64 * 2**20 / 2.0 / 1e9)
    assert ceilings.gemm_flops(size=256, repeats=3) == pytest.approx(2 * 256**3 / 2.0)
    monkeypatch.setattr(ceilings, "time", real_time)
    assert 0 < ceilings.sample_read_bandwidth(megabytes=16, repeats=2) < float("inf")


@pytest.mark.parametrize("call_seconds, side", [(1.0, 256), (0.05, 1024)])
def test_the_gemm_probe_grows_the_product_only_while_a_call_fits_its_budget(monkeypatch, call_seconds, side):
    """A GEMM that takes over the budget at side 256 (bf16 where the CPU has no bf16 instruction: a 2048 product
    takes a minute) is measured there; a fast one grows to the requested size."""
    import types

    now = [0.0, False]

    def clock() -> float:
        if now[1]:
            now[0] += call_seconds
        now[1] = not now[1]
        return now[0]

    monkeypatch.setattr(ceilings, "time", types.SimpleNamespace(perf_counter=clock))
    rate = ceilings.gemm_flops.__wrapped__(torch.float32, size=1024, repeats=1, budget=0.5)  # uncached
    assert rate == pytest.approx(2 * side**3 / call_seconds)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama-cpp-python is installed")
def test_llamacpp_without_the_binding_is_one_clear_error():
    with pytest.raises(ValueError, match="pip install llama-cpp-python"):
        run_bench(tiny("llama"), [Prompt("a", [256, 40])], BenchConfig(["llamacpp"], max_new_tokens=2),
                  progress=False)


def test_llamacpp_needs_an_embedded_gguf():
    from specnb.eval import llamacpp

    with pytest.raises(ValueError, match="embedded model's GGUF"):
        llamacpp.embedded_gguf(tiny("llama"))


class _CachingLlama:
    """llama-cpp-python's ``Llama`` as the runner sees it: ``generate`` prefills only what follows the prefix the
    prompt shares with the tokens already in its cache (``reset`` empties it), then yields ``[7, 8, ...]``."""

    def __init__(self, **kwargs):
        self.cached: list[int] = []
        self.prefilled: list[int] = []

    def token_eos(self) -> int:
        return 0

    def reset(self) -> None:
        self.cached = []

    def generate(self, tokens, **kwargs):
        shared = next((i for i, (a, b) in enumerate(zip(self.cached, tokens, strict=False)) if a != b),
                      min(len(self.cached), len(tokens)))
        self.prefilled.append(len(tokens) - shared)
        self.cached = list(tokens)
        yield from range(7, 100)


def test_llamacpp_prefills_every_prompt_whole(monkeypatch, tmp_path):
    """Timed as ours: no prompt reuses the KV cache of the last prompt's shared prefix (the chat template's)."""
    import sys
    import types

    from specnb.eval import llamacpp

    made: list[_CachingLlama] = []
    binding = types.SimpleNamespace(Llama=lambda **kw: made.append(_CachingLlama(**kw)) or made[-1])
    speculative = types.SimpleNamespace(LlamaPromptLookupDecoding=lambda **kw: None)
    monkeypatch.setitem(sys.modules, "llama_cpp", binding)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    monkeypatch.setattr(llamacpp, "check_available", lambda: None)
    (tmp_path / "m.gguf").write_bytes(b"0" * 10)
    monkeypatch.setattr(llamacpp, "embedded_gguf", lambda target: tmp_path / "m.gguf")
    monkeypatch.setattr(llamacpp, "streamed_bytes", lambda path: 10)
    target = tiny("llama")
    run = llamacpp.runner("llamacpp", target, max_context=64)
    prompts = [Prompt("a", "def f(x):"), Prompt("b", "def f(y):"), Prompt("b", "def f(y):")]  # the warm-up's twice
    for prompt in prompts:
        assert run(prompt, 3)["tokens"] == [7, 8, 9]
    assert made[0].prefilled == [len(encode_prompt(target, p)) for p in prompts]


def test_llamacpp_bytes_leave_out_an_untied_embedding_table():
    """A decoding step reads one row of the token embedding table when the file has its own output head."""
    from specnb.eval import llamacpp
    from specnb.model.gguf_file import open_gguf

    path = tiny_gguf("llama").decoder.source.path
    sizes = {t.name: t.data.nbytes for t in open_gguf(path).tensors}
    assert "output.weight" in sizes
    assert llamacpp.streamed_bytes(path) == sum(sizes.values()) - sizes["token_embd.weight"]


def test_uncounted_calls_give_no_per_call_numbers():
    import pandas as pd

    rows = pd.DataFrame({"method": ["ar", "ar", "peer", "peer"], "prompt_id": ["a", "b", "a", "b"],
                         "new_tokens": [10, 10, 10, 10], "calls": [9, 9, float("nan"), float("nan")],
                         "seconds": [1.0, 1.0, 0.5, 0.5], "identical_to_ar": [True, True, None, None],
                         "outside_forward_fraction": [0.1] * 4, "weight_bytes": [1e9] * 4,
                         "read_gb_per_s": [20.0] * 4})
    summary = summarize(rows).set_index("method")
    assert summary.loc["ar", "tokens_per_call"] == pytest.approx(1.0)
    assert summary.loc["ar", "weight_gb_per_s"] == pytest.approx(1e9 * 20 / 2.0 / 1e9)
    assert summary.loc[["peer"], ["calls", "tokens_per_call", "weight_gb_per_s"]].isna().all(axis=None)


@pytest.mark.parametrize("isa", ["avx2", "avx512bf16"])
def test_each_kernel_path_is_priced_at_the_instruction_it_multiplies_with(monkeypatch, isa):
    """The compute floor of a path is its own instruction's: the exact blocks' fp32 FMAs over decoded weights, the
    int8 route's vpdpbusd (AVX512-VNNI) or vpmaddubsw step (AVX2), the dense kernel's vdpbf16ps for bf16 weights
    on the AVX512 path and fp32 FMAs otherwise; the int8 tiles issue vpdpbusd with a broadcast row."""
    monkeypatch.setattr("specnb.model.kernels.cpu.kernel_isa", lambda flags=None: isa)
    avx512 = isa == "avx512bf16"
    assert [ceilings.kernel_instruction(True, int8, bf16) for int8 in (False, True) for bf16 in (False, True)] == \
        ["fp32-fma", "fp32-fma"] + ["int8-vnni" if avx512 else "int8-avx2"] * 2
    assert ceilings.kernel_instruction(False, False, True) == ("bf16-dot" if avx512 else "fp32-fma")
    assert ceilings.kernel_instruction(False, False, False) == "fp32-fma"
    assert ceilings.int8_form() == ("int8-vnni-broadcast" if avx512 else "int8-avx2")


@pytest.mark.skipif(ceilings.peak_macs("fp32-fma") is None, reason="needs specnb's CPU kernels")
def test_a_models_cost_table_names_its_paths_instruction():
    """path_instruction reads the path a loaded model runs: over GGUF blocks exact or int8, or dense."""
    from specnb.model.kernels.quant import int8_supported

    assert ceilings.path_instruction(tiny_gguf("llama")) == "fp32-fma"
    assert ceilings.path_instruction(tiny("llama")) == ceilings.kernel_instruction(False, False, False)
    if int8_supported():
        int8 = ceilings.kernel_instruction(True, True, False)
        assert int8.startswith("int8") and ceilings.path_instruction(tiny_gguf("llama", int8=True)) == int8


@pytest.mark.skipif(ceilings.peak_macs("fp32-fma") is None, reason="needs specnb's CPU kernels")
def test_instruction_peaks_are_physical():
    """Each instruction's measured peak per thread lies between 1 G multiply-adds per second and what two such
    instructions a cycle at 6 GHz give: a loop the compiler dropped or shortened would read faster than any CPU."""
    per_cycle = {"fp32-fma": 2 * 16, "bf16-dot": 2 * 32, "int8-vnni": 2 * 64, "int8-vnni-broadcast": 2 * 64,
                 "int8-avx2": 2 * 32}
    for instruction, macs in per_cycle.items():
        peak = ceilings.peak_macs(instruction)
        if peak is not None:
            assert 1e9 < peak / torch.get_num_threads() < macs * 6e9, instruction
