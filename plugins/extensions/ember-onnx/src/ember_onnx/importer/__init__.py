"""ONNX import: the graph executor and the op tables (one module per area)."""

from . import (  # noqa: F401 - registers the handlers
    ops_control,
    ops_elementwise,
    ops_host,
    ops_nn,
    ops_quant,
    ops_recurrent,
    ops_reduction,
    ops_resize,
    ops_shape,
)
from .graph import Executor, OnnxModule, load, unsupported_ops
from .registry import AREAS, OPS

__all__ = ["OnnxModule", "Executor", "load", "unsupported_ops", "OPS", "AREAS"]
