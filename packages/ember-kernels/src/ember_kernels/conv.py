"""Convolution kernel generators (moved from ember-opencl): ``im2col`` (copies raw bits into a column matrix for
the GEMM, in either row order, 32-bit indices), ``col2im`` (scatter-add of columns back to an input gradient, with
an optional bias), ``direct`` (a work-item per output position for short reductions) and the split-K ``sum``.
CPU variants step their indices as mixed-radix counters (:func:`_advance`, :func:`_carry`). Sources are in the
shared vocabulary (:mod:`.dialect`).
"""

from __future__ import annotations

from typing import Any

from .ctypes_ import ctype, header

#: raw storage type per element width (im2col copies bits: 0 bits are 0.0 in every float format)
_RAW = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}



_sources: dict[tuple[Any, ...], str] = {}



def _advance(digits: list[tuple[str, str]], subs: dict[str, list[str]], indent: str) -> list[str]:
    """C statements stepping a mixed-radix counter (digits outermost first, as (name, radix)) to the next value;
    ``subs[name]`` are statements that keep the digit's derived sub-digits in step (None: reset them to 0)."""
    lines: list[str] = []
    close = 0
    for j in range(len(digits) - 1, -1, -1):
        name, radix = digits[j]
        if j == 0:
            lines.append(f"{indent}++{name};")
            lines += [f"{indent}{x}" for x in subs.get(name + "+", [])]
            break
        lines.append(f"{indent}if (++{name} < {radix}) {{")
        lines += [f"{indent}    {x}" for x in subs.get(name + "+", [])]
        lines.append(f"{indent}}} else {{")
        indent += "    "
        lines.append(f"{indent}{name} = 0;")
        lines += [f"{indent}{x}" for x in subs.get(name + "0", [])]
        close += 1
    for _ in range(close):
        indent = indent[:-4]
        lines.append(f"{indent}}}")
    return lines



def _carry(names: list[str], radices: list[str], top: str | None) -> list[str]:
    """One C statement adding 1 to the sub-counter ``names`` (outermost first); the outermost digit (or ``top``,
    a digit above it with no radix) absorbs the final carry."""
    stmt = f"++{top};" if top else ""
    for name, radix in zip(names, radices):
        stmt = f"if (++{name} == {radix}) {{ {name} = 0; {stmt} }}" if stmt else f"++{name};"
    return [stmt]



