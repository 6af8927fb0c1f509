"""Every ``specnb.X`` name and every repository path the prose points a reader to exists: in the README, docs/,
data/README.md and the package's docstrings (Sphinx roles such as :func:`specnb.core.generate.generate`)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROSE = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOTTED = re.compile(r"\bspecnb(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
WRITTEN = {"data/roofline_gpu.csv"}  # what a command writes (`specnb roofline --device cuda`), named before it exists
PATH = re.compile(r"`((?:specnb|docs|tests|notebooks|data|figures)/[A-Za-z0-9_./-]+\.(?:py|md|h|cpp|ipynb|csv|jsonl))`")


def resolves(dotted: str) -> bool:
    """Whether ``specnb.a.b.c`` names a module or an attribute of one (the longest importable prefix, then
    attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _names_in(text: str) -> set[str]:
    return {m.group(0).rstrip(".") for m in DOTTED.finditer(text)}


@pytest.mark.parametrize("path", PROSE, ids=[str(p.relative_to(ROOT)) for p in PROSE])
def test_the_prose_names_only_what_exists(path):
    text = path.read_text()
    missing = sorted(name for name in _names_in(text) if not resolves(name))
    missing += sorted(p for p in set(PATH.findall(text)) - WRITTEN if not (ROOT / p).exists())
    assert missing == [], f"{path.name} names what does not exist"


def test_the_docstrings_name_only_what_exists():
    import ast

    missing = []
    for source in sorted((ROOT / "specnb").rglob("*.py")):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                missing += [f"{source.relative_to(ROOT)}: {name}" for name in _names_in(doc) if not resolves(name)]
    assert missing == []


def test_the_check_fails_on_a_name_that_does_not_exist():
    assert resolves("specnb.core.generate.generate") and resolves("specnb.study")
    assert not resolves("specnb.core.generate.no_such_function") and not resolves("specnb.id_data")
