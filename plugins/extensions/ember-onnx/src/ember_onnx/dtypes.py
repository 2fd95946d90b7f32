"""ONNX tensor element types <-> ember dtypes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import ember

from .errors import OnnxDTypeError

#: ONNX elem_type -> ember dtype, for the types ember has
ONNX_TO_EMBER: dict[int, ember.DType] = {
    TensorProto.FLOAT: ember.float32, TensorProto.DOUBLE: ember.float64, TensorProto.FLOAT16: ember.float16,
    TensorProto.BFLOAT16: ember.bfloat16, TensorProto.INT8: ember.int8, TensorProto.INT16: ember.int16,
    TensorProto.INT32: ember.int32, TensorProto.INT64: ember.int64, TensorProto.UINT8: ember.uint8,
    TensorProto.BOOL: ember.bool_,
}
EMBER_TO_ONNX: dict[ember.DType, int] = {v: k for k, v in ONNX_TO_EMBER.items()}


def to_ember_dtype(elem_type: int, what: str = "") -> ember.DType:
    """The ember dtype of ONNX ``elem_type``; :class:`OnnxDTypeError` naming the type when ember has none."""
    try:
        return ONNX_TO_EMBER[elem_type]
    except KeyError:
        name = helper.tensor_dtype_to_string(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        where = f"{what}: " if what else ""
        raise OnnxDTypeError(f"{where}ONNX type {name} has no ember dtype (ember has "
                             f"{', '.join(d.name for d in ONNX_TO_EMBER.values())})") from None


def to_onnx_dtype(dtype: ember.DType) -> int:
    """The ONNX elem_type of an ember dtype."""
    return EMBER_TO_ONNX[dtype]


def numpy_dtype(dtype: ember.DType) -> np.dtype:
    """The numpy dtype matching an ember dtype (limits, host constants)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(EMBER_TO_ONNX[dtype]))
