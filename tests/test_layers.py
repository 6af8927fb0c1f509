"""specnb's modules import one another without circles, and no layer imports a layer above it: every import (at
the top of a module or inside a function; not those under ``if TYPE_CHECKING:``) is an edge. And no module keeps
hidden state: nothing hung on objects specnb does not own, no cache keyed by object ids."""

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


# ------------------------------------------------------------------------------------------- hidden state
# What runs a call must be in plain sight: no state hung on objects specnb does not own (Hugging Face's models and
# tokenizers, torch tensors), no cache keyed by object ids. Four rules over specnb's source, each a function of one
# module's text that lists its offences.

FOREIGN_TAG = "_specnb"


def tagged_names(tree: ast.AST) -> list[str]:
    """Any ``_specnb*`` attribute or string: state specnb would tag a foreign object with."""
    return [f"line {node.lineno}: {FOREIGN_TAG}* {kind}" for node in ast.walk(tree)
            for kind, value in (("attribute", getattr(node, "attr", None) if isinstance(node, ast.Attribute) else None),
                                ("string", node.value if isinstance(node, ast.Constant) else None))
            if isinstance(value, str) and FOREIGN_TAG in value]


def reflective_writes(tree: ast.AST) -> list[str]:
    """``setattr`` / ``delattr`` (or ``X.__setattr__`` / ``X.__delattr__``) on anything but ``self``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        builtin = isinstance(func, ast.Name) and func.id in ("setattr", "delattr")
        dunder = isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")
        if not (builtin or dunder):
            continue
        # setattr(obj, ...) and object.__setattr__(obj, ...) name the object first; obj.__setattr__(name, ...) before
        bound = dunder and not (isinstance(func.value, ast.Name)
                                and (func.value.id == "object" or func.value.id[:1].isupper()))
        target = func.value if bound else (node.args[0] if node.args else None)
        if not (isinstance(target, ast.Name) and target.id == "self"):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:60]}")
    return found


def root_name(target: ast.expr) -> str | None:
    """The variable an attribute assignment's target hangs from (``a`` for ``a.b[0].c``), or None."""
    while isinstance(target, ast.Attribute | ast.Subscript):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def assigned(node: ast.AST) -> list[ast.expr]:
    """The attribute targets an assignment statement writes (tuples unpacked)."""
    targets = list(node.targets) if isinstance(node, ast.Assign) else [node.target] \
        if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets += target.elts
        elif isinstance(target, ast.Attribute):
            flat.append(target)
    return flat


