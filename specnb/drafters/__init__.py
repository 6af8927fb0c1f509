"""Drafters: one module per speculation method, all behind :class:`~specnb.core.drafter.Drafter`, and the method
registry.

:class:`Method` is a method's record: its name, one line of help, its display name in figures, its options
dataclass, its factory ``make(target, options) -> Drafter`` and whether the router may use it. Each drafter module
declares its records beside its options and factory, as ``METHODS = (Method(...), ...)``; :data:`MODULES` names
those modules. :data:`specnb.eval.methods.METHODS` adds ``ar`` and the Hugging Face / llama.cpp baselines.

A drafter module imports torch, and ``specnb bench --help`` and the model-name checks must not: :data:`DRAFTERS`
holds each record's :class:`Entry` (name, help, label, routable), read from its module's source without importing
it, and :meth:`Entry.method` imports the module for the options and the factory. The source stays the one place
a record is written.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..options import Options

if TYPE_CHECKING:
    from ..core.drafter import Drafter
    from ..model.models import LoadedModel


@dataclass(frozen=True)
class Method:
    """A named method.

    name: the bench's name (``pld``); help: one line for ``specnb bench --help``; label: its display name in every
    figure; options: its options dataclass (:class:`specnb.options.Options` for a method with none); factory:
    ``make(target, options) -> Drafter`` (None for ``ar`` and the baselines, which the bench runs itself);
    routable: whether the router (``auto``) may choose it (model-free, not already priced). In a drafter module,
    name, help, label and routable are written as literals (:data:`DRAFTERS` reads them from the source).
    """

    name: str
    help: str
    label: str
    options: type = Options
    factory: Callable[[LoadedModel, Any], Drafter] | None = None
    routable: bool = False

    @property
    def is_drafter(self) -> bool:
        """Whether the method drafts through our loop (``ar`` and the baselines do not)."""
        return self.factory is not None

    def make(self, target: LoadedModel, options: Any) -> Drafter:
        """The method's drafter for ``target`` with ``options`` (an instance of :attr:`options`)."""
        if self.factory is None:
            raise ValueError(f"{self.name} is not a drafter")
        return self.factory(target, options)


@dataclass(frozen=True)
class Entry:
    """What the registry knows of a drafter's record without importing its module: name, help, label, routable
    (the record's literals) and ``module``, the module that declares it."""

    name: str
    help: str
    label: str
    routable: bool
    module: str

    def method(self) -> Method:
        """The full record (imports :attr:`module`, and so torch, the first time)."""
        return next(m for m in importlib.import_module(self.module).METHODS if m.name == self.name)


MODULES = ("context", "model_ngram", "mixed", "dense", "rest", "crest", "priced", "suffix", "recycle", "auto",
           "draft_model")
"""The modules of this package that declare ``METHODS``, in the order of ``specnb bench --help`` and the figures."""

_LITERALS = ("name", "help", "label", "routable")


def read_entries(module: str) -> list[Entry]:
    """The records module ``module`` of this package declares in ``METHODS`` (a tuple of ``Method(...)`` calls),
    read from its source; ValueError if it declares none or writes a literal field as an expression."""
    path = Path(__file__).with_name(f"{module}.py")
    calls = _declared(ast.parse(path.read_text(encoding="utf-8")))
    if not calls:
        raise ValueError(f"{path} declares no METHODS = (Method(...), ...)")
    fields = [f.name for f in dataclasses.fields(Method)]
    entries = []
    for call in calls:
        given = dict(zip(fields, call.args, strict=False)) | {k.arg: k.value for k in call.keywords}
        try:
            values = {key: ast.literal_eval(given[key]) for key in _LITERALS if key in given}
        except ValueError:
            raise ValueError(f"{path}:{call.lineno}: write a Method's {', '.join(_LITERALS)} as literals") from None
        entries.append(Entry(**{"routable": False, **values}, module=f"{__name__}.{module}"))
    return entries


def _declared(tree: ast.Module) -> list[ast.expr]:
    """The elements of the tuple a module assigns to ``METHODS`` at its top level ([] if none)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(t, ast.Name) and t.id == "METHODS" for t in targets) and isinstance(node.value, ast.Tuple):
            return node.value.elts
    return []


def registry(modules: tuple[str, ...]) -> dict[str, Entry]:
    """{name: entry} of every record ``modules`` declare, in order; ValueError for a name declared twice."""
    out: dict[str, Entry] = {}
    for entry in (entry for module in modules for entry in read_entries(module)):
        if entry.name in out:
            raise ValueError(f"method {entry.name!r} is declared by {out[entry.name].module} and {entry.module}")
        out[entry.name] = entry
    return out


DRAFTERS: dict[str, Entry] = registry(MODULES)
"""Every drafter's entry, by method name (the order of ``specnb bench --help``)."""
