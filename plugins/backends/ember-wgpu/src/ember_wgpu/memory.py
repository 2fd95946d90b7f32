"""Pooling buffer allocator of the WebGPU backend.

Creating a WebGPU buffer is a driver call (and on lavapipe a host allocation plus zeroing), so every tensor's
storage comes from a :class:`MemoryPool`:

* **Size classes.** A request is rounded up to ``ALIGN`` and then to a size class with 8 classes per doubling
  (rounding waste < 12.5%). Each block is a whole buffer of its class size: WebGPU binds buffers, and binding one
  buffer at several offsets in one dispatch would need the offsets aligned and the ranges disjoint, which views of
  one tensor are not.
* **Cache.** Freed buffers are kept per class and handed to the next request of that class. When creating a
  buffer would push ``reserved`` above twice the peak of live memory, least recently freed cached buffers of other
  classes are released first, so the cache cannot grow far beyond what the workload needs at once. (With the
  limit at the peak itself, a training step that needs different classes at different times released and
  recreated a few buffers every step.)
* **Out of memory.** Exceeding ``capacity``, a request above the adapter's storage-binding limit, or a driver
  allocation failure (after trimming the cache once and retrying) raises :class:`ember.errors.OutOfMemoryError`
  naming the requested and available bytes.
* **Dry run.** :meth:`MemoryPool.dry_run` records one iteration's allocations by class (classes it uses are not
  evicted meanwhile); on exit it releases the cached buffers of classes the iteration did not use and keeps, per
  class, as many as it had live at once, so a repeating workload is served from the cache without creating
  buffers (and the plan's classes are never evicted afterwards).

The reuse is ordered correctly without fences: WebGPU executes a queue's commands (and ``queue.write_buffer``) in
submission order, so a kernel that writes a reused buffer runs after every kernel that read it before.

``report()`` has the fields of ember-opencl's pool (``in_use``, ``reserved``, ``peak``, ``peak_reserved``,
``held``, ``cached``, ``allocations``, ``reuses``, ``raw_allocations``, ``raw_releases``, ...); the ``small_*``
split counts requests up to ``SMALL_MAX`` bytes, and the ``plan_*`` fields are those of the last dry run.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from ember.errors import OutOfMemoryError

ALIGN = 256
SMALL_MAX = 1 << 20
_LOG2_ALIGN = ALIGN.bit_length() - 1
_STEPS_LOG2 = 3


def size_class(nbytes: int) -> int:
    """The buffer size a request of ``nbytes`` bytes is rounded to."""
    a = (nbytes + ALIGN - 1) & -ALIGN or ALIGN
    step = 1 << max(a.bit_length() - 1 - _STEPS_LOG2, _LOG2_ALIGN)
    return (a + step - 1) & -step


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


class Block:
    """One live allocation: a whole buffer of ``capacity`` bytes of which ``nbytes`` are requested.

    The buffer returns to the pool when the Block is garbage collected.
    """

    __slots__ = ("buffer", "nbytes", "capacity", "_pool", "recorded")

    def __init__(self, buffer: Any, nbytes: int, capacity: int, pool: MemoryPool, recorded: bool = False) -> None:
        self.buffer = buffer
        self.nbytes = nbytes
        self.capacity = capacity
        self._pool: MemoryPool | None = pool
        #: allocated inside a dry run (only those count in its live-at-once tally)
        self.recorded = recorded

    def __del__(self) -> None:
        try:
            pool = self._pool
            if pool is not None:
                self._pool = None
                pool._free(self.buffer, self.nbytes, self.capacity, self.recorded)
        except Exception:  # interpreter shutdown: module state may already be gone
            pass

    def __repr__(self) -> str:
        return f"Block({self.nbytes} bytes, capacity {self.capacity})"


class MemoryPool:
    """Size-class cache of WebGPU storage buffers for one device."""

    def __init__(self, device: Any, capacity: int, max_alloc: int, label: str = "wgpu",
                 lock: Any = None) -> None:
        import wgpu

        self._device = device
        self._usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self.capacity = capacity
        self.max_alloc = max_alloc
        self.label = label
        # the runtime passes its own lock: releasing a buffer flushes the runtime's recorded dispatches, and one
        # lock for both cannot deadlock (a garbage-collected Block may free memory inside any runtime call)
        self._lock = lock if lock is not None else threading.RLock()
        self._free_lists: OrderedDict[int, list[Any]] = OrderedDict()  # class -> cached buffers (LRU by class)
        self._in_use = self._held = self._reserved = self._peak = self._peak_reserved = self._peak_held = 0
        self._allocs = self._reuses = self._raw_allocs = self._raw_releases = self._evictions = self._trims = 0
        self._live = self._small_allocs = self._small_in_use = 0
        self._recording: dict[int, list[int]] | None = None  # dry run: class -> [live now, most live at once]
        self._plan: dict[int, int] = {}
        self._plan_allocs = 0
        # every buffer the pool created, live or cached: a Block that dies inside a garbage cycle would otherwise
        # take its buffer into the cycle's unreachable set, and wgpu-py would release the buffer (its __del__)
        # even though Block.__del__ just returned it to the pool
        self._buffers: dict[int, Any] = {}
        #: called before a buffer is destroyed (the runtime submits recorded dispatches that may still use it)
        self.before_release: Callable[[], None] | None = None

    # -- allocation ----------------------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` bytes (a cached buffer of its class, or a new one)."""
        cap = size_class(nbytes)
        if cap > self.max_alloc:
            raise OutOfMemoryError(
                f"ember-wgpu: cannot allocate {human_bytes(nbytes)} on {self.label}: one buffer may hold at most "
                f"{human_bytes(self.max_alloc)} (the adapter's max-storage-buffer-binding-size)")
        with self._lock:
            free = self._free_lists.get(cap)
            if free:
                buf = free.pop()
                self._reuses += 1
            else:
                buf = self._create(cap, nbytes)
            self._allocs += 1
            self._live += 1
            self._in_use += nbytes
            self._held += cap
            if nbytes <= SMALL_MAX:
                self._small_allocs += 1
                self._small_in_use += nbytes
            if cap in self._plan:
                self._plan_allocs += 1
            self._peak = max(self._peak, self._in_use)
            self._peak_held = max(self._peak_held, self._held)
            rec = self._recording
            if rec is not None:
                slot = rec.setdefault(cap, [0, 0])
                slot[0] += 1
                slot[1] = max(slot[1], slot[0])
        return Block(buf, nbytes, cap, self, rec is not None)

    def _create(self, cap: int, nbytes: int) -> Any:
        limit = max(2 * self._peak_held, self._held + cap)  # twice what the workload has needed at once
        if self._reserved + cap > limit:
            self._evict(self._reserved + cap - limit, keep=cap)
        if self._reserved + cap > self.capacity:
            self.trim()
            if self._reserved + cap > self.capacity:
                raise OutOfMemoryError(
                    f"ember-wgpu: out of memory on {self.label}: requested {human_bytes(nbytes)}, "
                    f"{human_bytes(self.capacity - self._reserved)} of {human_bytes(self.capacity)} available "
                    f"({human_bytes(self._in_use)} in use)")
        try:
            buf = self._device.create_buffer(size=cap, usage=self._usage)
        except Exception as first:  # the driver's allocation failed: give back the cache and try once more
            self.trim()
            try:
                buf = self._device.create_buffer(size=cap, usage=self._usage)
            except Exception:
                raise OutOfMemoryError(
                    f"ember-wgpu: out of memory on {self.label}: the driver refused a buffer of "
                    f"{human_bytes(cap)} ({human_bytes(self._in_use)} in use, {human_bytes(self._reserved)} "
                    f"reserved): {first}") from first
        self._buffers[id(buf)] = buf
        self._raw_allocs += 1
        self._reserved += cap
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        return buf

    def _evict(self, nbytes: int, keep: int) -> None:
        """Release least recently freed cached buffers of classes other than ``keep`` until ``nbytes`` are gone."""
        for cls in list(self._free_lists):
            if nbytes <= 0:
                break
            # the plan's classes, and during a dry run the classes it has used, stay: the iteration needs them again
            if cls == keep or cls in self._plan or (self._recording is not None and cls in self._recording):
                continue
            free = self._free_lists[cls]
            while free and nbytes > 0:
                self._release(free.pop(), cls)
                self._evictions += 1
                nbytes -= cls
            if not free:
                del self._free_lists[cls]

    def _release(self, buf: Any, cap: int) -> None:
        self._reserved -= cap
        self._raw_releases += 1
        self._buffers.pop(id(buf), None)
        if self.before_release is not None:
            self.before_release()
        destroy = getattr(buf, "destroy", None)
        if destroy is not None:
            destroy()

    def _free(self, buf: Any, nbytes: int, cap: int, recorded: bool = False) -> None:
        with self._lock:
            self._live -= 1
            self._in_use -= nbytes
            self._held -= cap
            if nbytes <= SMALL_MAX:
                self._small_in_use -= nbytes
            rec = self._recording
            # a block from before the dry run returns to the cache, where the run's next request of its class
            # finds it: it is not one of the buffers the run needs at once, so it must not lower their tally
            if rec is not None and recorded and cap in rec:
                rec[cap][0] -= 1
            # append in place (a nested free from the garbage collector must not replace the list under us)
            self._free_lists.setdefault(cap, []).append(buf)
            self._free_lists.move_to_end(cap)  # most recently freed class last

    def trim(self) -> int:
        """Release every cached (free) buffer; returns the bytes released."""
        with self._lock:
            before = self._reserved
            for cls, free in self._free_lists.items():
                for buf in free:
                    self._release(buf, cls)
            self._free_lists.clear()
            self._trims += 1
            return before - self._reserved

    # -- statistics ----------------------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Memory statistics in bytes and counts (the field names of ember-opencl's pool)."""
        with self._lock:
            reserved = self._reserved
            cached_buffers = sum(len(v) for v in self._free_lists.values())
            return {
                "allocator": "ember-wgpu pool",
                "device": self.label,
                "capacity": self.capacity,
                "max_alloc": self.max_alloc,
                "in_use": self._in_use,
                "reserved": reserved,
                "peak": self._peak,
                "peak_reserved": self._peak_reserved,
                "held": self._held,
                "cached": reserved - self._held,
                "allocations": self._allocs,
                "reuses": self._reuses,
                "raw_allocations": self._raw_allocs,
                "raw_releases": self._raw_releases,
                "evictions": self._evictions,
                "trims": self._trims,
                "live_blocks": self._live,
                "small_allocations": self._small_allocs,
                "small_in_use": self._small_in_use,
                "large_allocations": self._allocs - self._small_allocs,
                "large_in_use": self._in_use - self._small_in_use,
                "large_cached_buffers": cached_buffers,
                "plan_allocations": self._plan_allocs,
                "plan_slots": sum(self._plan.values()),
                "plan_reserved": sum(c * n for c, n in self._plan.items()),
                "reserved_over_peak": reserved / self._peak if self._peak else None,
            }

    # -- dry run ---------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def dry_run(self) -> Iterator[dict[str, Any]]:
        """Record the allocations of the workload inside the context; on exit keep per class as many cached
        buffers as were live at once and release the rest. Yields a dict filled on exit with ``allocations``,
        ``classes``, ``planned_bytes``, ``released`` and ``reserved``."""
        stats: dict[str, Any] = {}
        with self._lock:
            self._recording = {}
            allocs0 = self._allocs
        try:
            yield stats
        finally:
            with self._lock:
                rec, self._recording = self._recording or {}, None
                self._plan = {cls: most for cls, (_, most) in rec.items()}
                released = 0
                for cls in list(self._free_lists):
                    free = self._free_lists[cls]
                    keep = self._plan.get(cls, 0)
                    while len(free) > keep:
                        self._release(free.pop(), cls)
                        released += cls
                    if not free:
                        del self._free_lists[cls]
                stats["allocations"] = self._allocs - allocs0
                stats["classes"] = len(self._plan)
                stats["planned_bytes"] = sum(c * n for c, n in self._plan.items())
                stats["released"] = released
                stats["reserved"] = self._reserved
