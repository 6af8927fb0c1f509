"""Timing one target call over a grid of draft shapes (N-Grammys §3, Fig. 1): the roofline tables the cost model reads.

One *cell* is a forward call of the target on a (k, w + 1) block of tokens, k rows that share a KV cache of
``context`` tokens (expanded k times, as batch verification does), after the cache is in place. Its cost is
the median wall time of several calls; the *slow-down* is that time over the time of (k, w) = (1, 0) at the
same context length. "Verification is free" (the memory-bound assumption) holds where the slow-down is ~1.

:func:`cost_table` measures a target's table once and caches it where
:func:`specnb.core.roofline.cached_cost_model` reads it. On a GPU the same code times randomly initialised models
of real shapes (:func:`random_model`; timings do not depend on weight values):
``specnb roofline --model random:mistral-7b --dtype bfloat16 --out data/roofline_gpu.csv``.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PretrainedConfig, PreTrainedModel

from ..atomic import write_csv
from ..core.head_rows import PROBE_ROWS, cheapest_rows, splits
from ..core.roofline import CostModel, cached_cost_model, cost_table_path, device_name
from ..model.ceilings import (
    cuda_ceilings,
    gemm_flops,
    matmul_parameters,
    path_instruction,
    peak_macs,
    read_bandwidth,
    sample_read_bandwidth,
    streamed_bytes,
)
from ..model.device import resolve_device, synchronize
from ..model.forward import forward
from ..model.kernels.cpu import cpu_class
from ..model.kv_cache import GrowingCache
from ..model.models import LoadedModel, byte_tokenizer, resolve_dtype


@dataclass(frozen=True)
class Grid:
    """Which cells to time. ``max_tokens`` skips cells with k * (w + 1) above it (None: time them all)."""

    ks: tuple[int, ...]
    ws: tuple[int, ...]
    contexts: tuple[int, ...]
    repeats: int
    max_tokens: int | None = None

    def cells(self) -> list[tuple[int, int, int]]:
        """(context, k, w) in timing order; (1, 0) first at each context (it is the reference)."""
        out = []
        for context in self.contexts:
            shapes = [(k, w) for k in self.ks for w in self.ws
                      if self.max_tokens is None or k * (w + 1) <= self.max_tokens or (k, w) == (1, 0)]
            shapes.sort(key=lambda s: s != (1, 0))
            out += [(context, k, w) for k, w in shapes]
        return out


COLUMNS = frozenset({"context", "k", "w", "tokens", "seconds", "slowdown"})
"""Columns every table :func:`measure` returns has (how ``specnb roofline --out`` knows a CSV it may replace)."""

PAPER_KS = tuple(range(1, 33))
PAPER_WS = tuple(range(16))
CONTEXTS = (256, 1024, 4096)
PAPER_CONTEXTS = (25, 100, 500)  # N-Grammys Fig. 1: the context lengths of its three heatmaps
COARSE_KS = (1, 2, 4, 8, 16, 32)
COARSE_WS = (0, 1, 3, 7, 15)
GRIDS = {
    # the paper's grid: k = 1..32, w = 0..15, three context lengths, median of 5 calls
    "full": Grid(PAPER_KS, PAPER_WS, CONTEXTS, repeats=5),
    # powers of two in k and 2^n - 1 in w (every (k, w + 1) block size class) up to 64 tokens per call, median
    # of 5 calls after a warm-up call per cell
    "quick": Grid(COARSE_KS, COARSE_WS, CONTEXTS[:2], repeats=5, max_tokens=64),
    # the cost curve: one row of 1..64 tokens (a chain or a tree), contexts 256 / 1k / 4k
    "curve": Grid((1,), (0, 1, 3, 7, 15, 31, 63), CONTEXTS, repeats=5),
    "smoke": Grid((1, 2, 4), (0, 1, 3), (25, 100), repeats=2),
    # a GPU's table (data/roofline_gpu.csv): the quick grid's drafts, and chains and trees of up to 256 tokens in
    # one row, up to 512 tokens a call (a GPU verifies far more than a CPU before a call costs more than one token's)
    "gpu": Grid(COARSE_KS, COARSE_WS + (31, 63, 127, 255), CONTEXTS[:2], repeats=5, max_tokens=512),
    # N-Grammys Fig. 1 as the paper drew it: k = 1..32, w = 0..15 at its context lengths 25 / 100 / 500
    "paper": Grid(PAPER_KS, PAPER_WS, PAPER_CONTEXTS, repeats=5),
    # the quick grid's block-size classes at the paper's context lengths, median of 3 paired calls
    "paper-quick": Grid(COARSE_KS, COARSE_WS, PAPER_CONTEXTS, repeats=3, max_tokens=64),
    # the shapes the adaptive draft shape may pick by default (up to 64 tokens per call: beyond that an fp32
    # call costs several single-token calls on CPUs); widen it for GPUs with `-o roofline=table.csv`
    "adaptive": Grid((1, 2, 3, 4, 5, 6, 8, 10, 12, 16), (0, 1, 2, 3, 4, 6, 8, 10, 12, 15), (100, 500),
                     repeats=3, max_tokens=64),
}


def get_grid(name: str) -> Grid:
    if name not in GRIDS:
        raise ValueError(f"unknown roofline grid {name!r}; use one of {', '.join(GRIDS)}")
    return GRIDS[name]


HEAD_ROWS_TIMED = 64  # the head curve's largest row count; CostModel prices more rows in proportion
LEAST_RATIO = 0.9  # a block of several tokens over the one-token call just before it: below this, a disturbed pair
RETRIES = 3  # times such a pair is timed again before its ratio is kept as it is
SPREAD = 1.3  # a cell's passes agree where more than half lie within this band (largest / smallest) around their median
ORDER_SLACK = 1.05  # more tokens, or a longer context, costing less than the other cell over this: both timed again
EXTRA_PASSES = 6  # passes over the cells that cannot be true as timed, at most, before they are kept as they are
PASS_SAMPLE_MB = 128  # MB read to sample the bandwidth before each pass (~15 ms; tells a VM's states apart)


def implausible(seconds: dict[tuple[int, int, int], float],
                passes: dict[tuple[int, int, int], list[float]]) -> set[tuple[int, int, int]]:
    """The cells of a timed table that cannot be true as timed: ``seconds`` (context, k, w) -> seconds of one call,
    ``passes`` -> its paired ratios, one a pass. A cell is implausible where its passes disagree (no more than half
    of them within the band :data:`SPREAD` wide around their median: its median is one disturbed pass away from
    another value), or where it costs :data:`ORDER_SLACK` less than a cell that does less work: as many drafts (k)
    of fewer tokens (w), fewer drafts of as many tokens, or the same block at a shorter context (both cells of such a
    pair are returned: which was disturbed is unknown)."""
    half_band = SPREAD**0.5
    out = set()
    for cell, ratios in passes.items():
        middle = statistics.median(ratios)
        if 2 * sum(middle / half_band <= r <= middle * half_band for r in ratios) <= len(ratios):
            out.add(cell)
    for axis in range(3):  # along the context, k, then w: neighbours that differ in that coordinate only
        rest = [a for a in range(3) if a != axis]
        lines: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for cell in seconds:
            lines.setdefault((cell[rest[0]], cell[rest[1]]), []).append(cell)
        for line in lines.values():
            line.sort(key=lambda cell: cell[axis])
            for less, more in zip(line, line[1:], strict=False):
                if seconds[more] * ORDER_SLACK < seconds[less]:
                    out |= {less, more}
    return out


@torch.inference_mode()
def time_cells(target: LoadedModel, grid: Grid, seed: int = 0, progress: bool = True,
               desc: str = "roofline", graphs: bool = False) -> pd.DataFrame:
    """Median seconds of one call per cell; columns context, k, w, tokens, seconds, slowdown, and the spread
    of the slow-down over the timed passes (``slowdown_low`` / ``slowdown_high``: the cell's smallest and
    largest paired ratio over the median ratio of (1, 0) at that context; ``passes``: how many). On a CPU, the read
    bandwidth sampled before each timed pass: ``read_gb_per_s`` (their median), ``read_gb_per_s_low`` /
    ``read_gb_per_s_high`` (the smallest and largest), the host's state while the table was timed (a VM's halves or
    doubles within minutes, and a multi-token call's price over a one-token call's moves with it: docs/kernels.md).

    Each context length's cache is filled once with random tokens (batch 1); before every call the cache is
    cut back to that prefill (a view), and a k-row block attends to it broadcast to k rows (see
    :mod:`specnb.model.kv_cache`), so each call appends the same (k, w + 1) block to the same cache.

    A VM's memory bandwidth drifts within minutes, so a cell's seconds are not its calls' median alone: every
    call of a cell is paired with a one-token call at the same context just before it, and the cell costs the
    median of its ratios to those calls times the median one-token call at that context. Cells are timed in
    passes, every cell once per pass in a fresh random order, and the first pass is an untimed warm-up (kernels
    and allocations differ per shape, notably on a GPU). Why, measured: docs/forward_pass.md, "Measurements
    behind the code".

    A pair that cannot be true is timed again (up to :data:`RETRIES` times): a block of several tokens does all of
    a one-token call's work and more, so a ratio below :data:`LEAST_RATIO` says the one-token call was disturbed
    (docs/forward_pass.md, "Measurements behind the code"). And a cell that cannot be true among the others
    (:func:`implausible`: passes that disagree, or less work costing more) is timed again with its partner, in up to
    :data:`EXTRA_PASSES` more passes over such cells, and costs the median of all its passes (``passes`` counts them;
    ``settled`` is False for a cell still implausible after them, kept as timed and marked in notebook 05's heatmaps).

    ``graphs`` (a CUDA device only): each (context, block) call is captured once as a CUDA graph and the timings
    replay it, so a call costs its kernels without PyTorch's launches from Python (what a serving stack's decode
    pays); eager calls otherwise, as the papers' Hugging Face implementations make them.

    Where a call's output head computes only the rows acceptance reads (:func:`specnb.core.head_rows.splits`), the
    head alone is timed too, on every row count of the cells up to :data:`HEAD_ROWS_TIMED` and on
    :data:`specnb.core.head_rows.PROBE_ROWS`, in the same passes and paired alike (with a one-token call at the
    first context): columns ``head_seconds`` (on the cell's ``tokens`` rows; NaN above) and ``head_first`` (the
    rows a call's head computes at its first read, :func:`specnb.core.head_rows.cheapest_rows` of these timings),
    which :class:`specnb.core.roofline.CostModel` prices replayed calls with.
    """
    device = target.device
    vocab = target.vocab_size
    generator = torch.Generator().manual_seed(seed)
    caches = {}
    for context in grid.contexts:
        caches[context] = GrowingCache()
        prompt = torch.randint(vocab, (1, context), generator=generator)
        forward(target, prompt, last_only=True, cache=caches[context])
    cells = grid.cells()
    blocks = {cell: torch.randint(vocab, (cell[1], cell[2] + 1), generator=generator).to(device) for cell in cells}
    one = {context: torch.randint(vocab, (1, 1), generator=generator).to(device) for context in grid.contexts}
    ratios: dict[tuple[int, int, int], list[float]] = {cell: [] for cell in cells}
    single: dict[int, list[float]] = {context: [] for context in grid.contexts}
    head = target.decoder.head
    hidden = torch.randn(max(HEAD_ROWS_TIMED, *PROBE_ROWS), target.config.hidden_size,
                         generator=generator).to(device, target.dtype)
    head_rows = sorted(set(PROBE_ROWS) | {k * (w + 1) for _, k, w in cells if k * (w + 1) <= HEAD_ROWS_TIMED}) \
        if splits(head, hidden) else []
    head_ratios: dict[int, list[float]] = {rows: [] for rows in head_rows}
    captured: dict[tuple, torch.cuda.CUDAGraph] = {}

    def run(context: int, block: torch.Tensor) -> None:
        caches[context].keep(context, torch.empty(0, dtype=torch.long))
        forward(target, block, cache=caches[context])

    if graphs:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        pool = torch.cuda.graph_pool_handle()  # one pool for every graph: they never run at once
        for context, k, w in cells:  # every block once, eagerly: the caches reach their final buffers before any
            run(context, blocks[context, k, w])  # graph records them

    def clocked(key: tuple, work: Callable[[], object]) -> float:
        """Seconds of ``work`` once (replayed from its graph, captured on its first call, with ``graphs``)."""
        if graphs and key not in captured:
            work()  # allocations and lazy tables outside the graph
            captured[key] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(captured[key], pool=pool):
                work()
        synchronize(device)
        start = time.perf_counter()
        if graphs:
            captured[key].replay()
        else:
            work()
        synchronize(device)
        return time.perf_counter() - start

    def call(context: int, block: torch.Tensor) -> float:
        return clocked((context, *block.shape), lambda: run(context, block))

    def head_call(rows: int) -> float:
        return clocked(("head", rows), lambda: head(hidden[:rows]))

    def time_one(index: int, timed: bool) -> None:
        """Cell ``index`` (past the cells: the head on some rows) and its one-token partner, once."""
        if index >= len(cells):  # the head alone on some rows
            rows, context = head_rows[index - len(cells)], grid.contexts[0]
            reference = call(context, one[context])
            seconds = head_call(rows)
            if timed:
                single[context].append(reference)
                head_ratios[rows].append(seconds / reference)
            return
        context, k, w = cells[index]
        reference = call(context, one[context])
        seconds = call(context, blocks[context, k, w])
        for _ in range(RETRIES if timed and k * (w + 1) > 1 else 0):
            if seconds >= LEAST_RATIO * reference:
                break
            reference = call(context, one[context])
            seconds = call(context, blocks[context, k, w])
        if timed:
            single[context].append(reference)
            ratios[context, k, w].append(seconds / reference)

    def suspects() -> list[int]:
        """Indices (as :func:`time_one` takes them) of the cells and head rows :func:`implausible` as timed so far
        (the head's rows as cells (0, rows, 0), in units of one-token calls)."""
        cell_seconds = {cell: statistics.median(ratios[cell]) * statistics.median(single[cell[0]]) for cell in cells}
        found = implausible(cell_seconds, ratios)
        head = {(0, rows, 0): head_ratios[rows] for rows in head_rows}
        found_head = implausible({key: statistics.median(r) for key, r in head.items()}, head)
        return [i for i, cell in enumerate(cells) if cell in found] + \
            [len(cells) + i for i, rows in enumerate(head_rows) if (0, rows, 0) in found_head]

    bar = tqdm(total=2 * (len(cells) + len(head_rows)) * (grid.repeats + 1), desc=desc, unit="call",
               disable=not progress)
    bandwidths = []  # GB/s before each timed pass: the host's state while the table was timed
    for timed in [False] + [True] * grid.repeats:
        if timed and device.type == "cpu":
            bandwidths.append(sample_read_bandwidth(PASS_SAMPLE_MB, 3))
        for index in torch.randperm(len(cells) + len(head_rows), generator=generator).tolist():
            time_one(index, timed)
            bar.update(2)
    for _ in range(EXTRA_PASSES):  # what cannot be true as timed is timed again
        again = suspects()
        if not again:
            break
        bar.total += 2 * len(again)
        for index in torch.randperm(len(again), generator=generator).tolist():
            time_one(again[index], True)
            bar.update(2)
    bar.close()
    unsettled = {cells[index] for index in suspects() if index < len(cells)}
    frame = pd.DataFrame([dict(context=c, k=k, w=w, tokens=k * (w + 1),
                               seconds=statistics.median(ratios[c, k, w]) * statistics.median(single[c]),
                               ratio_min=min(ratios[c, k, w]), ratio_max=max(ratios[c, k, w]),
                               ratio_median=statistics.median(ratios[c, k, w]), passes=len(ratios[c, k, w]),
                               settled=(c, k, w) not in unsettled)
                          for c, k, w in cells])
    reference = frame[(frame.k == 1) & (frame.w == 0)].set_index("context")
    frame["slowdown"] = frame.seconds / frame.context.map(reference.seconds)
    base = frame.context.map(reference.ratio_median)  # (1, 0)'s own paired ratio, ~1
    frame["slowdown_low"], frame["slowdown_high"] = frame.ratio_min / base, frame.ratio_max / base
    if bandwidths:
        frame["read_gb_per_s"] = statistics.median(bandwidths)
        frame["read_gb_per_s_low"], frame["read_gb_per_s_high"] = min(bandwidths), max(bandwidths)
    if head_rows:
        one_call = statistics.median(single[grid.contexts[0]])
        curve = {rows: statistics.median(head_ratios[rows]) * one_call for rows in head_rows}
        frame["head_seconds"] = frame.tokens.map(curve)
        frame["head_first"] = cheapest_rows({rows: curve[rows] for rows in PROBE_ROWS})
    return frame.drop(columns=["ratio_min", "ratio_max", "ratio_median"])


def timing_label(target: LoadedModel) -> str:
    """The ``dtype`` column of a timing: the weights' dtype (``"bfloat16"``), with ``-gguf`` where the projections
    and head compute over GGUF blocks (``"bfloat16-gguf"``: bf16 activations; ``-gguf-int8`` rounded to int8)."""
    dtype = target.dtype_name
    return dtype if target.weights == "bf16" else f"{dtype}-{target.weights}"


def measure(target: LoadedModel | PreTrainedModel, grid: Grid, label: str | None = None,
            progress: bool = True, graphs: bool = False) -> pd.DataFrame:
    """:func:`time_cells` plus provenance columns (model, dtype (:func:`timing_label`), device, torch version,
    date, repeats, CPU class) and the machine's floors for each cell: ``bandwidth_floor_s`` (weight bytes over the
    measured read bandwidth) and ``compute_floor_s`` (parameters x tokens multiply-adds at the peak of the
    instruction the path uses, ``compute_instruction``: :func:`specnb.model.ceilings.path_instruction`; PyTorch's
    best GEMM FLOP/s where specnb's kernels do not run the model, and on a CUDA device, with its read bandwidth:
    :func:`specnb.model.ceilings.cuda_ceilings`; ``cuda_graphs`` there: whether the calls were replayed graphs)."""
    if not isinstance(target, LoadedModel):
        target = LoadedModel.of(target, byte_tokenizer(), type(target).__name__)
    name = label or target.name
    dtype = timing_label(target)
    frame = time_cells(target, grid, progress=progress, desc=f"roofline {name} {dtype}", graphs=graphs)
    frame["model"] = name
    frame["dtype"] = dtype
    frame["device"] = device_name(target.device)
    frame["torch"] = torch.__version__
    frame["kernel"] = target.decoder.call_path() or "torch"
    frame["date"] = datetime.date.today().isoformat()
    frame["repeats"] = grid.repeats
    if target.device.type == "cpu":
        frame["cpu_class"] = cpu_class()
        if "read_gb_per_s" not in frame:
            frame["read_gb_per_s"] = read_bandwidth()
        frame["gemm_gflops"] = gemm_flops(target.dtype) / 1e9
        instruction = path_instruction(target)
        macs = peak_macs(instruction) if instruction else None
        frame["compute_instruction"] = instruction or "torch-gemm"
        frame["peak_gmacs"] = macs / 1e9 if macs else frame.gemm_gflops / 2
    elif target.device.type == "cuda":
        frame["cuda_graphs"] = graphs
        read, flops = cuda_ceilings(target.device, target.dtype)
        frame["read_gb_per_s"], frame["gemm_gflops"] = read / 1e9, flops / 1e9
        frame["compute_instruction"] = "torch-gemm"
        frame["peak_gmacs"] = frame.gemm_gflops / 2
    if "peak_gmacs" in frame:
        frame["bandwidth_floor_s"] = streamed_bytes(target) / (frame.read_gb_per_s * 1e9)
        frame["compute_floor_s"] = matmul_parameters(target.modules) * frame.tokens / (frame.peak_gmacs * 1e9)
    return frame


def floor_table(frame: pd.DataFrame) -> pd.DataFrame | None:
    """One row of k tokens (k = 1, w = 0..) at the frame's shortest context against what this machine allows:
    per ``tokens``, the measured ``ms`` and slow-down over one token (``x_one``, its spread ``x_low`` / ``x_high``),
    ``floor_ms`` (the larger of the bandwidth and compute floors of :func:`measure`) and ``floor_x_one`` (that floor
    over the measured one-token call: the lowest slow-down a kernel could reach here, attention and every operation
    but the multiply-adds left out), and ``of_floor`` (floor / measured, 1 at the floor). None where the frame has
    no floors (a table timed before they were recorded). Why: a target such as "16 tokens for 1.5x one" is only worth
    chasing where the floor lies below it."""
    if "compute_floor_s" not in frame or "bandwidth_floor_s" not in frame:
        return None
    row = frame[(frame.context == frame.context.min()) & (frame.k == 1)].sort_values("tokens")
    if row.empty or row.tokens.iloc[0] != 1:
        return None
    one = row.seconds.iloc[0]
    floor = row[["bandwidth_floor_s", "compute_floor_s"]].max(axis=1)
    return pd.DataFrame({"tokens": row.tokens.to_numpy(), "ms": row.seconds.to_numpy() * 1e3,
                         "x_one": row.slowdown.to_numpy(), "x_low": row.slowdown_low.to_numpy(),
                         "x_high": row.slowdown_high.to_numpy(), "floor_ms": floor.to_numpy() * 1e3,
                         "floor_x_one": (floor / one).to_numpy(), "of_floor": (floor / row.seconds).to_numpy()})


def heatmap_table(frame: pd.DataFrame, context: int, value: str = "slowdown") -> pd.DataFrame:
    """[k x w] table of ``value`` at one context length (NaN where a cell was not measured)."""
    sub = frame[frame.context == context]
    return sub.pivot_table(index="k", columns="w", values=value, aggfunc="median")


def cost_table(target: LoadedModel, grid: Grid | str = "adaptive", progress: bool = True) -> pd.DataFrame:
    """This model's roofline table on this machine and dtype, measured once on ``grid`` and cached at
    :func:`specnb.core.roofline.cost_table_path`."""
    path = cost_table_path(target)
    if path.exists():
        return pd.read_csv(path)
    frame = measure(target, get_grid(grid) if isinstance(grid, str) else grid, progress=progress)
    write_csv(path, frame)
    return frame


def cost_model_for(target: LoadedModel, path: str | Path = "") -> CostModel:
    """A CostModel from a CSV (``path``), else from :func:`cost_table` (measured and cached on first use)."""
    return cached_cost_model(target, path) if path else CostModel(cost_table(target))


# --------------------------------------------------------------------------- GPU: random real shapes


def random_config(shape: str) -> PretrainedConfig:
    """The configuration of a real architecture's shapes: ``gemma-3-270m``, ``mistral-7b``, ``llama-2-7b`` or
    ``qwen2.5-1.5b`` (ValueError for another)."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config

    configs = {
        "gemma-3-270m": lambda: Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048,
                                                 num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                                                 head_dim=256, query_pre_attn_scalar=256, sliding_window=512),
        "mistral-7b": lambda: MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                            sliding_window=None),
        "llama-2-7b": lambda: LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32),
        "qwen2.5-1.5b": lambda: Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                            num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2),
    }
    if shape not in configs:
        raise ValueError(f"unknown model shape {shape!r}; use one of {', '.join(configs)}")
    return configs[shape]()


def random_model(shape: str, dtype: str = "bfloat16", device: str = "cuda") -> PreTrainedModel:
    """A randomly initialised model of :func:`random_config`'s shapes, for timing on an accelerator without
    downloading weights."""
    from transformers import AutoModelForCausalLM

    config = random_config(shape)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device.type)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return model.eval()
