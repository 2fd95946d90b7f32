"""Tests of the explicit-vector fused kernels of ember_opencl.fusion (CPU drivers: float32 bodies and bool masks).

Every op with a vector form runs in a hand-built kernel over special values (NaN, +-inf, +-0, tiny and huge
numbers) in the layouts the vector template handles: contiguous (whole vectors and a scalar remainder), rows with
inputs broadcast along the inner dim, rows shorter than a vector, and several outputs. Results are compared with
:func:`ember.ir.interpret` (the ops one by one on the same backend): bit for bit, except where the body calls a
transcendental builtin, whose vector overload may round differently from the scalar one (within an ulp).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")

import ember  # noqa: E402
from ember import dtypes as dt  # noqa: E402
from ember.ir import Instr, Kernel, interpret  # noqa: E402
from ember_opencl import array as arr  # noqa: E402
from ember_opencl import fusion  # noqa: E402
from ember_opencl.backend import OpenCLBackend  # noqa: E402
from ember_opencl.compiler import ProgramCache  # noqa: E402
from ember_opencl.runtime import device_count  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

F32, BOOL, I32 = dt.float32, dt.bool_, dt.int32
TRANSCENDENTAL = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
                  "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "sigmoid", "pow",
                  "atan2", "hypot", "rsqrt"}
UNARY_F = ["neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "asin", "acos",
           "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "floor", "ceil", "trunc",
           "round", "reciprocal", "sigmoid", "sign"]
PREDICATES = ["isnan", "isinf", "isfinite", "signbit", "isposinf", "isneginf", "logical_not"]
BINARY_F = ["add", "sub", "mul", "div", "maximum", "minimum", "fmax", "fmin", "atan2", "copysign", "hypot", "pow"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
MASK_BINARY = ["logical_and", "logical_or", "logical_xor", "eq", "ne"]


@pytest.fixture(scope="module")
def be() -> OpenCLBackend:
    s = ember.Device.opencl(0).base.stack
    while not isinstance(s, OpenCLBackend):
        s = s.inner
    if not s.rt.is_cpu:
        pytest.skip("explicit vectors are the CPU drivers' layout")
    return s


class K:
    def __init__(self) -> None:
        self.body: list[Instr] = []

    def add(self, op: str, args: tuple, dtype: dt.DType) -> int:
        self.body.append(Instr(op, args, dtype))
        return len(self.body) - 1

    def kernel(self, rank: int, inputs: tuple, scalars: int, outputs: tuple) -> Kernel:
        return Kernel(rank, tuple(inputs), scalars, tuple(self.body), tuple(outputs), None)


def special(n: int, seed: int) -> np.ndarray:
    """n float32 values: normal ones and every special value, shuffled across vector lanes and remainders."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-38, 3e38, -88.5, 0.55, -0.549, 1.0, -1.0, 0.5],
                  np.float32)
    idx = rng.choice(n, size=min(n, 3 * len(sp)), replace=False)
    x[idx] = np.resize(sp, len(idx))
    return x


def compare(be, kern: Kernel, inputs, scalars, shape, exact, what: str) -> list[np.ndarray]:
    """Run ``kern`` fused (it must take the vector form) and interpreted; ``exact`` (one flag, or one per output)
    says whether an output must match bit for bit or within an ulp or so."""
    fn = fusion.compile_kernel(be, kern)
    assert fn is not None and fn.vec is not None, what
    got = [be.to_numpy(h) for h in fn(inputs, scalars, shape, [None] * len(kern.outputs))]
    ref = [be.to_numpy(h) for h in interpret(kern, be, inputs, scalars, shape)]
    flags = exact if isinstance(exact, list) else [exact] * len(got)
    for j, (g, r, ex) in enumerate(zip(got, ref, flags)):
        msg = f"{what}: output {j}"
        assert g.shape == r.shape and g.dtype == r.dtype, msg
        if g.dtype == np.bool_:
            np.testing.assert_array_equal(g.view(np.uint8), r.view(np.uint8), err_msg=msg)
        elif ex:
            np.testing.assert_array_equal(g, r, err_msg=msg)
            np.testing.assert_array_equal(np.signbit(g), np.signbit(r), err_msg=msg)  # signed zeros too
        else:
            np.testing.assert_array_equal(np.isnan(g), np.isnan(r), err_msg=msg)
            ok = np.isfinite(r)
            inf = ~ok & ~np.isnan(r)
            np.testing.assert_array_equal(g[inf], r[inf], err_msg=msg)
            np.testing.assert_allclose(g[ok], r[ok], rtol=4e-7, atol=1e-37, err_msg=msg)
    return got


