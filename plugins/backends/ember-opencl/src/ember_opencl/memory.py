"""Pooling device-memory allocator of the OpenCL backend.

Device buffers are expensive to create (a driver call, often a page-table update), so every tensor's storage comes
from a :class:`MemoryPool`:

* **Size classes.** A request is rounded up to ``ALIGN`` and then to a size class with 8 classes per doubling
  (rounding waste < 12.5%).
* **Small pool.** Requests up to ``SMALL_MAX`` are carved from shared pages (``PAGE_SIZE`` raw buffers) with a bump
  pointer; freed blocks go to a per-class free list and are reused by the next request of that class. A page whose
  blocks are all free is reset: one is kept as a spare, the others are released.
* **Large pool.** Bigger requests get a dedicated raw buffer of the class size; freed buffers are cached per class.
  When creating a buffer would push ``reserved`` above the peak of live memory, least recently freed cached buffers
  of other classes are released first, so the cache cannot grow far beyond what the workload needs at once.
* **Out of memory.** Exceeding ``capacity`` or an OpenCL allocation failure trims the cache once and retries; then
  :class:`ember.errors.OutOfMemoryError` names the requested and available bytes.
* **Dry run.** :meth:`MemoryPool.dry_run` records the allocation trace of one iteration of a workload (sizes and
  lifetimes; blocks handed to the next iteration, such as gradients and the loss, are matched to the allocation
  that made them). On exit it plans offsets for all of them in one *plan buffer* (greedy by size: each block at
  the lowest offset free during its lifetime), which is typically within a few percent of the peak in use, and
  releases every other cached buffer. When the workload repeats, its n-th allocation gets its planned offset, so
  no new buffers are created. The plan is a hint: a planned range is used only when no live block overlaps it
  (a workload that deviates falls back to the pools above), so a plan never affects correctness.

A :class:`Block` returns its memory to the pool when it is garbage collected.
"""

from __future__ import annotations

import contextlib
import threading
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any

from ember.errors import OutOfMemoryError, ValueRangeError

ALIGN = 256  # byte alignment of block offsets: divisible by every element size and by typical base alignments
SMALL_MAX = 1 << 20  # requests up to this many bytes are carved from shared pages
PAGE_SIZE = 2 << 20  # raw buffer size of a small-pool page
_LOG2_ALIGN = ALIGN.bit_length() - 1
_STEPS_LOG2 = 3  # 2**3 = 8 size classes per doubling
_RESYNC = 3  # a plan skips at most this many expected allocations to find the current one

# OpenCL status codes that mean "no memory": MEM_OBJECT_ALLOCATION_FAILURE, OUT_OF_RESOURCES, OUT_OF_HOST_MEMORY
_OOM_CODES = frozenset({-4, -5, -6})


def size_class(nbytes: int) -> int:
    """The block size a request of ``nbytes`` bytes is rounded to (outside a dry-run plan)."""
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


def _is_alloc_failure(exc: BaseException) -> bool:
    # pyopencl.MemoryError is a pyopencl.Error (not a builtin MemoryError); other cl.Errors carry the status code.
    if isinstance(exc, MemoryError) or type(exc).__name__ == "MemoryError":
        return True
    code = getattr(exc, "code", None)
    if callable(code):  # some pyopencl versions expose the status code as a method
        try:
            code = code()
        except Exception:
            return False
    return code in _OOM_CODES


def _release_buffer(buf: Any) -> None:
    release = getattr(buf, "release", None)
    if release is not None:
        release()


class _Page:
    """A small-pool raw buffer carved with a bump pointer."""

    __slots__ = ("buffer", "size", "top", "live", "classes")

    def __init__(self, buffer: Any, size: int) -> None:
        self.buffer = buffer
        self.size = size
        self.top = 0  # first uncarved byte
        self.live = 0  # live blocks carved from this page
        self.classes: set[int] = set()  # classes carved here, i.e. free lists that may hold entries of this page


