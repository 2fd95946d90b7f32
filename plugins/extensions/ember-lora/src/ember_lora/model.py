"""Model-level LoRA: ``apply_lora`` and the functions that manage a model's adapters afterwards.

The model keeps its own class; ``apply_lora`` replaces the targeted layers in place and records each adapter's
config in ``model._lora_configs`` (insertion order) and the active adapter in ``model._lora_active``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ember import nn
from ember.errors import DTypeError, ValueRangeError
from ember.nn import ParamGroup, param_groups

from .config import ALL_LINEAR, LoraConfig
from .layers import ATTENTION_PROJECTIONS, LoraLayer, LoraMultiheadAttention, ModulesToSaveWrapper, wrapper_for

_ADAPTER_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: parameter-name pieces that mark LoRA adapter weights
ADAPTER_KEYS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


def _check_model(model: Any, op: str) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise DTypeError(f"{op}: model must be an nn.Module, got {type(model).__name__}")
    return model


def _configs(model: nn.Module) -> dict[str, LoraConfig]:
    return model.__dict__.setdefault("_lora_configs", {})


def _require_lora(model: Any, op: str) -> dict[str, LoraConfig]:
    configs = _configs(_check_model(model, op))
    if not configs:
        raise ValueRangeError(f"{op}: {type(model).__name__} has no LoRA adapters (call apply_lora first)")
    return configs


def _check_adapter_name(name: Any, op: str) -> str:
    if not isinstance(name, str):
        raise DTypeError(f"{op}: adapter must be a str, got {type(name).__name__}")
    if not _ADAPTER_NAME.fullmatch(name):
        raise ValueRangeError(f"{op}: adapter name must be letters, digits, '_' or '-', got {name!r}")
    return name


def _walk(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) for every module that LoRA may target, not descending into LoRA's own wrappers."""
    def visit(module: nn.Module, prefix: str) -> Iterator[tuple[str, nn.Module]]:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            yield path, child
            if not isinstance(child, (LoraLayer, ModulesToSaveWrapper)):
                yield from visit(child, path)
    yield from visit(model, "")


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoraLayer]]:
    """(path, layer) for every LoRA-wrapped layer of ``model``."""
    for path, m in _walk(_check_model(model, "lora_layers")):
        if isinstance(m, LoraLayer):
            yield path, m


def _saved_wrappers(model: nn.Module) -> Iterator[tuple[str, ModulesToSaveWrapper]]:
    for path, m in _walk(model):
        if isinstance(m, ModulesToSaveWrapper):
            yield path, m


def _name_matches(path: str, names: Iterable[str]) -> bool:
    # PEFT's rule for a list of names: the whole path, or a suffix after a dot
    return any(path == n or path.endswith("." + n) for n in names)


def _base_of(m: nn.Module) -> nn.Module:
    return m.base_layer if isinstance(m, LoraLayer) else m


def _is_linear(m: nn.Module) -> bool:
    """A Linear layer for "all-linear": float, or the 4-bit base QLoRA made of one."""
    from ember.quantization import Linear4bit

    return isinstance(m, (nn.Linear, Linear4bit))


def _output_head(model: nn.Module, candidates: list[tuple[str, nn.Module]]) -> str | None:
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        head = getter()
        for path, m in candidates:
            if head is not None and (m is head or _base_of(m) is head):
                return path
    linear = [path for path, m in candidates if _is_linear(_base_of(m))]
    return linear[-1] if linear else None


def _is_attention(m: nn.Module) -> bool:
    return isinstance(_base_of(m), nn.MultiheadAttention)


def attention_projections(model: nn.Module) -> dict[str, tuple[str, str]]:
    """``{"<attention path>.<projection>": (attention path, projection)}`` for every ``nn.MultiheadAttention`` of
    ``model`` (wrapped or not): the names ``target_modules`` and adapter files give its q/k/v/out projections."""
    return {f"{p}.{proj}": (p, proj) for p, m in _walk(model) if _is_attention(m) for proj in ATTENTION_PROJECTIONS}