# (linear: whole vectors and a remainder; rows: an input broadcast along the rows and across the outer dim; short
# rows: rows shorter than a vector, all remainder; one: a single element)
SHAPES = {"linear": ((1000 + 7,), ()), "one": ((1,), ()), "rows": ((3, 5, 37), (5, 1)), "short-rows": ((7, 10), (7, 1))}


@pytest.mark.parametrize("layout", ["linear", "short-rows"])
def test_unary(be, layout: str) -> None:
    """The unary ops with a vector form, as the outputs of one kernel."""
    shape, _ = SHAPES[layout]
    x = special(int(np.prod(shape)), 1).reshape(shape)
    k = K()
    a = k.add("load", (0,), F32)
    # every op once (linear: vectors and a remainder); the row walk, which does not depend on the op, with a few
    ops = UNARY_F + PREDICATES if layout == "linear" else ["neg", "exp", "tanh", "sigmoid", "sign", "isnan",
                                                           "logical_not"]
    outs = tuple(k.add("unary", (op, a), BOOL if op in PREDICATES else F32) for op in ops)
    compare(be, k.kernel(len(shape), (F32,), 0, outs), [be.from_numpy(x)], [], shape,
            [op not in TRANSCENDENTAL for op in ops], f"{layout} {ops}")


@pytest.mark.parametrize("layout", ["one", "rows", "short-rows"])
def test_binary_with_broadcast_and_scalar(be, layout: str) -> None:
    """op(x, y) with y broadcast along the rows' inner dim (a per-row value), and op(scalar, x), every binary op
    with a vector form (all of them on "rows"), as the outputs of one kernel."""
    shape, yshape = SHAPES[layout]
    x = special(int(np.prod(shape)), 2).reshape(shape)
    y = special(int(np.prod(yshape)) if yshape else int(np.prod(shape)), 3).reshape(yshape or shape)
    k = K()
    a, b, s = k.add("load", (0,), F32), k.add("load", (1,), F32), k.add("scalar", (0,), F32)
    ops = BINARY_F + COMPARE if layout == "rows" else ["add", "div", "maximum", "pow", "lt"]
    outs: list[int] = []
    for op in ops:
        out_dtype = BOOL if op in COMPARE else F32
        outs += [k.add("binary", (op, a, b), out_dtype), k.add("binary", (op, s, a), out_dtype)]
    kern = k.kernel(len(shape), (F32, F32), 1, tuple(outs))
    exact = [op not in TRANSCENDENTAL for op in ops for _ in range(2)]
    for sv in (1.5, float("nan"), -0.0):
        compare(be, kern, [be.from_numpy(x), be.from_numpy(y)], [sv], shape, exact, f"{layout} s={sv} {ops}")


