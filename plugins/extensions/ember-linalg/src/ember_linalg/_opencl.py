"""OpenCL device kernels for cholesky (``cholesky``, ``cholesky_ex``), triangular solves and LU with partial pivoting
(``lu_factor_ex``).

They run on the OpenCL backend's own handles (CLArrays), through its public kernel API (``compile_kernel``,
``empty``, ``contiguous``, ``rt.queue``, ``h.buf``/``h.eoff``) -- ember-opencl is not imported. Each work-item
factors or solves one matrix (or one right-hand-side column) serially: batches of small matrices stay on the device
with no host round trip; matrices larger than :data:`MAX_N` (where one work-item per matrix would leave the device
idle) and broadcast batch shapes use the host fallback (LAPACK on a copy), as every other op does on OpenCL.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt

from . import _ops
from ._base import _HOST, LinAlgError, batch_index

#: the largest matrix order factored on the device (one work-item per matrix); larger ones go to LAPACK on the host
MAX_N = 128

_CTYPES = {dt.float32: "float", dt.float64: "double"}

_SOURCE = """{pragma}
#define T {ctype}

/* Cholesky of one matrix per work-item. Reads the lower triangle (or the upper one, as the transpose's lower), writes
   L (or U = L^T) with zeros in the other triangle; info = order of the first minor that is not positive-definite. */
__kernel void ember_linalg_cholesky(__global const T* A, long a_off, __global T* L, long l_off,
                                    __global int* info, long i_off, int n, int upper) {{
    const long b = get_global_id(0);
    __global const T* a = A + a_off + b * (long)n * n;
    __global T* l = L + l_off + b * (long)n * n;
#define AIJ(i, j) (upper ? a[(long)(j) * n + (i)] : a[(long)(i) * n + (j)])
#define LIJ(i, j) l[upper ? (long)(j) * n + (i) : (long)(i) * n + (j)]
    for (long e = 0; e < (long)n * n; ++e) l[e] = (T)0;
    int bad = 0;
    for (int j = 0; j < n && !bad; ++j) {{
        T s = AIJ(j, j);
        for (int k = 0; k < j; ++k) s -= LIJ(j, k) * LIJ(j, k);
        if (!(s > (T)0)) {{ bad = j + 1; break; }}
        const T d = sqrt(s);
        LIJ(j, j) = d;
        for (int i = j + 1; i < n; ++i) {{
            T t = AIJ(i, j);
            for (int k = 0; k < j; ++k) t -= LIJ(i, k) * LIJ(j, k);
            LIJ(i, j) = t / d;
        }}
    }}
    info[i_off + b] = bad;
}}

/* A X = B for triangular A (n x n), one right-hand-side column per work-item: forward or back substitution. A zero
   on the diagonal gives inf/nan (no check), as torch's trsm. */
__kernel void ember_linalg_trsv(__global const T* A, long a_off, __global const T* B, long b_off, __global T* X,
                                long x_off, int n, int k, int upper, int unit) {{
    const long g = get_global_id(0);
    const long b = g / k;
    const int c = (int)(g % k);
    __global const T* a = A + a_off + b * (long)n * n;
    __global const T* rhs = B + b_off + b * (long)n * k;
    __global T* x = X + x_off + b * (long)n * k;
    for (int s = 0; s < n; ++s) {{
        const int i = upper ? n - 1 - s : s;
        T t = rhs[(long)i * k + c];
        if (upper) {{ for (int j = i + 1; j < n; ++j) t -= a[(long)i * n + j] * x[(long)j * k + c]; }}
        else {{ for (int j = 0; j < i; ++j) t -= a[(long)i * n + j] * x[(long)j * k + c]; }}
        x[(long)i * k + c] = unit ? t : t / a[(long)i * n + i];
    }}
}}

/* getrf of one m x n matrix per work-item: partial pivoting (the first entry of largest magnitude, as LAPACK's
   i_amax), 1-based pivots, info = 1-based index of the first zero pivot (the elimination goes on, as getrf's). */
