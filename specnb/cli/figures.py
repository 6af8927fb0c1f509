"""``specnb figures compare OLD [NEW]``: headline numbers that moved between two reference runs."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    figures = sub.add_parser("figures", help=help).add_subparsers(metavar="ACTION")
    p = figures.add_parser("compare", help="headline numbers that moved beyond their 90%% interval between runs")
    p.add_argument("old", help="a figures folder or a git revision (its figures/), e.g. HEAD~1")
    p.add_argument("new", nargs="?", default="figures", help="a figures folder or git revision (default: figures)")
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    """Print what moved between the runs OLD and NEW; ValueError where either holds a malformed results file or
    none, or where they share no notebook or no verdict (nothing to compare)."""
    from ..study.reference_run import load_results, moved

    old, new = load_results(args.old, judged=True), load_results(args.new, judged=True)
    for where, results in ((args.old, old), (args.new, new)):
        if not results:
            raise ValueError(f"{where!r} holds no NN_results.json: nothing to compare")
    if not set(old) & set(new):
        raise ValueError(f"{args.old!r} (notebooks {', '.join(sorted(old))}) and {args.new!r} (notebooks "
                         f"{', '.join(sorted(new))}) share no notebook's results: nothing to compare")
    shared = sorted(set(old) & set(new))
    compared = sum(len(set(old[k].get("verdicts", {})) & set(new[k].get("verdicts", {}))) for k in shared)
    if not compared:
        raise ValueError(f"the notebooks both runs hold ({', '.join(shared)}) share no verdict: nothing to compare")
    rows = moved(old, new)
    for r in rows:
        print(f"{r['notebook']} {r['claim']}: {r['old']} -> {r['new']}"
              + (f" ({r['old_verdict']} -> {r['new_verdict']})" if r["old_verdict"] != r["new_verdict"] else ""))
    print(f"{len(rows)} of {compared} compared numbers moved beyond their 90% interval or changed verdict")
    return 0
