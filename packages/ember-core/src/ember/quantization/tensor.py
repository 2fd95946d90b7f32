"""``QuantizedTensor``: a quantized value (packed data, scales, a format tag, the original shape and dtype).

Formats (the ``format`` tag):

* ``"nf4"`` / ``"fp4"``: 4-bit block quantization, bitsandbytes' algorithm (see :mod:`ember.quantization.ops`).
  The tensor is flattened (row-major); a size that is not a whole number of blocks is padded with zeros to one
  (zeros never change a block's absmax, so the real elements' codes and absmax equal bitsandbytes', whose last
  block is partial). ``data`` holds ``ceil(n / blocksize) * blocksize / 2`` bytes: its first ``ceil(n / 2)`` are
  bitsandbytes' packed bytes. With ``double_quant`` the float32 absmax is itself quantized: its mean is
  subtracted (``offset``) and the rest stored as int8 in blocks of 256, each with a float32 scale (``scale2``),
  symmetric absmax scaling. (bitsandbytes quantizes this second level with its dynamic 8-bit map instead: the
  4-bit codes are the same, the absmax dequantizes slightly differently.)
* ``"int8"``: ``q = clamp(round(x / scale) + zero_point, qmin, qmax)``, ``x ≈ (q - zero_point) * scale``, round
  half to even. ``scheme="symmetric"``: ``scale = absmax / 127``, no zero point, q in [-127, 127];
  ``"asymmetric"``: ``scale = (max(x_max, 0) - min(x_min, 0)) / 255``, ``zero_point = clamp(-128 -
  round(x_min / scale), -128, 127)``, q in [-128, 127] (PyTorch's qint8 affine min/max rule). ``granularity``:
  ``"per_tensor"``, ``"per_channel"`` (one scale per index of ``axis``) or ``"per_block"`` (symmetric, blocks of
  ``blocksize`` over the flattened tensor, padded as above). A zero range gets scale 1.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .. import dtypes as dt
from ..errors import DTypeError, ShapeError, ValueRangeError
from ..tensor import Tensor
from . import ops as _ops

__all__ = ["FORMATS", "QuantizedTensor", "dequantize", "quantize", "quantize_4bit", "quantize_int8"]

FORMATS = ("nf4", "fp4", "int8")
SCHEMES = ("symmetric", "asymmetric")
GRANULARITIES = ("per_tensor", "per_channel", "per_block")
#: the block size of double quantization's second level (bitsandbytes': 256)
DQ_BLOCK = 256


class QuantizedTensor:
    """A quantized tensor: ``data`` (uint8 packed nibbles or int8 values), ``scale`` (float32 absmax or scales; int8
    when double-quantized), optional ``zero_point``, ``scale2`` and ``offset`` (double quantization), the format
    tag and the original ``shape`` and ``dtype``. ``dequantize()`` gives the float tensor back.

    Build one with :func:`quantize`; it is a value (no autograd): what it stores never requires grad.
    """

    __slots__ = ("data", "scale", "zero_point", "scale2", "offset", "format", "shape", "dtype", "blocksize",
                 "scheme", "granularity", "axis")

    def __init__(self, data: Tensor, scale: Tensor, *, format: str, shape: tuple[int, ...], dtype: dt.DType,
                 blocksize: int | None = None, scheme: str | None = None, granularity: str | None = None,
                 axis: int | None = None, zero_point: Tensor | None = None, scale2: Tensor | None = None,
                 offset: Tensor | None = None) -> None:
        if format not in FORMATS:
            raise ValueRangeError(f"QuantizedTensor: format must be one of {FORMATS}, got {format!r}")
        self.data, self.scale, self.zero_point = data, scale, zero_point
        self.scale2, self.offset = scale2, offset
        self.format, self.shape, self.dtype = format, tuple(int(s) for s in shape), dtype
        self.blocksize, self.scheme, self.granularity, self.axis = blocksize, scheme, granularity, axis

    # -- description ------------------------------------------------------------------------------------------------
    @property
    def double_quant(self) -> bool:
        """Whether the absmax is itself quantized (4-bit formats)."""
        return self.scale2 is not None

    @property
    def device(self) -> Any:
        """The device of the stored tensors."""
        return self.data.device

    def numel(self) -> int:
        """Element count of the original tensor."""
        return math.prod(self.shape)

    def nbytes(self) -> int:
        """Bytes of storage (data and every scale)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def tensors(self) -> dict[str, Tensor]:
        """The stored tensors by part name (``data``, ``scale`` and those present of ``zero_point``, ``scale2``,
        ``offset``): what records save."""
        parts = {"data": self.data, "scale": self.scale, "zero_point": self.zero_point, "scale2": self.scale2,
                 "offset": self.offset}
        return {k: v for k, v in parts.items() if v is not None}

    def tag(self) -> dict[str, Any]:
        """The format tag (JSON-able): format, shape, dtype and the format's settings."""
        tag: dict[str, Any] = {"format": self.format, "shape": list(self.shape), "dtype": self.dtype.name}
        for k in ("blocksize", "scheme", "granularity", "axis"):
            v = getattr(self, k)
            if v is not None:
                tag[k] = v
        if self.format != "int8":
            tag["double_quant"] = self.double_quant
        return tag

    @classmethod
    def from_parts(cls, tag: dict[str, Any] | str, parts: dict[str, Tensor]) -> QuantizedTensor:
        """Rebuild from :meth:`tag` and :meth:`tensors` (what records load); a malformed tag is a typed error."""
        info = json.loads(tag) if isinstance(tag, str) else dict(tag)
        try:
            dtype = getattr(dt, info["dtype"])
            missing = [k for k in ("data", "scale") if k not in parts]
            if missing or not isinstance(dtype, dt.DType):
                raise KeyError(missing or "dtype")
            return cls(parts["data"], parts["scale"], format=info["format"], shape=tuple(info["shape"]),
                       dtype=dtype, blocksize=info.get("blocksize"), scheme=info.get("scheme"),
                       granularity=info.get("granularity"), axis=info.get("axis"),
                       zero_point=parts.get("zero_point"), scale2=parts.get("scale2"), offset=parts.get("offset"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueRangeError(f"QuantizedTensor.from_parts: malformed format tag {info!r} or parts "
                                  f"{sorted(parts)} (missing {exc})") from exc

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v!r}" for k, v in self.tag().items() if k not in ("format", "shape", "dtype"))
        return (f"QuantizedTensor(format={self.format!r}, shape={self.shape}, dtype={self.dtype.name}"
                f"{', ' + extra if extra else ''})")

    # -- values -----------------------------------------------------------------------------------------------------
    def absmax(self) -> Tensor:
        """4-bit formats: the float32 block absmax (dequantizing the second level under double quantization)."""
        if self.format == "int8":
            raise ValueRangeError(f"QuantizedTensor.absmax: an {self.format} tensor has scales, not a block absmax")
        if self.scale2 is None:
            return self.scale
        assert self.offset is not None
        q = self.scale.to(dt.float32).reshape(-1, DQ_BLOCK)
        vals = (q * (self.scale2 / 127).unsqueeze(-1)).reshape(-1) + self.offset
        return vals[:self.data.shape[0] * 2 // self.blocksize]  # type: ignore[operator]

    def dequantize(self, dtype: dt.DType | None = None) -> Tensor:
        """The float tensor this stands for, in ``dtype`` (default: the original dtype)."""
        out_dtype = self.dtype if dtype is None else dtype
        if not isinstance(out_dtype, dt.DType) or not out_dtype.is_floating_point:
            raise DTypeError(f"QuantizedTensor.dequantize: dtype must be a floating-point ember dtype, got {dtype!r}")
        n = self.numel()
        if self.format != "int8":
            flat = _ops.dequantize_4bit(self.data, self.absmax(), blocksize=self.blocksize,
                                        quant_type=self.format, dtype=dt.float32)
            return flat[:n].reshape(self.shape).to(out_dtype)
        if self.granularity == "per_block":
            bs = self.blocksize
            assert bs is not None
            vals = _ops.dequantize_int8(self.data.reshape(1, -1, bs), self.scale, None, dtype=out_dtype)
            return vals.reshape(-1)[:n].reshape(self.shape)
        outer, c, inner = _channel_view(self.shape, self.granularity, self.axis)  # type: ignore[arg-type]
        zp = self.zero_point.reshape(c) if self.zero_point is not None else None
        vals = _ops.dequantize_int8(self.data.reshape(outer, c, inner), self.scale.reshape(c), zp, dtype=out_dtype)
        return vals.reshape(self.shape)


def _channel_view(shape: tuple[int, ...], granularity: str, axis: int | None) -> tuple[int, int, int]:
    """(outer, channels, inner) of an int8 tensor of ``shape``: the int8 ops' layout (one scale per channel)."""
    if granularity == "per_channel":
        assert axis is not None
        return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    return 1, 1, math.prod(shape)


# -- quantizing -------------------------------------------------------------------------------------------------------
def _check_float(op: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected an ember Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point tensor, got {x.dtype.name} of shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ShapeError(f"{op}: cannot quantize an empty tensor (shape {tuple(x.shape)})")
    return x


def _padded_flat(x: Tensor, blocksize: int) -> Tensor:
    """x flattened (float32) and padded with zeros to a whole number of blocks."""
    from ..ops.creation import zeros
    from ..ops.shape import cat

    flat = x.detach().to(dt.float32).reshape(-1)
    pad = -flat.shape[0] % blocksize
    return cat([flat, zeros(pad, dtype=dt.float32, device=x.device)]) if pad else flat


def _fixed_order_mean(x: Tensor) -> Tensor:
    """The mean of a flat float32 tensor summed in one fixed order on every backend (a pairwise tree of elementwise
    adds over the zero-padded power-of-two length): a backend's own reduction sums in its own order, and the
    double-quantization offset must not depend on the device that quantized."""
    from ..ops.creation import zeros
    from ..ops.shape import cat

    n = x.shape[0]
    size = 1 << max(n - 1, 0).bit_length()
    s = cat([x, zeros(size - n, dtype=x.dtype, device=x.device)]) if size > n else x
    while s.shape[0] > 1:
        half = s.reshape(2, -1)
        s = half[0] + half[1]
    return s.reshape(()) / n


def _double_quant(absmax: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(int8 codes, float32 scale per block of 256, float32 offset) of the block absmax."""
    from ..ops.pointwise import where

    offset = _fixed_order_mean(absmax)
    centred = _padded_flat(absmax - offset, DQ_BLOCK).reshape(-1, DQ_BLOCK)
    amax = centred.abs().amax(-1)
    safe = where(amax > 0, amax, 1.0)
    q = (centred / (safe / 127).unsqueeze(-1)).round().clamp(-127, 127).to(dt.int8).reshape(-1)
    return q, safe, offset.reshape(1)


def quantize_4bit(x: Tensor, quant_type: str = "nf4", blocksize: int = 64,
                  double_quant: bool = False) -> QuantizedTensor:
    """NF4/FP4 block quantization of ``x`` (any shape, flattened row-major), bit-exact with bitsandbytes'
    ``quantize_4bit`` on the float32 values; ``double_quant`` also quantizes the absmax (module docstring)."""
    op = "quantize_4bit"
    _check_float(op, x)
    _ops.check_4bit(op, blocksize, quant_type)
    if not isinstance(double_quant, bool):
        raise DTypeError(f"{op}: double_quant must be a bool, got {type(double_quant).__name__}")
    packed, absmax = _ops.quantize_4bit(_padded_flat(x, blocksize), blocksize=blocksize, quant_type=quant_type)
    kw: dict[str, Any] = {}
    scale = absmax
    if double_quant:
        scale, kw["scale2"], kw["offset"] = _double_quant(absmax)
    return QuantizedTensor(packed, scale, format=quant_type, shape=tuple(x.shape), dtype=x.dtype,
                           blocksize=blocksize, **kw)


def quantize_int8(x: Tensor, scheme: str = "symmetric", granularity: str = "per_tensor", axis: int = 0,
                  blocksize: int = 64) -> QuantizedTensor:
    """int8 quantization of ``x`` (module docstring): ``scheme`` symmetric/asymmetric, ``granularity`` per
    tensor, per channel (along ``axis``) or per block (symmetric, ``blocksize`` a power of two in [32, 4096])."""
    from ..ops.pointwise import where

    op = "quantize_int8"
    _check_float(op, x)
    if scheme not in SCHEMES:
        raise ValueRangeError(f"{op}: scheme must be one of {SCHEMES}, got {scheme!r}")
    if granularity not in GRANULARITIES:
        raise ValueRangeError(f"{op}: granularity must be one of {GRANULARITIES}, got {granularity!r}")
    xf = x.detach().to(dt.float32)
    shape = tuple(x.shape)
    if granularity == "per_block":
        if scheme != "symmetric":
            raise ValueRangeError(f"{op}: per_block int8 is symmetric only, got scheme={scheme!r}")
        _ops.check_4bit(op, blocksize, "nf4")
        blocks = _padded_flat(xf, blocksize).reshape(-1, blocksize)
        amax = blocks.abs().amax(-1)
        scale = where(amax > 0, amax / 127, 1.0)
        q = _ops.quantize_int8(blocks.reshape(1, -1, blocksize), scale, None, qmin=-127, qmax=127).reshape(-1)
        return QuantizedTensor(q, scale, format="int8", shape=shape, dtype=x.dtype, blocksize=blocksize,
                               scheme=scheme, granularity=granularity)
    reduce: tuple[int, ...] | None = None
    ax: int | None = None
    if granularity == "per_channel":
        if isinstance(axis, bool) or not isinstance(axis, int) or not -x.ndim <= axis < max(x.ndim, 1) or x.ndim == 0:
            raise ValueRangeError(f"{op}: axis {axis!r} is out of range for a tensor of shape {shape}")
        ax = axis % x.ndim
        reduce = tuple(d for d in range(x.ndim) if d != ax)
    keep = {"dim": reduce, "keepdim": True} if reduce is not None else {}
    if reduce == ():  # a 1-d tensor per channel: every element its own channel
        hi, lo = xf, xf
    elif reduce is None:
        hi, lo = xf.amax(), xf.amin()
    else:
        hi, lo = xf.amax(**keep), xf.amin(**keep)
    outer, c, inner = _channel_view(shape, granularity, ax)
    x3 = xf.reshape(outer, c, inner)
    if scheme == "symmetric":
        amax = where(hi.abs() > lo.abs(), hi.abs(), lo.abs())
        scale = where(amax > 0, amax / 127, 1.0)
        q = _ops.quantize_int8(x3, scale.reshape(c), None, qmin=-127, qmax=127).reshape(shape)
        zp = None
    else:
        hi, lo = hi.clamp_min(0.0), lo.clamp_max(0.0)
        rng = hi - lo
        scale = where(rng > 0, rng / 255, 1.0)
        zpf = (-128 - (lo / scale).round()).clamp(-128, 127)
        q = _ops.quantize_int8(x3, scale.reshape(c), zpf.reshape(c), qmin=-128, qmax=127).reshape(shape)
        zp = zpf.to(dt.int8)
    return QuantizedTensor(q, scale, format="int8", shape=shape, dtype=x.dtype, scheme=scheme,
                           granularity=granularity, axis=ax, zero_point=zp)


def quantize(x: Tensor, format: str = "nf4", **options: Any) -> QuantizedTensor:
    """Quantize ``x`` to ``format`` (``"nf4"``, ``"fp4"`` or ``"int8"``); ``options`` go to :func:`quantize_4bit`
    (``blocksize``, ``double_quant``) or :func:`quantize_int8` (``scheme``, ``granularity``, ``axis``,
    ``blocksize``).

    >>> import ember
    >>> from ember import quantization as Q
    >>> q = Q.quantize(ember.tensor([[0.5, -1.0], [0.25, 0.0]]), "nf4", blocksize=32)
    >>> q
    QuantizedTensor(format='nf4', shape=(2, 2), dtype=float32, blocksize=32, double_quant=False)
    >>> q.data[:2].tolist(), q.dequantize().tolist()
    ([192, 167], [[0.44070982933044434, -1.0], [0.24611230194568634, 0.0]])
    """
    if format in ("nf4", "fp4"):
        return quantize_4bit(x, format, **options)
    if format == "int8":
        return quantize_int8(x, **options)
    raise ValueRangeError(f"quantize: format must be one of {FORMATS}, got {format!r}")


def dequantize(q: QuantizedTensor, dtype: dt.DType | None = None) -> Tensor:
    """``q.dequantize(dtype)``."""
    if not isinstance(q, QuantizedTensor):
        raise DTypeError(f"dequantize: expected a QuantizedTensor, got {type(q).__name__}")
    return q.dequantize(dtype)
