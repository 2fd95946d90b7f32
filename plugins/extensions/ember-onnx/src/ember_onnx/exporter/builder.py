"""The ONNX graph under construction: value names, nodes, initializers, constants and symbolic ints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import ember

from ..dtypes import numpy_dtype, to_onnx_dtype
from .symbolic import DimRef, Path, SymInt


class Builder:
    """Collects nodes and initializers; ``sym`` turns a record's int literal into an int or an int64 tensor."""

    def __init__(self, opset: int, dims: Sequence[DimRef], syms: dict[tuple[int, Path], SymInt],
                 input_names: Sequence[str]) -> None:
        self.opset = opset
        self.nodes: list[Any] = []
        self.initializers: list[TensorProto] = []
        self.names: dict[int, str] = {}
        self.dims = list(dims)
        self.syms = syms
        self.input_names = list(input_names)
        self._dim_values: dict[int, str] = {}
        self._consts: dict[tuple[bytes, str, tuple[int, ...]], str] = {}
        self._counter = 0
        self.record_index = -1

    # -- names and nodes ------------------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A new unique value name."""
        self._counter += 1
        return f"{hint}_{self._counter}"

    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, outputs: Sequence[str] | None = None,
             **attrs: Any) -> list[str]:
        """Append a node; returns its output names (fresh unless given)."""
        outs = list(outputs) if outputs is not None else [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh("n_" + op_type),
                                           **{k: v for k, v in attrs.items() if v is not None}))
        return outs

    def one(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        """Append a one-output node and return the output's name."""
        return self.node(op_type, inputs, 1, **attrs)[0]

    def const(self, value: Any, dtype: ember.DType | None = None, name: str | None = None) -> str:
        """A constant: a named initializer (parameters, buffers) or, unnamed, a ``Constant`` node (deduplicated).

        Only model state becomes initializers, so an importer can treat every float initializer as trainable.
        """
        arr = np.asarray(value, dtype=numpy_dtype(dtype) if dtype is not None else None)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        if name is not None:
            self.initializers.append(numpy_helper.from_array(arr, name))
            return name
        key = (arr.tobytes(), str(arr.dtype), arr.shape)
        if arr.size <= 16 and key in self._consts:
            return self._consts[key]
        out = self.one("Constant", [], value=numpy_helper.from_array(arr))
        if arr.size <= 16:
            self._consts[key] = out
        return out

    def scalar_like(self, value: Any, dtype: ember.DType) -> str:
        """A 0-d constant of ``dtype`` (a Python scalar operand)."""
        return self.const(np.asarray(value).astype(numpy_dtype(dtype)), None)

    # -- symbolic ints --------------------------------------------------------------------------------------------
    def _dim(self, j: int) -> str:
        if j not in self._dim_values:
            d = self.dims[j]
            shape = self.one("Shape", [self.input_names[d.input_index]])
            self._dim_values[j] = self.one("Gather", [shape, self.const(np.array([d.axis], np.int64))], axis=0)
        return self._dim_values[j]

    def _emit(self, s: SymInt) -> str:
        if s.kind == "prod":
            out = self._dim(s.terms[0][0])
            for j, _ in s.terms[1:]:
                out = self.one("Mul", [out, self._dim(j)])
            return out if s.const == 1 else self.one("Mul", [out, self.const(np.array([s.const], np.int64))])
        out = self.const(np.array([s.const - sum(a * self.dims[j].size for j, a in s.terms)], np.int64))
        for j, a in s.terms:
            term = self._dim(j) if a == 1 else self.one("Mul", [self._dim(j), self.const(np.array([a], np.int64))])
            out = self.one("Add", [out, term])
        return out

    def sym(self, path: Path, value: int) -> int | str:
        """The record argument at ``path``: its int when static, else a 1-element int64 tensor's name."""
        s = self.syms.get((self.record_index, path))
        return value if s is None else self._emit(s)

    def is_dynamic(self, prefix: Path) -> bool:
        """Whether any int under argument ``prefix`` of the current record is symbolic."""
        n = len(prefix)
        return any(r == self.record_index and p[:n] == prefix for r, p in self.syms)

    def ints(self, prefix: Path, values: Sequence[int]) -> str:
        """An int64 1-D tensor of ``values`` (record argument ``prefix``), computed when any entry is symbolic."""
        if not self.is_dynamic(prefix):
            return self.const(np.array(list(values), np.int64))
        parts = []
        for i, v in enumerate(values):
            x = self.sym(prefix + (i,), v)
            parts.append(x if isinstance(x, str) else self.const(np.array([x], np.int64)))
        return self.one("Concat", parts, axis=0)

    def scalar_int(self, path: Path, value: int) -> str:
        """A 0-d int64 tensor for the record argument at ``path`` (Range bounds)."""
        x = self.sym(path, value)
        if isinstance(x, int):
            return self.const(np.array(x, np.int64))
        return self.one("Squeeze", [x, self.const(np.array([0], np.int64))])

    def cast(self, name: str, dtype: ember.DType) -> str:
        """``name`` cast to ``dtype``."""
        return self.one("Cast", [name], to=to_onnx_dtype(dtype))


def elem_type(dtype: ember.DType) -> int:
    """ONNX elem_type of an ember dtype."""
    return to_onnx_dtype(dtype)


def value_info(name: str, dtype: ember.DType, shape: Sequence[int | str | None]) -> Any:
    """A graph input/output declaration (symbolic dims as strings)."""
    return helper.make_tensor_value_info(name, elem_type(dtype), list(shape))
