"""``ember.quantization``: quantized weights as values, quantized layers and post-training dynamic quantization.

* :class:`QuantizedTensor` and :func:`quantize` / :func:`dequantize`: int8 (symmetric / asymmetric, per tensor,
  per channel, per block) and 4-bit block NF4 / FP4 (bitsandbytes-exact, optional double quantization).
* ops (``ember.quantization.ops``): ``quantize_4bit``, ``dequantize_4bit`` and ``matmul_4bit`` (the weight
  dequantized on the fly) as extension ops; backends may register kernels (ember-flex does).
* :class:`Linear4bit` (QLoRA's base layer), :class:`DynamicQuantizedLinear`, :class:`DynamicQuantizedConv2d`,
  :func:`quantize_dynamic`,
  :func:`model_size`.
* :func:`save` / :func:`load`: safetensors with scales and format tags (see docs/quantization.md).

>>> import ember
>>> from ember import quantization as Q
>>> w = ember.randn(64, 128, generator=ember.Generator().manual_seed(0))
>>> q = Q.quantize(w, "nf4")
>>> q.nbytes(), w.numel() * 4
(4608, 32768)
>>> float((q.dequantize() - w).abs().max()) < 0.7
True
"""

from __future__ import annotations

from . import ops
from .io import DequantizedOnLoadWarning, load, save
from .modules import (
    DynamicQuantizedConv2d,
    DynamicQuantizedLinear,
    Linear4bit,
    QuantizedModule,
    model_size,
    quantize_dynamic,
    quantized_modules,
)
from .tensor import FORMATS, QuantizedTensor, dequantize, quantize, quantize_4bit, quantize_int8

__all__ = [
    "FORMATS", "QuantizedTensor", "quantize", "dequantize", "quantize_4bit", "quantize_int8", "Linear4bit",
    "DynamicQuantizedLinear", "DynamicQuantizedConv2d", "QuantizedModule", "quantize_dynamic", "model_size",
    "quantized_modules", "save", "load", "DequantizedOnLoadWarning", "ops",
]
