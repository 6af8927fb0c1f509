"""The notebooks' ``profile`` parameter: how big a run is.

* ``smoke``: tiny random models, a handful of prompts and tokens: seconds (the test suite runs it).
* ``quick``: Gemma-3-270M (the default; notebook 07's draft-model study: the Qwen2.5-Coder 0.5B -> 1.5B pair):
  minutes on 2 CPU cores.
* ``full``: Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft: hours.

Two sizes per profile: ``n_prompts`` x ``max_new_tokens`` for what is computed from the target's cached greedy
outputs (replay, reference-token analyses), ``timed_prompts`` x ``timed_tokens`` for what is timed by decoding
(10 prompts give a speedup to about ±10%, so fewer cannot show the differences the notebooks discuss).

Every profile runs on ``device``: CUDA when the machine has it, else the CPU (the notebooks pass it to
``load_model``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .device import default_device


@dataclass(frozen=True)
class Profile:
    name: str
    target: str  # model name for specnb.load_model
    draft: str | None  # draft model name (or "self:L") for draft-model methods
    n_prompts: int  # prompts per prompt set, for replay and reference-token analyses
    max_new_tokens: int  # the greedy references' length
    timed_prompts: int  # prompts per set of a timed run
    timed_tokens: int  # new tokens per prompt of a timed run
    pair: tuple[str, str]  # (target, draft) of the draft-model study (notebook 07)
    dtype: str = "auto"
    device: str = field(default_factory=default_device)  # cuda when available, else cpu


PROFILES = {
    "smoke": Profile("smoke", target="tiny-gemma3", draft="self:2", n_prompts=2, max_new_tokens=16,
                     timed_prompts=2, timed_tokens=12, pair=("tiny-gemma3", "self:2")),
    "quick": Profile("quick", target="gemma-3-270m", draft="self:12", n_prompts=10, max_new_tokens=128,
                     timed_prompts=10, timed_tokens=64,
                     pair=("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")),
    "full": Profile("full", target="qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
                    n_prompts=80, max_new_tokens=256, timed_prompts=40, timed_tokens=128,
                    pair=("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}")
    return PROFILES[name]
