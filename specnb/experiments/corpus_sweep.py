"""DReSD vs REST over corpus size, on the same documents (notebook 03; it reconciles notebooks 03 and 04).

Notebook 03 compares DReSD with REST on its dense store's corpus (the first documents of the stdlib, sized by
the profile); notebook 04 studies REST on the whole stdlib, so their REST numbers differ by the corpus alone.
Here both methods are built on nested random document samples of the dense store's corpus, the largest
being the store itself (a sample's dense store reuses the store's hidden states:
:func:`specnb.datastores.dense.subset_datastore`), and REST also on the whole stdlib, notebook 04's corpus, of
which the dense store's documents are the first (DReSD there would need hours of extraction on a CPU). Every
store is built once into the cache. Acceptance comes from greedy replay; the predicted speedup prices every
replayed call with the roofline table (a tree-attention call of its drafted nodes:
:func:`specnb.eval.replay.priced_seconds`). Every comparison pairs the two methods reference by
reference (:func:`sweep_summary`), so a notebook judges "faster" or "a tie" from a 90% interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from torch import Tensor

from ..core.drafter import Drafter
from ..core.metrics import ratio_interval
from ..datastores.corpus import build_corpus
from ..datastores.dense import DenseDatastore, subset_datastore
from ..datastores.rest import RestIndex, disk_bytes
from ..drafters.dense import DenseDrafter
from ..drafters.rest import RestDrafter
from ..eval.replay import Reference, ar_priced_seconds, priced_seconds, replay_many
from ..eval.runner import summarize
from ..model.models import LoadedModel
from ..study.profiles import Profile
from .dresd import build_config, datastores, store_corpus
from .grids import replay_rows
from .paired import versus
from .study_folder import rest_store, study_folder

DRESD_SHAPE = (10, 6)  # DReSD's controlled comparison with REST's trees (about as many nodes: notebook 03)


@dataclass
class SweepPoint:
    """One corpus: its name, token count and stores (``dense`` None: REST only)."""

    corpus: str
    tokens: int
    rest: RestIndex
    dense: DenseDatastore | None


def sweep_points(target: LoadedModel, profile: Profile, progress: bool = False) -> list[SweepPoint]:
    """The corpora of the sweep for ``target`` at ``profile``'s size (its ``corpus_sweep`` record: nested document
    samples of the dense store's corpus, REST on the whole corpus or not), smallest first, their stores built once.
    The code corpus is ``profile.corpus``: ``code`` (the stdlib) or a folder / JSONL of the user's."""
    sizes = profile.corpus_sweep
    parent = datastores(target, profile, kinds=("code-OOD",), progress=progress)["code-OOD"]
    stored = store_corpus(parent)
    points = []
    for fraction in sizes.fractions:
        if fraction == 1.0:
            docs, dense, name = np.arange(stored.num_docs), parent, f"rest-{parent.path.name}"  # the study's REST
        else:
            docs = stored.sample_docs(fraction, seed=0)
            name = f"rest-f{fraction}-{parent.path.name}"
            dense = subset_datastore(parent, docs, study_folder() / f"dense-f{fraction}-{parent.path.name}",
                                     build_config(profile), progress=progress)
        sample = stored.select(docs)
        points.append(SweepPoint(f"{fraction:.0%} of the dense store's", sample.num_tokens,
                                 rest_store(sample, study_folder() / name, progress), dense))
    if sizes.whole_stdlib:
        every = build_corpus(profile.corpus, target, progress=progress)  # cached; notebook 04's code corpus
        whole = rest_store(every, study_folder() / f"rest-{every.meta['name']}", progress)
        name = "whole stdlib" if profile.corpus == "code" else "whole corpus"
        points.append(SweepPoint(name, every.num_tokens, whole, None))
    return points


def corpus_sweep_rows(points: list[SweepPoint], references: list[Reference], hidden: list[Tensor], cost
                      ) -> pd.DataFrame:
    """Replay REST and DReSD (:data:`DRESD_SHAPE`) on every corpus over the same greedy references, one row per
    (corpus, method, reference).

    hidden: the teacher-forced states of the references (DReSD's queries). Columns: those of
    :func:`specnb.experiments.grids.replay_rows` (method "REST" / "DReSD 10x6", prompt_id = the reference's
    index, calls, accepted, draft_depth, drafted_nodes, acceptance_rate, ...), corpus, corpus_tokens,
    storage_bytes (what drafting reads from disk), est_seconds (the replayed calls priced with the roofline
    ``cost``: :func:`specnb.eval.replay.priced_seconds`) and ar_seconds (the same reference decoded
    AR, priced alike)."""
    ar = [ar_priced_seconds([reference], cost) for reference in references]
    frames = []
    for point in points:
        methods: dict[str, tuple[Callable[[], Drafter], int, list[Tensor] | None]] = {
            "REST": (lambda p=point: RestDrafter(p.rest), disk_bytes(point.rest.path), None)}
        if point.dense is not None:
            methods["DReSD {}x{}".format(*DRESD_SHAPE)] = (lambda p=point: DenseDrafter(p.dense, *DRESD_SHAPE),
                                                          point.dense.storage_bytes(), hidden)
        for method, (make, storage, states) in methods.items():
            runs = replay_many(make, references, states)
            frames.append(replay_rows(method, runs).assign(
                corpus=point.corpus, corpus_tokens=point.tokens, storage_bytes=storage,
                est_seconds=[priced_seconds(run, cost) for run in runs], ar_seconds=ar))
    return pd.concat(frames, ignore_index=True)


