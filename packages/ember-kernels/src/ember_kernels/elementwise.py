"""The map template and the op expressions behind every elementwise kernel (moved from ember-opencl).

A map writes ``out[i] = EXPR(v0, v1, ...)`` where each array operand is read through its own strides (0 for
broadcast dims, negative for reversed views); dims contiguous relative to each other in every operand are merged
first (:func:`collapse`). :func:`map_kernel` emits one kernel for an (expression, operand types, rank, layout);
a :class:`Family` puts the unary (or binary) ops of a dtype into one program. Sources are in the shared vocabulary
(:mod:`.dialect`); the backends launch them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ember import dtypes as dt
from ember.backend import BINARY_OPS, COMPARISON_OPS, PREDICATE_UNARY_OPS, UNARY_OPS
from ember.dtypes import DType

from .ctypes_ import CType, ctype, float_literals, header

_ERFINV = """
static inline {T} ember_erfinv_{S}({T} x) {{
    {T} a = fabs(x);
    if (a >= ({T})1) return a == ({T})1 ? copysign(({T})INFINITY, x) : ({T})NAN;
    float af = (float)a;
    float w = -log((1.0f - af) * (1.0f + af));
    float p;
    if (w < 5.0f) {{
        w -= 2.5f;
        p = 2.81022636e-08f; p = 3.43273939e-07f + p * w; p = -3.5233877e-06f + p * w;
        p = -4.39150654e-06f + p * w; p = 0.00021858087f + p * w; p = -0.00125372503f + p * w;
        p = -0.00417768164f + p * w; p = 0.246640727f + p * w; p = 1.50140941f + p * w;
    }} else {{
        w = sqrt(w) - 3.0f;
        p = -0.000200214257f; p = 0.000100950558f + p * w; p = 0.00134934322f + p * w;
        p = -0.00367342844f + p * w; p = 0.00573950773f + p * w; p = -0.0076224613f + p * w;
        p = 0.00943887047f + p * w; p = 1.00167406f + p * w; p = 2.83297682f + p * w;
    }}
    {T} z = ({T})(p * af);
    /* Newton steps; near 1 solve log(erfc(z)) = log1p(-a) instead, where erf(z) - a cancels */
    for (int k = 0; k < {STEPS}; ++k) {{
        {T} slope = ({T})1.1283791670955126 * exp(-z * z);
        if (a > ({T})0.5) {{
            {T} c = erfc(z);
            z += (log(c) - log1p(-a)) * c / slope;
        }} else {{
            z -= (erf(z) - a) / slope;
        }}
    }}
    return copysign(z, x);
}}
"""



_IPOW = """
static inline {T} ember_ipow_{S}({T} a, {T} b) {{
    if (b < 0) return (a == 1) ? ({T})1 : (a == -1 ? ((b & 1) ? ({T})-1 : ({T})1) : ({T})0);
    {T} r = 1;
    while (b) {{ if (b & 1) r *= a; a *= a; b >>= 1; }}
    return r;
}}
"""



_FLOORDIV = """
static inline {T} ember_floordiv_{S}({T} a, {T} b) {{
    if (b == ({T})0) return a / b;
    {T} m = fmod(a, b);
    {T} d = (a - m) / b;
    if (m != ({T})0 && ((b < ({T})0) != (m < ({T})0))) d -= ({T})1;
    if (d == ({T})0) return copysign(({T})0, a / b);
    {T} f = floor(d);
    if (d - f > ({T})0.5) f += ({T})1;
    return f;
}}
"""



# float tanh: some runtimes' libm tanh is scalar and slow (PoCL: about 13 ns per element, 9x exp). An odd polynomial
# fitted to tanh(x)/x in x^2 on |x| < 0.55 (1.2 ulp) and (1 - e) / (1 + e) with e = exp(-2|x|) above (1.7 ulp, no
# cancellation there); NaN and +-inf follow from exp, +-0 from the polynomial branch.
_TANHF = """
static inline float ember_tanh_float(float x) {
    float a = fabs(x);
    if (a < 0.55f) {
        float u = x * x;
        float p = -0.006262957180789449f;
        p = p * u + 0.02105950400655511f; p = p * u - 0.053847690148170625f; p = p * u + 0.13332511325760393f;
        p = p * u - 0.3333331272948062f; p = p * u + 0.9999999991619565f;
        return x * p;
    }
    float e = exp(-2.0f * a);
    return copysign((1.0f - e) / (1.0f + e), x);
}
"""



def _helpers(used: set[str], types: list[CType]) -> str:
    out = []
    for t in sorted({t.compute for t in types}):  # sorted: the source (and its cache key) must not vary by process
        suffix = t
        if "cmath" in used and t in ("float2", "double2"):
            from .complex_ import helpers

            out.append(helpers(t))
        if "tanh" in used and t == "float":
            out.append(_TANHF)
        if "erfinv" in used and t in ("float", "double"):
            out.append(_ERFINV.format(T=t, S=suffix, STEPS=1 if t == "float" else 3))
        if "ipow" in used and t not in ("float", "double"):
            out.append(_IPOW.format(T=t, S=suffix))
        if "floordiv" in used and t in ("float", "double"):
            out.append(_FLOORDIV.format(T=t, S=suffix))
    return float_literals("".join(out))



def _unary_expr(op: str, x: str, t: CType) -> tuple[str, set[str]]:
    T, fl = t.compute, t.is_float
    if op in ("floor", "ceil", "trunc", "round") and not fl:
        return x, set()
    simple = {"exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2", "log10": "log10",
              "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos", "tan": "tan",
              "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
              "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "erf": "erf", "erfc": "erfc",
              "floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "rint"}
    if op == "tanh" and T == "float":
        return f"ember_tanh_float({x})", {"tanh"}
    if op in simple:
        return f"{simple[op]}({x})", set()
    if op == "neg":
        return f"-{x}", set()
    if op == "abs":
        return (f"fabs({x})" if fl else x if not t.is_signed else f"({T})abs({x})"), set()
    if op == "sign":
        s = f"({T})(({x} > ({T})0) - ({x} < ({T})0))"
        return (f"(isnan({x}) ? ({T})0 : {s})" if fl else s), set()
    if op == "reciprocal":
        return f"(({T})1 / {x})", set()
    if op == "erfinv":
        return f"ember_erfinv_{T}({x})", {"erfinv"}
    if op == "sigmoid":
        return (f"({x} >= ({T})0 ? ({T})1 / (({T})1 + exp(-{x})) : exp({x}) / (({T})1 + exp({x})))"), set()
    if op == "sinc":  # as PyTorch: sin(pi x) / (pi x), not sinpi (which differs in the last bits)
        pi = "M_PI" if T == "double" else "M_PI_F"
        return f"({x} == ({T})0 ? ({T})1 : sin(({T}){pi} * {x}) / (({T}){pi} * {x}))", set()
    if op == "isnan":
        return (f"isnan({x})" if fl else "0"), set()
    if op == "isinf":
        return (f"isinf({x})" if fl else "0"), set()
    if op == "isfinite":
        return (f"isfinite({x})" if fl else "1"), set()
    if op == "isposinf":
        return (f"(isinf({x}) && {x} > ({T})0)" if fl else "0"), set()
    if op == "isneginf":
        return (f"(isinf({x}) && {x} < ({T})0)" if fl else "0"), set()
    if op == "logical_not":
        return f"({x} == ({T})0)", set()
    if op == "bitwise_not":
        return (f"({x} == 0)" if t.is_bool else f"(~{x})"), set()
    if op == "signbit":
        return (f"(signbit({x}) != 0)" if fl else f"({x} < 0)"), set()
    raise KeyError(op)



def _binary_expr(op: str, a: str, b: str, t: CType) -> tuple[str, set[str]]:
    T, fl = t.compute, t.is_float
    arith = {"add": "+", "sub": "-", "mul": "*", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">",
             "ge": ">="}
    if op in arith:
        return f"({a} {arith[op]} {b})", set()
    if op == "div":
        return f"({a} / {b})", set()
    if op == "floor_divide":
        if fl:
            return f"ember_floordiv_{T}({a}, {b})", {"floordiv"}
        return (f"(({a} / {b}) - ((({a} % {b}) != 0) && ((({a} < 0) != ({b} < 0)))))"), set()
    if op == "remainder":
        if fl:
            m = f"fmod({a}, {b})"
            return (f"({b} == ({T})0 ? ({T})NAN : ({m} != ({T})0 && (({b} < ({T})0) != ({m} < ({T})0)) "
                    f"? {m} + {b} : ({m} == ({T})0 ? copysign(({T})0, {b}) : {m})))"), set()
        m = f"({a} % {b})"
        return f"({m} != 0 && (({b} < 0) != ({m} < 0)) ? {m} + {b} : {m})", set()
    if op == "fmod":
        return (f"fmod({a}, {b})" if fl else f"({a} % {b})"), set()
    if op == "pow":
        if fl:
            return f"pow({a}, {b})", set()
        if t.is_bool:
            return f"({a} || !{b})", set()
        return f"ember_ipow_{T}({a}, {b})", {"ipow"}
    if op in ("maximum", "minimum"):
        f = "max" if op == "maximum" else "min"
        if fl:
            return f"((isnan({a}) || isnan({b})) ? {a} + {b} : f{f}({a}, {b}))", set()
        return f"{f}({a}, {b})", set()
    if op in ("fmax", "fmin"):
        return (f"{op}({a}, {b})" if fl else f"{op[1:]}({a}, {b})"), set()
    if op in ("atan2", "copysign", "hypot"):
        return f"{op}({a}, {b})", set()
    if op == "logical_and":
        return f"(({a} != ({T})0) && ({b} != ({T})0))", set()
    if op == "logical_or":
        return f"(({a} != ({T})0) || ({b} != ({T})0))", set()
    if op == "logical_xor":
        return f"(({a} != ({T})0) != ({b} != ({T})0))", set()
    if op in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        sym = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}[op]
        return f"({a} {sym} {b})", set()
    if op == "bitwise_left_shift":
        return f"(({b} < 0 || {b} >= {t.bits}) ? ({T})0 : ({T})((long){a} << {b}))", set()
    if op == "bitwise_right_shift":
        neg = f"({a} < 0 ? ({T})-1 : ({T})0)" if t.is_signed else f"({T})0"
        return f"(({b} < 0 || {b} >= {t.bits}) ? {neg} : ({T})({a} >> {b}))", set()
    raise KeyError(op)



def collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge neighbours that are contiguous relative to each other in every operand."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    new_shape: list[int] = []
    new_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if new_shape and all(st[d] * shape[d] == ns[-1] for st, ns in zip(strides, new_strides)):
            new_shape[-1] *= shape[d]
            for st, ns in zip(strides, new_strides):
                ns[-1] = st[d]
        else:
            new_shape.append(shape[d])
            for st, ns in zip(strides, new_strides):
                ns.append(st[d])
    return tuple(new_shape), [tuple(ns) for ns in new_strides]



class Family:
    """Map expressions compiled together, one kernel each, into one program.

    Drivers pay a fixed cost per program build (PoCL: ~0.25 s of clang per program, then ~0.1 s per kernel on its
    first launch), so all unary ops of a dtype share one program, as do all binary ops.
    """

    __slots__ = ("members", "index")

    def __init__(self, members: list[tuple[str, frozenset[str], DType]]) -> None:
        self.members = tuple(members)
        self.index = {(expr, out): k for k, (expr, _, out) in enumerate(self.members)}



def _rank_bucket(rank: int) -> int:
    # few distinct kernels: collapsed ranks 2-3 share the rank-3 kernel, 4-8 the rank-8 one
    return 3 if rank <= 3 else 8 if rank <= 8 else rank



def map_kernel(name: str, outs: Sequence[CType], operands: Sequence[tuple[CType, bool]], rank: int, layout: str,
               values: Sequence[str], stmts: Sequence[str] = ()) -> str:
    """One map kernel ``name`` writing ``outs[m][...] = values[m]`` at every point of the iteration space.

    Operand j is an array (params ``a{j}, a{j}_off``, read through its strides) or a scalar (param ``s{j}``); the
    loop body loads every operand into ``v{j}`` (its compute type), runs ``stmts`` and stores each value. Output m
    is ``out``/``out_off``/strides ``so{d}`` for m = 0 and ``out{m}``/``out{m}_off``/``so{m}_{d}`` otherwise.

    GPUs take grid-stride loops, so neighbouring work-items touch neighbouring elements: "linear" (contiguous
    operands) and "strided" (each flat index split into coordinates). CPUs take a contiguous run of flat indices per
    work-item: "linear_chunked" (a plain loop the compiler vectorises) and "chunked" (coordinates carried like an
    odometer, since a 64-bit division per element and dim would dominate); on PoCL that is 20-50x faster.
    """
    sfx = ["" if m == 0 else str(m) for m in range(len(outs))]
    params = []
    for m, t in enumerate(outs):
        params += [f"__global {t.storage}* out{sfx[m]}", f"long out{sfx[m]}_off"]
    for j, (t, is_array) in enumerate(operands):
        if is_array:
            params += [f"__global const {t.storage}* a{j}", f"long a{j}_off"]
        else:
            params.append(f"{t.compute} s{j}")
    params.append("long n")
    arrays = [j for j, (_, is_array) in enumerate(operands) if is_array]
    out_offsets = [f"oo{s}" for s in sfx]
    if layout not in ("linear", "linear_chunked"):
        params += [f"long n{d}" for d in range(rank)]
        for s in sfx:
            params += [f"long so{s}{'_' if s else ''}{d}" for d in range(rank)]
        params += [f"long s{j}_{d}" for j in arrays for d in range(rank)]
    offsets = out_offsets + [f"o{j}" for j in arrays]
    strides = {f"oo{s}": f"so{s}{'_' if s else ''}" for s in sfx} | {f"o{j}": f"s{j}_" for j in arrays}
    body: list[str] = []
    chunk_head = ["long chunk = (n + get_global_size(0) - 1) / get_global_size(0);",
                  "long start = get_global_id(0) * chunk;", "if (start >= n) return;",
                  "long end = min(start + chunk, n);"]
    starts = ", ".join(f"oo{s} = out{s}_off" for s in sfx)
    if layout in ("linear", "linear_chunked"):
        if layout == "linear":
            body.append("for (long i = get_global_id(0); i < n; i += get_global_size(0)) {")
        else:  # a contiguous run per work-item: a plain loop the compiler vectorises
            body += chunk_head + ["for (long i = start; i < end; ++i) {"]
        out_idx = [f"out{s}_off + i" for s in sfx]
        idx = {j: f"a{j}_off + i" for j in arrays}
    elif layout == "strided":
        body.append("for (long i = get_global_id(0); i < n; i += get_global_size(0)) {")
        body.append(f"    long r = i, {starts};" + "".join(f" long o{j} = a{j}_off;" for j in arrays))
        for d in range(rank - 1, -1, -1):
            body.append(f"    {{ long c = r % n{d}; r /= n{d};"
                        + "".join(f" {o} += c * {strides[o]}{d};" for o in offsets) + " }")
        out_idx = out_offsets
        idx = {j: f"o{j}" for j in arrays}
    else:
        body += chunk_head
        body.append(f"long r = start, {starts};" + "".join(f" long o{j} = a{j}_off;" for j in arrays))
        for d in range(rank - 1, -1, -1):
            body.append(f"long c{d} = r % n{d}; r /= n{d};"
                        + "".join(f" {o} += c{d} * {strides[o]}{d};" for o in offsets))
        body.append("for (long i = start; i < end; ++i) {")
        out_idx = out_offsets
        idx = {j: f"o{j}" for j in arrays}
    for j, (t, is_array) in enumerate(operands):
        value = t.load(f"a{j}", idx[j]) if is_array else f"s{j}"
        body.append(f"    {t.compute} v{j} = {value};")
    body += [f"    {st}" for st in stmts]
    for m, (t, v) in enumerate(zip(outs, values)):
        body.append(f"    {t.store('out' + sfx[m], out_idx[m], v)};")
    if layout == "chunked":  # advance the innermost coordinate, carrying into outer ones
        carry = ""
        for d in range(rank):
            step = f"++c{d};" + "".join(f" {o} += {strides[o]}{d};" for o in offsets)
            if d == 0:
                carry = step
            else:
                reset = f"c{d} = 0;" + "".join(f" {o} -= {strides[o]}{d} * n{d};" for o in offsets)
                carry = f"{step} if (c{d} == n{d}) {{ {reset} {carry} }}"
        body.append("    " + carry)
    body.append("}")
    return f"__kernel void {name}({', '.join(params)}) {{\n    " + "\n    ".join(body) + "\n}\n"



def _map_kernel(k: int, expr: str, out_t: CType, operands: tuple[tuple[CType, bool], ...], rank: int,
                layout: str) -> str:
    """One single-output map kernel (see :func:`map_kernel`)."""
    return map_kernel(f"ember_map{k}", [out_t], operands, rank, layout, [expr])



def _map_source(family: Family, operands: tuple[tuple[CType, bool], ...], rank: int, layout: str) -> str:
    types = [t for t, _ in operands] + [ctype(out) for _, _, out in family.members]
    used = set().union(*(u for _, u, _ in family.members))
    kernels = [_map_kernel(k, expr, ctype(out), operands, rank, layout)
               for k, (expr, _, out) in enumerate(family.members)]
    return header(*types) + _helpers(used, types) + "".join(kernels)



_FLOAT_ONLY = frozenset("""exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh
    asinh acosh atanh erf erfc erfinv sigmoid sinc reciprocal atan2 copysign hypot""".split())



_INTEGER_ONLY = frozenset("""bitwise_not bitwise_and bitwise_or bitwise_xor bitwise_left_shift
    bitwise_right_shift""".split())



def _valid(op: str, t: CType) -> bool:
    return op not in (_INTEGER_ONLY if t.is_float else _FLOAT_ONLY)



_unary_plans: dict[tuple[str, DType], tuple[str, frozenset[str], DType, Family]] = {}



_binary_plans: dict[tuple[str, DType, DType], tuple[str, frozenset[str], DType, Family]] = {}



def _unary_plan(op: str, dtype: DType) -> tuple[str, frozenset[str], DType, Family]:
    plan = _unary_plans.get((op, dtype))
    if plan is None:
        t = ctype(dtype)
        members = {}
        for name in sorted(UNARY_OPS):
            if _valid(name, t) or name == op:
                expr, used = _unary_expr(name, "v0", t)
                members[name] = (expr, frozenset(used), dt.bool_ if name in PREDICATE_UNARY_OPS else dtype)
        family = Family(list(members.values()))
        for name, (expr, used, out) in members.items():
            _unary_plans[(name, dtype)] = (expr, used, out, family)
        plan = _unary_plans[(op, dtype)]
    return plan



def _binary_plan(op: str, dtype: DType, wide: DType) -> tuple[str, frozenset[str], DType, Family]:
    """(expr, helpers, result dtype, family) of a binary op on operands of dtype (wide: a float scalar's type)."""
    plan = _binary_plans.get((op, dtype, wide))
    if plan is None:
        t = ctype(wide)
        names = sorted(n for n in BINARY_OPS if _valid(n, t) or n == op) if wide is dtype else [op]
        members = {}
        for name in names:
            expr, used = _binary_expr(name, "v0", "v1", t)
            members[name] = (expr, frozenset(used), dt.bool_ if name in COMPARISON_OPS else dtype)
        family = Family(list(members.values()))
        for name, (expr, used, out) in members.items():
            _binary_plans[(name, dtype, wide)] = (expr, used, out, family)
        plan = _binary_plans[(op, dtype, wide)]
    return plan
