"""Importing specnb changes no process-wide setting: neither the environment (``GOMP_SPINCOUNT``) nor matplotlib's
rcParams. The setup a run wants is done by calls (``specnb.openmp_spin_briefly()``, ``plots.use_style()``) that the
command, the notebooks and the conftest make. Each check runs in a fresh interpreter, where nothing is imported yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHANGES = """
import json, os, sys
import matplotlib
env, rc = dict(os.environ), {key: repr(value) for key, value in matplotlib.rcParams.items()}
for statement in sys.argv[1:]:
    exec(statement)
import matplotlib
print(json.dumps({"env": sorted(k for k in {*env, *os.environ} if env.get(k) != os.environ.get(k)),
                  "rc": sorted(k for k, v in matplotlib.rcParams.items() if rc.get(k) != repr(v))}))
"""


def changes(*statements: str) -> dict[str, list[str]]:
    """The environment variables and rcParams that running ``statements`` in a fresh interpreter changed (one
    without the variables specnb would set, so that a setdefault shows)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "MPLBACKEND")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", CHANGES, *statements], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_specnb_changes_no_global_setting():
    assert changes("import specnb", "import specnb.cli", "import specnb.study.plots") == {"env": [], "rc": []}


def test_the_setup_calls_are_what_changes_them():
    """The check can fail: the two setup calls change exactly what importing used to."""
    found = changes("import specnb, specnb.study.plots", "specnb.openmp_spin_briefly()",
                    "specnb.study.plots.use_style()")
    assert found["env"] == ["GOMP_SPINCOUNT"]
    assert "figure.constrained_layout.use" in found["rc"] and "axes.grid" in found["rc"]


def test_the_command_sets_the_spin_count_before_torch_loads():
    """``specnb`` (its main) sets it first; an explicit OMP_WAIT_POLICY or GOMP_SPINCOUNT wins."""
    code = ("from specnb.cli import main; main(['models', 'list']); import os, sys; "
            "print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.stdout.splitlines()[-1] == "3000 False"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "OMP_WAIT_POLICY": "passive"})
    assert run.stdout.splitlines()[-1] == "None False"


def test_every_notebook_sets_up_before_it_imports_torch():
    """Each notebook's first code cell after its parameters is the setup cell, and nothing before it imports."""
    from specnb.study.notebooks import NOTEBOOKS, SETUP_CELL

    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert paths
    for path in paths:
        code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        first = next(i for i, c in enumerate(code) if "parameters" in c["metadata"].get("tags", []))
        assert "".join(code[first + 1]["source"]) == SETUP_CELL, path.name
        assert not any("import" in "".join(c["source"]) for c in code[:first + 1]), path.name
