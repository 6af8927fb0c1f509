"""Shared fixtures: tiny random models (float32 unless asked for bf16, built in code, cached per session)."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import pytest
import torch

from specnb.kernels.cpu import kernel_isa
from specnb.models import LoadedModel, tiny_model

# Tiny models do tiny matmuls: a second thread only adds synchronisation (and, on a busy machine, a lot of
# it). Tests that time or run a real model raise this locally.
torch.set_num_threads(1)

ARCHS = ("llama", "qwen2", "gemma3")
DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def tiny(arch: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """One tiny model per architecture and dtype for the whole session (never mutated by decoding)."""
    return tiny_model(arch, dtype=dtype)


_GGUF_DIR = tempfile.TemporaryDirectory(prefix="specnb-tiny-gguf-")  # removed when the session ends
GGUF_ARCHS = ("qwen2", "gemma3")  # the architectures whose GGUF rows are in Hugging Face's order


@functools.cache
def tiny_gguf(arch: str, dtype: torch.dtype = torch.float32, int8: bool = False) -> LoadedModel:
    """A tiny model whose projections and head compute over GGUF blocks (Q8_0 and Q5_0 in turn: the formats
    the gguf package can write), from a file written here; its dense weights are set to the blocks' values, so
    Hugging Face's decoder computes the same model (``int8``: the blocks times int8-rounded activations, another
    model). One per architecture, dtype and route for the session."""
    import gguf

    from specnb.gguf_weights import PROJECTIONS, attach

    target = tiny_model(arch, dtype=dtype)
    model, layers = target.model, target.model.get_decoder().layers
    modules = [(layers[i].get_submodule(m), f"blk.{i}.{n}.weight") for i in range(len(layers))
               for m, n in PROJECTIONS.items()] + [(model.get_output_embeddings(), "output.weight")]
    path = Path(_GGUF_DIR.name) / f"{arch}-{str(dtype).removeprefix('torch.')}{'-int8' if int8 else ''}.gguf"
    writer = gguf.GGUFWriter(path, arch)
    with torch.no_grad():
        for j, (module, name) in enumerate(modules):
            qtype = (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q5_0)[j % 2]
            blocks = gguf.quants.quantize(module.weight.float().numpy(), qtype)
            writer.add_tensor(name, blocks, raw_dtype=qtype)
            module.weight.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, qtype)).to(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    attach(model, path, int8=int8)
    target.weights = "gguf-int8" if int8 else "gguf"
    return target


@pytest.fixture(params=ARCHS)
def tiny_target(request) -> LoadedModel:
    return tiny(request.param)


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

