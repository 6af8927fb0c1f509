"""CREST: n-gram counts, the SQLite store (exact trees, bad stores, atomic builds), the drafter."""

from __future__ import annotations

import sqlite3
from collections import Counter

import numpy as np
import pytest

from specnb.atomic import ExistsError
from specnb.core.generate import generate
from specnb.datastores import crest
from specnb.datastores.corpus import CorpusError
from specnb.datastores.crest import CrestStore, NgramCounter, build_crest
from specnb.datastores.rest import DEFAULT_SEARCH, RestIndex
from specnb.drafters.crest import CrestDrafter
from tests.conftest import tiny
from tests.test_rest import accepts_whole_continuations, make_corpus, self_corpus


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(1)
    return [rng.integers(0, 4, int(rng.integers(5, 80))).tolist() for _ in range(30)]


@pytest.mark.parametrize("shards", [1, 3])
def test_ngram_counts_match_brute_force(docs, shards):
    """Counted per suffix-array shard and summed: every count, the top n-grams (ties in token order) and each
    one's ranges, which hold its occurrences."""
    counter = NgramCounter(RestIndex.build(make_corpus(docs), progress=False, shards=shards))
    assert len(counter.shards) == shards
    for n in (1, 2, 3, 5):
        expected = Counter(tuple(d[i:i + n]) for d in docs for i in range(len(d) - n + 1))
        assert counter.counts(n).tolist() == sorted(expected.values(), reverse=True)
        keys, counts, ranges = counter.top(n, 4)
        best = sorted(expected.items(), key=lambda item: (-item[1], item[0]))[:4]
        assert [tuple(np.frombuffer(key.tobytes(), ">i4").tolist()) for key in keys] == [k for k, _ in best]
        assert counts.tolist() == [c for _, c in best] == (ranges[:, :, 1] - ranges[:, :, 0]).sum(1).tolist()


def test_lookup_returns_exactly_the_stored_tree(docs, tmp_path):
    index = RestIndex.build(make_corpus(docs), progress=False)
    store = build_crest(index, tmp_path / "c.sqlite", ns=(1, 2, 3), t=5, progress=False)
    assert len(store) == 4 + 5 + 5  # only 4 distinct unigrams
    assert store.storage_bytes == (tmp_path / "c.sqlite").stat().st_size
    counter = NgramCounter(index)
    for n in (1, 2, 3):
        for key in counter.top(n, 5)[0]:
            ngram = np.frombuffer(key.tobytes(), ">i4").astype(np.int64)
            tokens, parents = store.get(ngram)
            tree = index.tree_of(ngram)
            assert tokens.tolist() == tree.tokens.tolist() and parents.tolist() == tree.parents.tolist()
    # The longest stored suffix wins.
    top3 = np.frombuffer(counter.top(3, 1)[0][0].tobytes(), ">i4").astype(np.int64)
    tokens, _, n = store.lookup(np.concatenate([[9, 9], top3]))
    assert n == 3 and tokens.tolist() == index.tree_of(top3).tokens.tolist()
    assert store.lookup(np.array([9, 9]))[2] == 0


