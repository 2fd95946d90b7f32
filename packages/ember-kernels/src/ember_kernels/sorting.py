"""Sorting kernel generators (moved from ember-opencl): rows become (key, index) pairs whose unsigned order is
the value order (floats' sign bits flipped, NaN last), sorted by a bitonic network in local memory per tile plus
global merge steps, then gathered back by index. Kernels depend only on the element width, the pair width and the
rank of the collapsed outer dims. Sources are in the shared vocabulary (:mod:`.dialect`).
"""

from __future__ import annotations

from ember import dtypes as dt

# unsigned storage type and key type per element width in bytes
_UTYPE = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}



# float formats: mask of the exponent at infinity (an absolute value above it is NaN)
_FLOAT_INF = {dt.float16: 0x7C00, dt.bfloat16: 0x7F80, dt.float32: 0x7F800000, dt.float64: 0x7FF0000000000000}



def _pair_defs(wide: bool) -> str:
    """Macros of one pair representation: ELEM, LESS, SENT, PACK(key, idx), IDX(e), KEY type K."""
    if wide:
        return ("#define ELEM ulong2\n#define K ulong\n"
                "#define LESS(a, b) ((a).x < (b).x || ((a).x == (b).x && (a).y < (b).y))\n"
                "#define SENT ((ulong2)(~(ulong)0, ~(ulong)0))\n"
                "#define PACK(k, i) ((ulong2)((k), (ulong)(i)))\n#define IDX(e) ((long)(e).y)\n")
    return ("#define ELEM ulong\n#define K uint\n#define LESS(a, b) ((a) < (b))\n#define SENT (~(ulong)0)\n"
            "#define PACK(k, i) ((((ulong)(k)) << 32) | (ulong)(uint)(i))\n#define IDX(e) ((long)(uint)(e))\n")



_NET = """
/* branch-free compare-exchange: random data would mispredict a branch half the time */
static inline void ember_cas(__local ELEM* s, uint i, uint p) {
    ELEM a = s[i], b = s[p];
    int swap = LESS(b, a);
    s[i] = swap ? b : a;
    s[p] = swap ? a : b;
}
/* position of the lower element of compare pair number t at distance j (j a power of two) */
static inline uint ember_lo(uint t, uint j) { return ((t & ~(j - 1u)) << 1) | (t & (j - 1u)); }

/* Sort tiles of `tile` pairs: merge == 0 runs the bitonic stages 2..upto (each upto-chunk ends ascending);
   merge != 0 runs only the steps j = tile/2 .. 1 (finishing a global stage). Writes the first `keep` pairs of
   each tile to dst[group * keep ...]. */
__kernel void ember_sort_local(__global const ELEM* src, long src_off, __global ELEM* dst, long dst_off,
                               long total, uint tile, uint upto, uint keep, int merge, __local ELEM* s) {
    uint lid = get_local_id(0), w = get_local_size(0);
    long base = (long)get_group_id(0) * tile;
    for (uint t = lid; t < tile; t += w) {
        long g = base + t;
        s[t] = g < total ? src[src_off + g] : SENT;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint half_tile = tile >> 1;
    if (merge) {
        for (uint j = half_tile; j > 0; j >>= 1) {
            for (uint t = lid; t < half_tile; t += w) { uint i = ember_lo(t, j); ember_cas(s, i, i + j); }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    } else {
        for (uint k = 2; k <= upto; k <<= 1) {
            for (uint t = lid; t < half_tile; t += w) { uint i = ember_lo(t, k >> 1); ember_cas(s, i, i ^ (k - 1u)); }
            barrier(CLK_LOCAL_MEM_FENCE);
            for (uint j = k >> 2; j > 0; j >>= 1) {
                for (uint t = lid; t < half_tile; t += w) { uint i = ember_lo(t, j); ember_cas(s, i, i + j); }
                barrier(CLK_LOCAL_MEM_FENCE);
            }
        }
    }
    long obase = (long)get_group_id(0) * keep;
    for (uint t = lid; t < keep; t += w) {
        if (base + t < total) dst[dst_off + obase + t] = s[t];
    }
}

/* One global compare-exchange step of stage k at distance j (flip: the first step of the stage). */
__kernel void ember_sort_step(__global ELEM* d, long off, long npairs, long k, long j, int flip) {
    for (long t = get_global_id(0); t < npairs; t += get_global_size(0)) {
        long i = ((t & ~(j - 1)) << 1) | (t & (j - 1));
        long p = flip ? (i ^ (k - 1)) : (i + j);
        ELEM a = d[off + i], b = d[off + p];
        int swap = LESS(b, a);
        d[off + i] = swap ? b : a;
        d[off + p] = swap ? a : b;
    }
}
"""



