"""Tests of ember_opencl.memory: the pooling device-memory allocator.

Most tests use a fake ``raw_alloc`` (plain objects with ``.size``) so they run without OpenCL; one test allocates
real buffers on the first OpenCL device (PoCL in CI) and moves data through blocks.
"""

from __future__ import annotations

import gc
import importlib.util
import pathlib
import threading

import numpy as np
import pytest

from ember.errors import OutOfMemoryError, ValueRangeError

try:
    from ember_opencl import memory as M
except ImportError:  # package not installed (yet): load the module from the source tree
    _PATH = pathlib.Path(__file__).resolve().parents[1] / "src" / "ember_opencl" / "memory.py"
    _spec = importlib.util.spec_from_file_location("ember_opencl_memory_under_test", _PATH)
    M = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(M)

MiB = 1 << 20
GiB = 1 << 30


class FakeBuffer:
    __slots__ = ("size", "released", "serial")
    count = 0

    def __init__(self, size: int) -> None:
        FakeBuffer.count += 1
        self.serial = FakeBuffer.count
        self.size = size
        self.released = False

    def release(self) -> None:
        assert not self.released, "buffer released twice"
        self.released = True


class FakeDevice:
    """raw_alloc for tests: records every buffer created; can be told to fail like OpenCL does."""

    def __init__(self, fail_above: int | None = None, fail_code: int = -4) -> None:
        self.buffers: list[FakeBuffer] = []
        self.fail_above = fail_above  # fail when live raw bytes would exceed this (the driver's own limit)
        self.fail_code = fail_code
        self.calls = 0

    def live_bytes(self) -> int:
        return sum(b.size for b in self.buffers if not b.released)

    def __call__(self, nbytes: int) -> FakeBuffer:
        self.calls += 1
        assert nbytes > 0
        if self.fail_above is not None and self.live_bytes() + nbytes > self.fail_above:
            err = RuntimeError("create_buffer failed: MEM_OBJECT_ALLOCATION_FAILURE")
            err.code = self.fail_code
            raise err
        b = FakeBuffer(nbytes)
        self.buffers.append(b)
        return b


def make_pool(capacity: int = 4 * GiB, **kw):
    dev = FakeDevice(kw.pop("fail_above", None), kw.pop("fail_code", -4))
    return M.MemoryPool(None, capacity=capacity, raw_alloc=dev, label=kw.pop("label", "opencl:7"), **kw), dev


def reserved(pool) -> int:
    return pool.report()["reserved"]


# ------------------------------------------------------------------------------------------------ size classes
def test_size_class_rounding_and_waste_bound():
    assert M.size_class(0) == M.ALIGN
    assert M.size_class(1) == M.ALIGN
    assert M.size_class(256) == 256
    assert M.size_class(257) == 512
    assert M.size_class(2048) == 2048
    assert M.size_class(2049) == 2304
    assert M.size_class(4097) == 4608
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 1 << 31, 2000).tolist() + [M.SMALL_MAX, M.SMALL_MAX + 1]:
        c = M.size_class(n)
        assert c >= n and c % M.ALIGN == 0
        if n > 8 * M.ALIGN:
            assert (c - n) / n < 0.125
    # monotone: a bigger request never gets a smaller class
    sizes = sorted(rng.integers(1, 1 << 24, 500).tolist())
    classes = [M.size_class(n) for n in sizes]
    assert classes == sorted(classes)


def test_zero_byte_allocation_gives_minimal_block():
    pool, dev = make_pool()
    b = pool.allocate(0)
    assert b.nbytes == 0 and b.offset % M.ALIGN == 0 and b.capacity == M.ALIGN
    assert b.buffer.size >= b.offset + M.ALIGN
    r = pool.report()
    assert r["in_use"] == 0 and r["live_blocks"] == 1 and r["small_allocations"] == 1
    del b
    assert pool.report()["live_blocks"] == 0


def test_negative_size_rejected():
    pool, _ = make_pool()
    with pytest.raises(ValueRangeError, match="negative"):
        pool.allocate(-1)


# ------------------------------------------------------------------------------------------------ small pool
def test_small_blocks_share_pages_aligned_and_disjoint():
    pool, dev = make_pool()
    sizes = [1, 100, 256, 300, 1000, 4096, 5000, 70_000, M.SMALL_MAX]
    blocks = [pool.allocate(n) for n in sizes]
    assert len(dev.buffers) == 1, "all of these fit one page"
    assert dev.buffers[0].size == M.PAGE_SIZE
    spans = []
    for b, n in zip(blocks, sizes):
        assert b.nbytes == n and b.offset % M.ALIGN == 0 and b.capacity >= n
        assert b.buffer is dev.buffers[0]
        spans.append((b.offset, b.offset + b.capacity))
    spans.sort()
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:])), "blocks overlap"
    assert spans[-1][1] <= M.PAGE_SIZE
    r = pool.report()
    assert r["small_in_use"] == sum(sizes) == r["in_use"]
    assert r["small_reserved"] == M.PAGE_SIZE and r["large_reserved"] == 0 and r["pages"] == 1


