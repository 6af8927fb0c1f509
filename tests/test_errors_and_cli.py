"""Bad input gives one clear error; the CLI and the Draft utilities behave as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny

from specnb import Draft, generate, load_model
from specnb.cli import main
from specnb.core.datasets import jsonl
from specnb.core.draft import DraftError
from specnb.drafters.context import ContextNgramDrafter
from specnb.eval.methods import OptionError, make_drafter, options_for, parse_options, split_datastores
from specnb.model.models import ModelError
from specnb.study.profiles import get_profile


@pytest.mark.parametrize("prompt", ["", [], torch.tensor([], dtype=torch.long)])
def test_empty_prompt(prompt):
    with pytest.raises(ValueError, match="empty prompt"):
        generate(tiny("llama"), prompt)


def test_prompt_longer_than_context():
    target = tiny("llama")
    with pytest.raises(ValueError, match="exceeds the model's context"):
        generate(target, [1] * target.max_context, max_new_tokens=4)


def test_prompt_ids_outside_vocabulary():
    with pytest.raises(ValueError, match="vocabulary|token ids"):
        generate(tiny("llama"), [1, 2, 10_000])


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"verify": "sideways"}, "verification mode"),
])
def test_invalid_decoding_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(tiny("llama"), [1, 2, 3], **kwargs)


@pytest.mark.parametrize("name", ["no-such-model", "tiny-transformerxl"])
def test_unknown_model(name):
    with pytest.raises(ModelError, match="unknown"):
        load_model(name)


@pytest.mark.parametrize("argv, message", [
    (["corpus", "build", "code", "--model", "gemma-3-27Om"], "unknown model 'gemma-3-27Om'"),
    (["datastore", "build", "rest", "code", "--model=gemma3"], "unknown model 'gemma3'"),
    (["datastore", "build", "dense", "code", "--model", "no-such/model"], "HF_HUB_OFFLINE is set"),
    (["ngram-table", "--model", "tiny-gpt"], "unknown tiny architecture 'gpt'"),
    (["bench", "--methods", "sd", "--draft", "qwen-0.5b"], "unknown model 'qwen-0.5b'"),
])
def test_unknown_model_names_fail_at_once(argv, message):
    """A mistyped --model / --draft is one line and exit 2 before torch loads or the hub is asked (it used to
    spend ~25 s on hub retries): a fresh interpreter, so the time includes everything the command imports."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a well-formed hub id is then refused without a request
    script = (f"import sys, specnb.cli\ncode = specnb.cli.main({argv!r})\n"
              "print(sorted(m for m in sys.modules if m in ('torch', 'transformers')))\nsys.exit(code)")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parents[1])  # this checkout's specnb
    seconds = time.perf_counter() - start
    assert out.returncode == 2 and out.stderr.startswith("specnb: error: ") and out.stderr.count("\n") == 1, out
    assert message in out.stderr and out.stdout == "[]\n", out  # refused before torch was imported
    assert seconds < 5, f"{argv} took {seconds:.1f} s"  # generous: ~0.1 s alone, the machine may be busy


def test_model_names_resolve_without_the_hub(tmp_path, monkeypatch):
    from specnb.model.model_names import resolve_name

    assert resolve_name("gemma-3-270m").kind == "embedded" and resolve_name("tiny-qwen2").source == "qwen2"
    local = resolve_name(str(tmp_path))
    assert local.kind == "local" and local.offline  # from_pretrained then never asks the hub
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    for name in ("org/model", "./missing", "../a/b", "a/b/c", "~/nothing"):
        with pytest.raises(ModelError):
            resolve_name(name)


@pytest.mark.parametrize("kwargs", [{"k": 0}, {"w": 0}, {"max_ngram": 1, "min_ngram": 2}])
def test_invalid_draft_shape(kwargs):
    with pytest.raises(ValueError):
        ContextNgramDrafter(**kwargs)


@pytest.mark.parametrize("tokens, parents", [([1, 2], [-1, 1]), ([1, 2], [-1, -2]), ([-3], [-1]), ([1, 2], [-1])])
def test_invalid_trees_are_refused(tokens, parents):
    with pytest.raises(DraftError):
        Draft(torch.tensor(tokens), torch.tensor(parents))


def test_draft_token_outside_vocabulary():
    class Bad(ContextNgramDrafter):
        def propose(self, state):
            return Draft.chain([10_000])

    with pytest.raises(ValueError, match="vocabulary"):
        generate(tiny("llama"), [1, 2, 3], Bad())


