"""``Optimizer``: PyTorch's optimizer base class over ember tensors.

Parameter groups are plain dicts (``{"params": [...], "lr": ..., ...}``); per-parameter state lives in
``optimizer.state[param]``. ``state_dict()`` uses PyTorch's layout -- state keyed by the parameter's index in
group order, groups holding index lists -- so a checkpoint restores into a fresh optimizer over the same
parameters and training continues exactly where it stopped.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..autograd import enable_grad, no_grad
from ..errors import AutodiffError, DTypeError, EmberError, ValueRangeError
from ..tensor import Tensor


class _RequiredParameter:
    """Marks a hyper-parameter every group must give (no default)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _RequiredParameter()


def _check_range(op: str, name: str, value: Any, low: float = 0.0, high: float | None = None,
                 high_open: bool = True) -> None:
    """ValueRangeError naming the hyper-parameter unless low <= value (< or <=) high."""
    if isinstance(value, Tensor):
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueRangeError(f"{op}: invalid {name}: expected a number, got {type(value).__name__} {value!r}")
    ok = value >= low
    if high is not None:
        ok = ok and (value < high if high_open else value <= high)
    if not ok:
        rng = f">= {low}" if high is None else f"in [{low}, {high}{')' if high_open else ']'}"
        raise ValueRangeError(f"{op}: invalid {name} {value!r}: expected a value {rng}")


