"""A pretend accelerator for CPU-only machines: tensors on a device other than the CPU whose data is on the CPU.

Inside :func:`fake_device`, a factory call with ``device=FAKE`` (or under ``with FAKE:``) and a ``.to(FAKE)``
give :class:`FakeDeviceTensor` s; every aten op is checked the way CUDA checks devices, then run on the CPU
data, so results are the CPU's, bit for bit:

* a device tensor and a host tensor of one or more dimensions in the same op is an error (a 0-dim host
  tensor is a scalar, which CUDA accepts, and so are host *indices* of a device tensor in ``t[idx]``);
* a random op must get a generator of its output's device (``torch.Generator(device=...)``);
* ``.numpy()`` of a device tensor fails (as on CUDA: ``.cpu()`` first);
* device -> host reads (``int(t)``, ``.cpu()``, ``.tolist()``: the host syncs of a real GPU) are counted.

The device is tagged ``meta``: a CPU build of torch refuses to index a tensor that says ``cuda`` (its C++
indexing wants a CUDA device guard before any Python code sees the op), while ``meta`` has a guard and no
kernels of its own. specnb takes every device from the model's parameters and names ``cuda`` only to
synchronise, so a decoding step that runs here would not mix devices on a GPU, and code that forgets a
``device=`` fails with :class:`DeviceMixing`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

FAKE = torch.device("meta")
_REAL_GENERATOR = torch.Generator
_REAL_TENSOR = torch.tensor
_DEVICE_GENERATORS: dict[int, torch.Generator] = {}  # C++ address -> generator made for the fake device
aten = torch.ops.aten

# Ops that move data between devices, that read one value to the host, and whose host indices CUDA accepts.
_COPIES = {aten._to_copy, aten.to, aten.copy_}
_SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default}  # int(t), t.item()
_INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


class DeviceMixing(RuntimeError):
    """An op that a real accelerator would reject: host and device tensors mixed, or a host generator."""


@dataclass
class Counters:
    """What a run did that costs a host sync on a real GPU."""

    host_reads: int = 0  # device -> host copies and scalar reads


class FakeDeviceTensor(Tensor):
    """A tensor whose ``device`` is :data:`FAKE` and whose data is the CPU tensor ``inner``."""

    inner: Tensor

    @staticmethod
    def __new__(cls, inner: Tensor) -> FakeDeviceTensor:
        with torch.inference_mode(False):  # always a normal tensor: views of parameters must be normal
            out = Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                device=FAKE, requires_grad=False)
        out.inner = inner
        return out

    def __repr__(self) -> str:
        return f"FakeDeviceTensor({self.inner!r})"

    def numpy(self, *args, **kwargs):
        raise TypeError(f"can't convert {FAKE} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        f"tensor to host memory first.")

    def tolist(self):
        _MODES[-1].counters.host_reads += 1
        return self.inner.tolist()

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _MODES[-1].__torch_dispatch__(func, types, args, kwargs)


class FakeDeviceMode(TorchDispatchMode):
    """Checks every op's devices (see the module docstring) and runs it on the CPU data."""

    def __init__(self) -> None:
        super().__init__()
        self.counters = Counters()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, Tensor)]
        if any(t.device == FAKE and not isinstance(t, FakeDeviceTensor) for t in tensors):
            raise RuntimeError(f"{func}: a real {FAKE} tensor (made where this mode cannot see it)")
        on_device = [t for t in tensors if isinstance(t, FakeDeviceTensor)]
        devices = {d.type for d in flat if isinstance(d, torch.device)}
        if func.overloadpacket in _COPIES:  # .to(...), .cpu(), copy_: the target's device, else the source's
            other = args[1] if func is aten.to.other else None
            device_out = FAKE.type in devices or isinstance(other, FakeDeviceTensor) or \
                (bool(on_device) and "cpu" not in devices and other is None)
            self.counters.host_reads += bool(on_device) and not device_out
        else:
            device_out = FAKE.type in devices or bool(on_device)
            self.counters.host_reads += func in _SCALAR_READS and bool(on_device)
        _check(func, args, kwargs, tensors, on_device, device_out)

        def unwrap(x):
            if isinstance(x, torch.device) and x.type == FAKE.type:
                return torch.device("cpu")
            return x.inner if isinstance(x, FakeDeviceTensor) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        if func is aten.copy_.default:
            return args[0]
        if not device_out:
            return out
        inners = {id(t.inner): t for t in on_device}

        def wrap(x):
            if not isinstance(x, Tensor):
                return x
            same = inners.get(id(x))  # in-place ops give back their input
            return FakeDeviceTensor(x) if same is None else same

        return tree_map(wrap, out)


def _check(func, args, kwargs, tensors: list[Tensor], on_device: list[Tensor], device_out: bool) -> None:
    """Raise :class:`DeviceMixing` where CUDA would refuse the op."""
    generator = kwargs.get("generator")
    if generator is not None and (generator._cdata in _DEVICE_GENERATORS) != device_out:
        where = "a device" if generator._cdata in _DEVICE_GENERATORS else "a host"
        raise DeviceMixing(f"{func}: {where} generator for a {'device' if device_out else 'host'} result")
    if func.overloadpacket in _COPIES or not on_device:
        return
    host = [t for t in tensors if not isinstance(t, FakeDeviceTensor) and t.dim() > 0]
    if func in _INDEXING and isinstance(args[0], FakeDeviceTensor):
        indices = [t for t in tree_flatten(args[1])[0] if isinstance(t, Tensor)]
        host = [t for t in host if all(t is not i for i in indices)]
    if host:
        shapes = ", ".join(str(tuple(t.shape)) for t in host)
        raise DeviceMixing(f"{func}: device tensor(s) mixed with host tensor(s) of shape {shapes}")


_MODES = [FakeDeviceMode()]  # the rules outside any fake_device() block, then the innermost active mode


class _Generator(_REAL_GENERATOR):
    """Stands in for ``torch.Generator``: a CPU generator, remembered as a device one if made for FAKE."""

    def __new__(cls, device: str | torch.device = "cpu") -> _Generator:
        generator = super().__new__(cls)
        if torch.device(device).type == FAKE.type:  # dispatch sees new Python objects: keep the C++ address
            _DEVICE_GENERATORS[generator._cdata] = generator
        return generator

    def __init__(self, device: str | torch.device = "cpu") -> None:
        super().__init__()


def _tensor(data, *, device=None, **kwargs) -> Tensor:
    """Stands in for ``torch.tensor``, whose copy to a device skips dispatch: built on the host, then moved."""
    out = _REAL_TENSOR(data, **kwargs)
    return out if device is None else out.to(device)


@contextlib.contextmanager
def fake_device() -> Iterator[Counters]:
    """Run the body with the fake device (:data:`FAKE`) checked; yields the run's :class:`Counters`."""
    from specnb.model.device import DEVICE_TYPES

    mode = FakeDeviceMode()
    saved = torch.Generator, torch.tensor
    torch.Generator, torch.tensor = _Generator, _tensor
    _MODES.append(mode)
    DEVICE_TYPES.add(FAKE.type)
    try:
        with mode:
            yield mode.counters
    finally:
        DEVICE_TYPES.discard(FAKE.type)
        _MODES.pop()
        torch.Generator, torch.tensor = saved
        _DEVICE_GENERATORS.clear()