def test_unknown_method_and_profile():
    with pytest.raises(ValueError, match="unknown method"):
        make_drafter("telepathy", tiny("llama"))
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("huge")


def test_trie_merges_shared_prefixes_deterministically():
    rows = [[5, 6, 7], [5, 6, 8], [9, -1, -1], [5, 6, 7]]
    a, b = Draft.from_rows(rows), Draft.from_rows(torch.tensor(rows))
    assert a.tokens.tolist() == [5, 6, 7, 8, 9] and a.parents.tolist() == [-1, 0, 1, 1, -1]
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    assert a.source_row.tolist() == [0, 0, 0, 1, 2]
    assert a.paths().tolist() == [[1, 2, 3], [1, 2, 4], [5, -1, -1]]
    assert a.truncate(2).tokens.tolist() == [5, 6, 9] and a.truncate(2).parents.tolist() == [-1, 0, -1]


def test_context_ngram_ranks_by_count_then_recency():
    import numpy as np

    from specnb.drafters.context import continuations

    context = np.array([1, 2, 9, 1, 2, 7, 1, 2, 7, 1, 2, 8, 1, 2])
    assert continuations(context, 2, 1) == [[7], [8], [9]]  # 7 twice; then 8 (more recent) before 9
    once = np.array([1, 2, 3, 4, 5, 1, 2, 3])  # one match: its continuation, cut at the end of the context
    assert continuations(once, 3, 2) == [[4, 5]] and continuations(once, 3, 10) == [[4, 5, 1, 2, 3]]


def test_context_ngram_continuations_are_those_a_scan_of_every_window_finds():
    """Against the definition, window by window: every continuation of an earlier match of the last q tokens,
    counted, ranked by count then by its latest match."""
    import numpy as np

    from specnb.drafters.context import continuations

    rng = np.random.default_rng(0)
    for _ in range(300):
        context = rng.integers(0, int(rng.integers(2, 12)), int(rng.integers(2, 80)))
        for q, w in ((1, 1), (1, 4), (2, 3), (3, 10)):
            n, found = len(context), {}
            for i in range(n - q):
                if (context[i:i + q] == context[n - q:]).all():
                    row = tuple(context[i + q:i + q + w].tolist())
                    found[row] = (found.get(row, (0, 0))[0] + 1, i)
            ranked = sorted(found, key=lambda row: (-found[row][0], -found[row][1]))
            assert continuations(context, q, w) == [list(row) for row in ranked], (context, q, w)


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n"
                    + json.dumps({"id": "b", "messages": [{"role": "user", "content": "yo"}]}) + "\n")
    a, b = jsonl(path)
    assert a.text == "hi" and b.messages[0]["content"] == "yo"
    path.write_text(json.dumps({"prompt": "no id"}) + "\n")
    with pytest.raises(ValueError, match="missing 'id'"):
        jsonl(path)


def test_cli_bench_writes_csv(tmp_path, capsys):
    out = tmp_path / "r.csv"
    code = main(["bench", "--model", "tiny-qwen2", "--n", "2", "--max-new-tokens", "12", "--methods",
                 "ar,hf,hf-pld,pld", "--out", str(out)])
    assert code == 0
    import pandas as pd

    table = pd.read_csv(out)
    for column in ["method", "prompt_id", "new_tokens", "calls", "seconds", "tokens_per_s", "tokens_per_call",
                   "identical_to_ar", "speedup_vs_ar"]:
        assert column in table
    per_prompt = table[table.prompt_id != "ALL"]
    assert len(per_prompt) == 8 and per_prompt.identical_to_ar.all()
    assert set(table[table.prompt_id == "ALL"].method) == {"ar", "hf", "hf-pld", "pld"}
    assert "speedup_vs_ar" in capsys.readouterr().out
    # the summary's numbers are the per-prompt rows' (metrics.py definitions)
    ar_seconds = per_prompt[per_prompt.method == "ar"].seconds.sum()
    summary = table[table.prompt_id == "ALL"].set_index("method")
    for method, group in per_prompt.groupby("method"):
        row = summary.loc[method]
        assert row.new_tokens == group.new_tokens.sum() and row.calls == group.calls.sum()
        assert row.tokens_per_s == pytest.approx(group.new_tokens.sum() / group.seconds.sum())
        assert row.tokens_per_call == pytest.approx((group.new_tokens.sum() - len(group)) / group.calls.sum())
        assert row.speedup_vs_ar == pytest.approx(ar_seconds / group.seconds.sum())
        assert float(row.identical_to_ar) == 1.0
    for method in ("ar", "hf"):  # one call per token after the prefill's
        group = per_prompt[per_prompt.method == method]
        assert (group.calls == group.new_tokens - 1).all()


