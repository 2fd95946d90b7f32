"""Tests of ember_opencl.matmul: every kernel family and layout, edges, batches, dtypes, gemm, autotuning.

The conformance kit covers the public matmul/mm/bmm/einsum semantics on small shapes; these tests force each kernel
(simple, direct outer/dot, tiled local-memory) through layouts and sizes that cross tile edges, and check the
autotuner's persistence. numpy is the oracle. Skipped where no OpenCL device is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.errors import DTypeError, ShapeError

pytest.importorskip("pyopencl")

from ember_opencl import elementwise as ew  # noqa: E402
from ember_opencl import matmul as mm  # noqa: E402
from ember_opencl.array import CLArray, download  # noqa: E402
from ember_opencl.compiler import TuneStore  # noqa: E402
from ember_opencl.errors import AutotuneError  # noqa: E402
from ember_opencl.runtime import device_count, runtime  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device installed (e.g. pocl-opencl-icd)")

SIMPLE = mm.SIMPLE
OUTER = mm.Direct(6, 16, 2, 8).as_dict()
OUTER_1ROW = mm.Direct(1, 16, 16, 1).as_dict()
DOT = mm.Direct(2, 4, 8, 4, 8).as_dict()
TILED = mm.Tile(32, 32, 16, 2, 2, 4).as_dict()


@pytest.fixture(scope="module")
def dev() -> ember.Device:
    return ember.Device.opencl(0)


@pytest.fixture(scope="module", autouse=True)
def private_tune_store(tmp_path_factory: pytest.TempPathFactory) -> TuneStore:
    """Tune into a throw-away store: tests must not read or write the user's cache of winners."""
    rt = runtime(0)
    saved = rt.tune
    rt.tune = TuneStore(tmp_path_factory.mktemp("tune"), rt.key)
    yield rt.tune
    rt.tune = saved


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def H(dev: ember.Device, x: np.ndarray) -> CLArray:
    return ember.tensor(x, device=dev)._h


def get(h: CLArray) -> np.ndarray:
    return download(h if h.is_contiguous else ew.copy(h))


def transposed(dev: ember.Device, x: np.ndarray) -> CLArray:
    """A view equal to x whose storage is x.T (unit stride along the first dim), as w.T in a Linear layer."""
    t = H(dev, np.ascontiguousarray(x.T))
    return t.view(x.shape, t.estrides[::-1], t.offset)


def strided(dev: ember.Device, x: np.ndarray) -> CLArray:
    """A view equal to x with no unit stride at all (every other row, every third column of a bigger array)."""
    big = H(dev, np.repeat(np.repeat(x, 2, 0), 3, 1))
    return big.view(x.shape, (big.estrides[0] * 2, 3), big.offset)


def reversed_rows(dev: ember.Device, x: np.ndarray) -> CLArray:
    """A view equal to x read through a negative row stride."""
    t = H(dev, np.ascontiguousarray(x[::-1]))
    return t.view(x.shape, (-t.estrides[0], t.estrides[1]), t.offset + (x.shape[0] - 1) * t.estrides[0])


LAYOUTS = {"row": H, "col": transposed, "gen": strided, "neg": reversed_rows}


def _data(rng: np.random.Generator, shape: tuple[int, ...], d: dt.DType) -> np.ndarray:
    if d is dt.bool_:
        return rng.random(shape) < 0.1  # sparse, so that some outputs are False
    if d.is_floating_point:
        return rng.standard_normal(shape).astype(d.numpy)
    info = np.iinfo(d.numpy)
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=d.numpy)  # full range: sums wrap


def _want(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.itemsize == 2 and a.dtype.kind not in "iu":  # float16 / bfloat16: float accumulation, one rounding
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    return np.matmul(a, b)


def _check(got: np.ndarray, want: np.ndarray, d: dt.DType, k: int) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    if d in (dt.float16, dt.bfloat16):
        # summation order differs from numpy's; the result is rounded once to a 8/11-bit mantissa
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2 * k**0.5)
    elif d is dt.float32:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * k**0.5)
    elif d is dt.float64:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * k)
    else:
        np.testing.assert_array_equal(got, want)  # integers wrap exactly like numpy; bool is or-of-ands


