"""ember plugin entry point for ember-lora (entry-point group ``ember``, name ``lora``).

LoRA adds no ops and no devices: it works on ``nn`` modules with ordinary ember ops, so it runs on every device.
The plugin only reports itself to ``ember info``.
"""

from __future__ import annotations

from typing import Any

from ember.plugins import hookimpl

from . import __version__


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows for ember-lora: its version and the layer types it wraps."""
    from .layers import WRAPPERS

    return {"ember-lora": __version__, "wraps": [base.__name__ for base, _ in WRAPPERS]}
