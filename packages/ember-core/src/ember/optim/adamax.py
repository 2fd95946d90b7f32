"""Adamax (``torch.optim.Adamax``): Adam with the infinity norm in place of the second moment."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..ops.pointwise import maximum
from ..tensor import Tensor
from .optimizer import Optimizer, _check_adam_group, addcdiv_, lerp_


class Adamax(Optimizer):
    """``m = lerp(m, g, 1-beta1); u = max(beta2*u, |g| + eps); p -= lr / (1 - beta1^t) * m / u``."""

    def __init__(self, params: Any, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_adam_group("Adamax", group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "exp_avg", "exp_inf")

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, eps, wd = float(group["lr"]), group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in params:
            g = self._grad(p, group["maximize"])
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["exp_avg"] = zeros_like(p)
                state["exp_inf"] = zeros_like(p)
            step_t = state["step"]
            step_t.add_(1)
            if wd != 0:
                g = g + p * wd
            exp_avg, exp_inf = state["exp_avg"], state["exp_inf"]
            lerp_(exp_avg, g, 1 - beta1)
            exp_inf.copy_(maximum(exp_inf.mul_(beta2), g.abs().add_(eps)))
            clr = lr / (1 - beta1 ** step_t.item())
            addcdiv_(p, exp_avg, exp_inf, -clr)
