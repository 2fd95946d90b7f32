"""Tests of ember_opencl.reduction: reduce, argreduce, cumulative, softmax and logsumexp against numpy/torch.

The kit (``--ember-device=opencl -k "reduc or argm or cum or softmax ..."``) covers the public API; these call the
backend's methods on device handles directly, so they also check what the public API hides (results in the input
dtype: integer sums and products wrap, bool sum/prod are any/all) and reach the kernel paths: rows split into
chunks with a second pass (full reductions of 1e6 and 1e7 elements, few long columns), one-item-per-row kernels,
sizes crossing work-group boundaries, strided, reversed and broadcast views, several and scattered reduced dims.
"""

from __future__ import annotations

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")
torch = pytest.importorskip("torch")

import ember  # noqa: E402
from ember import dtypes as dt  # noqa: E402
from ember.backend import Backend  # noqa: E402
from ember.errors import DimError, DTypeError, ShapeError  # noqa: E402
from ember_opencl import array as arr  # noqa: E402
from ember_opencl.runtime import device_count  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

BF16 = dt.bfloat16.numpy
ALL = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, BF16, np.float32, np.float64]


@pytest.fixture(scope="module")
def be():
    return ember.Device.opencl(0).stack


def need(be, dtype) -> None:
    if dt.from_numpy_dtype(np.dtype(dtype)) not in be.supported_dtypes:
        pytest.skip(f"device has no {np.dtype(dtype).name}")


def up(be, a: np.ndarray, layout: str = "contiguous") -> arr.CLArray:
    """A device handle with a's values: contiguous, or a transposed / stepped-and-reversed / broadcast view."""
    if layout == "contiguous":
        return be.from_numpy(np.ascontiguousarray(a))
    if layout == "transposed":  # stored with the dims reversed, viewed back in a's order
        h = be.from_numpy(np.ascontiguousarray(a.transpose()))
        return arr.permute(h, tuple(reversed(range(a.ndim))))
    if layout == "strided":  # every other element of a reversed last dim
        big = np.repeat(a, 2, axis=-1)[..., ::-1].copy()
        h = be.from_numpy(big)
        key = (slice(None),) * (a.ndim - 1) + (slice(None, None, -2),)
        return arr.basic_index(h, key)
    if layout == "broadcast":  # a's first dim expanded from size 1 (stride 0): a must repeat along dim 0
        h = be.from_numpy(np.ascontiguousarray(a[:1]))
        return arr.expand(h, a.shape)
    raise AssertionError(layout)


def host(be, h: arr.CLArray) -> np.ndarray:
    return be.to_numpy(h)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    d = np.dtype(dtype)
    if d == np.bool_:
        return rng.random(shape) < 0.5
    if d.kind in "iu":
        info = np.iinfo(d)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(d)
    return rng.standard_normal(shape).astype(np.float32).astype(d)


def ref_reduce(op: str, a: np.ndarray, dims: tuple[int, ...], keepdim: bool) -> np.ndarray:
    """numpy in the input dtype (ints wrap); bool sum/prod are any/all; half types summed in float64."""
    if a.dtype == np.bool_:
        f = {"sum": np.logical_or, "prod": np.logical_and, "max": np.maximum, "min": np.minimum}[op]
        return f.reduce(a, axis=dims, keepdims=keepdim)
    f = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    if a.dtype.kind == "f" or a.dtype == BF16:
        with np.errstate(invalid="ignore"):  # inf - inf is the NaN expected
            wide = f.reduce(a.astype(np.float64), axis=dims, keepdims=keepdim)
        return wide.astype(a.dtype)
    return f.reduce(a, axis=dims, dtype=a.dtype, keepdims=keepdim)


def tol(dtype) -> dict:
    d = np.dtype(dtype)
    if d == BF16:
        return dict(rtol=1e-2, atol=1e-2)
    return {np.float16: dict(rtol=2e-3, atol=2e-3), np.float32: dict(rtol=2e-6, atol=1e-5),
            np.float64: dict(rtol=1e-12, atol=1e-12)}.get(d.type, dict(rtol=0, atol=0))


def check(got: np.ndarray, exp: np.ndarray, dtype, what: str) -> None:
    assert got.shape == exp.shape, what
    assert got.dtype == exp.dtype, what
    if np.dtype(dtype).kind in "biu":
        np.testing.assert_array_equal(got, exp, err_msg=what)
    else:
        np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), equal_nan=True, err_msg=what,
                                   **tol(dtype))


