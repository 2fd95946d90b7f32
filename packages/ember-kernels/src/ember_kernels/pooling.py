"""Pooling and interpolation kernel generators (moved from ember-opencl): one program per (dtype, fp64, index
width, CPU or GPU loop) holding max/avg pooling (fixed and adaptive windows), the index-returning max and the
linear/cubic interpolation kernels. Every input is seen as (batch0, batch1, D, H, W) through element strides.
Sources are in the shared vocabulary (:mod:`.dialect`).
"""

from __future__ import annotations

from typing import Any

from ember import dtypes as dt
from ember.dtypes import DType

from .ctypes_ import CType, ctype, float_literals, header

_COMMON_ARGS = ("__global const {S}* x, long x_off, long n, long L1, long sb0, long sb1, "
                "long I0, long I1, long I2, long sx0, long sx1, long sx2, long O0, long O1, long O2")



# output index i -> spatial output coordinates and the element offset of its (batch0, batch1) plane in x; IX is
# uint below 2**31 outputs (64-bit division is emulated, and slow, on GPUs), long above
_DECOMPOSE = """
        {IX} r = ({IX})i;
        {IX} o2 = r % ({IX})O2; r /= ({IX})O2;
        {IX} o1 = r % ({IX})O1; r /= ({IX})O1;
        {IX} o0 = r % ({IX})O0; r /= ({IX})O0;
        long base = x_off + (long)(r / ({IX})L1) * sb0 + (long)(r % ({IX})L1) * sb1;"""



# GPUs: a grid-stride loop, neighbouring work-items on neighbouring outputs, each index split into coordinates
_GPU_LOOP = "for (long i = get_global_id(0); i < n; i += get_global_size(0)) {{" + _DECOMPOSE



# CPUs: a contiguous run of outputs per work-item, coordinates split once and then carried like an odometer (a
# division per element and dim, and the grid stride's scattered accesses, dominate on PoCL)
_CPU_LOOP = """const long chunk_ = (n + get_global_size(0) - 1) / get_global_size(0);
    const long start_ = get_global_id(0) * chunk_;
    if (start_ >= n) return;
    const long end_ = min(start_ + chunk_, n);
    {IX} r = ({IX})start_;
    {IX} o2 = r % ({IX})O2; r /= ({IX})O2;
    {IX} o1 = r % ({IX})O1; r /= ({IX})O1;
    {IX} o0 = r % ({IX})O0; r /= ({IX})O0;
    {IX} q1 = r % ({IX})L1;
    long base = x_off + (long)(r / ({IX})L1) * sb0 + (long)q1 * sb1;
    for (long i = start_; i < end_; ++i) {{"""



_CPU_NEXT = """
        if (++o2 == ({IX})O2) {{ o2 = 0; if (++o1 == ({IX})O1) {{ o1 = 0; if (++o0 == ({IX})O0) {{ o0 = 0;
            if (++q1 == ({IX})L1) {{ q1 = 0; base += sb0 - (L1 - 1) * sb1; }} else base += sb1; }} }} }}
    """



