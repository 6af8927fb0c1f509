"""specnb.experiments helpers: pricing replayed calls, the cached greedy references, the corpus sweep's summary."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import WholeRows, tiny

from specnb.core.generate import generate
from specnb.core.metrics import CallStats, RunStats
from specnb.core.prompts import Prompt
from specnb.eval.replay import priced_seconds
from specnb.experiments import references as refs_module
from specnb.experiments.corpus_sweep import sweep_summary
from tests.test_priced import LinearCost


def call(nodes: int, new_tokens: int) -> CallStats:
    return CallStats(drafted_nodes=nodes, draft_depth=min(nodes, 1), accepted=new_tokens - 1, new_tokens=new_tokens,
                     draft_seconds=0.0, verify_seconds=0.0, overhead_seconds=0.0)


def test_replayed_calls_are_priced_by_their_shape_or_their_nodes():
    stats = RunStats(prompt_tokens=5, calls=[call(4, 3), call(10, 1), call(0, 1)])
    cost = LinearCost(0.5)  # 1 + 0.5 * k * w seconds
    assert priced_seconds(stats, cost) == pytest.approx(3 + 0.5 * 14)  # (1, nodes) per call
    assert priced_seconds(stats, cost, (2, 3)) == pytest.approx(3 * (1 + 0.5 * 6))
    assert priced_seconds(RunStats(prompt_tokens=5), cost) == 0.0  # no call, no phantom one


def test_every_replayed_call_is_priced_at_the_cache_length_before_it():
    """One rule for every priced replay (grids, the modelled speed, AR): a call's context is what the KV cache
    holds before it, as the roofline table measured it: the prompt, then every earlier call's new tokens."""
    import torch

    from specnb.eval.replay import _priced, ar_priced_seconds

    class Recording(WholeRows):
        def __init__(self):
            self.contexts = []

        def seconds_at(self, k, w, context_len):
            self.contexts.append(context_len)
            return 1.0

    stats = RunStats(prompt_tokens=5, calls=[call(4, 3), call(10, 1), call(0, 2)])
    cost = Recording()
    priced_seconds(stats, cost)
    assert cost.contexts == [5, 8, 9]
    cost.contexts.clear()
    reference = (torch.zeros(5, dtype=torch.long), torch.zeros(4, dtype=torch.long))  # the prefill gives token 1
    assert ar_priced_seconds([reference], cost) == 3.0 and cost.contexts == [5, 6, 7]
    cost.contexts.clear()
    assert _priced([stats], [reference], cost) == (2.0, 2.0) and cost.contexts == [5, 8, 9]


def test_greedy_references_are_decoded_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    target = tiny("llama")
    prompts = [Prompt("a", text="def add(a, b):"), Prompt("b", text="hello world")]
    first = refs_module.greedy_references(target, prompts, 12)
    assert [out.tolist() for _, out in first] == [generate(target, p, max_new_tokens=12).tokens for p in prompts]
    monkeypatch.setattr(refs_module, "generate", lambda *a, **k: pytest.fail("decoded again"))
    again = refs_module.greedy_references(target, prompts, 12)
    assert all(a.tolist() == b.tolist() and pa.tolist() == pb.tolist()
               for (pa, a), (pb, b) in zip(first, again, strict=True))
    assert len(list((tmp_path / "references").rglob("*.json"))) == 2  # one file a prompt


def sweep_rows(corpus: str, tokens: int, method: str, accepted: list[int], est: list[float]) -> pd.DataFrame:
    """corpus_sweep_rows-like rows: one per reference, 10 calls each, AR priced at 10 s per reference."""
    n = len(accepted)
    return pd.DataFrame({"corpus": corpus, "corpus_tokens": tokens, "method": method, "prompt_id": range(n),
                         "storage_bytes": 1, "new_tokens": [11 + a for a in accepted], "calls": 10,
                         "accepted": accepted, "draft_depth": 60, "drafted_nodes": 60, "acceptance_rate": 0.1,
                         "seconds": 0.0, "est_seconds": est, "ar_seconds": 10.0})


def test_sweep_summary_pairs_the_methods_per_corpus_and_states_rest_alone():
    rows = pd.concat([
        sweep_rows("small", 100, "REST", [2, 2, 3, 2], [9.0, 9.5, 9.0, 9.2]),
        sweep_rows("small", 100, "DReSD 10x6", [4, 5, 5, 4], [8.0, 8.1, 7.9, 8.0]),
        sweep_rows("large", 1000, "REST", [5, 6, 5, 5], [7.0, 7.2, 7.1, 7.0]),
        sweep_rows("large", 1000, "DReSD 10x6", [4, 5, 4, 4], [8.0, 8.2, 8.1, 8.0]),
        sweep_rows("all", 10_000, "REST", [7, 7, 8, 7], [6.0, 6.0, 6.1, 6.0])], ignore_index=True)
    out = sweep_summary(rows)
    assert out["corpora"] == ["small", "large"] and out["tokens"] == [100, 1000]
    assert out["ratio"] == pytest.approx([18 / 9, 17 / 21])
    assert out["speed"][0] == pytest.approx(36.7 / 32.0)  # REST's priced seconds over DReSD's
    assert out["speed_low"][0] > 1 and out["speed_high"][1] < 1  # DReSD faster on small, slower on large
    assert out["ratio_low"][0] <= out["ratio"][0] <= out["ratio_high"][0]
    assert out["rest_only"]["tokens"] == 10_000 and out["rest_only"]["accepted"] == pytest.approx(29 / 40)
    assert out["largest_shared"]["tokens"] == 1000


