"""flex's pooled reductions and copies (issue 17): chunked clone/contiguous are exact copies in C order, reductions
keep the serial bits at every thread count, SIMD-fast reductions chunk only from FAST_FACTOR times the threshold,
and a pool that stops paying goes cold (serial) and comes back after a probe.

Thresholds are lowered (monkeypatched) so that small arrays take the chunked path: chunking, not speed, is under
test; nothing here times anything (the cold-pool logic is driven with made-up measurements).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ember
from ember_flex import threads as T
from ember_flex.backend import FlexBackend


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch):
    """4 threads, chunks of 16+ elements, arrays of 64+ elements chunked (SIMD reductions from 256, copies from
    64); restored."""
    before = T.get_num_threads()
    monkeypatch.setattr(T, "MIN_CHUNK", 16)
    monkeypatch.setattr(T, "MIN_ELEMS", 64)
    monkeypatch.setattr(T, "FAST_FACTOR", 4)
    monkeypatch.setattr(T, "COPY_MIN", 64)
    T.set_num_threads(4)
    yield T
    T.set_num_threads(before)


def _identical(r: np.ndarray, ref: np.ndarray) -> None:
    ref = np.asarray(ref)
    assert type(r) is np.ndarray and r.dtype == ref.dtype and r.shape == ref.shape
    assert r.tobytes() == ref.tobytes(), "values differ (bit for bit)"


VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "strided": lambda a: a[:, ::3],
    "reversed": lambda a: a[::-1],
    "3d-permuted": lambda a: a[:, :120].reshape(40, 3, 40).transpose(1, 0, 2),
    "one-row": lambda a: a[:1, :],
}
DTYPES = [np.float32, np.float64, np.float16, np.int64, np.uint8, np.bool_]


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_copy_and_contiguous_are_exact_c_order_copies(pool, view, dtype):
    a = VIEWS[view]((np.random.default_rng(1).standard_normal((40, 131)) * 50).astype(dtype))
    be = FlexBackend()
    for r in (be.copy(a), T.copy(a) if a.ndim and a.size >= 64 else be.copy(a)):
        if r is None:  # T.copy declines a C-order result with one outer row it cannot split
            continue
        _identical(r, np.array(a, order="C"))
        assert r.flags.c_contiguous and r.flags.owndata and not np.may_share_memory(r, a)
    c = be.contiguous(a)
    _identical(c, np.ascontiguousarray(a))
    assert c.flags.c_contiguous
    if a.flags.c_contiguous:
        assert c is a  # no copy where none is needed (np.require's behaviour)


def test_copy_runs_on_several_threads(pool, monkeypatch):
    """A large clone is filled by the caller and the workers (each chunk slowed so that workers claim some)."""
    seen: set[str] = set()
    real = T._copy_into

    def spy(dst, src):
        seen.add(threading.current_thread().name)
        time.sleep(0.05)  # 4 chunks: a worker has ~150 ms to claim one, even on a busy machine
        real(dst, src)

    monkeypatch.setattr(T, "_copy_into", spy)
    x = np.arange(10_000, dtype=np.float32)
    _identical(FlexBackend().copy(x), x)
    assert len(seen) >= 2


def test_clone_through_ember_is_a_separate_exact_copy(pool):
    x = ember.tensor(np.random.default_rng(2).standard_normal((64, 50)).astype(np.float32))
    y = x.clone()
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    y.add_(1.0)
    assert not np.array_equal(y.numpy(), x.numpy())
    z = x.t().contiguous()
    np.testing.assert_array_equal(z.numpy(), x.numpy().T)
    assert z._h.flags.c_contiguous


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reductions_identical_for_every_thread_count(pool, dtype):
    """sum/mean/amax/amin/var through ember give the same bits at 1, 2, 3 and 4 threads (and match torch)."""
    torch = pytest.importorskip("torch")
    x_np = (np.random.default_rng(3).standard_normal((48, 97)) * 100 + 3).astype(dtype)
    x_np[5, 7] = -0.0
    x = ember.tensor(x_np)
    ops = {
        "sum": lambda t: t.sum(), "mean": lambda t: t.mean(), "amax": lambda t: t.amax(), "amin": lambda t: t.amin(),
        "sum-1": lambda t: t.sum(dim=-1), "sum0": lambda t: t.sum(dim=0), "mean-1": lambda t: t.mean(dim=1),
        "var": lambda t: t.var(), "var0": lambda t: t.var(dim=0), "amax0": lambda t: t.amax(dim=0),
    }
    ref: dict[str, bytes] = {}
    for threads in (1, 2, 3, 4):
        pool.set_num_threads(threads)
        for name, f in ops.items():
            got = f(x).numpy()
            if threads == 1:
                ref[name] = got.tobytes()
                want = f(torch.from_numpy(x_np.copy())).numpy()
                np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-4)
            else:
                assert got.tobytes() == ref[name], f"{name} at {threads} threads differs from 1 thread"


def test_simd_reductions_chunk_only_from_fast_factor(pool):
    """max/min and integer sums below MIN_ELEMS * FAST_FACTOR elements stay serial; the pairwise float sum chunks
    from MIN_ELEMS; every result is numpy's."""
    x = np.random.default_rng(4).standard_normal(200).astype(np.float32)  # 64 <= 200 < 256
    assert T.reduce(np.maximum, x, (0,), False) is None
    assert T.reduce(np.add, x.astype(np.int64), (0,), False) is None
    _identical(T.reduce(np.add, x, (0,), False), np.add.reduce(x))
    y = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    _identical(T.reduce(np.maximum, y, (0,), False), np.maximum.reduce(y))
    # which reductions run numpy's scalar pairwise loop: float sums over the axis innermost in memory
    m = np.ones((30, 40), np.float32)
    assert T._pairwise_loop(np.add, m, {1}) and T._pairwise_loop(np.add, m, {0, 1})
    assert not T._pairwise_loop(np.add, m, {0})  # rows added elementwise: SIMD
    assert T._pairwise_loop(np.add, m.T, {0}) and not T._pairwise_loop(np.add, m.T, {1})
    assert not T._pairwise_loop(np.maximum, m, {1}) and not T._pairwise_loop(np.add, m.astype(np.int32), {1})


