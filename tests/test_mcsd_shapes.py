"""Notebooks 07 and 08's experiment code: one draft level's acceptance from (p, q) (exact and simulated MCSS)
against MCSS itself, and the teacher-forced replay of greedy draft-model trees against the drafter's replay."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import WholeRows, tiny

from specnb.core.accept import mcss
from specnb.core.generate import generate
from specnb.core.roofline import CostModel
from specnb.drafters.draft_model import DraftModelDrafter, self_draft
from specnb.eval.replay import replay_greedy
from specnb.experiments import mcsd, shapes
from specnb.model.kernels import top_k

PROMPTS = [torch.tensor([ord(c) for c in text]) for text in ("def fib(n):\n    return", "for i in range(10):\n")]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def distributions(seed: int, rows: int = 3, vocab: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.softmax(1.5 * torch.randn(rows, vocab, generator=g), 1),
            torch.softmax(1.5 * torch.randn(rows, vocab, generator=g), 1))


def test_one_level_acceptance_matches_mcss():
    """The exact (with replacement) and simulated (without replacement, MCNS) acceptance of one level of k
    candidates equal the rate at which specnb.core.accept.mcss accepts, within Monte Carlo noise."""
    p, q = distributions(0)
    g = torch.Generator().manual_seed(1)
    wr = mcsd.with_replacement_level(p, q, 4)
    wor, mcns = mcsd.without_replacement_level(p, q, 4, 4000, g)
    n = 40_000
    for row in range(p.shape[0]):
        big_p, big_q = p[row:row + 1].expand(n, -1), q[row:row + 1].expand(n, -1)
        drawn_wr = torch.multinomial(big_q, 4, replacement=True, generator=g)
        drawn_wor = torch.multinomial(big_q, 4, replacement=False, generator=g)
        target = torch.multinomial(big_p, 1, generator=g)
        for k in (1, 2, 4):
            accepted, _ = mcss(big_p, big_q, drawn_wr[:, :k], g, replacement=True)
            assert abs(float((accepted >= 0).float().mean()) - float(wr[row, k - 1])) < 0.015
            accepted, _ = mcss(big_p, big_q, drawn_wor[:, :k], g, replacement=False)
            assert abs(float((accepted >= 0).float().mean()) - float(wor[row, k - 1])) < 0.02
            naive = (drawn_wor[:, :k] == target).any(1).float().mean()
            assert abs(float(naive) - float(mcns[row, k - 1])) < 0.02


def test_without_replacement_accepts_at_least_as_often_and_one_candidate_agrees():
    p, q = distributions(3, rows=5, vocab=30)
    wr = mcsd.with_replacement_level(p, q, 8)
    wor, _ = mcsd.without_replacement_level(p, q, 8, 2000, torch.Generator().manual_seed(0))
    assert torch.allclose(wr[:, 0], torch.minimum(p, q).sum(1), atol=1e-6)  # k = 1: sum(min(p, q))
    assert torch.allclose(wor[:, 0], wr[:, 0], atol=0.03)
    assert (wor[:, -1] >= wr[:, -1] - 0.02).all()
    assert (wr[:, 1:] >= wr[:, :-1] - 1e-6).all()  # more candidates never accept less


def _exact_level(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[float, float]:
    """(MCSS without replacement, MCNS): the exact probability that one level of k candidates drawn from q
    without replacement is accepted, by enumerating every ordered draw (small vocabularies only)."""
    mcss_rate = naive_rate = 0.0
    for seq in itertools.permutations(range(p.shape[0]), k):
        weight, left = 1.0, 1.0
        for x in seq:
            weight, left = weight * float(q[x]) / left, left - float(q[x])
        pc, qc, rejected = p.clone(), q.clone(), 1.0
        for x in seq:
            rejected *= 1 - min(1.0, float(pc[x] / qc[x]))
            residual = (pc - qc).clamp(min=0)
            pc = residual / residual.sum() if residual.sum() > 0 else pc
            qc = qc.clone()
            qc[x] = 0
            qc = qc / qc.sum()
        mcss_rate += weight * (1 - rejected)
        naive_rate += weight * float(p[list(seq)].sum())  # the target's own draw is one of the candidates
    return mcss_rate, naive_rate


def test_mcns_is_naive_sampling_below_mcss_and_equal_to_sum_pq_at_one_candidate():
    """MCNS is the MCSD paper's naive sampling (footnote 5: the target samples x from p and the level is accepted
    when x is a candidate), not MCSS with another way of drawing: at k = 1 it accepts sum(p q), below MCSS's
    sum(min(p, q)) wherever p != q (the paper's Section 2 and Appendix C), and it never accepts more than MCSS
    without replacement. Both simulated schemes also match an exact enumeration on a small vocabulary."""
    p, q = distributions(5, rows=4, vocab=6)
    wr = mcsd.with_replacement_level(p, q, 3)
    wor, mcns = mcsd.without_replacement_level(p, q, 3, 20_000, torch.Generator().manual_seed(2))
    naive_one = (p * q).sum(1)
    assert torch.allclose(mcns[:, 0], naive_one, atol=0.01)
    assert (wr[:, 0] - naive_one > 0.05).all()  # the gap at k = 1 is real, not noise
    assert torch.allclose(wor[:, 0], wr[:, 0], atol=0.01)  # with and without replacement agree at k = 1
    for row in range(p.shape[0]):
        for k in (1, 2, 3):
            exact_mcss, exact_naive = _exact_level(p[row].double(), q[row].double(), k)
            assert abs(float(wor[row, k - 1]) - exact_mcss) < 0.01
            assert abs(float(mcns[row, k - 1]) - exact_naive) < 0.01
            assert exact_naive <= exact_mcss + 1e-9


def test_greedy_level_is_top_k_membership():
    g = torch.Generator().manual_seed(0)
    target, draft = torch.randn(20, 50, generator=g), torch.randn(20, 50, generator=g)
    draft[0, :3] = 5.0  # a tie: the lower id ranks first, as the kernel's top_k breaks it
    target[0] = 0.0
    target[0, 1] = 1.0
    counts = mcsd.greedy_level(target, draft, [1, 2, 4])
    truth = target.argmax(1)
    for k, count in zip([1, 2, 4], counts, strict=True):
        assert count == float((top_k(draft, k) == truth[:, None]).any(1).sum())


def test_humaneval_solutions_score_the_solution_tokens():
    target = tiny("gemma3")
    texts = mcsd.humaneval_solutions(target, 2, 20)
    records = mcsd._humaneval_records(2)
    for text, record in zip(texts, records, strict=True):
        assert 0 < text.scored <= 20
        decoded = target.tokenizer.decode(text.ids[text.start:].tolist())
        assert record["canonical_solution"].startswith(decoded) or decoded in record["canonical_solution"]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 1, 1), (4, 2), (2, 4), (4, 2, 1), (1, 2, 4)])
def test_teacher_forced_draft_replay_equals_the_drafters_replay(arch, shape):
    """Replaying a greedy draft-model tree from the draft's ranks gives, call by call, the accepted lengths,
    node counts and depths of replaying the drafter itself (fp32, so no rounding between call shapes)."""
    target = tiny(arch)
    draft = self_draft(target, 2)
    references = [(ids, torch.tensor(generate(target, ids, max_new_tokens=40).tokens)) for ids in PROMPTS]
    ranks = shapes.draft_ranks(draft, references, target.vocab_size)
    fast = shapes.draft_replay(shape, references, ranks)
    for (prompt, output), quick in zip(references, fast, strict=True):
        slow = replay_greedy(DraftModelDrafter(draft, shape, target.vocab_size), prompt, output)
        assert [(c.accepted, c.drafted_nodes, c.draft_depth, c.rows_read) for c in quick.calls] == \
            [(c.accepted, c.drafted_nodes, c.draft_depth, c.rows_read) for c in slow.calls]
    assert any(c.accepted for run in fast for c in run.calls)  # the test means something
    assert max(shape) == 1 or any(c.rows_read > c.accepted + 1 for run in fast for c in run.calls)  # a wider row


def test_paired_ratio_of_a_cell_with_itself_is_a_tie():
    rows = pd.DataFrame({"family": "f", "k": [1, 1, 1, 2, 2, 2], "prompt_id": [0, 1, 2, 0, 1, 2],
                         "new_tokens": [11, 21, 31, 11, 21, 31], "calls": [5, 8, 10, 5, 8, 10],
                         "est_seconds": [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]})
    assert shapes.paired_ratio(rows, {"k": 2}, {"k": 1}) == (1.0, 1.0, 1.0)
    assert shapes.paired_ratio(rows, {"k": 2}, {"k": 1}, metric="est_speed") == (1.0, 1.0, 1.0)


def test_timed_summary_and_tree_over_batch_on_known_rows():
    """Measured = predicted gives accuracy 1; a batch mode twice as slow gives tree / batch = 2."""
    rows = []
    for mode, factor in (("tree", 1.0), ("batch", 2.0)):
        for i in range(4):
            rows.append({"method": f"mixed 4x8 {mode}", "prompt_id": i, "family": "mixed", "k": 4, "w": 8,
                         "mode": mode, "decode_seconds": factor * (1.0 + i), "ar_decode_seconds": 3.0 * (1.0 + i),
                         "est_seconds": factor * (1.0 + i), "ar_seconds": 3.0 * (1.0 + i), "new_tokens": 65,
                         "calls": 20, "identical_to_ar": True})
    rows = pd.DataFrame(rows).assign(read_gb_per_s=[30.0, 34.0, 36.0, 64.0] * 2)
    summary = shapes.timed_summary(rows).set_index("mode")
    assert summary.read_gb_per_s.tolist() == [35.0, 35.0]  # the host's state while it ran: the median sample
    assert summary.loc["tree", "measured"] == pytest.approx(3.0)
    assert summary.loc["batch", "predicted"] == pytest.approx(1.5)
    assert summary.accuracy.tolist() == pytest.approx([1.0, 1.0])
    assert summary.accuracy_low.tolist() == pytest.approx([1.0, 1.0])
    ratio = shapes.tree_over_batch(rows).iloc[0]
    assert (ratio.ratio, ratio.low, ratio.high) == pytest.approx((2.0, 2.0, 2.0))


def test_a_timed_run_in_another_host_state_than_its_cost_table_is_named():
    """A run's bandwidth within the table's range (widened by STATE_SLACK) says nothing; outside it, the cause
    names both, which a disagreeing measured / predicted ratio then reads; nothing where either is unknown."""
    assert shapes.host_state_note((33.0, 37.0), 35.0) == shapes.host_state_note((33.0, 37.0), 41.0) == ""
    note = shapes.host_state_note((62.0, 66.0), 34.0)
    assert "timed at 62-66 GB/s" in note and "this run at 34" in note and "another state" in note
    assert shapes.host_state_note((33.0, 37.0), 64.0) != ""
    assert shapes.host_state_note(None, 34.0) == shapes.host_state_note((62.0, 66.0), float("nan")) == ""


def test_mcsd_shape_rows_count_the_papers_budget():
    """4x2 and 2x4 have the same leaves (8) and 12 vs 10 nodes; a draft whose every rank is 0 accepts full
    depth on both, so their tokens per call tie."""
    output = torch.arange(30)
    references = [(torch.arange(5), output)]
    ranks = [torch.zeros(30, dtype=torch.long).numpy()]
    rows = shapes.mcsd_shape_rows(references, ranks, [("4x2", "2x4")])
    assert rows.set_index("shape").nodes.to_dict() == {"4x2": 12, "2x4": 10}
    ratio = shapes.order_ratios(rows.assign(set="s")).iloc[0]
    assert ratio.ratio == 1.0


def test_decoded_texts_are_the_targets_own_outputs_at_each_temperature(tmp_path, monkeypatch):
    """``mcsd.acceptance_on = "decoded"`` (smoke, paper): at T = 0 each scored token is the target's argmax after
    the text before it (its greedy output), at T = 1 its seeded sample, both cached; ``canonical`` (quick): one
    set of HumanEval solutions for both temperatures, run through the models once per text."""
    import dataclasses

    from specnb.study.profiles import get_profile

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    target = tiny("gemma3")
    p = get_profile("smoke")
    assert p.mcsd.acceptance_on == "decoded" and get_profile("quick").mcsd.acceptance_on == "canonical"
    texts = mcsd.forced_texts(target, p)
    assert len(texts[0.0]) == len(texts[1.0]) == p.n_prompts
    for text in texts[0.0]:
        logits = mcsd.forced_logits(target, text, target.vocab_size)
        assert text.scored == p.max_new_tokens and logits.argmax(1).tolist() == text.ids[text.start:].tolist()
    sampled = texts[1.0][0]
    again = generate(target, sampled.ids[:sampled.start], max_new_tokens=p.max_new_tokens, temperature=1.0, seed=0)
    assert again.tokens == sampled.ids[sampled.start:].tolist()
    assert sampled.ids[sampled.start:].tolist() != texts[0.0][0].ids[sampled.start:].tolist()
    assert mcsd.forced_texts(target, p)[1.0][0].ids.tolist() == sampled.ids.tolist()  # read back from the cache

    canonical = dataclasses.replace(p, mcsd=dataclasses.replace(p.mcsd, acceptance_on="canonical"))
    shared = mcsd.forced_texts(target, canonical)
    assert shared[0.0] is shared[1.0]
    passes = []
    monkeypatch.setattr(mcsd, "forced_logits", lambda model, text, vocab: passes.append(1) or
                        torch.zeros(text.scored, vocab))
    forced = mcsd.acceptance_vs_k(target, target, shared, [1, 2], draws=2, support=8)
    assert len(passes) == 2 * p.n_prompts and set(forced.rows.temperature) == {0.0, 1.0}


class LinearCost(WholeRows):
    """A cost table whose call of n tokens after the root costs 1 + 0.1 n (k rows of w: 1 + 0.1 k w)."""

    def seconds_at(self, k, w, context_len):
        return 1.0 + 0.1 * k * w

    def chain_seconds(self, nodes, context_len):
        return 1.0 + 0.1 * np.asarray(nodes, dtype=float)


def test_mcsd_budget_rows_price_a_tree_as_one_row_of_its_nodes_plus_its_draft_calls():
    """A draft whose every rank is 0 accepts every level: on 10 output tokens a 2x2 tree takes 3 calls of 6 nodes
    (1.6 s each on LinearCost) and 2 draft calls each (0.5 s each at a draft ratio of 0.5); AR takes 9 calls."""
    references = [(torch.arange(5), torch.arange(10))]
    ranks = [np.zeros(10, dtype=np.int64)]
    rows = shapes.mcsd_budget_rows(references, ranks, LinearCost(), 0.5, {4: ("2x2",), 2: ("2x1",)}).set_index("shape")
    assert rows.loc["2x2", ["calls", "nodes", "budget"]].tolist() == [3, 6, 4]
    assert rows.loc["2x2", "new_tokens"] - 1 == 9 and rows.loc["2x2", "drafted_nodes"] == 18
    assert rows.loc["2x2", "est_seconds"] == pytest.approx(3 * 1.6 + 3 * 2 * 0.5)
    assert rows.loc["2x2", "ar_seconds"] == pytest.approx(9.0)


def test_budget_groups_pool_the_calls_and_average_the_seconds():
    rows = pd.DataFrame({"set": "s", "budget": [4, 4, 4, 4, 8, 8], "shape": ["4x1", "4x1", "2x2", "2x2", "8x1", "8x1"],
                         "prompt_id": [0, 1, 0, 1, 0, 1], "new_tokens": [11, 21, 13, 23, 16, 26],
                         "calls": [5, 10, 4, 8, 3, 5], "drafted_nodes": [20, 40, 24, 48, 24, 40],
                         "est_seconds": [2.0, 4.0, 3.0, 5.0, 6.0, 7.0], "ar_seconds": [10.0, 20.0] * 3})
    pooled = shapes.budget_groups(rows).set_index(["budget", "prompt_id"])
    assert pooled.loc[(4, 0), ["new_tokens", "calls", "est_seconds", "ar_seconds"]].tolist() == [23, 9, 2.5, 10.0]
    summary = shapes.priced_summary(shapes.budget_groups(rows), ["budget"]).set_index("budget")
    assert summary.loc[4, "tokens_per_call"] == pytest.approx((10 + 20 + 12 + 22) / 27)
    assert summary.loc[4, "est_speedup"] == pytest.approx(30 / 7.0)
    points = shapes.budget_points(rows)
    assert points.label.tolist() == ["4: 4x1", "4: 2x2", "4: all of 4", "8: 8x1", "8: all of 8"]
    value, _, _ = shapes.paired_ratio(shapes.budget_groups(rows), {"budget": 8}, {"budget": 4}, "est_speed")
    assert value == pytest.approx((2.5 + 4.5) / (6.0 + 7.0))  # the mean shape's seconds, per prompt


def test_mcsd_budget_verdicts_judge_what_they_name():
    """On random ranks priced by a steep LinearCost, the larger budget has more tokens per call and is slower
    (both agree); each verdict's number is the ratio its claim names, recomputed here; every cause cites only
    numbers its evidence or the report holds."""
    from specnb.study.results import Results, uncited

    rng = np.random.default_rng(0)
    references = [(torch.arange(5), torch.arange(60)) for _ in range(8)]
    ranks = [rng.geometric(0.5, 60) - 1 for _ in references]
    budgets = {4: ("4x1x1", "2x2x1"), 16: ("16x1x1", "4x4x1", "4x2x2")}
    rows = shapes.mcsd_budget_rows(references, ranks, LinearCost(), 0.0, budgets).assign(set="code")
    report = Results("99", "smoke")
    report.add(draft_top1=0.5)
    judged = shapes.compare_mcsd_budgets(report, rows, LinearCost())
    assert set(report.comparisons) == {"budget 4 alike code", "budget 16 alike code", "budget 16 vs 4 tokens code",
                                       "budget 16 vs 4 speed code"}
    tpc = shapes.priced_summary(rows, ["budget", "shape"]).set_index("shape").tokens_per_call
    small = tpc[["4x1x1", "2x2x1"]]
    assert report.comparisons["budget 4 alike code"].ours == pytest.approx(small.max() / small.min())
    pooled = lambda b, c: rows[rows.budget == b][c].sum()  # noqa: E731
    tokens = report.comparisons["budget 16 vs 4 tokens code"]
    assert tokens.ours == pytest.approx((pooled(16, "new_tokens") - 3 * 8) / pooled(16, "calls")
                                        / ((pooled(4, "new_tokens") - 2 * 8) / pooled(4, "calls")))
    speed = report.comparisons["budget 16 vs 4 speed code"]
    assert speed.ours == pytest.approx(pooled(4, "est_seconds") / 2 / (pooled(16, "est_seconds") / 3))
    assert tokens.verdict == "agrees" and speed.verdict == "agrees" and speed.direction_only
    assert report.comparisons["budget 16 alike code"].expect.kind == "near"
    assert "cost table" in speed.claim and "GPU" in speed.cause
    records = {key: {**c.record(), "cause": c.cause} for key, c in report.comparisons.items()}
    assert uncited({"ours": report.ours, "verdicts": records}) == []
    assert "budget 16 vs 4 speed code" in report.takeaways["08_mcsd_budgets"]
    # the figure's ratio panel draws exactly the judged numbers, the alike rows under the tie band
    assert judged.value.tolist() == pytest.approx([c.ours for c in report.comparisons.values()])
    assert judged[["low", "high"]].to_numpy().ravel().tolist() == pytest.approx(
        [end for c in report.comparisons.values() for end in (c.low, c.high)])
    band = shapes.budget_band(judged)
    assert band.rows == tuple(judged.row[:2]) and (band.low, band.high) == pytest.approx((0.98, 1.02))


def test_greedy_ranks_of_decoded_texts_are_the_replays_draft_ranks(tmp_path, monkeypatch):
    """On the target's own greedy outputs (``decoded``), the ranks :func:`mcsd.acceptance_vs_k` keeps for the
    SD γ sweep are notebook 08's :func:`shapes.draft_ranks` of the same references, position by position."""
    from specnb.study.profiles import get_profile

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    target = tiny("gemma3")
    draft = self_draft(target, 2)
    texts = mcsd.forced_texts(target, get_profile("smoke"), (0.0,))
    forced = mcsd.acceptance_vs_k(target, draft, texts, [1, 2])
    refs = [(t.ids[:t.start], t.ids[t.start:]) for t in texts[0.0]]
    assert [t for t, _ in forced.greedy] == texts[0.0]
    expected = shapes.draft_ranks(draft, refs, target.vocab_size)
    assert all(r.tolist() == e.tolist() for (_, r), e in zip(forced.greedy, expected, strict=True))
    assert any(r.any() for _, r in forced.greedy) and any((r == 0).any() for _, r in forced.greedy)


def forced_of(ranks: list[np.ndarray], prompt: int = 5) -> mcsd.Forced:
    texts = [mcsd.ForcedText(str(i), torch.arange(prompt + len(r)), prompt) for i, r in enumerate(ranks)]
    return mcsd.Forced(pd.DataFrame(), pd.DataFrame(), list(zip(texts, ranks, strict=True)))


def test_sd_gamma_rows_replay_chains_and_price_their_draft_calls():
    """A draft whose every rank is 0 accepts every level: on 10 output tokens an SD chain of γ = 2 takes 3 calls of
    2 nodes (1.2 s each on LinearCost) and 2 draft calls each (0.5 s at a draft ratio of 0.5); γ = 1 takes 5."""
    rows = mcsd.sd_gamma_rows(forced_of([np.zeros(10, dtype=np.int64)]), LinearCost(), 0.5, "2x2", (1, 2))
    rows = rows.set_index("shape")
    assert rows.method.tolist() == ["SD", "SD", "MCSD"] and rows.gamma.tolist() == [1, 2, 2]
    assert rows.loc["1x1", ["calls", "drafted_nodes"]].tolist() == [3, 6]
    assert rows.loc["1", "calls"] == 5 and rows.loc["1", "new_tokens"] - 1 == 9
    assert rows.loc["1x1", "est_seconds"] == pytest.approx(3 * 1.2 + 3 * 2 * 0.5)
    assert rows.loc["2x2", "est_seconds"] == pytest.approx(3 * 1.6 + 3 * 2 * 0.5)
    assert rows.ar_seconds.tolist() == pytest.approx([9.0] * 3)


def test_sd_best_gamma_verdict_judges_mcsd_against_the_fastest_chain():
    """On random ranks, the best γ is the SD chain of the highest pooled estimated speedup, the verdict's number
    is its priced seconds over the MCSD tree's, paired by prompt, direction only; the cause cites only what the
    report holds."""
    from specnb.study.results import Results, uncited

    rng = np.random.default_rng(0)
    ranks = [rng.geometric(0.6, 60) - 1 for _ in range(8)]
    rows = mcsd.sd_gamma_rows(forced_of(ranks), LinearCost(), 0.2, "4x2x1")
    summary = mcsd.sd_gamma_summary(rows)
    seconds = rows.groupby("shape", sort=False).est_seconds.sum()
    sd = seconds[[s for s in seconds.index if set(s.split("x")) == {"1"}]]
    assert summary.loc[summary.best, "shape"].tolist() == [sd.idxmin()]
    assert summary.label[summary.best].iloc[0] == f"SD γ = {len(sd.idxmin().split('x'))} (best)"
    assert summary.set_index("shape").est_speedup[sd.idxmin()] == pytest.approx(
        rows.ar_seconds.sum() / len(summary) / sd.min())
    report = Results("99", "smoke")
    report.add(cost_ratio=0.2)
    mcsd.compare_sd_gamma(report, rows, summary, "8 texts")
    verdict = report.comparisons["mcsd_vs_sd_best_gamma"]
    assert verdict.ours == pytest.approx(sd.min() / seconds["4x2x1"])
    assert verdict.direction_only and verdict.expect.kind == "above" and "cost table" in verdict.claim
    assert report.ours["sd_best_gamma"] == len(sd.idxmin().split("x"))
    records = {key: {**c.record(), "cause": c.cause} for key, c in report.comparisons.items()}
    assert uncited({"ours": report.ours, "verdicts": records}) == []
    assert "mcsd_vs_sd_best_gamma" in report.takeaways["07_sd_gamma"]


def test_setup_names_each_stores_own_documents_and_size(tmp_path):
    """08's DReSD setup row states the OOD dense store DReSD replays and, apart, the documents REST and CREST
    index: under ``paper`` the target's answers (in distribution), whose size is not DReSD's store's."""
    import json
    from types import SimpleNamespace

    from specnb.experiments.endtoend import store_corpus_tokens
    from specnb.study.profiles import get_profile
    from specnb.study.results import Results

    stores = {"rest": tmp_path / "rest", "dense": tmp_path / "dense", "dense-id": tmp_path / "dense-id"}
    for (label, path), tokens in zip(stores.items(), (9_632_530, 9_379_302, 9_611_531), strict=True):
        path.mkdir()
        meta = {"num_tokens": tokens} if label == "rest" else {"corpus": {"num_tokens": tokens}}
        (path / "meta.json").write_text(json.dumps(meta))
    for profile, docs in (("paper", "the target's answers (in distribution)"), ("quick", "code (out of distribution)")):
        study = SimpleNamespace(profile=get_profile(profile), headlines=lambda: {
            "target": "t", "draft": "d", "dtype": "bf16", "draft_call_ratio": 0.5,
            "store_tokens": store_corpus_tokens(stores)})
        report = Results("08", "smoke")
        shapes.ShapeStudy.record_setup(study, report)
        assert report.setups["DReSD"]["here"]["datastore"] == (
            f"DReSD: 9,379,302 tokens of code (out of distribution); REST and CREST: 9,632,530 tokens of {docs}")


def test_sampled_acceptance_is_what_the_pairs_overlap_predicts(monkeypatch):
    """SD at T = 1 accepts a drafted token with probability sum(min(p, q)) at its position: the count accepted lies
    within chance of that sum; a sampler that accepts more than min(1, p / q) (here against (p + q) / 2) does not."""
    from specnb.core import accept
    from specnb.core.prompts import Prompt
    from specnb.eval.checks import DegenerateData

    target = tiny("llama")
    draft = self_draft(target, 2)
    prompts = [Prompt(str(i), text) for i, text in enumerate(("def fib(n):\n    return", "for i in range(10):\n"))]
    check = mcsd.overlap_check(target, draft, prompts, 64)
    assert 0.2 * check.tested < check.accepted < check.tested  # a pair that neither always nor never agrees
    assert abs(check.z) < 3
    right = accept.mcss
    monkeypatch.setattr(accept, "mcss", lambda p, q, *a, **k: right((p + q.to(p.device)) / 2, q, *a, **k))
    with pytest.raises(DegenerateData, match="z = [+]"):
        mcsd.overlap_check(target, draft, prompts, 64)


def test_pair_costs_count_what_each_call_streams_without_loading_dense_weights():
    """The pair's weight bytes are the blocks a GGUF model streams (a self:L draft's first L layers and the head),
    its parameter count the dense model's, and neither loads the dense checkpoint (meta modules stand in)."""
    import dataclasses

    from conftest import tiny_gguf

    from specnb.model.kernels import extension

    if extension() is None:
        pytest.skip("needs specnb's kernels")
    dense = tiny("llama")
    target = tiny_gguf("llama")
    with torch.device("meta"):
        meta = type(dense.model)(dense.model.config)
    target = dataclasses.replace(target, modules=meta, dense=lambda: pytest.fail("dense weights loaded"))
    draft = self_draft(target, 2)
    assert mcsd.weight_bytes(target) == target.decoder.weight_bytes()
    assert mcsd.weight_bytes(draft) == draft.decoder.weight_bytes() < mcsd.weight_bytes(target)
    assert mcsd.parameters(target) == mcsd.parameters(dense) > mcsd.parameters(draft) > 0
    layer = sum(p.numel() for p in dense.model.model.layers[0].parameters())
    assert mcsd.parameters(target) - mcsd.parameters(draft) == 2 * layer


def test_dresds_paper_shape_is_judged_on_the_gpu_tables_price_too(tmp_path):
    """With replay rows priced on a GPU table, 4x16 is set against the best shape by that price: the paired
    tokens-per-call ratio times the ratio of the two calls' prices there; rows without ``est_speedup_gpu`` (no
    table), no such verdict."""
    from specnb.experiments import gpu_price
    from specnb.study.results import Results

    table = tmp_path / "roofline_gpu.csv"
    pd.DataFrame([{"context": 256, "k": k, "w": w, "seconds": s, "model": "random:llama-2-7b", "device": "NVIDIA Fake",
                   "cuda_graphs": False} for k, w, s in ((1, 0, 1.0), (4, 16, 1.7), (16, 4, 1.6), (2, 8, 1.2))]
                 ).to_csv(table, index=False)
    calls = {(4, 16): 20, (16, 4): 25, (2, 8): 25}
    rows = pd.DataFrame([{"family": shapes.DRESD, "set": "HumanEval", "k": k, "w": w, "prompt_id": f"p{i}",
                          "new_tokens": 101, "calls": c + i % 2, "tokens_per_call": 100 / (c + i % 2),
                          "est_seconds": 1.0} for (k, w), c in calls.items() for i in range(6)])
    grids = pd.DataFrame([{"family": shapes.DRESD, "set": "HumanEval", "k": k, "w": w, "tokens_per_call": 100 / c,
                           "est_speedup": 1.0, "est_speedup_low": 0.9, "est_speedup_high": 1.1}
                          for (k, w), c in calls.items()])
    cost = CostModel(pd.read_csv(table))
    report = Results("99", "smoke")
    shapes.compare_dresd(report, rows, grids, cost, gpu_table=table)
    assert "gpu_dresd_paper_shape" not in report.comparisons
    report = Results("99", "smoke")
    shapes.compare_dresd(report, gpu_price.add_gpu_column(rows, "random:llama-2-7b", path=table), grids, cost,
                         gpu_table=table)
    judged = report.comparisons["gpu_dresd_paper_shape"]
    tokens = shapes.paired_ratio(rows, {"k": 4, "w": 16}, {"k": 2, "w": 8})
    assert "(2x8)" in judged.claim and judged.ours == pytest.approx(tokens[0] * 1.2 / 1.7)
    assert judged.verdict == "disagrees"  # 4x16 accepts ~1.25x the tokens at ~1.42x the price
