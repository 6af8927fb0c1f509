"""Notebook 02's study: DReSD Table 2's key transforms (:func:`projection_variants`), their MRR and replayed MAR
(:func:`projection_ablation`), and the paper's Fig. 5 / Table 2 numbers (:data:`CLAIMS`) judged by
:func:`compare_table2`. The stores themselves are :mod:`specnb.experiments.dresd`'s."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.metrics import bootstrap_interval, mean_interval
from ..datastores.ann import code_bits, code_error, self_ranks
from ..datastores.dense import DenseDatastore
from ..datastores.embed import Projection, fit_projection
from ..drafters.dense import DenseDrafter
from ..eval.replay import Reference, replay_many
from ..study.verdicts import MRR, SHARE, TIE, Expect
from .dresd import replay_methods_table, with_projection
from .grids import replay_rows
from .paired import difference, mean_versus, versus


@dataclass(frozen=True)
class Table2Claims:
    """DReSD's numbers on its key transform, judged by :func:`compare_table2` (notebook 02 states them in its
    verdicts and draws :attr:`mrr` beside ours)."""

    variance_64: tuple[float, float]  # §5.2, Fig. 5: variance held by 64 z-scored components (read off the figure)
    dims: tuple[int, int]  # §5.2: the hidden sizes of its models, which those 64 components are taken from
    mrr: dict[str, float]  # Table 2: MRR of the PCA transform at each number of dimensions
    mar: tuple[float, float]  # Table 2: MAR at 64 and at 128 dimensions

    @property
    def variance_text(self) -> str:
        """``30–40%``."""
        return f"{100 * self.variance_64[0]:.0f}–{100 * self.variance_64[1]:.0f}%"

    @property
    def mar_gain(self) -> float:
        """MAR at 128 dimensions over MAR at 64."""
        return self.mar[1] / self.mar[0]


CLAIMS = Table2Claims(variance_64=(0.30, 0.40), dims=(4096, 5120),
                      mrr={"32D": 0.855, "64D": 0.936, "96D": 0.942, "128D": 0.942}, mar=(22.5, 23.0))

JUDGED_IN_03 = "64D"
"""Notebook 02's transform whose MRR is notebook 03's code-OOD MRR (the same store, keys and index): judged there,
against Table 1, so that one measurement is counted once."""


def projection_variants(sample: np.ndarray, full: Projection, dims: tuple[int, ...] = (32, 64, 96, 128)
                        ) -> dict[str, Projection]:
    """DReSD Table 2's key transforms: ``full`` (z-score, PCA, L2) at each of ``dims`` (those it has), and at 64
    dimensions (or fewer) a fit without the z-score ("64D, no z-score") and one without the L2 norm."""
    grid = [d for d in dims if d <= full.components.shape[0]]
    base = min(64, max(grid))
    variants = {f"{d}D": full.with_dims(d) for d in grid}
    variants["64D, no z-score"] = fit_projection(sample, n_components=max(grid), dims=base, znorm=False)
    variants["64D, no L2"] = full.with_dims(base, l2=False)
    return variants


def projection_ablation(ood: DenseDatastore, ind: DenseDatastore, variants: dict[str, Projection],
                        references: list[Reference], hidden: list, n_queries: int = 2000, seed: int = 0
                        ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """DReSD Table 2 and its normalisation ablation. MRR searches every key transform through an index of the
    store's own kind and parameters (hnswlib or IVF-PQ: the search drafting uses) and, as its control, exactly over
    the same keys (below 1 only where keys coincide), so the gap between the two is the index's; the replay searches
    the ID store exactly, so MAR judges the transform alone (notebook 03 measures how close the index comes to exact
    search: recall@10 on real queries).

    Returns (table, ranks, rows):

    * table, one row per variant (index ``variant``): MRR of ``n_queries`` of ``ood``'s own keys under the
      variant (the store's index) with ``MRR_low`` / ``MRR_high`` (90% interval over the queries), ``MRR_exact``
      (the same queries searched exactly), ``code_bits`` (bits a dimension the index keeps of a key) and
      ``code_error`` (a stored key's mean distance from the key, over its length: :func:`code_error`), the
      variance its dimensions explain, and the replayed acceptance_rate (MAR), accepted_length and tokens_per_call of a
      10 x 10 DReSD drafter over the ID store ``ind`` keyed by the variant (exact search), with their 90%
      intervals over prompts;
    * ranks: float [n_queries] per variant (columns), the reciprocal rank of each query (to pair variants);
    * rows: the replay rows (method = variant, one per reference: :func:`specnb.experiments.grids.replay_rows`).
    """
    picked = np.sort(np.random.default_rng(seed).choice(ood.rows, min(n_queries, ood.rows), replace=False))
    table, ranks, frames = {}, {}, []
    for name, projection in variants.items():
        keyed = with_projection(ood, projection, ann=True)
        ranks[name] = self_ranks(keyed.index, keyed.keys, picked)
        exact = self_ranks(None, keyed.keys, picked)
        store = with_projection(ind, projection)
        frames.append(replay_rows(name, replay_many(lambda store=store: DenseDrafter(store, 10, 10), references,
                                                    hidden)))
        low, high = mean_interval(ranks[name])
        table[name] = {"MRR": float(ranks[name].mean()), "MRR_low": low, "MRR_high": high,
                       "MRR_exact": float(exact.mean()), "code_bits": code_bits(keyed.index),
                       "code_error": float(code_error(keyed.index, keyed.keys[picked]).mean()),
                       "explained_variance": float(projection.explained_variance_ratio[:projection.dims].sum())}
    rows = pd.concat(frames, ignore_index=True)
    replayed = replay_methods_table(rows).drop(columns=["calls", "nodes_per_call"])
    frame = pd.DataFrame.from_dict(table, orient="index").join(replayed).rename_axis("variant")
    return frame, pd.DataFrame(ranks), rows


def paired_with_base(ranks: pd.DataFrame, rows: pd.DataFrame, base: str = JUDGED_IN_03) -> pd.DataFrame:
    """Each transform's tokens per call, MAR and MRR over the ``base`` transform's, paired: over the replayed
    prompts (``rows``, :func:`projection_ablation`'s) for the first two, over the self-queries (``ranks``) for MRR,
    since one shared prompt or query moves both sides alike and unpaired intervals hide a gap smaller than the prompts'
    spread. Returns one row per (transform, measure), the transforms in ``ranks``' order without ``base``: columns
    ``row`` ("32D / 64D"), ``group`` (the measure), ``value``, ``low``, ``high`` (90%) and ``method`` ("dense"),
    as :func:`specnb.study.plots.paired_ratios` draws them."""
    out = []
    for variant in (v for v in ranks.columns if v != base):
        mrr = ranks[variant].mean() / ranks[base].mean()
        low, high = bootstrap_interval(lambda x, y, axis=-1: x.mean(axis) / y.mean(axis), ranks[variant], ranks[base])
        for group, (value, lo, hi) in (("tokens per call", versus(rows, variant, base, "tokens_per_call")),
                                        ("MAR", mean_versus(rows, variant, base, "acceptance_rate")),
                                        ("MRR", (mrr, low, high))):
            out.append({"row": f"{variant} / {base}", "group": group, "value": value, "low": lo, "high": hi,
                        "method": "dense"})
    return pd.DataFrame(out)


def compare_table2(report, cumulative: np.ndarray, same_share: int, table: pd.DataFrame, ranks: pd.DataFrame,
                   rows: pd.DataFrame, keys: int, index: str) -> None:
    """DReSD Fig. 5, Table 2 and §5.2 as :meth:`specnb.study.results.Results.compare` calls on
    :func:`projection_ablation`'s (table, ranks, rows), with :mod:`specnb.study.verdicts`' tolerances:

    * ``variance_64`` / ``variance_share``: the variance held by 64 components and by ``same_share`` (64/4096 of
      our dimensions) of the cumulative explained variance ``cumulative`` [components], against the paper's
      30-40% (``CLAIMS.variance_64``) ± :data:`~specnb.study.verdicts.SHARE` (read off Fig. 5); one PCA fit,
      judged as a point;
    * ``mrr_<dims>``: MRR through the store's index at each of ``CLAIMS.mrr``'s dimensions we have but
      :data:`JUDGED_IN_03`, against the paper's ± :data:`~specnb.study.verdicts.MRR`; ``keys``: the store's size,
      for the cause (the 64-d MRR and its interval go to ``ours["mrr_64D_interval"]``); ``index``: the index
      searched (``AnnIndex.label()``), named in the claims and, as ``ours["mrr_index"]``, in
      :func:`table2_markdown`;
    * ``drop_no_z`` / ``drop_no_l2``: the MRR lost without each normalisation, paired over the queries, must
      exceed :data:`~specnb.study.verdicts.TIE` (the direction of the paper's drop);
    * ``mar_128_64`` (with 128 dimensions): MAR at 128 over MAR at 64, paired over prompts, against the paper's
      ratio (``CLAIMS.mar``) with the published band."""
    d = len(cumulative)
    name = index.split(" (")[0]  # "hnswlib", "IVF-PQ": the claims' short name
    report.add(mrr_index=index)
    for key, k in (("variance_64", 64), ("variance_share", same_share)):
        report.compare(key, f"variance held by {k} z-scored components (one fit)", cumulative[min(k, d) - 1],
                       np.nan, np.nan, Expect.within(*CLAIMS.variance_64, SHARE),
                       "DReSD §5.2, Fig. 5 (64 of {}-{} dims)".format(*CLAIMS.dims),
                       fmt=".1%", cause="another model: the spectrum of a narrower model's states is another one",
                       internal=False, direction_only=False)
    if JUDGED_IN_03 in table.index:
        report.add(mrr_64D_interval=[table.loc[JUDGED_IN_03].MRR_low, table.loc[JUDGED_IN_03].MRR_high])
    report.add(**{column: table[column].to_dict() for column in ("MRR_exact", "code_bits", "code_error")})
    for dims, paper in CLAIMS.mrr.items():
        if dims in table.index and dims != JUDGED_IN_03:
            row = table.loc[dims]
            report.compare(f"mrr_{dims}", f"MRR at {dims[:-1]} dimensions ({name})", row.MRR, row.MRR_low,
                           row.MRR_high, Expect.near(paper, MRR), "DReSD Table 2", internal=False,
                           direction_only=False, cause=_mrr_cause(row, paper, keys, name),
                           evidence={"store keys": keys, "exact-search MRR": row.MRR_exact,
                                     "bits a dimension": row.code_bits, "stored key's error": row.code_error})
    for key, variant in (("drop_no_z", "64D, no z-score"), ("drop_no_l2", "64D, no L2")):
        report.compare(key, f"MRR lost {variant.replace('64D, no', 'without')} (paired over queries)",
                       *difference(ranks["64D"], ranks[variant]), Expect.above(0.0, TIE),
                       "DReSD §5.2 (MRR drops sharply without it)", internal=False, direction_only=True,
                       cause=f"a store of {keys:,} keys: every key stays its own nearest neighbour without it too",
                       evidence={"store keys": keys})
    if "128D" in table.index:
        ratio = mean_versus(rows, "128D", "64D", "acceptance_rate")
        report.compare("mar_128_64", "MAR at 128 dimensions over MAR at 64 (paired over prompts)", *ratio,
                       Expect.published([CLAIMS.mar_gain]),
                       "DReSD Table 2 (MAR {:.1f} at 64D, {:.1f} at 128D)".format(*CLAIMS.mar), internal=False,
                       direction_only=False,
                       cause=f"the interval over this handful of prompts spans {ratio[2] - ratio[1]:.2f}, wider than "
                             "the band", evidence={"interval width": ratio[2] - ratio[1]})
    report.takeaway("02_pca_cumulative_variance", "64 z-scored components hold {verdicts[variance_64][ours]:.1%} of "
                    f"the variance, against {CLAIMS.variance_text} of the paper's {CLAIMS.dims[0]}–{CLAIMS.dims[1]} "
                    "dimensions (Fig. 5): {verdicts[variance_64][verdict]}")
    report.takeaway("02_pca_dims_paired", "without the L2 normalisation MRR drops by {verdicts[drop_no_l2][ours]:.3f}, "
                    "without the z-score by {verdicts[drop_no_z][ours]:.3f} (paired over queries, a store of "
                    f"{keys:,} keys)")


def _mrr_cause(row: pd.Series, paper: float, keys: int, name: str) -> str:
    """Why one MRR of :func:`projection_ablation`'s table (``row``) sits off the paper's, from what the row holds:
    the same queries searched exactly (what the transform and the store's size give) and the precision the index
    keeps a key with (what its search adds)."""
    exact = f"exact search over the same {keys:,} keys reads MRR {row.MRR_exact:.3f}"
    kept = (f"{name} keeps {row.code_bits:.3g} bits a dimension of a key here (a stored key {row.code_error:.1%} of "
            "its length off)")
    if row.MRR > paper:
        return f"{exact}: in a store this size few keys sit near one another" + \
            (f"; {kept}" if row.code_error > 0 else "")
    return f"{kept}, where {exact}" if row.code_error > 0 else f"{name}'s search misses own keys: {exact}"


def table2_markdown(report) -> str:
    """The part of notebook 02's results template on MRR and MAR, naming only the comparisons
    :func:`compare_table2` recorded in ``report`` (its findings from ``ours[finding]``)."""
    text = ("MRR through {ours[mrr_index]} at 64 dimensions is {ours[mrr][64D]:.3f} ({ours[mrr_64D_interval][0]:.3f}–"
            "{ours[mrr_64D_interval][1]:.3f}): the store and keys notebook 03 judges against DReSD Table 1 "
            "(code-OOD), so it is judged there, once. Without the z-score it is {ours[mrr][64D, no z-score]:.3f}, "
            "without the L2 "
            "normalisation {ours[mrr][64D, no L2]:.3f}; against the tie band that counts as no drop, the paired "
            "losses are {ours[finding][drop_no_z]} (no z-score) and {ours[finding][drop_no_l2]} (no L2).")
    if report.ours["mrr_64D_interval"][0] >= 0.999:  # saturated: say what self-queries can still show
        shown = [name for key, name in (("drop_no_z", "the z-score"), ("drop_no_l2", "the L2 normalisation"))
                 if report.comparisons[key].verdict == "agrees"]
        tell = f"tell the transforms apart only by dropping {' or '.join(shown)}." if shown else \
            "cannot tell the transforms apart."
        text += (" The index returned almost every queried key first (the interval's lower end is at least 0.999), so "
                 "on a store this size self-queries " + tell)
    dims = [d for d in CLAIMS.mrr if d in report.ours["MRR_exact"]]
    few, many = dims[0], dims[-1]
    text += (f" Searched exactly, the same keys read MRR {{ours[MRR_exact][{few}]:.3f}} at {few[:-1]} dimensions and "
             f"{{ours[MRR_exact][{many}]:.3f}} at {many[:-1]} (below 1 only where keys coincide)")
    if any(report.ours["code_error"][d] > 0 for d in dims):  # a lossy index: the precision it keeps keys with
        text += (f"; the index keeps {{ours[code_bits][{few}]:.3g}} and {{ours[code_bits][{many}]:.3g}} bits a "
                 f"dimension of a key there (a stored key {{ours[code_error][{few}]:.1%}} and "
                 f"{{ours[code_error][{many}]:.1%}} of its length off)")
    text += "."
    if "mar_128_64" in report.comparisons:
        text += (" MAR at 128 dimensions over MAR at 64 is {ours[finding][mar_128_64]} against the paper's ratio "
                 f"(its MAR moves by {CLAIMS.mar_gain - 1:.0%}).")
    return text


def mrr_note(table: pd.DataFrame, n_queries: int, index: str) -> str:
    """One Markdown sentence on the MRR column of :func:`projection_ablation`'s ``table`` when some transforms read
    its ceiling ("" when none does: the figure draws it). MRR here is a self-query measure (each query is a stored
    key, which finds itself unless the transform or the index merges keys), so the transforms that read its ceiling
    (1.000 at three decimals) are named together, the others with their value and 90% interval.
    :func:`specnb.study.plots.near_constant` decides whether those at the ceiling differ at all. ``index``: the
    index searched, with its parameters (``AnnIndex.label``)."""
    from ..study.plots import near_constant

    top = table[table.MRR.round(3) >= 1.0]
    if top.empty:
        return ""
    rest = table.drop(top.index)
    said = ", ".join(f"{name} {r.MRR:.3f} [{r.MRR_low:.3f}, {r.MRR_high:.3f}]" for name, r in rest.iterrows())
    alike = "indistinguishable" if near_constant(top.MRR, top.MRR_low, top.MRR_high) else "yet distinguishable"
    return (f"*MRR through {index} ({n_queries:,} self-queries: each query is a stored key) reads 1.000 for "
            f"{len(top)} of {len(table)} transforms ({'; '.join(top.index)}: {alike})"
            + (f"; {said}" if len(rest) else "") + ". A self-query finds its own key under any transform that "
            "keeps the keys apart and normalised, so MRR cannot separate those; tokens per call of the 10 × 10 "
            "drafter can.*")
