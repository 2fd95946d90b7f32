"""Tests of ember_opencl.sorting: sort/topk against torch (stable) and numpy, on the paths the kit's small inputs
miss: rows longer than a work-group tile (global merge passes, a 1e6-element row), many short rows per tile, the
top-k tournament, strided/broadcast inputs, every dtype's key transform (NaN, -0.0, +-inf, integer extremes).
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.errors import ValueRangeError

pytest.importorskip("pyopencl")
torch = pytest.importorskip("torch")

from ember_opencl import sorting  # noqa: E402
from ember_opencl.runtime import device_count, runtime  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")


@pytest.fixture(scope="module")
def dev():
    return ember.Device.opencl(0)


@pytest.fixture(scope="module")
def tile():
    return sorting._max_tile(runtime(0), False)


def ref_sort(a: np.ndarray, dim: int, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    r = torch.sort(torch.from_numpy(np.ascontiguousarray(a)), dim=dim, descending=descending, stable=True)
    return r.values.numpy(), r.indices.numpy()


def check_sort(dev, a: np.ndarray, dim: int, descending: bool, x=None) -> None:
    x = ember.tensor(a, device=dev) if x is None else x
    r = ember.sort(x, dim, descending, stable=True)
    v, i = ref_sort(a, dim, descending)
    got_i = r.indices.numpy()
    assert r.indices.dtype is ember.int64
    np.testing.assert_array_equal(got_i, i, err_msg=f"indices {a.shape} {a.dtype} dim={dim} desc={descending}")
    got_v = r.values.numpy()
    assert got_v.dtype == a.dtype
    # bit-exact values (-0.0 stays -0.0, NaNs stay NaN): they are gathered from the input
    np.testing.assert_array_equal(got_v.view(f"u{a.itemsize}"), np.take_along_axis(a, i, dim).view(f"u{a.itemsize}"))
    np.testing.assert_array_equal(got_v, v)


def special_floats(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Many ties, NaN, -0.0, 0.0, +-inf."""
    pool = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, -1.5, 2.0, -7.25, 1e-3], dtype=np.float64)
    return pool[rng.integers(0, len(pool), shape)].astype(dtype)


# -- sort ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_float_keys_nan_zero_inf(dev, dtype, descending):
    a = special_floats(np.random.default_rng(1), (4, 333), dtype)
    a[1, 5] = -np.nan  # a NaN with the sign bit set is still the largest
    for dim in (0, 1):
        check_sort(dev, a, dim, descending)


def test_nan_payloads_tie(dev):
    bits = np.array([0x7FC00000, 0xFFC00001, 0x3F800000, 0x7F800001, 0x80000000, 0], np.uint32)
    a = bits.view(np.float32)
    r = ember.sort(ember.tensor(a, device=dev))
    assert r.indices.tolist() == [4, 5, 2, 0, 1, 3]  # -0.0 == 0.0 and every NaN ties, largest, by index
    assert r.indices.tolist() == np.argsort(a, kind="stable").tolist()
    r = ember.sort(ember.tensor(a, device=dev), descending=True)
    assert r.indices.tolist() == [0, 1, 3, 2, 4, 5]


def test_bfloat16(dev):
    a = special_floats(np.random.default_rng(2), (3, 257), np.float32)
    x = ember.tensor(a, device=dev).to(ember.bfloat16)
    t = torch.from_numpy(a).to(torch.bfloat16)
    for descending in (False, True):
        r = ember.sort(x, 1, descending, stable=True)
        e = torch.sort(t, dim=1, descending=descending, stable=True)
        np.testing.assert_array_equal(r.indices.numpy(), e.indices.numpy())
        np.testing.assert_array_equal(r.values.numpy().astype(np.float32), e.values.float().numpy())


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64], ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_integer_keys_extremes(dev, dtype, descending):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    a = rng.integers(info.min, info.max, (5, 100), dtype=dtype, endpoint=True)
    a[:, :4] = [info.min, info.max, 0, info.min]  # extremes and ties
    if info.min < 0:
        a[:, 4] = -1
    check_sort(dev, a, 1, descending)
    check_sort(dev, a, 0, descending)


