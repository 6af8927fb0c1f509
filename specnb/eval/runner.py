"""The runner's loop behind :func:`specnb.eval.bench.run_bench` (the one entry), and the one summary.

:func:`_run` decodes every prompt with every method in one process: one short warm-up per method first,
then methods interleaved per prompt (slow drift of the machine hits all of them alike). It returns a tidy
DataFrame, one row per (method, prompt), holding every :class:`~specnb.core.metrics.CallStats` aggregate of the
generation (:func:`generation_row`) and, for greedy runs, whether the output equals ``ar``'s token for token.
:func:`summarize` turns those rows into one row per method following :mod:`specnb.core.metrics`: ratios of
totals over prompts (tokens per call, accepted length, tokens/s, speedup), except the acceptance rate (MAR),
which is averaged per prompt as its definition says.

Every method runs as a :data:`Runner`: any function ``(prompt, max_new_tokens) -> dict`` of row fields, a
:class:`DecodeRunner` for a drafter (``None``: AR through the same loop) or a :class:`Variant` (a drafter with its
own verification mode), or the bench's Hugging Face and llama.cpp peers; a runner with a ``clear()`` method is
cleared after its warm-up. A runner's ``tokens`` (the new token ids) are compared with
the reference's and not kept; fields whose name starts with ``_`` are read by the comparison and dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.drafter import Drafter
from ..core.generate import CallHook, generate
from ..core.metrics import RunStats, first_divergence, mean_interval, rate_ratio_interval, ratio_interval
from ..core.prompts import Conversation, Prompt
from ..core.verify import VerifyMode
from ..drafters.auto import Routed
from ..model.kernels import top_k
from ..model.models import LoadedModel
from .checks import check_partial_acceptance

Runner = Callable[[Prompt, int], dict]
"""(prompt, max_new_tokens) -> row fields: at least ``new_tokens`` and ``seconds``; ``tokens`` to compare."""

REFERENCE = "ar"
"""The method every other is compared with, token for token (greedy runs)."""

# Relative precision of a logit in each dtype (unit roundoff); a top-2 gap below a few units of the top
# logit's magnitude can flip between two mathematically equal computations.
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


@dataclass
class Variant:
    """A drafter (None = AR through the same loop) run with its own verification mode."""

    drafter: Drafter | None
    verify: VerifyMode = "tree"


class TopTwo:
    """A :data:`specnb.core.generate.CallHook` recording, at every generated position, the target's top-1 logit and
    its margin over the top-2 (to judge whether a divergence between two runs sits where rounding can flip
    the argmax)."""

    def __init__(self) -> None:
        self.top1: list[float] = []
        self.gaps: list[float] = []

    def __call__(self, logits: torch.Tensor) -> None:
        # The hook runs inside the reference's timed loop: the kernel's top-2 instead of PyTorch's float copy +
        # topk, which slowed the very baseline every speedup divides by (docs/forward_pass.md, "Measurements
        # behind the code").
        top = logits.gather(-1, top_k(logits, 2).to(logits.device)).float().cpu()  # [m, 2]
        self.top1 += top[:, 0].tolist()
        self.gaps += (top[:, 0] - top[:, 1]).tolist()


def generation_row(stats: RunStats) -> dict[str, float]:
    """Every aggregate of one generation: totals of the per-call fields and the per-generation metrics."""
    calls = stats.calls
    return {
        **stats.summary(),
        "prefill_seconds": stats.prefill_seconds, "decode_seconds": stats.decode_seconds,
        "overhead_seconds": sum(c.overhead_seconds for c in calls),
        "drafted_nodes": sum(c.drafted_nodes for c in calls), "draft_depth": sum(c.draft_depth for c in calls),
        "accepted": sum(c.accepted for c in calls), "rejected_steps": stats.rejected_steps,
    }


class DecodeRunner:
    """A :data:`Runner` decoding with one drafter (``None``: AR) through :func:`specnb.core.generate.generate`; with
    ``record_gaps`` its rows carry the target's top-2 margins (``_gaps``, ``_top1``) for comparisons.
    :meth:`clear` makes the drafter forget earlier requests (:func:`_run` calls it after the warm-up)."""

    def __init__(self, target: LoadedModel, method: Drafter | Variant | None, *, temperature: float, top_p: float,
                 verify: VerifyMode, seed: int, record_gaps: bool = False):
        self.drafter, self.verify = (method.drafter, method.verify) if isinstance(method, Variant) else (method, verify)
        self.target, self.temperature, self.top_p, self.seed, self.record_gaps = (target, temperature, top_p, seed,
                                                                                  record_gaps)

    def __call__(self, prompt: Prompt, max_new_tokens: int) -> dict:
        tops: CallHook | None = TopTwo() if self.record_gaps else None
        out = generate(self.target, prompt, self.drafter, max_new_tokens=max_new_tokens, temperature=self.temperature,
                       top_p=self.top_p, verify=self.verify, seed=self.seed, on_call=tops)
        row = {**generation_row(out.stats), "tokens": out.tokens,
               "held_bytes": self.drafter.nbytes if self.drafter is not None else 0}
        if any(isinstance(c.report, Routed) for c in out.stats.calls):  # a router: which member drafted each call
            row["picks"] = " ".join(c.report.picked or "-" for c in out.stats.calls)
            row["retired"] = out.stats.calls[-1].report.retired  # members retired by the end of the run
        if tops is not None:
            row.update(_gaps=tops.gaps[:len(out.tokens)], _top1=tops.top1[:len(out.tokens)])
        return row

    def clear(self) -> None:
        if self.drafter is not None:
            self.drafter.clear()


def _run(target: LoadedModel, prompts: list[Prompt], runners: Mapping[str, Runner], *, temperature: float,
         max_new_tokens: int, warmup: int, progress: bool, sink: Callable[[list[dict]], None], check: bool
         ) -> pd.DataFrame:
    """Run every runner on every prompt (their follow-ups already checked); one row per (method, prompt), in run
    order. :func:`specnb.eval.bench.run_bench` documents the arguments.

    :data:`REFERENCE` is the method the others are compared with (greedy only: ``identical_to_ar``,
    ``first_divergence`` and, where it differs, its top-2 logit gap there); it runs first on each prompt, and its
    output is the answer a follow-up prompt (:attr:`Prompt.follows`) sees for every method.
    """
    names = sorted(runners, key=lambda name: name != REFERENCE)  # the reference first, the rest in order
    for runner in (runners[name] for name in names):  # warm-up: allocator, kernels, lazily built tables
        if warmup > 0:
            runner(prompts[0], min(warmup, max_new_tokens))
            if hasattr(runner, "clear"):  # the warm-up's output must not be an "earlier request" of the first prompt
                runner.clear()
    dtype = target.dtype
    rows: list[dict] = []
    done, interrupted = 0, False
    try:
        conversation = Conversation(target)  # the reference's output per prompt id, for the follow-ups
        for prompt in tqdm(prompts, desc="prompts", disable=not progress):
            prompt = conversation.resolve(prompt)
            ref: dict = {}
            prompt_rows = []
            for name in names:
                out = runners[name](prompt, max_new_tokens)
                if name == REFERENCE:
                    ref = out
                prompt_rows.append(_compare({"method": name, "prompt_id": prompt.id, **out}, ref,
                                            greedy=temperature == 0, dtype=dtype))
            conversation.record(prompt.id, ref.get("tokens", []))
            rows += prompt_rows
            done += 1
            sink(prompt_rows)
    except KeyboardInterrupt:
        interrupted = True
    frame = pd.DataFrame(rows)
    frame.attrs.update(interrupted=interrupted, prompts_done=done)
    if check and rows:
        check_partial_acceptance(frame, temperature, exempt=(REFERENCE,))
    return frame


def _compare(row: dict, reference: dict, *, greedy: bool, dtype: torch.dtype) -> dict:
    """``row`` without its private fields, with identical_to_ar and, for greedy runs that differ, where and
    how close the reference call was there. Sampled runs differ by design (their check is statistical: the
    tests) and rows without tokens cannot be compared: NaN."""
    tokens = row.pop("tokens", None)
    row = {key: value for key, value in row.items() if not key.startswith("_")}
    if not greedy or tokens is None or "tokens" not in reference:
        return {**row, "identical_to_ar": math.nan}
    index = first_divergence(reference["tokens"], tokens)
    row["identical_to_ar"] = index is None
    row["first_divergence"] = index
    gaps = reference.get("_gaps", [])
    if index is not None and index < len(gaps):
        gap, logit = gaps[index], reference["_top1"][index]
        row["first_divergence_gap"] = gap
        # A few units of roundoff of the logit's magnitude: rounding in the last layers and the LM head.
        row["gap_within_rounding"] = gap <= 8 * ROUNDOFF.get(dtype, 2.0**-8) * max(1.0, abs(logit))
    return row


def summarize(rows: pd.DataFrame, baseline: str = "ar") -> pd.DataFrame:
    """One row per method (``prompt_id == "ALL"``) from :func:`specnb.eval.bench.run_bench`'s rows, following
    :mod:`specnb.core.metrics`.

    Ratios of totals over prompts: tokens/s (all new tokens / all seconds), tokens per call ((new tokens -
    one prefill token per prompt) / calls), accepted length (accepted / calls), the MCSD step acceptance rate
    (accepted / (accepted + rejected steps)), the draft's share of wall time, the share of decode time spent
    outside the target's calls, ``speedup_vs_<baseline>`` (the baseline's total seconds / the method's) and
    ``speedup_vs_<baseline>_low`` / ``_high``, its 90% interval over the prompts they share
    (:func:`specnb.core.metrics.rate_ratio_interval`); ``tokens_per_call``, ``accepted_length``, ``acceptance_rate``
    and ``tokens_per_s`` carry ``_low`` / ``_high`` too, their 90% intervals over the method's prompts
    (:func:`specnb.core.metrics.ratio_interval`, :func:`specnb.core.metrics.mean_interval`).
    ``acceptance_rate`` (MAR) is the mean of the per-prompt rates, as its definition says. A column a method
    cannot report (a peer that counts no calls) gives NaN, never a made-up value.

    Rows of :func:`specnb.eval.bench.run_bench` (with ``weight_bytes`` and ``read_gb_per_s``) add the weight
    bytes streamed per second (target calls, prefills included: ``weight_gb_per_s``), that as a fraction of the
    read bandwidth (the median of the run's samples: ``bandwidth_fraction``), and ``decode_bandwidth_fraction``:
    the same over the decoding calls and their seconds only (a prefill is a compute-bound call the same for every
    method; for ``ar`` this is how close the loop runs to the machine's ceiling).
    """
    col = lambda group, name: group[name].sum(min_count=len(group)) if name in group else math.nan  # noqa: E731
    base = rows.loc[rows.method == baseline, "seconds"].sum()
    intervals = speedup_intervals(rows, baseline)
    out = []
    for method, group in rows.groupby("method", sort=False):
        n, calls, seconds, new = len(group), col(group, "calls"), group.seconds.sum(), group.new_tokens.sum()
        accepted, rejected = col(group, "accepted"), col(group, "rejected_steps")
        out.append({
            "method": method, "prompt_id": "ALL", "prompts": n, "new_tokens": new, "calls": calls,
            "seconds": seconds, "tokens_per_s": new / seconds if seconds > 0 else math.nan,
            "tokens_per_call": (new - n) / calls if calls > 0 else math.nan,
            "accepted_length": accepted / calls if calls > 0 else math.nan,
            "acceptance_rate": group.acceptance_rate.mean() if "acceptance_rate" in group else math.nan,
            "step_acceptance_rate": accepted / (accepted + rejected) if accepted + rejected > 0 else math.nan,
            "draft_share": col(group, "draft_seconds") / seconds if seconds > 0 else math.nan,
            "outside_forward_fraction": 1 - col(group, "verify_seconds") / col(group, "decode_seconds")
            if col(group, "decode_seconds") > 0 else math.nan,
            "identical_to_ar": group.identical_to_ar.astype(float).mean() if "identical_to_ar" in group
            else math.nan,
            "held_bytes": group.held_bytes.max() if "held_bytes" in group else math.nan,
            f"speedup_vs_{baseline}": base / seconds if base > 0 else math.nan,
            **dict(zip((f"speedup_vs_{baseline}_low", f"speedup_vs_{baseline}_high"),
                       intervals.get(method, (math.nan, math.nan)), strict=True)),
            **_metric_intervals(group),
            **_bandwidth(group, calls, seconds),
        })
    return pd.DataFrame(out)


def _bandwidth(group: pd.DataFrame, calls: float, seconds: float) -> dict[str, float]:
    """One method's weight bytes streamed per second and its fractions of the read bandwidth (see
    :func:`summarize`); nothing for rows without the bench's machine columns."""
    if "weight_bytes" not in group or "read_gb_per_s" not in group:
        return {}
    weight_bytes, read = group.weight_bytes.iloc[0], group.read_gb_per_s.median()
    out = {"read_gb_per_s": read, "weight_gb_per_s": weight_bytes * (calls + len(group)) / seconds / 1e9}
    out["bandwidth_fraction"] = out["weight_gb_per_s"] / read
    if "decode_seconds" in group:  # the loop alone: prefills (compute-bound, the same for all) left out
        out["decode_bandwidth_fraction"] = weight_bytes * calls / group.decode_seconds.sum(min_count=1) / 1e9 / read
    return out


def _metric_intervals(group: pd.DataFrame) -> dict[str, float]:
    """The 90% intervals over prompts of one method's tokens per call, accepted length, MAR and tokens/s."""
    out: dict[str, float] = {}
    pairs = {"tokens_per_call": ("new_tokens", "calls", 1), "accepted_length": ("accepted", "calls", 0),
             "tokens_per_s": ("new_tokens", "seconds", 0)}
    for name, (numerator, denominator, prefill) in pairs.items():
        low = high = math.nan
        if numerator in group and denominator in group and group[denominator].notna().all():
            low, high = ratio_interval(group[numerator].to_numpy(float) - prefill, group[denominator].to_numpy(float))
        out[f"{name}_low"], out[f"{name}_high"] = low, high
    rates = group.acceptance_rate.to_numpy(float) if "acceptance_rate" in group else np.array([])
    out["acceptance_rate_low"], out["acceptance_rate_high"] = mean_interval(rates) if rates.size else (math.nan,
                                                                                                       math.nan)
    return out


def speedup_intervals(rows: pd.DataFrame, baseline: str) -> dict[str, tuple[float, float]]:
    """{method: (low, high)}: the 90% interval of the baseline's seconds over each method's, on the prompts
    both ran, a prompt listed twice pairing run with run (:func:`specnb.core.metrics.rate_ratio_interval`); empty
    when the baseline did not run."""
    return ratio_intervals(rows, baseline, ("one", "seconds"))


RATIOS = {"tokens_per_call": ("new_tokens_after_prefill", "calls"), "accepted_length": ("accepted", "calls"),
          "tokens_per_s": ("new_tokens", "seconds")}
"""A per-method metric as (numerator, denominator) columns of :func:`specnb.eval.bench.run_bench` rows, summed over
prompts."""


def ratio_intervals(rows: pd.DataFrame, baseline: str, metric: str | tuple[str, str]) -> dict[str, tuple[float, float]]:
    """{method: (low, high)}: the 90% interval of each method's ``metric`` over the baseline's, paired by prompt
    (a prompt listed twice pairing run with run), resampling prompts (:func:`specnb.core.metrics.rate_ratio_interval`).
    metric: a name of :data:`RATIOS` (e.g. DReSD's tokens per call over REST's on the same references) or a
    (numerator, denominator) pair of columns; ``("one", "seconds")`` is the speedup (base seconds / seconds).
    Empty when the baseline did not run."""
    numerator, denominator = RATIOS[metric] if isinstance(metric, str) else metric
    runs = rows.assign(run=rows.groupby(["method", "prompt_id"]).cumcount(), one=1.0,
                       new_tokens_after_prefill=rows.new_tokens - 1 if "new_tokens" in rows else math.nan)
    wide = runs.pivot_table(index=["prompt_id", "run"], columns="method", values=[numerator, denominator],
                            aggfunc="first")
    if baseline not in wide[denominator]:
        return {}
    out = {}
    for method in wide[denominator].columns:
        cols = [(numerator, method), (denominator, method), (numerator, baseline), (denominator, baseline)]
        values = wide[cols].dropna().to_numpy(dtype=float)  # [P, 4]
        out[method] = rate_ratio_interval(*values.T)
    return out
