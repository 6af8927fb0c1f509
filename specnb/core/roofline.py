"""Roofline / wave-quantization timing of one target call (N-Grammys §3, Fig. 1).

One *cell* is a forward call of the target on a (k, w + 1) block of tokens, k rows that share a KV cache of
``context`` tokens (expanded k times, as batch verification does), after the cache is in place. Its cost is
the median wall time of several calls; the *slow-down* is that time over the time of (k, w) = (1, 0) at the
same context length. "Verification is free" (the memory-bound assumption) holds where the slow-down is ~1.

On a GPU the same code times randomly initialised models of real shapes (timings do not depend on weight
values): ``specnb roofline --model random:mistral-7b --dtype bfloat16 --out data/roofline_gpu.csv``.

:class:`CostModel` turns a measured table into per-call seconds for any context length (linear in the
context between measured lengths); the adaptive draft shape (:mod:`specnb.drafters.mixed`) uses it.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PretrainedConfig, PreTrainedModel

from ..atomic import write_csv
from ..model.ceilings import gemm_flops, matmul_parameters, path_instruction, peak_macs, read_bandwidth, streamed_bytes
from ..model.device import default_device, model_device, resolve_device, synchronize
from ..model.forward import forward
from ..model.kernels.cpu import cpu_class, cpu_model
from ..model.kv_cache import GrowingCache
from ..model.models import LoadedModel, byte_tokenizer, load_model, resolve_dtype
from ..paths import artifact_path, safe_name


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


def device_name(device: torch.device | str) -> str:
    """GPU name, or the CPU model (``/proc/cpuinfo``) with the number of threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {torch.get_num_threads()} torch threads"


@torch.inference_mode()
def time_cells(target: LoadedModel, grid: Grid, seed: int = 0, progress: bool = True,
               desc: str = "roofline") -> pd.DataFrame:
    """Median seconds of one call per cell; columns context, k, w, tokens, seconds, slowdown, and the spread
    of the slow-down over the timed passes (``slowdown_low`` / ``slowdown_high``: the cell's smallest and
    largest paired ratio over the median ratio of (1, 0) at that context; ``passes``: how many).

    Each context length's cache is filled once with random tokens (batch 1); before every call the cache is
    cut back to that prefill (a view), and a k-row block attends to it broadcast to k rows (see
    :mod:`specnb.model.kv_cache`), so each call appends the same (k, w + 1) block to the same cache.

    A VM's memory bandwidth drifts by 2x within minutes, so a cell's seconds are not its calls' median alone:
    every call of a cell is paired with a one-token call at the same context just before it, and the cell
    costs the median of its ratios to those calls times the median one-token call at that context. Cells are
    timed in passes, every cell once per pass in a fresh random order, and the first pass is an untimed
    warm-up (kernels and allocations differ per shape, notably on a GPU). Timed back to back, a slow spell
    once priced a 1-token call of Qwen2.5-1.5B at 1.4x a 5-token one.
    """
    device = model_device(target.model)
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

    def call(context: int, block: torch.Tensor) -> float:
        caches[context].keep(context, torch.empty(0, dtype=torch.long))
        synchronize(device)
        start = time.perf_counter()
        forward(target, block, cache=caches[context])
        synchronize(device)
        return time.perf_counter() - start

    bar = tqdm(total=2 * len(cells) * (grid.repeats + 1), desc=desc, unit="call", disable=not progress)
    for timed in [False] + [True] * grid.repeats:
        for index in torch.randperm(len(cells), generator=generator).tolist():
            context, k, w = cells[index]
            reference = call(context, one[context])
            seconds = call(context, blocks[context, k, w])
            if timed:
                single[context].append(reference)
                ratios[context, k, w].append(seconds / reference)
            bar.update(2)
    bar.close()
    frame = pd.DataFrame([dict(context=c, k=k, w=w, tokens=k * (w + 1),
                               seconds=statistics.median(ratios[c, k, w]) * statistics.median(single[c]),
                               ratio_min=min(ratios[c, k, w]), ratio_max=max(ratios[c, k, w]),
                               ratio_median=statistics.median(ratios[c, k, w]), passes=len(ratios[c, k, w]))
                          for c, k, w in cells])
    reference = frame[(frame.k == 1) & (frame.w == 0)].set_index("context")
    frame["slowdown"] = frame.seconds / frame.context.map(reference.seconds)
    base = frame.context.map(reference.ratio_median)  # (1, 0)'s own paired ratio, ~1
    frame["slowdown_low"], frame["slowdown_high"] = frame.ratio_min / base, frame.ratio_max / base
    return frame.drop(columns=["ratio_min", "ratio_max", "ratio_median"])


