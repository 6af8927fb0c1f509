"""specnb's modules import one another without circles, and no layer imports a layer above it: every import (at
the top of a module or inside a function; not those under ``if TYPE_CHECKING:``) is an edge."""

from __future__ import annotations

import ast
from pathlib import Path

import specnb

ROOT = Path(specnb.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(name: str, modules: set[str]) -> str | None:
    """The module ``name`` imports: itself, or its package for a name defined in the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(path: Path, modules: set[str]) -> set[str]:
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
        node.test) for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {m for n in names if n.startswith("specnb") and (m := resolve(n, modules)) and m != me}
    return found


def graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in edges:
        if v not in index:
            visit(v)
    return out


# Lowest first; a module is in the layer of its longest matching prefix. The drafter protocol (core.drafter,
# core.report) sits in the core, which calls it; study holds what the experiments report through.
LAYERS = [
    ("leaves", ("specnb.paths", "specnb.atomic", "specnb.options", "specnb.draft_shapes")),
    ("model", ("specnb.model",)),
    ("core", ("specnb.core",)),
    ("datastores", ("specnb.datastores",)),
    ("drafters", ("specnb.drafters",)),
    ("eval", ("specnb.eval",)),
    ("study", ("specnb.study",)),
    ("experiments", ("specnb.experiments",)),
    ("command line", ("specnb.cli", "specnb")),
]


def layer(module: str) -> int:
    matches = [(len(prefix), i) for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1]


def upward(edges: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({LAYERS[layer(m)][0]}) imports {d} ({LAYERS[layer(d)][0]})"
            for m, deps in sorted(edges.items()) for d in sorted(deps) if layer(d) > layer(m)]


def test_the_graph_sees_imports_of_every_kind():
    edges = graph()
    assert "specnb.model.kernels.quant" in edges["specnb.model.decoder"]  # from .kernels import quant
    assert "specnb.datastores.manifest" in edges["specnb.datastores.rest"]  # from .manifest import ...
    assert "specnb.model.models" not in edges["specnb.eval.methods"]  # under TYPE_CHECKING only
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_every_import_names_a_module():
    """``from .x import y`` inside specnb names a module x that exists (a stale relative import after a move would
    otherwise resolve to its nearest existing package and fail only when run)."""
    modules = set(graph())
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        me = module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{node.module}" if node.module else anchor
                if base not in modules:
                    missing.append(f"{me}: {base}")
    assert missing == []


def test_no_import_circles():
    assert circles(graph()) == []


def test_no_layer_imports_a_layer_above_it():
    assert upward({"specnb.core.generate": {"specnb.drafters.auto"}}) != []  # the check can fail
    assert upward(graph()) == []
