"""Hash the greedy tokens of ``ar``, ``pld`` and ``auto`` on every path a target runs on, to compare two trees.

For each path (``hf``: Hugging Face's modules over the dense bf16 checkpoint; ``bf16``: specnb's decoder over
it; ``gguf``: over the GGUF file's blocks; ``gguf-int8``: those blocks times int8 activations) and each method,
the new tokens of 4 HumanEval prompts x 64 tokens (greedy, Gemma-3-270M) are hashed into one line
``<path> <method> <sha256[:16]>``. Run it on two trees (``PYTHONPATH=<tree> python scripts/same_tokens.py``) and
compare the lines: a refactor that keeps every path's arithmetic prints the same hashes.

``auto`` prices its members on a fixed synthetic roofline table (written to a temporary file), not on this
machine's measured one: its drafts then depend only on the tokens, and no timing runs. A few CPU minutes.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from specnb.core.datasets import humaneval
from specnb.core.generate import generate
from specnb.eval.methods import make_drafter
from specnb.model.models import LoadedModel, load_model

MODEL, PROMPTS, NEW_TOKENS = "gemma-3-270m", 4, 64
PATHS = {"hf": "bf16", "bf16": "bf16", "gguf": "gguf", "gguf-int8": "gguf-int8"}  # path -> weights it loads
METHODS = ("ar", "pld", "auto")


def fixed_roofline(path: Path) -> Path:
    """A one-row roofline table at contexts 0 and 4096: 10 ms per call plus 0.5 ms per verified token."""
    rows = [dict(context=c, k=1, w=w, seconds=0.010 + 0.0005 * (w + 1)) for c in (0, 4096) for w in range(64)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@contextlib.contextmanager
def on_path(target: LoadedModel, path: str) -> Iterator[LoadedModel]:
    """``target`` as path ``path`` runs it. ``hf``: ``specnb.model.models.stock(target)``, or on trees before the
    explicit backend (9dad721) ``specnb.model.decoder.stock``, a context manager over the Hugging Face model."""
    if path != "hf":
        yield target
        return
    from specnb.model import models

    if hasattr(models, "stock"):
        yield models.stock(target)
        return
    from specnb.model.decoder import stock

    with stock(target.model):
        yield target


def main() -> None:
    prompts = humaneval(PROMPTS)
    with tempfile.TemporaryDirectory() as tmp:
        roofline = str(fixed_roofline(Path(tmp) / "roofline.csv"))
        for path, weights in PATHS.items():
            with on_path(load_model(MODEL, weights=weights), path) as target:
                for method in METHODS:
                    digest = hashlib.sha256()
                    for prompt in prompts:
                        drafter = make_drafter(method, target, {"roofline": roofline} if method == "auto" else None)
                        out = generate(target, prompt, drafter, max_new_tokens=NEW_TOKENS, stop_at_eos=False)
                        digest.update(repr(out.tokens).encode())
                    print(f"{path} {method} {digest.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