def _check_betas(op: str, betas: Any) -> None:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueRangeError(f"{op}: betas must be a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(betas):
        _check_range(op, f"beta parameter at index {i} (betas[{i}])", b, 0.0, 1.0)


class Optimizer:
    """Base class of all optimizers (``torch.optim.Optimizer``).

    Subclasses pass their hyper-parameter ``defaults`` and implement ``step``; updates happen under
    ``ember.no_grad()`` with in-place ops on the parameters, so a parameter keeps its identity (and stays the
    leaf a differentiable device tracks).
    """

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise DTypeError(
                f"{type(self).__name__}: params argument given to the optimizer should be an iterable of Tensors "
                "or dicts, but got a Tensor (wrap it in a list)"
            )
        if isinstance(params, dict):
            params = [params]
        try:
            groups = list(params)
        except TypeError:
            raise DTypeError(
                f"{type(self).__name__}: params should be an iterable of Tensors or dicts, got "
                f"{type(params).__name__}"
            ) from None
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if not groups:
            raise ValueRangeError(f"{type(self).__name__}: optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    # -- groups ------------------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters (with its own hyper-parameters; missing ones come from ``defaults``)."""
        name = type(self).__name__
        if not isinstance(param_group, dict):
            raise DTypeError(f"{name}.add_param_group: param_group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueRangeError(f"{name}.add_param_group: the group has no 'params' entry")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise DTypeError(
                f"{name}: optimizer parameters need to be organized in ordered collections, but the ordering of "
                "tensors in sets will change between runs; use a list instead"
            )
        params = list(params)
        tensors: list[Tensor] = []
        names: list[str] = []
        for p in params:
            if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
                names.append(p[0])
                p = p[1]
            if not isinstance(p, Tensor):
                raise DTypeError(f"{name}: optimizer can only optimize Tensors, but one of the params is "
                                 f"{type(p).__name__}")
            if not p.is_leaf:
                raise AutodiffError(
                    f"{name}: can't optimize a non-leaf Tensor (shape {p.shape}); optimize the leaf it was computed "
                    "from, or pass t.detach().requires_grad_()"
                )
            tensors.append(p)
        if names:
            if len(names) != len(tensors):
                raise ValueRangeError(f"{name}: all optimizer params should be with/without names; some names are "
                                      "missing")
            group["param_names"] = names
        group["params"] = tensors
        for key, default in self.defaults.items():
            if default is required and key not in group:
                raise ValueRangeError(f"{name}: parameter group didn't specify a value of required optimization "
                                      f"parameter {key}")
            group.setdefault(key, default)
        self._validate_group(group)
        ids = [id(p) for p in tensors]
        if len(set(ids)) != len(ids):
            raise ValueRangeError(f"{name}: a parameter group contains the same parameter more than once")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if seen.intersection(ids):
            raise ValueRangeError(f"{name}: some parameters appear in more than one parameter group")
        if self.param_groups and (("param_names" in group) != ("param_names" in self.param_groups[0])):
            raise ValueRangeError(f"{name}: all optimizer param groups should be with/without names")
        self.param_groups.append(group)

    def _validate_group(self, group: dict[str, Any]) -> None:
        """Check a group's hyper-parameters (subclasses; called for every group, defaults filled in)."""

    # -- stepping ----------------------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all optimized parameters (to None by default, else to zeros)."""
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    with no_grad():
                        g.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the parameters once; ``closure`` (re-evaluates the model, returns the loss) runs with grad on."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if params:
                    self._update_group(group, params)
        return loss

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        raise EmberError(f"{type(self).__name__} does not implement step()")

    def _grad(self, p: Tensor, maximize: bool) -> Tensor:
        g = p.grad
        if g is None:  # pragma: no cover - filtered by step()
            raise AutodiffError("internal: parameter without grad")
        if g._dtype is not p._dtype:
            g = g.to(p._dtype)
        return -g if maximize else g

    @staticmethod
    def _step_tensor(p: Tensor) -> Tensor:
        """PyTorch keeps ``step`` as a float32 scalar tensor in each parameter's state."""
        from ..dtypes import float32
        from ..ops.creation import zeros

        return zeros((), dtype=float32, device=p._device)

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}`` (PyTorch's layout).

        Like PyTorch, the state tensors are the live buffers; copy or save the dict before stepping again.
        """
        index: dict[int, int] = {}
        groups = []
        start = 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            for i, p in enumerate(g["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in g["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyper-parameters and state saved by ``state_dict()`` (tensors are copied onto each
        parameter's device; floating buffers take the parameter's dtype, ``step`` stays as saved)."""
        name = type(self).__name__
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueRangeError(f"{name}.load_state_dict: expected a dict with 'state' and 'param_groups' keys")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueRangeError(
                f"{name}.load_state_dict: loaded state dict has {len(saved_groups)} parameter groups, the optimizer "
                f"has {len(self.param_groups)}"
            )
        for i, (g, s) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueRangeError(
                    f"{name}.load_state_dict: loaded parameter group {i} has {len(s['params'])} parameters, the "
                    f"optimizer's group has {len(g['params'])}"
                )
        id_map = {old: p for g, s in zip(self.param_groups, saved_groups) for old, p in zip(s["params"], g["params"])}
        new_state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for k, v in state_dict["state"].items():
            p = id_map.get(k if not isinstance(k, str) else int(k))
            if p is None:
                continue  # PyTorch ignores state of unknown indices too
            new_state[p] = {key: self._cast_state(p, key, val) for key, val in v.items()}
        new_groups = []
        for g, s in zip(self.param_groups, saved_groups):
            ng = copy.deepcopy({k: v for k, v in s.items() if k != "params"})
            ng["params"] = g["params"]
            if "param_names" in g and "param_names" not in s:
                ng["param_names"] = g["param_names"]
            new_groups.append(ng)
        self.state = new_state
        self.param_groups = new_groups

    @staticmethod
    def _cast_state(p: Tensor, key: str, value: Any) -> Any:
        if isinstance(value, Tensor):
            if key == "step":
                return value.to(p._device).clone()
            if value._dtype.is_floating_point:
                return value.to(p._device, p._dtype).clone()
            return value.to(p._device).clone()
        if isinstance(value, dict):
            return {k: Optimizer._cast_state(p, k, v) for k, v in value.items()}
        return copy.deepcopy(value)

    # -- printing ----------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(g):
                if k not in ("params", "param_names"):
                    lines.append(f"    {k}: {g[k]}")
        lines.append(")")
        return "\n".join(lines)


def lerp_(a: Tensor, end: Tensor, weight: float) -> Tensor:
    """a <- a + weight * (end - a), in place, with PyTorch's two-sided formula (exact at weight 0 and 1)."""
    if weight < 0.5:
        return a.add_((end - a).mul_(weight))
    # end - (end - a) * (1 - weight), written into a
    d = (end - a).mul_(1 - weight)
    return a.copy_(end - d)


def addcmul_(a: Tensor, t1: Tensor, t2: Tensor, value: float = 1.0) -> Tensor:
    """a <- a + value * t1 * t2, in place."""
    return a.add_((t1 * value).mul_(t2) if value != 1 else t1 * t2)


def addcdiv_(a: Tensor, t1: Tensor, t2: Tensor, value: float = 1.0) -> Tensor:
    """a <- a + value * t1 / t2, in place."""
    return a.add_((t1 * value).div_(t2) if value != 1 else t1 / t2)


__all__ = ["Optimizer", "required"]
