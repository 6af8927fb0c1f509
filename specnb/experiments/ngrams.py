"""The learning-free batched drafts of N-Grammys (notebook 06; the tables also serve notebook 08): the model's
unigram and bigram tables restricted to what the prompts need, top-k curves, the mixed strategy's (k, w) grid and
ablation (with §5.2's statements on it), the context's query length (footnote 2), the timed comparison of its
shapes (N-Grammys Table 1), and the comparisons with the paper.

Replayed numbers come with 90% intervals over the prompts; timed ones with the paired interval over the prompts
of :func:`specnb.experiments.summarize`; the cost of one call, timed with :func:`specnb.eval.timing.time_cells`, with
its spread over the timed passes. Estimated speedups price the replayed calls with the roofline table
(:mod:`specnb.experiments.grids`) and are put next to the timed ones they estimate.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.datasets import humaneval, mtbench
from ..core.metrics import bootstrap_interval
from ..core.prompts import Prompt
from ..core.roofline import GPU_CSV, CostModel, device_name
from ..datastores.ngram_tables import BigramTable, bigram_table, default_restriction, unigram_ranking
from ..drafters.context import ContextNgramDrafter
from ..drafters.mixed import MixedDrafter, accepted_rank, accepted_strategy
from ..drafters.model_ngram import BigramDrafter, UnigramDrafter
from ..eval.bench import BenchConfig, run_bench
from ..eval.replay import Reference, ar_priced_seconds, replay_many
from ..eval.runner import Variant, summarize
from ..eval.timing import Grid, cost_table, time_cells
from ..model.models import LoadedModel
from ..study.profiles import get_profile
from ..study.verdicts import TIE, TOKENS_PER_CALL, Expect
from .gpu_price import COLUMN as GPU_COLUMN
from .gpu_price import PAPER_SHAPES, add_gpu_column, gpu_cost_model
from .grids import mixed_grid, replay_rows, replay_summary
from .references import greedy_references

PAPER = "N-Grammys"


@dataclass(frozen=True)
class NgrammysClaims:
    """N-Grammys' numbers, judged by this module's ``judge_*`` and stated beside ours by notebook 06
    (``report.paper(**ngrams.CLAIMS.stated())``)."""

    table1: dict[str, dict[str, tuple[float, float]]]  # Table 1: {set: {quantity: range over 3B / 7B / 13B}}
    fig2_gain: float  # §4.1 / Fig. 2: the extended bigram (w = 2) at top-25, tokens per call − 1
    source: str

    def span(self, quantity: str) -> str:
        """The range of ``quantity`` over Table 1's sets: ``2.13–2.89``."""
        ends = [n for row in self.table1.values() for n in row[quantity]]
        return f"{min(ends):.2f}–{max(ends):.2f}"

    def stated(self) -> dict[str, object]:
        """{name: the paper's number as the notebook's text states it} (``{paper[name]}`` in its template)."""
        return {**{q: self.span(q) for q in ("tpc_10_10", "speedup_10_10", "speedup_best")},
                "fig2_gain": f"≈ {self.fig2_gain:.0%}", "source": self.source}


CLAIMS = NgrammysClaims(
    table1={  # the range over its 3B / 7B / 13B targets (A100, bfloat16)
        "HumanEval": {"tpc_10_10": (2.22, 2.89), "speedup_10_10": (2.04, 2.50), "tpc_best": (2.19, 2.91),
                      "speedup_best": (2.05, 2.77)},
        "MT-Bench": {"tpc_10_10": (2.13, 2.78), "speedup_10_10": (1.91, 2.31), "tpc_best": (2.13, 2.68),
                     "speedup_best": (1.91, 2.45)}},
    fig2_gain=0.5, source="N-Grammys Table 1, Fig. 2 (3B–13B targets, A100)")

GRID_KS, GRID_WS = [1, 5, 10, 20, 25], list(range(2, 15, 2))  # N-Grammys §5: the (k, w) grid of Table 1 / Fig. 3
TOPK = [1, 2, 5, 10, 15, 20, 25]  # the k of N-Grammys Fig. 2
TABLE1_BLOCK = (10, 10)  # N-Grammys Table 1's default shape
QUERY_LENGTHS = (1, 2, 3)  # N-Grammys §5, footnote 2: q = 2, 3 degrade speed-up and tokens per call against q = 1
PAPER_VOCABULARY = 32_000  # Mistral-7B's (N-Grammys Figs. 2-4)


def prompt_sets(n_prompts: int) -> dict[str, list[Prompt]]:
    """The first ``n_prompts`` of HumanEval and of MT-Bench (first turns), by set name."""
    return {"HumanEval": humaneval(n_prompts), "MT-Bench": mtbench(n_prompts)}


def references(target: LoadedModel, sets: dict[str, list[Prompt]], max_new_tokens: int
               ) -> dict[str, list[Reference]]:
    """The target's cached greedy references of every set (:func:`specnb.experiments.references.greedy_references`)."""
    return {name: greedy_references(target, prompts, max_new_tokens) for name, prompts in sets.items()}


def tables(target: LoadedModel, references: dict[str, list[Reference]], profile: str
           ) -> tuple[BigramTable, str, np.ndarray, CostModel]:
    """(the bigram table and how its rows are chosen (:func:`restricted_bigram_table`), the unigram ranking, the
    roofline cost model of this target on this machine (the profile's ``cost_grid``: ``adaptive``; ``smoke``: the
    smoke grid))."""
    table, note = restricted_bigram_table(target, references)
    cost = CostModel(cost_table(target, get_profile(profile).cost_grid, progress=False))
    return table, note, unigram_ranking(target), cost