def _im2col_source(itemsize: int, nd: int, order: str) -> str:
    """cols[g, n, r, l] (any strides) = x[n, g*Cg + r / Kp, window(l, r % Kp)], or 0 outside the input; rows
    r >= Cg * Kp (RT > Cg * Kp) hold ``one`` (the bit pattern of 1.0).

    A work-item copies rows of the innermost output dim, each in three runs (left padding, inside, right padding)
    with no per-element bounds checks. ``per`` rows are consecutive per work-item (CPUs: one block each, the row
    indices stepped as a mixed-radix counter, so no division per row; GPUs: per = 1, neighbours take neighbouring
    rows). ``order`` is the enumeration of (g, n, r, l'), outermost first; its last letter should be the dim of
    unit stride.
    """
    key = ("im2col", itemsize, nd, order)
    src = _sources.get(key)
    if src is not None:
        return src
    raw = _RAW[itemsize]
    last = nd - 1
    params = [f"__global {raw}* out", "long out_off", f"__global const {raw}* x", "long x_off", "int rows",
              "int per", "int G", "int N", "int RT", "int LR", "int Cg", "int Kp", f"{raw} one", "long sxn",
              "long sxc"]
    params += [f"int {n}{d}" for d in range(nd) for n in ("S", "O", "K", "st", "dl", "lo")]
    params += [f"long sx{d}" for d in range(nd)]
    params += ["long og", "long on", "long orr", "long ol"]
    size = {"g": "G", "n": "N", "r": "RT", "l": "LR"}
    kn = [f"k{d}" for d in range(nd)]
    on = [f"o{d}" for d in range(nd - 1)]
    body = ["for (int b0 = get_global_id(0) * per; b0 < rows; b0 += get_global_size(0) * per) {",
            "    int b1 = min(b0 + per, rows), t = b0;"]
    for c in reversed(order[1:]):
        body.append(f"    int {c} = t % {size[c]}; t /= {size[c]};")
    body.append(f"    int {order[0]} = t;")
    body.append("    int u = r;" + "".join(f" int k{d} = u % K{d}; u /= K{d};" for d in range(last, -1, -1))
                + " int cg = u;")
    if nd > 1:
        body.append("    u = l;" + "".join(f" int o{d} = u % O{d}; u /= O{d};" for d in range(nd - 2, 0, -1))
                    + " int o0 = u;")
    body.append("    for (int i = b0; i < b1; ++i) {")
    b = "        "
    body.append(f"{b}long oi = out_off + g * og + n * on + r * orr + (long)l * O{last} * ol;")
    # rows past the window's (cg == Cg) multiply a bias folded into the weight matrix
    body.append(f"{b}if (cg >= Cg) {{")
    body.append(f"{b}    for (int o = 0; o < O{last}; ++o) out[oi + o * ol] = one;")
    body.append(f"{b}}} else {{")
    body.append(f"{b}    long xi = x_off + n * sxn + (long)(g * Cg + cg) * sxc;")
    body.append(f"{b}    bool inside = true;")
    for d in range(nd - 1):
        body.append(f"{b}    {{ int p = o{d} * st{d} - lo{d} + k{d} * dl{d}; inside = inside && p >= 0 && p < S{d};"
                    f" xi += p * sx{d}; }}")
    sz, osz, stl = f"S{last}", f"O{last}", f"st{last}"
    # the row reads p = p0 + o * st: inside the input for oa <= o < ob
    body.append(f"{b}    int p0 = k{last} * dl{last} - lo{last}, oa = 0, ob = 0;")
    body.append(f"{b}    if (inside) {{")
    body.append(f"{b}        oa = p0 >= 0 ? 0 : min({stl} == 1 ? -p0 : (-p0 + {stl} - 1) / {stl}, {osz});")
    body.append(f"{b}        ob = {sz} - p0 <= 0 ? 0 : min({stl} == 1 ? {sz} - p0 : ({sz} - p0 + {stl} - 1) / {stl},"
                f" {osz});")
    body.append(f"{b}        ob = max(ob, oa);")
    body.append(f"{b}    }}")
    body.append(f"{b}    for (int o = 0; o < oa; ++o) out[oi + o * ol] = ({raw})0;")
    body.append(f"{b}    long xs = xi + (long)p0 * sx{last}, xstep = (long){stl} * sx{last};")
    body.append(f"{b}    for (int o = oa; o < ob; ++o) out[oi + o * ol] = x[xs + o * xstep];")
    body.append(f"{b}    for (int o = ob; o < {osz}; ++o) out[oi + o * ol] = ({raw})0;")
    body.append(f"{b}}}")
    subs = {"r+": _carry(kn, [f"K{d}" for d in range(nd)], "cg"),
            "r0": ["cg = 0;" + "".join(f" {k} = 0;" for k in kn)]}
    if nd > 1:
        subs["l+"] = _carry(on, [f"O{d}" for d in range(nd - 1)], None)
        subs["l0"] = ["".join(f"{o} = 0; " for o in on).strip()]
    body += _advance([(c, size[c]) for c in order], subs, b)
    body.append("    }")
    body.append("}")
    src = f"__kernel void ember_im2col({', '.join(params)}) {{\n    " + "\n    ".join(body) + "\n}\n"
    _sources[key] = src
    return src



