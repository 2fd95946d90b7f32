"""Tests of ember_opencl.pooling: max/avg/adaptive pooling and interpolate against torch.nn.functional.

The conformance kit covers the common cases; these add what it does not: dilation with padding and ceil_mode
together, NaN and tie rules of the indices, divisor_override with count_include_pad, every interpolate mode with
and without align_corners and scale factors in float64 (tight tolerance), float16/bfloat16, non-contiguous and
broadcast inputs, batch layouts that do not merge, outputs larger than one grid (grid-stride loop), integer
dtypes at the backend level and bad arguments. Runs on any OpenCL device (PoCL in CI); skips without one.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.errors import DeviceError, ShapeError, UnsupportedError
from ember.nn import functional as F
from ember.testing import noncontiguous

pytest.importorskip("pyopencl")
torch = pytest.importorskip("torch")
TF = torch.nn.functional

from ember_opencl import array as arr  # noqa: E402
from ember_opencl import pooling  # noqa: E402
from ember_opencl.runtime import runtime  # noqa: E402


@pytest.fixture(scope="module")
def dev() -> ember.Device:
    try:
        d = ember.Device.opencl(0)
    except DeviceError as exc:
        pytest.skip(f"no OpenCL device: {exc}")
    return d


@pytest.fixture(scope="module")
def rt(dev: ember.Device):
    return runtime(0)


def _need64(rt) -> None:
    if not rt.fp64:
        pytest.skip("device without float64")


def rand(shape: tuple[int, ...], dtype=np.float32, seed: int = 0, nans: int = 0, ties: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if ties:
        a = np.round(a * 2) / 2
    if nans:
        a.reshape(-1)[rng.integers(0, a.size, nans)] = np.nan
    return a.astype(dtype)


def T(a: np.ndarray):  # noqa: N802
    return torch.from_numpy(np.ascontiguousarray(a))


def same(got, ref, rtol: float = 0.0, atol: float = 0.0) -> None:
    g = got.numpy() if hasattr(got, "numpy") else got
    r = ref.detach().numpy()
    assert g.shape == r.shape, (g.shape, r.shape)
    assert g.dtype == r.dtype, (g.dtype, r.dtype)
    np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, equal_nan=True)


TOL = {np.float32: dict(rtol=2e-6, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}


# -- max pooling ---------------------------------------------------------------------------------------------------
MAX_CASES = [
    # nd, shape, kernel, stride, padding, dilation, ceil_mode
    (1, (2, 3, 13), 3, 2, 1, 2, True),
    (1, (2, 3, 11), 4, 3, 2, 1, True),
    (1, (1, 2, 9), 2, 1, 0, 3, False),
    (2, (2, 3, 11, 9), (3, 2), (2, 3), (1, 1), (2, 1), True),
    (2, (2, 2, 10, 7), 3, 2, 1, 1, True),
    (2, (1, 3, 8, 8), (2, 3), 1, (1, 0), (3, 2), False),
    (3, (1, 2, 7, 6, 9), (2, 3, 2), (2, 1, 3), (1, 1, 0), (1, 2, 1), True),
    (3, (2, 1, 5, 5, 5), 3, 2, 1, 2, False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", MAX_CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(MAX_CASES)])
def test_max_pool_matches_torch(dev, rt, case, dtype):
    if dtype is np.float64:
        _need64(rt)
    nd, shape, k, s, p, d, cm = case
    fe, ft = getattr(F, f"max_pool{nd}d"), getattr(TF, f"max_pool{nd}d")
    for x in (rand(shape, dtype, nans=3), rand(shape, dtype, 1, ties=True)):
        ref, ridx = ft(T(x), k, s, p, d, ceil_mode=cm, return_indices=True)
        for layout in (ember.tensor(x, device=dev), noncontiguous(x, dev)):
            out, idx = fe(layout, k, s, p, d, ceil_mode=cm, return_indices=True)
            same(out, ref)
            same(idx, ridx)
        # unbatched (C, *spatial), without indices
        same(fe(ember.tensor(x[0], device=dev), k, s, p, d, ceil_mode=cm), ft(T(x[0]), k, s, p, d, ceil_mode=cm))


def test_max_pool_nan_and_tie_rules(dev):
    # torch: the first maximum wins a tie, the last NaN wins over everything, -inf windows keep the first index
    x = np.array([[[[1.0, 1.0, np.nan, 2.0], [np.nan, 0.0, 2.0, 2.0], [-np.inf, -np.inf, 3.0, np.nan],
                    [-np.inf, -np.inf, np.nan, 3.0]]]], np.float32)
    for k, s in ((2, 2), (2, 1), (3, 1)):
        ref, ridx = TF.max_pool2d(T(x), k, s, return_indices=True)
        out, idx = F.max_pool2d(ember.tensor(x, device=dev), k, s, return_indices=True)
        same(out, ref)
        same(idx, ridx)
    assert F.max_pool2d(ember.tensor(x, device=dev), 2, return_indices=True)[1].numpy()[0, 0, 1, 0] == 8


@pytest.mark.parametrize("edt,tdt", [(ember.float16, torch.float16), (ember.bfloat16, torch.bfloat16)])
def test_max_pool_half_types_are_exact(dev, edt, tdt):
    x = rand((2, 3, 9, 11), np.float32, 2, nans=2)
    xt = T(x).to(tdt)
    ref, ridx = TF.max_pool2d(xt, 3, 2, 1, ceil_mode=True, return_indices=True)
    out, idx = F.max_pool2d(ember.tensor(x, device=dev).to(edt), 3, 2, 1, ceil_mode=True, return_indices=True)
    assert out.dtype is edt
    same(out.to(ember.float32), ref.float())
    same(idx, ridx)


# -- average pooling -----------------------------------------------------------------------------------------------
AVG_CASES = [
    (1, (2, 3, 13), 3, 2, 1, True),
    (1, (2, 3, 10), 4, 3, 2, False),
    (2, (2, 3, 11, 9), (3, 2), (2, 3), (1, 1), True),
    (2, (1, 2, 7, 8), 5, 2, 2, True),
    (2, (2, 2, 6, 6), 2, 1, 0, False),
    (3, (1, 2, 7, 6, 9), (2, 3, 2), (2, 1, 3), (1, 1, 0), True),
    (3, (2, 1, 5, 5, 5), 3, 2, 1, False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", AVG_CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(AVG_CASES)])
def test_avg_pool_matches_torch(dev, rt, case, dtype):
    if dtype is np.float64:
        _need64(rt)
    nd, shape, k, s, p, cm = case
    x = rand(shape, dtype, 3)
    fe, ft = getattr(F, f"avg_pool{nd}d"), getattr(TF, f"avg_pool{nd}d")
    for cip in (True, False):
        ref = ft(T(x), k, s, p, ceil_mode=cm, count_include_pad=cip)
        same(fe(noncontiguous(x, dev), k, s, p, ceil_mode=cm, count_include_pad=cip), ref, **TOL[dtype])
        same(fe(ember.tensor(x[0], device=dev), k, s, p, cm, cip), ft(T(x[0]), k, s, p, cm, cip), **TOL[dtype])
        if nd > 1:
            for div in (1, 3, 7):
                same(fe(ember.tensor(x, device=dev), k, s, p, cm, cip, div), ft(T(x), k, s, p, cm, cip, div),
                     **TOL[dtype])


def test_avg_pool_float16(dev):
    x = rand((2, 3, 9, 10), np.float32, 4).astype(np.float16)
    ref = TF.avg_pool2d(T(x).float(), 3, 2, 1, ceil_mode=True, count_include_pad=False).half()
    out = F.avg_pool2d(ember.tensor(x, device=dev), 3, 2, 1, ceil_mode=True, count_include_pad=False)
    same(out, ref, rtol=1e-3, atol=1e-3)


# -- adaptive pooling ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nd,shape,out", [
    (1, (2, 3, 10), (4,)), (1, (2, 3, 5), (8,)), (1, (1, 2, 7), (7,)),
    (2, (2, 3, 9, 7), (4, 3)), (2, (2, 3, 5, 6), (7, 11)), (2, (3, 8, 8), (3, 3)),
    (3, (1, 2, 5, 6, 7), (2, 3, 4)), (3, (1, 1, 3, 4, 5), (5, 2, 8)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adaptive_pools_match_torch(dev, rt, nd, shape, out, dtype):
    if dtype is np.float64:
        _need64(rt)
    x = rand(shape, dtype, 5)
    xn = rand(shape, dtype, 6, nans=2, ties=True)
    same(getattr(F, f"adaptive_avg_pool{nd}d")(noncontiguous(x, dev), out),
         getattr(TF, f"adaptive_avg_pool{nd}d")(T(x), out), **TOL[dtype])
    for a in (x, xn):
        v, i = getattr(F, f"adaptive_max_pool{nd}d")(noncontiguous(a, dev), out, return_indices=True)
        rv, ri = getattr(TF, f"adaptive_max_pool{nd}d")(T(a), out, return_indices=True)
        same(v, rv)
        same(i, ri)


# -- interpolate ---------------------------------------------------------------------------------------------------
def _interp_cases() -> list[tuple[tuple[int, ...], str, bool | None, dict]]:
    cases = []
    linear = {1: "linear", 2: "bilinear", 3: "trilinear"}
    shapes = {1: (2, 3, 7), 2: (2, 3, 5, 6), 3: (1, 2, 3, 4, 5)}
    for nd, shape in shapes.items():
        sizes = [dict(size=tuple(n + 4 for n in shape[2:])), dict(size=tuple(max(1, n - 2) for n in shape[2:])),
                 dict(size=tuple(2 * n for n in shape[2:])), dict(size=shape[2:])]
        scales = [dict(scale_factor=1.7), dict(scale_factor=0.6), dict(scale_factor=2.0), dict(scale_factor=1.1),
                  dict(scale_factor=1.5, recompute_scale_factor=True)]
        modes = ["nearest", "nearest-exact", linear[nd]] + (["bicubic", "area"] if nd == 2 else [])
        for mode, kw in itertools.product(modes, sizes + scales):
            if mode == "area" and "scale_factor" in kw:
                continue
            for ac in ((False, True) if mode in linear.values() or mode == "bicubic" else (None,)):
                cases.append((shape, mode, ac, kw))
    return cases


INTERP = _interp_cases()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,mode,ac,kw", INTERP, ids=[f"{c[1]}-{c[2]}-{c[3]}" for c in INTERP])
def test_interpolate_matches_torch(dev, rt, shape, mode, ac, kw, dtype):
    if dtype is np.float64:
        _need64(rt)
    x = rand(shape, dtype, 7)
    ref = TF.interpolate(T(x), mode=mode, align_corners=ac, **kw)
    same(F.interpolate(noncontiguous(x, dev), mode=mode, align_corners=ac, **kw), ref, **TOL[dtype])


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic", "area"])
@pytest.mark.parametrize("edt,tdt,tol", [(ember.float16, torch.float16, 2e-3),
                                         (ember.bfloat16, torch.bfloat16, 1.6e-2)])
def test_interpolate_half_types(dev, mode, edt, tdt, tol):
    x = T(rand((2, 3, 6, 7), np.float32, 8)).to(tdt)
    kw = dict(size=(11, 4)) if mode == "area" else dict(scale_factor=(1.7, 0.8))
    ac = True if mode == "bicubic" else None
    ref = TF.interpolate(x.float(), mode=mode, align_corners=ac, **kw)  # computed in float, rounded once
    out = F.interpolate(ember.tensor(x.float().numpy(), device=dev).to(edt), mode=mode, align_corners=ac, **kw)
    assert out.dtype is edt
    same(out.to(ember.float32), ref, rtol=tol, atol=tol)


def test_interpolate_nearest_integer_dtypes(dev):
    x = np.random.default_rng(9).integers(-120, 120, (2, 3, 5, 6))
    for npdt in (np.uint8, np.int8, np.int32, np.int64):
        a = x.astype(npdt)
        ref = TF.interpolate(T(a.astype(np.float64)), scale_factor=(1.7, 2.0), mode="nearest").numpy().astype(npdt)
        out = F.interpolate(ember.tensor(a, device=dev), scale_factor=(1.7, 2.0), mode="nearest").numpy()
        assert out.dtype == npdt
        np.testing.assert_array_equal(out, ref)


# -- sizes, layouts and dtypes at the backend level -------------------------------------------------------------------
def test_outputs_larger_than_one_grid(dev, rt):
    # more outputs than rt.grid launches work-items: every work-item loops (grid-stride)
    x = rand((3, 5, 67, 131), np.float32, 10, nans=4)
    n_out = 3 * 5 * 33 * 65
    assert rt.grid(n_out)[0][0] < n_out
    xe = ember.tensor(x, device=dev)
    v, i = F.max_pool2d(xe, 3, 2, 1, return_indices=True)
    rv, ri = TF.max_pool2d(T(x), 3, 2, 1, return_indices=True)
    same(v, rv)
    same(i, ri)
    xf = np.nan_to_num(x)
    same(F.avg_pool2d(ember.tensor(xf, device=dev), 3, 2, 1), TF.avg_pool2d(T(xf), 3, 2, 1), **TOL[np.float32])
    same(F.interpolate(ember.tensor(xf, device=dev), size=(101, 257), mode="bilinear"),
         TF.interpolate(T(xf), size=(101, 257), mode="bilinear"), rtol=1e-5, atol=1e-5)


def test_batch_dims_that_do_not_merge(dev, rt):
    # (C, N) permuted batch dims, then three batch dims with a gap: read through their strides, or copied
    x = rand((4, 3, 2, 9, 8), np.float32, 11)
    h = arr.upload(rt, x, dt.float32)
    perm = arr.permute(h, (1, 0, 2, 3, 4))  # (3, 4, 2, 9, 8): batch strides (144, 432, 72) do not merge
    sliced = arr.basic_index(perm, (slice(None), slice(None, None, 2)))  # (3, 2, 2, 9, 8)
    ref_x = x.transpose(1, 0, 2, 3, 4)[:, ::2]
    ref = TF.max_pool2d(T(ref_x.reshape(-1, 9, 8)), 3, 2, 1, return_indices=True)
    v, i = pooling.max_pool(sliced, (3, 3), (2, 2), (1, 1), (1, 1), False, True)
    np.testing.assert_array_equal(arr.download(v), ref[0].numpy().reshape(v.shape))
    np.testing.assert_array_equal(arr.download(i), ref[1].numpy().reshape(i.shape))
    a = pooling.avg_pool(sliced, (2, 3), (1, 2), (1, 1), True, False, None)
    ra = TF.avg_pool2d(T(ref_x.reshape(-1, 9, 8)), (2, 3), (1, 2), (1, 1), True, False)
    np.testing.assert_allclose(arr.download(a), ra.numpy().reshape(a.shape), rtol=2e-6, atol=2e-6)
    # the input is never modified and never needs to be contiguous
    np.testing.assert_array_equal(arr.download(h), x)


def test_broadcast_input(dev, rt):
    # a batch broadcast with stride 0 and an expanded spatial dim
    row = rand((1, 1, 1, 7), np.float32, 12)
    h = arr.expand(arr.upload(rt, row, dt.float32), (2, 3, 5, 7))
    full = np.broadcast_to(row, (2, 3, 5, 7))
    out = pooling.interpolate(h, (8, 10), "bicubic", True, None)
    ref = TF.interpolate(T(full), size=(8, 10), mode="bicubic", align_corners=True)
    np.testing.assert_allclose(arr.download(out), ref.numpy(), rtol=1e-5, atol=1e-5)
    v, i = pooling.adaptive_max_pool(h, (2, 3), True)
    rv, ri = TF.adaptive_max_pool2d(T(full), (2, 3), return_indices=True)
    np.testing.assert_array_equal(arr.download(v), rv.numpy())
    np.testing.assert_array_equal(arr.download(i), ri.numpy())


@pytest.mark.parametrize("dtype", [dt.int8, dt.uint8, dt.int32, dt.int64])
def test_integer_pools_at_backend_level(rt, dtype):
    # core casts integer pools to float64; the kernels still take integers directly (devices without float64)
    x = np.random.default_rng(13).integers(0 if dtype is dt.uint8 else -100, 100, (2, 3, 7, 6)).astype(dtype.numpy)
    h = arr.upload(rt, x, dtype)
    v, i = pooling.max_pool(h, (3, 2), (2, 2), (1, 1), (1, 1), True, True)
    rv, ri = TF.max_pool2d(T(x.astype(np.float64)), (3, 2), 2, 1, ceil_mode=True, return_indices=True)
    np.testing.assert_array_equal(arr.download(v), rv.numpy().astype(dtype.numpy))
    np.testing.assert_array_equal(arr.download(i), ri.numpy())
    a = pooling.avg_pool(h, (2, 2), (2, 2), (0, 0), False, True, None)
    ra = TF.avg_pool2d(T(x.astype(np.float64)), 2).numpy()
    np.testing.assert_array_equal(arr.download(a), np.trunc(ra).astype(dtype.numpy))  # truncated as torch


def test_empty_batch_launches_nothing(rt):
    h = arr.upload(rt, np.zeros((0, 3, 6, 6), np.float32), dt.float32)
    v, i = pooling.max_pool(h, (2, 2), (2, 2), (0, 0), (1, 1), False, True)
    assert v.shape == (0, 3, 3, 3) and i.shape == (0, 3, 3, 3) and i.dtype is dt.int64
    assert pooling.interpolate(h, (4, 5), "bilinear", False, None).shape == (0, 3, 4, 5)
    assert pooling.adaptive_avg_pool(h, (2, 1)).shape == (0, 3, 2, 1)


def test_wide_index_kernels(dev, monkeypatch):
    # outputs past 2**31 split their index in 64 bits: force that variant on a small case
    monkeypatch.setattr(pooling, "_NARROW", 0)
    x = rand((2, 3, 7, 9), np.float32, 14, nans=1)
    v, i = F.max_pool2d(ember.tensor(x, device=dev), 3, 2, 1, return_indices=True)
    rv, ri = TF.max_pool2d(T(x), 3, 2, 1, return_indices=True)
    same(v, rv)
    same(i, ri)
    xf = np.nan_to_num(x)
    same(F.avg_pool2d(ember.tensor(xf, device=dev), 2, 1, 1), TF.avg_pool2d(T(xf), 2, 1, 1), **TOL[np.float32])
    for mode in ("nearest", "bilinear", "bicubic"):
        same(F.interpolate(ember.tensor(xf, device=dev), size=(11, 5), mode=mode),
             TF.interpolate(T(xf), size=(11, 5), mode=mode), rtol=1e-5, atol=1e-5)


def test_one_program_per_dtype(rt):
    # sizes are arguments: pools and interpolate of every rank share one compiled program per dtype (and index width)
    src = pooling._program(dt.float32, bool(rt.fp64), False, rt.is_cpu)
    assert pooling._program(dt.float32, bool(rt.fp64), False, rt.is_cpu) is src
    for name in ("ember_max_pool", "ember_avg_pool", "ember_nearest", "ember_interp_linear", "ember_interp_cubic"):
        assert f"__kernel void {name}(" in src
        assert rt.kernel(src, name) is not None


# -- bad input -----------------------------------------------------------------------------------------------------
def test_bad_arguments(dev, rt):
    h = arr.upload(rt, rand((1, 2, 4, 4)), dt.float32)
    with pytest.raises(UnsupportedError, match="interpolate: mode 'cubic'.*shape \\(1, 2, 4, 4\\)"):
        pooling.interpolate(h, (3, 3), "cubic", None, None)
    with pytest.raises(ShapeError, match="adaptive_avg_pool: 4 spatial dims over an input of shape \\(1, 2, 4, 4\\)"):
        pooling.adaptive_avg_pool(h, (1, 1, 1, 1))
    with pytest.raises(ShapeError, match="max_pool: 5 spatial dims"):
        pooling.max_pool(h, (1,) * 5, (1,) * 5, (0,) * 5, (1,) * 5, False, False)
    # core's checks come first on the public API
    with pytest.raises(ember.DTypeError, match="max_pool2d"):
        F.max_pool2d(ember.tensor(np.ones((1, 1, 4, 4), bool), device=dev), 2)
    with pytest.raises(ember.ValueRangeError, match="interpolate"):
        F.interpolate(ember.tensor(rand((1, 2, 4, 4)), device=dev), size=3, mode="cubic")


@pytest.mark.parametrize("kw", [dict(kernel_size=2, stride=2), dict(kernel_size=3, stride=2, padding=1, dilation=2),
                                dict(kernel_size=(3, 2), stride=(1, 3), padding=(1, 0), ceil_mode=True)])
def test_max_pool_runs_cross_planes(dev, kw):
    """Many (N, C) planes of odd sizes through a transposed (strided) batch: CPU work-items carry their output
    coordinates across rows and planes, which must land on the same values and indices as torch."""
    a = rand((7, 13, 11, 9), nans=3, ties=True)
    x = T(a).transpose(0, 1)
    got, gi = F.max_pool2d(ember.tensor(a, device=dev).transpose(0, 1), return_indices=True, **kw)
    ref, ri = TF.max_pool2d(x, return_indices=True, **kw)
    same(got, ref)
    np.testing.assert_array_equal(gi.numpy(), ri.numpy())
    same(F.avg_pool2d(ember.tensor(a, device=dev).transpose(0, 1), kw["kernel_size"], kw["stride"],
                      kw.get("padding", 0)), TF.avg_pool2d(x, kw["kernel_size"], kw["stride"], kw.get("padding", 0)),
         rtol=1e-6, atol=1e-6)