class _Plan:
    """Planned offsets for the allocations of a recorded iteration, in one buffer.

    ``sizes[i]`` is the aligned size of the iteration's i-th allocation and ``offsets[i]`` its offset in
    ``buffer`` (-1: not planned, e.g. state made once and kept). A planned range is handed out only when no live
    block of the plan overlaps it: live blocks never overlap, so with their offsets sorted only the last one
    starting before the range's end needs checking.
    """

    __slots__ = ("buffer", "size", "sizes", "offsets", "live_offs", "live_end", "cursor", "in_use")

    def __init__(self, buffer: Any, size: int, sizes: list[int], offsets: list[int]) -> None:
        self.buffer = buffer
        self.size = size
        self.sizes = sizes
        self.offsets = offsets
        self.live_offs: list[int] = []  # sorted offsets of live blocks
        self.live_end: dict[int, int] = {}  # offset -> end of a live block
        self.cursor = 0  # index of the allocation expected next
        self.in_use = 0

    def take(self, a: int) -> int:
        """Offset for the next allocation of aligned size ``a``, or -1 (off the recorded trace, or occupied)."""
        sizes = self.sizes
        n = len(sizes)
        i = self.cursor
        if sizes[i] != a:
            for skip in range(1, _RESYNC + 1):  # an expected allocation did not happen
                j = i + skip
                if j < n and sizes[j] == a:
                    i = j
                    break
            else:
                if sizes[0] != a:
                    return -1  # not part of the plan: the cursor waits
                i = 0  # the next repetition started early
        self.cursor = i + 1 if i + 1 < n else 0
        off = self.offsets[i]
        if off < 0:
            return -1
        end = off + a
        live_offs = self.live_offs
        j = bisect_left(live_offs, end)
        if j and self.live_end[live_offs[j - 1]] > off:
            return -1  # a block from an earlier repetition is still live there
        live_offs.insert(j, off)
        self.live_end[off] = end
        return off

    def give_back(self, off: int) -> None:
        live_offs = self.live_offs
        del live_offs[bisect_left(live_offs, off)]
        del self.live_end[off]


class Block:
    """One live allocation: ``nbytes`` bytes at byte ``offset`` (a multiple of ``ALIGN``) of ``buffer``.

    The memory returns to the pool when the Block is garbage collected; keep the Block alive for as long as the
    memory is used (queued kernels included: with an in-order queue, reuse is ordered after them).
    """

    __slots__ = ("buffer", "offset", "nbytes", "_cap", "_page", "_seq", "_pool")

    def __init__(self, buffer: Any, offset: int, nbytes: int, cap: int, page: Any, seq: int, pool: MemoryPool):
        self.buffer = buffer
        self.offset = offset
        self.nbytes = nbytes
        self._cap = cap  # bytes actually set aside
        self._page = page  # _Page (small pool), _Plan (plan buffer) or None (dedicated large buffer)
        self._seq = seq  # allocation number, to match a dry run's frees to the previous iteration's allocations
        self._pool = pool

    @property
    def capacity(self) -> int:
        """Bytes set aside for this block (``nbytes`` rounded up to its size class)."""
        return self._cap

    def __del__(self) -> None:
        try:
            pool = self._pool
            if pool is not None:
                self._pool = None
                pool._free(self.buffer, self.offset, self.nbytes, self._cap, self._page, self._seq)
        except Exception:  # interpreter shutdown: module state may already be gone
            pass

    def __repr__(self) -> str:
        page = self._page
        kind = "large" if page is None else "small" if isinstance(page, _Page) else "planned"
        return f"Block({self.nbytes} bytes at offset {self.offset}, {kind}, capacity {self._cap})"