def _col2im_source(dtype: Any, nd: int, bias: bool) -> str:
    """out[n, c, *s] (contiguous) = the sum of the column entries cols[g, n, r, l] that im2col read from
    x[n, c, *s] (+ bias[c]): a gather (no atomics), taps summed in window order (deterministic). Work-items take
    ``per`` consecutive elements, stepping their indices as a mixed-radix counter (see the im2col kernel)."""
    key = ("col2im", dtype, nd, bias)
    src = _sources.get(key)
    if src is not None:
        return src
    t = ctype(dtype)
    params = [f"__global {t.storage}* out", "long out_off", f"__global const {t.storage}* cols", "long c_off"]
    if bias:
        params += [f"__global const {t.storage}* bias", "long b_off", "long sb"]
    params += ["int total", "int per", "int C", "int Cg", "int Kp"]
    params += [f"int {n}{d}" for d in range(nd) for n in ("S", "O", "K", "st", "dl", "lo")]
    params += ["long og", "long on", "long orr", "long ol"]
    body = ["for (int b0 = get_global_id(0) * per; b0 < total; b0 += get_global_size(0) * per) {",
            "    int b1 = min(b0 + per, total), t = b0;"]
    for d in range(nd - 1, -1, -1):
        body.append(f"    int s{d} = t % S{d}; t /= S{d};")
    body.append("    int c = t % C, n = t / C;")
    body.append("    int g = c / Cg, cg = c - g * Cg;")
    body.append("    for (int i = b0; i < b1; ++i) {")
    b = "        "
    body.append(f"{b}long base = c_off + g * og + n * on + (long)cg * Kp * orr;")
    body.append(f"{b}{t.compute} acc = ({t.compute})0;")
    indent = b
    for d in range(nd):
        kidx = "k0" if d == 0 else f"kx{d - 1} * K{d} + k{d}"
        oidx = "o0" if d == 0 else f"ox{d - 1} * O{d} + o{d}"
        body.append(f"{indent}for (int k{d} = 0; k{d} < K{d}; ++k{d}) {{")
        indent += "    "
        # q falls as k rises: once it is negative no later tap reads this element
        body.append(f"{indent}int q{d} = s{d} + lo{d} - k{d} * dl{d}, o{d} = q{d};")
        body.append(f"{indent}if (q{d} < 0) break;")
        body.append(f"{indent}if (st{d} != 1) {{ o{d} = q{d} / st{d}; if (o{d} * st{d} != q{d}) continue; }}")
        body.append(f"{indent}if (o{d} >= O{d}) continue;")
        body.append(f"{indent}int kx{d} = {kidx}, ox{d} = {oidx};")
    last = nd - 1
    body.append(f"{indent}acc += {t.load('cols', f'base + kx{last} * orr + ox{last} * ol')};")
    for _ in range(nd):
        indent = indent[:-4]
        body.append(f"{indent}}}")
    if bias:
        body.append(f"{b}acc += {t.load('bias', 'b_off + c * sb')};")
    body.append(f"{b}{t.store('out', 'out_off + i', 'acc')};")
    subs = {"c+": ["if (++cg == Cg) { cg = 0; ++g; }"], "c0": ["cg = 0; g = 0;"]}
    body += _advance([("n", "N"), ("c", "C")] + [(f"s{d}", f"S{d}") for d in range(nd)], subs, b)
    body.append("    }")
    body.append("}")
    src = (header(t) + f"__kernel void ember_col2im({', '.join(params)}) {{\n    " + "\n    ".join(body)
           + "\n}\n")
    _sources[key] = src
    return src



