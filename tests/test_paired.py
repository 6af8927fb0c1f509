"""specnb.experiments.paired (one method against another, paired by prompt), the words a conclusion picks from a
finding, and the "here" side of a setup table (specnb.experiments.setups)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import tiny

from specnb.experiments.paired import FINDING_WORDS, difference, findings, mean_across, mean_versus, versus
from specnb.experiments.setups import here
from specnb.study.results import Results
from specnb.study.verdicts import Expect


def rows(method: str, tokens: list[int], seconds: list[float], rates: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"method": method, "prompt_id": [f"p{i}" for i in range(len(tokens))], "new_tokens": tokens,
                         "seconds": seconds, "calls": [t // 2 for t in tokens], "accepted": [t // 4 for t in tokens],
                         "acceptance_rate": rates})


def test_versus_is_the_ratio_of_totals_with_a_paired_interval():
    frame = pd.concat([rows("a", [64, 64, 64, 64], [1.0, 2.0, 1.5, 1.2], [0.2, 0.3, np.nan, 0.25]),
                       rows("b", [64, 64, 64, 64], [2.0, 4.1, 2.9, 2.5], [0.1, 0.2, 0.1, 0.1])], ignore_index=True)
    value, low, high = versus(frame, "a", "b", "tokens_per_s")
    assert value == pytest.approx((256 / 5.7) / (256 / 11.5))
    assert low <= value <= high and low > 1.5  # every prompt about twice as fast: a narrow paired interval
    assert versus(frame, "a", "b", ("one", "seconds"))[0] == pytest.approx(11.5 / 5.7)  # the speedup
    ratio, low, high = mean_versus(frame, "a", "b", "acceptance_rate")  # the NaN prompt's pair is dropped
    assert ratio == pytest.approx(np.mean([0.2, 0.3, 0.25]) / np.mean([0.1, 0.2, 0.1])) and low <= ratio <= high
    assert all(math.isnan(v) for v in versus(frame[frame.prompt_id == "p0"], "a", "b", "tokens_per_s"))


def test_mean_across_compares_two_prompt_sets_unpaired():
    """Two methods on different prompts (3 and 5 of them, ids overlapping by chance): each side's own mean, NaN
    dropped, and an interval resampling each side apart (paired, the shorter side could not be resampled at all).
    A side of one prompt gives no ratio."""
    frame = pd.concat([rows("chat", [64] * 3, [1.0] * 3, [0.1, 0.2, np.nan]),
                       rows("code", [64] * 5, [1.0] * 5, [0.4, 0.5, 0.3, 0.4, 0.4])], ignore_index=True)
    ratio, low, high = mean_across(frame, "chat", "code", "acceptance_rate")
    assert ratio == pytest.approx(0.15 / 0.4) and low < ratio < high and high < 0.6
    assert mean_across(frame, "code", "chat", "acceptance_rate")[0] == pytest.approx(0.4 / 0.15)
    assert all(math.isnan(v) for v in mean_across(frame[frame.prompt_id != "p1"], "chat", "code", "acceptance_rate"))


def test_difference_pairs_the_samples():
    value, low, high = difference(np.array([1.0, 0.5, 1.0, 1.0]), np.array([0.5, 0.5, 0.5, 0.5]))
    assert value == pytest.approx(0.375) and 0 <= low <= value <= high <= 0.5


def test_findings_name_each_comparison_and_a_missing_value(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("99", "smoke")
    report.compare("faster", "a over b", 1.3, 1.2, 1.4, Expect.above(1.0, 0.02), "b", internal=True,
                   direction_only=False)
    report.compare("tie", "a over b", 1.0, 0.99, 1.01, Expect.above(1.0, 0.02), "b", internal=True,
                   direction_only=False)
    report.compare("none", "a over b", math.nan, math.nan, math.nan, Expect.above(1.0, 0.02), "b", internal=True,
                   direction_only=False)
    words = findings(report)
    assert words["faster"] == FINDING_WORDS["higher"] and words["tie"] == FINDING_WORDS["tie"]
    assert words["none"].startswith("not measured")


def test_the_setup_states_the_model_the_machine_and_the_dtype():
    setup = here(tiny("llama"), prompts_tokens="2 × 8", datastore="none")
    assert setup["model"].startswith("tiny-llama (hidden ") and setup["dtype"] == "float32"
    assert setup["hardware"] and setup["prompts × tokens"] == "2 × 8" and setup["datastore"] == "none"
