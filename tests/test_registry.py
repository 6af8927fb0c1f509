"""Each drafter module declares its methods' records (``METHODS``) beside its options and factory, and the registry
reads their names, help, labels and routability from the source, without importing the module: what it reads
equals the imported records, no drafter module is left out, and no name is declared twice."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from specnb import drafters
from specnb.drafters import DRAFTERS, MODULES, Entry, Method, read_entries, registry
from specnb.eval.methods import METHODS, method

FOLDER = Path(drafters.__file__).parent


def factories(module: str) -> set[str]:
    """The public ``make`` / ``make_*`` functions defined in drafter module ``module``."""
    tree = ast.parse((FOLDER / f"{module}.py").read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and (node.name == "make" or node.name.startswith("make_"))}


def test_every_module_with_a_factory_declares_its_records_and_the_source_reading_equals_them():
    names = sorted(p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__")
    assert sorted(MODULES) == sorted(name for name in names if factories(name))  # hindsight, shaped: study-only
    for name in MODULES:
        records = importlib.import_module(f"specnb.drafters.{name}").METHODS
        assert all(isinstance(m, Method) and m.is_drafter for m in records)
        assert factories(name) == {m.factory.__name__ for m in records}, name  # every factory has its record
        assert read_entries(name) == [Entry(m.name, m.help, m.label, m.routable, f"specnb.drafters.{name}")
                                      for m in records]
    assert all(method(name) is entry.method() for name, entry in DRAFTERS.items())


def test_a_name_is_declared_once_and_a_module_without_records_is_refused():
    baselines = [name for name, record in METHODS.items() if isinstance(record, Method)]
    assert len(METHODS) == len(DRAFTERS) + len(baselines) and not set(DRAFTERS) & set(baselines)
    with pytest.raises(ValueError, match="'pld' is declared by specnb.drafters.context and specnb.drafters.context"):
        registry(("context", "context"))
    with pytest.raises(ValueError, match="hindsight.py declares no METHODS"):
        read_entries("hindsight")
