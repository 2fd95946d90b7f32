"""The 4-bit block-quantization ops (NF4, FP4) as extension ops, with compositions in ember ops.

* ``quant.quantize_4bit(x, *, blocksize, quant_type)``: ``x`` flat, a whole number of blocks; returns the packed
  codes (uint8, two per byte, high nibble first) and the block absmax (float32).
* ``quant.dequantize_4bit(packed, absmax, *, blocksize, quant_type, dtype)``: ``code[nibble] * absmax``.
* ``quant.matmul_4bit(x, packed, absmax, bias, *, out_features, in_features, blocksize, quant_type,
  transpose)``: ``x @ dequant(W).T + bias`` (``transpose=False``; W is (out_features, in_features)) or
  ``x @ dequant(W)`` (``transpose=True``, what the backward needs). A backend kernel dequantizes the weight a
  chunk of rows at a time, never the whole matrix (ember-flex does). Its vjp is w.r.t. ``x`` and ``bias`` only:
  the quantized weight is frozen (QLoRA's base), so ``packed`` and ``absmax`` get no gradient.

The algorithm is bitsandbytes' (``quantize_4bit``/``dequantize_4bit``): per block of ``blocksize`` consecutive
elements the absmax ``m`` (float32), each element scaled by the float32 reciprocal ``1/m`` (0 for an all-zero
block), the code the first one whose decision threshold the scaled value does not exceed (``x > t`` picks the
upper code, so a value exactly on a midpoint goes to the lower code, as bitsandbytes' decision tree), and two codes
per byte, the first element in the high nibble. Dequantization is ``codebook[code] * m`` in float32.

* ``quant.quantize_int8(x, scale, zero_point, *, qmin, qmax)``: ``x`` float32 viewed as ``(outer, C, inner)`` with
  one float32 ``scale`` (and optional float32 ``zero_point``) per index of the middle dim: ``clamp(round(x / scale)
  + zero_point, qmin, qmax)`` as int8, rounding half to even. Per tensor is ``C = 1``, per channel the channel
  axis in the middle, per block ``(1, blocks, blocksize)``.
* ``quant.dequantize_int8(q, scale, zero_point, *, dtype)``: ``(q - zero_point) * scale`` in float32 (zero_point
  int8 or None), in ``dtype``.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, ValueRangeError
from ..extension import TensorSpec, backend_extension
from ..tensor import Tensor

__all__ = ["CODEBOOKS", "FP4_ORDER", "THRESHOLDS", "dequantize_4bit", "dequantize_int8", "matmul_4bit", "quantize_4bit",
           "quantize_int8"]

#: bitsandbytes' 16-value codebooks (float32 values), indexed by the 4-bit code
CODEBOOKS: dict[str, tuple[float, ...]] = {
    "nf4": (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
            0.7229568362236023, 1.0),
    # FP4 (e2m1, bias 3, absmax 12 scaled to 1): bit 3 is the sign
    "fp4": (0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,
            -0.0, -0.005208333333, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25),
}
#: the decision thresholds (float32 constants of bitsandbytes' quantization trees), ascending: NF4's 15 midpoints
#: over the signed value, FP4's 7 over the magnitude
THRESHOLDS: dict[str, tuple[float, ...]] = {
    "nf4": (-0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
            -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
            0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
            0.5016634166240692, 0.6427869200706482, 0.8614784181118011),
    "fp4": (0.00260417, 0.0859375, 0.20833333, 0.29166667, 0.4166667, 0.583333, 0.8333333),
}
#: FP4: the magnitude code for k thresholds exceeded (the codes in increasing magnitude order)
FP4_ORDER: tuple[int, ...] = (0, 1, 6, 7, 4, 5, 2, 3)

#: block sizes the 4-bit formats accept
BLOCK_SIZES = tuple(2 ** k for k in range(5, 13))


def check_4bit(op: str, blocksize: Any, quant_type: Any) -> None:
    """Refuse an unknown 4-bit format or block size with a typed error naming ``op``."""
    if quant_type not in CODEBOOKS:
        raise ValueRangeError(f"{op}: quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize not in BLOCK_SIZES:
        raise ValueRangeError(f"{op}: blocksize must be a power of two in [32, 4096], got {blocksize!r}")


def _codebook(quant_type: str, like: Tensor) -> Tensor:
    from ..ops.creation import tensor

    return tensor(CODEBOOKS[quant_type], dtype=dt.float32, device=like._device)


# -- quantize ---------------------------------------------------------------------------------------------------------
def _quantize_spec(x: TensorSpec, *, blocksize: int, quant_type: str) -> tuple[TensorSpec, TensorSpec]:
    op = "quantize_4bit"
    check_4bit(op, blocksize, quant_type)
    if x.ndim != 1 or x.shape[0] % blocksize:
        raise ShapeError(f"{op}: expected a flat tensor of whole blocks of {blocksize}, got shape {x.shape}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point tensor, got {x.dtype.name}")
    n = x.shape[0]
    return TensorSpec((n // 2,), dt.uint8), TensorSpec((n // blocksize,), dt.float32)


@backend_extension("quant.quantize_4bit", output=_quantize_spec, publish=False,
                   description="4-bit block quantization (NF4/FP4, bitsandbytes' algorithm)")
def quantize_4bit(x: Tensor, *, blocksize: int, quant_type: str) -> tuple[Tensor, Tensor]:
    """Quantize a flat float tensor (a whole number of blocks); returns ``(packed uint8, absmax float32)``."""
    from ..ops.creation import tensor
    from ..ops.indexing import take
    from ..ops.pointwise import where

    blocks = x.to(dt.float32).reshape(-1, blocksize)
    absmax = blocks.abs().amax(-1)
    nonzero = absmax > 0
    recip = where(nonzero, 1.0 / where(nonzero, absmax, 1.0), 0.0)  # float32 reciprocal, as bitsandbytes
    scaled = blocks * recip.unsqueeze(-1)
    thr = tensor(THRESHOLDS[quant_type], dtype=dt.float32, device=x._device)
    if quant_type == "nf4":
        codes = (scaled.unsqueeze(-1) > thr).sum(-1)
    else:
        order = tensor(FP4_ORDER, dtype=dt.int64, device=x._device)
        codes = take(order, (scaled.abs().unsqueeze(-1) > thr).sum(-1)) + (scaled < 0).to(dt.int64) * 8
    pairs = codes.reshape(-1, 2)
    packed = (pairs[:, 0] * 16 + pairs[:, 1]).to(dt.uint8)
    return packed, absmax


# -- dequantize -------------------------------------------------------------------------------------------------------
def _check_packed(op: str, packed: TensorSpec, absmax: TensorSpec, blocksize: int) -> int:
    """Check packed codes against their absmax; returns the element count (whole blocks)."""
    if packed.ndim != 1 or packed.dtype is not dt.uint8:
        raise DTypeError(f"{op}: expected packed codes as a flat uint8 tensor, got {packed.dtype.name} of shape "
                         f"{packed.shape}")
    if absmax.ndim != 1 or absmax.dtype is not dt.float32:
        raise DTypeError(f"{op}: expected absmax as a flat float32 tensor, got {absmax.dtype.name} of shape "
                         f"{absmax.shape}")
    n = packed.shape[0] * 2
    if n != absmax.shape[0] * blocksize:
        raise ShapeError(f"{op}: {packed.shape[0]} packed bytes hold {n} codes, but {absmax.shape[0]} blocks of "
                         f"{blocksize} need {absmax.shape[0] * blocksize}")
    return n


def _dequantize_spec(packed: TensorSpec, absmax: TensorSpec, *, blocksize: int, quant_type: str,
                     dtype: dt.DType = dt.float32) -> TensorSpec:
    op = "dequantize_4bit"
    check_4bit(op, blocksize, quant_type)
    n = _check_packed(op, packed, absmax, blocksize)
    if not isinstance(dtype, dt.DType) or not dtype.is_floating_point:
        raise DTypeError(f"{op}: dtype must be a floating-point ember dtype, got {dtype!r}")
    return TensorSpec((n,), dtype)


@backend_extension("quant.dequantize_4bit", output=_dequantize_spec, publish=False,
                   description="4-bit block dequantization (NF4/FP4): codebook[code] * absmax")
def dequantize_4bit(packed: Tensor, absmax: Tensor, *, blocksize: int, quant_type: str,
                    dtype: dt.DType = dt.float32) -> Tensor:
    """The flat float tensor the packed codes stand for, ``codebook[code] * absmax`` computed in float32."""
    from ..ops.indexing import take
    from ..ops.shape import stack

    p = packed.to(dt.int64)
    codes = stack([p // 16, p % 16], -1).reshape(-1)
    vals = take(_codebook(quant_type, packed), codes).reshape(-1, blocksize) * absmax.unsqueeze(-1)
    return vals.reshape(-1).to(dtype)


# -- matmul with the weight dequantized on the fly --------------------------------------------------------------------
def _matmul_spec(x: TensorSpec, packed: TensorSpec, absmax: TensorSpec, bias: Any, *, out_features: int,
                 in_features: int, blocksize: int, quant_type: str, transpose: bool = False) -> TensorSpec:
    op = "matmul_4bit"
    check_4bit(op, blocksize, quant_type)
    n = _check_packed(op, packed, absmax, blocksize)
    if n < out_features * in_features or n - out_features * in_features >= blocksize:
        raise ShapeError(f"{op}: {absmax.shape[0]} blocks of {blocksize} do not hold a "
                         f"({out_features}, {in_features}) weight")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point input, got {x.dtype.name}")
    k, m = (out_features, in_features) if transpose else (in_features, out_features)
    if x.ndim < 1 or x.shape[-1] != k:
        raise ShapeError(f"{op}: expected an input (..., {k}) for a ({out_features}, {in_features}) weight"
                         f"{' (transposed)' if transpose else ''}, got shape {x.shape}")
    if bias is not None:
        if not isinstance(bias, TensorSpec) or bias.shape != (m,) or bias.dtype is not x.dtype:
            raise ShapeError(f"{op}: expected bias of shape ({m},) and dtype {x.dtype.name}, got "
                             f"{getattr(bias, 'shape', bias)!r} {getattr(getattr(bias, 'dtype', None), 'name', '')}")
    return TensorSpec((*x.shape[:-1], m), x.dtype)


@backend_extension("quant.matmul_4bit", output=_matmul_spec, publish=False,
                   description="x @ dequant(W).T + b with a 4-bit (NF4/FP4) weight dequantized on the fly")
def matmul_4bit(x: Tensor, packed: Tensor, absmax: Tensor, bias: Tensor | None, *, out_features: int,
                in_features: int, blocksize: int, quant_type: str, transpose: bool = False) -> Tensor:
    """``x @ W.T + bias`` (or ``x @ W`` with ``transpose``) for the 4-bit weight W (out_features, in_features).

    The composition dequantizes the whole weight (in x's dtype); backend kernels work a chunk of rows at a time.
    """
    w = dequantize_4bit(packed, absmax, blocksize=blocksize, quant_type=quant_type, dtype=x.dtype)
    w = w[:out_features * in_features].reshape(out_features, in_features)
    out = x @ w if transpose else x @ w.T
    return out + bias if bias is not None else out


@matmul_4bit.vjp
def _matmul_4bit_vjp(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    x, packed, absmax, bias = ctx.inputs
    kw = dict(ctx.kwargs)
    kw["transpose"] = not kw.get("transpose", False)
    dx = matmul_4bit(grad, packed, absmax, None, **kw)  # the frozen weight gets no gradient
    db = None
    if bias is not None:
        db = grad.reshape(-1, grad.shape[-1]).sum(0) if grad.ndim > 1 else grad
    return dx, None, None, db


# -- int8 -------------------------------------------------------------------------------------------------------------
def _check_channels(op: str, x: TensorSpec, scale: TensorSpec, zero_point: Any, zp_dtype: dt.DType) -> None:
    if x.ndim != 3:
        raise ShapeError(f"{op}: expected a 3-d (outer, channels, inner) tensor, got shape {x.shape}")
    c = x.shape[1]
    if scale.dtype is not dt.float32 or scale.shape != (c,):
        raise ShapeError(f"{op}: expected a float32 scale of shape ({c},) for {x.shape}, got {scale.dtype.name} of "
                         f"shape {scale.shape}")
    if zero_point is not None and (not isinstance(zero_point, TensorSpec) or zero_point.shape != (c,)
                                   or zero_point.dtype is not zp_dtype):
        raise ShapeError(f"{op}: expected a {zp_dtype.name} zero_point of shape ({c},) for {x.shape}, got "
                         f"{getattr(getattr(zero_point, 'dtype', None), 'name', zero_point)!r} of shape "
                         f"{getattr(zero_point, 'shape', None)}")


def _quantize_int8_spec(x: TensorSpec, scale: TensorSpec, zero_point: Any, *, qmin: int, qmax: int) -> TensorSpec:
    op = "quantize_int8"
    if x.dtype is not dt.float32:
        raise DTypeError(f"{op}: expected a float32 tensor, got {x.dtype.name}")
    _check_channels(op, x, scale, zero_point, dt.float32)
    if not (isinstance(qmin, int) and isinstance(qmax, int) and -128 <= qmin < qmax <= 127):
        raise ValueRangeError(f"{op}: expected -128 <= qmin < qmax <= 127, got qmin={qmin!r}, qmax={qmax!r}")
    return TensorSpec(x.shape, dt.int8)


@backend_extension("quant.quantize_int8", output=_quantize_int8_spec, publish=False,
                   description="int8 quantization with a scale (and zero point) per channel")
def quantize_int8(x: Tensor, scale: Tensor, zero_point: Tensor | None, *, qmin: int, qmax: int) -> Tensor:
    """``clamp(round(x / scale) + zero_point, qmin, qmax)`` as int8 for ``x`` (outer, C, inner), scale (C,)."""
    c = x.shape[1]
    q = (x / scale.reshape(1, c, 1)).round()
    if zero_point is not None:
        q = q + zero_point.reshape(1, c, 1)
    return q.clamp(qmin, qmax).to(dt.int8)


def _dequantize_int8_spec(q: TensorSpec, scale: TensorSpec, zero_point: Any, *,
                          dtype: dt.DType = dt.float32) -> TensorSpec:
    op = "dequantize_int8"
    if q.dtype is not dt.int8:
        raise DTypeError(f"{op}: expected int8 codes, got {q.dtype.name}")
    _check_channels(op, q, scale, zero_point, dt.int8)
    if not isinstance(dtype, dt.DType) or not dtype.is_floating_point:
        raise DTypeError(f"{op}: dtype must be a floating-point ember dtype, got {dtype!r}")
    return TensorSpec(q.shape, dtype)


@backend_extension("quant.dequantize_int8", output=_dequantize_int8_spec, publish=False,
                   description="int8 dequantization: (q - zero_point) * scale per channel")
def dequantize_int8(q: Tensor, scale: Tensor, zero_point: Tensor | None, *, dtype: dt.DType = dt.float32) -> Tensor:
    """``(q - zero_point) * scale`` computed in float32, in ``dtype``, for ``q`` (outer, C, inner), scale (C,)."""
    c = q.shape[1]
    v = q.to(dt.float32)
    if zero_point is not None:
        v = v - zero_point.to(dt.float32).reshape(1, c, 1)
    return (v * scale.reshape(1, c, 1)).to(dtype)