# -- every kernel, every layout, edges -------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [SIMPLE, OUTER, TILED], ids=["simple", "direct-outer", "tiled-local"])
@pytest.mark.parametrize("la", ["row", "col", "gen"])
@pytest.mark.parametrize("lb", ["row", "col", "gen", "neg"])
def test_forced_kernels_all_layouts(dev, rng, cfg, la, lb):
    M, K, N = 37, 67, 45  # no dim a multiple of any tile or vector width
    a, b = _data(rng, (M, K), dt.float32), _data(rng, (K, N), dt.float32)
    got = get(mm.gemm(LAYOUTS[la](dev, a), LAYOUTS[lb](dev, b), config=cfg))
    _check(got, a @ b, dt.float32, K)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 7, 7), (33, 129, 1), (129, 33, 67), (1, 129, 33), (129, 1, 129),
                                   (64, 64, 64), (65, 63, 17), (6, 16, 8), (5, 17, 9)])
@pytest.mark.parametrize("cfg", [OUTER, DOT, TILED, OUTER_1ROW], ids=["outer", "dot", "tiled", "outer-1row"])
def test_forced_kernels_edges(dev, rng, shape, cfg):
    M, N, K = shape
    a, b = _data(rng, (M, K), dt.float32), _data(rng, (K, N), dt.float32)
    hb = transposed(dev, b) if cfg is DOT else H(dev, b)  # the dot form needs B contiguous along K
    got = get(mm.gemm(H(dev, a), hb, config=cfg))
    _check(got, a @ b, dt.float32, K)


@pytest.mark.parametrize("M,K,N", [(1, 7, 33), (7, 33, 129), (33, 129, 7), (129, 67, 129), (129, 129, 33),
                                   (257, 300, 129), (3, 1000, 1), (1, 999, 300)])
def test_autotuned_sizes_crossing_tiles(dev, rng, M, K, N):
    a, b = _data(rng, (M, K), dt.float32), _data(rng, (K, N), dt.float32)
    _check(get(mm.matmul(H(dev, a), H(dev, b))), a @ b, dt.float32, K)
    # the Linear layer's x @ w.T, a transposed view read in place
    w = _data(rng, (N, K), dt.float32)
    _check(get(mm.matmul(H(dev, a), transposed(dev, w.T))), a @ w.T, dt.float32, K)


def test_transposed_operands_through_the_public_api(dev, rng):
    x, w = rng.standard_normal((300, 260), dtype=np.float32), rng.standard_normal((130, 260), dtype=np.float32)
    ex, ew_ = ember.tensor(x, device=dev), ember.tensor(w, device=dev)
    np.testing.assert_allclose((ex @ ew_.T).numpy(), x @ w.T, rtol=1e-4, atol=1e-3)  # NT (Linear forward)
    np.testing.assert_allclose((ex.T @ ex).numpy(), x.T @ x, rtol=1e-4, atol=1e-3)  # TN (weight gradient)
    np.testing.assert_allclose((ew_.T.T @ ex.T).numpy(), w @ x.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose((ex.T.T.T.T @ ew_.T).numpy(), x @ w.T, rtol=1e-4, atol=1e-3)


def test_both_transposed_is_swapped_not_copied(dev, rng):
    a, b = rng.standard_normal((50, 40), dtype=np.float32), rng.standard_normal((60, 50), dtype=np.float32)
    ha, hb = transposed(dev, a.T), transposed(dev, b.T)  # a.T and b.T as views
    rt = runtime(0)
    before = rt.pool.report()["allocations"]
    got = mm.matmul(ha, hb)
    assert rt.pool.report()["allocations"] - before == 1  # only the output
    p = mm.plan(mm._expand(ha, (1,)), mm._expand(hb, (1,)), got.view((1, 40, 60), (0, 60, 1), 0))
    assert p.layouts == ("k", "n") and (p.M, p.N) == (60, 40)  # C^T = B^T A^T: both read along their rows
    _check(get(got), a.T @ b.T, dt.float32, 50)


def test_zero_stride_matrix_dims(dev, rng):
    row = rng.standard_normal((1, 70), dtype=np.float32)
    h = H(dev, row)
    expanded = h.view((40, 70), (0, 1), h.offset)  # the same row 40 times, never materialised
    b = rng.standard_normal((70, 90), dtype=np.float32)
    for cfg in (None, SIMPLE, OUTER, TILED):
        got = get(mm.gemm(expanded, H(dev, b), config=cfg))
        _check(got, np.broadcast_to(row, (40, 70)) @ b, dt.float32, 70)


# -- batches and 1-d operands --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sa,sb", [
    ((4, 33, 17), (17, 40)),  # shared B: the batch folds into M
    ((33, 17), (4, 17, 40)),  # shared A
    ((2, 1, 33, 17), (1, 3, 17, 40)),  # both broadcast: two kernel batch dims
    ((2, 1, 3, 5, 7), (1, 4, 1, 7, 6)),  # three batch dims that do not merge: outer one loops on the host
    ((3, 1, 1, 129), (5, 129, 70)),  # batched vector-matrix products
    ((6, 70, 90), (6, 90, 80)),
])
def test_batch_broadcasting(dev, rng, sa, sb):
    a, b = _data(rng, sa, dt.float32), _data(rng, sb, dt.float32)
    rt = runtime(0)
    ha, hb = H(dev, a), H(dev, b)
    before = rt.pool.report()["allocations"]
    got = mm.matmul(ha, hb)
    assert rt.pool.report()["allocations"] - before == 1  # the output only: broadcast operands are not copied
    _check(get(got), np.matmul(a, b), dt.float32, sa[-1])


