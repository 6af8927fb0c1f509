"""Token corpora: documents, boundaries, caching, the truncated ShareGPT reader, tokenizer checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specnb.datastores.corpus import (
    CorpusError,
    TokenizerInfo,
    build_corpus,
    json_records,
    load_corpus,
    stdlib_files,
)
from specnb.datastores.manifest import verify_store
from specnb.model.models import byte_tokenizer


@pytest.fixture
def py_files(tmp_path):
    texts = ["def f(x):\n    return x + 1\n", "", "import os\nprint(os.sep)\n", "class A:\n    pass\n"]
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / "src" / f"m{i}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        paths.append(path)
    return paths, texts


def test_build_files_boundaries_and_cache(py_files, tmp_path):
    paths, texts = py_files
    out = tmp_path / "corpus"
    corpus = build_corpus(paths, "tiny-llama", out=out, progress=False)
    tok = byte_tokenizer()
    expected = [tok(t, add_special_tokens=False).input_ids for t in texts if t]  # the empty file is dropped
    assert corpus.num_docs == 3
    assert [d.tolist() for d in corpus.docs()] == expected
    assert corpus.tokens.dtype == np.int32 and corpus.doc_starts[-1] == corpus.num_tokens
    assert corpus.meta["tokenizer"]["vocab_size"] == len(tok)
    assert np.array_equal(corpus.doc_ids, np.repeat(np.arange(3), [len(e) for e in expected]))
    again = build_corpus(paths, "tiny-qwen2", out=out, progress=False)  # same byte tokenizer: cache hit
    assert again.meta["build_seconds"] == corpus.meta["build_seconds"]
    directory = build_corpus(tmp_path / "src", "tiny-llama", out=tmp_path / "dir", progress=False)
    assert directory.num_docs == 3 and np.array_equal(directory.tokens, corpus.tokens)
    assert not list(tmp_path.glob("*partial*"))
    assert verify_store(out).startswith(f"ok: corpus store {out}, 2 files")
    for source, limits in ((paths[:1], {}), (paths, {"max_docs": 2}), ("code", {})):  # another source / limits
        with pytest.raises(CorpusError, match="another source or limits.*--force"):
            build_corpus(source, "tiny-llama", out=out, progress=False, **limits)
    forced = build_corpus(paths[:1], "tiny-llama", out=out, force=True, progress=False)  # replaces its own corpus
    assert forced.num_docs == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "dir", "src"]


def test_sample_and_select(py_files, tmp_path):
    corpus = build_corpus(py_files[0], "tiny-llama", out=tmp_path / "c", progress=False)
    sub = corpus.select(np.array([2, 0]))
    assert [d.tolist() for d in sub.docs()] == [corpus.doc(2).tolist(), corpus.doc(0).tolist()]
    small, large = corpus.sample(0.34, seed=1), corpus.sample(0.67, seed=1)
    assert small.num_docs == 1 and large.num_docs == 2
    small_docs = {tuple(d.tolist()) for d in small.docs()}
    assert small_docs <= {tuple(d.tolist()) for d in large.docs()}


def test_json_records_drops_broken_tail(tmp_path):
    records = [{"id": i, "conversations": [{"from": "gpt", "value": "x" * (i * 50)}]} for i in range(40)]
    text = json.dumps(records, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: int(len(text) * 0.8)])  # cut mid-record
    got = list(json_records(path, chunk_bytes=97, progress=False))
    assert 0 < len(got) < 40 and got == records[: len(got)]
    path.write_text(text)
    assert list(json_records(path, chunk_bytes=1 << 20, progress=False)) == records


def test_errors(py_files, tmp_path):
    with pytest.raises(CorpusError, match="not `code`, `chat`"):
        build_corpus("no/such/dir", "tiny-llama", progress=False)
    with pytest.raises(CorpusError, match="no corpus"):
        load_corpus(tmp_path / "missing")
    out = tmp_path / "c"
    build_corpus(py_files[0], "tiny-llama", out=out, progress=False)
    (out / "tokens.npy").write_bytes(b"garbage")
    with pytest.raises(CorpusError, match="corrupt"):
        load_corpus(out)
    info, _ = TokenizerInfo.of("tiny-llama")
    foreign = TokenizerInfo("other", 5, "0123456789abcdef")
    foreign_tok = byte_tokenizer()
    foreign_tok.add_tokens(["<extra>"])
    with pytest.raises(CorpusError, match="rebuild it with"):
        info.check(foreign_tok, "store")
    with pytest.raises(CorpusError, match="different one"):
        foreign.check(byte_tokenizer(), "store")


def test_stdlib_files_and_cli(tmp_path, py_files):
    files = stdlib_files()
    assert len(files) > 100 and all(f.suffix == ".py" and "site-packages" not in f.parts for f in files[:50])
    from specnb.cli import main

    out = str(tmp_path / "cli")
    assert main(["corpus", "build", str(tmp_path / "src"), "--model", "tiny-llama", "--out", out]) == 0
    assert load_corpus(tmp_path / "cli").num_docs == 3


def test_a_users_folder_and_jsonl(tmp_path):
    """A folder of any text files (hidden files, caches and binaries skipped), a JSONL of texts and token ids;
    cached under the contents' hash, so an edited file is another corpus; bad lines named."""
    tok = byte_tokenizer()
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("# notes\nsome text\n")
    (docs / "sub" / "b.txt").write_text("more text\n")
    (docs / ".hidden").write_text("skipped\n")
    (docs / "blob.bin").write_bytes(b"\x00\x01\x02")
    folder = build_corpus(docs, "tiny-llama", progress=False)
    assert [d.tolist() for d in folder.docs()] == [tok(t, add_special_tokens=False).input_ids
                                                    for t in ("# notes\nsome text\n", "more text\n")]
    (docs / "a.md").write_text("# notes, edited\n")
    edited = build_corpus(docs, "tiny-llama", progress=False)
    assert edited.path != folder.path and edited.num_tokens != folder.num_tokens

    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text(json.dumps({"text": "def f(): pass"}) + "\n\n" + json.dumps({"tokens": [5, 6, 7]}) + "\n")
    mixed = build_corpus(jsonl, "tiny-llama", progress=False)
    assert [d.tolist() for d in mixed.docs()] == [tok("def f(): pass", add_special_tokens=False).input_ids, [5, 6, 7]]
    jsonl.write_text(json.dumps({"tokens": [1, len(tok)]}) + "\n")
    with pytest.raises(CorpusError, match="outside the tokenizer's vocabulary"):
        build_corpus(jsonl, "tiny-llama", progress=False)
    jsonl.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"ids": [1]}) + "\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: expected"):
        build_corpus(jsonl, "tiny-llama", progress=False)
    jsonl.write_text("{not json\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:1: not JSON"):
        build_corpus(jsonl, "tiny-llama", progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorpusError, match="no text files"):
        build_corpus(empty, "tiny-llama", progress=False)


