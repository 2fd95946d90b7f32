"""CuPyBackend's memory plumbing without a GPU: ``memory_dry_run()`` over a stand-in for CuPy's pool and memory
hooks (the hook protocol of cupy.cuda.MemoryHook: keyword callbacks after each pool malloc and free, registered
with ``with``), and the pinned staging of host transfers over stand-ins that record what was called. The names
are checked against the real CuPy in test_cupy_names.py."""

from __future__ import annotations

import contextlib
import threading
import types
import weakref
from typing import Any

import numpy as np
import pytest

from ember import dtypes as dt
from ember.errors import ValueRangeError
from ember_cupy import backend as cupy_backend
from ember_cupy.backend import CuPyBackend

_ACTIVE: list[Any] = []


class _Hook:
    """cupy.cuda.MemoryHook's protocol: active inside ``with``; callbacks take keyword arguments."""

    def __enter__(self) -> Any:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)


class _Block:
    """A MemoryPointer stand-in: the pool gets the block back when it is garbage collected."""

    def __init__(self, ptr: int, mem: int) -> None:
        self.ptr = ptr
        self.mem = types.SimpleNamespace(size=mem)


class _Pool:
    """A MemoryPool stand-in: blocks rounded to 512 bytes, cached on free, hooks called as CuPy calls them."""

    def __init__(self) -> None:
        self.used = 0
        self.cached: list[int] = []
        self.next_ptr = 1 << 20
        self.freed_all = 0

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.used + sum(self.cached)

    def free_all_blocks(self) -> None:
        self.freed_all += 1
        self.cached.clear()

    def malloc(self, size: int) -> Any:
        mem = -(-size // 512) * 512
        if mem in self.cached:
            self.cached.remove(mem)
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + mem
        self.used += mem
        for h in list(_ACTIVE):
            h.malloc_postprocess(device_id=0, size=size, mem_size=mem, mem_ptr=ptr, pmem_id=ptr)
        block = _Block(ptr, mem)
        weakref.finalize(block, self._free, ptr, mem)
        return block

    def _free(self, ptr: int, mem: int) -> None:
        self.used -= mem
        self.cached.append(mem)
        for h in list(_ACTIVE):
            h.free_postprocess(device_id=0, mem_size=mem, mem_ptr=ptr, pmem_id=ptr)


@pytest.fixture
def be() -> CuPyBackend:
    b = CuPyBackend.__new__(CuPyBackend)
    b.index, b.name, b.platform = 0, "cuda", "cuda"
    b.pool = _Pool()
    b.cp = types.SimpleNamespace(cuda=types.SimpleNamespace(MemoryHook=_Hook, memory=types.SimpleNamespace(
        OutOfMemoryError=MemoryError)))
    b.device, b.stream = contextlib.nullcontext(), contextlib.nullcontext()
    b._lock = threading.Lock()
    b._peak, b._peak_reserved, b._staged, b._dry_run_active = 0, 0, [], False
    b.describe = lambda: "cuda:0 (stand-in)"  # type: ignore[method-assign]
    b.sync = lambda: None  # type: ignore[method-assign]
    return b


def test_dry_run_records_a_step_and_reserves_its_peak(be: CuPyBackend) -> None:
    pool = be.pool
    before = pool.malloc(4096)  # live before the dry run: not recorded, counted in peak_in_use
    pool.malloc(100)  # garbage: cached, released by the plan
    with be.memory_dry_run() as stats:
        a = pool.malloc(1000)
        b = pool.malloc(1000)
        del a, b  # both 1000-byte blocks were live at once
        c = pool.malloc(3000)
        carried = pool.malloc(2000)  # handed to the next step
        del c
        del before  # a block from before: its free is not counted
    assert stats["sizes"] == {1000: 2, 2000: 1, 3000: 1}
    assert (stats["allocations"], stats["frees"], stats["carried"], stats["kept"]) == (4, 3, 1, 1)
    assert stats["peak_in_use"] == 4096 + 3072 + 2048  # the 3000-byte block and the carried 2000 one
    assert stats["per_size_bytes"] == 2 * 1000 + 2000 + 3000
    assert stats["plan_bytes"] == 2 * 1024 + 2048 + 3072  # the pool's rounded blocks
    assert pool.freed_all == 1
    assert sorted(pool.cached) == [1024, 1024, 2048, 3072]  # reserved: cached for the next steps, garbage gone
    assert stats["reserved"] == pool.total_bytes()
    del carried


def test_dry_run_leaves_the_pool_on_error_and_does_not_nest(be: CuPyBackend) -> None:
    with pytest.raises(RuntimeError, match="step failed"), be.memory_dry_run() as stats:
        keep = be.pool.malloc(512)
        raise RuntimeError("step failed")
    assert stats["allocations"] == 1 and "plan_bytes" not in stats and be.pool.freed_all == 0
    del keep
    with be.memory_dry_run():
        with pytest.raises(ValueRangeError, match="already active"), be.memory_dry_run():
            pass


class _Event:
    def __init__(self) -> None:
        self.done = False


def _staging_cupy(calls: list[str]) -> Any:
    """numpy plus the CuPy names the transfers call, recording them."""
    shim = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})

    class Arr(np.ndarray):
        def set(self, arr: np.ndarray, stream: Any = None) -> None:
            calls.append(f"set(pinned={getattr(arr, 'pinned', False)})")
            self[...] = arr

    def empty(shape: Any, dtype: Any) -> Any:
        return np.empty(shape, dtype).view(Arr)

    def asnumpy(a: Any, stream: Any = None, blocking: bool = True, out: Any = None) -> np.ndarray:
        calls.append(f"asnumpy(out={'pinned' if getattr(out, 'pinned', False) else out})")
        if out is None:
            return np.asarray(a).copy()
        out[...] = a
        return out

    shim.empty, shim.asnumpy, shim.ndarray = empty, asnumpy, Arr
    shim.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    return shim


