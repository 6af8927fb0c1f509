"""The draft model's own KV cache: after every step it equals a fresh prefill of the tokens the draft has taken
in (the context up to its ``prefix``), whatever was accepted: nothing, a branch off the first path (a compaction),
a whole path down to a leaf, or a repeated sibling (drawn with replacement; only its first copy was expanded).
Gemma-3 (sliding-window and full-attention layers, a context past the tiny model's window of 16) and Llama, in
float32 and bf16, driven step by step with chosen acceptances and end to end through ``generate``.

A wrong cache never changes the output (the target verifies every token), only what gets accepted: these tests
are what catches it.
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import tiny

from specnb.core.draft import Draft
from specnb.core.drafter import DecodeState
from specnb.core.generate import generate
from specnb.drafters.draft_model import DraftModelDrafter, self_draft
from specnb.model import kernels
from specnb.model.forward import forward
from specnb.model.kv_cache import GrowingCache

PROMPT = [ord(c) for c in "def fib(n):\n    return"]  # 23 tokens: past the tiny Gemma's window
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Each step's acceptance: none, a path through second children (slots not a prefix of the cache: a compaction),
# the first path down to its leaf (the leaf was never fed to the draft), and a repeated sibling's path.
STEPS = ("branch", "none", "full", "repeat", "branch", "full", "repeat", "none", "branch", "full")


@functools.cache
def fresh_cache(arch: str, dtype: str, ids: tuple[int, ...]) -> GrowingCache:
    """The self:2 draft's cache after one causal call over ``ids`` from empty."""
    draft = self_draft(tiny(arch, DTYPES[dtype]), 2)
    cache = GrowingCache()
    with torch.inference_mode():
        forward(draft, torch.tensor([ids]), cache=cache)
    return cache


def assert_cache_is_a_fresh_prefill(drafter: DraftModelDrafter, text: list[int], arch: str, dtype: str) -> None:
    """The drafter's cache holds exactly ``text[:prefix]`` (the tokens it took in), as a fresh prefill would.

    Bit for bit on specnb's kernels (every row of a call computes the bits it computes alone); where they are
    not built, PyTorch's GEMMs sum in other orders for other row counts: fp32 to rounding, bf16 to its resolution,
    both far below what a wrong entry changes (another token or position: differences of order 1)."""
    prefix = drafter.prefix
    assert 0 < prefix <= len(text)
    expected = fresh_cache(arch, dtype, tuple(text[:prefix]))
    assert len(drafter.cache.layers) == len(expected.layers)
    if kernels.extension() is not None:
        tolerance = {"atol": 0.0, "rtol": 0.0}
    else:
        tolerance = {"atol": 1e-5, "rtol": 1e-4} if dtype == "fp32" else {"atol": 0.05, "rtol": 0.02}
    for got, want in zip(drafter.cache.layers, expected.layers, strict=True):
        assert got.keys.shape == want.keys.shape, (got.keys.shape, want.keys.shape)
        torch.testing.assert_close(got.keys.float(), want.keys.float(), **tolerance)
        torch.testing.assert_close(got.values.float(), want.values.float(), **tolerance)


def children(tree: Draft, node: int) -> list[int]:
    return torch.nonzero(tree.parents == node).squeeze(1).tolist()


def path_to(tree: Draft, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = int(tree.parents[node])
    return path[::-1]


def repeated(tree: Draft) -> list[int]:
    """Nodes whose token an earlier sibling already holds."""
    seen: set[tuple[int, int]] = set()
    out = []
    for i, pair in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist(), strict=True)):
        if pair in seen:
            out.append(i)
        seen.add(pair)
    return out


def choose(tree: Draft, how: str) -> list[int]:
    """The accepted nodes (path order) for one of the STEPS patterns."""
    if how == "none":
        return []
    if how == "repeat" and repeated(tree):
        copy = repeated(tree)[-1]  # the deepest (last) repeated sibling: its path crosses computed slots
        return path_to(tree, copy)
    node, path = -1, []
    while kids := children(tree, node):
        node = kids[min(1, len(kids) - 1)] if how == "branch" else kids[0]
        path.append(node)
        if how == "branch" and len(path) == 2:  # stop inside the tree: the rest of its slots are dropped
            break
    return path


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("drafting", ["top-k", "sampled"])
def test_draft_cache_equals_a_fresh_prefill_after_every_step(arch: str, dtype: str, drafting: str) -> None:
    """Ten steps of chosen acceptances (none, a branch, a whole path, a repeated sibling) on a self:2 draft's
    trees: top-k siblings at T = 0 (3x2x2), or candidates drawn with replacement at T = 1 (6x3x2), where equal
    siblings occur and only the first copy is expanded. After each update the draft's cache is a fresh prefill of
    the text it took in, and it took in every accepted node it had computed (so nothing is recomputed); at the
    end a greedy drafter's next tree equals a fresh drafter's on the same text."""
    target = tiny(arch, DTYPES[dtype])
    draft = self_draft(target, 2)
    sampled = drafting == "sampled"
    make = lambda: DraftModelDrafter(draft, "6x3x2" if sampled else "3x2x2", target.vocab_size,  # noqa: E731
                                     scheme="mcss" if sampled else "mcss-wor", temperature=1.0 if sampled else 0.0)
    drafter = make()
    text = [*PROMPT, 71]  # the prompt and the root
    drafter.reset(torch.tensor(PROMPT))
    seen = {"none": 0, "branch": 0, "full": 0, "repeat": 0}
    for step, how in enumerate(STEPS):
        tree = drafter.propose(DecodeState(torch.tensor(text), None, max_depth=8, prompt_len=len(PROMPT)))
        nodes = choose(tree, how)
        if how == "repeat" and not repeated(tree):
            how = "full"
        seen[how] += 1
        computed = [n for n in nodes if bool(drafter.tree_slot[n] >= 0)]
        committed = [*tree.tokens[nodes].tolist(), (step * 37 + 11) % 256]  # the accepted tokens and a bonus
        before = len(text)
        with torch.inference_mode():  # as in generate()
            drafter.update(torch.tensor(committed), torch.tensor(nodes, dtype=torch.long))
        text += committed
        # the draft took in the context it was given and every accepted node it had computed, in path order
        assert drafter.prefix == before + len(computed) and computed == nodes[:len(computed)], how
        assert_cache_is_a_fresh_prefill(drafter, text, arch, dtype)
    if sampled:
        assert seen["repeat"] >= 2, seen  # the pattern the sampled trees exist for did occur
    else:
        state = DecodeState(torch.tensor(text), None, max_depth=8, prompt_len=len(PROMPT))
        again, fresh = drafter.propose(state), make().propose(state)
        assert torch.equal(again.tokens, fresh.tokens) and torch.equal(again.parents, fresh.parents)


