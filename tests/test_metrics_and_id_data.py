"""The metric definitions of metrics.py on hand-made and real runs; ID data (id_data.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from conftest import tiny

from specnb.core.generate import generate
from specnb.core.metrics import CallStats, RunStats, first_divergence, rate_ratio_interval
from specnb.core.prompts import Prompt, encode_prompt
from specnb.datastores.corpus import CorpusError
from specnb.datastores.id_data import docstring_stubs, generate_responses, id_corpus
from specnb.drafters.context import ContextNgramDrafter
from specnb.eval.methods import make_drafter


def call(depth: int, accepted: int, nodes: int | None = None, verify: float = 0.1) -> CallStats:
    return CallStats(drafted_nodes=depth if nodes is None else nodes, draft_depth=depth, accepted=accepted,
                     new_tokens=accepted + 1, draft_seconds=0.01, verify_seconds=verify, overhead_seconds=0.0)


def test_metric_definitions():
    stats = RunStats(prompt_tokens=5, calls=[call(4, 4, nodes=40), call(4, 1), call(0, 0), call(2, 0)],
                     prefill_seconds=0.5, decode_seconds=1.0)
    assert stats.num_calls == 4
    assert stats.new_tokens == 1 + (5 + 2 + 1 + 1)  # the prefill's token counts as generated
    assert stats.tokens_per_call == 9 / 4  # calls after prefill only: the prefill's token is not a call's
    assert stats.accepted_length == stats.tokens_per_call - 1 == 5 / 4
    # per call accepted / depth (not nodes: 40 nodes fully accepted along one path is 1.0), over calls
    # that offered a draft
    assert stats.acceptance_rate == pytest.approx((1 + 0.25 + 0) / 3)
    assert stats.tokens_per_second == pytest.approx(10 / 1.5)
    assert stats.outside_forward_fraction == pytest.approx(1 - 0.4 / 1.0)
    assert stats.summary()["tokens_per_call"] == stats.tokens_per_call
    empty = RunStats(calls=[call(0, 0)])
    assert math.isnan(empty.acceptance_rate) and math.isnan(empty.outside_forward_fraction)
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2 and first_divergence([1], [1, 2]) == 1


def test_speed_ratio_intervals_resample_prompts_in_pairs():
    import numpy as np

    ones = np.ones(3)
    base = np.array([1.0, 10.0, 100.0])  # prompts of very different lengths
    # Twice as fast on every prompt: every paired resample says 2; unpaired resampling would not.
    assert rate_ratio_interval(ones, base / 2, ones, base) == pytest.approx((2.0, 2.0))
    # Tokens count: the same seconds for twice the tokens is twice the rate.
    assert rate_ratio_interval(2 * ones, base, ones, base) == pytest.approx((2.0, 2.0))
    # Faster on one prompt only: the interval spans the prompts' own ratios and holds the total's.
    seconds = base / np.array([4.0, 2.0, 2.0])
    low, high = rate_ratio_interval(ones, seconds, ones, base)
    assert 2.0 <= low < base.sum() / seconds.sum() < high <= 4.0
    assert all(math.isnan(x) for x in rate_ratio_interval(ones[:1], base[:1], ones[:1], base[:1]))


def test_summaries_pair_each_prompt_with_the_baselines_run_of_it():
    import pandas as pd

    from specnb.eval.runner import summarize

    base = {"a": 1.0, "b": 10.0, "c": 100.0}
    rows = pd.DataFrame(
        [{"method": "ar", "prompt_id": p, "seconds": s, "new_tokens": 5} for p, s in base.items()]
        + [{"method": "fast", "prompt_id": p, "seconds": base[p] / 2, "new_tokens": 5} for p in "cba"]  # other order
        + [{"method": "ar", "prompt_id": "a", "seconds": 50.0, "new_tokens": 5},  # "a" listed a second time
           {"method": "fast", "prompt_id": "a", "seconds": 25.0, "new_tokens": 5}])
    fast = summarize(rows).set_index("method").loc["fast"]
    assert fast.speedup_vs_ar == pytest.approx(2.0)
    assert (fast.speedup_vs_ar_low, fast.speedup_vs_ar_high) == pytest.approx((2.0, 2.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_reference_records_each_positions_top_logit_and_its_margin(dtype):
    """What a divergence is judged by (gap_within_rounding): the top-1 logit and its margin over the
    second, at every position; a tie is a zero margin."""
    from specnb.eval.runner import TopTwo

    logits = torch.randn(3, 262_144, generator=torch.Generator().manual_seed(0)).to(dtype)
    logits[1, [7, 200_000]] = 50.0  # a tie for the top
    logits[2, 5], logits[2, 9] = 40.0, -40.0
    hook = TopTwo()
    hook(logits[:2])
    hook(logits[2:])
    top = logits.float().topk(2, dim=-1).values
    assert hook.top1 == top[:, 0].tolist() and hook.gaps == (top[:, 0] - top[:, 1]).tolist()
    assert hook.gaps[1] == 0.0 and hook.top1[2] == 40.0


def test_identical_to_ar_says_whether_a_method_gave_the_references_tokens():
    """The bench's ``identical_to_ar`` (greedy runs): True for a method whose tokens are AR's, False where one token
    differs, with the index it differs at in ``first_divergence``; the summary's is the share of identical prompts."""
    from specnb.eval.bench import BenchConfig, run_bench
    from specnb.eval.runner import summarize

    target = tiny("llama")

    def decoding(change: int):
        """A bench peer: AR's tokens, the fourth one plus ``change``."""
        def decode(prompt: Prompt, max_new_tokens: int) -> dict:
            tokens = generate(target, prompt, max_new_tokens=max_new_tokens, stop_at_eos=False).tokens
            tokens[3] += change
            return {"new_tokens": len(tokens), "seconds": 1.0, "tokens": tokens}
        return decode

    prompts = [Prompt("a", [256, 40, 41, 42]), Prompt("b", [256, 50, 51])]
    made = {"ar": decoding(0), "same": decoding(0), "other": decoding(1)}  # "ar" replaces the bench's own
    rows = run_bench(target, prompts, BenchConfig([], max_new_tokens=8, made=made, warmup_tokens=0), progress=False)
    assert rows.identical_to_ar.tolist() == [True, True, False] * 2
    assert rows[rows.method == "other"].first_divergence.tolist() == [3, 3]
    summary = summarize(rows).set_index("method").identical_to_ar
    assert (summary["same"], summary["other"]) == (1.0, 0.0)


