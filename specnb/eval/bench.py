"""Side-by-side benchmark: our methods and Hugging Face's, same process, same prompts, same token budget.

For every prompt, every method runs once (methods interleaved per prompt, so slow drift of the machine
hits all of them alike), after one warm-up run of each method. One row per (method, prompt), then one
summary row per method (``prompt_id == "ALL"``) with ``speedup_vs_ar``: our AR loop's total wall time over
the method's. Greedy runs are checked token for token against our AR output; where they differ, the
first divergence is reported with the AR top-1/top-2 logit gap there, and whether that gap is within the
rounding of the model's dtype (so a bf16 flip can be told from a bug).

The machine's read bandwidth is sampled at the start and after every prompt
(:func:`specnb.model.ceilings.sample_read_bandwidth`; a VM's drifts from one minute to the next) and each row
carries the sample taken after its prompt. Each method's ``weight_gb_per_s`` is the target's weight bytes
streamed per call (:func:`specnb.model.ceilings.streamed_bytes`) times its target calls (prefills included) over its
wall time, and ``bandwidth_fraction`` that over the median of the read bandwidth samples;
``decode_bandwidth_fraction`` counts the decoding calls and seconds only (for AR, how close the loop runs to the
machine's ceiling). The ``hf*`` baselines run the
model as Hugging Face ships it (``generate``: its decoder, PyTorch's GEMM and SDPA) on the dense checkpoint;
where our target computes over GGUF blocks their tokens, like llama.cpp's, are not compared with our AR's.

Nothing is lost: :class:`BenchConfig` checks every value when it is made (before a model loads), a
:class:`CsvSink` appends each prompt's rows to the CSV as soon as the prompt is done, and Ctrl-C stops the
run between two steps with the rows of every finished prompt kept and summarised.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..atomic import write_text
from ..core.prompts import Prompt, encode_prompt, with_answer
from ..model.ceilings import sample_read_bandwidth, streamed_bytes
from ..model.device import model_device, synchronize
from ..model.kernels.cpu import cpu_class
from ..model.models import LoadedModel, load_model
from .methods import HF_BASELINES, LLAMACPP_BASELINES, HfAssistedOptions, LookupOptions, make_drafter, options_for
from .runner import DecodeRunner, Runner, run
from .runner import summarize as experiments_summarize


@dataclass
class BenchConfig:
    """What a bench runs; every value is checked when the config is made (ValueError naming the value).

    methods: method names (``ar`` is added first: it is the reference). options: {method: its options
    dataclass} (:func:`specnb.eval.methods.options_for`); a method left out gets its defaults, with the run's
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
    """Run every method on every prompt (:func:`specnb.experiments.run`); returns per-prompt rows followed by
    one summary row per method.

    sink: called with the rows of each prompt once all its methods have run (e.g. :class:`CsvSink`).
    Ctrl-C (KeyboardInterrupt) during the prompts stops the run: the result then holds the finished prompts
    only, and ``result.attrs["interrupted"]`` is True. ``result.attrs["prompts_done"]`` counts them.
    """
    if not prompts:
        raise ValueError("no prompts to benchmark")
    for prompt in prompts:  # the user's budget, checked before any method runs (warm-up included)
        if prompt.follows is None:
            length = encode_prompt(target, prompt).shape[0]
        else:  # a second turn: its first turn's answer (at most max_new_tokens) is not known yet
            length = encode_prompt(target, with_answer(prompt, "")).shape[0] + config.max_new_tokens
        if length + config.max_new_tokens > target.max_context:
            raise ValueError(f"prompt {prompt.id!r} ({length} tokens) + --max-new-tokens {config.max_new_tokens} "
                             f"exceeds the context of {target.name} ({target.max_context} tokens)")
    methods, counter = bench_runners(target, config, {m: (m, config.options[m]) for m in config.methods})

    def sampled(rows: list[dict]) -> None:  # the machine's read bandwidth right after this prompt's runs
        bandwidth = sample_read_bandwidth()
        for row in rows:
            row["read_gb_per_s"] = bandwidth
        if sink is not None:
            sink(rows)

    try:
        per_prompt = run(target, prompts, methods, temperature=config.temperature, top_p=config.top_p,
                         verify=config.verify, max_new_tokens=config.max_new_tokens, warmup=config.warmup_tokens,
                         seed=config.seed, progress=progress, sink=sampled)
    finally:
        counter.remove()
    results = pd.concat([per_prompt, summarize(per_prompt)], ignore_index=True) if len(per_prompt) else per_prompt
    results.attrs.update(per_prompt.attrs)
    return results


