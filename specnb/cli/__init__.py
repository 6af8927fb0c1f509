"""The ``specnb`` command line: one module per command in this package, each with ``add_parser(subparsers, help)``.

Every user error is one line ``specnb: error: ...`` and exit status 2, in every command (``datastore verify``
reports a damaged store the same way with exit status 1); Ctrl-C is exit 130 without a traceback. Only the
chosen command's module is imported (``specnb --help`` and ``specnb bench --help`` never import torch), and
every option's help shows its default.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import openmp_spin_briefly

COMMANDS = {
    "models": ("models", "list or fetch the embedded models"),
    "bench": ("bench", "run methods side by side on a prompt set"),
    "notebooks": ("notebooks", "run the notebooks with papermill"),
    "figures": ("figures", "the reference run's figures"),
    "corpus": ("corpus", "token corpora for retrieval datastores"),
    "ngram-table": ("ngram_table", "build the model-derived unigram/bigram tables (cached)"),
    "roofline": ("roofline", "time one target call over a (k, w, context) grid"),
    "kernels": ("kernels", "the few-row CPU kernels"),
    "extract-rate": ("extract_rate", "time a dense store's hidden-state extraction (rows/s)"),
    "id-data": ("id_data", "generate the target's greedy responses (in-distribution datastore data)"),
    "study": ("study", "the notebooks on your model and data, into one folder"),
    "datastore": ("datastore", "build and verify retrieval datastores"),
}
"""Command -> (its module in this package, its one line of help): listing the commands imports none of them."""


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
            raise _missing_choice(parser, argv)
        return args.func(args) or 0
    except (ValueError, OSError) as exc:  # bad input (incl. corrupt / missing files): one line, no traceback
        print(f"specnb: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass  # said below, once the interrupted work's frames are gone: their progress bars close and repaint
    finally:
        if cluster := sys.modules.get("specnb.datastores.cluster"):  # a Ray build ran
            cluster.disconnect()
    gc.collect()
    print("specnb: interrupted", file=sys.stderr)
    return 130


def _missing_choice(parser: argparse.ArgumentParser, argv: list[str]) -> UsageError:
    """The error for a command line that stops before naming what to do (``specnb``, ``specnb datastore build``):
    the deepest parser ``argv`` reached, and the choices it offers."""
    while True:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        choices = actions[0].choices if actions else {}
        chosen = next((a for a in argv if a in choices), None)
        if chosen is None:
            return UsageError(f"{parser.prog} needs one of: {', '.join(choices)} (see {parser.prog} --help)")
        parser = choices[chosen]


def _check_model_names(argv: list[str]) -> None:
    """Check every ``--model NAME`` and ``--draft NAME`` before the command's module is imported (torch takes
    seconds), so that a mistyped name or a model that is not installed fails at once
    (:func:`specnb.model.model_names.check_installed`). Spellings this quick look does not read (abbreviations) are
    checked later, when the model loads."""
    from ..model.model_names import check_installed

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
    """The parser of every command; a command's own options are added only when ``command`` names it, so that
    parsing another command imports none of its modules."""
    parser = _Parser(prog="specnb", description="Speculative decoding notebooks and benchmarks")
    sub = parser.add_subparsers(metavar="COMMAND")
    for name, (module, text) in COMMANDS.items():
        if command == name:
            importlib.import_module(f"{__name__}.{module}").add_parser(sub, text)
        else:
            sub.add_parser(name, help=text)
    return parser
