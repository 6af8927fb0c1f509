"""The analyses behind notebooks 04 (CREST compaction), 05 (roofline) and 06 (N-Grammys): intervals over resampled
prompts, storage ratios, the spread of a timed cell over passes, the steps of a cost curve, and replay grids with
intervals."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny

from specnb.eval import timing
from specnb.eval.replay import replay_many
from specnb.eval.runner import summarize
from specnb.eval.timing import Grid, time_cells
from specnb.experiments import compaction as cx
from specnb.experiments import roofline_study as rs
from specnb.experiments.grids import replay_grid, replay_rows
from specnb.study.results import Results


def test_storage_ratio_interpolates_in_log_bytes_and_is_zero_when_crest_never_reaches_rest():
    rest_bytes, rest = np.array([1e6, 1e7, 1e8]), np.array([0.2, 0.4, 0.6])
    crest_bytes, crest = np.array([1e5, 1e6, 1e7]), np.array([0.3, 0.5, 0.7])
    out = cx._storage(rest_bytes, rest, crest_bytes, crest)
    assert out["storage_ratio_grid"] == pytest.approx(1e8 / 1e7)
    cross = math.exp(math.log(1e6) + 0.5 * (math.log(1e7) - math.log(1e6)))  # 0.6 halfway from 0.5 to 0.7
    assert out["storage_ratio_interpolated"] == pytest.approx(1e8 / cross)
    assert out["crest_gain_over_rest_best"] == pytest.approx(0.7 / 0.6 - 1)
    never = cx._storage(rest_bytes, rest, crest_bytes, crest * 0.5)
    assert never["storage_ratio_grid"] == 0 and never["storage_ratio_interpolated"] == 0 and never["reached"] == 0
    nothing = cx._storage(rest_bytes, rest * 0, crest_bytes, crest * 0)
    assert math.isnan(nothing["storage_ratio_interpolated"])


def _per_prompt(rng: np.random.Generator) -> pd.DataFrame:
    """Replay rows of two REST and two CREST points of one task over 8 prompts (CREST accepts more)."""
    rows = []
    for point, method, nbytes, rate in (("r1", "REST", 1e6, 0.2), ("r2", "REST", 1e7, 0.4),
                                        ("c1", "CREST", 1e5, 0.35), ("c2", "CREST", 1e6, 0.6)):
        for prompt in range(8):
            calls = int(rng.integers(40, 60))
            rows.append({"point": point, "task": "code", "method": method, "bytes": nbytes, "prompt": prompt,
                         "accepted": int(rng.binomial(calls * 3, rate / 3)), "calls": calls,
                         "hits": calls, "nodes": 10 * calls, "tokens": nbytes / 8})
    return pd.DataFrame(rows)


def test_resampled_accepted_lengths_are_paired_and_the_first_row_is_the_whole_sample():
    per_prompt = _per_prompt(np.random.default_rng(0))
    values = cx.resampled(per_prompt, "code", resamples=50)
    points = cx.points(per_prompt).set_index("point")
    assert values.shape == (51, 4)
    assert np.allclose(values.iloc[0][points.index], points.accepted_length)
    for _, row in points.iterrows():
        assert row.accepted_length_low <= row.accepted_length <= row.accepted_length_high
    value, low, high = cx.interval(values["c2"].to_numpy())
    assert low <= value <= high


def test_storage_summary_and_its_verdicts_carry_intervals():
    per_prompt = _per_prompt(np.random.default_rng(1))
    summary = cx.storage_table(per_prompt)
    row = summary.iloc[0]
    for name in ("storage_ratio_interpolated", "crest_gain_over_rest_best", "rest_best_accepted"):
        assert row[f"{name}_low"] <= row[name] <= row[f"{name}_high"]
    assert 0 <= row.reached <= 1 and "reached_low" not in summary
    report = Results("99", "smoke")
    cx.judge_storage(report, summary, t_max=100)
    assert set(report.comparisons) == {"storage_ratio_code", "gain_code"}
    assert report.ours["judged"]["gain_code"] in ("agrees", "disagrees", "inconclusive")
    takeaway = report.takeaways["04_accepted_length_vs_storage"]  # in the plotted metric, then the paper's
    assert takeaway.startswith(f"best tokens per call, CREST vs REST: {1 + row.crest_best_accepted:.2f} vs "
                               f"{1 + row.rest_best_accepted:.2f} on code; in accepted length")


def _all_n(rates: dict[tuple[str, int, int], float]) -> pd.DataFrame:
    """All-n <= m replay rows (:func:`cx.top_t_grids`' second frame) over 8 prompts: accepted = rate x calls,
    a prompt's rate moved by a shared +-10% so the points stay paired."""
    rows = []
    for (task, m, t), rate in rates.items():
        for prompt in range(8):
            rows.append({"point": f"{task} {m} t{t}", "task": task, "method": "CREST", "m": m, "t": t,
                         "entries": m * t, "prompt": prompt, "calls": 100,
                         "accepted": round(100 * rate * (0.9 + 0.2 * prompt / 7)), "hits": 80, "nodes": 900})
    return pd.DataFrame(rows)


def test_all_n_stores_judge_the_best_m_and_the_peak_on_code():
    """CREST Fig. 9: on code m = 3 peaks at t = 1,000 and falls by the largest t (both agree); on chat the best
    store is m = 2 (the best m is 2: disagrees, a ratio of exactly 1) and no peak is judged."""
    code = {("code", 1, 250): 0.4, ("code", 1, 1000): 0.5, ("code", 1, 4000): 0.5,
            ("code", 2, 250): 0.5, ("code", 2, 1000): 0.7, ("code", 2, 4000): 0.6,
            ("code", 3, 250): 0.55, ("code", 3, 1000): 0.9, ("code", 3, 4000): 0.7}
    chat = {("chat", m, t): 0.3 + 0.1 * t / 4000 - 0.05 * (m == 3) for m in (1, 2, 3) for t in (250, 1000, 4000)}
    chat[("chat", 2, 4000)] = 0.5
    report = Results("99", "smoke")
    rows = cx.judge_all_n(report, _all_n({**code, **chat})).set_index("task")
    assert (rows.m.code, rows.t.code, rows.entries.code, rows.short_m.code) == (3, 1000, 3000, 2)
    assert rows.mixing.code == pytest.approx(0.9 / 0.7, rel=0.01) and rows.decline.code == pytest.approx(0.9 / 0.7,
                                                                                                        rel=0.01)
    assert rows.mixing_low.code <= rows.mixing.code <= rows.mixing_high.code
    judged = report.ours["judged"]
    assert judged == {"best_m_code": "agrees", "peak_code": "agrees", "best_m_chat": "disagrees"}
    assert (rows.m.chat, rows.mixing.chat) == (2, 1.0)
    assert report.comparisons["peak_code"].evidence["n-grams at the peak"] == 3000
    assert report.takeaways["04_all_n_le_m_top_t"].startswith("the best all-n store: m = {verdicts[best_m_code]")


def test_a_timed_cell_reports_its_spread_over_passes():
    frame = time_cells(tiny("llama"), Grid((1, 2), (0, 3), (8,), repeats=3), progress=False)
    assert frame.passes.between(3, 3 + timing.EXTRA_PASSES).all()  # more where a cell was timed again
    assert (frame.slowdown_low <= frame.slowdown + 1e-12).all()
    assert (frame.slowdown <= frame.slowdown_high + 1e-12).all()


def test_curve_steps_find_the_largest_step_between_consecutive_sizes():
    curve = pd.DataFrame({"dtype": "bfloat16", "context": 256, "tokens": [1, 8, 16, 32],
                          "slowdown": [1.0, 1.15, 1.74, 2.0], "slowdown_low": [0.98, 1.1, 1.7, 1.9],
                          "slowdown_high": [1.02, 1.2, 1.8, 2.1]})
    steps = rs.curve_steps(curve)
    assert steps[["from", "to"]].values.tolist() == [[1, 8], [8, 16], [16, 32]]
    largest = rs.largest_steps(steps)["bfloat16"]
    assert (largest["from"], largest["to"]) == (8, 16)
    assert largest["step"] == pytest.approx(1.74 / 1.15)
    assert largest["step_low"] == pytest.approx(1.7 / 1.2) and largest["step_high"] == pytest.approx(1.8 / 1.1)


def test_replay_grid_intervals_are_opt_in_and_contain_the_value():
    from specnb.core.roofline import CostModel
    from specnb.drafters.context import ContextNgramDrafter

    rng = np.random.default_rng(0)
    refs = [(torch.tensor(rng.integers(0, 5, 20)), torch.tensor(np.tile(rng.integers(0, 5, 4), 6)))
            for _ in range(6)]
    cost = CostModel(pd.DataFrame([dict(context=c, k=k, w=w, seconds=0.01 * (1 + 0.1 * k * w))
                                   for c in (10, 100) for k in (1, 2) for w in (0, 1, 3)]))
    make = lambda k, w: ContextNgramDrafter(k=k, w=w)  # noqa: E731
    plain = replay_grid(make, refs, [(1, 3)], cost)
    assert "tokens_per_call_low" not in plain and "est_speedup_low" not in plain
    row = replay_grid(make, refs, [(1, 3), (2, 1)], cost, intervals=True).iloc[0]
    assert row.tokens_per_call_low <= row.tokens_per_call <= row.tokens_per_call_high
    assert row.est_speedup_low <= row.est_speedup <= row.est_speedup_high
    assert row.est_speedup == pytest.approx(plain.iloc[0].est_speedup)


def test_fig2_takeaway_gives_the_plotted_tokens_per_call_and_its_difference_over_ar():
    """06's Fig. 2 line quotes what the figure plots (tokens per call) and the claim's quantity (a difference of
    tokens per call over AR's 1), both from the curves, never a speedup."""
    from types import SimpleNamespace

    from specnb.experiments import ngrams

    curves = pd.DataFrame({"set": ["HumanEval"] * 2 + ["MT-Bench"] * 2, "strategy": ["extended bigram (w=2)"] * 4,
                           "k": [1, 25] * 2, "tokens_per_call": [1.1, 1.7, 1.2, 1.74],
                           "tokens_per_call_low": [1.0, 1.56, 1.1, 1.68],
                           "tokens_per_call_high": [1.2, 1.84, 1.3, 1.82]})
    report = Results("99", "smoke")
    ngrams.judge_fig2(report, curves, SimpleNamespace(name="tiny", vocab_size=100, chat=False))
    assert report.comparisons["fig2_HumanEval"].ours == pytest.approx(0.7)
    assert report.takeaways["06_ngram_topk_tokens_per_call"].startswith(
        "the extended bigram (w = 2) at top 25: 1.70 tokens per call on HumanEval "
        "({verdicts[fig2_HumanEval][ours]:+.2f} over AR's 1), 1.74 tokens per call on MT-Bench")
    assert "not a speedup" in report.takeaways["06_ngram_topk_tokens_per_call"]


def test_crest_lookup_is_judged_against_rest_on_the_same_contexts():
    rows = [dict(task="code", retriever=name, **{"median ms": ms, "REST over this": ratio,
                                                 "REST over this low": low, "REST over this high": high})
            for name, ms, ratio, low, high in (("REST", 0.13, 1.0, 1.0, 1.0), ("CREST", 0.018, 7.4, 7.1, 7.7))]
    rows.append(dict(task="chat", retriever="CREST", **{"median ms": 0.2, "REST over this": 0.6,
                                                         "REST over this low": 0.5, "REST over this high": 0.7}))
    report = Results("99", "smoke")
    cx.record_latency(report, pd.DataFrame(rows))
    assert set(report.comparisons) == {"lookup_code", "lookup_chat"}  # CREST's rows only
    assert report.ours["judged"] == {"lookup_code": "agrees", "lookup_chat": "disagrees"}
    assert report.comparisons["lookup_code"].direction_only
    assert report.ours["latency"]["code CREST"]["median ms"] == 0.018
    drawn = cx.latency_ratios(pd.DataFrame(rows))  # the figure's ratios: the verdicts' numbers, in their order
    assert list(drawn.row) == ["code: REST / CREST", "chat: REST / CREST"]
    for r in drawn.itertuples():
        verdict = report.comparisons[f"lookup_{r.row.split(':')[0]}"]
        assert (r.value, r.low, r.high) == (verdict.ours, verdict.low, verdict.high)


def _query_case():
    """A hand-made REST store where only a 6+-token query finds the right continuation: 3..7 is followed by
    10 11 12 once (after 1 2) and by 20 21 22 three times (after 9 9), and a 3-node tree keeps the most frequent.
    Code: prompt 1..6, output 7 10 11 12; up to max_query 5 the first call drafts 20 21 (0 accepted), the second
    11 (1 accepted): 1 token in 2 calls; from 6 on, 1 2 3 4 5 6 7 matches once: 10 11 (2 accepted) in 1 call.
    Chat: prompt 3..6, output 7 20 21 22: 2 accepted in 1 call at every max_query."""
    from specnb.datastores.corpus import TokenCorpus
    from specnb.datastores.rest import RestIndex, SearchConfig

    docs = [[1, 2, 3, 4, 5, 6, 7, 10, 11, 12]] + [[9, 9, 3, 4, 5, 6, 7, 20, 21, 22]] * 3
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    meta = {"tokenizer": {"name": "tiny-llama", "vocab_size": 259, "fingerprint": "x"}, "name": "test"}
    index = RestIndex.build(TokenCorpus(np.concatenate([np.asarray(d, dtype=np.int32) for d in docs]), starts, meta),
                            progress=False)
    references = {"code": [(torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([7, 10, 11, 12]))] * 3,
                  "chat": [(torch.tensor([3, 4, 5, 6]), torch.tensor([7, 20, 21, 22]))] * 2}
    return cx.query_sweep({"code": index, "chat": index}, references, (2, 5, 6, 16),
                          SearchConfig(length=3, max_nodes=3))


def test_rest_query_sweep_gives_the_share_of_the_gain_short_matches_keep(tmp_path, monkeypatch):
    from specnb.study.results import uncited

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    sweep = _query_case()
    report = Results("99", "smoke")
    table = cx.judge_query_sweep(report, sweep).set_index(["task", "max_query"])
    assert table.tokens_per_call["code"].tolist() == [1.5, 1.5, 3.0, 3.0]  # 1 + 1/2 accepted per call, then 1 + 2
    assert table.tokens_per_call["chat"].tolist() == [3.0] * 4
    assert table.share["code"].tolist() == [0.25, 0.25, 1.0, 1.0]  # 0.5 / 2 accepted per call
    code, chat = table.loc[("code", 5)], table.loc[("chat", 5)]
    assert (code.share_low, code.share_high) == (0.25, 0.25)  # the same reference thrice: every resample alike
    assert table.loc[("code", 16)].long_share == 1.0 and table.loc[("code", 5)].long_share == 0
    assert table.loc[("chat", 16)].long_accepted_share == 0 and chat.share == 1.0
    assert report.ours["judged"] == {"rest_short_query_code": "disagrees", "rest_short_query_chat": "agrees"}
    assert report.comparisons["rest_short_query_code"].expect.region[0] == pytest.approx(0.55)
    assert report.ours["rest_query"]["code"]["q16"]["accepted_length"] == 2.0
    results = json.loads(report.write().read_text())
    assert "with queries of up to 16 tokens, 100% of calls match more than 5" in results["verdicts"][
        "rest_short_query_code"]["cause"]
    assert uncited(results) == []
    assert results["takeaways"]["04_rest_max_query"].startswith(
        "REST's tokens per call with its longest query cut to 5 tokens, against 16: 1.50 vs 3.00 on code "
        "(25% (25%–25%)")
    nothing = Results("99", "smoke")  # nothing accepted (a random tiny model): no share, and the cause says why
    cx.judge_query_sweep(nothing, sweep.assign(accepted=0, long_accepted=0))
    assert nothing.ours["judged"]["rest_short_query_code"] == "inconclusive"
    assert nothing.comparisons["rest_short_query_code"].cause.startswith("REST accepts no draft token here")
    with pytest.raises(ValueError, match="max_query 5 and 16"):
        cx.judge_query_sweep(Results("99", "smoke"), sweep[sweep.max_query < 16])


def _ablation() -> pd.DataFrame:
    """Hand-made :func:`specnb.experiments.ngrams.mixed_ablation` rows at (k, w) = (4, 3), two prompts of one set:
    the bigram wins 4 calls, 3 of them below its first row (ranks 0, 1, 2, 3); the context wins 4, 1 below its
    first row (ranks 0, 0, 0, 2), 2 of them with all w = 3 tokens; the context fills 4 of 4 rows in 4 calls, 0 rows
    in 3, 1 row in 2 and 2 rows in 1 of the 10."""
    calls = [  # (prompt, accepted, strategy, rank, context rows)
        (0, 1, "bigram", 0, 0), (0, 2, "bigram", 1, 0), (0, 1, "bigram", 2, 1), (0, 3, "context", 0, 4),
        (0, 0, "none", None, 0), (1, 1, "bigram", 3, 1), (1, 3, "context", 0, 4), (1, 1, "context", 0, 4),
        (1, 2, "context", 2, 4), (1, 0, "none", None, 2)]
    return pd.DataFrame([{"set": "HumanEval", "prompt": p, "context": 20 + i, "k": 4, "w": 3, "accepted": a,
                          "strategy": s, "rank": np.nan if r is None else r, "context_rows": c, "bigram_rows": 4 - c}
                         for i, (p, a, s, r, c) in enumerate(calls)])


def test_fig4_statistics_count_rank_tails_full_acceptances_and_allocations():
    from specnb.experiments import ngrams

    stats = ngrams.fig4_statistics(_ablation()).iloc[0]
    assert (stats.k, stats.w, stats.prompts, stats.calls, stats.bigram_won, stats.context_won) == (4, 3, 2, 10, 4, 4)
    assert stats.bigram_tail_share == pytest.approx(3 / 4) and stats.context_tail_share == pytest.approx(1 / 4)
    assert stats.rank_tail == pytest.approx(3 / 4 - 1 / 4)
    assert stats.context_full == pytest.approx(2 / 10) and stats.longest_context == 3
    assert stats.whole_batch == pytest.approx(4 / 10) and stats.no_rows == pytest.approx(3 / 10)
    assert (stats.mode_rows, stats.mode_share) == (0, pytest.approx(3 / 10))
    assert stats.whole_batch_lead == pytest.approx(4 / 10 - 3 / 10)
    for key in ("rank_tail", "context_full", "whole_batch_lead"):
        assert stats[f"{key}_low"] <= stats[key] + 1e-12 and stats[key] <= stats[f"{key}_high"] + 1e-12
    # the context never filling the batch: the statistic is its deficit to the commonest allocation
    fewer = _ablation().assign(context_rows=lambda f: f.context_rows.clip(upper=3))
    assert ngrams.fig4_statistics(fewer).iloc[0].whole_batch_lead == pytest.approx(0 - 4 / 10)


def test_fig4_verdicts_cite_only_their_evidence():
    from types import SimpleNamespace

    from specnb.experiments import ngrams
    from specnb.study.results import uncited

    report = Results("99", "smoke")
    ngrams.judge_fig4(report, ngrams.fig4_statistics(_ablation()),
                      SimpleNamespace(name="tiny", vocab_size=100, chat=False))
    assert set(report.comparisons) == {"fig4_rank_tail_HumanEval", "fig4_full_w_HumanEval",
                                       "fig4_whole_batch_HumanEval"}
    assert report.comparisons["fig4_rank_tail_HumanEval"].ours == pytest.approx(0.5)
    assert all(c.direction_only and not c.internal for c in report.comparisons.values())
    records = {"ours": {}, "paper": {}, "verdicts": {key: {**c.record(), "cause": c.cause}
                                                      for key, c in report.comparisons.items()}}
    assert uncited(records) == []
    assert "fig4_whole_batch_HumanEval" in report.takeaways["06_mixed_ablation"]


def _query_runs(tokens_per_call: dict[int, list[tuple[int, int]]]) -> pd.DataFrame:
    """:func:`specnb.experiments.ngrams.query_length_runs`-like rows of the mixed strategy on one set:
    {q: [(new tokens, calls) per prompt]}."""
    return pd.DataFrame([{"method": f"mixed q={q}", "prompt_id": i, "new_tokens": n, "calls": c, "seconds": 0.0,
                          "accepted": n - 1 - c, "set": "HumanEval", "strategy": "mixed", "q": q, "context_rows": c}
                         for q, prompts in tokens_per_call.items() for i, (n, c) in enumerate(prompts)])


def test_q1_advantage_is_over_the_best_other_query_length_paired_by_prompt():
    from specnb.experiments import ngrams

    # tokens per call (new tokens - 1) / calls, pooled over prompts: q = 1: 2.0, q = 2: 1.5, q = 3: 2.5
    runs = _query_runs({1: [(21, 10), (41, 20)], 2: [(16, 10), (31, 20)], 3: [(26, 10), (51, 20)]})
    table = ngrams.query_lengths(runs)
    assert table.tokens_per_call.tolist() == pytest.approx([2.0, 1.5, 2.5])
    value, low, high = ngrams.q1_advantage(runs, "HumanEval")
    assert value == pytest.approx(2.0 / 2.5)  # over q = 3, the best other, not over q = 2
    assert low <= value + 1e-12 and value <= high + 1e-12
    report = Results("99", "smoke")
    assert ngrams.judge_query_length(report, runs).equals(table)
    verdict = report.comparisons["q1_best_HumanEval"]
    assert verdict.verdict == "disagrees" and verdict.direction_only
    assert verdict.evidence["best other q"] == 3 and "q = 3 gives 2.50 tokens per call" in verdict.cause
    assert "06_context_query_length" in report.takeaways


def test_query_length_ratios_are_the_verdicts_paired_ratios_per_longer_q():
    from specnb.experiments import ngrams

    # mixed: q = 1: 2.0, q = 2: 1.5, q = 3: 2.5 tokens per call; context alone: 2.0, 1.0, 0.5
    mixed = _query_runs({1: [(21, 10), (41, 20)], 2: [(16, 10), (31, 20)], 3: [(26, 10), (51, 20)]})
    context = _query_runs({1: [(21, 10), (41, 20)], 2: [(11, 10), (21, 20)], 3: [(6, 10), (11, 20)]})
    runs = pd.concat([mixed, context.assign(strategy="context")], ignore_index=True)
    ratios = ngrams.query_length_ratios(runs)
    assert ratios.row.tolist() == ["mixed: q = 1 / q = 2", "mixed: q = 1 / q = 3 (best q > 1: the verdict)",
                                   "prompt lookup: q = 1 / q = 2", "prompt lookup: q = 1 / q = 3"]
    assert ratios.method.tolist() == ["mixed", "mixed", "pld", "pld"] and set(ratios.set) == {"HumanEval"}
    assert ratios.value.tolist() == pytest.approx([2.0 / 1.5, 2.0 / 2.5, 2.0, 4.0])
    verdict = ratios.iloc[1]  # the verdict's own ratio and interval, not a twin's
    assert (verdict.value, verdict.low, verdict.high) == ngrams.q1_advantage(runs, "HumanEval")
    assert tuple(ratios.iloc[2][["value", "low", "high"]]) == ngrams.q1_advantage(runs, "HumanEval", "context", (2,))
    assert (ratios.low <= ratios.value + 1e-12).all() and (ratios.value <= ratios.high + 1e-12).all()


def test_the_query_length_sweep_replays_each_q_of_both_strategies():
    from specnb.datastores.ngram_tables import BigramTable
    from specnb.drafters.context import ContextNgramDrafter
    from specnb.experiments import ngrams

    tokens = np.arange(10)  # token x is followed by x+1, ..., x+4 (mod 10), best first
    topk = (tokens[:, None] + np.arange(1, 5)[None]) % 10
    table = BigramTable(tokens, topk, np.zeros(topk.shape, np.float32), tokens.copy())
    rng = np.random.default_rng(0)
    refs = {"HumanEval": [(torch.tensor(rng.integers(0, 10, 12)), torch.tensor(np.tile(rng.integers(0, 10, 3), 5)))
                          for _ in range(3)]}
    runs = ngrams.query_length_runs(table, refs, k=4, w=3)
    assert len(runs) == 2 * 3 * 3 and set(runs.method) == {f"{s} q={q}" for s in ("mixed", "context")
                                                          for q in (1, 2, 3)}
    summary = ngrams.query_lengths(runs).set_index(["strategy", "q"])
    for q in (1, 2, 3):  # the context rows alone replay as the context drafter of that q
        alone = summarize(replay_rows("c", replay_many(lambda q=q: ContextNgramDrafter(4, 3, q, q),
                                                       refs["HumanEval"])), baseline="").iloc[0]
        assert summary.loc[("context", q)].tokens_per_call == pytest.approx(alone.tokens_per_call)
    assert (summary.tokens_per_call_low <= summary.tokens_per_call + 1e-12).all()
    ablation = ngrams.mixed_ablation(table, refs, k=4, w=3)  # the rows Fig. 4's statistics read, per prompt
    for prompt, sub in ablation.groupby("prompt"):
        ids, output = refs["HumanEval"][prompt]
        assert sub.context.iloc[0] == len(ids) + 1 and (sub.context.diff().dropna() == sub.accepted.iloc[:-1].to_numpy()
                                                         + 1).all()
    assert set(ablation.prompt) == {0, 1, 2} and (ablation.k == 4).all() and (ablation.w <= 3).all()


def test_the_query_sweep_figure_cuts_only_an_exact_tail():
    """The max_query figure drops a task's points from the first max_query where REST keeps exactly 100% with no
    interval through the longest, keeps a lone exact point and a 100% with an interval, and draws CREST's "most"
    band only where the shares come near it."""
    def task(name, share, low, high):
        return pd.DataFrame({"task": name, "max_query": [2, 4, 8, 16], "share": share, "share_low": low,
                             "share_high": high})

    table = pd.concat([task("code", [1.2, 1.0, 1.0, 1.0], [1.1, 1.0, 1.0, 1.0], [1.3, 1.0, 1.0, 1.0]),
                       task("chat", [0.9, 1.0, 1.1, 1.0], [0.8, 0.95, 1.0, 1.0], [1.0, 1.0, 1.2, 1.0])])
    view = cx.query_sweep_view(table)
    assert view.panels["code"].max_query.tolist() == [2, 4]  # 4, 8 and 16 exact: drawn up to 4
    assert view.panels["chat"].max_query.tolist() == [2, 4, 8, 16]  # only 16 exact: nothing cut
    assert view.notes.startswith("not drawn: exactly 100% (no interval) from max_query = 4 on code to 16")
    assert not view.band and "every share above" in view.notes and view.top == 1.3
    assert cx.query_sweep_view(table.assign(share_low=table.share_low - 0.5)).band


def test_table1s_10_10_is_judged_on_the_gpu_table_where_there_is_one(tmp_path):
    """The (10, 10) speedup priced on the paper's GPU class: tokens per call over a (10, 10) call's slow-down on the
    GPU table's Mistral-7B rows, its interval from the tokens per call's; nothing judged without a table."""
    from specnb.experiments import gpu_price, ngrams

    table = tmp_path / "roofline_gpu.csv"
    pd.DataFrame([{"context": 256, "k": k, "w": w, "seconds": s, "model": "random:mistral-7b",
                   "device": "NVIDIA Fake", "cuda_graphs": False}
                  for k, w, s in ((1, 0, 1.0), (10, 10, 1.25), (1, 10, 1.1))]).to_csv(table, index=False)
    rows = pd.DataFrame({"set": ["HumanEval", "MT-Bench"], "k": 10, "w": 10, "tokens_per_call": [3.0, 2.5],
                         "tokens_per_call_low": [2.8, 2.4], "tokens_per_call_high": [3.2, 2.6]})
    grids = gpu_price.add_gpu_column(rows, gpu_price.PAPER_SHAPES["ngrammys"], path=table)
    report = Results("99", "smoke")
    ngrams.judge_gpu_10_10(report, grids, table)
    human = report.comparisons["gpu_speedup_10_10_HumanEval"]
    assert (human.ours, human.low, human.high) == pytest.approx((3.0 / 1.25, 2.8 / 1.25, 3.2 / 1.25))
    assert human.verdict == "agrees" and "NVIDIA Fake" in human.claim  # 2.4 in the paper's 2.04-2.50
    assert report.comparisons["gpu_speedup_10_10_MT-Bench"].ours == pytest.approx(2.0)
    empty = Results("99", "smoke")
    ngrams.judge_gpu_10_10(empty, rows, table)
    assert not empty.comparisons


def test_table1s_estimates_are_judged_with_their_interval_over_prompts():
    """An estimate whose interval over prompts lies inside the timed interval agrees; one that straddles its edge is
    inconclusive, where the estimate as a single number would have flipped between agrees and disagrees."""
    from specnb.experiments import ngrams

    summary = pd.DataFrame([
        {"set": "HumanEval", "method": m, "speedup_vs_ar": 1.5, "speedup_vs_ar_low": 1.3, "speedup_vs_ar_high": 1.7,
         "outside_forward_fraction": 0.1, "k": k, "w": w, "tokens_per_call": 2.5}
        for m, k, w in (("ar", 1, 0), ("pld", 1, 10), ("mixed (1, 6)", 1, 6))])
    estimated = {"HumanEval": {"pld": {"speedup": 1.5, "low": 1.4, "high": 1.6},
                               "mixed (1, 6)": {"speedup": 1.72, "low": 1.5, "high": 1.9}}}
    grids = pd.DataFrame([{"set": "HumanEval", "k": 10, "w": 10, "tokens_per_call": 3.0, "tokens_per_call_low": 2.8,
                           "tokens_per_call_high": 3.2}])
    blocks = pd.DataFrame([{"context": 256, "k": 10, "w": 10, "slowdown": 10.0, "slowdown_low": 9.0,
                            "slowdown_high": 11.0}])

    class Cost:
        def seconds_at(self, k: int, w: int, context: int) -> float:
            return 0.01 * k * (w + 1) ** 0.5

    report = Results("99", "smoke")
    out = ngrams.judge_timed(report, summary, estimated, grids, blocks, Cost())
    pld, mixed = report.comparisons["estimate_HumanEval_pld"], report.comparisons["estimate_HumanEval_mixed (1, 6)"]
    assert (pld.low, pld.high) == (1.4, 1.6) and pld.verdict == "agrees"
    assert mixed.verdict == "inconclusive" and "drafting and the decode loop" in mixed.cause  # 1.72 > 1.7
    assert out["timed_best"]["HumanEval"]["estimated"] == 1.72
