"""The notebooks' ``profile`` parameter: how big a run is.

* ``smoke``: tiny random models, a handful of prompts and tokens: seconds (the test suite runs it).
* ``quick``: Gemma-3-270M (the default): minutes on 2 CPU cores.
* ``full``: Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft: hours.

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
    n_prompts: int  # prompts per prompt set
    max_new_tokens: int
    dtype: str = "auto"
    device: str = field(default_factory=default_device)  # cuda when available, else cpu


PROFILES = {
    "smoke": Profile("smoke", target="tiny-gemma3", draft="self:2", n_prompts=2, max_new_tokens=16),
    "quick": Profile("quick", target="gemma-3-270m", draft="self:6", n_prompts=10, max_new_tokens=96),
    "full": Profile("full", target="qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
                    n_prompts=80, max_new_tokens=256),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}")
    return PROFILES[name]
