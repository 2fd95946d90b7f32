"""The fast paths of flex's GELU and layer-norm kernels (ember_flex.norm_kernels) against torch: the float32 GELU's
``tanh(x h(x**2))`` erf over a dense sweep (tails, zeros, denormals, saturation), inputs that hold inf or NaN,
broadcast-scalar gradients (the gradient of ``f(x).sum()``, never copied out to full size), tiled affine
parameters on inputs of several blocks, the thread pool's ranges, non-contiguous and half-precision inputs, eps and
no-affine. Kernels are called directly on numpy arrays (the backend argument is unused)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ember_flex import norm_kernels as K
from ember_flex import threads

torch = pytest.importorskip("torch")
TF = torch.nn.functional

# torch.testing's float32 defaults; float64 as the other flex norm tests
TOL = {np.float32: {"rtol": 1.3e-6, "atol": 1e-5}, np.float64: {"rtol": 1e-10, "atol": 1e-12}}


@pytest.fixture
def pooled() -> Iterator[None]:
    """Two threads and a pool threshold low enough that the test shapes are cut into ranges."""
    before, min_elems = threads.get_num_threads(), threads.min_elems
    threads.set_num_threads(2)
    threads.min_elems = 1 << 10
    try:
        yield
    finally:
        threads.set_num_threads(before)
        threads.min_elems = min_elems


def _t(a: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(a))


def _close(got: np.ndarray, ref: Any, dtype: Any, **tol: float) -> None:
    ref = ref.detach().numpy() if hasattr(ref, "detach") else np.asarray(ref)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, **{**TOL[np.dtype(dtype).type], **tol})


def _torch_gelu_grads(x: np.ndarray, g: np.ndarray, approximate: str) -> tuple[Any, Any]:
    tx = _t(x).requires_grad_(True)
    ty = TF.gelu(tx, approximate=approximate)
    ty.backward(_t(g))
    return ty, tx.grad


# -- GELU ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 70001), (5,), (K.BLOCK + 1,)], ids=lambda s: "x".join(map(str, s)))
def test_gelu_vs_torch_on_the_pool(pooled: None, dtype: Any, approximate: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(10)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    ty, tgrad = _torch_gelu_grads(x, g, approximate)
    _close(K.gelu(None, x, approximate=approximate), ty, dtype)
    _close(K.gelu_backward(None, x, g, approximate=approximate), tgrad, dtype)


def test_gelu_non_contiguous_input_and_grad() -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((300, 400)) * 3).astype(np.float32).T  # transposed: the kernel copies it
    g = rng.standard_normal((400, 600)).astype(np.float32)[:, ::2]  # strided
    ty, tgrad = _torch_gelu_grads(x, g, "none")
    _close(K.gelu(None, x), ty, np.float32)
    _close(K.gelu_backward(None, x, g), tgrad, np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gelu_half_types_compute_in_float32(dtype: str) -> None:
    """Half types run the float32 kernel and round once, as torch's CPU GELU does."""
    tdt = getattr(torch, dtype)
    x32 = (np.random.default_rng(12).standard_normal((7, 300)) * 3).astype(np.float32)
    tx = _t(x32).to(tdt)
    x = tx.float().numpy().astype(np.float16) if dtype == "float16" else None
    if x is None:  # numpy has no bfloat16: the kernel sees ml_dtypes' type where ember uses it
        ml = pytest.importorskip("ml_dtypes")
        x = tx.float().numpy().astype(ml.bfloat16)
    got = K.gelu(None, x)
    assert got.dtype == x.dtype
    ref = TF.gelu(tx).float().numpy()
    # one rounding to the half type on each side: within one unit in the last place of the half type
    ulp = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=ulp, atol=1e-3)


