"""complex64/complex128 on OpenCL: reductions and matmul on the real view, and core's complex ops as map kernels.

A complex array is stored as OpenCL ``float2``/``double2`` (numpy's layout: real, imag), so every complex view is
also a real view with a trailing dim of 2 (:func:`as_real`: element strides doubled, one more stride of 1). Sums and
means of complex arrays are the real reduction kernels (Kahan-compensated) over that view, keeping the trailing dim;
a complex matmul is four real GEMMs on the real and imaginary parts. The elementwise ops are the map template with
complex expressions (:mod:`ember_kernels.complex_`, routed in :mod:`.elementwise`).

:func:`register` gives core's complex extension ops (``ember.ops.complex``: real, imag, abs, angle, conj,
view_as_real, view_as_complex, complex, polar) OpenCL kernels, so they stay on the device instead of running core's
host composition.
"""

from __future__ import annotations

from typing import Any

from ember.dtypes import DType
from ember.errors import DTypeError

from . import array as arr
from . import elementwise as ew
from .array import CLArray, empty
from .ctypes_ import ctype

__all__ = ["as_complex", "as_real", "cumulative", "matmul", "reduce", "refuse", "register"]


def as_real(h: CLArray) -> CLArray:
    """The complex array h as a real array of shape (*h.shape, 2) over the same memory (no copy)."""
    real = h.dtype.to_real
    return CLArray(h.rt, h.block, (*h.shape, 2), real, tuple(2 * s for s in h.estrides) + (1,), 2 * h.offset)


def as_complex(f: CLArray, dtype: DType) -> CLArray:
    """A real array of shape (*s, 2) as the complex array of shape s over the same memory (copied first when its
    (real, imag) pairs are not adjacent and aligned)."""
    if f.estrides[-1] != 1 or f.offset % 2 or any(s % 2 for s in f.estrides[:-1]):
        f = ew.copy(f)
    return CLArray(f.rt, f.block, f.shape[:-1], dtype, tuple(s // 2 for s in f.estrides[:-1]), f.offset // 2)


def _refuse(op: str, dtype: DType) -> DTypeError:
    return DTypeError(f"{op}: not supported for {dtype.name} on the OpenCL backend (complex reductions: sum; "
                      "use .real / .imag for the others)")


def reduce(op: str, h: CLArray, dims: tuple[int, ...], keepdim: bool) -> CLArray:
    """sum of a complex array over dims: the real reduction over the (real, imag) view, which keeps its last dim."""
    if op != "sum":
        raise _refuse(op, h.dtype)
    from . import reduction

    out = reduction.reduce("sum", as_real(h), tuple(dims), keepdim)
    return as_complex(out, h.dtype)


def cumulative(op: str, h: CLArray, dim: int) -> CLArray:
    """cumsum of a complex array along dim: the real scan over the (real, imag) view (dim keeps its index)."""
    if op != "sum":
        raise DTypeError(f"cum{op}: not supported for {h.dtype.name} on the OpenCL backend (complex scans: cumsum)")
    from . import reduction

    return as_complex(reduction.cumulative("sum", as_real(h), dim % len(h.shape)), h.dtype)


def refuse(op: str, dtype: DType) -> DTypeError:
    """The typed error of an op with no complex kernel here."""
    return DTypeError(f"{op}: not supported for {dtype.name} on the OpenCL backend")


def _part(h: CLArray, k: int) -> CLArray:
    """The real (k = 0) or imaginary (k = 1) part of h as a contiguous real array."""
    return ew.copy(arr.basic_index(as_real(h), (Ellipsis, k)))


def matmul(a: CLArray, b: CLArray) -> CLArray:
    """(ar + i ai)(br + i bi) = (ar br - ai bi) + i (ar bi + ai br): four real GEMMs and one combining map."""
    from . import matmul as mm

    ar, ai, br, bi = _part(a, 0), _part(a, 1), _part(b, 0), _part(b, 1)
    rr, ii, ri, ir = mm.matmul(ar, br), mm.matmul(ai, bi), mm.matmul(ar, bi), mm.matmul(ai, br)
    out = empty(a.rt, rr.shape, a.dtype)
    t = ctype(a.dtype)
    real = ctype(rr.dtype)
    ew.run_map(f"(({t.compute})(v0 - v1, v2 + v3))", frozenset(), out, [(rr, real), (ii, real), (ri, real),
                                                                        (ir, real)])
    return out


# -- kernels for core's complex extension ops ------------------------------------------------------------------
def _map1(expr: str, h: CLArray, out_dtype: DType) -> CLArray:
    out = empty(h.rt, h.shape, out_dtype)
    ew.run_map(expr, frozenset(), out, [(h, ctype(h.dtype))])
    return out


def _real_k(backend: Any, h: CLArray) -> CLArray:
    return _map1("v0.x", h, h.dtype.to_real)


def _imag_k(backend: Any, h: CLArray) -> CLArray:
    return _map1("v0.y", h, h.dtype.to_real)


def _abs_k(backend: Any, h: CLArray) -> CLArray:
    return _map1("hypot(v0.x, v0.y)", h, h.dtype.to_real)


def _angle_k(backend: Any, h: CLArray) -> CLArray:
    return _map1("atan2(v0.y, v0.x)", h, h.dtype.to_real)


def _conj_k(backend: Any, h: CLArray) -> CLArray:
    return _map1(f"(({ctype(h.dtype).compute})(v0.x, -v0.y))", h, h.dtype)


def _view_as_real_k(backend: Any, h: CLArray) -> CLArray:
    out = empty(h.rt, (*h.shape, 2), h.dtype.to_real)
    ew.run_map("v0", frozenset(), out, [(as_real(h), ctype(h.dtype.to_real))])
    return out


def _view_as_complex_k(backend: Any, f: CLArray) -> CLArray:
    return ew.copy(as_complex(f, f.dtype.to_complex))


def _pair(expr: str, a: CLArray, b: CLArray) -> CLArray:
    import numpy as np

    dtype = a.dtype.to_complex
    shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    out = empty(a.rt, shape, dtype)
    t = ctype(a.dtype)
    ew.run_map(expr.format(T2=ctype(dtype).compute), frozenset(), out, [(a, t), (b, t)])
    return out


def _complex_k(backend: Any, re: CLArray, im: CLArray) -> CLArray:
    return _pair("(({T2})(v0, v1))", re, im)


def _polar_k(backend: Any, r: CLArray, theta: CLArray) -> CLArray:
    return _pair("(({T2})(v0 * cos(v1), v0 * sin(v1)))", r, theta)


_KERNELS = {"complex.real": _real_k, "complex.imag": _imag_k, "complex.abs": _abs_k, "complex.angle": _angle_k,
            "complex.conj": _conj_k, "complex.view_as_real": _view_as_real_k,
            "complex.view_as_complex": _view_as_complex_k, "complex.complex": _complex_k, "complex.polar": _polar_k}


def register() -> None:
    """Register the OpenCL kernels of core's complex ops (``ember.extension.get("complex.real")`` ...)."""
    from ember import extension

    for name, fn in _KERNELS.items():
        extension.get(name).kernel("opencl")(fn)

