"""Side-by-side benchmark: our methods and Hugging Face's, same process, same prompts, same token budget.

For every prompt, every method runs once (methods interleaved per prompt, so slow drift of the machine
hits all of them alike), after one warm-up run of each method: :func:`run_bench` returns one row per (method,
prompt), and :func:`specnb.eval.runner.summarize` one row per method (``prompt_id == "ALL"``) with
``speedup_vs_ar``: our AR loop's total wall time over the method's. Greedy runs are checked token for token
against our AR output; where they differ, the first divergence is reported with the AR top-1/top-2 logit gap
there, and whether that gap is within the rounding of the model's dtype (so a bf16 flip can be told from a bug).

The machine's read bandwidth is sampled at the start and after every prompt that ends at least
:data:`RESAMPLE_SECONDS` after the last sample (:func:`specnb.model.ceilings.sample_read_bandwidth`; a VM's drifts
from one minute to the next, and a sample costs ~0.5 s, which short prompts would otherwise mostly measure) and each
row carries the latest sample at the end of its prompt. Each method's ``weight_gb_per_s`` is the target's weight bytes
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
import dataclasses
import io
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..atomic import check_output_file, csv_has_columns, write_text
from ..core.drafter import Drafter
from ..core.prompts import Prompt, check_follow_ups, encode_prompt, with_answer
from ..core.verify import VerifyMode
from ..model.ceilings import sample_read_bandwidth, streamed_bytes
from ..model.device import synchronize
from ..model.kernels.cpu import cpu_class
from ..model.models import LoadedModel, load_model
from .methods import (
    HF_BASELINES,
    LLAMACPP_BASELINES,
    HfAssistedOptions,
    LookupOptions,
    make_drafter,
    method,
    parse_options,
)
from .runner import DecodeRunner, Runner, Variant, _run

RESAMPLE_SECONDS = 10.0  # the read bandwidth is sampled again after a prompt once the last sample is this old


@dataclass
class BenchConfig:
    """What a bench runs; every value is checked when the config is made (ValueError naming the value), before a
    model loads.

    methods: labels of the methods to run (``ar`` is added first: it is the reference); a label is a method's name
    unless ``aliases`` maps it to one (e.g. ``{"dense-id": "dense"}``: DReSD on another store). options: {label: the
    method's options dataclass, or a mapping of option values parsed by
    :func:`specnb.eval.methods.parse_options`}; a label left out gets its method's defaults. temperature, top_p,
    seed: the run's sampling, given here only: a draft model's options that leave them None take these.
    warmup_tokens: new tokens of each method's warm-up run on the first prompt (0: none).
    made: {label: what the caller made and the bench runs as it is: a drafter (None: AR), a
    :class:`~specnb.eval.runner.Variant` (a drafter with its own verification) or a
    :data:`~specnb.eval.runner.Runner`}, for a study's unnamed drafters; their labels follow ``methods`` (``ar``
    among them replaces the named one). check: at temperature > 0, raise
    :class:`~specnb.eval.checks.DegenerateData` when a method other than ``ar`` accepted every token it drafted
    (:func:`~specnb.eval.checks.check_partial_acceptance`: only a draft that is the target does that); False when
    the caller judges that itself.
    After ``__post_init__``, ``options`` holds every named label's typed options.
    """

    methods: Sequence[str]
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    verify: VerifyMode = "tree"
    options: dict[str, Any] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    warmup_tokens: int = 16
    made: dict[str, Drafter | Variant | Runner | None] = field(default_factory=dict)
    check: bool = True

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.temperature < float("inf"):
            raise ValueError(f"--temperature must be >= 0 and finite, got {self.temperature}")
        if not 0 <= self.seed < 1 << 63:
            raise ValueError(f"--seed must be in [0, 2**63), got {self.seed}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.verify not in ("tree", "batch"):
            raise ValueError(f"unknown verification mode {self.verify!r}; use tree or batch")
        if self.warmup_tokens < 0:
            raise ValueError(f"warmup_tokens must be >= 0, got {self.warmup_tokens}")
        self.methods = list(dict.fromkeys(["ar", *self.methods, *self.made]))  # AR always runs: the reference
        unknown = sorted(set(self.options) - set(self.methods))
        if unknown:
            raise ValueError(f"options given for {', '.join(unknown)}, which the bench does not run")
        if made := sorted(set(self.options) & set(self.made)):
            raise ValueError(f"options given for {', '.join(made)}, which the caller made")
        self.options = {label: self._typed(label, self.options.get(label)) for label in self.methods
                        if label not in self.made}

    def method(self, label: str) -> str:
        """The method name of ``label``."""
        return self.aliases.get(label, label)

    def _typed(self, label: str, options: Any) -> Any:
        """``label``'s typed options, their unset sampling fields (None) taken from the run."""
        name = self.method(label)
        if options is None or isinstance(options, Mapping):
            options = parse_options(name, options)
        elif not isinstance(options, method(name).options):
            raise ValueError(f"method {label} takes {method(name).options.__name__}, got "
                             f"{type(options).__name__}")
        run = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}
        unset = {key: value for key, value in run.items() if getattr(options, key, 0) is None}
        return dataclasses.replace(options, **unset) if unset else options