_net_sources: dict[bool, str] = {}



def _net_source(wide: bool) -> str:
    src = _net_sources.get(wide)
    if src is None:
        src = _net_sources[wide] = _pair_defs(wide) + _NET
    return src



def _outer_code(rank: int, strides: tuple[str, ...]) -> tuple[str, str]:
    """(parameter list, statements) decomposing row r over `rank` outer dims into offsets named by strides."""
    params = "".join(f", long n{d}" for d in range(rank))
    params += "".join(f", long {s}{d}" for s in strides for d in range(rank))
    body = "long rr = r;"
    for d in range(rank - 1, -1, -1):
        body += f" {{ long c = rr % n{d}; rr /= n{d};" + "".join(f" {s}o += c * {s}{d};" for s in strides) + " }"
    return params, body



_key_sources: dict[tuple[int, int], str] = {}



def _key_source(width: int, rank: int) -> str:
    """Kernel writing the (key, index) pairs of every row, padded with sentinels to seg per row."""
    ck = (width, rank)
    src = _key_sources.get(ck)
    if src is None:
        params, outer = _outer_code(rank, ("si",))
        src = _key_sources[ck] = _pair_defs(width == 8) + (
            f"__kernel void ember_sort_keys(__global const {_UTYPE[width]}* src, long src_off, long sdim,"
            " __global ELEM* dst, long dst_off, long n, long seg, long total, int mode, K sign, K inf, int desc"
            f"{params}) {{\n"
            "    K wmask = sign | (sign - (K)1);\n"
            "    for (long g = get_global_id(0); g < total; g += get_global_size(0)) {\n"
            "        long r = g / seg, j = g - r * seg;\n"
            "        if (j >= n) { dst[dst_off + g] = SENT; continue; }\n"
            f"        long sio = src_off + j * sdim; {outer}\n"
            "        K u = (K)src[sio], key;\n"
            "        if (mode == 2) {  /* IEEE float: NaN largest, -0.0 == 0.0, negatives reversed */\n"
            "            K a = u & ~sign;\n"
            "            key = a > inf ? ~(K)0 : (a == 0 ? sign : ((u & sign) ? (~u & wmask) : (u | sign)));\n"
            "        } else {\n"
            "            key = mode == 1 ? (u ^ sign) : u;\n"
            "        }\n"
            "        if (desc) key = ~key;\n"
            "        dst[dst_off + g] = PACK(key, j);\n"
            "    }\n}\n")
    return src



_out_sources: dict[tuple[int, int], str] = {}



def _out_source(width: int, rank: int) -> str:
    """Kernel writing the first kk sorted pairs of each row as values (gathered from src) and int64 indices."""
    ck = (width, rank)
    src = _out_sources.get(ck)
    if src is None:
        u = _UTYPE[width]
        params, outer = _outer_code(rank, ("si", "so"))
        src = _out_sources[ck] = _pair_defs(width == 8) + (
            f"__kernel void ember_sort_out(__global const ELEM* s, long s_off, long seg, __global const {u}* src,"
            f" long src_off, long sdim, __global {u}* vals, long v_off, __global long* idxs, long i_off, long kk,"
            f" long total, long odim{params}) {{\n"
            "    for (long g = get_global_id(0); g < total; g += get_global_size(0)) {\n"
            "        long r = g / kk, j = g - r * kk;\n"
            "        long idx = IDX(s[s_off + r * seg + j]);\n"
            f"        long sio = src_off, soo = 0; {outer}\n"
            "        long o = soo + j * odim;\n"
            "        vals[v_off + o] = src[sio + idx * sdim];\n"
            "        idxs[i_off + o] = idx;\n"
            "    }\n}\n")
    return src
