"""flex's thread pool (ember_flex.threads): chunked elementwise ops, casts and reductions are bit for bit (and
stride for stride) the serial numpy calls; ``ember.set_num_threads`` sizes the pool; concurrent user threads
neither deadlock nor disagree.

The pool's size thresholds are lowered here (monkeypatched) so that small arrays take the chunked path, and the
pool gets 4 threads whatever the machine has: chunking, not the speed, is under test.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember_flex import threads as T
from ember_flex.backend import _BINARY, _UNARY, FlexBackend

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_]


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch):
    """4 threads, chunks of 16+ elements, every array of 64+ elements chunked; restored afterwards."""
    before = T.get_num_threads()
    # set_num_threads below derives min_elems from the patched MIN_ELEMS: monkeypatch restores it last
    monkeypatch.setattr(T, "min_elems", T.min_elems)
    monkeypatch.setattr(T, "MIN_CHUNK", 16)
    monkeypatch.setattr(T, "MIN_ELEMS", 64)
    T.set_num_threads(4)
    yield T
    T.set_num_threads(before)


@pytest.fixture
def be(pool) -> FlexBackend:
    return FlexBackend()


def _identical(r: np.ndarray, ref: np.ndarray) -> None:
    ref = np.asarray(ref)
    assert r.dtype == ref.dtype and r.shape == ref.shape
    assert r.tobytes() == ref.tobytes(), "values differ (bit for bit)"
    # layout as numpy's serial call (strides of length-1 dims are free)
    assert [s for s, n in zip(r.strides, r.shape) if n > 1] == [s for s, n in zip(ref.strides, ref.shape) if n > 1]


def _data(dtype: type, rng: np.random.Generator) -> np.ndarray:
    a = (rng.standard_normal((37, 131)) * 10).astype(dtype)
    if np.dtype(dtype).kind == "f":
        a[0, :6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30]
    return a


VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "strided": lambda a: a[:, ::3],
    "reversed": lambda a: a[::-1],
    "3d-permuted": lambda a: a[:, :129].reshape(37, 3, 43).transpose(1, 0, 2),
}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_unary_bit_identical(be, view, dtype):
    x = VIEWS[view](_data(dtype, np.random.default_rng(0)))
    chunked = 0
    for op, f in _UNARY.items():
        try:
            with np.errstate(all="ignore"):
                ref = f(x)
        except (TypeError, ValueError):  # no such loop for this dtype (bitwise_not of floats, ...)
            continue
        with np.errstate(all="ignore"):
            r = be.unary(op, x)
            direct = T.elementwise(f, (x,))
        _identical(r, ref)
        if direct is not None:
            chunked += 1
            _identical(direct, ref)
    assert chunked > 0  # every view here is one the pool chunks


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_binary_bit_identical(be, view, dtype):
    x = VIEWS[view](_data(dtype, np.random.default_rng(1)))
    y = VIEWS[view](_data(dtype, np.random.default_rng(2)))
    others = {"same": y, "copy": np.ascontiguousarray(y), "row": y[:1], "col": y[:, :1], "int": 3, "float": 1.5,
              "0-d": np.asarray(y[1, 1])}
    for op in _BINARY:
        for other in others.values():
            for a, b in ((x, other), (other, x)):
                try:
                    with np.errstate(all="ignore"):
                        ref = _serial_binary(op, a, b)
                except (TypeError, ValueError, OverflowError):
                    continue
                with np.errstate(all="ignore"):
                    r = be.binary(op, a, b)
                _identical(r, ref)


def _serial_binary(op: str, a, b) -> np.ndarray:
    """flex's binary with the pool off."""
    saved = T.min_elems
    T.min_elems = 1 << 62
    try:
        return FlexBackend().binary(op, a, b)
    finally:
        T.min_elems = saved


