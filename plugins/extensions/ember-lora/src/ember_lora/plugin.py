"""ember plugin entry point for ember-lora (entry-point group ``ember``, name ``lora``).

LoRA adds no ops and no devices: it works on ``nn`` modules with ordinary ember ops, so it runs on every device.
The plugin reports itself to ``ember info`` and registers OpenCL kernels for core's quantization ops
(:mod:`ember_lora.quant_opencl`); other backends run those ops' compositions (ember-flex has its own kernels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ember.plugins import hookimpl

from . import __version__, quant_opencl

# the OpenCL kernels of core's quantization ops (QLoRA's 4-bit matmul among them): registered by name, so they run
# when ember-opencl is installed and cost nothing otherwise (ember-opencl is never imported)
quant_opencl.register()


@hookimpl
def plugin_info() -> dict[str, Any]:
    """What ``ember info`` shows for ember-lora: its version and the layer types it wraps."""
    from .layers import WRAPPERS

    return {"ember-lora": __version__, "wraps": [base.__name__ for base, _ in WRAPPERS],
            "quantization kernels": "opencl (quant.quantize_4bit, dequantize_4bit, matmul_4bit, quantize_int8, "
                                    "dequantize_int8)"}


# `ember bench lora` (entry-point group ``ember.benchmarks``): the script ships in this package, so an absolute
# path is registered and the benchmark runs from an installed wheel too
LORA_BENCHMARK = {
    "description": "fine-tuning the seed transformer full vs LoRA vs QLoRA (trainable fraction, peak RSS and pool, "
                   "step time; each in a fresh process), NF4/FP4 RMSE on N(0,1), int8 PTQ accuracy deltas",
    "script": str(Path(__file__).with_name("bench.py")),
}
