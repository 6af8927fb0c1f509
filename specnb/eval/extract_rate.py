"""How fast a target extracts a dense store's hidden states: rows (corpus positions) per second.

A dense store's extraction (:mod:`specnb.datastores.embed`) dominates its cost, so a paper-scale store's
worker-hours are its rows over this rate (docs/datastores.md). The rate is timed on a synthetic corpus of random
tokens through the extraction's own path (its layout of segments and batches, :func:`embed.run_batch`: the
decoder's forward pass, the copies to and from the device, float16 rows), so it counts everything but writing
the rows. ``random:SHAPE`` models have a real architecture's shapes and random weights: a machine that cannot read
the embedded weights (the GPU machines this project is lent) still gives the rate of that shape::

    specnb extract-rate --model random:gemma-3-270m --model random:qwen2.5-1.5b --device cuda \\
        --batch-tokens 4096 32768 --out data/extract_rate_gpu.csv
"""

from __future__ import annotations

import time

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core.roofline import device_name
from ..datastores.corpus import TokenCorpus
from ..datastores.embed import batches, check_sizes, plan, run_batch, segments
from ..model.device import synchronize
from ..model.models import LoadedModel, byte_tokenizer, load_model
from .timing import random_model

COLUMNS = ["model", "dtype", "weights", "device", "device_name", "torch", "seq_len", "overlap", "batch_tokens",
           "batches", "rows", "seconds", "rows_per_s", "padded_tokens_per_s"]


def synthetic_corpus(tokens: int, doc_tokens: int, vocab_size: int, seed: int = 0) -> TokenCorpus:
    """``tokens`` random token ids in [0, vocab_size) as documents of ``doc_tokens`` (the last one shorter)."""
    if tokens < 2 or doc_tokens < 2:
        raise ValueError(f"need at least 2 tokens and 2 tokens a document; got {tokens} and {doc_tokens}")
    ids = np.random.default_rng(seed).integers(0, vocab_size, tokens, dtype=np.int32)
    starts = np.unique(np.append(np.arange(0, tokens, doc_tokens), tokens)).astype(np.int64)
    return TokenCorpus(ids, starts, {"name": f"random-{tokens}"})


def check_batches(corpus: TokenCorpus, seq_len: int, overlap: int, batch_tokens: int) -> None:
    """ValueError (one line) unless ``corpus`` fills at least two batches (one is untimed): checked from the
    layout alone, before a model loads."""
    check_sizes(seq_len, overlap, batch_tokens)
    filled = len(batches(segments(corpus.doc_starts, seq_len, overlap), batch_tokens))
    if filled < 2:
        raise ValueError(f"the corpus fills {filled} batch of {batch_tokens} tokens: need at least 2 (raise --tokens)")


def measure(target: LoadedModel, corpus: TokenCorpus, *, seq_len: int = 512, overlap: int = 64,
            batch_tokens: int = 4096, progress: bool = True) -> dict[str, object]:
    """One row of :data:`COLUMNS`: ``corpus``'s extraction by ``target`` timed batch after batch, after one
    untimed batch (kernel choice and allocation on the first call of a shape); the device is synchronised before
    the clock starts and stops. ``rows_per_s`` counts the rows a store keeps; ``padded_tokens_per_s`` every token
    the model ran (overlap context and padding included)."""
    check_batches(corpus, seq_len, overlap, batch_tokens)
    layout = plan(target, corpus, seq_len=seq_len, overlap=overlap, batch_tokens=batch_tokens)
    device = target.device
    tokens = np.asarray(corpus.tokens)
    run_batch(target, tokens, layout.work[0])
    synchronize(device)
    rows = padded = 0
    start = time.perf_counter()
    for batch in tqdm(layout.work[1:], desc=f"{target.name}, {batch_tokens} tokens a batch", unit="batch",
                      disable=not progress):
        rows += sum(states.shape[0] for _, states in run_batch(target, tokens, batch))
        padded += len(batch) * batch[0].length
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"model": target.name, "dtype": layout.params["dtype"], "weights": target.weights, "device": device.type,
            "device_name": device_name(device), "torch": torch.__version__, "seq_len": seq_len, "overlap": overlap,
            "batch_tokens": batch_tokens, "batches": len(layout.work) - 1, "rows": rows, "seconds": seconds,
            "rows_per_s": rows / seconds, "padded_tokens_per_s": padded / seconds}


def load_target(name: str, dtype: str, device: str, weights: str = "auto") -> LoadedModel:
    """An installed model, or ``random:SHAPE`` (:func:`specnb.eval.timing.random_model`: dense weights) with a
    byte tokenizer."""
    if name.startswith("random:"):
        model = random_model(name.removeprefix("random:"), dtype, device)
        return LoadedModel.of(model, byte_tokenizer(), name)
    return load_model(name, dtype=dtype, device=device, weights=weights)
