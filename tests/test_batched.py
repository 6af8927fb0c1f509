"""Greedy decoding side by side (core/batched.py): every row the tokens of its prompt decoded alone."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import kernel_path_exists, tiny, tiny_gguf, without_kernels

from specnb.atomic import ExistsError, exclusive
from specnb.core.batched import greedy_batch, rows_exact
from specnb.core.generate import generate
from specnb.core.prompts import Prompt
from specnb.datastores.id_data import generate_responses

pytestmark = pytest.mark.skipif(not kernel_path_exists(), reason="no AVX2/FMA CPU (or SPECNB_KERNELS=0)")

# lengths 3 to 29 around the tiny Gemma-3's sliding window of 16: padding and the window both matter
LENGTHS = (3, 29, 11, 18)


def prompts(vocab: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g) for n in LENGTHS]


@pytest.mark.parametrize("make", [lambda: tiny("llama"), lambda: tiny("gemma3", torch.bfloat16),
                                  lambda: tiny_gguf("qwen2", torch.bfloat16, int8=True),
                                  lambda: tiny_gguf("gemma3", torch.bfloat16, int8=True)],
                         ids=["llama-fp32", "gemma3-bf16", "qwen2-gguf-int8", "gemma3-gguf-int8"])
def test_rows_decode_to_each_prompt_alone(make):
    target = make()
    rows = prompts(target.vocab_size)
    alone = [generate(target, p, max_new_tokens=12) for p in rows]
    assert rows_exact(target)
    assert greedy_batch(target, rows, 12) == [(a.tokens, a.stop_reason) for a in alone]
    assert len({tuple(a.tokens) for a in alone}) == len(rows)  # the rows differ: a mixed-up row would show


def test_a_row_stops_at_its_eos_and_the_others_go_on():
    free = [generate(tiny("gemma3"), p, max_new_tokens=10).tokens for p in prompts(tiny("gemma3").vocab_size)]
    eos = free[1][4]  # the second row's fifth token
    target = dataclasses.replace(tiny("gemma3"), eos_token_ids=frozenset({eos}))
    got = greedy_batch(target, prompts(target.vocab_size), 10)
    assert got[1] == (free[1][:free[1].index(eos) + 1], "eos")
    for (tokens, stop), alone in zip(got, (generate(target, p, max_new_tokens=10) for p in prompts(target.vocab_size)),
                                     strict=True):
        assert (tokens, stop) == (alone.tokens, alone.stop_reason)


def test_refused_where_rows_are_not_exact():
    with without_kernels():
        assert not rows_exact(tiny("llama"))
        with pytest.raises(ValueError, match="bits of each alone"):
            greedy_batch(tiny("llama"), prompts(tiny("llama").vocab_size), 4)


def test_responses_in_batches_are_the_file_one_at_a_time_writes(tmp_path, monkeypatch):
    """The same lines in the same order (windows of prompts grouped by length, written in the given order)."""
    monkeypatch.setattr("specnb.datastores.id_data.WINDOW_BATCHES", 2)
    monkeypatch.setattr("specnb.datastores.id_data.BATCH_MAX_PROMPT", 20)  # "import os" x 6 decodes alone
    target = tiny("gemma3")
    texts = ["def f(x):", "import os\n" * 6, "x = 1", "class A:\n    pass\n" * 3, "y = [1, 2]", "z"]
    items = [Prompt(str(i), text=text) for i, text in enumerate(texts)]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    generate_responses(target, items, one, max_new_tokens=9)
    generate_responses(target, items[:1], two, max_new_tokens=9, batch=2)
    generate_responses(target, items, two, max_new_tokens=9, batch=2)  # resumes, 5 left: windows of 4 and 1
    assert two.read_text() == one.read_text()
    assert json.loads(two.with_suffix(".meta.json").read_text())["drafts"] == "none (batches of 2)"


def test_a_second_run_on_an_answers_file_being_written_is_refused(tmp_path):
    """Two runs appending to one file would each write the answers the other writes: the second one is refused
    while the first holds the file, and the lock goes with the run."""
    out, items = tmp_path / "answers.jsonl", [Prompt("0", text="def f(x):")]
    with exclusive(out, "held"), pytest.raises(ExistsError, match="another process is writing answers to"):
        generate_responses(tiny("gemma3"), items, out, max_new_tokens=3)
    generate_responses(tiny("gemma3"), items, out, max_new_tokens=3)
    assert len(out.read_text().splitlines()) == 1 and not (tmp_path / "answers.jsonl.lock").exists()
