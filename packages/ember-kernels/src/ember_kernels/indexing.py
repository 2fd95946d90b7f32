"""Indexing kernel generators (moved from ember-opencl): the advanced-index move template (get / put / atomic
add and multiply through compare-and-swap loops on 32- or 64-bit words), the deterministic scatter-reduce loop,
boolean-mask counting and coordinates, and pad (constant / replicate / circular / reflect). Element moves copy
raw storage words, so one kernel serves every dtype of a width. Sources are in the shared vocabulary.
"""

from __future__ import annotations

from typing import Any

from ember import dtypes as dt

from .ctypes_ import CType, header

_WORD = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong", 16: "ulong2"}  # 16: complex128 (OpenCL only)



_INT64_ATOMICS = "#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable\n"



def _decode(t: CType, bits: str) -> str:
    """A compute value of t from its storage bits held in a uint/ulong."""
    d = t.dtype
    if d is dt.float16:
        return f"ember_h2f((ushort){bits})"
    if d is dt.bfloat16:
        return f"ember_bf16_load((ushort){bits})"
    return {dt.bool_: f"(uchar){bits}", dt.uint8: f"(uchar){bits}", dt.int8: f"as_char((uchar){bits})",
            dt.int16: f"as_short((ushort){bits})", dt.int32: f"as_int({bits})", dt.int64: f"as_long({bits})",
            dt.float32: f"as_float({bits})", dt.float64: f"as_double({bits})"}[d]



def _encode(t: CType, value: str) -> str:
    """The storage bits (uint, ulong for 64-bit) of a compute value of t."""
    d = t.dtype
    if d is dt.float16:
        return f"(uint)ember_f2h({value})"
    if d is dt.bfloat16:
        return f"(uint)ember_bf16_store({value})"
    return {dt.bool_: f"(uint)(({value}) != 0)", dt.uint8: f"(uint)(uchar)({value})",
            dt.int8: f"(uint)as_uchar((char)({value}))", dt.int16: f"(uint)as_ushort((short)({value}))",
            dt.int32: f"as_uint((int)({value}))", dt.int64: f"as_ulong((long)({value}))",
            dt.float32: f"as_uint((float)({value}))", dt.float64: f"as_ulong((double)({value}))"}[d]



_HALF_HELPERS = """
static inline float ember_h2f(ushort u) { return vload_half(0, (const __private half*)&u); }
static inline ushort ember_f2h(float f) { ushort u; vstore_half_rte(f, 0, (__private half*)&u); return u; }
"""



def _atomic_fn(t: CType, op: str, big_endian: bool) -> str:
    """ember_atomic(p, idx, v): p[idx] = p[idx] (op) v as one compare-and-swap loop."""
    sym = "+" if op == "add" else "*"
    size = t.dtype.itemsize
    T, S = t.compute, t.storage
    head = f"static inline void ember_atomic(__global {S}* p, long idx, {T} v) {{\n"
    # byte arithmetic: pointer arithmetic on half* needs cl_khr_fp16 on some compilers
    addr = f"((__global uchar*)p + idx * {size})"
    if size == 8:
        return (head + f"    volatile __global ulong* w = (volatile __global ulong*){addr};\n"
                "    ulong old = *w, seen;\n"
                f"    do {{ seen = old; {T} nv = {_decode(t, 'seen')} {sym} v;\n"
                f"         old = atom_cmpxchg(w, seen, {_encode(t, 'nv')}); }} while (old != seen);\n}}\n")
    if size == 4:
        return (head + f"    volatile __global uint* w = (volatile __global uint*){addr};\n"
                "    uint old = *w, seen;\n"
                f"    do {{ seen = old; {T} nv = {_decode(t, 'seen')} {sym} v;\n"
                f"         old = atomic_cmpxchg(w, seen, {_encode(t, 'nv')}); }} while (old != seen);\n}}\n")
    # 8/16-bit: CAS on the aligned 32-bit word holding the element, changing only its bytes
    mask = "0xffu" if size == 1 else "0xffffu"
    pos = f"({4 - size}u - lane)" if big_endian else "lane"
    return (head + f"    __global uchar* bp = {addr};\n"
            "    uint lane = (uint)((size_t)bp & 3);\n"
            "    volatile __global uint* w = (volatile __global uint*)(bp - lane);\n"
            f"    uint sh = {pos} * 8u, m = {mask} << sh;\n"
            "    uint old = *w, seen;\n"
            f"    do {{ seen = old; uint bits = (seen >> sh) & {mask};\n"
            f"         {T} nv = {_decode(t, 'bits')} {sym} v;\n"
            f"         uint nb = ({_encode(t, 'nv')}) & {mask};\n"
            "         old = atomic_cmpxchg(w, seen, (seen & ~m) | (nb << sh)); } while (old != seen);\n}\n")