def test_batch_broadcast_of_transposed_weight(dev, rng):
    x, w = rng.standard_normal((3, 50, 64), dtype=np.float32), rng.standard_normal((48, 64), dtype=np.float32)
    for cfg in (None, SIMPLE, DOT, TILED):
        hx = H(dev, x)
        got = get(mm.gemm(hx.view((150, 64), (64, 1), hx.offset), transposed(dev, w.T), config=cfg))
        _check(got, x.reshape(150, 64) @ w.T, dt.float32, 64)
    np.testing.assert_allclose(get(mm.matmul(H(dev, x), transposed(dev, w.T))), x @ w.T, rtol=1e-4, atol=1e-4)


def test_batch_beyond_one_launch(dev, rng):
    # more batch entries than drivers accept work-groups along dim 2: launched in chunks, continuing the batch index
    a, b = rng.standard_normal((70001, 2, 3), dtype=np.float32), rng.standard_normal((70001, 3, 2), dtype=np.float32)
    for cfg in (None, SIMPLE, OUTER):
        got = get(mm.gemm(H(dev, a), H(dev, b), config=cfg))
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb", [((1,), (1,)), ((700,), (700,)), ((129,), (129, 33)), ((33, 129), (129,)),
                                   ((5, 7, 600), (600,)), ((600,), (3, 600, 9)), ((0,), (0,)), ((1000,), (1000, 1)),
                                   ((600, 1000), (1000,)), ((1000,), (1000, 700))])
def test_one_dimensional_operands(dev, rng, sa, sb):
    a, b = _data(rng, sa, dt.float32), _data(rng, sb, dt.float32)
    got = get(mm.matmul(H(dev, a), H(dev, b)))
    want = np.matmul(a, b)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_empty_dims(dev):
    for sa, sb in [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((4, 5), (5, 0)), ((0, 4, 5), (5, 3))]:
        a, b = np.ones(sa, np.float32), np.ones(sb, np.float32)
        got = get(mm.matmul(H(dev, a), H(dev, b)))
        np.testing.assert_array_equal(got, a @ b)  # K == 0 gives zeros, not garbage


# -- dtypes --------------------------------------------------------------------------------------------------------
ALL = [dt.float64, dt.float16, dt.bfloat16, dt.int8, dt.uint8, dt.int16, dt.int32, dt.int64, dt.bool_]


@pytest.mark.parametrize("d", ALL, ids=str)
def test_dtypes(dev, rng, d):
    if d is dt.float64 and not runtime(0).fp64:
        pytest.skip("device has no cl_khr_fp64")
    a, b = _data(rng, (33, 67), d), _data(rng, (67, 40), d)
    _check(get(mm.matmul(H(dev, a), H(dev, b))), _want(a, b), d, 67)  # small: the simple kernel
    _check(get(mm.gemm(H(dev, a), H(dev, b), config=OUTER)), _want(a, b), d, 67)  # vector loads + vector stores
    if d in (dt.float64, dt.float16, dt.bfloat16, dt.int8, dt.bool_):
        _check(get(mm.gemm(H(dev, a), H(dev, b), config=TILED)), _want(a, b), d, 67)
        _check(get(mm.gemm(H(dev, a), transposed(dev, b), config=DOT)), _want(a, b), d, 67)