def test_beyond_verdicts_read_suffix_against_pld_and_the_retrieval_ceiling():
    from specnb.experiments.beyond import verdicts

    summary = pd.DataFrame({"set": ["chat"] * 4, "method": ["pld", "suffix", "recycle", "auto"],
                            "tokens_per_s": [10.0, 12.0, 8.0, 11.4], "tokens_per_call": [2.0, 2.2, 1.5, 2.4],
                            "vs_best_single_low": [0.8, 1.0, 0.6, 0.9], "vs_best_single_high": [0.9, 1.0, 0.7, 0.99],
                            "vs_pld_low": [1.0, 1.1, 0.7, 1.05], "vs_pld_high": [1.0, 1.3, 0.9, 1.2]})
    verdict = verdicts(summary, {"chat": 2.5})["chat"]
    assert (verdict["auto_vs_best_low"], verdict["auto_vs_best_high"]) == (0.9, 0.99)
    assert (verdict["auto_vs_pld_low"], verdict["auto_vs_pld_high"]) == (1.05, 1.2)
    assert verdict["best_single"] == "suffix"
    assert verdict["auto_vs_best"] == pytest.approx(0.95) and verdict["auto_vs_pld"] == pytest.approx(1.14)
    assert verdict["suffix_vs_pld_tokens_per_call"] == pytest.approx(1.1)
    assert verdict["ceiling_vs_pld_tokens_per_call"] == pytest.approx(1.25)


def test_pick_shares_per_prompt_split_merged_calls_between_their_members():
    """One row per prompt in the order they ran, then all calls; members in the study's method order, each
    beside its half of the calls it merged with another (``pld+``), then no draft, the same columns for every set.
    10's chart folded every merged pair into one grey bar, the largest, hiding which members drafted."""
    import pandas as pd

    from specnb.experiments.beyond import ALL_CALLS, member_shares, pick_shares

    picks = pd.DataFrame({"set": ["a"] * 5 + ["b"] * 2, "step": [0, 1, 2, 3, 4, 0, 1],
                          "prompt_id": ["p2", "p2", "p1", "p1", "p1", "q1", "q1"],
                          "picked": ["suffix", "pld+suffix", "suffix+recycle", "-", "pld", "suffix", "suffix"]})
    shares = pick_shares(picks)
    assert list(shares["a"].columns) == list(shares["b"].columns) == ["pld", "pld+", "suffix", "suffix+",
                                                                      "recycle+", "-"]
    assert list(shares["a"].index) == ["prompt 1", "prompt 2", ALL_CALLS]
    assert shares["a"].loc["prompt 1"].to_dict() == {"pld": 0.0, "pld+": 0.25, "suffix": 0.5, "suffix+": 0.25,
                                                     "recycle+": 0.0, "-": 0.0}
    assert shares["a"].loc["prompt 2"].to_dict() == pytest.approx({"pld": 1 / 3, "pld+": 0.0, "suffix": 0.0,
                                                                  "suffix+": 1 / 6, "recycle+": 1 / 6, "-": 1 / 3})
    assert shares["a"].loc[ALL_CALLS].to_dict() == pytest.approx({"pld": 0.2, "pld+": 0.1, "suffix": 0.2,
                                                                 "suffix+": 0.2, "recycle+": 0.1, "-": 0.2})
    assert shares["b"].loc[ALL_CALLS].to_dict() == {"pld": 0.0, "pld+": 0.0, "suffix": 1.0, "suffix+": 0.0,
                                                    "recycle+": 0.0, "-": 0.0}
    assert member_shares(picks) == {"a": pytest.approx({"pld": 0.3, "suffix": 0.4, "recycle": 0.1, "-": 0.2}),
                                    "b": {"suffix": 1.0}}
    assert member_shares(picks, merged=False) == {"a": pytest.approx({"pld": 0.2, "suffix": 0.2, "-": 0.2}),
                                                  "b": {"suffix": 1.0}}


