"""Tests of ember_opencl.random: Philox4x32-10 against a pure-Python reference (and Random123's published answers),
the counter layout (seed, call offset, element index), distributions with fixed seeds, and bad input.

All draws use fixed seeds, so the statistical checks are deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.errors import DTypeError, ValueRangeError

pytest.importorskip("pyopencl")

from ember_opencl.random import Philox  # noqa: E402
from ember_opencl.runtime import device_count, runtime  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

# -- the reference: Philox4x32-10 as Random123 defines it ---------------------------------------------------------
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
U32 = 0xFFFFFFFF


def philox_ref(ctr: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & U32, p1 & U32, ((p0 >> 32) ^ c3 ^ k1) & U32, p0 & U32
        k0, k1 = (k0 + W0) & U32, (k1 + W1) & U32
    return c0, c1, c2, c3


def ref_words(seed: int, offset: int, nblocks: int) -> np.ndarray:
    """The words of call number `offset` after seeding: counter (block lo, block hi, offset lo, offset hi)."""
    seed &= (1 << 64) - 1
    key = (seed & U32, seed >> 32)
    return np.array([philox_ref((b & U32, b >> 32, offset & U32, offset >> 32), key) for b in range(nblocks)],
                    dtype=np.uint64)


# Random123 kat_vectors for philox4x32 with 10 rounds
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((U32, U32, U32, U32), (U32, U32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.fixture(scope="module")
def rt():
    return runtime(0)


@pytest.fixture(scope="module")
def dev():
    return ember.Device.opencl(0)


def host(h) -> np.ndarray:
    from ember_opencl.array import download

    return download(h)


def raw(gen: Philox, nblocks: int) -> np.ndarray:
    return host(gen.raw(nblocks)).view(np.uint32).astype(np.uint64)


# -- the generator itself -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_reference_matches_published_vectors(ctr, key, expected):
    assert philox_ref(ctr, key) == expected


def test_device_matches_published_vector(rt):
    # seed 0, first call, block 0: counter and key all zeros
    words = raw(Philox(rt, 0), 1)
    assert tuple(int(w) for w in words[0]) == KAT[0][2]


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 + 7, 2**64 - 1, -1, -(2**40)])
def test_device_words_follow_counter_layout(rt, seed):
    gen = Philox(rt, seed)
    first, second = raw(gen, 37), raw(gen, 5)
    np.testing.assert_array_equal(first, ref_words(seed, 0, 37))
    np.testing.assert_array_equal(second, ref_words(seed, 1, 5))


def test_high_block_and_offset_words(rt):
    # blocks past 2**32 elements are out of reach here; a large call offset exercises the offset's high word
    gen = Philox(rt, 99)
    gen.offset = 2**32 + 3
    np.testing.assert_array_equal(raw(gen, 3), ref_words(99, 2**32 + 3, 3))
    assert gen.offset == 2**32 + 4


def test_independent_of_work_group_size(rt, monkeypatch):
    a = host(Philox(rt, 5).uniform((1001,), dt.float32))
    monkeypatch.setattr(rt, "ew_local", 1)
    monkeypatch.setattr(rt, "ew_max_groups", 3)
    b = host(Philox(rt, 5).uniform((1001,), dt.float32))
    np.testing.assert_array_equal(a, b)


def test_every_call_advances_the_stream(rt):
    gen = Philox(rt, 3)
    gen.uniform((0,), dt.float32)  # an empty draw still takes its offset
    assert gen.offset == 1
    a, b = host(gen.uniform((64,), dt.float32)), host(gen.uniform((64,), dt.float32))
    assert not np.array_equal(a, b)
    gen.seed(3)
    assert gen.offset == 0
    gen.uniform((0,), dt.float32)
    np.testing.assert_array_equal(host(gen.uniform((64,), dt.float32)), a)


# -- uniform ------------------------------------------------------------------------------------------------------
def test_uniform_float32_is_the_top_24_bits(rt):
    words = ref_words(11, 0, 250).reshape(-1)
    got = host(Philox(rt, 11).uniform((1000,), dt.float32))
    np.testing.assert_array_equal(got, ((words >> 8).astype(np.float64) * 2.0**-24).astype(np.float32))


def test_uniform_float64_has_53_bits(rt):
    if not rt.fp64:
        pytest.skip("device has no float64")
    w = ref_words(11, 0, 100).reshape(-1, 2)
    bits = ((w[:, 0] << np.uint64(32)) | w[:, 1]) >> np.uint64(11)
    got = host(Philox(rt, 11).uniform((200,), dt.float64))
    np.testing.assert_array_equal(got, bits.astype(np.float64) * 2.0**-53)
    # 53 bits: the low bits of the significand vary (a float32 routed through double would leave them zero)
    scaled = (got * 2.0**53).astype(np.uint64)
    assert (scaled & np.uint64(0x1FFFFFFF)).any()


@pytest.mark.parametrize("d", [dt.float16, dt.bfloat16, dt.float32, dt.float64], ids=str)
def test_uniform_range_and_ks(rt, d):
    if d is dt.float64 and not rt.fp64:
        pytest.skip("device has no float64")
    n = 200_000
    a = np.sort(host(Philox(rt, 2024).uniform((n,), d)).astype(np.float64))
    assert a[0] >= 0.0 and a[-1] < 1.0, "uniform must lie in [0, 1) after rounding to the dtype"
    assert abs(a.mean() - 0.5) < 0.005 and abs(a.var() - 1 / 12) < 0.002
    if d in (dt.float32, dt.float64):
        # Kolmogorov-Smirnov distance to U(0, 1); 1.63 / sqrt(n) is the 1% critical value
        cdf = np.arange(1, n + 1) / n
        assert max(np.max(cdf - a), np.max(a - (cdf - 1 / n))) < 1.63 / math.sqrt(n)


def test_uniform_half_types_never_round_to_one(rt):
    # every 16-bit value drawn is an exact multiple of 2**-digits below 1: no value can round up to 1.0
    for d, digits in ((dt.float16, 11), (dt.bfloat16, 8)):
        a = host(Philox(rt, 7).uniform((300_000,), d)).astype(np.float64)
        assert a.max() == 1.0 - 2.0**-digits
        np.testing.assert_array_equal(a * 2**digits, np.floor(a * 2**digits))


# -- normal -------------------------------------------------------------------------------------------------------
def _normal_cdf(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    return 0.5 * (1 + np.vectorize(erf)(x / sqrt(2)))


@pytest.mark.parametrize("d", [dt.float32, dt.float64, dt.float16, dt.bfloat16], ids=str)
def test_normal_moments_and_ks(rt, d):
    if d is dt.float64 and not rt.fp64:
        pytest.skip("device has no float64")
    n = 200_000
    a = host(Philox(rt, 31337).normal((n,), d)).astype(np.float64)
    assert np.isfinite(a).all()
    assert abs(a.mean()) < 0.01 and abs(a.var() - 1) < 0.015
    assert abs(np.mean(a**3)) < 0.03 and abs(np.mean(a**4) - 3) < 0.06  # skewness, kurtosis
    if d in (dt.float32, dt.float64):
        s = np.sort(a)
        cdf = _normal_cdf(s)
        ecdf = np.arange(1, n + 1) / n
        assert max(np.max(ecdf - cdf), np.max(cdf - (ecdf - 1 / n))) < 1.63 / math.sqrt(n)


def test_normal_odd_sizes_and_pairs(rt):
    # a tail element of an odd-sized draw is the same Box-Muller value a larger draw gives there
    a = host(Philox(rt, 4).normal((7,), dt.float32))
    b = host(Philox(rt, 4).normal((8,), dt.float32))
    np.testing.assert_array_equal(a, b[:7])
    # the two values of a pair come from one (u1, u2): r**2 = -2 log(u1) with u1 in (0, 1]
    w = ref_words(4, 0, 2).reshape(-1)
    u1 = ((w[0::2] >> 8) + 1).astype(np.float64) * 2.0**-24
    r2 = b[0::2].astype(np.float64) ** 2 + b[1::2].astype(np.float64) ** 2
    np.testing.assert_allclose(r2, -2 * np.log(u1), rtol=1e-4, atol=1e-6)


# -- integers -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("low,high", [(0, 10), (-5, 5), (-100, -90), (0, 2), (7, 8)])
def test_integers_range_and_chi_square(rt, low, high):
    n = 100_000
    a = host(Philox(rt, 77).integers(low, high, (n,), dt.int64))
    assert a.dtype == np.int64 and a.min() >= low and a.max() < high
    k = high - low
    counts = np.bincount(a - low, minlength=k)
    assert len(counts) == k
    if k > 1:
        expected = n / k
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        # 99.9% quantile of chi-square with k - 1 <= 9 degrees of freedom is below 28
        assert chi2 < 28, chi2


def test_integers_full_int64_range(rt):
    lo, hi = -(2**63), 2**63 - 1
    a = host(Philox(rt, 5).integers(lo, hi, (20_000,), dt.int64))
    assert (a < 0).mean() == pytest.approx(0.5, abs=0.02)
    assert a.min() < -(2**62) and a.max() > 2**62  # all 64 bits are used
    assert len(np.unique(a)) == a.size


@pytest.mark.parametrize("d,low,high", [
    (dt.uint8, 0, 256), (dt.int8, -128, 128), (dt.int16, -3, 3), (dt.int32, -(2**31), 2**31 - 1),
    (dt.bool_, 0, 2), (dt.float32, -4, 4), (dt.float16, 0, 100), (dt.bfloat16, 0, 50), (dt.float64, 10, 20),
], ids=str)
def test_integers_dtypes(rt, d, low, high):
    if d is dt.float64 and not rt.fp64:
        pytest.skip("device has no float64")
    a = host(Philox(rt, 9).integers(low, high, (20_000,), d))
    assert a.dtype == d.numpy
    v = a.astype(np.float64)
    assert v.min() >= low and v.max() < high
    np.testing.assert_array_equal(v, np.floor(v))
    if high - low <= 256:
        assert len(np.unique(v)) == high - low  # every value shows up


def test_integers_match_the_reference(rt):
    w = ref_words(8, 0, 3).reshape(-1, 2)
    r = (w[:, 0] << np.uint64(32)) | w[:, 1]
    span = 1000
    expected = [-3 + (int(x) * span >> 64) for x in r]
    np.testing.assert_array_equal(host(Philox(rt, 8).integers(-3, 997, (6,), dt.int64)), expected)


# -- through ember ------------------------------------------------------------------------------------------------
def test_backend_stream_is_seeded_per_device(dev):
    dev.seed(1234)
    a = ember.rand(100, device=dev).numpy()
    b = ember.randn(3, 5, device=dev).numpy()
    dev.seed(1234)
    np.testing.assert_array_equal(ember.rand(100, device=dev).numpy(), a)
    np.testing.assert_array_equal(ember.randn(3, 5, device=dev).numpy(), b)
    # the device stream is the documented Philox stream: seed 1234, call 0
    w = ref_words(1234, 0, 25).reshape(-1)
    np.testing.assert_array_equal(a, ((w >> 8).astype(np.float64) * 2.0**-24).astype(np.float32))


def test_dropout_is_reproducible(dev):
    x = ember.ones(1000, device=dev)
    dev.seed(0)
    a = ember.nn.functional.dropout(x, 0.5, training=True).numpy()
    dev.seed(0)
    b = ember.nn.functional.dropout(x, 0.5, training=True).numpy()
    np.testing.assert_array_equal(a, b)
    assert 0.4 < (a == 0).mean() < 0.6


# -- bad input ----------------------------------------------------------------------------------------------------
def test_bad_input(rt, dev):
    gen = Philox(rt, 0)
    with pytest.raises(DTypeError, match="rand.*int64"):
        gen.uniform((3,), dt.int64)
    with pytest.raises(DTypeError, match="randn.*bool"):
        gen.normal((3,), dt.bool_)
    with pytest.raises(ValueRangeError, match=r"randint.*\[5, 5\)"):
        gen.integers(5, 5, (3,), dt.int64)
    with pytest.raises(ValueRangeError, match="randint"):
        gen.integers(0, 2**65, (3,), dt.int64)
    with pytest.raises(ember.DTypeError, match="floating"):
        ember.rand(3, dtype=ember.int64, device=dev)
    with pytest.raises(ember.ValueRangeError, match="low < high"):
        ember.randint(5, 1, (2,), device=dev)