# -- reduce -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [10**6, 10**7])
def test_full_reduction_big_float32(be, n: int) -> None:
    rng = np.random.default_rng(n)
    a = (rng.random(n, dtype=np.float32) + 0.5).astype(np.float32)
    a[n // 3], a[2 * n // 3] = 7.0, -3.0
    h = up(be, a)
    ref = a.astype(np.float64).sum()
    got = host(be, be.reduce("sum", h, (0,), False))
    assert got.shape == () and got.dtype == np.float32
    # compensated per item, then a tree: far better than sequential float32 (which drifts by ~1e-4 here)
    assert abs(float(got) - ref) <= 1e-6 * ref
    assert float(host(be, be.reduce("max", h, (0,), False))) == 7.0
    assert float(host(be, be.reduce("min", h, (0,), True))[0]) == -3.0
    assert int(host(be, be.argreduce("argmax", h, None, False))) == n // 3
    assert int(host(be, be.argreduce("argmin", h, 0, False))) == 2 * n // 3


def test_full_reduction_big_other_dtypes(be) -> None:
    rng = np.random.default_rng(1)
    n = 10**6 + 3
    i32 = rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32)
    check(host(be, be.reduce("sum", up(be, i32), (0,), False)), np.add.reduce(i32, dtype=np.int32), np.int32,
          "int32 sum wraps")
    i64 = rng.integers(-(10**12), 10**12, n)
    assert int(host(be, be.reduce("sum", up(be, i64), (0,), False))) == int(i64.sum())
    f16 = (rng.random(n) / 20).astype(np.float16)  # the sum (~25000) fits in float16
    got = float(host(be, be.reduce("sum", up(be, f16), (0,), False)))
    ref = f16.astype(np.float64).sum()
    assert abs(got - ref) <= 1e-3 * ref  # accumulated in float, rounded to half once
    need(be, np.float64)
    f64 = rng.standard_normal(n)
    assert abs(float(host(be, be.reduce("sum", up(be, f64), (0,), False))) - np.sum(f64)) < 1e-9


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_reduce_every_dtype(be, op: str, dtype) -> None:
    need(be, dtype)
    rng = np.random.default_rng(7)
    for shape, dims in [((5, 300), (1,)), ((300, 5), (0,)), ((3, 4, 70), (0, 2)), ((1000,), (0,)),
                        ((2, 3, 5), (0, 1, 2))]:
        a = rand(rng, shape, dtype)
        if op == "prod" and np.dtype(dtype).kind == "f" or dtype == BF16 and op == "prod":
            a = (1 + rand(rng, shape, np.float32) / 200).astype(dtype)  # keep the product finite
        for keepdim in (False, True):
            got = host(be, be.reduce(op, up(be, a), dims, keepdim))
            check(got, ref_reduce(op, a, dims, keepdim), dtype, f"{op} {shape} {dims} {keepdim}")


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "broadcast"])
@pytest.mark.parametrize("shape,dims", [
    ((1, 1), (0, 1)), ((17,), (0,)), ((257, 63), (1,)), ((63, 257), (0,)), ((3, 4099), (1,)), ((4099, 3), (0,)),
    ((6, 5, 129), (0, 2)), ((6, 5, 129), (1,)), ((2, 3, 4, 5, 6), (0, 2, 4)), ((2, 3, 4, 5, 6), (1, 3)),
    ((2, 3, 2, 3, 2, 3, 2, 3), (0, 2, 4, 6)), ((2, 3, 2, 3, 2, 3, 2, 3, 2, 2), (1, 3)),
])
def test_reduce_layouts(be, layout: str, shape: tuple[int, ...], dims: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(shape) * 100 + sum(shape))
    a = rand(rng, shape, np.float32)
    if layout == "broadcast":
        a = np.broadcast_to(a[:1], shape).copy()
    for op in ("sum", "max", "min"):
        for keepdim in (False, True):
            got = host(be, be.reduce(op, up(be, a, layout), dims, keepdim))
            check(got, ref_reduce(op, a, dims, keepdim), np.float32, f"{op} {layout} {shape} {dims}")
    i = rand(rng, shape, np.int16)
    if layout == "broadcast":
        i = np.broadcast_to(i[:1], shape).copy()
    check(host(be, be.reduce("sum", up(be, i, layout), dims, False)), ref_reduce("sum", i, dims, False), np.int16,
          f"int16 sum {layout} {shape} {dims}")


