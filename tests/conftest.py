"""Shared fixtures: tiny random models (float32 unless asked for bf16, built in code, cached per session)."""

from __future__ import annotations

import functools
import os

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
