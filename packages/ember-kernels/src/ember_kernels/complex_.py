"""Complex arithmetic for the map template: complex64/complex128 values as OpenCL ``float2``/``double2``.

The vector types store (real, imag) as numpy's complex types do, and their ``+``, ``-`` and unary ``-`` are complex
addition, subtraction and negation; everything else goes through the helpers below (``ember_c<op>_<T>``), emitted
into a program when its expressions use them (the ``"cmath"`` helper set of :func:`.elementwise._helpers`). The
formulas are the ones numpy and PyTorch use: Smith's division, ``exp``/``log``/``sqrt``/``sin``/``cos``/... on
(real, imag) parts, ``pow`` as ``exp(b log a)`` with ``0 ** b`` special-cased. OpenCL C only: CUDA's ``float2`` has
no operators, and no CUDA kernel uses these.
"""

from __future__ import annotations

from ember.dtypes import DType

from .ctypes_ import CType, ctype

__all__ = ["BINARY", "PREDICATES", "UNARY", "binary_expr", "convert_expr", "helpers", "unary_expr"]

#: unary ops with a complex kernel (complex out; isnan/isinf/isfinite give bool)
UNARY = frozenset("""neg exp log sqrt rsqrt reciprocal sin cos tan sinh cosh tanh sigmoid expm1 log1p log2 log10
    isnan isinf isfinite""".split())
PREDICATES = frozenset({"isnan", "isinf", "isfinite"})
#: binary ops with a complex kernel (eq/ne give bool); the ordering comparisons, min/max and the integer ops are not
#: defined on complex numbers (PyTorch refuses them too)
BINARY = frozenset({"add", "sub", "mul", "div", "pow", "eq", "ne"})

_HELPERS = """
static inline {T2} ember_cmul_{T}({T2} a, {T2} b) {{ return ({T2})(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }}
static inline {T2} ember_cdiv_{T}({T2} a, {T2} b) {{
    /* Smith's algorithm: no overflow of |b|^2 */
    if (fabs(b.y) <= fabs(b.x)) {{
        {T} r = b.y / b.x, d = b.x + b.y * r;
        return ({T2})((a.x + a.y * r) / d, (a.y - a.x * r) / d);
    }}
    {T} r = b.x / b.y, d = b.y + b.x * r;
    return ({T2})((a.x * r + a.y) / d, (a.y * r - a.x) / d);
}}
static inline {T2} ember_cexp_{T}({T2} a) {{
    {T} e = exp(a.x);
    return a.y == ({T})0 ? ({T2})(e, a.y) : ({T2})(e * cos(a.y), e * sin(a.y));
}}
static inline {T2} ember_clog_{T}({T2} a) {{ return ({T2})(log(hypot(a.x, a.y)), atan2(a.y, a.x)); }}
static inline {T2} ember_csqrt_{T}({T2} a) {{
    /* the principal root, branch cut on the negative real axis (C99's csqrt) */
    if (a.x == ({T})0 && a.y == ({T})0) return ({T2})(({T})0, a.y);
    if (isinf(a.y)) return ({T2})(({T})INFINITY, a.y);
    {T} t = sqrt((fabs(a.x) + hypot(a.x, a.y)) * ({T})0.5);
    if (a.x >= ({T})0) return ({T2})(t, a.y / (({T})2 * t));
    return ({T2})(fabs(a.y) / (({T})2 * t), copysign(t, a.y));
}}
static inline {T2} ember_csin_{T}({T2} a) {{ return ({T2})(sin(a.x) * cosh(a.y), cos(a.x) * sinh(a.y)); }}
static inline {T2} ember_ccos_{T}({T2} a) {{ return ({T2})(cos(a.x) * cosh(a.y), -(sin(a.x) * sinh(a.y))); }}
static inline {T2} ember_csinh_{T}({T2} a) {{ return ({T2})(sinh(a.x) * cos(a.y), cosh(a.x) * sin(a.y)); }}
static inline {T2} ember_ccosh_{T}({T2} a) {{ return ({T2})(cosh(a.x) * cos(a.y), sinh(a.x) * sin(a.y)); }}
static inline {T2} ember_ctanh_{T}({T2} a) {{
    /* tanh(x + iy) = (sinh 2x + i sin 2y) / (cosh 2x + cos 2y); for large |x| the limit +-1 (no inf/inf) */
    if (fabs(a.x) > ({T})20) return ({T2})(copysign(({T})1, a.x), ({T})0 * sin(({T})2 * a.y));
    {T} d = cosh(({T})2 * a.x) + cos(({T})2 * a.y);
    return ({T2})(sinh(({T})2 * a.x) / d, sin(({T})2 * a.y) / d);
}}
static inline {T2} ember_ctan_{T}({T2} a) {{
    /* tan(z) = -i tanh(iz) */
    {T2} t = ember_ctanh_{T}(({T2})(-a.y, a.x));
    return ({T2})(t.y, -t.x);
}}
static inline {T2} ember_cpow_{T}({T2} a, {T2} b) {{
    if (a.x == ({T})0 && a.y == ({T})0) {{
        if (b.x == ({T})0 && b.y == ({T})0) return ({T2})(({T})1, ({T})0);
        if (b.y == ({T})0 && b.x > ({T})0) return ({T2})(({T})0, ({T})0);
    }}
    return ember_cexp_{T}(ember_cmul_{T}(b, ember_clog_{T}(a)));
}}
"""


