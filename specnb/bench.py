"""Side-by-side benchmark: our methods and Hugging Face's, same process, same prompts, same token budget.

For every prompt, every method runs once (methods interleaved per prompt, so slow drift of the machine
hits all of them alike), after one warm-up run of each method. One row per (method, prompt), then one
summary row per method (``prompt_id == "ALL"``) with ``speedup_vs_ar``: our AR loop's total wall time over
the method's. Greedy runs are checked token for token against our AR output; where they differ, the
first divergence is reported with the AR top-1/top-2 logit gap there, and whether that gap is within the
rounding of the model's dtype (so a bf16 flip can be told from a bug).

The machine's read bandwidth is measured once at the start (:func:`specnb.ceilings.read_bandwidth`);
each method's ``weight_gb_per_s`` is the target's weight bytes streamed per call
(:func:`specnb.ceilings.streamed_bytes`)
times its target calls (prefills included) over its wall time, and ``bandwidth_fraction`` that over the
read bandwidth: for AR, how close the loop runs to the machine's ceiling. The ``hf*`` baselines run the
model as Hugging Face ships it (:func:`specnb.kernels.stock`: PyTorch's GEMM and SDPA).

Nothing is lost: :class:`BenchConfig` checks every value when it is made (before a model loads), a
:class:`CsvSink` appends each prompt's rows to the CSV as soon as the prompt is done, and Ctrl-C stops the
run between two steps with the rows of every finished prompt kept and summarised.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from . import kernels
from .ceilings import read_bandwidth, streamed_bytes
from .datastores.atomic import write_text
from .decode import generate
from .device import model_device, synchronize
from .kernels.cpu import cpu_class
from .methods import HF_BASELINES, LLAMACPP_BASELINES, HfAssistedOptions, LookupOptions, make_drafter, options_for
from .metrics import first_divergence
from .models import LoadedModel, load_model
from .prompts import Prompt, encode_prompt

# Relative precision of a logit in each dtype (unit roundoff); a top-2 gap below a few units of the top
# logit's magnitude can flip between two mathematically equal computations.
ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


@dataclass
class BenchConfig:
    """What a bench runs; every value is checked when the config is made (ValueError naming the value).

    methods: method names (``ar`` is added first: it is the reference). options: {method: its options
    dataclass} (:func:`specnb.methods.options_for`); a method left out gets its defaults, with the run's
    temperature, top_p and seed.
    """

    methods: list[str]
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    verify: str = "tree"
    options: dict[str, Any] = field(default_factory=dict)
    warmup_tokens: int = 16

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.verify not in ("tree", "batch"):
            raise ValueError(f"unknown verification mode {self.verify!r}; use tree or batch")
        self.methods = list(dict.fromkeys(["ar", *self.methods]))  # AR always runs: it is the reference
        run = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}
        missing = [m for m in self.methods if m not in self.options]
        self.options = {**options_for(missing, {}, run=run), **self.options}


def run_bench(target: LoadedModel, prompts: list[Prompt], config: BenchConfig, progress: bool = True,
              sink: Callable[[list[dict]], None] | None = None) -> pd.DataFrame:
    """Run every method on every prompt; returns per-prompt rows followed by one summary row per method.

    sink: called with the rows of each prompt once all its methods have run (e.g. :class:`CsvSink`).
    Ctrl-C (KeyboardInterrupt) during the prompts stops the run: the result then holds the finished prompts
    only, and ``result.attrs["interrupted"]`` is True. ``result.attrs["prompts_done"]`` counts them.
    """
    if not prompts:
        raise ValueError("no prompts to benchmark")
    for prompt in prompts:  # the user's budget, checked before any method runs (warm-up included)
        length = encode_prompt(target, prompt).shape[0]
        if length + config.max_new_tokens > target.max_context:
            raise ValueError(f"prompt {prompt.id!r} ({length} tokens) + --max-new-tokens {config.max_new_tokens} "
                             f"exceeds the context of {target.name} ({target.max_context} tokens)")
    runners = {m: _runner(m, target, config.options[m], config) for m in config.methods}
    for method in config.methods:  # warm-up: allocator, kernels, lazily built tables
        runners[method](prompts[0], min(config.warmup_tokens, config.max_new_tokens))

    bandwidth = read_bandwidth()
    weight_bytes = streamed_bytes(target.model)
    rows: list[dict] = []
    done, interrupted = 0, False
    counter = _CallCounter(target.model)
    try:
        for prompt in tqdm(prompts, desc="bench", disable=not progress):
            reference: dict = {}
            prompt_rows = []
            for method in config.methods:
                counter.calls = 0
                out = runners[method](prompt, config.max_new_tokens)
                out.setdefault("calls", counter.calls - 1)  # forward calls after prefill
                row = {"method": method, "prompt_id": prompt.id, "weight_bytes": weight_bytes, **out,
                       "read_gb_per_s": bandwidth, "cpu_class": cpu_class()}
                if method == "ar":
                    reference = dict(out)
                prompt_rows.append(_compare(row, reference, config, target))
            rows += prompt_rows
            done += 1
            if sink is not None:
                sink(prompt_rows)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        counter.remove()
    per_prompt = pd.DataFrame(rows)
    results = pd.concat([per_prompt, summarize(per_prompt)], ignore_index=True) if rows else per_prompt
    results.attrs.update(interrupted=interrupted, prompts_done=done)
    return results


def summarize(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """One row per method: totals, tokens/s over all prompts, mean tokens per call, speedup vs our AR, and the
    weight bytes streamed per second (target calls, prefills included) as a fraction of the read bandwidth."""
    ar_seconds = per_prompt.loc[per_prompt.method == "ar", "seconds"].sum()
    rows = []
    for method, group in per_prompt.groupby("method", sort=False):
        calls = group.calls.sum(min_count=len(group))  # NaN when a runner cannot count them (llamacpp-pld)
        target_calls = calls + len(group)  # + one prefill per prompt
        weight_gb_per_s = group.weight_bytes.iloc[0] * target_calls / group.seconds.sum() / 1e9 \
            if "weight_bytes" in group else math.nan
        rows.append({
            "method": method, "prompt_id": "ALL",
            "new_tokens": group.new_tokens.sum(), "calls": calls, "seconds": group.seconds.sum(),
            "tokens_per_s": group.new_tokens.sum() / group.seconds.sum(),
            # the prefill's token is not a call's: (new tokens - 1 per prompt) / calls, as in metrics.py
            "tokens_per_call": (group.new_tokens.sum() - len(group)) / max(1, calls) if calls == calls else math.nan,
            "accepted_length": group.accepted_length.mean() if "accepted_length" in group else math.nan,
            "identical_to_ar": group.identical_to_ar.mean(),
            "outside_forward_fraction": group.outside_forward_fraction.mean(),
            "speedup_vs_ar": ar_seconds / group.seconds.sum(),
            "weight_gb_per_s": weight_gb_per_s,
            "bandwidth_fraction": weight_gb_per_s / group.read_gb_per_s.iloc[0] if "read_gb_per_s" in group
            else math.nan,
        })
    return pd.DataFrame(rows)


def _compare(row: dict, reference: dict, config: BenchConfig, target: LoadedModel) -> dict:
    """Add identical_to_ar and, for greedy runs that differ, where and how close the AR call was there."""
    tokens = row.pop("tokens")
    for private in [key for key in row if key.startswith("_")]:
        del row[private]
    if config.temperature > 0 or row["method"] in LLAMACPP_BASELINES:
        # sampled runs differ by design (their check is statistical: tests); llama.cpp runs other weights
        return {**row, "identical_to_ar": math.nan}
    index = first_divergence(reference["tokens"], tokens)
    row["identical_to_ar"] = index is None
    row["first_divergence"] = index
    if index is not None and index < len(reference["_gaps"]):
        gap, logit = reference["_gaps"][index], reference["_top1"][index]
        dtype = next(target.model.parameters()).dtype
        row["first_divergence_gap"] = gap
        # A few units of roundoff of the logit's magnitude: rounding in the last layers and the LM head.
        row["gap_within_rounding"] = gap <= 8 * ROUNDOFF.get(dtype, 2.0**-8) * max(1.0, abs(logit))
    return row


def _runner(method: str, target: LoadedModel, options: Any, config: BenchConfig):
    """A function (prompt, max_new_tokens) -> result dict for one method."""
    if method in HF_BASELINES:
        return _hf_runner(method, target, options, config)
    if method in LLAMACPP_BASELINES:
        from . import llamacpp

        return llamacpp.runner(method, target, target.max_context,
                               draft_tokens=options.w if isinstance(options, LookupOptions) else 10)
    drafter = make_drafter(method, target, options)

    def run(prompt: Prompt, max_new_tokens: int) -> dict:
        out = generate(target, prompt, drafter, max_new_tokens=max_new_tokens, temperature=config.temperature,
                       top_p=config.top_p, verify=config.verify, seed=config.seed, record_gaps=method == "ar")
        result = {**out.stats.summary(), "calls": out.stats.num_calls, "tokens": out.tokens}
        if method == "ar":  # what comparisons need; underscored keys stay out of the CSV
            result.update(_gaps=out.top2_gaps, _top1=out.top1_logits)
        return result

    return run


def _hf_runner(method: str, target: LoadedModel, options: Any, config: BenchConfig):
    """Hugging Face ``generate``: plain, prompt lookup (10 tokens) or assisted by a draft model (loaded on the
    target's device); timed between device synchronisations."""
    device = model_device(target.model)
    kwargs: dict = {}
    if isinstance(options, LookupOptions):
        kwargs["prompt_lookup_num_tokens"] = options.w
    if isinstance(options, HfAssistedOptions):
        kwargs["assistant_model"] = load_model(options.draft, dtype=next(target.model.parameters()).dtype,
                                               device=device).model
    sampling = dict(do_sample=True, temperature=config.temperature, top_p=config.top_p) if config.temperature > 0 \
        else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos = sorted(target.eos_token_ids) or None
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else (eos or [0])[0]

    def run(prompt: Prompt, max_new_tokens: int) -> dict:
        ids = encode_prompt(target, prompt)[None].to(device)
        torch.manual_seed(config.seed)
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode(), contextlib.ExitStack() as stack:
            for model in (target.model, kwargs.get("assistant_model")):  # both as Hugging Face ships them
                if model is not None:
                    stack.enter_context(kernels.stock(model))
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                        eos_token_id=eos, pad_token_id=pad, **sampling, **kwargs)
        synchronize(device)
        seconds = time.perf_counter() - start
        tokens = out[0, ids.shape[1]:].cpu().tolist()
        return {"new_tokens": len(tokens), "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
                "tokens": tokens}

    return run


