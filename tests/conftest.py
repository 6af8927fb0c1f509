"""Shared fixtures: tiny random models (float32, built in code, cached per session)."""

from __future__ import annotations

import functools

import pytest

from specnb.models import LoadedModel, tiny_model

ARCHS = ("llama", "qwen2", "gemma3")


@functools.cache
def tiny(arch: str) -> LoadedModel:
    """One tiny model per architecture for the whole session (never mutated by decoding)."""
    return tiny_model(arch)


@pytest.fixture(params=ARCHS)
def tiny_target(request) -> LoadedModel:
    return tiny(request.param)