def test_cli_bad_input_is_one_line(capsys):
    assert main(["bench", "--model", "tiny-llama", "--methods", "ar,warp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: unknown method") and err.count("\n") == 1


def test_cli_models_list(capsys):
    assert main(["models", "list"]) == 0
    assert "gemma-3-270m" in capsys.readouterr().out


def test_missing_model_package_names_the_fetch_command(tmp_path, monkeypatch):
    import dataclasses

    from specnb.model import models

    spec = dataclasses.replace(models.EMBEDDED["gemma-3-270m"], name="ghost-model",
                               parts=(("specnb_no_such_part_package", "data/part01.bin"),))
    monkeypatch.setitem(models.EMBEDDED, "ghost-model", spec)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="specnb models fetch ghost-model"):
        load_model("ghost-model")


def test_draft_not_installed_fails_before_the_target_loads(tmp_path, monkeypatch, capsys):
    import dataclasses

    from specnb.model import models

    spec = dataclasses.replace(models.EMBEDDED["gemma-3-270m"], name="ghost-model",
                               parts=(("specnb_no_such_part_package", "data/part01.bin"),))
    monkeypatch.setitem(models.EMBEDDED, "ghost-model", spec)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))

    def no_loading(*args, **kwargs):
        raise AssertionError("the target loaded before the draft was checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    argv = ["bench", "--model", "tiny-llama", "--methods", "sd", "--draft", "ghost-model", "--n", "1"]
    assert main(argv) == 2
    assert "specnb models fetch ghost-model" in capsys.readouterr().err
    with pytest.raises(ModelError, match="specnb models fetch ghost-model"):  # the Python API checks it too
        options_for(["ar", "sd"], {"draft": "ghost-model"}, [])


@pytest.mark.parametrize("argv, message", [
    (["--methods", "rest", "--datastore", "{tmp}/none"], "no REST datastore at {tmp}/none"),
    (["--methods", "rest"], "no REST datastore at {tmp}/datastores/rest-code-tiny-llama"),  # the default store
    (["--methods", "crest-priced", "--datastore", "{tmp}/none.sqlite"], "no CREST store at {tmp}/none.sqlite"),
    (["--methods", "auto", "-o", "crest={tmp}/none.sqlite"], "no CREST store at {tmp}/none.sqlite"),
    (["--methods", "dense", "--datastore", "{tmp}/none"], "no dense datastore at {tmp}/none;"),
    (["--methods", "dense", "--datastore", "code"], "no dense datastore at {tmp}/datastores/dense/code-tiny-llama"),
    (["--methods", "mixed-adaptive", "-o", "roofline={tmp}/none.csv"], "roofline table {tmp}/none.csv does not"),
    (["--methods", "sd", "--draft", "self:4"], "self-draft needs 1 <= L < 4"),  # tiny models have 4 layers
    (["--weights", "gguf"], "weights 'gguf' needs a GGUF file"),
])
def test_missing_inputs_fail_before_the_target_loads(argv, message, tmp_path, monkeypatch, capsys):
    from specnb.model import models

    def no_loading(*args, **kwargs):
        raise AssertionError("the target loaded before the stores were checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["bench", "--model", "tiny-llama", "--n", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: ") and message.format(tmp=tmp_path) in err, err


def test_dense_build_checks_its_source_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from specnb.model import models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model loaded before the corpus source was checked")

    monkeypatch.setattr(models, "load_model", no_loading)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    assert main(["datastore", "build", "dense", str(tmp_path / "missing"), "--model", "tiny-llama"]) == 2
    assert "is not `code`, `chat` or an existing file/directory" in capsys.readouterr().err


def test_existing_stores_pass_the_check(source, tmp_path, monkeypatch):
    """Sound stores of the model's tokenizer, and a roofline table, pass every check made before the model loads."""
    from specnb.datastores.corpus import build_corpus
    from specnb.datastores.crest import build_crest
    from specnb.datastores.dense import BuildConfig, build_datastore
    from specnb.datastores.rest import RestIndex
    from specnb.eval.methods import check_before_loading
    from tests.conftest import tiny

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    corpus = build_corpus(str(source), "tiny-llama", progress=False)
    rest = RestIndex.build(corpus, tmp_path / "rest", progress=False)
    build_crest(rest, tmp_path / "crest.sqlite", ns=(1, 2), t=10, progress=False).close()
    build_datastore(tiny("llama"), corpus, tmp_path / "dense", BuildConfig(n_next=4, dims=8, seq_len=32, overlap=8,
                                                                           batch_tokens=128), progress=False)
    (tmp_path / "roofline.csv").write_text("")
    datastores = [f"rest={tmp_path}/rest", f"crest-priced={tmp_path}/crest.sqlite", f"dense={tmp_path}/dense"]
    options = options_for(["ar", "rest", "crest-priced", "dense", "auto", "mixed-adaptive"],
                          {"crest": str(tmp_path / "crest.sqlite"), "dense": str(tmp_path / "dense"),
                           "roofline": str(tmp_path / "roofline.csv")}, datastores)
    check_before_loading("tiny-llama", options)  # nothing missing: no error
    check_before_loading("tiny-llama", options_for(["ar", "sd"], {"draft": "self:3"}))


def test_a_self_draft_is_typed_once_at_the_edge():
    """``self:L`` becomes a SelfDraft when the options are parsed; past that edge only the typed value is taken."""
    from specnb.draft_shapes import SelfDraft
    from specnb.eval.methods import parse_options

    options = options_for(["sd", "mcsd"], {"draft": "self:3"})
    assert options["sd"].draft == options["mcsd"].draft == SelfDraft(3)
    assert parse_options("sd", {"draft": SelfDraft(2)}).draft == SelfDraft(2)
    with pytest.raises(ValueError, match="option draft must be str or SelfDraft, got 3"):
        parse_options("sd", {"draft": 3})
    with pytest.raises(ValueError, match="L must be an integer >= 1"):
        SelfDraft(0)


def test_datastore_per_method():
    assert split_datastores([]) == (None, {})
    assert split_datastores(["a/b", "dense=x/y", "rest=z"]) == ("a/b", {"dense": "x/y", "rest": "z"})
    assert split_datastores(["odd=name"]) == ("odd=name", {})  # not a method: a path containing '='
    with pytest.raises(ValueError, match="METHOD=PATH"):
        split_datastores(["a", "b"])
    options = options_for(["ar", "rest", "crest-priced", "dense"], {}, ["shared", "crest=c", "dense=d"])
    assert options["rest"].datastore == "shared"
    assert options["crest-priced"].datastore == "c"  # a priced method reads its base method's store
    assert options["dense"].datastore == "d"


# ------------------------------------------------------------------------------------------ typed options


def test_options_are_typed_once_and_errors_name_the_option():
    rest = parse_options("rest", {"w": "5", "max_nodes": "32", "datastore": "x"})
    assert (rest.w, rest.max_nodes, rest.datastore) == (5, 32, "x")
    assert parse_options("crest", {"max_nodes": "none"}).max_nodes is None
    assert parse_options("dense-priced", {"datastore": "d"}).merge == "votes"  # its own default
    with pytest.raises(OptionError, match="option w must be an integer, got 'abc'"):
        parse_options("pld", {"w": "abc"})
    with pytest.raises(OptionError, match="option merge must be one of rows, votes"):
        parse_options("dense", {"datastore": "d", "merge": "mean"})
    with pytest.raises(OptionError, match="min_query .* must not exceed max_query"):
        parse_options("rest", {"min_query": 9, "max_query": 4})
    with pytest.raises(OptionError, match="option k must be >= 1"):
        parse_options("pld", {"k": 0})
    with pytest.raises(OptionError, match="has no option 'x'.*reads k, w, max_ngram, min_ngram"):
        parse_options("pld", {"x": 1})
    with pytest.raises(OptionError, match="option max_ngram must be an integer, got 2.5"):
        parse_options("pld", {"max_ngram": 2.5})


@pytest.mark.parametrize("given, datastores, message", [
    ({"unknownkey": "1"}, [], "-o unknownkey: read by none"),
    ({"draft_shape": "4x2"}, [], "--draft-shape: read by none"),
    ({"draft": "self:2"}, [], "--draft: read by none"),
    ({}, ["store"], "--datastore: read by none"),
    ({}, ["rest=store"], "--datastore rest=...: read by none"),
])
def test_an_option_no_chosen_method_reads_is_refused(given, datastores, message):
    with pytest.raises(OptionError, match=message) as info:
        options_for(["ar", "pld"], given, datastores)
    assert "pld reads k, w, max_ngram, min_ngram" in str(info.value)


def test_seed_and_temperature_reach_the_draft_model():
    from specnb.eval.bench import BenchConfig

    config = BenchConfig(["sd", "mcsd"], temperature=0.7, top_p=0.9, seed=5,
                         options=options_for(["sd", "mcsd"], {"draft": "self:2", "draft_shape": "1"}))
    options = config.options
    assert (options["sd"].seed, options["sd"].temperature, options["mcsd"].top_p) == (5, 0.7, 0.9)
    assert options["mcsd"].draft_shape == (1,)  # parsed once, at the edge
    drafter = make_drafter("mcsd", tiny("llama"), options["mcsd"])
    assert drafter.generator.initial_seed() == 5
    own = BenchConfig(["sd"], temperature=0.7, options=options_for(["sd"], {"draft": "self:2", "temperature": "0"}))
    assert own.options["sd"].temperature == 0.0  # a draft's own setting is kept


def test_the_bench_runs_a_callers_drafters_beside_the_named_methods():
    """``made``: a study's own drafters go through the one entry, after the named methods; they take no options."""
    from specnb.eval.bench import BenchConfig

    config = BenchConfig(["pld"], made={"mine": None})
    assert config.methods == ["ar", "pld", "mine"] and list(config.options) == ["ar", "pld"]
    with pytest.raises(ValueError, match="options given for mine, which the caller made"):
        BenchConfig([], made={"mine": None}, options={"mine": {}})


def test_strings_are_parsed_once_into_typed_options():
    assert parse_options("mcsd", {"draft_shape": "4x2x2x1"}).draft_shape == (4, 2, 2, 1)
    assert parse_options("dense", {"datastore": "d", "draft_shape": "greedy"}).draft_shape == (3, 20)
    assert parse_options("auto", {"members": "pld, suffix"}).members == ("pld", "suffix")
    assert parse_options("auto", {"members": ["pld"]}).members == ("pld",)
    with pytest.raises(OptionError, match="option draft_shape: invalid draft shape"):
        parse_options("mcsd", {"draft_shape": "4x0"})
    with pytest.raises(OptionError, match="option scheme must be one of mcss, mcss-wor, mcns"):
        parse_options("mcsd", {"scheme": "best"})


# --------------------------------------------------------------------------------- one error style, CLI


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command gets as far as loading a model."""
    from specnb.model import models

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(models, "load_model", refuse)


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


BENCH = ["bench", "--model", "tiny-llama", "--max-new-tokens", "4"]


@pytest.mark.parametrize("extra, message", [
    (["--n", "-1"], "--n must be >= 1"),
    (["--n", "0"], "--n must be >= 1"),
    (["--methods", "ar,warp"], "unknown method 'warp'"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["-o", "unknownkey=1"], "-o unknownkey: read by none"),
    (["-o", "w=abc"], "method pld: option w must be an integer, got 'abc'"),
    (["-o", "noequals"], "must look like KEY=VALUE"),
    (["--w", "3", "-o", "w=2"], "-o w=2: w is already given (--w 3)"),
    (["-o", "min_ngram=1", "-o", "min_ngram=2"], "-o min_ngram=2: min_ngram is already given (-o min_ngram=1)"),
    (["--draft-shape", "4x2"], "--draft-shape: read by none"),
    (["--datastore", "somewhere"], "--datastore: read by none"),
    (["--methods", "dense"], "dense needs --datastore"),
    (["--methods", "dense", "--datastore", "d", "--draft-shape", "3-20"], "invalid dense draft shape"),
    (["--methods", "mcsd", "--draft-shape", "4x0"], "invalid draft shape"),
    (["--methods", "sd", "-o", "scheme=best"], "option scheme must be one of"),
    (["--methods", "hf-assisted"], "hf-assisted needs --draft"),
    (["--methods", "sd", "--draft", "self:x"], "invalid self-draft 'self:x'"),
    (["--methods", "hf-assisted", "--draft", "self:2"], "hf-assisted needs --draft NAME"),
    (["--methods", "mcsd", "-o", "temperature=abc"], "method mcsd: option temperature must be a number"),
    (["--dtype", "float8"], "invalid choice: 'float8'"),
    (["--weights", "q4"], "invalid choice: 'q4'"),
    (["--k", "abc"], "invalid int value: 'abc'"),
    (["--verify", "sideways"], "invalid choice"),
    (["--prompts", "nosuch"], "--prompts 'nosuch' is an unknown prompt set: use humaneval"),
    (["--prompts", ""], "--prompts '' is an unknown prompt set"),
    (["--prompts", "tests"], "--prompts 'tests' is a folder, not a JSONL file"),
    (["--out", "{tmp}/missing/r.csv"], "folder {tmp}/missing does not exist"),
    (["--out", "{tmp}"], "is a folder"),
    (["--out", "{tmp}/file.txt/r.csv"], "does not exist"),
    (["--out", ""], "--out is empty"),
    (["--out", "/proc/r.csv"], "--out /proc/r.csv: cannot write in /proc"),
    (["--methods", " , "], "--methods names none"),
    (["--temperature", "inf"], "--temperature must be >= 0 and finite"),
    (["--temperature", "nan"], "--temperature must be >= 0 and finite"),
    (["--seed", "-1"], "--seed must be in [0, 2**63)"),
    (["--seed", str(1 << 63)], "--seed must be in [0, 2**63)"),
    (["--model", "gemma-3-270m", "--methods", "sd"], "draft-model methods need --draft NAME"),
    (["--model", "gemma-3-270m", "--max-new-tokens", "32768"], "leaves no room for a prompt in the context"),
    (["--methods", "suffix", "-o", "alpha=inf"], "option alpha must be a finite number, got inf"),
    (["--methods", "sd", "-o", "temperature=nan"], "option temperature must be a finite number, got nan"),
    (["--methods", "sd", "-o", "seed=-5"], "option seed must be in [0, 2**63), got -5"),
    (["--device", "mps"], "invalid device 'mps': specnb runs on cpu, cuda or cuda:N"),
])
def test_bench_refuses_bad_input_in_one_line_before_loading(extra, message, tmp_path, capsys, no_model):
    (tmp_path / "file.txt").write_text("x")
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    code, err = run_cli([*BENCH, "--methods", "pld", *extra], capsys)
    assert code == 2
    assert err.startswith("specnb: error: ") and err.count("\n") == 1, err
    assert message.replace("{tmp}", str(tmp_path)) in err


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
    ('{"id": "x", "prompt": null}', "'prompt' must be a string, got null"),
    ('{"id": "x", "prompt": 7}', "'prompt' must be a string, got a number"),
    ('{"id": "x", "prompt": "  "}', "'prompt' is empty"),
    ('{"id": "x"}', "needs 'prompt' (a string) or 'messages' (a list of {role, content})"),
    ('{"prompt": "hi"}', "missing 'id'"),
    ('{"id": null, "prompt": "hi"}', "'id' must be a string or an integer, got null"),
    ('{"id": "a", "prompt": "again"}', "id 'a' already used on line 1"),
    ('["a"]', "expected a JSON object, got a list"),
    ('{"id": "x", "messages": []}', "'messages' is empty"),
    ('{"id": "x", "messages": "hi"}', "'messages' must be a list, got a string"),
    ('{"id": "x", "messages": [{"role": "user"}]}', "messages[0] has no 'content'"),
    ('{"id": "x", "messages": [{"content": "hi"}]}', "messages[0] has no 'role'"),
    ('{"id": "x", "messages": [{"role": "user", "content": 3}]}',
     "messages[0] has a non-string (a number) 'content'"),
    ('{"id": "x", "messages": ["hi"]}', "messages[0] must be an object"),
])
def test_prompt_file_errors_name_file_and_line(line, message, tmp_path, capsys, no_model):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "fine"}) + "\n\n" + line + "\n")
    with pytest.raises(ValueError) as info:
        jsonl(path)
    assert str(info.value).startswith(f"{path}:3: {message}")
    code, err = run_cli([*BENCH, "--prompts", str(path)], capsys)
    assert code == 2 and err == f"specnb: error: {info.value}\n"


@pytest.mark.parametrize("extra, message", [
    (["--methods", "mcsd", "--draft-shape", "1000x2"], "draft shape 1000x2 branches past tiny-llama's vocabulary"),
    (["--methods", "recycle", "-o", "k=100000"], "option k (100000) exceeds tiny-llama's vocabulary"),
])
def test_a_draft_wider_than_the_vocabulary_is_one_line(extra, message, capsys):
    """Caught when the drafter is made (the vocabulary is the loaded model's): a top-k past it was a traceback."""
    code, err = run_cli([*BENCH, "--n", "1", *extra], capsys)
    assert code == 2 and err.startswith("specnb: error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_a_prompt_past_the_context_is_refused_before_loading(tmp_path, capsys, no_model):
    """Read with the tokenizer alone: the model (seconds, gigabytes) is never loaded for a run that cannot fit."""
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "short", "prompt": "hi"}) + "\n" +
                    json.dumps({"id": "long", "prompt": "word " * 800}) + "\n")
    code, err = run_cli(["bench", "--model", "gemma-3-270m", "--methods", "pld", "--prompts", str(path),
                         "--max-new-tokens", "32000"], capsys)
    assert code == 2 and err.startswith("specnb: error: prompt 'long' (") and err.count("\n") == 1, err
    assert "+ --max-new-tokens 32000 exceeds the context of gemma-3-270m (32768 tokens)" in err


