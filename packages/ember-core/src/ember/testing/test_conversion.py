"""Conformance: dtype and device conversion, copies, host export (numpy, item, tolist, __array__, DLPack)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.testing import ALL_DTYPES, assert_close, pairs, require_dtype, to_torch, torch_dtype, torch_or_skip

_VALUES = np.array([-2.7, -1.5, -0.5, 0.0, 0.4, 1.5, 2.5, 100.9])


@pytest.mark.parametrize("pair", pairs(ALL_DTYPES), ids=lambda p: f"{p[0].name}->{p[1].name}")
def test_to_dtype_matches_torch(device, pair):
    torch_or_skip()
    src, dst = pair
    require_dtype(device, src, dst)
    vals = _VALUES if src.is_floating_point else np.array([0, 1, 2, 3, 7, 100])
    if src is dt.uint8 or dst is dt.uint8:
        vals = np.abs(vals)  # negative float -> uint8 is undefined behaviour in C and differs between libraries
    x = ember.tensor(vals.astype(src.numpy), device=device)
    y = x.to(dst)
    assert y.dtype is dst and y.device == device
    assert_close(y, to_torch(x).to(torch_dtype(dst)), msg=f"{src.name} -> {dst.name}")
    assert x.dtype is src, "to() must not change its input"


def test_float_to_int_truncates_toward_zero(device):
    x = ember.tensor([-2.9, -0.5, 0.5, 2.9], device=device)
    assert x.to(ember.int32).tolist() == [-2, 0, 0, 2]
    assert x.long().tolist() == [-2, 0, 0, 2]
    assert x.bool().tolist() == [True, True, True, True]


def test_to_returns_self_when_nothing_changes(device):
    x = ember.ones(3, device=device)
    assert x.to(ember.float32) is x
    assert x.to(device) is x
    assert x.to(device, ember.float32) is x
    y = x.to(ember.float32, copy=True)
    assert y is not x
    assert_close(y, np.ones(3, np.float32))


def test_to_other_tensor_and_dtype_names(device):
    x = ember.ones(2, device=device)
    i = ember.tensor([1, 2], device=device)
    assert x.to(i).dtype is ember.int64
    assert x.to("float64").dtype is ember.float64 if device.supports_dtype(dt.float64) else True
    assert x.to(dtype=ember.int32).dtype is ember.int32
    assert x.type_as(i).dtype is ember.int64
    for name, d in (("float", dt.float32), ("double", dt.float64), ("half", dt.float16), ("int", dt.int32),
                    ("long", dt.int64), ("short", dt.int16), ("char", dt.int8), ("byte", dt.uint8),
                    ("bool", dt.bool_)):
        if device.supports_dtype(d):
            assert getattr(x, name)().dtype is d, name


def test_to_device_round_trip(device):
    host = ember.Device.host()
    x = ember.tensor([[1.5, -2.0], [3.0, 4.0]], device=device)
    h = x.to(host)
    assert h.device == host
    assert_close(h, x.numpy())
    back = h.to(device)
    assert back.device == device
    assert_close(back, x.numpy())
    assert x.cpu().device == host
    assert x.to("cpu").device == host  # PyTorch's spelling of the host device
    assert_close(x.to(str(host)), x.numpy())


def test_to_rejects_bad_arguments(device):
    x = ember.ones(2, device=device)
    with pytest.raises(ember.EmberError):
        x.to("no_such_device_kind")
    with pytest.raises(ember.DTypeError, match="cannot interpret"):
        x.to(dtype="complex1024")


def test_clone_is_independent(device):
    x = ember.tensor([1.0, 2.0, 3.0], device=device)
    y = x.clone()
    assert y.dtype is x.dtype and y.shape == x.shape and y.device == device
    y += 1
    assert x.tolist() == [1.0, 2.0, 3.0]
    assert y.tolist() == [2.0, 3.0, 4.0]
    assert ember.clone(x).tolist() == [1.0, 2.0, 3.0]


def test_copy_casts_and_broadcasts(device):
    torch = torch_or_skip()
    x = ember.zeros(2, 3, device=device)
    src = ember.tensor([1, 2, 3], device=device)
    assert x.copy_(src) is x
    t = torch.zeros(2, 3)
    t.copy_(to_torch(src))
    assert_close(x, t)
    x.copy_([[7, 8, 9], [1, 2, 3]])
    assert x.tolist() == [[7.0, 8.0, 9.0], [1.0, 2.0, 3.0]]
    i = ember.zeros(2, dtype=ember.int32, device=device)
    i.copy_(ember.tensor([1.9, -1.9], device=device))
    assert i.tolist() == [1, -1], "copy_ from float to int truncates toward zero"
    with pytest.raises(ember.ShapeError, match="copy_"):
        x.copy_(ember.ones(4, device=device))


def test_fill_and_zero(device):
    x = ember.ones(2, 2, device=device)
    assert x.fill_(3.5) is x
    assert x.tolist() == [[3.5, 3.5], [3.5, 3.5]]
    x.zero_()
    assert x.tolist() == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("d", ALL_DTYPES, ids=str)
def test_numpy_export(device, d):
    require_dtype(device, d)
    a = (np.arange(6).reshape(2, 3) % 2).astype(d.numpy)
    x = ember.tensor(a, device=device)
    n = x.numpy()
    assert isinstance(n, np.ndarray) and n.dtype == d.numpy and n.shape == (2, 3)
    np.testing.assert_array_equal(n.astype(np.float64), a.astype(np.float64))
    arr = np.asarray(x)
    assert arr.dtype == d.numpy and arr.shape == (2, 3)
    assert np.array(x, dtype=np.float64).dtype == np.float64


def test_item_and_tolist(device):
    assert ember.tensor(2.5, device=device).item() == 2.5
    assert isinstance(ember.tensor(3, device=device).item(), int)
    assert isinstance(ember.tensor(True, device=device).item(), bool)
    assert ember.tensor([[7]], device=device).item() == 7
    assert ember.tensor([[1, 2], [3, 4]], device=device).tolist() == [[1, 2], [3, 4]]
    assert ember.tensor(1.5, device=device).tolist() == 1.5
    assert ember.zeros(0, device=device).tolist() == []
    with pytest.raises(ember.ShapeError, match="item: a Tensor with 2 elements"):
        ember.tensor([1, 2], device=device).item()
    with pytest.raises(ember.ShapeError, match="ambiguous"):
        bool(ember.tensor([True, False], device=device))


def test_python_number_protocols(device):
    assert float(ember.tensor([2.5], device=device)) == 2.5
    assert int(ember.tensor(7.9, device=device)) == 7
    assert [10, 20, 30][ember.tensor(1, device=device)] == 20
    with pytest.raises(ember.DTypeError, match="index"):
        [1, 2][ember.tensor(1.0, device=device)]
    assert len(ember.zeros(4, 2, device=device)) == 4
    with pytest.raises(ember.ShapeError, match="len"):
        len(ember.tensor(1.0, device=device))


@pytest.mark.parametrize("d", [dt.float32, dt.float64, dt.int32, dt.int64, dt.uint8, dt.bool_], ids=str)
def test_dlpack_round_trip_with_numpy(device, d):
    require_dtype(device, d)
    a = (np.arange(12).reshape(3, 4) % 5).astype(d.numpy)
    x = ember.tensor(a, device=device)
    if x.__dlpack_device__()[0] == 1:  # a host tensor exports to numpy directly
        n = np.from_dlpack(x)
        np.testing.assert_array_equal(n, a)
        assert n.dtype == a.dtype
    y = ember.from_dlpack(a, device=device)
    assert y.device == device
    assert_close(y, a)


def test_from_numpy_shares_memory_tensor_copies(device):
    a = np.arange(4.0, dtype=np.float32)  # sharing is the point, not float64 (which some backends lack)
    shared = ember.from_numpy(a)
    copied = ember.tensor(a, device=device)
    a[0] = 42.0
    assert shared.device == ember.Device.host()
    assert shared.tolist()[0] == 42.0, "from_numpy shares memory (it lives on the host device)"
    assert copied.tolist()[0] == 0.0, "tensor() copies its input"
    with pytest.raises(ember.DTypeError, match="from_numpy"):
        ember.from_numpy([1, 2])


def test_as_tensor_avoids_copies(device):
    x = ember.ones(3, device=device)
    assert ember.as_tensor(x) is x
    assert ember.as_tensor(x, dtype=ember.float32) is x
    assert ember.as_tensor([1, 2], device=device).dtype is ember.int64


def test_repr_names_dtype_and_device(device):
    r = repr(ember.tensor([1.5, 2.0], dtype=ember.float64, device=device) if device.supports_dtype(dt.float64)
             else ember.tensor([1, 2], dtype=ember.int32, device=device))
    assert r.startswith("tensor(") and "dtype=ember." in r
    if device is not ember.Device.host():  # as PyTorch: every device but the host one is named
        assert f"device={device}" in r
    else:
        assert "device=" not in r