def test_bool(dev):
    a = np.random.default_rng(4).integers(0, 2, (3, 50)).astype(bool)
    for descending in (False, True):
        check_sort(dev, a, 1, descending)


@pytest.mark.parametrize("n", [1, 2, 3, 63, 64, 65, 511, 1000])
def test_short_rows_many_per_tile(dev, n):
    # many rows share a work-group tile; each row is padded to a power of two with sentinels
    a = np.random.default_rng(n).integers(-20, 20, (37, n)).astype(np.float32)
    check_sort(dev, a, 1, False)
    check_sort(dev, a, 1, True)


@pytest.mark.parametrize("extra", [-1, 0, 1, 3])
def test_rows_across_tiles(dev, tile, extra):
    # rows longer than a tile: global compare-exchange passes plus local merges
    for m in (2, 8):
        n = tile * m + extra
        a = np.random.default_rng(m + extra).integers(-50, 50, (3, n)).astype(np.float32)
        a[0, ::11] = np.nan
        check_sort(dev, a, 1, False)
        check_sort(dev, a, 1, True)


def test_million_element_row(dev):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(1_000_000).astype(np.float32)
    a[::1000] = 0.5  # ties across tiles
    a[7::5001] = np.nan
    x = ember.tensor(a, device=dev)
    r = ember.sort(x)
    order = np.argsort(a, kind="stable")
    np.testing.assert_array_equal(r.indices.numpy(), order)
    np.testing.assert_array_equal(r.values.numpy(), a[order])
    r = ember.sort(x, descending=True, stable=True)
    np.testing.assert_array_equal(r.indices.numpy(), ref_sort(a, 0, True)[1])


def test_float64_long_rows(dev):
    if not dev.supports_dtype(ember.float64):
        pytest.skip("device has no float64")
    a = np.random.default_rng(6).integers(-1000, 1000, (2, 20_000)).astype(np.float64) / 7
    a[1, ::3] = np.nan
    check_sort(dev, a, 1, False)
    check_sort(dev, a, 1, True)
    b = np.random.default_rng(7).integers(-(2**62), 2**62, (30_000,), dtype=np.int64)
    check_sort(dev, b, 0, False)


def test_any_dim_and_strided_inputs(dev):
    a = np.random.default_rng(8).integers(0, 6, (5, 40, 7)).astype(np.float32)
    x = ember.tensor(a, device=dev)
    for dim in (0, 1, 2, -1):
        check_sort(dev, a, dim % 3, dim % 2 == 0, x=x)
    # a permuted (non-contiguous) view and a step slice
    p = x.permute(2, 0, 1)
    check_sort(dev, np.transpose(a, (2, 0, 1)), 2, False, x=p)
    check_sort(dev, np.transpose(a, (2, 0, 1)), 1, True, x=p)
    s = x[1:, ::3, 1::2]
    check_sort(dev, a[1:, ::3, 1::2], 1, False, x=s)
    check_sort(dev, a[1:, ::3, 1::2], 0, True, x=s)


def test_broadcast_input(dev):
    a = np.array([3.0, 1.0, 2.0], np.float32)
    x = ember.tensor(a, device=dev).expand(4, 3)
    r = ember.sort(x, 0)  # every column is all ties: indices in order
    np.testing.assert_array_equal(r.indices.numpy(), np.broadcast_to(np.arange(4)[:, None], (4, 3)))
    r = ember.sort(x, 1, descending=True)
    np.testing.assert_array_equal(r.values.numpy(), np.broadcast_to([3.0, 2.0, 1.0], (4, 3)))