def test_the_corpus_sweep_runs_on_a_users_corpus(tmp_path, monkeypatch):
    """Notebook 03's corpus sweep on a user's folder: nested samples of the dense store's documents, then REST on
    the whole folder (the profile's ``whole_stdlib`` point), every corpus tokenised with the target's tokenizer."""
    from dataclasses import replace

    from specnb.datastores.corpus import build_corpus
    from specnb.experiments.corpus_sweep import sweep_points
    from specnb.model import kernels
    from specnb.study import profiles

    kernels.extension()  # loaded from the real cache before the test's own replaces it (a build takes a minute)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    smoke = profiles.PROFILES["smoke"]
    monkeypatch.setitem(profiles.PROFILES, "smoke",
                        replace(smoke, corpus_sweep=replace(smoke.corpus_sweep, whole_stdlib=True)))
    folder = tmp_path / "src"
    folder.mkdir()
    for i in range(12):
        (folder / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i}\n" * 30)
    target = tiny("gemma3")
    points = sweep_points(target, profiles.get_profile("smoke", corpus=str(folder)))
    whole = build_corpus(folder, target, progress=False)
    assert [p.corpus for p in points] == ["50% of the dense store's", "100% of the dense store's", "whole corpus"]
    assert points[0].tokens < points[1].tokens <= whole.num_tokens == points[2].tokens


def test_the_id_store_answers_the_users_held_out_prompts(tmp_path, monkeypatch, capsys):
    """DReSD's in-distribution data on a user's prompt file: the target's answers to the prompts past those the
    notebooks decode (never the timed ones), at most ``id_generated[0]``; too few held out: stdlib stubs, said."""
    import json

    from specnb.experiments import dresd
    from specnb.study.profiles import get_profile

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):"}) + "\n" for i in range(10)))
    p = get_profile("smoke", prompts=str(mine))  # decodes 2 prompts; ID data: 6 stubs' worth
    assert [q.id for q in dresd.held_out_prompts(p)] == [f"p{i}" for i in range(2, 8)]
    assert dresd.held_out_prompts(get_profile("smoke")) == []  # a built-in set: no held-out prompts
    target = tiny("gemma3")
    path = dresd.id_responses(target, p)
    answered = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert sorted(answered) == [f"p{i}" for i in range(2, 8)]
    assert "6 prompts of" in json.loads(path.with_suffix(".meta.json").read_text())["prompts"]
    assert "answers to 6 prompts of" in capsys.readouterr().out
    assert dresd.id_responses(target, p) == path  # made once

    mine.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"def g{i}(x):"}) + "\n" for i in range(4)))
    few = dresd.id_responses(target, get_profile("smoke", prompts=str(mine)))
    assert not any(json.loads(line)["id"].startswith("q") for line in few.read_text().splitlines())
    assert "2 held-out prompts in" in capsys.readouterr().out


def _gpu_table(path, models=("random:llama-2-7b", "random:mistral-7b")) -> None:
    """A fake GPU cost table: one-token calls 1 s; (1, 10) 1.1 s; (10, 10) 2 s, at two contexts, per model (the
    second model's calls twice as long, except the one-token call)."""
    rows = []
    for i, model in enumerate(models):
        for context in (128, 512):
            for k, w, seconds in ((1, 0, 1.0), (1, 10, 1.1 * (1 + i)), (10, 10, 2.0 * (1 + i))):
                rows.append({"context": context, "k": k, "w": w, "seconds": seconds, "model": model,
                             "device": "NVIDIA Fake"})
    pd.DataFrame(rows).to_csv(path, index=False)


def test_the_gpu_column_is_added_with_a_table_and_said_absent_without(tmp_path, capsys):
    from specnb.experiments.gpu_price import COLUMN, GRAPHS_COLUMN, add_gpu_column

    grid = pd.DataFrame({"k": [1, 10], "w": [10, 10], "tokens_per_call": [2.2, 4.0]})
    missing = tmp_path / "roofline_gpu.csv"
    assert add_gpu_column(grid, "random:llama-2-7b", path=missing) is grid
    line = capsys.readouterr().out.strip()
    assert len(line.splitlines()) == 1 and COLUMN in line and "left out" in line and "roofline_gpu.csv" in line

    _gpu_table(missing)
    priced = add_gpu_column(grid, "random:llama-2-7b", path=missing)
    assert priced[COLUMN].tolist() == pytest.approx([2.2 / 1.1, 4.0 / 2.0]) and COLUMN not in grid
    assert add_gpu_column(grid, "random:mistral-7b", path=missing)[COLUMN].tolist() == pytest.approx([1.0, 1.0])
    chains = pd.DataFrame({"tokens_per_call": [1.0, 2.2], "draft_nodes_per_call": [0.0, 10.2]})
    by_nodes = add_gpu_column(chains, "random:llama-2-7b", nodes="draft_nodes_per_call", path=missing)
    assert by_nodes[COLUMN].tolist() == pytest.approx([1.0, 2.0])  # one row of 10 draft tokens: (1, 10)
    assert capsys.readouterr().out == ""
    assert GRAPHS_COLUMN not in priced  # a table without `cuda_graphs` was timed eagerly


