"""Interruptions of the real process: a specnb command in a child process killed (SIGKILL, as ``kill -9``) or
Ctrl-C'd (SIGINT) at a chosen call (:mod:`tests.interrupting`, no timing), then what it left behind.

Whatever the moment: a store being overwritten is still the old store, whole and usable, until the new one is
complete; no half store, model file or checkpoint is ever at the final path; a resumed dense build never mixes
files of another run; ``datastore verify`` sees damage that the sampled check made when opening does not; Ctrl-C
during the bench is one line and a non-zero exit, with the CSV whole.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import shutil
import signal
import sys
import textwrap

import numpy as np
import pytest

from specnb.cli import main
from specnb.datastores.ann import IndexParams
from specnb.datastores.corpus import build_corpus, load_corpus
from specnb.datastores.crest import CrestStore
from specnb.datastores.dense import BuildConfig, build_datastore, load_datastore
from specnb.datastores.manifest import CHUNK, SAMPLES, verify_store
from specnb.paths import cache_dir
from tests.conftest import tiny
from tests.interrupting import interrupted

REPEAT = pytest.mark.repeat  # the same protection at another moment: make test-full
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # the child's floats equal this process's
# every filesystem step of replacing a folder store (whatever the implementation takes: renames, an exchange,
# the removal of the old one), counted while atomic._swap_in runs
SWAP_STEPS = dict(at=["os:rename", "os:replace", "shutil:rmtree", "specnb.atomic:_exchange"],
                  within="specnb.atomic:_swap_in", after=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh SPECNB_CACHE, here and in every child, sharing the CPU kernels built in the usual one (a child
    would compile them again: half a minute)."""
    path = tmp_path / "cache"
    kernels = cache_dir() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    path.mkdir()
    (path / "kernels").symlink_to(kernels, target_is_directory=True)
    monkeypatch.setenv("SPECNB_CACHE", str(path))
    return path


def one_line(err: str, start: str) -> bool:
    """Whether stderr says one thing, in one line starting with ``start``, after nothing but progress bars."""
    lines = [line for line in err.splitlines() if line.strip()]
    return "Traceback" not in err and bool(lines) and lines[-1].startswith(start) \
        and all("%|" in line for line in lines[:-1])