def test_context_error_names_max_new_tokens(capsys):
    code, err = run_cli([*BENCH[:-2], "--methods", "pld", "--n", "1", "--max-new-tokens", "100000"], capsys)
    assert code == 2 and "--max-new-tokens 100000 exceeds the context" in err


def test_every_command_reports_errors_in_one_line(tmp_path, capsys, isolated_cache):
    for argv in (["models", "fetch", "no-such-model"], ["nosuchcommand"], ["bench", "--nosuchflag"],
                 ["datastore", "verify", str(tmp_path / "nothing")],
                 ["datastore", "build", "rest", str(tmp_path / "nosuchsource"), "--model", "tiny-llama"],
                 ["datastore", "build", "crest", "--model", "tiny-llama", "--t", "0"],
                 ["corpus", "build", str(tmp_path / "nosuchsource"), "--model", "tiny-llama"],
                 ["roofline", "--model", "tiny-llama"], ["id-data", "code", "--n", "0", "--out", str(tmp_path / "x")],
                 ["id-data", "poetry", "--out", str(tmp_path / "x")], ["study", "run"],
                 ["extract-rate", "--model", "random:gemma-3-270m", "--out", str(tmp_path)],
                 ["kernels", "topk", "--vocab", "2"], ["figures", "compare"]):
        code, err = run_cli(argv, capsys)
        assert code == 2 and err.startswith("specnb: error: ") and err.count("\n") == 1, (argv, err)