def test_pairwise_plan_is_numpys_tree_and_cached(pool):
    leaves, tree = T._pairwise_plan(1000, 2)
    assert leaves == ((0, 248), (248, 248), (496, 248), (744, 256))  # halves rounded down to multiples of 8
    assert tree == ((0, 1), (2, 3))
    assert T._pairwise_plan(1000, 2) is T._pairwise_plan(1000, 2)
    assert T._pairwise_plan(100, 3) == (((0, 100),), 0)  # one leaf: numpy's block loop


def test_cold_pool_goes_serial_and_comes_back(pool, monkeypatch):
    """Made-up measurements of one kind of op: pooled wall times no better than the caller's serial estimate make
    the kind cold (and, as it is the only kind measured, active() False: the backend runs serial numpy, same
    bits); after the pause a probe that pays makes it warm again; failing probes double the pause up to
    _BACKOFF_MAX."""
    p = T._pool
    now = [1000.0]
    monkeypatch.setattr(T, "_clock", lambda: now[0])
    monkeypatch.setattr(T, "_MEASURE_FROM_CHUNK", 0)  # the fixture's small chunks: measured all the same
    assert T.active() and p.gain == 1.5 and not p.kinds
    for _ in range(20):  # the caller ran every chunk itself: speed-up 1/1.1
        p._measured("k", 4, 4, 1.0, 1.1)
        if not T.active("k"):
            break
    st = p.kinds["k"]
    assert not T.active("k") and st.cold_until == pytest.approx(now[0] + T._BACKOFF_MIN)
    assert not T.active() and p.all_cold_until == st.cold_until  # every measured kind is cold
    be = FlexBackend()
    x = np.random.default_rng(6).standard_normal((50, 40)).astype(np.float32)
    _identical(be.reduce("sum", x, (0, 1), False), np.add.reduce(x, axis=(0, 1)))  # serial while cold
    _identical(be.copy(x), x)
    now[0] += T._BACKOFF_MIN  # the pause is over: the next pooled op is a probe
    assert T.active("k") and T.active()
    p._measured("k", 4, 4, 1.0, 1.1)  # the probe does not pay: a pause twice as long
    assert not T.active("k") and st.cold_until == pytest.approx(now[0] + 2 * T._BACKOFF_MIN)
    for _ in range(12):
        now[0] = st.cold_until
        p._measured("k", 4, 4, 1.0, 1.1)
    assert st.cold_until - now[0] == pytest.approx(T._BACKOFF_MAX)
    now[0] = st.cold_until
    p._measured("k", 4, 2, 1.0, 1.2)  # the caller ran half the chunks in 1.2x the time of two: speed-up 1.67
    assert T.active("k") and st.cold_until == 0.0 and st.gain == pytest.approx(2 / 1.2)
    assert T.active() and p.all_cold_until == 0.0
    p._measured("k", 4, 2, 1.0, 0.0)  # a zero wall time measures nothing
    p._measured("k", 4, 2, 0.0, 1.0)  # nor does a CPU clock too coarse to see the chunks
    assert st.gain == pytest.approx(2 / 1.2)


