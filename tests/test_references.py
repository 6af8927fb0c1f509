"""Every ``specnb.X`` name and every repository path the prose points a reader to exists: in the README, docs/,
data/README.md, figures/README.md, the notebooks' Markdown cells and the package's docstrings (Sphinx roles such as
:func:`specnb.core.generate.generate`)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROSE = [ROOT / "README.md", ROOT / "data" / "README.md", ROOT / "figures" / "README.md",
         *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "notebooks").glob("*.ipynb"))]
DOTTED = re.compile(r"\bspecnb(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATH = re.compile(r"`((?:specnb|docs|tests|notebooks|data|figures)/[A-Za-z0-9_./-]+"
                  r"\.(?:py|md|h|cpp|ipynb|csv|jsonl?|png))`")
PLACEHOLDER = re.compile(r"(?<![A-Za-z0-9])(?:NN|NAME|FILE|DIR)(?![A-Za-z0-9])")  # figures/NN_results.json: a glob
COMMAND = re.compile(r"`specnb ([a-z][a-z-]*)")  # `specnb bench ...`: a command of specnb.cli.COMMANDS
RUN = re.compile(r"python -m (specnb(?:\.[A-Za-z_][A-Za-z0-9_]*)*)")  # a module with a main


def resolves(dotted: str) -> bool:
    """Whether ``specnb.a.b.c`` names a module or an attribute of one (the longest importable prefix, then
    attributes; last, a field a class declares without a default, such as a dataclass field)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, name in enumerate(parts[cut:], start=cut):
            if hasattr(obj, name):
                obj = getattr(obj, name)
            else:
                return i == len(parts) - 1 and isinstance(obj, type) and any(
                    name in vars(k).get("__annotations__", {}) for k in obj.__mro__)
        return True
    return False


def runnable(module: str) -> bool:
    """Whether ``python -m module`` runs something: a package with a ``__main__``, or a module with a main guard."""
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        return False
    if spec is None or spec.origin is None:
        return False
    if spec.submodule_search_locations is not None:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return re.search(r"""if __name__ == ["']__main__["']""", Path(spec.origin).read_text()) is not None


def prose(path: Path) -> str:
    """What a reader reads of ``path``: a notebook's Markdown cells (its code is run and tested elsewhere), or the
    whole text."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _names_in(text: str) -> set[str]:
    return {m.group(0).rstrip(".") for m in DOTTED.finditer(text)}


def missing(text: str) -> list[str]:
    """The ``specnb.X`` names, repository paths, ``specnb`` commands and ``python -m`` modules ``text`` names that
    do not exist."""
    from specnb.cli import COMMANDS

    names = sorted(name for name in _names_in(text) if not resolves(name))
    names += sorted(p for p in set(PATH.findall(text)) if not any(ROOT.glob(PLACEHOLDER.sub("*", p))))
    names += sorted(f"specnb {c}" for c in set(COMMAND.findall(text)) if c not in COMMANDS)
    return names + sorted(f"python -m {m}" for m in set(RUN.findall(text)) if not runnable(m))


@pytest.mark.parametrize("path", PROSE, ids=[str(p.relative_to(ROOT)) for p in PROSE])
def test_the_prose_names_only_what_exists(path):
    assert missing(prose(path)) == [], f"{path.name} names what does not exist"


def test_the_docstrings_name_only_what_exists():
    import ast

    found = []
    for source in sorted((ROOT / "specnb").rglob("*.py")):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node) or ""
                found += [f"{source.relative_to(ROOT)}: {name}" for name in missing(doc)]
    assert found == []


def test_the_check_fails_on_a_name_that_does_not_exist(tmp_path):
    assert resolves("specnb.core.generate.generate") and resolves("specnb.study")
    assert not resolves("specnb.core.generate.no_such_function") and not resolves("specnb.id_data")
    assert resolves("specnb.study.profiles.DresdSizes.store_tokens")  # a dataclass field: no class attribute
    assert not resolves("specnb.study.profiles.DresdSizes.no_such_field")
    assert not resolves("specnb.study.profiles.DresdSizes.store_tokens.items")  # nothing to look into past a field
    notebook = tmp_path / "00_made_up.ipynb"
    notebook.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["Sizes: `specnb.study.profiles.DresdSizes.made_up`,\n",
                                             "see `notebooks/99_made_up.ipynb`; run `specnb made-up --n 1`\n",
                                             "or `python -m specnb.datastores.id_data` (no main)."]},
        {"cell_type": "code", "source": ["specnb.code_cells_are_not_prose\n"]}]}))
    assert missing(prose(notebook)) == ["specnb.study.profiles.DresdSizes.made_up", "notebooks/99_made_up.ipynb",
                                        "specnb made-up", "python -m specnb.datastores.id_data"]
    assert missing("`specnb id-data code`, `python -m specnb.cli`, ``figures/README.md``, `figures/NN_results.json`"
                   ) == []
    assert missing("`figures/NN_no_such_results.json`") == ["figures/NN_no_such_results.json"]