def check_lengths(target: Any, prompts: Sequence[Prompt], max_new_tokens: int, max_context: int) -> None:
    """ValueError naming the first prompt whose tokens and ``max_new_tokens`` exceed ``max_context`` (a second
    turn counts its first turn's answer as ``max_new_tokens``: it is not known yet). ``target``: a
    :class:`LoadedModel`, or before one loads anything with its ``name``, ``tokenizer``, ``chat`` and
    ``vocab_size`` (what :func:`~specnb.core.prompts.encode_prompt` reads)."""
    for prompt in prompts:
        if prompt.follows is None:
            length = encode_prompt(target, prompt).shape[0]
        else:
            length = encode_prompt(target, with_answer(prompt, "")).shape[0] + max_new_tokens
        if length + max_new_tokens > max_context:
            raise ValueError(f"prompt {prompt.id!r} ({length} tokens) + --max-new-tokens {max_new_tokens} "
                             f"exceeds the context of {target.name} ({max_context} tokens)")


def run_bench(target: LoadedModel, prompts: list[Prompt], config: BenchConfig, progress: bool = True,
              sink: Callable[[list[dict]], None] | None = None) -> pd.DataFrame:
    """Run every method of ``config`` on every prompt, each named method's drafter made once for the whole prompt
    list (so what a drafter learns across requests grows as in a server); returns one row per (label, prompt),
    in run order (``ar`` first on each prompt; its output is the answer a follow-up prompt sees for every method),
    with the machine's columns (``weight_bytes``, ``read_gb_per_s``: the read bandwidth sampled right after the
    prompt, ``cpu_class``). :func:`specnb.eval.runner.summarize` turns them into one row per method.

    The one entry for running methods: the command line's, the notebooks' and the studies' (their own drafters
    as ``config.made``). sink: called with the rows of each prompt once all its methods have run (e.g.
    :class:`CsvSink`). Ctrl-C (KeyboardInterrupt) during the prompts stops the run: the result then holds the
    finished prompts only, and ``result.attrs["interrupted"]`` is True. ``result.attrs["prompts_done"]`` counts
    them. ValueError before anything runs when a follow-up prompt comes without its earlier prompt before it, or a
    prompt and ``max_new_tokens`` exceed the target's context.
    """
    if not prompts:
        raise ValueError("no prompts to benchmark")
    check_follow_ups(prompts)
    check_lengths(target, prompts, config.max_new_tokens, target.max_context)  # before any method runs
    machine = {"weight_bytes": streamed_bytes(target), "read_gb_per_s": sample_read_bandwidth(),
               "cpu_class": cpu_class()}
    counter = _CallCounter(target.modules)  # a GGUF model's are never called: the peers count their own

    sampled_at, bandwidth = time.perf_counter(), machine["read_gb_per_s"]

    def sampled(rows: list[dict]) -> None:  # the machine's read bandwidth at the end of this prompt's runs
        nonlocal sampled_at, bandwidth
        if time.perf_counter() - sampled_at >= RESAMPLE_SECONDS:
            bandwidth, sampled_at = sample_read_bandwidth(), time.perf_counter()
        for row in rows:
            row["read_gb_per_s"] = bandwidth
        if sink is not None:
            sink(rows)

    try:
        runners = {label: _Counted(_runner(label, target, config), counter, machine) for label in config.methods}
        return _run(target, prompts, runners, temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                    warmup=config.warmup_tokens, progress=progress, sink=sampled, check=config.check)
    finally:
        counter.remove()


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