def test_each_call_mode_of_the_gpu_table_prices_its_own_column(tmp_path):
    """Eager rows and CUDA-graph rows of one model in one table: each column reads its own mode's rows, never both."""
    from specnb.experiments.gpu_price import COLUMN, GRAPHS_COLUMN, add_gpu_column, gpu_cost_model

    path = tmp_path / "roofline_gpu.csv"
    _gpu_table(path, models=("random:llama-2-7b",))
    eager = pd.read_csv(path).assign(cuda_graphs=False)
    graphed = eager.assign(cuda_graphs=True, seconds=eager.seconds * eager.w.map({0: 1.0, 10: 2.0}))
    pd.concat([eager, graphed]).to_csv(path, index=False)
    grid = pd.DataFrame({"k": [1, 10], "w": [10, 10], "tokens_per_call": [2.2, 4.0]})
    priced = add_gpu_column(grid, "random:llama-2-7b", path=path)
    assert priced[COLUMN].tolist() == pytest.approx([2.2 / 1.1, 4.0 / 2.0])
    assert priced[GRAPHS_COLUMN].tolist() == pytest.approx([2.2 / 2.2, 4.0 / 4.0])
    eager.to_csv(path, index=False)
    assert gpu_cost_model("random:llama-2-7b", path, graphs=True) is None
    assert GRAPHS_COLUMN not in add_gpu_column(grid, "random:llama-2-7b", path=path)


def test_the_roofline_command_writes_a_table_the_gpu_column_reads_on_a_device(tmp_path):
    """``specnb roofline --device <accelerator> --out FILE`` end to end on the pretend device: every call runs
    there, the table names the device, and the GPU column prices a replayed table with it."""
    from fake_device import FAKE, fake_device

    from specnb.cli import main
    from specnb.experiments.gpu_price import COLUMN, add_gpu_column

    out = tmp_path / "roofline_gpu.csv"
    with fake_device():
        assert main(["roofline", "--model", "tiny-llama", "--device", FAKE.type, "--grid", "smoke",
                     "--max-tokens", "4", "--out", str(out)]) in (0, None)
    table = pd.read_csv(out)
    assert {"context", "k", "w", "seconds", "model", "device"} <= set(table.columns)
    assert (table.seconds > 0).all() and set(table.model) == {"tiny-llama"}
    grid = pd.DataFrame({"k": [1, 2], "w": [1, 1], "tokens_per_call": [1.5, 2.0]})
    assert add_gpu_column(grid, "random:llama-2-7b", path=out)[COLUMN].notna().all()


def test_notebook_02_judges_every_table2_row_but_the_one_notebook_03_judges(tmp_path, monkeypatch):
    """The 64-d MRR is notebook 03's code-OOD MRR (same store, keys and index): counted once, there; the rest of
    Table 2 and Fig. 5 judged with the named tolerances, their causes citing only what the file holds."""
    import json

    import numpy as np

    from specnb.experiments import pca_variance as pv
    from specnb.experiments.paired import findings
    from specnb.study.results import Results, uncited

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("02", "smoke")
    names = ["32D", "64D", "96D", "128D", "64D, no z-score", "64D, no L2"]
    table = pd.DataFrame({"MRR": [1.0, 1.0, 0.9, 0.8, 0.99, 0.5], "MRR_low": [1.0, 1.0, 0.88, 0.78, 0.98, 0.45],
                          "MRR_high": [1.0, 1.0, 0.92, 0.82, 1.0, 0.55], "MRR_exact": [0.999] * 6,
                          "code_bits": [8.0, 4.0, 8 / 3, 2.0, 4.0, 4.0],
                          "code_error": [0.05, 0.2, 0.3, 0.4, 0.2, 0.2]}, index=names)
    ranks = pd.DataFrame({"64D": [1.0] * 8, "64D, no z-score": [1.0] * 7 + [0.5], "64D, no L2": [0.5, 1.0] * 4})
    rows = pd.DataFrame([{"method": m, "prompt_id": i, "acceptance_rate": r}
                         for m, rates in (("64D", [0.5, 0.6, 0.4]), ("128D", [0.5, 0.55, 0.45]))
                         for i, r in enumerate(rates)])
    pv.compare_table2(report, np.linspace(0.1, 1.0, 640), 10, table, ranks, rows, 27_063,
                      "IVF-PQ (4096 lists, 32 B codes, nprobe 32)")
    assert report.comparisons["mrr_32D"].claim == "MRR at 32 dimensions (IVF-PQ)"  # the index searched, named
    assert "mrr_64D" not in report.comparisons and {"mrr_32D", "mrr_128D", "drop_no_l2"} <= set(report.comparisons)
    assert report.comparisons["variance_64"].measured().endswith("% (no interval)")  # shares to 0.1%
    # above the paper's: the store's size (exact search); below it: the index's codes, 2 bits a dimension at 128
    assert report.comparisons["mrr_32D"].cause.startswith("exact search over the same 27,063 keys reads MRR 0.999")
    assert report.comparisons["mrr_128D"].cause.startswith("IVF-PQ keeps 2 bits a dimension of a key here (a "
                                                           "stored key 40.0% of its length off)")
    report.add(mrr=table.MRR.to_dict(), finding=findings(report))
    text = report.render(pv.table2_markdown(report)).data
    assert "judged there, once" in text and "1.000 (1.000–1.000)" in text
    assert "MRR through IVF-PQ (4096 lists, 32 B codes, nprobe 32) at 64 dimensions" in text
    assert "keeps 8 and 2 bits a dimension of a key there (a stored key 5.0% and 40.0% of its length off)" in text
    assert uncited(json.loads(report.path.read_text())) == []
    exact = Results("02", "smoke")  # an index that keeps the float32 keys (hnswlib): no precision to speak of
    pv.compare_table2(exact, np.linspace(0.1, 1.0, 640), 10, table.assign(code_bits=32.0, code_error=0.0), ranks,
                      rows, 27_063, "hnswlib (M 16, ef 64)")
    exact.add(mrr=table.MRR.to_dict(), finding=findings(exact))
    text = exact.render(pv.table2_markdown(exact)).data
    assert "Searched exactly" in text and "bits a dimension" not in text
    assert exact.comparisons["mrr_128D"].cause.startswith("hnswlib's search misses own keys")


