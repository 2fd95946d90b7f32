"""Conformance: ember.nn.functional convolution, pooling, interpolation, padding and unfold/fold on the device
under test, against torch (a backend without its own kernels runs core's default compositions here)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.nn import functional as F
from ember.testing import torch_or_skip
from ember.testing._helpers import NN_DTYPES as DTYPES
from ember.testing._helpers import E, T, check, raises, rand

torch = torch_or_skip()

TF = torch.nn.functional

CONV_TOL = {np.float32: dict(rtol=1e-4, atol=1e-4), np.float64: dict(rtol=1e-9, atol=1e-10)}

CONV_CASES = [
    # nd, N, Cin, Cout, spatial, k, kwargs
    (1, 2, 3, 4, (17,), (3,), {}),
    (1, 2, 4, 6, (20,), (5,), dict(stride=2, padding=2, dilation=2, groups=2)),
    (1, 2, 3, 4, (10,), (4,), dict(padding="same")),
    (1, 2, 3, 4, (10,), (3,), dict(padding="valid")),
    (2, 2, 3, 5, (9, 11), (3, 3), dict(padding=1)),
    (2, 1, 4, 4, (8, 7), (3, 2), dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=4)),
    (2, 2, 3, 2, (7, 8), (4, 3), dict(padding="same", dilation=(1, 2))),
    (3, 1, 2, 3, (5, 6, 4), (3, 2, 3), dict(stride=(1, 2, 1), padding=1)),
    (3, 2, 2, 2, (4, 5, 6), (2, 3, 2), dict(padding="same")),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(CONV_CASES)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_matches_torch(case, dtype, bias):
    nd, n, cin, cout, sp, k, kw = case
    g = kw.get("groups", 1)
    x = rand((n, cin) + sp, dtype, 1)
    w = rand((cout, cin // g) + k, dtype, 2)
    b = rand((cout,), dtype, 3) if bias else None
    fe, ft = getattr(F, f"conv{nd}d"), getattr(TF, f"conv{nd}d")
    ref = ft(T(x), T(w), None if b is None else T(b), **kw)
    check(fe(E(x, "strided"), E(w), None if b is None else E(b), **kw), ref, **CONV_TOL[dtype])
    # unbatched input
    ref1 = ft(T(x[0]), T(w), None if b is None else T(b), **kw)
    check(fe(E(x[0]), E(w), None if b is None else E(b), **kw), ref1, **CONV_TOL[dtype])


CONVT_CASES = [
    (1, 2, 4, 3, (7,), (3,), dict(stride=2, padding=1, output_padding=1)),
    (1, 1, 4, 2, (6,), (2,), dict(groups=2, dilation=2)),
    (2, 2, 3, 4, (5, 6), (3, 3), dict(stride=2, padding=1, output_padding=(1, 0))),
    (2, 1, 4, 2, (4, 4), (2, 3), dict(stride=(1, 2), groups=2, dilation=(2, 1))),
    (3, 1, 2, 2, (3, 4, 3), (2, 2, 2), dict(stride=2)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONVT_CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(CONVT_CASES)])
def test_conv_transpose_matches_torch(case, dtype):
    nd, n, cin, coutg, sp, k, kw = case
    x = rand((n, cin) + sp, dtype, 1)
    w = rand((cin, coutg) + k, dtype, 2)
    b = rand((coutg * kw.get("groups", 1),), dtype, 3)
    fe, ft = getattr(F, f"conv_transpose{nd}d"), getattr(TF, f"conv_transpose{nd}d")
    check(fe(E(x, "strided"), E(w), E(b), **kw), ft(T(x), T(w), T(b), **kw), **CONV_TOL[dtype])
    check(fe(E(x[0]), E(w), None, **kw), ft(T(x[0]), T(w), None, **kw), **CONV_TOL[dtype])


def test_conv_transpose_positional_order_is_groups_then_dilation():
    x, w = rand((1, 4, 5)), rand((4, 1, 3))
    # stride, padding, output_padding, groups, dilation
    check(F.conv_transpose1d(E(x), E(w), None, 1, 0, 0, 4, 2), TF.conv_transpose1d(T(x), T(w), None, 1, 0, 0, 4, 2))


POOL_CASES = [
    (1, (2, 3, 11), dict(kernel_size=3)),
    (1, (2, 3, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (2, (2, 3, 9, 8), dict(kernel_size=2)),
    (2, (2, 3, 9, 8), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1))),
    (2, (1, 2, 10, 9), dict(kernel_size=3, stride=2, ceil_mode=True)),
    (3, (1, 2, 5, 6, 7), dict(kernel_size=2, stride=(1, 2, 2), padding=1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(POOL_CASES)])
def test_max_pool_matches_torch(case, dtype):
    nd, shape, kw = case
    x = rand(shape, dtype)
    fe, ft = getattr(F, f"max_pool{nd}d"), getattr(TF, f"max_pool{nd}d")
    for dil in (1, 2):
        k = dict(kw, dilation=dil)
        try:
            ref, ridx = ft(T(x), return_indices=True, **k)
        except RuntimeError:
            continue
        out, idx = fe(E(x, "strided"), return_indices=True, **k)
        check(out, ref)
        check(idx, ridx)
        check(fe(E(x[0]), **k), ft(T(x[0]), **k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES, ids=[f"{c[0]}d-{i}" for i, c in enumerate(POOL_CASES)])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_matches_torch(case, dtype, count_include_pad):
    nd, shape, kw = case
    x = rand(shape, dtype)
    fe, ft = getattr(F, f"avg_pool{nd}d"), getattr(TF, f"avg_pool{nd}d")
    check(fe(E(x, "strided"), count_include_pad=count_include_pad, **kw),
          ft(T(x), count_include_pad=count_include_pad, **kw))
    check(fe(E(x[0]), **kw), ft(T(x[0]), **kw))
    if nd > 1:
        check(fe(E(x), divisor_override=3, **kw), ft(T(x), divisor_override=3, **kw))


def test_max_pool_integer_input():
    x = np.random.default_rng(0).integers(-50, 50, (1, 2, 6, 6)).astype(np.int64)
    check(F.max_pool2d(E(x), 2), TF.max_pool2d(T(x), 2))


@pytest.mark.parametrize("nd,shape,out", [
    (1, (2, 3, 10), 4), (1, (2, 3, 10), (3,)), (2, (2, 3, 9, 7), (4, 3)), (2, (2, 3, 9, 7), (None, 2)),
    (2, (3, 8, 8), 3), (3, (1, 2, 5, 6, 7), (2, 3, None)),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_adaptive_pools(nd, shape, out, dtype):
    x = rand(shape, dtype)
    check(getattr(F, f"adaptive_avg_pool{nd}d")(E(x, "strided"), out),
          getattr(TF, f"adaptive_avg_pool{nd}d")(T(x), out))
    v, i = getattr(F, f"adaptive_max_pool{nd}d")(E(x), out, return_indices=True)
    rv, ri = getattr(TF, f"adaptive_max_pool{nd}d")(T(x), out, return_indices=True)
    check(v, rv)
    check(i, ri)


INTERP_CASES = [
    ((2, 3, 7), dict(size=12, mode="nearest")),
    ((2, 3, 7), dict(scale_factor=2.5, mode="nearest")),
    ((2, 3, 7), dict(size=5, mode="linear")),
    ((2, 3, 7), dict(scale_factor=1.7, mode="linear", align_corners=True)),
    ((2, 3, 5, 6), dict(size=(8, 9), mode="bilinear")),
    ((2, 3, 5, 6), dict(scale_factor=(2.0, 1.5), mode="bilinear", align_corners=False)),
    ((2, 3, 5, 6), dict(size=(4, 9), mode="bicubic", align_corners=True)),
    ((1, 2, 5, 6), dict(scale_factor=2, mode="bicubic")),
    ((1, 2, 5, 6), dict(size=(10, 3), mode="nearest-exact")),
    ((1, 2, 9, 7), dict(size=(4, 3), mode="area")),
    ((1, 2, 3, 4, 5), dict(size=(5, 6, 4), mode="trilinear")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 5, 6), dict(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", INTERP_CASES, ids=[f"{c[1]['mode']}-{i}" for i, c in enumerate(INTERP_CASES)])
def test_interpolate_matches_torch(case, dtype):
    shape, kw = case
    x = rand(shape, dtype)
    check(F.interpolate(E(x, "strided"), **kw), TF.interpolate(T(x), **kw), **CONV_TOL[dtype])


def test_upsample_aliases():
    x = rand((1, 2, 3, 4), np.float32)
    check(F.upsample(E(x), scale_factor=2), TF.interpolate(T(x), scale_factor=2))
    check(F.upsample_bilinear(E(x), size=(5, 7)), TF.interpolate(T(x), size=(5, 7), mode="bilinear",
                                                                   align_corners=True))


PAD_CASES = [
    ((2, 3), (1, 2), "constant", None),
    ((2, 3, 4), (1, 2, 0, 3), "constant", 1.5),
    ((2, 3, 4), (-1, 2, 1, -1), "constant", None),
    ((2, 3, 4), (1, 2, 3, 1, 1, 0), "constant", 0.0),
    ((2, 3, 5), (2, 3), "reflect", None),
    ((2, 3, 4, 5), (1, 2, 3, 0), "reflect", None),
    ((3, 4, 5), (1, 2, 3, 1), "replicate", None),
    ((1, 2, 3, 4, 5), (1, 1, 2, 0, 1, 2), "replicate", None),
    ((2, 3, 5), (2, 5), "circular", None),
    ((1, 2, 3, 4), (1, 2, 3, 1), "circular", None),
    # negative pads crop: reflect and replicate index the whole input, circular wraps within the cropped extent
    ((2, 1, 5), (3, -2), "reflect", None),
    ((2, 4, 5), (-1, 2, 2, -3), "reflect", None),
    ((2, 3, 5), (-2, 3), "replicate", None),
    ((2, 3, 5), (3, -2), "circular", None),
    ((2, 4, 5), (-1, 2, 1, -1), "circular", None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PAD_CASES, ids=[f"{c[2]}-{i}" for i, c in enumerate(PAD_CASES)])
def test_pad_matches_torch(case, dtype):
    shape, p, mode, value = case
    x = rand(shape, dtype)
    check(F.pad(E(x, "strided"), p, mode=mode, value=value), TF.pad(T(x), p, mode=mode, value=value))


def test_pad_integer_constant():
    x = np.arange(6).reshape(2, 3)
    check(F.pad(E(x), (1, 1), value=7), TF.pad(T(x), (1, 1), value=7))


@pytest.mark.parametrize("kw", [dict(kernel_size=2),
                                dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1)),
                                dict(kernel_size=3, stride=2, padding=(0, 1))])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unfold_fold(kw, dtype):
    x = rand((2, 3, 7, 8), dtype)
    cols = F.unfold(E(x, "strided"), **kw)
    ref = TF.unfold(T(x), **kw)
    check(cols, ref)
    check(F.unfold(E(x[0]), **kw), TF.unfold(T(x[0]), **kw))
    c = ref.numpy()
    check(F.fold(E(c), (7, 8), **kw), TF.fold(T(c), (7, 8), **kw), **CONV_TOL[dtype])
    check(F.fold(E(c[0]), (7, 8), **kw), TF.fold(T(c[0]), (7, 8), **kw), **CONV_TOL[dtype])


def test_pixel_shuffle_roundtrip():
    x = rand((2, 8, 3, 5), np.float32)
    check(F.pixel_shuffle(E(x), 2), TF.pixel_shuffle(T(x), 2))
    y = rand((2, 3, 6, 4), np.float32)
    check(F.pixel_unshuffle(E(y), 2), TF.pixel_unshuffle(T(y), 2))


def test_empty_batch():
    x = rand((0, 3, 5, 5), np.float32)
    w = rand((4, 3, 3, 3), np.float32)
    assert F.conv2d(E(x), E(w)).shape == (0, 4, 3, 3)
    assert F.max_pool2d(E(x), 2).shape == (0, 3, 2, 2)


def _x(*shape, dtype=np.float32):
    return E(rand(shape, dtype))


def test_conv_errors():
    w = _x(8, 4, 3, 3)
    with raises(ember.ShapeError, "conv2d: expected input with 4 dims (N, C, H, W) or 3 (C, H, W), got shape (2, 3)"):
        F.conv2d(_x(2, 3), w)
    with raises(ember.ShapeError, "conv2d: input has 3 channels but weight expects 4 (weight shape (8, 4, 3, 3), "
                                  "groups=1)"):
        F.conv2d(_x(1, 3, 5, 5), w)
    with raises(ember.ShapeError, "conv2d", "expected weight with 4 dims"):
        F.conv2d(_x(1, 4, 5, 5), _x(8, 4, 3))
    with raises(ember.ShapeError, "conv2d", "larger than the padded input", "(2, 2)"):
        F.conv2d(_x(1, 4, 2, 2), w)
    with raises(ember.ShapeError, "conv1d", "divisible by groups=3"):
        F.conv1d(_x(1, 6, 5), _x(4, 2, 3), groups=3)
    with raises(ember.DTypeError, "conv2d", "weight", "float64"):
        F.conv2d(_x(1, 4, 5, 5), _x(8, 4, 3, 3, dtype=np.float64))
    with raises(ember.DTypeError, "conv2d", "int64"):
        F.conv2d(ember.tensor(np.ones((1, 4, 5, 5), np.int64)), w)
    with raises(ember.ShapeError, "conv2d", "bias", "(8,)", "(4,)"):
        F.conv2d(_x(1, 4, 5, 5), w, _x(4))
    with raises(ember.ValueRangeError, "conv2d", "'same'", "strided"):
        F.conv2d(_x(1, 4, 5, 5), w, padding="same", stride=2)
    with raises(ember.ValueRangeError, "conv2d", "'full'"):
        F.conv2d(_x(1, 4, 5, 5), w, padding="full")
    with raises(ember.ValueRangeError, "conv2d", "stride", "positive"):
        F.conv2d(_x(1, 4, 5, 5), w, stride=0)
    with raises(ember.ValueRangeError, "conv2d", "padding", "non-negative"):
        F.conv2d(_x(1, 4, 5, 5), w, padding=-1)
    with raises(ember.ValueRangeError, "conv3d", "stride", "3 ints"):
        F.conv3d(_x(1, 1, 4, 4, 4), _x(1, 1, 2, 2, 2), stride=(1, 2))
    with raises(ember.ValueRangeError, "conv2d", "groups"):
        F.conv2d(_x(1, 4, 5, 5), w, groups=0)
    with raises(ember.ShapeError, "conv1d: expected input with 3 dims (N, C, L) or 2 (C, L)"):
        F.conv1d(_x(5), _x(1, 1, 2))


def test_conv_transpose_errors():
    with raises(ember.ValueRangeError, "conv_transpose2d", "output padding must be smaller"):
        F.conv_transpose2d(_x(1, 2, 4, 4), _x(2, 3, 3, 3), stride=2, output_padding=2)
    with raises(ember.ShapeError, "conv_transpose1d", "input has 3 channels but weight expects 2"):
        F.conv_transpose1d(_x(1, 3, 4), _x(2, 3, 3))
    with raises(ember.ShapeError, "conv_transpose1d", "not positive"):
        F.conv_transpose1d(_x(1, 2, 1), _x(2, 3, 1), padding=1)
    with raises(ember.ValueRangeError, "conv_transpose2d", "string padding"):
        F.conv_transpose2d(_x(1, 2, 4, 4), _x(2, 3, 3, 3), padding="same")


def test_pool_errors():
    with raises(ember.ValueRangeError, "max_pool2d", "pad should be at most half"):
        F.max_pool2d(_x(1, 1, 8, 8), 2, padding=2)
    with raises(ember.ShapeError, "max_pool2d", "output size", "too small", "(1, 1, 1, 1)"):
        F.max_pool2d(_x(1, 1, 1, 1), 2)
    with raises(ember.ShapeError, "avg_pool1d: expected input with 3 dims (N, C, L) or 2 (C, L), got shape (4,)"):
        F.avg_pool1d(_x(4), 2)
    with raises(ember.ValueRangeError, "avg_pool2d", "divisor_override"):
        F.avg_pool2d(_x(1, 1, 4, 4), 2, divisor_override=0)
    with raises(ember.ValueRangeError, "max_pool2d", "kernel_size", "positive"):
        F.max_pool2d(_x(1, 1, 4, 4), 0)
    with raises(ember.DTypeError, "max_pool2d", "bool"):
        F.max_pool2d(ember.tensor(np.ones((1, 1, 4, 4), bool)), 2)
    with raises(ember.ValueRangeError, "adaptive_avg_pool2d", "output_size"):
        F.adaptive_avg_pool2d(_x(1, 1, 4, 4), (1, 2, 3))
    with raises(ember.ShapeError, "adaptive_max_pool1d", "non-zero"):
        F.adaptive_max_pool1d(_x(1, 1, 0), 2)


def test_interpolate_errors():
    x = _x(1, 2, 4, 4)
    with raises(ember.ValueRangeError, "interpolate", "only one of size or scale_factor"):
        F.interpolate(x, size=3, scale_factor=2)
    with raises(ember.ValueRangeError, "interpolate", "either size or scale_factor"):
        F.interpolate(x)
    with raises(ember.ShapeError, "interpolate", "linear mode needs 3D input"):
        F.interpolate(x, size=3, mode="linear")
    with raises(ember.ValueRangeError, "interpolate", "align_corners"):
        F.interpolate(x, size=3, align_corners=True)
    with raises(ember.ValueRangeError, "interpolate", "mode", "'cubic'"):
        F.interpolate(x, size=3, mode="cubic")
    with raises(ember.ShapeError, "interpolate", "3-D, 4-D or 5-D", "(4, 4)"):
        F.interpolate(_x(4, 4), size=3)
    with raises(ember.ValueRangeError, "interpolate", "size", "2 ints"):
        F.interpolate(x, size=(1, 2, 3))
    with raises(ember.ShapeError, "interpolate", "greater than 0"):
        F.interpolate(x, scale_factor=0.1)
    with raises(ember.UnsupportedError, "antialias"):
        F.interpolate(x, size=2, mode="bilinear", antialias=True)


def test_pad_errors():
    x = _x(1, 2, 3)
    with raises(ember.ValueRangeError, "pad", "divisible by 2"):
        F.pad(x, (1, 2, 3))
    with raises(ember.ShapeError, "pad", "too large", "(1, 2, 3)"):
        F.pad(x, (1,) * 8)
    with raises(ember.ValueRangeError, "pad", "padding size should be less", "(3, 0)"):
        F.pad(x, (3, 0), mode="reflect")
    with raises(ember.ValueRangeError, "pad", "wrapping around"):
        F.pad(x, (4, 0), mode="circular")
    with raises(ember.ValueRangeError, "pad", "mode", "'wrap'"):
        F.pad(x, (1, 1), mode="wrap")
    with raises(ember.ValueRangeError, "pad", "doesn't take in value"):
        F.pad(x, (1, 1), mode="replicate", value=2.0)
    with raises(ember.ShapeError, "pad", "reflect padding of the last 2 dims", "(2, 3)"):
        F.pad(_x(2, 3), (1, 1, 1, 1), mode="reflect")
    with raises(ember.ShapeError, "pad", "negative output size"):
        F.pad(x, (-2, -2))


def test_unfold_fold_errors():
    with raises(ember.ShapeError, "unfold", "expected input with 4 dims"):
        F.unfold(_x(2, 3), 2)
    with raises(ember.ShapeError, "unfold", "do not fit"):
        F.unfold(_x(1, 1, 2, 2), 3)
    with raises(ember.ShapeError, "fold", "divisible by the product of kernel_size"):
        F.fold(_x(1, 5, 4), (3, 3), 2)
    with raises(ember.ShapeError, "fold", "expected size of input's dimension 2 to be 4, but got 5"):
        F.fold(_x(1, 4, 5), (3, 3), 2)
    with raises(ember.ShapeError, "pixel_shuffle", "divisible"):
        F.pixel_shuffle(_x(1, 3, 2, 2), 2)
