"""ASGD (``torch.optim.ASGD``): averaged stochastic gradient descent (Polyak & Juditsky 1992)."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_range


class ASGD(Optimizer):
    """SGD with a decaying step ``eta`` and weight ``lambd`` decay; from step ``t0`` on, ``state['ax']`` keeps the
    running average of the iterates (the averaged parameters to evaluate with). ``eta`` and ``mu`` are per-parameter
    float32 scalars, as in PyTorch."""

    _scalar_state_keys = ("eta", "mu")

    def __init__(self, params: Any, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
                 weight_decay: float = 0, foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        defaults = dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("ASGD", "learning rate (lr)", group["lr"])
        _check_range("ASGD", "weight_decay value", group["weight_decay"])
        for key in ("lambd", "alpha", "t0"):  # PyTorch leaves them unchecked; only their type is required
            _check_range("ASGD", f"{key} value", group[key], -float("inf"))

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "eta", "mu", "ax")

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, lambd, alpha, t0, wd = (float(group["lr"]), group["lambd"], group["alpha"], group["t0"],
                                    group["weight_decay"])
        for p in params:
            g = self._grad(p, group["maximize"])
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["eta"] = self._step_tensor(p).add_(lr)
                state["mu"] = self._step_tensor(p).add_(1)
                state["ax"] = zeros_like(p)
            step_t, eta_t, mu_t, ax = state["step"], state["eta"], state["mu"], state["ax"]
            step_t.add_(1)
            if wd != 0:
                g = g + p * wd
            eta = eta_t.item()
            p.mul_(1 - lambd * eta)
            p.add_(g * -eta)
            mu = mu_t.item()
            if mu != 1:
                ax.add_((p - ax).mul_(mu))
            else:
                ax.copy_(p)
            step = step_t.item()
            eta_t.fill_(lr / ((1 + lambd * lr * step) ** alpha))
            mu_t.fill_(1 / max(1, step - t0))
