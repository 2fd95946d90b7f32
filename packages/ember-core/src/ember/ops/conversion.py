"""Dtype and device conversion, copies: ``to``, ``clone``, ``contiguous``, ``float()``, ``detach`` ..."""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..bridge import check_dtype_supported, transfer
from ..device import Device, as_device
from ..dtypes import DType
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor


def _cast(x: Tensor, d: DType) -> Tensor:
    if x._dtype is d:
        return x
    check_dtype_supported(x._device, d, "to")
    return Tensor._make(x._device.stack.cast(x._h, d), d, x._device)


def to(self: Tensor, *args: Any, dtype: Any = None, device: Any = None, copy: bool = False,
       non_blocking: bool = False) -> Tensor:
    """``x.to(device)``, ``x.to(dtype)``, ``x.to(device, dtype)``, ``x.to(other_tensor)``; returns self when
    nothing changes (unless copy=True), like PyTorch."""
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a._device, a._dtype
        elif isinstance(a, Device) or (isinstance(a, str) and not _is_dtype_name(a)):
            device = a
        elif a is not None:
            dtype = a
    out = self
    if device is not None:
        out = transfer(out, as_device(device))
    if dtype is not None:
        out = _cast(out, dt.as_dtype(dtype))
    if copy and out is self:
        out = clone(self)
    return out


def _is_dtype_name(s: str) -> bool:
    try:
        dt.as_dtype(s)
        return True
    except DTypeError:
        return False


def clone(input: Tensor) -> Tensor:
    """A copy with its own memory."""
    return Tensor._make(input._device.stack.copy(input._h), input._dtype, input._device)


def contiguous(self: Tensor) -> Tensor:
    return Tensor._make(self._device.stack.contiguous(self._h), self._dtype, self._device)


def copy_(self: Tensor, src: Any) -> Tensor:
    """Copy src (broadcast to self's shape, cast to self's dtype, moved to self's device) into self."""
    from ..shapes import broadcast_shapes

    if not isinstance(src, Tensor):
        from .creation import tensor

        src = tensor(src, dtype=self._dtype, device=self._device)
    src = to(src, self._device)
    if broadcast_shapes(self.shape, src.shape, op="copy_") != self.shape:
        from ..errors import ShapeError

        raise ShapeError(f"copy_: source of shape {src.shape} cannot be broadcast to {self.shape}")
    h = src._h if src._dtype is self._dtype else self._device.stack.cast(src._h, self._dtype)
    self._device.stack.assign(self._h, h)
    return self


