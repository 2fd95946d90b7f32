"""Tests of ember_opencl.indexing on a real OpenCL device (PoCL in CI): numpy-style getitem/setitem (with numpy's
layout rule for the advanced dims), gather/scatter (duplicates combine under add/multiply, for every dtype),
cat, tril/triu and pad (every mode against torch.nn.functional.pad).

Most tests call the module on backend handles directly, so that numpy (what ember-flex does with ``h[key]``) is
the exact oracle; a few go through ember's public API and compare with torch. Sizes cross work-group and
grid-stride boundaries, sources are non-contiguous (strided, transposed), index arrays broadcast.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember import dtypes as dt
from ember.errors import ShapeError, UnsupportedError, ValueRangeError

cl = pytest.importorskip("pyopencl")

from ember_opencl import array as A  # noqa: E402
from ember_opencl import elementwise as ew  # noqa: E402
from ember_opencl import indexing as I  # noqa: E402
from ember_opencl.runtime import device_count, runtime  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def rt() -> Any:
    return runtime(0)


ALL = list(dt.ALL_DTYPES)


def need(rt: Any, dtype: dt.DType) -> None:
    if dtype is dt.float64 and not rt.fp64:
        pytest.skip("device without float64")


def values(shape: tuple[int, ...], dtype: dt.DType, seed: int = 0) -> np.ndarray:
    """Distinct-ish test data of dtype (small integers, so every dtype holds them exactly)."""
    r = np.random.default_rng(seed)
    if dtype is dt.bool_:
        return r.random(shape) > 0.5
    lo, hi = (0, 100) if dtype is dt.uint8 else (-60, 60)
    return r.integers(lo, hi, size=shape).astype(dtype.numpy)


def up(rt: Any, a: np.ndarray, dtype: dt.DType | None = None) -> A.CLArray:
    """A contiguous device copy of a (0-d arrays stay 0-d)."""
    a = np.asarray(a)
    h = A.upload(rt, a.reshape(-1), dtype or dt.from_numpy_dtype(a.dtype))
    return h.view(a.shape, A.contiguous_strides(a.shape), h.offset)


def nc(rt: Any, a: np.ndarray, dtype: dt.DType | None = None) -> A.CLArray:
    """A non-contiguous device handle holding a: every other row of a bigger buffer, stored transposed."""
    a = np.asarray(a)
    if a.ndim == 0:
        return up(rt, a, dtype)
    t = np.ascontiguousarray(a.transpose())
    big = np.zeros((2 * t.shape[0],) + t.shape[1:], dtype=a.dtype)
    big[1::2] = t
    h = A.basic_index(up(rt, big, dtype), (slice(1, 2 * t.shape[0], 2),))
    h = A.permute(h, tuple(reversed(range(a.ndim))))
    assert not h.is_contiguous or a.size <= 1
    return h


def down(h: A.CLArray) -> np.ndarray:
    c = ew.copy(h)
    flat = A.download(c.view((c.size,), (1,), c.offset))
    return flat.reshape(h.shape)


def same(actual: np.ndarray, expected: np.ndarray) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if actual.dtype.itemsize == 2 and actual.dtype.kind == "V" or str(actual.dtype) == "bfloat16":
        actual, expected = actual.astype(np.float32), expected.astype(np.float32)
    np.testing.assert_array_equal(actual, expected)


def ix(rt: Any, a: Any) -> A.CLArray:
    return up(rt, np.asarray(a, dtype=np.int64))


# ----------------------------------------------------------------------------------------------------------------
# getitem
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_getitem_every_dtype_noncontiguous(rt: Any, dtype: dt.DType) -> None:
    need(rt, dtype)
    x = values((7, 9, 5), dtype)
    h = nc(rt, x)
    i = np.array([[4, -1, 0], [6, 2, 2]])  # negative, duplicate, out of order
    j = np.array([3, 0, 1])  # broadcasts against i
    same(down(I.getitem(h, (ix(rt, i), slice(None), ix(rt, j)))), x[i, :, j])
    same(down(I.getitem(h, (slice(1, 6, 2), ix(rt, j), ix(rt, j[:, None])))), x[1:6:2, j, j[:, None]])


def test_getitem_large_crosses_groups(rt: Any) -> None:
    x = RNG.standard_normal((300, 257)).astype(np.float32)
    h = nc(rt, x)
    i = RNG.integers(-300, 300, size=(5000,))
    same(down(I.getitem(h, (ix(rt, i),))), x[i])
    k = RNG.integers(0, 257, size=(1, 4099))
    same(down(I.getitem(h, (ix(rt, i[:, None][:50]), ix(rt, k)))), x[i[:50, None], k])


@pytest.mark.parametrize("key", [
    "a,b", "a,:,b", ":,a", "0,:,a", "a,0", "None,a,:,b", "a,None,b", "...,a", "a,...", "a,::2,b", "0,a,b",
    ":,a,b", "a2d,:,b", "1,None,a",
])
def test_getitem_numpy_layout_rule(rt: Any, key: str) -> None:
    x = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    env = {"a": np.array([3, 0, 2]), "b": np.array([[1], [4]]), "a2d": np.array([[0, 1], [2, 3]])}
    np_key = eval(f"np.s_[{key}]", {"np": np}, env)  # noqa: S307 - test-local literal keys
    np_key = np_key if isinstance(np_key, tuple) else (np_key,)
    cl_key = tuple(ix(rt, k) if isinstance(k, np.ndarray) else k for k in np_key)
    same(down(I.getitem(up(rt, x), cl_key)), x[np_key])


def test_getitem_zero_dim_index_and_broadcast_stride_zero_index(rt: Any) -> None:
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    h = up(rt, x)
    zero_d = ix(rt, np.array(-2))
    same(down(I.getitem(h, (zero_d,))), x[np.array(-2)])
    same(down(I.getitem(h, (slice(None), zero_d))), x[:, np.array(-2)])
    # an expanded (stride 0) index array is read in place
    e = A.expand(ix(rt, [[3], [1]]), (2, 5))
    assert e.estrides == (1, 0)
    same(down(I.getitem(h, (e, slice(1, 3)))), x[np.broadcast_to([[3], [1]], (2, 5)), 1:3])


def test_basic_keys_are_views(rt: Any) -> None:
    h = up(rt, np.arange(20, dtype=np.float32).reshape(4, 5))
    v = I.getitem(h, (slice(1, 3, 1), 2, Ellipsis))
    assert v.block is h.block and v.shape == (2,)
    same(down(v), np.array([7, 12], dtype=np.float32))


@pytest.mark.parametrize("dtype", [dt.float32, dt.bool_, dt.float16, dt.int8], ids=lambda d: d.name)
def test_getitem_bool_masks(rt: Any, dtype: dt.DType) -> None:
    x = values((37, 11, 3), dtype, seed=3)
    h = nc(rt, x)
    m = RNG.random((37, 11)) > 0.4
    same(down(I.getitem(h, (up(rt, m),))), x[m])
    m1 = RNG.random(11) > 0.5
    same(down(I.getitem(h, (slice(2, 30), up(rt, m1), ix(rt, [[2], [0]])))), x[2:30, m1, np.array([[2], [0]])])
    none = np.zeros((37, 11), dtype=bool)
    same(down(I.getitem(h, (up(rt, none),))), x[none])


def test_getitem_mask_large_and_expanded(rt: Any) -> None:
    n = 200_003  # many chunks, a ragged last one
    x = RNG.standard_normal(n).astype(np.float32)
    m = RNG.random(n) > 0.7
    same(down(I.getitem(up(rt, x), (up(rt, m),))), x[m])
    # an expanded (stride 0) mask, as masked_select builds
    mrow = RNG.random((1, 64)) > 0.5
    em = A.expand(up(rt, mrow), (50, 64))
    xx = RNG.standard_normal((50, 64)).astype(np.float32)
    same(down(I.getitem(up(rt, xx), (em,))), xx[np.broadcast_to(mrow, (50, 64))])


def test_getitem_zero_dim_bool(rt: Any) -> None:
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    h = up(rt, x)
    for v in (True, False):
        b = ew.full(rt, (), v, dt.bool_)
        same(down(I.getitem(h, (b,))), x[np.bool_(v)])
        if v:
            same(down(I.getitem(h, (slice(None), b, ix(rt, [2, 0])))), x[:, np.bool_(v), [2, 0]])
        else:  # a False scalar gives a dim of size 0, which does not broadcast with (2,) (numpy agrees)
            with pytest.raises(ShapeError, match=r"\(0,\), \(2,\)"):
                I.getitem(h, (slice(None), b, ix(rt, [2, 0])))


def test_getitem_empty_results(rt: Any) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = up(rt, x)
    same(down(I.getitem(h, (ix(rt, np.zeros(0, np.int64)),))), x[np.zeros(0, np.int64)])
    same(down(I.getitem(h, (slice(2, 2), ix(rt, [1, 2])))), x[2:2, [1, 2]])


def test_getitem_bad_keys(rt: Any) -> None:
    h = up(rt, np.zeros((3, 4), np.float32))
    with pytest.raises(ShapeError, match="broadcast"):
        I.getitem(h, (ix(rt, [0, 1]), ix(rt, [0, 1, 2])))
    with pytest.raises(ShapeError, match="mask"):
        I.getitem(h, (up(rt, np.ones((4, 3), bool)),))
    with pytest.raises(ShapeError, match="too many indices"):
        I.getitem(h, (ix(rt, [0]), 0, 1))


# ----------------------------------------------------------------------------------------------------------------
# setitem
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_setitem_advanced_every_dtype(rt: Any, dtype: dt.DType) -> None:
    need(rt, dtype)
    x = values((6, 7, 3), dtype)
    v = values((2, 6, 3), dtype, seed=5)
    i = np.array([[5], [0]])
    j = np.array([6, 1, 3, 0, 2, 4])
    h = nc(rt, x)
    I.setitem(h, (ix(rt, i), ix(rt, j)), nc(rt, v))
    want = x.copy()
    want[i, j] = v
    same(down(h), want)


def test_setitem_broadcast_scalar_and_mask(rt: Any) -> None:
    x = np.arange(60, dtype=np.float32).reshape(5, 4, 3)
    h = up(rt, x)
    want = x.copy()
    I.setitem(h, (slice(None), ix(rt, [3, 0]), 1), up(rt, np.array([-1.0, -2.0], np.float32)))
    want[:, [3, 0], 1] = [-1.0, -2.0]
    m = x[..., 0] > 20
    I.setitem(h, (up(rt, m),), 7.5)
    want[m] = 7.5
    I.setitem(h, (ix(rt, [4, 1]), slice(None), ix(rt, [[2], [0]])), up(rt, np.arange(4, dtype=np.float32)))
    want[[4, 1], :, np.array([[2], [0]])] = np.arange(4)
    same(down(h), want)


def test_setitem_value_cast_and_leading_ones(rt: Any) -> None:
    x = np.zeros((4, 3), np.int16)
    h = up(rt, x)
    I.setitem(h, (ix(rt, [2, 0]),), up(rt, np.array([[[1.9, -2.7, 3.0]]], np.float32)))
    x[[2, 0]] = np.array([1, -2, 3], np.int16)
    same(down(h), x)


def test_setitem_duplicates_one_value_wins(rt: Any) -> None:
    x = np.zeros(8, np.float32)
    h = up(rt, x)
    idx = np.array([3] * 1000 + [5])
    vals = np.arange(1001, dtype=np.float32) + 1
    I.setitem(h, (ix(rt, idx),), up(rt, vals))
    got = down(h)
    assert got[3] in set(vals[:1000].tolist()) and got[5] == 1001
    assert np.count_nonzero(got) == 2


def test_setitem_value_is_a_view_of_target(rt: Any) -> None:
    x = np.arange(10, dtype=np.int64)
    h = up(rt, x)
    src = A.basic_index(h, (slice(0, 5, 1),))  # x[[1, 2, 3, 4, 5]] = x[0:5] must read the old values
    I.setitem(h, (ix(rt, [1, 2, 3, 4, 5]),), src)
    x[[1, 2, 3, 4, 5]] = x[0:5].copy()
    same(down(h), x)


def test_setitem_basic_key_assigns_view(rt: Any) -> None:
    x = np.arange(12, dtype=np.uint8).reshape(3, 4)
    h = up(rt, x)
    I.setitem(h, (slice(0, 3, 2), slice(1, 3, 1)), 9)
    x[0:3:2, 1:3] = 9
    same(down(h), x)


def test_setitem_bad_value_shape(rt: Any) -> None:
    h = up(rt, np.zeros((4, 3), np.float32))
    with pytest.raises(ShapeError, match="broadcast"):
        I.setitem(h, (ix(rt, [0, 1]),), up(rt, np.zeros((3, 3), np.float32)))


# ----------------------------------------------------------------------------------------------------------------
# cat, gather, index_select
# ----------------------------------------------------------------------------------------------------------------
def test_cat_noncontiguous_and_empty(rt: Any) -> None:
    parts = [RNG.standard_normal((3, n, 70)).astype(np.float32) for n in (5, 0, 129, 1)]
    hs = [nc(rt, p) if k % 2 else up(rt, p) for k, p in enumerate(parts)]
    same(down(I.cat(hs, 1)), np.concatenate(parts, 1))
    same(down(I.cat([up(rt, parts[0]), nc(rt, parts[0])], 2)), np.concatenate([parts[0]] * 2, 2))


@pytest.mark.parametrize("dtype", [dt.bool_, dt.float16, dt.bfloat16, dt.int64], ids=lambda d: d.name)
def test_gather_noncontiguous_smaller_index(rt: Any, dtype: dt.DType) -> None:
    x = values((40, 33, 6), dtype, seed=2)
    for dim in (0, 1, 2):
        ishape = [30, 20, 4]
        ishape[dim] = 50
        idx = RNG.integers(0, x.shape[dim], size=ishape)
        got = down(I.gather(nc(rt, x), dim, nc(rt, idx)))
        sub = x[tuple(slice(0, n) if d != dim else slice(None) for d, n in enumerate(ishape))]
        same(got, np.take_along_axis(sub, idx, axis=dim))


def test_gather_expanded_index(rt: Any) -> None:
    x = RNG.standard_normal((5, 1000)).astype(np.float32)
    idx = A.expand(ix(rt, [[4], [0], [2]]), (3, 1000))
    same(down(I.gather(up(rt, x), 0, idx)), np.take_along_axis(x, np.broadcast_to([[4], [0], [2]], (3, 1000)), 0))


def test_index_select(rt: Any) -> None:
    x = RNG.standard_normal((6, 5, 4)).astype(np.float32)
    idx = np.array([4, 4, 0, 2])
    for dim in range(3):
        same(down(I.index_select(nc(rt, x), dim, ix(rt, idx[idx < x.shape[dim]]))),
             np.take(x, idx[idx < x.shape[dim]], axis=dim))


# ----------------------------------------------------------------------------------------------------------------
# scatter
# ----------------------------------------------------------------------------------------------------------------
def _scatter_ref(x: np.ndarray, dim: int, index: np.ndarray, src: Any, reduce: str | None) -> np.ndarray:
    out = x.copy()
    if isinstance(src, np.ndarray):
        src = src[tuple(slice(0, n) for n in index.shape)]
    else:
        src = np.full(index.shape, src, dtype=x.dtype)
    grid = list(np.indices(index.shape, sparse=True))
    grid[dim] = index
    key = tuple(grid)
    if reduce is None:
        out[key] = src
    elif reduce == "add":
        np.add.at(out, key, src)
    else:
        np.multiply.at(out, key, src)
    return out


@pytest.mark.parametrize("reduce", ["add", "multiply"])
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_scatter_reduce_duplicates_every_dtype(rt: Any, dtype: dt.DType, reduce: str) -> None:
    need(rt, dtype)
    x = values((5, 9), dtype, seed=1)
    if reduce == "multiply" and dtype not in (dt.bool_,):
        src = np.random.default_rng(2).choice([-1, 1, 2], size=(5, 30)).astype(dtype.numpy) \
            if dtype is not dt.uint8 else np.random.default_rng(2).choice([1, 2], size=(5, 30)).astype(np.uint8)
    else:
        src = values((5, 30), dtype, seed=4)
    idx = RNG.integers(0, 9, size=(4, 25))  # many duplicates per destination; smaller than src and x
    got = down(I.scatter(nc(rt, x), 1, up(rt, idx), nc(rt, src), reduce))
    want = _scatter_ref(x, 1, idx, src, reduce)
    if dtype is dt.bfloat16:  # sums pass 256, where bfloat16 rounds: the order of the adds matters
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=0.5)
    else:
        same(got, want)


@pytest.mark.parametrize("dtype", [dt.int64, dt.float64, dt.int32], ids=lambda d: d.name)
def test_scatter_reduce_without_int64_atomics(rt: Any, dtype: dt.DType, monkeypatch: Any) -> None:
    need(rt, dtype)
    monkeypatch.setattr(I, "force_loop_reduce", True)
    x = values((6, 4, 3), dtype)
    src = values((6, 7, 3), dtype, seed=9)
    idx = RNG.integers(0, 4, size=(5, 7, 2))
    for reduce in ("add", "multiply"):
        s = np.clip(src, -2, 2).astype(dtype.numpy) if reduce == "multiply" else src
        got = down(I.scatter(nc(rt, x), 1, nc(rt, idx), nc(rt, s), reduce))
        same(got, _scatter_ref(x, 1, idx, s, reduce))


def test_scatter_add_large_exact(rt: Any) -> None:
    n = 300_000
    idx = RNG.integers(0, 17, size=n)
    src = RNG.integers(-5, 6, size=n).astype(np.int32)
    got = down(I.scatter(up(rt, np.zeros(17, np.int32)), 0, up(rt, idx), up(rt, src), "add"))
    same(got, np.bincount(idx, weights=src, minlength=17).astype(np.int32))
    src8 = RNG.integers(0, 2, size=n).astype(np.int8)
    got8 = down(I.scatter(up(rt, np.zeros(17, np.int8)), 0, up(rt, idx), up(rt, src8), "add"))
    same(got8, np.bincount(idx, weights=src8, minlength=17).astype(np.int64).astype(np.int8))  # wraps


def test_scatter_replace_scalar_and_src(rt: Any) -> None:
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    idx = np.array([[4, 1, 0], [2, 3, 1]])  # no duplicate destinations: the replace result is deterministic
    src = -np.arange(12, dtype=np.float32).reshape(3, 4)
    same(down(I.scatter(up(rt, x), 0, up(rt, idx), nc(rt, src), None)), _scatter_ref(x, 0, idx, src, None))
    same(down(I.scatter(up(rt, x), 1, up(rt, idx), 2.5, None)), _scatter_ref(x, 1, idx, 2.5, None))
    same(down(I.scatter(up(rt, x), 1, up(rt, idx), 3.0, "multiply")), _scatter_ref(x, 1, idx, 3.0, "multiply"))
    with pytest.raises(UnsupportedError, match="reduce"):
        I.scatter(up(rt, x), 0, up(rt, idx), 1.0, "max")


def test_scatter_leaves_input_untouched(rt: Any) -> None:
    x = np.ones((3, 3), np.float32)
    h = up(rt, x)
    I.scatter(h, 0, up(rt, np.array([[0, 0, 0]])), 5.0, "add")
    same(down(h), x)


# ----------------------------------------------------------------------------------------------------------------
# tril / triu
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_tril_triu_every_dtype(rt: Any, dtype: dt.DType) -> None:
    need(rt, dtype)
    x = values((3, 5, 7), dtype, seed=8)
    for k in (-6, -1, 0, 2, 9):
        same(down(I.tril(nc(rt, x), k, False)), np.tril(x, k))
        same(down(I.tril(nc(rt, x), k, True)), np.triu(x, k))


def test_tril_large_and_empty(rt: Any) -> None:
    x = RNG.standard_normal((130, 300)).astype(np.float32)
    same(down(I.tril(up(rt, x), 1, False)), np.tril(x, 1))
    same(down(I.tril(up(rt, np.zeros((0, 4), np.float32)), 0, True)), np.zeros((0, 4), np.float32))


# ----------------------------------------------------------------------------------------------------------------
# pad
# ----------------------------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

PAD_CASES = [
    ("constant", (2, 3)), ("constant", (-1, 2, 0, 3)), ("constant", (1, 1, 2, 0, 3, 1)),
    ("reflect", (2, 3)), ("reflect", (3, 1, 2, 2)), ("reflect", (-1, 3)), ("reflect", (6, -3)), ("reflect", (-4, 5)),
    ("reflect", (1, 2, 0, 1, 2, 3)),
    ("replicate", (4, 5)), ("replicate", (0, 2, 7, 1)), ("replicate", (2, -2, 1, 1, 3, 0)),
    ("circular", (3, 2)), ("circular", (4, 0, 1, 3)), ("circular", (3, -4)), ("circular", (-1, 2, 1, 1)),
    ("circular", (1, 2, 3, 4, 2, 1)),
]


@pytest.mark.parametrize(("mode", "p"), PAD_CASES, ids=lambda v: str(v))
def test_pad_vs_torch(rt: Any, mode: str, p: tuple[int, ...]) -> None:
    x = RNG.standard_normal((2, 3, 5, 6, 7)).astype(np.float32)
    npairs = len(p) // 2
    x = x[(0,) * (5 - npairs - 2)]  # torch wants (N, C, *spatial) for the non-constant modes
    want = TF.pad(torch.from_numpy(x), p, mode=mode, **({"value": -4.5} if mode == "constant" else {})).numpy()
    pairs = [(0, 0)] * x.ndim
    for i in range(npairs):
        pairs[x.ndim - 1 - i] = (p[2 * i], p[2 * i + 1])
    got = down(I.pad(nc(rt, x), tuple(pairs), mode, -4.5 if mode == "constant" else None))
    same(got, want)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: d.name)
def test_pad_every_dtype(rt: Any, dtype: dt.DType) -> None:
    need(rt, dtype)
    x = values((3, 4, 5), dtype, seed=6)
    x64 = torch.from_numpy(x.astype(np.float64))
    for mode, value in (("constant", 1), ("reflect", None), ("replicate", None), ("circular", None)):
        want = TF.pad(x64, (2, 1, 3, -1), mode=mode, **({"value": 1.0} if value is not None else {}))
        got = down(I.pad(nc(rt, x), ((0, 0), (3, -1), (2, 1)), mode, value))
        same(got, want.numpy().astype(dtype.numpy))


def test_pad_large_and_fill_values(rt: Any) -> None:
    x = RNG.standard_normal((3, 200, 300)).astype(np.float32)
    got = down(I.pad(up(rt, x), ((0, 0), (5, 7), (1, 130)), "constant", float("-inf")))
    same(got, np.pad(x, ((0, 0), (5, 7), (1, 130)), constant_values=-np.inf))
    xi = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = down(I.pad(up(rt, xi), ((1, 0), (0, 1)), "constant", float("-inf")))  # max-pool style padding
    same(got, np.pad(xi, ((1, 0), (0, 1)), constant_values=np.iinfo(np.int32).min))
    xb = np.array([True, False])
    same(down(I.pad(up(rt, xb), ((2, 1),), "constant", True)), np.array([True, True, True, False, True]))


def test_pad_errors(rt: Any) -> None:
    h = up(rt, np.zeros((2, 3), np.float32))
    with pytest.raises(UnsupportedError, match="mode"):
        I.pad(h, ((0, 0), (1, 1)), "symmetric", None)
    with pytest.raises(ShapeError, match="empty dimension"):
        I.pad(up(rt, np.zeros((2, 0), np.float32)), ((1, 0), (1, 1)), "replicate", None)
    with pytest.raises(ValueRangeError, match="NaN"):
        I.pad(up(rt, np.zeros((2, 3), np.int32)), ((1, 0), (0, 0)), "constant", float("nan"))
    with pytest.raises(ShapeError, match="negative"):
        I.pad(h, ((0, 0), (-2, -2)), "constant", 0)
