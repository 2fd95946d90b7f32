"""complex64/complex128 on the OpenCL backend, through its methods on device handles, against numpy: transfers,
strided/broadcast/reversed operands of the elementwise kernels, casts both ways, sums over scattered dims (the real
view), batched matmul, core's complex ops as device kernels, the typed errors of what has no complex kernel, and
that complex kernels never fuse."""

from __future__ import annotations

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")

import ember  # noqa: E402
from ember import dtypes as dt  # noqa: E402
from ember.errors import DTypeError  # noqa: E402
from ember_opencl import complex_ as cx  # noqa: E402
from ember_opencl.runtime import device_count  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

CPLX = [np.complex64, np.complex128]


@pytest.fixture(scope="module")
def be():
    return ember.Device.opencl(0).stack.base_backend


def need(be, dtype) -> None:
    if dt.from_numpy_dtype(np.dtype(dtype)) not in be.supported_dtypes:
        pytest.skip(f"device has no {np.dtype(dtype).name}")


def rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def tol(dtype):
    return {"rtol": 2e-5, "atol": 2e-5} if dtype == np.complex64 else {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize("dtype", CPLX, ids=lambda d: np.dtype(d).name)
def test_round_trip_and_supported_dtypes(be, dtype):
    need(be, dtype)
    a = rand((3, 5), dtype)
    np.testing.assert_array_equal(be.to_numpy(be.from_numpy(a)), a)
    assert dt.complex64 in be.supported_dtypes
    assert (dt.complex128 in be.supported_dtypes) == (dt.float64 in be.supported_dtypes)


@pytest.mark.parametrize("dtype", CPLX, ids=lambda d: np.dtype(d).name)
def test_binary_ops_on_views_match_numpy(be, dtype):
    need(be, dtype)
    a, b = rand((4, 6), dtype, 1), rand((6,), dtype, 2)
    ha, hb = be.from_numpy(a), be.from_numpy(b)
    views = {  # a transposed, a reversed and a broadcast operand
        "T": (be.permute(ha, (1, 0)), a.T, be.expand(be.reshape(hb, (6, 1)), (6, 4)), np.broadcast_to(b[:, None],
                                                                                                       (6, 4))),
        "rev": (be.getitem(ha, (slice(None), slice(None, None, -1))), a[:, ::-1], hb, b),
    }
    for name, (x, xn, y, yn) in views.items():
        for op, f in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
                      ("pow", np.power)):
            np.testing.assert_allclose(be.to_numpy(be.binary(op, x, y)), f(xn, yn), err_msg=f"{op} {name}",
                                       **tol(dtype))
        np.testing.assert_array_equal(be.to_numpy(be.binary("eq", x, x)), np.ones(xn.shape, bool))
        np.testing.assert_array_equal(be.to_numpy(be.binary("ne", x, y)), xn != yn)
    np.testing.assert_allclose(be.to_numpy(be.binary("mul", ha, 2.5)), a * 2.5, **tol(dtype))


