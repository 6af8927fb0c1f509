"""Notebook 00, the quickstart: prompt lookup against our AR and Hugging Face's ``generate`` in one run, and
the comparisons it concludes from (:func:`judge_quickstart`). Its paper number, DReSD Table 3's prompt-lookup
speedup, is :data:`specnb.experiments.endtoend.CLAIMS`, judged with notebook 09's band through
:func:`specnb.experiments.endtoend.judge_table3`; the bench it times is
:func:`specnb.experiments.endtoend.bench_config`'s."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..study.verdicts import EXACT, TIE, Expect
from .endtoend import judge_table3

BASELINES = (("ar_hf", "ar", "hf"), ("pld_hf", "pld", "hf-pld"), ("hf_pld", "hf-pld", "hf"))
"""Notebook 00's speed comparisons in one process: (key, method, its baseline)."""

PLD_SETUP = {"model": "CodeLlama / Llama-2-Chat 7B and 13B (hidden 4096 / 5120)",
             "hardware": "one NVIDIA V100 32 GB GPU", "dtype": "not stated", "datastore": "none",
             "prompts × tokens": "100 CodeAlpaca × up to 128", "task": "code assistant"}
"""DReSD's setup for Table 3's prompt-lookup column (notebook 00's setup table)."""


def judge_quickstart(report: Any, rows: pd.DataFrame, summary: pd.DataFrame, here: dict[str, str]) -> None:
    """Notebook 00's setup table (``here``: ours, :func:`specnb.experiments.setups.here`, against
    :data:`PLD_SETUP`) and comparisons: prompt lookup's outputs equal AR's on every prompt (exact), its speedup
    over our AR inside DReSD Table 3's prompt-lookup range (:func:`specnb.experiments.endtoend.judge_table3`:
    judged once, since that range lies above 1), and each of :data:`BASELINES` faster than its baseline by more
    than a tie (internal). rows / summary: :func:`specnb.eval.bench.run_bench` rows and their
    :func:`specnb.experiments.summarize` (indexed by method). Also records the figure's takeaway."""
    from ..core.metrics import mean_interval
    from ..study.plots import label
    from .paired import versus

    report.setup("DReSD Table 3, PLD column", here=here, theirs=PLD_SETUP)
    dtype = here["dtype"]
    identical = rows[rows.method == "pld"].identical_to_ar.astype(float)
    report.compare("lossless", "share of prompts where prompt lookup's output equals our AR's", identical.mean(),
                   *mean_interval(identical), Expect.near(1.0, EXACT), "lossless greedy SD (tests/test_lossless.py)",
                   cause=f"rounding ({dtype}): a multi-token call can round a near-tie the other way "
                         "(first_divergence_gap in 00_per_prompt.csv)", fmt=".0%", internal=True, direction_only=False)
    r = summary.loc["pld"]
    evidence = {"tokens per call": r.tokens_per_call}
    judge_table3(report, "pld_paper", "our prompt lookup's speedup over our AR", "pld",
                 r[["speedup_vs_ar", "speedup_vs_ar_low", "speedup_vs_ar_high"]],
                 f"another model, task and machine (setup table): {r.tokens_per_call:.2f} tokens per call here; how "
                 "often the output re-types its context and what a 10-token call costs (notebook 05) decide it",
                 evidence)
    kernels = "the stock PyTorch kernels Hugging Face runs are as fast as ours on this machine (specnb.model.kernels)"
    causes = {"ar_hf": kernels, "pld_hf": kernels,
              "hf_pld": "its 10-token calls cost several one-token calls with stock kernels on this CPU (notebook 05)"}
    for key, method, base in BASELINES:
        if method in summary.index and base in summary.index:
            report.compare(key, f"{label(method)}: tokens/s over {label(base)}'s",
                           *versus(rows, method, base, "tokens_per_s"), Expect.above(1.0, TIE),
                           f"{label(base)} (this run)", cause=causes[key], internal=True, direction_only=False)
    report.takeaway("00_quickstart_speed", "prompt lookup ×{verdicts[pld_paper][ours]:.2f} "
                    "({verdicts[pld_paper][low]:.2f}–{verdicts[pld_paper][high]:.2f}) over our AR at "
                    "{verdicts[pld_paper][evidence][tokens per call]:.2f} tokens per call, its output identical on "
                    "{verdicts[lossless][ours]:.0%} of the prompts; DReSD Table 3's range: "
                    "{verdicts[pld_paper][verdict]}")
