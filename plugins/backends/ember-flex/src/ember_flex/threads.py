"""flex's intra-op thread pool: large elementwise ops and reductions chunked across the machine's cores.

numpy runs a ufunc's inner loop without the GIL, so chunks of one op, each a plain numpy call on a slice, run in
parallel on a few Python threads. :func:`elementwise`, :func:`cast` and :func:`reduce` are what
:class:`~ember_flex.backend.FlexBackend` calls for arrays of at least :data:`min_elems` elements (below, the
chunking and a worker's wake-up cost more than a second core gains; see :data:`MIN_ELEMS`); each returns ``None``
where it would not give the serial result exactly, and the caller then runs the serial numpy call.

Results are bit-identical to the one-thread path, layout (strides) included:

* elementwise: every element is computed by the same inner loop on the same dtypes; chunks are slices along the
  outermost axis in memory, so each has the serial call's strides (and numpy picks the same SIMD or scalar loop);
* reductions over some axes are split along a *kept* (non-reduced) axis only, in chunks at least 2 long, so every
  output element is accumulated over exactly the elements, in exactly the order, of the serial call;
* whole float32/float64 sums split numpy's pairwise summation tree (``pairwise_sum`` in numpy's loops: halves at
  ``n/2`` rounded down to a multiple of 8, above 128 elements): each thread sums whole subtrees with numpy itself,
  and the partial sums are added in the tree's order in the array's dtype. Integer and bool reductions are exact in
  any order. Float max/min combine chunk maxima, and recompute serially when the result is a zero or NaN (whose
  sign or payload depends on the order); float prod and half-precision sums (accumulated wider inside numpy's loop)
  run serially.

Reductions that numpy runs with SIMD loops (max/min, integer sums, float sums over outer axes) are ~4-8x faster
per element than the scalar pairwise float sum, so they are chunked only from :data:`FAST_FACTOR` times as many
elements. :func:`copy` fills a fresh C-order array in chunks (``np.copyto`` on slices: exact however it is split);
the backend's clone/contiguous use it only from :data:`COPY_MIN` elements on, by default never (measured no faster
than numpy's serial copy here).

``EMBER_FLEX_THREADS_MIN=n`` (environment, read at import) chunks arrays from n elements on instead: for tests that
push small arrays through the pool and for measuring the threshold on other machines.

Cold pool: on a machine whose other cores are busy with other processes, a worker that claims a chunk and is then
preempted makes the caller wait for it, and pooled ops run slower than serial ones (measured here: a 1M-element
float32 sum 0.54 ms pooled against 0.42 ms serial, minima, with 6 processes on 2 cores). Each pooled op therefore
times the caller's own chunks (their CPU seconds per chunk times all chunks: the serial cost) against the op's
wall time; when a running mean of that speed-up falls below :data:`_PAYS`, ops of that kind run serially for 10 ms
(doubling to 1 s while the probe after each pause does not pay; back to 10 ms once the kind has paid
:data:`_TRUSTED` pooled ops in a row after a probe): the backend's reductions, casts and elementwise
ops their plain serial calls, a kernel's blocks one after another on the caller. Only timing depends on this:
every chunking gives the serial bits. With the thresholds lowered (tests, EMBER_FLEX_THREADS_MIN) the pool never
goes cold: chunking is under test there, not speed.

Per kind, not one estimate for all: a bandwidth-bound op (``a + b``, a cast) gains ~1.0-1.3x from a second thread
on a small VM, a compute-bound kernel (attention blocks, GELU, exp, norm blocks) ~2x. With one running mean the
many cheap elementwise ops dragged it under :data:`_PAYS`, and the attention blocks of a transformer's forward then
ran serially too (on a quiet 2-core VM: a (2, 8, 512, 64) float32 attention 14-17 ms pooled, 26-28 ms serial). A
kind is keyed from what the caller passes, without naming it (:func:`run`): a block function's code object (every
closure of one ``def`` is one kind; ``functools.partial`` unwrapped), with the first argument's where that is a
function too (a wrapper and the kernel it runs), or a ufunc; the backend's elementwise ops are a kind per ufunc or
function, reductions per ufunc, loop and split. A new kind starts from the running mean over all kinds (the
machine's estimate: on a busy machine it goes cold after one op that does not pay); at most :data:`_MAX_KINDS`
kinds are kept, the least recently measured dropped. :func:`active` without a kind, what the backend asks before
it chunks, is False only while every measured kind is cold (a machine whose other cores are taken), and a kind not
measured yet follows it. The estimate cannot see two threads slowing each other (memory bandwidth): it errs towards
pooling, as the pool did before it measured. :func:`kind_stats` shows each kind's estimate and counts.

Pool: one process-wide pool of ``get_num_threads() - 1`` daemon workers, sized by ``ember.set_num_threads``
(``1``: no pool, everything serial). An op is cut into about two chunks per thread; the calling thread and the
workers it woke claim them one at a time, so a worker that is late (other processes on the cores) leaves its
chunks to the caller instead of making it wait. One op at a time uses the pool: a user
thread that finds it busy runs its op serially instead of queueing, so N user threads never make more than
``N + threads - 1`` busy threads, and no chunk ever waits on another op (no deadlock). After ``os.fork`` the
child starts with no workers and makes new ones on first use.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from types import CodeType
from typing import Any

import numpy as np

ndarray = np.ndarray

#: smallest output (elementwise) or input (reduction) element count that is chunked. Measured on a 2-core machine
#: shared with other work (the numbers behind ``ember bench threads``): the chunked path costs ~5 us plus ~4 us of
#: Python per chunk, and a worker's wake-up 10-30 us, while numpy's a + b takes ~0.3-0.6 ns per float32 element;
#: below ~2**18 elements (one chunk of ~2**16 per thread) the overhead would eat what a second core gains
MIN_ELEMS = 1 << 18
#: smallest chunk, in elements (~20-60 us of a + b): smaller chunks cost more to dispatch than they save
MIN_CHUNK = 1 << 16

#: reductions numpy runs with SIMD (max/min of any dtype, integer sums, float sums over outer axes) take ~0.05-0.1
#: ns per element against ~0.37 for the scalar pairwise float sum, so they are chunked only from FAST_FACTOR times
#: as many elements: below, the pool's ~15-30 us cost more than half of a serial call
FAST_FACTOR = 4
#: copies (clone, contiguous) are chunked from this many elements on: by default never. In every same-run
#: measurement on the busy 2-core machine this was written on, numpy's serial copy was as fast or faster (medians,
#: serial vs pooled: 16 MB 6.0 vs 1.7 GB/s; 64 MB 0.76 vs 0.78, 1.40 vs 1.25, 0.63 vs 0.44). A machine where
#: :func:`copy` pays sets it (``ember_flex.threads.COPY_MIN = 1 << 22``, say); EMBER_FLEX_THREADS_MIN sets it too
COPY_MIN = 1 << 62

# EMBER_FLEX_THREADS_MIN=n: chunk from n elements on (chunks from n/2): for tests that push small arrays through
# the pool (the conformance kit, say) and for measuring thresholds on other machines
_env_min = os.environ.get("EMBER_FLEX_THREADS_MIN", "")
if _env_min.isdigit() and int(_env_min) > 0:
    MIN_ELEMS = int(_env_min)
    MIN_CHUNK = max(2, min(MIN_CHUNK, MIN_ELEMS // 2))
    FAST_FACTOR = 1
    COPY_MIN = MIN_ELEMS

#: what the backend compares sizes with: MIN_ELEMS, or a size nothing reaches when there is one thread
min_elems: int = MIN_ELEMS

_NEVER = 1 << 62

#: a pooled op "pays" when the serial estimate is at least this many times its wall time; below (a running mean),
#: the pool goes cold for _BACKOFF_MIN seconds, doubling up to _BACKOFF_MAX while probes keep failing
_PAYS = 1.05
_BACKOFF_MIN = 0.01
_BACKOFF_MAX = 1.0
#: the clock of the cold-pool pauses (tests replace it)
_clock = time.perf_counter
#: the pool measures itself (and may go cold) only while chunks are at least this long: with the thresholds lowered
#: (tests, EMBER_FLEX_THREADS_MIN) chunking is under test, not speed, and every large op stays pooled
_MEASURE_FROM_CHUNK = 1 << 16
#: kinds of op with an estimate of their own (see :func:`run`): a model's few dozen kernels and ufuncs fit; beyond,
#: the least recently measured kind is dropped (and measured afresh when it comes back)
_MAX_KINDS = 64
#: a kind back from a pause is trusted again (its next pause the shortest) after this many paying pooled ops in a row
_TRUSTED = 8


def _cpu_clock() -> Callable[[], float] | None:
    """The calling thread's CPU clock where it resolves microseconds (Linux, macOS); None elsewhere (Windows
    counts thread time in 15.6 ms ticks): the pool then never measures itself, nor goes cold."""
    try:
        return time.thread_time if time.get_clock_info("thread_time").resolution <= 1e-6 else None
    except (AttributeError, ValueError, OSError):
        return None


_CPU_CLOCK = _cpu_clock()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


class _Batch:
    """One op's chunks, claimed one at a time by whoever runs :meth:`work` (the calling thread and the workers it
    woke): a worker that is late (a busy machine) finds fewer or no chunks left, and the caller never waits for a
    chunk nobody has started."""

    __slots__ = ("tasks", "claim", "finish", "done", "error")

    def __init__(self, tasks: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        self.tasks = tasks
        self.claim = itertools.count().__next__  # atomic: one C call under the GIL
        self.finish = itertools.count(1).__next__  # likewise: whoever draws len(tasks) finished the last chunk
        # held until the last chunk is done: the caller blocks on it (a bare lock: cheaper than an Event's
        # Condition, which runs Python code under its own lock on both sides)
        self.done = threading.Lock()
        self.done.acquire()
        self.error: BaseException | None = None

    def work(self, clock: Callable[[], float] | None = None) -> tuple[int, float]:
        """Run unclaimed chunks until none is left; return how many this thread ran and, with a ``clock``, the
        time they took on it."""
        tasks, n = self.tasks, len(self.tasks)
        ran, busy = 0, 0.0
        while True:
            i = self.claim()
            if i >= n:
                return ran, busy
            fn, args = tasks[i]
            exc: BaseException | None = None
            t0 = clock() if clock is not None else 0.0
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread, which raises it
                exc = e
            if clock is not None:
                busy += clock() - t0
            ran += 1
            if exc is not None and self.error is None:
                self.error = exc  # the first error (two at once: either; both are the serial call's)
            if self.finish() == n:
                self.done.release()


class _Speed:
    """One kind of op's estimate: the running mean of its pooled ops' measured speed-up, and its cold pause."""

    __slots__ = ("gain", "cold_until", "backoff", "streak", "used", "pooled", "cold")

    def __init__(self, gain: float) -> None:
        self.gain = gain  # starts from the machine's estimate (all kinds'): a busy machine's new kinds go cold fast
        #: while _clock() < cold_until, ops of this kind run serially: the last pooled ones did not pay
        self.cold_until = 0.0
        self.backoff = _BACKOFF_MIN
        self.streak = 0  # pooled ops that paid since the kind last came back from a pause
        self.used = 0  # the pool's tick at its last measurement: the least recently measured kind is dropped first
        self.pooled = 0  # ops of this kind run on the workers, and run serially while cold (see kind_stats)
        self.cold = 0


def _key(f: Any) -> Hashable:
    """The kind key of a callable: a Python function's (or bound method's) code object, so every closure made by
    one ``def`` is one kind; a ufunc itself; other functions by module and qualified name; any other callable by
    its type. ``functools.partial`` is unwrapped. Never the callable itself where that could keep objects alive."""
    if type(f) is np.ufunc:  # the backend's elementwise ops: first, cheapest
        return f
    while isinstance(f, functools.partial):
        f = f.func
    code = getattr(f, "__code__", None)
    if isinstance(code, CodeType):
        return code
    if isinstance(f, np.ufunc):
        return f
    name = getattr(f, "__qualname__", None)
    if isinstance(name, str):  # builtins and C functions: module-level, named
        return (getattr(f, "__module__", None), name)
    return type(f)


def _task_kind(task: tuple[Callable[..., Any], tuple[Any, ...]]) -> Hashable:
    """The kind of a batch of tasks, from its first: the function's key, and the first argument's when that is
    callable too (a generic chunk helper running a ufunc, or a wrapper running a kernel's block function)."""
    fn, args = task
    k = _key(fn)
    if args and callable(args[0]):
        return (k, _key(args[0]))
    return k


def _kind_name(k: Any) -> str:
    """A readable name of a kind key (kind_stats)."""
    if isinstance(k, CodeType):
        return f"{getattr(k, 'co_qualname', k.co_name)} ({os.path.basename(k.co_filename).removesuffix('.py')})"
    if isinstance(k, np.ufunc):
        return k.__name__
    if isinstance(k, type):
        return k.__qualname__
    if isinstance(k, tuple):
        return ".".join(_kind_name(x) for x in k if x is not None)
    return str(k)


class _Pool:
    """Daemon worker threads fed from one queue; :meth:`run` runs one op's chunks on them and the caller."""

    def __init__(self) -> None:
        self.threads = _cpu_count()
        self._reset()

    def _reset(self) -> None:
        # also the after-fork handler: the child has none of the parent's threads (it keeps their count, made
        # anew on first use), and the parent's locks may have been held at the fork
        self._workers: list[threading.Thread] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._busy = threading.Lock()  # held by the one op using the workers
        self._reset_speed()
        #: ops run on the workers, and large ops run serially because the pool or their kind was cold (pool_stats)
        self.pooled = 0
        self.cold = 0

    def _reset_speed(self) -> None:
        # every estimate is written under _busy (run's _measured, set_threads) and read without it: rebinding the
        # dict leaves a concurrent reader with the old one, consistent in itself
        #: kind key -> its estimate; at most _MAX_KINDS, the least recently measured dropped first
        self.kinds: dict[Hashable, _Speed] = {}
        #: > 0 while every measured kind is cold (the earliest end of their pauses): the machine is busy, and
        #: active() without a kind says so to callers that check before chunking
        self.all_cold_until = 0.0
        self._tick = 0
        #: running mean of every pooled op's measured speed-up, whatever its kind (a hopeful start): the machine's
        #: estimate, which a new kind starts from
        self.gain = 1.5

    def active(self, kind: Hashable | None = None) -> bool:
        """Whether large ops (of ``kind``) should be chunked now: False for a while after pooled ops of that kind
        stopped paying (the other cores busy with other processes, or a bandwidth-bound op that a second thread
        does not speed up), True again when that while is over (the next pooled op of the kind measures again).
        Without a kind, or for a kind not measured yet: False only while every measured kind is cold."""
        return self._pays(kind)

    def _pays(self, kind: Hashable | None) -> bool:
        st = None if kind is None else self.kinds.get(kind)
        until = self.all_cold_until if st is None else st.cold_until
        if not until or _clock() >= until:
            return self.threads > 1
        self.cold += 1
        if st is not None:
            st.cold += 1
        return False

    def _measured(self, kind: Hashable, tasks: int, ran: int, busy: float, wall: float) -> None:
        """Update ``kind``'s speed-up estimate after one of its pooled ops (under ``_busy``): the caller's own
        chunks timed the serial cost (the CPU seconds of its chunks per chunk, times all chunks) against the op's
        wall time. CPU time, not wall time: a caller preempted by other processes would otherwise find its own
        chunks slow and the pool's wall time good in comparison. Only the timing uses this: every chunking gives
        the serial bits."""
        self.pooled += 1
        if ran == 0 or busy <= 0 or wall <= 0 or MIN_CHUNK < _MEASURE_FROM_CHUNK:
            return
        ratio = busy * tasks / ran / wall
        st = self.kinds.get(kind)
        if st is None:
            if len(self.kinds) >= _MAX_KINDS:
                del self.kinds[min(self.kinds, key=lambda k: self.kinds[k].used)]
            st = self.kinds[kind] = _Speed(self.gain)
            self.all_cold_until = 0.0  # a new kind is warm
        self.gain += (ratio - self.gain) * 0.25
        self._tick += 1
        st.used = self._tick
        st.pooled += 1
        now = _clock()
        if st.cold_until:  # a probe after a cold spell: one pooled op decides
            if ratio >= _PAYS:
                # warm again, but the pause stays as long until the kind has paid _TRUSTED times in a row: on a
                # busy machine a lucky probe would otherwise restart pauses of 10 ms, and many kinds' probes add up
                st.cold_until, st.gain, st.streak = 0.0, ratio, 0
                self.all_cold_until = 0.0
            else:
                st.backoff = min(2 * st.backoff, _BACKOFF_MAX)
                self._cools(st, now + st.backoff)
            return
        st.gain += (ratio - st.gain) * 0.25
        if st.gain < _PAYS:
            self._cools(st, now + st.backoff)
        else:
            st.streak += 1
            if st.streak >= _TRUSTED:
                st.backoff = _BACKOFF_MIN

    def _cools(self, st: _Speed, until: float) -> None:
        """``st``'s kind goes cold until ``until``; when every kind is cold, so is active() without a kind."""
        st.cold_until = until
        kinds = self.kinds.values()
        self.all_cold_until = min(s.cold_until for s in kinds) if all(s.cold_until for s in kinds) else 0.0

    def _work(self) -> None:
        get = self._queue.get
        while True:
            batch = get()
            if batch is None:  # a stop request from set_threads
                return
            batch.work()

    def set_threads(self, n: int) -> None:
        """n threads in all (n - 1 workers); workers beyond that stop once the op in flight (if any) is done."""
        with self._busy:
            self.threads = n
            self._reset_speed()  # a new thread count is measured afresh
            extra = len(self._workers) - (n - 1)
            for _ in range(max(0, extra)):
                self._queue.put(None)
            if extra > 0:
                self._workers = self._workers[:n - 1]

    def run(self, tasks: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], kind: Hashable | None = None) -> None:
        """Run every ``fn(*args)`` on this thread and the workers; return when all are done and raise the first
        error. Serial on this thread when another op holds the pool or while it, or the tasks' kind (``kind``, by
        default :func:`_task_kind` of the first task), is cold (:meth:`active`)."""
        if len(tasks) < 2:
            _run_serially(tasks)
            return
        if kind is None:
            kind = _task_kind(tasks[0])
        # self.active() first, without a kind: what a test that keeps the pool on replaces
        if not self.active() or not self._pays(kind) or not self._busy.acquire(blocking=False):
            _run_serially(tasks)
            return
        try:
            t0 = time.perf_counter()
            wake = min(len(tasks), self.threads) - 1
            while len(self._workers) < wake:
                t = threading.Thread(target=self._work, name=f"ember-flex-{len(self._workers)}", daemon=True)
                t.start()
                self._workers.append(t)
            batch = _Batch(tasks)
            put = self._queue.put
            for _ in range(wake):
                put(batch)
            ran, busy = batch.work(_CPU_CLOCK)  # chunks until none is left unclaimed; then the workers' ones
            batch.done.acquire()
            if batch.error is not None:
                raise batch.error
            self._measured(kind, len(tasks), ran, busy, time.perf_counter() - t0)
        finally:
            self._busy.release()