def test_metrics_of_real_runs():
    target = tiny("llama")
    ar = generate(target, "def add(a, b):", max_new_tokens=20, stop_at_eos=False).stats
    assert ar.num_calls == ar.new_tokens - 1 == 19 and ar.tokens_per_call == 1.0 and ar.accepted_length == 0
    assert math.isnan(ar.acceptance_rate)
    sd = generate(target, "a b a b a b a b", ContextNgramDrafter(), max_new_tokens=20, stop_at_eos=False).stats
    assert sd.new_tokens == 20 and sd.tokens_per_call == pytest.approx(19 / sd.num_calls)
    assert sum(c.accepted for c in sd.calls) == 19 - sd.num_calls


def test_docstring_stubs_are_seeded_stubs():
    stubs = docstring_stubs(6, seed=1, max_files=40)
    assert len(stubs) == 6 and len({s.id for s in stubs}) == 6
    assert [s.id for s in stubs] == [s.id for s in docstring_stubs(6, seed=1, max_files=40)]
    assert [s.id for s in stubs] != [s.id for s in docstring_stubs(6, seed=2, max_files=40)]
    for stub in stubs:
        assert stub.text.startswith("def ") and stub.text.rstrip().endswith(('"""', "'''"))
        assert stub.messages[0]["content"].endswith(stub.text)


def test_a_response_that_ends_keeps_its_eos(tmp_path):
    """A response that stops at an EOS holds it (as generate() does) and says so."""
    prompt = Prompt("a", text="def f(x):")
    free = generate(tiny("llama"), prompt, max_new_tokens=8).tokens
    target = dataclasses.replace(tiny("llama"), eos_token_ids=frozenset({free[3]}))  # stop at the 4th token
    out = generate_responses(target, [prompt], tmp_path / "r.jsonl", max_new_tokens=8)
    record = json.loads(out.read_text())
    assert record["stop_reason"] == "eos"
    assert record["response_ids"] == generate(target, prompt, max_new_tokens=8).tokens == \
        free[:free.index(free[3]) + 1]