__kernel void ember_linalg_getrf(__global const T* A, long a_off, __global T* LU, long lu_off, __global int* piv,
                                 long p_off, __global int* info, long i_off, int m, int n) {{
    const long b = get_global_id(0);
    const int kk = m < n ? m : n;
    __global const T* a = A + a_off + b * (long)m * n;
    __global T* lu = LU + lu_off + b * (long)m * n;
    __global int* p = piv + p_off + b * kk;
    for (long e = 0; e < (long)m * n; ++e) lu[e] = a[e];
    int bad = 0;
    for (int j = 0; j < kk; ++j) {{
        int r = j;
        T best = fabs(lu[(long)j * n + j]);
        for (int i = j + 1; i < m; ++i) {{
            const T v = fabs(lu[(long)i * n + j]);
            if (v > best) {{ best = v; r = i; }}
        }}
        p[j] = r + 1;
        if (r != j) {{
            for (int c = 0; c < n; ++c) {{
                const T t = lu[(long)j * n + c];
                lu[(long)j * n + c] = lu[(long)r * n + c];
                lu[(long)r * n + c] = t;
            }}
        }}
        const T d = lu[(long)j * n + j];
        if (d != (T)0) {{
            for (int i = j + 1; i < m; ++i) lu[(long)i * n + j] /= d;
        }} else if (!bad) {{
            bad = j + 1;
        }}
        for (int i = j + 1; i < m; ++i) {{
            const T f = lu[(long)i * n + j];
            for (int c = j + 1; c < n; ++c) lu[(long)i * n + c] -= f * lu[(long)j * n + c];
        }}
    }}
    info[i_off + b] = bad;
}}
"""


def _kernel(backend: Any, dtype: dt.DType, name: str) -> Any:
    pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" if dtype is dt.float64 else ""
    return backend.compile_kernel(_SOURCE.format(pragma=pragma, ctype=_CTYPES[dtype]), name)


def _on_device(backend: Any, *handles: Any) -> bool:
    """Whether the device kernels take these inputs: float32/float64 and matrices of order <= MAX_N."""
    return backend.dtype_of(handles[0]) in _CTYPES and all(max(h.shape[-2:]) <= MAX_N for h in handles)


def _cholesky_device(backend: Any, a: Any, upper: bool) -> tuple[Any, Any]:
    dtype = backend.dtype_of(a)
    a = backend.contiguous(a)
    n = a.shape[-1]
    count = math.prod(a.shape[:-2])
    out = backend.empty(tuple(a.shape), dtype)
    info = backend.empty(tuple(a.shape[:-2]), dt.int32)
    if count and n:
        knl = _kernel(backend, dtype, "ember_linalg_cholesky")
        knl(backend.rt.queue, (count,), None, a.buf, np.int64(a.eoff), out.buf, np.int64(out.eoff), info.buf,
            np.int64(info.eoff), np.int32(n), np.int32(int(upper)))
    elif count:
        backend.assign(info, 0)
    return out, info


@_ops.cholesky.kernel("opencl")
def _cholesky(backend: Any, a: Any, *, upper: bool = False) -> Any:
    """Cholesky on the device; a matrix that is not positive-definite raises LinAlgError as on flex."""
    if not _on_device(backend, a):
        return _HOST["linalg.cholesky"](backend, a, upper=upper)
    out, info = _cholesky_device(backend, a, upper)
    codes = np.asarray(backend.to_numpy(info)).reshape(-1)
    if codes.any():
        k = int(np.flatnonzero(codes)[0])
        raise LinAlgError(f"linalg.cholesky: {batch_index(tuple(a.shape), k)}The factorization could not be "
                          f"completed because the input is not positive-definite (the leading minor of order "
                          f"{int(codes[k])} is not positive-definite).")
    return out


@_ops.cholesky_ex.kernel("opencl")
def _cholesky_ex(backend: Any, a: Any, *, upper: bool = False) -> Any:
    """(L, info) on the device."""
    if not _on_device(backend, a):
        return _HOST["linalg.cholesky_ex"](backend, a, upper=upper)
    return _cholesky_device(backend, a, upper)


@_ops.solve_triangular.kernel("opencl")
def _solve_triangular(backend: Any, a: Any, b: Any, *, upper: bool, left: bool = True,
                      unitriangular: bool = False) -> Any:
    """Substitution on the device, one right-hand-side column per work-item (X A = B through transposes)."""
    if not _on_device(backend, a) or tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        return _HOST["linalg.solve_triangular"](backend, a, b, upper=upper, left=left, unitriangular=unitriangular)
    dtype = backend.dtype_of(a)
    nd = len(a.shape)
    swap = (*range(nd - 2), nd - 1, nd - 2)
    if not left:  # X A = B  <=>  A^T X^T = B^T (A^T's triangle is the other one)
        a, b, upper = backend.permute(a, swap), backend.permute(b, swap), not upper
    a, b = backend.contiguous(a), backend.contiguous(b)
    n, k = b.shape[-2], b.shape[-1]
    count = math.prod(a.shape[:-2])
    out = backend.empty(tuple(b.shape), dtype)
    if count and n and k:
        knl = _kernel(backend, dtype, "ember_linalg_trsv")
        knl(backend.rt.queue, (count * k,), None, a.buf, np.int64(a.eoff), b.buf, np.int64(b.eoff), out.buf,
            np.int64(out.eoff), np.int32(n), np.int32(k), np.int32(int(upper)), np.int32(int(unitriangular)))
    return backend.contiguous(backend.permute(out, swap)) if not left else out


@_ops.lu_factor_ex.kernel("opencl")
def _lu_factor_ex(backend: Any, a: Any, *, pivot: bool = True) -> Any:
    """(LU, pivots, info) on the device (getrf with partial pivoting, one matrix per work-item)."""
    if not _on_device(backend, a):
        return _HOST["linalg.lu_factor_ex"](backend, a, pivot=pivot)
    dtype = backend.dtype_of(a)
    a = backend.contiguous(a)
    m, n = a.shape[-2:]
    batch = tuple(a.shape[:-2])
    count = math.prod(batch)
    lu = backend.empty(tuple(a.shape), dtype)
    piv = backend.empty((*batch, min(m, n)), dt.int32)
    info = backend.empty(batch, dt.int32)
    if count and m and n:
        knl = _kernel(backend, dtype, "ember_linalg_getrf")
        knl(backend.rt.queue, (count,), None, a.buf, np.int64(a.eoff), lu.buf, np.int64(lu.eoff), piv.buf,
            np.int64(piv.eoff), info.buf, np.int64(info.eoff), np.int32(m), np.int32(n))
    elif count:
        backend.assign(info, 0)
    return lu, piv, info