@pytest.mark.parametrize("shape,dim", [((1, 10**6), 1), ((10**6, 1), 0), ((100003, 3), 0), ((3, 100003), 1),
                                       ((2, 70001), 1), ((70001, 2), 1), ((1024, 1024), 0)])
def test_reduce_two_pass_shapes(be, shape: tuple[int, ...], dim: int) -> None:
    """Few long rows (or columns) are split into chunks and reduced in two passes."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape).astype(np.float32)
    exp = a.astype(np.float64).sum(dim)
    got = host(be, be.reduce("sum", up(be, a), (dim,), False))
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-3 * np.sqrt(shape[dim]) * 1e-3)
    np.testing.assert_array_equal(host(be, be.reduce("max", up(be, a), (dim,), False)), a.max(dim))
    np.testing.assert_array_equal(host(be, be.argreduce("argmin", up(be, a), dim, True)),
                                  a.argmin(dim, keepdims=True))


def test_reduce_nan_and_inf(be) -> None:
    a = np.array([[1.0, np.nan, 3.0, -np.inf], [np.inf, 2.0, -1.0, 0.0], [np.inf, -np.inf, 1.0, 1.0]],
                 np.float32)
    for op in ("sum", "prod", "max", "min"):
        for dim in (0, 1):
            got = host(be, be.reduce(op, up(be, a), (dim,), False))
            check(got, ref_reduce(op, a, (dim,), False), np.float32, f"{op} {dim}")
    big = np.ones(300001, np.float32)
    big[200000] = np.nan
    assert np.isnan(host(be, be.reduce("max", up(be, big), (0,), False)))
    assert np.isnan(host(be, be.reduce("min", up(be, big), (0,), False)))
    big[200000] = np.inf
    assert host(be, be.reduce("sum", up(be, big), (0,), False)) == np.inf  # compensation must not make NaN
    big[5] = -np.inf
    assert np.isnan(host(be, be.reduce("sum", up(be, big), (0,), False)))


def test_reduce_wraps_in_dtype(be) -> None:
    a = np.full((3, 1000), 100, np.int8)
    check(host(be, be.reduce("sum", up(be, a), (1,), False)), np.add.reduce(a, axis=1, dtype=np.int8), np.int8,
          "int8 sum")
    p = np.full((2, 40), 3, np.int32)
    check(host(be, be.reduce("prod", up(be, p), (1,), False)), np.multiply.reduce(p, axis=1, dtype=np.int32),
          np.int32, "int32 prod")
    u = np.full(300, 255, np.uint8)
    assert int(host(be, be.reduce("sum", up(be, u), (0,), False))) == int(np.add.reduce(u, dtype=np.uint8))
    b = np.zeros((4, 600), np.bool_)
    b[1, 599] = True
    b[2] = True
    np.testing.assert_array_equal(host(be, be.reduce("sum", up(be, b), (1,), False)), [False, True, True, False])
    np.testing.assert_array_equal(host(be, be.reduce("prod", up(be, b), (1,), False)), [False, False, True, False])


def test_reduce_zero_size(be) -> None:
    a = np.zeros((3, 0, 4), np.float32)
    for op, value in (("sum", 0.0), ("prod", 1.0)):
        got = host(be, be.reduce(op, up(be, a), (1,), False))
        assert got.shape == (3, 4) and (got == value).all()
        got = host(be, be.reduce(op, up(be, a), (1, 2), True))
        assert got.shape == (3, 1, 1) and (got == value).all()
    assert host(be, be.reduce("sum", up(be, a), (0,), False)).shape == (0, 4)
    assert host(be, be.reduce("max", up(be, a), (2,), True)).shape == (3, 0, 1)
    i = np.zeros((0,), np.int32)
    assert int(host(be, be.reduce("sum", up(be, i), (0,), False))) == 0
    assert int(host(be, be.reduce("prod", up(be, i), (0,), False))) == 1
    assert host(be, be.argreduce("argmax", up(be, a), 2, False)).shape == (3, 0)


# -- argreduce ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in ALL if d is not np.bool_], ids=lambda d: np.dtype(d).name)
def test_argreduce_every_dtype(be, dtype) -> None:
    need(be, dtype)
    rng = np.random.default_rng(11)
    a = rand(rng, (37, 301), dtype)
    for op, f in (("argmax", np.argmax), ("argmin", np.argmin)):
        for dim in (0, 1, None):
            for keepdim in (False, True):
                got = host(be, be.argreduce(op, up(be, a), dim, keepdim))
                exp = f(a, axis=dim, keepdims=keepdim)
                assert got.dtype == np.int64
                np.testing.assert_array_equal(got, exp, err_msg=f"{op} {dim} {keepdim}")


def test_argreduce_first_occurrence_and_nan(be) -> None:
    n = 10**6
    a = np.zeros(n, np.float32)
    assert int(host(be, be.argreduce("argmax", up(be, a), 0, False))) == 0  # all equal: the first
    a[[700000, 300000, 999999]] = 5.0
    assert int(host(be, be.argreduce("argmax", up(be, a), None, False))) == 300000
    a[[900000, 600000]] = np.nan
    for op in ("argmax", "argmin"):
        assert int(host(be, be.argreduce(op, up(be, a), None, False))) == 600000
    t = np.array([[1.0, np.nan, np.nan, 3.0], [-np.inf, -np.inf, 0.0, np.inf], [2.0, 2.0, 2.0, 2.0]], np.float32)
    tt = torch.from_numpy(t)
    for op in ("argmax", "argmin"):
        for dim in (0, 1):
            exp = getattr(torch, op)(tt, dim).numpy()
            np.testing.assert_array_equal(host(be, be.argreduce(op, up(be, t), dim, False)), exp, err_msg=op)


@pytest.mark.parametrize("layout", ["transposed", "strided", "broadcast"])
def test_argreduce_views(be, layout: str) -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(-5, 5, (9, 4, 131)).astype(np.int32)  # many ties
    if layout == "broadcast":
        a = np.broadcast_to(a[:1], a.shape).copy()
    h = up(be, a, layout)
    for op, f in (("argmax", np.argmax), ("argmin", np.argmin)):
        assert int(host(be, be.argreduce(op, h, None, False))) == int(f(a))  # flat C-order index of the view
        for dim in (0, 1, 2):
            np.testing.assert_array_equal(host(be, be.argreduce(op, h, dim, False)), f(a, axis=dim))


# -- cumulative ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
def test_cumulative_every_dtype(be, dtype) -> None:
    need(be, dtype)
    rng = np.random.default_rng(13)
    for shape, dim in [((4, 300), 1), ((300, 4), 0), ((3, 5, 7), 1), ((2, 9000), 1)]:
        a = rand(rng, shape, dtype)
        for op in ("sum", "prod"):
            if op == "prod" and np.dtype(dtype).kind not in "biu":
                a = (1 + rand(rng, shape, np.float32) / 500).astype(dtype)
            got = host(be, be.cumulative(op, up(be, a), dim))
            if np.dtype(dtype) == np.bool_:
                exp = (np.logical_or if op == "sum" else np.logical_and).accumulate(a, axis=dim)
            elif np.dtype(dtype).kind in "iu":
                exp = (np.add if op == "sum" else np.multiply).accumulate(a, axis=dim, dtype=a.dtype)
            else:
                exp = (np.add if op == "sum" else np.multiply).accumulate(a.astype(np.float64), axis=dim)
                exp = exp.astype(a.dtype)
            what = f"cum{op} {shape} {dim}"
            if np.dtype(dtype).kind in "biu":
                check(got, exp, dtype, what)
            else:  # a long running sum: compare against the float64 scan at the scale of the partial sums
                scale = np.abs(a.astype(np.float64)).cumsum(axis=dim) if op == "sum" else 1.0
                err = np.abs(got.astype(np.float64) - exp.astype(np.float64))
                assert got.dtype == a.dtype and (err <= 4 * tol(dtype)["rtol"] * (scale + 1)).all(), what


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "broadcast"])
@pytest.mark.parametrize("shape,dim", [((1, 10**6), 1), ((10**6,), 0), ((3, 100003), 1), ((100003, 3), 0),
                                       ((513, 257), 0), ((257, 513), 1), ((2, 3, 4, 5, 6, 7), 3)])
def test_cumulative_paths(be, layout: str, shape: tuple[int, ...], dim: int) -> None:
    """Short rows (one item per row), long rows (a group per row, chunks with carries), columns, views."""
    rng = np.random.default_rng(sum(shape))
    a = rng.integers(-3, 4, shape).astype(np.int32)  # exact: any summation order must give numpy's result
    if layout == "broadcast":
        a = np.broadcast_to(a[:1], shape).copy()
    np.testing.assert_array_equal(host(be, be.cumulative("sum", up(be, a, layout), dim)), np.cumsum(a, axis=dim))
    f = rng.random(shape).astype(np.float32)
    if layout == "broadcast":
        f = np.broadcast_to(f[:1], shape).copy()
    got = host(be, be.cumulative("sum", up(be, f, layout), dim))
    exp = np.cumsum(f.astype(np.float64), axis=dim)
    np.testing.assert_allclose(got, exp, rtol=1e-5)


def test_cumulative_special_values(be) -> None:
    a = np.array([[1.0, np.inf, 2.0, -np.inf, 1.0], [0.5, np.nan, 1.0, 1.0, 1.0]], np.float32)
    t = torch.from_numpy(a)
    np.testing.assert_array_equal(host(be, be.cumulative("sum", up(be, a), 1)), torch.cumsum(t, 1).numpy())
    np.testing.assert_array_equal(host(be, be.cumulative("prod", up(be, a), 1)), torch.cumprod(t, 1).numpy())
    assert host(be, be.cumulative("sum", up(be, np.zeros((0, 3), np.float32)), 0)).shape == (0, 3)


# -- softmax and logsumexp ---------------------------------------------------------------------------------------------
def special_rows(length: int) -> np.ndarray:
    """Rows that stress the stabilisation: all -inf, a +inf, a NaN, huge and tiny values, ordinary values."""
    rng = np.random.default_rng(length)
    rows = rng.standard_normal((6, length)).astype(np.float32) * 3
    rows[0] = -np.inf
    rows[1, length // 2] = np.inf
    rows[2, length - 1] = np.nan
    rows[3] += 1e4
    rows[4] -= 1e4
    rows[5, 0] = -np.inf
    return rows


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("length", [1, 5, 17, 300, 5000])
def test_softmax_matches_composition(be, log: bool, length: int) -> None:
    a = special_rows(length)
    for x, dim in ((a, 1), (np.ascontiguousarray(a.T), 0), (np.repeat(a[:, None, :], 3, axis=1), 2)):
        got = host(be, be.softmax(up(be, x), dim, log))
        exp = host(be, Backend.softmax(be, up(be, x), dim, log))  # the contract's default composition
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"{dim} {x.shape}")
    ok = a[3:]  # finite rows also match torch
    tt = torch.from_numpy(ok)
    exp = (torch.log_softmax if log else torch.softmax)(tt, 1).numpy()
    np.testing.assert_allclose(host(be, be.softmax(up(be, ok), 1, log)), exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,dim", [((1, 100000), 1), ((2, 50000), 0), ((3000, 40), 1), ((40, 3000), 0),
                                       ((4, 6, 33), 1)])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_softmax_paths(be, shape: tuple[int, ...], dim: int, layout: str) -> None:
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32) * 4
    tt = torch.from_numpy(x.astype(np.float64))  # torch's float32 softmax of 1e5 elements is off by ~2e-5 itself
    for log in (False, True):
        got = host(be, be.softmax(up(be, x, layout), dim, log))
        exp = (torch.log_softmax if log else torch.softmax)(tt, dim).numpy()
        # x - max rounds to an ulp of x: a relative error of exp, an absolute one of log_softmax
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5 if log else 0, err_msg=f"log={log}")


@pytest.mark.parametrize("dtype", [np.float16, BF16, np.float64], ids=lambda d: np.dtype(d).name)
def test_softmax_logsumexp_dtypes(be, dtype) -> None:
    need(be, dtype)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 333)).astype(np.float32).astype(dtype)
    xf = torch.from_numpy(x.astype(np.float64))
    got = host(be, be.softmax(up(be, x), 1, False))
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got.astype(np.float64), torch.softmax(xf, 1).numpy(), **tol(dtype))
    got = host(be, be.logsumexp(up(be, x), (1,), False))
    assert got.dtype == x.dtype
    np.testing.assert_allclose(got.astype(np.float64), torch.logsumexp(xf, 1).numpy(), **tol(dtype))


@pytest.mark.parametrize("length", [1, 5, 17, 300, 5000])
def test_logsumexp_matches_composition(be, length: int) -> None:
    a = special_rows(length)
    for x, dims in ((a, (1,)), (np.ascontiguousarray(a.T), (0,)), (np.repeat(a[:, None, :], 3, axis=1), (1, 2))):
        for keepdim in (False, True):
            got = host(be, be.logsumexp(up(be, x), dims, keepdim))
            exp = host(be, Backend.logsumexp(be, up(be, x), dims, keepdim))
            np.testing.assert_allclose(got, exp, rtol=1e-5, equal_nan=True, err_msg=f"{dims} {keepdim}")
    got = host(be, be.logsumexp(up(be, a), (1,), False))
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2])


@pytest.mark.parametrize("shape,dims", [((1, 10**6), (1,)), ((10**6, 2), (0,)), ((3000, 50), (1,)),
                                        ((50, 3000), (0,)), ((2, 3, 4, 5, 6), (0, 2, 4)), ((2, 3, 4, 5, 6), (1, 3))])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_logsumexp_paths(be, shape: tuple[int, ...], dims: tuple[int, ...], layout: str) -> None:
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32) * 4
    got = host(be, be.logsumexp(up(be, x, layout), dims, True))
    exp = torch.logsumexp(torch.from_numpy(x.astype(np.float64)), dims, keepdim=True).numpy()
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


# -- through the public API, including bad input ----------------------------------------------------------------------
def test_public_api_and_errors() -> None:
    dev = ember.Device.opencl(0)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = ember.tensor(x, device=dev)
    np.testing.assert_allclose(t.mean((0, 2)).numpy(), x.mean((0, 2)))
    np.testing.assert_allclose(t.std(1).numpy(), x.std(1, ddof=1), rtol=1e-6)
    assert t.argmax().item() == 23 and t.sum(dtype=ember.float64).dtype is ember.float64
    np.testing.assert_array_equal(ember.cumsum(t, 2).numpy(), np.cumsum(x, 2))
    empty = ember.tensor(np.zeros((0, 3), np.float32), device=dev)
    with pytest.raises(ShapeError, match="max"):
        empty.max()
    with pytest.raises(ShapeError, match="argmax"):
        empty.argmax(0)
    assert empty.sum(0).tolist() == [0.0, 0.0, 0.0] and empty.prod(0).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(DTypeError, match="argmax"):
        ember.tensor(np.array([True, False]), device=dev).argmax()
    with pytest.raises(DimError):
        t.cumsum(3)
    with pytest.raises(DTypeError, match="mean"):
        ember.tensor(np.arange(3), device=dev).mean()


@pytest.mark.parametrize("shape, dims", [((64, 64, 26, 26), (0, 2, 3)), ((9, 5, 7, 33), (0, 2, 3)),
                                         ((3, 300, 17), (1,)), ((4097, 37), (0,)), ((5, 11, 13, 3), (0, 1, 3))])
def test_chunked_walks_over_several_reduced_dims(be, shape, dims):
    """Batch-norm style statistics (kept dim between reduced ones) and kept-inner columns: on CPUs each work-item
    walks a chunk whose coordinates are carried across reduced dims, and rows are reduced in tiles of 8."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(shape).astype(np.float32)
    a.flat[rng.integers(0, a.size, 5)] = 3.5  # ties: the first flat index wins
    h = be.from_numpy(a)
    ref = a.astype(np.float64).sum(dims, keepdims=True)
    np.testing.assert_allclose(be.to_numpy(be.reduce("sum", h, dims, True)), ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(be.to_numpy(be.reduce("max", h, dims, False)), a.max(dims))
    np.testing.assert_array_equal(be.to_numpy(be.reduce("min", h, dims, False)), a.min(dims))
    if len(dims) == 1:
        np.testing.assert_array_equal(be.to_numpy(be.argreduce("argmax", h, dims[0], False)), a.argmax(dims[0]))
    a[(0,) * a.ndim] = np.nan
    h = be.from_numpy(a)
    got = be.to_numpy(be.reduce("max", h, dims, False))
    assert np.isnan(got.flat[0]) and np.array_equal(got, a.max(dims), equal_nan=True)
