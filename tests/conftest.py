"""Shared fixtures: tiny random models (float32 unless asked for bf16, built in code, cached per session)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import specnb

# jsonschema (which Ray and nbformat import) loads rfc3987_syntax where it is installed (jupyter-events asks for
# jsonschema's format extras), and that compiles 38 grammars on import: ~3 s in every process. Only the "iri"
# format checks use it, which no test asks for; the test processes, and the Ray cluster's (WITHOUT_IRI_CHECKS),
# go without it.
sys.modules.setdefault("rfc3987_syntax", None)  # an import of it now fails, as where it is not installed
WITHOUT_IRI_CHECKS = 'import sys; sys.modules.setdefault("rfc3987_syntax", None)'  # the same, for a sitecustomize

specnb.openmp_spin_briefly()  # before torch is imported (libgomp reads it once), as the command and notebooks do

import torch  # noqa: E402

from specnb.model import kernels  # noqa: E402
from specnb.model.kernels.cpu import kernel_isa  # noqa: E402
from specnb.model.models import LoadedModel, byte_tokenizer, tiny_model  # noqa: E402

# Loaded here, from the real cache (make test builds it first): a test's first kernel call under isolated_cache
# would otherwise compile the extension into its temporary folder, a minute on 2 cores.
kernels.extension()

# The longest test file (the study of every notebook, ~2.5 min on 2 cores) is collected first; with make test's
# --no-loadscope-reorder pytest-xdist starts it first, and the other worker runs the rest meanwhile (by default it
# orders files by their number of tests, and this one, started last, ran alone at the end).
FIRST = ("test_study_run.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in FIRST)  # stable: each file's own order is kept


# Tiny models do tiny matmuls: a second thread only adds synchronisation (and, on a busy machine, a lot of
# it). Tests that time or run a real model raise this locally.
torch.set_num_threads(1)

ARCHS = ("llama", "qwen2", "gemma3")
DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(autouse=True)
def head_rows_in_two_calls(monkeypatch):
    """Every verification call's head runs its first two rows, then the rest only if acceptance reads past them (as
    on a machine where two rows cost one's price), so that every losslessness test takes the split path; a tiny
    model's timings would pick any split, or none."""
    monkeypatch.setattr("specnb.core.head_rows.rows_at_one_price", lambda head, like: 2)


