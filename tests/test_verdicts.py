"""Verdicts computed from numbers and their intervals (specnb.study.verdicts, Results.compare / claim / setup) and the
degenerate-data rules (specnb.eval.checks): each rule has a test that fails when the rule is removed."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specnb.eval.checks import DegenerateData, check_effect, check_partial_acceptance, check_varies
from specnb.study.results import Results, cited_numbers, uncited, verdict_words
from specnb.study.verdicts import PUBLISHED, Comparison, Expect, finding, judge, source

NAN = math.nan


def test_judge_inside_outside_across():
    near = Expect.near(2.0, 0.2)  # [1.8, 2.2]
    assert judge(1.9, 2.1, near) == "agrees"
    assert judge(2.3, 2.6, near) == "disagrees"
    assert judge(1.0, 1.7, near) == "disagrees"
    assert judge(2.1, 2.4, near) == "inconclusive"
    assert judge(1.9, 1.9, near) == "agrees"  # a point
    assert judge(NAN, NAN, near) == "inconclusive"
    within = Expect.within(10.6, 13.5, 1.0)  # [9.6, 14.5]
    assert judge(11, 14, within) == "agrees" and judge(15, 18, within) == "disagrees"
    above = Expect.above(1.0, 0.05)  # > 1.05
    assert judge(1.1, 1.3, above) == "agrees"
    assert judge(0.97, 1.04, above) == "disagrees"  # a tie disagrees with "beats"
    assert judge(1.0, 1.2, above) == "inconclusive"
    assert judge(1.05, 1.2, above) == "inconclusive"  # touching the edge is not beyond it
    below = Expect.below(1.0)
    assert judge(0.5, 0.9, below) == "agrees" and judge(1.0, 1.1, below) == "disagrees"


def test_a_published_band_and_descriptions():
    expect = Expect.published([2.5])  # a published number: ± PUBLISHED of it
    assert expect.region == pytest.approx((2.25, 2.75))
    assert expect.describe() == "≈ 2.5 ± 0.25"
    assert Expect.within(10.6, 13.5).describe() == "in 10.6–13.5"
    assert Expect.above(1, 0.05).describe() == "> 1 + 0.05"
    with pytest.raises(ValueError):
        Expect.within(3, 2)


def test_a_tie_is_a_tie():
    assert finding(0.99, 1.01, 1.0, 0.02) == "tie"
    assert finding(1.03, 1.2, 1.0, 0.02) == "higher"
    assert finding(0.5, 0.9, 1.0, 0.02) == "lower"
    assert finding(0.99, 1.2, 1.0, 0.02) == "unclear"
    # MCSD's "decreasing shapes win": 2.9375 against 2.9375 is a tie and disagrees with "beats"
    tie = Comparison("4x2 over 2x4", 2.9375 - 2.9375, NAN, NAN, Expect.above(0.0, 0.01), "MCSD Fig. 4")
    assert tie.point and tie.verdict == "disagrees" and tie.finding == "tie"


def test_results_file_holds_every_verdict_and_its_inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("99", "smoke")
    verdict = report.compare("ratio", "CREST storage saving, code", 17.3, 15.1, 19.0, Expect.within(10.6, 13.5, 1.0),
                             "CREST §5", cause="8,000 n-grams per n against the paper's 1.6-2.2 M",
                             internal=False, direction_only=False, evidence={"n-grams per n": 8000})
    assert verdict == "disagrees"
    report.compare("same", "tokens per call", 2.0, 1.9, 2.1, Expect.near(2.0, 0.2), "replay", cause="unused",
                   internal=True, direction_only=False)
    report.setup("CREST", here={"model": "Gemma-3-270M", "prompts × tokens": "10 × 128"},
                 theirs={"model": "CodeLlama-7B", "hardware": "A100"})
    rendered = report.render("{verdicts}\n\n{verdict[ratio]}\n\n{setup}").data
    stored = json.loads((tmp_path / "99_results.json").read_text())["verdicts"]
    assert stored["ratio"]["verdict"] == "disagrees" and stored["ratio"]["region"] == [9.6, 14.5]
    assert stored["same"]["verdict"] == "agrees" and stored["same"]["cause"] == ""  # a cause only for the others
    assert stored["ratio"]["evidence"] == {"n-grams per n": 8000} and not stored["ratio"]["internal"]
    assert stored["same"]["internal"] and stored["ratio"]["lean"] is None
    assert "**disagrees** — 17.3 (15.1–19) against in 10.6–13.5 (± 1) (CREST §5); likely cause: 8,000" in rendered
    assert "| model | Gemma-3-270M | CodeLlama-7B |" in rendered and "| hardware | — | A100 |" in rendered


def test_a_claim_needs_an_interval_narrower_than_the_effect(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("99", "smoke")
    report.claim("gain", "CREST over REST", 0.35, 0.2, 0.5)
    assert report.ours["gain_low"] == 0.2
    with pytest.raises(DegenerateData, match="smaller than its 90% interval"):
        report.claim("gain", "chat storage ratio", 0.012, -0.05, 0.08)
    with pytest.raises(DegenerateData, match="without an interval"):
        check_effect(0.1, NAN, NAN, "x")


def rows(method: str, accepted: list[int], depth: list[int], calls: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"method": method, "accepted": accepted, "draft_depth": depth, "calls": calls})


def test_a_draft_accepting_everything_at_temperature_one_is_stopped():
    everything = rows("sd", [300, 300], [300, 300], [60, 60])
    with pytest.raises(DegenerateData, match="accepted every one of its 600 drafted tokens"):
        check_partial_acceptance(everything, 1.0)
    check_partial_acceptance(everything, 0.0)  # greedy: a deterministic draft may be right every time
    check_partial_acceptance(rows("sd", [60], [60], [33]), 1.0)  # a close pair's short run: 0.99^60 = 55%
    check_partial_acceptance(rows("sd", [299, 300], [300, 300], [60, 60]), 1.0)  # one rejection: fine
    check_partial_acceptance(everything.assign(method="ar"), 1.0)  # exempt


def test_the_runner_applies_the_acceptance_rule():
    """A draft model that *is* the target accepts everything at T = 1: run_bench() stops it (check=False lets a
    test that means it through)."""
    from conftest import tiny

    from specnb.core.prompts import Prompt
    from specnb.drafters.draft_model import DraftModelDrafter
    from specnb.eval.bench import BenchConfig, run_bench

    target = tiny("llama")
    itself = DraftModelDrafter(target, "1x1x1x1x1x1x1x1", target.vocab_size, temperature=1.0)
    texts = ["def fib(n):", "import os\nimport sys\n", "class A:\n", "for i in range(10):\n", "x = [1, 2, 3]\n",
             "while True:\n", "# a comment\n", "print('hello')\n"]
    prompts = [Prompt(f"p{i}", text) for i, text in enumerate(texts)]  # ~900 drafted tokens, all accepted
    with pytest.raises(DegenerateData, match="sd"):
        run_bench(target, prompts, BenchConfig([], 150, temperature=1.0, made={"sd": itself}, warmup_tokens=0),
                  progress=False)
    out = run_bench(target, prompts, BenchConfig([], 150, temperature=1.0, made={"sd": itself}, warmup_tokens=0,
                                                 check=False), progress=False)
    assert (out[out.method == "sd"].accepted == out[out.method == "sd"].draft_depth).all()


def test_a_constant_series_is_a_sentence_not_a_figure():
    check_varies([0.1, 0.2], "ok")
    for values, kind in (([0, 0, 0], "all zero"), ([1.0, 1.0, NAN], "constant at 1"), ([3.0], "1 finite")):
        with pytest.raises(DegenerateData, match=kind):
            check_varies(values, "acceptance vs k")


def test_an_inconclusive_verdict_leans_to_its_centre_and_flags_are_kept():
    above = Expect.above(1.0, 0.02)
    leaning_in = Comparison("a over b", 1.1, 0.99, 1.3, above, "DReSD Fig. 4", direction_only=True)
    leaning_out = Comparison("a over b", 1.0, 0.9, 1.05, above, "DReSD Fig. 4", direction_only=True)
    assert leaning_in.verdict == leaning_out.verdict == "inconclusive"
    assert (leaning_in.lean, leaning_out.lean) == ("agrees", "disagrees")
    agrees = Comparison("a over b", 1.2, 1.1, 1.3, above, "DReSD Fig. 4", direction_only=True)
    assert agrees.lean is None and verdict_words(agrees.record()) == "agrees (direction only)"
    assert verdict_words(leaning_out.record()) == "inconclusive, leans disagrees"
    internal = Comparison("ours over AR", 1.2, 1.1, 1.3, above, "AR (ours)", internal=True).record()
    assert verdict_words(internal) == "agrees; internal" and source(internal) == "internal"
    assert source(agrees.record()) == "DReSD" and source(Comparison("x", 1, 1, 1, above, "ArcticInference docs")
                                                         .record()) == "other"
    assert Comparison("x", 1.0, NAN, NAN, above, "y").lean is None  # a point is never inconclusive but as NaN


def test_a_published_number_gets_one_band_wherever_it_is_judged():
    """Notebooks 00 and 09 judge DReSD Table 3's prompt-lookup speedup through one function: the same band."""
    from specnb.experiments.endtoend import CLAIMS

    pld = CLAIMS.speedups["pld"]
    band, mean = Expect.published(pld), sum(pld) / len(pld)
    assert band.region == pytest.approx((min(pld) - PUBLISHED * mean, max(pld) + PUBLISHED * mean))
    assert Expect.published([2.0]).region == pytest.approx((1.8, 2.2))


