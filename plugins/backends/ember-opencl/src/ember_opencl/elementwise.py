"""Generated elementwise kernels: one "map" template serves unary, binary, where, cast, copy, assign and fill.

A map writes ``out[i] = EXPR(v0, v1, ...)`` where each array operand is read through its own strides (0 for
broadcast dims, negative for reversed views), so inputs are never copied to make them contiguous. Dims that are
contiguous relative to each other in every operand are merged first; when everything is contiguous the kernel
indexes linearly. Kernels are generated per (expression, operand types, rank, layout) and memoised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember.errors import DTypeError
from ember_kernels import complex_ as cx
from ember_kernels.elementwise import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _ERFINV,
    _FLOAT_ONLY,
    _FLOORDIV,
    _INTEGER_ONLY,
    _IPOW,
    _TANHF,
    Family,
    _binary_expr,
    _binary_plan,
    _binary_plans,
    _helpers,
    _map_kernel,
    _map_source,
    _rank_bucket,
    _unary_expr,
    _unary_plan,
    _unary_plans,
    _valid,
    collapse,
    map_kernel,
)

from .array import CLArray, empty
from .ctypes_ import CType, ctype

# -- scalar helper functions (emitted only into programs that use them) ------------------------------------------


# -- op expressions: (value names, operand ctype) -> OpenCL C expression ----------------------------------------


# -- the map kernel ---------------------------------------------------------------------------------------------
def _broadcast_strides(h: CLArray, shape: tuple[int, ...]) -> tuple[int, ...]:
    lead = len(shape) - h.ndim
    out = [0] * lead
    for d, (n, s) in enumerate(zip(h.shape, h.estrides)):
        out.append(0 if n == 1 and shape[lead + d] != 1 else s)
    return tuple(out)


_singles: dict[tuple[str, DType], Family] = {}
_sources: dict[tuple[Any, ...], str] = {}


def run_map(expr: str, used: frozenset[str], out: CLArray, operands: list[tuple[Any, CType]],
            family: Family | None = None) -> None:
    """out[...] = expr over operands (arrays broadcast to out's shape, or scalars given with their ctype).

    The expression names the operands' values v0, v1, ... (in their compute types) and may use the flat output
    index ``i``. ``family``, when given and holding (expr, out.dtype), compiles expr together with its siblings.
    """
    n = out.size
    if n == 0:
        return
    rt = out.rt
    arrays = [op for op, _ in operands if isinstance(op, CLArray)]
    shape, strides = collapse(out.shape, [out.estrides] + [_broadcast_strides(a, out.shape) for a in arrays])
    linear = len(shape) <= 1 and all(st == (1,) or st == () for st in strides)
    k = family.index.get((expr, out.dtype)) if family is not None else None
    if k is None:
        family = _singles.get((expr, out.dtype))
        if family is None:
            family = _singles[(expr, out.dtype)] = Family([(expr, used, out.dtype)])
        k = 0
    desc = tuple((t, isinstance(op, CLArray)) for op, t in operands)
    rank = 1 if linear else _rank_bucket(len(shape))
    layout = ("linear_chunked" if linear else "chunked") if rt.is_cpu else ("linear" if linear else "strided")
    key = (family, tuple((t.dtype, a) for t, a in desc), rank, layout)
    src = _sources.get(key)
    if src is None:
        src = _sources[key] = _map_source(family, desc, rank, layout)
    kernel = rt.kernel(src, f"ember_map{k}")
    args: list[Any] = [out.buf, np.int64(out.eoff)]
    for op, t in operands:
        if isinstance(op, CLArray):
            args += [op.buf, np.int64(op.eoff)]
        else:
            args.append(t.arg(op))
    args.append(np.int64(n))
    if not linear:
        pad = rank - len(shape)
        args += [np.int64(1)] * pad + [np.int64(v) for v in shape]
        for st in strides:
            args += [np.int64(0)] * pad + [np.int64(v) for v in st]
    gsize, lsize = rt.grid(n)
    kernel(rt.queue, gsize, lsize, *args)


# -- the ops the backend exposes ---------------------------------------------------------------------------------
def _scalar_ctype(value: Any, other: CType, rt: Any) -> CType:
    """The ctype a Python scalar is passed as, beside an array operand of type other."""
    if isinstance(value, float) and not other.is_float:
        return ctype(dt.float64 if rt.fp64 else dt.float32)  # a comparison of ints with a float (no truncation)
    return other


def _shape_of(*xs: Any) -> tuple[int, ...]:
    shapes = [x.shape for x in xs if isinstance(x, CLArray)]
    if all(sh == shapes[0] for sh in shapes):
        return shapes[0]
    return tuple(np.broadcast_shapes(*shapes))


def _complex_refused(op: str, dtype: DType) -> DTypeError:
    return DTypeError(f"{op}: not supported for {dtype.name} on the OpenCL backend (complex kernels: "
                      f"{', '.join(sorted(cx.UNARY | cx.BINARY))})")


def unary(op: str, h: CLArray) -> CLArray:
    if h.dtype.is_complex:  # float2/double2 values: their own expressions, one kernel per op
        try:
            expr, used = cx.unary_expr(op, "v0", ctype(h.dtype))
        except KeyError:
            raise _complex_refused(op, h.dtype) from None
        out = empty(h.rt, h.shape, dt.bool_ if op in cx.PREDICATES else h.dtype)
        run_map(expr, frozenset(used), out, [(h, ctype(h.dtype))])
        return out
    expr, used, out_dtype, family = _unary_plan(op, h.dtype)
    out = empty(h.rt, h.shape, out_dtype)
    run_map(expr, used, out, [(h, ctype(h.dtype))], family)
    return out


def binary(op: str, a: Any, b: Any, out: CLArray | None = None) -> CLArray:
    ref = a if isinstance(a, CLArray) else b
    t = ctype(ref.dtype)
    if ref.dtype.is_complex:
        try:
            expr, used = cx.binary_expr(op, "v0", "v1", t)
        except KeyError:
            raise _complex_refused(op, ref.dtype) from None
        if out is None:
            out = empty(ref.rt, _shape_of(a, b), dt.bool_ if op in ("eq", "ne") else ref.dtype)
        run_map(expr, frozenset(used), out, [(a, t), (b, t)])
        return out
    ta = t if isinstance(a, CLArray) else _scalar_ctype(a, t, ref.rt)
    tb = t if isinstance(b, CLArray) else _scalar_ctype(b, t, ref.rt)
    wide = ta if ta is not t else tb  # a float scalar beside ints: compare in the float type
    expr, used, out_dtype, family = _binary_plan(op, ref.dtype, wide.dtype)
    if out is None:
        out = empty(ref.rt, _shape_of(a, b), out_dtype)
    run_map(expr, used, out, [(a, ta), (b, tb)], family)
    return out


def where(cond: CLArray, a: Any, b: Any) -> CLArray:
    ref = a if isinstance(a, CLArray) else b if isinstance(b, CLArray) else None
    dtype = ref.dtype if ref is not None else (dt.float32 if isinstance(a, float) or isinstance(b, float)
                                               else dt.int64)
    t = ctype(dtype)
    out = empty(cond.rt, _shape_of(cond, a, b), dtype)
    run_map("(v0 ? v1 : v2)", frozenset(), out, [(cond, ctype(dt.bool_)), (a, t), (b, t)])
    return out


def cast(h: CLArray, dtype: DType) -> CLArray:
    """A converted copy; the store's C conversion truncates floats toward zero, as C and PyTorch do."""
    out = empty(h.rt, h.shape, dtype)
    run_map(_convert("v0", h.dtype, dtype), frozenset(), out, [(h, ctype(h.dtype))])
    return out


def _convert(value: str, src: DType, dst: DType) -> str:
    """The map expression storing a src value into dst: as is between real dtypes (the store converts), through
    :func:`ember_kernels.complex_.convert_expr` where either is complex."""
    return cx.convert_expr(value, src, dst) if src.is_complex or dst.is_complex else value


def copy(h: CLArray) -> CLArray:
    out = empty(h.rt, h.shape, h.dtype)
    run_map("v0", frozenset(), out, [(h, ctype(h.dtype))])
    return out


def assign(dst: CLArray, src: Any) -> None:
    """dst[...] = src (an array broadcastable to dst, of any dtype, or a scalar); dst may be a strided view."""
    t = ctype(dst.dtype)
    if isinstance(src, CLArray):
        if src.block is dst.block:  # overlapping memory: read a snapshot, never a half-written source
            src = copy(src)
        run_map(_convert("v0", src.dtype, dst.dtype), frozenset(), dst, [(src, ctype(src.dtype))])
    else:
        run_map("v0", frozenset(), dst, [(src, t)])


def full(rt: Any, shape: tuple[int, ...], value: Any, dtype: DType) -> CLArray:
    out = empty(rt, shape, dtype)
    run_map("v0", frozenset(), out, [(value, ctype(dtype))])
    return out


def arange(rt: Any, start: Any, stop: Any, step: Any, dtype: DType) -> CLArray:
    """start + i * step, computed in int64 for integer dtypes and in double (float without fp64) otherwise."""
    import math

    n = max(0, math.ceil((stop - start) / step))
    out = empty(rt, (n,), dtype)
    if dtype.is_floating_point or any(isinstance(v, float) for v in (start, step)):
        t = ctype(dt.float64 if rt.fp64 else dt.float32)
    else:
        t = ctype(dt.int64)
    run_map("(v0 + (" + t.compute + ")i * v1)", frozenset(), out, [(start, t), (step, t)])
    return out