class _Recorder:
    """The allocation trace of a dry run."""

    __slots__ = ("sizes", "t_alloc", "t_free", "ids", "carried", "t", "size_net", "size_peak", "peak_in_use")

    def __init__(self, in_use: int) -> None:
        self.sizes: list[int] = []  # aligned size of the i-th allocation
        self.t_alloc: list[int] = []  # event time of the i-th allocation
        self.t_free: list[int] = []  # event time of its free (-1: still live at the end)
        self.ids: dict[tuple[int, int], int] = {}  # (id(buffer), offset) of a live recorded block -> its index
        self.carried: list[tuple[int, int, int]] = []  # frees of older blocks: (time, allocation number, size)
        self.t = 0  # event clock
        self.size_net: dict[int, int] = {}  # exact request size -> live count
        self.size_peak: dict[int, int] = {}
        self.peak_in_use = in_use

    def alloc(self, key: tuple[int, int], nbytes: int, a: int, in_use: int) -> None:
        self.ids[key] = len(self.sizes)
        self.sizes.append(a)
        self.t_alloc.append(self.t)
        self.t_free.append(-1)
        self.t += 1
        n = self.size_net.get(nbytes, 0) + 1
        self.size_net[nbytes] = n
        if n > self.size_peak.get(nbytes, 0):
            self.size_peak[nbytes] = n
        if in_use > self.peak_in_use:
            self.peak_in_use = in_use

    def free(self, key: tuple[int, int], nbytes: int, seq: int) -> None:
        i = self.ids.pop(key, None)
        if i is None:
            self.carried.append((self.t, seq, (nbytes + ALIGN - 1) & -ALIGN or ALIGN))
        else:
            self.t_free[i] = self.t
        self.t += 1
        self.size_net[nbytes] = self.size_net.get(nbytes, 0) - 1

    def lifetimes(self) -> tuple[list[list[tuple[int, int]]], int]:
        """Per allocation, its live intervals in a repeated iteration ([] = not planned), and how many blocks are
        handed to the next iteration.

        A block still live at the end is handed to the next iteration when blocks of its size from before the dry
        run were freed during it: per size, the k-th oldest such block (by allocation number) stands for the k-th
        block of that size left live, whose lifetime then wraps around to that free. Unmatched blocks are state
        made once and kept; they are not planned.
        """
        n = len(self.sizes)
        end = self.t
        freed_old: dict[int, list[tuple[int, int]]] = {}  # size -> [(allocation number, time freed)]
        for t, seq, a in self.carried:
            freed_old.setdefault(a, []).append((seq, t))
        left: dict[int, list[int]] = {}  # size -> indices of blocks live at the end, in allocation order
        for i in range(n):
            if self.t_free[i] < 0:
                left.setdefault(self.sizes[i], []).append(i)
        wrap: dict[int, int] = {}
        for a, olds in freed_old.items():
            for (_, t), i in zip(sorted(olds), left.get(a, ())):
                # freed after its successor is made (a loss kept until the next one replaces it): one range cannot
                # hold both, so such a block is served by the pools
                wrap[i] = t if t <= self.t_alloc[i] else -1
        out: list[list[tuple[int, int]]] = []
        for i in range(n):
            t0, t1 = self.t_alloc[i], self.t_free[i]
            if t1 >= 0:
                out.append([(t0, t1)])
            elif wrap.get(i, -1) >= 0:
                out.append([(t0, end), (0, wrap[i])])
            else:
                out.append([])
        return out, sum(1 for t in wrap.values() if t >= 0)


