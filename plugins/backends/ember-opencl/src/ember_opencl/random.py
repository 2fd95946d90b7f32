"""Counter-based random numbers: Philox4x32-10 keyed by the seed, with no state on the device.

Each call (``uniform``, ``normal``, ``integers``, ``raw``) takes the next *call offset* of the host-side stream
and evaluates ``philox4x32_10(counter, key)`` with ``counter = (block, call offset)`` as four 32-bit words
``(block lo, block hi, offset lo, offset hi)`` and ``key = (seed lo, seed hi)``. A block yields four 32-bit words;
element ``e`` of a call reads words of block ``e // per_block`` only, so results depend on the seed, the number of
calls since seeding and the element index, never on work-group sizes or the device. Same seed -> same sequence;
every call gets fresh counters.

Words per element: 1 for float32/float16/bfloat16 uniforms (4 per block), 2 for float64 uniforms (53 bits) and
for integers (a 64-bit draw mapped to the range by a multiply-high, bias below range / 2**64); normals use
Box-Muller on pairs of uniforms, giving 2 normals per pair.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember.errors import DTypeError, ValueRangeError
from ember_kernels.random import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _PHILOX,
    _body,
    _source,
    _sources,
)

from .array import CLArray, empty

MASK64 = (1 << 64) - 1


class Philox:
    """A device's random stream: Philox4x32-10 keyed by the seed; each call advances the host-side call offset."""

    def __init__(self, rt: Any, seed: int) -> None:
        self.rt = rt
        self.key = 0
        self.offset = 0
        self._lock = threading.Lock()  # threads drawing at once must each get their own call offset
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """Restart the stream: key = seed (mod 2**64, so negative seeds work), call offset 0."""
        with self._lock:
            self.key = int(seed) & MASK64
            self.offset = 0

    def _launch(self, kind: str, shape: tuple[int, ...], dtype: DType, low: int = 0, span: int = 0) -> CLArray:
        out = empty(self.rt, shape, dtype)
        with self._lock:
            key, offset = self.key, self.offset
            self.offset = (offset + 1) & MASK64  # a fresh counter range even for empty draws: simple to reason about
        n = out.size
        if n == 0:
            return out
        src, per = _source(kind, dtype)
        kernel = self.rt.kernel(src, f"ember_philox_{kind}")
        nblocks = -(-n // per)
        gsize, lsize = self.rt.grid(nblocks)
        kernel(self.rt.queue, gsize, lsize, out.buf, np.int64(out.eoff), np.int64(n), np.int64(nblocks),
               np.uint32(key & 0xFFFFFFFF), np.uint32(key >> 32),
               np.uint32(offset & 0xFFFFFFFF), np.uint32(offset >> 32), np.int64(low), np.uint64(span))
        return out

    def uniform(self, shape: tuple[int, ...], dtype: DType) -> CLArray:
        """Uniform samples in [0, 1) of a float dtype (never 1.0, also after rounding to 16-bit floats)."""
        if not dtype.is_floating_point:
            raise DTypeError(f"rand: expected a floating point dtype, got {dtype.name}")
        return self._launch("uniform", shape, dtype)

    def normal(self, shape: tuple[int, ...], dtype: DType) -> CLArray:
        """Standard normal samples of a float dtype (Box-Muller; computed in float, or double for float64)."""
        if not dtype.is_floating_point:
            raise DTypeError(f"randn: expected a floating point dtype, got {dtype.name}")
        return self._launch("normal", shape, dtype)

    def integers(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> CLArray:
        """Integers uniform in [low, high), stored as dtype (any integer, bool or float dtype)."""
        span = int(high) - int(low)
        if span <= 0 or span > MASK64 or not -(1 << 63) <= int(low) < (1 << 63):
            raise ValueRangeError(f"randint: unsupported range [{low}, {high}) for dtype {dtype.name}")
        return self._launch("integers", shape, dtype, int(low), span)

    def raw(self, nblocks: int) -> CLArray:
        """The next call's Philox output words as an int32 (nblocks, 4) array (bit patterns; for tests)."""
        return self._launch("raw", (max(0, int(nblocks)), 4), dt.int32)

    def __repr__(self) -> str:
        return f"Philox(key={self.key:#x}, offset={self.offset})"
