"""``LoraConfig``: what ``apply_lora`` adds to a model, with the field names and semantics of PEFT's ``LoraConfig``."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from ember.errors import DTypeError, ValueRangeError
from ember.nn import ParamGroup

#: accepted values of ``bias``: which biases train along with the adapters (PEFT's names)
BIAS_MODES = ("none", "all", "lora_only")
#: accepted values of ``init_lora_weights``
INIT_MODES = (True, False, "gaussian", "pissa")
ALL_LINEAR = "all-linear"


def _aliased(name: str, value: Any, default: Any, alias: str, alias_value: Any) -> Any:
    """The value given under PEFT's ``name`` or under the shorter ``alias`` (issue 22's spelling), not both."""
    if alias_value is None:
        return value
    if value is not default and value != default:
        raise ValueRangeError(f"LoraConfig: give {name}= or its alias {alias}=, not both")
    return alias_value


class LoraConfig:
    """The adapters ``apply_lora`` adds, PEFT's ``LoraConfig`` fields and defaults.

    - ``r``: rank of the update ``ΔW = B @ A`` (``A``: ``(r, in)``, ``B``: ``(out, r)``).
    - ``lora_alpha`` (alias ``alpha``): the update is scaled by ``lora_alpha / r``, or ``lora_alpha / sqrt(r)``
      with ``use_rslora=True`` (rank-stabilised LoRA).
    - ``lora_dropout`` (alias ``dropout``): dropout on the adapter's input (the base path is not dropped).
    - ``target_modules`` (alias ``target``): which layers get adapters. A string is a regex that must match a
      module's whole dotted path (``re.fullmatch``); a list/tuple of names selects modules whose path equals a name or
      ends with ``"." + name``; ``"all-linear"`` selects every ``Linear`` except the output head (the module
      ``model.get_output_embeddings()`` returns, else the last ``Linear``); a ``ParamGroup`` selects the layers whose
      ``weight`` it selects.
    - ``bias``: ``"none"`` (every bias frozen), ``"all"`` (every bias trains) or ``"lora_only"`` (the biases of the
      wrapped layers train).
    - ``modules_to_save``: module names (matched as a list of ``target_modules``) that get a fully trainable copy per
      adapter, saved with it (a classifier head).
    - ``init_lora_weights`` (alias ``init``): ``True`` (``A`` Kaiming-uniform with ``a=sqrt(5)``, ``B`` zero: the
      adapted model starts equal to the base), ``"gaussian"`` (``A ~ N(0, 1/r)``, ``B`` zero), ``"pissa"`` (``A``,
      ``B`` from the top ``r`` singular vectors of the base weight, which keeps the residual: the output is
      unchanged) or ``False`` (both random: the adapted model starts different, for tests).
    """

    def __init__(self, r: int = 8, lora_alpha: float = 8, lora_dropout: float = 0.0,
                 target_modules: str | Iterable[str] | ParamGroup | None = None, bias: str = "none",
                 modules_to_save: Iterable[str] | None = None, use_rslora: bool = False,
                 init_lora_weights: bool | str = True, *, alpha: float | None = None, dropout: float | None = None,
                 target: str | Iterable[str] | ParamGroup | None = None, init: bool | str | None = None) -> None:
        if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
            raise ValueRangeError(f"LoraConfig: r must be a positive int, got {r!r}")
        self.r = r
        a = _aliased("lora_alpha", lora_alpha, 8, "alpha", alpha)
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a <= 0:
            raise ValueRangeError(f"LoraConfig: lora_alpha must be a positive finite number, got {a!r}")
        self.lora_alpha: float = a
        p = _aliased("lora_dropout", lora_dropout, 0.0, "dropout", dropout)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueRangeError(f"LoraConfig: lora_dropout must be a probability in [0, 1], got {p!r}")
        self.lora_dropout = float(p)
        self.target_modules = _check_target(_aliased("target_modules", target_modules, None, "target", target))
        if bias not in BIAS_MODES:
            raise ValueRangeError(f"LoraConfig: bias must be one of {list(BIAS_MODES)}, got {bias!r}")
        self.bias = bias
        self.modules_to_save = _check_names("modules_to_save", modules_to_save)
        if not isinstance(use_rslora, bool):
            raise DTypeError(f"LoraConfig: use_rslora must be a bool, got {type(use_rslora).__name__}")
        self.use_rslora = use_rslora
        init_mode = _aliased("init_lora_weights", init_lora_weights, True, "init", init)
        if not any(init_mode is m if isinstance(m, bool) else init_mode == m for m in INIT_MODES):
            raise ValueRangeError(f"LoraConfig: init_lora_weights must be one of True, False, 'gaussian', 'pissa', "
                                  f"got {init_mode!r}")
        self.init_lora_weights: bool | str = init_mode

    @property
    def scaling(self) -> float:
        """The factor on ``B @ A``: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (a ``ParamGroup`` target is not serialisable: ``save_adapter`` stores the
        layers it selected instead)."""
        tm = self.target_modules
        return {
            "r": self.r, "lora_alpha": self.lora_alpha, "lora_dropout": self.lora_dropout,
            "target_modules": tm if isinstance(tm, (str, ParamGroup)) or tm is None else list(tm),
            "bias": self.bias,
            "modules_to_save": None if self.modules_to_save is None else list(self.modules_to_save),
            "use_rslora": self.use_rslora, "init_lora_weights": self.init_lora_weights,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraConfig:
        """A config from ``to_dict()``'s fields or PEFT's ``adapter_config.json`` (fields PEFT has and ember does not
        implement must hold their defaults)."""
        if not isinstance(data, dict):
            raise DTypeError(f"LoraConfig.from_dict: expected a dict, got {type(data).__name__}")
        peft_type = data.get("peft_type", "LORA")
        if peft_type != "LORA":
            raise ValueRangeError(f"LoraConfig.from_dict: peft_type must be 'LORA', got {peft_type!r}")
        # PEFT features ember-lora does not implement: a config that uses one cannot be reproduced faithfully
        for key, neutral in (("use_dora", False), ("fan_in_fan_out", False), ("rank_pattern", {}),
                             ("alpha_pattern", {}), ("layers_to_transform", None)):
            if data.get(key, neutral) not in (neutral, None):
                raise ValueRangeError(f"LoraConfig.from_dict: {key}={data[key]!r} is not supported by ember-lora")
        fields = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "modules_to_save", "use_rslora",
                  "init_lora_weights")
        return cls(**{k: data[k] for k in fields if k in data})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoraConfig) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return "LoraConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"


def _check_names(field: str, names: Any) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise DTypeError(f"LoraConfig: {field} must be a list of module names, got {type(names).__name__} "
                         f"{names!r}")
    out = tuple(names)
    for n in out:
        if not isinstance(n, str) or not n:
            raise DTypeError(f"LoraConfig: {field} entries must be non-empty strings, got {n!r}")
    if not out:
        raise ValueRangeError(f"LoraConfig: {field} is an empty list")
    return out


def _check_target(target: Any) -> str | tuple[str, ...] | ParamGroup | None:
    if target is None or isinstance(target, ParamGroup):
        return target
    if isinstance(target, str):
        if target != ALL_LINEAR:
            try:
                re.compile(target)
            except re.error as e:
                raise ValueRangeError(f"LoraConfig: target_modules {target!r} is not a valid regex: {e}") from None
        return target
    return _check_names("target_modules", target)


__all__ = ["LoraConfig", "BIAS_MODES", "INIT_MODES", "ALL_LINEAR"]
