"""Notebook 05: the roofline / wave-quantization grid of one target call (N-Grammys Fig. 1) and the cost curve of
one row of 1..64 tokens on this machine, the steps of that curve computed from its numbers, and the comparisons
with the paper's memory-bound assumption.

Timing is :mod:`specnb.eval.timing`'s. A cell has no prompts to resample: its uncertainty is the spread of its paired
ratio over the timed passes (``slowdown_low`` / ``slowdown_high`` of :func:`specnb.eval.timing.time_cells`), which is
what every comparison here uses as its interval.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..core.roofline import GPU_CSV, device_name, load_gpu_table
from ..eval.timing import Grid, get_grid, measure, timing_label
from ..model.models import LoadedModel
from ..study.profiles import get_profile
from ..study.verdicts import PREDICTION, Expect
from .gpu_price import graphed

PAPER = "N-Grammys"


@dataclass(frozen=True)
class RooflineClaims:
    """N-Grammys' claim on one call's cost, stated beside ours by notebook 05
    (``report.paper(**rs.CLAIMS.stated())``); its memory-bound cost model is judged by :func:`judge_free_row`."""

    jumps: str  # §3, Fig. 1: how a call's time grows with the tokens it verifies
    source: str

    def stated(self) -> dict[str, object]:
        """{name: the paper's claim as the notebook's text states it} (``{paper[name]}`` in its template)."""
        return {"jumps": self.jumps, "source": self.source}


CLAIMS = RooflineClaims(jumps="step-wise jumps at wave (tile) boundaries",
                        source="N-Grammys §3, Fig. 1 (Mistral-7B, A100)")


def grids_for(profile: str) -> tuple[Grid, Grid]:
    """(the heatmap grid, the cost-curve grid) of a profile: ``full`` the paper's grid (k = 1..32, w = 0..15 at
    ℓ = 25 / 100 / 500, median of 5) and the curve at ℓ = 256 / 1k / 4k; ``quick`` the block-size classes up to
    64 tokens at the paper's ℓ and the curve, median of 3 paired calls each; ``smoke`` the smoke grid for both
    (the profile's ``roofline`` record)."""
    sizes = get_profile(profile).roofline
    curve = get_grid(sizes.curve_grid)
    return get_grid(sizes.grid), curve if sizes.curve_repeats is None else replace(curve, repeats=sizes.curve_repeats)


def heatmap_dtypes(profile: str, models: dict[str, LoadedModel], default: LoadedModel) -> tuple[str, ...]:
    """The labels (:func:`specnb.eval.timing.timing_label`) of ``models`` whose whole grid is timed: all in ``full``
    (``roofline.heatmap_all_dtypes``), else the ``default`` target's (loaded as the other notebooks load theirs);
    every model's cost curve is timed always."""
    if get_profile(profile).roofline.heatmap_all_dtypes:
        return tuple(models)
    return (timing_label(default),)


def measure_all(models: dict[str, LoadedModel], grid: Grid, curve_grid: Grid, heatmap: tuple[str, ...] | None = None
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the heatmap cells of the ``heatmap`` dtypes (default: every model's), the one-row cost curve of every
    model): :func:`specnb.eval.timing.measure` rows, the curve's restricted to one row (k = 1). ``models``: one
    target per dtype, keyed by the dtype's name."""
    frame = pd.concat([measure(m, grid, progress=False) for d, m in models.items() if heatmap is None or d in heatmap],
                      ignore_index=True)
    curve = pd.concat([measure(m, curve_grid, progress=False) for m in models.values()], ignore_index=True)
    return frame, curve[curve.k == 1].reset_index(drop=True)


def setup(report, models: dict[str, LoadedModel], grid: Grid, curve_grid: Grid, heatmap: tuple[str, ...]) -> None:
    """This run's setup beside N-Grammys Fig. 1's (:meth:`specnb.study.results.Results.setup`)."""
    model = next(iter(models.values()))
    report.setup(PAPER, here={
        "model": model.name, "hardware": device_name(model.device),
        "dtype": f"grid: {' and '.join(heatmap)}; cost curve: {' and '.join(models)}",
        "prompts × tokens": "none: random tokens, one call per cell",
        "task": f"one call on a (k, w + 1) block, k ∈ {{{', '.join(map(str, grid.ks))}}}, "
                f"w ∈ {{{', '.join(map(str, grid.ws))}}}"
                + (f", at most {grid.max_tokens} tokens" if grid.max_tokens else ""),
        "context ℓ": ", ".join(map(str, grid.contexts)) + f" (cost curve: {', '.join(map(str, curve_grid.contexts))})",
        "per cell": f"median of {grid.repeats} calls, each paired with a one-token call; spread over the passes"},
        theirs={"model": "Mistral-7B", "hardware": "one NVIDIA A100 40GB", "dtype": "bfloat16",
                "prompts × tokens": "—", "task": "one call on a (k, w + 1) block, k = 1..32, w = 0..15",
                "context ℓ": "25, 100, 500", "per cell": "average of five calls"})


def curve_steps(curve: pd.DataFrame) -> pd.DataFrame:
    """Every step of the cost curve between consecutive measured sizes, per dtype and context: from, to (tokens),
    slowdown_from, slowdown_to, step (= slowdown_to / slowdown_from), and step_low / step_high from the cells'
    spread over passes (the ratio's smallest and largest values)."""
    rows = []
    for (dtype, context), part in curve.groupby(["dtype", "context"], sort=False):
        part = part.sort_values("tokens")
        for a, b in zip(part.itertuples(), part.iloc[1:].itertuples(), strict=False):
            rows.append({"dtype": dtype, "context": context, "from": a.tokens, "to": b.tokens,
                         "slowdown_from": a.slowdown, "slowdown_to": b.slowdown, "step": b.slowdown / a.slowdown,
                         "step_low": b.slowdown_low / a.slowdown_high, "step_high": b.slowdown_high / a.slowdown_low})
    return pd.DataFrame(rows)


def largest_steps(steps: pd.DataFrame) -> dict[str, dict]:
    """Per dtype, the largest step of the cost curve at its smallest context (:func:`curve_steps` row as a dict)."""
    out = {}
    for dtype, part in steps.groupby("dtype", sort=False):
        part = part[part.context == part.context.min()]
        out[dtype] = part.loc[part.step.idxmax()].to_dict()
    return out


def slowdowns(curve: pd.DataFrame) -> dict[str, dict]:
    """Per dtype, at the curve's smallest context: {tokens: {slowdown, low, high}}, plus the one-token call's
    milliseconds, the bandwidth floor's and the context."""
    out = {}
    for dtype, part in curve.groupby("dtype", sort=False):
        part = part[part.context == part.context.min()].sort_values("tokens")
        one = part[part.tokens == 1].iloc[0]
        out[dtype] = {"context": int(one.context), "one_token_ms": one.seconds * 1e3,
                      "bandwidth_floor_ms": one.get("bandwidth_floor_s", np.nan) * 1e3,
                      "tokens": {int(r.tokens): {"slowdown": r.slowdown, "low": r.slowdown_low,
                                                 "high": r.slowdown_high} for r in part.itertuples()}}
    return out


def judge_free_row(report, frame: pd.DataFrame) -> dict[str, dict]:
    """The memory-bound assumption (N-Grammys §3: a (k, w + 1) block costs about a (k, 1) one) for the longest
    one-row block of the heatmap grid, per dtype, at the paper's middle context (or the grid's nearest):
    its slow-down over (1, 0) against 1 ± :data:`~specnb.study.verdicts.PREDICTION`, with the spread over passes.
    An internal check: the paper states the assumption for GPUs, not for a CPU. Returns {dtype: the cell as a
    dict}."""
    out = {}
    for dtype, part in frame.groupby("dtype", sort=False):
        contexts = np.array(sorted(part.context.unique()))
        context = int(contexts[np.argmin(np.abs(contexts - 100))])
        row = part[(part.context == context) & (part.k == 1)].sort_values("w").iloc[-1]
        report.compare(f"free_row_{dtype}", f"{dtype}: slow-down of one row of {int(row.tokens)} tokens over one "
                       f"token at ℓ = {context} (spread over {int(row.passes)} timed passes)", row.slowdown,
                       row.slowdown_low, row.slowdown_high, Expect.near(1.0, PREDICTION),
                       "the memory-bound cost model (N-Grammys §3 states it for GPUs)", internal=True,
                       direction_only=False, evidence={"tokens": int(row.tokens),
                                                       "compute floor ms": row.compute_floor_s * 1e3,
                                                       "bandwidth floor ms": row.bandwidth_floor_s * 1e3},
                       cause=f"the work per token adds up on a CPU: {int(row.tokens)} tokens need "
                             f"{row.compute_floor_s * 1e3:.1f} ms of arithmetic at best here (compute floor), one "
                             f"token's weight reads {row.bandwidth_floor_s * 1e3:.1f} ms (bandwidth floor)")
        out[dtype] = row.to_dict()
        report.takeaway(f"05_roofline_cpu_{dtype}", f"one row of {int(row.tokens)} tokens costs "
                        f"×{{verdicts[free_row_{dtype}][ours]:.2f}} one token at ℓ = {context} on this CPU (the "
                        "memory-bound assumption of a GPU: ≈ ×1)")
    return out


def machine(frame: pd.DataFrame) -> str:
    """The machine a timed frame (:func:`specnb.eval.timing.measure` rows) ran on, for a figure's title, as the
    heatmaps and curves of notebook 05 carry it: the CPU model with its kernel class and the threads
    (``"AMD EPYC (avx512bf16), 2 threads"``); this machine's when the frame does not say."""
    from ..model.kernels.cpu import cpu_class

    device = str(frame.device.iloc[0]) if "device" in frame and len(frame) else device_name("cpu")
    isa = str(frame.cpu_class.iloc[0]) if "cpu_class" in frame and len(frame) else cpu_class()
    model, _, threads = device.partition(", ")
    return f"{model} ({isa}), {threads.replace(' torch', '')}" if threads else f"{model} ({isa})"


def passes_text(frame: pd.DataFrame) -> str:
    """How many timed passes each point of a timed frame (``passes`` column) took, for a figure's title: ``"3"``,
    or ``"3–5"`` when the points differ."""
    lo, hi = int(frame.passes.min()), int(frame.passes.max())
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def llamacpp_curve(target: LoadedModel, curve_grid: Grid) -> pd.DataFrame:
    """llama.cpp's one-row calls of the cost curve's token counts at each of its contexts, on the target's GGUF
    file (:func:`specnb.eval.llamacpp.cost_curve`): rows tokens, seconds, slowdown, context, passes, dtype
    ``"llama.cpp"``. Empty, with one printed line saying why, without llama-cpp-python or a GGUF file."""
    from ..eval import llamacpp

    try:
        llamacpp.check_available()
        llamacpp.embedded_gguf(target)
    except ValueError as exc:
        print(f"llama.cpp's curve skipped: {exc}")
        return pd.DataFrame()
    tokens = tuple(sorted({w + 1 for w in curve_grid.ws}))
    rows = [row for context in curve_grid.contexts
            for row in llamacpp.cost_curve(target, tokens, context, curve_grid.repeats)]
    return pd.DataFrame(rows).assign(dtype="llama.cpp")


def curve_takeaway(report) -> None:
    """The front page's line for the cost-curve figure: each dtype's largest step (``ours[largest_step]``)."""
    report.takeaway("05_roofline_cpu_curve", "a call's cost climbs in steps; the largest: " + ", ".join(
        f"×{{ours[largest_step][{d}][step]:.2f}} from {{ours[largest_step][{d}][from]:.0f}} to "
        f"{{ours[largest_step][{d}][to]:.0f}} tokens ({d}, ℓ = {{ours[largest_step][{d}][context]:.0f}})"
        for d in report.ours.get("largest_step", {})))


def llamacpp_takeaway(report, both: pd.DataFrame) -> None:
    """The front page's line for the figure of our call's cost beside llama.cpp's (``both``: the rows of one
    context, ``dtype`` naming the runtime), its numbers added as ``ours[llamacpp]``: per runtime, the call's ms
    at the fewest and the most tokens verified."""
    out = {}
    for name, part in both.groupby("dtype", sort=False):
        part = part.sort_values("tokens")
        out[name] = {"context": int(part.context.iloc[0]), "fewest": int(part.tokens.iloc[0]),
                     "most": int(part.tokens.iloc[-1]), "fewest_ms": float(part.seconds.iloc[0] * 1e3),
                     "most_ms": float(part.seconds.iloc[-1] * 1e3)}
    report.add(llamacpp=out)
    report.takeaway("05_cost_vs_llamacpp", "one call after {context} tokens: ".format(
        context=next(iter(out.values()))["context"]) + "; ".join(
        f"{name} {{ours[llamacpp][{name}][fewest_ms]:.1f}} ms at {{ours[llamacpp][{name}][fewest]}} token(s), "
        f"{{ours[llamacpp][{name}][most_ms]:.0f}} ms at {{ours[llamacpp][{name}][most]}}" for name in out))


# --------------------------------------------------------------------------------------- a saved GPU table

GPU_CALLS = {False: "eager calls", True: "CUDA graphs"}
"""What each call mode of a GPU table (``cuda_graphs``) is named in the figures."""
PAPER_SHAPE = "random:mistral-7b"  # N-Grammys' Fig. 1 model, as the GPU table names its shapes
PAPER_ROW = 16  # the paper's longest one-row block (w = 0..15)


SEVEN_B = ("random:llama-2-7b", "random:mistral-7b")  # the papers' targets' shapes: the GPU grid figure's panels


def gpu_table() -> pd.DataFrame | None:
    """The saved GPU table (:func:`specnb.core.roofline.load_gpu_table`) as :func:`gpu_calls` rows, its provenance
    printed (one row per model and call mode); None, and one line saying so, where none is saved."""
    gpu = load_gpu_table()
    if gpu is None:
        print(f"No GPU table at {GPU_CSV}: this run shows the CPU only (no GPU was available).")
        return None
    gpu = gpu_calls(gpu)
    provenance = ["model", "calls", "dtype", "device", "torch", "date", "repeats"]
    print(gpu[provenance].drop_duplicates().to_string(index=False))
    return gpu


def grid_models(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of a GPU table the grid figure draws: the :data:`SEVEN_B` shapes', or every model's without them."""
    big = rows[rows.model.isin(SEVEN_B)]
    return big if len(big) else rows


def judge_gpu(report, gpu: pd.DataFrame) -> None:
    """Notebook 05's GPU verdicts and lines: :func:`judge_gpu_free_row` on ``gpu`` (:func:`gpu_table`'s rows) and
    :func:`gpu_grid_takeaway` on the rows its grid figure draws (:func:`grid_models` at the shortest context)."""
    gpu_grid_takeaway(report, grid_models(gpu[gpu.context == gpu.context.min()]))
    judge_gpu_free_row(report, gpu)


def gpu_calls(gpu: pd.DataFrame) -> pd.DataFrame:
    """A saved GPU table (``data/roofline_gpu.csv``) with ``calls`` naming each row's call mode (:data:`GPU_CALLS`;
    :func:`specnb.experiments.gpu_price.graphed`), eager rows first."""
    return gpu.assign(calls=graphed(gpu).map(GPU_CALLS)).sort_values("calls", key=lambda c: c != GPU_CALLS[False],
                                                                 kind="stable")


def judge_gpu_free_row(report, gpu: pd.DataFrame) -> None:
    """N-Grammys' memory-bound assumption on its own hardware class: a row of :data:`PAPER_ROW` tokens against one
    token for Mistral-7B's shapes, per call mode of the GPU table (``gpu``: :func:`gpu_calls` rows), at the table's
    context nearest the paper's middle one (100), against 1 ± :data:`~specnb.study.verdicts.PREDICTION`, with the
    spread over passes. Nothing is judged where the table has no Mistral-7B rows; ``ours[gpu]`` holds what the
    front page's lines read."""
    rows = gpu[(gpu.model == PAPER_SHAPE) & (gpu.k == 1)]
    if rows.empty:
        return
    contexts = np.array(sorted(rows.context.unique()))
    context = int(contexts[np.argmin(np.abs(contexts - 100))])
    rows = rows[rows.context == context]
    out = {"device": str(rows.device.iloc[0]), "context": context, "tokens": PAPER_ROW}
    for calls, part in rows.groupby("calls", sort=False):
        one, row = (part[part.tokens == n].iloc[0] for n in (1, PAPER_ROW))
        key = "gpu_free_row_" + ("graphs" if bool(row.get("cuda_graphs", False)) else "eager")
        evidence = {"one token ms": one.seconds * 1e3, "bandwidth floor ms": row.bandwidth_floor_s * 1e3,
                    "compute floor ms": row.compute_floor_s * 1e3}
        report.compare(key, f"Mistral-7B's shapes on {row.device} ({calls}): slow-down of one row of {PAPER_ROW} "
                       f"tokens over one token at ℓ = {context} (spread over {int(row.passes)} timed passes)",
                       row.slowdown, row.slowdown_low, row.slowdown_high, Expect.near(1.0, PREDICTION),
                       f"{CLAIMS.source}: the memory-bound cost model (random weights of its shapes)",
                       internal=False, direction_only=False, evidence=evidence,
                       cause=f"one token's call takes {evidence['one token ms']:.1f} ms where the weights read in "
                             f"{evidence['bandwidth floor ms']:.1f} ms: the rest is per-call work that a longer row "
                             f"adds to ({PAPER_ROW} tokens' arithmetic: {evidence['compute floor ms']:.2f} ms)")
        mode = key.removeprefix("gpu_free_row_")
        out[mode], out[f"{mode}_slowdown"] = calls, float(row.slowdown)
    report.add(gpu=out)
    report.takeaway("05_roofline_gpu_curve", f"on {{ours[gpu][device]}}, one row of {PAPER_ROW} tokens of "
                    "Mistral-7B's shapes costs " + " and ".join(
                        f"×{{ours[gpu][{mode}_slowdown]:.2f}} one token ({{ours[gpu][{mode}]}})"
                        for mode in ("eager", "graphs") if mode in out))


def gpu_grid_takeaway(report, grid: pd.DataFrame) -> None:
    """The front page's line for the GPU grid figure (``grid``: the :func:`gpu_calls` rows it draws): per model, the
    slow-down of its largest block (most tokens, then most drafts) in each call mode, held as ``ours[gpu_block]``."""
    out = {}
    for model, part in grid.groupby("model", sort=False):
        cell = part.sort_values(["tokens", "k"]).iloc[-1]
        out[model.removeprefix("random:")] = {
            "k": int(cell.k), "w": int(cell.w), "context": int(cell.context),
            **{calls: float(sub.slowdown.iloc[0]) for calls, sub in
               part[(part.k == cell.k) & (part.w == cell.w)].groupby("calls", sort=False)}}
    report.add(gpu_block=out)
    report.takeaway("05_roofline_gpu", "; ".join(
        f"{name}'s {v['k']} × {v['w'] + 1} block costs " + " and ".join(
            f"×{{ours[gpu_block][{name}][{calls}]:.2f}} one token ({calls})" for calls in v
            if calls not in ("k", "w", "context")) + f" at ℓ = {v['context']}" for name, v in out.items()))


def gpu_sentence(report) -> str:
    """The end of notebook 05's closing sentence: what :func:`judge_gpu_free_row` found on a GPU, as a template, or
    that no GPU was measured."""
    modes = [mode for mode in ("eager", "graphs") if f"gpu_free_row_{mode}" in report.comparisons]
    if not modes:
        return ", and no GPU was measured here."
    return ("; on a GPU ({ours[gpu][device]}, a saved table), one row of {ours[gpu][tokens]} tokens of the paper's "
            "model shapes costs " + " and ".join(f"×{{ours[gpu][{m}_slowdown]:.2f}} one token "
                                                  f"({{ours[gpu][{m}]}})" for m in modes) + ".")