def restricted_bigram_table(target: LoadedModel, references: dict[str, list[Reference]]) -> tuple[BigramTable, str]:
    """(the bigram table, how its rows are chosen). Vocabularies above 65,536 (hours of target calls for every
    row on a CPU) get the rows of the HumanEval and MT-Bench prompt tokens plus the tokens of ``references``'
    outputs (with their top-1 chains): on these prompts exactly the drafts of the full table, since every root
    the decoder meets has its row. The table is cached and grows on demand."""
    restriction, described = default_restriction(target)
    if restriction is not None:
        outputs = np.concatenate([out.numpy() for refs in references.values() for _, out in refs])
        restriction, described = np.union1d(restriction, outputs), described + " + the reference outputs"
    table = bigram_table(target, restriction)
    return table, f"bigram rows: {table.tokens.shape[0]:,} of {target.vocab_size:,} tokens ({described})"


def setup(report, target: LoadedModel, n_prompts: int, max_new_tokens: int, timed_prompts: int,
          timed_tokens: int) -> None:
    """This run's setup beside N-Grammys' (:meth:`specnb.study.results.Results.setup`)."""
    dtype = target.dtype_name
    report.setup(PAPER, here={
        "model": f"{target.name} (base, vocabulary {target.vocab_size:,})",
        "hardware": device_name(target.device), "dtype": dtype,
        "prompts × tokens": f"replay: {n_prompts} × {max_new_tokens} per set; timed: {timed_prompts} × {timed_tokens} "
                            "per set, one run",
        "task": "HumanEval, MT-Bench first turns (raw prompts, greedy)",
        "verification": "k rows as a batch (the paper's naive batching); prompt lookup as one chain"},
        theirs={"model": "Mistral-7B-Instruct (Figs. 2–4); Phi-3 3B, Vicuna-13B (Table 1) (vocabulary 32,000)",
                "hardware": "one NVIDIA A100 40GB", "dtype": "bfloat16",
                "prompts × tokens": "Fig. 2: first 50 prompts per set; Table 1: the sets of Medusa / EAGLE, three "
                                    "timed runs (tokens not stated)",
                "task": "MT-Bench, HumanEval, GSM8K (instruction-tuned models)",
                "verification": "k rows as a batch (naive batching)"})


def topk_curves(references: dict[str, list[Reference]], unigram: np.ndarray, table: BigramTable,
                ks: list[int]) -> pd.DataFrame:
    """N-Grammys Fig. 2 by greedy replay: one row per (set, strategy, k) with tokens per call over the set's
    prompts and its 90% interval (``tokens_per_call_low`` / ``_high``), for the unigram (top-k of ``unigram``),
    the bigram (w = 1) and the extended bigram (w = 2, 3)."""
    strategies = {"unigram": lambda k: UnigramDrafter(unigram, k)}
    strategies.update({f"bigram (w={w})" if w == 1 else f"extended bigram (w={w})":
                       (lambda k, w=w: BigramDrafter(table, k, w)) for w in (1, 2, 3)})
    rows = []
    for name, refs in references.items():
        for label, make in strategies.items():
            for k in ks:
                summary = summarize(replay_rows(label, replay_many(lambda make=make, k=k: make(k), refs)),
                                    baseline="").iloc[0]
                rows.append({"set": name, "strategy": label, "k": k, "tokens_per_call": summary.tokens_per_call,
                             "tokens_per_call_low": summary.tokens_per_call_low,
                             "tokens_per_call_high": summary.tokens_per_call_high})
    return pd.DataFrame(rows)


def fig2_headlines(curves: pd.DataFrame) -> dict:
    """The numbers the conclusions quote from :func:`topk_curves`: per set, the bigram's and the unigram's tokens
    per call at k = 1 and at the largest k."""
    k = int(curves.k.max())
    at = curves.set_index(["set", "strategy", "k"]).tokens_per_call
    return {"k_max": k, **{label: {s: {1: at[s, strategy, 1], k: at[s, strategy, k]} for s in curves.set.unique()}
                           for label, strategy in (("bigram", "bigram (w=1)"), ("unigram", "unigram"))}}


def judge_fig2(report, curves: pd.DataFrame, target: LoadedModel) -> None:
    """The extended bigram (w = 2) at the largest k against N-Grammys' ~50% more tokens per call, per set."""
    k, reached = curves.k.max(), {}
    for name, sub in curves.groupby("set", sort=False):
        row = sub[(sub.strategy == "extended bigram (w=2)") & (sub.k == k)].iloc[0]
        reached[name] = row.tokens_per_call
        report.compare(f"fig2_{name}", f"{name}: extended bigram (w = 2, top {k}), tokens per call − 1 (replayed)",
                       row.tokens_per_call - 1, row.tokens_per_call_low - 1, row.tokens_per_call_high - 1,
                       Expect.near(CLAIMS.fig2_gain, TOKENS_PER_CALL), "N-Grammys §4.1, Fig. 2 (Mistral-7B-Instruct)",
                       fmt=".2f", internal=False, direction_only=False, evidence={"vocabulary": target.vocab_size},
                       cause=f"another target and tokenizer: {target.name} ({kind_of(target)}) with "
                             f"{target.vocab_size:,} tokens, the paper an instruction-tuned 7B model with 32,000")
    # the figure plots tokens per call; the claim is a difference of tokens per call over AR's 1, not a speedup
    report.takeaway("06_ngram_topk_tokens_per_call", f"the extended bigram (w = 2) at top {k}: " + ", ".join(
        f"{tpc:.2f} tokens per call on {name} ({{verdicts[fig2_{name}][ours]:+.2f}} over AR's 1)"
        for name, tpc in reached.items()) + f" (N-Grammys Fig. 2: ≈ {1 + CLAIMS.fig2_gain:.1f}, i.e. "
        f"{CLAIMS.fig2_gain:+.1f}; tokens per call, not a speedup)")