def test_lowered_thresholds_never_go_cold(pool):
    """With test-sized chunks (the fixture, EMBER_FLEX_THREADS_MIN) the pool does not judge its speed: every
    large op stays pooled, so tests exercise the workers."""
    p = T._pool
    for _ in range(50):
        p._measured("k", 4, 4, 1.0, 10.0)
    assert T.active() and T.active("k") and p.gain == 1.5 and not p.kinds and p.all_cold_until == 0.0


def test_cold_pool_reset_by_set_num_threads(pool, monkeypatch):
    """A new thread count is measured afresh: every kind's estimate is dropped."""
    monkeypatch.setattr(T, "_MEASURE_FROM_CHUNK", 0)
    p = T._pool
    for _ in range(8):
        p._measured("k", 4, 4, 1.0, 3.0)
    assert not T.active("k") and not T.active()
    ember.set_num_threads(3)
    assert T.active() and T.active("k") and p.gain == 1.5 and not p.kinds and T.get_num_threads() == 3


def test_stalled_worker_makes_the_pool_cold_not_wrong(pool, monkeypatch):
    """A worker that never comes (another process on its core): the caller runs every chunk, the measured
    speed-up stays below 1, the pool goes cold; every result is still the serial one."""
    monkeypatch.setattr(T, "_MEASURE_FROM_CHUNK", 0)
    if T._CPU_CLOCK is None:
        pytest.skip("no fine-grained thread CPU clock here: the pool does not measure itself")
    pool.set_num_threads(2)
    x = np.random.default_rng(7).standard_normal(20_000).astype(np.float32)
    _identical(T.reduce(np.add, x, (0,), False), np.add.reduce(x))  # the one worker exists now
    release = threading.Event()

    class Stall:
        def work(self) -> None:
            release.wait(60)

    T._pool._queue.put(Stall())
    try:
        be = FlexBackend()
        for _ in range(40):
            _identical(be.reduce("sum", x, (0,), False), np.add.reduce(x))
            _identical(be.copy(x), x)
            if not T.active():
                break
        assert not T.active()
    finally:
        release.set()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_whole_reductions_serial_path_is_numpys(dtype):
    """Small whole-array reductions (no pool): a 0-d ndarray with numpy's dtype and bits, by every op."""
    be = FlexBackend()
    x = (np.random.default_rng(8).standard_normal((7, 9)) * 3).astype(dtype)
    ufuncs = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
    for op, uf in ufuncs.items():
        for a in (x, x.T, x[::2], x.reshape(-1)):
            dims = tuple(range(a.ndim))
            with np.errstate(all="ignore"):
                ref = np.asarray(uf.reduce(a, axis=dims))
                r = be.reduce(op, a, dims, False)
            _identical(r, ref)
            assert r.shape == ()