def test_integer_accumulation_wraps_like_numpy(dev):
    a = np.full((2, 300), 100, np.int8)
    b = np.full((300, 3), 100, np.int8)
    want = a @ b  # 3_000_000 wraps to int8
    assert want.dtype == np.int8
    np.testing.assert_array_equal(get(mm.matmul(H(dev, a), H(dev, b))), want)
    a32 = np.full((2, 5), 2**30, np.int32)
    np.testing.assert_array_equal(get(mm.matmul(H(dev, a32), H(dev, a32.T.copy()))), a32 @ a32.T)


def test_bool_is_or_of_ands(dev):
    a = np.array([[True, False, False], [False, False, False]])
    b = np.array([[False, True], [True, True], [True, False]])
    got = get(mm.matmul(H(dev, a), H(dev, b)))
    np.testing.assert_array_equal(got, np.array([[False, True], [False, False]]))
    assert got.dtype == np.bool_


def test_half_types_accumulate_in_float(dev):
    # 4096 ones of 1/8 each: a float16 accumulator stalls at 256 once increments fall below half an ulp
    for d in (dt.float16, dt.bfloat16):
        a = np.full((1, 4096), 0.125, d.numpy)
        b = np.ones((4096, 2), d.numpy)
        for cfg in (None, OUTER, TILED):
            got = get(mm.gemm(H(dev, a), H(dev, b), config=cfg))
            np.testing.assert_array_equal(got.astype(np.float32), np.full((1, 2), 512.0, np.float32))


# -- gemm ----------------------------------------------------------------------------------------------------------
def test_gemm_trans_flags_alpha_beta_and_strided_out(dev, rng):
    a, b = rng.standard_normal((67, 37), dtype=np.float32), rng.standard_normal((45, 67), dtype=np.float32)
    c0 = rng.standard_normal((37, 90), dtype=np.float32)
    for cfg in (None, SIMPLE, OUTER, TILED):
        hc = H(dev, c0)
        out = hc.view((37, 45), (90, 2), hc.offset)  # every other column of a bigger buffer
        r = mm.gemm(H(dev, a), H(dev, b), out, trans_a=True, trans_b=True, alpha=2.0, beta=0.5, config=cfg)
        assert r is out
        want = c0.copy()
        want[:, ::2] = 2.0 * a.T @ b.T + 0.5 * c0[:, ::2]
        np.testing.assert_allclose(get(hc), want, rtol=1e-4, atol=1e-3)  # odd columns untouched


def test_gemm_beta_zero_never_reads_out(dev, rng):
    a, b = rng.standard_normal((40, 30), dtype=np.float32), rng.standard_normal((30, 50), dtype=np.float32)
    for cfg in (None, SIMPLE, OUTER, TILED):
        out = H(dev, np.full((40, 50), np.nan, np.float32))
        mm.gemm(H(dev, a), H(dev, b), out, beta=0, config=cfg)
        np.testing.assert_allclose(get(out), a @ b, rtol=1e-4, atol=1e-4)
    out = H(dev, np.full((40, 50), 3.0, np.float32))
    mm.gemm(H(dev, a[:, :0]), H(dev, b[:0]), out, beta=2.0)  # K == 0: out = beta * out
    np.testing.assert_array_equal(get(out), np.full((40, 50), 6.0, np.float32))


def test_gemm_batched_and_accumulating(dev, rng):
    w = rng.standard_normal((16, 27), dtype=np.float32)  # conv: (C_out, C_in*kh*kw) @ cols (N, C_in*kh*kw, L)
    cols = rng.standard_normal((3, 27, 100), dtype=np.float32)
    y = get(mm.gemm(H(dev, w), H(dev, cols)))
    np.testing.assert_allclose(y, w @ cols, rtol=1e-4, atol=1e-4)
    gy = rng.standard_normal((3, 16, 100), dtype=np.float32)
    dw = H(dev, np.zeros((16, 27), np.float32))
    for n in range(3):  # weight gradient summed over the batch: dw += gy[n] @ cols[n].T
        mm.gemm(H(dev, gy[n]), H(dev, cols[n]), dw, trans_b=True, beta=1.0)
    np.testing.assert_allclose(get(dw), np.einsum("nol,nil->oi", gy, cols), rtol=1e-4, atol=1e-3)
    dx = get(mm.gemm(H(dev, w), H(dev, gy), trans_a=True))  # (C_in*kh*kw, L) per image
    np.testing.assert_allclose(dx, np.swapaxes(w, 0, 1) @ gy, rtol=1e-4, atol=1e-3)
    ints = get(mm.gemm(H(dev, np.ones((2, 3), np.int32)), H(dev, np.ones((3, 2), np.int32)), alpha=-3))
    np.testing.assert_array_equal(ints, np.full((2, 2), -9, np.int32))


