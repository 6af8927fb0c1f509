"""Bad input gives one clear error; the CLI and the Draft utilities behave as documented."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny

from specnb import Draft, generate, load_model
from specnb.cli import main
from specnb.datasets import jsonl
from specnb.draft import DraftError
from specnb.drafters import ContextNgramDrafter
from specnb.methods import FACTORIES, MethodOptions, make_drafter, split_datastores
from specnb.models import ModelError
from specnb.profiles import get_profile


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
        make_drafter("telepathy", tiny("llama"), MethodOptions())
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


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n"
                    + json.dumps({"id": "b", "messages": [{"role": "user", "content": "yo"}]}) + "\n")
    a, b = jsonl(path)
    assert a.text == "hi" and b.messages[0]["content"] == "yo"
    path.write_text(json.dumps({"prompt": "no id"}) + "\n")
    with pytest.raises(ValueError, match="needs 'id'"):
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


def test_cli_bad_input_is_one_line(capsys):
    assert main(["bench", "--model", "tiny-llama", "--methods", "ar,warp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specnb: error: unknown method") and err.count("\n") == 1


def test_cli_models_list(capsys):
    assert main(["models", "list"]) == 0
    assert "gemma-3-270m" in capsys.readouterr().out


def test_missing_model_package_names_the_fetch_command(tmp_path, monkeypatch):
    import dataclasses

    from specnb import models

    spec = dataclasses.replace(models.EMBEDDED["gemma-3-270m"], name="ghost-model",
                               parts=(("specnb_no_such_part_package", "data/part01.bin"),))
    monkeypatch.setitem(models.EMBEDDED, "ghost-model", spec)
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="specnb models fetch ghost-model"):
        load_model("ghost-model")


def test_datastore_per_method():
    assert split_datastores([]) == (None, {})
    assert split_datastores(["a/b", "dense=x/y", "rest=z"]) == ("a/b", {"dense": "x/y", "rest": "z"})
    assert split_datastores(["odd=name"]) == ("odd=name", {})  # not a method: a path containing '='
    with pytest.raises(ValueError, match="METHOD=PATH"):
        split_datastores(["a", "b"])
    seen = {}
    FACTORIES["probe"] = lambda target, options: seen.setdefault("path", options.datastore)
    try:
        make_drafter("probe", None, MethodOptions(datastore="shared", datastores={"probe": "mine"}))
    finally:
        del FACTORIES["probe"]
    assert seen["path"] == "mine"
