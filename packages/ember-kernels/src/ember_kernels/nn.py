"""Kernels for core's neural-network extension ops: GELU and layer norm (forward and backward) and scaled
dot-product attention's forward, in the shared vocabulary (:mod:`.dialect`: OpenCL C text, CUDA/HIP through the
prelude).

Every program depends on dtypes, flags and compile-time tile sizes only; sizes, strides and offsets are kernel
arguments. Arithmetic is in the dtype's compute type (float for float16/bfloat16/float32, double for float64), as
torch's kernels accumulate.

* ``ember_gelu`` / ``ember_gelu_backward``: one grid-stride loop over n contiguous elements; exact (erf) or tanh
  GELU with torch's formulas (``gelu`` and ``gelu_backward`` of ATen).
* ``ember_layer_norm``: one work-group per row of d elements (``reqd_work_group_size(wg)``): the mean, then the
  biased variance of the centred values (two passes over the row, as core's composition: no cancellation), each a
  tree reduction in local memory of wg partial sums (a fixed order: the result does not depend on timing), then
  ``(x - mean) * rstd * weight + bias`` and the row's mean and rstd (what the backward reads).
* ``ember_layer_norm_dx`` / ``ember_layer_norm_dparams``: the backward's dx per row (a work-group, two tree sums)
  and dweight/dbias per column (a work-item summing the rows in order).
* ``ember_sdpa``: one work-group per (batch, block of wg query rows), one work-item per query row. Pass 1 computes
  the row's scores against tiles of ``tk`` keys by ``ec`` features loaded into local memory, applies the scale,
  the mask (bool keeps, float adds) or the causal triangle (computed from the indices, never materialised: a causal
  block stops at its last row's key), writes them to a float scratch row and keeps the running max; pass 2 turns
  the row into the softmax (rows whose every position is masked give zeros: torch's "safe" softmax) and writes the
  probabilities ``attn`` (the op's second output, which the backward reads); pass 3 accumulates
  ``(attn * dropout) @ v`` over tiles of ``tk`` values by ``ec`` features in local memory. Per-batch element
  offsets of q, k, v and the mask come from small index arrays (``*_b``), so broadcast batch dims and grouped-query
  heads (repeat_interleave) are addressed in place, never copied.
"""

from __future__ import annotations

from .ctypes_ import CType, float_literals, header

__all__ = ["GELU_MODES", "gelu_source", "layer_norm_backward_source", "layer_norm_source", "sdpa_source"]

#: GELU's ``approximate`` values
GELU_MODES = ("none", "tanh")


def _acc(t: CType) -> str:
    """The accumulation type: double for float64, float otherwise."""
    return "double" if t.compute == "double" else "float"


def _lit(t: CType, value: str) -> str:
    """A floating literal of the accumulation type (``0.5f`` in float code: no double in float programs)."""
    return value if _acc(t) == "double" else f"{value}f"


def gelu_source(t: CType, approximate: str, backward: bool, chunked: bool = False) -> str:
    """``ember_gelu(y, yo, x, xo, n)`` or ``ember_gelu_backward(dx, dxo, x, xo, g, go, n)`` for dtype t
    (contiguous operands from element offsets ``*o``). ``chunked`` (CPUs): each work-item runs over one contiguous
    run of elements, a loop the CPU compiler vectorises, instead of the GPU's grid-stride loop (coalesced across
    work-items)."""
    if approximate not in GELU_MODES:
        raise ValueError(f"gelu_source: approximate must be one of {GELU_MODES}, got {approximate!r}")
    a, s = _acc(t), t.storage
    c = {"half": _lit(t, "0.5"), "one": _lit(t, "1.0"), "rsqrt2": _lit(t, "0.70710678118654752440"),
         "rsqrt2pi": _lit(t, "0.39894228040143267794"), "k": _lit(t, "0.044715"),
         "k3": _lit(t, "0.134145"), "s2pi": _lit(t, "0.79788456080286535588")}
    if approximate == "tanh":
        if backward:  # ATen's gelu_backward (tanh): the product rule on 0.5 x (1 + tanh(inner))
            body = (f"{a} x2 = x * x; {a} th = tanh({c['s2pi']} * (x + {c['k']} * x2 * x));\n"
                    f"        {a} left = {c['half']} * x; {a} right = {c['one']} + th;\n"
                    f"        {a} r = g * ({c['half']} * right + left * ({c['one']} - th * th) * "
                    f"({c['s2pi']} * ({c['one']} + {c['k3']} * x2)));")
        else:
            body = (f"{a} r = {c['half']} * x * ({c['one']} + tanh({c['s2pi']} * (x + {c['k']} * x * x * x)));")
    elif backward:  # Phi(x) + x phi(x)
        body = (f"{a} cdf = {c['half']} * ({c['one']} + erf(x * {c['rsqrt2']}));\n"
                f"        {a} pdf = exp(-{c['half']} * x * x) * {c['rsqrt2pi']};\n"
                f"        {a} r = g * (cdf + x * pdf);")
    else:
        body = f"{a} r = x * {c['half']} * ({c['one']} + erf(x * {c['rsqrt2']}));"
    name = "ember_gelu_backward" if backward else "ember_gelu"
    if chunked:
        loop = ("long run = (n + get_global_size(0) - 1) / get_global_size(0);\n"
                "    long lo = get_global_id(0) * run, hi = min(n, lo + run);\n"
                "    for (long i = lo; i < hi; i++)")
    else:
        loop = "for (long i = get_global_id(0); i < n; i += get_global_size(0))"
    grad_param = f"__global const {s}* gp, long go, " if backward else ""
    grad_load = f"{a} g = ({a}){t.load('gp', 'go + i')};\n        " if backward else ""
    src = f"""{header(t)}
__kernel void {name}(__global {s}* y, long yo, __global const {s}* xp, long xo, {grad_param}long n) {{
    {loop} {{
        {a} x = ({a}){t.load('xp', 'xo + i')};
        {grad_load}{body}
        {t.store('y', 'yo + i', 'r')};
    }}
}}
"""
    return float_literals(src)


