"""``Optimizer``: PyTorch's optimizer base class over ember tensors.

Parameter groups are plain dicts (``{"params": [...], "lr": ..., ...}``); per-parameter state lives in
``optimizer.state[param]``. ``state_dict()`` uses PyTorch's layout -- state keyed by the parameter's index in
group order, groups holding index lists -- so a checkpoint restores into a fresh optimizer over the same
parameters and training continues exactly where it stopped.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from .. import compile as _compile
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


def _check_adam_group(op: str, group: dict[str, Any]) -> None:
    """The hyper-parameters the Adam family shares (lr, eps, betas, weight_decay), checked as PyTorch does."""
    _check_range(op, "learning rate (lr)", group["lr"])
    _check_range(op, "epsilon value (eps)", group["eps"])
    _check_betas(op, group["betas"])
    _check_range(op, "weight_decay value", group["weight_decay"])


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_state_value(name: str, where: str, p: Tensor, key: Any, val: Any,
                       scalar_keys: tuple[str, ...] = ()) -> None:
    """One per-parameter state entry: ``step`` a finite count >= 0; ``scalar_keys`` (per-parameter scalars such
    as ASGD's ``eta``) finite one-element numbers; tensors of the parameter's shape (floating for a floating
    parameter); otherwise finite numbers, None or dicts of such."""
    if not isinstance(key, str):
        raise ValueRangeError(f"{name}: {where} has a non-string key {key!r}")
    at = f"{where}[{key!r}]"
    if key in scalar_keys:
        if isinstance(val, Tensor):
            if val.numel() != 1 or not val._dtype.is_floating_point:
                raise ValueRangeError(f"{name}: {at} must be a one-element floating tensor, got shape "
                                      f"{tuple(val.shape)} {val._dtype}")
            val = val.item()
        if not _is_number(val) or not math.isfinite(val):
            raise ValueRangeError(f"{name}: {at} is {val!r}; expected a finite number")
        return
    if key == "step":
        if isinstance(val, Tensor):
            if val.numel() != 1 or val._dtype.is_bool or not (val._dtype.is_floating_point or val._dtype.is_integer):
                raise ValueRangeError(f"{name}: {at} must be a one-element numeric tensor, got shape "
                                      f"{tuple(val.shape)} {val._dtype}")
            val = val.item()
        if not _is_number(val) or not math.isfinite(val) or val < 0:
            raise ValueRangeError(f"{name}: {at} is {val!r}; expected a finite step count >= 0")
        return
    if isinstance(val, Tensor):
        if tuple(val.shape) != tuple(p.shape):
            raise ValueRangeError(f"{name}: {at} has shape {tuple(val.shape)}, the parameter's is {tuple(p.shape)}")
        if p._dtype.is_floating_point and not val._dtype.is_floating_point:
            raise ValueRangeError(f"{name}: {at} has dtype {val._dtype}, expected a floating dtype like the "
                                  f"parameter's {p._dtype}")
    elif isinstance(val, Mapping):
        for k, v in val.items():
            if isinstance(v, Tensor) or v is None or (_is_number(v) and math.isfinite(v)):
                continue
            if not isinstance(v, Mapping):
                raise ValueRangeError(f"{name}: {at}[{k!r}] is a {type(v).__name__}; expected a tensor or a number")
    elif not (val is None or isinstance(val, bool) or (_is_number(val) and math.isfinite(val))):
        raise ValueRangeError(f"{name}: {at} is {val!r:.80}; expected a tensor, a finite number or None")


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
        parameter's device; floating buffers take the parameter's dtype, ``step`` stays as saved).

        Everything is checked before anything changes (see :meth:`check_state_dict`): a bad state dict raises
        ValueRangeError naming the offending entry and leaves the optimizer as it was."""
        state, groups = self._prepare_load(state_dict, cast=True)
        self.state = state
        self.param_groups = groups

    def check_state_dict(self, state_dict: Any) -> None:
        """Raise ValueRangeError (naming the entry, e.g. ``param_groups[0]['lr']``) unless ``load_state_dict``
        would accept ``state_dict``; changes nothing. Checks the layout, the group sizes, every hyper-parameter's
        type and range (finite numbers, lr >= 0, betas in [0, 1), ...), each state tensor's shape and dtype kind,
        ``step`` (a finite number >= 0) and the state entries this optimizer's step needs."""
        self._prepare_load(state_dict, cast=False)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        """The state entries ``step`` needs once a parameter has state (subclasses; checked on load)."""
        return ()

    #: per-parameter state entries that are one-element scalars (kept in their saved dtype, like ``step``)
    _scalar_state_keys: tuple[str, ...] = ()

    def _prepare_load(self, state_dict: Any, cast: bool
                      ) -> tuple[defaultdict[Tensor, dict[str, Any]], list[dict[str, Any]]]:
        """Validate a state dict and build the new state and groups without touching the optimizer."""
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, Mapping) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueRangeError(f"{name}: expected a dict with 'state' and 'param_groups' keys")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)):
            raise ValueRangeError(f"{name}: 'param_groups' must be a list, got {type(saved_groups).__name__}")
        if not isinstance(saved_state, Mapping):
            raise ValueRangeError(f"{name}: 'state' must be a dict, got {type(saved_state).__name__}")
        if len(saved_groups) != len(self.param_groups):
            raise ValueRangeError(
                f"{name}: loaded state dict has {len(saved_groups)} parameter groups, the optimizer "
                f"has {len(self.param_groups)}"
            )
        seen: set[int] = set()
        for i, s in enumerate(saved_groups):
            if not isinstance(s, Mapping) or not all(isinstance(k, str) for k in s):
                raise ValueRangeError(f"{name}: param_groups[{i}] must be a dict with str keys, got {s!r:.80}")
            idx = s.get("params")
            if not isinstance(idx, (list, tuple)) or not all(_is_int(j) for j in idx):
                raise ValueRangeError(f"{name}: param_groups[{i}]['params'] must be a list of parameter indices, "
                                      f"got {idx!r:.80}")
            if len(self.param_groups[i]["params"]) != len(idx):
                raise ValueRangeError(
                    f"{name}: loaded parameter group {i} has {len(idx)} parameters, the "
                    f"optimizer's group has {len(self.param_groups[i]['params'])}"
                )
            if seen.intersection(idx) or len(set(idx)) != len(idx):
                raise ValueRangeError(f"{name}: param_groups[{i}]['params'] repeats a parameter index: {list(idx)}")
            seen.update(idx)
        id_map = {old: p for g, s in zip(self.param_groups, saved_groups) for old, p in zip(s["params"], g["params"])}
        new_groups = []
        group_of: dict[int, dict[str, Any]] = {}
        for i, (g, s) in enumerate(zip(self.param_groups, saved_groups)):
            ng = copy.deepcopy({k: v for k, v in s.items() if k != "params"})
            self._check_group_values(name, i, ng)
            ng["params"] = g["params"]
            if "param_names" in ng and not (isinstance(ng["param_names"], (list, tuple))
                                            and len(ng["param_names"]) == len(g["params"])
                                            and all(isinstance(n, str) for n in ng["param_names"])):
                raise ValueRangeError(f"{name}: param_groups[{i}]['param_names'] must be one name per parameter")
            if "param_names" in g and "param_names" not in s:
                ng["param_names"] = g["param_names"]
            try:
                self._validate_group(ng)
            except (EmberError, TypeError, ValueError, KeyError) as e:
                raise ValueRangeError(f"{name}: param_groups[{i}]: {e}") from None
            new_groups.append(ng)
            for p in g["params"]:
                group_of[id(p)] = ng
        new_state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        for k, v in saved_state.items():
            if _is_int(k):
                index = int(k)
            elif isinstance(k, str) and k.lstrip("-").isdigit():
                index = int(k)
            else:
                raise ValueRangeError(f"{name}: state key {k!r} is not a parameter index")
            p = id_map.get(index)
            if p is None:
                continue  # PyTorch ignores state of unknown indices too
            where = f"state[{index}]"
            if not isinstance(v, Mapping):
                raise ValueRangeError(f"{name}: {where} must be a dict, got {type(v).__name__}")
            missing = [key for key in self._state_keys(group_of[id(p)]) if key not in v] if v else []
            if missing:
                raise ValueRangeError(f"{name}: {where} lacks {missing} (has {sorted(map(str, v))}); "
                                      f"{type(self).__name__}'s step needs them")
            for key, val in v.items():
                _check_state_value(name, where, p, key, val, self._scalar_state_keys)
            new_state[p] = ({key: self._cast_state(p, key, val, self._scalar_state_keys) for key, val in v.items()}
                            if cast else dict(v))
        return new_state, new_groups

    def _check_group_values(self, name: str, i: int, group: dict[str, Any]) -> None:
        """Every hyper-parameter the optimizer has a default for is present and of the default's type; every
        number is finite."""
        for key, default in self.defaults.items():
            where = f"param_groups[{i}][{key!r}]"
            if key not in group:
                raise ValueRangeError(f"{name}: {where} is missing")
            v = group[key]
            if isinstance(default, bool):
                ok = isinstance(v, bool)
            elif default is None:
                ok = v is None or isinstance(v, bool)
            elif isinstance(default, (int, float)) or default is required:
                ok = _is_number(v)
            elif isinstance(default, (tuple, list)):
                ok = isinstance(v, (tuple, list)) and len(v) == len(default) and all(_is_number(x) for x in v)
            elif isinstance(default, str):
                ok = isinstance(v, str)
            else:
                ok = True
            if not ok:
                raise ValueRangeError(f"{name}: {where} is {v!r:.80} ({type(v).__name__}); expected a value like "
                                      f"the default {default!r}")
        for key, v in group.items():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                if _is_number(x) and not math.isfinite(x):
                    raise ValueRangeError(f"{name}: param_groups[{i}][{key!r}] is {v!r}; expected finite numbers")

    @staticmethod
    def _cast_state(p: Tensor, key: str, value: Any, scalar_keys: tuple[str, ...] = ()) -> Any:
        if isinstance(value, Tensor):
            if key == "step" or key in scalar_keys:
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
    """a <- a + value * t1 * t2, in place (``value`` may be an ember.compile binding: it then stays one)."""
    return a.add_((t1 * _compile.scalar_tensor(value, t1)).mul_(t2) if value != 1 else t1 * t2)


def addcdiv_(a: Tensor, t1: Tensor, t2: Tensor, value: float = 1.0) -> Tensor:
    """a <- a + value * t1 / t2, in place (``value`` may be an ember.compile binding: it then stays one)."""
    return a.add_((t1 * _compile.scalar_tensor(value, t1)).div_(t2) if value != 1 else t1 / t2)


__all__ = ["Optimizer", "required"]