@functools.cache
def tiny(arch: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """One tiny model per architecture and dtype for the whole session (never mutated by decoding)."""
    return tiny_model(arch, dtype=dtype)


@functools.cache
def gemma(dtype: str, weights: str = "auto") -> LoadedModel:
    """The embedded Gemma-3-270M, one per dtype and weights for the session (skip where it is not fetched)."""
    from specnb.model.models import load_model
    from specnb.paths import cache_dir

    if not (cache_dir() / "models" / "gemma-3-270m" / "config.json").exists():
        pytest.skip("run `specnb models fetch gemma-3-270m` (make test does)")
    return load_model("gemma-3-270m", dtype=dtype, weights=weights)


_GGUF_DIR = tempfile.TemporaryDirectory(prefix="specnb-tiny-gguf-")  # removed when the session ends
GGUF_ARCHS = ("llama", "qwen2", "gemma3")


# Hugging Face module (under model.layers.<i>.) -> GGUF tensor (blk.<i>.<name>): projections, then norms
GGUF_PROJECTIONS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                    "mlp.down_proj": "ffn_down"}
GGUF_NORMS = {"llama": {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"},
              "qwen2": {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"},
              "gemma3": {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                         "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
                         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}}


def converter_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """A Llama q or k projection's rows as llama.cpp's converter stores them: each head's two rotary halves
    interleaved."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(model, arch: str, path: Path) -> None:
    """Write ``model`` (a tiny Llama, Qwen2 or Gemma-3) as a GGUF file the way llama.cpp's converter lays one out:
    settings and the byte tokenizer in the metadata, the embedding, head and projections in Q8_0 and Q5_0 in turn
    (the formats the gguf package can write), Llama's q / k rows permuted, norms (Gemma's as 1 + w) and biases in
    F32. The model's
    dense weights are then set to the blocks' values, so Hugging Face's decoder computes the model the file
    holds."""
    import gguf

    config, gemma = model.config.get_text_config(), arch == "gemma3"
    layers = model.get_decoder().layers
    keys = gguf.Keys
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(layers[0].self_attn.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"] if gemma else rope["rope_theta"])
    if gemma:
        writer.add_sliding_window(config.sliding_window)
        writer.add_uint32(keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch), 2)  # tiny_model's layer types
        writer.add_float32(keys.Rope.FREQ_BASE_SWA.format(arch=arch), rope["sliding_attention"]["rope_theta"])
        writer.add_float32(keys.Attention.SCALE.format(arch=arch), layers[0].self_attn.scaling)
    vocab = sorted(byte_tokenizer().get_vocab().items(), key=lambda item: item[1])  # the tiny models' tokenizer
    pad = config.vocab_size - len(vocab)  # the embedding's rows past the tokenizer's: unused tokens
    writer.add_tokenizer_model("gpt2")  # byte-level BPE; no merges: every token is one byte or special
    writer.add_token_list([token for token, _ in vocab] + [f"<unused{i}>" for i in range(pad)])
    writer.add_token_types([1] * 256 + [3] * (len(vocab) - 256) + [5] * pad)  # normal, control, unused
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_bos_token_id(vocab[256][1])
    writer.add_eos_token_id(vocab[257][1])
    writer.add_pad_token_id(vocab[258][1])
    quantized = [(model.get_input_embeddings(), "token_embd"), (model.get_output_embeddings(), "output")]
    quantized += [(layers[i].get_submodule(m), f"blk.{i}.{n}") for i in range(len(layers))
                  for m, n in GGUF_PROJECTIONS.items()]
    with torch.no_grad():
        for j, (module, name) in enumerate(quantized):
            qtype = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0)[j % 2]
            weight = module.weight.float().numpy()
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(
                name.rsplit(".", 1)[-1]) if arch == "llama" else None
            blocks = gguf.quants.quantize(weight if heads is None else converter_rows(weight, heads), qtype)
            writer.add_tensor(f"{name}.weight", blocks, raw_dtype=qtype)
            stored = gguf.quants.dequantize(blocks, qtype)
            if heads is not None:  # back to Hugging Face's rows: the inverse of converter_rows
                stored = stored.reshape(heads, -1, 2, stored.shape[1]).swapaxes(1, 2).reshape(stored.shape)
            module.weight.copy_(torch.from_numpy(stored).to(module.weight.dtype))
            if getattr(module, "bias", None) is not None:
                writer.add_tensor(f"{name}.bias", module.bias.float().numpy())
        norms = [(model.get_decoder().norm, "output_norm")] + [(layers[i].get_submodule(m), f"blk.{i}.{n}")
                                                              for i in range(len(layers))
                                                              for m, n in GGUF_NORMS[arch].items()]
        for module, name in norms:
            weight = module.weight.float()
            writer.add_tensor(f"{name}.weight", (1.0 + weight if gemma else weight).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@functools.cache
def tiny_gguf(arch: str, dtype: torch.dtype = torch.float32, int8: bool = False) -> LoadedModel:
    """A tiny model that specnb's decoder runs from a GGUF file written here (:func:`write_gguf`), with the
    weights its Hugging Face model holds (``int8``: the blocks times int8-rounded activations, another model).
    One per architecture, dtype and route for the session."""
    from specnb.model.backend import build_decoder

    target = tiny_model(arch, dtype=dtype)
    path = Path(_GGUF_DIR.name) / f"{arch}-{str(dtype).removeprefix('torch.')}{'-int8' if int8 else ''}.gguf"
    write_gguf(target.model, arch, path)
    return dataclasses.replace(target, decoder=build_decoder(target.model, "gguf-int8" if int8 else "gguf", str(path)))


@pytest.fixture(params=ARCHS)
def tiny_target(request) -> LoadedModel:
    return tiny(request.param)


class WholeRows:
    """A fake cost table without a head curve (as a GPU's): every call's head computes all its rows."""

    def head_correction(self, table_rows: int, rows: int, rows_read: int | None, all_rows: bool) -> float:
        return 0.0


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """Point SPECNB_CACHE at a fresh folder so tables and stores built by a test never leak into others."""
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    return tmp_path


def kernel_path_exists() -> bool:
    """Whether specnb's CPU kernels have a path on this machine: an x86 CPU with AVX2 + FMA, kernels not turned off
    with ``SPECNB_KERNELS=0``. Where one exists the extension must build: tests that need it skip only where it
    cannot exist, and a build failure fails them (``test_kernels.py::test_the_extension_builds``)."""
    return os.environ.get("SPECNB_KERNELS", "1") != "0" and kernel_isa() is not None


@contextlib.contextmanager
def without_kernels() -> Iterator[None]:
    """specnb as it runs where its CPU kernels do not (other devices, CPUs without AVX2 + FMA): the same
    decoder, each step PyTorch's op."""
    with mock.patch.object(kernels, "extension", lambda: None):
        yield


@contextlib.contextmanager
def hugging_face_on_kernels(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Hugging Face's decoder with its linear layers and attention on specnb's kernels, for the block only:
    the reference that rounds where specnb's decoder rounds, so bf16 results compare bit for bit (specnb
    itself never patches Hugging Face's modules)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("specnb-test", kernels.attention)
    AttentionMaskInterface.register("specnb-test", sdpa_mask)  # masks built as for SDPA (None when causal)
    configs = list({id(c): c for c in (model.config, model.config.get_text_config())}.values())
    saved = [c._attn_implementation for c in configs]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    for module in linears:
        module.forward = functools.partial(lambda m, x: kernels.linear(x, m.weight, m.bias), module)
    for config in configs:
        config._attn_implementation = "specnb-test"
    try:
        yield model
    finally:
        for module in linears:
            del module.forward
        for config, name in zip(configs, saved, strict=True):
            config._attn_implementation = name


@pytest.fixture
def all_threads():
    """A real model wants every core (tiny models run on one thread here)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def one_thread():
    """Tiny models and vectorised work on many small rows run fastest on one thread (and far better on a busy
    machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def source(tmp_path):
    """A folder of small Python files to build stores from (byte tokens with the tiny models: about 450)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 5)
    return src


def clustered_unit_vectors(n: int, dims: int, centres: int, spread: float, seed: int = 0) -> np.ndarray:
    """float32 [n, dims] unit vectors around ``centres`` random centres, Gaussian noise of std ``spread`` added
    before normalising: data an ANN index should search well."""
    rng = np.random.default_rng(seed)
    middle = rng.standard_normal((centres, dims))
    x = middle[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, dims))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
