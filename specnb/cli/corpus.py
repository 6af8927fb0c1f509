"""``specnb corpus build SOURCE --model NAME``: tokenise a corpus once per tokenizer
(:func:`specnb.datastores.corpus.build_corpus`)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    parser = sub.add_parser("corpus", help=help)
    actions = parser.add_subparsers(dest="corpus_command", required=True)
    build = actions.add_parser("build", help="tokenise a corpus once per tokenizer and cache it")
    build.add_argument("source", nargs="+", help="code (stdlib), chat (ShareGPT), a folder of text files, files, "
                       'or a JSONL of {"text": ...} / {"tokens": [ids]} lines')
    build.add_argument("--model", required=True, help="model whose tokenizer to use (e.g. gemma-3-270m)")
    build.add_argument("--max-tokens", type=int, default=None, help="stop after about this many tokens")
    build.add_argument("--max-docs", type=int, default=None, help="stop after this many documents")
    build.add_argument("--out", default=None, help="output folder (default: under the specnb cache)")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.set_defaults(func=_build)


def _build(args: argparse.Namespace) -> int:
    from ..datastores.corpus import build_corpus

    source = args.source[0] if len(args.source) == 1 else args.source
    corpus = build_corpus(source, args.model, max_tokens=args.max_tokens, max_docs=args.max_docs,
                          out=args.out, force=args.force)
    print(f"{corpus.path}: {corpus.num_docs:,} documents, {corpus.num_tokens:,} tokens "
          f"({corpus.tokenizer.name}, vocab {corpus.tokenizer.vocab_size})")
    return 0