def test_small_reuse_by_class():
    pool, dev = make_pool()
    keep = pool.allocate(64)  # keeps the page non-empty
    b = pool.allocate(1000)
    off = b.offset
    del b
    c = pool.allocate(1000 + 20)  # same class (1024) -> the same slot
    assert c.offset == off and c.nbytes == 1020
    r = pool.report()
    assert r["reuses"] == 1 and r["raw_allocations"] == 1 and r["allocations"] == 3
    d = pool.allocate(5000)  # another class: a new slot, not the cached 1024 one
    assert d.offset not in (off, keep.offset)
    del keep, c, d


def test_page_overflow_takes_new_page_and_empty_pages_are_released():
    pool, dev = make_pool()
    first = [pool.allocate(M.SMALL_MAX) for _ in range(2)]  # fills page 1 exactly
    second = [pool.allocate(M.SMALL_MAX) for _ in range(2)]  # page 2
    third = pool.allocate(M.SMALL_MAX)  # page 3 (active)
    assert len({id(b.buffer) for b in first + second + [third]}) == 3
    assert pool.report()["pages"] == 3
    del first  # page 1 empty: becomes the spare (kept, not released)
    assert pool.report()["pages"] == 3 and not any(b.released for b in dev.buffers)
    del second  # page 2 empty: a spare exists already -> released
    r = pool.report()
    assert r["pages"] == 2 and r["small_reserved"] == 2 * M.PAGE_SIZE
    assert sum(b.released for b in dev.buffers) == 1
    # the spare is used before any new raw buffer
    more = [pool.allocate(M.SMALL_MAX) for _ in range(3)]
    assert pool.report()["raw_allocations"] == 3
    del more, third
    assert pool.trim() > 0
    r = pool.report()
    assert r["reserved"] == 0 and r["pages"] == 0 and all(b.released for b in dev.buffers)


def test_freed_blocks_of_released_page_are_not_handed_out_again():
    pool, dev = make_pool()
    a = [pool.allocate(300_000) for _ in range(6)]  # page 1 holds 6 (class 311296) -> all on page 1
    spill = pool.allocate(900_000)  # does not fit page 1 -> page 2 becomes active
    page1 = a[0].buffer
    assert spill.buffer is not page1
    del a  # page 1 empty and not active -> spare; its free-list entries are dropped
    b = pool.allocate(300_000)
    assert b.buffer is spill.buffer, "a retired page's stale entries must not be reused"
    assert not page1.released  # kept as the spare
    del b, spill


# ------------------------------------------------------------------------------------------------ large pool
def test_large_blocks_dedicated_and_reused_by_class():
    pool, dev = make_pool()
    n = 5 * MiB + 100_000
    b = pool.allocate(n)
    assert b.offset == 0 and b.buffer.size == M.size_class(n) >= n
    buf = b.buffer
    del b
    r = pool.report()
    assert r["in_use"] == 0 and r["reserved"] == M.size_class(n) and r["large_cached_buffers"] == 1
    c = pool.allocate(n - 1000)  # same class
    assert c.buffer is buf and pool.report()["reuses"] == 1
    d = pool.allocate(2 * n)
    assert d.buffer is not buf
    r = pool.report()
    assert r["large_in_use"] == n - 1000 + 2 * n and r["small_reserved"] == 0
    assert r["raw_allocations"] == 2
    del c, d


def test_growth_releases_cached_buffers_of_other_classes_first():
    pool, dev = make_pool()
    a = pool.allocate(40 * MiB)
    del a  # cached, peak held is 40 MiB
    b = pool.allocate(30 * MiB)  # other class; 40 + 30 > peak -> the cached 40 MiB buffer goes first
    r = pool.report()
    assert r["reserved"] == M.size_class(30 * MiB)
    assert r["evictions"] == 1 and dev.buffers[0].released
    del b


def test_trim_releases_cached_memory_only():
    pool, dev = make_pool()
    live_small = pool.allocate(1000)
    live_large = pool.allocate(8 * MiB)
    tmp = [pool.allocate(3 * MiB), pool.allocate(10_000)]
    tmp.append(pool.allocate(2 * MiB))
    del tmp
    before = reserved(pool)
    released = pool.trim()
    assert released == before - reserved(pool) > 0
    r = pool.report()
    assert r["reserved"] == M.PAGE_SIZE + M.size_class(8 * MiB)  # the live page and the live large buffer
    assert r["in_use"] == 1000 + 8 * MiB and r["trims"] == 1
    assert not live_small.buffer.released and not live_large.buffer.released
    assert pool.trim() == 0
    del live_small, live_large
    pool.trim()
    assert reserved(pool) == 0 and all(b.released for b in dev.buffers)


# ------------------------------------------------------------------------------------------------ report
def test_report_fields_and_peak():
    pool, _ = make_pool()
    r = pool.report()
    for key in (
        "in_use",
        "reserved",
        "peak",
        "peak_reserved",
        "allocations",
        "reuses",
        "raw_allocations",
        "small_in_use",
        "small_reserved",
        "large_in_use",
        "large_reserved",
        "capacity",
        "live_blocks",
    ):
        assert key in r, key
    assert r["in_use"] == r["reserved"] == r["peak"] == 0
    a = pool.allocate(3 * MiB)
    b = pool.allocate(100)
    assert pool.report()["peak"] == 3 * MiB + 100
    del a
    r = pool.report()
    assert r["in_use"] == 100 and r["peak"] == 3 * MiB + 100
    assert r["peak_reserved"] >= r["reserved"] >= r["in_use"]
    assert r["large_in_use"] == 0 and r["small_in_use"] == 100
    pool.reset_peak()
    r = pool.report()
    assert r["peak"] == 100 and r["peak_reserved"] == r["reserved"]
    del b