def test_a_cause_citing_a_number_the_file_does_not_hold_is_listed():
    assert [(w, v) for w, v, _, _ in cited_numbers("27,063 keys, 15% of calls, 9.4 M tokens; Fig. 4, §5.3, "
                                                   "notebook 05, a V100 and 7B–13B models")] == \
        [("27,063", 27063.0), ("15%", 15.0), ("9.4 M", 9.4)]
    record = {"ours": {"keys": 27063, "share": 0.1512}, "paper": {"tokens": "19–31 M tokens"},
              "verdicts": {"a": {"cause": "a store of 27,063 keys; 15% of calls; the paper's 19–31 M; 2.19 tokens",
                                 "evidence": {}, "claim": "2.19 in a claim is no evidence"}}}
    assert uncited(record) == ["a: 2.19"]
    record["verdicts"]["a"]["evidence"] = {"tokens per call": 2.1912}
    assert uncited(record) == []


def test_every_tolerance_is_a_named_one():
    """One tolerance per kind of claim: no comparison in specnb/ or the notebooks writes its tolerance as a bare
    number (a literal 0.02 here and 0.05 there for the same kind of claim is what this rules out)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sources = {p: p.read_text() for p in (root / "specnb").rglob("*.py")}
    for p in (root / "notebooks").glob("[0-9][0-9]_*.ipynb"):
        cells = json.loads(p.read_text())["cells"]
        sources[p] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    position = {"near": 1, "above": 1, "below": 1, "within": 2}
    literal = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "Expect" and \
                    node.func.attr in position:
                given = node.args[position[node.func.attr]:] + [k.value for k in node.keywords
                                                                 if k.arg == "tolerance"]
                literal += [f"{path.name}:{node.lineno}" for arg in given
                            if isinstance(arg, ast.Constant) and arg.value != 0]
    assert literal == []
