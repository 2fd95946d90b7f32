"""Adapter files: ``save_adapter`` / ``load_adapter`` (a directory with ``adapter_model.safetensors`` and
``adapter_config.json``, PEFT's file names), written and read with ``ember.records``.

Tensor keys are the adapter's state-dict keys without the adapter name: ``<path>.lora_A.weight``,
``<path>.lora_B.weight``, ``<path>.lora_embedding_A``, ``<path>.lora_embedding_B``, a module copy's parameters
as ``<path>.<param>`` and trained biases under their state-dict key. ``peft_format=True`` prefixes every key with
``base_model.model.`` and writes PEFT's config fields, so ``peft.PeftModel.from_pretrained`` reads the directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import OrderedDict
from typing import Any

import ember
from ember import nn, records
from ember.errors import DTypeError, ValueRangeError
from ember.nn import ParamGroup
from ember.records import IncompatibleStateError, LoadReport
from ember.tensor import Tensor

from . import __version__
from .config import LoraConfig
from .layers import LoraEmbedding, LoraLayer, LoraMultiheadAttention, wrapper_for
from .model import (
    _check_adapter_name,
    _check_model,
    _configs,
    _inject,
    _require_lora,
    _saved_wrappers,
    _walk,
    delete_adapter,
    is_bias,
    target_candidates,
)

WEIGHTS_NAME = "adapter_model.safetensors"
CONFIG_NAME = "adapter_config.json"
PEFT_PREFIX = "base_model.model."


def _adapter_state(model: nn.Module, adapter: str) -> OrderedDict[str, Tensor]:
    """The tensors that make up ``adapter``, under adapter-name-free keys (PEFT's, without its prefix)."""
    config = _configs(model)[adapter]
    out: OrderedDict[str, Tensor] = OrderedDict()
    wrapped: list[tuple[str, LoraLayer]] = []
    for path, m in _walk(model):
        if isinstance(m, LoraLayer) and adapter in m.adapter_names:
            wrapped.append((path, m))
            if isinstance(m, LoraMultiheadAttention):  # one (A, B) pair per projection, named as a layer
                for proj in m.projections[adapter]:
                    for container in m.adapter_containers:
                        out[f"{path}.{proj}.{container}.weight"] = getattr(m, container)[adapter][proj].weight
                continue
            for container in m.adapter_containers:
                p = getattr(m, container)[adapter]
                suffix = "" if isinstance(m, LoraEmbedding) else ".weight"
                out[f"{path}.{container}{suffix}"] = p if isinstance(p, Tensor) else p.weight
    for path, w in _saved_wrappers(model):
        if adapter in w.adapter_names:
            for name, p in w.modules_to_save[adapter].named_parameters():
                out[f"{path}.{name}"] = p
    if config.bias == "all":
        inside = {id(p) for _, w in _saved_wrappers(model) for p in w.parameters()}
        for name, p in model.named_parameters():
            if is_bias(name) and id(p) not in inside:
                out[name] = p
    elif config.bias == "lora_only":
        for path, layer in wrapped:
            for name, bias in layer.base_biases().items():
                out[f"{path}.base_layer.{name}"] = bias
    return out


def _config_json(model: nn.Module, config: LoraConfig, adapter: str, peft_format: bool) -> dict[str, Any]:
    data = config.to_dict()
    if isinstance(config.target_modules, ParamGroup):  # not serialisable: store the layers it selected
        data["target_modules"] = []
        for p, m in _walk(model):
            if isinstance(m, LoraLayer) and adapter in m.adapter_names:
                data["target_modules"] += ([f"{p}.{proj}" for proj in m.projections[adapter]]
                                           if isinstance(m, LoraMultiheadAttention) else [p])
    if peft_format:
        # the fields PEFT's LoraConfig reads, at the values that reproduce what ember-lora computes
        return {
            "peft_type": "LORA", "task_type": None, "base_model_name_or_path": None, "revision": None,
            "inference_mode": True, "fan_in_fan_out": False, "use_dora": False, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
            **data,
            # PiSSA's residual lives in the base weights a PEFT user does not have: load as a plain adapter
            "init_lora_weights": True if data["init_lora_weights"] == "pissa" else data["init_lora_weights"],
        }
    return {"format": "ember-lora", "ember_lora_version": __version__, "adapter": adapter, "peft_type": "LORA",
            **data}


def _write_json(path: str, data: dict[str, Any]) -> None:
    # atomic like records.save: a crash leaves the previous config, never half of one
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".adapter_config.", suffix=".ember-tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_adapter(model: nn.Module, directory: str | os.PathLike[str], adapter: str = "default",
                 peft_format: bool = False) -> None:
    """Save adapter ``adapter`` (its weights, module copies and trained biases, not the base model) to
    ``directory``: ``adapter_model.safetensors`` and ``adapter_config.json``. ``peft_format=True`` uses PEFT's key
    names (``base_model.model.<path>.lora_A.weight``) and config fields. Merged adapters are saved as trained
    (the merge is not in the adapter weights)."""
    op = "save_adapter"
    configs = _require_lora(model, op)
    _check_adapter_name(adapter, op)
    if adapter not in configs:
        raise ValueRangeError(f"{op}: no adapter {adapter!r} (adapters: {list(configs)})")
    if not isinstance(directory, (str, os.PathLike)):
        raise DTypeError(f"{op}: directory must be a path, got {type(directory).__name__}")
    if not isinstance(peft_format, bool):
        raise DTypeError(f"{op}: peft_format must be a bool, got {type(peft_format).__name__}")
    d = os.fspath(directory)
    if os.path.exists(d) and not os.path.isdir(d):
        raise ValueRangeError(f"{op}: {d!r} exists and is not a directory")
    if peft_format:
        # PEFT adapts torch's MultiheadAttention through its packed in_proj_weight (one A for q, k and v together),
        # not per projection: a PEFT user could not load these keys
        attention = [p for p, m in _walk(model) if isinstance(m, LoraMultiheadAttention) and adapter in m.r]
        if attention:
            raise ValueRangeError(f"{op}: peft_format=True cannot express LoRA on MultiheadAttention projections "
                                  f"(adapter {adapter!r} adapts {attention}); save without peft_format")
    os.makedirs(d, exist_ok=True)
    prefix = PEFT_PREFIX if peft_format else ""
    state = OrderedDict((prefix + k, v.detach()) for k, v in _adapter_state(model, adapter).items())
    records.save(state, os.path.join(d, WEIGHTS_NAME),
                 metadata={"lora_adapter": adapter, "lora_format": "peft" if peft_format else "ember-lora"})
    _write_json(os.path.join(d, CONFIG_NAME), _config_json(model, configs[adapter], adapter, peft_format))