def helpers(compute: str) -> str:
    """The complex helper functions for compute type ``float2`` or ``double2``."""
    return _HELPERS.format(T=compute[:-1], T2=compute)


def _scalar(t: CType) -> str:
    return t.compute[:-1]


def unary_expr(op: str, x: str, t: CType) -> tuple[str, set[str]]:
    """The expression of a complex unary op on value ``x`` (a ``float2``/``double2``); KeyError for others."""
    if op not in UNARY:
        raise KeyError(op)
    T, T2 = _scalar(t), t.compute
    if op == "neg":
        return f"(-{x})", set()
    if op in PREDICATES:
        fn = {"isnan": "(isnan({0}.x) || isnan({0}.y))", "isinf": "(isinf({0}.x) || isinf({0}.y))",
              "isfinite": "(isfinite({0}.x) && isfinite({0}.y))"}[op]
        return fn.format(x), set()
    one = f"(({T2})(({T})1, ({T})0))"
    simple = {"exp": "cexp", "log": "clog", "sqrt": "csqrt", "sin": "csin", "cos": "ccos", "tan": "ctan",
              "sinh": "csinh", "cosh": "ccosh", "tanh": "ctanh"}
    if op in simple:
        return f"ember_{simple[op]}_{T}({x})", {"cmath"}
    if op == "reciprocal":
        return f"ember_cdiv_{T}({one}, {x})", {"cmath"}
    if op == "rsqrt":
        return f"ember_cdiv_{T}({one}, ember_csqrt_{T}({x}))", {"cmath"}
    if op == "sigmoid":
        return f"ember_cdiv_{T}({one}, {one} + ember_cexp_{T}(-{x}))", {"cmath"}
    if op == "expm1":
        return f"(ember_cexp_{T}({x}) - {one})", {"cmath"}
    if op == "log1p":
        return f"ember_clog_{T}({one} + {x})", {"cmath"}
    # log2 / log10: log(z) / log(base), a real divisor (both parts scale)
    base = "2" if op == "log2" else "10"
    return f"(ember_clog_{T}({x}) / log(({T}){base}))", {"cmath"}


def binary_expr(op: str, a: str, b: str, t: CType) -> tuple[str, set[str]]:
    """The expression of a complex binary op on values ``a``, ``b``; KeyError for ops complex numbers lack."""
    if op not in BINARY:
        raise KeyError(op)
    T = _scalar(t)
    if op in ("add", "sub"):
        return f"({a} {'+' if op == 'add' else '-'} {b})", set()
    if op == "eq":
        return f"({a}.x == {b}.x && {a}.y == {b}.y)", set()
    if op == "ne":
        return f"({a}.x != {b}.x || {a}.y != {b}.y)", set()
    fn = {"mul": "cmul", "div": "cdiv", "pow": "cpow"}[op]
    return f"ember_{fn}_{T}({a}, {b})", {"cmath"}


def convert_expr(value: str, src: DType, dst: DType) -> str:
    """``value`` (src's compute type) as dst's compute type, where either is complex: a real value becomes
    (value, 0), a complex one keeps its real part for a real dst (numpy's and PyTorch's cast), nonzero-ness for
    bool, and changes precision component-wise between complex64 and complex128."""
    d = ctype(dst)
    if src.is_complex and dst.is_complex:
        return value if src is dst else f"convert_{d.compute}({value})"
    if dst.is_complex:
        T = d.compute[:-1]
        return f"(({d.compute})(({T})({value}), ({T})0))"
    if not src.is_complex:
        return value
    if d.is_bool:
        return f"({value}.x != 0 || {value}.y != 0)"
    return f"{value}.x"
