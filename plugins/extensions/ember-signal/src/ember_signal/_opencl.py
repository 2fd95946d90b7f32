"""An OpenCL FFT for ember-signal's transforms (``signal.c2c``, ``signal.r2c``, ``signal.c2r``) on ember-opencl.

Stockham autosort, mixed radix: a line of n = R_1 R_2 ... R_k points (each R_i in 2, 3, 4, 5, 7) is transformed in
k passes, one kernel launch per pass over every line of the batch (one work-item per radix-R butterfly), ping-ponging
between two buffers; the norm's scale is applied by the last pass. Each transformed dim is resized (cropped or
zero-padded, ``backend.pad``), moved last and made contiguous, then transformed; r2c is c2c of the complexified input
cut to n // 2 + 1 bins, c2r the inverse c2c of the Hermitian extension of the half spectrum (its real part: the
imaginary parts of the DC and Nyquist bins are ignored, as pocketfft and torch do).

A size with a prime factor above 7 (or any transform on a device without the needed precision) runs the host
fallback: the input copied to the host, scipy.fft (pocketfft) there, the result copied back -- as every other
backend does. So does every transform on a CPU runtime (PoCL) unless ``EMBER_OPENCL_FFT=device``: there the host is
the same cores and pocketfft beats the generic kernel many times over (:func:`mode`).

Like ember-linalg's OpenCL kernels this module uses only the backend's public kernel API (``compile_kernel``,
``empty``, ``rt.queue``, ``rt.grid``, handles' ``buf``/``eoff``); ember-opencl is not imported.
"""

from __future__ import annotations

import math
import os
import weakref
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.errors import ValueRangeError

from ._ops import c2c, c2r, host_c2c, host_c2r, host_r2c, r2c

__all__ = ["RADICES", "plan", "register"]

#: the radices of the device passes (4 before 2: fewer passes for powers of two)
RADICES = (4, 2, 3, 5, 7)

_SOURCE = """{pragma}
#define T {T}
#define T2 {T2}
/* the items of a kernel: on a GPU a grid-stride loop (neighbouring work-items, neighbouring items); on a CPU runtime
   a contiguous run per work-item, which its compiler turns into a plain loop (PoCL: many times faster) */
#if {chunked}
#define EMBER_FFT_LOOP(g, total) \\
    const long chunk_ = ((total) + get_global_size(0) - 1) / get_global_size(0); \\
    const long start_ = get_global_id(0) * chunk_, end_ = min(start_ + chunk_, (long)(total)); \\
    for (long g = start_; g < end_; ++g)
#else
#define EMBER_FFT_LOOP(g, total) for (long g = get_global_id(0); g < (total); g += get_global_size(0))
#endif
static inline T2 ember_fft_cmul(T2 a, T2 b) {{ return (T2)(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x); }}
{passes}
/* the Hermitian extension of half spectra (lines of `bins` = n / 2 + 1) to full lines of n bins */
__kernel void ember_fft_hermitian(__global const T2* src, long src_off, __global T2* dst, long dst_off, long bins,
                                  long n, long lines) {{
    const long total = lines * n;
    EMBER_FFT_LOOP(g, total) {{
        const long line = g / n, k = g - line * n;
        __global const T2* in = src + src_off + line * bins;
        const T2 v = k < bins ? in[k] : in[n - k];
        dst[dst_off + g] = k < bins ? v : (T2)(v.x, -v.y);
    }}
}}
/* the real parts of count complex values */
__kernel void ember_fft_real(__global const T2* src, long src_off, __global T* dst, long dst_off, long count) {{
    EMBER_FFT_LOOP(g, count) dst[dst_off + g] = src[src_off + g].x;
}}
"""