def leftovers(folder, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_a_forked_child_ends_and_reads_its_environment_as_a_fresh_interpreter():
    """The children below are forked from a server that imported torch and specnb (tests/interrupting.py): each
    still exits with its own status, dies of the signal it lets through, and computes on the threads and in the
    folder a fresh ``python -m tests.interrupting`` would."""
    from tests.interrupting import ROOT

    ran = interrupted(code="import os, sys, torch\nprint(torch.get_num_threads(), os.getcwd(), os.environ['X'])\n"
                           "sys.exit(3)", env={"OMP_NUM_THREADS": "1", "X": "given"})
    assert (ran.returncode, ran.stdout) == (3, f"1 {ROOT} given\n"), ran.stderr
    assert interrupted(code="raise KeyboardInterrupt").returncode == -signal.SIGINT
    killed = interrupted(code="import os\nos.remove(os.devnull + 'x')", at="os:remove")
    assert killed.killed and killed.stdout == ""


# ------------------------------------------------------------------------------- CREST overwrite


@pytest.fixture
def crest_old(source, tmp_path, cache, capsys):
    """A REST store and a CREST store (t = 50) built from it, to overwrite with t = 5."""
    rest = tmp_path / "rest"
    assert main(["datastore", "build", "rest", str(source), "--model", "tiny-llama", "--out", str(rest)]) == 0
    out = tmp_path / "stores" / "c.sqlite"
    argv = ["datastore", "build", "crest", str(source), "--model", "tiny-llama", "--rest", str(rest), "--out", str(out)]
    assert main([*argv, "--t", "50"]) == 0
    capsys.readouterr()
    return out, [*argv, "--t", "5", "--overwrite"]


@pytest.mark.parametrize("at, sig", [
    pytest.param("specnb.datastores.crest:encode_tree", "KILL", marks=REPEAT),  # computing the new trees
    ("specnb.datastores.crest:_rows_hash", "KILL"),  # every row inserted into the new file, not yet committed
    pytest.param("specnb.datastores.crest:_rows_hash", "INT", marks=REPEAT),
])
def test_an_interrupted_crest_overwrite_keeps_the_old_store(crest_old, at, sig, cache, capsys):
    out, argv = crest_old
    result = interrupted(argv, at=at, nth=3 if "encode" in at else 1, sig=sig)
    assert result.fired, result.stderr
    if sig == "KILL":
        assert result.returncode == -signal.SIGKILL
    else:  # Ctrl-C: exit 130, one line, the temporary file removed
        assert result.returncode == 130 and one_line(result.stderr, "specnb: interrupted"), result.stderr
        assert leftovers(out.parent, keep={"c.sqlite"}) == []
    store = CrestStore(out)
    store.verify()  # every tree of the old store, whole
    assert set(store.meta["t"]) == {50}
    store.db.close()
    assert main(argv) == 0  # and the overwrite, run again, completes
    assert set(CrestStore(out).meta["t"]) == {5}


# --------------------------------------------------------------------------- dense overwrite


DENSE_FLAGS = ["--seq-len", "16", "--batch-tokens", "80", "--dims", "8", "--components", "8", "--sample", "2000",
               "--M", "8", "--ef-construction", "20", "--ef-search", "16"]


def dense_config(n_next: int) -> BuildConfig:
    """The BuildConfig of ``DENSE_FLAGS --n-next n_next`` (the CLI's overlap: 64)."""
    return BuildConfig(n_next=n_next, dims=8, n_components=8, sample_size=2000, seq_len=16, overlap=64,
                       batch_tokens=80, index=IndexParams(8, 20, 16))


def dense_argv(source, out, n_next: int) -> list[str]:
    return ["datastore", "build", "dense", str(source), "--model", "tiny-llama", "--out", str(out), "--n-next",
            str(n_next), *DENSE_FLAGS]


@pytest.mark.parametrize("trap, kept", [
    (dict(at="specnb.datastores.embed:last_hidden_states", nth=3), 4),  # extracting hidden states
    pytest.param(dict(at="specnb.datastores.ann:AnnIndex.build"), 4, marks=REPEAT),  # every state extracted, indexing
    # the new store complete, after the first step of swapping it in (the same code as the corpus's)
    pytest.param(dict(**SWAP_STEPS, nth=1), 6, marks=REPEAT),
], ids=["extracting", "indexing", "swapping"])
def test_an_interrupted_dense_overwrite_keeps_the_old_store(trap, kept, source, tmp_path, cache, capsys):
    """Killed while a store of --n-next 6 overwrites one of --n-next 4: the store at the path is whole, the old
    one until the new one is complete (there was a moment with no store there, between two renames)."""
    out = tmp_path / "stores" / "ds"
    assert main(dense_argv(source, out, 4)) == 0
    capsys.readouterr()
    result = interrupted([*dense_argv(source, out, 6), "--overwrite"], **trap, env=SINGLE_THREAD)
    assert result.killed, result.stderr
    store = load_datastore(out)
    assert store.n_next == kept and verify_store(out).startswith("ok: dense store")
    del store
    assert main([*dense_argv(source, out, 6), "--overwrite"]) == 0  # run again: resumes, completes, replaces
    assert load_datastore(out).n_next == 6 and verify_store(out)
    assert leftovers(out.parent, keep={"ds"}) == []  # no partial, lock or old copy left


# ------------------------------------------------------------------------------ corpus --force


@pytest.mark.parametrize("trap, kept", [
    (dict(mid_write="tokens.npy"), "old"),  # half the new tokens written
    pytest.param(dict(at="specnb.datastores.corpus:write_meta"), "old", marks=REPEAT),  # arrays written, no meta
    (dict(**SWAP_STEPS, nth=1), "new"),  # each step of putting the complete new corpus in the old one's place
    pytest.param(dict(**SWAP_STEPS, nth=2), "new", marks=REPEAT),
    (dict(at="specnb.datastores.corpus:write_meta", sig="INT"), "old"),
], ids=["mid-write", "before-meta", "swap-1", "swap-2", "ctrl-c"])
def test_an_interrupted_corpus_rebuild_keeps_the_old_corpus(trap, kept, source, tmp_path, cache, capsys):
    """``corpus build --force`` over a corpus, interrupted: a whole corpus at the path at every moment, the old
    one until the new one is complete."""
    out = tmp_path / "corpora" / "code"
    argv = ["corpus", "build", str(source), "--model", "tiny-llama", "--out", str(out)]
    assert main(argv) == 0
    old = load_corpus(out)
    old_tokens, old_meta = np.array(old.tokens), old.meta
    del old
    capsys.readouterr()
    new = [*argv, "--max-tokens", "100", "--force"]
    result = interrupted(new, **trap)
    assert result.fired, result.stderr
    corpus = load_corpus(out)
    if kept == "new":
        assert corpus.num_tokens < old_tokens.shape[0] and verify_store(out)
    else:
        assert corpus.meta == old_meta and np.array_equal(corpus.tokens, old_tokens) and verify_store(out)
    if trap.get("sig") == "INT":
        assert result.returncode == 130 and one_line(result.stderr, "specnb: interrupted"), result.stderr
        assert leftovers(out.parent, keep={"code"}) == []
    else:
        assert result.returncode == -signal.SIGKILL
    del corpus
    assert main(new) == 0 and load_corpus(out).num_tokens < old_tokens.shape[0]


def test_force_rebuilds_a_damaged_corpus(source, tmp_path, cache, capsys):
    """A corpus whose checksums fail is refused when opened ("build it again"); ``--force`` rebuilds it (it was
    refused as "not a corpus"), while a folder that is not a corpus is still never replaced."""
    out = tmp_path / "corpus"
    argv = ["corpus", "build", str(source), "--model", "tiny-llama", "--out", str(out)]
    assert main(argv) == 0
    tokens = out / "tokens.npy"
    data = bytearray(tokens.read_bytes())
    data[-1] ^= 0xFF
    tokens.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(argv) == 2 and "damaged; build it again" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0 and verify_store(out)
    rest = tmp_path / "rest"
    assert main(["datastore", "build", "rest", str(source), "--model", "tiny-llama", "--out", str(rest)]) == 0
    capsys.readouterr()
    assert main([*argv[:-1], str(rest), "--force"]) == 2
    assert "is not a corpus; refusing to replace it" in capsys.readouterr().err


# ---------------------------------------------------------------- dense resume with other parameters


def extraction(store) -> dict[str, np.ndarray]:
    return {name: np.array(np.load(store.path / name)) for name in
            ("hidden.f16.npy", "values.i32.npy", "positions.i64.npy", "corpus_tokens.i32.npy")}


def assert_same_extraction(a, b) -> None:
    ea, eb = extraction(a), extraction(b)
    for name in ea:
        assert ea[name].shape == eb[name].shape and np.array_equal(ea[name], eb[name]), name
    assert a.meta["extract"] == b.meta["extract"]


@pytest.fixture
def batches(monkeypatch) -> list[int]:
    """A list that grows by one at every forward batch of an extraction in this process."""
    from specnb.datastores import embed

    calls: list[int] = []
    real = embed.last_hidden_states
    monkeypatch.setattr(embed, "last_hidden_states", lambda *args: calls.append(1) or real(*args))
    return calls


def test_a_dense_build_never_resumes_the_partial_of_another_run(source, tmp_path, cache, capsys, batches):
    """A build killed after 8 of its batches leaves ``<out>.partial`` with its progress. Resumed with other
    parameters, with a corpus of the same name and size but other tokens, or with the same parameters after a
    run of other parameters was killed in that partial before it recorded any progress: each gives exactly
    what a fresh build gives (it starts over), never rows of two runs. The same run resumes."""
    target = tiny("llama")
    corpus = build_corpus(str(source), target, progress=False)  # the corpus the CLI builds (same cache)
    killed = tmp_path / "a" / "ds"
    result = interrupted(dense_argv(source, killed, 4), at="specnb.datastores.embed:last_hidden_states", nth=10,
                         env=SINGLE_THREAD)
    assert result.killed, result.stderr
    partial = killed.with_name("ds.partial")
    assert json.loads((partial / "progress.json").read_text())["batches_done"] == 8

    def resumed(name, config, corpus=corpus):
        out = tmp_path / name / "ds"
        out.parent.mkdir()
        shutil.copytree(partial, out.with_name("ds.partial"))
        return build_datastore(target, corpus, out, config, progress=False)

    def fresh(name, config, corpus=corpus):
        return build_datastore(target, corpus, tmp_path / name / "ds", config, progress=False)

    def forwards(build) -> tuple[object, int]:
        """(the store ``build()`` returns, the forward batches it ran)."""
        batches.clear()
        return build(), len(batches)

    reference, total = forwards(lambda: fresh("fresh4", dense_config(4)))
    same, calls = forwards(lambda: resumed("same", dense_config(4)))
    assert calls == total - 8  # the same run resumes after its 8 batches, and gives a fresh build's rows
    assert_same_extraction(same, reference)
    assert reference.meta["timings"]["extract_seconds"] > 0  # timed whole
    assert same.meta["timings"]["extract_seconds"] is None  # no process saw the whole: no time, not a part's

    other, calls = forwards(lambda: resumed("other", dense_config(6)))
    assert calls == total  # started over
    assert_same_extraction(other, fresh("fresh6", dense_config(6)))

    tokens = np.array(corpus.tokens)
    edited = dataclasses.replace(corpus, tokens=(tokens + 1) % 256)  # same name, documents and size
    other, calls = forwards(lambda: resumed("tokens", dense_config(4), edited))
    assert calls == total
    assert_same_extraction(other, fresh("fresh-other", dense_config(4), edited))

    # a run of other parameters killed in A's partial before its first progress record, then A again
    twice = tmp_path / "twice" / "ds"
    twice.parent.mkdir()
    shutil.copytree(partial, twice.with_name("ds.partial"))
    result = interrupted(dense_argv(source, twice, 6), at="specnb.datastores.embed:last_hidden_states", nth=1,
                         env=SINGLE_THREAD)
    assert result.killed, result.stderr
    again, calls = forwards(lambda: build_datastore(target, corpus, twice, dense_config(4), progress=False))
    assert calls == total
    assert_same_extraction(again, same)
    assert main(["datastore", "verify", str(twice)]) == 0


def test_a_dense_build_stopped_after_its_extraction_does_not_extract_again(source, tmp_path, cache, batches,
                                                                            monkeypatch):
    """Stopped while fitting the key transform (every hidden state written), a build reruns no forward pass and
    gives a fresh build's store, its extraction untimed; a run of other parameters stopped in that partial, then
    the first again, starts over (the mark of a complete extraction is gone with the files it described). In this
    process: what matters is where the build stops, not how."""
    from specnb.datastores import dense, embed

    target = tiny("llama")
    corpus = build_corpus(str(source), target, progress=False)
    reference = build_datastore(target, corpus, tmp_path / "fresh" / "ds", dense_config(4), progress=False)
    total = len(batches)

    def stopped(out, config, at, after: int = 0):
        real = getattr(at[0], at[1])

        def stop(*args, **kwargs):
            if len(batches) >= after:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(*at, stop)
            with pytest.raises(KeyboardInterrupt):
                build_datastore(target, corpus, out, config, progress=False)

    out = tmp_path / "a" / "ds"
    stopped(out, dense_config(4), (dense, "fit_projection"))
    batches.clear()
    resumed = build_datastore(target, corpus, out, dense_config(4), progress=False)
    assert not batches
    assert_same_extraction(resumed, reference)
    assert resumed.meta["timings"]["extract_seconds"] is None

    twice = tmp_path / "twice" / "ds"
    stopped(twice, dense_config(4), (dense, "fit_projection"))
    batches.clear()
    stopped(twice, dense_config(6), (embed, "last_hidden_states"), after=3)
    batches.clear()
    again = build_datastore(target, corpus, twice, dense_config(4), progress=False)
    assert len(batches) == total
    assert_same_extraction(again, reference)


# ----------------------------------------------------- full verify: damage outside the sampled chunks


def unsampled_byte(size: int) -> int | None:
    """An offset no chunk of the sampled hash covers (manifest.sampled_hash), or None if they cover the file."""
    covered = np.zeros(size, dtype=bool)
    for i in range(SAMPLES):
        start = max(0, size - CHUNK) * i // (SAMPLES - 1)
        covered[start:start + CHUNK] = True
    free = np.flatnonzero(~covered)
    return int(free[len(free) // 2]) if len(free) else None


def test_full_verify_sees_damage_outside_the_sampled_chunks(tmp_path, cache, capsys):
    """One byte flipped where the sampled check made on opening does not look, in each file of a dense store
    and of a corpus large enough to have such bytes: the store still opens, ``datastore verify`` (always the
    full sha256 of every file) says so in one line naming the file, exit 1."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        words = rng.choice(["def", "return", "x", "+", "(", ")", ":", "\n    ", "self", "if", "else"], 2500)
        (src / f"m{i}.py").write_text(" ".join(words))
    target = tiny("llama")
    corpus = build_corpus(str(src), target, progress=False)
    dense = build_datastore(target, corpus.select(np.arange(2)), tmp_path / "dense", dense_config(20),
                            progress=False).path
    checked = []
    for store, opener in ((corpus.path, load_corpus), (dense, load_datastore)):
        for file in sorted(f for f in store.iterdir() if f.name != "meta.json"):
            offset = unsampled_byte(file.stat().st_size)
            if offset is None:
                continue
            data = bytearray(file.read_bytes())
            data[offset] ^= 0xFF
            file.write_bytes(bytes(data))
            opener(store)  # the sampled check on opening does not see it
            assert main(["datastore", "verify", str(store)]) == 1, file
            err = capsys.readouterr().err
            assert one_line(err, "specnb: error: ") and str(file) in err, err
            data[offset] ^= 0xFF
            file.write_bytes(bytes(data))
            assert main(["datastore", "verify", str(store)]) == 0
            capsys.readouterr()
            checked.append(f"{store.name}/{file.name}")
    assert any(c.startswith("dense/") for c in checked) and any(not c.startswith("dense/") for c in checked), checked


# ---------------------------------------------------------------------- model fetch and conversion


@pytest.fixture
def ghost(tmp_path, cache, monkeypatch):
    """An embedded model "ghost" whose GGUF file comes in two parts from a local package ``ghost_parts``; its
    spec is registered here and by :func:`ghost_code` in a child."""
    from specnb.model import model_names

    package = tmp_path / "pkgs" / "ghost_parts"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes() for _ in range(2)]
    for i, part in enumerate(parts):
        (package / "data" / f"part{i}.bin").write_bytes(part)
    spec = dataclasses.replace(model_names.EMBEDDED["gemma-3-270m"], name="ghost", packages=("ghost-parts",),
                               parts=tuple(("ghost_parts", f"data/part{i}.bin") for i in range(2)),
                               sha256=hashlib.sha256(b"".join(parts)).hexdigest(), size=sum(map(len, parts)))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setitem(model_names.EMBEDDED, "ghost", spec)
    return spec, b"".join(parts), {"PYTHONPATH": str(package.parent)}


def ghost_code(spec, then: str) -> str:
    """A child's snippet: register ``spec`` as in :func:`ghost`, then run ``then``."""
    return textwrap.dedent(f"""
        import dataclasses, sys
        from specnb.model import model_names, models
        from specnb.cli import main

        model_names.EMBEDDED["ghost"] = dataclasses.replace(model_names.EMBEDDED["gemma-3-270m"], name="ghost",
            packages={spec.packages!r}, parts={spec.parts!r}, sha256={spec.sha256!r}, size={spec.size!r})
    """) + textwrap.dedent(then)


def test_a_fetch_whose_sha256_differs_is_refused_and_leaves_nothing(ghost, cache, capsys):
    from specnb.model import model_names

    spec, _, _ = ghost
    for wrong in (dataclasses.replace(spec, sha256="0" * 64), dataclasses.replace(spec, size=spec.size + 1)):
        model_names.EMBEDDED["ghost"] = wrong
        assert main(["models", "fetch", "ghost"]) == 2
        err = capsys.readouterr().err
        assert one_line(err, "specnb: error: ghost: joined file has the wrong sha256/size"), err
        assert not model_names.gguf_file("ghost").exists() and not model_names.converted_dir("ghost").exists()
        assert leftovers(model_names.gguf_file("ghost").parent, keep=set()) == []  # no temporary file either


def test_an_interrupted_join_leaves_nothing_at_the_final_path(ghost, cache):
    """Killed half-way through writing the joined GGUF: nothing at its final name (a file there is taken as
    joined and checked, and is never checked again); the next fetch joins it whole."""
    from specnb.model import model_names, models

    spec, joined, env = ghost
    result = interrupted(code=ghost_code(spec, "sys.exit(main(['models', 'fetch', 'ghost']))"),
                         mid_write="*.gguf", env=env)
    assert result.killed, result.stderr
    assert not model_names.gguf_file("ghost").exists()
    assert models._join_parts(spec).read_bytes() == joined


LOADER = """
from specnb.model.models import tiny_model

TINY = tiny_model("llama")  # before the loaders below replace the ones tiny_model uses


class Loader:
    \"\"\"AutoTokenizer / AutoModelForCausalLM for a conversion: the tiny llama's.\"\"\"

    def __init__(self, what):
        self.what = what

    def from_pretrained(self, *args, **kwargs):
        return TINY.model if self.what == "model" else TINY.tokenizer
"""


def test_an_interrupted_gguf_conversion_leaves_no_half_checkpoint(ghost, cache, monkeypatch, capsys):
    """Killed once the converted weights are saved but not the tokenizer: nothing at the converted model's folder
    (``config.json`` there means "ready"); fetching again converts it whole. The conversion's loaders return the
    tiny llama (the GGUF parts are random bytes: what is tested is where the files go)."""
    from specnb.model import model_names, models

    spec, _, env = ghost
    patch = ("import transformers\n"  # models imports the model loader where it loads
             "models.AutoTokenizer, transformers.AutoModelForCausalLM = Loader('tokenizer'), Loader('model')\n")
    result = interrupted(code=ghost_code(spec, LOADER + patch + "sys.exit(main(['models', 'fetch', 'ghost']))"),
                         at="transformers:PreTrainedModel.save_pretrained", after=True, env=env)
    assert result.killed, result.stderr
    out = model_names.converted_dir("ghost")
    assert model_names.gguf_file("ghost").exists()  # joined and checked before the conversion
    assert not out.exists()
    namespace: dict = {}
    exec(LOADER, namespace)
    monkeypatch.setattr(models, "AutoTokenizer", namespace["Loader"]("tokenizer"))
    monkeypatch.setattr("transformers.AutoModelForCausalLM", namespace["Loader"]("model"))
    assert main(["models", "fetch", "ghost"]) == 0
    monkeypatch.undo()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out)("ab")["input_ids"] == [97, 98]
    reference = tiny("llama").model.state_dict()
    assert all(np.array_equal(v.numpy(), reference[k].numpy()) for k, v in loaded.state_dict().items())


def test_a_damaged_cached_gguf_or_checkpoint_is_made_again(ghost, cache, monkeypatch, capsys):
    """The joined GGUF file cut to half, or one byte of it changed (its size kept), and a converted checkpoint
    whose weights file was cut short: the next fetch (and so load_model) says so in one line and makes it
    again, instead of failing minutes later inside a reader."""
    from specnb.model import model_names, models

    spec, joined, _ = ghost
    namespace: dict = {}
    exec(LOADER, namespace)
    monkeypatch.setattr(models, "AutoTokenizer", namespace["Loader"]("tokenizer"))
    monkeypatch.setattr("transformers.AutoModelForCausalLM", namespace["Loader"]("model"))
    assert main(["models", "fetch", "ghost"]) == 0
    gguf, out = model_names.gguf_file("ghost"), model_names.converted_dir("ghost")
    weights = next(out.glob("*.safetensors"))
    whole = weights.read_bytes()
    flipped = bytearray(joined)
    flipped[len(joined) // 2] ^= 0xFF
    for path, damage, why in [(gguf, joined[:len(joined) // 2], "bytes, 600,000 recorded"),
                              (gguf, bytes(flipped), "its sha256 differs"),
                              (weights, whole[:100], f"{weights.name}: 100 bytes")]:
        capsys.readouterr()
        path.write_bytes(damage)
        assert main(["models", "fetch", "ghost"]) == 0
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.strip() and "%|" not in line]  # but progress bars
        assert len(said) == 1 and said[0].startswith(f"specnb: {path.parent if path == weights else path} is "
                                                     "damaged (") and why in said[0], err
        assert gguf.read_bytes() == joined and weights.read_bytes() == whole
    capsys.readouterr()
    assert main(["models", "fetch", "ghost"]) == 0 and capsys.readouterr().err == ""  # whole: nothing said


# ------------------------------------------------------------------------------------------ bench


@pytest.fixture
def bench_argv(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"def f{i}(x):"}) + "\n" for i in range(2)))
    out = tmp_path / "r.csv"
    earlier = "method,prompt_id,new_tokens,seconds\nar,old1,4,0.5\npld,old1,4,0.25\n"  # an earlier run's CSV
    out.write_text(earlier)
    return ["bench", "--model", "tiny-llama", "--prompts", str(prompts), "--n", "2", "--max-new-tokens", "4",
            "--methods", "pld", "--out", str(out)], out, earlier


def read_csv(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def test_ctrl_c_during_the_bench_warm_up(bench_argv):
    """Ctrl-C in the warm-up (before any prompt): exit 130, one line, the CSV of an earlier run untouched."""
    argv, out, earlier = bench_argv
    result = interrupted(argv, at="specnb.eval.runner:generate", sig="INT")
    assert result.fired and result.returncode == 130, result.stderr
    assert one_line(result.stderr, "specnb: interrupted"), result.stderr
    assert out.read_text() == earlier
    assert leftovers(out.parent, keep={"r.csv", "p.jsonl"}) == []


def test_a_kill_while_the_csv_is_rewritten_keeps_it_whole(bench_argv):
    """The summary rows bring new columns, so the CSV is rewritten under the wider header: killed half-way
    through that write, the CSV still holds every per-prompt row, whole."""
    argv, out, _ = bench_argv
    # writes to a *.csv: the first prompt's (a new header), the second's (appended), the summary's (rewrite)
    result = interrupted(argv, mid_write="*.csv", nth=3)
    assert result.killed, result.stderr
    rows = read_csv(out)
    assert [(r["method"], r["prompt_id"]) for r in rows] == [("ar", "p0"), ("pld", "p0"), ("ar", "p1"), ("pld", "p1")]
    assert all(r["seconds"] and r["new_tokens"] for r in rows)


@REPEAT
def test_ctrl_c_while_the_csv_is_rewritten(bench_argv):
    """Ctrl-C while the first prompt's rows replace the earlier run's CSV (a new header): exit 130 in one line,
    the CSV whole: that prompt's rows and their summary."""
    argv, out, _ = bench_argv
    result = interrupted(argv, at="os:replace", within="specnb.eval.bench:CsvSink.__call__", sig="INT")
    assert result.fired and result.returncode == 130, result.stderr
    assert one_line(result.stderr, "specnb: interrupted after 1 of 2 prompts"), result.stderr
    rows = read_csv(out)
    assert [(r["method"], r["prompt_id"]) for r in rows] == [("ar", "p0"), ("pld", "p0"), ("ar", "ALL"),
                                                              ("pld", "ALL")]
    assert rows[-1]["speedup_vs_ar"]
    assert leftovers(out.parent, keep={"r.csv", "p.jsonl"}) == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.serial  # starts a local Ray
def test_ctrl_c_while_a_local_ray_stops_after_a_build(tmp_path, cache):
    """A Ctrl-C while the local Ray of a finished ``--ray`` build stops: Ray stops whole (the signal is held off
    meanwhile) and the command exits 0 without a traceback (Ray's own exit handler printed one, exit 0)."""
    source = tmp_path / "src"
    source.mkdir()
    for i in range(4):
        (source / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * (i + 2))
    argv = ["datastore", "build", "rest", str(source), "--model", "tiny-llama", "--out", str(tmp_path / "rest"),
            "--ray", "--workers", "1", "--shards", "2"]
    result = interrupted(argv, at="ray._private.node:Node.kill_all_processes", sig="INT",
                         env={"RAY_USAGE_STATS_ENABLED": "0"})
    assert result.fired and result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr


def test_ctrl_c_says_so_after_the_last_progress_bar(source, tmp_path, cache):
    """Ctrl-C during a dense extraction, progress bars on: ``specnb: interrupted`` is the last line; the bar the
    interrupted loop held used to repaint itself after it."""
    result = interrupted(dense_argv(source, tmp_path / "ds", 4), at="specnb.datastores.embed:last_hidden_states",
                         nth=3, sig="INT", env={"TQDM_DISABLE": "0", **SINGLE_THREAD})
    assert result.fired and result.returncode == 130
    assert one_line(result.stderr, "specnb: interrupted"), result.stderr
