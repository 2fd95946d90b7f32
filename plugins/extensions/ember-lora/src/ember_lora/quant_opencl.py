"""OpenCL kernels for core's quantization ops (``ember.quantization.ops``): ``quant.quantize_4bit``,
``quant.dequantize_4bit``, ``quant.matmul_4bit`` (NF4/FP4, the weight dequantized on the fly), ``quant.quantize_int8``
and ``quant.dequantize_int8``.

They run on the OpenCL backend's own handles through its public kernel API (``compile_kernel``, ``empty``,
``contiguous``, ``cast``, ``from_numpy``, ``rt.queue``, ``h.buf``/``h.eoff``) -- ember-opencl is not imported, as
ember-linalg's device kernels do. ember-lora registers them when the plugin loads; without ember-lora (or on
backends without kernels) the ops run their compositions in ember ops, which these kernels equal:

* quantize (4-bit): one work-item per block: the absmax (NaN propagates, as numpy's max), the float32 reciprocal
  (0 for an all-zero block), each scaled value's code as the count of decision thresholds it exceeds (a tie goes to
  the lower code; NaN gets code 0), two codes per byte, high nibble first. Bit-exact with the composition and with
  ember-flex: every step is one correctly rounded float32 operation (the backend builds with
  ``-cl-fp32-correctly-rounded-divide-sqrt`` where the device offers it) and the tables are the float32 values of
  :mod:`ember.quantization.ops`, written into the program as exact hexadecimal float literals.
* dequantize (4-bit): one work-item per byte, ``codebook[code] * absmax`` in float32 (bit-exact).
* int8: one work-item per element, ``clamp(rint(x / scale) + zero_point, qmin, qmax)`` (``rint`` rounds half to even
  as ``round`` does) and ``(q - zero_point) * scale`` (bit-exact for finite input).
* matmul: the weight is dequantized a chunk of rows at a time (about :data:`CHUNK_ELEMENTS` weights, a whole
  number of blocks) into one reused device buffer, and each chunk is one product on the backend's own autotuned
  GEMM (``backend.matmul``) into its columns of the output (or, for the transposed product the backward needs,
  accumulated into the output): the float weight never exists whole, as in ember-flex's kernel. A GEMM that decodes
  the 4-bit codes inside its tile loads was measured too: on PoCL it ran 5-10x slower than the tuned GEMM plus a
  dequantization pass, whose cost is one read of the packed weight per product. It agrees with
  dequantize-then-matmul to float rounding (the chunks' GEMMs may pick other tiles than the whole product's).

Other floating dtypes (bfloat16, float16) compute in float32 and are cast back on the device, as the compositions
and ember-flex do.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.quantization import ops as qops

__all__ = ["CHUNK_ELEMENTS", "dequantize_4bit", "dequantize_int8", "matmul_4bit", "quantize_4bit", "quantize_int8",
           "register"]

#: weights dequantized per matmul chunk (4 MiB of float32), as ember-flex's kernel
CHUNK_ELEMENTS = 1 << 20

_CTYPES = {dt.float32: "float", dt.float64: "double"}

_SOURCE = """{pragma}
#define T {ctype}

/* the tables of ember.quantization.ops as exact float32 literals */
__constant float ember_q4_codebooks[2][16] = {{ {{{nf4_code}}}, {{{fp4_code}}} }};
__constant float ember_q4_nf4_thr[15] = {{{nf4_thr}}};
__constant float ember_q4_fp4_thr[7] = {{{fp4_thr}}};
__constant uchar ember_q4_fp4_order[8] = {{{fp4_order}}};

/* NF4/FP4 code of a scaled value: NF4 counts its 15 signed thresholds exceeded, FP4 its 7 magnitude thresholds
   (mapped to the magnitude code) plus the sign bit. */
inline uchar ember_q4_code(const float v, const int fp4) {{
    if (isnan(v)) return 0;
    if (!fp4) {{
        uchar c = 0;
        for (int k = 0; k < 15; ++k) c += v > ember_q4_nf4_thr[k];
        return c;
    }}
    const float a = fabs(v);
    int k = 0;
    for (int j = 0; j < 7; ++j) k += a > ember_q4_fp4_thr[j];
    return ember_q4_fp4_order[k] | (v < 0.0f ? 8 : 0);
}}

