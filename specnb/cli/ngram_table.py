"""``specnb ngram-table``: build (or grow) a model's cached unigram and bigram tables
(:mod:`specnb.datastores.ngram_tables`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    parser = sub.add_parser("ngram-table", help=help)
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", default="default",
                        help="'all' (every token: hours for 262k vocabularies on a CPU), 'default' (all up to 65,536, "
                             "else the HumanEval + MT-Bench prompt tokens) or a text file whose tokens to cover")
    parser.add_argument("--k-max", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.set_defaults(func=_build)


def _build(args: argparse.Namespace) -> int:
    from ..datastores.ngram_tables import bigram_path, bigram_table, corpus_tokens, default_restriction, unigram_ranking
    from ..model.models import load_model

    target = load_model(args.model, dtype=args.dtype)
    if args.tokens == "all":
        tokens, described = None, "all tokens"
    elif args.tokens == "default":
        tokens, described = default_restriction(target)
    else:
        tokens, described = corpus_tokens(target, [Path(args.tokens).read_text()]), f"tokens of {args.tokens}"
    unigram_ranking(target)
    table = bigram_table(target, tokens, k_max=args.k_max, batch_size=args.batch_size)
    print(f"{bigram_path(target)}: {table.tokens.shape[0]:,} of {target.vocab_size:,} rows ({described})")
    return 0
