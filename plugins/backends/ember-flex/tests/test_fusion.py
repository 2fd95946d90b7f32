"""flex's fusion_compile (ember_flex.fusion) against ember.ir.interpret on flex and against numpy.

Exactness: the numpy path *is* interpret (bit-exact). The numexpr path is bit-exact for arithmetic, sqrt,
comparisons, where, casts, rounding, abs/neg/sign, bitwise ops; for transcendental functions (tanh, exp, pow, ...)
numexpr calls the C library where numpy has its own routines, so those are compared with a tight tolerance
(rtol 2e-6 float32, 1e-14 float64).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numexpr")

import ember  # noqa: E402
from ember import dtypes as dt  # noqa: E402
from ember.ir import Instr, Kernel, interpret  # noqa: E402
from ember_flex import fusion  # noqa: E402
from ember_flex.backend import FlexBackend  # noqa: E402

f16, bf16, f32, f64 = dt.float16, dt.bfloat16, dt.float32, dt.float64
i8, i32, i64, u8, b = dt.int8, dt.int32, dt.int64, dt.uint8, dt.bool_
TOL = {np.dtype(np.float32): dict(rtol=2e-6, atol=1e-7), np.dtype(np.float64): dict(rtol=1e-14, atol=1e-15)}


@pytest.fixture(scope="module")
def be() -> FlexBackend:
    s = ember.Device.flex().base.stack
    while not isinstance(s, FlexBackend):  # under the fusion decorator (and others) when installed
        s = s.inner
    return s


def L(k, d):
    return Instr("load", (k,), d)


def S(k, d):
    return Instr("scalar", (k,), d)


def U(name, a, d):
    return Instr("unary", (name, a), d)


def B(name, a, c, d):
    return Instr("binary", (name, a, c), d)


def gelu_kernel(d):
    body = (L(0, d), S(0, d), S(1, d), S(2, d), S(3, d),
            B("mul", 0, 0, d), B("mul", 5, 0, d), B("mul", 6, 3, d), B("add", 0, 7, d), B("mul", 8, 2, d),
            U("tanh", 9, d), B("add", 10, 4, d), B("mul", 0, 11, d), B("mul", 12, 1, d))
    return Kernel(1, (d,), 4, body, (13,))


GELU_SC = (0.5, 0.7978845608, 0.044715, 1.0)


def both_paths(fk, inputs, scalars, shape, outs=None):
    """Results of the numpy path and the numexpr path (fresh outs per path)."""
    cp = (lambda o: None if o is None else o.copy()) if outs is not None else None
    r_np = fk.run_path("numpy", inputs, scalars, shape, None if outs is None else [cp(o) for o in outs])
    r_ne = fk.run_path("numexpr", inputs, scalars, shape, None if outs is None else [cp(o) for o in outs])
    return r_np, r_ne


def assert_same(a, ref, exact=True):
    a, ref = np.asarray(a), np.asarray(ref)
    assert a.dtype == ref.dtype and a.shape == ref.shape
    if exact or a.dtype.kind not in "f":
        np.testing.assert_array_equal(a, ref)
        if a.dtype.kind == "f":  # signed zeros too
            np.testing.assert_array_equal(np.signbit(a), np.signbit(ref))
    else:
        np.testing.assert_allclose(a, ref, **TOL[a.dtype])


@pytest.mark.parametrize("d", [f32, f64])
def test_gelu_tanh_chain(be, d):
    fk = be.fusion_compile(gelu_kernel(d))
    assert isinstance(fk, fusion.FusedKernel)
    x = np.random.default_rng(0).standard_normal((64, 257)).astype(d.numpy)
    ref = interpret(gelu_kernel(d), be, [x], GELU_SC, x.shape)[0]
    xn = x.astype(np.float64)
    oracle = 0.5 * xn * (1 + np.tanh(0.7978845608 * (xn + 0.044715 * xn ** 3)))
    r_np, r_ne = both_paths(fk, [x], GELU_SC, x.shape)
    assert_same(r_np[0], ref)
    # tanh may be computed by numpy (when measured faster) or numexpr's libm: tolerance
    assert_same(r_ne[0], ref, exact=False)
    np.testing.assert_allclose(r_ne[0], oracle, rtol=1e-5 if d is f32 else 1e-12, atol=1e-6)
    # the automatic path too
    for _ in range(2 * fusion.TRIALS + 1):
        r = fk([x], GELU_SC, x.shape, [None])
        assert_same(r[0], ref, exact=False)


def test_exact_arithmetic_chain_bitwise(be):
    # Adam-like update: p - lr * m / (sqrt(v) + eps): only exact ops
    d = f32
    body = (L(0, d), L(1, d), L(2, d), S(0, d), S(1, d), U("sqrt", 2, d), B("add", 5, 4, d), B("div", 1, 6, d),
            B("mul", 7, 3, d), B("sub", 0, 8, d))
    k = Kernel(1, (d, d, d), 2, body, (9,))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(1)
    p, m, v = (r.standard_normal(1000).astype(np.float32) for _ in range(3))
    v = np.abs(v)
    ref = interpret(k, be, [p, m, v], (1e-3, 1e-8), (1000,))[0]
    for res in both_paths(fk, [p, m, v], (1e-3, 1e-8), (1000,)):
        assert_same(res[0], ref)
    np.testing.assert_allclose(ref, p - np.float32(1e-3) * m / (np.sqrt(v) + np.float32(1e-8)), rtol=1e-6)


def test_broadcast_lower_rank_inputs(be):
    d = f64
    k = Kernel(3, (d, d, d), 0, (L(0, d), L(1, d), L(2, d), B("mul", 0, 1, d), B("add", 3, 2, d)), (4,))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(2)
    a, bb, c = r.standard_normal((4, 1, 5)), r.standard_normal(5), r.standard_normal((3, 1))
    shape = (4, 3, 5)
    ref = interpret(k, be, [a, bb, c], (), shape)[0]
    for res in both_paths(fk, [a, bb, c], (), shape):
        assert_same(res[0], ref)
        assert res[0].shape == shape
    assert_same(ref, a * bb + c)


def test_output_broadcast_from_lower_rank_values(be):
    # every input is lower rank than the iteration shape: the output must still have the full shape
    d = f32
    k = Kernel(2, (d,), 0, (L(0, d), U("neg", 0, d)), (1,))
    fk = be.fusion_compile(k)
    x = np.arange(5, dtype=np.float32)
    for res in both_paths(fk, [x], (), (3, 5)):
        assert_same(res[0], np.broadcast_to(-x, (3, 5)))
        assert res[0].flags.writeable and not np.shares_memory(res[0], x)


def test_strided_and_transposed_inputs(be):
    d = f32
    k = Kernel(2, (d, d), 0, (L(0, d), L(1, d), B("sub", 0, 1, d), U("abs", 2, d), U("sqrt", 3, d)), (4,))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(3)
    a = r.standard_normal((40, 60)).astype(np.float32).T  # (60, 40), F-ordered
    bb = r.standard_normal((60, 80)).astype(np.float32)[:, ::2]  # strided
    ref = interpret(k, be, [a, bb], (), (60, 40))[0]
    for res in both_paths(fk, [a, bb], (), (60, 40)):
        assert_same(res[0], ref)
    assert_same(ref, np.sqrt(np.abs(a - bb)))


def test_scalar_args_change_between_calls(be):
    k = Kernel(1, (i32,), 1, (L(0, i32), S(0, i32), B("mul", 0, 1, i32), B("lt", 0, 1, b)), (2, 3))
    fk = be.fusion_compile(k)
    x = np.arange(-5, 5, dtype=np.int32)
    for s in (3, -2, 7, True):
        ref = interpret(k, be, [x], (s,), (10,))
        for res in both_paths(fk, [x], (s,), (10,)):
            assert_same(res[0], ref[0])
            assert_same(res[1], ref[1])
        assert_same(ref[0], x * np.int32(s))
    # a float scalar with an int32 operand: numpy promotes (x * 2.5 in float64, then back to int32; x < 2.5 in
    # float64): the kernel must follow flex, not convert 2.5 to int32
    ref = interpret(k, be, [x], (2.5,), (10,))
    res = fk([x], (2.5,), (10,), [None, None])
    assert fk.last_path == "numpy"
    assert_same(res[0], ref[0])
    assert_same(res[1], ref[1])
    assert_same(res[1], x < 2.5)
    # Python int out of int32's range: numpy's OverflowError, as flex.binary raises it
    with pytest.raises(OverflowError):
        fk.run_path("numexpr", [x], (2 ** 40,), (10,))


def test_float32_scalar_rounding_matches_numpy_weak_promotion(be):
    k = Kernel(1, (f32,), 1, (L(0, f32), S(0, f32), B("add", 0, 1, f32)), (2,))
    fk = be.fusion_compile(k)
    x = np.array([1.0, 1e-8, -3.0], np.float32)
    for s in (0.1, 1 / 3, 2 ** 60 + 1, 1e39):
        ref = interpret(k, be, [x], (s,), (3,))[0]
        assert ref.dtype == np.float32
        for res in both_paths(fk, [x], (s,), (3,)):
            assert_same(res[0], ref)


def test_multiple_outputs(be):
    d = f64
    k = Kernel(1, (d, d), 0, (L(0, d), L(1, d), B("add", 0, 1, d), B("mul", 0, 1, d), U("exp", 2, d),
                              B("div", 4, 3, d)), (2, 3, 5, 0, 2))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(4)
    x, y = r.standard_normal(300), r.standard_normal(300)
    ref = interpret(k, be, [x, y], (), (300,))
    for res in both_paths(fk, [x, y], (), (300,)):
        assert len(res) == 5
        for got, want in zip(res, ref):
            assert_same(got, want, exact=False)
        assert_same(res[0], x + y)
        assert_same(res[1], x * y)
        assert not np.shares_memory(res[3], x)  # a loaded value is returned as new memory
        assert res[0] is res[4] or not np.shares_memory(res[0], res[4]) or res[4] is ref[4] is ref[0]


@pytest.mark.parametrize("layout", ["contiguous", "strided_view"])
def test_outs_in_place_aliasing_an_input(be, layout):
    # a = a * s + b with out=a
    d = f32
    k = Kernel(1, (d, d), 1, (L(0, d), L(1, d), S(0, d), B("mul", 0, 2, d), B("add", 3, 1, d)), (4,))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(5)
    base = r.standard_normal(2000).astype(np.float32)
    bb = r.standard_normal(1000).astype(np.float32)
    for path in ("numpy", "numexpr"):
        buf = base.copy()
        a = buf[:1000] if layout == "contiguous" else buf[::2]
        want = a * np.float32(0.9) + bb
        untouched = buf[1000:].copy() if layout == "contiguous" else buf[1::2].copy()
        res = fk.run_path(path, [a, bb], (0.9,), (1000,), [a])
        assert res[0] is a
        assert_same(a, want)
        assert_same(buf[1000:] if layout == "contiguous" else buf[1::2], untouched)


def test_outs_fresh_contiguous_target_is_written_directly(be):
    d = f64
    k = Kernel(1, (d, d), 0, (L(0, d), L(1, d), B("copysign", 0, 1, d)), (2,))
    fk = be.fusion_compile(k)
    x, y = np.linspace(-3, 3, 101), np.linspace(-2, 1, 101)
    out = np.empty(101)
    res = fk.run_path("numexpr", [x, y], (), (101,), [out])
    assert res[0] is out
    assert_same(out, np.copysign(x, y))


def test_half_and_small_int_dtypes_stay_exact(be):
    # float16 / bfloat16 / int8 / uint8: numexpr has no such types; all-numpy kernels are left to op-by-op
    for d in (f16, bf16, i8, u8):
        k = Kernel(1, (d, d), 0, (L(0, d), L(1, d), B("add", 0, 1, d), B("mul", 2, 0, d)), (3,))
        assert be.fusion_compile(k) is None, d
    # mixed: a float16 input cast up to float32 (a numpy step), then numexpr, then cast back down (numpy)
    body = (L(0, f16), L(1, bf16), Instr("cast", (0,), f32), Instr("cast", (1,), f32), B("mul", 2, 3, f32),
            S(0, f32), B("add", 4, 5, f32), U("sqrt", 6, f32), Instr("cast", (7,), f16), Instr("cast", (7,), bf16))
    k = Kernel(1, (f16, bf16), 1, body, (8, 9, 7))
    fk = be.fusion_compile(k)
    assert fk is not None
    r = np.random.default_rng(6)
    x = np.abs(r.standard_normal(500)).astype(np.float16)
    y = np.abs(r.standard_normal(500)).astype(bf16.numpy)
    ref = interpret(k, be, [x, y], (0.25,), (500,))
    assert [v.dtype for v in ref] == [np.float16, bf16.numpy, np.float32]
    for res in both_paths(fk, [x, y], (0.25,), (500,)):
        for got, want in zip(res, ref):
            assert_same(got, want)


def test_bfloat16_scalar_follows_flex(be):
    # flex.binary(bf16_array, 0.1) computes in float32 with 0.1 as float32 (ml_dtypes widens): not bf16(0.1)
    d = bf16
    body = (L(0, d), S(0, d), B("mul", 0, 1, d), Instr("cast", (2,), f32), U("sqrt", 3, f32), B("add", 4, 3, f32))
    k = Kernel(1, (d,), 1, body, (5,))
    fk = be.fusion_compile(k)
    assert fk is not None
    x = np.linspace(0, 2, 77).astype(d.numpy)
    ref = interpret(k, be, [x], (0.1,), (77,))[0]
    for res in both_paths(fk, [x], (0.1,), (77,)):
        assert_same(res[0], ref)


@pytest.mark.parametrize("d", [i32, i64])
def test_integer_ops_exact(be, d):
    info = np.iinfo(d.numpy)
    x = np.array([0, 1, -1, 7, -7, info.max, info.min, 3, 40, -40], d.numpy)
    y = np.array([1, 3, -3, 2, 31, 1, -1, 63, 64, 5], d.numpy)
    for name in ("add", "sub", "mul", "maximum", "minimum", "bitwise_and", "bitwise_or", "bitwise_xor",
                 "bitwise_left_shift", "bitwise_right_shift", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                 "logical_or", "logical_xor"):
        rd = b if name in ("eq", "ne", "lt", "le", "gt", "ge") or name.startswith("logical") else d
        k = Kernel(1, (d, d), 0, (L(0, d), L(1, d), B(name, 0, 1, rd)), (2,))
        fk = be.fusion_compile(k)
        assert fk is not None, name
        ref = interpret(k, be, [x, y], (), (10,))[0]
        assert_same(fk.run_path("numexpr", [x, y], (), (10,))[0], ref)
    for name in ("neg", "abs", "sign", "bitwise_not"):
        k = Kernel(1, (d,), 0, (L(0, d), U(name, 0, d)), (1,))
        ref = interpret(k, be, [x], (), (10,))[0]
        assert_same(be.fusion_compile(k).run_path("numexpr", [x], (), (10,))[0], ref)
    # floor_divide / remainder: numexpr's sign and zero-divisor rules differ (and INT_MIN // -1 traps): not fused
    for name in ("floor_divide", "remainder"):
        k = Kernel(1, (d, d), 0, (L(0, d), L(1, d), B(name, 0, 1, d)), (2,))
        assert be.fusion_compile(k) is None


FLOAT_EXACT_UNARY = ["neg", "abs", "sign", "sqrt", "rsqrt", "reciprocal", "floor", "ceil", "round", "trunc",
                     "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "logical_not"]
FLOAT_APPROX_UNARY = ["exp", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
                      "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid"]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, 1e-30, -1e30, 0.3, 0.7, 3.0, -100.0, 100.0]


@pytest.mark.parametrize("d", [f32, f64])
@pytest.mark.parametrize("name", FLOAT_EXACT_UNARY + FLOAT_APPROX_UNARY)
def test_float_unary(be, d, name):
    rd = b if name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "logical_not") else d
    k = Kernel(1, (d,), 0, (L(0, d), U(name, 0, rd)), (1,))
    fk = be.fusion_compile(k)
    x = np.array(SPECIAL, d.numpy)
    ref = interpret(k, be, [x], (), x.shape)[0]
    if fk is None:  # only where numpy measured faster and nothing else is left for numexpr
        assert name in FLOAT_APPROX_UNARY
        return
    got = fk.run_path("numexpr", [x], (), x.shape)[0]
    if name in FLOAT_EXACT_UNARY:
        assert_same(got, ref)
    else:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_allclose(got, ref, **TOL[np.dtype(d.numpy)])


@pytest.mark.parametrize("d", [f32, f64])
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum", "fmod", "copysign", "pow",
                                  "atan2", "hypot"])
def test_float_binary(be, d, name):
    k = Kernel(1, (d, d), 0, (L(0, d), L(1, d), B(name, 0, 1, d)), (2,))
    fk = be.fusion_compile(k)
    x = np.array(SPECIAL, d.numpy)
    y = np.array(SPECIAL[::-1], d.numpy)
    if name in ("pow", "atan2", "hypot"):  # libm in numexpr may differ by an ulp: numpy steps, nothing to fuse
        assert fk is None
        return
    ref = interpret(k, be, [x, y], (), x.shape)[0]
    assert_same(fk.run_path("numexpr", [x, y], (), x.shape)[0], ref)


def test_both_paths_give_identical_bits_so_repeated_calls_agree(be):
    # a transcendental between exact ops: tanh runs as a numpy step on both paths, so while the size class is
    # being measured (paths alternate) and afterwards every call gives the same bits
    d = f64
    body = (L(0, d), S(0, d), B("mul", 0, 1, d), U("tanh", 2, d), S(1, d), B("add", 3, 4, d), B("mul", 5, 0, d))
    k = Kernel(1, (d,), 2, body, (6,))
    fk = be.fusion_compile(k)
    x = np.random.default_rng(3).standard_normal(50_000)
    runs = [fk([x], [0.79, 1.0], x.shape)[0] for _ in range(8)]
    assert fk.path_for(x.size) in ("numpy", "numexpr")  # both paths were timed (3 calls each) and one chosen
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    np.testing.assert_array_equal(runs[0], interpret(k, be, [x], [0.79, 1.0], x.shape)[0])


def test_comparisons_and_where_relu_backward(be):
    d = f32
    # grad * (x > 0), as where(x > 0, grad, 0)
    body = (L(0, d), L(1, d), S(0, d), B("gt", 0, 2, b), Instr("where", (3, 1, 2), d), B("le", 0, 2, b),
            B("logical_and", 3, 5, b), U("logical_not", 6, b))
    k = Kernel(2, (d, d), 1, body, (4, 7))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(7)
    x, g = r.standard_normal((30, 20)).astype(np.float32), r.standard_normal(20).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, 0.0]
    ref = interpret(k, be, [x, g], (0.0,), (30, 20))
    for res in both_paths(fk, [x, g], (0.0,), (30, 20)):
        assert_same(res[0], ref[0])
        assert_same(res[1], ref[1])
    assert_same(ref[0], np.where(x > 0, g, np.float32(0)))


def test_where_with_scalar_branches(be):
    k = Kernel(1, (f64,), 2, (L(0, f64), S(0, f64), S(1, f64), B("ge", 0, 1, b), Instr("where", (3, 1, 2), f64)),
               (4,))
    fk = be.fusion_compile(k)
    x = np.linspace(-1, 1, 9)
    ref = interpret(k, be, [x], (0.0, -1.5), (9,))[0]
    for res in both_paths(fk, [x], (0.0, -1.5), (9,)):
        assert_same(res[0], ref)
    assert_same(ref, np.where(x >= 0, 0.0, -1.5))


@pytest.mark.parametrize("src,dst", [(b, f32), (b, i64), (i32, f64), (i32, i64), (i64, f32), (f32, f64),
                                     (f32, b), (i64, b), (f64, f32), (f32, i32), (f64, i64), (i64, i32)])
def test_casts(be, src, dst):
    vals = [0, 1, -1, 3, 2 ** 31 - 1, -(2 ** 31), 2 ** 24 + 1] if src.is_integer else [0, 1, 1, 0, 1, 0, 1]
    if src.is_floating_point:
        vals = [0.0, -0.0, 1.5, -1.5, -2.7, 1e10, 16777217.0]
    x = np.array(vals).astype(src.numpy)
    k = Kernel(1, (src,), 0, (L(0, src), Instr("cast", (0,), dst), B("add", 1, 1, dst) if dst is not b
                              else B("logical_xor", 1, 1, b)), (1, 2))
    fk = be.fusion_compile(k)
    ref = interpret(k, be, [x], (), x.shape)
    downcast = (src, dst) in ((f64, f32), (f32, i32), (f64, i64), (i64, i32))
    if downcast:  # float->int truncation, float64->float32, int64->int32: numpy steps, still exact
        assert fk is None or fk._plan.ne_ok[1] is False
    if fk is None:
        return
    for res in both_paths(fk, [x], (), x.shape):
        assert_same(res[0], ref[0])
        assert_same(res[1], ref[1])
    assert_same(ref[0], be.cast(x, dst))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 4)])
def test_zero_d_and_empty(be, shape):
    d = f32
    k = Kernel(len(shape), (d, d), 1, (L(0, d), L(1, d), S(0, d), B("mul", 0, 2, d), B("add", 3, 1, d)), (4,))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(8)
    x = r.standard_normal(shape).astype(np.float32)
    y = np.asarray(r.standard_normal(shape[-1:]).astype(np.float32))
    ref = interpret(k, be, [x, y], (2.0,), shape)[0]
    for res in both_paths(fk, [x, y], (2.0,), shape):
        assert type(res[0]) is np.ndarray
        assert_same(res[0], ref)
    for _ in range(2 * fusion.TRIALS):
        assert_same(fk([x, y], (2.0,), shape, [None])[0], ref)
    out = np.empty(shape, np.float32)
    assert fk.run_path("numexpr", [x, y], (2.0,), shape, [out])[0] is out
    assert_same(out, ref)


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_reduce_kernels_with_nan(be, op):
    # softmax piece: exp(x - m), m broadcast from a keepdim reduction, reduced over the last dim
    d = f32
    body = (L(0, d), L(1, d), B("sub", 0, 1, d), U("exp", 2, d))
    k = Kernel(2, (d, d), 0, body, (3,), reduce=(op, (1,)))
    fk = be.fusion_compile(k)
    r = np.random.default_rng(9)
    x = r.standard_normal((16, 300)).astype(np.float32)
    x[3, 7] = np.nan
    m = x.max(axis=1, keepdims=True)
    m[np.isnan(m)] = 0
    ref = interpret(k, be, [x, m], (), x.shape)[0]
    assert ref.shape == (16, 1)
    for res in both_paths(fk, [x, m], (), x.shape):
        assert res[0].shape == (16, 1)
        assert np.isnan(res[0][3, 0]) and not np.isnan(np.delete(res[0], 3)).any()
        assert_same(res[0], ref, exact=False)
    oracle = getattr(np, op)(np.exp(x - m), axis=1, keepdims=True)
    np.testing.assert_allclose(ref, oracle, rtol=1e-5)


def test_reduce_exact_ops_bitwise_and_into_out(be):
    # variance piece: sum((x - mean)^2) over dims (0, 2), keepdim; only exact ops: bit-exact with interpret
    d = f64
    k = Kernel(3, (d, d), 0, (L(0, d), L(1, d), B("sub", 0, 1, d), B("mul", 2, 2, d)), (3,), reduce=("sum", (0, 2)))
    fk = be.fusion_compile(k)
    x = np.random.default_rng(10).standard_normal((8, 5, 33))
    mean = x.mean(axis=(0, 2), keepdims=True)
    ref = interpret(k, be, [x, mean], (), x.shape)[0]
    for res in both_paths(fk, [x, mean], (), x.shape):
        assert_same(res[0], ref)
    out = np.zeros((1, 5, 1))
    assert fk.run_path("numexpr", [x, mean], (), x.shape, [out])[0] is out
    assert_same(out, ref)
    np.testing.assert_allclose(ref, ((x - mean) ** 2).sum(axis=(0, 2), keepdims=True), rtol=1e-12)


def test_reduce_of_broadcast_body(be):
    # the body has a lower rank than the iteration shape: reduced over the broadcast, as interpret does
    d = f32
    k = Kernel(2, (d,), 0, (L(0, d), B("mul", 0, 0, d)), (1,), reduce=("sum", (0,)))
    fk = be.fusion_compile(k)
    x = np.arange(4, dtype=np.float32)
    ref = interpret(k, be, [x], (), (6, 4))[0]
    for res in both_paths(fk, [x], (), (6, 4)):
        assert_same(res[0], ref)
    assert_same(ref, 6 * (x * x)[None])


def test_measured_choice_is_observable(be, monkeypatch):
    """With a fake clock (numpy: 1 us + 1 ns/element, numexpr: 10 us + 0.1 ns/element, blocked: 10 us + 1 ns) the
    kernel keeps numpy for small sizes and numexpr for large ones, per size class, and then only runs the chosen
    path."""
    fk = be.fusion_compile(gelu_kernel(f32))
    clock = [0.0]
    monkeypatch.setattr(fusion.time, "perf_counter", lambda: clock[0])
    real_np, real_ne = fk._numpy, fk._numexpr

    def fake_np(inputs, scalars, shape, outs):
        clock[0] += 1e-6 + 1e-9 * inputs[0].size
        return real_np(inputs, scalars, shape, outs)

    def fake_ne(inputs, scalars, shape, outs):
        clock[0] += 1e-5 + 1e-10 * inputs[0].size
        return real_ne(inputs, scalars, shape, outs)

    real_bl = fk._try_blocked

    def fake_bl(inputs, scalars, shape, outs):  # the blocked path (large sizes only): the slowest here
        clock[0] += 1e-5 + 1e-9 * inputs[0].size
        return real_bl(inputs, scalars, shape, outs)

    monkeypatch.setattr(fk, "_numpy", fake_np)
    monkeypatch.setattr(fk, "_numexpr", fake_ne)
    monkeypatch.setattr(fk, "_try_blocked", fake_bl)
    small, large = np.ones(100, np.float32), np.ones(1 << 17, np.float32)
    paths = []
    for _ in range(2 * fusion.TRIALS):
        fk([small], GELU_SC, small.shape, [None])
        paths.append(fk.last_path)
    assert sorted(set(paths)) == ["numexpr", "numpy"]  # both were timed
    assert fk.path_for(100) == "numpy" and fk.choices == {2 * (100).bit_length(): "numpy"}
    assert fk.path_for(1 << 17) is None  # a different size class is measured separately
    for _ in range(3 * fusion.TRIALS):
        fk([large], GELU_SC, large.shape, [None])
    assert fk.path_for(1 << 17) == "numexpr"
    fk([small], GELU_SC, small.shape, [None])
    assert fk.last_path == "numpy"
    r = fk([large], GELU_SC, large.shape, [None])
    assert fk.last_path == "numexpr"
    np.testing.assert_allclose(r[0], 0.5 * (1 + np.tanh(0.7978845608 * 1.044715)), rtol=1e-6)


def test_measured_choice_with_the_real_clock(be):
    fk = be.fusion_compile(gelu_kernel(f64))
    x = np.random.default_rng(11).standard_normal(3000)
    ref = interpret(gelu_kernel(f64), be, [x], GELU_SC, x.shape)[0]
    for _ in range(2 * fusion.TRIALS):
        assert fk.path_for(x.size) is None
        assert_same(fk([x], GELU_SC, x.shape, [None])[0], ref, exact=False)
    chosen = fk.path_for(x.size)
    assert chosen in ("numpy", "numexpr")
    fk([x], GELU_SC, x.shape, [None])
    assert fk.last_path == chosen


def test_large_shared_subexpression_dag(be):
    # x1 = x0*x0 + x0, x2 = x1*x1 + x1, ...: a tree expansion would double per level; shared values are stored
    d = f64
    body = [L(0, d)]
    for _ in range(12):
        j = len(body) - 1
        body += [B("mul", j, j, d), B("add", j + 1, j, d), U("tanh", j + 2, d)]
    k = Kernel(1, (d,), 0, tuple(body), (len(body) - 1,))
    fk = be.fusion_compile(k)
    x = np.linspace(-1, 1, 50)
    ref = interpret(k, be, [x], (), (50,))[0]
    for res in both_paths(fk, [x], (), (50,)):
        assert_same(res[0], ref, exact=False)


def test_benchmark_helper_runs():
    r = fusion.benchmark_gelu(n=10_000, repeats=2)
    assert set(r) == {"op_by_op", "fused_numexpr", "fused_numpy", "fused_auto"}
    assert all(v > 0 for v in r.values())


def test_numexpr_path_drops_each_intermediate_after_its_last_read(be):
    """The numexpr path frees values as eager op by op does: each step-made value that is not an output is dropped
    exactly once, after the last step reading it, and the results are unchanged."""
    k = gelu_kernel(f32)
    fk = be.fusion_compile(k)
    steps, drops = fk._plan.steps, fk._drops
    made = [i for _, i, _ in steps]
    dropped = [j for d in drops for j in d]
    assert sorted(dropped) == sorted(j for j in made if j not in k.outputs)
    for s, (kind_, i, payload) in enumerate(steps):
        reads = fusion.operands(k.body[i]) if kind_ == "np" else payload[1]
        for j in reads:
            if j in made:
                where = next(t for t, d in enumerate(drops) if j in d)
                assert where >= s, (j, where, s)
    x = np.random.default_rng(12).standard_normal(5000).astype(np.float32)
    assert_same(fk.run_path("numexpr", [x], GELU_SC, x.shape)[0],
                interpret(k, be, [x], GELU_SC, x.shape)[0], exact=False)