@pytest.mark.parametrize("layout", ["linear", "short-rows"])
def test_masks_where_and_casts(be, layout: str) -> None:
    """bool inputs, outputs and scalars; mask logic; where on floats and on masks; casts both ways (the ReLU
    backward shape: where(x <= 0, 0, g), and its saved mask)."""
    shape, yshape = SHAPES[layout]
    n = int(np.prod(shape))
    x, g = special(n, 4).reshape(shape), special(n, 5).reshape(shape)
    m = (np.random.default_rng(6).random(yshape or shape) < 0.5)
    k = K()
    a, gg, mb = k.add("load", (0,), F32), k.add("load", (1,), F32), k.add("load", (2,), BOOL)
    zero, flag = k.add("scalar", (0,), F32), k.add("scalar", (1,), BOOL)
    le = k.add("binary", ("le", a, zero), BOOL)
    relu_bw = k.add("where", (le, zero, gg), F32)
    mix = k.add("binary", ("logical_xor", k.add("binary", ("logical_and", le, mb), BOOL), flag), BOOL)
    notm = k.add("unary", ("logical_not", mix), BOOL)
    pick = k.add("where", (notm, mb, le), BOOL)
    as_f = k.add("cast", (pick,), F32)
    back = k.add("cast", (k.add("binary", ("mul", as_f, a), F32),), BOOL)
    kern = k.kernel(len(shape), (F32, F32, BOOL), 2, (relu_bw, le, mix, pick, as_f, back))
    ins = [be.from_numpy(x), be.from_numpy(g), be.from_numpy(m)]
    for sv in (True, False):
        got = compare(be, kern, ins, [0.0, sv], shape, True, f"{layout} flag={sv}")
        np.testing.assert_array_equal(got[0], np.where(x <= 0, np.float32(0), g))
        np.testing.assert_array_equal(got[1], x <= 0)


def test_vector_layout_is_chosen_and_scalar_kept_elsewhere(be) -> None:
    k = K()
    y = k.add("unary", ("tanh", k.add("load", (0,), F32)), F32)
    fn = fusion.compile_kernel(be, k.kernel(2, (F32,), 0, (y,)))
    w = fusion.vec_width(be.rt)
    x = be.from_numpy(np.ones((4, 64), np.float32))
    fn([x], [], (4, 64), [None])
    fn([arr.permute(be.from_numpy(np.ones((64, 4), np.float32)), (1, 0))], [], (4, 64), [None])  # inner stride 4
    layouts = {key[0] if isinstance(key[0], str) else key[0][0] for key in fn.sources}
    assert layouts == {"vec", "chunked"}
    vec_src = next(src for key, src in fn.sources.items() if isinstance(key[0], tuple))
    assert f"vload{w}" in vec_src and "ember_tanh_v(" in vec_src and "ember_tanh_float(" in vec_src
    # int32 bodies have no vector form, nor sin/cos/tan (PoCL's vector overloads mishandle subnormals)
    ks = K()
    ys = ks.add("unary", ("sin", ks.add("load", (0,), F32)), F32)
    assert fusion.compile_kernel(be, ks.kernel(1, (F32,), 0, (ys,))).vec is None
    ki = K()
    yi = ki.add("binary", ("add", ki.add("load", (0,), I32), ki.add("load", (0,), I32)), I32)
    assert fusion.compile_kernel(be, ki.kernel(1, (I32,), 0, (yi,))).vec is None
    # the source depends on structure only: equal kernels give equal programs, scalars are never baked in
    k2 = K()
    y2 = k2.add("unary", ("tanh", k2.add("load", (0,), F32)), F32)
    fn2 = fusion.compile_kernel(be, k2.kernel(2, (F32,), 0, (y2,)))
    fn2([x], [], (4, 64), [None])
    assert fn2.source(("vec", (1,)), 0) == fn.source(("vec", (1,)), 0)


