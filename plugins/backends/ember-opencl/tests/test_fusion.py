"""Tests of ember_opencl.fusion: fused kernels (ember.ir.Kernel) against ember.ir.interpret and numpy.

Kernels are built by hand. Each compiled kernel is compared with running its instructions one by one on the same
backend (the reference semantics, so results match exactly: intermediates are converted and rounded as stored
results are) and with numpy. Both layout families run on any driver: the device's own, and the other one forced
through ``compile_kernel(..., cpu=...)`` (so a CPU driver runs the GPU kernels too).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")

import ember  # noqa: E402
from ember import dtypes as dt  # noqa: E402
from ember.errors import ShapeError  # noqa: E402
from ember.ir import Instr, Kernel, interpret  # noqa: E402
from ember_opencl import array as arr  # noqa: E402
from ember_opencl import fusion  # noqa: E402
from ember_opencl.backend import OpenCLBackend  # noqa: E402
from ember_opencl.ctypes_ import ctype  # noqa: E402
from ember_opencl.runtime import device_count  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

F32, F16, BF16, F64, I32, I64, U8, I8, I16, BOOL = (dt.float32, dt.float16, dt.bfloat16, dt.float64, dt.int32,
                                                    dt.int64, dt.uint8, dt.int8, dt.int16, dt.bool_)


@pytest.fixture(scope="module")
def be() -> OpenCLBackend:
    """The bare OpenCL backend (the fusion decorator, when installed, wraps the device's stack)."""
    s = ember.Device.opencl(0).base.stack
    while not isinstance(s, OpenCLBackend):
        s = s.inner
    return s


@pytest.fixture(params=[None, "other"], ids=["native", "other-layouts"])
def cpu(request, be) -> bool | None:
    """None: the device's own layouts; else the other family's (GPU kernels on a CPU driver and vice versa)."""
    return None if request.param is None else not be.rt.is_cpu


class K:
    """A tiny builder: ``k.load(0)``, ``k.bin("add", a, b)``... return instruction indices."""

    def __init__(self) -> None:
        self.body: list[Instr] = []

    def _add(self, op: str, args: tuple, dtype: dt.DType) -> int:
        self.body.append(Instr(op, args, dtype))
        return len(self.body) - 1

    def dtype(self, i: int) -> dt.DType:
        return self.body[i].dtype

    def load(self, k: int, dtype: dt.DType) -> int:
        return self._add("load", (k,), dtype)

    def scalar(self, k: int, dtype: dt.DType) -> int:
        return self._add("scalar", (k,), dtype)

    def un(self, name: str, a: int, dtype: dt.DType | None = None) -> int:
        return self._add("unary", (name, a), dtype or self.dtype(a))

    def bin(self, name: str, a: int, b: int, dtype: dt.DType | None = None) -> int:
        return self._add("binary", (name, a, b), dtype or self.dtype(a))

    def where(self, c: int, a: int, b: int) -> int:
        return self._add("where", (c, a, b), self.dtype(a))

    def cast(self, a: int, dtype: dt.DType) -> int:
        return self._add("cast", (a,), dtype)

    def kernel(self, rank: int, inputs: tuple, scalars: int, outputs: tuple, reduce=None) -> Kernel:
        return Kernel(rank, tuple(inputs), scalars, tuple(self.body), tuple(outputs), reduce)


def need(be, *dtypes) -> None:
    for d in dtypes:
        if d not in be.supported_dtypes:
            pytest.skip(f"device has no {d}")


def host(be, h) -> np.ndarray:
    return be.to_numpy(h)


def same(a: np.ndarray, b: np.ndarray, what: str = "") -> None:
    """Bitwise-equal values (NaN equal to NaN), same shape and dtype."""
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
    if a.dtype.kind == "f" or a.dtype == dt.bfloat16.numpy:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(a64), np.isnan(b64), err_msg=what)
        np.testing.assert_array_equal(np.where(np.isnan(a64), 0, a64), np.where(np.isnan(b64), 0, b64), err_msg=what)
    else:
        np.testing.assert_array_equal(a, b, err_msg=what)


