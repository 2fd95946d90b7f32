"""Typed errors of ember-onnx; all derive from ember's error family."""

from __future__ import annotations

from collections.abc import Iterable

from ember.errors import DTypeError, UnsupportedError, ValueRangeError


class UnsupportedOnnxOpError(UnsupportedError):
    """An ONNX model uses ops ember-onnx cannot import; ``ops`` lists every one of them (``domain::OpType``)."""

    def __init__(self, ops: Iterable[str], where: str = "ember_onnx.load") -> None:
        self.ops = sorted(set(ops))
        super().__init__(f"{where}: the model uses {len(self.ops)} unsupported ONNX op(s): {', '.join(self.ops)}")


class OnnxDTypeError(DTypeError):
    """An ONNX tensor type has no ember dtype (uint16/32/64, complex, string, float8, int4, ...)."""


class OnnxAttributeError(ValueRangeError):
    """A node's attribute value (or attribute-like input) is outside what ember-onnx implements."""


class ExportError(UnsupportedError):
    """A captured op has no ONNX lowering (the message names the op)."""