def test_responses_are_the_greedy_output_resumable_and_make_a_corpus(tmp_path):
    target = tiny("llama")
    prompts = [Prompt(name, text=text) for name, text in (("a", "def f(x):"), ("b", "import os\n"), ("c", "x = 1"))]
    out = tmp_path / "r.jsonl"
    generate_responses(target, prompts[:2], out, max_new_tokens=8, source="test")
    generate_responses(target, prompts, out, max_new_tokens=8, source="test",  # resumes: adds c, drafts change nothing
                       drafter=make_drafter("pld", target))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["a", "b", "c"]
    for prompt, record in zip(prompts, records, strict=True):
        assert record["prompt_ids"] == encode_prompt(target, prompt).tolist()
        assert record["response_ids"] == generate(target, prompt, max_new_tokens=8).tokens
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["model"] == "tiny-llama" and meta["num_responses"] == 3 and meta["max_new_tokens"] == 8
    assert meta["weights"] == target.weights and meta["drafts"] == "ContextNgramDrafter"
    meta_path = out.with_suffix(".meta.json")
    meta_path.write_text(json.dumps({**meta, "made_by": "transformers generate, batches of 8"}))
    with pytest.raises(ValueError, match="other settings"):  # a file another decoding made is not extended
        generate_responses(target, prompts, out, max_new_tokens=8)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="other settings"):
        generate_responses(target, prompts, out, max_new_tokens=9)
    corpus = id_corpus(out)
    assert corpus.num_docs == 3 and corpus.tokenizer.name == "tiny-llama"
    assert corpus.doc(1).tolist() == records[1]["prompt_ids"] + records[1]["response_ids"]
    assert id_corpus(out, responses_only=True).doc(2).tolist() == records[2]["response_ids"]
    with pytest.raises(CorpusError, match="no responses file"):
        id_corpus(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("mine, out, message", [
    ("r.meta.json", "r.jsonl", "r.meta.json exists and is not the sidecar of a responses file"),  # was overwritten
    ("r.jsonl", "r.jsonl", "--out r.jsonl exists and is not a responses file"),  # said "other settings", late
    ("r.jsonl", "r.jsonl/x.jsonl", "{tmp}/r.jsonl is not a folder"),
    (None, "", "--out is empty"),
    (None, ".", "--out . is a folder"),
])
def test_id_data_never_touches_a_users_file_and_says_so_before_the_model_loads(mine, out, message, tmp_path,
                                                                               capsys, monkeypatch):
    """``specnb id-data --out`` refuses in one line, before the prompts are listed and the model loads, an --out that
    is a user's file or whose sidecar ``.meta.json`` would replace one; the library refuses the sidecar too."""
    from specnb.cli import main
    from specnb.datastores import id_data
    from specnb.model import models

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    monkeypatch.setitem(id_data.PROMPT_SOURCES, "code", lambda *a, **k: pytest.fail("prompts listed first"))
    if mine:
        (tmp_path / mine).write_text('{"mine": 1}\n')
    assert main(["id-data", "code", "--model", "tiny-llama", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message.format(tmp=tmp_path) in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([mine] if mine else [])
    if mine:
        assert (tmp_path / mine).read_text() == '{"mine": 1}\n'
    if mine == "r.meta.json":
        with pytest.raises(ValueError, match="not the sidecar"):
            generate_responses(tiny("llama"), [Prompt("a", text="x")], tmp_path / "r.jsonl", max_new_tokens=2)
        assert (tmp_path / "r.meta.json").read_text() == '{"mine": 1}\n' and not (tmp_path / "r.jsonl").exists()


def test_id_data_never_mixes_two_prompt_sources_in_one_file(tmp_path, capsys, monkeypatch):
    """A file of answers to chat prompts, rerun as ``specnb id-data code``: one line before the model loads (the
    code answers were appended and the sidecar relabelled)."""
    from specnb.cli import main
    from specnb.model import models

    out = tmp_path / "r.jsonl"
    generate_responses(tiny("llama"), [Prompt("a", text="x")], out, max_new_tokens=2, source="chat: turns(n=1)")
    before = out.read_text(), out.with_suffix(".meta.json").read_text()
    capsys.readouterr()  # the first run's progress bar
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    assert main(["id-data", "code", "--model", "tiny-llama", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"specnb: error: {out} holds answers to chat prompts, not code; choose another --out\n", err
    assert (out.read_text(), out.with_suffix(".meta.json").read_text()) == before