_pool = _Pool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_pool._reset)


def set_num_threads(n: int) -> None:
    """Use n threads for large elementwise ops and reductions (1: all serial). ``ember.set_num_threads`` calls
    this through flex's ``register_backend_traits`` declaration; every kind's speed estimate starts afresh."""
    global min_elems
    _pool.set_threads(n)
    min_elems = MIN_ELEMS if n > 1 else _NEVER


def active(kind: Any = None) -> bool:
    """Whether chunking large ops pays now (see :meth:`_Pool.active`): callers that check it run their plain
    serial call while it is False, skipping even the chunking's Python; the others' chunks then run one after
    another on the calling thread. ``kind``: a function as passed to :func:`run` (its kind is that of
    ``run([(kind, args)])`` with a non-callable first argument) or a kind key; without it, False only while every
    kind measured so far is cold (a busy machine)."""
    if kind is None:
        return _pool.active()  # without an argument: what a test that keeps the pool on replaces
    return _pool._pays(_key(kind) if callable(kind) else kind)


def _run_serially(tasks: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """Every task on this thread; the first error is raised after all ran, as on the pool (no task abandoned)."""
    first: BaseException | None = None
    for fn, args in tasks:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - re-raised below, once every task ran
            first = first or exc
    if first is not None:
        raise first


def run(tasks: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], kind: Any = None) -> None:
    """Run every ``fn(*args)`` of ``tasks`` (independent of each other) on this thread and the pool's workers,
    returning when all are done and re-raising the first error; one after another on this thread while the pool is
    cold or another op holds it. For kernels that cut their own work into blocks, each computed the same way
    whatever thread runs it (flex's norm, training and attention kernels).

    Whether pooling pays is estimated per kind of op: ``kind`` (a function or a kind key, as :func:`active`
    takes), by default the first task's function (with its first argument where that is a function too: a
    wrapper's kernel), so each kernel's blocks are judged on their own."""
    _pool.run(tasks, None if kind is None else _key(kind) if callable(kind) else kind)