def _tree(var: str, wg: int) -> str:
    """Sum ``var[0..wg)`` into ``var[0]`` (wg a power of two), a fixed pairing order, barriers between steps."""
    return f"""    for (int st = {wg // 2}; st > 0; st >>= 1) {{
        if (lid < st) {var}[lid] += {var}[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}"""


def layer_norm_source(t: CType, has_weight: bool, has_bias: bool, wg: int) -> str:
    """``ember_layer_norm``: one work-group of ``wg`` (a power of two) work-items per row of d elements."""
    if wg < 1 or wg & (wg - 1):
        raise ValueError(f"layer_norm_source: the work-group size must be a power of two, got {wg}")
    a, s = _acc(t), t.storage
    wparam = f"__global const {s}* wp, long wo, " if has_weight else ""
    bparam = f"__global const {s}* bp, long bo, " if has_bias else ""
    affine = ""
    if has_weight:
        affine += f" v *= ({a}){t.load('wp', 'wo + j')};"
    if has_bias:
        affine += f" v += ({a}){t.load('bp', 'bo + j')};"
    src = f"""{header(t)}
__kernel __attribute__((reqd_work_group_size({wg}, 1, 1)))
void ember_layer_norm(__global const {s}* xp, long xo, {wparam}{bparam}__global {s}* y, long yo,
                      __global {s}* mp, long mo, __global {s}* rp, long ro, long d, {a} eps) {{
    __local {a} red[{wg}];
    int lid = (int)get_local_id(0);
    long row = get_group_id(0);
    long xb = xo + row * d, yb = yo + row * d;
    {a} acc = 0;
    for (long j = lid; j < d; j += {wg}) acc += ({a}){t.load('xp', 'xb + j')};
    red[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
{_tree('red', wg)}
    {a} mean = red[0] / ({a})d;
    barrier(CLK_LOCAL_MEM_FENCE);  /* everyone has read red[0] before it is reused */
    acc = 0;
    for (long j = lid; j < d; j += {wg}) {{
        {a} c = ({a}){t.load('xp', 'xb + j')} - mean;
        acc += c * c;
    }}
    red[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
{_tree('red', wg)}
    {a} rstd = ({a})1 / sqrt(red[0] / ({a})d + eps);
    for (long j = lid; j < d; j += {wg}) {{
        {a} v = (({a}){t.load('xp', 'xb + j')} - mean) * rstd;{affine}
        {t.store('y', 'yb + j', 'v')};
    }}
    if (lid == 0) {{
        {t.store('mp', 'mo + row', 'mean')};
        {t.store('rp', 'ro + row', 'rstd')};
    }}
}}
"""
    return float_literals(src)