def _adv_source(mode: str, tkey: Any, ndim: int, nk: int, big_endian: bool) -> str:
    """mode 'get': a[..] = b[computed]; 'put': b[computed] = a[..]; 'add'/'mul': b[computed] op= a[..]."""
    if mode in ("get", "put"):
        S = _WORD[tkey]
        pre = ""
    else:
        t: CType = tkey
        S = t.storage
        pre = (header(t) + (_INT64_ATOMICS if t.dtype.itemsize == 8 else "")
               + (_HALF_HELPERS if t.dtype is dt.float16 else "") + _atomic_fn(t, mode, big_endian))
    a_const = "const " if mode != "get" else ""
    b_const = "const " if mode == "get" else ""
    params = [f"__global {a_const}{S}* a", "long a_off", f"__global {b_const}{S}* b", "long b_off"]
    for k in range(nk):
        params += [f"__global const long* x{k}", f"long x{k}_off", f"long vs{k}", f"long vn{k}"]
    params.append("long n")
    for d in range(ndim):
        params += [f"long n{d}", f"long sa{d}", f"long sb{d}"] + [f"long sx{k}_{d}" for k in range(nk)]
    body = ["for (long i = get_global_id(0); i < n; i += get_global_size(0)) {",
            "    long r = i, oa = a_off, ob = b_off;" + "".join(f" long ox{k} = x{k}_off;" for k in range(nk))]
    for d in range(ndim - 1, -1, -1):
        body.append(f"    {{ long c = r % n{d}; r /= n{d}; oa += c * sa{d}; ob += c * sb{d};"
                    + "".join(f" ox{k} += c * sx{k}_{d};" for k in range(nk)) + " }")
    for k in range(nk):
        body.append(f"    {{ long v = x{k}[ox{k}]; if (v < 0) v += vn{k}; ob += v * vs{k}; }}")
    if mode == "get":
        body.append("    a[oa] = b[ob];")
    elif mode == "put":
        body.append("    b[ob] = a[oa];")
    else:
        body.append(f"    ember_atomic(b, ob, {tkey.load('a', 'oa')});")
    body.append("}")
    return (pre + f"__kernel void ember_adv({', '.join(params)}) {{\n    " + "\n    ".join(body) + "\n}\n")



_COUNT_SRC = """
__kernel void ember_mask_count(__global const uchar* m, long m_off, long n, long chunk, long nt,
                               __global long* counts, long counts_off) {
    long t = get_global_id(0);
    if (t >= nt) return;
    long lo = t * chunk, hi = min(n, lo + chunk), c = 0;
    for (long i = lo; i < hi; ++i) c += m[m_off + i] != 0;
    counts[counts_off + t] = c;
}
"""



