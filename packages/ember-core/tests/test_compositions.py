"""The default compositions in ember._compositions against PyTorch, on a backend with only the primitives.

The backend below implements nothing but the contract's required primitives (with numpy) and checks that the
compositions respect the contract: operands of binary/where/matmul/cat share a dtype, handles are arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from ember import dtypes as dt  # noqa: E402
from ember.backend import Backend  # noqa: E402

_UNARY = {
    "neg": np.negative, "abs": np.abs, "sign": np.sign, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt,
    "rsqrt": lambda a: 1 / np.sqrt(a), "reciprocal": np.reciprocal, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "trunc": np.trunc, "sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "isposinf": np.isposinf,
    "isneginf": np.isneginf, "logical_not": np.logical_not, "bitwise_not": np.invert, "signbit": np.signbit,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floor_divide": np.floor_divide, "remainder": np.remainder, "fmod": np.fmod, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "fmax": np.fmax, "fmin": np.fmin, "atan2": np.arctan2,
    "copysign": np.copysign, "hypot": np.hypot, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "logical_xor": np.logical_xor, "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor, "bitwise_left_shift": np.left_shift,
    "bitwise_right_shift": np.right_shift,
}


def _arr(h):
    assert isinstance(h, np.ndarray), f"handle must be an ndarray, got {type(h)}"
    return h


def _same_dtype(*xs):
    ds = {x.dtype for x in xs if isinstance(x, np.ndarray)}
    assert len(ds) <= 1, f"mixed operand dtypes {ds}"


def _weak(a, ref):
    """numpy treats Python scalars as weak (NEP 50) except against ml_dtypes' bfloat16: cast them there."""
    if not isinstance(a, np.ndarray) and isinstance(ref, np.ndarray) and ref.dtype.name == "bfloat16":
        return np.asarray(a, dtype=ref.dtype)
    return a


class NumpyPrimitiveBackend(Backend):
    """Only the required primitives; handles are numpy arrays."""

    name = "numpy-primitives"

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self._rng = np.random.default_rng(0)
        self.calls: dict[str, int] = {}

    def _count(self, what):
        self.calls[what] = self.calls.get(what, 0) + 1

    def from_numpy(self, array):
        return np.array(array, copy=True)

    def to_numpy(self, h):
        return _arr(h)

    def full(self, shape, value, dtype):
        return np.full(tuple(shape), value, dtype=dtype.numpy)

    def arange(self, start, stop, step, dtype):
        return np.arange(start, stop, step, dtype=dtype.numpy)

    def cast(self, h, dtype):
        return _arr(h).astype(dtype.numpy)

    def copy(self, h):
        return np.array(_arr(h), copy=True, order="C")

    def assign(self, dst, src):
        np.copyto(dst, src)

    def unary(self, op, h):
        self._count(op)
        return np.asarray(_UNARY[op](_arr(h)))

    def binary(self, op, a, b):
        self._count(op)
        _same_dtype(a, b)
        ref = a if isinstance(a, np.ndarray) else b
        r = np.asarray(_BINARY[op](_weak(a, ref), _weak(b, ref)))
        if op not in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"):
            assert r.dtype == ref.dtype, (op, r.dtype, ref.dtype)
        return r

    def where(self, cond, a, b):
        assert cond.dtype == np.bool_
        _same_dtype(a, b)
        return np.asarray(np.where(cond, _weak(a, b), _weak(b, a)))

    def reduce(self, op, h, dims, keepdim):
        h = _arr(h)
        f = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
        kw = {"dtype": h.dtype} if op in ("sum", "prod") else {}
        return np.asarray(f(h, axis=tuple(dims), keepdims=keepdim, **kw))

    def argreduce(self, op, h, dim, keepdim):
        f = np.argmax if op == "argmax" else np.argmin
        return np.asarray(f(_arr(h), axis=dim, keepdims=keepdim)).astype(np.int64)

    def cumulative(self, op, h, dim):
        f = np.cumsum if op == "sum" else np.cumprod
        return f(_arr(h), axis=dim, dtype=h.dtype)

    def matmul(self, a, b):
        _same_dtype(a, b)
        return np.asarray(np.matmul(_arr(a), _arr(b)))

    def sort(self, h, dim, descending, stable):
        h = _arr(h)
        key = h
        if descending:
            key = -h if h.dtype.kind == "f" else (~h if h.dtype.kind in "iu" else ~h)
        i = np.argsort(key, axis=dim, kind="stable")
        return np.take_along_axis(h, i, axis=dim), i.astype(np.int64)

    def reshape(self, h, shape):
        return np.reshape(_arr(h), tuple(shape))

    def permute(self, h, dims):
        return np.transpose(_arr(h), tuple(dims))

    def expand(self, h, shape):
        return np.broadcast_to(_arr(h), tuple(shape))

    def getitem(self, h, key):
        for k in key:
            if isinstance(k, np.ndarray):
                assert k.dtype in (np.int64, np.bool_), k.dtype
        return np.asarray(_arr(h)[tuple(key)])

    def setitem(self, h, key, value):
        if isinstance(value, np.ndarray):
            _same_dtype(h, value)
        _arr(h)[tuple(key)] = value

    def cat(self, hs, dim):
        _same_dtype(*hs)
        return np.concatenate([_arr(h) for h in hs], axis=dim)

    def seed(self, seed):
        self._rng = np.random.default_rng(seed)

    def rand(self, shape, dtype):
        return self._rng.random(tuple(shape)).astype(dtype.numpy)

    def randn(self, shape, dtype):
        return self._rng.standard_normal(tuple(shape)).astype(dtype.numpy)