@pytest.mark.parametrize("flags, message", [
    (["--max-tokens", "-5"], "--max-tokens must be >= 1, got -5"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--max-docs", "0"], "--max-docs must be >= 1, got 0"),
    (["--max-docs", "-1"], "--max-docs must be >= 1, got -1"),
    (["--out", "{tmp}/mine.csv"], "{tmp}/mine.csv exists and is not a corpus; refusing to replace it (choose another "
                                  "--out)"),
    (["--out", "{tmp}/mine.csv", "--force"], "{tmp}/mine.csv exists and is not a corpus"),
])
def test_corpus_build_refuses_bad_limits_and_a_users_out_in_one_line(flags, message, py_files, tmp_path, capsys,
                                                                     monkeypatch):
    """Limits below 1 (accepted: a limit of 0 was cached as the whole corpus) and an --out holding a user's file
    (refused as a corrupt corpus, with the advice to delete it) are one line, exit 2, before the tokenizer loads;
    the user's file is kept."""
    from specnb.cli import main
    from specnb.datastores import corpus

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus.TokenizerInfo, "of", lambda *a: pytest.fail("the tokenizer loaded before the check"))
    (tmp_path / "mine.csv").write_text("a,b\n1,2\n")
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert main(["corpus", "build", str(tmp_path / "src"), "--model", "tiny-llama", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message.format(tmp=tmp_path) in err and err.count("\n") == 1, err
    assert "delete" not in err and (tmp_path / "mine.csv").read_text() == "a,b\n1,2\n"
    assert not (tmp_path / "cache").exists()