def layer_norm_backward_source(t: CType, has_weight: bool, wg: int) -> str:
    """Layer norm's backward as two kernels: ``ember_layer_norm_dx``, one work-group of ``wg`` (a power of two) per
    row: g = dy * weight, the row means of g and g * xhat (two tree sums in local memory, a fixed order), then
    ``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))``; and ``ember_layer_norm_dparams``, one work-item per
    column: dweight = sum(dy * xhat) and dbias = sum(dy) over the rows in row order (deterministic)."""
    if wg < 1 or wg & (wg - 1):
        raise ValueError(f"layer_norm_backward_source: the work-group size must be a power of two, got {wg}")
    a, s = _acc(t), t.storage
    wparam = f"__global const {s}* wp, long wo, " if has_weight else ""
    g = f"dyv * ({a}){t.load('wp', 'wo + j')}" if has_weight else "dyv"
    src = f"""{header(t)}
__kernel __attribute__((reqd_work_group_size({wg}, 1, 1)))
void ember_layer_norm_dx(__global const {s}* xp, long xo, {wparam}__global const {s}* mp, long mo,
                         __global const {s}* rp, long ro, __global const {s}* dyp, long dyo, __global {s}* dx,
                         long dxo, long d) {{
    __local {a} s1[{wg}];
    __local {a} s2[{wg}];
    int lid = (int)get_local_id(0);
    long row = get_group_id(0);
    long base = row * d;
    {a} mean = ({a}){t.load('mp', 'mo + row')}, rstd = ({a}){t.load('rp', 'ro + row')};
    {a} a1 = 0, a2 = 0;
    for (long j = lid; j < d; j += {wg}) {{
        {a} dyv = ({a}){t.load('dyp', 'dyo + base + j')};
        {a} gv = {g};
        a1 += gv;
        a2 += gv * ((({a}){t.load('xp', 'xo + base + j')} - mean) * rstd);
    }}
    s1[lid] = a1;
    s2[lid] = a2;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int st = {wg // 2}; st > 0; st >>= 1) {{
        if (lid < st) {{
            s1[lid] += s1[lid + st];
            s2[lid] += s2[lid + st];
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    {a} mg = s1[0] / ({a})d, mgx = s2[0] / ({a})d;
    for (long j = lid; j < d; j += {wg}) {{
        {a} dyv = ({a}){t.load('dyp', 'dyo + base + j')};
        {a} gv = {g};
        {a} xhat = (({a}){t.load('xp', 'xo + base + j')} - mean) * rstd;
        {t.store('dx', 'dxo + base + j', 'rstd * (gv - mg - xhat * mgx)')};
    }}
}}

__kernel void ember_layer_norm_dparams(__global const {s}* xp, long xo, __global const {s}* mp, long mo,
                                       __global const {s}* rp, long ro, __global const {s}* dyp, long dyo,
                                       __global {s}* dw, long dwo, __global {s}* db, long dbo, long rows, long d) {{
    for (long j = get_global_id(0); j < d; j += get_global_size(0)) {{
        {a} aw = 0, ab = 0;
        for (long r = 0; r < rows; r++) {{
            {a} dyv = ({a}){t.load('dyp', 'dyo + r * d + j')};
            {a} xhat = (({a}){t.load('xp', 'xo + r * d + j')} - ({a}){t.load('mp', 'mo + r')}) *
                       ({a}){t.load('rp', 'ro + r')};
            aw += dyv * xhat;
            ab += dyv;
        }}
        {t.store('dw', 'dwo + j', 'aw')};
        {t.store('db', 'dbo + j', 'ab')};
    }}
}}
"""
    return float_literals(src)


