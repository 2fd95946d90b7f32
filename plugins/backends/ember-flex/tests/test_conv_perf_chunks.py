"""flex's batch-chunked convolution kernels (conv, its weight and input gradients, conv_transpose) against torch.

The kernels work on a chunk of the batch at a time in scratch of about ``_CHUNK_BYTES``; these tests shrink the
chunk to one sample and to two (a short last chunk for odd batches) so every chunked path runs with several chunks,
and check the results against torch for strides, dilation, groups (depthwise too), asymmetric and cropping pads,
float64 and float16, batch 1 and odd sizes. The results must not depend on BLAS's thread count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ember_flex import nn_kernels as K

torch = pytest.importorskip("torch")
F = torch.nn.functional


TCONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TCONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TOL = {np.float32: {"rtol": 1e-4, "atol": 1e-4}, np.float64: {"rtol": 1e-10, "atol": 1e-11}}

# nd, N, Cin, Cout, spatial, k, stride, pads ((lo, hi) per dim; negative crops), dilation, groups
CASES = [
    (2, 5, 16, 8, (9, 8), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),      # channels-last (R = 144)
    (2, 7, 12, 6, (11, 10), (3, 2), (2, 1), ((2, 1), (0, 3)), (1, 2), 1),    # asymmetric pads, stride, dilation
    (2, 4, 32, 12, (7, 9), (3, 3), (2, 2), ((0, 0), (1, 1)), (1, 1), 2),     # groups, channels-last
    (2, 6, 8, 8, (8, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 8),       # depthwise (channels-first)
    (2, 9, 1, 6, (12, 11), (3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),     # one input channel (first layer)
    (2, 3, 40, 5, (6, 6), (2, 2), (1, 1), ((-1, 0), (0, -1)), (1, 1), 1),    # cropping pads
    (1, 5, 40, 7, (13,), (3,), (2,), ((1, 2),), (2,), 1),                   # 1-d, channels-last
    (3, 3, 8, 4, (5, 6, 5), (2, 3, 2), (1, 2, 1), ((1, 0), (0, 1), (1, 1)), (1, 1, 2), 2),  # 3-d
    (2, 1, 33, 3, (5, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),      # batch 1, odd channel count
]
IDS = [f"{c[0]}d-n{c[1]}-ci{c[2]}-co{c[3]}-g{c[9]}" for c in CASES]


def _rand(shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _t(a: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(a))


def _torch_pad(x: Any, pads: tuple[tuple[int, int], ...]) -> Any:
    flat: list[int] = []
    for lo, hi in reversed(pads):
        flat += [lo, hi]
    return F.pad(x, flat)


def _check(out: np.ndarray, ref: Any, dtype: Any, scale: float = 1.0) -> None:
    ref = ref.detach().numpy()
    assert out.shape == ref.shape and out.dtype == np.dtype(dtype) and out.flags.c_contiguous
    tol = dict(TOL[dtype])
    tol["atol"] *= scale
    np.testing.assert_allclose(out, ref, **tol)


@pytest.fixture(params=["one", "uneven", "default"])
def chunking(request: Any, monkeypatch: Any) -> None:
    """Samples per chunk: one, two (the last chunk of an odd batch shorter), or the kernels' own choice."""
    for name in ("_batch_chunk", "_cache_chunk"):
        if request.param == "one":
            monkeypatch.setattr(K, name, lambda n, per_sample_bytes: 1)
        elif request.param == "uneven":
            monkeypatch.setattr(K, name, lambda n, per_sample_bytes: min(n, 2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_forward_chunked(case: tuple[Any, ...], dtype: Any, chunking: None) -> None:
    nd, N, Ci, Co, S, k, s, pads, d, g = case
    x, w, b = _rand((N, Ci) + S, dtype, 1), _rand((Co, Ci // g) + k, dtype, 2), _rand((Co,), dtype, 3)
    for bias in (b, None):
        y = K.conv(x, w, bias, s, pads, d, g)
        ref = TCONV[nd](_torch_pad(_t(x), pads), _t(w), None if bias is None else _t(bias), s, 0, d, g)
        _check(y, ref, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_gradients_chunked(case: tuple[Any, ...], dtype: Any, chunking: None) -> None:
    nd, N, Ci, Co, S, k, s, pads, d, g = case
    x, w = _rand((N, Ci) + S, dtype, 1), _rand((Co, Ci // g) + k, dtype, 2)
    xt, wt = _t(x).requires_grad_(), _t(w).requires_grad_()
    y = TCONV[nd](_torch_pad(xt, pads), wt, None, s, 0, d, g)
    gy = _rand(tuple(y.shape), dtype, 3)
    y.backward(_t(gy))
    # the weight gradient sums over the whole batch and every output position: a wider absolute tolerance
    _check(K.conv_weight_grad(x, gy, w.shape, s, pads, d, g), wt.grad, dtype, scale=10.0)
    _check(K.conv_input_grad(gy, w, x.shape, s, pads, d, g), xt.grad, dtype)


@pytest.mark.parametrize("chunk", ["one", "default"])
def test_conv_transpose_chunked(chunk: str, monkeypatch: Any) -> None:
    """conv_transpose's col2im route (stride > 1) runs the chunked input-gradient core."""
    if chunk == "one":
        monkeypatch.setattr(K, "_cache_chunk", lambda n, per_sample_bytes: 1)
    x, w, b = _rand((5, 12, 5, 6), np.float32, 1), _rand((12, 4, 3, 3), np.float32, 2), _rand((8,), np.float32, 3)
    y = K.conv_transpose(x, w, b, (2, 2), (1, 1), (1, 0), (1, 1), 2)
    _check(y, F.conv_transpose2d(_t(x), _t(w), _t(b), 2, 1, (1, 0), 2, 1), np.float32)


def test_conv_float16_unbatched_chunked(monkeypatch: Any) -> None:
    monkeypatch.setattr(K, "_batch_chunk", lambda n, per_sample_bytes: 1)
    monkeypatch.setattr(K, "_cache_chunk", lambda n, per_sample_bytes: 1)
    x, w = _rand((3, 40, 7, 7), np.float16, 1), _rand((6, 40, 3, 3), np.float16, 2)
    y = K.conv(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    assert y.dtype == np.float16
    ref = F.conv2d(_t(x.astype(np.float32)), _t(w.astype(np.float32)), None, 1, 1)
    np.testing.assert_allclose(y.astype(np.float32), ref.numpy(), rtol=2e-2, atol=5e-2)
    gw = K.conv_weight_grad(x, y, w.shape, (1, 1), ((1, 1), (1, 1)), (1, 1), 1)
    assert gw.dtype == np.float16 and gw.shape == w.shape
    y1 = K.conv(x[0], w, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1)  # unbatched (C, H, W)
    np.testing.assert_array_equal(y1, y[0])


# batch, in channels, out channels, spatial, dtype: reductions (GEMM K) of awkward lengths -- 37 * 121 rows for the
# weight gradient, 52 * 9 = 468 and 30 * 9 = 270 for the forward, 676 positions of the first layer's weight gradient;
# the seed CNN's second convolution at batch 64 (the whole-batch kernels gave different bits at 1 and 2 threads there)
THREAD_CASES = [(37, 64, 64, (13, 13), np.float32), (9, 52, 16, (9, 9), np.float32), (5, 30, 24, (12, 12), np.float32),
                (13, 1, 64, (28, 28), np.float32), (64, 64, 64, (13, 13), np.float32),
                (37, 64, 64, (13, 13), np.float64)]


@pytest.mark.parametrize("case", THREAD_CASES, ids=[f"n{c[0]}-ci{c[1]}-co{c[2]}" for c in THREAD_CASES])
def test_conv_results_do_not_depend_on_blas_threads(case: tuple[Any, ...]) -> None:
    """Bit-identical for any BLAS thread count: chunks depend on shapes only, and long GEMM reductions run as a
    multiple-of-64 head plus a short tail (OpenBLAS's threaded and serial drivers block other lengths differently)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    N, Ci, Co, S, dtype = case
    x, w, b = _rand((N, Ci) + S, dtype, 1), _rand((Co, Ci, 3, 3), dtype, 2), _rand((Co,), dtype, 3)
    pads = ((1, 0), (0, 1))

    def run() -> list[np.ndarray]:
        y = K.conv(x, w, b, (1, 1), pads, (1, 1), 1)
        return [y, K.conv_weight_grad(x, y, w.shape, (1, 1), pads, (1, 1), 1),
                K.conv_input_grad(y, w, x.shape, (1, 1), pads, (1, 1), 1)]

    results = []
    for threads in (1, 2, 3):
        with threadpoolctl.threadpool_limits(threads, user_api="blas"):
            results.append(run())
    for other in results[1:]:
        for a, c in zip(results[0], other):
            np.testing.assert_array_equal(a, c)


def test_gemm_long_reductions() -> None:
    """_gemm splits a long reduction into a multiple-of-64 head and a tail: the product is still a @ b."""
    rng = np.random.default_rng(0)
    for k in (7, 256, 257, 605, 968, 1024):
        a, b = rng.standard_normal((3, 20, k)), rng.standard_normal((3, k, 11))
        out = np.empty((3, 20, 11))
        K._gemm(a, b, out)
        np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)


def test_batch_chunk_sizes() -> None:
    """At least one sample, at most the batch, about _CHUNK_BYTES of scratch, at most _MAX_CHUNKS chunks (the
    whole-batch BLAS path); the pooled kernels' chunks have no cap on their number."""
    assert K._batch_chunk(4, K._CHUNK_BYTES * 10) == 1
    assert K._batch_chunk(64, K._CHUNK_BYTES * 10) == -(-64 // K._MAX_CHUNKS)
    assert K._batch_chunk(3, 1) == 3
    assert K._batch_chunk(8, K._CHUNK_BYTES // 4) == 4
    assert K._batch_chunk(0, 100) == 1
    assert K._cache_chunk(64, K._CHUNK_BYTES * 10) == 1
    assert K._cache_chunk(256, K._CHUNK_BYTES // 6) == 6
    assert K._cache_chunk(3, 1) == 3
    assert K._cache_chunk(0, 100) == 1


@pytest.mark.parametrize("case", THREAD_CASES[:2] + THREAD_CASES[4:5],
                         ids=[f"n{c[0]}-ci{c[1]}-co{c[2]}" for c in THREAD_CASES[:2] + THREAD_CASES[4:5]])
def test_conv_results_do_not_depend_on_the_pool(case: tuple[Any, ...], monkeypatch: Any) -> None:
    """The chunks run in ranges on flex's pool (each range's GEMMs on one BLAS thread): the same bits serially, on
    2 or 3 pool threads and when the ranges' scratch would be too large to pool, and BLAS's thread count is restored
    after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from ember_flex import threads

    N, Ci, Co, S, dtype = case
    x, w, b = _rand((N, Ci) + S, dtype, 1), _rand((Co, Ci, 3, 3), dtype, 2), _rand((Co,), dtype, 3)
    pads = ((1, 1), (1, 1))
    monkeypatch.setattr(K, "_cache_chunk", lambda n, per_sample_bytes: min(n, 3))  # several chunks per range

    def run() -> list[np.ndarray]:
        y = K.conv(x, w, b, (1, 1), pads, (1, 1), 1)
        return [y, K.conv_weight_grad(x, y, w.shape, (1, 1), pads, (1, 1), 1),
                K.conv_input_grad(y, w, x.shape, (1, 1), pads, (1, 1), 1)]

    pooled = []
    real_run = threads.run
    monkeypatch.setattr(threads, "run", lambda tasks, *a, **k: pooled.append(len(tasks)) or real_run(tasks, *a, **k))
    blas = [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
    before, min_elems = threads.get_num_threads(), threads.min_elems
    results = []
    try:
        for n in (1, 2, 3):
            threads.set_num_threads(n)
            if n > 1:
                threads.min_elems = 1
            results.append(run())
        assert pooled and min(pooled) >= 2  # the 2- and 3-thread runs went through the pool
        # ranges' scratch beyond _POOL_SCRATCH (a large image's sample): one range, BLAS's own threads, same bits
        monkeypatch.setattr(K, "_POOL_SCRATCH", 1)
        ran = len(pooled)
        results.append(run())
        assert len(pooled) == ran
    finally:
        threads.set_num_threads(before)
        threads.min_elems = min_elems
    assert [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"] == blas
    for other in results[1:]:
        for a, c in zip(results[0], other):
            np.testing.assert_array_equal(a, c)
    ref = F.conv2d(_t(x), _t(w), _t(b), 1, 1).numpy()
    np.testing.assert_allclose(results[0][0], ref, **TOL[dtype])


# nd, N, Cin, Cout, spatial, k, stride, pads, dilation, groups: input gradients with 2+ input channels per group
TAP_CASES = [
    (2, 3, 32, 8, (9, 8), (3, 3), (2, 1), ((1, 2), (0, 1)), (1, 2), 1),     # stride, dilation, asymmetric pads
    (2, 4, 64, 12, (7, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),    # groups: 32 channels per group
    (2, 2, 16, 4, (6, 6), (2, 2), (1, 1), ((-1, 0), (0, -1)), (1, 1), 1),   # cropping pads
    (1, 3, 24, 5, (11,), (4,), (3,), ((2, 1),), (1,), 1),                  # 1-d
    (3, 2, 16, 3, (4, 5, 4), (2, 2, 2), (1, 1, 2), ((0, 1), (1, 0), (1, 1)), (1, 1, 1), 1),  # 3-d
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", TAP_CASES, ids=[f"{c[0]}d-ci{c[2]}-g{c[9]}" for c in TAP_CASES])
def test_conv_input_grad_per_tap_and_one_gemm(case: tuple[Any, ...], dtype: Any, monkeypatch: Any) -> None:
    """The input gradient's two routes -- one GEMM per kernel tap (2+ channels per group) and one GEMM for all
    taps -- both match torch, in several chunks and in one."""
    nd, N, Ci, Co, S, k, s, pads, d, g = case
    x, w = _rand((N, Ci) + S, dtype, 1), _rand((Co, Ci // g) + k, dtype, 2)
    xt = _t(x).requires_grad_()
    y = TCONV[nd](_torch_pad(xt, pads), _t(w), None, s, 0, d, g)
    gy = _rand(tuple(y.shape), dtype, 3)
    y.backward(_t(gy))
    for min_cog in (1, 1 << 30):  # per tap, one GEMM
        monkeypatch.setattr(K, "_TAP_GEMM_MIN_COG", min_cog)
        for per_chunk in (1, N):
            monkeypatch.setattr(K, "_cache_chunk", lambda n, per_sample_bytes, c=per_chunk: min(n, c))
            _check(K.conv_input_grad(gy, w, x.shape, s, pads, d, g), xt.grad, dtype)


@pytest.mark.parametrize("min_cog", [1, 1 << 30], ids=["per-tap", "one-gemm"])
def test_conv_transpose_strided_per_tap(min_cog: int, monkeypatch: Any) -> None:
    """conv_transpose with stride > 1 and 2+ output channels per group runs the input-gradient core's per-tap
    route (or, forced, its one-GEMM route): both match torch, bias included."""
    monkeypatch.setattr(K, "_TAP_GEMM_MIN_COG", min_cog)
    x, w, b = _rand((3, 8, 5, 4), np.float32, 1), _rand((8, 16, 3, 2), np.float32, 2), _rand((32,), np.float32, 3)
    y = K.conv_transpose(x, w, b, (2, 3), (1, 0), (1, 2), (1, 2), 2)
    _check(y, F.conv_transpose2d(_t(x), _t(w), _t(b), (2, 3), (1, 0), (1, 2), 2, (1, 2)), np.float32)


# nd, N, Cin, Cout, spatial: 1x1 convolutions (stride 1, no padding, one group) run as plain per-sample GEMMs
POINTWISE_CASES = [(2, 5, 48, 16, (6, 7)), (1, 3, 40, 9, (11,)), (3, 2, 32, 5, (3, 4, 2)), (2, 4, 300, 6, (3, 3)),
                   (2, 3, 8, 12, (5, 5))]  # few input channels: forward and weight gradient keep their GEMM


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", POINTWISE_CASES, ids=[f"{c[0]}d-n{c[1]}-ci{c[2]}" for c in POINTWISE_CASES])
def test_conv_pointwise(case: tuple[Any, ...], dtype: Any, chunking: None) -> None:
    """1x1 forward (with and without bias), weight and input gradients match torch, in chunks of one sample, two,
    or the kernels' own; unbatched input too."""
    nd, N, Ci, Co, S = case
    k = (1,) * nd
    x, w, b = _rand((N, Ci) + S, dtype, 1), _rand((Co, Ci) + k, dtype, 2), _rand((Co,), dtype, 3)
    xt, wt = _t(x).requires_grad_(), _t(w).requires_grad_()
    y = TCONV[nd](xt, wt, _t(b))
    gy = _rand(tuple(y.shape), dtype, 4)
    y.backward(_t(gy))
    _check(K.conv(x, w, b), y, dtype)
    _check(K.conv(x, w, None), TCONV[nd](_t(x), _t(w)), dtype)
    _check(K.conv_weight_grad(x, gy, w.shape), wt.grad, dtype, scale=10.0)
    _check(K.conv_input_grad(gy, w, x.shape), xt.grad, dtype)
    np.testing.assert_array_equal(K.conv(x[1], w, b), K.conv(x, w, b)[1])
    np.testing.assert_array_equal(K.conv_input_grad(gy[1], w, x.shape[1:]), K.conv_input_grad(gy, w, x.shape)[1])


def test_conv_pointwise_bits_do_not_depend_on_threads(monkeypatch: Any) -> None:
    """The 1x1 kernels give the same bits on 1, 2 and 3 BLAS threads and on 1 and 3 pool threads (the weight
    gradient's reduction over 37 * 49 positions is no multiple of 64)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from ember_flex import threads

    x, w, b = _rand((37, 64, 7, 7), np.float32, 1), _rand((48, 64, 1, 1), np.float32, 2), _rand((48,), np.float32, 3)
    monkeypatch.setattr(K, "_cache_chunk", lambda n, per_sample_bytes: min(n, 5))  # several chunks per range

    def run() -> list[np.ndarray]:
        y = K.conv(x, w, b)
        return [y, K.conv_weight_grad(x, y, w.shape), K.conv_input_grad(y, w, x.shape)]

    results = []
    before = threads.get_num_threads()
    try:
        for n in (1, 3):
            threads.set_num_threads(n)
            for blas in (1, 2, 3):
                with threadpoolctl.threadpool_limits(blas, user_api="blas"):
                    results.append(run())
    finally:
        threads.set_num_threads(before)
    for other in results[1:]:
        for a, c in zip(results[0], other):
            np.testing.assert_array_equal(a, c)
