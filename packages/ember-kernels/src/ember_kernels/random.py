"""Philox4x32-10 draw kernels (uniform, normal, integers, raw), moved from ember-opencl so every backend emits the
same streams: element ``e`` of a call depends only on the seed, the call offset and ``e`` (see
:mod:`ember_opencl.random` for the counter layout). Sources are in the shared vocabulary (:mod:`.dialect`)."""

from __future__ import annotations

from ember import dtypes as dt
from ember.dtypes import DType

from .ctypes_ import ctype, header

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