def sweep_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (corpus, method) of :func:`corpus_sweep_rows`: corpus, corpus_tokens, method, storage_bytes,
    calls, tokens_per_call, accepted_length (with ``_low`` / ``_high``, its 90% interval over the references),
    acceptance_rate (MAR, per depth), nodes_per_call and est_speedup (priced AR time / priced time of the
    replayed calls, with its 90% interval)."""
    out = []
    for (corpus, method), group in rows.groupby(["corpus", "method"], sort=False):
        summary = summarize(group, baseline="").iloc[0]
        out.append({"corpus": corpus, "corpus_tokens": group.corpus_tokens.iloc[0], "method": method,
                    "storage_bytes": group.storage_bytes.iloc[0],
                    **summary[["calls", "tokens_per_call", "accepted_length", "accepted_length_low",
                               "accepted_length_high", "acceptance_rate"]],
                    "nodes_per_call": group.drafted_nodes.sum() / max(1, group.calls.sum()),
                    "est_speedup": group.ar_seconds.sum() / group.est_seconds.sum(),
                    **dict(zip(("est_speedup_low", "est_speedup_high"),
                               ratio_interval(group.ar_seconds.to_numpy(float), group.est_seconds.to_numpy(float)),
                               strict=True))})
    return pd.DataFrame(out)


def corpus_sweep(points: list[SweepPoint], references: list[Reference], hidden: list[Tensor], cost) -> pd.DataFrame:
    """:func:`sweep_table` of :func:`corpus_sweep_rows`: one row per (corpus, method)."""
    return sweep_table(corpus_sweep_rows(points, references, hidden, cost))


def sweep_summary(rows: pd.DataFrame) -> dict[str, object]:
    """Headline numbers of :func:`corpus_sweep_rows`, lists in corpus order over the corpora both methods were
    built on: corpora, tokens, rest_accepted, dresd_accepted, ratio (DReSD's accepted length over REST's) with
    ratio_low / ratio_high, tpc (the same for tokens per call) with tpc_low / tpc_high, speed (DReSD's predicted
    speed over REST's: REST's priced seconds over DReSD's) with
    speed_low / speed_high — 90% intervals paired over the references (:func:`specnb.experiments.paired.versus`)
    —, rest_speedup and dresd_speedup (predicted over AR); ``largest_shared``: the largest corpus both were built
    on (tokens, rest_accepted, dresd_accepted); ``rest_only``: the largest corpus REST alone was built on
    (tokens, accepted, speedup)."""
    table = sweep_table(rows)
    dresd = table[table.method != "REST"].set_index("corpus")
    rest = table[table.method == "REST"].set_index("corpus")
    both, name = list(dresd.index), "DReSD {}x{}".format(*DRESD_SHAPE)
    out: dict[str, object] = {"corpora": both, "tokens": rest.corpus_tokens[both].tolist(),
                              "rest_accepted": rest.accepted_length[both].tolist(),
                              "dresd_accepted": dresd.accepted_length.tolist(),
                              "rest_speedup": rest.est_speedup[both].tolist(),
                              "dresd_speedup": dresd.est_speedup.tolist()}
    for key, metric in (("ratio", "accepted_length"), ("tpc", "tokens_per_call"), ("speed", ("one", "est_seconds"))):
        values = [versus(rows[rows.corpus == corpus], name, "REST", metric) for corpus in both]
        out.update({key: [v[0] for v in values], f"{key}_low": [v[1] for v in values],
                    f"{key}_high": [v[2] for v in values]})
    shared = rest.corpus_tokens[both].idxmax()
    out["largest_shared"] = {"tokens": rest.corpus_tokens[shared], "rest_accepted": rest.accepted_length[shared],
                             "dresd_accepted": dresd.accepted_length[shared]}
    only = rest.drop(index=both)
    if len(only):
        largest = only.loc[only.corpus_tokens.idxmax()]
        out["rest_only"] = {"tokens": largest.corpus_tokens, "accepted": largest.accepted_length,
                            "speedup": largest.est_speedup}
    return out


def figure_ratios(summary: dict[str, object]) -> pd.DataFrame:
    """:func:`sweep_summary`'s paired ratios, DReSD over REST on the same references, one row per (quantity,
    corpus) for :func:`specnb.study.plots.paired_ratios`: tokens per call, then the predicted speed that
    :func:`compare_speeds` judges; group = the corpus ("3,839 tokens (10% of the dense store's)", its share
    named: two samples of a tiny corpus can hold as many tokens), method = DReSD (its colour)."""
    name = "DReSD {}×{}".format(*DRESD_SHAPE)
    rows = [{"row": f"{name} / REST, {what}", "group": f"{tokens:,} tokens ({summary['corpora'][i]})",
             "value": summary[key][i],
             "low": summary[f"{key}_low"][i], "high": summary[f"{key}_high"][i], "method": "dense"}
            for key, what in (("tpc", "tokens per call"), ("speed", "predicted speed"))
            for i, tokens in enumerate(summary["tokens"])]
    return pd.DataFrame(rows, columns=["row", "group", "value", "low", "high", "method"])


def compare_speeds(report, summary: dict[str, object]) -> None:
    """One :meth:`specnb.study.results.Results.compare` per corpus of :func:`sweep_summary`: DReSD's predicted
    speed over REST's, paired over the references, must exceed 1 + :data:`~specnb.study.verdicts.TIE`, the
    direction of the paper's matched-shape comparison (10-29% faster). Keys ``speed_<i>`` in corpus order."""
    from ..study.verdicts import TIE, Expect

    for i, tokens in enumerate(summary["tokens"]):
        report.compare(f"speed_{i}", f"DReSD {DRESD_SHAPE[0]}×{DRESD_SHAPE[1]} predicted speed over REST's, "
                       f"{tokens:,}-token corpus", summary["speed"][i], summary["speed_low"][i],
                       summary["speed_high"][i], Expect.above(1.0, TIE),
                       "DReSD §5.4, Fig. 9 (matched shapes, greedy: DReSD 10-29% faster)",
                       cause="every drafted node costs on this machine (notebook 05), and REST drafts none where "
                             "it finds no match", internal=False, direction_only=True)
    if last := len(summary["tokens"]) - 1:
        report.takeaway("03_corpus_sweep", "DReSD's predicted speed over REST's: ×{verdicts[speed_0][ours]:.2f} on "
                        f"the smallest corpus, ×{{verdicts[speed_{last}][ours]:.2f}} on the largest (DReSD Fig. 9: "
                        "10-29% faster)")


