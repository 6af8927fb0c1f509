"""pyproject.toml and environment.yml list the same dependencies (runtime + dev extras); the transformers range
excludes the release that removes what specnb's calls would warn about; a decoding step raises no FutureWarning.
Runs on every Python the package declares (3.10 reads TOML with tomli, a dev dependency there)."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement.split("#")[0]).lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_normalise(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    listed = {_normalise(line.strip()[2:]) for line in lines[start + 1:] if line.strip().startswith("- ")}
    assert listed == wanted, f"only in environment.yml: {listed - wanted}; only in pyproject: {wanted - listed}"


def test_nodeps_requirements_are_pinned():
    lines = [ln for ln in (ROOT / "requirements-nodeps.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines and all("==" in ln for ln in lines)


def test_the_package_declares_a_python_these_tests_run_on():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    dev = [_normalise(r) for r in project["optional-dependencies"]["dev"]]
    assert "tomli>=2.0;python_version<'3.11'" in dev  # what this file imports on 3.10


def test_transformers_is_kept_below_the_release_that_removes_past_key_values():
    """transformers 5.40 removes the decoders' ``past_key_values`` argument: the range stops before it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [spec] = [_normalise(r) for r in project["dependencies"] if r.startswith("transformers")]
    assert spec == "transformers>=5.0,<5.40"


@pytest.mark.parametrize("path", ["kernels", "torch", "hugging-face"])
def test_a_decoding_step_raises_no_future_warning(path: str) -> None:
    """Greedy speculative decoding (tree and batch verification, a Gemma-3 context past its window, a self-draft
    with its own cache) on specnb's decoder with its kernels, with PyTorch's ops (what runs where the kernels
    cannot) and on Hugging Face's own decoder (:func:`specnb.model.models.stock`: what runs other architectures)
    raises no FutureWarning: nothing it calls is deprecated for removal."""
    import contextlib

    from conftest import ARCHS, tiny, without_kernels

    from specnb import generate
    from specnb.drafters.context import ContextNgramDrafter
    from specnb.eval.methods import make_drafter
    from specnb.model.models import stock, tiny_model

    for arch in ARCHS:
        prompt = [256, *range(40, 46)] * 3
        with contextlib.ExitStack() as stack:
            if path == "torch":
                stack.enter_context(without_kernels())
            target = {"torch": tiny_model, "hugging-face": lambda arch: stock(tiny(arch))}.get(path, tiny)(arch)
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("error", FutureWarning)
            for verify in ("tree", "batch"):
                generate(target, prompt, ContextNgramDrafter(k=3, w=4), max_new_tokens=12, verify=verify)
            generate(target, prompt, make_drafter("mcsd", target, {"draft": "self:2", "draft_shape": "2x2"}),
                     max_new_tokens=8)
