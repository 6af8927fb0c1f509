"""``specnb study run``: the numbered notebooks on your model and your data, into one folder
(:mod:`specnb.study.study_run`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    from ..study import study_run
    from ..study.profiles import PROFILES

    parser = sub.add_parser("study", help=help)
    actions = parser.add_subparsers(metavar="ACTION")
    run = actions.add_parser("run", help="run the notebooks with papermill under your parameters into --out",
                         description=study_run.__doc__.split("\n\n")[1])
    run.add_argument("names", nargs="*", help="notebooks (00, 09_end_to_end, ...; default: all)")
    run.add_argument("--out", required=True, type=Path, help="the study folder (new, empty, or an earlier run's)")
    run.add_argument("--profile", default="quick", choices=list(PROFILES), help="sizes not given here")
    run.add_argument("--target", help="an embedded name, tiny-ARCH, a local folder or a Hugging Face id in the cache")
    run.add_argument("--draft", help="a model sharing the target's tokenizer, or self:L (notebooks 07, 08, 09)")
    run.add_argument("--prompts", help="a prompt set (humaneval, mtbench, ...) or a JSONL file (the bench's format)")
    run.add_argument("--corpus", help="the retrieval stores' code corpus: code, a folder of text files or a JSONL")
    run.add_argument("--device", help="cpu | cuda | cuda:N")
    run.add_argument("--dtype", help="auto | float32 | bfloat16")
    run.add_argument("--weights", help="auto | bf16 | gguf | gguf-int8")
    for size in study_run.SIZES:
        run.add_argument(f"--{size.replace('_', '-')}", type=int, dest=size, help="None: the profile's")
    run.add_argument("-p", dest="per_notebook", action="append", default=[], metavar="NN:NAME=VALUE",
                     help="a parameter of one notebook (e.g. 05:llamacpp=False); repeatable")
    run.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..study.profiles import OVERRIDABLE
    from ..study.study_run import notebook_parameters, run_study

    given = {name: getattr(args, name) for name in OVERRIDABLE if getattr(args, name, None) is not None}
    state = run_study(args.profile, args.names or None, args.out, given, notebook_parameters(args.per_notebook))
    failed = [stem for stem, r in state.items() if r["status"] == "failed"]
    print(f"{args.out / 'README.md'}: {sum(r['status'] == 'ok' for r in state.values())} ok, "
          f"{sum(r['status'] == 'skipped' for r in state.values())} skipped, {len(failed)} failed", flush=True)
    return 1 if failed else 0
