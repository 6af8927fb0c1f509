"""verify.py directly: tree and batch logits equal sequential decoding, keep() leaves exactly the cache of the
accepted text, greedy acceptance and its ties; TreeMasks; a draft model's cache after a partial acceptance."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import tiny

from specnb.core.accept import accept_greedy, longest_path, path_accepted
from specnb.core.draft import Draft
from specnb.core.drafter import DecodeState
from specnb.core.generate import generate
from specnb.core.head_rows import PROBE_ROWS, HeadRows, cheapest_rows, rows_at_one_price
from specnb.core.verify import Verifier
from specnb.draft_shapes import SelfDraft
from specnb.drafters.context import ContextNgramDrafter
from specnb.drafters.draft_model import DraftModelDrafter, load_draft
from specnb.drafters.priced import cut as priced_cut
from specnb.model.forward import forward
from specnb.model.kv_cache import GrowingCache
from specnb.model.masks import TreeMasks
from specnb.model.models import LoadedModel

# 24 prompt tokens: longer than the tiny Gemma3's sliding window (16), so its local-layer masks matter.
PROMPT = torch.tensor([5, 17, 42, 99, 3, 250, 8, 61, 77, 12, 140, 33, 200, 9, 64, 128, 7, 19, 88, 101, 45, 2, 230, 56])
ROOT = 71
# root -> 10 -> 11 -> 12, root -> 20 -> 21, 10 -> 13: branching at the root and below it.
TREE = Draft(torch.tensor([10, 11, 12, 20, 21, 13]), torch.tensor([-1, 0, 1, -1, 3, 0]))


@torch.inference_mode()
def fresh_logits(model: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits [L, V] of one causal call over ``ids`` from an empty cache."""
    return forward(model, ids[None])[0][0]


@torch.inference_mode()
def fresh_cache(model: LoadedModel, ids: torch.Tensor) -> GrowingCache:
    cache = GrowingCache()
    forward(model, ids[None], cache=cache)
    return cache


def node_path(draft: Draft, node: int) -> list[int]:
    """Tokens from the first node down to ``node`` (inclusive)."""
    path = []
    while node >= 0:
        path.append(int(draft.tokens[node]))
        node = int(draft.parents[node])
    return path[::-1]