def test_block_freed_by_garbage_collection_of_cycle():
    pool, _ = make_pool()

    class Holder:
        pass

    h = Holder()
    h.self = h
    h.block = pool.allocate(5000)
    del h
    assert pool.report()["live_blocks"] == 1  # still in an unreachable cycle
    gc.collect()
    assert pool.report()["live_blocks"] == 0 and pool.report()["in_use"] == 0


def test_free_while_pool_lock_is_held_is_deferred_not_deadlocked():
    pool, _ = make_pool()
    b = pool.allocate(5000)
    with pool._lock:  # as if the GC ran Block.__del__ inside allocate()
        del b
    assert pool.report()["live_blocks"] == 0  # applied by the next operation


def test_threads_allocate_and_free_concurrently():
    pool, _ = make_pool()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            live = []
            for _ in range(400):
                live.append(pool.allocate(int(rng.integers(0, 3 * MiB))))
                if len(live) > 8:
                    live.pop(int(rng.integers(0, len(live))))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    r = pool.report()
    assert r["live_blocks"] == 0 and r["in_use"] == 0 and r["allocations"] == 1600


# ------------------------------------------------------------------------------------------------ out of memory
def test_capacity_exceeded_trims_once_then_raises_with_sizes():
    pool, dev = make_pool(capacity=100 * MiB, label="opencl:3")
    live = pool.allocate(60 * MiB)
    cached = pool.allocate(30 * MiB)
    del cached  # 30 MiB cached; 90 MiB reserved
    ok = pool.allocate(35 * MiB)  # fits only after the cache is released
    assert pool.report()["reserved"] <= 100 * MiB
    with pytest.raises(OutOfMemoryError) as ei:
        pool.allocate(20 * MiB)
    msg = str(ei.value)
    assert isinstance(ei.value, MemoryError)
    assert "opencl:3" in msg and "requested 20971520 bytes (20.0 MiB)" in msg
    avail = 100 * MiB - pool.report()["reserved"]
    assert f"available {avail} bytes" in msg and "in use" in msg and "reserved" in msg
    del live, ok


def test_opencl_allocation_failure_trims_and_retries():
    # the driver refuses beyond 50 MiB although the pool believes 1 GiB is available
    pool, dev = make_pool(capacity=GiB, fail_above=50 * MiB)
    a = pool.allocate(20 * MiB)
    b = pool.allocate(20 * MiB + 4096)  # another class
    del b  # cached
    c = pool.allocate(25 * MiB)  # needs the cached buffer released: peak rule or trim-and-retry does it
    assert c.nbytes == 25 * MiB
    d_calls = dev.calls
    with pytest.raises(OutOfMemoryError, match=r"requested 31457280 bytes \(30.0 MiB\)") as ei:
        pool.allocate(30 * MiB)
    assert dev.calls == d_calls + 2, "one try, one trim, one retry"
    assert "MEM_OBJECT_ALLOCATION_FAILURE" in str(ei.value)
    del a, c


def test_other_allocation_errors_propagate():
    def broken(n):
        raise RuntimeError("INVALID_CONTEXT")

    pool = M.MemoryPool(None, capacity=GiB, raw_alloc=broken)
    with pytest.raises(RuntimeError, match="INVALID_CONTEXT"):
        pool.allocate(10)


def test_max_alloc_rejects_single_large_request():
    pool, dev = make_pool(max_alloc=64 * MiB, label="opencl:1")
    with pytest.raises(OutOfMemoryError, match="opencl:1.*67108865 bytes.*largest single allocation is 67108864"):
        pool.allocate(64 * MiB + 1)
    b = pool.allocate(64 * MiB - 5)  # its class would round above max_alloc: clamped instead
    assert b.buffer.size <= 64 * MiB and b.capacity >= b.nbytes
    assert dev.calls == 1
    del b


# ------------------------------------------------------------------------------------------------ dry run
def assert_disjoint(blocks) -> None:
    """No two live blocks share bytes of the same buffer."""
    by_buf: dict[int, list] = {}
    for b in blocks:
        by_buf.setdefault(id(b.buffer), []).append((b.offset, b.offset + max(b.nbytes, 1)))
    for spans in by_buf.values():
        spans.sort()
        for (_, e), (s, _) in zip(spans, spans[1:]):
            assert e <= s, f"overlapping blocks {spans}"