@pytest.mark.parametrize("dtype", CPLX, ids=lambda d: np.dtype(d).name)
def test_unary_ops_match_numpy(be, dtype):
    need(be, dtype)
    a = rand((2, 7), dtype, 3)
    h = be.from_numpy(a)
    for op, f in (("neg", np.negative), ("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt),
                  ("reciprocal", np.reciprocal), ("sin", np.sin), ("cos", np.cos), ("tan", np.tan),
                  ("sinh", np.sinh), ("cosh", np.cosh), ("tanh", np.tanh), ("log10", np.log10)):
        np.testing.assert_allclose(be.to_numpy(be.unary(op, h)), f(a), err_msg=op, **tol(dtype))
    special = np.array([0, -4, complex(np.inf, 1), complex(np.nan, 0), 1e30 + 1e30j], dtype)
    hs = be.from_numpy(special)
    np.testing.assert_array_equal(be.to_numpy(be.unary("isnan", hs)), np.isnan(special))
    np.testing.assert_array_equal(be.to_numpy(be.unary("isinf", hs)), np.isinf(special))
    np.testing.assert_array_equal(be.to_numpy(be.unary("isfinite", hs)), np.isfinite(special))
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(be.to_numpy(be.unary("sqrt", be.from_numpy(special[:2]))), np.sqrt(special[:2]))


@pytest.mark.parametrize("dtype", CPLX, ids=lambda d: np.dtype(d).name)
def test_casts_both_ways(be, dtype):
    need(be, dtype)
    a = rand((3, 4), dtype, 4)
    h = be.from_numpy(a)
    ctype = dt.from_numpy_dtype(np.dtype(dtype))
    for target in (dt.float32, dt.int32, dt.bool_, dt.complex64, dt.complex128):
        if target not in be.supported_dtypes:
            continue
        want = a.real.astype(target.numpy) if not target.is_complex and target is not dt.bool_ else \
            (a != 0) if target is dt.bool_ else a.astype(target.numpy)
        np.testing.assert_allclose(be.to_numpy(be.cast(h, target)), want, rtol=1e-6)
    r = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(be.to_numpy(be.cast(be.from_numpy(r), ctype)), r.astype(dtype))
    out = be.full((2, 3), 1 - 2j, ctype)
    np.testing.assert_array_equal(be.to_numpy(out), np.full((2, 3), 1 - 2j, dtype))
    be.assign(be.getitem(out, (0,)), be.from_numpy(np.array([1.5, 2.5, 3.5], np.float32)))
    np.testing.assert_array_equal(be.to_numpy(out)[0], np.array([1.5, 2.5, 3.5], dtype))


@pytest.mark.parametrize("dtype", CPLX, ids=lambda d: np.dtype(d).name)
def test_sums_and_matmul(be, dtype):
    need(be, dtype)
    a = rand((3, 4, 5), dtype, 5)
    h = be.from_numpy(a)
    for dims, keep in (((0,), False), ((0, 2), True), ((0, 1, 2), False), ((1,), True)):
        np.testing.assert_allclose(be.to_numpy(be.reduce("sum", h, dims, keep)), a.sum(axis=dims, keepdims=keep),
                                   **tol(dtype))
    t = be.permute(h, (2, 1, 0))  # a strided view
    np.testing.assert_allclose(be.to_numpy(be.reduce("sum", t, (1,), False)), a.transpose(2, 1, 0).sum(1),
                               **tol(dtype))
    b = rand((3, 5, 2), dtype, 6)
    np.testing.assert_allclose(be.to_numpy(be.matmul(h, be.from_numpy(b))), a @ b, **tol(dtype))
    with pytest.raises(DTypeError, match=f"prod: not supported for {np.dtype(dtype).name} on the OpenCL"):
        be.reduce("prod", h, (0,), False)


@pytest.mark.parametrize("dtype", CPLX, ids=lambda d: np.dtype(d).name)
def test_cumsum_on_the_real_view(be, dtype):
    need(be, dtype)
    a = rand((3, 4, 5), dtype, 8)
    h = be.from_numpy(a)
    for dim in (0, 1, 2, -1):
        np.testing.assert_allclose(be.to_numpy(be.cumulative("sum", h, dim)), np.cumsum(a, axis=dim), **tol(dtype))
    np.testing.assert_allclose(be.to_numpy(be.cumulative("sum", be.permute(h, (2, 0, 1)), 1)),
                               np.cumsum(a.transpose(2, 0, 1), axis=1), **tol(dtype))


def test_refused_ops_name_op_dtype_and_backend(be):
    h = be.from_numpy(rand((2, 2), np.complex64))
    for call, op in ((lambda: be.cumulative("prod", h, 0), "cumprod"), (lambda: be.softmax(h, 0, False), "softmax"),
                     (lambda: be.argreduce("argmax", h, 0, False), "argmax"),
                     (lambda: be.sort(h, 0, False, True), "sort"), (lambda: be.logsumexp(h, (0,), False), "logsumexp")):
        with pytest.raises(DTypeError, match=f"{op}: not supported for complex64 on the OpenCL backend"):
            call()
    with pytest.raises(DTypeError, match="floor: not supported for complex64 on the OpenCL backend"):
        be.unary("floor", h)
    with pytest.raises(DTypeError, match="maximum: not supported for complex64 on the OpenCL backend"):
        be.binary("maximum", h, h)


def test_core_complex_ops_run_device_kernels(be):
    from ember import extension

    for name in ("complex.real", "complex.imag", "complex.abs", "complex.angle", "complex.conj",
                 "complex.view_as_real", "complex.view_as_complex", "complex.complex", "complex.polar"):
        assert "opencl" in extension.get(name).kernels, name
    dev = ember.Device.opencl(0)
    z = rand((2, 3), np.complex64, 7)
    t = ember.tensor(z, device=dev)
    np.testing.assert_allclose(ember.view_as_real(t).numpy(), np.stack([z.real, z.imag], -1))
    np.testing.assert_allclose(ember.polar(t.abs(), ember.angle(t)).numpy(), z, rtol=1e-5, atol=1e-6)
    view = cx.as_real(be.from_numpy(z))
    assert view.shape == (2, 3, 2) and view.dtype is dt.float32


def test_complex_never_fuses(be):
    from ember.ir import Instr, Kernel
    from ember_opencl.fusion import compile_kernel

    k = Kernel(rank=1, inputs=(dt.complex64, dt.complex64), scalars=0,
               body=(Instr("load", (0,), dt.complex64), Instr("load", (1,), dt.complex64),
                     Instr("binary", ("mul", 0, 1), dt.complex64)), outputs=(2,))
    assert compile_kernel(be, k) is None
