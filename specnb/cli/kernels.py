"""``specnb kernels bench | quant | topk``: time the few-row CPU kernels against PyTorch's
(:mod:`specnb.model.kernels.bench`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    from ..model.kernels.bench import BACKENDS, QUANT_TENSORS, ROWS, SHAPES

    kernels = sub.add_parser("kernels", help=help).add_subparsers(metavar="ACTION")
    p = kernels.add_parser("bench", help="time linear-layer backends on decoding-sized calls")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    p.add_argument("--backends", default="fewrow,torch,onednn", help=f"comma-separated, of {', '.join(BACKENDS)}")
    p.add_argument("--inductor", action="store_true", help="add torch.compile max-autotune (slow to compile)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="CSV file for the table")
    p.set_defaults(func=_run)
    q = kernels.add_parser("quant", help="time the linear layer over GGUF blocks against bf16 on shipped tensors")
    q.add_argument("--tensors", default=",".join(QUANT_TENSORS), help=f"comma-separated, of {', '.join(QUANT_TENSORS)}")
    q.add_argument("--rows", default="1,4,16,64", help="comma-separated row counts")
    q.add_argument("--repeats", type=int, default=5)
    q.add_argument("--out", help="CSV file for the table")
    q.set_defaults(func=_run_quant)
    t = kernels.add_parser("topk", help="time top-k / argmax of logits rows against PyTorch")
    t.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    t.add_argument("--vocab", type=int, default=262144, help="logits per row (Gemma-3: 262144)")
    t.add_argument("--out", help="CSV file for the table")
    t.set_defaults(func=_run_top_k)


def _run(args: argparse.Namespace) -> int:
    import torch

    from ..model.ceilings import read_bandwidth
    from ..model.kernels.bench import BACKENDS, SHAPES, bench_linear
    from ..model.kernels.cpu import cpu_class

    shapes = {}
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        shapes[name] = SHAPES[name]
    backends = tuple(b for b in args.backends.split(",") if b) + (("inductor",) if args.inductor else ())
    if not backends:
        raise ValueError(f"--backends names none, got {args.backends!r}; known: {', '.join(BACKENDS)}")
    for backend in backends:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    rows = _parse_rows(args.rows)
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    _check_out(args.out, LINEAR_COLUMNS)
    bandwidth = read_bandwidth()
    print(f"read bandwidth {bandwidth:.1f} GB/s | CPU class {cpu_class()} | {torch.get_num_threads()} threads")
    table = bench_linear(shapes, rows, getattr(torch, args.dtype), backends, args.repeats, bandwidth)
    return _write_and_print(table, args.out, ["shape", "rows"], ["ms", "bandwidth_fraction"])


MAX_ROWS = 8192  # a long prefill; more would allocate gigabytes of inputs per shape
MAX_VOCAB = 1 << 22  # 16x Gemma-3's head
LINEAR_COLUMNS = frozenset({"backend", "rows", "ms"})  # every table of kernels bench and quant has them
TOP_K_COLUMNS = frozenset({"rows", "fewrow_ms", "torch_ms"})


def _check_out(out: str | None, columns: frozenset[str]) -> None:
    """Refuse (one line) an ``--out`` that cannot be written or holds a file these commands did not write
    (:func:`specnb.atomic.check_output_file`), before anything is timed."""
    from ..atomic import check_output_file, csv_has_columns

    if out is not None:
        check_output_file(out, lambda p: csv_has_columns(p, columns), "a kernels CSV")


def _write_and_print(table: pd.DataFrame, out: str | None, index: list[str], values: list[str]) -> int:
    """Write ``table`` to ``out`` (if given) and print it one row per ``index``, one column per backend."""
    from ..atomic import write_csv

    if out is not None:
        write_csv(out, table)
    wide = table.pivot_table(index=index, columns="backend", values=values, sort=False)
    print(wide.to_string(float_format=lambda v: f"{v:.3f}"))
    return 0


def _parse_rows(text: str) -> tuple[int, ...]:
    try:
        rows = tuple(int(r) for r in text.split(","))
    except ValueError:
        raise ValueError(f"--rows must be comma-separated integers, got {text!r}") from None
    if any(not 1 <= r <= MAX_ROWS for r in rows):
        raise ValueError(f"--rows must be in [1, {MAX_ROWS}], got {text!r}")
    return rows


def _run_quant(args: argparse.Namespace) -> int:
    import torch

    from ..model.ceilings import peak_macs, read_bandwidth
    from ..model.kernels.bench import QUANT_TENSORS, bench_quant, gguf_tensor
    from ..model.kernels.cpu import cpu_class

    unknown = [t for t in args.tensors.split(",") if t not in QUANT_TENSORS]
    if unknown:
        raise ValueError(f"unknown tensor {unknown[0]!r}; known: {', '.join(QUANT_TENSORS)}")
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    rows = _parse_rows(args.rows)
    _check_out(args.out, LINEAR_COLUMNS)
    tensors = {t: QUANT_TENSORS[t] for t in args.tensors.split(",")}
    for model, name in tensors.values():
        gguf_tensor(model, name)  # every file present before the first timing
    bandwidth = read_bandwidth()
    peaks = {i: peak_macs(i) for i in ("fp32-fma", "bf16-dot", "int8-vnni", "int8-vnni-broadcast", "int8-avx2")}
    print(f"read bandwidth {bandwidth:.1f} GB/s | CPU class {cpu_class()} | {torch.get_num_threads()} threads | "
          f"peak GMAC/s " + ", ".join(f"{i} {p / 1e9:.0f}" for i, p in peaks.items() if p))
    table = bench_quant(tensors, rows, args.repeats, bandwidth)
    return _write_and_print(table, args.out, ["tensor", "rows"], ["ms", "roof_fraction", "form_fraction"])


def _run_top_k(args: argparse.Namespace) -> int:
    import torch

    from ..atomic import write_csv
    from ..model.kernels.bench import bench_top_k
    from ..model.kernels.cpu import cpu_class

    if not 8 <= args.vocab <= MAX_VOCAB:
        raise ValueError(f"--vocab must be in [8, {MAX_VOCAB}], got {args.vocab}")
    _check_out(args.out, TOP_K_COLUMNS)
    print(f"CPU class {cpu_class()} | {torch.get_num_threads()} threads")
    table = bench_top_k(args.vocab, dtype=getattr(torch, args.dtype))
    if args.out is not None:
        write_csv(args.out, table)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0
