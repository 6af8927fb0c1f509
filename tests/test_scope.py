"""Claims bound to the papers' hardware or model (specnb.study.scope): measured, shown with what their numbers gave,
and counted apart as "not tested here" where the run's setup differs in that respect, never as agreements or
disagreements."""

from __future__ import annotations

import json
from fnmatch import fnmatch
from pathlib import Path

import pytest

from specnb.study.reference_run import index
from specnb.study.scope import BOUND, UNTESTED, scoped
from specnb.study.verdicts import Comparison, Expect

ROOT = Path(__file__).resolve().parents[1]


def _record(low: float, high: float, against: str = "DReSD Table 3", internal: bool = False) -> dict:
    return Comparison("a speedup", (low + high) / 2, low, high, Expect.above(1.0, 0.02), against, "a cause",
                      internal=internal, direction_only=False).record()


def _setups(hardware: str) -> dict:
    return {"DReSD Table 3": {"here": {"hardware": hardware, "model": "gemma-3-270m"},
                              "paper": {"hardware": "one NVIDIA V100 32 GB GPU", "model": "CodeLlama 7B"}}}


def test_a_gpu_speed_timed_on_a_cpu_is_not_tested_and_says_why():
    verdicts = {"table3_rest": _record(0.5, 0.9), "tokens": _record(0.5, 0.9),
                "table3_internal": _record(0.5, 0.9, internal=True)}
    cpu = _setups("AMD EPYC (avx512bf16, 2 threads)")
    out = scoped("09", verdicts, cpu)
    assert out["table3_rest"]["verdict"] == UNTESTED and out["table3_rest"]["measured_verdict"] == "disagrees"
    assert "V100" in out["table3_rest"]["untested"] and "AMD EPYC" in out["table3_rest"]["untested"]
    assert out["tokens"] == verdicts["tokens"]  # a claim any setup tests
    assert out["table3_internal"] == verdicts["table3_internal"]  # our own check: judged
    assert scoped("09", out, cpu) == out  # a file written scoped reads the same
    on_a_gpu = scoped("09", verdicts, _setups("one NVIDIA H100 80GB"))
    assert on_a_gpu["table3_rest"]["verdict"] == "disagrees"  # the paper's hardware class: tested


def test_a_number_of_the_papers_model_is_not_tested_on_another():
    setups = {"DReSD": {"here": {"model": "gemma-3-270m (hidden 640)"}, "paper": {"model": "CodeLlama 7B (4096)"}}}
    out = scoped("02", {"variance_64": _record(0.55, 0.6, against="DReSD §5.2, Fig. 5")}, setups)
    assert out["variance_64"]["verdict"] == UNTESTED
    assert "CodeLlama 7B" in out["variance_64"]["untested"] and "gemma-3-270m" in out["variance_64"]["untested"]


def test_the_front_page_counts_untested_claims_apart(tmp_path):
    from test_front_page import _run

    _run(tmp_path)
    (tmp_path / "09_results.json").write_text(json.dumps({
        "verdicts": {"table3_rest": _record(0.5, 0.9), "other": _record(1.1, 1.3)},
        "setup": _setups("AMD EPYC")}))
    page = index(tmp_path)
    assert "| DReSD | 1 | 1 (0) | 0 | 0 (0 / 0) | 1 |" in page
    assert "**not tested here (measured: disagrees)**" in page and "a speed on one NVIDIA V100" in page


@pytest.mark.parametrize("prefix", sorted(BOUND))
def test_every_bound_pattern_names_a_comparison_of_the_published_run(prefix):
    """A renamed comparison key would silently fall out of the scope: each pattern must match one."""
    keys = json.loads(next((ROOT / "figures").glob(f"{prefix}_results.json")).read_text())["verdicts"]
    assert [p for p in BOUND[prefix] if not any(fnmatch(k, p) for k in keys)] == []
