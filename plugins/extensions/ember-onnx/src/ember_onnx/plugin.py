"""ember plugin entry point for ember-onnx (entry-point group ``ember``, name ``onnx``).

ember-onnx adds no devices: import runs ONNX graphs with ordinary ember ops (so on every device) and export
captures ember ops. The plugin only reports itself to ``ember info``.
"""

from __future__ import annotations

from typing import Any

from ember.plugins import hookimpl

from . import __version__


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows for ember-onnx: its version and how many ONNX ops it imports."""
    from .importer import OPS

    return {"ember-onnx": __version__, "import_ops": len(OPS)}