def fill_(self: Tensor, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ShapeError(f"fill_: fill_ only supports 0-dimension value tensor but got tensor with {value.ndim} "
                             f"dimensions (shape {list(value.shape)})")
        # a tensor value is cast as copy_ casts (300 wraps into uint8, -0.5 gives 0), not range-checked, as torch
        v = _cast(value, self._dtype).item() if value._dtype is not self._dtype else value.item()
    else:
        from ..dtypes import convert_scalar
        from .creation import _check_float_fill

        v = convert_scalar(value, self._dtype, "fill_")  # PyTorch's range check of a Python scalar
        _check_float_fill(v, self._dtype, "fill_")
    self._device.stack.assign(self._h, v)
    return self


def zero_(self: Tensor) -> Tensor:
    return fill_(self, 0)


def type_as(self: Tensor, other: Tensor) -> Tensor:
    return _cast(self, other._dtype)


def cpu(self: Tensor) -> Tensor:
    """The tensor on the host device (``Device.host()``: the installed backend registered with ``host=True``)."""
    return to(self, Device.host())


def cuda(self: Tensor, device: Any = None, non_blocking: bool = False) -> Tensor:
    """The tensor on a CUDA device (``x.cuda()``, ``x.cuda(1)``, ``x.cuda("cuda:1")``): ``x.to("cuda")``, so without
    a CUDA backend installed it raises the DeviceError that says which extra to install."""
    if device is None:
        return to(self, "cuda")
    if isinstance(device, int) and not isinstance(device, bool):
        return to(self, f"cuda:{device}")
    dev = as_device(device)
    if dev.base.kind != "cuda":
        from ..errors import DeviceError

        raise DeviceError(f"cuda: expected a CUDA device, got {dev} (use .to({str(dev)!r}) to move there)")
    return to(self, dev)


def _caster(d: DType) -> Any:
    def f(self: Tensor) -> Tensor:
        return _cast(self, d)

    f.__name__ = d.name
    f.__doc__ = f"``self.to({d})``"
    return f


#: torch's legacy tensor-type names (``torch.FloatTensor`` ...) by dtype; :func:`type_` spells them ``ember.*``
_TYPE_NAMES: dict[DType, str] = {
    dt.float32: "FloatTensor", dt.float64: "DoubleTensor", dt.float16: "HalfTensor", dt.bfloat16: "BFloat16Tensor",
    dt.int64: "LongTensor", dt.int32: "IntTensor", dt.int16: "ShortTensor", dt.int8: "CharTensor",
    dt.uint8: "ByteTensor", dt.bool_: "BoolTensor",
}


def _type_name(x: Tensor) -> str:
    from ..device import is_host

    # torch.FloatTensor on the CPU, torch.cuda.FloatTensor elsewhere: the host backend (decorated or not: the same
    # memory) is bare, others name their kind
    where = "" if is_host(x._device.base) else f"{x._device.type}."
    return f"ember.{where}{_TYPE_NAMES[x._dtype]}"


def _dtype_of_type_name(name: str) -> DType | None:
    """The dtype a legacy type string names (``'ember.FloatTensor'``, ``'torch.LongTensor'``, ``'FloatTensor'``),
    or None; a device part (``torch.cuda.FloatTensor``) is not a type string here."""
    prefix, _, last = name.rpartition(".")
    if prefix not in ("", "ember", "torch"):
        return None
    return next((d for d, n in _TYPE_NAMES.items() if n == last), None)


def type_(self: Tensor, dtype: Any = None, non_blocking: bool = False) -> Any:
    """``x.type()``: the legacy type string, ``'ember.FloatTensor'`` (torch's ``'torch.FloatTensor'``) on the host
    backend (with any decorators) and ``'ember.<kind>.FloatTensor'`` (as ``'torch.cuda.FloatTensor'``) elsewhere.
    ``x.type(dtype)``: x cast to dtype (a dtype, a dtype name or a type string such as ``'torch.DoubleTensor'``),
    x itself when it already has it; devices change with ``.to(device)``."""
    if dtype is None:
        return _type_name(self)
    if isinstance(dtype, str):
        named = _dtype_of_type_name(dtype)
        if named is None and not _is_dtype_name(dtype):
            raise DTypeError(f"type: invalid type {dtype!r}: expected a dtype or a type string such as "
                             f"'ember.FloatTensor' ({', '.join(sorted(_TYPE_NAMES.values()))}); move tensors "
                             "between devices with .to(device)")
        dtype = named or dtype
    return _cast(self, dt.as_dtype(dtype))


def is_tensor(obj: Any) -> bool:
    """True when obj is an ember Tensor (a Parameter included), as ``torch.is_tensor``."""
    return isinstance(obj, Tensor)


def numel(input: Tensor) -> int:
    """The number of elements of ``input`` (``torch.numel``)."""
    if not isinstance(input, Tensor):
        raise DTypeError(f"numel: expected a Tensor, got {type(input).__name__}")
    return input.numel()


__all__ = ["clone", "is_tensor", "numel"]

TENSOR_METHODS: dict[str, Any] = {
    "to": to,
    "clone": clone,
    "contiguous": contiguous,
    "copy_": copy_,
    "fill_": fill_,
    "zero_": zero_,
    "type_as": type_as,
    "cpu": cpu,
    "cuda": cuda,
    "float": _caster(dt.float32),
    "double": _caster(dt.float64),
    "half": _caster(dt.float16),
    "bfloat16": _caster(dt.bfloat16),
    "int": _caster(dt.int32),
    "long": _caster(dt.int64),
    "short": _caster(dt.int16),
    "char": _caster(dt.int8),
    "byte": _caster(dt.uint8),
    "bool": _caster(dt.bool_),
}