def test_dry_run_plans_one_buffer_and_repeats_without_new_buffers():
    pool, dev = make_pool()
    workload = [3000, 3000, 5 * MiB + 1000, 700_000, 12 * MiB]

    def run():
        blocks = [pool.allocate(n) for n in workload[:4]]
        del blocks[0]
        t = pool.allocate(3000)
        big = pool.allocate(workload[4])  # the 5 MiB one is still live
        del blocks[1]
        u = pool.allocate(5 * MiB)  # fits where the 5 MiB block was
        assert_disjoint([*blocks, t, big, u])
        del t, blocks, big, u

    run()
    with pool.dry_run() as stats:
        run()
    assert stats["sizes"] == {3000: 2, 700_000: 1, 5 * MiB: 1, 5 * MiB + 1000: 1, 12 * MiB: 1}
    assert stats["allocations"] == 7 and stats["frees"] == 7 and stats["carried"] == 0 and stats["kept"] == 0
    assert stats["peak_in_use"] == 2 * 3000 + 5 * MiB + 1000 + 700_000 + 12 * MiB
    # the 5 MiB blocks and the 3000-byte ones take turns, so the plan is below keeping every size apart
    assert stats["plan_bytes"] < stats["per_size_bytes"]
    assert stats["plan_bytes"] <= 1.05 * stats["peak_in_use"]
    r = pool.report()
    assert r["reserved"] == r["plan_reserved"] == stats["plan_bytes"] == stats["reserved"]
    raw, plan_allocs = r["raw_allocations"], r["plan_allocations"]
    for _ in range(3):
        run()
    r = pool.report()
    assert r["raw_allocations"] == raw, "a planned workload creates no new buffers"
    assert r["plan_allocations"] == plan_allocs + 3 * 7
    assert r["reserved"] == stats["plan_bytes"] and r["in_use"] == 0
    b = pool.allocate(3000)
    assert "planned" in repr(b) and b.buffer.size == stats["plan_bytes"]
    del b


def test_plan_is_only_a_hint_when_the_workload_deviates():
    pool, dev = make_pool()

    def run(hold=None, extra=False):
        a = pool.allocate(4 * MiB)
        b = pool.allocate(4 * MiB)
        if extra:
            x = pool.allocate(4 * MiB)  # not in the trace
        del a
        c = pool.allocate(2 * MiB)  # planned where a was
        out = [b, c] + ([x] if extra else [])
        if hold is not None:
            hold.extend(out)  # freed late: the plan's offsets for the next run are still occupied
        return out

    with pool.dry_run():
        run()
    plan_bytes = pool.report()["plan_reserved"]
    assert plan_bytes == 8 * MiB
    held: list = []
    run(hold=held)
    live = list(held)
    live += run()  # b and c of the first run are still live: these must go elsewhere
    assert_disjoint(live)
    live += run(extra=True)
    assert_disjoint(live)
    assert len(live) == 7 and sum(b.nbytes for b in live) == pool.report()["in_use"]
    assert pool.report()["plan_reserved"] == plan_bytes
    del held, live
    r = pool.report()
    assert r["in_use"] == 0 and r["live_blocks"] == 0


def test_second_dry_run_replaces_plan_and_trim_releases_idle_plan():
    pool, dev = make_pool()
    with pool.dry_run() as stats:
        keep = pool.allocate(3 * MiB)
        pool.allocate(3 * MiB)
    assert stats["kept"] == 1  # live past the run and not handed on: state made once, not planned
    assert pool.report()["plan_reserved"] == 3 * MiB
    first_plan = pool._plan.buffer
    del keep
    with pool.dry_run() as stats:
        x = pool.allocate(5 * MiB)
        del x
    assert stats["plan_bytes"] == 5 * MiB
    assert first_plan.released
    y = pool.allocate(5 * MiB)  # from the new plan
    assert y.buffer.size == 5 * MiB and pool.report()["plan_in_use"] == 5 * MiB
    with pool.dry_run():
        z = pool.allocate(1 * MiB)
        del z
    old = y.buffer
    assert not old.released, "a replaced plan stays while its blocks live"
    del y
    assert old.released
    assert pool.trim() == 1 * MiB and pool.report()["reserved"] == 0


def test_drop_plan_releases_the_plan_once_its_blocks_are_freed():
    pool, dev = make_pool()
    with pool.dry_run():
        pool.allocate(3 * MiB)
    a = pool.allocate(3 * MiB)
    assert "planned" in repr(a)
    pool.drop_plan()
    b = pool.allocate(3 * MiB)
    assert "planned" not in repr(b)
    r = pool.report()
    assert r["plan_reserved"] == 3 * MiB and r["plan_slots"] == 0  # still held by a
    del a
    assert pool.report()["plan_reserved"] == 0
    del b


def test_plan_never_overlaps_live_blocks_when_iterations_deviate():
    rng = np.random.default_rng(5)
    pool, _ = make_pool()
    choices = [1, 256, 3000, 70_000, 900_000, 2 * MiB, 5 * MiB + 7]
    sizes = [choices[int(k)] for k in rng.integers(0, len(choices), 80)]
    lifetime = rng.integers(0, 12, 80).tolist()  # freed that many allocations later
    carried = set(rng.choice(80, 8, replace=False).tolist())  # handed to the next iteration

    def iteration(prev: list, deviate: float) -> list:
        live: dict[int, object] = {}
        held = []
        for i, n in enumerate(sizes):
            if i == 3:
                prev.clear()  # last iteration's hand-over is freed early in this one
            if rng.random() < deviate:
                continue  # an allocation the trace had does not happen
            if rng.random() < deviate:
                held.append(pool.allocate(int(rng.integers(0, 3 * MiB))))  # one it did not have
            live[i] = pool.allocate(n)
            assert_disjoint([*live.values(), *held, *prev])
            for j in [j for j in live if j not in carried and j + lifetime[j] <= i]:
                if rng.random() < deviate:
                    held.append(live[j])  # freed late: still live in the next iteration
                del live[j]
        return [live[j] for j in carried if j in live] + held

    prev = iteration([], 0.0)
    with pool.dry_run() as stats:
        prev = iteration(prev, 0.0)
    assert stats["carried"] == len(carried)
    raw = pool.report()["raw_allocations"]
    for _ in range(3):
        prev = iteration(prev, 0.0)
    assert pool.report()["raw_allocations"] == raw  # an exact repeat needs no new buffers
    for deviate in (0.05, 0.2, 0.5, 0.0, 0.0):
        prev = iteration(prev, deviate)
    r = pool.report()
    assert r["plan_allocations"] > 0 and r["in_use"] == sum(b.nbytes for b in prev)
    del prev
    assert pool.report()["in_use"] == 0 and pool.report()["plan_live_blocks"] == 0