def summarize(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """:func:`specnb.experiments.summarize` (speedup vs our AR) plus the weight bytes streamed per second
    (target calls, prefills included) and that as a fraction of the read bandwidth (the median of the run's
    samples, ``read_gb_per_s``); and, for our methods,
    ``decode_bandwidth_fraction``: the same over the decoding calls and their seconds only (a prefill is a
    compute-bound call the same for every method; for ``ar`` this is how close the loop runs to the ceiling)."""
    summary = experiments_summarize(per_prompt, baseline="ar")
    if "weight_bytes" in per_prompt:
        by_method = per_prompt.groupby("method", sort=False)
        weight_bytes, read = by_method.weight_bytes.first().to_numpy(), by_method.read_gb_per_s.median().to_numpy()
        target_calls = summary.calls.to_numpy() + summary.prompts.to_numpy()  # + one prefill per prompt
        summary["read_gb_per_s"] = read
        summary["weight_gb_per_s"] = weight_bytes * target_calls / summary.seconds / 1e9
        summary["bandwidth_fraction"] = summary.weight_gb_per_s / read
        if "decode_seconds" in per_prompt:  # the loop alone: prefills (compute-bound, the same for all) left out
            decode = by_method.decode_seconds.sum(min_count=1).to_numpy()
            summary["decode_bandwidth_fraction"] = weight_bytes * summary.calls.to_numpy() / decode / 1e9 / read
    return summary


def bench_runners(target: LoadedModel, config: BenchConfig, methods: dict[str, tuple[str, Any]]
                  ) -> tuple[dict[str, Runner], _CallCounter]:
    """{label: runner} for :func:`specnb.experiments.run` from {label: (method name, its options)} (one method
    may appear under several labels, e.g. two datastores), with the machine's columns on every row and the
    target's forward calls counted for the peers; remove the returned counter's hook after the run."""
    machine = {"weight_bytes": streamed_bytes(target), "read_gb_per_s": sample_read_bandwidth(),
               "cpu_class": cpu_class()}
    counter = _CallCounter(target.model)
    return {label: _Counted(_method(name, target, options, config), counter, machine)
            for label, (name, options) in methods.items()}, counter


class _Counted:
    """``runner`` whose rows carry the machine's columns and, where it reports none, the target's forward
    calls after prefill, counted by a hook; ``clear()`` reaches the runner's drafter."""

    def __init__(self, runner: Runner, counter: _CallCounter, machine: dict):
        self.runner, self.counter, self.machine = runner, counter, machine

    def __call__(self, prompt: Prompt, max_new_tokens: int) -> dict:
        self.counter.calls = 0
        out = self.runner(prompt, max_new_tokens)
        out.setdefault("calls", self.counter.calls - 1)
        return {**self.machine, **out}

    def clear(self) -> None:
        if hasattr(self.runner, "clear"):
            self.runner.clear()


def _method(method: str, target: LoadedModel, options: Any, config: BenchConfig) -> Runner:
    """A :data:`specnb.experiments.Runner` for one method: our loop with its drafter, or a peer."""
    if method in HF_BASELINES:
        return _hf_runner(method, target, options, config)
    if method in LLAMACPP_BASELINES:
        from . import llamacpp

        peer = llamacpp.runner(method, target, target.max_context,
                               draft_tokens=options.w if isinstance(options, LookupOptions) else 10)
        # llama.cpp runs other weights: its tokens are not compared with our AR's
        return lambda prompt, max_new_tokens: {k: v for k, v in peer(prompt, max_new_tokens).items() if k != "tokens"}
    return DecodeRunner(target, make_drafter(method, target, options), temperature=config.temperature,
                        top_p=config.top_p, verify=config.verify, seed=config.seed,
                        record_gaps=method == "ar" and config.temperature == 0)


def _hf_runner(method: str, target: LoadedModel, options: Any, config: BenchConfig):
    """Hugging Face ``generate``: plain, prompt lookup (10 tokens) or assisted by a draft model (loaded on the
    target's device); timed between device synchronisations."""
    device = model_device(target.model)
    kwargs: dict = {}
    if isinstance(options, LookupOptions):
        kwargs["prompt_lookup_num_tokens"] = options.w
    if isinstance(options, HfAssistedOptions):
        kwargs["assistant_model"] = load_model(options.draft, dtype=next(target.model.parameters()).dtype,
                                               device=device, weights="bf16").model  # runs as HF ships it
    sampling = dict(do_sample=True, temperature=config.temperature, top_p=config.top_p) if config.temperature > 0 \
        else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos = sorted(target.eos_token_ids) or None
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else (eos or [0])[0]

    def run(prompt: Prompt, max_new_tokens: int) -> dict:
        ids = encode_prompt(target, prompt)[None].to(device)
        torch.manual_seed(config.seed)
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                        eos_token_id=eos, pad_token_id=pad, **sampling, **kwargs)
        synchronize(device)
        seconds = time.perf_counter() - start
        tokens = out[0, ids.shape[1]:].cpu().tolist()
        row = {"new_tokens": len(tokens), "seconds": seconds, "tokens_per_s": len(tokens) / seconds}
        # over GGUF blocks our AR runs other weights than Hugging Face's dense checkpoint: nothing to compare
        return row if target.weights.startswith("gguf") else {**row, "tokens": tokens}

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
               "speedup_vs_ar_low", "speedup_vs_ar_high", "identical_to_ar", "weight_gb_per_s", "bandwidth_fraction",
               "decode_bandwidth_fraction", "outside_forward_fraction"]
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
    if path.is_file() and path.stat().st_size and not is_bench_csv(path):
        raise ValueError(f"--out {path} exists and is not a bench CSV of specnb (its header lacks "
                         f"{' and '.join(sorted(BENCH_COLUMNS))}); refusing to replace it: name another file")
    return path


BENCH_COLUMNS = frozenset({"method", "prompt_id"})  # every row the bench writes has them


def is_bench_csv(path: Path) -> bool:
    """Whether ``path`` starts with a CSV header holding the bench's :data:`BENCH_COLUMNS` (a file the bench wrote,
    which it may replace; any other file is the user's)."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader([f.readline(1 << 16)]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return BENCH_COLUMNS <= {column.strip() for column in header}


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