def near(a: np.ndarray, b: np.ndarray, atol: np.ndarray | float, what: str = "") -> None:
    """Equal up to ``atol`` per element (NaN where the other is NaN), same shape and dtype: kernels whose vector
    form calls transcendental builtins that round differently from the scalar ones in the last bit."""
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
    ok = ~np.isnan(a)
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    assert (diff[ok] <= np.broadcast_to(atol, a.shape)[ok]).all(), (what, float(diff[ok].max()))


def run_both(be, kernel: Kernel, inputs, scalars, shape, outs=None, cpu: bool | None = None):
    """(fused results, interpreted results) as host arrays; the fused kernel must compile."""
    fn = fusion.compile_kernel(be, kernel, cpu=cpu)
    assert fn is not None, kernel.describe()
    got = [host(be, h) for h in fn(inputs, scalars, shape, outs if outs is not None else [None] * len(kernel.outputs))]
    ref = [host(be, h) for h in interpret(kernel, be, inputs, scalars, shape)]
    return got, ref


def gelu_kernel(dtype: dt.DType = F32) -> Kernel:
    """0.5 * x * (1 + tanh(c * (x + a * x^3))): 8 arithmetic ops and 4 scalar arguments."""
    k = K()
    x = k.load(0, dtype)
    half, a, c, one = (k.scalar(i, dtype) for i in range(4))
    x3 = k.bin("mul", k.bin("mul", x, x), x)
    inner = k.bin("mul", k.bin("add", x, k.bin("mul", x3, a)), c)
    y = k.bin("mul", k.bin("mul", x, k.bin("add", k.un("tanh", inner), one)), half)
    return k.kernel(1, (dtype,), 4, (y,))


GELU_SCALARS = [0.5, 0.044715, math.sqrt(2 / math.pi), 1.0]


