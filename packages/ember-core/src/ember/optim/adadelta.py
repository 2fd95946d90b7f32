"""Adadelta (``torch.optim.Adadelta``): step sizes from running averages of squared gradients and updates."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_range, addcmul_


class Adadelta(Optimizer):
    """``v = rho*v + (1-rho)*g^2; d = sqrt(u + eps) / sqrt(v + eps) * g; u = rho*u + (1-rho)*d^2; p -= lr*d``
    (Zeiler 2012, with PyTorch's ``lr`` scaling)."""

    def __init__(self, params: Any, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
                 foreach: bool | None = None, *, capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                        capturable=capturable, foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("Adadelta", "learning rate (lr)", group["lr"])
        _check_range("Adadelta", "rho value", group["rho"], 0.0, 1.0, high_open=False)
        _check_range("Adadelta", "epsilon value (eps)", group["eps"])
        _check_range("Adadelta", "weight_decay value", group["weight_decay"])

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "square_avg", "acc_delta")

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, rho, eps, wd = float(group["lr"]), group["rho"], group["eps"], group["weight_decay"]
        for p in params:
            g = self._grad(p, group["maximize"])
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["square_avg"] = zeros_like(p)
                state["acc_delta"] = zeros_like(p)
            state["step"].add_(1)
            if wd != 0:
                g = g + p * wd
            square_avg, acc_delta = state["square_avg"], state["acc_delta"]
            addcmul_(square_avg.mul_(rho), g, g, 1 - rho)
            std = (square_avg + eps).sqrt_()
            delta = (acc_delta + eps).sqrt_().div_(std).mul_(g)
            addcmul_(acc_delta.mul_(rho), delta, delta, 1 - rho)
            p.add_(delta * -lr)