def timing_label(target: LoadedModel) -> str:
    """The ``dtype`` column of a timing: the weights' dtype (``"bfloat16"``), with ``-gguf`` where the projections
    and head compute over GGUF blocks (``"bfloat16-gguf"``: bf16 activations; ``-gguf-int8`` rounded to int8)."""
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    return dtype if target.weights == "bf16" else f"{dtype}-{target.weights}"


def measure(target: LoadedModel | PreTrainedModel, grid: Grid, label: str | None = None,
            progress: bool = True) -> pd.DataFrame:
    """:func:`time_cells` plus provenance columns (model, dtype (:func:`timing_label`), device, torch version,
    date, repeats, CPU class) and the machine's floors for each cell: ``bandwidth_floor_s`` (weight bytes over the
    measured read bandwidth) and ``compute_floor_s`` (parameters x tokens multiply-adds at the peak of the
    instruction the path uses, ``compute_instruction``: :func:`specnb.model.ceilings.path_instruction`; PyTorch's
    best GEMM FLOP/s where specnb's kernels do not run the model)."""
    if not isinstance(target, LoadedModel):
        target = LoadedModel.of(target, byte_tokenizer(), type(target).__name__)
    model = target.model
    name = label or target.name
    param = next(model.parameters())
    dtype = timing_label(target)
    frame = time_cells(target, grid, progress=progress, desc=f"roofline {name} {dtype}")
    frame["model"] = name
    frame["dtype"] = dtype
    frame["device"] = device_name(param.device)
    frame["torch"] = torch.__version__
    frame["kernel"] = target.decoder.call_path() or "torch"
    frame["date"] = datetime.date.today().isoformat()
    frame["repeats"] = grid.repeats
    if param.device.type == "cpu":
        frame["cpu_class"] = cpu_class()
        frame["read_gb_per_s"] = read_bandwidth()
        frame["gemm_gflops"] = gemm_flops(param.dtype) / 1e9
        frame["bandwidth_floor_s"] = streamed_bytes(target) / (frame.read_gb_per_s * 1e9)
        instruction = path_instruction(target)
        macs = peak_macs(instruction) if instruction else None
        frame["compute_instruction"] = instruction or "torch-gemm"
        frame["peak_gmacs"] = macs / 1e9 if macs else frame.gemm_gflops / 2
        frame["compute_floor_s"] = matmul_parameters(model) * frame.tokens / (frame.peak_gmacs * 1e9)
    return frame


def heatmap_table(frame: pd.DataFrame, context: int, value: str = "slowdown") -> pd.DataFrame:
    """[k x w] table of ``value`` at one context length (NaN where a cell was not measured)."""
    sub = frame[frame.context == context]
    return sub.pivot_table(index="k", columns="w", values=value, aggfunc="median")


# ----------------------------------------------------------------------------------------- cost model


