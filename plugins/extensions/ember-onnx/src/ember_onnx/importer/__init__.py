"""ONNX import: the graph executor and the op tables (one module per area)."""

from . import ops_control, ops_elementwise, ops_nn, ops_recurrent, ops_reduction, ops_resize, ops_shape  # noqa: F401 - registers the handlers
from .graph import Executor, OnnxModule, load, unsupported_ops
from .registry import AREAS, OPS

__all__ = ["OnnxModule", "Executor", "load", "unsupported_ops", "OPS", "AREAS"]
