"""Reduction, argmax/argmin, logsumexp, softmax and scan kernels (moved from ember-opencl).

Every kernel sees its input as (outer rows) x (reduced length) through sizes and element strides passed as
arguments (at most :data:`OMAX` kept and :data:`RMAX` reduced dims), so variants depend only on (op, dtypes,
number of reduced dims, pass). ``row`` kernels reduce a row per work-group in a local-memory tree (``__local``
parameters: dynamic shared memory on CUDA/HIP, see :mod:`.dialect`); ``col`` kernels one row per work-item.
float sums are compensated (Kahan); integer sums wrap in the input dtype. Sources are in the shared vocabulary.
"""

from __future__ import annotations

from typing import Any

from ember import dtypes as dt
from ember.dtypes import DType

from .ctypes_ import CType, header

OMAX = 4  # outer (kept) dims a kernel decomposes its row index into; more are first copied contiguous



RMAX = 3  # reduced dims a reduction kernel decomposes its element index into; more are copied contiguous



_SHORT = 16  # rows at most this long are reduced one work-item per row



_HALF = (dt.float16, dt.bfloat16)



_BOOL_OP = {"sum": "max", "prod": "min"}  # bool sum/prod stored as bool are any/all



def _group_tree(step: str) -> str:
    """OpenCL C: the work-group tree over ``sv[0..ls)`` (ls a power of two), after which ``sv[0]`` holds the group's
    result; ``step`` combines ``sv[lid]`` with ``sv[lid + s]``. Starts with the barrier that publishes ``sv``."""
    return ("barrier(CLK_LOCAL_MEM_FENCE);\n"
            "        for (int s = ls >> 1; s > 0; s >>= 1) {\n"
            f"            if (lid < s) {step}\n"
            "            barrier(CLK_LOCAL_MEM_FENCE);\n"
            "        }")



def _acc_dtype(dtype: DType) -> DType:
    """The dtype partial results are kept in (float16/bfloat16 accumulate in float)."""
    return dt.float32 if dtype in _HALF else dtype



_INT_LIMITS = {"char": ("CHAR_MIN", "CHAR_MAX"), "short": ("SHRT_MIN", "SHRT_MAX"), "int": ("INT_MIN", "INT_MAX"),
               "long": ("LONG_MIN", "LONG_MAX"), "uchar": ("0", "UCHAR_MAX")}



_UNSIGNED = {"char": "uint", "short": "uint", "int": "uint", "long": "ulong"}



def _identity(op: str, t: CType) -> str:
    """The neutral element of op in t's compute type."""
    a = t.compute
    if op == "sum":
        return f"(({a})0)"
    if op == "prod":
        return f"(({a})1)"
    high = op in ("max", "argmax")
    if t.is_float:
        return f"(({a})-INFINITY)" if high else f"(({a})INFINITY)"
    if t.is_bool:
        return "((uchar)0)" if high else "((uchar)1)"
    lo, hi = _INT_LIMITS[t.storage]
    return f"(({a}){lo if high else hi})"



def _comb_fn(op: str, t: CType) -> str:
    """``ember_comb(a, b)``: op on two compute values (NaN propagates through max/min; ints wrap)."""
    a = t.compute
    if op in ("sum", "prod"):
        sym = "+" if op == "sum" else "*"
        body = f"a {sym} b"
        if t.is_signed and not t.is_float:  # unsigned arithmetic: wrap without signed-overflow UB
            u = _UNSIGNED[t.storage]
            body = f"({u})a {sym} ({u})b"
    elif t.is_float:
        cmp = ">" if op == "max" else "<"
        body = f"(a {cmp} b || isnan(a)) ? a : b"
    else:
        body = f"{op}(a, b)"
    return f"static inline {a} ember_comb({a} a, {a} b) {{ return ({a})({body}); }}\n"



def _better_fn(op: str, t: CType) -> str:
    """``ember_better(v, vi, a, ai)``: does (v, vi) beat the current (a, ai)? NaN is the extreme, lower index
    wins ties."""
    a = t.compute
    cmp = ">" if op == "argmax" else "<"
    if t.is_float:
        body = f"isnan(v) ? (!isnan(a) || vi < ai) : (!isnan(a) && (v {cmp} a || (v == a && vi < ai)))"
    else:
        body = f"v {cmp} a || (v == a && vi < ai)"
    return f"static inline int ember_better({a} v, long vi, {a} a, long ai) {{ return {body}; }}\n"



