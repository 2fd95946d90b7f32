"""flex's chunked uniform draws (ember_flex.random_kernels): bit for bit numpy's ``Generator.random`` on PCG64 and
the stream left in numpy's exact state, for every size and dtype, any interleaving with other draws, any chunking
and thread count; the device stream and ``ember.Generator`` streams drawing through it; threads sharing a stream.

The oracle is numpy's own ``Generator.random`` on a second PCG64 with the same seed. Most tests lower the size
thresholds and chunk sizes (monkeypatched) so that small arrays cross many chunk and block boundaries, and give the
pool 4 threads kept warm whatever the machine's load: chunking is under test, not speed.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember_flex import random_kernels as R
from ember_flex import threads as T
from ember_flex.backend import FlexBackend

FLOATS = [np.float32, np.float64]


def _same(r: np.ndarray, ref: np.ndarray) -> None:
    assert r.dtype == ref.dtype and r.shape == ref.shape
    assert r.flags.c_contiguous
    assert r.tobytes() == ref.tobytes(), "values differ (bit for bit)"


def _pair(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    return np.random.Generator(np.random.PCG64(seed)), np.random.Generator(np.random.PCG64(seed))


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch):
    """Every float32/float64 draw of 1+ elements chunked, 7 raw draws a chunk, 3 a block; a warm 4-thread pool."""
    before = T.get_num_threads()
    monkeypatch.setattr(R, "MIN_ELEMS", 1)
    monkeypatch.setattr(R, "CHUNK_DRAWS", 7)
    monkeypatch.setattr(R, "BLOCK_DRAWS", 3)
    monkeypatch.setattr(T, "MIN_CHUNK", 2)  # below the pool's measuring size: it never goes cold here
    monkeypatch.setattr(T, "min_elems", T.min_elems)  # restored last (undo runs after the teardown below)
    monkeypatch.setattr(T, "MIN_ELEMS", 1)
    T.set_num_threads(4)  # min_elems = MIN_ELEMS = 1
    yield R
    T.set_num_threads(before)


SHAPES = [(), (0,), (1,), (2,), (3,), (13,), (14,), (15,), (41,), (42,), (43,), (3, 0, 2), (5, 7), (2, 3, 7)]


@pytest.mark.parametrize("dtype", FLOATS, ids=["float32", "float64"])
@pytest.mark.parametrize("first", [0, 1, 2], ids=["fresh", "buffered-half", "even"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_uniform_is_numpys_draw_and_state(small, shape, dtype, first):
    a, b = _pair(12345)
    if first:  # a float32 draw of 1 element leaves the other half of its raw draw buffered; of 2 it leaves none
        _same(R.uniform(b, (first,), np.float32), a.random((first,), dtype=np.float32))
    for _ in range(3):  # repeated: each draw starts where the last left the stream, buffered half included
        _same(R.uniform(b, shape, dtype), a.random(shape, dtype=dtype))
        assert b.bit_generator.state == a.bit_generator.state
    _same(b.random(5, dtype=np.float32), a.random(5, dtype=np.float32))


def test_uniform_random_interleavings(small):
    """Random sequences of draws of random sizes and dtypes, mixed with numpy's own uniform, normal and integer
    draws on the same stream: every sample and the state after every step are numpy's."""
    plan = np.random.default_rng(0)
    for trial in range(60):
        seed = int(plan.integers(1 << 62))
        a, b = _pair(seed)
        for step in range(10):
            op = int(plan.integers(6))
            if op <= 2:
                shape = tuple(int(s) for s in plan.integers(0, 40, size=int(plan.integers(0, 3))))
                dtype = FLOATS[int(plan.integers(2))]
                _same(R.uniform(b, shape, dtype), a.random(shape, dtype=dtype))
            elif op == 3:
                _same(b.standard_normal(7, dtype=np.float32), a.standard_normal(7, dtype=np.float32))
            elif op == 4:
                _same(b.integers(0, 1000, size=5, dtype=np.int32), a.integers(0, 1000, size=5, dtype=np.int32))
            else:
                _same(b.random(3, dtype=np.float32), a.random(3, dtype=np.float32))
            assert b.bit_generator.state == a.bit_generator.state, (trial, step)


@pytest.mark.parametrize("dtype", FLOATS, ids=["float32", "float64"])
def test_uniform_at_the_real_thresholds_and_chunk_bounds(dtype):
    """The module's own constants (no monkeypatching): sizes around MIN_ELEMS, one chunk of raw draws and a block."""
    per = 2 if dtype == np.float32 else 1
    sizes = sorted({max(0, n + d) for n in (R.MIN_ELEMS, per * R.CHUNK_DRAWS, 2 * per * R.CHUNK_DRAWS,
                                            per * R.BLOCK_DRAWS) for d in (-1, 0, 1, 2)})
    a, b = _pair(7)
    for n in sizes:
        _same(R.uniform(b, (n,), dtype), a.random(n, dtype=dtype))
        assert b.bit_generator.state == a.bit_generator.state, n


def test_uniform_leaves_other_generators_and_dtypes_to_numpy(small):
    """Other bit generators (Philox), other dtypes, and bad sizes: numpy's own call, its numbers and its errors."""
    a, b = np.random.Generator(np.random.Philox(3)), np.random.Generator(np.random.Philox(3))
    _same(R.uniform(b, (100,), np.float32), a.random(100, dtype=np.float32))
    with pytest.raises(ValueError):
        R.uniform(b, (-1, 4), np.float32)
    with pytest.raises(TypeError):
        R.uniform(np.random.Generator(np.random.PCG64(0)), (10,), np.float16)