_TEMPLATE = """
#pragma OPENCL FP_CONTRACT OFF

/* a pooling window along one dim: [s, e) stepping by d; torch skips the left padding in steps of the dilation */
static inline void ember_pool_window(long o, long I, long O, long k, long st, long p, long d, int adaptive,
                              long* s, long* e) {{
    if (adaptive) {{
        *s = (o * I) / O;
        *e = ((o + 1) * I + O - 1) / O;
    }} else {{
        long a = o * st - p;
        *e = min(a + (k - 1) * d + 1, I);
        if (a < 0) a += ((-a + d - 1) / d) * d;
        *s = a;
    }}
}}

/* an averaging window: the clamped [s, e) and the divisor's extent (padding counted up to I + p) */
static inline void ember_avg_window(long o, long I, long O, long k, long st, long p, int adaptive,
                             long* s, long* e, long* size) {{
    if (adaptive) {{
        *s = (o * I) / O;
        *e = ((o + 1) * I + O - 1) / O;
        *size = *e - *s;
    }} else {{
        long a = o * st - p;
        long b = min(a + k, I + p);
        *size = b - a;
        *s = max(a, 0L);
        *e = min(b, I);
    }}
}}

__kernel void ember_max_pool(__global {S}* out, long out_off, __global long* idx, long idx_off, int want_idx,
                             int adaptive, {ARGS},
                             long k0, long k1, long k2, long st0, long st1, long st2,
                             long p0, long p1, long p2, long d0, long d1, long d2) {{
    {LOOP}
        long s0, e0, s1, e1, s2, e2;
        ember_pool_window(o0, I0, O0, k0, st0, p0, d0, adaptive, &s0, &e0);
        ember_pool_window(o1, I1, O1, k1, st1, p1, d1, adaptive, &s1, &e1);
        ember_pool_window(o2, I2, O2, k2, st2, p2, d2, adaptive, &s2, &e2);
        {T} best = {LOWEST};
        long bi = (s0 * I1 + s1) * I2 + s2;
        for (long a = s0; a < e0; a += d0) {{
            long ra = base + a * sx0;
            for (long b = s1; b < e1; b += d1) {{
                long rb = ra + b * sx1;
                for (long c = s2; c < e2; c += d2) {{
                    {T} v = {LOAD_V};
                    if (v > best{NAN_WINS}) {{
                        best = v;
                        bi = (a * I1 + b) * I2 + c;
                    }}
                }}
            }}
        }}
        {STORE_BEST};
        if (want_idx) idx[idx_off + i] = bi;
    {NEXT}}}
}}

__kernel void ember_avg_pool(__global {S}* out, long out_off, int adaptive, {ARGS},
                             long k0, long k1, long k2, long st0, long st1, long st2,
                             long p0, long p1, long p2, int count_include_pad, long divisor) {{
    {LOOP}
        long s0, e0, n0, s1, e1, n1, s2, e2, n2;
        ember_avg_window(o0, I0, O0, k0, st0, p0, adaptive, &s0, &e0, &n0);
        ember_avg_window(o1, I1, O1, k1, st1, p1, adaptive, &s1, &e1, &n1);
        ember_avg_window(o2, I2, O2, k2, st2, p2, adaptive, &s2, &e2, &n2);
        {A} acc = 0;
        for (long a = s0; a < e0; ++a) {{
            long ra = base + a * sx0;
            for (long b = s1; b < e1; ++b) {{
                long rb = ra + b * sx1;
                for (long c = s2; c < e2; ++c) acc += ({A}){LOAD_C};
            }}
        }}
        {A} res;
        if (adaptive) {{
            res = acc / ({A})n0 / ({A})n1 / ({A})n2;  /* torch: sum / kd / kh / kw */
        }} else if (s0 >= e0 || s1 >= e1 || s2 >= e2) {{
            res = 0;
        }} else {{
            long div = divisor > 0 ? divisor
                     : (count_include_pad ? n0 * n1 * n2 : (e0 - s0) * (e1 - s1) * (e2 - s2));
            res = acc / ({A})div;
        }}
        {STORE_RES};
    {NEXT}}}
}}

/* nearest source index along one dim; code 0 copies, 2 halves (torch's short-cuts), 1 scales in float32 */
static inline long ember_nearest_index(long o, long I, float scale, int code, int exact) {{
    if (code == 0) return o;
    if (code == 2) return o >> 1;
    long src;
    if (exact) src = (long)floor((float)((({R})o + ({R})0.5) * ({R})scale));
    else src = (long)floor((float)o * scale);
    return min(src, I - 1);
}}

__kernel void ember_nearest(__global {S}* out, long out_off, {ARGS}, float sc0, float sc1, float sc2,
                            int code0, int code1, int code2, int exact) {{
    {LOOP}
        long src = base + ember_nearest_index(o0, I0, sc0, code0, exact) * sx0
                        + ember_nearest_index(o1, I1, sc1, code1, exact) * sx1
                        + ember_nearest_index(o2, I2, sc2, code2, exact) * sx2;
        {COPY};
    {NEXT}}}
}}

"""



