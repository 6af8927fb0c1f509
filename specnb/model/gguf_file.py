"""A GGUF file's metadata and tensors, read without walking its vocabulary.

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array: on Gemma-3's 262,144-token
vocabulary that is ~17 s per open, paid at every load. The decoder needs the scalar settings and the tensors, so
this reader parses the header with ``struct``, steps over long arrays by their lengths, and maps each tensor's
bytes as ``GGUFReader`` does (its ``data`` has the same dtype and shape). The format's constants come from the
``gguf`` package. ``docs/forward_pass.md`` gives the two readers' times.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
KEPT_ARRAY = 64  # arrays up to this length are kept as lists; longer ones (vocabularies, merges) as their length
DEFAULT_ALIGNMENT = 32  # the format's tensor-data alignment where general.alignment is absent

# GGUF value type -> struct format of one scalar (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array longer than :data:`KEPT_ARRAY`, not read: its element type and length."""

    value_type: int
    length: int


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: ``data`` maps the file's bytes (float32 / float16 [rows.., cols] for F32 / F16, else uint8
    [rows.., row bytes], as ``gguf.GGUFReader``); ``shape`` in the file's order (innermost first)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass(frozen=True)
class GGUFFile:
    """The metadata (key -> int, float, bool, str, list, or :class:`SkippedArray`) and tensors of a file."""

    path: str
    fields: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buffer, path: str):
        self.buffer, self.pos, self.path = buffer, 0, path

    def unpack(self, fmt: str):
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        except struct.error:
            raise ValueError(f"{self.path}: the GGUF header ends early (a truncated file?)") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buffer):
            raise ValueError(f"{self.path}: the GGUF header ends early (a truncated file?)")
        value = bytes(self.buffer[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return value

    def value(self, value_type: int):
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element, length = self.unpack("<I"), self.unpack("<Q")
            if length <= KEPT_ARRAY:
                return [self.value(element) for _ in range(length)]
            if element == _STRING:
                for _ in range(length):
                    n = self.unpack("<Q")  # (not `pos += unpack(..)`: unpack moves pos itself)
                    self.pos += n
            elif element in _SCALARS:
                self.pos += struct.calcsize(_SCALARS[element]) * length
            else:
                raise ValueError(f"{self.path}: a GGUF array of arrays is not supported")
            return SkippedArray(element, length)
        if value_type not in _SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {value_type}")
        return self.unpack(_SCALARS[value_type])


def open_gguf(path: str | Path) -> GGUFFile:
    """The file at ``path``, memory-mapped (tensor data is read as it is touched). Raises ValueError for a file
    that is not GGUF v2 / v3 little-endian, or whose header or tensors run past its end."""
    import gguf

    path = str(path)
    with open(path, "rb") as f:
        try:
            buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise ValueError(f"{path} is not a GGUF file (it is empty)") from None
    cursor = _Cursor(buffer, path)
    if bytes(buffer[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} (or big-endian); specnb reads little-endian v2 and v3")
    n_tensors, n_fields = cursor.unpack("<Q"), cursor.unpack("<Q")
    fields = {}
    for _ in range(n_fields):
        key = cursor.string()
        fields[key] = cursor.value(cursor.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
        infos.append((name, dims, cursor.unpack("<I"), cursor.unpack("<Q")))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cursor.pos // alignment) * alignment
    everything = np.frombuffer(buffer, dtype=np.uint8)
    tensors = []
    for name, dims, kind, offset in infos:
        tensor_type = gguf.GGMLQuantizationType(kind)
        block, block_bytes = gguf.GGML_QUANT_SIZES[tensor_type]
        rows = tuple(reversed(dims))
        nbytes = int(np.prod(dims, dtype=np.int64)) * block_bytes // block
        begin = start + offset
        if begin + nbytes > len(buffer):
            raise ValueError(f"{path}: tensor {name} runs past the end of the file (a truncated file?)")
        raw = everything[begin:begin + nbytes]
        if tensor_type == gguf.GGMLQuantizationType.F32:
            data = raw.view(np.float32).reshape(rows)
        elif tensor_type == gguf.GGMLQuantizationType.F16:
            data = raw.view(np.float16).reshape(rows)
        else:
            data = raw.reshape(rows[:-1] + (rows[-1] // block * block_bytes,))
        tensors.append(GGUFTensor(name, tensor_type, dims, data))
    return GGUFFile(path, fields, tensors)
