"""Model-derived unigram / bigram / extended bigram: tables against direct computation, cache, losslessness."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from conftest import tiny

from specnb.core.generate import generate
from specnb.datastores import ngram_tables
from specnb.datastores.ngram_tables import (
    NgramTableError,
    bigram_path,
    bigram_table,
    unigram_distances,
    unigram_ranking,
)
from specnb.drafters.model_ngram import BigramDrafter, UnigramDrafter

PROMPT = list(b"def add(a, b):\n    return a + b\n\ndef add(a, b):\n")


pytestmark = pytest.mark.usefixtures("isolated_cache")


def test_unigram_matches_the_papers_inner_product():
    target = tiny("llama")
    emb = target.model.get_input_embeddings().weight.detach().double()
    out = target.model.get_output_embeddings().weight.detach().double()
    centred = out - out.mean(0)
    # <a, b>_V = sum_x (a . v_x)(b . v_x), divided by |X| as the covariance is
    direct = ((centred @ emb.T) ** 2).sum(1).div(emb.shape[0]).sqrt()
    torch.testing.assert_close(unigram_distances(target).double(), direct, rtol=1e-4, atol=1e-5)
    assert unigram_ranking(target, top=10, rule="distance").tolist() == torch.argsort(direct)[:10].tolist()
    # the appendix rule: lowest inner product with the mean output embedding under the same covariance
    inner = ((out.mean(0) @ emb.T) * (out @ emb.T)).sum(1) / emb.shape[0]
    assert unigram_ranking(target, top=10).tolist() == torch.argsort(inner)[:10].tolist()
    with pytest.raises(ValueError, match="unknown unigram rule"):
        unigram_ranking(target, rule="zipf")


def test_bigram_rows_match_direct_model_calls():
    target = tiny("qwen2")
    table = bigram_table(target, [5, 97, 300], k_max=8, chain_depth=0, progress=False)
    for x in (5, 97, 300):
        with torch.inference_mode():
            logits = target.model(torch.tensor([[256, x]])).logits[0, -1]  # [bos, x]
        row = table.row_of[x]
        assert table.topk[row].tolist() == torch.topk(logits, 8).indices.tolist()
        np.testing.assert_allclose(table.logprobs[row], torch.log_softmax(logits, -1).topk(8).values, atol=1e-5)
    assert table.row_of[6] == -1 and table.rows(6, 4, 2) is None


def test_bigram_cache_reloads_grows_and_refuses_other_models(monkeypatch):
    target = tiny("llama")
    first = bigram_table(target, [10, 20], k_max=4, progress=False)
    calls = []
    original = ngram_tables._compute_rows
    monkeypatch.setattr(ngram_tables, "_compute_rows", lambda *a, **k: calls.append(a[1]) or original(*a, **k))
    again = bigram_table(target, [10, 20], k_max=4, progress=False)
    assert calls == [] and np.array_equal(again.topk, first.topk) and np.array_equal(again.tokens, first.tokens)
    grown = bigram_table(target, [30], k_max=4, progress=False)
    assert calls and set(first.tokens) < set(grown.tokens) and grown.row_of[30] >= 0
    # the same file under another model's name is refused with a one-line error
    other = tiny("qwen2")
    bigram_path(other).parent.mkdir(parents=True)
    shutil.copy(bigram_path(target), bigram_path(other))
    with pytest.raises(NgramTableError, match="built for 'tiny-llama'"):
        bigram_table(other, [10], k_max=4, progress=False)
    bigram_path(other).write_bytes(b"not an npz")
    with pytest.raises(NgramTableError, match="corrupt"):
        bigram_table(other, [10], k_max=4, progress=False)


def test_each_forward_path_keeps_its_own_bigram_rows():
    from specnb.model.models import stock

    target = tiny("llama")
    other = stock(target)  # the same weights and fingerprint, Hugging Face's modules computing the rows
    assert target.backend != other.backend and bigram_path(target) != bigram_path(other)
    bigram_table(target, [10], k_max=4, progress=False)
    assert bigram_path(target).exists() and not bigram_path(other).exists()


def test_extended_bigram_is_greedy_chaining():
    target = tiny("gemma3")
    table = bigram_table(target, progress=False)  # vocab 320: every row
    chains = table.extended(5)
    assert chains.shape == (320, table.k_max, 5)
    assert np.array_equal(chains[:, :, 0], table.topk)
    top1 = table.topk[:, 0]
    assert np.array_equal(chains[:, :, 1:], top1[chains[:, :, :-1]])
    assert table.rows(65, 3, 4).tolist() == chains[table.row_of[65], :3, :4].tolist()


@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_greedy_lossless(tiny_target, verify):
    table = bigram_table(tiny_target, progress=False)
    reference = generate(tiny_target, PROMPT, None, max_new_tokens=20).tokens
    for drafter in (UnigramDrafter(unigram_ranking(tiny_target), k=6), BigramDrafter(table, k=5, w=3)):
        out = generate(tiny_target, PROMPT, drafter, max_new_tokens=20, verify=verify)
        assert out.tokens == reference, type(drafter).__name__


def test_bad_shapes_are_refused():
    table = bigram_table(tiny("llama"), [1], k_max=4, progress=False)
    with pytest.raises(ValueError, match="k <= 4"):
        BigramDrafter(table, k=5)
    with pytest.raises(NgramTableError, match="must lie in"):
        bigram_table(tiny("llama"), [10_000], progress=False)


@pytest.mark.parametrize("method", ["ngram-bigram", "mixed"])
def test_a_k_past_the_default_table_widens_it_and_one_past_the_vocabulary_is_refused_first(method):
    from specnb.core.drafter import DecodeState
    from specnb.eval.methods import make_drafter

    target = tiny("llama")
    with pytest.raises(ValueError, match=f"k={target.vocab_size + 1} exceeds the vocabulary"):
        make_drafter(method, target, {"k": target.vocab_size + 1})
    assert not bigram_path(target).exists()  # refused before a row was computed
    drafter = make_drafter(method, target, {"k": 40, "w": 1})  # the default table keeps 32 successors a row
    assert drafter.table.k_max == 40
    state = DecodeState(torch.tensor(PROMPT), None, max_depth=1, prompt_len=len(PROMPT))
    assert drafter.propose(state).tokens.shape[0] == 40


def test_cli_builds_the_tables(tmp_path, capsys):
    from specnb.cli import main

    text = tmp_path / "corpus.txt"
    text.write_text("hello")
    assert main(["ngram-table", "--model", "tiny-llama", "--tokens", str(text), "--k-max", "4"]) == 0
    assert "rows (tokens of" in capsys.readouterr().out
    table = bigram_table(tiny("llama"), list(b"hello"), k_max=4, progress=False)
    assert all(table.row_of[t] >= 0 for t in b"helo")


@pytest.mark.parametrize("flags, message", [
    (["--k-max", "0"], "--k-max must be >= 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--batch-size", "-1"], "--batch-size must be >= 1, got -1"),
    (["--tokens", "{tmp}/empty.txt"], "--tokens {tmp}/empty.txt holds no text"),
    (["--tokens", "{tmp}/missing.txt"], "--tokens '{tmp}/missing.txt' is not 'all', 'default' or a text file"),
])
def test_ngram_table_checks_its_flags_and_tokens_file_before_the_model_loads(flags, message, tmp_path, capsys,
                                                                             monkeypatch):
    """Sizes below 1 (accepted) and a --tokens file that is missing or empty (reported once the model had loaded)
    are one line, exit 2, before the model loads; no table is written."""
    from specnb.cli import main
    from specnb.model import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    (tmp_path / "empty.txt").write_text(" \n")
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert main(["ngram-table", "--model", "tiny-llama", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message.format(tmp=tmp_path) in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]