def _place(sizes: list[int], lifetimes: list[list[tuple[int, int]]], limit: int) -> tuple[list[int], int]:
    """Offsets for blocks with the given sizes and live intervals so that blocks live at the same time do not
    overlap: largest first, each at the lowest offset that is free during its lifetime; a block that would end
    beyond ``limit`` bytes is left out (-1). Returns (offsets, total)."""
    import numpy as np

    order = sorted((i for i in range(len(sizes)) if lifetimes[i]), key=lambda i: (-sizes[i], lifetimes[i][0][0]))
    n_iv = sum(len(lifetimes[i]) for i in order)
    t0 = np.empty(n_iv, np.int64)
    t1 = np.empty(n_iv, np.int64)
    lo = np.empty(n_iv, np.int64)
    hi = np.empty(n_iv, np.int64)
    k = 0
    offsets = [-1] * len(sizes)
    total = 0
    for i in order:
        size = sizes[i]
        mask = None
        for a, b in lifetimes[i]:
            m = (t0[:k] < b) & (t1[:k] > a)
            mask = m if mask is None else mask | m
        off = 0
        if k and mask.any():
            los = lo[:k][mask]
            srt = np.argsort(los, kind="stable")
            los = los[srt]
            reach = np.maximum.accumulate(hi[:k][mask][srt])  # end of the occupied prefix before each block
            starts = np.concatenate(([0], reach[:-1]))
            fits = np.flatnonzero(los - starts >= size)
            off = int(starts[fits[0]]) if fits.size else int(reach[-1])
        if off + size > limit:
            continue
        offsets[i] = off
        total = max(total, off + size)
        for a, b in lifetimes[i]:
            t0[k], t1[k], lo[k], hi[k] = a, b, off, off + size
            k += 1
    return offsets, total