def gelu_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# -- elementwise ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 1000, 100_003])
def test_gelu_chain(be, cpu, n: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 3
    x[0] = np.nan
    k = gelu_kernel()
    (got,), (ref,) = run_both(be, k, [be.from_numpy(x)], GELU_SCALARS, (n,), cpu=cpu)
    # CPU drivers run this body with vectors: their exp may round differently from the scalar exp of the
    # interpreted tanh (both within 1 ulp), an error of a few ulp of 1 in (1 + tanh), scaled by 0.5 * |x|
    near(got, ref, np.abs(x) * 4e-7)
    np.testing.assert_allclose(got, gelu_np(x), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(got[0])


def test_source_is_deterministic_and_scalar_free(be) -> None:
    a, b = fusion.compile_kernel(be, gelu_kernel()), fusion.compile_kernel(be, gelu_kernel())
    assert a is not b
    for layout in ("linear", "linear_chunked", "strided", "chunked"):
        assert a.source(layout, 3) == b.source(layout, 3)
    assert a.source("strided", 3) != a.source("strided", 8)
    src = a.source("linear", 1)
    assert "0.044715" not in src and "ember_tanh_float(" in src  # scalars are kernel arguments, never baked in
    ra, rb = fusion.compile_kernel(be, var_kernel((1,))), fusion.compile_kernel(be, var_kernel((1,)))
    assert ra.source(1, ctype(F32)) == rb.source(1, ctype(F32))
    # the backend hook memoises per kernel; equal kernels share the compiled object
    assert be.fusion_compile(gelu_kernel()) is be.fusion_compile(gelu_kernel())


def test_scalars_change_between_calls(be) -> None:
    k = K()
    y = k.bin("add", k.bin("mul", k.load(0, F32), k.scalar(0, F32)), k.scalar(1, F32))
    fn = be.fusion_compile(k.kernel(2, (F32,), 2, (y,)))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    hx = be.from_numpy(x)
    compiled = be.rt.programs.stats["compiled"] + be.rt.programs.stats["disk_hits"]
    for s, t in [(2.0, 1.0), (-0.5, 3.25), (0.0, -7.0), (1e30, 0.0)]:
        (out,) = fn([hx], [s, t], x.shape, [None])
        np.testing.assert_array_equal(host(be, out), (x * np.float32(s) + np.float32(t)).astype(np.float32))
    # one program serves every scalar value (at most the first call built one)
    assert be.rt.programs.stats["compiled"] + be.rt.programs.stats["disk_hits"] <= compiled + 1
    assert len(fn.sources) == 1


def test_broadcast_lower_rank_inputs(be, cpu) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    col = rng.standard_normal((5, 1)).astype(np.float32)
    k = K()
    y = k.un("abs", k.bin("add", k.bin("add", k.load(0, F32), k.load(1, F32)), k.load(2, F32)))
    z = k.bin("mul", k.load(1, F32), k.load(2, F32))  # an output read only from broadcast inputs
    kern = k.kernel(3, (F32, F32, F32), 0, (y, z))
    ins = [be.from_numpy(x), be.from_numpy(bias), be.from_numpy(col)]
    got, ref = run_both(be, kern, ins, [], x.shape, cpu=cpu)
    for g, r in zip(got, ref):
        same(g, r)
    np.testing.assert_array_equal(got[0], np.abs(x + bias + col))
    np.testing.assert_array_equal(got[1], np.broadcast_to(bias * col, x.shape))


def test_broadcast_shape_error(be) -> None:
    k = K()
    y = k.bin("add", k.load(0, F32), k.load(1, F32))
    fn = be.fusion_compile(k.kernel(2, (F32, F32), 0, (y,)))
    a, b = be.from_numpy(np.zeros((3, 4), np.float32)), be.from_numpy(np.zeros(5, np.float32))
    with pytest.raises(ShapeError, match=r"input 1 of shape \(5,\).*\(3, 4\)"):
        fn([a, b], [], (3, 4), [None])


def views(be, x: np.ndarray):
    """(name, handle, numpy value) for a transposed, a reversed-and-stepped and an offset view holding x."""
    h = be.from_numpy(np.ascontiguousarray(x.T))
    yield "transposed", arr.permute(h, (1, 0)), x
    big = be.from_numpy(np.ascontiguousarray(np.repeat(x, 2, axis=1)[:, ::-1]))
    yield "reversed", arr.basic_index(big, (slice(None), slice(None, None, -2))), x
    pad = be.from_numpy(np.pad(x, ((1, 0), (2, 1))))
    yield "offset", arr.basic_index(pad, (slice(1, None), slice(2, -1))), x


def test_strided_views_as_inputs(be, cpu) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 9)).astype(np.float32)
    y = rng.standard_normal((7, 9)).astype(np.float32)
    k = K()
    a, b = k.load(0, F32), k.load(1, F32)
    out = k.bin("sub", k.un("exp", a), k.bin("maximum", a, b))
    kern = k.kernel(2, (F32, F32), 0, (out,))
    for name, hx, vx in views(be, x):
        for name2, hy, vy in views(be, y):
            (got,), (ref,) = run_both(be, kern, [hx, hy], [], x.shape, cpu=cpu)
            same(got, ref, f"{name}/{name2}")
            np.testing.assert_allclose(got, np.exp(vx) - np.maximum(vx, vy), rtol=1e-6, atol=1e-6)