def assert_same_cache(cache: GrowingCache, expected: GrowingCache) -> None:
    for layer, want in zip(cache.layers, expected.layers, strict=True):
        assert layer.keys.shape == want.keys.shape
        torch.testing.assert_close(layer.keys, want.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(layer.values, want.values, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("mode", ["tree", "batch"])
def test_every_node_sees_exactly_its_ancestors(arch, mode):
    """Row i+1 of the call's logits equals a fresh causal call over prompt + root + the path to node i."""
    model = tiny(arch)
    verifier = Verifier(model, mode)
    verifier.prefill(PROMPT)
    verification = verifier.forward(ROOT, TREE)
    context = torch.cat([PROMPT, torch.tensor([ROOT])])
    torch.testing.assert_close(verification.logits[0], fresh_logits(model, context)[-1], atol=1e-4, rtol=1e-4)
    for node in range(TREE.num_nodes):
        expected = fresh_logits(model, torch.cat([context, torch.tensor(node_path(TREE, node))]))[-1]
        torch.testing.assert_close(verification.logits[node + 1], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("mode", ["tree", "batch"])
@pytest.mark.parametrize("accepted", [[3, 4], [0, 5], [0, 1, 2], []])
def test_keep_leaves_the_cache_of_the_accepted_text(arch, mode, accepted):
    """After keep(), the cache equals a fresh prefill of prompt + root + accepted tokens (non-contiguous
    nodes included), and the next call's logits equal a fresh call's."""
    model = tiny(arch)
    verifier = Verifier(model, mode)
    verifier.prefill(PROMPT)
    verifier.forward(ROOT, TREE)
    nodes = torch.tensor(accepted, dtype=torch.long)
    with torch.inference_mode():  # as in generate(): the cache is compacted in place
        verifier.keep(nodes)
    text = torch.cat([PROMPT, torch.tensor([ROOT]), TREE.tokens[nodes]])
    assert verifier.cache_len == text.shape[0]
    assert_same_cache(verifier.cache, fresh_cache(model, text))
    after = verifier.forward(7, Draft.chain([8]))
    expected = fresh_logits(model, torch.cat([text, torch.tensor([7, 8])]))[-2:]
    torch.testing.assert_close(after.logits[:], expected, atol=1e-4, rtol=1e-4)


def test_greedy_acceptance_follows_the_argmax_and_breaks_ties_by_lowest_id():
    vocab = 32
    logits = torch.full((TREE.num_nodes + 1, vocab), -1.0)
    logits[0, [10, 20]] = 5.0  # a tie at the root: the target's token is the lower id, 10
    logits[1, 13] = 5.0  # after 10 the target says 13 (node 5), not 11 (node 1)
    logits[6, 30] = 5.0  # after 13: the bonus
    result = accept_greedy(TREE, logits)
    assert result.nodes.tolist() == [0, 5] and result.bonus == 30
    logits[0, 20] = 6.0  # now 20 wins at the root; 21 is not the argmax after it
    logits[4, 3] = 5.0
    result = accept_greedy(TREE, logits)
    assert result.nodes.tolist() == [3] and result.bonus == 3
    nothing = accept_greedy(TREE, torch.zeros(TREE.num_nodes + 1, vocab))  # all tied: token 0, in no node
    assert nothing.nodes.tolist() == [] and nothing.bonus == 0
    # Equally long accepted paths: the one through the earliest nodes wins.
    twins = Draft(torch.tensor([4, 4, 6]), torch.tensor([-1, -1, 1]))
    logits = torch.zeros(4, vocab)
    logits[:, 4] = 1.0
    assert accept_greedy(twins, logits).nodes.tolist() == [0]


def test_greedy_acceptance_of_a_chain_stops_at_its_first_miss():
    """A chain (node i's parent is row i) is compared token by token: accepted up to the first node that is not the
    argmax of its row, the bonus that row's argmax (the last row's when every node passed); ties go to the lower id.
    The same draft as a one-child-per-level tree, read through the general walk, gives the same answer."""
    vocab = 32
    chain = Draft.chain([4, 9, 2])
    logits = torch.zeros(4, vocab)
    logits[0, 4] = logits[1, 9] = 1.0  # nodes 0 and 1 pass
    logits[2, [5, 7]] = 1.0  # row 2 says 5 (the lower of a tie), not the drafted 2
    for draft in (chain, Draft(chain.tokens, torch.tensor([-1, 0, 1]))):
        result = accept_greedy(draft, logits)
        assert result.nodes.tolist() == [0, 1] and result.bonus == 5
    logits[2, 2] = 2.0
    logits[3, 11] = 1.0
    result = accept_greedy(chain, logits)  # every node passes: the bonus is the last row's argmax
    assert result.nodes.tolist() == [0, 1, 2] and result.bonus == 11 and result.nodes.dtype == torch.long
    logits[0, 6] = 3.0
    assert accept_greedy(chain, logits).nodes.tolist() == [] and accept_greedy(chain, logits).bonus == 6


class RowReads:
    """Logits [n+1, V] on the CPU that record the rows read from them, and fail at once when a row is read a second
    time (a level walk that reads a row again would walk that level again, forever)."""

    def __init__(self, logits: torch.Tensor):
        self.logits, self.device, self.rows = logits, logits.device, []

    def __getitem__(self, index):
        rows = torch.arange(self.logits.shape[0])[index].reshape(-1).tolist()
        assert not set(rows) & set(self.rows), f"rows {rows} read again (read before: {self.rows})"
        self.rows += rows
        return self.logits[index]


def test_greedy_acceptance_by_levels_matches_the_rule_over_all_rows():
    """accept_greedy reads the argmax only of rows whose node passed; on random trees with duplicate siblings
    it gives what the rule over every row gives (the deepest passing node, earliest on ties), reading the root's
    row and the row of every node whose whole path passes, each once."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        n = int(torch.randint(1, 14, (1,), generator=gen))
        parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)])
        draft = Draft(torch.randint(0, 3, (n,), generator=gen), parents)  # 3 tokens: many passes and twins
        logits = torch.randn(n + 1, 3, generator=gen)
        predicted = logits.max(-1).indices
        ok = draft.tokens == predicted[draft.parents + 1]
        want = longest_path(draft, ok)
        reads = RowReads(logits)
        got = accept_greedy(draft, reads)
        assert got.nodes.tolist() == want.tolist()
        assert got.bonus == int(predicted[int(want[-1]) + 1 if want.numel() else 0])
        assert sorted(reads.rows) == [0] + (torch.nonzero(path_accepted(draft, ok)).squeeze(1) + 1).tolist()


class CountingHead:
    """A head ``hidden @ weight.T`` that records the rows of every call."""

    def __init__(self, weight: torch.Tensor):
        self.weight, self.calls = weight, []

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.calls.append(hidden.shape[0])
        return hidden @ self.weight.T


def test_head_rows_computes_the_rows_read_then_the_rest_in_two_calls():
    """HeadRows gives every index what the whole head call gives, computing rows 0 .. max(first, highest read) - 1
    at the first read and the rest at the first read past them; never a third call."""
    gen = torch.Generator().manual_seed(3)
    # small integers: every product and sum exact, so any split of the rows gives the same values
    hidden, weight = (torch.randint(-9, 10, shape, generator=gen).double() for shape in ((9, 4), (5, 4)))
    whole = hidden @ weight.T
    reads = [0, slice(1, 3), torch.tensor([2, 0]), -1, torch.tensor([8, 1, 3]), slice(0, 9), slice(5, 8),
             slice(2, 7), torch.tensor([], dtype=torch.long)]
    for first in range(1, 11):
        for start in range(len(reads)):
            head = CountingHead(weight)
            rows = HeadRows(hidden, head, first)
            order = reads[start:] + reads[:start]
            for index in order:
                assert torch.equal(rows[index], whole[index])
            highest = torch.arange(9)[order[0]].reshape(-1).tolist() or [0]  # the rows the first read asks for
            prefix = min(max(first, max(highest) + 1), 9)
            assert head.calls == ([prefix] if prefix == 9 else [prefix, 9 - prefix])
    head = CountingHead(weight)
    rows = HeadRows(hidden, head, 3)
    assert torch.equal(rows[1], whole[1]) and torch.equal(rows[0:3], whole[:3]) and head.calls == [3]
    assert rows.computed == 3 and len(rows) == 9
    with pytest.raises(IndexError):
        rows[9]
    # a row of the second call is read as a view of it (acceptance reads one row at a time): no copy of the rest
    assert rows[7].untyped_storage().data_ptr() == rows[4:6].untyped_storage().data_ptr() != \
        rows[1].untyped_storage().data_ptr()


def test_the_head_computes_as_many_rows_together_as_cost_one_rows_price():
    """The rule, and the measurement (once per head)."""
    assert cheapest_rows({1: 10.0, 2: 10.1, 3: 10.2, 4: 11.4, 6: 17.0, 8: 19.0, 16: 35.0}) == 4
    assert cheapest_rows({1: 10.0, 2: 12.0, 4: 20.0}) == 1
    assert cheapest_rows({1: 1.0, 4: 0.9, 16: 1.1}) == 16
    head = CountingHead(torch.randn(7, 4))
    rows = rows_at_one_price(head, torch.zeros(1, 4))  # imported before conftest's fixture replaced it: the real one
    assert rows in PROBE_ROWS and rows_at_one_price(head, torch.zeros(1, 4)) == rows
    assert head.calls == list(PROBE_ROWS) * 4  # measured once: a warm-up and three timed passes


def test_a_call_splits_its_head_unless_the_draft_asks_for_all_rows():
    """A verification call's head computes two rows first (conftest's stand-in for this machine's measurement), or all
    of them when the draft is marked ``all_rows``, as a priced cut is (kept through truncation and merging)."""
    verifier = Verifier(tiny("llama"))
    verifier.prefill(PROMPT)
    assert verifier.forward(ROOT, TREE).logits.first == 2
    cut = priced_cut(TREE, 5)
    assert cut.all_rows and cut.num_nodes == 5 and cut.truncate(1).all_rows and Draft.chain([4]).merge(cut).all_rows
    verifier.keep(torch.empty(0, dtype=torch.long))
    assert verifier.forward(ROOT, cut).logits.first == 6


def walk_up(draft: Draft, node: int) -> list[int]:
    """The nodes from the root's child down to ``node``, found by following parents one by one (the reference)."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(draft.parents[node])
    return path[::-1]


def test_path_acceptance_and_truncation_match_a_walk_up_the_tree():
    """path_accepted (a node and all its ancestors pass) and truncate (depth and node-count cuts, renumbered
    parents, depths carried over) on random trees, against walking up the parents node by node."""
    gen = torch.Generator().manual_seed(1)
    draw = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731
    for _ in range(300):
        n = draw(1, 16)
        draft = Draft(torch.randint(0, 4, (n,), generator=gen), torch.tensor([draw(-1, i) for i in range(n)]))
        ok = torch.rand(n, generator=gen) < 0.6
        assert path_accepted(draft, ok).tolist() == [bool(ok[walk_up(draft, i)].all()) for i in range(n)]
        max_depth, max_nodes = draw(1, 6), draw(0, n + 2)
        cut = draft.truncate(max_depth, max_nodes)
        kept = [i for i in range(min(n, max_nodes)) if len(walk_up(draft, i)) <= max_depth]
        tokens_down_to = lambda d, i: d.tokens[walk_up(d, i)].tolist()  # noqa: E731
        assert [tokens_down_to(cut, j) for j in range(cut.num_nodes)] == [tokens_down_to(draft, i) for i in kept]
        assert cut.depth.tolist() == [len(walk_up(draft, i)) for i in kept]
        assert (cut is draft) == (len(kept) == n)


def test_a_merged_tree_holds_the_paths_of_both_and_no_path_twice():
    """Draft.merge on random pairs of trees: the set of root-to-node token paths is the union of the two, each
    path once; the first tree's nodes come first, unchanged; a tree merged with its own subtree is itself."""
    gen = torch.Generator().manual_seed(2)
    draw = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=gen))  # noqa: E731

    def trie(n: int) -> Draft:  # random rows of tokens 0..2: the trie has no repeated (parent, token)
        return Draft.from_rows([[draw(0, 3) for _ in range(draw(1, 5))] for _ in range(n)])

    def paths(d: Draft) -> list[tuple[int, ...]]:
        return [tuple(d.tokens[walk_up(d, i)].tolist()) for i in range(d.num_nodes)]

    for _ in range(200):
        a, b = trie(draw(0, 4)), trie(draw(1, 4))
        merged = a.merge(b)
        assert sorted(paths(merged)) == sorted(set(paths(a)) | set(paths(b)))
        assert paths(merged)[:a.num_nodes] == paths(a)
        assert b.merge(b.truncate(2, 3)) is b
    with pytest.raises(ValueError, match="deterministic"):
        Draft(torch.tensor([1]), torch.tensor([-1]), q=torch.ones(1, 4)).merge(TREE)


def test_tree_masks():
    allowed = torch.tensor([[True, False, True], [True, True, False]])
    llama = TreeMasks.of(tiny("llama").model)
    mask = llama(allowed, torch.tensor([20, 21]), torch.tensor([0, 20, 21]))
    assert mask.shape == (1, 1, 2, 3) and mask.dtype == torch.float32
    assert torch.equal(mask[0, 0] == 0, allowed) and (mask[0, 0][~allowed] == torch.finfo(torch.float32).min).all()
    gemma = TreeMasks.of(tiny("gemma3").model)  # window 16: a query at 20 sees keys at 5..20 in local layers
    masks = gemma(torch.ones(1, 3, dtype=torch.bool), torch.tensor([20]), torch.tensor([4, 5, 20]))
    assert set(masks) == {"full_attention", "sliding_attention"}
    assert (masks["full_attention"] == 0).all()
    assert (masks["sliding_attention"][0, 0, 0] == 0).tolist() == [False, True, True]


@pytest.mark.parametrize("accepted", [[1], [1, 0], [0, 1]])
def test_draft_model_cache_after_a_partial_acceptance(accepted):
    """The draft keeps exactly the slots of the accepted nodes it computed: its cache equals a fresh prefill
    of the accepted text, and its next draft equals a fresh drafter's."""
    target = tiny("llama")
    draft = load_draft(target, SelfDraft(2))

    def state(tokens: torch.Tensor) -> DecodeState:
        return DecodeState(tokens, None, max_depth=8, prompt_len=PROMPT.shape[0])

    drafter = DraftModelDrafter(draft, "3x2x2", target.vocab_size)
    context = torch.cat([PROMPT, torch.tensor([ROOT])])
    tree = drafter.propose(state(context))
    node, nodes = -1, []
    for rank in accepted:  # the rank-th child at each level: slots that are not a prefix of the cache
        node = int(torch.nonzero(tree.parents == node)[rank])
        nodes.append(node)
    tokens, bonus = tree.tokens[nodes].tolist(), 3
    with torch.inference_mode():  # as in generate()
        drafter.update(torch.tensor([*tokens, bonus]), torch.tensor(nodes, dtype=torch.long))
    text = torch.cat([context, torch.tensor(tokens, dtype=torch.long)])
    assert drafter.prefix == text.shape[0]
    assert_same_cache(drafter.cache, fresh_cache(draft, text))
    following = torch.cat([text, torch.tensor([bonus])])
    again, fresh = drafter.propose(state(following)), DraftModelDrafter(draft, "3x2x2", target.vocab_size)
    expected = fresh.propose(state(following))
    assert torch.equal(again.tokens, expected.tokens) and torch.equal(again.parents, expected.parents)


class SlowHead:
    """The tiny model's head, 20 ms slower a call."""

    def __init__(self, head):
        self.head, self.rows_exact = head, head.rows_exact

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return self.head(hidden)


def test_the_heads_rows_computed_during_acceptance_count_as_verification(monkeypatch):
    """Acceptance computes the head's rows; a call's seconds still put them in verification, not overhead."""
    target = tiny("llama")
    monkeypatch.setattr(target.decoder, "head", SlowHead(target.decoder.head))
    out = generate(target, PROMPT, ContextNgramDrafter(k=1, w=6), max_new_tokens=12, stop_at_eos=False)
    assert all(call.verify_seconds >= 0.02 > call.overhead_seconds for call in out.stats.calls)
