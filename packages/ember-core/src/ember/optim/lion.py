"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): sign of an interpolated momentum."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_betas, _check_range


class Lion(Optimizer):
    """``c = b1*m + (1-b1)*g;  p <- p - lr * (sign(c) + weight_decay * p);  m <- b2*m + (1-b2)*g``.

    Lion's update has unit magnitude per coordinate, so its ``lr`` is typically 3-10x smaller than AdamW's and
    its ``weight_decay`` 3-10x larger (the product ``lr * weight_decay`` is what decays the weights).
    """

    def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0, *, maximize: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, weight_decay=weight_decay,
                        maximize=maximize)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("Lion", "learning rate (lr)", group["lr"])
        _check_betas("Lion", group["betas"])
        _check_range("Lion", "weight_decay value", group["weight_decay"])

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("exp_avg",)

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, wd = float(group["lr"]), group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in params:
            g = self._grad(p, group["maximize"])
            state = self.state[p]
            if not state:
                state["exp_avg"] = zeros_like(p)
            exp_avg = state["exp_avg"]
            if wd != 0:
                p.mul_(1 - lr * wd)  # decoupled decay: the paper's lr * weight_decay * p term
            update = (exp_avg * beta1).add_(g * (1 - beta1)).sign_()
            p.add_(update.mul_(-lr))
            exp_avg.mul_(beta2).add_(g * (1 - beta2))
