"""What ``weights="auto"`` means on this machine: the GGUF blocks or the dense bf16 checkpoint, by measurement.

Speculation pays as much as verifying several tokens costs less than as many single steps, so a path that is
faster at one token but slower at 16 makes every speculative method slower. Which path wins is not a property
of the CPU class: VMs of one class differ (an AVX512 Zen 4 and an AVX512 Xeon disagreed on it). So the choice is
measured once per model, dtype, machine and kernel build: :func:`cost_table` times one call of 1, 4 and 16 tokens at
a 256-token context over both paths, interleaved in one process, and caches the medians; :func:`choose` takes the
blocks only where they are no slower than bf16 at every one of those calls.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd
import torch

from ..atomic import write_csv
from ..paths import artifact_path, safe_name

if TYPE_CHECKING:
    from .models import LoadedModel

TOKENS = (1, 4, 16)  # tokens per call: one decoding step, and the verification calls speculation makes
CONTEXT = 256
REPEATS = 5


def blocks_route() -> str:
    """The GGUF route this CPU runs fastest: ``gguf-int8`` where the int8 route runs (AVX512-VNNI, or AVX2 with
    F16C), else ``gguf``."""
    from .kernels.quant import int8_supported

    return "gguf-int8" if int8_supported() else "gguf"


def choose(table: pd.DataFrame, blocks: str) -> str:
    """``blocks`` if its median seconds are no more than bf16's at every ``tokens`` of ``table`` (columns
    ``weights``, ``tokens``, ``seconds``), else ``"bf16"``."""
    seconds = table.pivot_table(index="tokens", columns="weights", values="seconds")
    if blocks not in seconds or "bf16" not in seconds or seconds[[blocks, "bf16"]].isna().any().any():
        raise ValueError(f"the weights table has no complete timings of {blocks} and bf16")
    return blocks if bool((seconds[blocks] <= seconds["bf16"]).all()) else "bf16"


def table_path(name: str, dtype: torch.dtype, blocks: str):
    """Where the table of ``name`` in ``dtype`` against ``blocks`` is cached: keyed by the CPU, threads and kernel
    build as well (another machine or build is measured again)."""
    from . import kernels
    from .kernels.cpu import cpu_id

    host = f"{cpu_id()}-{torch.get_num_threads()}threads".replace(" ", "_").replace("/", "_")
    dtype_name = str(dtype).removeprefix("torch.")
    return artifact_path("roofline", f"weights-{safe_name(name)}-{dtype_name}-{blocks}-{host}-{kernels.digest()}.csv")


def measure(load: Callable[[str], LoadedModel], blocks: str, repeats: int = REPEATS) -> pd.DataFrame:
    """Median seconds of one call of each of :data:`TOKENS` after a :data:`CONTEXT`-token prefill, over ``bf16`` and
    ``blocks`` (``load(weights)``: the model over those weights): both models loaded side by side, every call of
    one paired with the same call of the other in alternating order. Columns ``weights``, ``tokens``,
    ``seconds``, ``context``, ``repeats``."""
    from .forward import forward
    from .kv_cache import GrowingCache

    generator = torch.Generator().manual_seed(0)
    models, caches = {}, {}
    for weights in ("bf16", blocks):
        models[weights], caches[weights] = load(weights), GrowingCache()
    vocab = models["bf16"].vocab_size
    prompt = torch.randint(vocab, (1, CONTEXT), generator=generator)
    calls = {t: torch.randint(vocab, (1, t), generator=generator) for t in TOKENS}
    with torch.inference_mode():
        for weights, model in models.items():
            forward(model, prompt, last_only=True, cache=caches[weights])

        def call(weights: str, tokens: int) -> float:
            caches[weights].keep(CONTEXT, torch.empty(0, dtype=torch.long))
            start = time.perf_counter()
            forward(models[weights], calls[tokens], cache=caches[weights])
            return time.perf_counter() - start

        times: dict[tuple[str, int], list[float]] = {(w, t): [] for w in models for t in TOKENS}
        for repeat in range(repeats + 1):  # the first pass warms up
            order = list(models) if repeat % 2 else list(models)[::-1]
            for tokens in TOKENS:
                for weights in order:
                    seconds = call(weights, tokens)
                    if repeat:
                        times[weights, tokens].append(seconds)
    return pd.DataFrame([{"weights": w, "tokens": t, "seconds": statistics.median(s), "context": CONTEXT,
                          "repeats": repeats} for (w, t), s in times.items()])


def cost_table(name: str, dtype: torch.dtype, blocks: str, load: Callable[[str], LoadedModel]) -> pd.DataFrame:
    """:func:`measure`'s table for model ``name`` in ``dtype`` (``load(weights)`` loads it), measured on first use
    (a line on stderr says so) and cached (:func:`table_path`)."""
    path = table_path(name, dtype, blocks)
    if path.exists():
        return pd.read_csv(path)
    print(f"specnb: timing {name} over bf16 and {blocks} once to choose weights='auto' (cached in {path})",
          file=sys.stderr)
    frame = measure(load, blocks)
    write_csv(path, frame)
    return frame
