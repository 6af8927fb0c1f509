"""``specnb extract-rate``: the dense store's extraction timed on a synthetic corpus, and the random shapes it times
on machines without the weights."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import tiny
from transformers import AutoConfig

from specnb.cli import main
from specnb.datastores.embed import plan
from specnb.eval.extract_rate import COLUMNS, measure, synthetic_corpus
from specnb.eval.timing import random_config
from specnb.model.models import fetch


def test_synthetic_corpus_is_documents_of_the_asked_length():
    corpus = synthetic_corpus(1000, 300, vocab_size=50, seed=1)
    assert corpus.num_tokens == 1000 and list(corpus.doc_starts) == [0, 300, 600, 900, 1000]
    assert corpus.tokens.min() >= 0 and corpus.tokens.max() < 50 and len(np.unique(corpus.tokens)) > 40
    assert np.array_equal(corpus.tokens, synthetic_corpus(1000, 300, 50, seed=1).tokens)
    with pytest.raises(ValueError, match="at least 2"):
        synthetic_corpus(1000, 1, 50)


def test_rate_counts_the_rows_of_every_batch_but_the_untimed_first():
    target = tiny("llama")
    corpus = synthetic_corpus(3000, 400, vocab_size=256)
    layout = plan(target, corpus, seq_len=64, overlap=8, batch_tokens=256)
    kept = [sum(seg.end - seg.keep for seg in batch) for batch in layout.work]
    row = measure(target, corpus, seq_len=64, overlap=8, batch_tokens=256, progress=False)
    assert list(row) == COLUMNS
    assert row["rows"] == sum(kept[1:]) and row["batches"] == len(layout.work) - 1
    assert row["rows_per_s"] == pytest.approx(row["rows"] / row["seconds"])
    padded = sum(len(batch) * batch[0].length for batch in layout.work[1:])
    assert row["padded_tokens_per_s"] == pytest.approx(padded / row["seconds"]) and padded > row["rows"]
    with pytest.raises(ValueError, match="need at least 2"):
        measure(target, synthetic_corpus(100, 50, 256), seq_len=64, overlap=8, batch_tokens=4096, progress=False)


def test_random_gemma_has_the_shipped_models_shapes():
    shipped = AutoConfig.from_pretrained(fetch("gemma-3-270m", quiet=True)).get_text_config()
    shape = random_config("gemma-3-270m")
    for name in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "sliding_window", "layer_types",
                 "query_pre_attn_scalar", "hidden_activation"):
        assert getattr(shape, name) == getattr(shipped, name), name


def test_command_writes_a_row_per_model_and_batch_size(tmp_path, capsys):
    out = tmp_path / "rate.csv"
    assert main(["extract-rate", "--model", "tiny-llama", "--device", "cpu", "--tokens", "3000", "--doc-tokens",
                 "300", "--seq-len", "64", "--overlap", "8", "--batch-tokens", "256", "512", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns) == COLUMNS and list(frame.batch_tokens) == [256, 512]
    assert (frame.model == "tiny-llama").all() and (frame.device == "cpu").all() and (frame.rows_per_s > 0).all()
    assert "rows/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--batch-tokens", "100"], "--batch-tokens >= --seq-len + --overlap"),
    (["--tokens", "1"], "need at least 2 tokens"),
    (["--model", "random:gpt-9"], "unknown model shape 'gpt-9'"),
])
def test_bad_arguments_are_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, argv, message):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specnb.eval.extract_rate.load_target", refuse)
    assert main(["extract-rate", "--model", "tiny-llama", *argv, "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message in err and err.count("\n") == 1
    assert main(["extract-rate", "--model", "tiny-llama", "--out", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