def test_notebook_02_pairs_each_transform_with_64d():
    """02_pca_dims_paired's ratios: a transform that doubles every prompt's tokens per call reads x2 with a paired
    interval of [2, 2] however much the prompts differ, and MRR pairs the same queries (half the reciprocal rank on
    every query: x0.5); 64D itself is the base, not a row."""
    from specnb.experiments import pca_variance as pv

    calls = [10, 40, 20]
    rows = pd.DataFrame([{"method": m, "prompt_id": i, "new_tokens": 1 + factor * n * (i + 2), "calls": n,
                          "acceptance_rate": 0.1 * factor * (i + 1)}
                         for m, factor in (("64D", 1), ("32D", 2)) for i, n in enumerate(calls)])
    ranks = pd.DataFrame({"32D": [0.5, 0.25, 0.5, 0.05], "64D": [1.0, 0.5, 1.0, 0.1]})
    ratios = pv.paired_with_base(ranks, rows).set_index("group")
    assert list(ratios.row.unique()) == ["32D / 64D"]
    for group, value in (("tokens per call", 2.0), ("MAR", 2.0), ("MRR", 0.5)):
        assert ratios.loc[group, ["value", "low", "high"]].tolist() == pytest.approx([value] * 3)


def test_mrr_per_datastore_counts_duplicate_keys_and_ranks_held_out_queries(tmp_path, monkeypatch):
    """DReSD Table 1 on a store whose every document is stored twice (each key has an exact duplicate): by the
    paper's definition MRR is 0.75 through the index and under exact search, well below 1; held-out queries (the
    target's decoding states, not stored) count any tied neighbour, so the duplicates cost them nothing. Judged
    against Table 1, the cause cites the exact and held-out MRRs, which the results file holds."""
    import json

    import numpy as np

    from specnb.datastores.dense import build_datastore
    from specnb.experiments import ann_index
    from specnb.experiments.references import references_and_states
    from specnb.study.results import Results, uncited
    from tests.test_dense import CONFIG, PROMPTS, own_outputs

    target = tiny("llama")
    corpus = own_outputs(target)
    twice = corpus.select(np.concatenate([np.arange(corpus.num_docs)] * 2))
    store = build_datastore(target, twice, tmp_path / "twice", CONFIG, progress=False)
    references, states = references_and_states(target, [Prompt("p", text=PROMPTS[2])], 12)
    queries = ann_index.decoding_queries(references, states)
    assert queries.shape == (12, states[0].shape[1])  # the prompt's last state and 11 of the 12 outputs'
    table = ann_index.mrr_table({"code-OOD": store}, queries, sample=store.rows)  # every key, as Eq. 4 sums
    row = table.loc["code-OOD"]
    assert row["keys"] == store.rows and row.held_out_queries == 12 and row["index"].startswith("hnswlib (M 8")
    assert row["MRR (exact)"] == pytest.approx(0.75) and 0.7 <= row["MRR (ANN)"] <= 0.75 + 1e-9
    assert row.MRR_low <= row["MRR (ANN)"] <= row.MRR_high
    assert row["MRR held-out (ANN)"] >= 0.9
    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("03", "smoke")
    ann_index.compare_table1(report, table)
    assert report.comparisons["mrr_code-OOD"].verdict == "disagrees"
    report.render("{verdicts}")
    assert uncited(json.loads(report.path.read_text())) == []


