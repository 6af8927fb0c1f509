"""DReSD: dense datastores and the DenseDrafter (first-token filter, shapes, checks, losslessness)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny

from specnb.core.drafter import DecodeState
from specnb.core.generate import generate
from specnb.datastores import dense as dense_store
from specnb.datastores.ann import AnnIndex, IndexParams
from specnb.datastores.corpus import CorpusError, TokenCorpus, TokenizerInfo
from specnb.datastores.dense import BuildConfig, DenseDatastore, build_datastore, load_datastore, subset_datastore
from specnb.datastores.manifest import meta_hash, verify_store
from specnb.draft_shapes import retrieval_shape
from specnb.drafters.dense import DenseDrafter
from specnb.eval.methods import make_drafter
from specnb.eval.replay import replay_greedy, teacher_forced_hidden

PROMPTS = ("def add(a, b):", "hello world, hello", "the cat sat on")
CONFIG = BuildConfig(n_next=20, dims=16, seq_len=32, overlap=8, batch_tokens=128,
                     index=IndexParams(M=8, ef_construction=60, ef_search=32))


def own_outputs(target, n_tokens: int = 40) -> TokenCorpus:
    """A corpus of the target's own greedy continuations (an ID datastore in miniature) plus noise."""
    docs = [generate(target, p, max_new_tokens=n_tokens) for p in (*PROMPTS, "zq")]
    ids = [np.asarray(g.prompt_ids + g.tokens, dtype=np.int32) for g in docs]
    ids.append(np.random.default_rng(0).integers(0, 256, 60).astype(np.int32))
    info, _ = TokenizerInfo.of(target)
    starts = np.concatenate([[0], np.cumsum([d.shape[0] for d in ids])]).astype(np.int64)
    return TokenCorpus(np.concatenate(ids), starts, {"name": "own", "tokenizer": info.__dict__})


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, DenseDatastore]:
    root = tmp_path_factory.mktemp("dense")
    return {arch: build_datastore(tiny(arch), own_outputs(tiny(arch)), root / arch, CONFIG, progress=False)
            for arch in ("llama", "gemma3")}


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_greedy_output_equals_autoregressive(stores, arch, verify):
    target = tiny(arch)
    accepted = 0
    for shape, prompt in (((10, 10), PROMPTS[0]), ((3, 20), PROMPTS[1])):
        ar = generate(target, prompt, max_new_tokens=32)
        out = generate(target, prompt, DenseDrafter(stores[arch], *shape), max_new_tokens=32, verify=verify)
        assert out.tokens == ar.tokens
        accepted += sum(c.accepted for c in out.stats.calls)
    assert accepted > 10  # the store holds these very continuations


def test_priced_dense_is_lossless_and_buckets_by_first_token_matches(stores):
    from specnb.drafters.priced import PricedTreeDrafter
    from tests.test_priced import LinearCost

    target = tiny("llama")
    priced = PricedTreeDrafter(DenseDrafter(stores["llama"], 3, 20, merge="votes"), LinearCost(0.0))
    for prompt in PROMPTS[:2]:
        out = generate(target, prompt, priced, max_new_tokens=32)
        assert out.tokens == generate(target, prompt, max_new_tokens=32).tokens
        assert out.stats.tokens_per_call > 1.0
    assert priced.steps[1:].sum() > 0  # steps with first-token matches land in their own buckets


@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_vote_merged_tree_is_lossless_ranked_and_within_budget(stores, verify):
    target = tiny("gemma3")
    drafter = DenseDrafter(stores["gemma3"], 2, 5, merge="votes")
    for prompt in PROMPTS:
        assert generate(target, prompt, drafter, max_new_tokens=32, verify=verify).tokens == \
            generate(target, prompt, max_new_tokens=32).tokens
    store = stores["gemma3"]
    hidden = np.asarray(store.hidden(), dtype=np.float32)
    for row in range(0, store.rows, 23):
        root = int(store.values[row, 0])
        rows = drafter.continuations(hidden[row], root, 5)
        state = DecodeState(tokens=torch.tensor([root]), hidden=torch.from_numpy(hidden[row]),
                            max_depth=5, prompt_len=0)
        draft = drafter.propose(state)
        assert draft.num_nodes <= 10
        # the first node is the most common first token among the continuations
        first, counts = np.unique(rows[:, 0], return_counts=True)
        assert counts[first == int(draft.tokens[0])][0] == counts.max()
    with pytest.raises(ValueError, match="merge"):
        DenseDrafter(store, merge="best")


