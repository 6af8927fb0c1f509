"""The loop on a real CUDA device (skipped without one; CI has none): greedy speculative decoding gives greedy
AR's tokens there in fp32, and in bf16 differs only at near ties; specnb's decoder on PyTorch's ops is as close to
fp32 as Hugging Face's.

tests/test_device.py checks device placement on a pretend device; this file checks what only a GPU computes:
cuBLAS and SDPA's rounding on the rows a verification call adds."""

from __future__ import annotations

import pytest
import torch

from specnb.core.generate import generate
from specnb.core.prompts import encode_prompt
from specnb.draft_shapes import SelfDraft
from specnb.drafters.draft_model import DraftModelDrafter, load_draft
from specnb.eval.methods import make_drafter
from specnb.model.backend import HFModules
from specnb.model.models import LoadedModel, byte_tokenizer, load_model, stock

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "the cat sat on the mat. the cat sat on"]
NEW_TOKENS = 40


def drafter(family: str, target: LoadedModel):
    if family in ("pld", "ngram-unigram"):
        return make_drafter(family, target)
    scheme, shape = {"sd": ("mcss", "3x1x1"), "mcsd": ("mcss-wor", "3x2x1")}[family]
    return DraftModelDrafter(load_draft(target, SelfDraft(2)), shape, target.vocab_size, scheme=scheme)


def margin(target: LoadedModel, prompt: str, tokens: list[int], a: int, b: int) -> float:
    """|logit a - logit b| over the largest |logit| after ``prompt`` + ``tokens``, from one forward pass of the
    whole sequence: how near a tie the two tokens are."""
    ids = torch.cat([encode_prompt(target, prompt), torch.tensor(tokens, dtype=torch.long)]).to("cuda")
    with torch.no_grad():
        logits = target.model(input_ids=ids[None]).logits[0, -1].float()
    return float((logits[a] - logits[b]).abs() / logits.abs().max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("verify", ["tree", "batch"])
@pytest.mark.parametrize("family", ["pld", "ngram-unigram", "sd", "mcsd"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_greedy_speculation_on_cuda_gives_ar_tokens(arch, family, verify, dtype):
    """fp32: AR's tokens exactly. bf16: cuBLAS and SDPA do not give a row the same bits in a call of one row and
    in a call of several, so a verified token may differ from AR's, but only where AR's top two tokens are
    within bf16 rounding of each other (a wrong cache or acceptance would differ anywhere)."""
    target = load_model(f"tiny-{arch}", dtype=dtype, device="cuda")
    accepted = calls = 0
    for prompt in PROMPTS:
        ar = generate(target, prompt, None, max_new_tokens=NEW_TOKENS).tokens
        out = generate(target, prompt, drafter(family, target), max_new_tokens=NEW_TOKENS, verify=verify)
        accepted += sum(call.accepted for call in out.stats.calls)  # drafted tokens accepted, not generated ones
        calls += out.stats.num_calls
        if out.tokens != ar and dtype == "bfloat16":
            i = next(i for i, (x, y) in enumerate(zip(out.tokens, ar, strict=False)) if x != y)
            near = margin(target, prompt, ar[:i], ar[i], out.tokens[i])
            print(f"{arch} {family} {verify} {dtype}: differs from AR at token {i}, margin {near:.2e}")
            assert near < 1e-2, (prompt, family, i)
        else:
            assert out.tokens == ar, (prompt, family)
    print(f"{arch} {family} {verify} {dtype}: {accepted / calls:.2f} drafted tokens accepted a call")
    if family in ("sd", "mcsd"):  # the target's own first layers: some of their drafts are the target's
        assert accepted > 0, f"{arch} {family} {verify} {dtype}: no draft accepted in {calls} calls"


@pytest.mark.parametrize("shape", ["gemma-3-270m", "qwen2.5-1.5b"])
def test_specnb_decoder_on_cuda_is_as_close_to_fp32_as_hugging_faces(shape):
    """Random weights through 18-28 layers amplify bf16 rounding, so the bound is Hugging Face's own distance
    from the fp32 computation of the same weights, not a fixed tolerance."""
    import copy

    from specnb.datastores.embed import last_hidden_states
    from specnb.eval.timing import random_model

    target = LoadedModel.of(random_model(shape, "bfloat16", "cuda"), byte_tokenizer(), f"random:{shape}")
    wide = copy.deepcopy(target.model).float()
    ids = torch.randint(0, 32000, (2, 700), device="cuda")  # longer than Gemma-3's 512-token window
    mask = torch.ones_like(ids)
    reference = last_hidden_states(LoadedModel(wide, target.tokenizer, target.name, HFModules.of(wide)), ids,
                                   mask).float()
    ours = last_hidden_states(target, ids, mask).float()
    theirs = last_hidden_states(stock(target), ids, mask).float()

    def distance(x: torch.Tensor) -> float:
        return float((x - reference).norm() / reference.norm())

    print(f"{shape}: from fp32, specnb {distance(ours):.2e}, Hugging Face {distance(theirs):.2e}")
    assert distance(ours) < 1.5 * distance(theirs)


def test_a_roofline_table_replays_its_calls_from_cuda_graphs():
    """``specnb roofline --cuda-graphs``: every cell captured and replayed, the table whole, and a tiny model's
    replayed calls cheaper than its eager ones (those are bound by launching kernels from Python)."""
    from specnb.eval.timing import Grid, time_cells

    target = load_model("tiny-llama", dtype="float32", device="cuda")
    grid = Grid((1, 2), (0, 3), (16,), repeats=3)
    graphed = time_cells(target, grid, progress=False, graphs=True)
    eager = time_cells(target, grid, progress=False)
    assert len(graphed) == len(eager) == 4 and (graphed.seconds > 0).all() and graphed.slowdown.notna().all()
    assert graphed.seconds.median() < eager.seconds.median()
