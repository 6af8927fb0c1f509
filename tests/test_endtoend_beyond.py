"""Notebooks 09 and 10's helpers: greedy identity in words, the comparisons they record (verdicts computed, never
typed), and the retrieval ceiling per prompt."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from conftest import tiny

from specnb.core.prompts import Prompt
from specnb.draft_shapes import SelfDraft
from specnb.experiments import beyond as bt
from specnb.experiments import endtoend as e2e
from specnb.experiments import quickstart
from specnb.study.results import Results, uncited
from tests.test_priced import LinearCost


def timed_rows(seconds: dict[str, list[float]], per_call: dict[str, float], new_tokens: int = 33) -> pd.DataFrame:
    """run_bench-like rows: every method on the same prompts, ``new_tokens`` each; ``per_call`` tokens per call."""
    rows = []
    for method, times in seconds.items():
        for i, s in enumerate(times):
            calls = round((new_tokens - 1) / per_call[method])
            rows.append({"method": method, "prompt_id": f"p{i}", "new_tokens": new_tokens, "seconds": s,
                         "calls": calls, "accepted": new_tokens - 1 - calls, "drafted_nodes": 4 * calls,
                         "draft_depth": 4 * calls, "identical_to_ar": True})
    return pd.DataFrame(rows)


def test_priced_dresd_reads_the_id_store():
    stores = {"rest": "r", "crest": "c", "dense": "ood", "dense-id": "id"}
    config = e2e.bench_config(stores, SelfDraft(2), ("dense-id", "dense-priced", "rest-priced"), max_new_tokens=8,
                              dense_shape=e2e.DRESD_SHAPE, store_of=e2e.PRICED_STORES)
    assert config.methods == ["ar", "dense-id", "dense-priced", "rest-priced"]
    assert config.method("dense-id") == "dense" and config.method("dense-priced") == "dense-priced"
    options = config.options
    assert (options["dense-id"].datastore, options["dense-id"].draft_shape) == ("id", (3, 20))  # parsed at the edge
    assert options["dense-priced"].datastore == "id" and options["rest-priced"].datastore == "r"


def test_identity_says_what_the_divergences_are():
    rows = pd.DataFrame({"method": ["ar", "pld", "pld", "hf", "hf"], "identical_to_ar": [True, True, True, True, False],
                         "first_divergence_gap": [math.nan, math.nan, math.nan, math.nan, 0.01],
                         "gap_within_rounding": [math.nan, math.nan, math.nan, math.nan, True]})
    found = e2e.identity(rows)
    assert found["ours"] == {"identical": 2, "total": 2, "max_gap": found["ours"]["max_gap"], "within_rounding": True}
    assert math.isnan(found["ours"]["max_gap"])
    assert found["hf"]["identical"] == 1 and found["hf"]["max_gap"] == 0.01 and found["hf"]["within_rounding"]
    text = e2e.identity_text(found).format(ours={"identity": found})
    assert "all 2 greedy outputs of our methods equal" in text
    assert "1 of 2 greedy outputs of Hugging Face's" in text and "within bf16 rounding (at most 0.01)" in text


def test_end_to_end_comparisons_are_computed_against_table3(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("99", "smoke")
    times = {"ar": [1.0, 1.1, 0.9, 1.0], "hf": [2.0, 2.2, 1.8, 2.0], "hf-pld": [1.2, 1.3, 1.1, 1.2],
             "pld": [0.5, 0.55, 0.45, 0.5], "rest": [1.0, 1.1, 0.9, 1.0], "dense-id": [1.5, 1.6, 1.4, 1.5],
             "rest-priced": [0.9, 1.0, 0.8, 0.9]}
    rows = timed_rows(times, {"ar": 1, "hf": 1, "hf-pld": 2, "pld": 2, "rest": 1.2, "dense-id": 1.4,
                              "rest-priced": 1.2})
    summary = e2e.table(rows)
    e2e.compare_with_papers(report, rows, summary, LinearCost(0.05), {"rest": 27_000, "dense-id": 40_000},
                            tiny("gemma3"), rest_store="code-OOD")
    verdicts = {k: c.verdict for k, c in report.comparisons.items()}
    assert verdicts["table3_pld"] == "agrees"  # 2x, inside PLD's 1.11-2.21
    assert verdicts["table3_rest"] == "disagrees" and verdicts["table3_dense-id"] == "disagrees"
    assert "store of 40 k tokens" in report.comparisons["table3_dense-id"].cause
    assert verdicts["ar_vs_hf"] == "agrees" and verdicts["pld_vs_hf_pld"] == "agrees"
    assert verdicts["dense_id_vs_rest"] == "disagrees"
    assert "dense_id_vs_ood" not in verdicts and "dense_priced_vs_dense" not in verdicts  # these did not run
    assert verdicts["rest_priced_vs_rest"] == "agrees"
    # the fastest, pld, is judged once: Table 3's range for it lies above 1
    assert report.ours["fastest"] == "pld" and "fastest_vs_ar" not in verdicts
    kinds = {k: (c.internal, c.direction_only) for k, c in report.comparisons.items()}
    assert kinds["table3_pld"] == (False, False) and kinds["dense_id_vs_rest"] == (False, True)
    assert kinds["ar_vs_hf"] == (True, False) and kinds["rest_priced_vs_rest"] == (True, False)
    assert report.comparisons["table3_rest"].evidence["store tokens"] == 27_000
    written = json.loads(report.write().read_text())
    assert uncited(written) == []  # every number a cause cites is in the file
    # the front page's line names the priced tree too (09 named 3 of its rows and left out the fastest retrieval)
    assert written["takeaways"]["09_end_to_end"].endswith("; the trees cut to what pays here: REST ×1.11")
    assert e2e.tally(report, "table3_") == {"total": 3, "agrees": 1, "disagrees": 2, "inconclusive": 0}
    here = report.setups["DReSD Table 3"]["here"]
    assert here["datastore"] == ("REST: 27,000 tokens of code (out of distribution); "
                                 "DReSD: 40,000 tokens of the target's answers (in distribution)")
    assert here["dtype"] == "float32 (specnb's decoder)"


def test_the_quickstart_judges_prompt_lookup_once_with_the_band_of_notebook_09(tmp_path, monkeypatch):
    """Notebook 00 (experiments.quickstart): its paper number is endtoend's data; its prompt-lookup speedup is
    judged once, against DReSD Table 3 with the band notebook 09 uses for the same number."""
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    rows = timed_rows({"ar": [1.0, 1.1, 0.9, 1.0], "pld": [0.5, 0.55, 0.45, 0.5], "hf": [2.0, 2.2, 1.8, 2.0],
                       "hf-pld": [1.2, 1.3, 1.1, 1.2]}, {"ar": 1, "pld": 2, "hf": 1, "hf-pld": 2})
    quick, full = Results("00", "smoke"), Results("09", "smoke")
    here = {"model": "tiny", "dtype": "float32"}
    quickstart.judge_quickstart(quick, rows, e2e.table(rows).set_index("method"), here)
    e2e.compare_with_papers(full, rows, e2e.table(rows), LinearCost(0.05), {}, tiny("gemma3"),
                            rest_store="code-OOD")
    assert set(quick.comparisons) == {"lossless", "pld_paper", "ar_hf", "pld_hf", "hf_pld"}
    assert quick.comparisons["pld_paper"].expect == full.comparisons["table3_pld"].expect
    assert [k for k, c in quick.comparisons.items() if not c.internal] == ["pld_paper"]
    assert quick.setups["DReSD Table 3, PLD column"]["paper"] == quickstart.PLD_SETUP
    assert uncited(json.loads(quick.write().read_text())) == []


def test_a_tie_with_rest_is_not_a_win():
    report = Results("99", "smoke")
    rows = timed_rows({"ar": [1.0] * 4, "rest": [0.8, 0.9, 0.7, 0.8], "dense-id": [0.8, 0.9, 0.7, 0.8]},
                      {"ar": 1, "rest": 1.5, "dense-id": 1.5})
    e2e.compare_with_papers(report, rows, e2e.table(rows), LinearCost(0.05), {}, tiny("gemma3"),
                            rest_store="code-OOD")
    assert report.comparisons["dense_id_vs_rest"].verdict == "disagrees"
    assert report.comparisons["dense_id_vs_rest"].finding == "tie"


def test_the_retrieval_ceiling_per_prompt_sums_to_the_sets(isolated_cache):
    target = tiny("llama")
    prompts = [Prompt("a", text="def add(a, b):\n    return a + b\n"), Prompt("b", text="def add(a, b):"),
               Prompt("c", text="hello world hello world")]
    sets = {"s": prompts}
    frame = bt.ceiling_prompts(target, sets, max_new_tokens=12)
    assert list(frame.prompt_id) == ["a", "b", "c"] and (frame.produced == 11).all()
    assert bt.set_ceilings(frame)["s"] == pytest.approx(bt.ceilings(target, sets, max_new_tokens=12)["s"])


def test_beyond_comparisons_cover_every_set_and_the_published_numbers(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    summaries = []
    for name in ("code", "multi-turn chat"):
        rows = timed_rows({"ar": [1.0] * 4, "pld": [0.6] * 4, "suffix": [0.5, 0.55, 0.5, 0.45],
                           "recycle": [0.7] * 4, "auto": [0.52] * 4},
                          {"ar": 1, "pld": 1.8, "suffix": 2.2, "recycle": 1.5, "auto": 2.1})
        summary = e2e.table(rows).assign(set=name, held_bytes=2**20)
        ceiling = pd.DataFrame({"set": name, "prompt_id": [f"p{i}" for i in range(4)], "produced": 32, "calls": 10})
        bt._against_ceiling(summary, rows, ceiling)
        for label, baseline in (("best_single", "suffix"), ("pld", "pld")):
            intervals = bt.speedup_intervals(rows, baseline)
            summary[f"vs_{label}_low"] = summary.method.map({m: v[0] for m, v in intervals.items()})
            summary[f"vs_{label}_high"] = summary.method.map({m: v[1] for m, v in intervals.items()})
        summaries.append(summary)
    summary = pd.concat(summaries, ignore_index=True)
    report = Results("99", "smoke")
    router = {name: {"auto_vs_pld": 1.1, "hindsight_vs_pld": 1.3} for name in ("code", "multi-turn chat")}
    found = bt.compare_beyond(report, summary, {"code": 3.2, "multi-turn chat": 3.2}, router, LinearCost(0.05),
                              setup={"model": "tiny"})
    assert found["code"]["best_single"] == "suffix"
    keys = set(report.comparisons)
    assert {"auto_vs_best_code", "auto_vs_pld_code", "suffix_tpc_code", "suffix_ceiling_code",
            "suffix_published_code", "suffix_vs_ngram_published_code", "recycle_published", "recycle_storage"} <= keys
    assert report.comparisons["suffix_ceiling_code"].verdict == "agrees"  # ~2.2 of 3.2: under the ceiling
    assert report.comparisons["auto_vs_pld_code"].verdict == "agrees"
    assert report.comparisons["recycle_storage"].verdict == "agrees"  # 1 MB < 2 MB
    assert set(report.setups) == {"SuffixDecoding (ArcticInference docs)", "Token Recycling (arXiv 2408.08696)"}
    assert report.comparisons["auto_vs_pld_code"].internal and not report.comparisons["recycle_published"].internal
    assert uncited(json.loads(report.write().read_text())) == []


def test_table3_is_judged_on_the_gpu_tables_price_where_the_summary_has_it():
    """Each Table 3 method's tokens per call over its calls' GPU price, a point against the paper's range; a summary
    without ``est_speedup_gpu`` judges nothing."""
    summary = pd.DataFrame({"method": ["ar", "pld", "rest"], "tokens_per_call": [1.0, 2.4, 3.0],
                            "draft_nodes_per_call": [0.0, 10.0, 40.0], "est_speedup_gpu": [1.0, 2.0, 0.5]}
                           ).set_index("method")
    names = {"pld": "prompt lookup", "rest": "REST"}
    report = Results("99", "smoke")
    e2e.judge_table3_gpu(report, summary, names)
    pld, rest = report.comparisons["gpu_table3_pld"], report.comparisons["gpu_table3_rest"]
    assert (pld.ours, pld.verdict, rest.verdict) == (2.0, "agrees", "disagrees")
    assert "×1.20 a one-token call" in pld.cause and "×6.00" in rest.cause
    empty = Results("99", "smoke")
    e2e.judge_table3_gpu(empty, summary.drop(columns="est_speedup_gpu"), names)
    assert not empty.comparisons