class Checked(DraftModelDrafter):
    """A draft-model drafter that checks its cache against a fresh prefill after every update."""

    def __init__(self, *args, arch: str, dtype: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.arch, self.dtype, self.checks = arch, dtype, 0

    def propose(self, state: DecodeState) -> Draft | None:
        self.text = state.tokens.tolist()
        return super().propose(state)

    def update(self, committed: torch.Tensor, accepted: torch.Tensor) -> None:
        super().update(committed, accepted)
        assert_cache_is_a_fresh_prefill(self, self.text + committed.tolist(), self.arch, self.dtype)
        self.checks += 1


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_draft_cache_through_generate(arch: str, dtype: str) -> None:
    """End to end: greedy mcsd with self:2 (4x2x2, MCSS at T = 1 with replacement: repeated siblings), 40
    tokens past the window; after every step the draft's cache is a fresh prefill of what it took in, and the
    run both accepted drafts and rejected some."""
    target = tiny(arch, DTYPES[dtype])
    drafter = Checked(self_draft(target, 2), "4x2x2", target.vocab_size, scheme="mcss", temperature=1.0,
                      arch=arch, dtype=dtype)
    out = generate(target, PROMPT, drafter, max_new_tokens=40)
    assert out.tokens == generate(target, PROMPT, max_new_tokens=40).tokens
    accepted = [c.accepted for c in out.stats.calls]
    assert drafter.checks == len(accepted) and 0 < sum(accepted) and min(accepted) < 3


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("scheme", ["mcss", "mcss-wor"])
def test_every_candidates_q_is_the_drafts_distribution_at_its_parent(arch: str, scheme: str) -> None:
    """MCSS needs, for every node, the exact distribution its sibling group was drawn from. Each node's ``q``
    (from the draft's tree calls on its own cache, after a step that kept part of a tree) equals the draft's
    probabilities at the node's parent computed afresh (the context and the path to the parent, one causal call),
    at the draft's temperature and top-p (0.7, 0.9: not the target's), and each node's token lies in that
    support. A q of the wrong row or temperature moves the sampled distribution only where the walk reaches it
    (two levels down, through a sibling that is not the first): a distribution test sees it rarely, this one at
    once."""
    from specnb.core.sampling import SamplingConfig, probabilities

    target = tiny(arch)
    draft = self_draft(target, 2)
    drafter = DraftModelDrafter(draft, "3x2x2", target.vocab_size, scheme=scheme, temperature=0.7, top_p=0.9,
                                seed=2)
    text = [*PROMPT, 71]
    drafter.reset(torch.tensor(PROMPT))
    tree = drafter.propose(DecodeState(torch.tensor(text), None, max_depth=8, prompt_len=len(PROMPT)))
    nodes = choose(tree, "branch")  # keep a branch: the next tree is drawn on a compacted cache
    committed = [*tree.tokens[nodes].tolist(), 5]
    with torch.inference_mode():
        drafter.update(torch.tensor(committed), torch.tensor(nodes, dtype=torch.long))
    text += committed
    tree = drafter.propose(DecodeState(torch.tensor(text), None, max_depth=8, prompt_len=len(PROMPT)))
    assert tree.q is not None and tree.max_depth == 3
    config = SamplingConfig(0.7, 0.9)
    for i in range(tree.num_nodes):
        parent_path = path_to(tree, int(tree.parents[i])) if tree.parents[i] >= 0 else []
        ids = torch.tensor([text + tree.tokens[parent_path].tolist()])
        with torch.inference_mode():
            logits = forward(draft, ids, last_only=True)[0][0, -1]
        expected = probabilities(logits, config)
        torch.testing.assert_close(tree.q[i].float(), expected, rtol=1e-4, atol=1e-6)
        assert expected[tree.tokens[i]] > 0, i