def test_plan_larger_than_max_alloc_keeps_what_fits():
    pool, dev = make_pool(max_alloc=10 * MiB)

    def run():
        a = pool.allocate(6 * MiB)
        b = pool.allocate(6 * MiB)
        c = pool.allocate(2 * MiB)
        assert_disjoint([a, b, c])
        return [a, b, c]

    with pool.dry_run() as stats:
        run()
    assert stats["plan_bytes"] <= 10 * MiB
    blocks = run()
    # one 6 MiB block does not fit the plan buffer; the 2 MiB one fills the gap
    assert sum("planned" in repr(b) for b in blocks) == 2 and "planned" not in repr(blocks[1])
    assert all(b.buffer.size <= 10 * MiB for b in blocks)
    del blocks


def test_dry_run_body_error_keeps_pools_and_stops_recording():
    pool, _ = make_pool()
    with pytest.raises(KeyError):
        with pool.dry_run() as stats:
            b = pool.allocate(5000)
            raise KeyError("boom")
    assert stats["sizes"] == {5000: 1} and "plan_bytes" not in stats
    assert pool.report()["plan_slots"] == 0 and pool.report()["plan_reserved"] == 0
    del b
    with pool.dry_run():
        with pytest.raises(ValueRangeError, match="already active"):
            with pool.dry_run():
                pass


# ---------------------------------------------------------------------------- synthetic CNN training step trace
class _Trace:
    """Builds an allocation trace with reference counting, like eager autograd with Python variables."""

    def __init__(self, prefix: str) -> None:
        self.events: list[tuple] = []
        self.refs: dict[str, int] = {}
        self.prefix = prefix
        self.n = 0

    def a(self, nbytes: int, name: str | None = None) -> str:
        if name is None:
            self.n += 1
            name = f"{self.prefix}{self.n}"
        self.events.append(("a", name, int(nbytes)))
        self.refs[name] = 1
        return name

    def keep(self, name: str) -> str:
        self.refs[name] += 1
        return name

    def drop(self, *names: str) -> None:
        for name in names:
            self.refs[name] -= 1
            if self.refs[name] == 0:
                del self.refs[name]
                self.events.append(("f", name))

    def free_persistent(self, name: str) -> None:
        self.events.append(("f", name))


F32 = 4

# seed CNN parameters (docs/models.md): name -> element count
CNN_PARAMS = {
    "conv1.w": 64 * 1 * 9, "conv1.b": 64, "bn1.g": 64, "bn1.b": 64,
    "conv2.w": 64 * 64 * 9, "conv2.b": 64, "bn2.g": 64, "bn2.b": 64,
    "fc1.w": 1600 * 128, "fc1.b": 128, "fc2.w": 128 * 128, "fc2.b": 128, "fc3.w": 128 * 10, "fc3.b": 10,
}  # fmt: skip
CNN_BUFFERS = {"bn1.rm": 64, "bn1.rv": 64, "bn2.rm": 64, "bn2.rv": 64}


def cnn_setup_trace() -> list[tuple]:
    """Model creation: parameters and BatchNorm running statistics (live for the whole run)."""
    return [("a", f"p.{k}", n * F32) for k, n in {**CNN_PARAMS, **CNN_BUFFERS}.items()]


