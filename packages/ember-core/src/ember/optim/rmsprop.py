"""RMSprop (``torch.optim.RMSprop``): plain, centered, with momentum."""

from __future__ import annotations

from typing import Any

from ..ops.creation import zeros_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_range, addcdiv_, addcmul_, lerp_


class RMSprop(Optimizer):
    """Divide the gradient by a running root-mean-square of recent gradients (Hinton's RMSprop, PyTorch's form:
    ``eps`` is added outside the square root)."""

    def __init__(self, params: Any, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False) -> None:
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach, maximize=maximize,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("RMSprop", "learning rate (lr)", group["lr"])
        _check_range("RMSprop", "epsilon value (eps)", group["eps"])
        _check_range("RMSprop", "momentum value", group["momentum"])
        _check_range("RMSprop", "weight_decay value", group["weight_decay"])
        _check_range("RMSprop", "alpha value", group["alpha"])

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return (("step", "square_avg") + (("momentum_buffer",) if group["momentum"] > 0 else ())
                + (("grad_avg",) if group["centered"] else ()))

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, alpha, eps, wd = float(group["lr"]), group["alpha"], group["eps"], group["weight_decay"]
        momentum, centered, maximize = group["momentum"], group["centered"], group["maximize"]
        for p in params:
            g = self._grad(p, maximize)
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["square_avg"] = zeros_like(p)
                if momentum > 0:
                    state["momentum_buffer"] = zeros_like(p)
                if centered:
                    state["grad_avg"] = zeros_like(p)
            state["step"].add_(1)
            if wd != 0:
                g = g + p * wd
            square_avg = state["square_avg"]
            addcmul_(square_avg.mul_(alpha), g, g, 1 - alpha)
            if centered:
                grad_avg = state["grad_avg"]
                lerp_(grad_avg, g, 1 - alpha)
                avg = addcmul_(square_avg.clone(), grad_avg, grad_avg, -1).sqrt_()
            else:
                avg = square_avg.sqrt()
            avg.add_(eps)
            if momentum > 0:
                buf = state["momentum_buffer"]
                addcdiv_(buf.mul_(momentum), g, avg)
                p.add_(buf * -lr)
            else:
                addcdiv_(p, g, avg, -lr)