def test_first_token_filter_shapes_and_dedup(stores):
    store = stores["llama"]
    hidden = np.asarray(store.hidden(), dtype=np.float32)
    drafter = DenseDrafter(store, k=4, w=6, neighbours=64)
    for row in range(0, store.rows, 17):
        root = int(store.values[row, 0])
        rows = drafter.candidates(hidden[row], root, 6)
        assert 1 <= rows.shape[0] <= 4 and rows.shape[1] == 6
        assert len({tuple(r) for r in rows.tolist()}) == rows.shape[0]  # distinct
        assert (rows[:, 0] >= 0).all()
        assert drafter.report.first_token_matches >= rows.shape[0]
        # the row's own value is among the drafts (it is its own nearest neighbour)
        own = store.values[row, 1:7].astype(np.int64)
        if store.pad_id in own:
            own[np.argmax(own == store.pad_id) + 1:] = -1
        if own[0] >= 0:
            assert any((r == own).all() for r in rows)
    # Every kept neighbour started with the root: a root no value starts with gives nothing.
    assert drafter.candidates(hidden[0], 300, 6).shape == (0, 6)


def test_empty_result_falls_back_to_plain_decoding(stores):
    target = tiny("llama")
    store = stores["llama"]
    drafter = DenseDrafter(store, 2, 5)
    drafter.candidates = lambda hidden, root, w: np.empty((0, w), dtype=np.int64)  # nothing retrieved
    ar = generate(target, "xyz", max_new_tokens=12)
    out = generate(target, "xyz", drafter, max_new_tokens=12)
    assert out.tokens == ar.tokens and all(c.drafted_nodes == 0 for c in out.stats.calls)


def test_shapes_and_factory(stores):
    assert retrieval_shape("3x20") == (3, 20) and retrieval_shape("greedy") == (3, 20)
    assert retrieval_shape("sampling") == (10, 10)
    with pytest.raises(ValueError, match="shape"):
        retrieval_shape("3-20")
    with pytest.raises(ValueError, match="n-next"):
        DenseDrafter(stores["llama"], 3, 21)
    with pytest.raises(ValueError, match="option k must be >= 1"):
        DenseDrafter(stores["llama"], 0, 5)
    drafter = make_drafter("dense", tiny("llama"), {"datastore": str(stores["llama"].path),
                                                 "draft_shape": "greedy"})
    assert (drafter.k, drafter.w) == (3, 20) and drafter.needs_hidden_state
    drafter = make_drafter("dense", tiny("llama"), {"datastore": str(stores["llama"].path), "k": 4})
    assert (drafter.k, drafter.w) == (4, 10)
    with pytest.raises(ValueError, match="--datastore"):
        make_drafter("dense", tiny("llama"))


def test_a_datastore_refuses_another_model_or_tokenizer(stores, tmp_path):
    store = stores["llama"]
    with pytest.raises(CorpusError, match="tiny-llama"):
        make_drafter("dense", tiny("qwen2"), {"datastore": str(store.path)})  # same tokenizer, other model
    meta = json.loads((store.path / "meta.json").read_text())
    meta["tokenizer"]["fingerprint"] = "0" * 16
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in store.path.iterdir():
        (copy / f.name).symlink_to(f)
    (copy / "meta.json").unlink()
    (copy / "meta.json").write_text(json.dumps({**meta, "meta_sha256": meta_hash(meta)}))
    with pytest.raises(CorpusError, match="tokenizer"):
        load_datastore(copy).check(tiny("llama"))