def sweep_markdown(summary: dict[str, object]) -> str:
    """The corpus-size part of a results template for :func:`sweep_summary` stored as ``ours[sweep]``: one line per
    corpus (accepted lengths, their paired ratio, the predicted speed ratio and the finding of
    :func:`compare_speeds`' ``speed_<i>``, from ``ours[finding]``: :func:`specnb.experiments.paired.findings`)
    and, when REST alone ran on a larger corpus, a sentence on it."""
    lines = [f"* {{ours[sweep][tokens][{i}]:,}} tokens: DReSD accepts {{ours[sweep][dresd_accepted][{i}]:.3f}} "
             f"vs REST {{ours[sweep][rest_accepted][{i}]:.3f}} tokens per call, ×{{ours[sweep][ratio][{i}]:.2f}} "
             f"({{ours[sweep][ratio_low][{i}]:.2f}}–{{ours[sweep][ratio_high][{i}]:.2f}}); predicted speed "
             f"×{{ours[sweep][speed][{i}]:.2f}} REST's ({{ours[sweep][speed_low][{i}]:.2f}}–"
             f"{{ours[sweep][speed_high][{i}]:.2f}}): {{ours[finding][speed_{i}]}}."
             for i in range(len(summary["corpora"]))]
    if "rest_only" in summary:
        lines.append("\nREST on the whole stdlib ({ours[sweep][rest_only][tokens]:,} tokens, notebook 04's corpus) "
                     "accepts {ours[sweep][rest_only][accepted]:.3f} tokens per call (predicted "
                     "×{ours[sweep][rest_only][speedup]:.2f} over AR) against "
                     "{ours[sweep][largest_shared][rest_accepted]:.3f} on the dense store's "
                     "{ours[sweep][largest_shared][tokens]:,} tokens: REST's numbers here and in notebook 04 differ "
                     "by the corpus, not the method.")
    return "\n".join(lines)
