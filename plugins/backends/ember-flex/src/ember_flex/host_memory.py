"""Keep freed host memory for the next step instead of handing it back to the system.

glibc's malloc serves a large request (an activation, an im2col buffer) with a fresh ``mmap`` and unmaps it on free;
its dynamic threshold stops at 32 MiB, and memory freed at the top of the heap goes back once it passes twice that.
A training step that allocates the same arrays every step then faults every page of them in again: the seed CNN's
step at batch 64 took ~3,000-3,800 minor page faults and 15-20 ms of kernel time per step, 10-15 % of the step.
Raising both thresholds makes malloc behave like a caching allocator (the reason PyTorch's CPU tuning guide
recommends jemalloc or tcmalloc): the second step reuses the first step's pages, and faults drop to ~0.

This is process-wide (it is malloc's setting, not flex's), done once when the first flex backend is created, only on
glibc, and only when the user has not tuned malloc themselves (``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``
set, or another allocator preloaded). ``EMBER_FLEX_HOST_CACHE=0`` leaves malloc as it is. Memory stays with the
process after a peak; :func:`release_free_memory` (glibc's ``malloc_trim``) hands the free part back.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

#: arrays up to this size come from malloc's heap (kept and reused after free) rather than a fresh mmap
MMAP_THRESHOLD = 1 << 30
#: free memory at the heap's top is kept up to this much instead of being returned on every free
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)
_USER_TUNING = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "LD_PRELOAD")

_lock = threading.Lock()
_state: dict[str, Any] = {"decided": False, "active": False, "reason": "not yet decided"}


def _glibc() -> Any | None:
    """The process's C library when it is glibc (mallopt and malloc_trim with glibc's meaning), else None."""
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    return libc if version() else None


def keep_freed_memory() -> bool:
    """Raise glibc malloc's mmap and trim thresholds once per process (see the module docstring); return whether
    the host cache is on. Thread-safe and idempotent."""
    with _lock:
        if _state["decided"]:
            return bool(_state["active"])
        _state["decided"] = True
        if os.environ.get("EMBER_FLEX_HOST_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
            _state["reason"] = "off (EMBER_FLEX_HOST_CACHE=0)"
            return False
        tuned = [name for name in _USER_TUNING if os.environ.get(name)]
        if tuned:
            _state["reason"] = f"off (the user tunes malloc: {', '.join(tuned)} set)"
            return False
        libc = _glibc()
        if libc is None:
            _state["reason"] = "off (the C library is not glibc)"
            return False
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                    TRIM_THRESHOLD) == 1
        _state["active"] = ok
        _state["reason"] = "on" if ok else "off (mallopt refused the thresholds)"
        return ok


def release_free_memory() -> bool:
    """Hand the allocator's free memory back to the system (glibc's ``malloc_trim(0)``); False where that is not
    available. Live arrays are untouched."""
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def describe() -> str:
    """One line for ``memory_report``: whether freed host memory is kept for reuse, and why not."""
    with _lock:
        return f"host cache {_state['reason']}"