def _outer_params(*prefixes: str) -> str:
    params = [f"long o{d}" for d in range(OMAX)]
    for pre in prefixes:
        params += [f"long {pre}{d}" for d in range(OMAX)]
    return ", ".join(params)



def _outer_code(row: str, bases: list[tuple[str, str, str]]) -> str:
    """Declare each base = start + the offset of row (over the outer dims, through that array's strides)."""
    lines = [f"long rem_ = {row};"] + [f"long {name} = {start};" for name, start, _ in bases]
    for d in range(OMAX - 1, -1, -1):
        lines.append(f"{{ long k_ = rem_ % o{d}; rem_ /= o{d};"
                     + "".join(f" {name} += k_ * {pre}{d};" for name, _, pre in bases) + " }")
    return "\n        ".join(lines)



def _red_params(nred: int) -> str:
    return ", ".join([f"long r{d}" for d in range(nred)] + [f"long rs{d}" for d in range(nred)])



def _red_offset(nred: int, base: str, j: str) -> str:
    """``long p = ...``: the element offset of the j-th reduced element (C order over the reduced dims)."""
    if nred == 1:
        return f"long p = {base} + {j} * rs0;"
    if nred == 2:
        return f"long p = {base} + ({j} / r1) * rs0 + ({j} % r1) * rs1;"
    return (f"long q_ = {j} / r2; long p = {base} + (q_ / r1) * rs0 + (q_ % r1) * rs1 + ({j} % r2) * rs2;")



_red_sources: dict[tuple[Any, ...], str] = {}



def _reduced_walk(nred: int, run: str) -> str:
    """Walk the flat reduced indices [j, j1) as runs along the innermost reduced dim: the coordinates are split
    once and then carried like an odometer (a 64-bit division per element dominates on CPUs). ``run`` is the code
    of one run of ``n_`` elements from offset ``p0``, the first of flat index ``j``."""
    last = nred - 1
    split = ["long q_ = j;"] + [f"long k{d} = q_ % r{d}; q_ /= r{d};" for d in range(last, 0, -1)] + ["long k0 = q_;"]
    offset = " + ".join(f"k{d} * rs{d}" for d in range(nred))
    carry = _carry(last - 1) if last else ""
    return ("\n        ".join(split) + f"""
        while (j < j1) {{
            const long n_ = min(r{last} - k{last}, j1 - j);
            const long p0 = base + {offset};
            {run}
            j += n_;
            k{last} = 0;
            {carry}
        }}""")



def _carry(d: int) -> str:
    """Advance reduced coordinate d by one, carrying into the dims outside it."""
    if d == 0:
        return "++k0;"
    return f"if (++k{d} == r{d}) {{ k{d} = 0; {_carry(d - 1)} }}"



_LANES = 8  # independent accumulators per CPU work-item: a dependency chain per element would bound the speed



