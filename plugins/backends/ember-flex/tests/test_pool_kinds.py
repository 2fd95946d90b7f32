"""flex's thread pool judges each kind of op on its own (issue 17): a bandwidth-bound op whose pooled runs stop
paying goes serial without taking the second core from compute-bound kernels (attention blocks, GELU, exp).

Kinds are keyed automatically from what the callers already pass (a block function's code, a ufunc, the chunk
helper and its ufunc, ``functools.partial`` unwrapped); ``active()`` without a kind, what the backend asks before
chunking, is False only while every measured kind is cold. The estimates are driven with made-up measurements and
the module's ``_clock`` hook: nothing here times anything, and every result is checked against the serial numpy
call, bit for bit.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np
import pytest

from ember_flex import threads as T
from ember_flex.backend import FlexBackend


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch):
    """4 threads; arrays of 64+ elements chunked in chunks of 16+; the pool measures these small chunks as if
    they were large ones; a frozen clock (advanced by hand); restored afterwards."""
    before = T.get_num_threads()
    monkeypatch.setattr(T, "MIN_CHUNK", 16)
    monkeypatch.setattr(T, "MIN_ELEMS", 64)
    monkeypatch.setattr(T, "_MEASURE_FROM_CHUNK", 0)
    now = [1000.0]
    monkeypatch.setattr(T, "_clock", lambda: now[0])
    T.set_num_threads(4)
    yield now
    T.set_num_threads(before)


def _cool(kind: Any) -> None:
    """Made-up measurements of ``kind`` that never pay (the caller ran every chunk, 1.1x slower) until it is cold."""
    for _ in range(20):
        T._pool._measured(kind, 4, 4, 1.0, 1.1)
        if kind in T._pool.kinds and T._pool.kinds[kind].cold_until:
            return
    raise AssertionError("never went cold")


def _pays(kind: Any, times: int = 5) -> None:
    for _ in range(times):
        T._pool._measured(kind, 4, 2, 1.0, 1.0)  # the caller ran half the chunks in the time of one: 2x


def _fill(out: np.ndarray, lo: int, hi: int) -> None:
    out[lo:hi] = np.exp(np.arange(lo, hi, dtype=np.float64) / 1e4)


def _other_fill(out: np.ndarray, lo: int, hi: int) -> None:
    out[lo:hi] = np.sqrt(np.arange(lo, hi, dtype=np.float64))


def _tasks(fn: Any, out: np.ndarray, parts: int = 4) -> list[tuple[Any, tuple[Any, ...]]]:
    n = out.size
    return [(fn, (out, i * n // parts, (i + 1) * n // parts)) for i in range(parts)]


def test_one_kind_cold_another_pooled(pool):
    """A cold kind runs serially (counted cold), a paying one keeps the workers, and active() without a kind (the
    backend's question) stays True while any measured kind pays; every result is the serial one."""
    a, b = T._key(_fill), T._key(_other_fill)
    _cool(a)
    _pays(b)
    assert not T.active(_fill) and T.active(_other_fill) and T.active()
    ref_a, ref_b = np.empty(4000), np.empty(4000)
    _fill(ref_a, 0, 4000)
    _other_fill(ref_b, 0, 4000)
    T.pool_stats(reset=True)
    T.kind_stats(reset=True)
    out = np.empty(4000)
    T.run(_tasks(_fill, out))
    assert T.pool_stats(reset=True) == {"pooled": 0, "cold": 1} and out.tobytes() == ref_a.tobytes()
    out = np.empty(4000)
    T.run(_tasks(_other_fill, out))
    assert T.pool_stats(reset=True) == {"pooled": 1, "cold": 0} and out.tobytes() == ref_b.tobytes()
    stats = T.kind_stats()
    assert stats["_fill (test_pool_kinds)"] == {"gain": pytest.approx(T._pool.kinds[a].gain, abs=1e-3),
                                                 "cold": 1.0, "pooled": 0, "serial": 1}
    assert stats["_other_fill (test_pool_kinds)"]["cold"] == 0.0
    assert stats["_other_fill (test_pool_kinds)"]["pooled"] == 1
    # an unmeasured kind follows the global state: pooled while any kind pays
    assert T.active(lambda: None)


def test_global_active_false_only_when_every_kind_is_cold(pool):
    """active() without a kind turns False when the last warm kind goes cold, until the earliest pause ends; then
    the kind whose pause ended probes, the others stay serial until theirs end."""
    now = pool
    _pays("b", 1)
    _cool("a")
    assert T.active() and not T.active("a")  # "b" still pays
    now[0] += T._BACKOFF_MIN / 2
    _cool("b")
    assert not T.active() and not T.active("a") and not T.active("b") and not T.active("never measured")
    assert T._pool.all_cold_until == T._pool.kinds["a"].cold_until  # the earliest end
    now[0] = T._pool.kinds["a"].cold_until
    assert T.active() and T.active("a") and not T.active("b")
    _pays("a", 1)  # the probe pays: "a" warm again
    assert T.active("a") and T._pool.kinds["a"].cold_until == 0.0 and T._pool.all_cold_until == 0.0


def test_new_kind_starts_from_the_machines_estimate(pool):
    """The pool's running mean over every kind is where a new kind starts: on a machine where nothing paid lately
    a new kind goes cold after one failing op (not after five from the hopeful 1.5), and one that pays at once
    stays warm."""
    assert T._pool.gain == 1.5
    _cool("a")
    _cool("b")
    assert T._pool.gain < T._PAYS
    T._pool._measured("c", 4, 4, 1.0, 1.1)
    assert not T.active("c")
    T._pool._measured("d", 4, 1, 1.0, 1.0)  # the caller ran one chunk of four in the op's time: 4x
    assert T.active("d") and T._pool.kinds["d"].gain > T._PAYS


def test_lucky_probe_keeps_the_long_pause_until_the_kind_pays_in_a_row(pool):
    """After failing probes have grown the pause, a probe that pays makes the kind warm, but if it goes cold again
    soon the pause is as long as before (no 10 ms cycling on a busy machine); _TRUSTED paying ops in a row bring
    the pause back to 10 ms."""
    now = pool
    _cool("k")
    st = T._pool.kinds["k"]
    for _ in range(4):  # failing probes: 20, 40, 80, 160 ms
        now[0] = st.cold_until
        T._pool._measured("k", 4, 4, 1.0, 1.1)
    assert st.backoff == pytest.approx(16 * T._BACKOFF_MIN)
    now[0] = st.cold_until
    T._pool._measured("k", 4, 3, 1.0, 1.2)  # a lucky probe: 1.11x
    assert T.active("k")
    _cool("k")
    assert st.cold_until - now[0] == pytest.approx(16 * T._BACKOFF_MIN)  # the long pause again
    now[0] = st.cold_until
    T._pool._measured("k", 4, 2, 1.0, 1.0)  # a probe that pays 2x, then paying ops in a row
    _pays("k", T._TRUSTED)
    assert st.backoff == T._BACKOFF_MIN
    _cool("k")
    assert st.cold_until - now[0] == pytest.approx(T._BACKOFF_MIN)


def test_elementwise_and_reductions_are_their_own_kinds(pool):
    """The backend's add going cold leaves exp, in-place add and sums on the pool; the cold add is numpy's serial
    call (same bits), decided before any chunking."""
    be = FlexBackend()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 100)).astype(np.float32)
    y = rng.standard_normal((64, 100)).astype(np.float32)
    _pays("another kind")
    _cool(T._key(np.add))
    assert T.active()  # what backend.binary asks first
    T.pool_stats(reset=True)
    assert be.binary("add", x, y).tobytes() == (x + y).tobytes()
    assert T.pool_stats(reset=True) == {"pooled": 0, "cold": 1}
    assert be.unary("exp", x).tobytes() == np.exp(x).tobytes()
    z = x.copy()
    be.inplace_binary("add", z, y)
    assert z.tobytes() == (x + y).tobytes()
    assert be.reduce("sum", x, (1,), False).tobytes() == np.add.reduce(x, axis=1).tobytes()
    assert T.pool_stats(reset=True) == {"pooled": 3, "cold": 0}
    names = set(T.kind_stats())
    assert {"add", "exp", "inplace.add", "reduce.add.pairwise.rows"} <= names, names
    _cool(("reduce", np.add, "pairwise", "rows"))
    T.pool_stats(reset=True)
    assert be.reduce("sum", x, (1,), False).tobytes() == np.add.reduce(x, axis=1).tobytes()
    assert T.pool_stats(reset=True) == {"pooled": 0, "cold": 1}
    # whole-array reductions: a kind per ufunc and loop too
    i = rng.integers(-9, 9, 6400)
    assert be.reduce("sum", x, (0, 1), False).tobytes() == np.add.reduce(x, axis=(0, 1)).tobytes()
    assert be.reduce("sum", i, (0,), False).tobytes() == np.add.reduce(i).tobytes()
    assert T.pool_stats(reset=True) == {"pooled": 2, "cold": 0}
    assert {"reduce.add.pairwise.whole", "reduce.add.simd.whole"} <= set(T.kind_stats()), T.kind_stats()