def test_a_subset_store_equals_a_fresh_build_of_its_documents(stores, tmp_path, monkeypatch):
    """The corpus-size sweep's stores: a parent's rows of some documents, their own transform and index; asked
    again, the store is opened as it is (no transform fitted, no index built, no file rewritten)."""
    parent = stores["llama"]
    corpus = TokenCorpus(np.asarray(parent.corpus_tokens()), np.asarray(parent.doc_starts()), parent.meta["corpus"])
    docs = corpus.sample_docs(0.5, seed=3)
    sub = subset_datastore(parent, docs, tmp_path / "sub", CONFIG)
    fresh = build_datastore(tiny("llama"), corpus.select(docs), tmp_path / "fresh", CONFIG, progress=False)
    assert sub.rows == fresh.rows < parent.rows and sub.meta["extract"]["subset_of"] == parent.path.name
    assert np.array_equal(sub.values, fresh.values)
    for name in ("positions", "corpus_tokens", "doc_starts"):
        assert np.array_equal(getattr(sub, name)(), getattr(fresh, name)()), name
    np.testing.assert_allclose(np.asarray(sub.hidden(), np.float32), np.asarray(fresh.hidden(), np.float32),
                               rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(np.abs(sub.keys), np.abs(fresh.keys), atol=2e-2)  # PCA axes up to their sign
    written = {f.name: f.stat().st_mtime_ns for f in sub.path.iterdir()}

    def rebuilt(*args, **kwargs):
        raise AssertionError("an existing subset store was built again")

    monkeypatch.setattr(dense_store, "_index_into", rebuilt)
    monkeypatch.setattr(dense_store, "atomic_folder", rebuilt)
    again = subset_datastore(parent, docs, tmp_path / "sub", CONFIG)  # reused, not rebuilt
    assert again.path == sub.path and np.array_equal(again.values, sub.values)
    assert {f.name: f.stat().st_mtime_ns for f in sub.path.iterdir()} == written
    monkeypatch.undo()
    assert verify_store(sub.path)


def test_interrupted_or_corrupt_build_never_loads(tmp_path, monkeypatch):
    target = tiny("qwen2")
    corpus = own_outputs(target, 8)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(AnnIndex, "build", crash)
    with pytest.raises(KeyboardInterrupt):
        build_datastore(target, corpus, tmp_path / "ds", CONFIG, progress=False)
    assert (tmp_path / "ds.partial").exists() and not (tmp_path / "ds").exists()
    with pytest.raises(CorpusError, match="interrupted build"):
        load_datastore(tmp_path / "ds")
    monkeypatch.undo()
    store = build_datastore(target, corpus, tmp_path / "ds", CONFIG, progress=False)
    assert store.rows == corpus.num_tokens - corpus.num_docs and not (tmp_path / "ds.partial").exists()

    values = np.array(store.values[:-3])  # a copy: the store memory-maps the file we overwrite
    del store
    np.save(tmp_path / "ds" / "values.i32.npy", values)  # a truncated values file
    with pytest.raises(CorpusError, match="corrupt"):
        load_datastore(tmp_path / "ds")
    with pytest.raises(CorpusError, match="no dense datastore"):
        load_datastore(tmp_path / "nothing")

    store = build_datastore(target, corpus, tmp_path / "ds", CONFIG, progress=False, overwrite=True)
    assert set(store.meta["files"]) >= {"values.i32.npy", "keys.f32.npy", "projection.npz", "index.hnsw"}
    assert verify_store(tmp_path / "ds").startswith(f"ok: dense store {tmp_path / 'ds'}")
    del store
    keys = tmp_path / "ds" / "keys.f32.npy"
    data = bytearray(keys.read_bytes())
    data[-1] ^= 1  # one bit of the last key: inside the sample checked on open
    keys.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match="does not match its recorded checksum"):
        load_datastore(tmp_path / "ds")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_replay_with_teacher_forced_states_matches_decoding(stores, arch):
    """Replaying DReSD from one teacher-forced pass gives the accepted lengths real decoding gets."""
    target = tiny(arch)
    out = generate(target, PROMPTS[0], DenseDrafter(stores[arch], 10, 10), max_new_tokens=32)
    prompt, tokens = torch.tensor(out.prompt_ids), torch.tensor(out.tokens)
    hidden = teacher_forced_hidden(target, prompt, tokens)
    assert hidden.shape == (prompt.shape[0] + tokens.shape[0], target.model.config.hidden_size)
    replay = replay_greedy(DenseDrafter(stores[arch], 10, 10), prompt, tokens, hidden)
    assert [c.accepted for c in replay.calls] == [c.accepted for c in out.stats.calls]
    with pytest.raises(ValueError, match="hidden"):
        replay_greedy(DenseDrafter(stores[arch], 10, 10), prompt, tokens)


