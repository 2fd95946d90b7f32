"""How each ember dtype lives in OpenCL C: the storage type, the type arithmetic happens in, loads and stores.

float16 is stored as ``half`` and moved with ``vload_half``/``vstore_half_rte`` (core OpenCL, no cl_khr_fp16
needed); bfloat16 is stored as ``ushort``; both compute in float, as PyTorch's CPU kernels do. bool is a ``uchar``
holding 0 or 1. complex64/complex128 are OpenCL's ``float2``/``double2`` (real part ``.x``, imaginary ``.y``, the
layout of numpy's complex types); their arithmetic is in :mod:`.complex_` (OpenCL only: CUDA's ``float2`` has no
operators, and the CUDA catalog lists no complex kernels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType

#: helpers every generated program may use (bfloat16 conversion with round-to-nearest-even, NaN kept quiet)
PREAMBLE = """
static inline float ember_bf16_load(ushort u) { return as_float(((uint)u) << 16); }
static inline ushort ember_bf16_store(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
"""

FP64_PRAGMA = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"


@dataclass(frozen=True)
class CType:
    """The OpenCL C view of one ember dtype."""

    dtype: DType
    storage: str  # element type of the buffer
    compute: str  # type arithmetic happens in
    scalar: type  # numpy scalar type of a kernel argument holding a compute-type value
    bits: int  # storage width (shift semantics)

    @property
    def is_float(self) -> bool:
        return self.dtype.is_floating_point

    @property
    def is_bool(self) -> bool:
        return self.dtype is dt.bool_

    @property
    def is_signed(self) -> bool:
        return self.dtype.is_signed

    def load(self, ptr: str, idx: str) -> str:
        if self.dtype is dt.float16:
            return f"vload_half({idx}, {ptr})"
        if self.dtype is dt.bfloat16:
            return f"ember_bf16_load({ptr}[{idx}])"
        return f"{ptr}[{idx}]"

    def store(self, ptr: str, idx: str, value: str) -> str:
        if self.dtype is dt.float16:
            return f"vstore_half_rte((float)({value}), {idx}, {ptr})"
        if self.dtype is dt.bfloat16:
            return f"{ptr}[{idx}] = ember_bf16_store((float)({value}))"
        if self.is_bool:
            return f"{ptr}[{idx}] = (uchar)(({value}) != 0)"
        return f"{ptr}[{idx}] = ({self.storage})({value})"

    def convert(self, value: str, src: CType) -> str:
        """A compute-type expression of this dtype from a compute value of src (float -> int truncates)."""
        if self.is_bool:
            return f"(uchar)(({value}) != 0)"
        if src.is_bool or src.compute == self.compute:
            return f"({self.compute})({value})"
        return f"({self.compute})({value})"

    def arg(self, value: object) -> np.generic:
        """A Python scalar as a kernel argument of the compute type."""
        if self.is_bool:
            return np.uint8(bool(value))
        return self.scalar(value)


CTYPES: dict[DType, CType] = {
    dt.bool_: CType(dt.bool_, "uchar", "uchar", np.uint8, 8),
    dt.uint8: CType(dt.uint8, "uchar", "uchar", np.uint8, 8),
    dt.int8: CType(dt.int8, "char", "char", np.int8, 8),
    dt.int16: CType(dt.int16, "short", "short", np.int16, 16),
    dt.int32: CType(dt.int32, "int", "int", np.int32, 32),
    dt.int64: CType(dt.int64, "long", "long", np.int64, 64),
    dt.float16: CType(dt.float16, "half", "float", np.float32, 16),
    dt.bfloat16: CType(dt.bfloat16, "ushort", "float", np.float32, 16),
    dt.float32: CType(dt.float32, "float", "float", np.float32, 32),
    dt.float64: CType(dt.float64, "double", "double", np.float64, 64),
    dt.complex64: CType(dt.complex64, "float2", "float2", np.complex64, 64),
    dt.complex128: CType(dt.complex128, "double2", "double2", np.complex128, 128),
}


def ctype(dtype: DType) -> CType:
    """The C view of an ember dtype."""
    return CTYPES[dtype]


_FLOAT_CAST_LITERAL = re.compile(r"\(float\)(-?\d+\.\d*(?:[eE][-+]?\d+)?)(?![\w.])")


def float_literals(source: str) -> str:
    """``(float)0.5`` -> ``0.5f``: a double literal in float code is an error or a warning on devices without fp64."""
    return _FLOAT_CAST_LITERAL.sub(r"\1f", source)


def header(*types: CType) -> str:
    """Pragmas and helpers for a program that touches these types."""
    fp64 = any(t.dtype is dt.float64 or t.dtype is dt.complex128 for t in types)
    return (FP64_PRAGMA if fp64 else "") + PREAMBLE
