"""The learning-free batched drafts of N-Grammys (notebook 06; the tables also serve notebook 08): the model's
unigram and bigram tables restricted to what the prompts need, top-k curves, the mixed strategy's ablation, and
the timed comparison of the mixed strategy's shapes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..datastores.ngram_tables import BigramTable, bigram_table, default_restriction
from ..drafters.context import ContextNgramDrafter
from ..drafters.mixed import AdaptiveShapeDrafter, MixedDrafter, accepted_rank, accepted_strategy
from ..drafters.model_ngram import BigramDrafter, UnigramDrafter
from ..models import LoadedModel
from ..prompts import Prompt
from ..replay import Reference, replay_many
from .runner import run, summarize


def restricted_bigram_table(target: LoadedModel, references: dict[str, list[Reference]]) -> tuple[BigramTable, str]:
    """(the bigram table, how its rows are chosen). Vocabularies above 65,536 (hours of target calls for every
    row on a CPU) get the rows of the HumanEval and MT-Bench prompt tokens plus the tokens of ``references``'
    outputs (with their top-1 chains): on these prompts exactly the drafts of the full table, since every root
    the decoder meets has its row. The table is cached and grows on demand."""
    restriction, described = default_restriction(target)
    if restriction is not None:
        outputs = np.concatenate([out.numpy() for refs in references.values() for _, out in refs])
        restriction, described = np.union1d(restriction, outputs), described + " + the reference outputs"
    table = bigram_table(target, restriction)
    return table, f"bigram rows: {table.tokens.shape[0]:,} of {target.vocab_size:,} tokens ({described})"


def topk_curves(references: dict[str, list[Reference]], unigram: np.ndarray, table: BigramTable,
                ks: list[int]) -> pd.DataFrame:
    """N-Grammys Fig. 2 by greedy replay: one row per (set, strategy, k) with the mean over prompts of tokens per
    call, for the unigram (top-k of ``unigram``), the bigram (w = 1) and the extended bigram (w = 2, 3)."""
    strategies = {"unigram": lambda k: UnigramDrafter(unigram, k)}
    strategies.update({f"bigram (w={w})" if w == 1 else f"extended bigram (w={w})":
                       (lambda k, w=w: BigramDrafter(table, k, w)) for w in (1, 2, 3)})
    return pd.DataFrame([{"set": name, "strategy": label, "k": k, "tokens_per_call": np.mean(
        [r.tokens_per_call for r in replay_many(lambda make=make, k=k: make(k), refs)])}
        for name, refs in references.items() for label, make in strategies.items() for k in ks])


def mixed_ablation(table: BigramTable, references: dict[str, list[Reference]], k: int = 10, w: int = 10
                   ) -> pd.DataFrame:
    """N-Grammys Fig. 4: one row per replayed call of the mixed strategy at (k, w): set, accepted, strategy
    ("context" / "bigram" / "none": whose row was accepted), rank (of that row within its strategy),
    context_rows and bigram_rows (how many of the k rows each strategy filled)."""
    return pd.DataFrame([{"set": name, "accepted": c.accepted, "strategy": accepted_strategy(c) or "none",
                          "rank": accepted_rank(c), "context_rows": c.info["context_rows"],
                          "bigram_rows": c.info["bigram_rows"]}
                         for name, refs in references.items()
                         for stats in replay_many(lambda: MixedDrafter(table, k, w), refs) for c in stats.calls])


def timed_mixed(target: LoadedModel, sets: dict[str, list[Prompt]], table: BigramTable,
                best: dict[str, tuple[int, int]], cost, max_new_tokens: int) -> pd.DataFrame:
    """N-Grammys Table 1 timed, plus the adaptive shape: AR, prompt lookup (k = 1, w = 10, q = 3..1), the mixed
    strategy at (10, 10) and at the set's ``best`` estimated shape, and ``mixed-adaptive`` (learning across
    prompts) decoded for real per set; :func:`specnb.experiments.summarize` rows with ``set``."""
    out = []
    for name, prompts in sets.items():
        methods = {"ar": None, "pld": ContextNgramDrafter(k=1, w=10, max_ngram=3),
                   "mixed (10,10)": MixedDrafter(table, 10, 10), "mixed (k*, w*)": MixedDrafter(table, *best[name]),
                   "mixed-adaptive": AdaptiveShapeDrafter(MixedDrafter(table, 1, 1), cost)}
        rows = run(target, prompts, methods, max_new_tokens=max_new_tokens, warmup=8, progress=False)
        out.append(summarize(rows).assign(set=name))
    return pd.concat(out, ignore_index=True)