def test_amax_fast_path_keeps_torch_results_and_errors():
    """x.amax()/x.amin()/x.max() of the whole tensor (core's fast path) against torch, and the checks it skips
    still apply where they matter: empty input, complex input, keepdim, dim=[] and 0-d tensors."""
    torch = pytest.importorskip("torch")
    from ember.errors import DTypeError, ShapeError

    rng = np.random.default_rng(9)
    for dtype in (np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_):
        a = (rng.standard_normal((5, 6)) * 4).astype(dtype)
        x, xt = ember.tensor(a), torch.from_numpy(a.copy())
        for name in ("amax", "amin"):
            got, want = getattr(x, name)(), getattr(xt, name)()
            assert got.shape == () and got.dtype == x.dtype
            np.testing.assert_array_equal(got.numpy(), want.numpy())
            np.testing.assert_array_equal(getattr(x, name)(dim=[]).numpy(), want.numpy())
            np.testing.assert_array_equal(getattr(x, name)(keepdim=True).numpy(), getattr(xt, name)(
                dim=(0, 1), keepdim=True).numpy())
        np.testing.assert_array_equal(x.max().numpy(), xt.max().numpy())
    nan = ember.tensor([1.0, float("nan"), 3.0])
    assert np.isnan(nan.amax().item())
    np.testing.assert_array_equal(ember.tensor(2.5).amax().numpy(), np.float32(2.5))  # 0-d: the slow path
    with pytest.raises(ShapeError, match="amax"):
        ember.zeros((0, 3)).amax()
    with pytest.raises(DTypeError, match="complex"):
        ember.tensor(np.ones(3, np.complex64)).amax()
    with pytest.raises(DTypeError, match="keepdim"):
        ember.ones(3).amax(keepdim=1)


def test_threads_min_environment_pushes_everything_through_the_pool():
    """EMBER_FLEX_THREADS_MIN=n: every op from n elements chunks (SIMD reductions and copies too) and the pool
    never goes cold (chunks shorter than _MEASURE_FROM_CHUNK)."""
    import os
    import subprocess
    import sys

    code = ("from ember_flex import threads as T; "
            "print(T.MIN_ELEMS, T.MIN_CHUNK, T.FAST_FACTOR, T.COPY_MIN, T.MIN_CHUNK < T._MEASURE_FROM_CHUNK)")
    env = {**os.environ, "EMBER_FLEX_THREADS_MIN": "1024"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    assert out == ["1024", "512", "1", "1024", "True"]


def test_copies_are_serial_by_default():
    """COPY_MIN's default: the backend's clone never uses the pool (it measured no faster); threads.copy itself
    still chunks when called."""
    assert T.COPY_MIN >= 1 << 40 or T.COPY_MIN == T.MIN_ELEMS  # the default, or EMBER_FLEX_THREADS_MIN's
    if T.COPY_MIN == T.MIN_ELEMS:
        pytest.skip("EMBER_FLEX_THREADS_MIN is set: copies are pooled on purpose")
    before = T.pool_stats()["pooled"]
    x = np.arange(1 << 19, dtype=np.float32)
    _identical(FlexBackend().copy(x), x)
    assert T.pool_stats()["pooled"] == before


def test_run_executes_every_task_once_from_several_user_threads(pool):
    """threads.run (the kernels' entry to the pool): every task runs exactly once, from any number of user threads
    at once (a thread that finds the pool busy runs its tasks itself), and results land where each task writes."""
    outs = [np.zeros(64) for _ in range(6)]
    errors: list[BaseException] = []

    def user(k: int) -> None:
        def fill(lo: int, hi: int) -> None:
            outs[k][lo:hi] += np.arange(lo, hi) + k

        try:
            for _ in range(20):
                pool.run([(fill, (lo, lo + 8)) for lo in range(0, 64, 8)])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=user, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in ts)
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, 20 * (np.arange(64) + k))


@pytest.mark.parametrize("threads", [4, 1], ids=["pooled", "serial"])
def test_run_reraises_the_first_error_after_every_task_ran(pool, threads):
    pool.set_num_threads(threads)
    ran: list[int] = []

    def task(i: int) -> None:
        ran.append(i)
        if i == 2:
            raise ValueError("task 2 failed")

    with pytest.raises(ValueError, match="task 2 failed"):
        pool.run([(task, (i,)) for i in range(6)])
    assert sorted(ran) == list(range(6))  # nothing half-applied: the other tasks were not abandoned
    pool.run([(ran.append, (9,))])  # the pool is usable afterwards
    assert ran[-1] == 9
