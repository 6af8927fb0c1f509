"""Draft-model drafters (vanilla SD and MCSD): greedy losslessness, the draft's KV cache, vocabulary checks."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from conftest import ARCHS, gemma, tiny

from specnb.core.datasets import humaneval
from specnb.core.generate import generate
from specnb.draft_shapes import SelfDraft, parse_draft, tree_shape
from specnb.drafters.draft_model import (
    DraftModelDrafter,
    SdOptions,
    VocabularyError,
    check_vocabulary,
    load_draft,
    self_draft,
)
from specnb.eval.methods import make_drafter
from specnb.model.models import LoadedModel, byte_tokenizer
from specnb.paths import cache_dir

PROMPT = torch.tensor([ord(c) for c in "def fib(n):\n    return"])  # 23 tokens: longer than gemma3's window 16


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@functools.cache
def ar_tokens(arch: str, max_new_tokens: int = 32) -> list[int]:
    return generate(tiny(arch), PROMPT, None, max_new_tokens=max_new_tokens).tokens


# A chain runs as a plain causal call in both verify modes, so sd is checked in tree mode only.
@pytest.mark.parametrize("method,shape,scheme,verify", [
    ("sd", "1x1x1", "mcss", "tree"), ("mcsd", "4x2x2x1", "mcss-wor", "tree"),
    ("mcsd", "4x2x2x1", "mcss-wor", "batch"), ("mcsd", "3x2", "mcss", "tree")])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_output_equals_ar(arch, method, shape, scheme, verify):
    target = tiny(arch)
    options = {"draft": "self:2", "draft_shape": shape, "scheme": scheme}
    out = generate(target, PROMPT, make_drafter(method, target, options), max_new_tokens=32, verify=verify)
    assert out.tokens == ar_tokens(arch)
    assert out.stats.tokens_per_call > 1.0, "the target's own first layers: some of their drafts are accepted"


def test_greedy_with_sampled_candidates_is_lossless():
    """A draft sampling at temperature 1 (carrying q) under a greedy target still gives the AR output."""
    target = tiny("gemma3")
    drafter = DraftModelDrafter(self_draft(target, 2), "4x2x2", target.vocab_size, temperature=1.0)
    assert generate(target, PROMPT, drafter, max_new_tokens=32).tokens == ar_tokens("gemma3")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_draft_cache_is_kept_not_recomputed(arch):
    """With the target as its own draft every chain is accepted, which needs a correct draft cache; the
    draft sees each context token once plus the tree nodes, never the whole context again."""
    target = tiny(arch)
    fed: list[int] = []
    hook = target.model.get_input_embeddings().register_forward_pre_hook(  # every model call embeds its ids
        lambda _, args: fed.append(args[0].shape[1]))
    try:
        drafter = DraftModelDrafter(target, "1x1x1x1", target.vocab_size)
        out = generate(target, PROMPT, drafter, max_new_tokens=41)
    finally:
        hook.remove()
    assert out.tokens == ar_tokens(arch, 41)
    assert out.stats.tokens_per_call == 5.0  # depth 4 + bonus, every call
    calls = out.stats.num_calls
    draft_tokens = sum(fed) - PROMPT.shape[0] - calls  # minus the target's own prefill and verify calls
    draft_tokens -= sum(c.drafted_nodes for c in out.stats.calls)  # [root]+draft in verification
    # Per step: level 0 feeds the last accepted leaf + the root, levels 1-3 one node each.
    assert draft_tokens == PROMPT.shape[0] + 5 * calls - 1


def test_self_draft_shares_weights_and_leaves_the_target_alone():
    target = tiny("gemma3")
    draft = self_draft(target, 2)
    assert draft.model.config.num_hidden_layers == 2 and target.model.config.num_hidden_layers == 4
    assert draft.model.get_output_embeddings().weight is target.model.get_output_embeddings().weight
    assert draft.model.model.layers[0] is target.model.model.layers[0]
    assert len(target.model.model.layers) == 4 and draft.model.model is not target.model.model
    # its decoder runs the target's own first layer objects and head: nothing rebuilt, nothing copied
    assert (len(draft.decoder.layers), len(target.decoder.layers)) == (2, 4)
    assert all(a is b for a, b in zip(draft.decoder.layers, target.decoder.layers, strict=False))
    assert draft.decoder.head is target.decoder.head and draft.decoder.norm is target.decoder.norm
    with pytest.raises(ValueError, match="1 <= L < 4"):
        self_draft(target, 4)
    with pytest.raises(ValueError, match="self:L"):
        parse_draft("self:two")
    assert (parse_draft("self:2"), str(SelfDraft(2))) == (SelfDraft(2), "self:2")
    assert parse_draft("tiny-llama") == "tiny-llama"


def test_draft_with_another_vocabulary_is_refused():
    target = tiny("qwen2")
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    other = dataclasses.replace(tiny("llama"), tokenizer=tokenizer, name="other-vocab")
    with pytest.raises(VocabularyError, match="different vocabulary"):
        check_vocabulary(target, other)
    check_vocabulary(target, tiny("llama"))  # same byte tokenizer: accepted


def test_a_draft_of_another_tokenizer_is_refused_before_either_model_loads(monkeypatch, capsys):
    from specnb.cli import main
    from specnb.model import models

    def no_loading(*args, **kwargs):
        raise AssertionError("a model loaded before the draft's tokenizer was checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    assert main(["bench", "--model", "tiny-llama", "--methods", "sd", "--draft", "gemma-3-270m", "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: draft model 'gemma-3-270m' has a different vocabulary (262144 tokens) "
                          "than the target 'tiny-llama'") and err.count("\n") == 1, err
    SdOptions(draft="tiny-qwen2").check("tiny-llama")  # the same byte tokenizer: accepted


def test_bad_shapes_and_options():
    assert tree_shape("4x2x2x1") == (4, 2, 2, 1)
    for bad in ("", "4x0", "2xx1", "a"):
        with pytest.raises(ValueError, match="invalid draft shape"):
            tree_shape(bad)
    target = tiny("llama")
    with pytest.raises(ValueError, match="use mcsd"):
        make_drafter("sd", target, {"draft": "self:2", "draft_shape": "2x1"})
    with pytest.raises(ValueError, match="scheme"):
        make_drafter("mcsd", target, {"draft": "self:2", "scheme": "best"})


@pytest.mark.slow
@pytest.mark.skipif(not (cache_dir() / "models" / "gemma-3-270m" / "config.json").exists(),
                    reason="run `specnb models fetch gemma-3-270m` (make test does)")
def test_gemma_self_draft_is_lossless_past_the_sliding_window():
    """Gemma-3-270M drafting for itself with self:6 (5 sliding-window layers) on a > 512-token context."""
    target = gemma("float32", "bf16")  # named, not auto: no timing of the weights, the load test_real_model makes
    prompt = "\n".join(p.text for p in humaneval(12)[3:12])
    assert len(target.tokenizer(prompt).input_ids) > 600
    ar = generate(target, prompt, max_new_tokens=16).tokens
    drafter = DraftModelDrafter(load_draft(target, SelfDraft(6)), "4x2x1", target.vocab_size)
    assert generate(target, prompt, drafter, max_new_tokens=16).tokens == ar


def truncated_reference(target: LoadedModel, layers: int) -> LoadedModel:
    """Hugging Face's own model of the target's first ``layers`` layers (same weights, stock attention), loaded as
    any model is (its own decoder over its own weights): what a self-draft must compute."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    config._attn_implementation = "sdpa"
    dtype = target.dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(dtype).eval()  # as tiny_model builds it
    missing, _ = model.load_state_dict(target.model.state_dict(), strict=False)
    assert not missing
    return LoadedModel.of(model, target.tokenizer, f"{target.name}-{layers}-layers")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch,layers", [("llama", 2), ("qwen2", 1), ("gemma3", 2), ("gemma3", 1)])