_PASS = """
/* one radix-{R} Stockham pass over `lines` contiguous lines of n points, the sub-transforms of length ns done:
   work-item (line, j) twiddles x[j + r m] (m = n / {R}) by w^(r (j mod ns) n / (ns {R})), w = exp(-2 pi i / n) read
   from the table tw (n entries, computed on the host in double precision; conjugated for the inverse, sign = 1),
   takes their {R}-point DFT and writes it to out[(j / ns) ns {R} + (j mod ns) + q ns], times scale. Index math
   within a line is 32-bit (n < 2^31): 64-bit division is slow on CPUs' OpenCL. */
__kernel void ember_fft_r{R}(__global const T2* src, long src_off, __global T2* dst, long dst_off,
                            __global const T2* tw, long tw_off, long n, long ns, long lines, T sign, T scale) {{
    const T twc[{R}] = {{{cos}}};
    const T tws[{R}] = {{{sin}}};
    const uint un = (uint)n, uns = (uint)ns;
    const uint m = un / {R}u;
    const uint stride = un / (uns * {R}u);  /* table step of one unit of k r */
    const long total = lines * (long)m;
    tw += tw_off;
    EMBER_FFT_LOOP(g, total) {{
        const long line = g / m;
        const uint j = (uint)(g - line * m);
        __global const T2* in = src + src_off + line * n;
        __global T2* out = dst + dst_off + line * n;
        const uint k = j % uns;
        T2 v[{R}];
        v[0] = in[j];
        for (uint r = 1; r < {R}u; ++r) {{
            const T2 w = tw[(k * r * stride) % un];
            v[r] = ember_fft_cmul(in[j + r * m], (T2)(w.x, -sign * w.y));
        }}
        const uint d = (j / uns) * uns * {R}u + k;
        for (uint q = 0; q < {R}u; ++q) {{
            T2 acc = v[0];
            for (uint r = 1; r < {R}u; ++r) {{
                const uint e = (r * q) % {R}u;
                acc += ember_fft_cmul(v[r], (T2)(twc[e], sign * tws[e]));
            }}
            out[d + q * uns] = acc * scale;
        }}
    }}
}}
"""