# linear (TAPS 2) and cubic (TAPS 4) resampling: constant tap counts unroll and keep the tables in registers; a
# copied dim (code 0) or a padded rank uses one tap
_INTERP_TEMPLATE = """
/* the taps (indices, weights) of one dim as torch's area_pixel_compute_source_index + guard_index_and_lambda
   (+ get_cubic_upsample_coefficients); returns how many are used */
static inline int ember_taps_{NAME}(long o, long I, {A} scale, int code, int align_corners, long* ix, {A}* w) {{
    if (code == 0) {{
        ix[0] = o;
        w[0] = 1;
        return 1;
    }}
    {A} src;
    if (align_corners) {{
        src = scale * ({A})o;
    }} else {{
        src = fma(scale, ({A})o + ({A})0.5, ({A})-0.5);
        if ({TAPS} == 2 && src < 0) src = 0;
    }}
    long i0 = min((long)floor((float)src), I - 1);
    {A} lam = src - ({A})i0;
    lam = lam < 0 ? ({A})0 : (lam > 1 ? ({A})1 : lam);
#if {TAPS} == 2
    ix[0] = i0;
    ix[1] = i0 < I - 1 ? i0 + 1 : i0;
    w[0] = ({A})1 - lam;
    w[1] = lam;
#else
    const {A} A = ({A})-0.75;
    {A} t = lam + ({A})1;
    w[0] = ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
    t = lam;
    w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
    t = ({A})1 - lam;
    w[2] = ((A + 2) * t - (A + 3)) * t * t + 1;
    t = ({A})2 - lam;
    w[3] = ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
    for (int j = 0; j < 4; ++j) ix[j] = clamp(i0 - 1 + j, 0L, I - 1);
#endif
    return {TAPS};
}}

__kernel void ember_interp_{NAME}(__global {S}* out, long out_off, {ARGS}, {A} sc0, {A} sc1, {A} sc2,
                                  int code0, int code1, int code2, int align_corners) {{
    {LOOP}
        long ix0[{TAPS}], ix1[{TAPS}], ix2[{TAPS}];
        {A} w0[{TAPS}], w1[{TAPS}], w2[{TAPS}];
        int t0 = ember_taps_{NAME}(o0, I0, sc0, code0, align_corners, ix0, w0);
        int t1 = ember_taps_{NAME}(o1, I1, sc1, code1, align_corners, ix1, w1);
        int t2 = ember_taps_{NAME}(o2, I2, sc2, code2, align_corners, ix2, w2);
        {A} acc = 0;
        for (int a = 0; a < {TAPS}; ++a) {{
            if (a >= t0) break;
            long ra = base + ix0[a] * sx0;
            {A} acc1 = 0;
            for (int b = 0; b < {TAPS}; ++b) {{
                if (b >= t1) break;
                long rb = ra + ix1[b] * sx1;
                {A} acc2 = 0;
                for (int c = 0; c < {TAPS}; ++c) {{
                    if (c >= t2) break;
                    acc2 += w2[c] * ({A}){LOAD_I};
                }}
                acc1 += w1[b] * acc2;
            }}
            acc += w0[a] * acc1;
        }}
        {STORE_ACC};
    {NEXT}}}
}}
"""



_LOWEST = {dt.bool_: "0", dt.uint8: "0", dt.int8: "(-128)", dt.int16: "(-32768)", dt.int32: "(-2147483647 - 1)",
           dt.int64: "(-9223372036854775807L - 1)"}



_programs: dict[tuple[Any, ...], str] = {}



def _acc_ctype(t: CType, fp64: bool) -> CType:
    """The type sums and weights live in: the float compute type, else double (float without fp64) for ints."""
    if t.is_float:
        return t
    return ctype(dt.float64 if fp64 else dt.float32)



def _program(dtype: DType, fp64: bool, wide: bool, cpu: bool = False) -> str:
    """The program of the five kernels for dtype (memoised: generating it costs more than a launch)."""
    key = (dtype, fp64, wide, cpu)
    src = _programs.get(key)
    if src is None:
        t = ctype(dtype)
        a = _acc_ctype(t, fp64)
        types = [t, a] + ([ctype(dt.float64)] if fp64 else [])
        common = dict(S=t.storage, A=a.compute, ARGS=_COMMON_ARGS.format(S=t.storage),
                      LOOP=(_CPU_LOOP if cpu else _GPU_LOOP).format(IX="long" if wide else "uint"),
                      NEXT=_CPU_NEXT.format(IX="long" if wide else "uint") if cpu else "",
                      LOAD_I=t.load("x", "rb + ix2[c] * sx2"), STORE_ACC=t.store("out", "out_off + i", "acc"))
        src = header(*types) + _TEMPLATE.format(
            T=t.compute, R="double" if fp64 else "float", **common,
            LOWEST=f"(({t.compute})-INFINITY)" if t.is_float else _LOWEST[dtype],
            NAN_WINS=" || isnan(v)" if t.is_float else "",
            LOAD_V=t.load("x", "rb + c * sx2"), LOAD_C=t.load("x", "rb + c * sx2"),
            STORE_BEST=t.store("out", "out_off + i", "best"), STORE_RES=t.store("out", "out_off + i", "res"),
            COPY=t.store("out", "out_off + i", t.load("x", "src")))
        src += "".join(_INTERP_TEMPLATE.format(NAME=name, TAPS=taps, **common)
                       for name, taps in (("linear", 2), ("cubic", 4)))
        _programs[key] = src = float_literals(src)
    return src
