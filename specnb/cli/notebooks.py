"""``specnb notebooks run | lines | publish``: the numbered notebooks under papermill."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    from ..study.profiles import PROFILES

    nb = sub.add_parser("notebooks", help=help).add_subparsers(metavar="ACTION")
    p = nb.add_parser("run", help="execute notebooks/NN_*.ipynb (all, or the named ones) into figures/ (quick) or "
                      "figures/PROFILE/")
    p.add_argument("--profile", default="quick", choices=list(PROFILES), help="run size (specnb.study.profiles)")
    p.add_argument("names", nargs="*", help="notebook names or number prefixes, e.g. 00 05_roofline")
    p.set_defaults(func=_run)
    p = nb.add_parser("lines", help="count each notebook's non-plotting and plotting code lines")
    p.add_argument("names", nargs="*", help="notebook names or number prefixes (default: all)")
    p.set_defaults(func=_lines)
    p = nb.add_parser("publish", help="copy the last quick run's executed notebooks, outputs included, over "
                      "notebooks/ and index figures/ (the committed reference run); another profile's into "
                      "figures/PROFILE/notebooks/, indexed in figures/PROFILE/README.md")
    p.add_argument("--profile", default="quick", choices=[p for p in PROFILES if p != "smoke"], help="which run")
    p.set_defaults(func=_publish)


def _run(args: argparse.Namespace) -> int:
    from ..study.notebooks import run_notebooks

    runs = run_notebooks(args.profile, args.names or None)
    failed = [run for run in runs if run.error]
    total = sum(run.seconds for run in runs)
    print(f"{len(runs) - len(failed)} of {len(runs)} notebooks ran in {total / 60:.1f} min", flush=True)
    for run in failed:
        print(f"specnb: error: {run.source.name} failed ({run.error}); see {run.executed}", file=sys.stderr)
    return 1 if failed else 0


def _lines(args: argparse.Namespace) -> int:
    from ..study.notebooks import code_lines, find_notebooks

    for path in find_notebooks(args.names or None):
        counts = code_lines(path)
        print(f"{path.stem:28s} code {counts['code']:4d}   plotting {counts['plotting']:4d}")
    return 0


def _publish(args: argparse.Namespace) -> int:
    from ..study.notebooks import NOTEBOOKS
    from ..study.plots import figures_for
    from ..study.reference_run import publish, publish_beside

    executed, figures = NOTEBOOKS / "executed" / args.profile, figures_for(args.profile)
    try:
        written = publish(executed, NOTEBOOKS, figures) if args.profile == "quick" else \
            publish_beside(executed, figures, args.profile)
    except (OSError, ValueError) as exc:
        print(f"specnb: error: {exc}", file=sys.stderr)
        return 2
    print(f"published {len(written)} notebooks with their outputs; {figures / 'README.md'} indexes the run")
    return 0