def pool_stats(reset: bool = False) -> dict[str, int]:
    """``{"pooled": ops run on the workers, "cold": large ops run serially because the pool (or their kind) was
    cold}`` since the process started or the last ``reset=True`` (benchmarks report them next to their timings;
    :func:`kind_stats` splits them by kind)."""
    r = {"pooled": _pool.pooled, "cold": _pool.cold}
    if reset:
        _pool.pooled = _pool.cold = 0
    return r


def kind_stats(reset: bool = False) -> dict[str, dict[str, float]]:
    """Per kind of op measured so far (named by function or ufunc; at most :data:`_MAX_KINDS`): ``{"gain": its
    running speed-up estimate, "cold": 1.0 while it is paused (serial) else 0.0, "pooled": its ops run on the
    workers, "serial": its ops run serially while cold}``, the counts since the kind was first measured or the
    last ``reset=True``. For profiles: which kinds pay on this machine."""
    out: dict[str, dict[str, float]] = {}
    now = _clock()
    for k, st in list(_pool.kinds.items()):
        name = _kind_name(k)
        while name in out:  # two keys with one name (two modules' functions of one name): both shown
            name += "'"
        out[name] = {"gain": round(st.gain, 3), "cold": float(bool(st.cold_until) and now < st.cold_until),
                     "pooled": st.pooled, "serial": st.cold}
        if reset:
            st.pooled = st.cold = 0
    return out


