"""Which published claims a run can test.

Some claims are bound to what the papers ran on. A speed is the papers' GPU's: it turns on what a call verifying
several tokens costs, which on a CPU is several one-token calls (notebook 05) and on a GPU about one, so a CPU run
measures the CPU, not the claim. Some numbers are the papers' model's own: the variance a 4096-d model's first 64
components hold, the acceptance of LLaMA-68M's drafts for LLaMA-13B, the tokens per call of an instruction-tuned 7B
model. Such a comparison is still measured and recorded, but where the run's setup differs in that respect its
verdict is ``not tested``, with why (from the results file's setup tables), and the front page counts it apart.

:data:`BOUND` names those claims by notebook and comparison key; the tests check that every pattern matches a
comparison of the quick run, so a renamed key cannot drop out unnoticed.
"""

from __future__ import annotations

import re
from fnmatch import fnmatch

HARDWARE, MODEL = "hardware", "model"

BOUND: dict[str, dict[str, str]] = {
    "00": {"pld_paper": HARDWARE},  # DReSD Table 3's prompt-lookup speedup (V100)
    "02": {"variance_64": MODEL},  # 64 of 4096-5120 dimensions; the same share of ours is judged beside it
    "03": {"speed_*": HARDWARE},  # Fig. 9's speed over REST, priced with this machine's costs
    "06": {"fig2_*": MODEL, "tpc_10_10_*": MODEL, "speedup_*": HARDWARE,  # Mistral-7B's tokens per call; A100
           "gpu_*": MODEL},  # priced on the GPU table: the price matched, the model's acceptance not
    "07": {"k1_t*": MODEL, "mcsd_vs_*": HARDWARE},  # LLaMA-68M -> 13B's acceptance; A6000 speeds
    "08": {"dresd_paper_shape": HARDWARE, "tree mixed *": HARDWARE, "budget * speed *": HARDWARE, "gpu_*": MODEL},
    "09": {"table3_*": HARDWARE, "dense_id_vs_rest": HARDWARE, "gpu_*": MODEL},  # DReSD Table 3 (V100)
    "10": {"suffix_*": HARDWARE, "recycle_published": HARDWARE, "recycle_storage": MODEL},  # vLLM's GPUs; V x k
}
"""{notebook: {comparison key pattern (fnmatch): what the claim is bound to}}."""

UNTESTED = "not tested"

_GPU = re.compile(r"GPU|NVIDIA|CUDA|\b[AHV]100\b", re.IGNORECASE)


def bound(prefix: str, key: str) -> str | None:
    """What comparison ``key`` of notebook ``prefix`` (``"09"``) is bound to: :data:`HARDWARE`, :data:`MODEL` or
    None (a claim any setup tests)."""
    return next((kind for pattern, kind in BOUND.get(prefix, {}).items() if fnmatch(key, pattern)), None)


def _setup(against: str, setups: dict[str, dict[str, dict[str, str]]]) -> tuple[dict[str, str], dict[str, str]]:
    """(here, theirs) of the setup table whose source ``against`` cites (its first word, or the words in its
    brackets: ``SuffixDecoding (ArcticInference docs)``); the only one, or empty, otherwise."""
    cited = [sides for name, sides in setups.items()
             if any(against.startswith(w) for w in [name.split()[0], *re.findall(r"\(([^)]*)\)", name)])]
    sides = cited[0] if cited else next(iter(setups.values())) if len(setups) == 1 else {"here": {}, "paper": {}}
    return sides["here"], sides["paper"]


def why_untested(prefix: str, key: str, record: dict, setups: dict[str, dict[str, dict[str, str]]]) -> str:
    """Why this run does not test comparison ``key`` of notebook ``prefix`` (its results-file ``record``), from the
    results file's ``setups``; "" where it does (an unbound claim, our own check, or a run on the claim's
    hardware)."""
    kind = bound(prefix, key)
    if kind is None or record.get("internal"):
        return ""
    here, theirs = _setup(record["against"], setups)
    if kind == HARDWARE:
        ours = here.get("hardware", "")
        if _GPU.search(ours):
            return ""
        return (f"a speed on {theirs.get('hardware') or 'a GPU'}; on {ours or 'a CPU'} a call verifying several "
                "tokens costs several one-token calls (notebook 05), so this measures the CPU, not the claim")
    model = theirs.get("model") or "the paper's model"
    return f"a number of {model} itself; this run's model is {here.get('model') or 'another'}"


def scoped(prefix: str, verdicts: dict[str, dict], setups: dict[str, dict[str, dict[str, str]]]) -> dict[str, dict]:
    """A results file's comparisons with each untested one's ``verdict`` set to :data:`UNTESTED`, what its
    numbers gave kept as ``measured_verdict`` and why as ``untested`` (idempotent: a file written so reads the
    same)."""
    out = {}
    for key, record in verdicts.items():
        why = why_untested(prefix, key, record, setups)
        if why:
            record = {**record, "measured_verdict": record.get("measured_verdict", record["verdict"]),
                      "verdict": UNTESTED, "untested": why, "lean": None}
        out[key] = record
    return out