def test_large_transfers_stage_through_pinned_memory(be: CuPyBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    import cupyx

    calls: list[str] = []
    be.cp = _staging_cupy(calls)
    be.supported_dtypes = frozenset(d for d in dt.ALL_DTYPES if d is not dt.bfloat16)
    events: list[_Event] = []

    class Stream(contextlib.nullcontext):  # type: ignore[type-arg]
        def record(self) -> _Event:
            events.append(_Event())
            return events[-1]

    be.stream = Stream()

    class Pinned(np.ndarray):
        pinned = True

    monkeypatch.setattr(cupyx, "empty_pinned", lambda shape, dtype: np.empty(shape, dtype).view(Pinned))
    small = np.arange(10, dtype=np.float32)
    big = np.arange(cupy_backend.PINNED_MIN_BYTES // 4 * 2, dtype=np.float32).reshape(2, -1)[:, ::2]  # strided
    up = be.from_numpy(big)
    np.testing.assert_array_equal(up, big)
    assert calls == ["set(pinned=True)"] and len(be._staged) == 1  # the buffer is held while the copy runs
    np.testing.assert_array_equal(be.from_numpy(small), small)
    assert len(calls) == 1  # small arrays: a direct copy
    events[0].done = True
    be.from_numpy(big)
    assert len(be._staged) == 1  # the finished upload's buffer went back to the pool
    down = be.to_numpy(up)
    np.testing.assert_array_equal(down, big)
    assert calls[-1] == "asnumpy(out=pinned)" and not isinstance(down, Pinned)  # returned pageable
    be.to_numpy(small)
    assert calls[-1] == "asnumpy(out=None)"


def test_memory_report_has_opencls_fields(be: CuPyBackend) -> None:
    pool = be.pool
    pool.n_free_blocks = lambda: len(pool.cached)  # type: ignore[attr-defined]
    pool.get_limit = lambda: 0  # type: ignore[attr-defined]
    be.cp.cuda.runtime = types.SimpleNamespace(memGetInfo=lambda: (3 << 30, 8 << 30))
    be.cp.get_default_pinned_memory_pool = lambda: types.SimpleNamespace(n_free_blocks=lambda: 2)
    be._modules = {"src": object()}
    live = pool.malloc(1500)
    pool.malloc(600)  # freed at once: cached
    rep = be.memory_report()
    assert {k: rep[k] for k in ("in_use", "held", "reserved", "peak", "peak_reserved", "cached", "cached_blocks",
                                "capacity", "free", "pinned_free_blocks", "staged_uploads")} == {
        "in_use": 1536, "held": 1536, "reserved": 1536 + 1024, "peak": 1536, "peak_reserved": 1536 + 1024,
        "cached": 1024, "cached_blocks": 1, "capacity": 8 << 30, "free": 3 << 30, "pinned_free_blocks": 2,
        "staged_uploads": 0}
    assert rep["kernels"] == {"programs": 1} and rep["allocator"] == "cupy.MemoryPool"
    del live