def _gelu64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 GELU and its derivative (scipy's erfc) at float32 x."""
    import scipy.special as sp

    x64 = x.astype(np.float64)
    cdf = 0.5 * sp.erfc(-x64 / np.sqrt(2))
    return x64 * cdf, cdf + x64 * np.exp(-0.5 * x64 * x64) / np.sqrt(2 * np.pi)


def test_gelu_float32_dense_sweep_against_float64_and_torch() -> None:
    """The float32 ``tanh(x h(x**2))`` chain over every 1e-5 step of |x| <= 10 (tails included): within 6e-7 of the
    float64 GELU (torch's float32 GELU: 1.2e-6 off) and 3e-7 of its derivative, and within the conformance kit's
    tolerance of torch's float32 results (rtol 2e-5, atol 2e-6) as well as torch.testing's."""
    x = np.linspace(-10, 10, 2_000_001).astype(np.float32)
    y, d = K.gelu(None, x), K.gelu_backward(None, x, np.ones_like(x))
    y64, d64 = _gelu64(x)
    np.testing.assert_allclose(y, y64, rtol=0, atol=6e-7)
    np.testing.assert_allclose(d, d64, rtol=0, atol=3e-7)
    ty, tgrad = _torch_gelu_grads(x, np.ones_like(x), "none")
    for tol in ({"rtol": 2e-5, "atol": 2e-6}, TOL[np.float32]):
        _close(y, ty, np.float32, **tol)
        _close(d, tgrad, np.float32, **tol)


def test_gelu_float32_zeros_denormals_and_saturation() -> None:
    """+-0 keep their sign, denormals and tiny values give exactly x / 2 (torch's float32 results), the derivative
    is 1/2 there; beyond |x| = 6 (up to float32's largest) tanh has saturated: GELU(x) = x, GELU(-x) = -0.0, and
    the derivative is 1 and x phi(x), as in torch (which overflows to inf near float32's largest)."""
    tiny = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.2e-38, -1.2e-38, 1e-20, -1e-20], np.float32)
    y = K.gelu(None, tiny)
    np.testing.assert_array_equal(y, tiny * np.float32(0.5))
    assert (np.signbit(y) == np.signbit(tiny)).all()
    np.testing.assert_array_equal(y, TF.gelu(_t(tiny)).numpy())
    np.testing.assert_array_equal(K.gelu_backward(None, tiny, np.ones_like(tiny)), np.full(tiny.shape, 0.5))
    big = np.concatenate([np.linspace(6, 100, 10001), np.geomspace(100, 3.4e38, 10001)]).astype(np.float32)
    np.testing.assert_array_equal(K.gelu(None, big), big)
    neg = K.gelu(None, -big)
    assert (neg == 0).all() and np.signbit(neg).all()
    np.testing.assert_array_equal(K.gelu_backward(None, big, np.ones_like(big)), np.ones_like(big))
    # x phi(x) alone (-3.6e-8 at -6, 0 from -14 on): Phi(x) < 1e-9 is below what 1 + t resolves
    d_neg = K.gelu_backward(None, -big, np.ones_like(big))
    np.testing.assert_allclose(d_neg, _gelu64(-big)[1], rtol=1e-5, atol=1e-9)
    below = big[big < 1e38]  # torch's float32 GELU overflows to inf above ~1.7e38 (x (1 + erf) before the 1/2)
    np.testing.assert_array_equal(TF.gelu(_t(below)).numpy(), below)


