"""Conformance: the error family. Bad input raises a typed ember error naming the op and the operands involved;
no raw numpy/backend exception escapes and nothing is silently computed."""

from __future__ import annotations

import builtins
import re

import numpy as np
import pytest

import ember
from ember import errors

_FAMILY = {
    "ShapeError": ValueError,
    "DimError": IndexError,
    "IndexOutOfRangeError": IndexError,
    "DTypeError": TypeError,
    "DeviceError": RuntimeError,
    "UnsupportedError": NotImplementedError,
    "PluginError": RuntimeError,
    "OutOfMemoryError": MemoryError,
    "AutodiffError": RuntimeError,
    "ValueRangeError": ValueError,
}


@pytest.mark.parametrize("name,builtin", sorted(_FAMILY.items()))
def test_error_family(name, builtin):
    cls = getattr(ember, name)
    assert cls is getattr(errors, name)
    assert issubclass(cls, ember.EmberError) and issubclass(cls, builtin)
    assert name in errors.__all__


def test_every_public_error_is_in_the_family():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, ember.EmberError), name
        assert issubclass(cls, builtins.Exception)


def _cases(device):
    f = ember.ones(2, 3, device=device)
    i = ember.tensor([1, 2, 3], device=device)
    b = ember.tensor([True, False], device=device)
    return [
        ("add broadcast", lambda: f + ember.ones(4, device=device), ember.ShapeError,
         [r"add", r"\(2, 3\)", r"\(4,\)"]),
        ("mul broadcast", lambda: ember.mul(f, ember.ones(2, device=device)), ember.ShapeError,
         [r"mul", r"\(2, 3\)", r"\(2,\)"]),
        ("where broadcast", lambda: ember.where(b, f, f), ember.ShapeError, ["where", r"\(2,\)", r"\(2, 3\)"]),
        ("matmul shapes", lambda: f @ f, ember.ShapeError, ["matmul", r"\(2, 3\)", "3 != 2"]),
        ("bitwise float", lambda: f & f, ember.DTypeError, ["bitwise_and", "float32"]),
        ("shift bool", lambda: b << b, ember.DTypeError, ["bitwise_left_shift", "bool"]),
        ("sub bool", lambda: b - b, ember.DTypeError, ["sub", "bool"]),
        ("neg bool", lambda: -b, ember.DTypeError, ["neg", "bool"]),
        ("int pow negative", lambda: i ** -2, ember.DTypeError, ["pow", "negative"]),
        ("int div zero", lambda: i // 0, ember.ValueRangeError, ["floor_divide", "division by zero", "int 0"]),
        ("in-place cast", lambda: i.__iadd__(0.5), ember.DTypeError, ["add_", "float32", "int64", "can't be cast"]),
        ("in-place shape", lambda: i.__iadd__(ember.ones(2, 3, dtype=ember.int64, device=device)),
         ember.ShapeError, ["add_", r"\(3,\)", r"\(2, 3\)"]),
        ("matmul dtypes", lambda: f @ ember.ones(3, 2, dtype=ember.int64, device=device), ember.DTypeError,
         ["matmul", "float32", "int64"]),
        ("operand type", lambda: f + "x", ember.DTypeError, ["add", "str"]),
        ("where condition", lambda: ember.where(i, i, i), ember.DTypeError, ["where", "bool", "int64"]),
        ("item", lambda: f.item(), ember.ShapeError, ["item", "6 elements"]),
        ("zeros negative", lambda: ember.zeros(2, -1, device=device), ember.ShapeError, ["zeros", "-1"]),
        ("arange step", lambda: ember.arange(0, 1, 0, device=device), ember.ValueRangeError, ["arange", "step"]),
        ("randint range", lambda: ember.randint(3, 1, (2,), device=device), ember.ValueRangeError,
         ["randint", "low=3", "high=1"]),
        ("rand dtype", lambda: ember.rand(2, dtype=ember.int32, device=device), ember.DTypeError,
         ["rand", "int32"]),
        ("dtype name", lambda: ember.zeros(2, dtype="float128", device=device), ember.DTypeError, ["float128"]),
        ("ragged", lambda: ember.tensor([[1], [2, 3]], device=device), ember.ShapeError, ["tensor", "ragged"]),
        ("requires_grad int", lambda: i.requires_grad_(), ember.DTypeError, ["requires_grad", "int64"]),
        ("set_default_dtype", lambda: ember.set_default_dtype(ember.int32), ember.DTypeError,
         ["set_default_dtype", "int32"]),
        ("clamp none", lambda: ember.clamp(f), ember.ValueRangeError, ["clamp"]),
        ("einsum operands", lambda: ember.einsum("ij,jk", f), ember.ValueRangeError, ["einsum", "2 operands"]),
        ("device spec", lambda: ember.Device.parse(f"{device.kind}:x"), ember.DeviceError,
         [f"{device.kind}:x", "not an int"]),
        ("device kind", lambda: ember.Device.parse("no_such_backend"), ember.EmberError, ["no_such_backend"]),
    ]


def test_error_types_and_messages(device):
    failures = []
    for label, call, cls, fragments in _cases(device):
        try:
            call()
        except ember.EmberError as exc:
            msg = str(exc)
            if not isinstance(exc, cls):
                failures.append(f"{label}: raised {type(exc).__name__}, expected {cls.__name__}: {msg}")
            missing = [p for p in fragments if not re.search(p, msg)]
            if missing:
                failures.append(f"{label}: message {msg!r} lacks {missing}")
        except Exception as exc:  # noqa: BLE001 - the point is to report any non-ember exception
            failures.append(f"{label}: raw {type(exc).__name__} escaped: {exc}")
        else:
            failures.append(f"{label}: no error raised")
    assert not failures, "\n".join(failures)


def _other_device(device):
    """A device that is not ``device``: the host device when testing another backend, else a distinct variant of
    the host device."""
    host = ember.Device.host()
    if device.base is not host:
        return host
    return ember.Device(host.kind, host.index, (*host.options, ("conformance_kit_other_device", True)))


def test_mixed_devices_raise_device_error(device):
    other = _other_device(device)
    a = ember.ones(3, device=device)
    h = device.stack.from_numpy(np.ones(3, np.float32)) if other.kind == device.kind else None
    b = ember.Tensor._make(h, ember.float32, other) if h is not None else ember.ones(3, device=other)
    for label, call in (("add", lambda: a + b), ("matmul", lambda: a @ b), ("where", lambda: ember.where(
            ember.ones(3, dtype=ember.bool_, device=device), a, b)), ("in-place", lambda: a.__iadd__(b)),
            ("einsum", lambda: ember.einsum("i,i->", a, b))):
        with pytest.raises(ember.DeviceError, match="same device") as info:
            call()
        assert str(device) in str(info.value), label


def test_failed_ops_leave_inputs_unchanged(device):
    x = ember.tensor([1, 2, 3], device=device)
    for call in (lambda: x.__iadd__(1.5), lambda: x.__ifloordiv__(0), lambda: x.__iadd__(ember.ones(2, 3))):
        with pytest.raises(ember.EmberError):
            call()
    assert x.tolist() == [1, 2, 3] and x.dtype is ember.int64
