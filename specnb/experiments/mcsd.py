"""MCSD's Table 2 picks (notebook 07): from one setting's summary rows, AR, vanilla SD at the depth of the best
MCSD tree, SD at its best depth, and the best MCSD tree."""

from __future__ import annotations

import pandas as pd


def table2_rows(group: pd.DataFrame) -> pd.DataFrame:
    """group: :func:`specnb.experiments.summarize` rows of one (dataset, temperature) with columns ``variant``
    (``AR``, chains ``1x1x...``, trees such as ``4x2x1``), speedup, tokens_per_call, acceptance_rate and
    draft_share. Returns one row per pick (method, config, speedup, block efficiency, acceptance rate, draft
    share); "SD (same depth)" is left out when no chain has the best tree's depth."""
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