def target_candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of everything ``target_modules`` may name: the modules (not inside LoRA's wrappers) and the
    projections of each attention module under their virtual paths (``<attention>.q_proj``, ...), mapped to the
    attention module. Its real ``out_proj`` Linear is replaced by the virtual one: the attention module reads that
    weight itself (no call to the layer), so only the attention wrapper can adapt it."""
    projections = attention_projections(model)
    attention = {a for a, _ in projections.values()}
    modules = dict(_walk(model))
    out: list[tuple[str, nn.Module]] = []
    for p, m in modules.items():
        if isinstance(m, ModulesToSaveWrapper) or p.rpartition(".")[0] in attention:
            continue
        out.append((p, m))
        if p in attention:
            out.extend((f"{p}.{proj}", m) for proj in ATTENTION_PROJECTIONS)
    return out


def _targets(model: nn.Module, config: LoraConfig, op: str) -> list[str]:
    """Paths of the modules ``config.target_modules`` selects (checked: each must be a type LoRA wraps); attention
    projections come as virtual paths (:func:`target_candidates`)."""
    target = config.target_modules
    if target is None:
        raise ValueRangeError(f"{op}: the config has no target_modules (a regex, a list of names, 'all-linear' or a "
                              "ParamGroup)")
    candidates = target_candidates(model)
    virtual = attention_projections(model)
    if isinstance(target, ParamGroup):
        if target.model is not model:
            raise ValueRangeError(f"{op}: target_modules is a ParamGroup of a different model")
        chosen = {path for path, _ in target.named_parameters()}
        # a layer is selected when its weight is (a wrapped layer's weight lives at <path>.base_layer.weight); an
        # attention projection when the weight holding it is
        picked = [p for p, m in candidates if p not in virtual
                  and (f"{p}.weight" in chosen or f"{p}.base_layer.weight" in chosen)]
        for v, (a, proj) in virtual.items():
            names = (["out_proj.weight"] if proj == "out_proj" else ["in_proj_weight", f"{proj[0]}_proj_weight"])
            if any(f"{a}.{pre}{n}" in chosen for pre in ("", "base_layer.") for n in names):
                picked.append(v)
    elif target == ALL_LINEAR:
        head = _output_head(model, [(p, m) for p, m in candidates if p not in virtual])
        picked = [p for p, m in candidates if p != head and (p in virtual or _is_linear(_base_of(m)))]
    elif isinstance(target, str):
        rx = re.compile(target)
        picked = [p for p, _ in candidates if rx.fullmatch(p)]
    else:
        picked = [p for p, _ in candidates if _name_matches(p, target)]
    if not picked:
        layers = [p for p, m in candidates if wrapper_for(_base_of(m)) is not None]
        raise ValueRangeError(f"{op}: target_modules {_describe_target(target)} selects no module of "
                              f"{type(model).__name__} (its Linear/Conv2d/Embedding layers: {layers[:12]}"
                              f"{' ...' if len(layers) > 12 else ''})")
    modules = dict(candidates)
    for p in picked:
        m = _base_of(modules[p])
        if wrapper_for(m) is None:
            raise DTypeError(f"{op}: target {p!r} is a {type(m).__name__}; LoRA wraps Linear, Conv2d, Embedding and "
                             "MultiheadAttention layers (its projections as <path>.q_proj/k_proj/v_proj/out_proj)")
    return picked


def _group_targets(model: nn.Module, paths: list[str]) -> dict[str, tuple[str, ...] | None]:
    """``{module path: attention projections or None}``: virtual projection paths gathered under their attention
    module (an attention module named itself takes all four, None)."""
    virtual = attention_projections(model)
    groups: dict[str, tuple[str, ...] | None] = {}
    for p in paths:
        if p in virtual:
            a, proj = virtual[p]
            if a in groups and groups[a] is None:
                continue
            groups[a] = (*(groups.get(a) or ()), proj)
        else:
            groups[p] = None
    return groups


def _describe_target(target: Any) -> str:
    return repr(target) if not isinstance(target, ParamGroup) else f"ParamGroup({len(target)} parameters)"


def _set_child(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, new)


def apply_lora(model: nn.Module, config: LoraConfig, adapter: str = "default") -> nn.Module:
    """Add LoRA adapter ``adapter`` to ``model`` in place and return it.

    The targeted ``Linear``, ``Conv2d`` and ``Embedding`` layers are replaced by ``LoraLinear``/``LoraConv2d``/
    ``LoraEmbedding`` holding the original layer as ``base_layer`` (a layer already wrapped gets one more adapter);
    ``modules_to_save`` get a trainable copy per adapter. Every other parameter of the model is frozen
    (``requires_grad=False``: no gradient is computed or stored for it), except biases as ``config.bias`` says.
    The first adapter becomes active; a later one is added inactive and frozen until ``set_adapter``.
    """
    op = "apply_lora"
    _check_model(model, op)
    if not isinstance(config, LoraConfig):
        raise DTypeError(f"{op}: config must be an ember_lora.LoraConfig, got {type(config).__name__}")
    _check_adapter_name(adapter, op)
    configs = _configs(model)
    if adapter in configs:
        raise ValueRangeError(f"{op}: {type(model).__name__} already has an adapter named {adapter!r} "
                              f"(adapters: {list(configs)})")
    paths = _targets(model, config, op)
    _inject(model, config, adapter, paths, op)
    return model


def _inject(model: nn.Module, config: LoraConfig, adapter: str, paths: list[str], op: str) -> None:
    """Wrap ``paths`` and the config's modules_to_save for ``adapter`` (targets already resolved)."""
    configs = _configs(model)
    saved: list[str] = []
    if config.modules_to_save:
        saved = [p for p, m in _walk(model) if _name_matches(p, config.modules_to_save)
                 and not isinstance(m, LoraLayer)]
        clash = sorted(set(saved) & set(paths))
        if clash:
            raise ValueRangeError(f"{op}: {clash} are both LoRA targets and modules_to_save")
        if not saved:
            raise ValueRangeError(f"{op}: modules_to_save {list(config.modules_to_save)} selects no module of "
                                  f"{type(model).__name__}")
    modules = dict(_walk(model))
    groups = _group_targets(model, paths)
    wrappers: list[tuple[str, LoraLayer, dict[str, Any]]] = []
    try:
        for p, projs in groups.items():  # build every wrapper before touching the model: a refusal leaves it as is
            m = modules[p]
            if isinstance(m, LoraLayer):
                layer = m
            else:
                cls = wrapper_for(m)
                assert cls is not None  # _targets checked
                layer = cls(m)
            wrappers.append((p, layer, {"projections": projs} if isinstance(layer, LoraMultiheadAttention) else {}))
        for _, layer, kw in wrappers:  # refuse before the first layer changes (PiSSA rewrites base weights)
            layer.check_config(adapter, config, **kw)
    except BaseException:
        _release_new(wrappers, modules)
        raise
    done: list[tuple[str, LoraLayer]] = []
    try:
        for p, layer, kw in wrappers:
            layer.update_layer(adapter, config, **kw)
            done.append((p, layer))
    except BaseException:
        for _, layer in done:  # nothing is in the model yet: take the adapter back off the layers that got it
            layer.delete_adapter(adapter)
        _release_new(wrappers, modules)
        raise
    for p, layer, _ in wrappers:
        if layer is not modules[p]:
            _set_child(model, p, layer)
    for p in saved:
        m = modules[p]
        wrapper = m if isinstance(m, ModulesToSaveWrapper) else ModulesToSaveWrapper(m)
        wrapper.update(adapter)
        if wrapper is not m:
            _set_child(model, p, wrapper)
    first = not configs
    configs[adapter] = config
    if first:
        model.__dict__["_lora_active"] = adapter
    _refresh(model)


def _release_new(wrappers: list[tuple[str, LoraLayer, dict[str, Any]]], modules: dict[str, nn.Module]) -> None:
    """Undo the wrappers built for a refused ``_inject`` (an attention wrapper hooked its base module)."""
    for p, layer, _ in wrappers:
        if layer is not modules[p]:
            layer.release_base()


def _active(model: nn.Module) -> str | None:
    return model.__dict__.get("_lora_active")


def _refresh(model: nn.Module) -> None:
    """Apply the active adapter to every wrapper and set ``requires_grad`` as the active config says: its adapter
    weights and module copies train, biases as ``bias`` says, everything else is frozen."""
    active = _active(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for _, layer in lora_layers(model):
        layer.set_adapter(active)
    for _, wrapper in _saved_wrappers(model):
        wrapper.set_adapter(active)
    config = _configs(model).get(active) if active is not None else None
    if config is None or config.bias == "none":
        return
    if config.bias == "all":
        inside_copies = {id(p) for _, w in _saved_wrappers(model) for p in w.parameters()}
        for path, p in model.named_parameters():
            if is_bias(path) and id(p) not in inside_copies and p.dtype.is_floating_point:
                p.requires_grad_(True)
    else:  # lora_only
        for _, layer in lora_layers(model):
            if active in layer.adapter_names:
                for bias in layer.base_biases().values():
                    bias.requires_grad_(True)


def adapters(model: nn.Module) -> dict[str, LoraConfig]:
    """The model's adapters and their configs, in the order they were added."""
    return dict(_configs(_check_model(model, "adapters")))


def active_adapter(model: nn.Module) -> str | None:
    """The name of the active adapter (None when the model has none)."""
    return _active(_check_model(model, "active_adapter"))


def set_adapter(model: nn.Module, adapter: str) -> None:
    """Make ``adapter`` the one that runs and trains (the others stay in the model, frozen)."""
    configs = _require_lora(model, "set_adapter")
    _check_adapter_name(adapter, "set_adapter")
    if adapter not in configs:
        raise ValueRangeError(f"set_adapter: no adapter {adapter!r} (adapters: {list(configs)})")
    if any(layer.merged for _, layer in lora_layers(model)):
        raise ValueRangeError("set_adapter: some adapters are merged into the base weights; unmerge(model) first")
    model.__dict__["_lora_active"] = adapter
    _refresh(model)


def delete_adapter(model: nn.Module, adapter: str) -> None:
    """Remove ``adapter`` from the model; a layer left without adapters is put back unwrapped. Deleting the active
    adapter activates the first remaining one."""
    configs = _require_lora(model, "delete_adapter")
    if adapter not in configs:
        raise ValueRangeError(f"delete_adapter: no adapter {adapter!r} (adapters: {list(configs)})")
    for path, layer in list(lora_layers(model)):
        if adapter in layer.adapter_names:
            layer.delete_adapter(adapter)
            if not layer.adapter_names:
                _set_child(model, path, layer.release_base())
    for path, wrapper in list(_saved_wrappers(model)):
        if adapter in wrapper.adapter_names:
            wrapper.delete_adapter(adapter)
            if not wrapper.adapter_names:
                _set_child(model, path, wrapper.original_module)
    del configs[adapter]
    if _active(model) == adapter:
        model.__dict__["_lora_active"] = next(iter(configs), None)
    if configs:
        _refresh(model)
    else:
        model.__dict__.pop("_lora_active", None)


@contextmanager
def disable_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """Run the base model inside the block: adapters and module copies are bypassed (merged adapters are taken out
    of the weights for the block and merged back after it)."""
    _require_lora(model, "disable_adapters")
    layers = [layer for _, layer in lora_layers(model)]
    wrappers = [w for _, w in _saved_wrappers(model)]
    remerge = {id(layer): list(layer.merged_adapters) for layer in layers}
    for layer in layers:
        layer.unmerge()
        layer.disable_adapters = True
    for w in wrappers:
        w.disable_adapters = True
    try:
        yield model
    finally:
        for layer in layers:
            layer.disable_adapters = False
            layer.merge(remerge[id(layer)])
        for w in wrappers:
            w.disable_adapters = False


def merge(model: nn.Module, adapter_names: list[str] | None = None) -> None:
    """Fold the active adapter (or ``adapter_names``) into the base weights: the forward then costs what the base
    model's does, with the same outputs to float rounding. ``unmerge`` takes them back out."""
    configs = _require_lora(model, "merge")
    names = adapter_names
    if names is not None:
        if isinstance(names, str):
            names = [names]
        unknown = [n for n in names if n not in configs]
        if unknown:
            raise ValueRangeError(f"merge: no adapter(s) {unknown} (adapters: {list(configs)})")
    for _, layer in lora_layers(model):
        layer.merge(None if names is None else [n for n in names if n in layer.adapter_names])


def unmerge(model: nn.Module) -> None:
    """Take every merged adapter back out of the base weights."""
    _require_lora(model, "unmerge")
    for _, layer in lora_layers(model):
        layer.unmerge()


def _unload(model: nn.Module, do_merge: bool) -> nn.Module:
    active = _active(model)
    for path, layer in list(lora_layers(model)):
        if do_merge:
            layer.merge()
        _set_child(model, path, layer.release_base())
    for path, wrapper in list(_saved_wrappers(model)):
        keep = wrapper.modules_to_save[active] if do_merge and active in wrapper.adapter_names else \
            wrapper.original_module
        _set_child(model, path, keep)
    model.__dict__.pop("_lora_configs", None)
    model.__dict__.pop("_lora_active", None)
    return model


def merge_and_unload(model: nn.Module) -> nn.Module:
    """Merge the active adapter into the base weights and put the plain layers back (a module to save is replaced
    by the active adapter's trained copy); returns the model, now without any LoRA module. ``requires_grad`` flags
    stay as they were (``model.requires_grad_(True)`` unfreezes everything)."""
    _require_lora(model, "merge_and_unload")
    return _unload(model, do_merge=True)


def unload(model: nn.Module) -> nn.Module:
    """Remove every adapter without merging: the plain base model comes back (merged adapters are unmerged first)."""
    _require_lora(model, "unload")
    for _, layer in lora_layers(model):
        layer.unmerge()
    return _unload(model, do_merge=False)


def is_bias(path: str) -> bool:
    """Whether a parameter path names a bias (``bias="all"``): ``bias``, or a name ending in it, as attention's
    ``in_proj_bias``."""
    return path.rsplit(".", 1)[-1].endswith("bias")


def _kind(path: str) -> str:
    """'adapter', 'saved' (a modules_to_save copy) or 'other' for a parameter path."""
    parts = path.split(".")
    if any(p in ADAPTER_KEYS for p in parts):
        return "adapter"
    if "modules_to_save" in parts:
        return "saved"
    return "other"


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """``(trainable, total)`` parameter element counts of ``model``; a 4-bit base weight (QLoRA) counts its
    weights in ``total`` (they are buffers, not parameters, but the model's weights all the same)."""
    _check_model(model, "trainable_parameters")
    trainable = total = 0
    for p in model.parameters():
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    from ember.quantization import quantized_modules

    total += sum(m.quantized_weight().numel() for _, m in quantized_modules(model))
    return trainable, total


def print_trainable_parameters(model: nn.Module) -> None:
    """Print PEFT's line: ``trainable params: N || all params: M || trainable%: P``."""
    trainable, total = trainable_parameters(model)
    pct = 100 * trainable / total if total else 0.0
    print(f"trainable params: {trainable:,d} || all params: {total:,d} || trainable%: {pct:.4f}")


def lora_param_groups(model: nn.Module, lr: float, weight_decay: float = 0.0, *, adapter_lr: float | None = None,
                      adapter_weight_decay: float | None = None, modules_to_save_lr: float | None = None,
                      modules_to_save_weight_decay: float | None = None, bias_lr: float | None = None,
                      bias_weight_decay: float | None = None) -> list[dict[str, Any]]:
    """Optimizer parameter groups for a LoRA model's trainable parameters: adapters, module copies
    (``modules_to_save``) and the rest (biases), each with its own ``lr``/``weight_decay`` (default ``lr`` and
    ``weight_decay``). Frozen parameters are left out and empty groups dropped; each group carries ``name`` and
    ``param_names``. Built on ``ember.optim.param_groups`` and ``ParamGroup``.
    """
    _require_lora(model, "lora_param_groups")
    opts = {"lr": lr, "weight_decay": weight_decay, "adapter_lr": adapter_lr,
            "adapter_weight_decay": adapter_weight_decay, "modules_to_save_lr": modules_to_save_lr,
            "modules_to_save_weight_decay": modules_to_save_weight_decay, "bias_lr": bias_lr,
            "bias_weight_decay": bias_weight_decay}
    for k, v in opts.items():
        if v is None and k not in ("lr", "weight_decay"):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueRangeError(f"lora_param_groups: {k} must be a non-negative number, got {v!r}")

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    specs = [
        (ParamGroup(model, where=lambda path, _: _kind(path) == "adapter"),
         {"name": "adapters", "lr": pick(adapter_lr, lr), "weight_decay": pick(adapter_weight_decay, weight_decay)}),
        (ParamGroup(model, where=lambda path, _: _kind(path) == "saved"),
         {"name": "modules_to_save", "lr": pick(modules_to_save_lr, lr),
          "weight_decay": pick(modules_to_save_weight_decay, weight_decay)}),
    ]
    default = {"name": "biases", "lr": pick(bias_lr, lr), "weight_decay": pick(bias_weight_decay, weight_decay)}
    groups = param_groups(model, specs, default, skip_frozen=True)
    return [g for g in groups if g["params"]]


__all__ = [
    "apply_lora", "set_adapter", "delete_adapter", "disable_adapters", "merge", "unmerge", "merge_and_unload",
    "unload", "trainable_parameters", "print_trainable_parameters", "lora_param_groups", "lora_layers", "adapters",
    "active_adapter", "attention_projections", "target_candidates",
]