def _runner(label: str, target: LoadedModel, config: BenchConfig) -> Runner:
    """The :data:`~specnb.eval.runner.Runner` of one label: the caller's, our loop with a drafter (the caller's or
    the named method's), or a peer."""
    made = config.made.get(label)
    if made is not None and not isinstance(made, Drafter | Variant):
        return made
    if label not in config.made:
        method, options = config.method(label), config.options[label]
        if method in HF_BASELINES:
            return _hf_runner(method, target, options, config)
        if method in LLAMACPP_BASELINES:
            from . import llamacpp

            peer = llamacpp.runner(method, target, target.max_context,
                                   draft_tokens=options.w if isinstance(options, LookupOptions) else 10)
            # llama.cpp runs other weights: its tokens are not compared with our AR's
            return lambda prompt, max_new_tokens: {k: v for k, v in peer(prompt, max_new_tokens).items()
                                                   if k != "tokens"}
        made = make_drafter(method, target, options)
    return DecodeRunner(target, made, temperature=config.temperature, top_p=config.top_p, verify=config.verify,
                        seed=config.seed, record_gaps=label == "ar" and config.temperature == 0)


def _hf_runner(method: str, target: LoadedModel, options: Any, config: BenchConfig):
    """Hugging Face ``generate``: plain, prompt lookup (10 tokens) or assisted by a draft model (loaded on the
    target's device); timed between device synchronisations."""
    device = target.device
    kwargs: dict = {}
    if isinstance(options, LookupOptions):
        kwargs["prompt_lookup_num_tokens"] = options.w
    if isinstance(options, HfAssistedOptions):
        kwargs["assistant_model"] = load_model(options.draft, dtype=target.dtype,
                                               device=device, weights="bf16").model  # runs as HF ships it
    sampling = dict(do_sample=True, temperature=config.temperature, top_p=config.top_p) if config.temperature > 0 \
        else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    eos = sorted(target.eos_token_ids) or None
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else (eos or [0])[0]

    def run(prompt: Prompt, max_new_tokens: int) -> dict:
        ids = encode_prompt(target, prompt)[None].to(device)
        model = target.model  # the dense weights, loaded here first where a GGUF file's blocks run our calls
        torch.manual_seed(config.seed)
        counter = _CallCounter(model)
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 eos_token_id=eos, pad_token_id=pad, **sampling, **kwargs)
        synchronize(device)
        seconds = time.perf_counter() - start
        counter.remove()
        tokens = out[0, ids.shape[1]:].cpu().tolist()
        row = {"new_tokens": len(tokens), "seconds": seconds, "tokens_per_s": len(tokens) / seconds,
               "calls": counter.calls - 1}
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


def format_table(summary: pd.DataFrame) -> str:
    """:func:`specnb.eval.runner.summarize`'s rows as a fixed-width table for the terminal."""
    columns = ["method", "new_tokens", "seconds", "tokens_per_s", "tokens_per_call", "speedup_vs_ar",
               "speedup_vs_ar_low", "speedup_vs_ar_high", "identical_to_ar", "weight_gb_per_s", "bandwidth_fraction",
               "decode_bandwidth_fraction", "outside_forward_fraction"]
    return summary[[c for c in columns if c in summary]].to_string(index=False, float_format=lambda x: f"{x:.3f}")


BENCH_COLUMNS = frozenset({"method", "prompt_id"})  # every row the bench writes has them


def check_writable(path: str | Path) -> Path:
    """``path`` as a Path if the bench may write its CSV there (:func:`specnb.atomic.check_output_file`: a new
    file, or one whose header holds :data:`BENCH_COLUMNS`); ValueError saying why not otherwise."""
    return check_output_file(path, lambda p: csv_has_columns(p, BENCH_COLUMNS), "a bench CSV")


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
