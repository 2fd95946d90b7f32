"""Learning-rate schedulers with PyTorch's names, arguments and values (``torch.optim.lr_scheduler``).

Each scheduler computes the learning rate of every parameter group in *closed form* from ``base_lrs`` and
``last_epoch`` (PyTorch's chainable recurrences give the same values up to rounding), so a scheduler restored from
``state_dict()`` continues exactly, and schedulers compose: :class:`ProductLR` multiplies their factors.

Usage is PyTorch's: build the scheduler after the optimizer, call ``optimizer.step()`` then ``scheduler.step()``
once per epoch (or per batch, for OneCycleLR / NoamLR / warm-ups).
"""

from __future__ import annotations

import copy
import math
import types
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import DTypeError, ValueRangeError
from .optimizer import Optimizer


def _check_optimizer(name: str, optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise DTypeError(f"{name}: {type(optimizer).__name__} is not an Optimizer")


def _per_group(name: str, what: str, optimizer: Optimizer, value: Any) -> list[Any]:
    """One value per parameter group (a scalar is repeated; a list must have one entry per group)."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueRangeError(f"{name}: expected {n} values for {what} (one per parameter group), got {len(value)}")
        return list(value)
    return [value] * n


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _like(name: str, key: str, new: Any, cur: Any) -> Any:
    """``new`` (a loaded state value) checked against ``cur`` (this scheduler's value of the same key): same type,
    length and keys, finite numbers; returned in ``cur``'s container type (records and JSON turn a Counter into a
    dict)."""
    def bad(what: str) -> ValueRangeError:
        return ValueRangeError(f"{name}: {key!r} is {new!r:.80}; expected {what}")

    if isinstance(cur, bool):
        if not isinstance(new, bool):
            raise bad("a bool")
        return new
    if _is_number(cur) or (cur is None and _is_number(new)):
        if not _is_number(new) or not math.isfinite(new):
            raise bad("a finite number")
        return new
    if cur is None:
        if new is not None and not isinstance(new, Mapping):
            raise bad("None")
        return new
    if isinstance(cur, str):
        if not isinstance(new, str):
            raise bad("a string")
        return new
    if isinstance(cur, Counter):
        if not isinstance(new, Mapping) or not all(_is_int(k) and _is_int(v) and v > 0 for k, v in new.items()):
            raise bad("a mapping of int milestones to positive counts")
        return Counter({int(k): int(v) for k, v in new.items()})
    if isinstance(cur, Mapping):
        if not isinstance(new, Mapping):
            raise bad("a dict")
        if isinstance(cur, dict) and set(cur) != set(new):  # lambda state and the like: the same attributes
            raise bad(f"the keys {sorted(map(str, cur))}")
        return {k: _like(name, f"{key}.{k}", new[k], cur[k]) for k in cur}
    if isinstance(cur, (list, tuple)):
        if not isinstance(new, (list, tuple)) or len(new) != len(cur):
            raise bad(f"a list of {len(cur)} values")
        return type(cur)(_like(name, f"{key}[{i}]", n, c) for i, (n, c) in enumerate(zip(new, cur)))
    if not isinstance(new, type(cur)):
        raise bad(f"a {type(cur).__name__}")
    return new


class LRScheduler:
    """Base class: subclasses define :meth:`get_lr` (the learning rates at ``last_epoch``, in closed form)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        name = type(self).__name__
        _check_optimizer(name, optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise ValueRangeError(
                        f"{name}: param 'initial_lr' is not specified in param_groups[{i}] when resuming a scheduler "
                        f"with last_epoch={last_epoch}; load the optimizer's state_dict first or use last_epoch=-1"
                    )
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self.step()

    def get_lr(self) -> list[float]:
        """The learning rate of each group at ``last_epoch``."""
        raise NotImplementedError(f"{type(self).__name__} does not define get_lr()")

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step()`` set."""
        return list(self._last_lr)

    def factors(self) -> list[float]:
        """Each group's learning rate at ``last_epoch`` divided by its base learning rate (used by ProductLR)."""
        return [lr / base if base != 0 else 1.0 for lr, base in zip(self.get_lr(), self.base_lrs)]

    def step(self, epoch: int | None = None) -> None:
        """Advance one step (or jump to ``epoch``) and write the new learning rates into the optimizer."""
        self._step_count += 1
        self._advance(self.last_epoch + 1 if epoch is None else epoch)
        self._set_lrs(self.get_lr())

    def _advance(self, epoch: Any) -> None:
        """Move to ``epoch`` (subclasses with derived position state update it here)."""
        self.last_epoch = epoch

    def _set_lrs(self, values: Sequence[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer (PyTorch's format)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state saved by ``state_dict()``; checked first (:meth:`check_state_dict`), so a bad one
        raises ValueRangeError and changes nothing."""
        self.__dict__.update(self._checked(state_dict, None))

    def check_state_dict(self, state_dict: Any, param_groups: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Raise ValueRangeError naming the entry unless ``load_state_dict`` would accept ``state_dict``: the same
        keys as this scheduler's own state, values of the same types and lengths, finite numbers, ``last_epoch``
        an int >= -1, learning rates >= 0, and a schedule that computes finite learning rates. ``param_groups``
        (default: the optimizer's) are the groups the schedule is tried on, e.g. those of an optimizer state about
        to be loaded. Changes nothing."""
        self._checked(state_dict, param_groups)

    def _checked(self, state_dict: Any, param_groups: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise ValueRangeError(f"{name}: expected a dict, got {type(state_dict).__name__}")
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(map(str, set(state_dict) - set(own)))
        if missing or unexpected:
            raise ValueRangeError(f"{name}: the state's keys do not match this scheduler's: missing {missing}, "
                                  f"unexpected {unexpected}")
        sd = {k: _like(name, k, state_dict[k], own[k]) for k in own}
        if not _is_int(sd["last_epoch"]) or sd["last_epoch"] < -1:
            raise ValueRangeError(f"{name}: 'last_epoch' is {sd['last_epoch']!r}; expected an int >= -1")
        if not _is_int(sd["_step_count"]) or sd["_step_count"] < 0:
            raise ValueRangeError(f"{name}: '_step_count' is {sd['_step_count']!r}; expected an int >= 0")
        for key in ("base_lrs", "_last_lr"):
            if key in sd and any(v < 0 for v in sd[key]):
                raise ValueRangeError(f"{name}: {key!r} is {sd[key]!r}; learning rates must be >= 0")
        self._try_schedule(name, sd, param_groups)
        return sd

    def _try_schedule(self, name: str, sd: dict[str, Any], param_groups: Sequence[Mapping[str, Any]] | None) -> None:
        """Compute the learning rates of the loaded state on a copy (with copies of the groups), so a state the
        schedule cannot use fails now instead of at the next step."""
        trial = copy.copy(self)
        trial.__dict__.update({k: v for k, v in sd.items() if k != "lr_lambdas"})  # lambdas' state is not them
        groups = self.optimizer.param_groups if param_groups is None else param_groups
        trial.optimizer = types.SimpleNamespace(param_groups=[dict(g) for g in groups])
        try:
            lrs = trial.get_lr()
        except (ArithmeticError, LookupError, TypeError, ValueError) as e:
            raise ValueRangeError(f"{name}: the saved state gives no learning rates ({type(e).__name__}: {e})"
                                  ) from None
        if not all(_is_number(lr) and math.isfinite(lr) for lr in lrs):
            raise ValueRangeError(f"{name}: the saved state gives learning rates {lrs}; expected finite numbers")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, last_lr={getattr(self, '_last_lr', None)})"


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)`` (one function, or one per group)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        _check_optimizer("LambdaLR", optimizer)
        fns = _per_group("LambdaLR", "lr_lambda", optimizer, lr_lambda)
        for f in fns:
            if not callable(f):
                raise DTypeError(f"LambdaLR: lr_lambda must be callable, got {type(f).__name__}")
        self.lr_lambdas: list[Callable[[int], float]] = fns
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        # functions are not saved; callable objects' attributes are (PyTorch's behaviour)
        sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        sd["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(f.__dict__) for f in self.lr_lambdas]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = self._checked(state_dict, None)
        fns = sd.pop("lr_lambdas", [])
        self.__dict__.update(sd)
        for f, saved in zip(self.lr_lambdas, fns):
            if saved is not None:
                f.__dict__.update(saved)


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if not isinstance(step_size, int) or isinstance(step_size, bool) or step_size <= 0:
            raise ValueRangeError(f"StepLR: step_size must be a positive integer, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` at each milestone epoch (a repeated milestone applies twice)."""

    def __init__(self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        n = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [base * self.gamma**n for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma**self.last_epoch for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale the learning rate linearly from ``start_factor`` to ``end_factor`` over ``total_iters`` steps (a
    warm-up when start_factor < end_factor), then keep ``end_factor``."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueRangeError(
                f"LinearLR: start_factor expected to be greater than 0 and less or equal to 1, got {start_factor}"
            )
        if end_factor > 1.0 or end_factor < 0:
            raise ValueRangeError(f"LinearLR: end_factor expected to be between 0 and 1, got {end_factor}")
        if not isinstance(total_iters, int) or total_iters <= 0:
            raise ValueRangeError(f"LinearLR: total_iters must be a positive integer, got {total_iters!r}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = self.start_factor + (self.end_factor - self.start_factor) * min(self.total_iters, self.last_epoch) \
            / self.total_iters
        return [base * f for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2`` (SGDR without restarts; past
    T_max the cosine continues, as in PyTorch)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803
        if not isinstance(T_max, (int, float)) or T_max <= 0:
            raise ValueRangeError(f"CosineAnnealingLR: T_max must be positive, got {T_max!r}")
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        c = (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every ``T_i`` epochs, ``T_0`` first and each period ``T_mult`` times longer."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0,  # noqa: N803
                 last_epoch: int = -1) -> None:
        if not isinstance(T_0, int) or isinstance(T_0, bool) or T_0 <= 0:
            raise ValueRangeError(f"CosineAnnealingWarmRestarts: expected positive integer T_0, but got {T_0!r}")
        if not isinstance(T_mult, int) or isinstance(T_mult, bool) or T_mult < 1:
            raise ValueRangeError(f"CosineAnnealingWarmRestarts: expected integer T_mult >= 1, but got {T_mult!r}")
        if not isinstance(eta_min, (float, int)):
            raise ValueRangeError(f"CosineAnnealingWarmRestarts: expected float or int eta_min, got {eta_min!r}")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def _advance(self, epoch: Any) -> None:
        # a (possibly fractional) epoch, as in PyTorch's per-batch usage ``step(epoch + i / iters)``
        if epoch < 0:
            raise ValueRangeError(f"CosineAnnealingWarmRestarts: expected non-negative epoch, but got {epoch}")
        self.T_cur, self.T_i = self._position(epoch)
        self.last_epoch = math.floor(epoch)

    def _position(self, e: float) -> tuple[float, int]:
        if e < self.T_0:
            return e, self.T_0
        if self.T_mult == 1:
            return e % self.T_0, self.T_0
        # walk the geometric periods with exact integers (a float log misplaces exact restart points)
        t_cur, t_i = e, self.T_0
        while t_cur >= t_i:
            t_cur -= t_i
            t_i *= self.T_mult
        return t_cur, t_i

    def get_lr(self) -> list[float]:
        c = (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
        return [self.eta_min + (base - self.eta_min) * c for base in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin): warm up from ``max_lr / div_factor`` to ``max_lr`` over ``pct_start`` of
    the steps, then anneal to ``initial_lr / final_div_factor``; momentum (or Adam's beta1) cycles inversely.
    Step it after every batch."""

    def __init__(self, optimizer: Optimizer, max_lr: float | list[float], total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True,
                 base_momentum: float | list[float] = 0.85, max_momentum: float | list[float] = 0.95,
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        _check_optimizer("OneCycleLR", optimizer)
        self.optimizer = optimizer
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueRangeError(f"OneCycleLR: expected positive integer total_steps, but got {total_steps!r}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0:
                raise ValueRangeError(f"OneCycleLR: expected positive integer epochs, but got {epochs!r}")
            if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
                raise ValueRangeError(
                    f"OneCycleLR: expected positive integer steps_per_epoch, but got {steps_per_epoch!r}"
                )
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueRangeError("OneCycleLR: you must define either total_steps OR (epochs AND steps_per_epoch)")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueRangeError(f"OneCycleLR: expected float between 0 and 1 pct_start, but got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueRangeError(
                f"OneCycleLR: anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy!r}"
            )
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                (float(pct_start * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (float(2 * pct_start * n) - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                (n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self._schedule_phases = [
                (float(pct_start * n) - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                (n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        self._anneal_func_type = anneal_strategy
        max_lrs = _per_group("OneCycleLR", "max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for m, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = m / div_factor
                group["max_lr"] = m
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueRangeError(
                    f"OneCycleLR: optimizer {type(optimizer).__name__} must support momentum or beta1 with the "
                    "`cycle_momentum` option enabled (pass cycle_momentum=False)"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            maxm = _per_group("OneCycleLR", "max_momentum", optimizer, max_momentum)
            basem = _per_group("OneCycleLR", "base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for mm, bm, group in zip(maxm, basem, optimizer.param_groups):
                    if self.use_beta1:
                        group["betas"] = (mm, *group["betas"][1:])
                    else:
                        group["momentum"] = mm
                    group["max_momentum"] = mm
                    group["base_momentum"] = bm
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueRangeError(
                f"OneCycleLR: tried to step {step_num} times; the specified number of total steps is "
                f"{self.total_steps}"
            )
        lrs = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, (end_step, lr0, lr1, m0, m1) in enumerate(self._schedule_phases):
                if step_num <= end_step or i == last:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lr = self._anneal(group[lr0], group[lr1], pct)
                    mom = self._anneal(group[m0], group[m1], pct) if self.cycle_momentum else None
                    break
                start_step = end_step
            lrs.append(lr)
            if mom is not None:
                if self.use_beta1:
                    group["betas"] = (mom, *group["betas"][1:])
                else:
                    group["momentum"] = mom
        return lrs


class NoamLR(LRScheduler):
    """The Transformer schedule (Vaswani et al. 2017): linear warm-up then inverse-square-root decay,
    ``lr = factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)`` with ``step = last_epoch + 1``
    (the number of the optimizer step about to run). The optimizer's own lr is ignored."""

    def __init__(self, optimizer: Optimizer, d_model: int, warmup_steps: int, factor: float = 1.0,
                 last_epoch: int = -1) -> None:
        if not isinstance(d_model, int) or d_model <= 0:
            raise ValueRangeError(f"NoamLR: d_model must be a positive integer, got {d_model!r}")
        if not isinstance(warmup_steps, int) or warmup_steps <= 0:
            raise ValueRangeError(f"NoamLR: warmup_steps must be a positive integer, got {warmup_steps!r}")
        if factor < 0:
            raise ValueRangeError(f"NoamLR: factor must be >= 0, got {factor}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.factor = factor
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        step = self.last_epoch + 1
        lr = self.factor * self.d_model**-0.5 * min(step**-0.5, step * self.warmup_steps**-1.5)
        return [lr for _ in self.base_lrs]


class _Composite(LRScheduler):
    """The state of a scheduler made of member schedulers (``_schedulers``): its own fields plus each member's
    state dict, checked member by member on load."""

    _schedulers: list[LRScheduler]

    def state_dict(self) -> dict[str, Any]:
        sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        sd["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = self._checked(state_dict, None)
        members = sd.pop("_schedulers")
        self.__dict__.update(sd)
        for s, m in zip(self._schedulers, members):
            s.load_state_dict(m)

    def _checked(self, state_dict: Any, param_groups: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        name = type(self).__name__
        members = state_dict.get("_schedulers") if isinstance(state_dict, Mapping) else None
        if isinstance(members, (list, tuple)) and len(members) != len(self._schedulers):
            raise ValueRangeError(f"{name}.load_state_dict: saved state has {len(members)} schedulers, this one has "
                                  f"{len(self._schedulers)}")
        sd = super()._checked(state_dict, param_groups)
        for i, (s, m) in enumerate(zip(self._schedulers, sd["_schedulers"])):
            try:
                s.check_state_dict(m, param_groups)
            except ValueRangeError as e:
                raise ValueRangeError(f"{name}.load_state_dict: _schedulers[{i}]: {e}") from None
        return sd

    def _try_schedule(self, name: str, sd: dict[str, Any], param_groups: Sequence[Mapping[str, Any]] | None) -> None:
        pass  # the rates come from the members, each tried on its own


class ProductLR(_Composite):
    """Compose schedulers multiplicatively: ``lr = base_lr * prod(member factors)``, each factor being a member's
    lr divided by its base lr (e.g. a LinearLR warm-up times a CosineAnnealingLR decay). Step only the
    ProductLR; it steps its members."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler]) -> None:
        name = type(self).__name__
        _check_optimizer(name, optimizer)
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueRangeError(f"{name}: expects at least one scheduler")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise DTypeError(f"{name}: schedulers[{i}] is {type(s).__name__}, not an LRScheduler")
            if isinstance(s, ProductLR):
                raise ValueRangeError(f"{name}: schedulers[{i}] is itself a {type(s).__name__}; flatten the list")
            if isinstance(s, ReduceLROnPlateau):
                raise ValueRangeError(
                    f"{name}: schedulers[{i}] is a ReduceLROnPlateau, which needs a metric in step() and has no "
                    "closed form to multiply; step it separately"
                )
            if s.optimizer is not optimizer:
                raise ValueRangeError(
                    f"{name}: schedulers[{i}] ({type(s).__name__}) is bound to a different optimizer than the "
                    f"one passed to {name}"
                )
        self._schedulers = schedulers
        self.optimizer = optimizer
        self.base_lrs = list(schedulers[0].base_lrs)
        self.last_epoch = schedulers[0].last_epoch
        self._step_count = 1
        self._set_lrs(self.get_lr())

    def get_lr(self) -> list[float]:
        lrs = list(self.base_lrs)
        for s in self._schedulers:
            lrs = [lr * f for lr, f in zip(lrs, s.factors())]
        return lrs

    def step(self, epoch: int | None = None) -> None:
        self._step_count += 1
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        for s in self._schedulers:
            s._step_count += 1
            s._advance(self.last_epoch)
        self._set_lrs(self.get_lr())
        for s in self._schedulers:
            s._last_lr = list(self._last_lr)

    def _advance(self, epoch: Any) -> None:
        # moved as a member of another composite (SequentialLR): the members follow
        self.last_epoch = epoch
        for s in self._schedulers:
            s._advance(epoch)



class PolynomialLR(LRScheduler):
    """Decay the learning rate polynomially to 0 over ``total_iters`` steps:
    ``lr = base_lr * (1 - min(epoch, total_iters) / total_iters) ** power``."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        if not _is_int(total_iters) or total_iters <= 0:
            raise ValueRangeError(f"PolynomialLR: total_iters must be a positive integer, got {total_iters!r}")
        if not _is_number(power):
            raise ValueRangeError(f"PolynomialLR: power must be a number, got {power!r}")
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
        return [base * f for base in self.base_lrs]


class ChainedScheduler(ProductLR):
    """PyTorch's ``ChainedScheduler(schedulers, optimizer=None)``: step several schedulers together, their effects
    multiplied. Ember's schedulers are closed-form, so this is :class:`ProductLR` (``lr = base_lr * prod(factors)``),
    which equals PyTorch's chained recurrences for its multiplicative schedulers (StepLR, MultiStepLR,
    ExponentialLR, LinearLR, PolynomialLR, CosineAnnealingLR with eta_min=0, ...). Step only the chain."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueRangeError("ChainedScheduler: expects at least one scheduler to be chained, but got none")
        if optimizer is None:
            optimizer = getattr(schedulers[0], "optimizer", None)
            if optimizer is None:
                raise DTypeError(f"ChainedScheduler: schedulers[0] is {type(schedulers[0]).__name__}, not an "
                                 "LRScheduler")
        super().__init__(optimizer, schedulers)


class SequentialLR(_Composite):
    """Run ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``; each starts from its own epoch 0 at
    its milestone (e.g. a LinearLR warm-up, then a CosineAnnealingLR). Step only the SequentialLR."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        _check_optimizer("SequentialLR", optimizer)
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueRangeError("SequentialLR: expects at least one scheduler, but got no scheduler")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise DTypeError(f"SequentialLR: schedulers[{i}] is {type(s).__name__}, not an LRScheduler")
            if isinstance(s, ReduceLROnPlateau):
                raise ValueRangeError(
                    "SequentialLR: does not support a ReduceLROnPlateau scheduler as it needs a metric in step(), "
                    f"but got one at index {i}"
                )
            if s.optimizer is not optimizer:
                raise ValueRangeError(
                    f"SequentialLR: expects all schedulers to belong to the same optimizer, but schedulers[{i}] "
                    f"({type(s).__name__}) is bound to a different one"
                )
        milestones = list(milestones)
        if len(milestones) != len(schedulers) - 1:
            raise ValueRangeError(
                "SequentialLR: expects one more scheduler than milestones, but got "
                f"{len(schedulers)} schedulers and {len(milestones)} milestones"
            )
        if not all(_is_int(m) for m in milestones) or milestones != sorted(milestones):
            raise ValueRangeError(f"SequentialLR: milestones must be increasing integers, got {milestones!r}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.optimizer = optimizer
        self.base_lrs = list(schedulers[0].base_lrs)
        self._step_count = 1
        self.last_epoch = last_epoch + 1
        self._advance(self.last_epoch)
        self._set_lrs(self.get_lr())
        self._active()._last_lr = list(self._last_lr)

    def _active(self) -> LRScheduler:
        return self._schedulers[bisect_right(self._milestones, self.last_epoch)]

    def _advance(self, epoch: Any) -> None:
        # closed form: the active scheduler sits at the epochs since its milestone (PyTorch restarts it with
        # step(0) there and steps it once per epoch after)
        self.last_epoch = epoch
        idx = bisect_right(self._milestones, epoch)
        self._schedulers[idx]._advance(epoch - (self._milestones[idx - 1] if idx > 0 else 0))

    def get_lr(self) -> list[float]:
        return self._active().get_lr()

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (an explicit ``epoch`` jumps there)."""
        self._step_count += 1
        self._advance(self.last_epoch + 1 if epoch is None else epoch)
        active = self._active()
        active._step_count += 1
        self._set_lrs(active.get_lr())
        active._last_lr = list(self._last_lr)

    def _checked(self, state_dict: Any, param_groups: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        sd = super()._checked(state_dict, param_groups)
        if list(sd["_milestones"]) != sorted(sd["_milestones"]) or not all(_is_int(m) for m in sd["_milestones"]):
            raise ValueRangeError(f"SequentialLR.load_state_dict: '_milestones' is {sd['_milestones']!r}; expected "
                                  "increasing integers")
        return sd


class ReduceLROnPlateau(LRScheduler):
    """Multiply the learning rate by ``factor`` once a metric has stopped improving for ``patience`` epochs
    (then wait ``cooldown`` epochs); never below ``min_lr``, and changes smaller than ``eps`` are skipped.
    Call ``scheduler.step(metric)`` once per epoch."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | list[float] = 0, eps: float = 1e-8) -> None:
        if not _is_number(factor) or factor >= 1.0:
            raise ValueRangeError(f"ReduceLROnPlateau: factor should be < 1.0, got {factor!r}")
        _check_optimizer("ReduceLROnPlateau", optimizer)
        self.factor = factor
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueRangeError(f"ReduceLROnPlateau: expected {len(optimizer.param_groups)} min_lrs (one per "
                                      f"parameter group), got {len(min_lr)}")
            self.default_min_lr: float | None = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        for key, v in (("patience", patience), ("cooldown", cooldown)):
            if not _is_int(v) or v < 0:
                raise ValueRangeError(f"ReduceLROnPlateau: {key} must be an integer >= 0, got {v!r}")
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in ("min", "max"):
            raise ValueRangeError(f"ReduceLROnPlateau: mode {mode!r} is unknown; expected 'min' or 'max'")
        if threshold_mode not in ("rel", "abs"):
            raise ValueRangeError(f"ReduceLROnPlateau: threshold mode {threshold_mode!r} is unknown; expected 'rel' "
                                  "or 'abs'")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def _reset(self) -> None:
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self) -> bool:
        """Whether the scheduler is waiting out ``cooldown`` epochs after a reduction."""
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        """Whether metric ``a`` improves on ``best`` by more than the threshold (per mode and threshold_mode)."""
        if self.mode == "min":
            return a < best * (1.0 - self.threshold) if self.threshold_mode == "rel" else a < best - self.threshold
        return a > best * (self.threshold + 1.0) if self.threshold_mode == "rel" else a > best + self.threshold

    def get_lr(self) -> list[float]:
        """The current learning rates (this scheduler has no closed form; ``step(metric)`` changes them)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, metrics: Any, epoch: int | None = None) -> None:  # type: ignore[override]
        """Record one epoch's metric (a number or one-element tensor) and reduce the rates if it plateaued."""
        try:
            current = float(metrics.item() if hasattr(metrics, "item") else metrics)
        except (TypeError, ValueError):
            raise DTypeError(f"ReduceLROnPlateau.step: metrics must be a number, got {type(metrics).__name__}"
                             ) from None
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad epochs during the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _reduce_lr(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise ValueRangeError(
                    f"ReduceLROnPlateau: the optimizer has {len(groups)} parameter groups but min_lr has "
                    f"{len(self.min_lrs)} entries (a group was added after the scheduler was built); set "
                    "scheduler.min_lrs to one value per group"
                )
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, min_lr in zip(groups, self.min_lrs):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, min_lr)
            if old_lr - new_lr > self.eps:
                group["lr"] = new_lr

    def _checked(self, state_dict: Any, param_groups: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        name = "ReduceLROnPlateau.load_state_dict"
        if not isinstance(state_dict, Mapping):
            raise ValueRangeError(f"{name}: expected a dict, got {type(state_dict).__name__}")
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(map(str, set(state_dict) - set(own)))
        if missing or unexpected:
            raise ValueRangeError(f"{name}: the state's keys do not match this scheduler's: missing {missing}, "
                                  f"unexpected {unexpected}")
        sd = {}
        for k in own:
            v = state_dict[k]
            if k in ("best", "mode_worse"):  # +-inf before the first metric
                if not _is_number(v) or math.isnan(v):
                    raise ValueRangeError(f"{name}: {k!r} is {v!r:.80}; expected a number")
                sd[k] = v
            else:
                sd[k] = _like(name, k, v, own[k])
        for k in ("last_epoch", "patience", "cooldown", "cooldown_counter", "num_bad_epochs"):
            if not _is_int(sd[k]) or sd[k] < 0:
                raise ValueRangeError(f"{name}: {k!r} is {sd[k]!r}; expected an int >= 0")
        if sd["mode"] not in ("min", "max") or sd["threshold_mode"] not in ("rel", "abs"):
            raise ValueRangeError(f"{name}: mode {sd['mode']!r} / threshold_mode {sd['threshold_mode']!r} unknown")
        if sd["factor"] >= 1.0:
            raise ValueRangeError(f"{name}: 'factor' is {sd['factor']!r}; expected a value < 1.0")
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = self._checked(state_dict, None)
        self.__dict__.update(sd)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


class CyclicLR(LRScheduler):
    """Cyclical learning rates (Smith 2017): the rate cycles between ``base_lr`` and ``max_lr`` (up over
    ``step_size_up`` steps, down over ``step_size_down``), the amplitude scaled per cycle (``triangular``: constant,
    ``triangular2``: halved each cycle) or per iteration (``exp_range``: ``gamma**iteration``), or by ``scale_fn``.
    With ``cycle_momentum`` the momentum (or Adam's beta1) cycles inversely between ``max_momentum`` and
    ``base_momentum``. Step it after every batch."""

    def __init__(self, optimizer: Optimizer, base_lr: float | list[float], max_lr: float | list[float],
                 step_size_up: int = 2000, step_size_down: int | None = None, mode: str = "triangular",
                 gamma: float = 1.0, scale_fn: Callable[[float], float] | None = None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum: float | list[float] = 0.8,
                 max_momentum: float | list[float] = 0.9, last_epoch: int = -1) -> None:
        _check_optimizer("CyclicLR", optimizer)
        self.optimizer = optimizer
        base_lrs = _per_group("CyclicLR", "base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group("CyclicLR", "max_lr", optimizer, max_lr)
        if not _is_number(step_size_up) or step_size_up <= 0:
            raise ValueRangeError(f"CyclicLR: step_size_up must be a positive number, got {step_size_up!r}")
        if step_size_down is not None and (not _is_number(step_size_down) or step_size_down < 0):
            raise ValueRangeError(f"CyclicLR: step_size_down must be a number >= 0, got {step_size_down!r}")
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueRangeError(f"CyclicLR: mode {mode!r} is invalid and scale_fn is None; expected 'triangular', "
                                  "'triangular2' or 'exp_range', or a scale_fn")
        if scale_fn is not None and not callable(scale_fn):
            raise DTypeError(f"CyclicLR: scale_fn must be callable, got {type(scale_fn).__name__}")
        if scale_mode not in ("cycle", "iterations"):
            raise ValueRangeError(f"CyclicLR: scale_mode must be 'cycle' or 'iterations', got {scale_mode!r}")
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        # the built-in modes fix the scale mode (as in PyTorch); a custom scale_fn uses the one given
        self.scale_mode = scale_mode if scale_fn is not None else ("iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueRangeError(
                    f"CyclicLR: optimizer {type(optimizer).__name__} must support momentum or beta1 with the "
                    "`cycle_momentum` option enabled (pass cycle_momentum=False)"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("CyclicLR", "base_momentum", optimizer, base_momentum)
            self.max_momentums = _per_group("CyclicLR", "max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for mm, bm, group in zip(self.max_momentums, self.base_momentums, optimizer.param_groups):
                    if self.use_beta1:
                        group["betas"] = (mm, *group["betas"][1:])
                    else:
                        group["momentum"] = mm
                    group["max_momentum"] = mm
                    group["base_momentum"] = bm
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x: float) -> float:
        """The amplitude scale at cycle (or iteration) ``x``."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma**x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [base + (mx - base) * scale_factor * scale for base, mx in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for group, bm, mm in zip(self.optimizer.param_groups, self.base_momentums, self.max_momentums):
                momentum = mm - (mm - bm) * scale_factor * scale
                if self.use_beta1:
                    group["betas"] = (momentum, *group["betas"][1:])
                else:
                    group["momentum"] = momentum
        return lrs

    def state_dict(self) -> dict[str, Any]:
        # a plain function is not saved; a callable object's attributes are (PyTorch's behaviour)
        sd = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_scale_fn_custom")}
        fn = self._scale_fn_custom
        sd["_scale_fn_custom"] = None if fn is None or isinstance(fn, types.FunctionType) else dict(fn.__dict__)
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sd = self._checked(state_dict, None)
        fn = sd.pop("_scale_fn_custom")
        self.__dict__.update(sd)
        if fn is not None and self._scale_fn_custom is not None:
            self._scale_fn_custom.__dict__.update(fn)

    def _try_schedule(self, name: str, sd: dict[str, Any], param_groups: Sequence[Mapping[str, Any]] | None) -> None:
        super()._try_schedule(name, {k: v for k, v in sd.items() if k != "_scale_fn_custom"}, param_groups)


__all__ = [
    "LRScheduler",
    "LambdaLR",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "LinearLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "OneCycleLR",
    "NoamLR",
    "ProductLR",
    "PolynomialLR",
    "ChainedScheduler",
    "SequentialLR",
    "ReduceLROnPlateau",
    "CyclicLR",
]
