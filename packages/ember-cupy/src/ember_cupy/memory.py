"""``memory_dry_run()`` on CuPy: record one iteration's allocations through CuPy's memory hooks, then size the pool.

CuPy's :class:`cupy.cuda.MemoryPool` already reuses freed blocks by size (512-byte bins, best fit with splitting),
so what a plan adds is *reservation*: after the recorded iteration every cached block is released
(``free_all_blocks``: memory earlier, different workloads left behind) and, for every request size, as many blocks as
were live at once are allocated and handed back, so the next iterations find them cached and make no
``cudaMalloc``/``hipMalloc`` calls (and cannot fail for fragmentation the warm-up did not see). Hooks are
thread-local in CuPy: allocations made by other threads during the dry run are not recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ember.errors import ValueRangeError


@contextlib.contextmanager
def dry_run(be: Any) -> Iterator[dict[str, Any]]:
    """Record the allocations of the body on ``be``'s device; the yielded dict is filled on exit with ember-opencl's
    fields: ``sizes`` ({request bytes: peak number live at once}), ``allocations``, ``frees``, ``carried`` (blocks
    allocated inside and still live at the end: handed to the next iteration), ``kept`` (the same blocks: CuPy
    cannot tell a block kept for good from one handed on), ``peak_in_use`` (pool bytes in use at the peak,
    including what was live before), ``per_size_bytes`` (the peak count of every size kept apart), ``plan_bytes``
    (what the plan reserved; only after a normal exit) and ``reserved`` (the pool's bytes afterwards). If the body
    raises, the statistics are filled and the pool is left as it is."""
    cp = be.cp
    if be._dry_run_active:
        raise ValueRangeError(f"{be.describe()}: memory_dry_run() is already active (dry runs do not nest)")
    pool = be.pool
    live: dict[int, int] = {}  # pointer -> request size, for blocks allocated inside
    size_live: dict[int, int] = {}
    size_peak: dict[int, int] = {}
    counts = {"allocations": 0, "frees": 0, "bytes": 0, "peak": 0}
    base = int(pool.used_bytes())
    device = be.index

    class Recorder(cp.cuda.MemoryHook):  # type: ignore[misc,name-defined]
        name = "ember-memory-dry-run"

        def malloc_postprocess(self, device_id: int, size: int, mem_size: int, mem_ptr: int, pmem_id: int) -> None:
            if device_id != device or not mem_ptr:  # another device, or a failed malloc
                return
            live[mem_ptr] = size
            counts["allocations"] += 1
            counts["bytes"] += mem_size
            counts["peak"] = max(counts["peak"], counts["bytes"])
            size_live[size] = n = size_live.get(size, 0) + 1
            size_peak[size] = max(size_peak.get(size, 0), n)

        def free_postprocess(self, device_id: int, mem_size: int, mem_ptr: int, pmem_id: int) -> None:
            size = live.pop(mem_ptr, None) if device_id == device else None
            if size is None:
                return  # a block from before the dry run
            counts["frees"] += 1
            counts["bytes"] -= mem_size
            size_live[size] -= 1

    stats: dict[str, Any] = {}
    be._dry_run_active = True
    ok = False
    try:
        with Recorder():
            yield stats
            be.sync()  # the body's kernels have run before the trace is read
        ok = True
    finally:
        be._dry_run_active = False
        stats.update(sizes=dict(sorted(size_peak.items())), allocations=counts["allocations"],
                     frees=counts["frees"], carried=len(live), kept=len(live), peak_in_use=base + counts["peak"],
                     per_size_bytes=sum(s * n for s, n in size_peak.items()))
        if ok:
            stats["plan_bytes"] = _reserve(be, size_peak)
        stats["reserved"] = int(pool.total_bytes())


def _reserve(be: Any, size_peak: dict[int, int]) -> int:
    """Release the pool's cached blocks, then allocate and hand back the peak count of every size; returns the
    bytes so reserved."""
    pool = be.pool
    with be._on():
        pool.free_all_blocks()
        held = [pool.malloc(size) for size, n in size_peak.items() for _ in range(n) if size]
        total = sum(int(p.mem.size) for p in held)
        del held  # back to the pool's free lists: cached for the next iteration
    return total
