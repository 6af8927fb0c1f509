"""Greedy speculative decoding must reproduce greedy AR decoding token for token, whatever the draft, in
float32 and in bf16 (where it holds because every row of a call computes the bits it computes alone).

An "oracle" drafter knows the AR reference output and builds trees from it with random corruption:
random tokens, wrong branches, EOS, empty drafts, deep chains and wide bushes. Hypothesis picks the shape.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from conftest import ARCHS, DTYPES, tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specnb import Draft, generate
from specnb.core.drafter import DecodeState, Drafter
from specnb.drafters.context import ContextNgramDrafter

MAX_NEW = 40
PROMPTS = {
    "short": [256, 10, 20, 30],
    # longer than tiny Gemma3's sliding window (16), repetitive so prompt lookup finds matches
    "long": [256] + list(range(40, 60)) * 3,
}


@functools.cache
def reference(arch: str, prompt: str, dtype: torch.dtype = torch.float32) -> list[int]:
    """Greedy AR tokens (EOS disabled so the run is always MAX_NEW long)."""
    return generate(tiny(arch, dtype), PROMPTS[prompt], max_new_tokens=MAX_NEW, stop_at_eos=False).tokens


class OracleDrafter(Drafter):
    """Proposes trees mixing the true continuation with noise; shape parameters drawn per step from ``rng``."""

    def __init__(self, truth: list[int], prompt_len: int, seed: int, width: int, depth: int, noise: float,
                 eos: int | None = None):
        self.truth, self.prompt_len = truth, prompt_len
        self.rng = np.random.default_rng(seed)
        self.width, self.depth, self.noise, self.eos = width, depth, noise, eos

    def propose(self, state: DecodeState) -> Draft | None:
        if self.rng.random() < 0.1:
            return None
        done = state.tokens.shape[0] - self.prompt_len  # tokens generated so far (root included)
        true_next = self.truth[done:done + self.depth]
        rows = []
        for _ in range(self.rng.integers(1, self.width + 1)):
            length = int(self.rng.integers(0, self.depth + 1))
            row = list(true_next[:length])
            for i in range(len(row)):
                if self.rng.random() < self.noise:
                    row[i] = int(self.rng.integers(0, 320))
            if self.eos is not None and row and self.rng.random() < 0.3:
                row[int(self.rng.integers(0, len(row)))] = self.eos
            rows.append(row)
        return Draft.from_rows(rows)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(ARCHS), prompt=st.sampled_from(sorted(PROMPTS)), mode=st.sampled_from(["tree", "batch"]),
       seed=st.integers(0, 2**31), width=st.integers(1, 8), depth=st.integers(1, 12), noise=st.floats(0, 0.6),
       dtype=st.sampled_from(DTYPES))
def test_random_trees_are_lossless(arch, prompt, mode, seed, width, depth, noise, dtype):
    truth = reference(arch, prompt, dtype)
    drafter = OracleDrafter(truth, len(PROMPTS[prompt]), seed, width, depth, noise)
    out = generate(tiny(arch, dtype), PROMPTS[prompt], drafter, max_new_tokens=MAX_NEW, verify=mode,
                   stop_at_eos=False)
    assert out.tokens == truth


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["tree", "batch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_deep_and_wide_trees(arch, mode, dtype):
    """A perfect 12-deep chain, a 16-wide bush of mostly wrong rows, and full acceptance all the way."""
    truth = reference(arch, "long", dtype)
    for width, depth, noise in [(1, 12, 0.0), (16, 3, 0.8), (6, 10, 0.1)]:
        drafter = OracleDrafter(truth, len(PROMPTS["long"]), 7, width, depth, noise)
        out = generate(tiny(arch, dtype), PROMPTS["long"], drafter, max_new_tokens=MAX_NEW, verify=mode,
                       stop_at_eos=False)
        assert out.tokens == truth
    assert max(c.accepted for c in out.stats.calls) >= 5  # the oracle does get long accepts


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["tree", "batch"])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_prompt_lookup_is_lossless(arch, mode, k, dtype):
    truth = reference(arch, "long", dtype)
    drafter = ContextNgramDrafter(k=k, w=6)
    out = generate(tiny(arch, dtype), PROMPTS["long"], drafter, max_new_tokens=MAX_NEW, verify=mode,
                   stop_at_eos=False)
    assert out.tokens == truth


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["tree", "batch"])
def test_eos_accepted_mid_block(arch, mode):
    """Make the 10th AR token an EOS: SD must stop right there even when EOS sits inside an accepted draft."""
    truth = reference(arch, "long")
    eos = truth[9]
    target = dataclasses.replace(tiny(arch), eos_token_ids=frozenset({eos}))
    expected = truth[:truth.index(eos) + 1]
    ar = generate(target, PROMPTS["long"], max_new_tokens=MAX_NEW)
    assert ar.tokens == expected and ar.stop_reason == "eos"
    for seed in range(4):
        drafter = OracleDrafter(truth, len(PROMPTS["long"]), seed, width=3, depth=12, noise=0.05, eos=eos)
        out = generate(target, PROMPTS["long"], drafter, max_new_tokens=MAX_NEW, verify=mode)
        assert out.tokens == expected and out.stop_reason == "eos"


@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_never_exceeds_max_new_tokens(max_new):
    truth = reference("llama", "long")
    drafter = OracleDrafter(truth, len(PROMPTS["long"]), 3, width=2, depth=12, noise=0.0)
    out = generate(tiny("llama"), PROMPTS["long"], drafter, max_new_tokens=max_new, stop_at_eos=False)
    assert out.tokens == truth[:max_new]
    assert out.stats.new_tokens == max_new and out.stop_reason == "max_new_tokens"


def test_model_without_eos_runs_to_max_tokens():
    target = dataclasses.replace(tiny("qwen2"), eos_token_ids=frozenset())
    out = generate(target, PROMPTS["short"], ContextNgramDrafter(), max_new_tokens=25)
    assert out.stop_reason == "max_new_tokens"
    assert out.tokens == generate(target, PROMPTS["short"], max_new_tokens=25).tokens and len(out.tokens) == 25


def test_matches_hugging_face_generate(tiny_target):
    """Our AR loop agrees with transformers' own greedy generate (including Gemma3's sliding window)."""
    ids = torch.tensor([PROMPTS["long"]])
    hf = tiny_target.model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                                    pad_token_id=258, min_new_tokens=MAX_NEW)
    assert hf[0, ids.shape[1]:].tolist() == reference(tiny_target.name.removeprefix("tiny-"), "long")
