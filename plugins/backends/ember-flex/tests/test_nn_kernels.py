"""Compare ember_flex.nn_kernels against torch.nn.functional."""


import numpy as np
import pytest

from ember_flex import nn_kernels as K

torch = pytest.importorskip("torch")
F = torch.nn.functional


TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def rng(seed=0):
    return np.random.default_rng(seed)


def rand(shape, dtype=np.float32, seed=0):
    return rng(seed).standard_normal(shape).astype(dtype)


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def check(out, ref, dtype=np.float32, **kw):
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == np.dtype(dtype), (out.dtype, dtype)
    assert out.flags.c_contiguous
    tol = dict(TOL[dtype])
    tol.update(kw)
    np.testing.assert_allclose(out, ref, **tol)


def noncontig(a):
    """Same values, non-contiguous memory (reversed-axis copy transposed back)."""
    b = np.asfortranarray(a)
    assert a.ndim < 2 or not b.flags.c_contiguous or a.size <= 1
    return b


TCONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TCONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


# ----------------------------------------------------------------- conv

CONV_CASES = [
    # nd, N, Cin, Cout, spatial, k, stride, pad, dil, groups
    (1, 2, 3, 4, (17,), (3,), (1,), (0,), (1,), 1),
    (1, 2, 4, 6, (20,), (5,), (2,), (2,), (2,), 2),
    (1, 3, 6, 6, (11,), (4,), (3,), (1,), (1,), 6),
    (2, 2, 3, 5, (9, 11), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (2, 2, 8, 16, (13, 12), (3, 2), (2, 1), (1, 0), (1, 2), 4),
    (2, 1, 16, 32, (10, 10), (3, 3), (1, 1), (2, 2), (2, 2), 1),   # channels-last path
    (2, 2, 6, 6, (8, 9), (3, 3), (2, 2), (1, 1), (1, 1), 6),        # depthwise
    (2, 3, 1, 8, (12, 12), (5, 5), (3, 2), (2, 2), (1, 1), 1),
    (3, 2, 4, 6, (6, 7, 5), (3, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 2),
    (3, 1, 8, 4, (5, 6, 7), (2, 3, 2), (2, 1, 1), (0, 1, 1), (2, 1, 1), 1),
]


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_symmetric(case, dtype, bias):
    nd, N, Ci, Co, S, k, s, p, d, g = case
    x = rand((N, Ci) + S, dtype, 1)
    w = rand((Co, Ci // g) + k, dtype, 2)
    b = rand((Co,), dtype, 3) if bias else None
    y = K.conv(x, w, b, s, tuple((q, q) for q in p), d, g)
    ref = TCONV[nd](T(x), T(w), None if b is None else T(b), s, p, d, g)
    check(y, ref, dtype)


@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("cin", [2, 12])
def test_conv_asymmetric_padding(nd, cin):
    S = {1: (15,), 2: (9, 10), 3: (5, 6, 7)}[nd]
    k = {1: (4,), 2: (4, 3), 3: (2, 3, 4)}[nd]
    pads = {1: ((1, 2),), 2: ((2, 1), (0, 3)), 3: ((1, 0), (0, 1), (2, 1))}[nd]
    x = rand((2, cin) + S, seed=4)
    w = rand((6, cin // 2) + k, seed=5)
    b = rand((6,), seed=6)
    flat = []
    for lo, hi in reversed(pads):
        flat += [lo, hi]
    ref = TCONV[nd](F.pad(T(x), flat), T(w), T(b), 1, 0, 1, 2)
    y = K.conv(x, w, b, (1,) * nd, pads, (1,) * nd, 2)
    check(y, ref)


def test_conv_same_padding_even_kernel():
    x = rand((2, 3, 10, 9), seed=7)
    w = rand((4, 3, 4, 2), seed=8)
    ref = F.conv2d(T(x), T(w), None, 1, "same", (2, 1))
    # torch 'same': total = d*(k-1), lo = total//2, hi = total - lo
    pads = ((3, 3), (0, 1))
    check(K.conv(x, w, None, (1, 1), pads, (2, 1), 1), ref)


def test_conv_noncontiguous_and_float16():
    x = rand((2, 4, 9, 8), seed=9)
    w = rand((6, 4, 3, 3), seed=10)
    xs = x.transpose(0, 1, 3, 2)  # non-contiguous
    ref = F.conv2d(T(xs), T(np.ascontiguousarray(w[:, :, ::-1])), None, 2, 1)
    y = K.conv(xs, w[:, :, ::-1], None, (2, 2), ((1, 1), (1, 1)), (1, 1), 1)
    check(y, ref)
    xh = x.astype(np.float16)
    yh = K.conv(xh, w.astype(np.float16), None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1)
    assert yh.dtype == np.float16
    ref = F.conv2d(T(xh.astype(np.float32)), T(w.astype(np.float16).astype(np.float32)))
    np.testing.assert_allclose(yh.astype(np.float32), ref.numpy(), rtol=2e-2, atol=2e-2)


def test_conv_unbatched_and_empty_batch():
    x = rand((3, 8, 8), seed=11)
    w = rand((5, 3, 3, 3), seed=12)
    check(K.conv(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1),
          F.conv2d(T(x), T(w), None, 1, 1))
    x0 = np.zeros((0, 3, 8, 8), np.float32)
    check(K.conv(x0, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1), 1), F.conv2d(T(x0), T(w)))


# ----------------------------------------------------------- weight grad

@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_weight_grad(case, dtype):
    nd, N, Ci, Co, S, k, s, p, d, g = case
    x = rand((N, Ci) + S, dtype, 1)
    w = rand((Co, Ci // g) + k, dtype, 2)
    wt = T(w).requires_grad_()
    y = TCONV[nd](T(x), wt, None, s, p, d, g)
    gy = rand(tuple(y.shape), dtype, 3)
    y.backward(T(gy))
    gw = K.conv_weight_grad(x, gy, w.shape, s, tuple((q, q) for q in p), d, g)
    check(gw, wt.grad, dtype, **({"atol": 1e-4} if dtype == np.float32 else {}))


def test_conv_weight_grad_asymmetric():
    x = rand((2, 4, 9, 10), seed=1)
    w = rand((6, 2, 3, 4), seed=2)
    wt = T(w).requires_grad_()
    y = F.conv2d(F.pad(T(x), [0, 3, 2, 1]), wt, None, (2, 1), 0, 1, 2)
    gy = rand(tuple(y.shape), seed=3)
    y.backward(T(gy))
    gw = K.conv_weight_grad(x, gy, w.shape, (2, 1), ((2, 1), (0, 3)), (1, 1), 2)
    check(gw, wt.grad, atol=1e-4)


@pytest.mark.parametrize("case", CONV_CASES[:6] + CONV_CASES[8:])
def test_conv_input_grad(case):
    nd, N, Ci, Co, S, k, s, p, d, g = case
    x = rand((N, Ci) + S, np.float64, 1)
    w = rand((Co, Ci // g) + k, np.float64, 2)
    xt = T(x).requires_grad_()
    y = TCONV[nd](xt, T(w), None, s, p, d, g)
    gy = rand(tuple(y.shape), np.float64, 3)
    y.backward(T(gy))
    gx = K.conv_input_grad(gy, w, x.shape, s, tuple((q, q) for q in p), d, g)
    check(gx, xt.grad, np.float64)


# -------------------------------------------------------- conv transpose

CONVT_CASES = [
    # nd, N, Cin, Cout, spatial, k, stride, pad, out_pad, dil, groups
    (1, 2, 4, 3, (7,), (3,), (1,), (0,), (0,), (1,), 1),
    (1, 2, 4, 6, (8,), (4,), (3,), (1,), (2,), (1,), 2),
    (2, 2, 3, 5, (5, 6), (3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1),
    (2, 1, 8, 4, (4, 5), (3, 2), (2, 3), (0, 1), (1, 2), (2, 1), 4),
    (2, 2, 16, 16, (6, 6), (3, 3), (1, 1), (1, 1), (0, 0), (1, 1), 1),   # stride 1: conv route
    (2, 2, 32, 8, (5, 6), (3, 3), (1, 1), (2, 1), (0, 0), (2, 1), 1),    # stride 1: col2im route
    (1, 2, 40, 6, (9,), (7,), (1,), (4,), (0,), (1,), 2),               # crops (k-1-p < 0)
    (2, 2, 6, 6, (5, 5), (3, 3), (2, 2), (2, 2), (1, 1), (1, 1), 6),
    (3, 2, 4, 6, (3, 4, 3), (2, 3, 2), (2, 1, 2), (0, 1, 1), (1, 0, 1), (1, 1, 2), 2),
]


@pytest.mark.parametrize("case", CONVT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose(case, dtype, bias):
    nd, N, Ci, Co, S, k, s, p, op, d, g = case
    x = rand((N, Ci) + S, dtype, 1)
    w = rand((Ci, Co // g) + k, dtype, 2)
    b = rand((Co,), dtype, 3) if bias else None
    y = K.conv_transpose(x, w, b, s, p, op, d, g)
    ref = TCONVT[nd](T(x), T(w), None if b is None else T(b), s, p, op, g, d)
    check(y, ref, dtype)


def test_conv_transpose_noncontiguous():
    x = rand((2, 4, 6, 5), seed=1).transpose(0, 1, 3, 2)
    w = rand((4, 3, 3, 3), seed=2)
    y = K.conv_transpose(x, w, None, (2, 2), (1, 1), (1, 1), (1, 1), 1)
    check(y, F.conv_transpose2d(T(x), T(w), None, 2, 1, 1))


# ------------------------------------------------------------------ pools

TMAXP = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
TAVGP = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}

POOL_CASES = [
    # nd, spatial, k, stride, pad, dil
    (1, (13,), (3,), (2,), (1,), (1,)),
    (1, (10,), (4,), (3,), (2,), (2,)),
    (2, (9, 10), (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, (11, 8), (3, 2), (2, 3), (1, 1), (2, 1)),
    (2, (7, 7), (2, 2), (2, 2), (0, 0), (1, 1)),
    (3, (6, 7, 5), (2, 3, 2), (2, 2, 1), (1, 1, 0), (1, 1, 2)),
]


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool(case, ceil_mode, dtype):
    nd, S, k, s, p, d = case
    x = rand((2, 3) + S, dtype, 5)
    ref, ridx = TMAXP[nd](T(x), k, s, p, d, ceil_mode, True)
    y = K.max_pool(x, k, s, p, d, ceil_mode, False)
    check(y, ref, dtype)
    y2, idx = K.max_pool(noncontig(x), k, s, p, d, ceil_mode, True)
    check(y2, ref, dtype)
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, ridx.numpy())


def test_max_pool_ties_and_neg_inf():
    x = np.zeros((1, 2, 6, 6), np.float32)
    x[0, 1] = -np.inf
    x[0, 0, 2:4, 2:4] = 1.0
    ref, ridx = F.max_pool2d(T(x), 3, 2, 1, 1, True, True)
    y, idx = K.max_pool(x, (3, 3), (2, 2), (1, 1), (1, 1), True, True)
    check(y, ref)
    np.testing.assert_array_equal(idx, ridx.numpy())


@pytest.mark.parametrize("shape,k", [((3, 4, 10, 12), (2, 2)), ((2, 3, 6, 4, 8), (2, 2, 2)), ((2, 5, 12), (3,))])
def test_max_pool_tiled_ties_pick_the_first_tap(shape, k):
    """Non-overlapping windows (the tiled path) over small integers: most windows hold ties, and the index is the
    first tap equal to the max, as torch's."""
    x = np.random.default_rng(3).integers(0, 3, shape).astype(np.float32)
    ref, ridx = TMAXP[len(k)](T(x), k, k, 0, 1, False, True)
    y, idx = K.max_pool(x, k, k, tuple(0 for _ in k), tuple(1 for _ in k), False, True)
    check(y, ref)
    np.testing.assert_array_equal(idx, ridx.numpy())


@pytest.mark.parametrize("shape", [(2, 3, 12, 14), (3, 12, 16), (2, 2, 13, 14), (2, 3, 8, 8), (2, 3, 11, 11),
                                   (3, 2, 2), (2, 3, 7, 3), (2, 5, 6)])
@pytest.mark.parametrize("fill", ["ties", "inf", "nan"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_pool_2x2_pairwise_path(monkeypatch, shape, fill, dtype):
    """The 2x2 pairwise kernel (rows first, then columns; odd sizes cropped): values and first-tap indices as
    torch's over ties (every order of equal taps: small integers), +-inf and NaN (which falls back to the tap
    loop), on strided input too."""
    calls = []
    real = K._pool_2x2_into
    monkeypatch.setattr(K, "_pool_2x2_into", lambda *a: calls.append(1) or real(*a))
    g = np.random.default_rng(11)
    x = g.integers(0, 3, shape).astype(dtype)
    if fill == "inf":
        x[g.random(shape) < 0.2] = np.inf
        x[g.random(shape) < 0.2] = -np.inf
    elif fill == "nan":
        x[g.random(shape) < 0.05] = np.nan
    ref, ridx = F.max_pool2d(T(x), 2, 2, 0, 1, False, True)
    for inp in (x, noncontig(x)):
        y, idx = K.max_pool(inp, (2, 2), (2, 2), (0, 0), (1, 1), False, True)
        check(y, ref, dtype, equal_nan=True)
        np.testing.assert_array_equal(idx, ridx.numpy())
    assert calls


@pytest.mark.parametrize("shape,k", [((5, 3, 12, 14), (2, 2)), ((4, 3, 11, 9), (2, 2)), ((3, 4, 6, 4, 8), (2, 2, 2))])
@pytest.mark.parametrize("nan", [False, True])
def test_max_pool_tiled_blocks_on_the_pool(monkeypatch, shape, k, nan):
    """The tiled kernels run on blocks of planes, on flex's pool for large inputs: blocks of a few planes on 1 and
    3 threads give torch's values and indices; NaN in one block sends the whole call to the tap loop."""
    from ember_flex import threads

    x = np.random.default_rng(4).integers(0, 4, shape).astype(np.float32)
    if nan:
        x.reshape(-1)[x.size // 2 + 3] = np.nan
    ref, ridx = TMAXP[len(k)](T(x), k, k, 0, 1, False, True)
    monkeypatch.setattr(K, "_POOL_BLOCK", 2 * int(np.prod(shape[2:])))  # two planes per block
    before, min_elems = threads.get_num_threads(), threads.min_elems
    try:
        for n in (1, 3):
            threads.set_num_threads(n)
            if n > 1:
                threads.min_elems = 1
            y, idx = K.max_pool(x, k, k, tuple(0 for _ in k), tuple(1 for _ in k), False, True)
            check(y, ref, equal_nan=True)
            np.testing.assert_array_equal(idx, ridx.numpy())
    finally:
        threads.set_num_threads(before)
        threads.min_elems = min_elems


def _scatter_reference(g, idx, x_shape, nd, overlap):
    """The composition max_pool_backward replaces: scatter into zeros along each flattened input plane."""
    nb = len(x_shape) - nd
    n, plane = int(np.prod(x_shape[:nb])), int(np.prod(x_shape[nb:]))
    out = np.zeros((n, plane), g.dtype)
    rows = np.arange(n)[:, None]
    if overlap:
        np.add.at(out, (rows, idx.reshape(n, -1)), g.reshape(n, -1))
    else:
        out[rows, idx.reshape(n, -1)] = g.reshape(n, -1)
    return out.reshape(x_shape)


MPB_CASES = [
    # nd, input shape, kernel, stride, padding, dilation (the windows overlap where stride < dilated kernel)
    (2, (3, 4, 12, 14), (2, 2), (2, 2), (0, 0), (1, 1)),
    (2, (2, 3, 11, 9), (2, 2), (2, 2), (0, 0), (1, 1)),
    (2, (2, 3, 9, 10), (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, (3, 5, 13), (3,), (1,), (1,), (2,)),
    (3, (2, 2, 6, 7, 5), (2, 3, 2), (2, 2, 1), (1, 1, 0), (1, 1, 2)),
    (2, (5, 12, 14), (2, 2), (2, 2), (0, 0), (1, 1)),  # unbatched (C, H, W)
]


@pytest.mark.parametrize("case", MPB_CASES, ids=[f"{c[0]}d-{'x'.join(map(str, c[1]))}" for c in MPB_CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("blocks", ["default", "small"])
def test_max_pool_backward(monkeypatch, case, dtype, blocks):
    """Torch's max-pool input gradient, and bit for bit the scatter composition it replaces, over ties (small
    integers), overlapping windows, padding, 1-3 pooled dims; in blocks of one plane on the pool too."""
    from ember_flex import threads

    nd, shape, k, s, p, d = case
    x = np.random.default_rng(6).integers(0, 4, shape).astype(dtype)
    _, idx = K.max_pool(x, k, s, p, d, False, True)
    g = rand(idx.shape, dtype, 7)
    overlap = any(si < di * (ki - 1) + 1 for si, di, ki in zip(s, d, k))
    xt = T(x).requires_grad_()
    TMAXP[nd](xt, k, s, p, d).backward(T(g))
    before, min_elems = threads.get_num_threads(), threads.min_elems
    try:
        if blocks == "small":
            monkeypatch.setattr(K, "_POOL_BLOCK", 1)
            threads.set_num_threads(3)
            threads.min_elems = 1
        dx = K.max_pool_backward(g, idx, x.shape, nd, overlap)
    finally:
        threads.set_num_threads(before)
        threads.min_elems = min_elems
    assert dx.shape == x.shape and dx.dtype == np.dtype(dtype) and dx.flags.c_contiguous
    np.testing.assert_array_equal(dx, _scatter_reference(g, idx, x.shape, nd, overlap))
    check(dx, xt.grad, dtype)


@pytest.mark.parametrize("side", [26, 11])
@pytest.mark.parametrize("planes_per_block", [3, 0])
def test_max_pool_seed_cnn_shapes_blocks_and_scratch(monkeypatch, side, planes_per_block):
    """The seed CNN's pools (2x2 over 26x26 and, cropped, 11x11 planes of ReLU outputs: ties at 0 everywhere) in
    blocks of three planes over seven planes (a short last block) or of one plane larger than a block (uncached
    window starts, no plane offsets), on 1 and 2 threads, then a larger and a smaller call reusing the per-thread
    index scratch and the cached window starts: torch's values, indices and input gradient each time, bit for bit
    the scatter composition."""
    from ember_flex import threads

    before, min_elems = threads.get_num_threads(), threads.min_elems
    monkeypatch.setattr(K, "_POOL_BLOCK", max(1, planes_per_block * side * side))
    try:
        for n_threads, batch in ((1, 7), (2, 7), (2, 11), (1, 2)):
            threads.set_num_threads(n_threads)
            if n_threads > 1:
                threads.min_elems = 1
            x = np.maximum(rand((batch, 1, side, side), np.float32, batch), 0)
            xt = T(x).requires_grad_()
            ref, ridx = F.max_pool2d(xt, 2, 2, 0, 1, False, True)
            y, idx = K.max_pool(x, (2, 2), (2, 2), (0, 0), (1, 1), False, True)
            np.testing.assert_array_equal(y, ref.detach().numpy())
            np.testing.assert_array_equal(idx, ridx.numpy())
            g = rand(idx.shape, np.float32, 100 + batch)
            ref.backward(T(g))
            dx = K.max_pool_backward(g, idx, x.shape, 2)
            np.testing.assert_array_equal(dx, xt.grad.numpy())
            np.testing.assert_array_equal(dx, _scatter_reference(g, idx, x.shape, 2, False))
    finally:
        threads.set_num_threads(before)
        threads.min_elems = min_elems


def test_max_pool_backward_adaptive_and_errors():
    """Adaptive max pooling's indices (windows overlap where sizes do not divide); mismatched shapes are refused."""
    x = rand((2, 3, 7, 10), np.float32, 8)
    _, idx = K.adaptive_max_pool(x, (3, 4), True)
    g = rand(idx.shape, np.float32, 9)
    xt = T(x).requires_grad_()
    F.adaptive_max_pool2d(xt, (3, 4)).backward(T(g))
    check(K.max_pool_backward(g, idx, x.shape, 2, True), xt.grad)
    with pytest.raises(ValueError, match="max_pool_backward"):
        K.max_pool_backward(g, idx[:1], x.shape, 2)
    with pytest.raises(ValueError, match="max_pool_backward"):
        K.max_pool_backward(g, idx, (3, 3, 7, 10), 2)


def test_max_pool_empty_batch():
    x = np.zeros((0, 3, 8, 8), np.float32)
    y, idx = K.max_pool(x, (2, 2), (2, 2), (0, 0), (1, 1), False, True)
    assert y.shape == (0, 3, 4, 4) and idx.shape == (0, 3, 4, 4)


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_avg_pool(case, ceil_mode, count_include_pad, dtype):
    nd, S, k, s, p, _ = case
    x = rand((2, 3) + S, dtype, 6)
    ref = TAVGP[nd](T(x), k, s, p, ceil_mode, count_include_pad)
    check(K.avg_pool(noncontig(x), k, s, p, ceil_mode, count_include_pad, None), ref, dtype)


@pytest.mark.parametrize("nd", [2, 3])
def test_avg_pool_divisor_override(nd):
    S = (9, 8, 7)[:nd]
    x = rand((2, 3) + S, seed=7)
    ref = TAVGP[nd](T(x), 3, 2, 1, True, True, 5)
    check(K.avg_pool(x, (3,) * nd, (2,) * nd, (1,) * nd, True, True, 5), ref)


TAAVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
TAMAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
ADAPT_CASES = [
    ((13,), (5,)), ((7,), (7,)), ((5,), (8,)),
    ((10, 9), (3, 4)), ((7, 11), (7, 3)), ((4, 5), (6, 7)), ((6, 6), (1, 1)),
    ((7, 6, 5), (3, 4, 2)),
]


@pytest.mark.parametrize("S,O", ADAPT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adaptive_avg_pool(S, O, dtype):
    x = rand((2, 3) + S, dtype, 8)
    check(K.adaptive_avg_pool(noncontig(x), O), TAAVG[len(S)](T(x), O), dtype)


@pytest.mark.parametrize("S,O", ADAPT_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adaptive_max_pool(S, O, dtype):
    x = rand((2, 3) + S, dtype, 9)
    ref, ridx = TAMAX[len(S)](T(x), O, True)
    check(K.adaptive_max_pool(x, O, False), ref, dtype)
    y, idx = K.adaptive_max_pool(noncontig(x), O, True)
    check(y, ref, dtype)
    np.testing.assert_array_equal(idx, ridx.numpy())


def test_adaptive_max_pool_ties():
    x = np.zeros((1, 1, 5, 7), np.float32)
    x[0, 0, 1:3, 2:5] = 2.0
    ref, ridx = F.adaptive_max_pool2d(T(x), (2, 3), True)
    y, idx = K.adaptive_max_pool(x, (2, 3), True)
    check(y, ref)
    np.testing.assert_array_equal(idx, ridx.numpy())


# ------------------------------------------------------------ interpolate

INTERP_SHAPES = {
    1: [((9,), (17,)), ((12,), (5,)), ((6,), (6,)), ((5,), (10,))],
    2: [((5, 7), (9, 12)), ((10, 9), (4, 6)), ((6, 5), (6, 10)), ((4, 4), (1, 3))],
    3: [((3, 4, 5), (6, 7, 3)), ((4, 3, 2), (4, 6, 5))],
}
LIN_MODE = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _interp_cases(modes):
    for nd, shapes in INTERP_SHAPES.items():
        for S, O in shapes:
            for mode in modes(nd):
                yield nd, S, O, mode


@pytest.mark.parametrize("nd,S,O,mode", list(_interp_cases(lambda nd: ["nearest", "nearest-exact"])))
def test_interpolate_nearest_size(nd, S, O, mode):
    x = rand((2, 3) + S, seed=10)
    ref = F.interpolate(T(x), size=O, mode=mode)
    check(K.interpolate(noncontig(x), O, mode), ref)


def _lin_modes(nd):
    return [LIN_MODE[nd]] + (["bicubic"] if nd == 2 else [])


@pytest.mark.parametrize("nd,S,O,mode", list(_interp_cases(_lin_modes)))
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_interpolate_linear_size(nd, S, O, mode, align_corners, dtype):
    x = rand((2, 3) + S, dtype, 11)
    ref = F.interpolate(T(x), size=O, mode=mode, align_corners=align_corners)
    check(K.interpolate(noncontig(x), O, mode, align_corners), ref, dtype)


SCALE_CASES = [
    (1, (7,), (1.7,)), (1, (10,), (0.45,)),
    (2, (5, 6), (2.3, 1.5)), (2, (9, 8), (0.6, 1.35)), (2, (4, 4), (2.0, 3.0)),
    (3, (3, 4, 5), (1.5, 2.2, 0.7)),
    (1, (4,), (2.2,)), (2, (4, 4), (2.2, 1.1)), (3, (4, 3, 4), (2.2, 1.1, 2.0)),  # torch short-cuts
]


@pytest.mark.parametrize("nd,S,sf", SCALE_CASES)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolate_scale_factor(nd, S, sf, mode, align_corners):
    if mode == "linear":
        mode = LIN_MODE[nd]
    if mode == "bicubic" and nd != 2:
        pytest.skip("bicubic is 2-d only")
    if mode.startswith("nearest") and align_corners:
        pytest.skip("align_corners not allowed for nearest")
    x = rand((2, 3) + S, seed=12)
    kw = {} if mode.startswith("nearest") else {"align_corners": align_corners}
    ref = F.interpolate(T(x), scale_factor=sf, mode=mode, **kw)
    size = tuple(int(np.floor(S[i] * sf[i])) for i in range(nd))
    assert tuple(ref.shape[2:]) == size
    y = K.interpolate(x, size, mode, align_corners if kw else None, scales=sf)
    check(y, ref)
    # recompute_scale_factor=True == plain size-based call
    ref2 = F.interpolate(T(x), scale_factor=sf, mode=mode, recompute_scale_factor=True, **kw)
    check(K.interpolate(x, size, mode, align_corners if kw else None), ref2)


def test_interpolate_float16_and_empty():
    x = rand((2, 3, 5, 6), seed=13).astype(np.float16)
    y = K.interpolate(x, (7, 9), "bilinear", False)
    assert y.dtype == np.float16
    ref = F.interpolate(T(x.astype(np.float32)), size=(7, 9), mode="bilinear", align_corners=False)
    np.testing.assert_allclose(y.astype(np.float32), ref.numpy(), rtol=1e-2, atol=1e-2)
    x0 = np.zeros((0, 3, 5, 6), np.float32)
    assert K.interpolate(x0, (7, 9), "bicubic", True).shape == (0, 3, 7, 9)


# -------------------------------------------------------------------- pad

def _torch_pads(pads):
    flat = []
    for lo, hi in reversed(pads):
        flat += [lo, hi]
    return flat


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pads", [
    ((2, 3, 8), ((0, 0), (0, 0), (2, 3))),
    ((2, 3, 6, 7), ((0, 0), (0, 0), (1, 2), (3, 0))),
    ((1, 2, 4, 5, 6), ((0, 0), (0, 0), (1, 1), (2, 0), (0, 3))),
])
def test_pad(mode, shape, pads):
    x = rand(shape, seed=14)
    nsp = len(shape) - 2
    ref = F.pad(T(x), _torch_pads(pads[2:]), mode=mode, **({"value": 1.5} if mode == "constant" else {}))
    check(K.pad(noncontig(x), pads, mode, 1.5), ref)
    assert nsp >= 1


def test_pad_constant_negative_and_all_dims():
    x = rand((3, 4, 5), seed=15)
    pads = ((1, -1), (-2, 3), (0, 2))
    ref = F.pad(T(x), _torch_pads(pads), value=-2.0)
    check(K.pad(x, pads, "constant", -2.0), ref)
    y = K.pad(x, ((0, 0), (0, 0), (0, 0)), "constant", 0.0)
    assert y is not x and np.array_equal(y, x)


def test_pad_circular_negative():
    x = rand((2, 3, 6, 7), seed=16)
    pads = ((0, 0), (0, 0), (2, -1), (-2, 3))
    ref = F.pad(T(x), _torch_pads(pads[2:]), mode="circular")
    check(K.pad(x, pads, "circular", 0.0), ref)


# ------------------------------------------------------------ unfold/fold

UNFOLD_CASES = [
    ((2, 3, 8, 9), (3, 3), (1, 1), (0, 0), (1, 1)),
    ((2, 2, 10, 7), (3, 2), (2, 1), (1, 2), (2, 1)),
    ((1, 4, 6, 6), (2, 2), (1, 1), (0, 0), (2, 2)),
]


@pytest.mark.parametrize("shape,k,d,p,s", UNFOLD_CASES)
def test_unfold(shape, k, d, p, s):
    x = rand(shape, seed=17)
    ref = F.unfold(T(x), k, d, p, s)
    check(K.unfold(noncontig(x), k, d, p, s), ref)


@pytest.mark.parametrize("shape,k,d,p,s", UNFOLD_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fold(shape, k, d, p, s, dtype):
    N, C, H, W = shape
    L = F.unfold(torch.zeros(shape), k, d, p, s).shape[-1]
    cols = rand((N, C * k[0] * k[1], L), dtype, 18)
    ref = F.fold(T(cols), (H, W), k, d, p, s)
    check(K.fold(noncontig(cols), (H, W), k, d, p, s), ref, dtype)
    # unbatched
    ref1 = F.fold(T(cols[0]), (H, W), k, d, p, s)
    check(K.fold(cols[0], (H, W), k, d, p, s), ref1, dtype)


def test_fold_unfold_roundtrip_counts():
    x = np.ones((1, 2, 7, 7), np.float32)
    cols = K.unfold(x, (3, 3), (1, 1), (1, 1), (2, 2))
    ref = F.fold(F.unfold(T(x), 3, 1, 1, 2), (7, 7), 3, 1, 1, 2)
    check(K.fold(cols, (7, 7), (3, 3), (1, 1), (1, 1), (2, 2)), ref)