def _run_kernel(op: str, tin: CType, nred: int, arg: bool, idx_in: bool, kahan: bool, common: str,
                store: Any) -> str:
    """``ember_red_run`` (CPUs): one work-item per (row, chunk), each walking its contiguous chunk of the reduced
    indices with carried coordinates into _LANES interleaved accumulators, then combining them (the same
    combination rules as the tree: compensated sums, NaN/first-index argmax order)."""
    a = tin.compute
    ident = _identity(op, tin)
    lanes = range(_LANES)
    if arg:
        init = " ".join(f"{a} acc{l_} = {ident}; long ai{l_} = LONG_MAX;" for l_ in lanes)

        def step(l_: int, p: str, jj: str) -> str:
            vi = f"xi[xi_off + ({p} - x_off)]" if idx_in else jj
            return (f"{{ {a} v = {tin.load('x', p)}; long vi = {vi}; "
                    f"if (ember_better(v, vi, acc{l_}, ai{l_})) {{ acc{l_} = v; ai{l_} = vi; }} }}")
        combine = " ".join(f"if (ember_better(acc{l_}, ai{l_}, acc0, ai0)) {{ acc0 = acc{l_}; ai0 = ai{l_}; }}"
                           for l_ in lanes if l_)
        final = f"{a} acc = acc0; long ai = ai0;"
    elif kahan:
        init = " ".join(f"{a} acc{l_} = {ident}, cmp{l_} = ({a})0;" for l_ in lanes)

        def step(l_: int, p: str, jj: str) -> str:
            return (f"{{ {a} y = {tin.load('x', p)} - cmp{l_}; {a} t = acc{l_} + y; "
                    f"cmp{l_} = isfinite(t) ? (t - acc{l_}) - y : ({a})0; acc{l_} = t; }}")
        # each lane's compensated total, then a compensated sum of the lanes
        combine = (" ".join(f"acc{l_} -= cmp{l_};" for l_ in lanes) + f" cmp0 = ({a})0;"
                   + "".join(f" {{ {a} y = acc{l_} - cmp0; {a} t = acc0 + y; "
                             f"cmp0 = isfinite(t) ? (t - acc0) - y : ({a})0; acc0 = t; }}" for l_ in lanes if l_))
        final = f"{a} acc = acc0 - cmp0;"
    else:
        init = " ".join(f"{a} acc{l_} = {ident};" for l_ in lanes)

        def step(l_: int, p: str, jj: str) -> str:
            return f"acc{l_} = ember_comb(acc{l_}, {tin.load('x', p)});"
        combine = " ".join(f"acc0 = ember_comb(acc0, acc{l_});" for l_ in lanes if l_)
        final = f"{a} acc = acc0;"

    def block(rs: str) -> str:
        body = " ".join(step(l_, f"(q + {l_} * {rs})" if l_ else "q", f"(jr + k + {l_})") for l_ in lanes)
        return (f"for (; k + {_LANES} <= n_; k += {_LANES}, q += {_LANES} * {rs}) {{ {body} }}")
    run = (f"long k = 0, q = p0; const long jr = j; "
           f"if (rs{nred - 1} == 1) {{ {block('1')} }} else {{ {block('rs' + str(nred - 1))} }} "
           f"for (; k < n_; ++k, q += rs{nred - 1}) {step(0, 'q', '(jr + k)')}")
    return f"""
__kernel void ember_red_run({common}, int colmajor) {{
    const long t = get_global_id(0);
    if (t >= rows * G) return;
    long row, c;
    if (colmajor) {{ c = t / rows; row = t - c * rows; }} else {{ row = t / G; c = t - row * G; }}
    {_outer_code("row", [("base", "x_off", "os")])}
    long j = c * CL;
    const long j1 = min(L, j + CL);
    {init}
    {_reduced_walk(nred, run)}
    {combine}
    {final}
    {store("t")}
}}
""" + _tile_kernel(tin, nred, arg, kahan, common, store, init, step)



_TILE = 8  # rows one CPU work-item reduces side by side when the kept dims are inner (a cache line per step)



def _tile_kernel(tin: CType, nred: int, arg: bool, kahan: bool, common: str, store: Any, init: str,
                 step: Any) -> str:
    """``ember_red_tile`` (CPUs, kept dims inner): one work-item per (chunk, _TILE consecutive rows), each step
    reading the rows' neighbouring elements into one accumulator per row; partials are (G, rows)."""
    a = tin.compute
    lanes = range(_TILE)
    bases = "\n    ".join(f"long b{l_}; {{ {_outer_code(f'min(row0 + {l_}, rows - 1)', [('bb_', 'x_off', 'os')])} "
                          f"b{l_} = bb_; }}" for l_ in lanes)
    body = " ".join(step(l_, f"(b{l_} + q)", "jj") for l_ in lanes)
    last = nred - 1
    run = (f"long q = p0; for (long k = 0; k < n_; ++k, q += rs{last}) {{ const long jj = j + k; {body} }}")
    stores = []
    for l_ in lanes:
        value = (f"{a} acc = acc{l_}; long ai = ai{l_};" if arg else
                 f"{a} acc = acc{l_} - cmp{l_};" if kahan else f"{a} acc = acc{l_};")
        stores.append(f"if (row0 + {l_} < rows) {{ {value} {store(f'(c * rows + row0 + {l_})')} }}")
    return f"""
__kernel void ember_red_tile({common}) {{
    const long tiles = (rows + {_TILE - 1}) / {_TILE};
    const long t = get_global_id(0);
    if (t >= tiles * G) return;
    const long c = t / tiles, row0 = (t - c * tiles) * {_TILE};
    {bases}
    const long base = 0;
    long j = c * CL;
    const long j1 = min(L, j + CL);
    {init}
    {_reduced_walk(nred, run)}
    {" ".join(stores)}
}}
"""