def _coords_source(k: int) -> str:
    params = ", ".join(f"long m{d}" for d in range(k))
    unravel = "".join(f" out[out_off + {d} * total + p] = (r / st{d}) % m{d};" for d in range(k))
    strides = "".join(f" long st{d} = 1{''.join(f' * m{e}' for e in range(d + 1, k))};" for d in range(k))
    return f"""
__kernel void ember_mask_coords(__global const uchar* m, long m_off, long n, long chunk, long nt,
                                __global const long* offs, long offs_off, __global long* out, long out_off,
                                long total{', ' + params if params else ''}) {{
    long t = get_global_id(0);
    if (t >= nt) return;
   {strides}
    long lo = t * chunk, hi = min(n, lo + chunk), p = offs[offs_off + t];
    for (long r = lo; r < hi; ++r) {{
        if (m[m_off + r] == 0) continue;
       {unravel}
        ++p;
    }}
}}
"""



_PAD_MODES = {"constant": 0, "replicate": 1, "circular": 2, "reflect": 3}



def _pad_source(width: int, ndim: int) -> str:
    W = _WORD[width]
    params = [f"__global {W}* out", "long out_off", f"__global const {W}* src", "long src_off", "long n",
              "int mode", f"{W} value"]
    for d in range(ndim):
        params += [f"long on{d}", f"long ss{d}", f"long lo{d}", f"long first{d}", f"long sz{d}"]
    body = ["for (long i = get_global_id(0); i < n; i += get_global_size(0)) {",
            "    long r = i, o = src_off; int outside = 0;"]
    for d in range(ndim - 1, -1, -1):
        body.append(f"    {{ long c = r % on{d}; r /= on{d}; long j = c - lo{d}, sz = sz{d};")
        body.append("      if (mode == 0) { outside |= (j < 0) | (j >= sz); }"
                    " else if (mode == 1) { j = j < 0 ? 0 : (j >= sz ? sz - 1 : j); }"
                    " else if (mode == 2) { j %= sz; if (j < 0) j += sz; }"
                    " else { long m = sz - 1; if (m == 0) j = 0;"
                    " else { j = j < 0 ? -j : j; j %= 2 * m; if (j > m) j = 2 * m - j; } }")
        body.append(f"      o += (j + first{d}) * ss{d}; }}")
    body += ["    out[out_off + i] = outside ? value : src[o];", "}"]
    return f"__kernel void ember_pad({', '.join(params)}) {{\n    " + "\n    ".join(body) + "\n}\n"


def _loop_source(t: CType, op: str, ndim: int) -> str:
    """The deterministic scatter-reduce kernel ``ember_scatter_loop``: each destination loops over the index
    along ``dim`` and combines the matching sources (``op`` "add" or "multiply"; no atomics)."""
    sym = "+" if op == "add" else "*"
    S, T = t.storage, t.compute
    params = [f"__global {S}* out", "long out_off", f"__global const {S}* src", "long src_off",
              "__global const long* idx", "long idx_off", "long n", "long L", "long sd", "long id", "long nd",
              "int dim"]
    params += [f"long n{d}, long so{d}, long ss{d}, long si{d}" for d in range(ndim)]
    body = ["for (long i = get_global_id(0); i < n; i += get_global_size(0)) {",
            "    long r = i, oo = out_off, os = src_off, oi = idx_off, target = 0;"]
    for d in range(ndim - 1, -1, -1):
        body.append(f"    {{ long c = r % n{d}; r /= n{d}; oo += c * so{d}; os += c * ss{d}; oi += c * si{d};"
                    f" if (dim == {d}) target = c; }}")
    body += [f"    {T} acc = {t.load('out', 'oo')};",
             "    for (long j = 0; j < L; ++j) {",
             "        long v = idx[oi + j * id]; if (v < 0) v += nd;",
             f"        if (v == target) acc = acc {sym} {t.load('src', 'os + j * sd')};",
             "    }",
             f"    {t.store('out', 'oo', 'acc')};", "}"]
    return (header(t) + f"__kernel void ember_scatter_loop({', '.join(params)}) {{\n    "
            + "\n    ".join(body) + "\n}\n")
