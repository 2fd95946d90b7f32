"""``ParamGroup``: a named selection of a model's parameters, for freezing and for per-group optimizer options.

>>> from ember import nn
>>> import ember
>>> model = nn.Module()
>>> model.encoder = nn.Module()
>>> model.encoder.w, model.encoder.bias = nn.Parameter(ember.ones(2)), nn.Parameter(ember.zeros(2))
>>> model.head = nn.Module(); model.head.w = nn.Parameter(ember.ones(2))
>>> [n for n, _ in ParamGroup(model, regex=r"^encoder\\.").named_parameters()]
['encoder.w', 'encoder.bias']
>>> groups = param_groups(model, [(ParamGroup(model, regex="bias"), {"weight_decay": 0.0})])
>>> [g["param_names"] for g in groups]
[['encoder.w', 'head.w'], ['encoder.bias']]
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..errors import DTypeError, ValueRangeError
from .module import Module, Parameter


class ParamGroup:
    """The parameters of ``model`` chosen by exact dotted ``paths``, a ``regex`` (``re.search`` on the path) and/or
    a predicate ``where(path, param) -> bool``. Several selectors must all match; none selects every parameter.

    The selection is evaluated on use, so it follows parameters replaced or added later.
    """

    def __init__(self, model: Module, *, paths: Iterable[str] | None = None, regex: str | re.Pattern[str] | None = None,
                 where: Callable[[str, Parameter], bool] | None = None) -> None:
        if not isinstance(model, Module):
            raise DTypeError(f"ParamGroup: model must be an nn.Module, got {type(model).__name__}")
        self.model = model
        self.paths: tuple[str, ...] | None = None
        if paths is not None:
            if isinstance(paths, str):
                paths = [paths]
            self.paths = tuple(paths)
            for p in self.paths:
                if not isinstance(p, str):
                    raise DTypeError(f"ParamGroup: paths must be strings, got {type(p).__name__} {p!r}")
            self._check_paths()
        self.regex: re.Pattern[str] | None = None
        if regex is not None:
            try:
                self.regex = re.compile(regex)
            except re.error as e:
                raise ValueRangeError(f"ParamGroup: invalid regex {regex!r}: {e}") from None
        if where is not None and not callable(where):
            raise DTypeError(f"ParamGroup: where must be a callable (path, param) -> bool, got {type(where).__name__}")
        self.where = where

    def _check_paths(self) -> None:
        known = [n for n, _ in self.model.named_parameters()]
        known_set = set(known)
        for p in self.paths or ():
            if p not in known_set:
                close = difflib.get_close_matches(p, known, n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ValueRangeError(
                    f"ParamGroup: {type(self.model).__name__} has no parameter {p!r} ({len(known)} parameters{hint})"
                )

    def matches(self, path: str, param: Parameter) -> bool:
        """Whether the parameter at ``path`` belongs to this group."""
        if self.paths is not None and path not in self.paths:
            return False
        if self.regex is not None and self.regex.search(path) is None:
            return False
        return self.where is None or bool(self.where(path, param))

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """(dotted path, parameter) pairs of the selection, in the model's order."""
        if self.paths is not None:
            self._check_paths()
        for path, p in self.model.named_parameters():
            if self.matches(path, p):
                yield path, p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def __iter__(self) -> Iterator[Parameter]:
        return self.parameters()

    def __len__(self) -> int:
        return sum(1 for _ in self.named_parameters())

    def __contains__(self, item: Any) -> bool:
        return any(p is item for p in self.parameters())

    def num_params(self) -> int:
        """Number of parameter elements in the selection."""
        return sum(p.numel() for p in self.parameters())

    def freeze(self) -> ParamGroup:
        """Stop training the selection (``requires_grad`` off)."""
        for p in self.parameters():
            p.requires_grad_(False)
        return self

    def unfreeze(self) -> ParamGroup:
        """Train the selection again (``requires_grad`` on; integer parameters stay off)."""
        for p in self.parameters():
            if p.dtype.is_floating_point:
                p.requires_grad_(True)
        return self

    def __repr__(self) -> str:
        sel = []
        if self.paths is not None:
            sel.append(f"paths={list(self.paths)!r}")
        if self.regex is not None:
            sel.append(f"regex={self.regex.pattern!r}")
        if self.where is not None:
            sel.append(f"where={getattr(self.where, '__name__', self.where)!r}")
        return f"ParamGroup({type(self.model).__name__}{', ' if sel else ''}{', '.join(sel)}; {len(self)} parameters)"


def param_groups(model: Module, groups: Sequence[tuple[ParamGroup, dict[str, Any]]],
                 default: dict[str, Any] | None = None, *, skip_frozen: bool = False) -> list[dict[str, Any]]:
    """Optimizer parameter groups (PyTorch's dicts) from ``(ParamGroup, options)`` pairs.

    Every parameter of ``model`` lands in exactly one group: the *last* pair whose ParamGroup selects it, else the
    default group (options ``default``). The result lists the default group first, then one group per pair, in
    order (empty groups are kept, so indices stay stable for per-group scheduler settings); each carries
    ``param_names``. ``skip_frozen=True`` leaves out parameters that do not require grad.
    """
    if not isinstance(model, Module):
        raise DTypeError(f"param_groups: model must be an nn.Module, got {type(model).__name__}")
    default = {} if default is None else default
    if not isinstance(default, dict):
        raise DTypeError(f"param_groups: default must be a dict of options, got {type(default).__name__}")
    specs = list(groups)
    for i, spec in enumerate(specs):
        if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], ParamGroup)
                and isinstance(spec[1], dict)):
            raise DTypeError(f"param_groups: groups[{i}] must be a (ParamGroup, dict of options) pair, got {spec!r}")
        if spec[0].model is not model:
            raise ValueRangeError(f"param_groups: groups[{i}]'s ParamGroup selects from a different model")
        if "params" in spec[1]:
            raise ValueRangeError(f"param_groups: groups[{i}]'s options must not contain 'params'")
    if "params" in default:
        raise ValueRangeError("param_groups: default options must not contain 'params'")
    out = [{"params": [], "param_names": [], **default}]
    out += [{"params": [], "param_names": [], **opts} for _, opts in specs]
    for path, p in model.named_parameters():
        if skip_frozen and not p.requires_grad:
            continue
        slot = 0
        for i, (pg, _) in enumerate(specs):
            if pg.matches(path, p):
                slot = i + 1
        out[slot]["params"].append(p)
        out[slot]["param_names"].append(path)
    return out


__all__ = ["ParamGroup", "param_groups"]