def _reduce_source(op: str, tin: CType, tout: CType, nred: int, arg: bool, idx_in: bool, cpu: bool = False) -> str:
    """The program for one (op, dtypes, reduced rank, pass): ``ember_red_row`` and ``ember_red_col`` on GPUs,
    ``ember_red_run`` and ``ember_red_tile`` on CPUs."""
    key = (op, tin.dtype, tout.dtype, nred, arg, idx_in, cpu)
    src = _red_sources.get(key)
    if src is not None:
        return src
    a = tin.compute
    ident = _identity(op, tin)
    kahan = op == "sum" and tin.is_float
    helpers = _better_fn(op, tin) if arg else _comb_fn(op, tin)
    if arg:
        out_p = f"__global long* out, long out_off, __global {a}* pv, long pv_off, int write_v"
        init = f"{a} acc = {ident}; long ai = LONG_MAX;"
        idx = "xi[xi_off + (p - x_off)]" if idx_in else "j"
        step = (f"{{ {a} v = {tin.load('x', 'p')}; long vi = {idx}; "
                "if (ember_better(v, vi, acc, ai)) { acc = v; ai = vi; } }")
        finish = ""

        def store(i: str) -> str:
            return f"out[out_off + {i}] = ai; if (write_v) pv[pv_off + {i}] = acc;"
    else:
        out_p = f"__global {tout.storage}* out, long out_off"
        init = f"{a} acc = {ident};" + (f" {a} cmp = ({a})0;" if kahan else "")
        if kahan:  # compensated; a non-finite partial sum stays exactly what plain summation gives
            step = (f"{{ {a} y = {tin.load('x', 'p')} - cmp; {a} t = acc + y; "
                    f"cmp = isfinite(t) ? (t - acc) - y : ({a})0; acc = t; }}")
            finish = "acc -= cmp;"
        else:
            step = f"acc = ember_comb(acc, {tin.load('x', 'p')});"
            finish = ""

        def store(i: str) -> str:
            return tout.store("out", f"out_off + {i}", "acc") + ";"
    in_p = f"__global const {tin.storage}* x, long x_off" + (", __global const long* xi, long xi_off" if idx_in else "")
    common = f"{out_p}, {in_p}, long rows, long L, long G, long CL, {_outer_params('os')}, {_red_params(nred)}"
    if arg:
        tree = ("if (ember_better(sv[lid + s], si[lid + s], sv[lid], si[lid])) "
                "{ sv[lid] = sv[lid + s]; si[lid] = si[lid + s]; }")
        locals_p = f"__local {a}* sv, __local long* si"
        to_local = "sv[lid] = acc; si[lid] = ai;"
        from_local = "acc = sv[0]; ai = si[0];"
    else:
        tree = "sv[lid] = ember_comb(sv[lid], sv[lid + s]);"
        locals_p = f"__local {a}* sv"
        to_local = "sv[lid] = acc;"
        from_local = "acc = sv[0];"
    if cpu:  # CPUs use only the run/tile kernels: a smaller program compiles faster (PoCL: seconds each)
        src = header(tin, tout) + helpers + _run_kernel(op, tin, nred, arg, idx_in, kahan, common, store)
        _red_sources[key] = src
        return src
    src = header(tin, tout) + helpers + f"""
__kernel void ember_red_row({common}, {locals_p}) {{
    const int lid = get_local_id(0), ls = get_local_size(0);
    const long total = rows * G;
    for (long g = get_group_id(0); g < total; g += get_num_groups(0)) {{
        const long row = g / G, c = g - row * G;
        {_outer_code("row", [("base", "x_off", "os")])}
        {init}
        for (long j = c * ls + lid; j < L; j += G * ls) {{
            {_red_offset(nred, "base", "j")}
            {step}
        }}
        {finish}
        {to_local}
        {_group_tree("{ " + tree + " }")}
        if (lid == 0) {{ {from_local} {store("g")} }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
}}

__kernel void ember_red_col({common}) {{
    const long total = rows * G;
    for (long t = get_global_id(0); t < total; t += get_global_size(0)) {{
        const long c = t / rows, row = t - c * rows;
        {_outer_code("row", [("base", "x_off", "os")])}
        const long j1 = min(L, (c + 1) * CL);
        {init}
        for (long j = c * CL; j < j1; ++j) {{
            {_red_offset(nred, "base", "j")}
            {step}
        }}
        {finish}
        {store("t")}
    }}
}}
"""
    _red_sources[key] = src
    return src



_lse_sources: dict[tuple[Any, ...], str] = {}