def cnn_step_trace(step: int, batch: int = 64) -> list[tuple]:
    """One eager training step of the seed CNN with Adam: zero_grad(set_to_none), forward, cross-entropy,
    backward (activations freed in reverse order), Adam update with elementwise temporaries. The loss of a step
    stays referenced (``loss = step(...)``) until the next step's loss replaces it."""
    B = batch
    t = _Trace(f"s{step}.")
    if step > 0:
        for k in CNN_PARAMS:
            t.free_persistent(f"g.{k}")
    backward = []

    def conv(x, cin, cout, hw, k, name, need_dx):
        cols_n = B * hw * cin * k * k * F32
        t.keep(x)
        cols = t.a(cols_n)
        mm = t.a(B * hw * cout * F32)
        t.drop(cols)
        o = t.a(B * cout * hw * F32)
        t.drop(mm)
        ob = t.a(B * cout * hw * F32)
        t.drop(o)

        def bw(g):
            gp = t.a(B * hw * cout * F32)
            cols = t.a(cols_n)
            t.a(cout * cin * k * k * F32, f"g.{name}.w")
            t.drop(cols)
            t.a(cout * F32, f"g.{name}.b")
            dx = None
            if need_dx:
                dcols = t.a(cols_n)
                hin = int(round(hw**0.5)) + k - 1
                dx = t.a(B * cin * hin * hin * F32)
                t.drop(dcols)
            t.drop(gp, g, x)
            return dx

        backward.append(bw)
        return ob

    def bn(x, c, hw, name):
        n = B * c * hw * F32
        mean = t.a(c * F32)
        xc = t.a(n)
        sq = t.a(n)
        var = t.a(c * F32)
        t.drop(sq)
        inv = t.a(c * F32)
        t.drop(var)
        xhat = t.a(n)
        t.drop(xc, mean)
        t1 = t.a(n)
        out = t.a(n)
        t.drop(t1)
        for _ in range(2):  # running statistics update
            t.drop(t.a(c * F32))

        def bw(g):
            tmp = t.a(n)
            t.a(c * F32, f"g.{name}.g")
            t.drop(tmp)
            t.a(c * F32, f"g.{name}.b")
            dxhat = t.a(n)
            t2 = t.a(n)
            s2 = t.a(c * F32)
            t.drop(t2)
            s1 = t.a(c * F32)
            t3 = t.a(n)
            t4 = t.a(n)
            t.drop(t3, dxhat)
            dx = t.a(n)
            t.drop(t4, s1, s2, g, xhat, inv)
            return dx

        backward.append(bw)
        return out

    def relu(x, n):
        y = t.keep(t.a(n))

        def bw(g):
            dx = t.a(n)
            t.drop(g, y)
            return dx

        backward.append(bw)
        return y

    def maxpool(x, nin, nout):
        y = t.a(nout)
        idx = t.a(nout * 2)  # int64 indices

        def bw(g):
            dx = t.a(nin)
            t.drop(g, idx)
            return dx

        backward.append(bw)
        return y

    def linear(x, fin, fout, name, need_dx=True):
        t.keep(x)
        mm = t.a(B * fout * F32)
        y = t.a(B * fout * F32)
        t.drop(mm)

        def bw(g):
            t.a(fout * fin * F32, f"g.{name}.w")
            t.a(fout * F32, f"g.{name}.b")
            dx = t.a(B * fin * F32) if need_dx else None
            t.drop(g, x)
            return dx

        backward.append(bw)
        return y

    def gelu(x, n):
        t.keep(x)
        t1 = t.a(n)
        t2 = t.a(n)
        t.drop(t1)
        t3 = t.a(n)
        t.drop(t2)
        y = t.a(n)
        t.drop(t3)

        def bw(g):
            temps = [t.a(n) for _ in range(3)]
            dx = t.a(n)
            t.drop(*temps)
            t.drop(g, x)
            return dx

        backward.append(bw)
        return y

    def dropout(x, n):
        r = t.a(n)
        mask = t.a(n // 4)
        t.drop(r)
        tmp = t.a(n)
        y = t.a(n)
        t.drop(tmp)

        def bw(g):
            tmp = t.a(n)
            dx = t.a(n)
            t.drop(tmp, g, mask)
            return dx

        backward.append(bw)
        return y

    def layer(fn, x, *args):
        y = fn(x, *args)
        t.drop(x)  # the forward variable is reassigned
        return y

    x = t.a(B * 784 * F32)
    labels = t.a(B * 8)
    h = layer(conv, x, 1, 64, 26 * 26, 3, "conv1", False)
    h = layer(bn, h, 64, 26 * 26, "bn1")
    h = layer(relu, h, B * 64 * 676 * F32)
    h = layer(maxpool, h, B * 64 * 676 * F32, B * 64 * 169 * F32)
    h = layer(conv, h, 64, 64, 11 * 11, 3, "conv2", True)
    h = layer(bn, h, 64, 11 * 11, "bn2")
    h = layer(relu, h, B * 64 * 121 * F32)
    h = layer(maxpool, h, B * 64 * 121 * F32, B * 64 * 25 * F32)
    h = layer(linear, h, 1600, 128, "fc1")
    h = layer(gelu, h, B * 128 * F32)
    h = layer(dropout, h, B * 128 * F32)
    h = layer(linear, h, 128, 128, "fc2")
    h = layer(gelu, h, B * 128 * F32)
    h = layer(dropout, h, B * 128 * F32)
    logits = layer(linear, h, 128, 10, "fc3")
    # cross-entropy via log-softmax
    m = t.a(B * F32)
    sh = t.a(B * 10 * F32)
    e = t.a(B * 10 * F32)
    s = t.a(B * F32)
    ls = t.a(B * F32)
    t.drop(s, e)
    logp = t.a(B * 10 * F32)
    t.drop(sh, ls, m, logits)
    nll = t.a(B * F32)
    loss = t.a(F32, f"loss{step % 2}")
    t.drop(nll)
    # backward
    gl = t.a(F32)
    sm = t.a(B * 10 * F32)
    oh = t.a(B * 10 * F32)
    d = t.a(B * 10 * F32)
    t.drop(sm, oh)
    g = t.a(B * 10 * F32)
    t.drop(d, gl, logp, labels)
    for bw in reversed(backward):
        g = bw(g)
    assert g is None  # conv1 computes no input gradient
    # Adam
    for k, n in CNN_PARAMS.items():
        nb = n * F32
        if step == 0:
            t.a(nb, f"m.{k}")
            t.a(nb, f"v.{k}")
        t1 = t.a(nb)
        t.drop(t1)
        t2 = t.a(nb)
        t3 = t.a(nb)
        t.drop(t2, t3)
        dd = t.a(nb)
        d2 = t.a(nb)
        t.drop(dd)
        u = t.a(nb)
        t.drop(d2)
        u2 = t.a(nb)
        t.drop(u, u2)
    if step > 0:
        t.free_persistent(f"loss{(step - 1) % 2}")
    temps = {k for k in t.refs if k.startswith(t.prefix)}
    assert not temps and loss in t.refs, sorted(t.refs)
    return t.events


def replay(pool, events, live: dict) -> None:
    for ev in events:
        if ev[0] == "a":
            assert ev[1] not in live, ev
            live[ev[1]] = pool.allocate(ev[2])
        else:
            del live[ev[1]]  # the Block's refcount drops to 0: its memory returns to the pool


def test_cnn_trace_is_consistent():
    live: dict = {}
    pool, _ = make_pool()
    replay(pool, cnn_setup_trace(), live)
    for step in range(3):
        replay(pool, cnn_step_trace(step), live)
    # parameters, their grads, Adam m and v, running stats and the last loss remain
    assert len(live) == 4 * len(CNN_PARAMS) + len(CNN_BUFFERS) + 1
    r = pool.report()
    assert r["in_use"] == sum(b.nbytes for b in live.values())
    assert r["allocations"] > 300


def run_cnn(pool, steps: int, batch: int, dry_run_step: int | None = None) -> tuple[dict, dict | None, list[int], dict]:
    """Replay ``steps`` training steps; returns the report after them (peak reset after the warm-up/dry-run
    steps), the dry-run statistics, the raw allocations per step and the blocks still live."""
    live: dict = {}
    replay(pool, cnn_setup_trace(), live)
    stats = None
    raw = []
    for step in range(steps):
        before = pool.report()["raw_allocations"]
        if step == dry_run_step:
            with pool.dry_run() as stats:
                replay(pool, cnn_step_trace(step, batch), live)
        else:
            replay(pool, cnn_step_trace(step, batch), live)
        raw.append(pool.report()["raw_allocations"] - before)
        if step == max(dry_run_step or 0, 1):
            pool.reset_peak()  # measure the steady state
    return pool.report(), stats, raw, live


@pytest.mark.parametrize("batch", [64, 256])
def test_cnn_training_step_after_dry_run_ratio_and_no_new_buffers(batch):
    capacity = 2 * GiB
    pool, dev = make_pool(capacity=capacity)
    r, stats, raw, live = run_cnn(pool, steps=6, batch=batch, dry_run_step=1)
    assert stats["allocations"] > 200 and stats["peak_in_use"] > 0
    # gradients are handed to the next step (planned across the step boundary); the loss outlives its successor's
    # allocation, so it stays with the pools
    assert stats["carried"] == len(CNN_PARAMS) and stats["kept"] == 1
    assert stats["plan_bytes"] <= 1.1 * stats["peak_in_use"] < stats["per_size_bytes"]
    assert raw[2:] == [0, 0, 0, 0], raw  # steps after the dry run create no buffers
    ratio = r["reserved"] / r["peak"]
    assert ratio <= 1.2, (ratio, r)
    assert r["peak_reserved"] <= capacity
    assert dev.live_bytes() == r["reserved"]


@pytest.mark.parametrize("batch", [64, 256])
def test_cnn_training_step_without_dry_run(batch):
    pool, dev = make_pool(capacity=2 * GiB)
    r, _, raw, live = run_cnn(pool, steps=6, batch=batch)
    assert r["peak_reserved"] / r["peak"] <= 1.3, r
    assert r["reuses"] / r["allocations"] > 0.8
    assert dev.live_bytes() == r["reserved"]


def test_cnn_under_tight_capacity_never_exceeds_it():
    # capacity just above what one step needs: the pool must evict and trim instead of failing
    pool, _ = make_pool(capacity=GiB)
    r, _, _, _ = run_cnn(pool, steps=3, batch=64)
    need = r["peak"]
    for cap in (int(need * 1.3), int(need * 1.15)):
        pool, dev = make_pool(capacity=cap)
        r, stats, _, _ = run_cnn(pool, steps=4, batch=64, dry_run_step=1)
        assert r["peak_reserved"] <= cap and dev.live_bytes() <= cap
    pool, _ = make_pool(capacity=int(need * 0.5))
    with pytest.raises(OutOfMemoryError, match="requested"):
        run_cnn(pool, steps=2, batch=64)


# ------------------------------------------------------------------------------------------------ real OpenCL
def _cl_context():
    cl = pytest.importorskip("pyopencl")
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:  # pragma: no cover - no ICD loader / no platform
        pytest.skip(f"no OpenCL platform: {exc}")
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices:  # pragma: no cover
        pytest.skip("no OpenCL device")
    return cl, cl.Context([devices[0]])


def test_real_opencl_blocks_write_and_read_back():
    cl, ctx = _cl_context()
    dev = ctx.devices[0]
    queue = cl.CommandQueue(ctx)
    pool = M.MemoryPool(ctx, capacity=dev.global_mem_size, max_alloc=dev.max_mem_alloc_size, label="opencl:0")
    assert M.ALIGN * 8 >= dev.mem_base_addr_align  # offsets satisfy the device's base alignment (given in bits)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (1, 77, 1000, 100_000, 700_000)]
    blocks = [pool.allocate(a.nbytes) for a in arrays]
    assert len({id(b.buffer) for b in blocks[:-1]}) == 1  # the small ones share a page
    for a, b in zip(arrays, blocks):
        cl.enqueue_copy(queue, b.buffer, a, dst_offset=b.offset)
    big = rng.standard_normal(2 * MiB // 4 + 3).astype(np.float32)
    bb = pool.allocate(big.nbytes)
    cl.enqueue_copy(queue, bb.buffer, big, dst_offset=bb.offset)
    # a kernel reading through (buffer, element offset) pairs, as the backend's kernels do
    prg = cl.Program(
        ctx,
        """
        __kernel void twice(__global const float *x, long xo, __global float *y, long yo) {
            size_t i = get_global_id(0); y[yo + i] = 2.0f * x[xo + i];
        }""",
    ).build()
    out = pool.allocate(arrays[2].nbytes)
    prg.twice(
        queue,
        (arrays[2].size,),
        None,
        blocks[2].buffer,
        np.int64(blocks[2].offset // 4),
        out.buffer,
        np.int64(out.offset // 4),
    )
    for a, b in zip(arrays + [big], blocks + [bb]):
        back = np.empty_like(a)
        cl.enqueue_copy(queue, back, b.buffer, src_offset=b.offset)
        np.testing.assert_array_equal(back, a)
    back = np.empty_like(arrays[2])
    cl.enqueue_copy(queue, back, out.buffer, src_offset=out.offset)
    np.testing.assert_array_equal(back, 2 * arrays[2])
    queue.finish()
    r = pool.report()
    assert r["in_use"] == sum(a.nbytes for a in arrays) + big.nbytes + arrays[2].nbytes
    assert isinstance(blocks[0].buffer, cl.Buffer)
    del blocks, bb, out, b  # (b: the loop variable holds the last block)
    assert pool.report()["in_use"] == 0
    assert pool.trim() > 0 and pool.report()["reserved"] == 0
    with pytest.raises(OutOfMemoryError, match="largest single allocation"):
        pool.allocate(dev.max_mem_alloc_size + 1)


def test_real_opencl_planned_iterations_keep_their_data():
    cl, ctx = _cl_context()
    dev = ctx.devices[0]
    queue = cl.CommandQueue(ctx)
    pool = M.MemoryPool(ctx, capacity=dev.global_mem_size, max_alloc=dev.max_mem_alloc_size)
    prg = cl.Program(
        ctx,
        """__kernel void axpb(__global const float *x, long xo, __global float *y, long yo, float a, float b) {
            size_t i = get_global_id(0); y[yo + i] = a * x[xo + i] + b;
        }""",
    ).build()
    knl = cl.Kernel(prg, "axpb")
    n_small, n_big = 50_000, 600_000  # 200 kB (small pool) and 2.4 MB (large pool)
    rng = np.random.default_rng(1)

    def axpb(src, n, a, b):
        out = pool.allocate(4 * n)
        knl(
            queue,
            (n,),
            None,
            src.buffer,
            np.int64(src.offset // 4),
            out.buffer,
            np.int64(out.offset // 4),
            np.float32(a),
            np.float32(b),
        )
        return out

    def iteration(seed):
        x = rng.standard_normal(n_big).astype(np.float32)
        bx = pool.allocate(x.nbytes)
        cl.enqueue_copy(queue, bx.buffer, x, dst_offset=bx.offset)
        h1 = axpb(bx, n_big, 2.0, 1.0)
        h2 = axpb(h1, n_small, 3.0, seed)  # the first n_small values
        del h1  # its range can be reused by the next block
        h3 = axpb(bx, n_big, -1.0, 0.0)
        live = [bx, h2, h3]
        assert_disjoint(live)
        got2, got3 = np.empty(n_small, np.float32), np.empty(n_big, np.float32)
        cl.enqueue_copy(queue, got2, h2.buffer, src_offset=h2.offset)
        cl.enqueue_copy(queue, got3, h3.buffer, src_offset=h3.offset)
        queue.finish()
        np.testing.assert_allclose(got2, 3.0 * (2.0 * x[:n_small] + 1.0) + seed, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got3, -x)
        return sum("planned" in repr(b) for b in live)

    iteration(0.0)
    with pool.dry_run() as stats:
        iteration(1.0)
    assert stats["allocations"] == 4 and stats["plan_bytes"] < 4 * (3 * n_big + n_small) + 4 * M.ALIGN
    raw = pool.report()["raw_allocations"]
    for seed in (2.0, 3.0, 4.0):
        assert iteration(seed) == 3
    r = pool.report()
    assert r["raw_allocations"] == raw and r["plan_allocations"] == 12 and r["in_use"] == 0