__kernel void ember_q4_quantize(__global const float* x, long x_off, __global uchar* packed, long p_off,
                                __global float* absmax, long a_off, int blocksize, int fp4) {{
    const long b = get_global_id(0);
    __global const float* xb = x + x_off + b * blocksize;
    float m = 0.0f;
    for (int i = 0; i < blocksize; ++i) {{
        const float a = fabs(xb[i]);
        if (isnan(a) || a > m) m = a;  /* once NaN, stays NaN: numpy's max */
    }}
    absmax[a_off + b] = m;
    const float r = m > 0.0f ? 1.0f / m : 0.0f;
    __global uchar* pb = packed + p_off + b * (blocksize / 2);
    for (int i = 0; i < blocksize; i += 2) {{
        const uchar hi = ember_q4_code(xb[i] * r, fp4);
        const uchar lo = ember_q4_code(xb[i + 1] * r, fp4);
        pb[i / 2] = (uchar)((hi << 4) | lo);
    }}
}}

/* 4-bit dequantization, one packed byte (two values) per work-item. */
__kernel void ember_q4_dequantize(__global const uchar* packed, long p_off, __global const float* absmax, long a_off,
                                  int fp4, __global T* out, long o_off, int blocksize) {{
    __constant const float* code = ember_q4_codebooks[fp4];
    const long i = get_global_id(0);
    const uchar byte = packed[p_off + i];
    const float m = absmax[a_off + (2 * i) / blocksize];
    out[o_off + 2 * i] = (T)(code[byte >> 4] * m);
    out[o_off + 2 * i + 1] = (T)(code[byte & 15] * m);
}}

/* int8 quantization / dequantization, one element per work-item; x viewed as (outer, C, inner). */
__kernel void ember_q8_quantize(__global const float* x, long x_off, __global const float* scale, long s_off,
                                __global const float* zp, long z_off, int has_zp, __global char* q, long q_off,
                                long c, long inner, int qmin, int qmax) {{
    const long i = get_global_id(0);
    const long ch = (i / inner) % c;
    float v = rint(x[x_off + i] / scale[s_off + ch]);
    if (has_zp) v = v + zp[z_off + ch];
    v = fmin(fmax(v, (float)qmin), (float)qmax);
    q[q_off + i] = (char)v;
}}

__kernel void ember_q8_dequantize(__global const char* q, long q_off, __global const float* scale, long s_off,
                                  __global const char* zp, long z_off, int has_zp, __global T* out, long o_off,
                                  long c, long inner) {{
    const long i = get_global_id(0);
    const long ch = (i / inner) % c;
    float v = (float)q[q_off + i];
    if (has_zp) v = v - (float)zp[z_off + ch];
    out[o_off + i] = (T)(v * scale[s_off + ch]);
}}
"""


def _hex_floats(values: Any) -> str:
    """C hexadecimal float literals of the float32 values: exact, whatever the compiler's decimal rounding."""
    return ", ".join(f"{float(v).hex()}f" for v in np.asarray(values, dtype=np.float32))


def _source(dtype: dt.DType) -> str:
    pragma = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" if dtype is dt.float64 else ""
    return _SOURCE.format(pragma=pragma, ctype=_CTYPES[dtype],
                          nf4_code=_hex_floats(qops.CODEBOOKS["nf4"]), fp4_code=_hex_floats(qops.CODEBOOKS["fp4"]),
                          nf4_thr=_hex_floats(qops.THRESHOLDS["nf4"]), fp4_thr=_hex_floats(qops.THRESHOLDS["fp4"]),
                          fp4_order=", ".join(str(int(v)) for v in qops.FP4_ORDER))


_SOURCES: dict[dt.DType, str] = {}


def _kernel(backend: Any, dtype: dt.DType, name: str) -> Any:
    src = _SOURCES.get(dtype)
    if src is None:
        src = _SOURCES[dtype] = _source(dtype)
    return backend.compile_kernel(src, name)