def test_broadcast_and_where_bit_identical(be):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    col = rng.standard_normal((64, 1)).astype(np.float32)
    _identical(be.binary("add", x, bias), x + bias)
    _identical(be.binary("mul", col, bias), col * bias)  # an outer product: both operands broadcast
    assert T.elementwise(np.add, (x, bias)) is not None
    cond = x > 0
    _identical(be.where(cond, x, bias), np.where(cond, x, bias))
    _identical(be.where(cond, x, 0.0), np.where(cond, x, np.float32(0)))
    _identical(be.where(cond, 1, x), np.where(cond, np.float32(1), x))
    _identical(be.where(cond.T, x.T, 2.0), np.where(cond.T, x.T, np.float32(2)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("to", [dt.float32, dt.float64, dt.float16, dt.bfloat16, dt.int32, dt.int64, dt.uint8,
                                dt.bool_], ids=lambda d: d.name)
def test_cast_bit_identical(be, dtype, to):
    x = _data(dtype, np.random.default_rng(4))
    for view in ("contiguous", "transposed", "strided"):
        v = VIEWS[view](x)
        with np.errstate(all="ignore"):
            ref = (np.trunc(v) if v.dtype.kind == "f" and to.numpy.kind in "iu" else v).astype(to.numpy)
            r = be.cast(v, to)
        _identical(r, ref)


REDUCE_DIMS = [(0,), (1,), (-1,), (0, 1), (1, 2), (0, 2), (0, 1, 2)]


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_reduce_bit_identical(be, op, dtype):
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    x = _data(dtype, np.random.default_rng(5))
    if op == "prod" and x.dtype.kind == "f":
        x = (1 + x / 1000).astype(dtype)  # products that stay finite
    arrays = {"2d": x, "2d-T": x.T, "3d": x[:, :129].reshape(37, 3, 43), "3d-perm": x[:, :129].reshape(37, 3, 43)
              .transpose(2, 0, 1), "strided": x[:, ::2]}
    for a in arrays.values():
        for dims in REDUCE_DIMS:
            if any(not -a.ndim <= d < a.ndim for d in dims) or len({d % a.ndim for d in dims}) != len(dims):
                continue
            for keep in (False, True):
                with np.errstate(all="ignore"):
                    ref = ufunc.reduce(a, axis=dims, keepdims=keep)
                    r = be.reduce(op, a, dims, keep)
                _identical(r, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [129, 1000, 4097, 65_537, 1_000_003])
@pytest.mark.parametrize("threads", [2, 3, 4, 8])
def test_whole_sum_follows_numpys_pairwise_order(pool, dtype, n, threads):
    """A whole float sum split across threads adds the same pairwise subtrees as numpy's own loop."""
    pool.set_num_threads(threads)
    x = (np.random.default_rng(n).standard_normal(n) * 1e3 + 7).astype(dtype)
    r = T.reduce(np.add, x, (0,), False)
    assert r is not None  # the pairwise path, not a serial fallback
    _identical(r, np.add.reduce(x))
    _identical(T.reduce(np.add, x.reshape(1, -1, 1), (0, 1, 2), True), np.add.reduce(x.reshape(1, -1, 1),
                                                                                          axis=(0, 1, 2),
                                                                                          keepdims=True))


def test_whole_max_zero_and_nan_are_serial(pool):
    x = np.zeros(1000, np.float32)
    x[::2] = -0.0
    assert T.reduce(np.maximum, x, (0,), False) is None  # the sign of a zero maximum is the serial order's
    y = np.arange(1000, dtype=np.float32)
    y[500] = np.nan
    assert T.reduce(np.maximum, y, (0,), False) is None
    y[500] = 3
    _identical(T.reduce(np.maximum, y, (0,), False), np.maximum.reduce(y))


def test_inplace_bit_identical_and_aliasing(be):
    rng = np.random.default_rng(6)
    for op in ("add", "mul", "maximum", "bitwise_and"):
        dtype = np.int32 if op == "bitwise_and" else np.float32
        a = (rng.standard_normal((50, 40)) * 10).astype(dtype)
        b = (rng.standard_normal((50, 40)) * 10).astype(dtype)
        for other in (b, b[:1], 3):
            ref = a.copy()
            _BINARY[op](ref, other, out=ref)
            got = a.copy()
            be.inplace_binary(op, got, other)
            _identical(got, ref)
    a = np.arange(4000, dtype=np.float32)
    ref = a.copy()
    ref += ref[::-1]  # numpy copies an overlapping operand first
    got = a.copy()
    assert not T.inplace(np.add, got, got[::-1])  # overlap: left to numpy
    be.inplace_binary("add", got, got[::-1])
    _identical(got, ref)


def test_errors_propagate_as_serial(be):
    with pytest.raises(ValueError):
        be.binary("add", np.ones((70, 3), np.float32), np.ones((70, 4), np.float32))
    with pytest.raises(TypeError):  # numpy's casting error from out=a, raised on the calling thread
        be.inplace_binary("add", np.ones(1000, np.int32), 1.5)


def test_set_num_threads_sizes_the_pool(monkeypatch):
    before = T.get_num_threads()
    # set_num_threads below derives min_elems from the patched MIN_ELEMS: monkeypatch restores it last
    monkeypatch.setattr(T, "min_elems", T.min_elems)
    monkeypatch.setattr(T, "MIN_CHUNK", 16)
    try:
        ember.set_num_threads(3)
        assert T.get_num_threads() == 3 and T.min_elems == T.MIN_ELEMS
        x = np.arange(10_000, dtype=np.float32)
        seen: set[str] = set()
        real = T._ufunc_chunk

        def spy(*args):
            seen.add(threading.current_thread().name)
            time.sleep(0.01)  # slow chunks: the woken workers claim some before the caller has done them all
            real(*args)

        monkeypatch.setattr(T, "_ufunc_chunk", spy)
        T.min_elems = 64
        _identical(T.elementwise(np.add, (x, x)), x + x)
        assert 2 <= len(seen) <= 3 and len(T._pool._workers) == 2  # the caller and up to 2 workers
        ember.set_num_threads(1)
        assert T.get_num_threads() == 1 and T.min_elems > 1 << 60  # n=1: nothing is chunked, no workers kept
        assert not T._pool._workers
        assert T.elementwise(np.add, (x, x)) is None
        seen.clear()
        FlexBackend().binary("add", x, x)
        assert not seen
    finally:
        ember.set_num_threads(before)


def test_concurrent_user_threads(be):
    """Several user threads with large ops at once: all results right, nobody stuck (one op holds the pool, the
    others run serially on their own thread)."""
    rng = np.random.default_rng(7)
    data = [rng.standard_normal((300, 300)).astype(np.float32) for _ in range(6)]
    expect = [(np.exp(d) + d, np.add.reduce(d, axis=1), np.add.reduce(d, axis=(0, 1))) for d in data]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                d = data[i]
                got = (be.binary("add", be.unary("exp", d), d), be.reduce("sum", d, (1,), False),
                       be.reduce("sum", d, (0, 1), False))
                for g, e in zip(got, expect[i]):
                    _identical(g, e)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(data))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a user thread is stuck"
    assert not errors, errors[0]


def test_tensor_ops_through_ember(pool):
    """End to end on an ember device: mean/var/max/sum over dims, clamp, where, casts against torch."""
    torch = pytest.importorskip("torch")
    dev = ember.Device.flex()
    x_np = np.random.default_rng(8).standard_normal((96, 80)).astype(np.float32)
    x, xt = ember.tensor(x_np, device=dev), torch.from_numpy(x_np.copy())
    pairs = [
        ((x.exp() + x).numpy(), (xt.exp() + xt).numpy()),
        (x.sum(dim=-1).numpy(), xt.sum(dim=-1).numpy()),
        (x.mean(dim=0).numpy(), xt.mean(dim=0).numpy()),
        (x.var(dim=1).numpy(), xt.var(dim=1).numpy()),
        (x.max(dim=1).values.numpy(), xt.max(dim=1).values.numpy()),
        (x.clamp(-0.5, 0.5).numpy(), xt.clamp(-0.5, 0.5).numpy()),
        (x.to(ember.float16).numpy(), xt.to(torch.float16).numpy()),
        (float(x.sum().item()), float(xt.sum().item())),
    ]
    for got, want in pairs:
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)