@pytest.mark.parametrize("flags, message", [
    (["--M", "0"], "--M must be >= 2, got 0"),  # hnswlib crashed (exit 139) after the whole extraction
    (["--ef-construction", "0"], "--ef-construction must be >= 1, got 0"),
    (["--ef-search", "0"], "--ef-search must be >= 1, got 0"),
    (["--n-next", "0"], "--n-next must be >= 1, got 0"),
    (["--dims", "0"], "--dims must be >= 1, got 0"),
    (["--dims", "300"], "--dims (300) must be <= --components (256)"),  # was cut to 256 without a word
    (["--seq-len", "0"], "--seq-len must be >= 1, got 0"),
    (["--batch-tokens", "100"], "--batch-tokens (100) must be >= --seq-len + overlap (512 + 64)"),
    (["--sample", "0"], "--sample must be >= 2, got 0"),
    (["--sample", "100"], "--sample (100) must be >= --components (256)"),  # failed in scikit-learn, after it
    (["--nlist", "-1"], "--nlist must be >= 0, got -1"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),  # was read as no limit
    (["--max-tokens", "-3"], "--max-tokens must be >= 1, got -3"),
])
def test_bad_build_sizes_are_one_line_errors_before_the_model_loads(flags, message, source, tmp_path, monkeypatch,
                                                                    capsys):
    """Every size of ``datastore build dense`` is checked when its BuildConfig is made, before the model loads: one
    line, exit 2, and no store, ``.partial`` or ``.lock`` left (they failed after the extraction, or crashed)."""
    from specnb.cli import main
    from specnb.model import models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model loaded before the sizes were checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "ds"
    assert main(["datastore", "build", "dense", str(source), "--model", "tiny-llama", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_dims_past_the_hidden_size_and_damaged_stores_are_refused_before_any_work(stores, tmp_path):
    """``dims`` above the target's hidden size is refused before the extraction (it was cut to it without a word);
    :func:`check_built_for`, what a bench runs before its model loads, refuses a damaged store or one of another
    model in one line (the bench found them only once the model had loaded), and passes a sound one."""
    import shutil

    target = tiny("llama")  # hidden size 64
    with pytest.raises(ValueError, match=r"--dims \(100\) must be <= 64, the hidden size of tiny-llama"):
        build_datastore(target, own_outputs(target, 4), tmp_path / "wide", BuildConfig(dims=100, n_components=128),
                        progress=False)
    assert not list(tmp_path.iterdir())
    store = tmp_path / "store"
    shutil.copytree(stores["llama"].path, store)
    dense_store.check_built_for(store, "tiny-llama")
    with pytest.raises(CorpusError, match="holds hidden states of model 'tiny-llama', not of 'tiny-qwen2'"):
        dense_store.check_built_for(store, "tiny-qwen2")  # the same byte tokenizer, another model's states
    with (store / "values.i32.npy").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(CorpusError, match="values.i32.npy holds") as refused:
        dense_store.check_built_for(store, "tiny-llama")
    assert "\n" not in str(refused.value)
    (store / "meta.json").write_text("{")
    with pytest.raises(CorpusError, match="is corrupt"):
        dense_store.check_built_for(store, "tiny-llama")
    with pytest.raises(CorpusError, match="no dense datastore"):
        dense_store.check_built_for(tmp_path / "nothing", "tiny-llama")