def parameter_writes(tree: ast.AST, classes: set[str]) -> list[str]:
    """An attribute set on a function parameter whose annotation names no specnb class (``self`` and ``cls`` are
    the function's own)."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = function.args
        params = {a.arg: a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        foreign = {name for name, note in params.items() if name not in ("self", "cls") and not (
            note is not None and classes & {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(note)
                                            if isinstance(n, ast.Name | ast.Attribute)})}
        for node in ast.walk(function):
            for target in assigned(node):
                if root_name(target) in foreign:
                    found.append(f"line {node.lineno}: {function.name} sets {ast.unparse(target)}")
    return found


def id_keys(tree: ast.Module) -> list[str]:
    """``id()`` at module scope, or (in a function) as a key, or part of one, into a module-level container:
    ``G[key]``, ``G.get(key)`` and the like, ``key in G``."""
    def calls_id(node: ast.AST, names: set[str] = frozenset()) -> bool:
        return any((isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "id")
                   or (isinstance(n, ast.Name) and n.id in names) for n in ast.walk(node))

    found = [f"line {node.lineno}: id() at module scope" for stmt in tree.body
             if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
             for node in ast.walk(stmt) if calls_id(node) and isinstance(node, ast.Call)]
    found += [f"line {node.lineno}: id() in class {stmt.name}'s body" for stmt in tree.body
              if isinstance(stmt, ast.ClassDef) for part in stmt.body
              if not isinstance(part, ast.FunctionDef | ast.AsyncFunctionDef)
              for node in ast.walk(part) if isinstance(node, ast.Call) and calls_id(node)]
    module_names = {t.id for stmt in tree.body if isinstance(stmt, ast.Assign | ast.AnnAssign)
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                    if isinstance(t, ast.Name)}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) or not calls_id(function):
            continue
        keys = {t.id for node in ast.walk(function) if isinstance(node, ast.Assign) and calls_id(node.value)
                for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(function):
            uses = []
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
                uses = [(node.value.id, node.slice)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name):
                uses = [(node.func.value.id, arg) for arg in node.args]
            elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
                uses = [(c.id, node.left) for c in node.comparators if isinstance(c, ast.Name)]
            found += [f"line {node.lineno}: id() as a key into module-level {name}" for name, key in uses
                      if name in module_names and calls_id(key, keys)]
    return found


def specnb_classes() -> set[str]:
    return {node.name for path in ROOT.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def hidden_state(source: str, classes: set[str]) -> list[str]:
    """Every offence of ``source`` (one module's text) against the four rules; ``classes``: specnb's class names."""
    tree = ast.parse(source)
    return tagged_names(tree) + reflective_writes(tree) + parameter_writes(tree, classes) + id_keys(tree)


def test_specnb_keeps_no_state_on_foreign_objects_and_no_id_keyed_caches():
    classes = specnb_classes()
    found = [f"{path.relative_to(ROOT.parent)} {offence}" for path in sorted(ROOT.rglob("*.py"))
             for offence in hidden_state(path.read_text(), classes)]
    assert found == []


RULES = {"tag": tagged_names, "reflection": reflective_writes, "id": id_keys,
         "parameter": lambda tree: parameter_writes(tree, {"Layer"})}
OFFENCES = [  # (rule, source): each rule's offences as specnb once wrote them, and other forms of each
    ("tag", "def f(model):\n    return getattr(model, 'x', None) or model._specnb_body\n"),
    ("tag", "def f(tokenizer):\n    return getattr(tokenizer, '_specnb_fingerprint', None)\n"),
    ("reflection", "def f(model):\n    setattr(model, 'flag', True)\n"),
    ("reflection", "def f(model):\n    delattr(model, 'flag')\n"),
    ("reflection", "def f(other):\n    object.__setattr__(other, 'flag', True)\n"),
    ("reflection", "def f(other):\n    other.__setattr__('flag', True)\n"),
    ("parameter", "def mark(model: nn.Module, path: str):\n    model.path = path\n"),
    ("parameter", "def f(module, size):\n    module.weight.data, module.n = module.weight[:size], size\n"),
    ("parameter", "def f(config: PretrainedConfig):\n    config.layers += 1\n"),
    ("id", "_HEADS = {}\n\ndef head(weight):\n    key = (id(weight), weight.dtype)\n    if key not in _HEADS:\n"
           "        _HEADS[key] = 1\n    return _HEADS[key]\n"),
    ("id", "_SEEN = {}\n\ndef seen(x):\n    return _SEEN.setdefault(id(x), x)\n"),
    ("id", "import torch\nDEFAULT = id(torch)\n"),
]
ALLOWED = {  # what the rules let through
    "own attributes": "class A:\n    def __init__(self):\n        self.x = 1\n"
                      "        object.__setattr__(self, 'y', 2)\n",
    "a specnb class's parameter": "def fill(layer: Layer, scale: float):\n    layer.scale = scale\n",
    "a local object": "def spec(ext):\n    out = ext.Norm()\n    out.eps = 1e-6\n    return out\n",
    "ids in a local table": "def named(fig):\n    seen = {id(t): t for t in fig.texts}\n    return [seen[id(fig)]]\n",
}


def test_each_hidden_state_rule_fails_on_offending_source():
    for rule, source in OFFENCES:
        assert RULES[rule](ast.parse(source)), source
    for name, source in ALLOWED.items():
        assert hidden_state(source, {"Layer"}) == [], name
    classes = specnb_classes()
    assert {"Body", "LoadedModel", "HFModules"} <= classes


def test_the_modules_of_ray_tasks_import_neither_torch_nor_transformers():
    """A fresh Ray worker imports the module of each task it runs: the suffix-array, CREST and IVF-PQ tasks must load
    without the model stack, which costs every new worker seconds (the check fails if any of them reaches it at
    import; docs/datastores.md has the times)."""
    import subprocess
    import sys

    from specnb.datastores import crest_build, ivfpq_shards, rest

    tasks = [rest._sort, crest_build._count, crest_build._merge, crest_build._trees, ivfpq_shards._add_keys]
    script = (f"import sys\nfor name in {sorted({task.__module__ for task in tasks})!r}:\n    __import__(name)\n"
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT.parent, check=True)
    assert out.stdout.splitlines()[-1] == "[]"
