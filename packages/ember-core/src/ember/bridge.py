"""The Bridge's shared helpers: between Tensors and backend handles.

The Bridge is the one layer every op crosses between a Tensor and its device's stack: the op functions of
:mod:`ember.ops` (and :mod:`ember.ops.nn` for ``ember.nn.functional``) validate, promote and convert with the
helpers here, in :mod:`ember.shapes` (the leaf module of shape helpers: broadcasting, dims, size arguments) and in
the op registry :mod:`ember.opinfo`. This module converts user values (tensors, Python scalars, numpy arrays,
nested lists) into handles on a device, checks that operands share a device, and moves data between devices
(DLPack where both sides speak it, else host memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .device import Device, as_device, default_device
from .dtypes import DType
from .errors import DeviceError, DTypeError, EmberError, ShapeError, UnsupportedError, ValueRangeError
from .tensor import Tensor  # tensor imports no Bridge module at import time: no cycle


def same_device(op: str, *tensors: Tensor) -> Device:
    """The device all tensors live on; DeviceError naming op and two of the devices when they differ."""
    dev = tensors[0]._device
    for t in tensors[1:]:
        if t._device is not dev:
            raise DeviceError(
                f"{op}: expected all tensors on the same device, got {dev} and {t._device} "
                f"(move one with .to(device))"
            )
    return dev


# --------------------------------------------------------------------------------------------------------------
# values -> handles
# --------------------------------------------------------------------------------------------------------------
def infer_dtype(data: Any, device: Device | None = None) -> DType:
    """The dtype ember.tensor(data) gets when none is given (PyTorch's inference)."""
    if isinstance(data, np.ndarray) or isinstance(data, np.generic):
        return dt.from_numpy_dtype(data.dtype)
    if isinstance(data, bool):
        return dt.bool_
    if isinstance(data, int):
        return dt.int64
    if isinstance(data, float):
        return device.default_dtype if device is not None else dt.get_default_dtype()
    if isinstance(data, complex):
        return _default_complex(device)
    try:
        arr = np.asarray(data)
    except ValueError as exc:
        raise ShapeError(f"tensor(): nested data is ragged or not numeric: {exc}") from None
    if arr.dtype.kind == "c":  # Python complex leaves: the default complex dtype (PyTorch)
        return _default_complex(device)
    if arr.dtype.kind in "biuf" and isinstance(data, (list, tuple)):
        typed = _infer_from_leaves(data, device)
        if typed is not None:
            return typed
    if arr.dtype.kind == "b":
        return dt.bool_
    if arr.dtype.kind in "iu":
        return dt.int64
    if arr.dtype.kind == "f":
        return device.default_dtype if device is not None else dt.get_default_dtype()
    if arr.dtype.kind in "OUS":
        _check_leaves(arr if arr.dtype.kind == "O" else np.asarray(data, dtype=object), None)  # names a non-number
        kinds = {type(v) for v in arr.ravel()}
        if float in kinds:
            return device.default_dtype if device is not None else dt.get_default_dtype()
        if kinds and kinds <= _PY_LEAVES:  # Python ints past int64: int64, refused by the range check
            return dt.int64 if int in kinds else dt.bool_
        raise DTypeError("tensor(): could not infer a dtype from the nested data (mixed tensors/objects?)")
    raise DTypeError(f"tensor(): unsupported data of numpy kind {arr.dtype} ({type(data).__name__})")


def _default_complex(device: Device | None) -> DType:
    """The complex dtype of Python complex data: the (device's) default float dtype's complex counterpart."""
    return (device.default_dtype if device is not None else dt.get_default_dtype()).to_complex


def _leaf_error(v: Any, dtype: DType | None) -> DTypeError:
    to = f" to {dtype}" if dtype is not None else ""
    return DTypeError(
        f"tensor(): cannot convert {type(v).__name__} {v!r}{to}: the data may hold only numbers (bool, int, "
        "float) and tensors"
    )


def _is_number(v: Any) -> bool:
    if isinstance(v, (str, bytes, bytearray, complex)) or v is None:
        return False
    if isinstance(v, np.generic):
        return v.dtype.kind in "biuf" or v.dtype.name == "bfloat16"
    return hasattr(type(v), "__float__") or hasattr(type(v), "__index__")


def _check_leaves(arr: np.ndarray, dtype: DType | None) -> None:
    """Refuse (DTypeError naming the value) strings, bytes, None, complex and other non-numbers in the data:
    numpy would parse "1.5" as a float, or call None False."""
    for v in arr.ravel():
        if not _is_number(v):
            raise _leaf_error(v.item() if isinstance(v, np.generic) else v, dtype)


def _range_error(v: Any, dtype: DType) -> ValueRangeError:
    return ValueRangeError(f"tensor(): value {v!r} cannot be converted to type {dtype.name} without overflow")


def _python_data_array(data: Any, dtype: DType) -> np.ndarray:
    """Python data (lists, scalars) as an array of dtype with PyTorch's checks: no strings or None, integer
    dtypes take only the values they hold (an unsigned one also negatives down to -max, which wrap), floats
    for integer dtypes must be finite and in range; numpy would wrap or parse them silently."""
    arr = np.asarray(data)
    kind = arr.dtype.kind
    if kind == "c" and not dtype.is_complex:
        raise _leaf_error(arr.ravel()[0].item(), dtype)
    if kind in "OUS":
        # numpy turned numbers into strings beside a string ([1, "a"] -> ["1", "a"]): look at the data itself
        _check_leaves(arr if kind == "O" else np.asarray(data, dtype=object), dtype)
        vals = []
        for v in arr.ravel():
            v = v.item() if isinstance(v, np.generic) else v
            if dtype.is_bool:
                vals.append(bool(v))
            elif dtype.is_integer:
                num = v if isinstance(v, int) else float(v)
                if not dt.fits(num, dtype):
                    raise _range_error(v, dtype)
                vals.append(int(num))
            else:
                try:
                    vals.append(float(v))
                except OverflowError:
                    raise _range_error(v, dtype) from None
        out = np.array(vals, dtype=np.int64 if dtype.is_integer else np.float64 if dtype.is_floating_point
                       else np.bool_)
        return out.reshape(arr.shape)
    if dtype.is_integer and arr.size and kind in "iuf":
        lo, hi = dt.int_range(dtype)
        if kind == "f":
            bad = ~(np.isfinite(arr) & (arr >= lo) & (arr <= hi))
        else:
            bad = (arr > hi) | (arr < (lo if dtype.is_signed else -hi))
        if bad.any():
            v = arr[bad].ravel()[0].item()
            raise _range_error(v, dtype)
    return arr


_PY_LEAVES = frozenset({bool, int, float})


def _infer_from_leaves(data: Any, device: Device | None) -> DType | None:
    """PyTorch's dtype for a sequence holding numpy scalars: promote_types over the leaves' own dtypes (a
    Python float counts as the default dtype). None when every leaf is a Python number (the rules below apply)."""
    try:
        kinds = set(map(type, np.asarray(data, dtype=object).ravel()))
    except (ValueError, TypeError):
        return None
    if kinds <= _PY_LEAVES:
        return None
    result: DType | None = None
    for k in kinds:
        if k is float:
            d = device.default_dtype if device is not None else dt.get_default_dtype()
        elif k in _PY_LEAVES:
            d = dt.bool_ if k is bool else dt.int64
        elif issubclass(k, np.generic):
            try:
                d = dt.from_numpy_dtype(np.dtype(k))
            except Exception:  # noqa: BLE001 - a numpy type ember lacks (uint16, ...): keep the old rules
                return None
        else:
            return None
        result = d if result is None else dt.promote_types(result, d)
    return result


def host_array(data: Any, dtype: DType) -> np.ndarray:
    """A host numpy array of dtype from nested lists, scalars, numpy arrays or tensors."""
    if isinstance(data, Tensor):
        return data.numpy().astype(dtype.numpy, copy=False)
    if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
        data = [host_array(x, dtype) for x in data]
    try:
        if isinstance(data, np.ndarray):
            arr = data  # numpy data converts as numpy (and PyTorch) cast it: no range checks
            if arr.dtype.kind not in "biufc" and arr.dtype.name != "bfloat16":
                raise DTypeError(f"tensor(): cannot convert a numpy array of dtype {arr.dtype} to {dtype}")
        else:
            arr = _python_data_array(data, dtype)
        if arr.dtype.kind == "f" and dtype.is_integer and np.isnan(arr).any():
            raise ValueRangeError(f"tensor(): cannot convert NaN to integer dtype {dtype}")
        return np.require(arr.astype(dtype.numpy, copy=False), requirements='C')
    except EmberError:
        raise
    except ValueError as exc:
        raise ShapeError(f"tensor(): nested data is ragged or not numeric: {exc}") from None
    except TypeError as exc:
        raise DTypeError(f"tensor(): cannot convert {type(data).__name__} to {dtype}: {exc}") from None


def check_dtype_supported(device: Device, dtype: DType, op: str) -> None:
    if dtype not in device.stack.supported_dtypes:
        if dtype.is_complex:  # a DTypeError (PyTorch: TypeError) naming the dtype and the backend
            raise DTypeError(f"{op}: dtype {dtype} is not supported by backend {device.stack.base_backend.name!r} "
                             f"(device {device}); its supported dtypes: "
                             f"{sorted(d.name for d in device.stack.supported_dtypes)}")
        raise UnsupportedError(f"{op}: device {device} does not support dtype {dtype}")


def to_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """Build a tensor from data (the body of ``ember.tensor``)."""
    dev = as_device(device) if device is not None else (
        data._device if isinstance(data, Tensor) else default_device()
    )
    d = dt.as_dtype(dtype) if dtype is not None else infer_dtype(data, dev)
    check_dtype_supported(dev, d, "tensor")
    arr = host_array(data, d)
    return Tensor._make(dev.stack.from_numpy(arr), d, dev)


def transfer(t: Tensor, device: Device) -> Tensor:
    """Move t to another device: DLPack between backends that both speak it, else through host memory.

    A destination backend may move data from a peer itself: ``from_peer(source_backend, handle)`` (optional, on
    the undecorated backend) gets the source's undecorated backend and handle and returns its own handle, or None
    to decline (ember-remote moves a tensor between two devices of one server on the server)."""
    src = t._device
    if src is device:
        return t
    check_dtype_supported(device, t._dtype, "to")
    if src.base is device.base:  # same backend, other decorators: share the data, not the decoration
        return Tensor._make(device.stack.lift(src.stack.lower(t._h)), t._dtype, device)
    stack = device.stack
    from_peer = getattr(stack.base_backend, "from_peer", None)
    if from_peer is not None:
        moved = from_peer(src.stack.base_backend, src.stack.lower(t._h))
        if moved is not None:
            return Tensor._make(stack.lift(moved), t._dtype, device)
    h = t._h
    if hasattr(stack, "from_dlpack") and hasattr(h, "__dlpack__"):
        try:
            return Tensor._make(stack.from_dlpack(h), t._dtype, device)
        except (TypeError, BufferError, RuntimeError, NotImplementedError):
            pass  # fall through to the host path
    return Tensor._make(stack.from_numpy(np.require(t.numpy(), requirements='C')), t._dtype, device)