def test_in_place_outputs(be) -> None:
    """An output that is an input (the same view) takes the vector loop; one overlapping an input at another
    offset takes the scalar loop (element order as before)."""
    k = K()
    a, b = k.add("load", (0,), F32), k.add("load", (1,), F32)
    y = k.add("binary", ("add", k.add("binary", ("mul", a, k.add("scalar", (0,), F32)), F32), b), F32)
    fn = fusion.compile_kernel(be, k.kernel(1, (F32, F32), 1, (y,)))
    rng = np.random.default_rng(7)
    av, bv = rng.standard_normal(1003).astype(np.float32), rng.standard_normal(1003).astype(np.float32)
    ha, hb = be.from_numpy(av), be.from_numpy(bv)
    (res,) = fn([ha, hb], [0.5], (1003,), [ha])
    assert res is ha
    np.testing.assert_array_equal(be.to_numpy(ha), av * np.float32(0.5) + bv)
    assert not fusion._overlaps([ha], [ha, hb])
    big = be.from_numpy(np.arange(20, dtype=np.float32))
    lo, hi = arr.basic_index(big, (slice(0, 10),)), arr.basic_index(big, (slice(1, 11),))
    assert fusion._overlaps([lo], [hi, be.from_numpy(np.zeros(10, np.float32))])
    remembered = dict(fn._layouts)
    far = arr.basic_index(big, (slice(10, 20),))
    fn([far, be.from_numpy(np.zeros(10, np.float32))], [1.0], (10,), [lo])  # same block, disjoint: scalar loop
    assert fn._layouts == remembered  # the scalar layout of an overlapping call is never memoised
    np.testing.assert_array_equal(be.to_numpy(big), np.r_[np.arange(10, 20), np.arange(10, 20)].astype(np.float32))


def test_vector_program_cached_on_disk(be, tmp_path: pathlib.Path) -> None:
    k = K()
    y = k.add("unary", ("sigmoid", k.add("load", (0,), F32)), F32)
    fn = fusion.compile_kernel(be, k.kernel(1, (F32,), 0, (y,)))
    src = fn.source(("vec", (1,)), 0)
    first = ProgramCache(be.rt.ctx, be.rt.device, cache_dir=tmp_path)
    first.kernel(src, "ember_fused", be.rt.build_options)
    assert first.stats["compiled"] == 1
    second = ProgramCache(be.rt.ctx, be.rt.device, cache_dir=tmp_path)
    second.kernel(src, "ember_fused", be.rt.build_options)
    assert second.stats["disk_hits"] == 1 and second.stats["compiled"] == 0


# -- fused sums ---------------------------------------------------------------------------------------------------
def sq_dev_kernel(rank: int, dims: tuple[int, ...]) -> Kernel:
    """sum over dims of (x - m)^2 * s: the batch-norm variance numerator (m broadcast from a keepdim tensor)."""
    k = K()
    d = k.add("binary", ("sub", k.add("load", (0,), F32), k.add("load", (1,), F32)), F32)
    y = k.add("binary", ("mul", k.add("binary", ("mul", d, d), F32), k.add("scalar", (0,), F32)), F32)
    return Kernel(rank, (F32, F32), 1, tuple(k.body), (y,), ("sum", dims))


@pytest.mark.parametrize("shape,dims", [((16, 6, 9, 11), (0, 2, 3)), ((3, 40_000), (1,)), ((5, 3), (1,)),
                                        ((7, 300), (0, 1)), ((64, 24), (0,))],
                         ids=["per-channel", "few-long-rows", "short-rows", "all", "outer"])
