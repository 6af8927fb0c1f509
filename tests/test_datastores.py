"""Datastores never delete what the project did not create, replace a store only when told to and only once
the new one is complete, record checksums and refuse damaged or foreign stores."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from specnb.atomic import ExistsError, atomic_file, atomic_folder
from specnb.cli import main
from specnb.datastores import rest
from specnb.datastores.corpus import CorpusError, build_corpus
from specnb.datastores.manifest import meta_hash
from specnb.datastores.rest import RestIndex
from tests.conftest import tiny
from tests.test_rest import make_corpus


@pytest.fixture
def foreign(tmp_path):
    """A folder of the user's own files."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "important.txt").write_text("keep me")
    (folder / "notes.md").write_text("# notes")
    return folder


def build(argv: list[str], capsys) -> tuple[int, str]:
    code = main(["datastore", "build", *argv])
    return code, capsys.readouterr().err


def test_a_folder_that_is_not_a_store_is_never_replaced(source, foreign, tmp_path, capsys, isolated_cache):
    for argv in (["rest", str(source), "--model", "tiny-llama", "--out", str(foreign)],
                 ["rest", str(source), "--model", "tiny-llama", "--out", str(foreign), "--overwrite"],
                 ["crest", str(source), "--model", "tiny-llama", "--out", str(foreign / "notes.md"), "--overwrite"]):
        code, err = build(argv, capsys)
        assert code == 2 and "is not a" in err and "refusing to replace it" in err and err.count("\n") == 1
    assert sorted(p.name for p in foreign.iterdir()) == ["important.txt", "notes.md"]
    assert (foreign / "important.txt").read_text() == "keep me"
    with pytest.raises(ExistsError):
        build_corpus(source, "tiny-llama", out=foreign, force=True, progress=False)
    from specnb.datastores.dense import build_datastore

    for overwrite in (False, True):
        with pytest.raises(ExistsError):
            build_datastore(tiny("llama"), make_corpus([[1, 2, 3]]), foreign, overwrite=overwrite, progress=False)
    code, err = build(["dense", str(source), "--model", "tiny-llama", "--out", str(foreign)], capsys)
    assert code == 2 and "is not a dense datastore; refusing" in err
    assert sorted(p.name for p in foreign.iterdir()) == ["important.txt", "notes.md"]


def test_a_store_is_replaced_only_with_overwrite_and_only_once_complete(source, tmp_path, capsys, monkeypatch,
                                                                        isolated_cache):
    out = tmp_path / "out" / "store"
    assert build(["rest", str(source), "--model", "tiny-llama", "--out", str(out)], capsys)[0] == 0
    before = RestIndex.load(out).meta
    code, err = build(["rest", str(source), "--model", "tiny-llama", "--out", str(out)], capsys)
    assert code == 2 and "pass --overwrite" in err

    def interrupted(folder, meta):
        raise KeyboardInterrupt  # after text.npy and sa.npy of the new store are written

    monkeypatch.setattr(rest, "write_meta", interrupted)
    code, err = build(["rest", str(source), "--model", "tiny-llama", "--out", str(out), "--overwrite",
                       "--max-tokens", "10"], capsys)
    assert code == 130 and "Traceback" not in err
    assert RestIndex.load(out).meta == before  # the old store, whole
    assert [p.name for p in out.parent.iterdir()] == ["store"]  # no temporary folder left
    monkeypatch.undo()
    monkeypatch.setenv("SPECNB_CACHE", str(isolated_cache))
    assert build(["rest", str(source), "--model", "tiny-llama", "--out", str(out), "--overwrite",
                  "--max-tokens", "10"], capsys)[0] == 0
    assert RestIndex.load(out).meta["num_tokens"] < before["num_tokens"]