def test_kind_keys():
    """Kinds from what callers pass: every closure of one def is one kind; partial unwrapped; a chunk helper and
    its ufunc, or a wrapper and its block function, together; a bound method by its code; a callable object by
    its type; C functions by name; run(kind=fn) and active(fn) key fn as the automatic kind does."""

    def make(k: int) -> Any:
        def block(lo: int, hi: int) -> None:
            return None
        return block

    def wrapper(body: Any, lo: int, hi: int) -> None:
        body(lo, hi)

    class Obj:
        def method(self, lo: int) -> None:
            return None

        def __call__(self, lo: int) -> None:
            return None

    assert T._task_kind((make(1), (0, 1))) == T._task_kind((make(2), (0, 1))) == make(3).__code__
    assert T._task_kind((functools.partial(make(1), 0), (1,))) == make(1).__code__
    assert T._task_kind((T._ufunc_chunk, (np.exp, (), (), 0, 1, None, 0))) == (T._ufunc_chunk.__code__, np.exp)
    assert T._task_kind((wrapper, (make(1), 0, 1))) == (wrapper.__code__, make(1).__code__)
    assert T._task_kind((Obj().method, (0,))) == Obj.method.__code__
    assert T._task_kind((Obj(), (0,))) is Obj
    assert T._key(np.exp) is np.exp and T._key(len) == ("builtins", "len")
    assert T._task_kind((T._leaf_sum, (np.zeros(3), np.zeros(1)))) == T._leaf_sum.__code__  # arrays: no callable
    assert T._kind_name(make(1).__code__) == "test_kind_keys.<locals>.make.<locals>.block (test_pool_kinds)" or \
        T._kind_name(make(1).__code__) == "block (test_pool_kinds)"  # Python 3.10: no co_qualname