def test_bad_stores(docs, tmp_path):
    index = RestIndex.build(make_corpus(docs), progress=False)
    path = tmp_path / "c.sqlite"
    with pytest.raises(CorpusError, match="no CREST store"):
        CrestStore(path)
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(CorpusError, match="not a valid CREST store"):
        CrestStore(path)
    with pytest.raises(ExistsError, match="is not a CREST store; refusing"):  # never replaces a foreign file
        build_crest(index, path, ns=(2,), t=10, progress=False)
    assert path.read_bytes() == b"not a database at all" * 100
    path.unlink()
    build_crest(index, path, ns=(2,), t=10, progress=False)
    for ns in ((), (0, 1), (17,)):  # a store's keys are REST queries: 1..16 tokens
        with pytest.raises(ValueError, match="1 <= n <= 16"):
            build_crest(index, path, ns=ns, t=10, progress=False)
    with pytest.raises(ExistsError, match="pass --overwrite"):
        build_crest(index, path, ns=(2,), t=10, progress=False, overwrite=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(CorpusError, match="not a valid CREST store"):
        CrestStore(path)
    path.unlink()  # what cannot be read as a CREST store is the user's to delete
    store = build_crest(index, path, ns=(2,), t=10, progress=False)
    store.verify()
    with sqlite3.connect(path) as db:  # one stored tree changed in place, same size
        key, blob = db.execute("SELECT ngram, tree FROM trees ORDER BY ngram LIMIT 1").fetchone()
        db.execute("UPDATE trees SET tree = ? WHERE ngram = ?", (blob[:-1] + bytes([blob[-1] ^ 1]), key))
    db.close()
    with pytest.raises(CorpusError, match="does not match its recorded checksums"):
        CrestStore(path)  # the first row is in the sample checked on open
    store = build_crest(index, path, ns=(2,), t=10, progress=False)
    foreign = tiny("llama").tokenizer
    with pytest.raises(CorpusError, match="rebuild it with"):
        store.tokenizer.check(foreign, "CREST store")
    store = build_crest(index, path, ns=(1, 2, 3), t=10, progress=False)
    sampled = {bytes.fromhex(key) for key in store.meta["sample"]}
    store.close()
    with sqlite3.connect(path) as db:  # a tree outside the open-time sample changed in place
        key, blob = next(row for row in db.execute("SELECT ngram, tree FROM trees") if row[0] not in sampled)
        db.execute("UPDATE trees SET tree = ? WHERE ngram = ?", (blob[:-1] + bytes([blob[-1] ^ 1]), key))
    db.close()
    store = CrestStore(path)  # opening checks the pages' structure and the sampled trees, not every tree's bytes
    with pytest.raises(CorpusError, match="does not match its recorded checksums"):
        store.verify()  # `specnb datastore verify` checks every tree


def test_interrupted_build_leaves_nothing(docs, tmp_path, monkeypatch):
    index = RestIndex.build(make_corpus(docs), progress=False)
    calls = {"n": 0}
    real = crest.encode_tree

    def failing(tree):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real(tree)

    monkeypatch.setattr(crest, "encode_tree", failing)
    with pytest.raises(KeyboardInterrupt):
        build_crest(index, tmp_path / "c.sqlite", ns=(1, 2), t=10, progress=False)
    monkeypatch.setattr(crest, "write_store", _interrupting_writer(crest.write_store))
    monkeypatch.setattr(crest, "encode_tree", real)
    with pytest.raises(KeyboardInterrupt):
        build_crest(index, tmp_path / "c.sqlite", ns=(1, 2), t=10, progress=False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CorpusError):
        CrestStore(tmp_path / "c.sqlite")


def _interrupting_writer(write_store):
    """write_store whose SQLite inserts fail half-way (after the temporary file exists)."""
    def wrapped(path, tables, t, meta, *rest):
        tables[-1].blobs[-1] = None  # NOT NULL violation -> sqlite3.IntegrityError mid-insert
        try:
            return write_store(path, tables, t, meta, *rest)
        except Exception as exc:
            raise KeyboardInterrupt from exc
    return wrapped


def test_crest_drafter_greedy_lossless(tmp_path):
    target = tiny("qwen2")
    prompts = ["def add(a, b):", "import os\n"]
    index = RestIndex.build(self_corpus(target, prompts), progress=False)
    store = build_crest(index, tmp_path / "c.sqlite", ns=(1, 2, 3, 4), t=200, progress=False)
    drafter = CrestDrafter(store)
    for prompt in [*prompts, "while True:"]:
        ar = generate(target, prompt, max_new_tokens=32)
        for verify in ("tree", "batch"):
            sd = generate(target, prompt, drafter, max_new_tokens=32, verify=verify)
            assert sd.tokens == ar.tokens
            if prompt in prompts:  # the n-gram ending at the root finds the stored continuation at every call
                # (looking up the n-gram that ends one token earlier would accept almost nothing): each call
                # accepts the whole stored tree's depth, DEFAULT_SEARCH.length, or what is left of the output
                calls = sd.stats.calls
                assert all(c.report.match_len for c in calls), (prompt, verify)
                assert accepts_whole_continuations(calls, 32, DEFAULT_SEARCH.length), [c.accepted for c in calls]


def test_cli_builds_and_bench_factories(tmp_path, monkeypatch):
    """`specnb datastore build rest|crest` (default paths under the cache) then the bench factories."""
    from specnb.cli import main
    from specnb.eval.methods import make_drafter

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 5)
    for argv in (["rest"], ["crest", "--t", "50"]):
        assert main(["datastore", "build", *argv, str(src), "--model", "tiny-llama"]) == 0
    target = tiny("llama")
    for method, suffix in (("rest", ""), ("crest", ".sqlite")):
        store = tmp_path / "cache" / "datastores" / f"{method}-src-tiny-llama{suffix}"
        drafter = make_drafter(method, target, {"datastore": str(store)})
        assert generate(target, "def f1(x):", drafter, max_new_tokens=8).tokens == \
            generate(target, "def f1(x):", max_new_tokens=8).tokens
    with pytest.raises(CorpusError, match="no CREST store"):
        make_drafter("crest", target, {"datastore": str(tmp_path / "nope.sqlite")})


@pytest.mark.parametrize("argv, message", [
    (["rest", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),  # 0 was read as no limit: the full store
    (["crest", "--max-tokens", "-1"], "--max-tokens must be >= 1, got -1"),
    (["crest", "--m", "1000"], "need 1 <= n <= 16 (the longest suffix a REST search tries), got n in [1, 2,"),
    (["crest", "--single-n", "17"], "got n in [17]"),
])
def test_rest_and_crest_builds_refuse_a_limit_out_of_range(argv, message, source, tmp_path, capsys, isolated_cache):
    """``datastore build rest|crest`` refuse a limit out of range in one line, before any corpus is read, and leave
    nothing behind (0 was read as no limit and built the full store; ``--m 1000`` counted n-grams no search asks
    for)."""
    from specnb.cli import main

    argv = [a.format(tmp=tmp_path) for a in argv]
    before = sorted(tmp_path.rglob("*"))
    assert main(["datastore", "build", argv[0], str(source), "--model", "tiny-llama", *argv[1:]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message.format(tmp=tmp_path) in err and err.count("\n") == 1, err
    assert sorted(tmp_path.rglob("*")) == before
