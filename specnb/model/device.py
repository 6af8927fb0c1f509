"""Where tensors live: choosing a device, and the few helpers the loop needs to be correct on an accelerator.

The decoding loop keeps its bookkeeping on the host (token buffer, drafts, EOS ids, acceptance) and its
model work on the model's device; :func:`specnb.model.forward.forward` is where token ids, positions and masks
cross over. Random draws use a generator on the device of the probabilities they sample, and timings
call :func:`synchronize` at phase boundaries so that they measure the device's work, not kernel launches.
"""

from __future__ import annotations

import torch
from torch.nn import Module


def default_device() -> str:
    """``"cuda"`` when a CUDA device is available, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


DEVICE_TYPES = {"cpu", "cuda"}
"""The device types a model may run on (the tests' pretend accelerator adds its own while it runs)."""


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device`; raises ValueError (one line for the CLI) when it cannot be used."""
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"invalid device {str(device)!r}: {exc}") from None
    if resolved.type not in DEVICE_TYPES:
        raise ValueError(f"invalid device {str(device)!r}: specnb runs on cpu, cuda or cuda:N")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available on this machine "
                         f"(torch {torch.__version__}); use --device cpu")
    return resolved


def model_device(model: Module) -> torch.device:
    """The device of the model's parameters (all on one device in specnb)."""
    return next(model.parameters()).device


def generator(device: torch.device, seed: int) -> torch.Generator:
    """A random generator on ``device`` seeded with ``seed`` (random ops need one on their output's device)."""
    return torch.Generator(device=device).manual_seed(seed)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU, whose ops finish when they return)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
