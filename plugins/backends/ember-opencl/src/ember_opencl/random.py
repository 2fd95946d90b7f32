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

from .array import CLArray, empty
from .ctypes_ import ctype, header

MASK64 = (1 << 64) - 1

_PHILOX = """
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
static inline uint4 ember_philox(uint4 c, uint k0, uint k1) {
    for (int r = 0; r < 10; ++r) {
        uint hi0 = mul_hi(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
        uint hi1 = mul_hi(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
        c = (uint4)(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return c;
}
"""

def _body(kind: str, d: DType) -> tuple[int, str]:
    """(elements per block, OpenCL statements) of a kind of draw into dtype d."""
    t = ctype(d)

    def store(i: str, v: str) -> str:
        return t.store("out", f"out_off + {i}", v) + ";"

    if kind == "raw":
        return 4, "".join(f"if (e + {i} < n) out[out_off + e + {i}] = (int)w.s{i};" for i in range(4))
    if kind == "uniform":
        if d is dt.float64:
            # 53 random bits: (hi:lo >> 11) * 2**-53 lies in [0, 1 - 2**-53]
            vals = [f"(double)((((ulong)w.s{2 * i} << 32) | w.s{2 * i + 1}) >> 11) * 0x1.0p-53" for i in range(2)]
            return 2, "".join(f"if (e + {i} < n) {{ {store(f'e + {i}', v)} }}" for i, v in enumerate(vals))
        # as many bits as the dtype's significand holds, so rounding to it can never reach 1.0
        digits = {dt.float32: 24, dt.float16: 11, dt.bfloat16: 8}[d]
        scale = f"0x1.0p-{digits}f"
        vals = [f"(float)(w.s{i} >> {32 - digits}) * {scale}" for i in range(4)]
        return 4, "".join(f"if (e + {i} < n) {{ {store(f'e + {i}', v)} }}" for i, v in enumerate(vals))
    if kind == "normal":
        if d is dt.float64:
            # two 53-bit uniforms; u1 in (0, 1] keeps log() finite
            body = ("double u1 = (double)(((((ulong)w.s0 << 32) | w.s1) >> 11) + 1) * 0x1.0p-53;"
                    "double u2 = (double)((((ulong)w.s2 << 32) | w.s3) >> 11) * 0x1.0p-53;"
                    "double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;"
                    f"if (e < n) {{ {store('e', 'r * cos(th)')} }}"
                    f"if (e + 1 < n) {{ {store('e + 1', 'r * sin(th)')} }}")
            return 2, body
        parts = []
        for p in range(2):
            a, b = 2 * p, 2 * p + 1
            parts.append(
                f"{{ float u1 = (float)((w.s{a} >> 8) + 1u) * 0x1.0p-24f;"
                f" float u2 = (float)(w.s{b} >> 8) * 0x1.0p-24f;"
                " float r = sqrt(-2.0f * log(u1)), th = 6.2831853f * u2;"
                f" if (e + {a} < n) {{ {store(f'e + {a}', 'r * cos(th)')} }}"
                f" if (e + {b} < n) {{ {store(f'e + {b}', 'r * sin(th)')} }} }}")
        return 4, "".join(parts)
    if kind == "integers":
        conv = "(float)v" if d.is_floating_point and d is not dt.float64 else "v"
        vals = [f"(low + (long)mul_hi(((ulong)w.s{2 * i} << 32) | w.s{2 * i + 1}, range))" for i in range(2)]
        return 2, "".join(f"if (e + {i} < n) {{ long v = {v}; {store(f'e + {i}', conv)} }}"
                          for i, v in enumerate(vals))
    raise KeyError(kind)


_sources: dict[tuple[str, DType], tuple[str, int]] = {}


def _source(kind: str, d: DType) -> tuple[str, int]:
    """(program source, elements per block) of one kind of draw into dtype d (memoised)."""
    key = (kind, d)
    got = _sources.get(key)
    if got is None:
        per, body = _body(kind, d)
        storage = "int" if kind == "raw" else ctype(d).storage
        src = (header(ctype(d)) + _PHILOX
               + f"__kernel void ember_philox_{kind}(__global {storage}* out, long out_off, long n, long nblocks,"
               " uint k0, uint k1, uint o0, uint o1, long low, ulong range) {\n"
               "    for (long b = get_global_id(0); b < nblocks; b += get_global_size(0)) {\n"
               "        uint4 w = ember_philox((uint4)((uint)b, (uint)(b >> 32), o0, o1), k0, k1);\n"
               f"        long e = b * {per};\n"
               f"        {body}\n"
               "    }\n}\n")
        got = _sources[key] = (src, per)
    return got


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