def test_self_draft_runs_its_own_layers_after_the_target_ran(arch, layers, dtype):
    """A self:L draft computes the L-layer model on the kernel path, also once the target has run (a decoder
    body cached on the model object the draft is a shallow copy of once ran the target's layers), and its logits
    differ from the target's. gemma3 self:1 keeps only a sliding-window layer: the target's full-attention layers
    must not run.
    A 40-token prompt, then single tokens, through the draft's own cache (the tiny Gemma's window is 16). The
    reference: an L-layer model of the same weights, on specnb's decoder bit for bit and on Hugging Face's
    within fp32 summation order."""
    from transformers import DynamicCache

    from specnb.model.forward import forward
    from specnb.model.kv_cache import GrowingCache

    target = tiny(arch, dtype)
    ids = torch.randint(0, 256, (1, 44), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        target_logits = forward(target, ids[:, :40], cache=GrowingCache())[0]
        draft = self_draft(target, layers)
        reference = truncated_reference(target, layers)
        cache, ref_cache, hf_cache = GrowingCache(), GrowingCache(), DynamicCache(config=reference.model.config)
        calls = [ids[:, :40]] + [ids[:, i:i + 1] for i in range(40, 44)]  # then the decoding calls (C++ stack)
        for call in calls:
            logits, hidden = forward(draft, call, cache=cache)
            assert torch.equal(hidden, forward(reference, call, cache=ref_cache)[1])
            if dtype == torch.float32:  # Hugging Face's decoder: only the summation order differs
                want = reference.model.model(call, cache=hf_cache, use_cache=True).last_hidden_state
                torch.testing.assert_close(hidden, want, rtol=1e-5, atol=1e-4)
            if call.shape[1] == 40:
                gap = (logits.float() - target_logits.float()).abs().amax()
                assert gap > 0.1 * target_logits.float().abs().amax(), "the draft computes the target's logits"
    assert cache.get_seq_length() == 44


@pytest.mark.parametrize("method", ["sd", "mcsd"])
def test_self_draft_accepts_some_but_not_all_at_temperature_one(method):
    """At T = 1 a draft that is not the target has its drafts rejected now and then: a draft that accepts
    everything is the target (the cached-body bug), one that accepts nothing drafts garbage."""
    target = tiny("gemma3")
    generate(target, PROMPT, max_new_tokens=2)  # the target has run before its self-draft is made
    drafter = make_drafter(method, target, {"draft": "self:2", "temperature": 1.0})
    stats = generate(target, PROMPT, drafter, max_new_tokens=48, temperature=1.0, seed=3).stats
    assert 0 < sum(c.accepted for c in stats.calls) < sum(c.draft_depth for c in stats.calls)


@pytest.mark.slow
@pytest.mark.skipif(not (cache_dir() / "models" / "gemma-3-270m" / "config.json").exists(),
                    reason="run `specnb models fetch gemma-3-270m` (make test does)")
@pytest.mark.parametrize("method", ["sd", pytest.param("mcsd", marks=pytest.mark.repeat)])  # both: tiny, above
def test_gemma_self_draft_is_not_the_target_on_chat(method):
    """Gemma-3-270M (bf16, the kernel path) with self:6 on an MT-Bench prompt at T = 1: the 6-layer draft agrees
    with the 18-layer target on far fewer than all of its tokens (it accepted everything while it ran the
    target's cached body)."""
    from specnb.core.datasets import mtbench

    target = gemma("bfloat16", "bf16")
    generate(target, "Hello", max_new_tokens=2)  # the target has run before its self-draft is made
    drafter = make_drafter(method, target, {"draft": "self:6", "temperature": 1.0})
    stats = generate(target, mtbench(1)[0], drafter, max_new_tokens=32, temperature=1.0, seed=0).stats
    assert stats.acceptance_rate < 0.9