@pytest.mark.parametrize("argv, choices", [
    ([], "models, bench, notebooks"), (["kernels"], "bench, quant, topk"), (["datastore"], "build, verify"),
    (["datastore", "build"], "rest, crest, dense"), (["figures"], "compare"), (["study"], "run"),
])
def test_a_command_line_that_stops_short_names_the_choices(argv, choices, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"specnb: error: {' '.join(['specnb', *argv])} needs one of: {choices}"), err


@pytest.mark.parametrize("argv, message", [
    (["roofline", "--model", "tiny-llama", "--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["kernels", "bench", "--backends", ","], "--backends names none"),
    (["extract-rate", "--model", "tiny-llama", "--tokens", "100"], "fills 1 batch of 4096 tokens: need at least 2"),
    (["kernels", "topk", "--vocab", str(1 << 40)], "--vocab must be in [8, 4194304]"),
    (["kernels", "bench", "--rows", "99999999"], "--rows must be in [1, 8192]"),
    (["corpus", "build", "", "--model", "tiny-llama"], "corpus source '' is not `code`"),
])
def test_measuring_commands_refuse_empty_work(argv, message, tmp_path, capsys, no_model):
    code, err = run_cli([*argv, "--out", str(tmp_path / "t.csv")], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_every_command_line_parser_lives_in_specnb_cli():
    """One room for command lines: no module outside ``specnb/cli/`` uses argparse, and every command has its
    module there with ``add_parser``."""
    import importlib

    import specnb
    from specnb.cli import COMMANDS

    root = Path(specnb.__file__).parent
    outside = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if "argparse" in p.read_text() and p.parent.name != "cli"]
    assert outside == []
    for module, _ in COMMANDS.values():
        assert callable(importlib.import_module(f"specnb.cli.{module}").add_parser)
    from specnb.cli.id_data import SOURCES
    from specnb.datastores.id_data import PROMPT_SOURCES

    assert SOURCES == tuple(sorted(PROMPT_SOURCES))  # named without importing torch


def test_help_shows_defaults_lists_methods_and_is_light():
    import subprocess
    import sys
    import time

    from specnb.eval.methods import METHODS

    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "import sys, specnb.cli; sys.exit(specnb.cli.main(['--help']))"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and time.perf_counter() - start < 5  # generous: the machine may be busy
    for argv in (["--help"], ["bench", "--help"]):
        script = (f"import sys, specnb.cli\ntry:\n    specnb.cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
                  "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert out.stdout.rstrip().endswith("[]"), f"{' '.join(argv)} imported torch or transformers"
    for name, spec in METHODS.items():
        assert f"  {name:15s} {spec.help}" in out.stdout
    assert "(default: 128)" in out.stdout and "(default: gemma-3-270m)" in out.stdout


@pytest.mark.parametrize("name, content", [
    ("notes.md", b"# my notes\n\nthree weeks of them\n"),
    ("results.csv", b"model,score\nmine,0.9\n"),  # a CSV, but not the bench's
    ("data.bin", bytes(range(256)) * 4),
])
@pytest.mark.parametrize("argv, what", [
    ([*BENCH, "--methods", "pld"], "a bench CSV"),
    (["roofline", "--model", "tiny-llama"], "a roofline CSV"),
    (["extract-rate", "--model", "tiny-llama"], "an extract-rate CSV"),
    (["kernels", "bench"], "a kernels CSV"),
    (["kernels", "quant"], "a kernels CSV"),
    (["kernels", "topk"], "a kernels CSV"),
])
def test_out_never_replaces_a_file_the_command_did_not_write(name, content, argv, what, tmp_path, capsys,
                                                              no_model):
    """``--out`` over a user's existing file that the command did not write: refused in one line before anything
    is loaded or timed (exit 2), the file untouched."""
    path = tmp_path / name
    path.write_bytes(content)
    code, err = run_cli([*argv, "--out", str(path)], capsys)
    assert code == 2 and err.startswith("specnb: error: ") and err.count("\n") == 1, err
    assert f"is not {what} of specnb" in err and str(path) in err
    assert path.read_bytes() == content


def test_bench_out_replaces_an_earlier_bench_csv_or_an_empty_file(tmp_path):
    from specnb.eval.bench import CsvSink

    earlier = tmp_path / "r.csv"
    earlier.write_text("method,prompt_id,seconds\nar,a,1.0\n")
    CsvSink(earlier)([{"method": "pld", "prompt_id": "b", "seconds": 0.5}])
    assert earlier.read_text() == "method,prompt_id,seconds\npld,b,0.5\n"
    empty = tmp_path / "empty.csv"
    empty.touch()
    CsvSink(empty)([{"method": "ar", "prompt_id": "a"}])
    assert empty.read_text() == "method,prompt_id\nar,a\n"


# ------------------------------------------------------------------------------------- bench keeps work


def test_ctrl_c_keeps_finished_prompts(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the third prompt: exit 130, no traceback, the two finished prompts' rows and a summary
    of them in the CSV."""
    import pandas as pd

    from specnb.eval import runner

    calls = []

    def interrupted_generate(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 + 2 * 2 + 1:  # warm-up (ar, pld), two prompts, then the third prompt's ar run
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    monkeypatch.setattr(runner, "generate", interrupted_generate)
    out = tmp_path / "r.csv"
    code = main([*BENCH, "--methods", "pld", "--n", "4", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 130 and "Traceback" not in captured.err
    assert "interrupted after 2 of 4 prompts" in captured.err and "speedup_vs_ar" in captured.out
    table = pd.read_csv(out)
    assert len(table[table.prompt_id != "ALL"]) == 4 and set(table[table.prompt_id == "ALL"].method) == {"ar", "pld"}


def test_csv_sink_appends_and_widens(tmp_path):
    import pandas as pd

    from specnb.eval.bench import CsvSink

    path = tmp_path / "r.csv"
    sink = CsvSink(path)
    sink([{"method": "ar", "seconds": 1.0}])
    assert path.read_text() == "method,seconds\nar,1.0\n"  # on disk as soon as the prompt is done
    sink([{"method": "pld", "seconds": 0.5}])
    sink([{"method": "pld", "seconds": 0.4, "first_divergence": 3}])
    table = pd.read_csv(path)
    assert list(table.columns) == ["method", "seconds", "first_divergence"] and len(table) == 3


def test_the_store_builders_load_without_transformers_modeling_code():
    """Corpus, REST and CREST builds (their commands, their Ray workers) need a tokenizer, never a model class:
    importing them leaves transformers' modeling code, seconds of imports per process, unloaded."""
    import subprocess
    import sys

    script = ("import sys, specnb.datastores.corpus, specnb.datastores.rest, specnb.datastores.crest_build\n"
              "print(sorted(m for m in sys.modules if m in ('transformers.modeling_utils', 'torch._dynamo')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.rstrip().endswith("[]"), out.stdout + out.stderr