class MemoryPool:
    """Caching allocator of device memory for one OpenCL context.

    ``capacity`` is the number of bytes the device offers (``global_mem_size`` or a test limit); ``max_alloc`` the
    largest single buffer (``max_mem_alloc_size``). ``raw_alloc(nbytes)`` creates a buffer-like object with a
    ``.size`` (default: a READ_WRITE ``pyopencl.Buffer``); objects with a ``release()`` method are released through
    it when the pool gives them back. ``label`` names the device in error messages.
    """

    def __init__(
        self,
        context: Any,
        *,
        capacity: int,
        raw_alloc: Callable[[int], Any] | None = None,
        label: str = "opencl:0",
        max_alloc: int | None = None,
    ) -> None:
        if capacity <= 0:
            raise ValueRangeError(f"MemoryPool({label}): capacity must be positive, got {capacity}")
        if raw_alloc is None:
            import pyopencl as cl

            flags = cl.mem_flags.READ_WRITE

            def raw_alloc(nbytes: int) -> Any:
                return cl.Buffer(context, flags, nbytes)

        self.context = context
        self.label = label
        self.capacity = int(capacity)
        self.max_alloc = int(max_alloc) if max_alloc else None
        self._raw_alloc = raw_alloc
        # Block.__del__ may run while this thread already holds the lock (cyclic GC inside allocate), so frees
        # never block: they go to _pending when the lock is taken and are applied by the next pool operation.
        self._lock = threading.Lock()
        self._pending: deque[tuple[Any, int, int, int, Any, int]] = deque()
        self._classes: dict[int, int] = {}  # aligned size -> size class (memo of the per-op path)
        self._free_small: dict[int, list[tuple[Any, int, _Page]]] = {}
        self._free_large: OrderedDict[int, list[Any]] = OrderedDict()  # least recently freed class first
        self._pages: list[_Page] = []
        self._active: _Page | None = None  # page new small blocks are carved from
        self._spare: _Page | None = None  # at most one empty page kept for reuse
        self._plan: _Plan | None = None  # offsets planned by the last dry run
        self._old_plans: list[_Plan] = []  # replaced plans whose blocks are still live
        self._rec: _Recorder | None = None
        # statistics (bytes unless named otherwise)
        self._in_use = 0  # requested bytes of live blocks
        self._held = 0  # bytes set aside for live blocks (rounded to classes)
        self._small_in_use = 0
        self._small_reserved = 0
        self._large_reserved = 0
        self._plan_reserved = 0
        self._peak = 0
        self._peak_held = 0
        self._peak_reserved = 0
        self._live = 0
        self._allocs = 0
        self._small_allocs = 0
        self._plan_allocs = 0
        self._reuses = 0
        self._raw_allocs = 0
        self._raw_releases = 0
        self._evictions = 0
        self._trims = 0

    @property
    def _reserved(self) -> int:
        return self._small_reserved + self._large_reserved + self._plan_reserved

    # -- allocation -------------------------------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` bytes (``nbytes == 0`` gives a minimal block).

        Raises :class:`~ember.errors.OutOfMemoryError` when the device cannot provide it even after the cache has
        been trimmed, or when ``nbytes`` exceeds the device's largest single allocation.
        """
        if nbytes < 0:
            raise ValueRangeError(f"{self.label}: cannot allocate a negative number of bytes ({nbytes})")
        max_alloc = self.max_alloc
        if max_alloc is not None and nbytes > max_alloc:
            raise OutOfMemoryError(
                f"{self.label}: cannot allocate {nbytes} bytes ({human_bytes(nbytes)}) in one buffer: the device's "
                f"largest single allocation is {max_alloc} bytes ({human_bytes(max_alloc)})"
            )
        with self._lock:
            if self._pending:
                self._drain()
            a = (nbytes + ALIGN - 1) & -ALIGN or ALIGN
            plan = self._plan
            if plan is not None and (off := plan.take(a)) >= 0:
                buf = plan.buffer
                page = plan
                cls = a
                plan.in_use += nbytes
                self._plan_allocs += 1
                self._reuses += 1
            else:
                cls = self._classes.get(a)
                if cls is None:
                    cls = self._class_of(a)
                if cls <= SMALL_MAX:
                    lst = self._free_small.get(cls)
                    if lst:
                        buf, off, page = lst.pop()
                        self._reuses += 1
                    else:
                        buf, off, page = self._carve(cls, nbytes)
                    page.live += 1
                    self._small_in_use += nbytes
                    self._small_allocs += 1
                else:
                    lst = self._free_large.get(cls)
                    if lst:
                        buf = lst.pop()
                        if not lst:
                            del self._free_large[cls]
                        self._reuses += 1
                    else:
                        self._make_room(cls)
                        buf = self._raw(cls, nbytes)
                        self._large_reserved += cls
                    off = 0
                    page = None
            self._allocs += 1
            self._live += 1
            in_use = self._in_use + nbytes
            self._in_use = in_use
            if in_use > self._peak:
                self._peak = in_use
            held = self._held + cls
            self._held = held
            if held > self._peak_held:
                self._peak_held = held
            if self._rec is not None:
                self._rec.alloc((id(buf), off), nbytes, a, in_use)
            return Block(buf, off, nbytes, cls, page, self._allocs, self)

    def _class_of(self, a: int) -> int:
        cls = size_class(a)
        if self.max_alloc is not None and cls > self.max_alloc:
            cls = self.max_alloc
        classes = self._classes
        if len(classes) >= 4096:  # workloads use far fewer sizes; bound the memo for those that do not
            classes.clear()
        classes[a] = cls
        return cls

    def _carve(self, cls: int, nbytes: int) -> tuple[Any, int, _Page]:
        page = self._active
        if page is None or page.top + cls > page.size:
            if page is not None and page.live == 0:
                self._reset_page(page)  # an empty full page: start it over instead of taking another
            else:
                page = self._spare
                if page is not None:
                    self._spare = None
                else:
                    self._make_room(PAGE_SIZE)
                    page = _Page(self._raw(PAGE_SIZE, nbytes), PAGE_SIZE)
                    self._pages.append(page)
                    self._small_reserved += PAGE_SIZE
                old = self._active
                self._active = page
                if old is not None and old.live == 0:
                    self._retire(old)
        off = page.top
        page.top = off + cls
        page.classes.add(cls)
        return page.buffer, off, page

    def _raw(self, size: int, request: int) -> Any:
        """A new raw buffer of ``size`` bytes; trims once and retries before raising OutOfMemoryError."""
        if self._reserved + size > self.capacity:
            self._trim_locked()
            if self._reserved + size > self.capacity:
                raise self._oom(request, size, None)
        try:
            buf = self._raw_alloc(size)
        except Exception as exc:
            if not _is_alloc_failure(exc):
                raise
            self._trim_locked()
            try:
                buf = self._raw_alloc(size)
            except Exception as exc2:
                if not _is_alloc_failure(exc2):
                    raise
                raise self._oom(request, size, exc2) from exc2
        self._raw_allocs += 1
        reserved = self._reserved + size
        if reserved > self._peak_reserved:
            self._peak_reserved = reserved
        return buf

    def _oom(self, request: int, size: int, cause: BaseException | None) -> OutOfMemoryError:
        reserved = self._reserved
        available = max(self.capacity - reserved, 0)
        why = f" (OpenCL: {cause})" if cause is not None else ""
        block = f" (a {size}-byte block)" if size != request else ""
        return OutOfMemoryError(
            f"{self.label}: out of device memory: requested {request} bytes ({human_bytes(request)}){block}, "
            f"available {available} bytes ({human_bytes(available)}) of capacity {self.capacity} "
            f"({human_bytes(self.capacity)}) after releasing cached blocks; in use {self._in_use} bytes "
            f"({human_bytes(self._in_use)}), reserved {reserved} bytes ({human_bytes(reserved)}){why}"
        )

    def _make_room(self, size: int) -> None:
        """Release least recently freed cached large buffers while growing by ``size`` would exceed the peak."""
        excess = self._reserved + size - max(self._peak_held, self._held + size)
        if excess <= 0:
            return
        free_large = self._free_large
        for cls in list(free_large):
            lst = free_large[cls]
            while lst and excess > 0:
                _release_buffer(lst.pop())
                self._large_reserved -= cls
                self._raw_releases += 1
                self._evictions += 1
                excess -= cls
            if not lst:
                del free_large[cls]
            if excess <= 0:
                return
        spare = self._spare
        if spare is not None:
            self._spare = None
            self._release_page(spare)

    # -- freeing ----------------------------------------------------------------------------------------------------
    def _free(self, buf: Any, off: int, nbytes: int, cap: int, page: Any, seq: int) -> None:
        """Called by Block.__del__; never blocks (see ``_pending``)."""
        lock = self._lock
        if lock.acquire(blocking=False):
            try:
                self._free_locked(buf, off, nbytes, cap, page, seq)
                if self._pending:
                    self._drain()
            finally:
                lock.release()
        else:
            self._pending.append((buf, off, nbytes, cap, page, seq))

    def _drain(self) -> None:
        pending = self._pending
        while pending:
            self._free_locked(*pending.popleft())

    def _free_locked(self, buf: Any, off: int, nbytes: int, cap: int, page: Any, seq: int) -> None:
        self._in_use -= nbytes
        self._held -= cap
        self._live -= 1
        if self._rec is not None:
            self._rec.free((id(buf), off), nbytes, seq)
        if page is None:
            free_large = self._free_large
            lst = free_large.get(cap)
            if lst is None:
                free_large[cap] = [buf]
            else:
                lst.append(buf)
                free_large.move_to_end(cap)
        elif page.__class__ is _Page:
            self._small_in_use -= nbytes
            lst = self._free_small.get(cap)
            if lst is None:
                self._free_small[cap] = [(buf, off, page)]
            else:
                lst.append((buf, off, page))
            page.live -= 1
            if page.live == 0 and page is not self._active:
                self._retire(page)
        else:
            page.give_back(off)
            page.in_use -= nbytes
            if not page.live_offs and page is not self._plan:
                self._drop_plan(page)

    # -- pages and plans --------------------------------------------------------------------------------------------
    def _reset_page(self, page: _Page) -> None:
        """Forget the page's free-list entries and carve it from the start again."""
        free_small = self._free_small
        for cls in page.classes:
            lst = free_small.get(cls)
            if lst:
                kept = [e for e in lst if e[2] is not page]
                if kept:
                    free_small[cls] = kept
                else:
                    del free_small[cls]
        page.classes.clear()
        page.top = 0

    def _retire(self, page: _Page) -> None:
        """An empty page: keep it as the spare if there is none, else release it."""
        self._reset_page(page)
        if self._spare is None:
            self._spare = page
        else:
            self._release_page(page)

    def _release_page(self, page: _Page) -> None:
        self._reset_page(page)
        self._pages.remove(page)
        if self._active is page:
            self._active = None
        if self._spare is page:
            self._spare = None
        _release_buffer(page.buffer)
        page.buffer = None
        self._small_reserved -= page.size
        self._raw_releases += 1

    def _drop_plan(self, plan: _Plan) -> None:
        """Release an idle plan's buffer."""
        if plan is self._plan:
            self._plan = None
        if plan in self._old_plans:
            self._old_plans.remove(plan)
        if plan.buffer is not None:
            _release_buffer(plan.buffer)
            plan.buffer = None
            self._plan_reserved -= plan.size
            self._raw_releases += 1

    # -- maintenance ------------------------------------------------------------------------------------------------
    def trim(self) -> int:
        """Release all cached free memory (empty pages, cached large buffers, an idle dry-run plan buffer).

        Returns the number of bytes released.
        """
        with self._lock:
            if self._pending:
                self._drain()
            return self._trim_locked()

    def _trim_locked(self) -> int:
        before = self._reserved
        for cls, lst in self._free_large.items():
            for buf in lst:
                _release_buffer(buf)
                self._large_reserved -= cls
                self._raw_releases += 1
        self._free_large.clear()
        for page in [p for p in self._pages if p.live == 0]:
            self._release_page(page)
        for plan in [*self._old_plans, *([self._plan] if self._plan is not None else [])]:
            if not plan.live_offs:
                self._drop_plan(plan)
        self._trims += 1
        return before - self._reserved

    def drop_plan(self) -> None:
        """Stop serving allocations from the last dry run's plan (e.g. before a different workload); its buffer is
        released as soon as none of its blocks is live."""
        with self._lock:
            if self._pending:
                self._drain()
            plan = self._plan
            if plan is not None:
                self._plan = None
                if plan.live_offs:
                    self._old_plans.append(plan)
                else:
                    self._drop_plan(plan)

    def reset_peak(self) -> None:
        """Start peak tracking afresh from the current in-use and reserved bytes."""
        with self._lock:
            if self._pending:
                self._drain()
            self._peak = self._in_use
            self._peak_held = self._held
            self._peak_reserved = self._reserved

    def report(self) -> dict[str, Any]:
        """Memory statistics in bytes and counts.

        ``in_use`` (requested bytes of live blocks), ``reserved`` (bytes of raw buffers held), ``peak`` (peak
        ``in_use``), ``peak_reserved``, ``held`` (live blocks rounded to their classes), ``cached`` (``reserved -
        held``), ``allocations``, ``reuses`` (served without creating a buffer), ``raw_allocations`` /
        ``raw_releases`` (device buffers created / released), ``small_*`` / ``large_*`` / ``plan_*`` splits (the
        plan arena of the last dry run), ``live_blocks``, ``pages``.
        """
        with self._lock:
            if self._pending:
                self._drain()
            reserved = self._reserved
            plan_in_use = sum(p.in_use for p in self._old_plans) + (self._plan.in_use if self._plan else 0)
            return {
                "allocator": "ember-opencl pool",
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
                "small_reserved": self._small_reserved,
                "pages": len(self._pages),
                "large_allocations": self._allocs - self._small_allocs - self._plan_allocs,
                "large_in_use": self._in_use - self._small_in_use - plan_in_use,
                "large_reserved": self._large_reserved,
                "large_cached_buffers": sum(len(v) for v in self._free_large.values()),
                "plan_allocations": self._plan_allocs,
                "plan_in_use": plan_in_use,
                "plan_reserved": self._plan_reserved,
                "plan_slots": sum(o >= 0 for o in self._plan.offsets) if self._plan is not None else 0,
                "plan_live_blocks": len(self._plan.live_offs) if self._plan is not None else 0,
                "reserved_over_peak": reserved / self._peak if self._peak else None,
            }

    # -- dry run ----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def dry_run(self) -> Iterator[dict[str, Any]]:
        """Record one iteration of a workload and plan the pools for repeating it.

        Wrap exactly one iteration (e.g. one training step), preferably a steady-state one after a warm-up
        iteration, so that blocks one iteration hands to the next (gradients, the loss) are matched to the
        allocation that makes them. On a normal exit the recorded allocations get offsets in one plan buffer (see
        the module docstring), that buffer is reserved and every other cached buffer released; later iterations
        that allocate the same sizes in the same order are served from it without creating buffers. The yielded
        dict is filled on exit: ``sizes`` ({request bytes: peak number live at once}), ``allocations``, ``frees``,
        ``carried`` (blocks handed to the next iteration), ``kept`` (blocks made once and kept, not planned),
        ``peak_in_use``, ``per_size_bytes`` (what keeping the peak count of every size apart would reserve),
        ``plan_bytes`` (the plan buffer) and ``reserved``. If the body raises, the statistics are filled but the
        pools are left as they are.
        """
        stats: dict[str, Any] = {}
        with self._lock:
            if self._pending:
                self._drain()
            if self._rec is not None:
                raise ValueRangeError(f"{self.label}: MemoryPool.dry_run() is already active (dry runs do not nest)")
            rec = self._rec = _Recorder(self._in_use)
        ok = False
        try:
            yield stats
            ok = True
        finally:
            with self._lock:
                if self._pending:
                    self._drain()
                self._rec = None
                lifetimes, carried = rec.lifetimes()
                per_size: dict[int, int] = {}
                for size in rec.size_peak:
                    a = (size + ALIGN - 1) & -ALIGN or ALIGN
                    per_size[a] = per_size.get(a, 0) + rec.size_peak[size]
                stats.update(
                    sizes=dict(sorted(rec.size_peak.items())),
                    allocations=len(rec.sizes),
                    frees=rec.t - len(rec.sizes),
                    carried=carried,
                    kept=sum(1 for lt in lifetimes if not lt),
                    peak_in_use=rec.peak_in_use,
                    per_size_bytes=sum(a * p for a, p in per_size.items()),
                )
                if ok:
                    stats["plan_bytes"] = self._make_plan(rec.sizes, lifetimes)
                stats["reserved"] = self._reserved

    def _make_plan(self, sizes: list[int], lifetimes: list[list[tuple[int, int]]]) -> int:
        """Replace the plan by one for this trace and release all other cached memory; returns the plan's size."""
        old = self._plan
        self._plan = None
        if old is not None:
            if old.live_offs:
                self._old_plans.append(old)  # released once its blocks are freed
            else:
                self._drop_plan(old)
        self._trim_locked()  # the plan replaces whatever the pools cached
        self._trims -= 1  # not a user-visible trim
        if not sizes:
            return 0
        limit = self.capacity - self._reserved
        if self.max_alloc is not None:
            limit = min(limit, self.max_alloc)
        offsets, total = _place(sizes, lifetimes, limit)  # what does not fit is served by the pools
        if total <= 0:
            return 0
        try:
            buf = self._raw(total, total)
        except OutOfMemoryError:
            return 0  # a plan is an optimization: go without
        self._plan_reserved += total
        self._plan = _Plan(buf, total, sizes, offsets)
        return total

    def __repr__(self) -> str:
        return f"MemoryPool({self.label}, in use {human_bytes(self._in_use)}, reserved {human_bytes(self._reserved)})"


__all__ = ["ALIGN", "PAGE_SIZE", "SMALL_MAX", "Block", "MemoryPool", "human_bytes", "size_class"]
