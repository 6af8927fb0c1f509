"""``specnb roofline``: time one target call over a (k, w, context) grid and write the CSV
(:mod:`specnb.eval.timing`); ``--model random:SHAPE`` times a random model of a real shape (a GPU machine),
``--llamacpp`` llama.cpp's one-row calls on the same GGUF file beside ours. Prints one row of 1..k tokens against
the floors this machine allows (:func:`specnb.eval.timing.floor_table`)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    from ..eval.timing import GRIDS
    from ..model.device import default_device

    parser = sub.add_parser("roofline", help=help)
    parser.add_argument("--model", default="gemma-3-270m",
                        help="model name/path, or random:SHAPE (gemma-3-270m, mistral-7b, llama-2-7b, qwen2.5-1.5b)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default=default_device(), help="cpu | cuda | cuda:N (default: cuda if available)")
    parser.add_argument("--grid", default="quick", choices=sorted(GRIDS))
    parser.add_argument("--max-tokens", type=int, default=None, help="skip cells with k * (w + 1) above this")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay each call from a CUDA graph (a serving stack's decode; default: eager calls)")
    parser.add_argument("--llamacpp", action="store_true",
                        help="time llama.cpp's one-row calls on the model's GGUF file too (llama-cpp-python), rows "
                             "of dtype llama.cpp in the same CSV; skipped with one line where it cannot run")
    parser.add_argument("--out", required=True, help="CSV to write (e.g. data/roofline_gpu.csv)")
    parser.set_defaults(func=_measure)


def _measure(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..atomic import check_output_file, csv_has_columns, write_csv
    from ..eval.timing import COLUMNS, Grid, floor_table, get_grid, measure, random_model
    from ..model.models import load_model

    check_output_file(args.out, lambda p: csv_has_columns(p, COLUMNS), "a roofline CSV")
    if args.cuda_graphs and not str(args.device).startswith("cuda"):
        raise ValueError(f"--cuda-graphs needs --device cuda, not {args.device}")
    grid = get_grid(args.grid)
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        grid = Grid(grid.ks, grid.ws, grid.contexts, grid.repeats, args.max_tokens)
    if args.llamacpp and (args.model.startswith("random:") or not str(args.device).startswith("cpu")):
        raise ValueError("--llamacpp times an embedded model's GGUF file on the CPU (--device cpu, no random:SHAPE)")
    if args.model.startswith("random:"):
        target = random_model(args.model.removeprefix("random:"), args.dtype, args.device)
    else:
        target = load_model(args.model, dtype=args.dtype, device=args.device)
    frame = measure(target, grid, label=args.model, graphs=args.cuda_graphs)
    peer = pd.DataFrame()
    if args.llamacpp:
        from ..experiments.roofline_study import llamacpp_curve

        peer = llamacpp_curve(target, grid)
    write_csv(args.out, pd.concat([frame, peer], ignore_index=True))
    print(f"wrote {len(frame)} cells to {args.out}" + (f", and llama.cpp's {len(peer)}" if len(peer) else ""))
    floors = floor_table(frame)
    if floors is not None:
        instruction = frame.compute_instruction.iloc[0]
        context = int(frame.context.min())
        print(f"one row of k tokens at context {context}: measured, and the floor this machine allows "
              f"({frame.read_gb_per_s.iloc[0]:.0f} GB/s, {instruction} {frame.peak_gmacs.iloc[0]:.0f} GMAC/s)")
        if len(peer):
            same = peer[peer.context == context].set_index("tokens")
            floors["llamacpp_ms"] = floors.tokens.map(same.seconds * 1e3)
            floors["llamacpp_x_one"] = floors.tokens.map(same.slowdown)
        print(floors.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0
