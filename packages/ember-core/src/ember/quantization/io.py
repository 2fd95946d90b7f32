"""Quantized weights through ``ember.records`` (safetensors): each quantized value's parts are plain safetensors
entries (``<key>`` the data, ``<key>_scale``, ``<key>_zero_point``, ``<key>_scale2``, ``<key>_offset`` -- the
buffer names of the quantized layers' state dicts) and its format tag sits in the header metadata under
``quantization`` (JSON: ``{key: tag}``).

Loading into a model: a quantized layer takes its parts as they are (a different format or shape is a typed
error); a float ``nn.Linear`` (or any float parameter) in that place gets the value dequantized to the parameter's
dtype, with a :class:`DequantizedOnLoadWarning` naming the keys (the accuracy of the quantized file, not of the
original float weights).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from .. import records as _rec
from ..errors import DTypeError, ShapeError
from ..nn.module import Module
from ..tensor import Tensor
from .modules import quantized_modules
from .tensor import QuantizedTensor

__all__ = ["DequantizedOnLoadWarning", "load", "save"]

META_KEY = "quantization"
_PARTS = ("scale", "zero_point", "scale2", "offset")


class DequantizedOnLoadWarning(UserWarning):
    """A quantized entry was loaded into a float parameter: its dequantized value was copied."""


def _flatten(obj: Any, op: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    if isinstance(obj, Module):
        state = dict(obj.state_dict())
        tags = {f"{p}.weight" if p else "weight": m.weight_tag() for p, m in quantized_modules(obj)}
        return state, tags
    if not isinstance(obj, Mapping):
        raise DTypeError(f"{op}: expected a Module or a dict of Tensors and QuantizedTensors, got "
                         f"{type(obj).__name__}")
    state, tags = {}, {}
    for k, v in obj.items():
        if isinstance(v, QuantizedTensor):
            for part, t in v.tensors().items():
                state[k if part == "data" else f"{k}_{part}"] = t
            tags[k] = v.tag()
        elif isinstance(v, Tensor):
            state[k] = v
        else:
            raise DTypeError(f"{op}: entry {k!r} is a {type(v).__name__}, not a Tensor or QuantizedTensor")
    return state, tags


def save(obj: Module | Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Save a model's state (quantized layers included) or a dict of Tensors/QuantizedTensors as safetensors,
    with each quantized value's format tag in the metadata."""
    state, tags = _flatten(obj, "quantization.save")
    _rec.save(state, path, metadata={META_KEY: json.dumps(tags, sort_keys=True)})


def load(path: str | os.PathLike[str], into: Module | None = None, *, strict: bool = True,
         device: Any = None) -> dict[str, Any]:
    """Read a file :func:`save` wrote: returns ``{key: Tensor | QuantizedTensor}``. With ``into``, also load it into
    that model (``strict`` as ``load_state_dict``): quantized layers take the parts, float parameters the
    dequantized values (with a :class:`DequantizedOnLoadWarning`)."""
    op = "quantization.load"
    state = dict(_rec.load(path, device=device))
    tags = json.loads(_rec.read_metadata(path).get(META_KEY, "{}"))
    out: dict[str, Any] = dict(state)
    for key, tag in tags.items():
        parts = {"data": out.pop(key)}
        for part in _PARTS:
            if f"{key}_{part}" in out:
                parts[part] = out.pop(f"{key}_{part}")
        out[key] = QuantizedTensor.from_parts(tag, parts)
    if into is not None:
        _load_into(into, out, strict, op)
    return out


def _load_into(model: Module, values: dict[str, Any], strict: bool, op: str) -> None:
    if not isinstance(model, Module):
        raise DTypeError(f"{op}: into must be an nn.Module, got {type(model).__name__}")
    mine = dict(model.state_dict())
    flat: dict[str, Tensor] = {}
    dequantized: list[str] = []
    for key, v in values.items():
        if not isinstance(v, QuantizedTensor):
            flat[key] = v
            continue
        if key in mine and f"{key}_scale" in mine:  # a quantized layer: check the format, then its parts go in
            prefix = key.rpartition(".")[0]
            layer = model.get_submodule(prefix) if prefix else model
            want = layer.weight_tag()  # type: ignore[operator]
            got = v.tag()
            if want != got:
                raise ShapeError(f"{op}: {key!r} is stored as {got} but the model's layer is {want}")
            for part, t in v.tensors().items():
                flat[key if part == "data" else f"{key}_{part}"] = t
        elif key in mine:
            target = mine[key]
            if tuple(target.shape) != v.shape:
                raise ShapeError(f"{op}: {key!r} is a quantized {v.shape} value, the model's parameter is "
                                 f"{tuple(target.shape)}")
            flat[key] = v.dequantize(target.dtype if target.dtype.is_floating_point else None)
            dequantized.append(key)
        else:
            flat[key] = v.dequantize()  # unexpected key: load_state_dict reports it
    if dequantized:
        warnings.warn(f"{op}: {dequantized} are quantized in the file and were dequantized into the model's float "
                      "parameters (values carry the quantization error)", DequantizedOnLoadWarning, stacklevel=3)
    model.load_state_dict(flat, strict=strict)
