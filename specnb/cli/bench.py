"""``specnb bench``: methods side by side on a prompt set (:func:`specnb.eval.bench.run_bench`).

Its help lists every method from the registry (:data:`specnb.eval.methods.METHODS`) without importing a drafter's
module, torch or a model: the options are parsed and checked before the model loads.
"""

from __future__ import annotations

import argparse
import sys

from ..eval.methods import METHODS
from ..model.model_names import WEIGHTS

DTYPES = ["auto", "bfloat16", "float32", "float16"]


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    methods = "\n".join(f"  {name:15s} {method.help}" for name, method in METHODS.items())
    p = sub.add_parser("bench", help=help,
                       epilog=f"methods:\n{methods}\n\nEvery value is checked before the model loads; rows are "
                              "written to --out as each prompt finishes (an earlier bench CSV there is replaced, "
                              "any other file refused); Ctrl-C keeps them and prints the summary.")
    p.add_argument("--model", default="gemma-3-270m", help="target: embedded name, tiny-ARCH, HF id or path")
    p.add_argument("--prompts", default="humaneval",
                   help="humaneval | mtbench | humaneval2 (each problem twice) | mtbench2 (both turns) | FILE.jsonl")
    p.add_argument("--n", type=int, default=10, help="number of prompts (>= 1; the first n)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--methods", default="ar,hf,hf-pld,pld", help="comma-separated (list below); 'ar' always runs")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="model dtype (auto: bf16 where fast)")
    p.add_argument("--weights", default="auto", choices=WEIGHTS,
                   help="bf16: the dense checkpoint in --dtype; gguf: the GGUF file's blocks (embedded models, CPU); "
                        "gguf-int8: those blocks times int8-rounded activations (VNNI or AVX2 integer dots); "
                        "auto: for embedded models the blocks route this CPU runs where timed no slower than bf16 "
                        "at 1, 4 and 16 tokens per call (measured once, cached), else bf16")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (None: cuda if available, else cpu)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="seed of every sampler (target, draft models, HF)")
    p.add_argument("--verify", default="tree", choices=["tree", "batch"], help="verification of a draft tree")
    p.add_argument("--k", type=int, help="number of drafts (None: each method's default)")
    p.add_argument("--w", type=int, help="draft length (None: each method's default)")
    p.add_argument("--datastore", action="append", default=[], metavar="[METHOD=]PATH",
                   help="datastore for retrieval methods; METHOD=PATH for one method (repeatable)")
    p.add_argument("--draft", help="draft model name or self:L (sd, mcsd, hf-assisted)")
    p.add_argument("--draft-shape", help="draft shape: KxW for dense, a tree like 4x2x2x1 for mcsd")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a method option (repeatable); a key no chosen method reads is an error")
    p.add_argument("--out", help="CSV file for per-prompt and summary rows (its folder must exist)")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    """Check everything, open the CSV, then load the model and run (Ctrl-C: keep, summarise, exit 130)."""
    from ..core.datasets import load_prompts
    from ..eval.bench import BenchConfig, CsvSink, format_table, run_bench
    from ..eval.methods import check_before_loading, options_for
    from ..eval.runner import summarize
    from ..model.device import default_device, resolve_device
    from ..model.model_names import check_weights, context_length

    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    device = resolve_device(args.device or default_device())
    named = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not named:
        raise ValueError(f"--methods names none, got {args.methods!r}")
    methods = list(dict.fromkeys(["ar", *named]))
    given = {"k": args.k, "w": args.w, "draft": args.draft, "draft_shape": args.draft_shape}
    said = {key: f"--{key.replace('_', '-')} {value}" for key, value in given.items() if value is not None}
    for key, value in map(_key_value, args.option):
        if key in said:  # a flag and -o, or -o twice: which one was meant?
            raise ValueError(f"-o {key}={value}: {key} is already given ({said[key]})")
        given[key], said[key] = value, f"-o {key}={value}"
    config = BenchConfig(methods, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                         seed=args.seed, verify=args.verify, options=options_for(methods, given, args.datastore))
    sink = CsvSink(args.out) if args.out is not None else None
    prompts = load_prompts(args.prompts, args.n)
    check_before_loading(args.model, config.options)
    check_weights(args.model, args.weights, args.dtype, device)
    limit = context_length(args.model)
    tokenizer = None if limit is None else _check_lengths(args.model, prompts, args.max_new_tokens, limit)

    from ..model.models import load_model

    target = load_model(args.model, dtype=args.dtype, device=device, weights=args.weights)
    del tokenizer  # held until here: the load took the same object instead of reading the vocabulary again
    weights = {"gguf": ", GGUF blocks", "gguf-int8": ", GGUF blocks, int8 activations"}.get(target.weights, "")
    print(f"{target.name} ({target.dtype}{weights}, {target.device}), {len(prompts)} prompts from {args.prompts}, "
          f"{args.max_new_tokens} new tokens, temperature {args.temperature}", flush=True)
    rows = run_bench(target, prompts, config, sink=sink)
    done = rows.attrs["prompts_done"]
    if done:
        summary = summarize(rows)
        print(format_table(summary))
        if sink is not None:
            sink(summary.to_dict("records"))
            print(f"wrote {args.out}")
    if rows.attrs["interrupted"]:
        kept = f"; their rows are in {args.out}" if sink is not None and done else ""
        print(f"specnb: interrupted after {done} of {len(prompts)} prompts{kept}", file=sys.stderr)
        return 130
    return 0


def _check_lengths(model: str, prompts: list, max_new_tokens: int, limit: int) -> object:
    """ValueError unless every prompt and ``max_new_tokens`` fit model ``model``'s context of ``limit`` tokens,
    read with its tokenizer alone (seconds before the model would load); returns that tokenizer."""
    from types import SimpleNamespace

    from ..datastores.corpus import load_tokenizer
    from ..eval.bench import check_lengths
    from ..model.models import uses_chat

    if max_new_tokens >= limit:
        raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the context of {model} "
                         f"({limit} tokens)")
    tokenizer = load_tokenizer(model)
    reader = SimpleNamespace(name=model, tokenizer=tokenizer, chat=uses_chat(model, tokenizer),
                             vocab_size=len(tokenizer))
    check_lengths(reader, prompts, max_new_tokens, limit)
    return tokenizer


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"-o {text!r} must look like KEY=VALUE")
    return key.strip(), value.strip()