def sdpa_source(t: CType, mask: CType | None, causal: bool, dropout: bool, wg: int, tk: int, ec: int) -> str:
    """``ember_sdpa``: attention forward for dtype t (see the module docstring).

    Args: ``mask`` the attn_mask's C type (bool keeps, a float dtype adds) or None; ``causal`` the top-left aligned
    triangle; ``dropout`` whether the dropout factors (contiguous, the attention's shape) multiply the
    probabilities in ``@ v``; ``wg`` query rows (work-items) per work-group, ``tk`` keys and ``ec`` features per
    local-memory tile.

    Arguments at launch (every array followed by its element offset): q, q_b (per-batch offsets from q's first
    element), q's row and feature strides; the same for k and v (GQA heads mapped by their offsets); [mask, mask_b,
    row and key strides]; [dropout]; out and attn (contiguous); the scratch of B*L*S accumulation-type values
    (scores, then probabilities); L, S, E, Ev, blocks of rows per batch element, the scale.
    """
    if mask is not None and causal:
        raise ValueError("sdpa_source: a mask and is_causal are exclusive")
    a, s = _acc(t), t.storage
    neg = "-INFINITY"
    params = [f"__global const {s}* q, long qo, __global const long* q_b, long qbo, long qsl, long qse",
              f"__global const {s}* k, long ko, __global const long* k_b, long kbo, long ksl, long kse",
              f"__global const {s}* v, long vo, __global const long* v_b, long vbo, long vsl, long vse"]
    if mask is not None:
        params.append(f"__global const {mask.storage}* m, long mo, __global const long* m_b, long mbo, "
                      "long msl, long mss")
    if dropout:
        params.append(f"__global const {s}* dr, long dro")
    params.append(f"__global {s}* out, long oo, __global {s}* attn, long ao, __global {a}* sc, long sco")
    params.append(f"long L, long S, long E, long Ev, long nblk, {a} scale")
    if mask is None:
        masking = ""
    elif mask.is_bool:
        masking = f"if (!m[mb + i * msl + j * mss]) sv = {neg};"
    else:
        masking = f"sv += ({a}){mask.load('m', 'mb + i * msl + j * mss')};"
    if causal:
        masking = f"if (j > i) sv = {neg};"
    mask_base = "long mb = mo + m_b[mbo + b];" if mask is not None else ""
    drop = f" * ({a}){t.load('dr', 'dro + row * S + j')}" if dropout else ""
    src = f"""{header(t, *( [mask] if mask is not None else []))}
__kernel __attribute__((reqd_work_group_size({wg}, 1, 1)))
void ember_sdpa({", ".join(params)}) {{
    __local {a} tile[{tk * ec}];
    int lid = (int)get_local_id(0);
    long g = get_group_id(0);
    long b = g / nblk, r0 = (g % nblk) * {wg};
    long i = r0 + lid;
    int valid = i < L;
    long row = b * L + i;  /* row of the (B*L, S) attention and (B*L, Ev) output */
    long qb = qo + q_b[qbo + b], kb = ko + k_b[kbo + b], vb = vo + v_b[vbo + b];
    {mask_base}
    /* keys this block reads: a causal block stops at its last row's key */
    long jend = {"min(S, r0 + " + str(wg) + ")" if causal else "S"};
    __global {a}* srow = sc + sco + row * S;
    {a} mx = {neg};
    /* pass 1: scores against tiles of {tk} keys by {ec} features in local memory */
    for (long j0 = 0; j0 < jend; j0 += {tk}) {{
        {a} acc[{tk}];
        for (int kk = 0; kk < {tk}; kk++) acc[kk] = 0;
        for (long e0 = 0; e0 < E; e0 += {ec}) {{
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int tt = lid; tt < {tk * ec}; tt += {wg}) {{
                long j = j0 + tt / {ec}, e = e0 + tt % {ec};
                tile[tt] = (j < jend && e < E) ? ({a}){t.load('k', 'kb + j * ksl + e * kse')} : ({a})0;
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
            if (valid) {{
                long ne = min((long){ec}, E - e0);
                for (long e = 0; e < ne; e++) {{
                    {a} qv = ({a}){t.load('q', 'qb + i * qsl + (e0 + e) * qse')};
                    for (int kk = 0; kk < {tk}; kk++) acc[kk] += qv * tile[kk * {ec} + e];
                }}
            }}
        }}
        if (valid) {{
            for (int kk = 0; kk < {tk}; kk++) {{
                long j = j0 + kk;
                if (j >= jend) break;
                {a} sv = acc[kk] * scale;
                {masking}
                srow[j] = sv;
                if (sv > mx) mx = sv;
            }}
        }}
    }}
    /* pass 2: the softmax of the row; a row with every position masked gives zeros */
    if (valid) {{
        long jn = mx == {neg} ? 0 : jend;
        {a} total = 0;
        for (long j = 0; j < jn; j++) {{
            {a} p = exp(srow[j] - mx);
            srow[j] = p;
            total += p;
        }}
        {a} inv = ({a})1 / total;
        for (long j = 0; j < S; j++) {{
            {a} p = j < jn ? srow[j] * inv : ({a})0;
            srow[j] = p;
            {t.store('attn', 'ao + row * S + j', 'p')};
        }}
    }}
    /* pass 3: out = (attn * dropout) @ v over tiles of {tk} values by {ec} features in local memory */
    for (long e0 = 0; e0 < Ev; e0 += {ec}) {{
        {a} o[{ec}];
        for (int e = 0; e < {ec}; e++) o[e] = 0;
        for (long j0 = 0; j0 < jend; j0 += {tk}) {{
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int tt = lid; tt < {tk * ec}; tt += {wg}) {{
                long j = j0 + tt / {ec}, e = e0 + tt % {ec};
                tile[tt] = (j < jend && e < Ev) ? ({a}){t.load('v', 'vb + j * vsl + e * vse')} : ({a})0;
            }}
            barrier(CLK_LOCAL_MEM_FENCE);
            if (valid) {{
                for (int kk = 0; kk < {tk}; kk++) {{
                    long j = j0 + kk;
                    if (j >= jend) break;
                    {a} p = srow[j]{drop};
                    for (int e = 0; e < {ec}; e++) o[e] += p * tile[kk * {ec} + e];
                }}
            }}
        }}
        if (valid) {{
            long ne = min((long){ec}, Ev - e0);
            for (long e = 0; e < ne; e++) {t.store('out', 'oo + row * Ev + e0 + e', 'o[e]')};
        }}
    }}
}}
"""
    return float_literals(src)