def test_docstring_stubs_come_from_every_root_the_profile_names(tmp_path, monkeypatch):
    """The paper profile's ID prompts: stubs of the installed packages beside the stdlib's, ids prefixed by their
    root, the stdlib's alone as before; the scan kept in the cache until a file changes."""
    from specnb.datastores import id_data

    doc = '    """' + "Return the thing this function computes, explained at length. " * 2 + '"""\n'
    for root, name in (("lib", "alpha"), ("pkgs", "beta")):
        (tmp_path / root / "mod").mkdir(parents=True)
        (tmp_path / root / "mod" / "x.py").write_text(f"def {name}(a):\n{doc}    return a\n\ndef _hidden(a):\n{doc}")
    monkeypatch.setattr(id_data, "STUB_ROOTS", {"stdlib": lambda: tmp_path / "lib",
                                                "site-packages": lambda: tmp_path / "pkgs"})
    assert [p.id for p in id_data.docstring_stubs(10)] == ["mod.x.alpha"]
    both = id_data.docstring_stubs(10, roots=("stdlib", "site-packages"))
    assert sorted(p.id for p in both) == ["mod.x.alpha", "site-packages.mod.x.beta"]
    assert both[0].text.startswith("def ") and "return a" not in both[0].text  # the stub: signature and docstring
    monkeypatch.setattr(id_data.ast, "parse", lambda source: 1 / 0)
    assert id_data.docstring_stubs(10, roots=("stdlib", "site-packages")) == both  # the cached scan, nothing parsed
    monkeypatch.undo()
    monkeypatch.setattr(id_data, "STUB_ROOTS", {"stdlib": lambda: tmp_path / "lib",
                                                "site-packages": lambda: tmp_path / "pkgs"})
    (tmp_path / "pkgs" / "mod" / "x.py").write_text(f"def gamma(a):\n{doc}    return a\n")  # a changed file
    assert sorted(p.id for p in id_data.docstring_stubs(10, roots=("stdlib", "site-packages"))) == \
        ["mod.x.alpha", "site-packages.mod.x.gamma"]


def test_id_and_ood_stores_of_equal_size_and_a_shipped_file_only_when_large_enough(tmp_path, monkeypatch):
    """With ``equal_id_ood`` the code-OOD store is cut to the code-ID corpus's tokens (whole documents, at least
    one: they differ by less than the longest); without it, to the profile's budget. A shipped ID file holding
    fewer responses than the profile asks for is not used."""
    import dataclasses
    import json

    from specnb.experiments import dresd
    from specnb.study.profiles import get_profile

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    target = tiny("gemma3")
    p = get_profile("smoke")
    assert p.dresd.equal_id_ood
    stores = dresd.datastores(target, p, kinds=("code-OOD", "code-ID"), progress=False)
    ood, ind = (stores[k].meta["extract"]["corpus_tokens"] for k in ("code-OOD", "code-ID"))
    longest = int(max(np.diff(dresd.store_corpus(stores["code-OOD"]).doc_starts)))
    assert abs(ood - ind) < longest and stores["code-OOD"].path.name.startswith(f"code-t{ind}-")
    unequal = dataclasses.replace(p, dresd=dataclasses.replace(p.dresd, equal_id_ood=False))
    cut = dresd.datastores(target, unequal, kinds=("code-OOD",), progress=False)["code-OOD"]
    assert cut.path.name.startswith(f"code-t{p.dresd.store_tokens['code']}-")

    generated = dresd.id_responses(target, p)
    shipped = tmp_path / "data" / "id_code_tiny-gemma3.jsonl"
    shipped.parent.mkdir()
    shipped.write_text(generated.read_text())
    meta = json.loads(generated.with_suffix(".meta.json").read_text())
    monkeypatch.setattr(dresd, "DATA", shipped.parent)
    for responses, expected in ((p.dresd.id_generated[0] - 1, generated), (p.dresd.id_generated[0], shipped)):
        shipped.with_suffix(".meta.json").write_text(json.dumps({**meta, "num_responses": responses}))
        assert dresd.id_responses(target, p) == expected


def test_study_stores_index_the_documents_the_profile_names(tmp_path, monkeypatch):
    """REST and CREST of notebooks 08-10 index the documents of ``study_stores.rest_store``: the ID store's under
    smoke (and paper, as DReSD's Table 3), the OOD store's under quick."""
    import dataclasses
    import json

    from specnb.experiments import dresd
    from specnb.experiments.stores import study_stores
    from specnb.study.profiles import get_profile

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    target = tiny("gemma3")
    p = get_profile("smoke")
    assert p.study_stores.rest_store == "code-ID" == get_profile("paper").study_stores.rest_store
    assert get_profile("quick").study_stores.rest_store == "code-OOD"
    dense = dresd.datastores(target, p, kinds=("code-OOD", "code-ID"), progress=False)
    for kind in ("code-ID", "code-OOD"):
        chosen = dataclasses.replace(p, study_stores=dataclasses.replace(p.study_stores, rest_store=kind))
        stores = study_stores(target, chosen)
        rest_meta = json.loads((stores["rest"] / "meta.json").read_text())
        assert rest_meta["num_tokens"] == dense[kind].meta["extract"]["corpus_tokens"]
        assert stores["crest"].name.endswith(f"{dense[kind].path.name}.sqlite")
        assert stores["dense-id"] == dense["code-ID"].path and stores["dense"] == dense["code-OOD"].path


def replayed(method: str, accepted: list[tuple[int, ...]], depth: int = 10) -> pd.DataFrame:
    """Replay rows of ``method``, one prompt per tuple: one call per entry accepting that many of ``depth``
    drafted tokens (the prompt's MAR is the mean of accepted / depth)."""
    from specnb.experiments.grids import replay_rows

    return replay_rows(method, [RunStats(prompt_tokens=5, calls=[
        CallStats(drafted_nodes=depth, draft_depth=depth, accepted=a, new_tokens=a + 1, draft_seconds=0.0,
                  verify_seconds=0.0, overhead_seconds=0.0) for a in calls]) for calls in accepted])