def _lse_source(t: CType, nred: int) -> str:
    key = (t.dtype, nred)
    src = _lse_sources.get(key)
    if src is not None:
        return src
    a = t.compute
    load = t.load("x", "p")
    common = (f"__global {t.storage}* out, long out_off, __global const {t.storage}* x, long x_off, long rows, "
              f"long L, {_outer_params('os')}, {_red_params(nred)}")
    # the same steps as the default composition: m = max (NaN propagates), 0 where not finite, log(sum exp) + m
    src = header(t) + _comb_fn("max", t) + f"""
__kernel void ember_lse_row({common}, __local {a}* sv) {{
    const int lid = get_local_id(0), ls = get_local_size(0);
    for (long row = get_group_id(0); row < rows; row += get_num_groups(0)) {{
        {_outer_code("row", [("base", "x_off", "os")])}
        {a} m = ({a})-INFINITY;
        for (long j = lid; j < L; j += ls) {{ {_red_offset(nred, "base", "j")} m = ember_comb(m, {load}); }}
        sv[lid] = m;
        {_group_tree("sv[lid] = ember_comb(sv[lid], sv[lid + s]);")}
        m = sv[0];
        m = isfinite(m) ? m : ({a})0;
        barrier(CLK_LOCAL_MEM_FENCE);
        {a} acc = ({a})0;
        for (long j = lid; j < L; j += ls) {{ {_red_offset(nred, "base", "j")} acc += exp({load} - m); }}
        sv[lid] = acc;
        {_group_tree("sv[lid] += sv[lid + s];")}
        if (lid == 0) {{ {t.store("out", "out_off + row", "log(sv[0]) + m")}; }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
}}

__kernel void ember_lse_col({common}) {{
    for (long row = get_global_id(0); row < rows; row += get_global_size(0)) {{
        {_outer_code("row", [("base", "x_off", "os")])}
        {a} m = ({a})-INFINITY;
        for (long j = 0; j < L; ++j) {{ {_red_offset(nred, "base", "j")} m = ember_comb(m, {load}); }}
        m = isfinite(m) ? m : ({a})0;
        {a} acc = ({a})0;
        for (long j = 0; j < L; ++j) {{ {_red_offset(nred, "base", "j")} acc += exp({load} - m); }}
        {t.store("out", "out_off + row", "log(acc) + m")};
    }}
}}
"""
    _lse_sources[key] = src
    return src



_softmax_sources: dict[DType, str] = {}



def _softmax_source(t: CType) -> str:
    src = _softmax_sources.get(t.dtype)
    if src is not None:
        return src
    a = t.compute
    load = t.load("x", "base + j * sx")
    common = (f"__global {t.storage}* out, long out_off, __global const {t.storage}* x, long x_off, long rows, "
              f"long L, long sx, long so, int logm, {_outer_params('os', 'ps')}")
    bases = [("base", "x_off", "os"), ("obase", "out_off", "ps")]
    # m = max (NaN propagates); exp(x - m) / s or (x - m) - log(s). As in PyTorch, a row whose max is infinite
    # (a +inf element, or all -inf) gives inf - inf = NaN throughout

    def write(j0: str, js: str) -> str:
        loop = f"for (long j = {j0}; j < L; j += {js})"
        logv = t.store("out", "obase + j * so", f"({load} - m) - ls_")
        expv = t.store("out", "obase + j * so", f"exp({load} - m) / s")
        return (f"if (logm) {{ {a} ls_ = log(s); {loop} {{ {logv}; }} }}"
                f"\n        else {{ {loop} {{ {expv}; }} }}")
    src = header(t) + _comb_fn("max", t) + f"""
__kernel void ember_softmax_row({common}, __local {a}* sv) {{
    const int lid = get_local_id(0), ls = get_local_size(0);
    for (long row = get_group_id(0); row < rows; row += get_num_groups(0)) {{
        {_outer_code("row", bases)}
        {a} m = ({a})-INFINITY;
        for (long j = lid; j < L; j += ls) m = ember_comb(m, {load});
        sv[lid] = m;
        {_group_tree("sv[lid] = ember_comb(sv[lid], sv[lid + s]);")}
        m = sv[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        {a} acc = ({a})0;
        for (long j = lid; j < L; j += ls) acc += exp({load} - m);
        sv[lid] = acc;
        {_group_tree("sv[lid] += sv[lid + s];")}
        const {a} s = sv[0];
        barrier(CLK_LOCAL_MEM_FENCE);
        {write("lid", "ls")}
    }}
}}

__kernel void ember_softmax_col({common}) {{
    for (long row = get_global_id(0); row < rows; row += get_global_size(0)) {{
        {_outer_code("row", bases)}
        {a} m = ({a})-INFINITY;
        for (long j = 0; j < L; ++j) m = ember_comb(m, {load});
        {a} s = ({a})0;
        for (long j = 0; j < L; ++j) s += exp({load} - m);
        {write("0", "1")}
    }}
}}
"""
    _softmax_sources[t.dtype] = src
    return src



