"""specnb: lossless speculative decoding — one loop, many drafters — for research notebooks."""

import os

# OpenMP threads that finish a parallel region spin for a while before sleeping (GNU libgomp: 300k spins by
# default). On a 2-core machine with one other busy process, a spinning thread steals the core its sibling
# needs, and a decoding step (hundreds of short parallel regions) ran 2.6x slower; spinning briefly keeps the
# quiet speed within noise and the slow-down at ~1.4x (measured on Gemma-3-270M, bf16). It only takes effect
# when specnb is imported before torch; an explicit GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

from .decode import Generation, generate  # noqa: E402
from .draft import Draft  # noqa: E402
from .models import LoadedModel, load_model, tiny_model  # noqa: E402
from .prompts import Prompt  # noqa: E402

__all__ = ["Draft", "Generation", "LoadedModel", "Prompt", "generate", "load_model", "tiny_model"]
