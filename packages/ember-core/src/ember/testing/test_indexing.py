"""Conformance: indexing on the device under test, against PyTorch: getitem/setitem with every index kind,
gather/scatter, index ops, masks, nonzero, take, and every error path (type and message)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import (
    DeviceError,
    DTypeError,
    IndexOutOfRangeError,
    ShapeError,
    Tensor,
    UnsupportedError,
    ValueRangeError,
)
from ember.testing import torch_or_skip
from ember.testing._helpers import NC, elsewhere, need

torch = torch_or_skip()

RNG = np.random.default_rng(7)


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------
class Idx:
    """An index array in a key template: becomes an ember tensor / a torch tensor of the same values."""

    def __init__(self, values: Any, dtype: str = "int64") -> None:
        self.arr = np.asarray(values, dtype=dtype)


def to_ember(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(to_ember(k) for k in key)
    if isinstance(key, Idx):
        need(key.arr.dtype)
        return ember.tensor(key.arr)
    return key


def to_torch(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(to_torch(k) for k in key)
    if isinstance(key, Idx):
        return torch.from_numpy(key.arr.copy())
    return key


def data(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return (np.arange(int(np.prod(shape))).reshape(shape) * 1.5 - 3).astype(dtype)


def check(e: Tensor, t: Any) -> None:
    assert isinstance(e, Tensor)
    assert e.shape == tuple(t.shape), (e.shape, tuple(t.shape))
    np.testing.assert_array_equal(e.numpy(), t.numpy())


# ----------------------------------------------------------------------------------------------------
# getitem
# ----------------------------------------------------------------------------------------------------
I2 = Idx([0, 2])
I3 = Idx([1, -1, 0])
M4 = Idx([True, False, True, True], "bool")
KEYS = [
    0,
    -1,
    2,
    (1, 2),
    (1, 2, 3),
    (-2, -3, -4),
    slice(None),
    slice(1, None),
    slice(None, None, 2),
    slice(-2, None),
    slice(5, 10),
    slice(2, 1),
    slice(-100, 100),
    (slice(None), 1),
    (Ellipsis, 0),
    (0, Ellipsis),
    (Ellipsis,),
    (None,),
    (None, 0),
    (0, None, Ellipsis, None),
    (slice(1, None), None, I2, Ellipsis),
    (Ellipsis, None),
    (slice(None), slice(None), slice(None), None),
    I2,
    I3,
    (I2, I2),
    (I2, slice(None), I2),
    (I2, 0),
    (0, slice(None), I2),
    (slice(None), I2, 0),
    (0, I2),
    (I2, slice(None), 0),
    (slice(None), slice(None), I2),
    (Ellipsis, I2),
    (Ellipsis, M4),
    (slice(None), slice(None), M4),
    (0, 1, M4),
    (1, slice(None), M4),
    Idx([[0, 1], [2, 0]]),
    (Idx([[0], [1]]), slice(None), Idx([0, 1, 2])),
    (Idx([[0], [1]]), Idx([0, 1, 2])),
    (slice(None), I2, None, I2),
    (I2, None, I2),
    (None, I2, I2),
    (slice(None), None, I2),
    Idx(np.ones((3, 3), bool), "bool"),
    Idx(np.eye(3, dtype=bool), "bool"),
    (Idx([[True, False, True]] * 3, "bool"),),
    True,
    False,
    (True, 0),
    (slice(None), True),
    (Ellipsis, False),
    (I2, True),
    (None, False),
    Idx([], "int64"),
    (slice(None), Idx([], "int64")),
    Idx([0, 1, 2], "int32"),
    Idx([1, 0, 1], "uint8"),
    Idx(np.zeros(3, bool), "bool"),
]


def _kid(k: Any) -> str:
    return repr(to_ember(k))[:60]


@pytest.mark.parametrize("key", KEYS, ids=_kid)
def test_getitem_matches_torch(key: Any) -> None:
    a = data(3, 3, 4)
    if isinstance(key, Idx) and key.arr.dtype == np.uint8:
        with pytest.warns(UserWarning):
            want = torch.from_numpy(a)[to_torch(key)]
    else:
        want = torch.from_numpy(a)[to_torch(key)]
    check(ember.tensor(a)[to_ember(key)], want)
    check(NC(a)[to_ember(key)], want)  # non-contiguous input


@pytest.mark.parametrize("key", KEYS, ids=_kid)
def test_setitem_matches_torch(key: Any) -> None:
    a = data(3, 3, 4)
    if isinstance(key, Idx) and key.arr.dtype == np.uint8:
        pytest.skip("torch warns on byte masks; covered by getitem")
    t = torch.from_numpy(a.copy())
    shape = tuple(t[to_torch(key)].shape)
    val = np.asarray((np.arange(int(np.prod(shape))).reshape(shape) + 100), dtype=np.float32)
    t[to_torch(key)] = torch.from_numpy(val)
    e = ember.tensor(a)
    e[to_ember(key)] = ember.tensor(val)
    check(e, t)
    # a scalar value, and a broadcast value (the last dim of the indexed shape)
    t2, e2 = torch.from_numpy(a.copy()), ember.tensor(a)
    t2[to_torch(key)] = -7.0
    e2[to_ember(key)] = -7.0
    check(e2, t2)
    if shape and shape[-1] > 0:
        row = np.arange(shape[-1], dtype=np.float32) * 10
        t3, e3 = torch.from_numpy(a.copy()), NC(a)
        t3[to_torch(key)] = torch.from_numpy(row)
        e3[to_ember(key)] = ember.tensor(row)
        check(e3, t3)


def test_torch_int_placement_differs_from_numpy() -> None:
    # numpy counts the int as an advanced index (result dims first); PyTorch applies it first
    a = data(3, 4, 5)
    idx = np.array([0, 2])
    assert a[0, :, idx].shape == (2, 4)
    assert ember.tensor(a)[0, :, ember.tensor(idx)].shape == (4, 2)
    np.testing.assert_array_equal(ember.tensor(a)[0, :, ember.tensor(idx)].numpy(), a[0][:, idx])


def test_basic_indexing_returns_views() -> None:
    x = ember.zeros(3, 4)
    y = x[0]
    y[:] = 1
    tx = torch.zeros(3, 4)
    ty = tx[0]
    ty[:] = 1
    check(x, tx)
    x[1:, 1::2][0] = 5.0
    tx[1:, 1::2][0] = 5.0
    check(x, tx)
    z = x[..., 2]
    z[:] = -1
    tx[..., 2] = -1
    check(x, tx)
    # a full int key gives a 0-d view, as in PyTorch
    s = x[2, 3]
    assert s.shape == ()
    s[...] = 42.0
    assert x[2, 3].item() == 42.0
    s2 = x[None, 1]
    s2[0, 0] = 9.0
    assert x[1, 0].item() == 9.0


def test_advanced_indexing_copies() -> None:
    x = ember.zeros(3, 4)
    y = x[ember.tensor([0, 1])]
    y[:] = 1
    assert float(x.numpy().sum()) == 0.0


def test_zero_dim_and_empty() -> None:
    s = ember.tensor(5.0)
    check(s[None], torch.tensor(5.0)[None])
    check(s[...], torch.tensor(5.0)[...])
    check(s[True], torch.tensor(5.0)[True])
    check(s[False], torch.tensor(5.0)[False])
    s[...] = 3.0
    assert s.item() == 3.0
    s[()] = 4.0
    assert s.item() == 4.0
    e = ember.zeros(0, 3)
    check(e[:, 1], torch.zeros(0, 3)[:, 1])
    check(e[ember.tensor([], dtype=ember.int64)], torch.zeros(0, 3)[torch.tensor([], dtype=torch.int64)])
    e[:] = 1.0  # writing nothing is fine
    with pytest.raises(IndexOutOfRangeError, match="index 0 is out of bounds for dimension 0 with size 0"):
        e[0]


def test_index_tensor_forms() -> None:
    a = data(4, 3)
    t = torch.from_numpy(a)
    x = ember.tensor(a)
    check(x[[0, 2, -1]], t[[0, 2, -1]])
    check(x[[True, False, True, False]], t[[True, False, True, False]])
    check(x[np.array([1, 3])], t[np.array([1, 3])])
    check(x[[]], t[[]])
    check(x[ember.tensor(2)], t[torch.tensor(2)])  # 0-d int tensor acts as an int
    check(x[ember.tensor(True)], t[torch.tensor(True)])
    check(x[np.int64(1), np.int32(2)], t[1, 2])
    check(x[ember.tensor(1) : ember.tensor(3)], t[1:3])
    check(x[[[0, 1], [1, 0]], [[2], [0]]], t[[[0, 1], [1, 0]], [[2], [0]]])


def test_mask_combined_with_index() -> None:
    a = data(4, 3, 2)
    m = np.array([True, False, True, True])
    t = torch.from_numpy(a)
    x = ember.tensor(a)
    check(x[ember.tensor(m), 1], t[torch.from_numpy(m), 1])
    check(x[ember.tensor(m), :, ember.tensor([0, 1, 1])], t[torch.from_numpy(m), :, torch.tensor([0, 1, 1])])


def test_setitem_dtype_casts_and_value_forms() -> None:
    x = ember.zeros(3, dtype=ember.int32)
    x[0] = 2.9  # float -> int truncates, as PyTorch
    x[1] = True
    x[2] = np.int64(-4)
    assert x.tolist() == [2, 1, -4]
    x[:] = ember.tensor([1.7, -1.7, 0.2])
    assert x.tolist() == [1, -1, 0]
    x[[0, 2]] = [7, 8]  # a list value
    assert x.tolist() == [7, -1, 8]
    b = ember.zeros(3, dtype=ember.bool_)
    b[1] = 5
    assert b.tolist() == [False, True, False]
    f = ember.zeros(2, 3)
    f[0] = ember.tensor([[1.0, 2.0, 3.0]])  # leading size-1 dims of the value are dropped (PyTorch)
    assert f.tolist() == [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]
    f[ember.tensor([True, False])] = 9.0
    assert f.tolist()[0] == [9.0, 9.0, 9.0]
    # overlapping source and destination
    v = ember.arange(5)
    v[1:] = v[:-1]
    tv = torch.arange(5)
    tv[1:] = tv[:-1].clone()
    check(v, tv)


def test_setitem_int_placement_value_layout() -> None:
    # value in PyTorch's layout must land correctly although the backend key uses numpy's layout
    a = data(3, 4, 5)
    t = torch.from_numpy(a.copy())
    x = ember.tensor(a)
    val = np.arange(8, dtype=np.float32).reshape(4, 2) + 50
    t[0, :, torch.tensor([1, 3])] = torch.from_numpy(val)
    x[0, :, ember.tensor([1, 3])] = ember.tensor(val)
    check(x, t)


# -- getitem / setitem errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "exc", "msg"),
    [
        (5, IndexOutOfRangeError, "index 5 is out of bounds for dimension 0 with size 3"),
        (-4, IndexOutOfRangeError, "index -4 is out of bounds for dimension 0 with size 3"),
        ((0, 4), IndexOutOfRangeError, "index 4 is out of bounds for dimension 1 with size 4"),
        ((0, 0, 0), IndexOutOfRangeError, "too many indices for tensor of dimension 2"),
        ((Ellipsis, 0, Ellipsis), IndexOutOfRangeError, "single ellipsis"),
        (slice(None, None, -1), ValueRangeError, "step must be greater than zero"),
        (slice(None, None, 0), ValueRangeError, "slice step cannot be zero"),
        (slice(0.5, 2), IndexOutOfRangeError, "slice indices must be integers"),
        (1.0, IndexOutOfRangeError, "valid indices (got float)"),
        ("a", IndexOutOfRangeError, "valid indices (got str)"),
        (Idx([0, 3]), IndexOutOfRangeError, "index 3 is out of bounds for dimension 0 with size 3"),
        (Idx([-4, 0]), IndexOutOfRangeError, "index -4 is out of bounds for dimension 0 with size 3"),
        (
            (slice(None), Idx([9])),
            IndexOutOfRangeError,
            "index 9 is out of bounds for dimension 1 with size 4",
        ),
        (
            Idx([0.0, 1.0], "float32"),
            IndexOutOfRangeError,
            "must be long, int, byte or bool tensors, got float32",
        ),
        (Idx([0, 1], "int16"), IndexOutOfRangeError, "must be long, int, byte or bool tensors, got int16"),
        (
            Idx([True, False], "bool"),
            IndexOutOfRangeError,
            "the shape of the mask [2] at index 0 does not match the shape of the indexed tensor [3, 4] at "
            "index 0",
        ),
        ((0, Idx([True], "bool")), IndexOutOfRangeError, "at index 1"),
        (
            (Idx([0, 1]), Idx([0, 1, 2])),
            IndexOutOfRangeError,
            "indexing tensors could not be broadcast together with shapes [2], [3]",
        ),
    ],
)
def test_index_errors(key: Any, exc: type, msg: str) -> None:
    x = ember.zeros(3, 4)
    with pytest.raises(exc, match=_re(msg)):
        x[to_ember(key)]
    with pytest.raises(exc, match=_re(msg)):
        x[to_ember(key)] = 1.0
    assert float(x.numpy().sum()) == 0.0  # nothing was written


def _re(s: str) -> str:
    import re

    return re.escape(s)


def test_index_error_classes_match_torch_builtins() -> None:
    # code written against PyTorch's exceptions keeps working
    x = ember.zeros(3)
    with pytest.raises(IndexError):
        x[3]
    with pytest.raises(ValueError):
        x[::-1]


def test_setitem_errors() -> None:
    x = ember.zeros(3, 4)
    with pytest.raises(
        ShapeError,
        match=_re("value tensor of shape [3] cannot be broadcast to indexing result of shape [3, 4]"),
    ):
        x[:] = ember.zeros(3)
    with pytest.raises(ShapeError, match=_re("value tensor of shape [2, 3, 4]")):
        x[:] = ember.zeros(2, 3, 4)
    with pytest.raises(DTypeError, match="cannot convert object"):
        x[0] = object()  # noqa: B018 - not convertible
    i = ember.zeros(2, dtype=ember.int8)
    with pytest.raises(ValueRangeError, match="cannot be converted to type int8 without overflow"):
        i[0] = 300
    with pytest.raises(ValueRangeError, match="value nan cannot be converted to type int8 without overflow"):
        i[0] = float("nan")
    e = ember.zeros(3).expand(2, 3)
    with pytest.raises(UnsupportedError, match="refers to a single memory location"):
        e[0, 0] = 1.0
    assert ember.zeros(3).expand(2, 3).numpy().sum() == 0


def test_device_mismatch() -> None:
    x = ember.zeros(3)
    with pytest.raises(DeviceError, match="expected the value on the tensor's device"):
        x[:] = elsewhere(ember.ones(3))
    with pytest.raises(DeviceError, match="gather: expected all tensors on the same device"):
        ember.gather(x, 0, elsewhere(ember.tensor([0])))
    with pytest.raises(DeviceError, match="masked_fill: expected all tensors on the same device"):
        x.masked_fill(elsewhere(ember.tensor([True, False, True])), 0.0)
    with pytest.raises(DeviceError, match="scatter: expected all tensors on the same device"):
        x.scatter(0, ember.tensor([0]), elsewhere(ember.ones(1)))


# ----------------------------------------------------------------------------------------------------
# gather / scatter
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim: int) -> None:
    a = data(3, 4)
    idx = RNG.integers(0, a.shape[dim], size=(2, 3)).astype(np.int64)
    check(
        ember.gather(ember.tensor(a), dim, ember.tensor(idx)),
        torch.gather(torch.from_numpy(a), dim, torch.from_numpy(idx)),
    )
    check(NC(a).gather(dim, ember.tensor(idx)), torch.from_numpy(a).gather(dim, torch.from_numpy(idx)))


def test_gather_edge_cases() -> None:
    check(
        ember.gather(ember.tensor(5.0), 0, ember.tensor(0)),
        torch.gather(torch.tensor(5.0), 0, torch.tensor(0)),
    )
    e = ember.gather(ember.zeros(3, 4), 1, ember.zeros(3, 0, dtype=ember.int64))
    assert e.shape == (3, 0)


def test_gather_errors() -> None:
    x = ember.zeros(3, 4)
    with pytest.raises(DTypeError, match="expected dtype int32/int64 for index, got int16"):
        ember.gather(x, 0, ember.zeros(2, 2, dtype=ember.int16))  # torch 2.13 takes int32 indices too
    with pytest.raises(ShapeError, match="same number of dimensions"):
        ember.gather(x, 0, ember.zeros(2, dtype=ember.int64))
    with pytest.raises(
        ShapeError, match=_re("expected index [2, 5] to be no larger than self [3, 4] apart from dimension 0")
    ):
        ember.gather(x, 0, ember.zeros(2, 5, dtype=ember.int64))
    with pytest.raises(IndexOutOfRangeError, match="index 3 is out of bounds for dimension 0 with size 3"):
        ember.gather(x, 0, ember.tensor([[3]]))
    with pytest.raises(IndexOutOfRangeError, match="index -1 is out of bounds"):
        ember.gather(x, 1, ember.tensor([[-1]]))
    with pytest.raises(ember.DimError, match="dimension out of range"):
        ember.gather(x, 2, ember.tensor([[0]]))


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
def test_scatter(reduce: str | None) -> None:
    a = data(3, 5)
    src = data(2, 5) + 10
    idx = np.array([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2]])
    kw = {} if reduce is None else {"reduce": reduce}
    want = torch.from_numpy(a).scatter(0, torch.from_numpy(idx), torch.from_numpy(src), **kw)
    check(ember.scatter(ember.tensor(a), 0, ember.tensor(idx), ember.tensor(src), **kw), want)
    want_v = torch.from_numpy(a).scatter(1, torch.from_numpy(idx[:, :3]), 2.5, **kw)
    check(ember.tensor(a).scatter(1, ember.tensor(idx[:, :3]), value=2.5, **kw), want_v)
    x = ember.tensor(a)
    r = x.scatter_(0, ember.tensor(idx), ember.tensor(src), **kw)
    assert r is x
    check(x, want)


def test_scatter_add_matches_torch_with_duplicates() -> None:
    a = np.zeros((3, 2), np.float32)
    idx = np.array([[0, 0], [0, 1], [2, 2]])
    src = np.ones((3, 2), np.float32)
    want = torch.from_numpy(a).scatter_add(0, torch.from_numpy(idx), torch.from_numpy(src))
    check(ember.scatter_add(ember.tensor(a), 0, ember.tensor(idx), ember.tensor(src)), want)
    x = ember.tensor(a)
    x.scatter_add_(0, ember.tensor(idx), ember.tensor(src))
    check(x, want)
    # smaller index than src (only index's extent is used)
    want2 = torch.from_numpy(a).scatter_add(1, torch.tensor([[1]]), torch.from_numpy(src))
    check(ember.scatter_add(ember.tensor(a), 1, ember.tensor([[1]]), ember.tensor(src)), want2)


def test_scatter_errors() -> None:
    x = ember.zeros(3, 4)
    i = ember.tensor([[0, 1]])
    with pytest.raises(ValueRangeError, match="reduce argument must be either 'add' or 'multiply'"):
        ember.scatter(x, 0, i, ember.ones(1, 2), reduce="max")
    with pytest.raises(DTypeError, match="expected self.dtype to be equal to src.dtype"):
        ember.scatter(x, 0, i, ember.ones(1, 2, dtype=ember.int32))
    with pytest.raises(ShapeError, match="no larger size than src"):
        ember.scatter(x, 0, ember.tensor([[0, 1, 2]]), ember.ones(1, 2))
    with pytest.raises(IndexOutOfRangeError, match="index 3 is out of bounds for dimension 0 with size 3"):
        ember.scatter(x, 0, ember.tensor([[3]]), value=1.0)
    with pytest.raises(ValueRangeError, match="missing src"):
        ember.scatter(x, 0, i)
    with pytest.raises(DTypeError, match="expected dtype int32/int64 for index, got int16"):
        ember.scatter(x, 0, i.to(ember.int16), value=1.0)
    with pytest.raises(ShapeError, match="same number of dimensions"):
        ember.scatter(x, 0, ember.tensor([0]), value=1.0)


# ----------------------------------------------------------------------------------------------------
# index_select / index_add / index_put
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim: int) -> None:
    a = data(3, 4, 2)
    idx = np.array([1, 0, 1], np.int64)
    check(
        ember.index_select(ember.tensor(a), dim, ember.tensor(idx)),
        torch.index_select(torch.from_numpy(a), dim, torch.from_numpy(idx)),
    )
    check(
        NC(a).index_select(dim, ember.tensor(idx.astype(np.int32))),
        torch.from_numpy(a).index_select(dim, torch.from_numpy(idx.astype(np.int32))),
    )
    check(
        ember.index_select(ember.tensor(5.0), 0, ember.tensor([0])),
        torch.index_select(torch.tensor(5.0), 0, torch.tensor([0])),
    )


def test_index_select_errors() -> None:
    x = ember.zeros(3, 4)
    with pytest.raises(ShapeError, match="index is supposed to be a vector"):
        ember.index_select(x, 0, ember.zeros(2, 2, dtype=ember.int64))
    with pytest.raises(DTypeError, match="expected an int64 or int32 index, got float32"):
        ember.index_select(x, 0, ember.zeros(2))
    with pytest.raises(IndexOutOfRangeError, match="index 4 is out of bounds for dimension 1 with size 4"):
        ember.index_select(x, 1, ember.tensor([4]))


def test_index_add() -> None:
    a = data(4, 3)
    src = data(3, 3) + 1
    idx = np.array([0, 2, 0])
    want = torch.from_numpy(a).index_add(0, torch.from_numpy(idx), torch.from_numpy(src), alpha=2)
    check(ember.index_add(ember.tensor(a), 0, ember.tensor(idx), ember.tensor(src), alpha=2), want)
    x = ember.tensor(a)
    x.index_add_(0, ember.tensor(idx), ember.tensor(src), alpha=2)
    check(x, want)
    with pytest.raises(ShapeError, match="must equal the number of indices"):
        ember.index_add(ember.tensor(a), 0, ember.tensor([0]), ember.tensor(src))


def test_index_put() -> None:
    a = data(4, 3)
    i0, i1 = np.array([0, 1, 0]), np.array([2, 2, 2])
    v = np.array([1.0, 2.0, 3.0], np.float32)
    for acc in (False, True):
        t = torch.from_numpy(a.copy()).index_put_(
            (torch.from_numpy(i0), torch.from_numpy(i1)), torch.from_numpy(v), accumulate=acc
        )
        x = ember.tensor(a)
        if acc:
            x.index_put_((ember.tensor(i0), ember.tensor(i1)), ember.tensor(v), accumulate=True)
            check(x, t)
        else:
            # duplicates without accumulate are unspecified: compare the unique positions only
            x.index_put_((ember.tensor(i0[1:]), ember.tensor(i1[1:])), ember.tensor(v[1:]))
            t2 = torch.from_numpy(a.copy()).index_put_(
                (torch.from_numpy(i0[1:]), torch.from_numpy(i1[1:])), torch.from_numpy(v[1:])
            )
            check(x, t2)
    # accumulate over a leading index with trailing full dims, and with a bool mask
    t = torch.from_numpy(a.copy()).index_put_((torch.tensor([1, 1]),), torch.tensor(1.0), accumulate=True)
    check(ember.index_put(ember.tensor(a), (ember.tensor([1, 1]),), ember.tensor(1.0), accumulate=True), t)
    m = np.array([True, False, True, False])
    t = torch.from_numpy(a.copy()).index_put_((torch.from_numpy(m),), torch.tensor(2.0), accumulate=True)
    check(ember.index_put(ember.tensor(a), (ember.tensor(m),), ember.tensor(2.0), accumulate=True), t)


# ----------------------------------------------------------------------------------------------------
# masks, nonzero, take
# ----------------------------------------------------------------------------------------------------
def test_masked_fill() -> None:
    a = data(3, 4)
    m = RNG.random((3, 4)) > 0.5
    check(
        ember.masked_fill(ember.tensor(a), ember.tensor(m), -1.0),
        torch.from_numpy(a).masked_fill(torch.from_numpy(m), -1.0),
    )
    mrow = np.array([True, False, False, True])
    check(
        ember.tensor(a).masked_fill(ember.tensor(mrow), ember.tensor(9.0)),
        torch.from_numpy(a).masked_fill(torch.from_numpy(mrow), torch.tensor(9.0)),
    )
    # out-of-place broadcasts input too
    mcol = np.array([[True], [False]])
    check(
        ember.tensor(a[0]).masked_fill(ember.tensor(mcol), 0.0),
        torch.from_numpy(a[0]).masked_fill(torch.from_numpy(mcol), 0.0),
    )
    ints = np.arange(4)
    check(
        ember.tensor(ints).masked_fill(ember.tensor(mrow), 1.7),
        torch.from_numpy(ints).masked_fill(torch.from_numpy(mrow), 1.7),
    )
    x = NC(a)
    r = x.masked_fill_(ember.tensor(mrow), 5.0)
    assert r is x
    check(x, torch.from_numpy(a).masked_fill(torch.from_numpy(mrow), 5.0))


def test_masked_fill_errors() -> None:
    x = ember.zeros(3, 4)
    with pytest.raises(DTypeError, match="only supports boolean masks, but got mask with dtype int64"):
        x.masked_fill(ember.tensor([1, 0, 1, 0]), 1.0)
    with pytest.raises(ShapeError, match="only supports a 0-dimensional value tensor"):
        x.masked_fill(ember.tensor([True] * 4), ember.ones(1))
    with pytest.raises(ShapeError, match="not broadcastable"):
        x.masked_fill(ember.tensor([True] * 3), 1.0)
    with pytest.raises(
        ShapeError, match=_re("mask of shape [2, 1, 4] cannot be broadcast to the tensor's shape")
    ):
        x.masked_fill_(ember.zeros(2, 1, 4, dtype=ember.bool_), 1.0)


def test_masked_select() -> None:
    a = data(3, 4)
    m = RNG.random((3, 4)) > 0.5
    check(
        ember.masked_select(ember.tensor(a), ember.tensor(m)),
        torch.masked_select(torch.from_numpy(a), torch.from_numpy(m)),
    )
    check(
        ember.masked_select(ember.tensor(a), ember.tensor(m[0])),
        torch.masked_select(torch.from_numpy(a), torch.from_numpy(m[0])),
    )
    check(
        ember.masked_select(ember.tensor(2.0), ember.tensor(True)),
        torch.masked_select(torch.tensor(2.0), torch.tensor(True)),
    )


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2), (0, 3), ()])
def test_nonzero(shape: tuple[int, ...]) -> None:
    a = (RNG.random(shape) > 0.5).astype(np.float32) * 3 if shape else np.array(2.0, np.float32)
    t = torch.from_numpy(a)
    check(ember.nonzero(ember.tensor(a)), torch.nonzero(t))
    check(ember.argwhere(ember.tensor(a)), torch.argwhere(t))
    got = ember.nonzero(ember.tensor(a), as_tuple=True)
    want = torch.nonzero(t, as_tuple=True)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        check(g, w)
    assert ember.nonzero(ember.tensor(a)).dtype is ember.int64


def test_nonzero_bool_and_where_one_arg() -> None:
    m = np.array([[True, False], [False, True]])
    check(ember.nonzero(ember.tensor(m)), torch.nonzero(torch.from_numpy(m)))
    got = ember.where(ember.tensor(m))
    want = torch.where(torch.from_numpy(m))
    for g, w in zip(got, want):
        check(g, w)


def test_take() -> None:
    a = data(3, 4)
    idx = np.array([[0, -1], [5, 11]])
    check(
        ember.take(ember.tensor(a), ember.tensor(idx)), torch.take(torch.from_numpy(a), torch.from_numpy(idx))
    )
    check(NC(a).take(ember.tensor(idx)), torch.take(torch.from_numpy(a), torch.from_numpy(idx)))
    assert ember.take(ember.tensor(a), ember.zeros(0, dtype=ember.int64)).shape == (0,)
    with pytest.raises(IndexOutOfRangeError, match="index 12 is out of bounds for dimension 0 with size 12"):
        ember.take(ember.tensor(a), ember.tensor([12]))


def test_take_along_dim() -> None:
    a = data(3, 4)
    idx = np.argsort(a, axis=1)
    for dim in (0, 1, None):
        i = idx if dim != 0 else np.argsort(a, axis=0)
        check(
            ember.take_along_dim(ember.tensor(a), ember.tensor(i), dim),
            torch.take_along_dim(torch.from_numpy(a), torch.from_numpy(i), dim),
        )
    # indices broadcast against input outside dim
    i1 = np.array([[0], [2], [1]])
    check(
        ember.take_along_dim(ember.tensor(a), ember.tensor(i1), 1),
        torch.take_along_dim(torch.from_numpy(a), torch.from_numpy(i1), 1),
    )
    with pytest.raises(ShapeError, match="same number of dimensions"):
        ember.take_along_dim(ember.tensor(a), ember.tensor([0]), 1)


def test_errors_name_the_op_for_non_tensor_args() -> None:
    with pytest.raises(DTypeError, match="gather: index must be a Tensor"):
        ember.gather(ember.zeros(2), 0, [0])
    with pytest.raises(DTypeError, match="masked_fill: mask must be a Tensor"):
        ember.masked_fill(ember.zeros(2), [True, False], 0.0)


def _random_key(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A random mix of ints, slices, None, one Ellipsis and index arrays that PyTorch accepts."""
    key: list[Any] = []
    d = 0
    used_ellipsis = False
    # after an ellipsis the key must run to the last dim, so that its items line up with the trailing dims
    while d < len(shape) and (used_ellipsis or rng.random() < 0.85):
        r = rng.random()
        n = shape[d]
        if r < 0.2:
            key.append(int(rng.integers(-n, n)))
            d += 1
        elif r < 0.45:
            lo, hi = sorted(int(v) for v in rng.integers(-n - 1, n + 2, size=2))
            key.append(slice(lo, hi, int(rng.integers(1, 3))))
            d += 1
        elif r < 0.55:
            key.append(None)
        elif r < 0.6 and not used_ellipsis:
            key.append(Ellipsis)
            used_ellipsis = True
            d = int(rng.integers(d, len(shape) + 1))  # the dims the ellipsis stands for
        else:
            # distinct positions (some negative), so the setitem comparison is well defined
            vals = rng.choice(n, size=2, replace=False) - n * rng.integers(0, 2, size=2)
            key.append(Idx(vals))
            d += 1
    return tuple(key)


@pytest.mark.parametrize("seed", range(60))
def test_random_keys_match_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = data(3, 4, 5, 2)
    key = _random_key(rng, a.shape)
    want = torch.from_numpy(a)[to_torch(key)]
    check(ember.tensor(a)[to_ember(key)], want)
    t = torch.from_numpy(a.copy())
    val = np.asarray(rng.standard_normal(tuple(want.shape)), np.float32)
    t[to_torch(key)] = torch.from_numpy(val)
    e = NC(a)
    e[to_ember(key)] = ember.tensor(val)
    check(e, t)