def test_fused_sum(be, shape: tuple[int, ...], dims: tuple[int, ...]) -> None:
    """Vector lanes (inner reduced stride 0 or 1), scalar pieces (short rows, a strided reduced dim), chunked rows
    (partials and a second pass): all within float32 rounding of float64, and of the interpreted reduction."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    m = x.mean(axis=dims, keepdims=True).astype(np.float32)
    kern = sq_dev_kernel(len(shape), dims)
    fn = fusion.compile_kernel(be, kern)
    assert fn.vec is not None
    hx, hm = be.from_numpy(x), be.from_numpy(m)
    (got,) = [be.to_numpy(h) for h in fn([hx, hm], [0.5], shape, [None])]
    (ref,) = [be.to_numpy(h) for h in interpret(kern, be, [hx, hm], [0.5], shape)]
    exact = ((x.astype(np.float64) - m) ** 2 * 0.5).sum(axis=dims, keepdims=True)
    assert got.shape == exact.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, exact, rtol=2e-6)
    np.testing.assert_allclose(got, ref, rtol=2e-6)
    if shape == (16, 6, 9, 11):  # the vector form was taken
        assert any(f"vload{fusion.vec_width(be.rt)}" in src for src in fn.sources.values())


def test_fused_sum_special_values_and_strided_dims(be) -> None:
    """inf, -inf and NaN in some rows (a non-finite partial stays what plain summation gives), and a reduction over
    three dims of a transposed view (three collapsed reduced dims, coordinates carried from piece to piece)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 200)).astype(np.float32)
    x[1, 7], x[2, 150], x[3, 3], x[3, 190], x[4, 50] = np.inf, np.nan, np.inf, -np.inf, -np.inf
    k = K()
    y = k.add("unary", ("abs", k.add("load", (0,), F32)), F32)
    kern = Kernel(2, (F32,), 0, tuple(k.body), (y,), ("sum", (1,)))
    (got,) = fusion.compile_kernel(be, kern)([be.from_numpy(x)], [], x.shape, [None])
    want = np.abs(x.astype(np.float64)).sum(1, keepdims=True)
    np.testing.assert_allclose(be.to_numpy(got), want, rtol=2e-6)  # rows 1, 3, 4: inf; row 2: NaN (equal_nan)
    x4 = rng.standard_normal((4, 5, 6, 7)).astype(np.float32)
    h = arr.permute(be.from_numpy(np.ascontiguousarray(x4.transpose(3, 1, 2, 0))), (3, 1, 2, 0))  # dims scrambled
    k2 = K()
    y2 = k2.add("binary", ("mul", k2.add("load", (0,), F32), k2.add("load", (0,), F32)), F32)
    kern2 = Kernel(4, (F32,), 0, tuple(k2.body), (y2,), ("sum", (0, 2, 3)))
    (got2,) = fusion.compile_kernel(be, kern2)([h], [], x4.shape, [None])
    np.testing.assert_allclose(be.to_numpy(got2), (x4.astype(np.float64) ** 2).sum((0, 2, 3), keepdims=True),
                               rtol=2e-6)


def test_fused_sum_of_masked_values(be) -> None:
    """A float32 sum whose body reads a bool input (contiguous and broadcast) and a bool scalar: the lanes of the
    masks are -1/0 ints, not floats (binary cross-entropy's masked terms)."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((6, 70)).astype(np.float32)
    keep = rng.random((6, 70)) < 0.5
    row = rng.random((6, 1)) < 0.5
    k = K()
    a, m, r = k.add("load", (0,), F32), k.add("load", (1,), BOOL), k.add("load", (2,), BOOL)
    flag, zero = k.add("scalar", (0,), BOOL), k.add("scalar", (1,), F32)
    both = k.add("binary", ("logical_xor", k.add("binary", ("logical_and", m, r), BOOL), flag), BOOL)
    y = k.add("where", (both, a, zero), F32)
    kern = Kernel(2, (F32, BOOL, BOOL), 2, tuple(k.body), (y,), ("sum", (1,)))
    fn = fusion.compile_kernel(be, kern)
    assert fn.vec is not None
    ins = [be.from_numpy(x), be.from_numpy(keep), be.from_numpy(row)]
    for flag_value in (False, True):
        (got,) = fn(ins, [flag_value, 0.0], x.shape, [None])
        sel = (keep & row) ^ flag_value
        np.testing.assert_allclose(be.to_numpy(got), np.where(sel, x.astype(np.float64), 0).sum(1, keepdims=True),
                                   rtol=2e-6, atol=1e-6)
    assert any(f"vload{fusion.vec_width(be.rt)}" in src for src in fn.sources.values())