def fig6_rows(swap: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(code rows, chat rows) with MARs REST 0.25 on code, 0.125 on chat; DReSD 0.45 on code, 0.25 on chat (or
    code and chat's numbers swapped: chat above code)."""
    code = {"REST": [(2, 2), (3, 3), (2, 3), (3, 2)], "DReSD": [(4, 4), (5, 5), (4, 5), (5, 4)]}
    chat = {"REST": [(1, 1), (1, 2), (2, 1), (1, 1)], "DReSD": [(3, 3), (2, 3), (3, 2), (2, 2)]}
    code, chat = (chat, code) if swap else (code, chat)
    return (pd.concat([replayed("REST, OOD store", code["REST"]), replayed("DReSD 10×6, OOD store", code["DReSD"])]),
            pd.concat([replayed("REST, chat store", chat["REST"]), replayed("DReSD 10×6, chat store", chat["DReSD"])]))


def test_fig6_table_holds_each_method_on_code_and_on_chat_with_table7_beside():
    """DReSD Fig. 6 / Table 7's table: REST and DReSD 10×6 on code and on chat, in the paper's order, each row the
    mean of its prompts' MAR and its tokens per call (ratio of totals), with Table 7's range over its models."""
    from specnb.experiments import ann_index

    table = ann_index.alignment_table(*fig6_rows())
    assert list(table.index) == ["DReSD 10×6, code (HumanEval)", "DReSD 10×6, chat (MT-Bench)",
                                 "REST, code (HumanEval)", "REST, chat (MT-Bench)"]  # the study's method order
    assert list(table.method) == ["DReSD 10×6", "DReSD 10×6", "REST", "REST"]
    assert list(table.store) == ["code-OOD", "chat-OOD", "code-OOD", "chat-OOD"] and set(table.prompts) == {4}
    assert table.acceptance_rate.to_numpy() == pytest.approx([0.45, 0.25, 0.25, 0.125])
    assert table.tokens_per_call.to_numpy() == pytest.approx([44 / 8, 28 / 8, 28 / 8, 18 / 8])
    assert (table.acceptance_rate_low <= table.acceptance_rate).all()
    assert (table.acceptance_rate <= table.acceptance_rate_high).all()
    assert table.loc["REST, chat (MT-Bench)", ["paper_MAR_low", "paper_MAR_high"]].tolist() == \
        pytest.approx([0.080, 0.093])
    assert table.loc["DReSD 10×6, code (HumanEval)", ["paper_MAR_low", "paper_MAR_high"]].tolist() == \
        pytest.approx([0.290, 0.319])


def test_fig6_verdicts_judge_chat_below_code_and_dresd_above_rest_on_chat(tmp_path, monkeypatch):
    """Chat's MAR over code's (two prompt sets: unpaired) must be below 1 for REST and for DReSD, DReSD's over
    REST's on chat (paired) above 1; all direction only, against Table 7's ratios. Code and chat swapped, the two
    chat-over-code verdicts disagree, and their causes cite only numbers the results file holds."""
    import json

    from specnb.experiments import ann_index
    from specnb.study.results import Results, uncited

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    assert ann_index.CLAIMS.table7_ratio("DReSD-M", "REST-M") == pytest.approx((18.5 / 9.3, 17.3 / 8.0))
    assert ann_index.CLAIMS.table7_ratio("REST-M", "REST-C") == pytest.approx((8.0 / 18.0, 9.3 / 16.7))
    report = Results("03", "smoke")
    ann_index.compare_fig6(report, *fig6_rows())
    rest, dense, gain = (report.comparisons[k] for k in ("mar_chat_code_REST", "mar_chat_code_DReSD", "mar_chat"))
    assert rest.ours == pytest.approx(0.5) and dense.ours == pytest.approx(0.25 / 0.45)
    assert gain.ours == pytest.approx(2.0)
    assert all(c.verdict == "agrees" and c.direction_only and not c.internal for c in (rest, dense, gain))
    assert rest.low < 0.5 < rest.high and rest.expect.kind == "below" and gain.expect.kind == "above"
    assert "×0.44–×0.56" in rest.against and "×1.99–×2.16" in gain.against
    assert report.ours["chat_prompts"] == 4

    swapped = Results("03", "smoke")
    ann_index.compare_fig6(swapped, *fig6_rows(swap=True))
    assert swapped.comparisons["mar_chat_code_REST"].ours == pytest.approx(2.0)
    assert swapped.comparisons["mar_chat_code_REST"].verdict == "disagrees"
    assert swapped.comparisons["mar_chat_code_DReSD"].verdict == "disagrees"
    assert "25.0% on MT-Bench and 12.5% on HumanEval" in swapped.comparisons["mar_chat_code_REST"].cause
    swapped.render("{verdicts}")
    assert uncited(json.loads(swapped.path.read_text())) == []


def test_fig6_ratios_are_the_verdicts_ratios_with_table7_beside(tmp_path, monkeypatch):
    """:func:`alignment_ratios`: the three ratios the Fig. 6 verdicts judge, in their order, each value and interval
    the verdict's own (one computation for the figure and the verdict), coloured by the numerator's method, Table
    7's range beside it."""
    from specnb.experiments import ann_index
    from specnb.study.results import Results

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    ratios = ann_index.alignment_ratios(*fig6_rows())
    assert list(ratios.key) == ["mar_chat_code_DReSD", "mar_chat_code_REST", "mar_chat"]  # the study's order
    assert list(ratios.method) == ["DReSD 10×6", "REST", "DReSD 10×6"]
    assert ratios.value.to_numpy() == pytest.approx([0.25 / 0.45, 0.5, 2.0])
    assert list(ratios.row) == ["DReSD 10×6: chat / code", "REST: chat / code", "chat: DReSD 10×6 / REST"]
    assert ratios.iloc[2][["span_low", "span_high"]].tolist() == pytest.approx([18.5 / 9.3, 17.3 / 8.0])
    report = Results("03", "smoke")
    ann_index.compare_fig6(report, *fig6_rows())
    for r in ratios.itertuples():
        verdict = report.comparisons[r.key]
        assert (r.value, r.low, r.high) == (verdict.ours, verdict.low, verdict.high)


def test_fig4_ratios_are_the_verdicts_ratios(tmp_path, monkeypatch):
    """:func:`fig4_ratios`: the five ratios the Fig. 4 verdicts judge, in their order, each value and interval the
    verdict's own (the figure draws what is judged), coloured by the numerator's method."""
    from specnb.experiments import ann_index
    from specnb.study.results import Results

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    code, chat = fig6_rows()  # its chat rows stand in for the ID store's: MAR REST 0.125, DReSD 0.25
    rows = pd.concat([code, chat.assign(method=chat.method.str.replace("chat", "ID"))])
    ratios = ann_index.fig4_ratios(rows)
    assert list(ratios.key) == ["mar_OOD", "length_OOD", "mar_ID", "length_ID", "mar_id_ood"]
    assert ratios.value.to_numpy() == pytest.approx([1.8, 36 / 20, 2.0, 20 / 10, 0.25 / 0.45])
    assert list(ratios.method) == ["dense", "dense", "dense-id", "dense-id", "dense-id"]  # dark: the ID store
    assert ratios.row.iloc[0] == "OOD store: MAR, DReSD 10×6 / REST"
    report = Results("03", "smoke")
    ann_index.compare_fig4(report, rows)
    for r in ratios.itertuples():
        verdict = report.comparisons[r.key]
        assert (r.value, r.low, r.high) == (verdict.ours, verdict.low, verdict.high)


def test_fig6_replays_mtbench_against_the_chat_store_and_rest_on_its_documents(tmp_path, monkeypatch):
    """:func:`chat_rows`: the first n MT-Bench prompts, each replayed by REST over the chat store's own documents and
    by DReSD 10×6 over the store: one row per (method, prompt), every token of each reference counted."""
    from specnb.datastores.dense import build_datastore
    from specnb.experiments import ann_index, dresd
    from specnb.experiments.references import greedy_references
    from tests.test_dense import CONFIG, own_outputs

    target = tiny("llama")
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))  # after the model: its kernels stay cached
    store = build_datastore(target, own_outputs(target), tmp_path / "chat", CONFIG, progress=False)
    rows = ann_index.chat_rows(target, store, 2, 8)
    assert sorted(rows.method.unique()) == ["DReSD 10×6, chat store", "REST, chat store"]
    assert rows.groupby("method").prompt_id.nunique().tolist() == [2, 2]
    references = greedy_references(target, ann_index.load_prompts("mtbench", 2), 8)
    assert rows.groupby("method").new_tokens.sum().tolist() == [sum(len(out) for _, out in references)] * 2
    rest = dresd.rest_twin(store)
    assert rest.meta["num_tokens"] == len(store.corpus_tokens())


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_the_storage_cause_names_the_stores_own_index_and_its_bytes(tmp_path, monkeypatch, kind):
    """01's bytes-per-position cause names the index the store holds (the paper profile's is IVF-PQ, the quick
    one's hnswlib) and cites bytes a position the results file holds."""
    import json

    from specnb.experiments import hidden_states as hs
    from specnb.study.results import Results, uncited

    monkeypatch.setenv("SPECNB_FIGURES", str(tmp_path))
    report = Results("01", "smoke")
    storage = {"dense_bytes": 1.2e9, "rest_bytes": 8e7, "rows": 10_000_000, "bytes_per_row": 120.0, "ratio": 15.0,
               "index": kind, "index_bytes_per_row": 40.1, "values_bytes_per_row": 84.0}
    hs.judge_storage(report, storage)
    cause = report.comparisons["bytes_per_token"].cause
    assert hs.INDEX_NAMES[kind] in cause and "40.1 bytes a position" in cause and "84.0" in cause
    assert uncited(json.loads(report.write().read_text())) == []
