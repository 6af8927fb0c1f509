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
    """Check the sizes and read a --tokens file, then load the model and build (ValueError or OSError, one line,
    before the model loads)."""
    from ..datastores.ngram_tables import bigram_path, bigram_table, corpus_tokens, default_restriction, unigram_ranking
    from ..model.models import load_model

    for flag in ("k_max", "batch_size"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    text = None if args.tokens in ("all", "default") else _tokens_text(args.tokens)
    target = load_model(args.model, dtype=args.dtype)
    if args.tokens == "all":
        tokens, described = None, "all tokens"
    elif text is None:
        tokens, described = default_restriction(target)
    else:
        tokens, described = corpus_tokens(target, [text]), f"tokens of {args.tokens}"
    unigram_ranking(target)
    table = bigram_table(target, tokens, k_max=args.k_max, batch_size=args.batch_size)
    print(f"{bigram_path(target)}: {table.tokens.shape[0]:,} of {target.vocab_size:,} rows ({described})")
    return 0


def _tokens_text(path: str) -> str:
    """The text of the ``--tokens`` file ``path``; ValueError (one line) when it is missing, not a file, not text
    or holds nothing to cover."""
    if not Path(path).is_file():
        raise ValueError(f"--tokens {path!r} is not 'all', 'default' or a text file")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--tokens {path} is not UTF-8 text") from None
    if not text.strip():
        raise ValueError(f"--tokens {path} holds no text: no tokens to cover")
    return text