def test_fork_child_gets_a_fresh_pool(pool, monkeypatch):
    import os

    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    x = np.arange(10_000, dtype=np.float32)
    T.elementwise(np.add, (x, x))  # the parent's workers exist
    monkeypatch.setattr(T, "_MEASURE_FROM_CHUNK", 0)
    for _ in range(10):  # and a cold kind: the child measures afresh
        T._pool._measured(T._key(np.add), 4, 4, 1.0, 2.0)
    assert not T.active(np.add)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's workers are gone; the pool must make new ones, not wait for dead ones
        try:
            ok = not T._pool.kinds and T.active(np.add)
            ok = ok and T.elementwise(np.add, (x, x)) is not None
            ok = ok and np.array_equal(T.elementwise(np.add, (x, x)), x + x)
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    os.close(r)
    assert got == b"1"


def test_stalled_worker_never_blocks_the_caller(pool):
    """A worker that does not come (a machine busy with other processes) leaves its chunks to the caller: the op
    completes on the calling thread instead of waiting."""
    pool.set_num_threads(2)
    x = np.arange(10_000, dtype=np.float32)
    _identical(T.elementwise(np.add, (x, x)), x + x)  # the one worker exists now
    release = threading.Event()

    class Stall:
        def work(self) -> None:
            release.wait(60)

    T._pool._queue.put(Stall())  # the worker takes this and blocks
    try:
        for _ in range(5):
            _identical(T.elementwise(np.multiply, (x, x)), x * x)
            _identical(T.reduce(np.add, x.reshape(100, 100), (1,), False), np.add.reduce(x.reshape(100, 100), 1))
    finally:
        release.set()