def test_self_check_agrees_and_a_disagreeing_numpy_keeps_its_own_calls(small, monkeypatch):
    assert R.agrees_with_numpy.__wrapped__() is True

    def broken(*args):
        raise AssertionError("the chunked path ran although numpy disagreed")

    monkeypatch.setattr(R, "agrees_with_numpy", lambda: False)
    monkeypatch.setattr(R, "_draw", broken)
    a, b = _pair(8)
    for n, dtype in [(1000, np.float32), (999, np.float64)]:
        _same(R.uniform(b, (n,), dtype), a.random(n, dtype=dtype))


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_the_numbers_do_not_depend_on_the_thread_count(small, threads):
    T.set_num_threads(threads)
    a, b = _pair(99)
    for n, dtype in [(101, np.float32), (64, np.float64), (1, np.float32), (200, np.float32), (33, np.float64)]:
        _same(R.uniform(b, (n,), dtype), a.random(n, dtype=dtype))
    assert b.bit_generator.state == a.bit_generator.state


def test_chunks_run_on_the_pool(small):
    """Plain tuples and ember.Size (what core's ops pass) both take the chunked path."""
    T.pool_stats(reset=True)
    a, b = _pair(5)
    _same(R.uniform(b, (1000,), np.float32), a.random(1000, dtype=np.float32))
    _same(R.uniform(b, ember.Size([10, 100]), np.float64), a.random((10, 100), dtype=np.float64))
    _same(R.uniform(b, ember.Size([3, 333]), np.float32), a.random((3, 333), dtype=np.float32))
    assert T.pool_stats()["pooled"] == 3


def test_ember_set_num_threads_one_and_two_give_the_same_draws():
    """Through ember's public API with the real thresholds: a large float32 and float64 draw on the device stream,
    with one thread and with two."""
    before = ember.get_num_threads()
    dev = ember.Device.flex()
    try:
        got = []
        for n in (1, 2):
            ember.set_num_threads(n)
            dev.seed(2024)
            got.append([ember.rand(3, device=dev).numpy(), ember.rand(300_001, device=dev).numpy(),
                        ember.rand(512, 513, dtype=ember.float64, device=dev).numpy()])
    finally:
        ember.set_num_threads(before)
    ref = np.random.Generator(np.random.PCG64(2024))
    for one, two, ref_ in zip(got[0], got[1], [ref.random(3, dtype=np.float32), ref.random(300_001, dtype=np.float32),
                                               ref.random((512, 513))]):
        _same(one, ref_)
        _same(two, ref_)


@pytest.mark.parametrize("dtype", [dt.float32, dt.float64, dt.float16, dt.bfloat16], ids=lambda d: d.name)
def test_backend_rand_after_seed(small, dtype):
    be = FlexBackend()
    be.seed(31)
    ref = np.random.Generator(np.random.PCG64(31))
    draw = np.float64 if dtype is dt.float64 else np.float32
    for shape in [(5,), (4, 9), (1,), (77,)]:
        r = be.rand(shape, dtype)
        _same(r, ref.random(shape, dtype=draw).astype(dtype.numpy))
        _same(be.randn((3,), dt.float32), ref.standard_normal(3, dtype=np.float32))
    be.seed(31)  # seed restarts the stream
    _same(be.rand((5,), dtype), np.random.Generator(np.random.PCG64(31)).random(5, dtype=draw).astype(dtype.numpy))


def test_generator_repeats_the_device_stream(small):
    """``ember.Generator`` seeded with n draws what ``Device.flex().seed(n)`` draws, through the same chunked path,
    and get_state/set_state mid-stream (on a buffered half) repeats every later draw."""
    dev = ember.Device.flex()
    dev.seed(77)
    g = ember.Generator(dev).manual_seed(77)
    for shape, dtype in [((3,), ember.float32), ((50,), ember.float32), ((20,), ember.float64), ((9,), ember.float32)]:
        a = ember.rand(*shape, dtype=dtype, device=dev).numpy()
        b = ember.rand(*shape, dtype=dtype, device=dev, generator=g).numpy()
        _same(b, a)
    state = g.get_state()  # 3 + 50 + 9 float32 after the float64 draw: a half is buffered now
    after = [ember.rand(n, device=dev, generator=g).numpy() for n in (101, 6, 64)]
    again = ember.Generator(dev).set_state(state)
    for n, ref in zip((101, 6, 64), after):
        _same(ember.rand(n, device=dev, generator=again).numpy(), ref)
    ref = np.random.Generator(np.random.PCG64(77))
    for n, dtype in [(3, np.float32), (50, np.float32), (20, np.float64), (9, np.float32), (101, np.float32)]:
        ref.random(n, dtype=dtype)
    _same(after[1], ref.random(6, dtype=np.float32))


def test_threads_sharing_one_stream_get_whole_distinct_draws(small):
    """8 threads drawing from one backend stream at once (the stream's lock held for each whole draw): each gets
    one of the draws that 8 draws in a row give, none twice, and the stream ends where 8 draws in a row leave it."""
    be = FlexBackend()
    be.seed(4)
    n, k = 600, 8
    results: list[np.ndarray] = []
    errors: list[BaseException] = []
    start = threading.Barrier(k)

    def draw() -> None:
        try:
            start.wait()
            for _ in range(3):
                results.append(be.rand((n,), dt.float32))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    workers = [threading.Thread(target=draw) for _ in range(k)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors and not any(w.is_alive() for w in workers)
    ref = np.random.Generator(np.random.PCG64(4))
    expected = {ref.random(n, dtype=np.float32).tobytes() for _ in range(3 * k)}
    assert len(expected) == 3 * k
    assert {r.tobytes() for r in results} == expected
    assert be._rng.bit_generator.state == ref.bit_generator.state