def test_gemm_errors(dev):
    f, i = H(dev, np.ones((2, 3), np.float32)), H(dev, np.ones((3, 2), np.int32))
    with pytest.raises(DTypeError, match="gemm: .*float32, int32"):
        mm.gemm(f, i)
    with pytest.raises(ShapeError, match=r"gemm: op\(a\) of shape \(2, 3\) and op\(b\) of shape \(2, 3\)"):
        mm.gemm(f, f)
    with pytest.raises(ShapeError, match="gemm: out has shape"):
        mm.gemm(f, f, H(dev, np.ones((3, 3), np.float32)), trans_b=True)
    with pytest.raises(ShapeError, match="2-d or 3-d"):
        mm.gemm(H(dev, np.ones(3, np.float32)), f)
    b3 = H(dev, np.ones((2, 3, 2), np.float32))
    with pytest.raises(ShapeError, match="cannot be multiplied"):
        mm.gemm(H(dev, np.ones((3, 2, 3), np.float32)), b3)
    with pytest.raises(DTypeError, match="matmul: operands must share a dtype"):
        mm.matmul(f, i)
    with pytest.raises(ShapeError, match=r"matmul: shapes \(2, 3\) and \(2, 3\) cannot be multiplied"):
        mm.matmul(f, f)
    with pytest.raises(ShapeError, match="not broadcastable"):
        mm.matmul(H(dev, np.ones((2, 2, 3), np.float32)), H(dev, np.ones((3, 3, 2), np.float32)))


# -- autotuning ----------------------------------------------------------------------------------------------------
def test_shape_key_buckets(dev):
    a, b = H(dev, np.ones((100, 70), np.float32)), H(dev, np.ones((70, 90), np.float32))
    c = H(dev, np.ones((100, 90), np.float32))
    p = mm.plan(mm._expand(a, (1,)), mm._expand(b, (1,)), c.view((1, 100, 90), (0, 90, 1), 0))
    assert mm.shape_key(p) == "float32|kn|128x128x128|1"
    p = mm.plan(mm._expand(a, (1,)), mm._expand(transposed(dev, np.ones((70, 90), np.float32)), (1,)),
                c.view((1, 100, 90), (0, 90, 1), 0))
    assert mm.shape_key(p) == "float32|kk|128x128x128|1"


def test_candidates_fit_the_device(dev):
    rt = runtime(0)
    a, b = H(dev, np.ones((300, 300), np.float32)), H(dev, np.ones((300, 300), np.float32))
    c = H(dev, np.ones((300, 300), np.float32))
    p = mm.plan(mm._expand(a, (1,)), mm._expand(b, (1,)), c.view((1, 300, 300), (0, 300, 1), 0))
    cands = mm.candidates(rt, p)
    assert cands[-1] == SIMPLE and len(cands) >= 3
    for cfg in cands[:-1]:
        if cfg["kind"] == "tiled":
            tile = mm.Tile.from_dict(cfg)
            assert tile.threads <= rt.max_work_group and tile.local_bytes(4) <= rt.local_mem
        else:
            d = mm.Direct.from_dict(cfg)
            assert d.lx * d.ly <= rt.max_work_group


def test_gpu_candidates_respect_limits(dev):
    """A GPU-like device gets local-memory tiles within its work-group and local-memory limits, none far bigger
    than the problem, and the simple kernel last."""
    from types import SimpleNamespace

    gpu = SimpleNamespace(is_cpu=False, max_work_group=128, local_mem=16 * 1024)
    c = H(dev, np.ones((1, 40, 300), np.float32))
    a, b = H(dev, np.ones((40, 50), np.float64)), H(dev, np.ones((50, 300), np.float64))
    cands = mm.candidates(gpu, mm.plan(mm._expand(a, (1,)), mm._expand(b, (1,)), c))
    assert cands[-1] == SIMPLE
    tiles = [mm.Tile.from_dict(t) for t in cands[:-1]]
    assert tiles and all(t.threads <= 128 and t.local_bytes(8) <= 16 * 1024 and t.tm <= 128 for t in tiles)