_TYPES = {dt.complex64: ("float", "float2", ""), dt.complex128: ("double", "double2",
                                                                    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable")}


def _literal(v: float, t: str) -> str:
    text = repr(float(v))
    return text + "f" if t == "float" else text


def _source(dtype: dt.DType, chunked: bool) -> str:
    t, t2, pragma = _TYPES[dtype]
    passes = "".join(_PASS.format(R=r, cos=", ".join(_literal(math.cos(2 * math.pi * e / r), t) for e in range(r)),
                                  sin=", ".join(_literal(math.sin(2 * math.pi * e / r), t) for e in range(r)))
                     for r in sorted(set(RADICES)))
    return _SOURCE.format(pragma=pragma, T=t, T2=t2, passes=passes, chunked=int(chunked))


def plan(n: int) -> list[int] | None:
    """The radices of a length-n transform on the device (their product is n), or None when n has a prime factor
    above 7 (those sizes use the host fallback)."""
    if n >= 2**31:  # the passes index within a line in 32 bits
        return None
    out: list[int] = []
    rest = n
    for r in RADICES:
        while rest % r == 0:
            out.append(r)
            rest //= r
    return out if rest == 1 else None


_SOURCES: dict[tuple[dt.DType, bool], str] = {}
#: per backend: (n, dtype) -> the device table of exp(-2 pi i t / n), t < n
_TWIDDLES: weakref.WeakKeyDictionary[Any, dict[tuple[int, dt.DType], Any]] = weakref.WeakKeyDictionary()


def _kernel(backend: Any, dtype: dt.DType, name: str) -> Any:
    chunked = bool(getattr(backend.rt, "is_cpu", False))
    src = _SOURCES.get((dtype, chunked))
    if src is None:
        src = _SOURCES[(dtype, chunked)] = _source(dtype, chunked)
    return backend.compile_kernel(src, name)


def _twiddles(backend: Any, n: int, dtype: dt.DType) -> Any:
    """exp(-2 pi i t / n) for t < n on the device (computed in double precision, uploaded once per size)."""
    tables = _TWIDDLES.setdefault(backend, {})
    table = tables.get((n, dtype))
    if table is None:
        t = np.exp(-2j * np.pi * np.arange(n) / n).astype(dtype.numpy)
        table = tables[(n, dtype)] = backend.from_numpy(t)
    return table


def _launch(backend: Any, knl: Any, total: int, *args: Any) -> None:
    gsize, lsize = backend.rt.grid(total)
    knl(backend.rt.queue, gsize, lsize, *args)


def _lines(backend: Any, h: Any, n: int, sign: float, scale: float) -> Any:
    """The FFT of every contiguous line of n points of h (complex, contiguous, n > 1), times scale."""
    dtype = backend.dtype_of(h)
    real = np.float32 if dtype is dt.complex64 else np.float64
    lines = math.prod(h.shape) // n
    radices = plan(n)
    assert radices is not None
    tw = _twiddles(backend, n, dtype)
    src, ns = h, 1
    for i, r in enumerate(radices):
        dst = backend.empty(tuple(h.shape), dtype)
        last = i == len(radices) - 1
        _launch(backend, _kernel(backend, dtype, f"ember_fft_r{r}"), lines * (n // r), src.buf, np.int64(src.eoff),
                dst.buf, np.int64(dst.eoff), tw.buf, np.int64(tw.eoff), np.int64(n), np.int64(ns), np.int64(lines),
                real(sign), real(scale if last else 1.0))
        src, ns = dst, ns * r
    return src


def _scale(norm: str, n: int, forward: bool) -> float:
    if norm == "ortho":
        return 1 / math.sqrt(n)
    return 1 / n if (norm == "forward") == forward else 1.0


def _resize(backend: Any, h: Any, d: int, n: int) -> Any:
    """h cropped or zero-padded at the end of dim d to n."""
    have = h.shape[d]
    if have == n:
        return h
    pads = tuple((0, n - have) if i == d else (0, 0) for i in range(len(h.shape)))
    return backend.pad(h, pads, "constant", 0)


def _c2c_dim(backend: Any, h: Any, d: int, n: int, norm: str, forward: bool) -> Any:
    """The 1-D transform of h along dim d (resized to n first)."""
    h = _resize(backend, h, d, n)
    nd = len(h.shape)
    scale = _scale(norm, n, forward)
    if n <= 1 or math.prod(h.shape) == 0:
        out = backend.contiguous(h)
        return backend.binary("mul", out, scale) if scale != 1.0 and math.prod(h.shape) else out
    order = [i for i in range(nd) if i != d] + [d]
    moved = backend.contiguous(backend.permute(h, tuple(order)))
    out = _lines(backend, moved, n, -1.0 if forward else 1.0, scale)
    back = [0] * nd
    for i, o in enumerate(order):
        back[o] = i
    return backend.permute(out, tuple(back))


#: ``EMBER_OPENCL_FFT``: ``auto`` (default: the device kernel on GPUs and accelerators, pocketfft on the host for a
#: CPU runtime such as PoCL, where the host is the same cores and pocketfft is many times faster than the generic
#: kernel), ``device`` (always the kernel, for every size it handles) or ``host`` (always the host fallback)
FFT_ENV = "EMBER_OPENCL_FFT"
_MODES = ("auto", "device", "host")


def mode() -> str:
    """The FFT policy on OpenCL from ``EMBER_OPENCL_FFT`` (read per call: tests and users switch it at run time)."""
    value = os.environ.get(FFT_ENV, "auto").strip().lower() or "auto"
    if value not in _MODES:
        raise ValueRangeError(f"{FFT_ENV}={value!r}: expected one of {', '.join(_MODES)}")
    return value


def _device_ok(backend: Any, dtype: dt.DType, sizes: tuple[int, ...]) -> bool:
    """Whether the device kernel runs this transform: the policy (:func:`mode`), a complex dtype the device stores,
    and every size a product of the radices."""
    policy = mode()
    if policy == "host" or (policy == "auto" and getattr(backend.rt, "is_cpu", False)):
        return False
    return dtype in _TYPES and dtype in backend.supported_dtypes and all(n <= 1 or plan(n) is not None
                                                                       for n in sizes)


def _to_complex(backend: Any, h: Any) -> Any:
    dtype = backend.dtype_of(h)
    return h if dtype.is_complex else backend.cast(h, dtype.to_complex)


def _c2c(backend: Any, h: Any, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str, forward: bool) -> Any:
    ctype = backend.dtype_of(h).to_complex
    if not _device_ok(backend, ctype, s):
        return backend.from_numpy(host_c2c(np.asarray(backend.to_numpy(h)), s, dims, norm, forward))
    out = _to_complex(backend, h)
    for d, n in zip(dims, s):
        out = _c2c_dim(backend, out, d, n, norm, forward)
    return backend.contiguous(out)


def _r2c(backend: Any, h: Any, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> Any:
    ctype = backend.dtype_of(h).to_complex
    if not _device_ok(backend, ctype, s):
        return backend.from_numpy(host_r2c(np.asarray(backend.to_numpy(h)), s, dims, norm))
    full = _c2c(backend, h, s=s, dims=dims, norm=norm, forward=True)
    last = dims[-1]
    key = tuple(slice(0, s[-1] // 2 + 1) if i == last else slice(None) for i in range(len(full.shape)))
    return backend.contiguous(backend.getitem(full, key))


def _c2r(backend: Any, h: Any, *, s: tuple[int, ...], dims: tuple[int, ...], norm: str) -> Any:
    dtype = backend.dtype_of(h)
    if not _device_ok(backend, dtype, s):
        return backend.from_numpy(host_c2r(np.asarray(backend.to_numpy(h)), s, dims, norm))
    out = h
    for d, n in zip(dims[:-1], s[:-1]):  # the full complex inverse over every dim but the last
        out = _c2c_dim(backend, out, d, n, norm, forward=False)
    last, n = dims[-1], s[-1]
    half = n // 2 + 1
    out = _resize(backend, out, last, half)
    nd = len(out.shape)
    order = [i for i in range(nd) if i != last] + [last]
    moved = backend.contiguous(backend.permute(out, tuple(order)))
    lines = math.prod(moved.shape[:-1])
    ext = backend.empty((*moved.shape[:-1], n), dtype)
    if lines and n:
        _launch(backend, _kernel(backend, dtype, "ember_fft_hermitian"), lines * n, moved.buf, np.int64(moved.eoff),
                ext.buf, np.int64(ext.eoff), np.int64(half), np.int64(n), np.int64(lines))
    scale = _scale(norm, n, False)
    if n > 1 and lines:
        ext = _lines(backend, ext, n, 1.0, scale)
    elif scale != 1.0 and lines:
        ext = backend.binary("mul", ext, scale)
    real = backend.empty(tuple(ext.shape), dtype.to_real)
    if lines and n:
        _launch(backend, _kernel(backend, dtype, "ember_fft_real"), lines * n, ext.buf, np.int64(ext.eoff),
                real.buf, np.int64(real.eoff), np.int64(lines * n))
    back = [0] * nd
    for i, o in enumerate(order):
        back[o] = i
    return backend.contiguous(backend.permute(real, tuple(back)))


def register() -> None:
    """Register the OpenCL kernels of signal.c2c, signal.r2c and signal.c2r (keyed by the backend name, so
    without ember-opencl they are never looked up)."""
    c2c.kernel("opencl")(_c2c)
    r2c.kernel("opencl")(_r2c)
    c2r.kernel("opencl")(_c2r)