def test_gelu_blocks_with_inf_or_nan_keep_their_special_values() -> None:
    """inf -> inf, -inf -> NaN, NaN -> NaN (the erf formula's results) and NaN gradients, with no special path: the
    blocks around them equal the same values computed alone."""
    rng = np.random.default_rng(13)
    x = (rng.standard_normal(3 * K.BLOCK) * 3).astype(np.float32)
    x[K.BLOCK + 5: K.BLOCK + 8] = [np.inf, -np.inf, np.nan]
    y = K.gelu(None, x)
    d = K.gelu_backward(None, x, np.ones_like(x))
    assert y[K.BLOCK + 5] == np.inf and np.isnan(y[K.BLOCK + 6]) and np.isnan(y[K.BLOCK + 7])
    assert np.isnan(d[K.BLOCK + 5: K.BLOCK + 8]).all()
    for part in (slice(0, K.BLOCK), slice(2 * K.BLOCK, 3 * K.BLOCK)):
        np.testing.assert_array_equal(y[part], K.gelu(None, x[part]))
    finite = np.isfinite(x)
    ty, tgrad = _torch_gelu_grads(np.where(finite, x, 0), np.ones_like(x), "none")
    _close(y[finite], ty.detach()[torch.from_numpy(finite)], np.float32)
    _close(d[finite], tgrad[torch.from_numpy(finite)], np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_broadcast_scalar_grad_is_bit_identical(pooled: None, dtype: Any, approximate: str) -> None:
    """A broadcast scalar gradient (not copied out) gives exactly the result of the materialised one."""
    x = (np.random.default_rng(14).standard_normal((4, 70001)) * 3).astype(dtype)
    for value in (1.0, 0.37, -2.5):
        full = np.full(x.shape, value, dtype)
        bcast = np.broadcast_to(dtype(value), x.shape)
        assert not any(bcast.strides)
        got = K.gelu_backward(None, x, bcast, approximate=approximate)
        np.testing.assert_array_equal(got, K.gelu_backward(None, x, full, approximate=approximate))
        assert got.shape == x.shape and got.flags.writeable


# -- layer norm ----------------------------------------------------------------------------------------------------
def _torch_layer_norm(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, dy: np.ndarray,
                      ns: tuple[int, ...], eps: float) -> tuple[Any, ...]:
    tx = _t(x).requires_grad_(True)
    tw = None if w is None else _t(w).requires_grad_(True)
    tb = None if b is None else _t(b).requires_grad_(True)
    ty = TF.layer_norm(tx, ns, tw, tb, eps=eps)
    ty.backward(_t(dy))
    return ty, tx.grad, None if tw is None else tw.grad, None if tb is None else tb.grad


LN_CASES = [((1500, 40), (40,)), ((6, 50, 33), (50, 33)), ((5, 3000), (3000,)), ((2, 3, 7), (7,))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", LN_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + str(len(c[1])))
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layer_norm_vs_torch_on_the_pool(pooled: None, dtype: Any, case: Any, affine: str, eps: float) -> None:
    """Inputs of several row blocks (tiled weight and bias), on the pool's ranges, with either eps."""
    shape, ns = case
    rng = np.random.default_rng(15)
    x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    w = rng.uniform(0.5, 2, ns).astype(dtype) if affine != "none" else None
    b = rng.standard_normal(ns).astype(dtype) if affine == "both" else None
    ty, tdx, tdw, tdb = _torch_layer_norm(x, w, b, dy, ns, eps)
    y, mean, rstd = K.layer_norm(None, x, w, b, normalized_shape=ns, eps=eps)
    _close(y, ty, dtype)
    stat = shape[:len(shape) - len(ns)] + (1,) * len(ns)
    assert mean.shape == rstd.shape == stat
    dx, dw, db = K.layer_norm_backward(None, x, w, mean, rstd, dy, normalized_shape=ns)
    _close(dx, tdx, dtype)
    rows = x.size // int(np.prod(ns))
    tol = {"rtol": 1e-5, "atol": 2e-6 * rows} if dtype == np.float32 else {}
    # without weight (bias), torch has no dweight (dbias): the rows' sums of dy * xhat (dy), in float64
    xhat = (x.astype(np.float64) - mean) * rstd
    _close(dw, tdw if tdw is not None else (dy * xhat).reshape(-1, *ns).sum(0).astype(dtype), dtype, **tol)
    _close(db, tdb if tdb is not None else dy.astype(np.float64).reshape(-1, *ns).sum(0).astype(dtype), dtype,
           **tol)


def test_layer_norm_non_contiguous_input_and_grad() -> None:
    rng = np.random.default_rng(16)
    x = (rng.standard_normal((64, 300)) * 2 + 1).astype(np.float32).T  # (300, 64), transposed
    dy = rng.standard_normal((300, 128)).astype(np.float32)[:, ::2]
    w = rng.uniform(0.5, 2, 64).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    ty, tdx, tdw, tdb = _torch_layer_norm(x, w, b, dy, (64,), 1e-5)
    y, mean, rstd = K.layer_norm(None, x, w, b, normalized_shape=(64,))
    _close(y, ty, np.float32)
    dx, dw, db = K.layer_norm_backward(None, x, w, mean, rstd, dy, normalized_shape=(64,))
    _close(dx, tdx, np.float32)
    _close(dw, tdw, np.float32, rtol=1e-5, atol=1e-3)
    _close(db, tdb, np.float32, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_half_types_compute_in_float32(dtype: str) -> None:
    tdt = getattr(torch, dtype)
    rng = np.random.default_rng(17)
    tx = _t((rng.standard_normal((300, 48)) * 2 + 1).astype(np.float32)).to(tdt)
    tw = _t(rng.uniform(0.5, 2, 48).astype(np.float32)).to(tdt)
    tb = _t(rng.standard_normal(48).astype(np.float32)).to(tdt)
    if dtype == "float16":
        cast = np.float16
    else:
        cast = pytest.importorskip("ml_dtypes").bfloat16
    x, w, b = (t.float().numpy().astype(cast) for t in (tx, tw, tb))
    y, mean, rstd = K.layer_norm(None, x, w, b, normalized_shape=(48,))
    assert y.dtype == x.dtype
    ref = TF.layer_norm(tx, (48,), tw, tb).float().numpy()
    ulp = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=2 * ulp, atol=2 * ulp)


def test_layer_norm_rows_far_from_zero_are_recentred() -> None:
    """Rows whose mean is 1e4 standard deviations from zero: the float32 row sum leaves the mean ~1e-3 standard
    deviations off, which the corrected two-pass removes (y within 2e-6 of float64; torch 2.x's float32 layer_norm
    is 1.6e-3 off here). Rows near zero in the same block keep the plain two-pass result, bit for bit."""
    rng = np.random.default_rng(18)
    x = rng.standard_normal((200, 512)).astype(np.float32)
    x[::2] += np.float32(1e4)
    x64 = x.astype(np.float64)
    y64 = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    y, mean, rstd = K.layer_norm(None, x, None, None, normalized_shape=(512,))
    np.testing.assert_allclose(y, y64, rtol=0, atol=2e-6)
    np.testing.assert_allclose(mean.reshape(-1), x64.mean(1), rtol=1e-7, atol=1e-6)
    np.testing.assert_allclose(rstd.reshape(-1), 1 / np.sqrt(x64.var(1) + 1e-5), rtol=1e-6)
    near, _, _ = K.layer_norm(None, x[1::2], None, None, normalized_shape=(512,))
    np.testing.assert_array_equal(y[1::2], near)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    _, tdx, _, _ = _torch_layer_norm(x, None, None, dy, (512,), 1e-5)
    dx = K.layer_norm_backward(None, x, None, mean, rstd, dy, normalized_shape=(512,))[0]
    _close(dx[1::2], tdx[1::2], np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weight", [True, False])
def test_layer_norm_backward_broadcast_scalar_dy_is_bit_identical(pooled: None, dtype: Any, weight: bool) -> None:
    """A broadcast scalar dy (the gradient of ``layer_norm(x).sum()``) gives exactly the materialised result."""
    rng = np.random.default_rng(19)
    shape, ns = (40, 30, 64), (30, 64)
    x = (rng.standard_normal(shape) + 2).astype(dtype)
    w = rng.uniform(0.5, 2, ns).astype(dtype) if weight else None
    _, mean, rstd = K.layer_norm(None, x, w, None, normalized_shape=ns)
    for value in (1.0, 0.1):
        full = np.full(shape, value, dtype)
        bcast = np.broadcast_to(dtype(value), shape)
        got = K.layer_norm_backward(None, x, w, mean, rstd, bcast, normalized_shape=ns)
        for g, r in zip(got, K.layer_norm_backward(None, x, w, mean, rstd, full, normalized_shape=ns)):
            np.testing.assert_array_equal(g, r)


def test_layer_norm_rows_do_not_depend_on_the_call() -> None:
    """A row's y, mean, rstd and dx are the same bits whether it is normalised in a call of many blocks (tiled
    weight and bias, pool ranges) or alone."""
    rng = np.random.default_rng(20)
    x = (rng.standard_normal((5000, 40)) * 2 + 1).astype(np.float32)
    dy = rng.standard_normal((5000, 40)).astype(np.float32)
    w = rng.uniform(0.5, 2, 40).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    y, mean, rstd = K.layer_norm(None, x, w, b, normalized_shape=(40,))
    dx = K.layer_norm_backward(None, x, w, mean, rstd, dy, normalized_shape=(40,))[0]
    for rows in (slice(0, 3), slice(4321, 4330), slice(4999, 5000)):
        ys, ms, rs = K.layer_norm(None, x[rows], w, b, normalized_shape=(40,))
        np.testing.assert_array_equal(ys, y[rows])
        np.testing.assert_array_equal(ms, mean[rows])
        np.testing.assert_array_equal(rs, rstd[rows])
        dxs = K.layer_norm_backward(None, x[rows], w, ms, rs, dy[rows], normalized_shape=(40,))[0]
        np.testing.assert_array_equal(dxs, dx[rows])


def test_user_threads_running_the_kernels_at_once_keep_their_serial_results(pooled: None) -> None:
    """Kernels called from several Python threads at once (one holds the pool, the others run serially) give each
    thread exactly its serial result: no state is shared between calls."""
    import threading

    rng = np.random.default_rng(21)
    inputs = [(rng.standard_normal((700, 96)) * (i + 1)).astype(np.float32) for i in range(4)]
    w = rng.uniform(0.5, 2, 96).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)

    def run(x: np.ndarray) -> list[np.ndarray]:
        y, mean, rstd = K.layer_norm(None, x, w, b, normalized_shape=(96,))
        return [K.gelu(None, x), K.gelu_backward(None, x, y), y,
                *K.layer_norm_backward(None, x, w, mean, rstd, x, normalized_shape=(96,))]

    expected = [run(x) for x in inputs]
    got: list[list[list[np.ndarray]]] = [[] for _ in inputs]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(5):
                got[i].append(run(inputs[i]))
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not errors
    for i, runs in enumerate(got):
        assert len(runs) == 5
        for outs in runs:
            for o, e in zip(outs, expected[i]):
                np.testing.assert_array_equal(o, e)