class _CallCounter:
    """Counts forward calls of a model (for HF methods, whose loops we cannot instrument)."""

    def __init__(self, model: torch.nn.Module):
        self.calls = 0
        self._handle = model.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()


def format_table(results: pd.DataFrame) -> str:
    """The summary rows as a fixed-width table for the terminal."""
    summary = results[results.prompt_id == "ALL"]
    columns = ["method", "new_tokens", "seconds", "tokens_per_s", "tokens_per_call", "speedup_vs_ar",
               "identical_to_ar", "weight_gb_per_s", "bandwidth_fraction", "outside_forward_fraction"]
    return summary[[c for c in columns if c in summary]].to_string(index=False, float_format=lambda x: f"{x:.3f}")


def check_writable(path: str | Path) -> Path:
    """``path`` as a Path if a file can be written there; ValueError saying why not otherwise."""
    path = Path(path)
    parent = path.parent
    if path.is_dir():
        raise ValueError(f"--out {path} is a directory; name a file in it")
    if not parent.is_dir():
        raise ValueError(f"--out {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"--out {path} is not writable")
    return path


class CsvSink:
    """Bench rows appended to a CSV file as they come, flushed at once, so an interrupted run keeps them.

    The header is every column seen so far; when new rows bring a column (a divergence, the summary's
    speedup) the file is rewritten atomically under the wider header, else the rows are appended.
    """

    def __init__(self, path: str | Path):
        self.path = check_writable(path)
        self.rows: list[dict] = []
        self.columns: list[str] = []

    def __call__(self, rows: list[dict]) -> None:
        self.rows += rows
        columns = list(dict.fromkeys([*self.columns, *(key for row in rows for key in row)]))
        if columns != self.columns:
            self.columns = columns
            write_text(self.path, self._format(self.rows, header=True))
        else:
            with self.path.open("a", newline="") as f:
                f.write(self._format(rows, header=False))  # one write: a Ctrl-C never splits a row

    def _format(self, rows: list[dict], header: bool) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, self.columns, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()