def test_multiple_outputs(be, cpu) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((33, 17)).astype(np.float32)
    y = rng.standard_normal((33, 17)).astype(np.float32)
    k = K()
    a, b = k.load(0, F32), k.load(1, F32)
    s = k.bin("add", k.bin("mul", a, k.scalar(0, F32)), b)
    gt = k.bin("gt", a, b, BOOL)
    relu = k.where(gt, a, b)
    as_int = k.cast(k.bin("mul", s, k.scalar(1, F32)), I32)
    kern = k.kernel(2, (F32, F32), 2, (s, gt, relu, as_int, s))
    got, ref = run_both(be, kern, [be.from_numpy(x), be.from_numpy(y)], [1.5, 10.0], x.shape, cpu=cpu)
    for g, r in zip(got, ref):
        same(g, r)
    sx = x * np.float32(1.5) + y
    np.testing.assert_array_equal(got[0], sx)
    np.testing.assert_array_equal(got[1], x > y)
    np.testing.assert_array_equal(got[2], np.where(x > y, x, y))
    np.testing.assert_array_equal(got[3], (sx * np.float32(10)).astype(np.int32))
    np.testing.assert_array_equal(got[4], sx)


def test_outs_in_place_and_aliasing_an_input(be, cpu) -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal((6, 10)).astype(np.float32)
    k = K()
    y = k.bin("add", k.bin("mul", k.load(0, F32), k.scalar(0, F32)), k.load(1, F32))  # a = a * s + b
    fn = fusion.compile_kernel(be, k.kernel(2, (F32, F32), 1, (y,)), cpu=cpu)
    ha, hb = be.from_numpy(a), be.from_numpy(b)
    (res,) = fn([ha, hb], [0.25], a.shape, [ha])
    assert res is ha
    np.testing.assert_array_equal(host(be, ha), a * np.float32(0.25) + b)
    # a strided (transposed) view written in place, aliasing the same input element by element
    base = be.from_numpy(np.ascontiguousarray(a.T))
    view = arr.permute(base, (1, 0))
    (res,) = fn([view, hb], [2.0], a.shape, [view])
    assert res is view
    np.testing.assert_array_equal(host(be, base), (a * np.float32(2) + b).T)
    # a slice of a bigger buffer: the rest stays untouched
    big = be.from_numpy(np.full((6, 12), -1.0, np.float32))
    part = arr.basic_index(big, (slice(None), slice(1, 11)))
    fn([ha, hb], [1.0], a.shape, [part])
    after = host(be, big)
    np.testing.assert_array_equal(after[:, 1:11], host(be, ha) + b)
    assert (after[:, 0] == -1).all() and (after[:, 11] == -1).all()


ELEMENTWISE_DTYPES = [F32, F16, BF16, F64, I8, I16, I32, I64, U8]


def rand(rng: np.random.Generator, shape, dtype: dt.DType) -> np.ndarray:
    if dtype is BOOL:
        return rng.random(shape) < 0.5
    if not dtype.is_floating_point:
        return rng.integers(-20 if dtype.is_signed else 0, 20, shape).astype(dtype.numpy)
    return (rng.standard_normal(shape) * 4).astype(np.float32).astype(dtype.numpy)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES, ids=str)
