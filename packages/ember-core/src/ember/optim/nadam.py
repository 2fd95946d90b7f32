"""NAdam (``torch.optim.NAdam``): Adam with Nesterov momentum and a momentum-decay schedule (Dozat 2016)."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_adam_group, _check_range, addcdiv_, addcmul_, lerp_


class NAdam(Optimizer):
    """``mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay))``; the update mixes the current gradient and the
    first moment with the products of the ``mu`` schedule (kept per parameter as ``mu_product``).
    ``decoupled_weight_decay=True`` gives NAdamW."""

    _scalar_state_keys = ("mu_product",)

    def __init__(self, params: Any, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_adam_group("NAdam", group)
        _check_range("NAdam", "momentum_decay value", group["momentum_decay"])

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "mu_product", "exp_avg", "exp_avg_sq")

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, eps, wd = float(group["lr"]), group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        momentum_decay, decoupled = group["momentum_decay"], group["decoupled_weight_decay"]
        for p in params:
            g = self._grad(p, group["maximize"])
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                # a float32 scalar like PyTorch's, so the running product rounds the same way
                state["mu_product"] = self._step_tensor(p).add_(1)
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
            step_t = state["step"]
            step_t.add_(1)
            step = step_t.item()
            bias_correction2 = 1 - beta2**step
            if wd != 0:
                if decoupled:
                    p.mul_(1 - lr * wd)
                else:
                    g = g + p * wd
            mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
            mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
            mu_product_t = state["mu_product"]
            mu_product_t.mul_(mu)
            mu_product = mu_product_t.item()
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            lerp_(exp_avg, g, 1 - beta1)
            addcmul_(exp_avg_sq.mul_(beta2), g, g, 1 - beta2)
            denom = (exp_avg_sq / bias_correction2).sqrt_().add_(eps)
            mu_product_next = mu_product * mu_next
            addcdiv_(p, g, denom, -lr * (1.0 - mu) / (1.0 - mu_product))
            addcdiv_(p, exp_avg, denom, (-lr * mu_next) / (1.0 - mu_product_next))
