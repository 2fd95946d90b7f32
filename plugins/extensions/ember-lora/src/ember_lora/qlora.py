"""QLoRA: ``apply_qlora`` quantizes the targeted ``nn.Linear`` layers' weights to 4 bits (NF4 or FP4,
``ember.quantization.Linear4bit``) and adds LoRA adapters around them (``QLoraLinear``), in one step.

The base weights are stored packed (half a byte per weight plus a block absmax), frozen, and dequantized on the
fly inside the forward's matmul (``quant.matmul_4bit``: a backend kernel dequantizes a chunk of rows at a time);
the adapters are ordinary parameters in ``compute_dtype``. The projections of an ``nn.MultiheadAttention`` the
targets name (``all-linear`` includes them) get LoRA on their float weights, which stay float and frozen: the
attention module reads its packed ``in_proj_weight`` itself, so there is no Linear layer to quantize. Gradients
reach the adapters (and the biases ``config.bias`` selects) only: the quantized op's vjp is w.r.t. its input and
bias.
"""

from __future__ import annotations

from typing import Any

import ember
from ember import nn
from ember.errors import DTypeError, ValueRangeError

from .config import LoraConfig
from .layers import LoraLayer, QLoraLinear
from .model import (
    _check_adapter_name,
    _check_model,
    _configs,
    _inject,
    _set_child,
    _targets,
    _walk,
    attention_projections,
)

__all__ = ["apply_qlora"]

_COMPUTE = ("float32", "bfloat16")


def apply_qlora(model: nn.Module, config: LoraConfig, quant: str = "nf4", double_quant: bool = True,
                compute_dtype: Any = ember.float32, adapter: str = "default", blocksize: int = 64) -> nn.Module:
    """Quantize the ``nn.Linear`` layers ``config.target_modules`` selects to ``quant`` (``"nf4"`` or ``"fp4"``,
    blocks of ``blocksize``, the absmax double-quantized unless ``double_quant=False``) and add adapter ``adapter``
    around them in ``compute_dtype`` (``ember.float32`` or ``ember.bfloat16``); returns the model, changed in place.

    Targets must be ``nn.Linear`` layers (or layers this already made) or attention projections (adapted on their
    float weights, module docstring); Conv2d and Embedding targets are refused
    with a typed error before anything changes. The rest is :func:`apply_lora`: other parameters frozen, biases as
    ``config.bias`` says, ``modules_to_save`` copies, adapter management, ``save_adapter``. The base Linear's bias
    stays float in ``compute_dtype``.
    """
    op = "apply_qlora"
    _check_model(model, op)
    if not isinstance(config, LoraConfig):
        raise DTypeError(f"{op}: config must be an ember_lora.LoraConfig, got {type(config).__name__}")
    if quant not in ("nf4", "fp4"):
        raise ValueRangeError(f"{op}: quant must be 'nf4' or 'fp4', got {quant!r}")
    if not isinstance(double_quant, bool):
        raise DTypeError(f"{op}: double_quant must be a bool, got {type(double_quant).__name__}")
    if getattr(compute_dtype, "name", None) not in _COMPUTE or not isinstance(compute_dtype, ember.DType):
        raise DTypeError(f"{op}: compute_dtype must be ember.float32 or ember.bfloat16, got {compute_dtype!r}")
    if config.init_lora_weights == "pissa":
        raise ValueRangeError(f"{op}: init_lora_weights='pissa' rewrites the base weights, which QLoRA quantizes; "
                              "use True or 'gaussian'")
    _check_adapter_name(adapter, op)
    configs = _configs(model)
    if adapter in configs:
        raise ValueRangeError(f"{op}: {type(model).__name__} already has an adapter named {adapter!r} "
                              f"(adapters: {list(configs)})")
    from ember.quantization import Linear4bit
    from ember.quantization.ops import check_4bit

    check_4bit(op, blocksize, quant)
    paths = _targets(model, config, op)
    modules = dict(_walk(model))
    virtual = attention_projections(model)
    for p in paths:
        if p in virtual:  # an attention projection: LoRA on its float weight (module docstring)
            continue
        m = modules[p]
        if not isinstance(m, (nn.Linear, QLoraLinear)):
            kind = f"a float {type(m).__name__} with LoRA adapters" if isinstance(m, LoraLayer) else \
                f"a {type(m).__name__}"
            raise DTypeError(f"{op}: target {p!r} is {kind}; QLoRA quantizes nn.Linear layers only")
    # quantize every float target first; _inject then wraps the Linear4bit layers in QLoraLinear
    quantized = {p: Linear4bit.from_linear(modules[p], quant, blocksize, double_quant, compute_dtype)
                 for p in paths if p not in virtual and isinstance(modules[p], nn.Linear)}
    for p, q in quantized.items():
        _set_child(model, p, q)
    try:
        _inject(model, config, adapter, paths, op)
    except BaseException:
        for p in quantized:  # put the float layers back: the model is as it was
            _set_child(model, p, modules[p])
        raise
    return model