def test_dtype_families(be, cpu, dtype: dt.DType) -> None:
    """Arithmetic with wrap-around, comparisons, where, casts and a scalar, in every dtype."""
    need(be, dtype)
    rng = np.random.default_rng(5)
    x, y = rand(rng, (5, 13), dtype), rand(rng, (13,), dtype)
    k = K()
    a, b = k.load(0, dtype), k.load(1, dtype)
    p = k.bin("mul", k.bin("add", a, b), k.bin("sub", a, k.scalar(0, dtype)))  # wraps for small ints
    m = k.bin("maximum", p, k.un("abs", b))
    lt = k.bin("lt", a, b, BOOL)
    w = k.where(lt, m, k.un("neg", a))
    f = k.cast(w, F32)
    back = k.cast(k.bin("mul", f, k.scalar(1, F32)), dtype)
    outs = (w, lt, back)
    if dtype.is_floating_point:
        outs += (k.un("sqrt", k.un("abs", p)), k.bin("floor_divide", p, b), k.un("isnan", k.un("log", m), BOOL))
    else:
        outs += (k.bin("remainder", p, k.where(k.bin("eq", b, k.scalar(2, dtype), BOOL), k.scalar(3, dtype), b)),)
    kern = k.kernel(2, (dtype, dtype), 4, outs)
    got, ref = run_both(be, kern, [be.from_numpy(x), be.from_numpy(y)], [3, 0.5, 0, 7], x.shape, cpu=cpu)
    for j, (g, r) in enumerate(zip(got, ref)):
        same(g, r, f"output {j}")
    # numpy on the first output (ints wrap, half types rounded per op)
    if dtype.is_floating_point:
        wide = np.float64 if dtype is F64 else np.float32
        rnd = (lambda v: v.astype(dtype.numpy).astype(wide)) if dtype in (F16, BF16) else (lambda v: v)
        xw, yw = x.astype(wide), y.astype(wide)
        pw = rnd(rnd(rnd(xw + yw) * rnd(xw - 3)))
        expect = np.where(xw < yw, np.maximum(pw, np.abs(yw)), -xw).astype(dtype.numpy)
    else:
        with np.errstate(over="ignore"):
            pw = (x + y) * (x - dtype.numpy.type(3))
        expect = np.where(x < y, np.maximum(pw, np.abs(y).astype(dtype.numpy)), (-x).astype(dtype.numpy))
    same(got[0], expect.astype(dtype.numpy))


def test_bool_family(be, cpu) -> None:
    rng = np.random.default_rng(6)
    x, y = rng.random((4, 9)) < 0.5, rng.random((9,)) < 0.5
    k = K()
    a, b = k.load(0, BOOL), k.load(1, BOOL)
    o = k.bin("logical_or", k.bin("logical_and", a, b), k.un("logical_not", a))
    xo = k.bin("logical_xor", o, k.scalar(0, BOOL))
    n = k.bin("add", k.cast(xo, I32), k.cast(a, I32))
    kern = k.kernel(2, (BOOL, BOOL), 1, (o, xo, n))
    got, ref = run_both(be, kern, [be.from_numpy(x), be.from_numpy(y)], [True], x.shape, cpu=cpu)
    for g, r in zip(got, ref):
        same(g, r)
    oo = (x & y) | ~x
    np.testing.assert_array_equal(got[0], oo)
    np.testing.assert_array_equal(got[1], ~oo)
    np.testing.assert_array_equal(got[2], (~oo).astype(np.int32) + x)


