"""ember-onnx: import ONNX models as ember modules that run on any device, and export ember models to ONNX.

>>> import ember_onnx  # doctest: +SKIP
>>> module = ember_onnx.load("model.onnx", device=ember.Device.flex())  # doctest: +SKIP
>>> proto = ember_onnx.export(model, (x,), "model.onnx", dynamic_axes={"input": {0: "batch"}})  # doctest: +SKIP
"""

__version__ = "0.1.0"
#: backend-contract version this plugin was built against
CONTRACT = 1

from .errors import ExportError, OnnxAttributeError, OnnxDTypeError, UnsupportedOnnxOpError  # noqa: E402
from .exporter import export  # noqa: E402
from .importer import OnnxModule, load, unsupported_ops  # noqa: E402


def supported_import_ops() -> list[str]:
    """Every ONNX op ember-onnx imports with its own handler (``domain::OpType``, sorted).

    Ops ONNX defines as functions of other ops (``Celu``, ``Attention``, ...) import too when their body's ops do;
    :func:`unsupported_ops` gives the verdict for one model.
    """
    from .importer import OPS

    return sorted(f"{d or 'ai.onnx'}::{op}" for d, op in OPS)


__all__ = ["load", "export", "OnnxModule", "unsupported_ops", "supported_import_ops", "UnsupportedOnnxOpError",
           "OnnxDTypeError", "OnnxAttributeError", "ExportError"]
