"""ember plugin entry point for ember-lora (entry-point group ``ember``, name ``lora``).

LoRA adds no ops and no devices: it works on ``nn`` modules with ordinary ember ops, so it runs on every device.
The plugin only reports itself to ``ember info``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.plugins import hookimpl

from . import __version__


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows for ember-lora: its version and the layer types it wraps."""
    from .layers import WRAPPERS

    return {"ember-lora": __version__, "wraps": [base.__name__ for base, _ in WRAPPERS]}


# `ember bench lora` (entry-point group ``ember.benchmarks``): the script ships in this package, so an absolute
# path is registered and the benchmark runs from an installed wheel too
LORA_BENCHMARK = {
    "description": "fine-tuning the seed transformer full vs LoRA vs QLoRA (trainable fraction, peak RSS and pool, "
                   "step time; each in a fresh process), NF4/FP4 RMSE on N(0,1), int8 PTQ accuracy deltas",
    "script": str(Path(__file__).with_name("bench.py")),
}