def test_empty(dev):
    for shape, dim in (((0, 5), 1), ((3, 0), 1), ((3, 0), 0), ((0,), 0)):
        r = ember.sort(ember.zeros(*shape, device=dev), dim)
        assert r.values.shape == shape and r.indices.shape == shape


def test_unstable_request_is_stable(dev):
    a = np.array([2, 1, 2, 1, 2], np.int32)
    assert ember.sort(ember.tensor(a, device=dev)).indices.tolist() == [1, 3, 0, 2, 4]


def test_few_kernel_variants():
    # sources depend on the element width and the outer rank only, never on sizes
    assert all(len(k) == 2 for k in sorting._key_sources)
    assert set(sorting._net_sources) <= {False, True}


# -- topk ---------------------------------------------------------------------------------------------------------
def check_topk(dev, a: np.ndarray, k: int, dim: int, largest: bool) -> None:
    r = ember.topk(ember.tensor(a, device=dev), k, dim, largest)
    v, i = ref_sort(a, dim, largest)
    sl = (slice(None),) * dim + (slice(0, k),)
    np.testing.assert_array_equal(r.indices.numpy(), i[sl], err_msg=f"topk {a.shape} k={k} dim={dim} {largest}")
    np.testing.assert_array_equal(r.values.numpy(), v[sl])
    e = torch.topk(torch.from_numpy(a), k, dim, largest)
    np.testing.assert_array_equal(r.values.numpy(), e.values.numpy())


@pytest.mark.parametrize("k", [1, 2, 5, 17, 100])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_tournament_long_row(dev, k, largest):
    a = np.random.default_rng(k).standard_normal(300_000).astype(np.float32)
    a[::997] = np.nan
    a[5::1001] = 1.25  # ties among the largest candidates
    check_topk(dev, a, k, 0, largest)


def test_topk_tournament_many_rows_and_dims(dev, tile):
    a = np.random.default_rng(9).integers(-100, 100, (3, tile * 4 + 5, 2)).astype(np.int32)
    for k in (1, 3, 8):
        check_topk(dev, a, k, 1, True)
        check_topk(dev, a, k, 1, False)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int8, np.float16], ids=str)
def test_topk_dtypes(dev, dtype):
    if dtype is np.float64 and not dev.supports_dtype(ember.float64):
        pytest.skip("device has no float64")
    a = (np.random.default_rng(10).standard_normal((4, 9000)) * 50).astype(dtype)
    for k in (0, 1, 4, 9000):
        check_topk(dev, a, k, 1, True)
    check_topk(dev, a, 3, 0, False)


def test_topk_large_k_sorts(dev, tile):
    a = np.random.default_rng(11).standard_normal(tile * 3).astype(np.float32)
    check_topk(dev, a, tile, 0, True)  # k too large for the tournament: sort and slice
    check_topk(dev, a, tile * 3 - 1, 0, False)


def test_topk_unsorted_flag_returns_sorted(dev):
    a = np.array([3.0, 1.0, np.nan, 2.0, 5.0], np.float32)
    r = ember.topk(ember.tensor(a, device=dev), 3, sorted=False)
    assert r.indices.tolist() == [2, 4, 0]


# -- bad input (validated by core before the backend) --------------------------------------------------------------
def test_bad_input(dev):
    x = ember.tensor(np.arange(4.0, dtype=np.float32), device=dev)
    with pytest.raises(ValueRangeError, match=r"topk\(\): selected number k=5"):
        ember.topk(x, 5)
    with pytest.raises(ember.errors.EmberError, match="sort"):
        ember.sort(x, 3)
    with pytest.raises(ember.DTypeError, match="topk"):
        ember.topk(ember.tensor(np.array([True]), device=dev), 1)


def test_rows_beyond_32_bit_indices_are_refused(dev):
    x = ember.zeros(1, device=dev).expand(2**32)  # a broadcast view: no memory behind it
    with pytest.raises(ember.errors.UnsupportedError, match=r"sort/topk: dimension 0 of shape \(4294967296,\)"):
        ember.sort(x)