def _work_dtype(backend: Any, dtype: dt.DType) -> dt.DType:
    """The dtype a kernel computes in: the input's when it has a kernel, else float32 (cast around)."""
    if dtype is dt.float64 and dt.float64 in getattr(backend, "supported_dtypes", (dt.float64,)):
        return dt.float64
    return dt.float32


def _cast(backend: Any, h: Any, dtype: dt.DType) -> Any:
    return h if backend.dtype_of(h) is dtype else backend.cast(h, dtype)


def quantize_4bit(backend: Any, x: Any, *, blocksize: int, quant_type: str) -> tuple[Any, Any]:
    """Packed codes (uint8) and block absmax (float32) of a flat tensor of whole blocks."""
    x = backend.contiguous(_cast(backend, x, dt.float32))
    n = x.shape[0]
    blocks = n // blocksize
    packed = backend.empty((n // 2,), dt.uint8)
    absmax = backend.empty((blocks,), dt.float32)
    if blocks:
        knl = _kernel(backend, dt.float32, "ember_q4_quantize")
        knl(backend.rt.queue, (blocks,), None, x.buf, np.int64(x.eoff), packed.buf, np.int64(packed.eoff),
            absmax.buf, np.int64(absmax.eoff), np.int32(blocksize),
            np.int32(quant_type == "fp4"))
    return packed, absmax


def dequantize_4bit(backend: Any, packed: Any, absmax: Any, *, blocksize: int, quant_type: str,
                    dtype: dt.DType = dt.float32) -> Any:
    """The flat values ``codebook[code] * absmax`` (float32 arithmetic) in ``dtype``."""
    packed, absmax = backend.contiguous(packed), backend.contiguous(absmax)
    work = _work_dtype(backend, dtype)
    nbytes = packed.shape[0]
    out = backend.empty((2 * nbytes,), work)
    if nbytes:
        knl = _kernel(backend, work, "ember_q4_dequantize")
        knl(backend.rt.queue, (nbytes,), None, packed.buf, np.int64(packed.eoff), absmax.buf, np.int64(absmax.eoff),
            np.int32(quant_type == "fp4"), out.buf, np.int64(out.eoff), np.int32(blocksize))
    return _cast(backend, out, dtype)


def _dequantize_range(backend: Any, packed: Any, absmax: Any, block0: int, blocks: int, blocksize: int,
                      fp4: bool, out: Any) -> None:
    """Dequantize ``blocks`` blocks from block ``block0`` into the start of ``out`` (flat, float32 or float64)."""
    nbytes = blocks * blocksize // 2
    knl = _kernel(backend, backend.dtype_of(out), "ember_q4_dequantize")
    knl(backend.rt.queue, (nbytes,), None, packed.buf, np.int64(packed.eoff + block0 * blocksize // 2), absmax.buf,
        np.int64(absmax.eoff + block0), np.int32(fp4), out.buf, np.int64(out.eoff), np.int32(blocksize))


def _rows_per_chunk(out_features: int, in_features: int, blocksize: int) -> int:
    """Rows per chunk: a multiple of the rows that span whole blocks, about CHUNK_ELEMENTS weights."""
    step = blocksize // math.gcd(in_features, blocksize)
    rows = max(step, (CHUNK_ELEMENTS // max(in_features, 1)) // step * step)
    return min(rows, out_features)


def matmul_4bit(backend: Any, x: Any, packed: Any, absmax: Any, bias: Any, *, out_features: int, in_features: int,
                blocksize: int, quant_type: str, transpose: bool = False) -> Any:
    """``x @ W.T + bias`` (or ``x @ W``) with W dequantized a chunk of rows at a time into one reused buffer."""
    in_dtype = backend.dtype_of(x)
    work = _work_dtype(backend, in_dtype)
    x = backend.contiguous(_cast(backend, x, work))
    packed, absmax = backend.contiguous(packed), backend.contiguous(absmax)
    lead = tuple(x.shape[:-1])
    k = x.shape[-1]
    n = in_features if transpose else out_features
    rows = math.prod(lead)
    x2 = backend.reshape(x, (rows, k))
    fp4 = quant_type == "fp4"
    if rows == 0 or out_features == 0 or in_features == 0:
        out = backend.full((rows, n), 0, work)
    else:
        chunk = _rows_per_chunk(out_features, in_features, blocksize)
        buf = backend.empty((-(-chunk * in_features // blocksize) * blocksize,), work)
        out = backend.full((rows, n), 0, work) if transpose else None
        parts = []
        for r0 in range(0, out_features, chunk):
            r1 = min(r0 + chunk, out_features)
            e0, e1 = r0 * in_features, r1 * in_features  # e0 is on a block boundary (chunk spans whole blocks)
            b0 = e0 // blocksize
            _dequantize_range(backend, packed, absmax, b0, -(-e1 // blocksize) - b0, blocksize, fp4, buf)
            w = backend.reshape(backend.getitem(buf, (slice(0, e1 - e0),)), (r1 - r0, in_features))
            if transpose:  # x @ W: the chunk's rows of W meet the chunk's columns of x
                xs = backend.getitem(x2, (slice(None), slice(r0, r1)))
                backend.inplace_binary("add", out, backend.matmul(xs, w))
            else:
                parts.append(backend.matmul(x2, backend.permute(w, (1, 0))))
        if not transpose:
            out = parts[0] if len(parts) == 1 else backend.cat(parts, 1)
    if bias is not None:
        out = backend.binary("add", out, _cast(backend, bias, work))
    return _cast(backend, backend.reshape(out, (*lead, n)), in_dtype)


def quantize_int8(backend: Any, x: Any, scale: Any, zero_point: Any, *, qmin: int, qmax: int) -> Any:
    """``clamp(rint(x / scale) + zero_point, qmin, qmax)`` as int8, ``x`` (outer, C, inner), scale (C,)."""
    x, scale = backend.contiguous(x), backend.contiguous(scale)
    outer, c, inner = x.shape
    out = backend.empty(tuple(x.shape), dt.int8)
    total = outer * c * inner
    if total:
        zp = backend.contiguous(zero_point) if zero_point is not None else scale  # unread when has_zp=0
        knl = _kernel(backend, dt.float32, "ember_q8_quantize")
        knl(backend.rt.queue, (total,), None, x.buf, np.int64(x.eoff), scale.buf, np.int64(scale.eoff), zp.buf,
            np.int64(zp.eoff), np.int32(zero_point is not None), out.buf, np.int64(out.eoff), np.int64(c),
            np.int64(inner), np.int32(qmin), np.int32(qmax))
    return out


def dequantize_int8(backend: Any, q: Any, scale: Any, zero_point: Any, *, dtype: dt.DType = dt.float32) -> Any:
    """``(q - zero_point) * scale`` (float32 arithmetic) in ``dtype``, ``q`` (outer, C, inner), scale (C,)."""
    q, scale = backend.contiguous(q), backend.contiguous(scale)
    outer, c, inner = q.shape
    work = _work_dtype(backend, dtype)
    out = backend.empty(tuple(q.shape), work)
    total = outer * c * inner
    if total:
        zp = backend.contiguous(zero_point) if zero_point is not None else q  # unread when has_zp=0
        knl = _kernel(backend, work, "ember_q8_dequantize")
        knl(backend.rt.queue, (total,), None, q.buf, np.int64(q.eoff), scale.buf, np.int64(scale.eoff), zp.buf,
            np.int64(zp.eoff), np.int32(zero_point is not None), out.buf, np.int64(out.eoff), np.int64(c),
            np.int64(inner))
    return _cast(backend, out, dtype)


_KERNELS = {"quantize_4bit": quantize_4bit, "dequantize_4bit": dequantize_4bit, "matmul_4bit": matmul_4bit,
            "quantize_int8": quantize_int8, "dequantize_int8": dequantize_int8}


def register(backend_name: str = "opencl") -> None:
    """Register the kernels with core's quantization ops for the backend named ``backend_name`` (called when the
    ember-lora plugin loads)."""
    for name, fn in _KERNELS.items():
        getattr(qops, name).kernel(backend_name)(fn)