def _read_config(d: str, op: str) -> dict[str, Any]:
    path = os.path.join(d, CONFIG_NAME)
    if not os.path.isfile(path):
        raise records.RecordNotFoundError(f"{op}: {path!r} does not exist (an adapter directory holds "
                                          f"{CONFIG_NAME} and {WEIGHTS_NAME})", path)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise records.CorruptRecordError(f"{op}: {path!r} is not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise records.CorruptRecordError(f"{op}: {path!r} holds a {type(data).__name__}, not a config object")
    return data


def _layer_paths(keys: list[str]) -> list[str]:
    """Layer paths of the adapter keys (``<path>.lora_A.weight`` -> ``<path>``), in order."""
    out: list[str] = []
    for k in keys:
        for marker in (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B"):
            if k.endswith(marker):
                path = k[: -len(marker)]
                if path not in out:
                    out.append(path)
    return out


def load_adapter(model: nn.Module, directory: str | os.PathLike[str], adapter: str = "default") -> nn.Module:
    """Load an adapter saved by ``save_adapter`` (either format, or one PEFT wrote) into ``model`` as ``adapter``.

    When the model has no adapter of that name, it is created on the layers the file has weights for (and the
    config's ``modules_to_save``) and becomes active if it is the model's first; an existing one is overwritten.
    Keys the model lacks, keys the adapter has but the file lacks, and shapes that differ (another base model, or
    another ``r``) raise ``ember.records.IncompatibleStateError`` naming them and their shapes, and leave the model
    as it was. Returns the model.
    """
    op = "load_adapter"
    _check_model(model, op)
    _check_adapter_name(adapter, op)
    if not isinstance(directory, (str, os.PathLike)):
        raise DTypeError(f"{op}: directory must be a path, got {type(directory).__name__}")
    d = os.fspath(directory)
    data = _read_config(d, op)
    # the file's weights replace whatever initialisation made: never run one (PiSSA would rewrite the base weights
    # again, and PEFT's other schemes, "olora", "pissa_niter_16", ..., are only initialisations too)
    data = {**data, "init_lora_weights": True}
    try:
        config = LoraConfig.from_dict(data)
    except (DTypeError, ValueRangeError) as e:
        raise records.CorruptRecordError(f"{op}: {os.path.join(d, CONFIG_NAME)!r}: {e}") from e
    state = records.load(os.path.join(d, WEIGHTS_NAME))
    keys = list(state)
    if keys and all(k.startswith(PEFT_PREFIX) for k in keys):
        state = OrderedDict((k[len(PEFT_PREFIX):], v) for k, v in state.items())
    configs = _configs(model)
    created = adapter not in configs
    if created:
        modules = dict(target_candidates(model))
        paths = _layer_paths(list(state))
        unknown = [p for p in paths if p not in modules or wrapper_for(_plain(modules[p])) is None]
        if unknown:
            bad = [k for k in state if any(k.startswith(p + ".") for p in unknown)]
            report = LoadReport([], bad, [])
            raise IncompatibleStateError(f"{op}: {d!r} has adapter weights for layers {type(model).__name__} does "
                                         f"not have (or that LoRA does not wrap): {report.describe()}", report)
        try:
            _inject(model, config, adapter, paths, op)
        except (DTypeError, ValueRangeError) as e:
            raise IncompatibleStateError(f"{op}: {d!r} does not fit {type(model).__name__}: {e}",
                                         LoadReport([], [], [])) from e
    try:
        _copy_in(model, adapter, state, d, op)
    except IncompatibleStateError:
        if created:
            delete_adapter(model, adapter)
        raise
    return model


def _plain(m: nn.Module) -> nn.Module:
    return m.base_layer if isinstance(m, LoraLayer) else m


def _copy_in(model: nn.Module, adapter: str, state: OrderedDict[str, Tensor], d: str, op: str) -> None:
    """Check the file's tensors against the adapter's, all at once, then copy them in."""
    target = _adapter_state(model, adapter)
    missing = [k for k in target if k not in state]
    unexpected = [k for k in state if k not in target]
    mismatched = [(k, tuple(state[k].shape), tuple(target[k].shape)) for k in state
                  if k in target and tuple(state[k].shape) != tuple(target[k].shape)]
    report = LoadReport(missing, unexpected, mismatched)
    if not report.clean:
        raise IncompatibleStateError(f"{op}: {d!r} does not match adapter {adapter!r} of {type(model).__name__}: "
                                     f"{report.describe()}", report)
    with ember.no_grad():
        for k, p in target.items():
            p.copy_(state[k].to(p.device).to(p.dtype))


__all__ = ["save_adapter", "load_adapter", "WEIGHTS_NAME", "CONFIG_NAME", "PEFT_PREFIX"]
