"""Conformance: tensor factories (inference rules, shapes, fill values, ranges, random streams, *_like)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.testing import ALL_DTYPES, FLOAT_DTYPES, assert_close, require_dtype, torch_dtype, torch_or_skip


# --------------------------------------------------------------------------------------------------------------
# ember.tensor: dtype inference follows torch.tensor
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [1, 2.5, True, [1, 2, 3], [1.0, 2], [True, False], [True, 1], [[1, 2], [3, 4]], [[1.5], [2]], [], [[]],
     [[], []], [1, 2.5, True]],
    ids=repr,
)
def test_tensor_inference_matches_torch(device, data):
    torch = torch_or_skip()
    t = ember.tensor(data, device=device)
    assert t.device == device
    assert_close(t, torch.tensor(data), msg=f"tensor({data!r})")


@pytest.mark.parametrize(
    "data",
    [[np.float16(1)], [[np.float16(1)], [np.float16(2.5)]], [np.int32(3)], [np.uint8(7)], [np.bool_(True)],
     [np.float64(1.5)], [np.float32(1.5)], [np.float16(1), 2.0], [np.float16(1), np.float32(2)], [np.int8(1), 3],
     [np.int8(1), 3.5], [np.float16(1), np.int32(2)], [np.int16(1), np.uint8(2)], [np.int32(1), True]],
    ids=repr,
)
def test_tensor_inference_from_numpy_scalars_matches_torch(device, data):
    # torch promotes over the leaves' own dtypes (a Python float counts as the default dtype)
    torch = torch_or_skip()
    want = torch.tensor(data)
    require_dtype(device, str(want.dtype).removeprefix("torch."))
    t = ember.tensor(data, device=device)
    assert t.device == device
    assert_close(t, want, msg=f"tensor({data!r})")


@pytest.mark.parametrize("np_dtype", ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                                      "bool"])
def test_tensor_from_numpy_keeps_dtype(device, np_dtype):
    d = dt.as_dtype(np_dtype)
    require_dtype(device, d)
    a = (np.arange(6).reshape(2, 3) % 3).astype(np_dtype)
    t = ember.tensor(a, device=device)
    assert_close(t, a)
    a[0, 0] = 1  # tensor() copies: later changes to the source do not show
    assert t.numpy()[0, 0] == 0


@pytest.mark.parametrize("d", ALL_DTYPES, ids=str)
def test_tensor_explicit_dtype(device, d):
    require_dtype(device, d)
    t = ember.tensor([[0, 1], [2, 3]], dtype=d, device=device)
    assert t.dtype is d and t.shape == (2, 2)
    assert_close(t, np.array([[0, 1], [2, 3]]).astype(d.numpy))


def test_tensor_default_device_is_device_under_test(device):
    assert ember.tensor([1.0]).device == device
    assert ember.zeros(2).device == device


def test_tensor_float_data_uses_default_dtype(device):
    require_dtype(device, dt.float64)
    old = dt.get_default_dtype()
    try:
        ember.set_default_dtype(ember.float64)
        assert ember.tensor([1.5], device=device).dtype is ember.float64
        assert ember.tensor([1], device=device).dtype is ember.int64
        assert ember.zeros(2, device=device).dtype is ember.float64
    finally:
        ember.set_default_dtype(old)


def test_tensor_scalar_is_0d(device):
    t = ember.tensor(3.5, device=device)
    assert t.shape == () and t.ndim == 0 and t.numel() == 1
    assert t.item() == 3.5


def test_tensor_bad_data_raises_typed_errors(device):
    with pytest.raises(ember.ShapeError, match="ragged"):
        ember.tensor([[1, 2], [3]], device=device)
    with pytest.raises(ember.ValueRangeError, match="nan cannot be converted to type int32 without overflow"):
        ember.tensor([float("nan")], dtype=ember.int32, device=device)  # torch: the same words, a RuntimeError
    with pytest.raises(ember.DTypeError):
        ember.tensor(["a", "b"], device=device)
    with pytest.raises(ember.DTypeError, match="cannot interpret"):
        ember.tensor([1], dtype="complex1024", device=device)


# --------------------------------------------------------------------------------------------------------------
# filled factories
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,value", [("zeros", 0), ("ones", 1), ("empty", None)])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (2, 0, 4)], ids=str)
def test_filled_factories(device, name, value, shape):
    fn = getattr(ember, name)
    for t in (fn(shape, device=device), fn(*shape, device=device)):
        assert t.shape == shape and t.dtype is ember.float32 and t.device == device
        if value is not None:
            assert_close(t, np.full(shape, value, dtype=np.float32))


@pytest.mark.parametrize("d", ALL_DTYPES, ids=str)
def test_zeros_ones_dtypes(device, d):
    require_dtype(device, d)
    assert_close(ember.zeros(2, 3, dtype=d, device=device), np.zeros((2, 3), d.numpy))
    assert_close(ember.ones([4], dtype=d, device=device), np.ones(4, d.numpy))


@pytest.mark.parametrize("value,expected", [(1.5, dt.float32), (2, dt.int64), (True, dt.bool_)])
def test_full_infers_dtype_from_value(device, value, expected):
    torch = torch_or_skip()
    t = ember.full((2, 2), value, device=device)
    assert_close(t, torch.full((2, 2), value))
    assert t.dtype is expected
    if device.supports_dtype(dt.float64):
        assert_close(ember.full(3, 7, dtype=ember.float64, device=device), np.full(3, 7.0))


def test_factories_reject_bad_sizes(device):
    with pytest.raises(ember.ShapeError, match="negative dimension"):
        ember.zeros(2, -1, device=device)
    with pytest.raises(ember.ShapeError, match="sizes must be ints"):
        ember.ones(2.5, device=device)
    with pytest.raises(ember.ShapeError, match="full"):
        ember.full((-3,), 1.0, device=device)


# --------------------------------------------------------------------------------------------------------------
# ranges
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [(5,), (2, 7), (0, 10, 3), (10, 0, -3), (0, 1, 0.1), (-1.0, 1.0, 0.25), (1, 2.5), (0, 0), (0.5, 3),
     (1, -2, -0.5), (0, 1, 0.3), (-3, 3, 1.5)],
    ids=repr,
)
def test_arange_matches_torch(device, args):
    torch = torch_or_skip()
    assert_close(ember.arange(*args, device=device), torch.arange(*args), msg=f"arange{args}")


def test_arange_dtype_argument(device):
    torch = torch_or_skip()
    for d in (dt.int32, dt.float64, dt.int8):
        if device.supports_dtype(d):
            assert_close(ember.arange(0, 10, 2, dtype=d, device=device), torch.arange(0, 10, 2, dtype=torch_dtype(d)))


def test_arange_errors(device):
    with pytest.raises(ember.ValueRangeError, match="step must be nonzero"):
        ember.arange(0, 5, 0, device=device)
    with pytest.raises(ember.ValueRangeError, match="inconsistent with step sign"):
        ember.arange(0, 5, -1, device=device)
    with pytest.raises(ember.ValueRangeError, match="arange"):
        ember.arange(0, math.inf, device=device)
    with pytest.raises(ember.DTypeError, match="arange"):
        ember.arange("5", device=device)


@pytest.mark.parametrize("args", [(0, 1, 5), (-2, 2, 1), (3, 3, 4), (0, 1, 0), (1, -1, 7), (0, 10, 11)], ids=repr)
def test_linspace_matches_torch(device, args):
    torch = torch_or_skip()
    assert_close(ember.linspace(*args, device=device), torch.linspace(*args), msg=f"linspace{args}")


def test_linspace_int_dtype_and_errors(device):
    torch = torch_or_skip()
    assert_close(ember.linspace(0, 10, 5, dtype=ember.int64, device=device),
                 torch.linspace(0, 10, 5, dtype=torch.int64))
    with pytest.raises(ember.ValueRangeError, match="linspace"):
        ember.linspace(0, 1, -2, device=device)


@pytest.mark.parametrize("args", [(3,), (2, 4), (4, 2), (0,), (1, 0)], ids=repr)
def test_eye_matches_torch(device, args):
    torch = torch_or_skip()
    assert_close(ember.eye(*args, device=device), torch.eye(*args))
    assert_close(ember.eye(*args, dtype=ember.int64, device=device), torch.eye(*args, dtype=torch.int64))


def test_eye_errors(device):
    with pytest.raises(ember.ValueRangeError, match="eye"):
        ember.eye(-1, device=device)


# --------------------------------------------------------------------------------------------------------------
# random streams
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=str)
def test_rand_range_dtype_and_shape(device, d):
    require_dtype(device, d)
    t = ember.rand(2000, dtype=d, device=device)
    assert t.shape == (2000,) and t.dtype is d
    a = t.numpy().astype(np.float64)
    assert a.min() >= 0.0 and a.max() <= 1.0
    assert 0.4 < a.mean() < 0.6 and a.std() > 0.2
    assert len(np.unique(a)) > 50


@pytest.mark.parametrize("d", FLOAT_DTYPES, ids=str)
def test_randn_moments(device, d):
    require_dtype(device, d)
    a = ember.randn(50, 100, dtype=d, device=device).numpy().astype(np.float64)
    assert a.shape == (50, 100)
    assert abs(a.mean()) < 0.1 and 0.9 < a.std() < 1.1
    assert (a < 0).any() and (a > 2).any()


def test_rand_defaults_and_errors(device):
    assert ember.rand(3, device=device).dtype is ember.float32
    assert ember.randn((2, 2), device=device).shape == (2, 2)
    assert ember.rand(0, device=device).shape == (0,)
    with pytest.raises(ember.DTypeError, match="floating"):
        ember.rand(3, dtype=ember.int64, device=device)
    with pytest.raises(ember.DTypeError, match="randn"):
        ember.randn(3, dtype=ember.bool_, device=device)


@pytest.mark.parametrize("low,high", [(0, 2), (3, 10), (-5, 5), (-100, -90)])
def test_randint_range(device, low, high):
    t = ember.randint(low, high, (4000,), device=device)
    assert t.dtype is ember.int64 and t.shape == (4000,)
    a = t.numpy()
    assert a.min() >= low and a.max() < high
    assert set(np.unique(a)) == set(range(low, high))  # every value shows up in 4000 draws


def test_randint_forms_and_dtype(device):
    t = ember.randint(5, (3, 2), device=device)
    assert t.shape == (3, 2) and 0 <= t.numpy().min() and t.numpy().max() < 5
    if device.supports_dtype(dt.int8):
        t = ember.randint(-3, 3, (100,), dtype=ember.int8, device=device)
        assert t.dtype is ember.int8 and t.numpy().min() >= -3 and t.numpy().max() < 3
    with pytest.raises(ember.ValueRangeError, match="low < high"):
        ember.randint(5, 5, (2,), device=device)
    with pytest.raises(ember.ValueRangeError, match="size is required"):
        ember.randint(5, device=device)


@pytest.mark.parametrize("factory", ["rand", "randn", "randint"])
def test_seed_reproduces_stream(device, factory):
    def draw():
        if factory == "randint":
            return ember.randint(0, 1000, (64,), device=device).numpy().copy()
        return getattr(ember, factory)(64, device=device).numpy().copy()

    device.seed(1234)
    a, b = draw(), draw()
    device.seed(1234)
    c, d = draw(), draw()
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(b, d)
    assert not np.array_equal(a, b), "consecutive draws must differ"
    device.seed(4321)
    assert not np.array_equal(draw(), a), "different seeds must give different streams"
    ember.manual_seed(1234, device=device)
    np.testing.assert_array_equal(draw(), a)


def test_seed_rejects_non_int(device):
    with pytest.raises(ember.DeviceError, match="seed must be an int"):
        device.seed(1.5)


# --------------------------------------------------------------------------------------------------------------
# *_like
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [dt.float32, dt.int32, dt.bool_, dt.float64], ids=str)
def test_like_factories(device, d):
    require_dtype(device, d)
    x = ember.tensor(np.arange(6).reshape(2, 3).astype(d.numpy), device=device)
    for name, fill in (("zeros_like", 0), ("ones_like", 1), ("empty_like", None)):
        r = getattr(ember, name)(x)
        assert r.shape == x.shape and r.dtype is d and r.device == device, name
        if fill is not None:
            assert_close(r, np.full((2, 3), fill, d.numpy), msg=name)
    assert_close(ember.full_like(x, 1), np.ones((2, 3), d.numpy))
    r = ember.zeros_like(x, dtype=ember.float64) if device.supports_dtype(dt.float64) else None
    if r is not None:
        assert r.dtype is ember.float64


def test_random_like(device):
    x = ember.zeros(3, 4, dtype=ember.float32, device=device)
    for fn in (ember.rand_like, ember.randn_like):
        r = fn(x)
        assert r.shape == (3, 4) and r.dtype is ember.float32 and r.device == device
    r = ember.randint_like(x, 10)
    assert r.shape == (3, 4) and r.dtype is ember.float32
    a = r.numpy()
    assert (a == np.floor(a)).all() and a.min() >= 0 and a.max() < 10
    with pytest.raises(ember.DTypeError, match="expected a Tensor"):
        ember.zeros_like(np.zeros(3))