def get_num_threads() -> int:
    """The threads flex's pool uses (the caller's included)."""
    return _pool.threads


if _pool.threads <= 1:
    min_elems = _NEVER


# -- chunking ---------------------------------------------------------------------------------------------------
def _bounds(n: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``parts`` (lo, hi) ranges covering range(n): as even as possible (each at least ``n // parts`` long), or
    with ``align`` > 1 each start a multiple of it (SIMD-friendly offsets) and maybe fewer ranges."""
    if align == 1:
        return [(i * n // parts, (i + 1) * n // parts) for i in range(parts)]
    step = -(-n // parts)
    step = -(-step // align) * align
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def _outer_axis(shape: tuple[int, ...], strides: tuple[int, ...], parts: int, allowed: Sequence[int]) -> int:
    """The axis to split: among ``allowed``, by decreasing |stride| (outermost in memory first), the first at least
    2*parts long, else the longest; -1 when none is at least 4 long (two chunks of 2)."""
    order = sorted(allowed, key=lambda d: -abs(strides[d]))
    for d in order:
        if shape[d] >= 2 * parts:
            return d
    best = max(order, key=lambda d: shape[d], default=-1)
    return best if best >= 0 and shape[best] >= 4 else -1


def _parts(n: int) -> int:
    """Chunks for n elements: two per thread (a late worker leaves its share to the others), each MIN_CHUNK+."""
    t = _pool.threads
    return 0 if t < 2 else min(2 * t, n // MIN_CHUNK)


class _Mismatch(Exception):
    """A chunk's result has another dtype or shape than the whole op's: run the op serially."""


def _copy_result(fn: Callable[..., Any], args: tuple[Any, ...], out: ndarray) -> None:
    r = fn(*args)
    if type(r) is not ndarray or r.dtype != out.dtype or r.shape != out.shape:
        raise _Mismatch
    np.copyto(out, r, casting="no")


def elementwise(fn: Callable[..., Any], args: tuple[Any, ...]) -> ndarray | None:
    """``fn(*args)`` for a numpy elementwise function (a ufunc, or a function of ufuncs such as flex's sigmoid or
    ``np.where``) computed in chunks on the pool, bit for bit and stride for stride as the serial call; ``None``
    where chunking would not be exact or would not pay (the caller then calls ``fn`` itself). Each ``fn`` is a kind
    of its own (see :func:`run`): exp may pay where a bandwidth-bound add does not."""
    kind = _key(fn)
    if not _pool._pays(kind):
        return None
    arrays = [a for a in args if type(a) is ndarray]
    shape = arrays[0].shape
    for a in arrays[1:]:
        if a.shape != shape:
            try:
                shape = np.broadcast_shapes(*(x.shape for x in arrays))
            except ValueError:
                return None  # the serial call raises numpy's own error
            break
    n = math.prod(shape)
    parts = _parts(n)
    if parts < 2 or not shape:
        return None
    ndim = len(shape)
    full = [a for a in arrays if a.shape == shape]
    if all(a.flags.c_contiguous for a in arrays):
        order = "C"
        if len(full) == len(arrays):  # no broadcasting: split the flat arrays
            flat_args = tuple(a.reshape(-1) if type(a) is ndarray else a for a in args)
            r = _run_elementwise(fn, flat_args, (n,), 0, parts, None, kind)
            return None if r is None else r.reshape(shape)
        axis = _outer_axis(shape, tuple(range(ndim, 0, -1)), parts, range(ndim))
    elif len(arrays) == 1 and full:
        # one array operand in any layout: the result has its layout (numpy's order K), split outermost in memory
        order = "K"
        axis = _outer_axis(shape, arrays[0].strides, parts, range(ndim))
    else:
        return None  # mixed layouts: numpy's choice of result layout is not worth re-deriving
    if axis < 0:
        return None
    return _run_elementwise(fn, args, shape, axis, parts, arrays[0] if order == "K" else None, kind)


def _run_elementwise(fn: Callable[..., Any], args: tuple[Any, ...], shape: tuple[int, ...], axis: int,
                     parts: int, like: ndarray | None, kind: Hashable) -> ndarray | None:
    """The chunks along ``axis`` into a new result: C order, or ``like``'s layout (numpy's order K)."""
    ndim = len(shape)
    # per operand: the axis of its own that is split, -1 for an operand taken whole (a scalar, or broadcast)
    ks = tuple(_split_axis(a, axis, ndim) for a in args)
    probe = fn(*(_part(a, k, 0, 0) for a, k in zip(args, ks)))  # the result dtype (numpy's promotion rules)
    if type(probe) is not ndarray:
        return None
    out = np.empty_like(like, dtype=probe.dtype) if like is not None else np.empty(shape, probe.dtype)
    run = _ufunc_chunk if isinstance(fn, np.ufunc) else _copy_chunk
    tasks = [(run, (fn, args, ks, lo, hi, out, axis))
             for lo, hi in _bounds(shape[axis], parts, 64 if axis == ndim - 1 else 1)]
    try:
        _pool.run(tasks, kind)
    except _Mismatch:
        return None
    return out


def _split_axis(a: Any, axis: int, ndim: int) -> int:
    if type(a) is not ndarray:
        return -1
    k = axis - (ndim - a.ndim)
    return -1 if k < 0 or a.shape[k] == 1 else k


def _part(a: Any, k: int, lo: int, hi: int) -> Any:
    """a[lo:hi] along its axis k (k < 0: a itself)."""
    if k < 0:
        return a
    if k == 0:
        return a[lo:hi]
    return a[(slice(None),) * k + (slice(lo, hi),)]


def _ufunc_chunk(fn: np.ufunc, args: tuple[Any, ...], ks: tuple[int, ...], lo: int, hi: int, out: ndarray,
                 axis: int) -> None:
    fn(*[_part(a, k, lo, hi) for a, k in zip(args, ks)], out=_part(out, axis, lo, hi))


def _copy_chunk(fn: Callable[..., Any], args: tuple[Any, ...], ks: tuple[int, ...], lo: int, hi: int,
                out: ndarray, axis: int) -> None:
    _copy_result(fn, tuple(_part(a, k, lo, hi) for a, k in zip(args, ks)), _part(out, axis, lo, hi))


def inplace(fn: np.ufunc, a: ndarray, b: Any) -> bool:
    """``fn(a, b, out=a)`` in chunks; False (nothing done) where it would not be exact: ``b`` sharing memory with
    ``a`` (numpy copies such an operand first), or a non-contiguous ``a``."""
    if not isinstance(fn, np.ufunc) or not a.flags.c_contiguous:
        return False
    if type(b) is ndarray:
        if np.may_share_memory(a, b) or not b.flags.c_contiguous or b.ndim > a.ndim:
            return False
        try:
            if np.broadcast_shapes(a.shape, b.shape) != a.shape:
                return False  # numpy's error, from the serial call
        except ValueError:
            return False
    parts = _parts(a.size)
    kind = ("inplace", fn)
    if parts < 2 or a.ndim == 0 or not _pool._pays(kind):
        return False
    if type(b) is not ndarray or b.shape == a.shape:
        fa = a.reshape(-1)
        args, ks = (fa, b.reshape(-1) if type(b) is ndarray else b), (0, 0 if type(b) is ndarray else -1)
        tasks = [(_ufunc_chunk, (fn, args, ks, lo, hi, fa, 0)) for lo, hi in _bounds(a.size, parts, 64)]
    else:
        axis = _outer_axis(a.shape, tuple(range(a.ndim, 0, -1)), parts, range(a.ndim))
        if axis < 0:
            return False
        ks = (axis, _split_axis(b, axis, a.ndim))
        tasks = [(_ufunc_chunk, (fn, (a, b), ks, lo, hi, a, axis)) for lo, hi in _bounds(a.shape[axis], parts)]
    _pool.run(tasks, kind)
    return True


def cast(h: ndarray, npdt: np.dtype[Any], trunc: bool) -> ndarray | None:
    """``h.astype(npdt)`` (``np.trunc(h).astype(npdt)`` with ``trunc``) in chunks: one pass, the same cast loop;
    ``None`` where it would not pay."""
    parts = _parts(h.size)
    if parts < 2 or h.ndim == 0 or not _pool._pays("cast"):
        return None
    out = np.empty_like(h, dtype=npdt)  # astype's order K
    if h.flags.c_contiguous:
        src, dst = h.reshape(-1), out.reshape(-1)
        axis = 0
    else:
        axis = _outer_axis(h.shape, h.strides, parts, range(h.ndim))
        if axis < 0:
            return None
        src, dst = h, out
    pre = (slice(None),) * axis
    tasks = [(_cast_into, (src[pre + (slice(lo, hi),)], dst[pre + (slice(lo, hi),)], trunc))
             for lo, hi in _bounds(src.shape[axis], parts, 64 if src.ndim == 1 else 1)]
    _pool.run(tasks, "cast")
    return out


def _cast_into(src: ndarray, dst: ndarray, trunc: bool) -> None:
    np.copyto(dst, np.trunc(src) if trunc else src, casting="unsafe")


# -- copies -------------------------------------------------------------------------------------------------------
def copy(h: ndarray) -> ndarray | None:
    """``np.array(h, copy=True, order="C")`` in chunks: a fresh C-order array that the pool fills with
    ``np.copyto`` on slices, so the first touch of its new pages (which the kernel zeroes) and the copy itself are
    spread over the cores; ``None`` where that would not pay (the caller then copies serially)."""
    parts = _parts(h.size)
    if parts < 2 or h.ndim == 0 or not _pool._pays("copy"):
        return None
    out = np.empty(h.shape, h.dtype)
    if h.flags.c_contiguous:
        src, dst = h.reshape(-1), out.reshape(-1)
        bounds = _bounds(h.size, parts, 1024)  # chunk starts on 4 KiB+ boundaries: no page is shared by two threads
    else:
        if h.shape[0] < 2:
            return None  # the outer axis of the C-order result is where its rows are contiguous
        src, dst = h, out
        bounds = _bounds(h.shape[0], min(parts, h.shape[0]))
    _pool.run([(_copy_into, (dst[lo:hi], src[lo:hi])) for lo, hi in bounds], "copy")
    return out


def _copy_into(dst: ndarray, src: ndarray) -> None:
    np.copyto(dst, src, casting="no")


# -- reductions ---------------------------------------------------------------------------------------------------
#: numpy's pairwise summation: below this many elements a block is summed with 8 accumulators, above it is halved
_PW_BLOCK = 128


def reduce(ufunc: np.ufunc, h: ndarray, dims: tuple[int, ...], keepdim: bool) -> ndarray | None:
    """``ufunc.reduce(h, axis=dims, keepdims=keepdim)`` (add, multiply, maximum, minimum) on the pool, bit-identical
    to the serial call; ``None`` where that cannot be guaranteed or would not pay (see the module docstring)."""
    ndim = h.ndim
    if ndim == 0 or not dims:
        return None
    red = {d % ndim for d in dims}
    pairwise = _pairwise_loop(ufunc, h, red)
    if h.size < min_elems * (1 if pairwise else FAST_FACTOR):
        return None
    kept = [d for d in range(ndim) if d not in red]
    parts = _parts(h.size)
    if parts < 2:
        return None
    axis = _outer_axis(h.shape, h.strides, parts, kept) if kept else -1
    # a kind per ufunc, loop (pairwise or SIMD) and split (along kept rows, or the whole array's partial results)
    kind = ("reduce", ufunc, "pairwise" if pairwise else "simd", "rows" if axis >= 0 else "whole")
    if axis >= 0:
        return _reduce_outer(ufunc, h, dims, keepdim, axis, parts, red, kind) if _pool._pays(kind) else None
    if any(h.shape[d] != 1 for d in kept):
        return None  # a few kept rows: serial
    return _reduce_whole(ufunc, h, keepdim, parts, red, kind) if _pool._pays(kind) else None


def _pairwise_loop(ufunc: np.ufunc, h: ndarray, red: set[int]) -> bool:
    """Whether numpy runs this reduction through its scalar pairwise sum (a float sum over the axis innermost in
    memory: ~0.37 ns per element); max/min, integer sums and sums over outer axes run numpy's SIMD loops, ~4-8x
    faster, where chunking needs more elements to pay."""
    if ufunc is not np.add or h.dtype.kind not in "fc":
        return False
    inner = min((d for d in range(h.ndim) if h.shape[d] > 1), key=lambda d: abs(h.strides[d]), default=-1)
    return inner in red


def _reduce_outer(ufunc: np.ufunc, h: ndarray, dims: tuple[int, ...], keepdim: bool, axis: int, parts: int,
                  red: set[int], kind: Hashable) -> ndarray | None:
    n = h.shape[axis]
    parts = min(parts, n // 2)  # chunks at least 2 long: a length-1 axis would be dropped and reorder the loops
    if parts < 2:
        return None
    pre = (slice(None),) * axis
    probe = ufunc.reduce(h[pre + (slice(0, 0),)], axis=dims, keepdims=keepdim)
    # the serial result's layout: numpy allocates it in the input's memory order (K), reduced axes as length 1
    perm = sorted(range(h.ndim), key=lambda d: -abs(h.strides[d]))
    out = np.empty([1 if d in red else h.shape[d] for d in perm], probe.dtype).transpose(np.argsort(perm))
    if not keepdim:
        out = np.squeeze(out, axis=tuple(sorted(red)))
    oaxis = axis if keepdim else axis - sum(d < axis for d in red)
    opre = (slice(None),) * oaxis
    tasks = [(_reduce_into, (ufunc, h[pre + (slice(lo, hi),)], dims, keepdim, out[opre + (slice(lo, hi),)]))
             for lo, hi in _bounds(n, parts)]
    _pool.run(tasks, kind)
    return out


def _reduce_into(ufunc: np.ufunc, h: ndarray, dims: tuple[int, ...], keepdim: bool, out: ndarray) -> None:
    ufunc.reduce(h, axis=dims, keepdims=keepdim, out=out)


def _flat(h: ndarray) -> ndarray | None:
    """h's elements in memory order as a 1-D view (numpy's whole-array reductions iterate in memory order)."""
    if h.flags.c_contiguous:
        return h.reshape(-1)
    if h.flags.f_contiguous:
        return h.T.reshape(-1)
    return None


def _reduce_whole(ufunc: np.ufunc, h: ndarray, keepdim: bool, parts: int, red: set[int],
                  kind: Hashable) -> ndarray | None:
    flat = _flat(h)
    if flat is None:
        return None
    dk = h.dtype.kind
    shape = tuple(1 for _ in range(h.ndim)) if keepdim else ()
    if dk in "iub":  # integer arithmetic wraps: exact in any order
        partial = _chunk_reduce(ufunc, flat, parts, kind)
        return np.asarray(ufunc.reduce(partial)).reshape(shape)
    if dk != "f" or h.dtype.itemsize < 4:
        return None  # half types accumulate wider inside numpy's loop; ml_dtypes' types have no pairwise loop
    if ufunc is np.add:
        return np.asarray(_pairwise(flat, parts, kind)).reshape(shape)
    if ufunc is np.maximum or ufunc is np.minimum:
        r = ufunc.reduce(_chunk_reduce(ufunc, flat, parts, kind))
        if r == 0 or r != r:  # the sign of a zero, a NaN's payload: whichever the serial order gives
            return None
        return np.asarray(r).reshape(shape)
    return None  # float products: numpy multiplies in sequence


def _chunk_reduce(ufunc: np.ufunc, flat: ndarray, parts: int, kind: Hashable) -> ndarray:
    bounds = _bounds(flat.size, parts, 64)
    probe = ufunc.reduce(flat[:1])
    partial = np.empty(len(bounds), dtype=np.asarray(probe).dtype)
    tasks = [(_reduce_into, (ufunc, flat[lo:hi], (0,), True, partial[i:i + 1])) for i, (lo, hi) in enumerate(bounds)]
    _pool.run(tasks, kind)
    return partial


def _pairwise(flat: ndarray, parts: int, kind: Hashable) -> Any:
    """numpy's ``add.reduce`` of a contiguous float array: ``0 + pairwise_sum(flat)``, the tree's subtrees summed on
    the pool (``add.reduce(leaf, initial=-0.0)`` is exactly ``pairwise_sum(leaf)``: -0.0 changes no sum)."""
    leaves, tree = _pairwise_plan(flat.size, max(1, (parts - 1).bit_length()))  # 2**depth >= parts leaves
    sums = np.empty(len(leaves), dtype=flat.dtype)
    tasks = [(_leaf_sum, (flat[lo:lo + n], sums[i:i + 1])) for i, (lo, n) in enumerate(leaves)]
    _pool.run(tasks, kind)
    vals = list(sums)  # numpy scalars of flat's dtype: their + rounds as the C loop's does

    def combine(t: Any) -> Any:
        return vals[t] if isinstance(t, int) else combine(t[0]) + combine(t[1])

    return flat.dtype.type(0) + combine(tree)


@functools.lru_cache(maxsize=64)
def _pairwise_plan(n: int, depth: int) -> tuple[tuple[tuple[int, int], ...], Any]:
    """The top ``depth`` levels of numpy's pairwise tree over n elements: the leaves as (start, length), and the
    tree as nested pairs of leaf numbers (cached: a model's sums repeat the same few sizes)."""
    leaves: list[tuple[int, int]] = []

    def split(lo: int, n: int, d: int) -> Any:
        if d == 0 or n <= _PW_BLOCK:
            leaves.append((lo, n))
            return len(leaves) - 1
        n2 = n // 2
        n2 -= n2 % 8
        return (split(lo, n2, d - 1), split(lo + n2, n - n2, d - 1))

    tree = split(0, n, depth)
    return tuple(leaves), tree


def _leaf_sum(leaf: ndarray, out: ndarray) -> None:
    np.add.reduce(leaf, keepdims=True, initial=-0.0, out=out)
