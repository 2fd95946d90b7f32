"""numpy kernels for core's 4-bit quantization ops (``quant.quantize_4bit``, ``quant.dequantize_4bit``,
``quant.matmul_4bit``; ember.quantization.ops has the algorithm, bitsandbytes').

* quantize: the block absmax, the float32 reciprocal, and the code of each scaled value as the count of decision
  thresholds it exceeds (``np.searchsorted(thresholds, v, side="left")``: ``v > t`` picks the upper code, so a
  tie goes to the lower one; NaN gets code 0 as bitsandbytes' decision tree gives it).
* dequantize: a 256-entry table of (high, low) code values per byte, one gather, then the absmax.
* matmul: the weight is dequantized a chunk of rows at a time (about ``CHUNK_ELEMENTS`` weights, a whole number
  of blocks) into one reused float buffer, and each chunk is one GEMM into its columns of the output (or, for the
  transposed product the backward needs, one GEMM accumulated into the output): the float weight never exists
  whole.

float32 and float64 inputs compute in their own dtype; other floating dtypes (bfloat16, float16) in float32,
cast back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["CHUNK_ELEMENTS", "register"]

#: weights dequantized per matmul chunk (4 MiB of float32)
CHUNK_ELEMENTS = 1 << 20

_TABLES: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}


def _tables(quant_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(byte -> (hi, lo) values (256, 2) float32, thresholds float32, FP4 magnitude order or None)."""
    got = _TABLES.get(quant_type)
    if got is None:
        from ember.quantization import ops

        code = np.asarray(ops.CODEBOOKS[quant_type], dtype=np.float32)
        b = np.arange(256)
        pair = np.stack([code[b >> 4], code[b & 15]], axis=1)
        order = np.asarray(ops.FP4_ORDER, dtype=np.uint8) if quant_type == "fp4" else None
        got = (pair, np.asarray(ops.THRESHOLDS[quant_type], dtype=np.float32), order)
        _TABLES[quant_type] = got
    return got


def quantize_4bit(backend: Any, x: np.ndarray, *, blocksize: int, quant_type: str) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes (uint8) and block absmax (float32) of a flat tensor of whole blocks."""
    _, thr, order = _tables(quant_type)
    blocks = x.astype(np.float32, copy=False).reshape(-1, blocksize)
    absmax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        recip = np.where(absmax > 0, np.float32(1) / absmax, np.float32(0)).astype(np.float32)
    scaled = blocks * recip[:, None]
    if order is None:
        codes = np.searchsorted(thr, scaled, side="left").astype(np.uint8)
    else:
        codes = order[np.searchsorted(thr, np.abs(scaled), side="left")]
        codes |= (scaled < 0).astype(np.uint8) << 3
    codes[np.isnan(scaled)] = 0
    pairs = codes.reshape(-1, 2)
    packed = (pairs[:, 0] << 4) | pairs[:, 1]
    return packed.astype(np.uint8, copy=False), absmax.astype(np.float32, copy=False)


def _dequant_into(packed: np.ndarray, absmax: np.ndarray, blocksize: int, pair: np.ndarray,
                  out: np.ndarray | None = None) -> np.ndarray:
    """float32 values of ``packed`` (whole blocks) into ``out`` (flat, float32) or a new array."""
    n = packed.shape[0] * 2
    if out is None:
        out = np.empty(n, np.float32)
    view = out[:n].reshape(-1, 2)
    np.take(pair, packed, axis=0, out=view)
    blocks = out[:n].reshape(-1, blocksize)
    blocks *= absmax[:, None]
    return out[:n]


def dequantize_4bit(backend: Any, packed: np.ndarray, absmax: np.ndarray, *, blocksize: int, quant_type: str,
                    dtype: Any = None) -> np.ndarray:
    """The flat values ``code * absmax`` (float32), in the op's ``dtype``."""
    pair, _, _ = _tables(quant_type)
    vals = _dequant_into(packed, absmax, blocksize, pair)
    want = np.dtype(dtype.numpy) if dtype is not None else np.dtype(np.float32)
    return vals if vals.dtype == want else vals.astype(want)


def _rows_per_chunk(out_features: int, in_features: int, blocksize: int) -> int:
    """Rows per chunk: a multiple of the rows that span whole blocks, about CHUNK_ELEMENTS weights."""
    step = blocksize // math.gcd(in_features, blocksize)
    rows = max(step, (CHUNK_ELEMENTS // max(in_features, 1)) // step * step)
    return min(rows, out_features) if rows < out_features else out_features


def matmul_4bit(backend: Any, x: np.ndarray, packed: np.ndarray, absmax: np.ndarray, bias: np.ndarray | None, *,
                out_features: int, in_features: int, blocksize: int, quant_type: str,
                transpose: bool = False) -> np.ndarray:
    """``x @ W.T + bias`` (or ``x @ W``) with W dequantized a chunk of rows at a time."""
    dt = x.dtype
    work = dt if dt in (np.float32, np.float64) else np.dtype(np.float32)
    pair, _, _ = _tables(quant_type)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).astype(work, copy=False)
    rows = _rows_per_chunk(out_features, in_features, blocksize)
    m = in_features if transpose else out_features
    out = np.zeros((x2.shape[0], m), work) if transpose else np.empty((x2.shape[0], m), work)
    buf = np.empty(-(-rows * in_features // blocksize) * blocksize, np.float32)
    for r0 in range(0, out_features, rows):
        r1 = min(r0 + rows, out_features)
        e0, e1 = r0 * in_features, r1 * in_features  # e0 is on a block boundary (rows is a multiple of step)
        b0, b1 = e0 // blocksize, -(-e1 // blocksize)
        vals = _dequant_into(packed[b0 * blocksize // 2:b1 * blocksize // 2], absmax[b0:b1], blocksize, pair, buf)
        w = vals[:e1 - e0].reshape(r1 - r0, in_features)
        if work != np.float32:
            w = w.astype(work)
        if transpose:
            out += x2[:, r0:r1] @ w
        else:
            out[:, r0:r1] = x2 @ w.T
    if bias is not None:
        out += bias.astype(work, copy=False)
    out = out.reshape(*lead, m)
    return out if out.dtype == dt else out.astype(dt)


def register() -> None:
    """Register the kernels with core's quantization ops (called when the flex plugin is loaded)."""
    from ember.quantization import ops

    ops.quantize_4bit.kernel("flex")(quantize_4bit)
    ops.dequantize_4bit.kernel("flex")(dequantize_4bit)
    ops.matmul_4bit.kernel("flex")(matmul_4bit)
