"""``specnb extract-rate``: time the hidden-state extraction of models on a device, one CSV row each
(:mod:`specnb.eval.extract_rate`)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    from ..eval import extract_rate
    from ..model.device import default_device
    from ..model.model_names import WEIGHTS

    parser = sub.add_parser("extract-rate", help=help, description=extract_rate.__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True,
                        help="an installed model or random:SHAPE (gemma-3-270m, qwen2.5-1.5b, mistral-7b, "
                             "llama-2-7b); repeat for several")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default=default_device(), help="cpu | cuda | cuda:N")
    parser.add_argument("--weights", default="auto", choices=WEIGHTS,
                        help="what an installed model computes over (random:SHAPE models: dense)")
    parser.add_argument("--tokens", type=int, default=200_000, help="corpus tokens to extract per model and batch size")
    parser.add_argument("--doc-tokens", type=int, default=2048, help="tokens per synthetic document")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, nargs="+", default=[4096], help="padded tokens per forward pass")
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.set_defaults(func=_measure)


def _measure(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..atomic import check_output_file, csv_has_columns, write_csv
    from ..eval.extract_rate import COLUMNS, check_batches, load_target, measure, synthetic_corpus
    from ..eval.timing import random_config

    check_output_file(args.out, lambda p: csv_has_columns(p, frozenset(COLUMNS)), "an extract-rate CSV")
    corpus = synthetic_corpus(args.tokens, args.doc_tokens, vocab_size=2)  # every size checked before a model loads
    for batch_tokens in args.batch_tokens:
        check_batches(corpus, args.seq_len, args.overlap, batch_tokens)
    for name in args.model:
        if name.startswith("random:"):
            random_config(name.removeprefix("random:"))
    rows = []
    for name in args.model:
        target = load_target(name, args.dtype, args.device, args.weights)
        corpus = synthetic_corpus(args.tokens, args.doc_tokens, target.config.vocab_size)
        for batch_tokens in args.batch_tokens:
            row = measure(target, corpus, seq_len=args.seq_len, overlap=args.overlap, batch_tokens=batch_tokens)
            print(f"{name} {row['dtype']} ({target.weights}) on {row['device_name']}, {batch_tokens} tokens a batch: "
                  f"{row['rows_per_s']:,.0f} rows/s")
            rows.append(row)
        del target
    write_csv(args.out, pd.DataFrame(rows, columns=COLUMNS))
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0
