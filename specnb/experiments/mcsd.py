"""Draft-model SD and MCSD (notebook 07): each comparison decodes one prompt set at one temperature with several
draft shapes and acceptance schemes, AR alongside (:func:`specnb.experiments.run`), and MCSD's Table 2 picks.

Every function returns :func:`specnb.experiments.summarize` rows (one per variant) renamed for MCSD: ``variant``
(``AR``, a draft shape such as ``4x2x1``, or a label), ``speedup`` (vs AR), ``acceptance_rate`` = the paper's
step acceptance rate (accepted / (accepted + rejected) draft steps), ``dataset`` and ``temperature``.
"""

from __future__ import annotations

import math

import pandas as pd

from ..accept import Scheme
from ..drafters.draft_model import DraftModelDrafter
from ..models import LoadedModel
from ..prompts import Prompt
from ..verify import VerifyMode
from .grids import replay_table
from .references import greedy_references
from .runner import Variant, run, summarize


class Study:
    """One target, its draft model and the prompt sets of notebook 07, decoding ``max_new_tokens`` per prompt."""

    def __init__(self, target: LoadedModel, draft: LoadedModel, prompts: dict[str, list[Prompt]],
                 max_new_tokens: int):
        self.target, self.draft, self.prompts, self.max_new_tokens = target, draft, prompts, max_new_tokens

    def variant(self, shape: str | tuple[int, ...], temperature: float, scheme: Scheme = "mcss-wor",
                verify: VerifyMode = "tree") -> Variant:
        """A draft-model drafter of ``shape`` sampling at the target's temperature, with its verification."""
        return Variant(DraftModelDrafter(self.draft, shape, self.target.vocab_size, scheme=scheme,
                                         temperature=temperature), verify)

    def compare(self, variants: dict[str, Variant], dataset: str, temperature: float) -> pd.DataFrame:
        """Decode ``dataset`` with every variant (``AR`` is the reference; one short warm-up each)."""
        rows = run(self.target, self.prompts[dataset], variants, temperature=temperature,
                   max_new_tokens=self.max_new_tokens, warmup=8, reference="AR", progress=False)
        return summarize(rows, baseline="AR").rename(columns={"method": "variant", "speedup_vs_AR": "speedup"}).assign(
            acceptance_rate=lambda t: t.step_acceptance_rate, dataset=dataset, temperature=temperature)

    def replay(self, shapes: list[str], dataset: str) -> pd.DataFrame:
        """Greedy (T = 0) acceptance of draft-model drafters of ``shapes`` by replay over the target's cached greedy
        outputs of ``dataset`` (exact for greedy decoding, no target calls; no times: speedup is NaN)."""
        references = greedy_references(self.target, self.prompts[dataset], self.max_new_tokens)
        makers = {s: (lambda s=s: DraftModelDrafter(self.draft, s, self.target.vocab_size)) for s in shapes}
        out = summarize(replay_table(makers, references), baseline="").drop(columns="speedup_vs_")
        return out.rename(columns={"method": "variant"}).assign(
            speedup=math.nan, acceptance_rate=lambda t: t.step_acceptance_rate, dataset=dataset, temperature=0.0)

    def acceptance_vs_k(self, ks: list[int]) -> pd.DataFrame:
        """MCSD Fig. 3: one draft level of k candidates (drawn without replacement) on every set, at T = 0 by
        greedy replay (the draft's top k verified by greedy matching is deterministic) and at T = 1 decoded;
        adds the integer column ``k``."""
        out = pd.concat([self.replay([f"{k}" for k in ks], dataset) for dataset in self.prompts]
                        + [self.compare({f"{k}": self.variant((k,), 1.0) for k in ks}, dataset, 1.0)
                           for dataset in self.prompts], ignore_index=True)
        return out.assign(k=out.variant.astype(int))

    def budget_configurations(self, shapes: dict[str, list[str]], dataset: str) -> pd.DataFrame:
        """MCSD Fig. 4 at T = 1: ``shapes`` {"decreasing": [...], "increasing": [...]} with AR; adds ``order`` and
        ``budget`` (leaves of the shape; 0 for AR)."""
        variants = {"AR": Variant(None)} | {s: self.variant(s, 1.0) for group in shapes.values() for s in group}
        out = self.compare(variants, dataset, 1.0)
        order = {s: name for name, group in shapes.items() for s in group}
        leaves = {s: int(pd.Series(s.split("x")).astype(int).prod()) for s in order}
        return out.assign(order=out.variant.map(order), budget=out.variant.map(leaves).fillna(0).astype(int))

    def ablation(self, shape: str, dataset: str) -> pd.DataFrame:
        """MCSD Table 4 at T = 1: MCSS without / with replacement, naive MCNS, and MCSS without replacement
        verified in batch rows instead of tree attention, same shape, AR alongside."""
        return self.compare({"AR": Variant(None),
                             "MCSS w/o replacement": self.variant(shape, 1.0, "mcss-wor"),
                             "MCSS w/ replacement": self.variant(shape, 1.0, "mcss"),
                             "MCNS": self.variant(shape, 1.0, "mcns"),
                             "MCSS w/o replacement, batch": self.variant(shape, 1.0, "mcss-wor", verify="batch")},
                            dataset, 1.0)

    def sd_vs_mcsd(self, depths: list[int], trees: list[str], temperatures: tuple[float, ...]
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """MCSD Table 2: (every variant's row per set and temperature: AR, vanilla SD chains of ``depths``,
        MCSD ``trees``; the picks of :func:`table2_rows` per set and temperature)."""
        results = []
        for dataset in self.prompts:
            for t in temperatures:
                chains = {"x".join(["1"] * d): self.variant("x".join(["1"] * d), t, "mcss") for d in depths}
                results.append(self.compare({"AR": Variant(None)} | chains | {s: self.variant(s, t) for s in trees},
                                            dataset, t))
        every = pd.concat(results, ignore_index=True)
        picks = every.groupby(["dataset", "temperature"]).apply(table2_rows).reset_index(level=[0, 1])
        return every, picks


def table2_rows(group: pd.DataFrame) -> pd.DataFrame:
    """group: :func:`specnb.experiments.summarize` rows of one (dataset, temperature) with columns ``variant``
    (``AR``, chains ``1x1x...``, trees such as ``4x2x1``), speedup, tokens_per_call, acceptance_rate and
    draft_share. Returns one row per pick (method, config, speedup, block efficiency, acceptance rate, draft
    share): AR, vanilla SD at the depth of the best MCSD tree, SD at its best depth, and the best MCSD tree;
    "SD (same depth)" is left out when no chain has the best tree's depth."""
    depth = group.variant.str.count("x") + 1
    chains = group[(group.variant != "AR") & group.variant.str.fullmatch(r"1(x1)*")]
    trees = group[(group.variant != "AR") & ~group.variant.isin(chains.variant)]
    best_tree = trees.loc[trees.speedup.idxmax()]
    same = chains[depth[chains.index] == depth[best_tree.name]]
    picks = {"Baseline (AR)": group[group.variant == "AR"].iloc[0],
             "SD (same depth)": same.iloc[0] if len(same) else None,
             "SD (best depth)": chains.loc[chains.speedup.idxmax()], "MCSD": best_tree}
    return pd.DataFrame([{"method": m, "config": r.variant, "speedup": r.speedup,
                          "block_efficiency": r.tokens_per_call, "acceptance_rate": r.acceptance_rate,
                          "draft_share": r.draft_share} for m, r in picks.items() if r is not None])