def _direct_source(dtype: Any, nd: int, cot: int, bias: bool) -> str:
    """y[n, g*Cog + co, l] = sum over (cg, taps) of w[g*Cog + co, cg, taps] * x[n, g*Cg + cg, window(l, taps)]
    (+ b): a direct convolution for grouped convs with few outputs per group (depthwise) and, on GPUs, short
    reductions, where a GEMM's tiles would be mostly padding. A work-item computes COT output channels at one
    position: each input value it loads feeds COT multiply-adds. Positions are stepped as in the im2col kernel."""
    key = ("direct", dtype, nd, cot, bias)
    src = _sources.get(key)
    if src is not None:
        return src
    t = ctype(dtype)
    acc = t.compute
    params = [f"__global {t.storage}* y", "long y_off", f"__global const {t.storage}* x", "long x_off",
              f"__global const {t.storage}* w", "long w_off"]
    if bias:
        params += [f"__global const {t.storage}* b", "long b_off", "long sb"]
    params += ["int total", "int per", "int N", "int L", "int CT", "int G", "int Cg", "int Cog", "long sxn",
               "long sxc", "long swo", "long swc"]
    params += [f"int {n}{d}" for d in range(nd) for n in ("S", "O", "K", "st", "dl", "lo")]
    params += [f"long sx{d}" for d in range(nd)] + [f"long sw{d}" for d in range(nd)]
    body = ["for (int b0 = get_global_id(0) * per; b0 < total; b0 += get_global_size(0) * per) {",
            "    int b1 = min(b0 + per, total), t = b0, l = t % L; t /= L;",
            "    int ct = t % CT; t /= CT;",
            "    int g = t % G, n = t / G, u = l;"]
    for d in range(nd - 1, 0, -1):
        body.append(f"    int o{d} = u % O{d}; u /= O{d};")
    body.append("    int o0 = u;")
    body.append("    for (int i = b0; i < b1; ++i) {")
    inner = ["int co0 = ct * COT, jmax = min(COT, Cog - co0) - 1;"]
    inner += [f"int pb{d} = o{d} * st{d} - lo{d};" for d in range(nd)]
    inner.append(f"{acc} acc[COT];")
    inner.append(f"for (int j = 0; j < COT; ++j) acc[j] = ({acc})0;")
    inner.append("long xg = x_off + n * sxn + (long)g * Cg * sxc;")
    inner.append("long wg = w_off + (long)(g * Cog + co0) * swo;")
    inner.append("for (int cg = 0; cg < Cg; ++cg) {")
    indent = "    "
    inner.append(f"{indent}long xc = xg + cg * sxc, wc = wg + cg * swc;")
    for d in range(nd):
        prev_x, prev_w = ("xc", "wc") if d == 0 else (f"xk{d - 1}", f"wk{d - 1}")
        inner.append(f"{indent}for (int k{d} = 0; k{d} < K{d}; ++k{d}) {{")
        indent += "    "
        inner.append(f"{indent}int p{d} = pb{d} + k{d} * dl{d};")
        inner.append(f"{indent}if (p{d} < 0 || p{d} >= S{d}) continue;")
        inner.append(f"{indent}long xk{d} = {prev_x} + p{d} * sx{d}, wk{d} = {prev_w} + k{d} * sw{d};")
    last = nd - 1
    inner.append(f"{indent}{acc} v = {t.load('x', f'xk{last}')};")
    # tail tiles (Cog not a multiple of COT) reread their last channel's weights and drop those sums at the store
    wload = t.load("w", f"wk{last} + min(j, jmax) * swo")
    inner.append(f"{indent}for (int j = 0; j < COT; ++j) acc[j] += v * {wload};")
    for _ in range(nd):
        indent = indent[:-4]
        inner.append(f"{indent}}}")
    inner.append("}")
    inner.append("long yi = y_off + ((long)(n * G + g) * Cog + co0) * L + l;")
    inner.append("for (int j = 0; j <= jmax; ++j) {")
    value = "acc[j]" + (f" + {t.load('b', 'b_off + (g * Cog + co0 + j) * sb')}" if bias else "")
    inner.append(f"    {t.store('y', 'yi + (long)j * L', value)};")
    inner.append("}")
    body += ["        " + line for line in inner]
    subs = {"l+": _carry([f"o{d}" for d in range(nd)], [f"O{d}" for d in range(nd)], None),
            "l0": ["".join(f"o{d} = 0; " for d in range(nd)).strip()]}
    body += _advance([("n", "N"), ("g", "G"), ("ct", "CT"), ("l", "L")], subs, "        ")
    body.append("    }")
    body.append("}")
    src = (header(t) + f"#define COT {cot}\n__kernel void ember_conv_direct({', '.join(params)}) {{\n    "
           + "\n    ".join(body) + "\n}\n")
    _sources[key] = src
    return src



def _sum_source(dtype: Any) -> str:
    """out[g, j] (+)= sum over s of parts[g, s, j] (contiguous): the split-K partial products of a weight gradient
    (added to out's values when ``accumulate``: the chunks of a batch)."""
    key = ("sum", dtype)
    src = _sources.get(key)
    if src is not None:
        return src
    t = ctype(dtype)
    src = header(t) + f"""
__kernel void ember_conv_sum(__global {t.storage}* out, long out_off, __global const {t.storage}* parts,
                             long p_off, long total, long S, long M, int accumulate) {{
    for (long i = get_global_id(0); i < total; i += get_global_size(0)) {{
        long g = i / M, j = i - g * M;
        long p = p_off + g * S * M + j;
        {t.compute} acc = accumulate ? {t.load('out', 'out_off + i')} : ({t.compute})0;
        for (long s = 0; s < S; ++s) acc += {t.load('parts', 'p + s * M')};
        {t.store('out', 'out_off + i', 'acc')};
    }}
}}
"""
    _sources[key] = src
    return src