def _count_timings(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    timed: list[dict] = []
    real = mm._timer

    def timer(*args, **kwargs):
        run = real(*args, **kwargs)

        def counted(cfg):
            timed.append(cfg)
            return run(cfg)

        return counted

    monkeypatch.setattr(mm, "_timer", timer)
    return timed


def test_tune_result_persists_and_is_reused(dev, rng, tmp_path, monkeypatch):
    rt = runtime(0)
    monkeypatch.setattr(rt, "tune", TuneStore(tmp_path, rt.key))
    timed = _count_timings(monkeypatch)
    a, b = rng.standard_normal((200, 150), dtype=np.float32), rng.standard_normal((150, 120), dtype=np.float32)
    np.testing.assert_allclose(get(mm.matmul(H(dev, a), H(dev, b))), a @ b, rtol=1e-4, atol=1e-3)
    assert len(timed) >= 2  # first use: the candidates were timed
    stored = rt.tune.get(mm.TUNE_OP, "float32|kn|256x128x256|1")
    assert stored is not None and stored in timed
    assert (tmp_path / "opencl" / rt.key / "tune.json").is_file()
    # a fresh store (a new process) reads the winner from disk and times nothing; nor does a second shape of the class
    timed.clear()
    monkeypatch.setattr(rt, "tune", TuneStore(tmp_path, rt.key))
    np.testing.assert_allclose(get(mm.matmul(H(dev, a), H(dev, b))), a @ b, rtol=1e-4, atol=1e-3)
    a2, b2 = a[:190, :140].copy(), b[:140, :110].copy()
    np.testing.assert_allclose(get(mm.matmul(H(dev, a2), H(dev, b2))), a2 @ b2, rtol=1e-4, atol=1e-3)
    assert timed == []


def test_small_products_are_not_tuned(dev, tmp_path, monkeypatch):
    rt = runtime(0)
    monkeypatch.setattr(rt, "tune", TuneStore(tmp_path, rt.key))
    timed = _count_timings(monkeypatch)
    a = np.ones((40, 40), np.float32)
    np.testing.assert_array_equal(get(mm.matmul(H(dev, a), H(dev, a))), a @ a)
    assert timed == [] and not (tmp_path / "opencl" / rt.key / "tune.json").exists()


def test_failing_candidate_is_skipped(dev, rng, tmp_path, monkeypatch):
    rt = runtime(0)
    monkeypatch.setattr(rt, "tune", TuneStore(tmp_path, rt.key))
    too_big = mm.Direct(1, 1, rt.max_work_group, 2).as_dict()  # more work-items per group than the device allows
    bogus = {"kind": "no-such-kernel"}
    monkeypatch.setattr(mm, "candidates", lambda rt_, p: [too_big, bogus, OUTER, dict(SIMPLE)])
    a, b = rng.standard_normal((130, 140), dtype=np.float32), rng.standard_normal((140, 150), dtype=np.float32)
    np.testing.assert_allclose(get(mm.matmul(H(dev, a), H(dev, b))), a @ b, rtol=1e-4, atol=1e-3)
    assert rt.tune.get(mm.TUNE_OP, "float32|kn|256x256x256|1") == OUTER
    # every candidate failing is an error that names the op, not a silent fallback
    monkeypatch.setattr(mm, "candidates", lambda rt_, p: [too_big, bogus])
    with pytest.raises(AutotuneError, match=r"autotune 'matmul.v1' for 'float32\|kn\|256x128x256\|1'"):
        mm.matmul(H(dev, a), H(dev, b[:, :70].copy()))


def test_aliased_stride_offers_padded_candidates(dev, rng):
    rt = runtime(0)
    if not rt.is_cpu:
        pytest.skip("padding candidates are offered to CPU devices")
    a = rng.standard_normal((64, 256), dtype=np.float32)
    b = rng.standard_normal((256, 1024), dtype=np.float32)  # rows 4 KiB apart
    p = mm.plan(mm._expand(H(dev, a), (1,)), mm._expand(H(dev, b), (1,)),
                H(dev, np.zeros((1, 64, 1024), np.float32)))
    assert mm.shape_key(p).startswith("float32|kn~|")
    padded = [c for c in mm.candidates(rt, p) if c.get("pad")]
    assert padded
    got = get(mm.gemm(H(dev, a), H(dev, b), config=padded[0]))
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-3)