def test_kinds_are_capped_least_recently_measured_first(pool, monkeypatch):
    monkeypatch.setattr(T, "_MAX_KINDS", 8)
    for i in range(8):
        _pays(("k", i), 1)
    _pays(("k", 0), 1)  # measured again: now the most recent
    for i in range(8, 12):
        _pays(("k", i), 1)
    assert len(T._pool.kinds) == 8
    assert set(T._pool.kinds) == {("k", i) for i in (0, 5, 6, 7, 8, 9, 10, 11)}
    assert T.active()


def test_set_num_threads_starts_afresh(pool):
    """A new thread count drops every kind's estimate (a forked child's too: test_threaded_kernels)."""
    _cool("a")
    _pays("b")
    T.set_num_threads(3)
    assert not T._pool.kinds and T.active("a") and T.active() and T._pool.gain == 1.5


def test_user_threads_measure_many_kinds_at_once(pool, monkeypatch):
    """Several user threads run ops of more kinds than the cap, measured (real clocks) and evicted while the others
    read the estimates: no error, every result the serial one, the table within its cap."""
    monkeypatch.setattr(T, "_MAX_KINDS", 3)
    monkeypatch.setattr(T, "_clock", __import__("time").perf_counter)
    fns = [np.exp, np.sqrt, np.negative, np.abs, np.square, np.sin]
    x = np.random.default_rng(5).random(5000).astype(np.float32)
    refs = {f: f(x).tobytes() for f in fns}
    errors: list[BaseException] = []

    def user(k: int) -> None:
        try:
            for i in range(40):
                f = fns[(i + k) % len(fns)]
                r = T.elementwise(f, (x,))
                assert (f(x) if r is None else r).tobytes() == refs[f]
                T.active(f)
                T.active()
                T.kind_stats()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    users = [threading.Thread(target=user, args=(k,)) for k in range(4)]
    for t in users:
        t.start()
    for t in users:
        t.join(60)
    assert not errors, errors[0]
    assert 1 <= len(T._pool.kinds) <= 3
