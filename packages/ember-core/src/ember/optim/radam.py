"""RAdam (``torch.optim.RAdam``): Adam with a variance-rectification term (Liu et al. 2019)."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_adam_group, addcmul_, lerp_


class RAdam(Optimizer):
    """While the approximated SMA length ``rho_t <= 5`` the step is un-adapted momentum SGD
    (``p -= lr * m_hat``); afterwards Adam's adaptive step times the rectification ``r_t``.
    ``decoupled_weight_decay=True`` gives RAdamW."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, maximize=maximize, foreach=foreach, capturable=capturable,
                        decoupled_weight_decay=decoupled_weight_decay, differentiable=differentiable)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_adam_group("RAdam", group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "exp_avg", "exp_avg_sq")

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, eps, wd = float(group["lr"]), group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        for p in params:
            g = self._grad(p, group["maximize"])
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
            step_t = state["step"]
            step_t.add_(1)
            step = step_t.item()
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * wd)
                else:
                    g = g + p * wd
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            lerp_(exp_avg, g, 1 - beta1)
            addcmul_(exp_avg_sq.mul_(beta2), g, g, 1 - beta2)
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            bias_corrected_exp_avg = exp_avg / bias_correction1
            rho_inf = 2 / (1 - beta2) - 1
            rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
            if rho_t > 5.0:
                rect = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                adaptive_lr = (bias_correction2**0.5) / exp_avg_sq.sqrt().add_(eps)
                p.sub_(bias_corrected_exp_avg * lr * adaptive_lr * rect)
            else:
                p.sub_(bias_corrected_exp_avg * lr)
