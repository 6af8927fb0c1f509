"""``specnb id-data code|chat --out FILE.jsonl``: the target's greedy responses to prompts disjoint from the
evaluation sets, the in-distribution data of a DReSD store (:mod:`specnb.datastores.id_data`)."""

from __future__ import annotations

import argparse

SOURCES = ("chat", "code")  # the keys of specnb.datastores.id_data.PROMPT_SOURCES


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    parser = sub.add_parser("id-data", help=help)
    parser.add_argument("source", choices=SOURCES, help="code: stdlib stubs; chat: ShareGPT turns")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--n", type=int, default=150, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16,
                        help="prompts decoded side by side where each row keeps its bits alone (the same tokens); "
                             "1: one at a time, with prompt lookup")
    parser.add_argument("--out", required=True, help="JSONL file (appended to; resumable)")
    parser.set_defaults(func=_generate)


def _generate(args: argparse.Namespace) -> int:
    """Check the counts and --out (never a user's file, nor its sidecar), then list the prompts, load the model and
    append its responses."""
    import torch

    from ..datastores.id_data import PROMPT_SOURCES, check_responses_out, generate_responses
    from ..eval.methods import make_drafter
    from ..model.models import load_model

    for flag in ("n", "max_new_tokens", "batch"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    check_responses_out(args.out, args.source)
    torch.manual_seed(args.seed)
    prompts = PROMPT_SOURCES[args.source](args.n, seed=args.seed)
    target = load_model(args.model, dtype=args.dtype)
    source = f"{args.source}: {PROMPT_SOURCES[args.source].__name__}(n={args.n}, seed={args.seed})"
    print(generate_responses(target, prompts, args.out, max_new_tokens=args.max_new_tokens, source=source,
                             seed=args.seed, drafter=make_drafter("pld", target), batch=args.batch))
    return 0