_scan_sources: dict[tuple[Any, ...], str] = {}



def _scan_source(op: str, t: CType) -> str:
    """``ember_scan_seq`` (one item per row), ``ember_scan_totals`` and ``ember_scan_block`` (a group per chunk of
    a row, local-memory Hillis-Steele per tile, carry from the scanned chunk totals)."""
    key = (op, t.dtype)
    src = _scan_sources.get(key)
    if src is not None:
        return src
    a = t.compute
    ident = _identity(op, t)
    load = t.load("x", "base + j * sx")
    outer = _outer_params("os", "ps")
    bases = [("base", "x_off", "os"), ("obase", "out_off", "ps")]
    if op == "sum" and t.is_float:  # running sums compensated (Kahan), as torch's CPU scans are accurate
        kahan = (f"{{ {a} y_ = (V) - cmp; {a} t_ = acc + y_; cmp = isfinite(t_) ? (t_ - acc) - y_ : ({a})0; "
                 "acc = t_; }")
        seq_step = kahan.replace("V", load)
        carry_step = kahan.replace("acc", "carry").replace("V", "sv[ls - 1]")
        tile_out = "carry + (sv[lid] - cmp)"
    else:
        seq_step = f"acc = ember_comb(acc, {load});"
        carry_step = "carry = ember_comb(carry, sv[ls - 1]);"
        tile_out = "ember_comb(carry, sv[lid])"
    src = header(t) + _comb_fn(op, t) + f"""
__kernel void ember_scan_seq(__global {t.storage}* out, long out_off, __global const {t.storage}* x, long x_off,
                             long rows, long L, long sx, long so, {outer}) {{
    for (long row = get_global_id(0); row < rows; row += get_global_size(0)) {{
        {_outer_code("row", bases)}
        {a} acc = {ident}, cmp = ({a})0;
        for (long j = 0; j < L; ++j) {{
            {seq_step}
            {t.store("out", "obase + j * so", "acc")};
        }}
    }}
}}

__kernel void ember_scan_totals(__global {a}* tot, long out_off, __global const {t.storage}* x, long x_off,
                                long rows, long L, long G, long CL, long sx, {outer}, __local {a}* sv) {{
    const int lid = get_local_id(0), ls = get_local_size(0);
    for (long g = get_group_id(0); g < rows * G; g += get_num_groups(0)) {{
        const long row = g / G, c = g - row * G;
        {_outer_code("row", bases)}
        const long j1 = min(L, (c + 1) * CL);
        {a} acc = {ident}, cmp = ({a})0;
        for (long j = c * CL + lid; j < j1; j += ls) {seq_step}
        sv[lid] = acc - cmp;
        {_group_tree("sv[lid] = ember_comb(sv[lid], sv[lid + s]);")}
        if (lid == 0) tot[out_off + g] = sv[0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
}}

__kernel void ember_scan_block(__global {t.storage}* out, long out_off, __global const {t.storage}* x, long x_off,
                               __global const {a}* cr, long cr_off, int has_carry,
                               long rows, long L, long G, long CL, long sx, long so, {outer}, __local {a}* sv) {{
    const int lid = get_local_id(0), ls = get_local_size(0);
    for (long g = get_group_id(0); g < rows * G; g += get_num_groups(0)) {{
        const long row = g / G, c = g - row * G;
        {_outer_code("row", bases)}
        const long j1 = min(L, (c + 1) * CL);
        {a} carry = (has_carry && c > 0) ? cr[cr_off + g - 1] : {ident}, cmp = ({a})0;
        for (long t0 = c * CL; t0 < j1; t0 += ls) {{
            const long j = t0 + lid;
            sv[lid] = j < j1 ? {load} : {ident};
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int s = 1; s < ls; s <<= 1) {{
                {a} w = lid >= s ? sv[lid - s] : {ident};
                barrier(CLK_LOCAL_MEM_FENCE);
                sv[lid] = ember_comb(w, sv[lid]);
                barrier(CLK_LOCAL_MEM_FENCE);
            }}
            if (j < j1) {{ {t.store("out", "obase + j * so", tile_out)}; }}
            {carry_step}
            barrier(CLK_LOCAL_MEM_FENCE);
        }}
    }}
}}
"""
    _scan_sources[key] = src
    return src