def test_stores_record_checksums_and_refuse_damage(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "rest"
    RestIndex.build(make_corpus([rng.integers(0, 50, 100_000).tolist()]), path, progress=False)
    meta = json.loads((path / "meta.json").read_text())
    assert set(meta["files"]) == {"text.npy", "sa.npy"} and meta["tokenizer"]["fingerprint"] == "x"
    assert meta["builder"]["suffix_array"] == "pydivsufsort"
    assert main(["datastore", "verify", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"ok: rest store {path}, 2 files")

    text = path / "text.npy"
    data = bytearray(text.read_bytes())
    data[len(data) // 2 + 1] ^= 0xFF  # one byte, between the sampled chunks: only the full check sees it
    text.write_bytes(bytes(data))
    RestIndex.load(path)
    assert main(["datastore", "verify", str(path)]) == 1  # damage: exit 1 (2 is a user error)
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and "does not match its recorded checksum" in err
    assert err.count("\n") == 1

    header = 128  # the .npy header kept: the file still loads as an array of the right shape
    text.write_bytes(bytes(data[:header]) + rng.integers(0, 256, len(data) - header, dtype=np.uint8).tobytes())
    with pytest.raises(CorpusError, match="does not match its recorded checksum"):
        RestIndex.load(path)
    text.write_bytes(bytes(data[:-4]))
    with pytest.raises(CorpusError, match="recorded: damaged"):
        RestIndex.load(path)


def test_crest_refuses_a_rest_store_of_another_tokenizer(source, tmp_path, capsys, isolated_cache):
    store = tmp_path / "rest"
    assert build(["rest", str(source), "--model", "tiny-llama", "--out", str(store)], capsys)[0] == 0
    meta = json.loads((store / "meta.json").read_text())
    meta["tokenizer"].update(name="other-model", fingerprint="0" * 16)
    (store / "meta.json").write_text(json.dumps({**meta, "meta_sha256": meta_hash(meta)}))
    code, err = build(["crest", str(source), "--model", "tiny-llama", "--rest", str(store), "--out",
                       str(tmp_path / "c.sqlite")], capsys)
    assert code == 2 and "tokenizer of 'other-model'" in err and not (tmp_path / "c.sqlite").exists()
    assert "model 'tiny-llama' has a different one" in err  # the name given, not a cache path


def test_a_store_of_another_tokenizer_is_refused_before_the_model_loads(source, tmp_path, capsys, monkeypatch,
                                                                         isolated_cache):
    """REST, CREST and dense stores record their tokenizer: a bench given one built for another tokenizer stops
    with one line naming it, judged from the model's tokenizer alone (load_model is never called)."""
    import sqlite3

    from specnb.datastores.dense import BuildConfig, build_datastore
    from specnb.eval import methods
    from specnb.model import models

    rest_store, crest_store, dense_store = tmp_path / "rest", tmp_path / "c.sqlite", tmp_path / "dense"
    assert build(["rest", str(source), "--model", "tiny-llama", "--out", str(rest_store)], capsys)[0] == 0
    assert build(["crest", str(source), "--model", "tiny-llama", "--rest", str(rest_store), "--t", "50", "--out",
                  str(crest_store)], capsys)[0] == 0
    build_datastore(tiny("llama"), build_corpus(str(source), tiny("llama"), progress=False), dense_store,
                    BuildConfig(n_next=4, dims=8, seq_len=32, overlap=8, batch_tokens=128), progress=False)
    stores = {"rest": rest_store, "crest": crest_store, "dense": dense_store}
    for method, store in stores.items():
        methods.check_before_loading("tiny-llama", methods.options_for([method], {}, [str(store)]))  # the same: ok
    other = {"name": "other-model", "vocab_size": 7, "fingerprint": "0" * 16}
    for store in (rest_store, dense_store):
        meta = json.loads((store / "meta.json").read_text())
        meta["tokenizer"] = other
        (store / "meta.json").write_text(json.dumps({**meta, "meta_sha256": meta_hash(meta)}))
    crest_store.chmod(0o644)
    with sqlite3.connect(crest_store) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'tokenizer'", (json.dumps(other),))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    for method, store in stores.items():
        code = main(["bench", "--model", "tiny-llama", "--methods", method, "--datastore", str(store), "--n", "1",
                     "--max-new-tokens", "4", "--out", str(tmp_path / f"{method}.csv")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "tokenizer of 'other-model'" in err, (method, err)


def test_atomic_helpers_leave_the_old_version_on_failure(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a").write_text("old")
    with pytest.raises(ExistsError):
        with atomic_folder(folder):
            pass
    with pytest.raises(RuntimeError), atomic_folder(folder, replace=True) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError
    assert (folder / "a").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.txt"]
    with atomic_folder(folder, replace=True) as tmp:
        (tmp / "b").write_text("new")
    assert [p.name for p in folder.iterdir()] == ["b"] and sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.txt"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_atomic_writes_reach_the_disk_before_their_rename(tmp_path, monkeypatch, exchange):
    """Every new file and folder is fsynced before the rename that publishes it, the parent folder after; where
    the system cannot exchange two paths (forced here), the old folder is moved aside and the result is the
    same."""
    import os

    from specnb import atomic

    events = []
    real = {name: getattr(os, name) for name in ("fsync", "replace", "rename")}
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("sync", os.readlink(f"/proc/self/fd/{fd}")))
                        or real["fsync"](fd))
    for name in ("replace", "rename"):
        monkeypatch.setattr(os, name, functools.partial(
            lambda name, a, b: events.append((name, str(a), str(b))) or real[name](a, b), name))
    if not exchange:
        monkeypatch.setattr(atomic, "_renameat2", lambda: None)
    elif atomic._renameat2() is None:
        pytest.skip("this system has no renameat2")
    swap = atomic._exchange
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: swap(a, b) and not events.append(("exchange", a, b)))
    path = tmp_path / "f.txt"
    with atomic_file(path) as tmp:
        tmp.write_text("new")
    assert events == [("sync", str(tmp)), ("replace", str(tmp), str(path)), ("sync", str(tmp_path))]
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a").write_text("old")
    events.clear()
    with atomic_folder(folder, replace=True) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b").write_text("new")
    synced = [e[1] for e in events if e[0] == "sync"]
    first_rename = next(i for i, e in enumerate(events) if e[0] != "sync")
    assert {str(tmp / "sub" / "b"), str(tmp / "sub"), str(tmp)} <= set(synced[:first_rename])
    assert events[-1] == ("sync", str(tmp_path)) and events[first_rename][0] == ("exchange" if exchange else "rename")
    assert [p.name for p in folder.rglob("*")] == ["sub", "b"] and (folder / "sub" / "b").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f.txt"]


def flip_middle_byte(path) -> None:
    """One byte in the middle of ``path`` changed, the size kept (a bad sector, a stray write)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def crest_docs() -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, 50, int(rng.integers(50, 300))).tolist() for _ in range(120)]


def test_a_damaged_crest_store_is_refused_when_opened_and_by_verify(crest_docs, tmp_path, capsys):
    """One byte flipped in the middle of a CREST store's SQLite file (same size): ``datastore verify`` says so in
    one line with exit 1 (it died with sqlite3's traceback), opening it for decoding is refused naming the file
    (it drafted nothing and exited 0), and the bench refuses it in one line."""
    from specnb.datastores.crest import CrestStore, build_crest

    path = tmp_path / "c.sqlite"
    build_crest(RestIndex.build(make_corpus(crest_docs), progress=False), path, ns=(1, 2, 3), t=1000,
                progress=False).close()
    assert main(["datastore", "verify", str(path)]) == 0
    capsys.readouterr()
    flip_middle_byte(path)
    assert main(["datastore", "verify", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and err.count("\n") == 1 and str(path) in err, err
    with pytest.raises(CorpusError, match="not a valid CREST store") as info:
        CrestStore(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "def f(x):"}\n')
    assert main(["bench", "--model", "tiny-llama", "--prompts", str(prompts), "--n", "1", "--max-new-tokens",
                 "4", "--methods", "crest", "--datastore", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and err.count("\n") == 1 and str(path) in err, err


def test_verify_reports_damage_in_one_line_with_exit_1_for_every_kind(source, tmp_path, capsys, isolated_cache):
    """REST, CREST, dense and corpus stores, each with one byte flipped in the middle of its largest file: exit 1
    and one line naming the file; a path with nothing at it stays a user error (exit 2)."""
    from specnb.datastores.dense import BuildConfig, build_datastore

    target = tiny("llama")
    rest_store = tmp_path / "rest"
    assert build(["rest", str(source), "--model", "tiny-llama", "--out", str(rest_store)], capsys)[0] == 0
    crest_store = tmp_path / "c.sqlite"
    assert build(["crest", str(source), "--model", "tiny-llama", "--rest", str(rest_store), "--t", "50", "--out",
                  str(crest_store)], capsys)[0] == 0
    corpus = build_corpus(str(source), target, progress=False)
    dense_store = tmp_path / "dense"
    build_datastore(target, corpus, dense_store, BuildConfig(n_next=4, dims=8, seq_len=32, overlap=8,
                                                              batch_tokens=128), progress=False)
    for store in (rest_store, crest_store, dense_store, corpus.path):
        assert main(["datastore", "verify", str(store)]) == 0, store
        capsys.readouterr()
        files = [store] if store.is_file() else [f for f in store.iterdir() if f.name != "meta.json"]
        victim = max(files, key=lambda f: f.stat().st_size)
        flip_middle_byte(victim)
        assert main(["datastore", "verify", str(store)]) == 1, store
        err = capsys.readouterr().err
        assert err.startswith("specnb: error: ") and err.count("\n") == 1 and str(store) in err, (store, err)
    assert main(["datastore", "verify", str(tmp_path / "nothing")]) == 2


@pytest.mark.parametrize("damage", ["value", "truncated"])
def test_a_damaged_meta_json_is_refused_by_open_and_verify_in_one_line(source, tmp_path, capsys, damage):
    """meta.json holds the other files' checksums, so it checks itself: one changed digit in a count, or the
    file cut short, and opening the store or verifying it is one line naming meta.json."""
    from specnb.datastores.corpus import load_corpus

    corpus = build_corpus(str(source), tiny("llama"), out=tmp_path / "corpus", progress=False)
    meta = corpus.path / "meta.json"
    text = meta.read_text()
    count = f'"num_tokens": {corpus.num_tokens}'
    assert count in text
    meta.write_text(text.replace(count, f'"num_tokens": {corpus.num_tokens + 1}') if damage == "value"
                    else text[:len(text) // 2])
    with pytest.raises(CorpusError, match="meta.json") as refused:
        load_corpus(corpus.path)
    assert "\n" not in str(refused.value)
    assert main(["datastore", "verify", str(corpus.path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and err.count("\n") == 1 and "meta.json" in err, err


def test_two_resumable_builds_of_one_store_never_share_its_partial(tmp_path):
    """A resumable build (keep_partial) fills ``<store>.partial``, a name every build of that store shares; a
    second build while the first runs is refused instead of writing into the first one's files (two notebooks
    building one dense store at once left a corrupt hidden-state file)."""
    out = tmp_path / "store"
    with atomic_folder(out, keep_partial=True) as first:
        (first / "part.npy").write_text("first")
        with pytest.raises(ExistsError, match="another process is building"):
            with atomic_folder(out, keep_partial=True):
                pass
    assert (out / "part.npy").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no partial, no lock left behind


def test_a_damaged_store_or_an_empty_datastore_path_fails_the_bench_before_the_model_loads(source, tmp_path,
                                                                                           capsys, monkeypatch,
                                                                                           isolated_cache):
    """A REST or CREST store that is damaged or no store at all stops ``specnb bench`` in one line before its model
    loads (it was found only once the model had loaded), and so does ``--datastore crest=`` (it was read as no
    datastore, and the default store was used)."""
    from specnb.model import models

    rest_store, crest_store = tmp_path / "rest", tmp_path / "c.sqlite"
    assert build(["rest", str(source), "--model", "tiny-llama", "--out", str(rest_store)], capsys)[0] == 0
    assert build(["crest", str(source), "--model", "tiny-llama", "--rest", str(rest_store), "--t", "20", "--out",
                  str(crest_store)], capsys)[0] == 0
    with (rest_store / "text.npy").open("ab") as f:
        f.write(b"\0")
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(crest_store.read_bytes()[:-100])
    (tmp_path / "text.sqlite").write_text("not a store")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    for method, datastore, message in (("rest", f"rest={rest_store}", "text.npy holds"),
                                       ("crest", f"crest={cut}", "is not a valid CREST store"),
                                       ("crest", str(tmp_path / "text.sqlite"), "is not a valid CREST store"),
                                       ("crest", "crest=", "--datastore 'crest=' names no path"),
                                       ("rest", "", "--datastore '' names no path")):
        code = main(["bench", "--model", "tiny-llama", "--methods", method, "--datastore", datastore, "--n", "1"])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("specnb: error: ") and message in err and err.count("\n") == 1, err


def test_dense_build_refuses_an_existing_store_without_overwrite_before_the_model_loads(source, tmp_path, capsys,
                                                                                       monkeypatch):
    """A dense store at --out is replaced only with --overwrite, as REST's and CREST's are, and that is said before
    the model loads (the build loaded it, then returned the old store, or failed on a damaged one)."""
    from specnb.model import models

    store = tmp_path / "ds"
    store.mkdir()
    (store / "meta.json").write_text('{"kind": "dense"}')  # a store of ours, damaged
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    code, err = build(["dense", str(source), "--model", "tiny-llama", "--out", str(store)], capsys)
    assert code == 2 and "already holds a dense datastore; pass --overwrite" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"]
    assert [p.name for p in store.iterdir()] == ["meta.json"]


@pytest.mark.parametrize("what", ["folder", "foreign meta.json", "text file", "empty file", "SQLite",
                                  "SQLite with another meta"])
def test_verify_calls_a_path_that_holds_no_store_a_user_error(what, tmp_path, capsys):
    """``datastore verify`` on something that is no store (a user's folder or file, another program's SQLite) is a
    user error, exit 2 (it said "damaged", exit 1, the answer for a store whose bytes changed)."""
    import contextlib
    import sqlite3

    path = tmp_path / "thing"
    if what in ("folder", "foreign meta.json"):
        path.mkdir()
        (path / ("meta.json" if what == "foreign meta.json" else "notes.txt")).write_text('{"name": "mine"}')
    elif what.startswith("SQLite"):
        table = "meta" if "meta" in what else "t"
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute(f"CREATE TABLE {table} (key TEXT, value TEXT)")
            db.execute(f"INSERT INTO {table} VALUES ('kind', '\"other\"')")
    else:
        path.write_text("" if what == "empty file" else "my notes")
    assert main(["datastore", "verify", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"specnb: error: {path} is ") and "not a" in err and err.count("\n") == 1, err