@pytest.fixture
def be():
    return NumpyPrimitiveBackend()


RNG = np.random.default_rng(1234)
FLOATS = [np.float32, np.float64]


def _tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


def _rand(shape, dtype=np.float64):
    return np.asarray(RNG.standard_normal(shape)).astype(dtype)


def _check(got, want, dtype=None):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **_tol(dtype or got.dtype))


def _t(a):
    return torch.from_numpy(np.array(a, copy=True, order="C"))


# --------------------------------------------------------------------------------------------------------
# conv / conv_transpose
# --------------------------------------------------------------------------------------------------------
CONV_CASES = [
    # nd, N, Cin, Cout, spatial, k, stride, padding, dilation, groups, bias
    (1, 2, 3, 4, (9,), (3,), (1,), (0,), (1,), 1, True),
    (1, 1, 4, 6, (11,), (3,), (2,), (2,), (2,), 2, False),
    (2, 2, 3, 5, (7, 8), (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    (2, 1, 4, 4, (9, 7), (3, 2), (2, 1), (1, 0), (1, 2), 4, True),
    (2, 2, 6, 4, (6, 6), (1, 1), (1, 1), (0, 0), (1, 1), 2, False),
    (2, 1, 2, 3, (10, 9), (4, 3), (3, 2), (2, 1), (2, 1), 1, True),
    (3, 1, 2, 4, (5, 6, 4), (2, 3, 2), (1, 2, 1), (1, 1, 0), (1, 1, 2), 2, True),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(be, case, dtype):
    nd, n, cin, cout, sp, k, s, p, d, g, bias = case
    x = _rand((n, cin) + sp, dtype)
    w = _rand((cout, cin // g) + k, dtype)
    b = _rand((cout,), dtype) if bias else None
    fn = [F.conv1d, F.conv2d, F.conv3d][nd - 1]
    want = fn(_t(x), _t(w), None if b is None else _t(b), stride=s, padding=p, dilation=d, groups=g)
    got = be.conv(x, w, b, s, tuple((pp, pp) for pp in p), d, g)
    _check(got, want)
    assert got.flags.c_contiguous


def test_conv_asymmetric_padding_and_unbatched(be):
    x = _rand((3, 8, 7))
    w = _rand((2, 3, 3, 3))
    got = be.conv(x[None], w, None, (1, 1), ((1, 2), (0, 3)), (1, 1), 1)
    want = F.conv2d(F.pad(_t(x[None]), (0, 3, 1, 2)), _t(w))
    _check(got, want)
    got_u = be.conv(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    _check(got_u, F.conv2d(_t(x), _t(w), padding=1))


CONVT_CASES = [
    # nd, N, Cin, Cout, spatial, k, stride, padding, output_padding, dilation, groups, bias
    (1, 2, 3, 4, (6,), (3,), (1,), (0,), (0,), (1,), 1, True),
    (1, 1, 4, 6, (5,), (3,), (2,), (1,), (1,), (2,), 2, False),
    (2, 2, 3, 2, (4, 5), (3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1, True),
    (2, 1, 4, 4, (3, 4), (2, 3), (3, 2), (0, 2), (2, 1), (1, 2), 2, True),
    (2, 1, 2, 3, (5, 5), (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), 1, False),
    (3, 1, 2, 4, (3, 2, 3), (2, 3, 2), (2, 1, 2), (1, 0, 1), (1, 0, 0), (1, 1, 1), 2, True),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONVT_CASES)
def test_conv_transpose(be, case, dtype):
    nd, n, cin, cout, sp, k, s, p, op, d, g, bias = case
    x = _rand((n, cin) + sp, dtype)
    w = _rand((cin, cout // g) + k, dtype)
    b = _rand((cout,), dtype) if bias else None
    fn = [F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d][nd - 1]
    want = fn(_t(x), _t(w), None if b is None else _t(b), stride=s, padding=p, output_padding=op, groups=g,
              dilation=d)
    got = be.conv_transpose(x, w, b, s, p, op, d, g)
    _check(got, want)
    assert got.flags.c_contiguous


# --------------------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------------------
POOL_CASES = [
    # spatial, k, stride, padding, dilation
    ((10,), (3,), (2,), (1,), (1,)),
    ((11,), (4,), (3,), (2,), (2,)),
    ((9, 8), (3, 3), (2, 2), (1, 1), (1, 1)),
    ((10, 7), (2, 3), (3, 2), (1, 0), (2, 1)),
    ((8, 8), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((7, 9), (3, 2), (1, 2), (1, 1), (1, 1)),
    ((6, 7, 5), (3, 2, 2), (2, 2, 1), (1, 1, 0), (1, 2, 1)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool(be, case, ceil_mode, dtype):
    sp, k, s, p, d = case
    nd = len(sp)
    x = _rand((2, 3) + sp, dtype)
    fn = [F.max_pool1d, F.max_pool2d, F.max_pool3d][nd - 1]
    want, wi = fn(_t(x), k, s, p, d, ceil_mode=ceil_mode, return_indices=True)
    got, gi = be.max_pool(x, k, s, p, d, ceil_mode, True)
    _check(got, want)
    _check(gi, wi)
    _check(be.max_pool(x, k, s, p, d, ceil_mode, False), want)


def test_max_pool_ties_inf_nan_unbatched(be):
    x = np.zeros((2, 6, 6), np.float32)
    x[0, 1, 1] = np.nan
    x[1] = -np.inf
    x[1, 2:4, 2:4] = 1.0
    want, wi = F.max_pool2d(_t(x), 3, 2, 1, ceil_mode=True, return_indices=True)
    got, gi = be.max_pool(x, (3, 3), (2, 2), (1, 1), (1, 1), True, True)
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(gi, wi.numpy())


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("divisor_override", [None, 3])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("case", POOL_CASES)
def test_avg_pool(be, case, ceil_mode, count_include_pad, divisor_override, dtype):
    sp, k, s, p, _ = case
    p = tuple(min(pp, kk // 2) for pp, kk in zip(p, k))
    nd = len(sp)
    x = _rand((2, 3) + sp, dtype)
    if nd == 1:  # avg_pool1d has no divisor_override: it is avg_pool2d over a height of 1
        want = F.avg_pool2d(_t(x)[..., None, :], (1,) + k, (1,) + s, (0,) + p, ceil_mode, count_include_pad,
                            divisor_override)[..., 0, :]
    else:
        fn = [None, F.avg_pool2d, F.avg_pool3d][nd - 1]
        want = fn(_t(x), k, s, p, ceil_mode, count_include_pad, divisor_override)
    got = be.avg_pool(x, k, s, p, ceil_mode, count_include_pad, divisor_override)
    _check(got, want)


def test_avg_pool_float16(be):
    x = _rand((1, 2, 9, 9), np.float16)
    want = F.avg_pool2d(_t(x).float(), 3, 2, 1, ceil_mode=True, count_include_pad=False)
    got = be.avg_pool(x, (3, 3), (2, 2), (1, 1), True, False, None)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.numpy(), rtol=2e-3, atol=2e-3)


ADAPTIVE_CASES = [((10,), (3,)), ((12,), (4,)), ((7,), (7,)), ((5,), (8,)), ((9, 7), (4, 3)), ((8, 8), (1, 1)),
                  ((8, 6), (2, 3)), ((6, 5, 7), (3, 2, 4)), ((13, 11), (5, 6))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", ADAPTIVE_CASES)
def test_adaptive_pools(be, case, dtype):
    sp, o = case
    nd = len(sp)
    x = _rand((2, 3) + sp, dtype)
    favg = [F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d][nd - 1]
    fmax = [F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d][nd - 1]
    _check(be.adaptive_avg_pool(x, o), favg(_t(x), o))
    want, wi = fmax(_t(x), o, return_indices=True)
    got, gi = be.adaptive_max_pool(x, o, True)
    _check(got, want)
    _check(gi, wi)
    _check(be.adaptive_max_pool(x, o, False), want)
    # unbatched input (C, *S)
    _check(be.adaptive_avg_pool(x[0], o), favg(_t(x[0]), o))


# --------------------------------------------------------------------------------------------------------
# interpolate
# --------------------------------------------------------------------------------------------------------
INTERP_CASES = [
    # mode, in spatial, size or None, scale_factor or None
    ("nearest", (7,), (13,), None), ("nearest", (8,), (16,), None), ("nearest", (9,), (4,), None),
    ("nearest", (5, 6), (11, 4), None), ("nearest", (5, 6), None, (2.5, 1.7)), ("nearest", (4, 3, 5), (7, 6, 2), None),
    ("nearest", (6, 6), None, (0.5, 1.3)),
    ("nearest-exact", (7,), (13,), None), ("nearest-exact", (9, 5), (4, 11), None),
    ("nearest-exact", (5, 6), None, (1.5, 0.6)), ("nearest-exact", (3, 4, 5), (6, 2, 7), None),
    ("linear", (7,), (13,), None), ("linear", (9,), (4,), None), ("linear", (6,), None, (2.3,)),
    ("bilinear", (5, 6), (11, 4), None), ("bilinear", (5, 6), None, (2.5, 0.7)), ("bilinear", (4, 4), (4, 4), None),
    ("bilinear", (1, 5), (3, 1), None),
    ("trilinear", (3, 4, 5), (6, 2, 7), None), ("trilinear", (3, 4, 5), None, (1.5, 2.0, 0.8)),
    ("bicubic", (5, 6), (11, 4), None), ("bicubic", (6, 7), None, (2.2, 0.6)), ("bicubic", (4, 4), (9, 9), None),
    ("area", (9, 7), (4, 3), None),
]


INTERP_PARAMS = [(c, ac) for c in INTERP_CASES
                 for ac in ((False, True) if c[0] in ("linear", "bilinear", "trilinear", "bicubic") else (False,))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case,align_corners", INTERP_PARAMS)
def test_interpolate(be, case, align_corners, dtype):
    mode, sp, size, sf = case
    x = _rand((2, 3) + sp, dtype)
    kw = {"align_corners": align_corners} if mode in ("linear", "bilinear", "trilinear", "bicubic") else {}
    if size is not None:
        want = F.interpolate(_t(x), size=size, mode=mode, **kw)
    else:
        want = F.interpolate(_t(x), scale_factor=sf, mode=mode, **kw)
    out_size = tuple(want.shape[2:])
    got = be.interpolate(x, out_size, mode, align_corners if kw else None, None if sf is None else tuple(sf))
    _check(got, want)
    assert got.flags.c_contiguous


def test_interpolate_with_known_dtype_and_float16(be):
    from ember import _compositions as C

    x = _rand((1, 2, 5, 6), np.float32)
    want = F.interpolate(_t(x), size=(9, 4), mode="bilinear", align_corners=False)
    _check(C.interpolate(be, x, (9, 4), "bilinear", False, None, dtype=dt.float32), want)
    xh = x.astype(np.float16)
    got = be.interpolate(xh, (9, 4), "bicubic", False, None)
    want = F.interpolate(_t(xh).float(), size=(9, 4), mode="bicubic", align_corners=False)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.numpy(), rtol=1e-2, atol=1e-2)


def test_interpolate_bfloat16_large(be):
    import ml_dtypes

    x = _rand((1, 2, 3, 300)).astype(ml_dtypes.bfloat16)
    xf = _t(x.astype(np.float32))
    for mode, kw in (("bilinear", {"align_corners": False}), ("bicubic", {"align_corners": True}),
                     ("nearest", {})):
        got = be.interpolate(x, (5, 517), mode, kw.get("align_corners"), None)
        assert got.dtype == x.dtype
        want = F.interpolate(xf, size=(5, 517), mode=mode, **kw).numpy()
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=3e-2, atol=3e-2)


def test_conv_transpose_unbatched(be):
    x = _rand((4, 5, 6))
    w = _rand((4, 3, 3, 2))
    _check(be.conv_transpose(x, w, None, (2, 1), (1, 0), (1, 0), (1, 1), 1),
           F.conv_transpose2d(_t(x), _t(w), stride=(2, 1), padding=(1, 0), output_padding=(1, 0)))


def test_to_like_exact(be):
    from ember import _compositions as C

    t = RNG.standard_normal(50) * 1e3
    t[3] = 0.0
    t[4] = 1e-9
    t[5] = -3.0e-6
    for dtype in (np.float32, np.float64):
        ref = np.ones(3, dtype)
        got = C._to_like(be, ref, t)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, t.astype(dtype), rtol=np.finfo(dtype).eps, atol=0)


# --------------------------------------------------------------------------------------------------------
# pad
# --------------------------------------------------------------------------------------------------------
def _torch_pad_arg(pads):
    flat = []
    for lo, hi in reversed(pads):
        flat += [lo, hi]
    return flat


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("pads", [((0, 0), (0, 0), (2, 3)), ((0, 0), (0, 0), (1, 0), (2, 2)),
                                  ((0, 0), (0, 0), (0, 1), (3, 1), (1, 2)), ((0, 0), (0, 0), (2, 2), (0, 0))])
def test_pad_modes(be, mode, pads):
    nd = len(pads)
    x = _rand((2, 3, 5, 6, 4)[:nd])
    want = F.pad(_t(x), _torch_pad_arg(pads[2:]), mode=mode, **({"value": 1.5} if mode == "constant" else {}))
    got = be.pad(x, pads, mode, 1.5)
    _check(got, want)


@pytest.mark.parametrize("mode", ["constant", "circular"])
def test_pad_negative(be, mode):
    x = _rand((2, 3, 7, 8))
    pads = ((0, 0), (0, 0), (-2, 1), (3, -1)) if mode == "constant" else ((0, 0), (0, 0), (-2, 1), (2, -1))
    want = F.pad(_t(x), _torch_pad_arg(pads[2:]), mode=mode)
    _check(be.pad(x, pads, mode, 0.0), want)
    if mode == "constant":
        only_crop = ((0, 0), (-1, 0), (0, -2), (-1, -1))
        _check(be.pad(x, only_crop, mode, 0.0), F.pad(_t(x), _torch_pad_arg(only_crop)))


@pytest.mark.parametrize("npdtype,value", [(np.int32, 7), (np.int64, -3), (np.uint8, 200), (np.bool_, True)])
def test_pad_int_bool(be, npdtype, value):
    x = (RNG.integers(0, 100, (3, 4)) > 50) if npdtype == np.bool_ else RNG.integers(0, 100, (3, 4))
    x = x.astype(npdtype)
    pads = ((1, 2), (-1, 3))
    want = F.pad(_t(x), _torch_pad_arg(pads), value=value)
    got = be.pad(x, pads, "constant", value)
    _check(got, want)
    got = be.pad(x, ((0, 0), (2, 1)), "replicate", 0)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.pad(x, ((0, 0), (2, 1)), mode="edge"))
    np.testing.assert_array_equal(be.pad(x, ((1, 1), (2, 2)), "reflect", 0), np.pad(x, ((1, 1), (2, 2)), "reflect"))


def test_pad_fewer_pairs_and_zero(be):
    x = _rand((2, 3, 4))
    _check(be.pad(x, ((1, 1),), "constant", 0.0), F.pad(_t(x), (1, 1)))
    got = be.pad(x, ((0, 0), (0, 0), (0, 0)), "reflect", 0)
    np.testing.assert_array_equal(got, x)
    assert not np.shares_memory(got, x)


# --------------------------------------------------------------------------------------------------------
# scatter
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("reduce", ["add", "multiply"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_scatter_reduce_duplicates(be, dim, reduce, dtype):
    shape = (4, 5, 6)
    ishape = [3, 4, 5]
    ishape[dim] = 9  # more entries than targets: duplicates guaranteed
    h = RNG.integers(-3, 4, shape).astype(dtype) if dtype in (np.int64, np.int32) else _rand(shape, dtype)
    idx = RNG.integers(0, shape[dim], ishape).astype(np.int64)
    srcshape = list(ishape)
    srcshape = [s + 1 for s in srcshape]
    src = (RNG.integers(-2, 3, srcshape).astype(dtype) if dtype in (np.int64, np.int32)
           else (RNG.uniform(0.5, 1.5, srcshape) if reduce == "multiply" else _rand(srcshape)).astype(dtype))
    want = torch.scatter_reduce(_t(h), dim, _t(idx), _t(src)[tuple(slice(0, n) for n in ishape)],
                                {"add": "sum", "multiply": "prod"}[reduce])
    got = be.scatter(h, dim, idx, src, reduce)
    _check(got, want)
    assert not np.shares_memory(got, h)
    # scalar source
    want = torch.scatter(_t(h), dim, _t(idx), 2, reduce=reduce)
    _check(be.scatter(h, dim, idx, 2, reduce), want)


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_replace(be, dim):
    h = _rand((5, 6))
    # unique targets per column/row so the result is fully specified
    if dim == 0:
        idx = np.stack([RNG.permutation(5)[:3] for _ in range(4)], axis=1).astype(np.int64)
    else:
        idx = np.stack([RNG.permutation(6)[:4] for _ in range(3)], axis=0).astype(np.int64)
    src = _rand((5, 6))
    _check(be.scatter(h, dim, idx, src, None), torch.scatter(_t(h), dim, _t(idx), _t(src)))
    _check(be.scatter(h, dim, idx, -1.25, None), torch.scatter(_t(h), dim, _t(idx), -1.25))
    # duplicates: some written value wins
    idx = np.zeros((2, 6), np.int64)
    got = be.scatter(h, 0, idx, src, None)
    assert all(got[0, j] in (src[0, j], src[1, j]) for j in range(6))
    np.testing.assert_array_equal(got[1:], h[1:])


def test_scatter_add_one_entry_and_long_runs(be):
    h = np.zeros((3, 1), np.float64)
    idx = np.zeros((100, 1), np.int64)
    src = _rand((100, 1))
    _check(be.scatter(h, 0, idx, src, "add"), torch.scatter_add(_t(h), 0, _t(idx), _t(src)))
    idx1 = np.array([[2], [0]], np.int64)
    _check(be.scatter(h, 0, idx1[:1], src, "add"), torch.scatter_add(_t(h), 0, _t(idx1[:1]), _t(src[:1])))


# --------------------------------------------------------------------------------------------------------
# einsum
# --------------------------------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,j", [(3,), (4,)]),
    ("i,i->", [(5,), (5,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("...ij,...jk->...ik", [(3, 4, 5), (2, 1, 5, 2)]),
    ("...ij,jk", [(2, 3, 4), (4, 5)]),
    ("i...->...", [(3, 2, 4)]),
    ("...i,...i->...", [(2, 3, 4), (3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
    ("iji->j", [(3, 4, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ab,cd,bc->ad", [(2, 3), (4, 5), (3, 4)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("ij,kj->ikj", [(3, 4), (2, 4)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("i,i,i->i", [(4,), (4,), (4,)]),
    ("BaC,aC->Ba", [(2, 3, 4), (3, 4)]),
    ("i,->i", [(3,), ()]),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum(be, case, dtype):
    eq, shapes = case
    ops = [_rand(s, dtype) for s in shapes]
    want = torch.einsum(eq, *[_t(o) for o in ops])
    got = be.einsum(eq, *ops)
    _check(got, want)
    assert all(not np.shares_memory(got, o) for o in ops)


def test_einsum_int(be):
    a = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    b = RNG.integers(-5, 5, (4, 2)).astype(np.int64)
    _check(be.einsum("ij,jk->ik", a, b), torch.einsum("ij,jk->ik", _t(a), _t(b)))
    _check(be.einsum("ii->", a[:3, :3]), torch.einsum("ii->", _t(a[:3, :3])))
