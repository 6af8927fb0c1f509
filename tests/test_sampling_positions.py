"""Sampled speculative decoding follows the target's distribution at every position of a block, not only the
first: deterministic trees in tree and batch verification, top_p < 1, Gemma-3 past its sliding window, MCSS with a
draft temperature other than the target's (with and without replacement), ``mcns`` end to end. The test and its
power are described in :mod:`exact_sampling` (300 runs, tokens 1..4 against the target's exact conditionals).
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import kernel_path_exists, tiny, tiny_gguf
from exact_sampling import ALPHA, LONG, POSITIONS, SHORT, assert_matches, sample_and_test

from specnb.core.sampling import SamplingConfig
from specnb.drafters.draft_model import DraftModelDrafter, self_draft
from specnb.drafters.recycle import RecycleDrafter


@functools.cache
def shared_recycle(arch: str) -> RecycleDrafter:
    """One Token Recycling drafter per target, shared by the runs (its table learns the target's successors, so
    its trees hold likely tokens several levels deep)."""
    return RecycleDrafter(tiny(arch).vocab_size, max_nodes=16)


@pytest.mark.parametrize("arch,prompt,verify,temperature,top_p", [
    pytest.param("gemma3", LONG, "tree", 0.8, 0.9, id="gemma3-window-tree-top_p"),
    pytest.param("llama", SHORT, "batch", 1.0, 0.5, id="llama-batch-top_p"),
])
def test_deterministic_drafts_sample_like_the_target(arch: str, prompt: list[int], verify: str, temperature: float,
                                                      top_p: float) -> None:
    """Deterministic trees (Token Recycling's, up to 16 nodes, no q): one target draw per node on the walk. Tree
    verification on Gemma-3 with a prompt past its sliding window, batch verification on Llama, both with
    top_p < 1. Power: :mod:`exact_sampling` (300 runs, tokens 1..4; a 0.06 shift at every position, 0.13-0.15 at
    one)."""
    result = sample_and_test(tiny(arch), prompt, lambda: shared_recycle(arch), temperature=temperature, top_p=top_p,
                             verify=verify)
    assert_matches(result, min_deep=100)


@pytest.mark.parametrize("arch,scheme,draft_temperature,temperature,top_p,verify", [
    pytest.param("gemma3", "mcss", 0.6, 1.0, 1.0, "tree", id="mcss-draft-colder-gemma3-window"),
    pytest.param("llama", "mcss-wor", 1.5, 0.8, 0.9, "tree", id="mcss-wor-draft-hotter-top_p"),
    pytest.param("llama", "mcns", 1.0, 1.0, 1.0, "tree", id="mcns"),
])
def test_draft_model_candidates_sample_like_the_target(arch: str, scheme: str, draft_temperature: float,
                                                       temperature: float, top_p: float, verify: str) -> None:
    """MCSD with a self:2 draft (3x2x2 candidates per level, q carried): MCSS with replacement at a draft
    temperature below the target's (Gemma-3, prompt past the window), without replacement above it (with top_p
    < 1), and naive multi-candidate sampling (``mcns``) end to end. Power: :mod:`exact_sampling`
    (300 runs, tokens 1..4; a 0.06 shift at every position, 0.13-0.15 at one)."""
    target = tiny(arch)
    drafter = DraftModelDrafter(self_draft(target, 2), "3x2x2", target.vocab_size, scheme=scheme,
                                temperature=draft_temperature, seed=1)
    prompt = LONG if arch == "gemma3" else SHORT
    result = sample_and_test(target, prompt, lambda: drafter, temperature=temperature, top_p=top_p, verify=verify)
    assert_matches(result, min_deep=60)


def test_the_test_detects_a_sampler_wrong_only_past_the_first_position(monkeypatch) -> None:
    """The test has power where a test of tokens[:2] has none: AR sampling whose tokens 2..4 are drawn at
    temperature 0.8 instead of 1 (token 1 exact) fails it."""
    import specnb.core.generate as decode

    real, calls = decode.accept, {"n": 0}

    def cold_after_the_first(draft, logits, config: SamplingConfig, generator):
        calls["n"] += 1  # AR: call 1 of each generation makes token 1, calls 2..4 tokens 2..4
        if calls["n"] % POSITIONS != 1:
            config = SamplingConfig(0.8, config.top_p)
        return real(draft, logits, config, generator)

    monkeypatch.setattr(decode, "accept", cold_after_the_first)
    biased = sample_and_test(tiny("llama"), SHORT, lambda: None, runs=200)
    assert min(biased.pvalue_by_position, biased.pvalue_pooled) < ALPHA / 2, biased


@pytest.mark.parametrize("where", [
    pytest.param("gguf", id="qwen2-gguf-blocks",
                 marks=pytest.mark.skipif(not kernel_path_exists(), reason="needs an x86 CPU with AVX2 + FMA")),
    pytest.param("bf16", id="gemma3-bf16-window"),
])
def test_mcss_samples_like_the_target_over_the_blocks_and_in_bf16(where: str) -> None:
    """MCSS with a self:2 draft over a tiny Qwen2's GGUF blocks (the path the embedded models take by default)
    and on a bf16 Gemma-3 past its window: the target's distribution at positions 1..4, as in fp32 on dense
    weights. Power: :mod:`exact_sampling`."""
    target = tiny_gguf("qwen2") if where == "gguf" else tiny("gemma3", torch.bfloat16)
    drafter = DraftModelDrafter(self_draft(target, 2), "3x2x2", target.vocab_size, scheme="mcss", temperature=1.0,
                                seed=1)
    prompt = SHORT if where == "gguf" else LONG
    result = sample_and_test(target, prompt, lambda: drafter, temperature=1.0, top_p=1.0, verify="tree")
    assert_matches(result, min_deep=60)
