"""The "here" side of a notebook's setup table (:meth:`specnb.study.results.Results.setup`), read from the run itself:
the target's name and hidden size, the machine it ran on, the dtype its weights were loaded in (or its GGUF blocks).
Nothing here is typed, so a rerun on another machine or dtype states its own setup."""

from __future__ import annotations

from ..core.roofline import device_name
from ..model.kernels.cpu import cpu_class
from ..model.models import LoadedModel

# what the documents of each dense code store are (``specnb.experiments.dresd.datastores``' kinds)
DOCUMENTS = {"code-OOD": "code (out of distribution)", "code-ID": "the target's answers (in distribution)"}


def hidden_size(target: LoadedModel) -> int:
    """The width of the target's hidden state (the dense keys' raw dimension)."""
    return int(target.config.hidden_size)


def weights_label(target: LoadedModel) -> str:
    """What the target computes in: its weights' dtype (``"bfloat16"``), or ``"bfloat16 activations, GGUF blocks"``
    where its projections and head run over the GGUF file's blocks."""
    dtype = target.dtype_name
    if target.weights == "gguf-int8":
        return f"{dtype} activations rounded to int8, GGUF blocks"
    return f"{dtype} activations, GGUF blocks" if target.weights == "gguf" else dtype


def here(target: LoadedModel, **fields: object) -> dict[str, str]:
    """{"model": "<name> (hidden <d>)", "hardware": the GPU's name or the CPU's model with its torch threads
    and its class (amx / avx512bf16 / avx2), "dtype": :func:`weights_label`}, then ``fields`` (e.g.
    ``datastore=...``, ``prompts_tokens=...``: underscores become spaces, ``prompts_tokens`` becomes
    ``prompts × tokens``), every value as a string."""
    hardware = device_name(target.device)
    if target.device.type == "cpu":
        hardware += f" ({cpu_class()})"
    out = {"model": f"{target.name} (hidden {hidden_size(target)})", "hardware": hardware,
           "dtype": weights_label(target)}
    for key, value in fields.items():
        name = "prompts × tokens" if key == "prompts_tokens" else key.replace("_", " ")
        out[name] = str(value)
    return out