def test_zero_d_and_empty_shapes(be, cpu) -> None:
    k = K()
    y = k.bin("add", k.un("exp", k.load(0, F32)), k.scalar(0, F32))
    fn = fusion.compile_kernel(be, k.kernel(2, (F32,), 1, (y, 0)), cpu=cpu)
    kern0 = K()
    y0 = kern0.bin("mul", kern0.load(0, F32), kern0.scalar(0, F32))
    fn0 = fusion.compile_kernel(be, kern0.kernel(0, (F32,), 1, (y0,)), cpu=cpu)
    (r,) = fn0([be.from_numpy(np.array(3.0, np.float32))], [2.0], (), [None])
    assert host(be, r).shape == () and float(host(be, r)) == 6.0
    # a 0-d input broadcast to a 2-d shape
    (r, c) = fn([be.from_numpy(np.array(0.0, np.float32))], [1.0], (2, 3), None)
    np.testing.assert_array_equal(host(be, r), np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(host(be, c), np.zeros((2, 3), np.float32))
    for shape in [(0,), (3, 0), (0, 5)]:
        h = be.from_numpy(np.zeros(shape, np.float32))
        outs = fn([h], [1.0], shape, [None, None])
        assert [host(be, o).shape for o in outs] == [shape, shape]


def test_unsupported_kernels_return_none(be) -> None:
    k = K()
    x = k.load(0, I32)
    assert be.fusion_compile(Kernel(1, (I32,), 0, (Instr("load", (0,), I32), Instr("unary", ("exp", 0), I32)),
                                    (1,))) is None  # float-only op on ints
    assert be.fusion_compile(Kernel(1, (I32,), 0, (Instr("load", (0,), I32), Instr("unary", ("nope", 0), I32)),
                                    (1,))) is None
    assert be.fusion_compile(Kernel(1, (I32,), 0, (Instr("load", (0,), I32), Instr("gather", (0,), I32)),
                                    (1,))) is None
    assert be.fusion_compile(k.kernel(1, (I32,), 0, (x, x), ("sum", (0,)))) is None  # two reduced outputs
    assert be.fusion_compile(k.kernel(1, (I32,), 0, (x,), ("argmax", (0,)))) is None
    assert be.fusion_compile(k.kernel(1, (I32,), 0, ())) is None


# -- reductions ---------------------------------------------------------------------------------------------------
def var_kernel(dims: tuple[int, ...], op: str = "sum", dtype: dt.DType = F32, rank: int = 3) -> Kernel:
    """op over dims of (x - m)^2 * s, m broadcast from a keepdim tensor (the variance numerator)."""
    k = K()
    d = k.bin("sub", k.load(0, dtype), k.load(1, dtype))
    y = k.bin("mul", k.bin("mul", d, d), k.scalar(0, dtype))
    return k.kernel(rank, (dtype, dtype), 1, (y,), (op, dims))


def ref_reduce(op: str, v: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    f = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return f(v.astype(np.float64), axis=dims, keepdims=True)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dims", [(2,), (0,), (1,), (0, 2), (0, 1, 2)], ids=["inner", "outer", "middle",
                                                                               "outer+inner", "all"])
def test_reduce_dims_with_nan(be, cpu, op: str, dims: tuple[int, ...]) -> None:
    rng = np.random.default_rng(7)
    x = (rng.random((6, 7, 40)) + 0.5).astype(np.float32)
    x[2, 3, 5] = np.nan
    m = np.mean(x, axis=dims, keepdims=True).astype(np.float32)
    m[np.isnan(m)] = 1.0
    kern = var_kernel(dims, op)
    s = 0.9 if op == "prod" else 2.0
    (got,), (ref,) = run_both(be, kern, [be.from_numpy(x), be.from_numpy(m)], [s], x.shape, cpu=cpu)
    assert got.shape == tuple(1 if d in dims else n for d, n in enumerate(x.shape))
    if op in ("sum", "prod"):  # the same values, combined in another order than the unfused reduction
        np.testing.assert_allclose(got, ref, rtol=1e-5, equal_nan=True)
    else:
        same(got, ref)
    exp = ref_reduce(op, (x.astype(np.float64) - m) ** 2 * s, dims)
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-6, equal_nan=True)
    assert np.isnan(got).sum() == np.isnan(exp).sum() > 0  # NaN propagates through max/min too


@pytest.mark.parametrize("shape,dims", [((3, 70_001), (1,)), ((50_000, 3), (0,)), ((200_000,), (0,))],
                         ids=["long-rows", "long-cols", "full"])
def test_reduce_split_rows(be, cpu, shape, dims) -> None:
    """Few long rows are split in chunks; partials (float) are finished by a second pass."""
    rng = np.random.default_rng(8)
    x = (rng.random(shape) + 0.5).astype(np.float32)
    m = np.zeros([1 if d in dims else n for d, n in enumerate(shape)], np.float32) + 0.25
    for op in ("sum", "max"):
        kern = var_kernel(dims, op, rank=len(shape))
        fn = fusion.compile_kernel(be, kern, cpu=cpu)
        (got,) = fn([be.from_numpy(x), be.from_numpy(m)], [1.0], shape, [None])
        exp = ref_reduce(op, (x.astype(np.float64) - 0.25) ** 2, dims)
        np.testing.assert_allclose(host(be, got), exp, rtol=1e-5)


