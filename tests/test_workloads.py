"""The prompt sets where history matters: repeated code requests and MT-Bench's two turns, the second seeing
the model's first answer."""

from __future__ import annotations

import pytest
from conftest import tiny

from specnb import generate
from specnb.core.datasets import load_prompts
from specnb.core.prompts import Prompt, encode_prompt, with_answer
from specnb.eval.bench import BenchConfig, run_bench


def test_humaneval2_asks_every_problem_twice_in_order():
    prompts = load_prompts("humaneval2", 5)
    assert [p.id for p in prompts] == ["HumanEval/0/a", "HumanEval/0/b", "HumanEval/1/a", "HumanEval/1/b",
                                       "HumanEval/2/a"]
    first, second = prompts[:2]
    stub = first.text
    assert stub in first.messages[0]["content"] and stub in second.messages[0]["content"]
    assert first.messages != second.messages and second.text.endswith(stub) and second.text != stub


def test_mtbench2_orders_turns_and_names_what_each_follows():
    prompts = load_prompts("mtbench2", 4)
    ids = [p.id for p in prompts]
    assert ids[0].endswith("/1") and ids[1] == ids[0][:-1] + "2" and ids[2].endswith("/1")
    assert [p.follows for p in prompts] == [None, ids[0], None, ids[2]]
    assert prompts[1].messages[0] == prompts[0].messages[0] and len(prompts[1].messages) == 2


def test_a_follow_up_cannot_be_encoded_without_its_answer():
    follow_up = load_prompts("mtbench2", 2)[1]
    with pytest.raises(ValueError, match="follows"):
        encode_prompt(tiny("llama"), follow_up)
    resolved = with_answer(follow_up, "THE ANSWER")
    assert [m["role"] for m in resolved.messages] == ["user", "assistant", "user"]
    assert resolved.messages[1]["content"] == "THE ANSWER" and "THE ANSWER" in resolved.text


def test_the_second_turn_sees_the_reference_answer_to_the_first():
    target = tiny("llama")
    first = Prompt("q/1", text="alpha beta", messages=({"role": "user", "content": "alpha beta"},))
    other = Prompt("r/1", text="gamma delta", messages=({"role": "user", "content": "gamma delta"},))
    second = Prompt("q/2", messages=(first.messages[0], {"role": "user", "content": "and then?"}), follows="q/1")
    seen = []

    def spy(prompt: Prompt, max_new_tokens: int) -> dict:
        seen.append(prompt)
        return {"new_tokens": 0, "seconds": 1.0}

    run_bench(target, [first, other, second], BenchConfig([], max_new_tokens=6, made={"spy": spy}, warmup_tokens=0),
              progress=False)
    answer, other_answer = (target.tokenizer.decode(generate(target, p, max_new_tokens=6).tokens,
                                                    skip_special_tokens=True) for p in (first, other))
    assert answer != other_answer  # the test can tell the right answer from the latest one
    assert seen[-1].id == "q/2" and seen[-1].follows is None
    assert seen[-1].messages == (first.messages[0], {"role": "assistant", "content": answer},
                                 {"role": "user", "content": "and then?"})


def test_greedy_references_give_a_follow_up_its_earlier_reference_as_the_answer(tmp_path, monkeypatch):
    """Replays of the multi-turn sets (notebook 10's ceiling) must see the conversation the bench runs."""
    from specnb.experiments.references import greedy_references

    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))
    target = tiny("llama")
    first = Prompt("q/1", text="alpha beta", messages=({"role": "user", "content": "alpha beta"},))
    other = Prompt("r/1", text="gamma delta", messages=({"role": "user", "content": "gamma delta"},))
    second = Prompt("q/2", messages=(first.messages[0], {"role": "user", "content": "and then?"}), follows="q/1")
    refs = greedy_references(target, [first, other, second], 6)
    answer = target.tokenizer.decode(refs[0][1].tolist(), skip_special_tokens=True)
    assert answer != target.tokenizer.decode(refs[1][1].tolist(), skip_special_tokens=True)
    ids = encode_prompt(target, with_answer(second, answer))
    assert refs[2][0].tolist() == ids.tolist()
    assert refs[2][1].tolist() == generate(target, ids, max_new_tokens=6).tokens
    with pytest.raises(ValueError, match="q/2"):
        greedy_references(target, [second], 6)


def test_an_orphan_follow_up_fails_before_anything_runs():
    follow_up = load_prompts("mtbench2", 2)[1]
    with pytest.raises(ValueError, match=follow_up.id):
        run_bench(tiny("llama"), [follow_up], BenchConfig([], max_new_tokens=4), progress=False)


def test_the_bench_runs_both_turns():
    """``specnb bench --prompts mtbench2``: the budget check before the run does not need the answers yet."""
    from specnb.eval.bench import BenchConfig, run_bench

    prompts = load_prompts("mtbench2", 2)
    rows = run_bench(tiny("llama"), prompts, BenchConfig(["ar", "pld"], max_new_tokens=4), progress=False)
    assert set(rows.prompt_id) == {p.id for p in prompts}


@pytest.mark.parametrize("method", ["suffix", "recycle"])
def test_the_bench_warm_up_is_not_an_earlier_request(method):
    """The warm-up decodes the first prompt's first tokens: a drafter that remembers requests must forget them,
    or the first prompt is drafted from its own future (the bench's numbers once were)."""
    from specnb.eval.bench import BenchConfig, run_bench

    target, prompts = tiny("llama"), load_prompts("humaneval", 2)
    calls = {}
    for warmup in (0, 16):
        config = BenchConfig(["ar", method], max_new_tokens=24, warmup_tokens=warmup)
        rows = run_bench(target, prompts, config, progress=False)
        calls[warmup] = rows[rows.method == method].calls.tolist()
    assert calls[16] == calls[0]
