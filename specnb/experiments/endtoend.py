"""The end-to-end table (notebook 09; DReSD Table 3, Spec-Bench style): every bench method and the Hugging Face
baselines on one prompt set, one temperature, in one process (:func:`specnb.experiments.run`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..bench import BenchConfig, bench_runners
from ..methods import options_for
from ..models import LoadedModel
from ..prompts import Prompt
from .runner import run, summarize

METHODS = ("ar", "pld", "ngram-bigram", "mixed", "mixed-adaptive", "rest", "crest", "dense", "dense-id",
           "rest-priced", "crest-priced", "dense-priced", "sd", "mcsd", "hf", "hf-pld", "hf-assisted")
"""Labels of the table: bench method names, and ``dense-id`` (DReSD on the in-distribution store)."""


def method_specs(stores: dict[str, Path], draft: str, methods: tuple[str, ...] = METHODS) -> dict[str, tuple]:
    """{label: (bench method, {option: value})}: each retrieval method on its study store (``-priced`` on its
    base method's), the draft-model methods with ``draft``. ``hf-assisted`` needs a loadable draft model, so
    it is left out for a ``self:L`` draft."""
    specs = {}
    for label in methods:
        name = "dense" if label == "dense-id" else label
        given: dict = {}
        base = label.removesuffix("-priced")
        if base in stores:
            given["datastore"] = str(stores[base])
        if name in ("sd", "mcsd", "hf-assisted"):
            if name == "hf-assisted" and draft.startswith("self:"):
                continue
            given["draft"] = draft
        specs[label] = (name, given)
    return specs


def run_specs(target: LoadedModel, prompts: list[Prompt], specs: dict[str, tuple], *, temperature: float,
              max_new_tokens: int, warmup: int = 8, progress: bool = False) -> pd.DataFrame:
    """:func:`specnb.experiments.run`'s rows (one per label and prompt) for {label: (bench method, {option:
    value})}, each method's drafter made once for the whole prompt list."""
    run_values = {"temperature": temperature, "top_p": 1.0, "seed": 0}
    config = BenchConfig(["ar"], max_new_tokens=max_new_tokens, temperature=temperature)
    options = {label: (name, options_for([name], given, run=run_values)[name])
               for label, (name, given) in specs.items()}
    runners, counter = bench_runners(target, config, options)
    try:
        return run(target, prompts, runners, temperature=temperature, max_new_tokens=max_new_tokens, warmup=warmup,
                   progress=progress)
    finally:
        counter.remove()


def end_to_end(target: LoadedModel, prompts: list[Prompt], specs: dict[str, tuple], *, temperature: float,
               max_new_tokens: int, warmup: int = 8, progress: bool = False) -> pd.DataFrame:
    """One summary row per label (:func:`specnb.experiments.summarize`, speedup vs our AR) plus
    ``speedup_vs_hf``: Hugging Face ``generate``'s total wall time over the method's, and, for greedy outputs
    that differ from our AR's, ``divergence_gap``: the largest top-2 logit gap of our AR at a first divergence
    (NaN where none differs; a gap within a few bf16 roundings means two kernels rounded a near-tie apart)."""
    rows = run_specs(target, prompts, specs, temperature=temperature, max_new_tokens=max_new_tokens, warmup=warmup,
                     progress=progress)
    summary = summarize(rows)
    if "hf" in specs:
        summary["speedup_vs_hf"] = rows.loc[rows.method == "hf", "seconds"].sum() / summary.seconds
    diverged = "first_divergence_gap" in rows  # only when some greedy output differs
    summary["divergence_gap"] = summary.method.map(rows.groupby("method").first_divergence_gap.max()) \
        if diverged else float("nan")
    return summary