@pytest.mark.parametrize("dtype", [F16, BF16, I32, I8, U8, BOOL, F64], ids=str)
def test_reduce_dtypes(be, cpu, dtype: dt.DType) -> None:
    need(be, dtype)
    rng = np.random.default_rng(9)
    x = rand(rng, (9, 300), dtype)
    for op in ("sum", "max", "prod"):
        k = K()
        a = k.load(0, dtype)
        y = k.bin("logical_xor", a, k.scalar(0, BOOL)) if dtype is BOOL else k.bin("add", a, k.scalar(0, dtype))
        kern = k.kernel(2, (dtype,), 1, (y,), (op, (1,)))
        (got,), (ref,) = run_both(be, kern, [be.from_numpy(x)], [False if dtype is BOOL else 1], x.shape, cpu=cpu)
        if dtype in (F16, BF16, F64) and op != "max":
            np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=1e-2 if dtype is BF16
                                       else 2e-3 if dtype is F16 else 1e-12)
        else:
            same(got, ref, op)  # ints wrap as the unfused reduction does; bool sum/prod are any/all


def test_reduce_out_in_place_and_strided_inputs(be, cpu) -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal((8, 30)).astype(np.float32)
    kern = var_kernel((0,), rank=2)
    fn = fusion.compile_kernel(be, kern, cpu=cpu)
    zero = be.from_numpy(np.zeros(30, np.float32))
    for name, hx, vx in views(be, x.T.copy()):  # (30, 8) views; reduce their dim 0 via a transposed view
        hv = arr.permute(hx, (1, 0))
        big = be.from_numpy(np.full((3, 32), -1.0, np.float32))
        out = arr.basic_index(big, (slice(1, 2), slice(1, 31)))
        (res,) = fn([hv, zero], [1.0], (8, 30), [out])
        assert res is out
        after = host(be, big)
        np.testing.assert_allclose(after[1, 1:31], (vx.T.astype(np.float64) ** 2).sum(0), rtol=1e-5, err_msg=name)
        assert (after[0] == -1).all() and (after[2] == -1).all() and after[1, 0] == -1 and after[1, 31] == -1


def test_reduce_empty_and_scattered_layouts(be) -> None:
    kern = var_kernel((1,), rank=2)
    fn = be.fusion_compile(kern)
    zero = be.from_numpy(np.zeros((1, 1), np.float32))
    (r,) = fn([be.from_numpy(np.zeros((4, 0), np.float32)), zero], [1.0], (4, 0), [None])
    np.testing.assert_array_equal(host(be, r), np.zeros((4, 1), np.float32))
    (r,) = fn([be.from_numpy(np.zeros((0, 5), np.float32)), zero], [1.0], (0, 5), [None])
    assert host(be, r).shape == (0, 1)
    # kept dims that do not collapse to at most 4: run op by op, same result
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 2, 3, 2, 5)).astype(np.float32)
    hx = arr.permute(be.from_numpy(np.ascontiguousarray(x.transpose(4, 2, 0, 3, 1, 5))), (2, 4, 1, 3, 0, 5))
    m = be.from_numpy(np.zeros((1,), np.float32))
    k6 = var_kernel((5,), rank=6)
    (got,), (ref,) = run_both(be, k6, [hx, m], [1.0], x.shape)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(got, (x.astype(np.float64) ** 2).sum(5, keepdims=True), rtol=1e-5)


def test_softmax_pieces(be, cpu) -> None:
    """exp(x - m) with m a keepdim max, summed over the last dim: the denominator of softmax."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((16, 33)).astype(np.float32)
    hx = be.from_numpy(x)
    mx = be.reduce("max", hx, (1,), True)
    k = K()
    e = k.un("exp", k.bin("sub", k.load(0, F32), k.load(1, F32)))
    kern = k.kernel(2, (F32, F32), 0, (e,), ("sum", (1,)))
    (got,), (ref,) = run_both(be, kern, [hx, mx], [], x.shape, cpu=cpu)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(got, np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True), rtol=1e-5)