class CostModel:
    """Seconds of one call for each (k, w) in a measured table, at any context length.

    shapes: int64 [S, 2] the (k, w) measured at every context length of the table. ``table``: float64 [C, S],
    the measured seconds made non-decreasing in w for each k at each context (isotonic least squares,
    scikit-learn's): a call of more tokens in as many rows never costs less, but a table timed through a slow
    spell can say so (Qwen2.5-Coder-1.5B bf16 on 2 Zen 4 cores, context 100: 3 nodes 125.6 ms, 6 nodes 102.2),
    and a router pricing on it would take the larger tree for being the cheaper one.
    """

    def __init__(self, frame: pd.DataFrame):
        required = {"context", "k", "w", "seconds"}
        if not required <= set(frame.columns):
            raise ValueError(f"a roofline table needs columns {sorted(required)}, got {sorted(frame.columns)}")
        table = frame.pivot_table(index="context", columns=["k", "w"], values="seconds", aggfunc="median")
        table = table.dropna(axis=1)
        if table.shape[1] == 0 or (1, 0) not in table.columns:
            raise ValueError("roofline table has no shape measured at every context, or lacks (k, w) = (1, 0)")
        self.contexts = table.index.to_numpy(dtype=np.float64)  # [C]
        self.shapes = np.array(table.columns.tolist(), dtype=np.int64)  # [S, 2]
        self.table = table.to_numpy(dtype=np.float64, copy=True)  # [C, S]
        from sklearn.isotonic import isotonic_regression  # ~1 s to import: only where a table is priced

        for k in np.unique(self.shapes[:, 0]):
            columns = np.flatnonzero(self.shapes[:, 0] == k)
            columns = columns[np.argsort(self.shapes[columns, 1])]  # by w
            for row in self.table:
                row[columns] = isotonic_regression(row[columns])
        self._context_list = self.contexts.tolist()  # bisect on a list: ~0.2 us against numpy's ~3
        self._chains: dict[bytes, np.ndarray] = {}  # chain_seconds' rows [C, B] per budget list
        self._last_chain: tuple[int, bytes, np.ndarray] | None = None  # and its last answer

    def seconds(self, context_len: int) -> np.ndarray:
        """float64 [S]: interpolated linearly in the context length (clamped at the measured ends)."""
        return self._at_context(self.table, context_len)

    def _at_context(self, rows: np.ndarray, context_len: int) -> np.ndarray:
        """rows [C, X], one per measured context -> [X] at ``context_len`` (linear, clamped at the ends)."""
        if self.contexts.shape[0] == 1:
            return rows[0].copy()
        contexts = self._context_list
        i = min(max(bisect.bisect_left(contexts, context_len) - 1, 0), len(contexts) - 2)
        t = min(max((context_len - contexts[i]) / (contexts[i + 1] - contexts[i]), 0.0), 1.0)
        return (1 - t) * rows[i] + t * rows[i + 1]

    def seconds_at(self, k: int, w: int, context_len: int) -> float:
        """Seconds of one (k, w) call: the measured shape, else interpolated in the block's token count
        k * (w + 1) between measured shapes (on CPUs the cost depends mostly on that count); beyond the
        largest measured block, proportional to the token count (compute-bound). One row (k = 1) is priced
        from one-row shapes only, as :meth:`chain_seconds` prices it."""
        if k == 1:
            return float(self.chain_seconds(np.array([w]), context_len)[0])
        seconds = self.seconds(context_len)
        hit = np.flatnonzero((self.shapes[:, 0] == k) & (self.shapes[:, 1] == w))
        if hit.size:
            return float(seconds[hit[0]])
        tokens = self.shapes[:, 0] * (self.shapes[:, 1] + 1)
        order = np.argsort(tokens, kind="stable")
        tokens, seconds = tokens[order], seconds[order]
        n = k * (w + 1)
        if n > tokens[-1]:
            return float(seconds[-1] * n / tokens[-1])
        return float(np.interp(n, tokens, seconds))

    def chain_seconds(self, nodes: np.ndarray, context_len: int) -> np.ndarray:
        """float64 [B]: the seconds of one call verifying b draft nodes and the root, as one row (a chain, or a
        tree under a tree mask: they cost the same), for every b in ``nodes`` (int [B]). Priced drafters ask at
        every step with the same budgets (a router's members all with the same context), so each budget list's
        answer at every measured context is kept, and a new context only interpolates between them (the answer
        is linear in the table's rows); the last answer is kept too."""
        nodes = np.asarray(nodes, dtype=np.int64)
        key = nodes.tobytes()
        if self._last_chain is None or self._last_chain[:2] != (context_len, key):
            rows = self._chains.get(key)
            if rows is None:
                rows = self._chains[key] = np.stack([self._chain_row(seconds, nodes) for seconds in self.table])
            self._last_chain = (context_len, key, self._at_context(rows, context_len))
        return self._last_chain[2].copy()

    def _chain_row(self, seconds: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """:meth:`chain_seconds` at one measured context: seconds [S] of the table's shapes -> [B].

        Interpolated linearly in the token count between the measured one-row shapes (1, w), and beyond the
        longest, proportional to the token count (compute-bound). Shapes of several rows are batch
        verification's, where every row reads the cache again: they cost more than one row of as many tokens
        (Gemma-3-270M bf16 on 2 Zen 4 cores, 16 tokens: 36.5 ms in one row, 41.5 in 4 rows, 64.1 in 16), so
        interpolating through them priced 16-node trees at 52 ms and unmeasured lengths out of order.
        """
        rows = np.flatnonzero(self.shapes[:, 0] == 1)  # at least (1, 0): the constructor checks it
        order = rows[np.argsort(self.shapes[rows, 1])]
        tokens, row_seconds = self.shapes[order, 1] + 1, seconds[order]
        n = nodes + 1
        return np.where(n > tokens[-1], row_seconds[-1] * n / tokens[-1], np.interp(n, tokens, row_seconds))


def machine_key(target: LoadedModel) -> str:
    """Model, dtype, device (CPU model and threads) and forward path of ``target``, as a file name: what a
    cached timing or output depends on (a table timed with other kernels or another body does not apply). The
    model's whole name is kept (``safe_name(..., whole=True)``): two checkpoints in folders of one name must not
    share cached outputs."""
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    host = device_name(next(target.model.parameters()).device).replace(" ", "_").replace("/", "_")
    kernel = target.decoder.call_path()
    return "-".join(part for part in (safe_name(target.name, whole=True), dtype, host, kernel) if part)


def cost_table_path(target: LoadedModel) -> Path:
    """Where :func:`cost_table` caches this target's table; ``-paired``: timed as :func:`time_cells` times
    now (tables cached before that were timed back to back, and are measured again rather than read)."""
    return artifact_path("roofline", f"{machine_key(target)}-paired.csv")


def cost_table(target: LoadedModel, grid: Grid | str = "adaptive", progress: bool = True) -> pd.DataFrame:
    """This model's roofline table on this machine and dtype, measured once on ``grid`` and cached."""
    path = cost_table_path(target)
    if path.exists():
        return pd.read_csv(path)
    frame = measure(target, get_grid(grid) if isinstance(grid, str) else grid, progress=progress)
    write_csv(path, frame)
    return frame


def cost_model_for(target: LoadedModel, path: str | Path = "") -> CostModel:
    """A CostModel from a CSV (``path``) or from :func:`cost_table` (measured and cached on first use)."""
    if path:
        if not Path(path).exists():
            raise FileNotFoundError(f"roofline table {path} does not exist")
        return CostModel(pd.read_csv(path))
    return CostModel(cost_table(target))


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


GPU_CSV = Path(__file__).resolve().parents[2] / "data" / "roofline_gpu.csv"


def load_gpu_table(path: str | Path = GPU_CSV) -> pd.DataFrame | None:
    """A roofline table measured on a GPU (with its provenance columns), or None when none was saved."""
    path = Path(path)
    return pd.read_csv(path) if path.exists() else None


def add_parser(subparsers) -> argparse.ArgumentParser:
    """``specnb roofline``: time the (k, w, context) grid for a model and write a CSV."""
    parser = subparsers.add_parser("roofline", help="time one target call over a (k, w, context) grid")
    parser.add_argument("--model", default="gemma-3-270m",
                        help="model name/path, or random:SHAPE (gemma-3-270m, mistral-7b, llama-2-7b, qwen2.5-1.5b)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default=default_device(), help="cpu | cuda | cuda:N (default: cuda if available)")
    parser.add_argument("--grid", default="quick", choices=sorted(GRIDS))
    parser.add_argument("--max-tokens", type=int, default=None, help="skip cells with k * (w + 1) above this")
    parser.add_argument("--out", required=True, help="CSV to write (e.g. data/roofline_gpu.csv)")
    parser.set_defaults(func=run_cli)
    return parser


def run_cli(args: argparse.Namespace) -> None:
    grid = get_grid(args.grid)
    if args.max_tokens is not None:
        grid = Grid(grid.ks, grid.ws, grid.contexts, grid.repeats, args.max_tokens)
    if args.model.startswith("random:"):
        target: LoadedModel | PreTrainedModel = random_model(args.model.removeprefix("random:"), args.dtype,
                                                             args.device)
    else:
        target = load_model(args.model, dtype=args.dtype, device=args.device)
    frame = measure(target, grid, label=args.model)
    write_csv(args.out, frame)
    print(f"wrote {len(frame)} cells to {args.out}")