def kind_of(target: LoadedModel) -> str:
    """``a chat model on its chat template`` or ``a base model on raw prompts``: how the target saw the prompts."""
    return "a chat model on its chat template" if target.chat else "a base model on raw prompts"


def grid(table: BigramTable, references: dict[str, list[Reference]], cost) -> pd.DataFrame:
    """N-Grammys Figs. 3 / 5: :func:`specnb.experiments.grids.mixed_grid` over the paper's (k, w) grid per set,
    with intervals (tokens per call and the speedup estimated with ``cost``, (k, w) calls priced as batches), and
    ``est_speedup_gpu`` where a GPU cost table exists (:func:`specnb.experiments.gpu_price.add_gpu_column`)."""
    return add_gpu_column(pd.concat([mixed_grid(table, refs, GRID_KS, GRID_WS, cost, intervals=True).assign(set=name)
                                     for name, refs in references.items()], ignore_index=True),
                          PAPER_SHAPES["ngrammys"])


def best_shapes(grids: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """The (k, w) of the largest estimated speedup per set."""
    return {name: tuple(int(v) for v in sub.loc[sub.est_speedup.idxmax(), ["k", "w"]])
            for name, sub in grids.groupby("set", sort=False)}


def mixed_ablation(table: BigramTable, references: dict[str, list[Reference]], k: int = 10, w: int = 10
                   ) -> pd.DataFrame:
    """N-Grammys Fig. 4: one row per replayed call of the mixed strategy at (k, w): set, prompt (the reference's
    index in its set), context (tokens before the call's draft), k, w (the call's, cut near the reference's end),
    accepted, strategy ("context" / "bigram" / "none": whose row was accepted), rank (of that row within its
    strategy), context_rows and bigram_rows (how many of the k rows each strategy filled)."""
    rows = []
    for name, refs in references.items():
        for prompt, stats in enumerate(replay_many(lambda: MixedDrafter(table, k, w), refs)):
            context = stats.prompt_tokens + 1  # the prompt and the root the prefill produced
            for c in stats.calls:
                rows.append({"set": name, "prompt": prompt, "context": context, "k": c.report.k, "w": c.report.w,
                             "accepted": c.accepted, "strategy": accepted_strategy(c) or "none",
                             "rank": accepted_rank(c), "context_rows": c.report.context_rows,
                             "bigram_rows": c.report.bigram_rows})
                context += c.new_tokens
    return pd.DataFrame(rows)


def context_share(ablation: pd.DataFrame) -> dict[str, float]:
    """Per set, the share of accepted draft tokens that came from context rows (:func:`mixed_ablation` rows)."""
    return {name: float(sub[sub.strategy == "context"].accepted.sum() / max(1, sub.accepted.sum()))
            for name, sub in ablation.groupby("set", sort=False)}


def ablation_summary(ablation: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """(accepted length per (set, strategy) described, the headline numbers: each set's context share and the
    mean accepted length when each strategy's row won)."""
    described = ablation.groupby(["set", "strategy"]).accepted.describe()
    return described, {"context_share": context_share(ablation),
                       "accepted_by_strategy": {f"{s} {g}": float(described["mean"].get((s, g), np.nan))
                                                for s in ablation.set.unique() for g in ("context", "bigram")}}


def ablation_counts(ablation: pd.DataFrame) -> pd.DataFrame:
    """Per (set, prompt) of :func:`mixed_ablation` rows, the counts §5.2's statements rest on: ``calls``; for each
    strategy s, ``s_won`` (calls whose accepted row is s's) and ``s_tail`` (of those, the row at rank >= 1, not s's
    first); ``context_full`` (calls accepting a context row in full: all w tokens of the ablation's w); and
    ``rows_<n>`` for n = 0..k (calls in which the context filled n of the k rows)."""
    k, w = int(ablation.k.max()), int(ablation.w.max())
    context, bigram = ablation.strategy.eq("context"), ablation.strategy.eq("bigram")
    tail = ablation["rank"].fillna(0).ge(1)
    flags = pd.DataFrame({"set": ablation.set, "prompt": ablation.prompt, "calls": 1, "context_won": context,
                          "context_tail": context & tail, "bigram_won": bigram, "bigram_tail": bigram & tail,
                          "context_full": context & ablation.accepted.ge(w),
                          **{f"rows_{n}": ablation.context_rows.eq(n) for n in range(k + 1)}})
    return flags.groupby(["set", "prompt"], sort=False).sum().astype(int).reset_index()


def _rank_tail(bigram_tail, bigram_won, context_tail, context_won, axis=-1):
    """The bigram's share of accepted rows at rank >= 1 minus the context's (ratios of totals over prompts)."""
    return bigram_tail.sum(axis) / bigram_won.sum(axis) - context_tail.sum(axis) / context_won.sum(axis)


def _whole_batch_lead(calls, *rows, axis=-1):
    """The share of calls whose k rows all came from the context (``rows[-1]``: rows_k) minus the largest share of
    any other allocation (``rows[:-1]``: rows_0 .. rows_{k-1})."""
    shares = np.stack([r.sum(axis) for r in rows]) / calls.sum(axis)
    return shares[-1] - shares[:-1].max(axis=0)


def _judged(report, key: str, *args, **kwargs) -> str:
    """:meth:`specnb.study.results.Results.compare`, the verdict also kept as ``ours["judged"][key]`` (one word for
    a sentence of the conclusions; the verdict table holds the whole comparison)."""
    verdict = report.compare(key, *args, **kwargs)
    report.ours.setdefault("judged", {})[key] = verdict
    return verdict


def fig4_statistics(ablation: pd.DataFrame) -> pd.DataFrame:
    """One row per set of :func:`mixed_ablation` rows with the quantities N-Grammys §5.2 states, each with its 90%
    interval over the set's prompts (``_low`` / ``_high``, prompts resampled, :func:`specnb.core.metrics.
    bootstrap_interval`; NaN ends with fewer than two prompts or a strategy that never won):

    * ``rank_tail``: the share of the bigram's accepted rows at rank >= 1 minus the context's (``bigram_tail_share``,
      ``context_tail_share``; ``bigram_won`` / ``context_won``: the calls each won);
    * ``context_full``: the share of calls accepting a context row in full (``w`` tokens; ``longest_context``: the
      longest accepted context row);
    * ``whole_batch_lead``: the share of calls in which the context filled all ``k`` rows (``whole_batch``) minus
      the share of the most frequent other allocation (``mode_rows`` context rows, ``mode_share``); ``no_rows``:
      the share of calls without a context row; ``median_context``: the median tokens before a call."""
    from scipy.stats import DegenerateDataWarning  # here, not at the top: slow to import

    k, w = int(ablation.k.max()), int(ablation.w.max())
    out = []
    for name, counts in ablation_counts(ablation).groupby("set", sort=False):
        sub = ablation[ablation.set == name]
        c = {col: counts[col].to_numpy(float) for col in counts.columns if col not in ("set", "prompt")}
        rows = [c[f"rows_{n}"] for n in range(k + 1)]
        calls = c["calls"].sum()
        others = np.array([r.sum() for r in rows[:-1]]) / calls
        tail, full = (c["bigram_tail"], c["bigram_won"], c["context_tail"], c["context_won"]), c["context_full"]
        with np.errstate(invalid="ignore", divide="ignore"):  # a strategy that never won: NaN, not a warning
            row = {"set": name, "k": k, "w": w, "prompts": len(counts), "calls": int(calls),
                   "bigram_won": int(c["bigram_won"].sum()), "context_won": int(c["context_won"].sum()),
                   "bigram_tail_share": c["bigram_tail"].sum() / c["bigram_won"].sum(),
                   "context_tail_share": c["context_tail"].sum() / c["context_won"].sum(),
                   "rank_tail": float(_rank_tail(*tail)),
                   "context_full": full.sum() / calls,
                   "longest_context": int(sub[sub.strategy == "context"].accepted.max()) if c["context_won"].sum()
                   else 0,
                   "whole_batch": rows[-1].sum() / calls, "mode_rows": int(others.argmax()),
                   "mode_share": float(others.max()), "no_rows": rows[0].sum() / calls,
                   "whole_batch_lead": float(_whole_batch_lead(c["calls"], *rows)),
                   "median_context": float(sub.context.median())}
        for key, stat, samples in (("rank_tail", _rank_tail, tail),
                                   ("context_full", lambda f, n, axis=-1: f.sum(axis) / n.sum(axis),
                                    (full, c["calls"])),
                                   ("whole_batch_lead", _whole_batch_lead, (c["calls"], *rows))):
            with warnings.catch_warnings():  # a resample of prompts where a strategy never won: NaN, no interval
                warnings.simplefilter("ignore", DegenerateDataWarning)
                row[f"{key}_low"], row[f"{key}_high"] = bootstrap_interval(stat, *samples)
        out.append(row)
    return pd.DataFrame(out)


def judge_fig4(report, stats: pd.DataFrame, target: LoadedModel) -> None:
    """N-Grammys §5.2's three statements on Fig. 4 per set, from :func:`fig4_statistics` (direction only: the paper
    shows histograms, no number): the bigram's accepted ranks are heavy-tailed relative to the context's
    (``fig4_rank_tail_<set>``: its share at rank >= 1 above the context's by more than a tie); the context's rows
    are accepted in full, w tokens (``fig4_full_w_<set>``: a share of calls above 0); the context is often given
    the whole batch (``fig4_whole_batch_<set>``, read as: all k rows is its most frequent allocation, ahead of the
    next by more than a tie)."""
    against = "N-Grammys §5.2, Fig. 4 (Mistral-7B, (10, 10))"
    for r in stats.itertuples():
        _judged(
            report, f"fig4_rank_tail_{r.set}",
            f"{r.set}: accepted rows at rank ≥ 1 (not their strategy's first), the "
            f"bigram's share minus the context's, mixed ({r.k}, {r.w}) (replayed)", r.rank_tail, r.rank_tail_low,
            r.rank_tail_high, Expect.above(0.0, TIE), against + ": the bigram's ranks heavy-tailed relative to the "
            "context's", fmt=".2f", internal=False, direction_only=True,
            evidence={"bigram's accepted rows at rank ≥ 1": r.bigram_tail_share, "calls the bigram won": r.bigram_won,
                      "context's accepted rows at rank ≥ 1": r.context_tail_share,
                      "calls the context won": r.context_won},
            cause=f"the bigram's accepted rows are at rank ≥ 1 in {r.bigram_tail_share:.0%} of the {r.bigram_won} "
                  f"calls it won, the context's in {r.context_tail_share:.0%} of {r.context_won}")
        _judged(
            report, f"fig4_full_w_{r.set}",
            f"{r.set}: share of calls accepting a context row in full (w = {r.w} tokens), "
            f"mixed ({r.k}, {r.w}) (replayed)", r.context_full, r.context_full_low, r.context_full_high,
            Expect.above(0.0), against + ": context speculations of length w = 10 accepted on every task", fmt=".1%",
            internal=False, direction_only=True,
            evidence={"longest accepted context row": r.longest_context, "w": r.w, "calls": r.calls,
                      "calls the context won": r.context_won},
            cause=f"the longest context row accepted in {r.calls} calls is {r.longest_context} tokens of w = {r.w}")
        _judged(
            report, f"fig4_whole_batch_{r.set}",
            f"{r.set}: share of calls whose {r.k} rows all came from the context minus "
            f"the share of the most frequent other allocation, mixed ({r.k}, {r.w}) (replayed)", r.whole_batch_lead,
            r.whole_batch_lead_low, r.whole_batch_lead_high, Expect.above(0.0, TIE),
            against + ": the context often allocated the entire batch (read: its most frequent allocation)",
            fmt=".2f", internal=False, direction_only=True,
            evidence={"k": r.k, "calls with all rows from the context": r.whole_batch,
                      "most frequent allocation": r.mode_rows, "its share of calls": r.mode_share,
                      "calls without a context row": r.no_rows, "median context": r.median_context,
                      "query length": 1, "vocabulary": target.vocab_size, "paper's vocabulary": PAPER_VOCABULARY},
            cause=f"the context fills all {r.k} rows in {r.whole_batch:.0%} of calls; its commonest allocation is "
                  f"{r.mode_rows} rows ({r.mode_share:.0%} of calls): with q = 1 the last token has no earlier "
                  f"occurrence in {r.no_rows:.0%} of calls (median context {r.median_context:.0f} tokens; "
                  f"{target.name}'s {target.vocab_size:,} tokens, the paper's {PAPER_VOCABULARY:,})")
    report.add(fig4={r.set: {key: getattr(r, key) for key in ("rank_tail", "context_full", "whole_batch_lead")}
                     for r in stats.itertuples()})
    judged = "; ".join(f"{name}: the bigram's heavier rank tail {{verdicts[fig4_rank_tail_{name}][verdict]}}, context "
                       f"rows accepted in full {{verdicts[fig4_full_w_{name}][verdict]}}, the whole batch the "
                       f"context's commonest allocation {{verdicts[fig4_whole_batch_{name}][verdict]}}"
                       for name in stats.set)
    before = report.takeaways.get("06_mixed_ablation")  # judge_tokens_10_10's context share, when it ran first
    report.takeaway("06_mixed_ablation", (f"{before}; " if before else "") + "N-Grammys §5.2 on Fig. 4: " + judged)


def query_length_runs(table: BigramTable, references: dict[str, list[Reference]],
                      queries: tuple[int, ...] = QUERY_LENGTHS, k: int = TABLE1_BLOCK[0], w: int = TABLE1_BLOCK[1]
                      ) -> pd.DataFrame:
    """N-Grammys footnote 2 by greedy replay: for every query length q of ``queries``, the mixed strategy at (k, w)
    with its context n-grams matching exactly the last q tokens (``mixed``) and the context n-grams alone
    (``context``: up to k rows of w tokens, the bigram's rows left out). One row per (set, strategy, q, prompt):
    :func:`specnb.experiments.grids.replay_rows`' columns (``method`` = ``<strategy> q=<q>``) and
    ``context_rows``, the rows the context offered over the prompt's calls."""
    strategies = {"mixed": lambda q: MixedDrafter(table, k, w, max_ngram=q, min_ngram=q),
                  "context": lambda q: ContextNgramDrafter(k=k, w=w, max_ngram=q, min_ngram=q)}
    frames = []
    for name, refs in references.items():
        for strategy, make in strategies.items():
            for q in queries:
                runs = replay_many(lambda make=make, q=q: make(q), refs)
                offered = [sum(getattr(c.report, "context_rows", getattr(c.report, "matched_rows", 0))
                               for c in run.calls) for run in runs]
                frames.append(replay_rows(f"{strategy} q={q}", runs).assign(set=name, strategy=strategy, q=q,
                                                                           context_rows=offered))
    return pd.concat(frames, ignore_index=True)


def query_lengths(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (set, strategy, q) of :func:`query_length_runs`: tokens per call over the prompts with its 90%
    interval (``tokens_per_call_low`` / ``_high``) and the context's rows offered per call."""
    rows = []
    for (name, strategy, q), group in runs.groupby(["set", "strategy", "q"], sort=False):
        summary = summarize(group, baseline="").iloc[0]
        rows.append({"set": name, "strategy": strategy, "q": q, "tokens_per_call": summary.tokens_per_call,
                     "tokens_per_call_low": summary.tokens_per_call_low,
                     "tokens_per_call_high": summary.tokens_per_call_high,
                     "context_rows_per_call": group.context_rows.sum() / max(1, group.calls.sum())})
    return pd.DataFrame(rows)


def _q1_over_best_other(*samples, axis=-1):
    """Tokens per call at q = 1 over the largest at any other q; ``samples``: (new tokens after prefill, calls) per
    query length, q = 1 first (ratios of totals over prompts)."""
    per_q = [n.sum(axis) / d.sum(axis) for n, d in zip(samples[::2], samples[1::2], strict=True)]
    return per_q[0] / np.max(np.stack(per_q[1:]), axis=0)


def q1_advantage(runs: pd.DataFrame, name: str, strategy: str = "mixed",
                 against: tuple[int, ...] | None = None) -> tuple[float, float, float]:
    """(ratio, low, high): ``strategy``'s tokens per call at q = 1 over the best other query length's on set
    ``name`` (:func:`query_length_runs` rows), paired by prompt, the 90% interval resampling the prompts.
    ``against``: the query lengths to take the best of (None: every other one; ``(2,)``: q = 1 over q = 2)."""
    sub = runs[(runs.set == name) & (runs.strategy == strategy)]
    by_q = {q: group.sort_values("prompt_id") for q, group in sub.groupby("q")}
    order = [1, *(q for q in sorted(by_q) if q != 1 and (against is None or q in against))]
    samples = [np.asarray(col, dtype=float) for q in order for col in (by_q[q].new_tokens - 1, by_q[q].calls)]
    with np.errstate(invalid="ignore", divide="ignore"):
        value = float(_q1_over_best_other(*samples))
    return (value, *bootstrap_interval(_q1_over_best_other, *samples))


def query_length_ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """The paired ratios behind ``q1_best_<set>`` (:func:`q1_advantage`, as the verdict computes them) for
    :func:`specnb.study.plots.paired_ratios`, one row per (set, strategy, longer q): tokens per call at q = 1 over
    that at q, the mixed strategy's first, then the context rows alone (``context``: prompt lookup's n-grams, named
    so in figures). The mixed strategy's row over its best longer q is the verdict's ratio (q = 1 over the best of
    them, its interval resampling that maximum) and says so. Columns ``set``, ``row`` (the tick label), ``value``,
    ``low``, ``high`` and ``method`` (the colour's key: mixed, pld)."""
    from ..eval.methods import METHODS

    rows = []
    for name in runs.set.unique():
        for strategy, key in (("mixed", "mixed"), ("context", "pld")):
            sub = runs[(runs.set == name) & (runs.strategy == strategy)]
            longer = [int(q) for q in sorted(sub.q.unique()) if q != 1]
            if not longer:  # a strategy not replayed (or at q = 1 only): no ratio
                continue
            best = max(longer, key=lambda q: (sub[sub.q == q].new_tokens - 1).sum() / sub[sub.q == q].calls.sum())
            for q in longer:
                verdict = strategy == "mixed" and q == best
                value, low, high = q1_advantage(runs, name, strategy, None if verdict else (q,))
                rows.append({"set": name, "row": f"{METHODS[key].label}: q = 1 / q = {q}"
                             + (" (best q > 1: the verdict)" if verdict else ""),
                             "value": value, "low": low, "high": high, "method": key})
    return pd.DataFrame(rows, columns=["set", "row", "value", "low", "high", "method"])


def judge_query_length(report, runs: pd.DataFrame) -> pd.DataFrame:
    """N-Grammys footnote 2 per set, on :func:`query_length_runs`' rows: the mixed strategy at (10, 10) gives more
    tokens per call with the context's query length q = 1 than with any longer q (``q1_best_<set>``: q = 1's over
    the best other's, paired over prompts, above 1 by more than a tie; direction only: the paper gives no size).
    Returns the :func:`query_lengths` table it cites."""
    table = query_lengths(runs)
    at = table.set_index(["set", "strategy", "q"])
    for name in table.set.unique():
        ratio = q1_advantage(runs, name)
        mixed = {int(q): at.loc[(name, "mixed", q)] for q in table[table.set == name].q.unique()}
        best = max((q for q in mixed if q != 1), key=lambda q: mixed[q].tokens_per_call)
        report.ours.setdefault("q1_over_best", {})[name] = ratio[0]
        _judged(
            report, f"q1_best_{name}",
            f"{name}: mixed {TABLE1_BLOCK}, tokens per call with context query length q = 1 over "
            f"the best of q = {', '.join(str(q) for q in mixed if q != 1)} (replayed, paired over prompts)", *ratio,
            Expect.above(1.0, TIE), "N-Grammys §5, footnote 2 (q = 2, 3 degrade tokens per call and speed-up)",
            fmt=".3f", internal=False, direction_only=True,
            evidence={"q": 1, "best other q": best,
                      **{f"tokens per call, q = {q}": r.tokens_per_call for q, r in mixed.items()},
                      **{f"context rows per call, q = {q}": r.context_rows_per_call for q, r in mixed.items()}},
            cause=f"q = {best} gives {mixed[best].tokens_per_call:.2f} tokens per call against q = 1's "
                  f"{mixed[1].tokens_per_call:.2f}: the context offers {mixed[best].context_rows_per_call:.1f} rows "
                  f"per call at q = {best}, {mixed[1].context_rows_per_call:.1f} at q = 1, the bigram fills the rest")
    report.takeaway("06_context_query_length", "the mixed strategy at (10, 10), tokens per call with the context's "
                    "query length q = 1 over the best longer q: " + ", ".join(
                        f"{{verdicts[q1_best_{name}][measured]}} on {name} ({{verdicts[q1_best_{name}][verdict]}})"
                        for name in table.set.unique()) + " (N-Grammys footnote 2: q = 2, 3 are worse)")
    return table


def judge_tokens_10_10(report, grids: pd.DataFrame, shares: dict[str, float], target: LoadedModel) -> None:
    """Tokens per call of the mixed strategy at (10, 10), replayed, against N-Grammys Table 1, per set; and its
    speedup priced on the GPU table where ``grids`` were (:func:`judge_gpu_10_10`)."""
    for name, sub in grids.groupby("set", sort=False):
        row = sub[(sub.k == TABLE1_BLOCK[0]) & (sub.w == TABLE1_BLOCK[1])].iloc[0]
        report.compare(f"tpc_10_10_{name}", f"{name}: mixed (10, 10), tokens per call (replayed)", row.tokens_per_call,
                       row.tokens_per_call_low, row.tokens_per_call_high,
                       Expect.within(*CLAIMS.table1[name]["tpc_10_10"], TOKENS_PER_CALL),
                       "N-Grammys Table 1 (3B–13B, A100)", internal=False, direction_only=False,
                       evidence={"context rows' share of accepted tokens": shares[name]},
                       cause=f"another target ({target.name}, {kind_of(target)}; the paper: "
                             f"instruction-tuned 3B–13B models); context rows give {shares[name]:.0%} of the accepted "
                             "tokens here")
    judge_gpu_10_10(report, grids)
    report.takeaway("06_mixed_ablation", "context rows give " + ", ".join(
        f"{{verdicts[tpc_10_10_{name}][evidence][context rows' share of accepted tokens]:.0%}} of the accepted draft "
        f"tokens at (10, 10) on {name}" for name in grids.set.unique()))


def judge_gpu_10_10(report, grids: pd.DataFrame, path: str | Path = GPU_CSV) -> None:
    """N-Grammys Table 1's (10, 10) speedup with the hardware's price matched: replayed tokens per call over the
    slow-down of one (10, 10) call on the GPU table (Mistral-7B's shapes, eager calls, as the paper's code makes
    them: ``est_speedup_gpu`` of :func:`grid`), per set, its interval from the tokens per call's. The gap left is
    the target and its acceptance. Nothing is judged without the table (``path``: the one ``grids`` was priced on)."""
    if GPU_COLUMN not in grids:
        return
    device = gpu_cost_model(PAPER_SHAPES["ngrammys"], path)[1]
    for name, sub in grids.groupby("set", sort=False):
        g = sub[(sub.k == TABLE1_BLOCK[0]) & (sub.w == TABLE1_BLOCK[1])].iloc[0]
        slow = g.tokens_per_call / g[GPU_COLUMN]
        paper = CLAIMS.table1[name]["tpc_10_10"]
        report.compare(f"gpu_speedup_10_10_{name}", f"{name}: mixed (10, 10), speedup estimated as replayed tokens "
                       f"per call ÷ one (10, 10) call's slow-down on the GPU table ({device}, eager calls)",
                       g[GPU_COLUMN], g[f"{GPU_COLUMN}_low"], g[f"{GPU_COLUMN}_high"],
                       Expect.published(CLAIMS.table1[name]["speedup_10_10"]), "N-Grammys Table 1 (10, 10)",
                       internal=False, direction_only=False,
                       evidence={"call cost over a one-token call": slow, "tokens per call": g.tokens_per_call,
                                 "paper's tokens per call at (10, 10)": paper},
                       cause=f"the call is priced as on the paper's GPU class (×{slow:.2f} a one-token call); this "
                             f"target accepts {g.tokens_per_call:.2f} tokens per call at (10, 10), the paper's "
                             f"{paper[0]}–{paper[1]}")


def block_cost(target: LoadedModel, contexts: tuple[int, ...] = (100, 500), repeats: int = 3) -> pd.DataFrame:
    """The slow-down of one (10, 10) batch call (and of (1, 10), (10, 0)) over (1, 0) on this machine now
    (:func:`specnb.eval.timing.time_cells`: paired calls, median over ``repeats`` passes, with the spread)."""
    return time_cells(target, Grid((1, TABLE1_BLOCK[0]), (0, TABLE1_BLOCK[1]), contexts, repeats),
                      progress=False)


def timed(target: LoadedModel, sets: dict[str, list[Prompt]], table: BigramTable,
          best: dict[str, tuple[int, int]], max_new_tokens: int) -> pd.DataFrame:
    """N-Grammys Table 1 timed: AR, prompt lookup (k = 1, w = 10, q = 3..1, one chain) and the mixed strategy at
    the set's ``best`` estimated shape (k rows verified as a batch, as the paper does), decoded for real per set
    (one warm-up per method, methods interleaved per prompt); :func:`specnb.experiments.summarize` rows with
    ``set``, ``k`` and ``w``. (10, 10) is not decoded: its speedup is estimated (:func:`judge_timed`)."""
    out = []
    for name, prompts in sets.items():
        k, w = best[name]
        methods = {"pld": ContextNgramDrafter(k=1, w=10, max_ngram=3),
                   f"mixed ({k}, {w})": Variant(MixedDrafter(table, k, w), verify="batch")}
        config = BenchConfig([], max_new_tokens=max_new_tokens, made=methods, warmup_tokens=8)
        rows = run_bench(target, prompts, config, progress=False)
        summary = summarize(rows).assign(set=name)
        summary["k"], summary["w"] = summary.method.map({"pld": 1, f"mixed ({k}, {w})": k}), \
            summary.method.map({"pld": 10, f"mixed ({k}, {w})": w})
        out.append(summary)
    return pd.concat(out, ignore_index=True)


def estimates(table: BigramTable, references: dict[str, list[Reference]], best: dict[str, tuple[int, int]],
              cost, prompts: int, tokens: int) -> dict[str, dict[str, dict[str, float]]]:
    """{set: {method: {speedup, low, high}}}: the estimated speedup of the timed methods over the first ``prompts``
    references cut to ``tokens`` (what :func:`timed` decodes), with its 90% interval over those prompts (as the
    timed speedup has its own): replayed calls priced with ``cost`` — prompt lookup's chains by their nodes, the
    mixed strategy's as (k, w) batches — over AR's priced time. Drafting and the loop are not priced."""
    out = {}
    for name, full in references.items():
        refs = [(prompt, output[:tokens]) for prompt, output in full[:prompts]]
        k, w = best[name]
        ar_each = [ar_priced_seconds([ref], cost) for ref in refs]
        drafters = {"pld": (lambda: ContextNgramDrafter(k=1, w=10, max_ngram=3), None),
                    f"mixed ({k}, {w})": (lambda k=k, w=w: MixedDrafter(table, k, w), (k, w))}
        out[name] = {}
        for method, (make, shape) in drafters.items():
            row = replay_summary(method, replay_many(make, refs), cost, sum(ar_each), shape, ar_per_prompt=ar_each)
            out[name][method] = {"speedup": row["est_speedup"], "low": row["est_speedup_low"],
                                 "high": row["est_speedup_high"]}
    return out


def judge_timed(report, summary: pd.DataFrame, estimated: dict[str, dict[str, dict[str, float]]],
                grids: pd.DataFrame, blocks: pd.DataFrame, cost) -> dict[str, dict]:
    """The comparisons of N-Grammys Table 1 per set: every timed method's estimate (:func:`estimates`, with its
    interval over prompts) against its timed interval; the best shape's timed speedup and (10, 10)'s estimated one
    (replayed tokens per call over the timed slow-down of one (10, 10) call, interval from both) against the
    paper's. Returns the (10, 10) estimate per set ({speedup, low, high, slowdown, tokens_per_call})."""
    cell = blocks[(blocks.k == TABLE1_BLOCK[0]) & (blocks.w == TABLE1_BLOCK[1])]
    slow, slow_low, slow_high = cell.slowdown.mean(), cell.slowdown_low.min(), cell.slowdown_high.max()
    block, timed_best = {}, {}
    for name, sub in summary.groupby("set", sort=False):
        for r in sub[sub.method != "ar"].itertuples():
            est, outside = estimated[name][r.method], r.outside_forward_fraction
            cause = (f"the estimate prices the target's calls only: drafting and the decode loop take {outside:.0%} "
                     "of the timed decode time" if est["speedup"] > r.speedup_vs_ar_high else
                     "the roofline table, timed at another moment, prices these calls above what they cost in this run")
            report.compare(f"estimate_{name}_{r.method}", f"{name}: {r.method}, estimated speedup (replay × roofline "
                           "table, 90% interval over prompts) inside the timed 90% interval", est["speedup"],
                           est["low"], est["high"],
                           Expect.within(r.speedup_vs_ar_low, r.speedup_vs_ar_high), "timed here",
                           internal=True, direction_only=False, evidence={"time outside the target's calls": outside},
                           cause=cause)
        best = sub[sub.method.str.startswith("mixed")].iloc[0]
        timed_best[name] = {**best.to_dict(), "estimated": estimated[name][best.method]["speedup"]}
        ctx = int(blocks.context.min())
        best_slow = cost.seconds_at(int(best.k), int(best.w), ctx) / cost.seconds_at(1, 0, ctx)
        report.compare(f"speedup_best_{name}", f"{name}: {best.method} (the estimated best shape), timed speedup",
                       best.speedup_vs_ar, best.speedup_vs_ar_low, best.speedup_vs_ar_high,
                       Expect.published(CLAIMS.table1[name]["speedup_best"]), "N-Grammys Table 1 (k*, w*)",
                       internal=False, direction_only=False,
                       evidence={"call cost over a one-token call": best_slow, "context": ctx,
                                 "tokens per call": best.tokens_per_call,
                                 "paper's best shapes' tokens per call": CLAIMS.table1[name]["tpc_best"]},
                       cause=f"a ({int(best.k)}, {int(best.w)}) call costs ×{best_slow:.2f} a one-token call on this "
                             f"CPU (roofline table, ℓ = {ctx}) and accepts {best.tokens_per_call:.2f} tokens per call "
                             f"(the paper's best shapes: {CLAIMS.table1[name]['tpc_best'][0]}–"
                             f"{CLAIMS.table1[name]['tpc_best'][1]})")
        g = grids[(grids.set == name) & (grids.k == TABLE1_BLOCK[0]) & (grids.w == TABLE1_BLOCK[1])].iloc[0]
        block_tokens = TABLE1_BLOCK[0] * (TABLE1_BLOCK[1] + 1)
        est = {"speedup": g.tokens_per_call / slow, "low": g.tokens_per_call_low / slow_high,
               "high": g.tokens_per_call_high / slow_low, "slowdown": slow, "tokens_per_call": g.tokens_per_call}
        report.compare(f"speedup_10_10_{name}", f"{name}: mixed (10, 10), speedup estimated as replayed tokens per "
                       "call ÷ the timed slow-down of one (10, 10) call", est["speedup"], est["low"], est["high"],
                       Expect.published(CLAIMS.table1[name]["speedup_10_10"]), "N-Grammys Table 1 (10, 10)",
                       internal=False, direction_only=False,
                       evidence={"tokens in a (10, 10) call": block_tokens,
                                 "call cost over a one-token call": slow, "tokens per call": g.tokens_per_call},
                       cause=f"a (10, 10) batch call ({block_tokens} tokens) costs ×{slow:.1f} a one-token call on "
                             f"this CPU (timed here; notebook 05 times the whole grid), so {g.tokens_per_call:.2f} "
                             "tokens per call cannot pay for it")
        block[name] = est
    report.takeaway("06_mixed_timed", "; ".join(
        f"{name}: the best estimated shape timed at ×{{verdicts[speedup_best_{name}][ours]:.2f}} "
        f"({{verdicts[speedup_best_{name}][low]:.2f}}–{{verdicts[speedup_best_{name}][high]:.2f}}), estimated "
        f"×{{ours[timed_best][{name}][estimated]:.2f}} (N-Grammys Table 1: ×{CLAIMS.table1[name]['speedup_best'][0]}–"
        f"{CLAIMS.table1[name]['speedup_best'][1]} on an A100)" for name in timed_best))
    report.takeaway("06_mixed_grid", "the best (k, w) by estimated speedup (replay priced on this machine's cost "
                    "table): " + ", ".join(f"{{ours[best][{name}]}} at ×{{ours[best_est_speedup][{name}]:.2f}} on "
                                           f"{name}" for name in report.ours.get("best", {})))
    return {"block": block, "timed_best": timed_best}