BENCH = Path(__file__).resolve().parents[4] / "benchmarks" / "threads.py"


@pytest.mark.skipif(not BENCH.is_file(), reason="benchmarks/threads.py is not in this checkout")
def test_threads_benchmark_smoke(tmp_path, capsys):
    """``ember bench threads`` runs: every op at every size and thread count asked for, JSON with the timings."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("_bench_threads", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    before = ember.get_num_threads()
    out = tmp_path / "t.json"
    assert mod.main(["--quick", "--sizes", "100", "300000", "--threads", "1", "2", "--json", str(out)]) == 0
    assert ember.get_num_threads() == before  # restored
    res = json.loads(out.read_text())["seconds_per_call"]
    assert set(res) == {"1", "2"}
    for t in res.values():
        assert set(t) == set(mod.OPS)
        for per_size in t.values():
            assert set(per_size) == {"100", "300000"}
            assert all(cell["flex"]["median"] > 0 for cell in per_size.values())
    text = capsys.readouterr().out
    assert "sum(dim=-1) (float32)" in text and "xT1" in text


def test_numexpr_gets_flex_thread_count(monkeypatch):
    """Fused kernels (numexpr) use flex's thread count: at the first compile (numexpr would cap itself at 8-16
    on its own) unless the environment sets numexpr's, and on every ember.set_num_threads."""
    numexpr = pytest.importorskip("numexpr")
    from ember_flex import fusion

    before, ne_before = T.get_num_threads(), numexpr.get_num_threads()
    try:
        monkeypatch.delenv("NUMEXPR_NUM_THREADS", raising=False)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        T.set_num_threads(3)  # flex's pool only: numexpr still has its own count
        numexpr.set_num_threads(1)
        monkeypatch.setattr(fusion, "_threads_synced", False)
        fusion._sync_threads(numexpr)
        assert numexpr.get_num_threads() == 3
        numexpr.set_num_threads(1)
        fusion._sync_threads(numexpr)  # once only: a later numexpr setting of the user's stays
        assert numexpr.get_num_threads() == 1
        monkeypatch.setattr(fusion, "_threads_synced", False)
        monkeypatch.setenv("NUMEXPR_NUM_THREADS", "1")
        fusion._sync_threads(numexpr)
        assert numexpr.get_num_threads() == 1
        ember.set_num_threads(2)
        assert numexpr.get_num_threads() == 2 and T.get_num_threads() == 2
    finally:
        ember.set_num_threads(before)
        numexpr.set_num_threads(ne_before)
