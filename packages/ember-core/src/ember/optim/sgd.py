"""Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (``torch.optim.SGD``)."""

from __future__ import annotations

from typing import Any

from .. import compile as _compile
from ..errors import ValueRangeError
from ..tensor import Tensor
from .optimizer import Optimizer, _check_range


class SGD(Optimizer):
    """``p <- p - lr * v`` with ``v = momentum * v + (1 - dampening) * (g + weight_decay * p)`` (PyTorch's form:
    the first step stores the gradient itself as the momentum buffer)."""

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None) -> None:
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize, foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    #: passed to kernels as an ember.compile binding (a scheduler's new lr replays the same graph)
    _compile_bindings = ("lr",)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("SGD", "learning rate (lr)", group["lr"])
        _check_range("SGD", "momentum value", group["momentum"])
        _check_range("SGD", "weight_decay value", group["weight_decay"])
        _check_range("SGD", "dampening value", group["dampening"], -float("inf"))
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueRangeError(
                f"SGD: Nesterov momentum requires a momentum and zero dampening, got momentum={group['momentum']}, "
                f"dampening={group['dampening']}"
            )

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr = _compile.scalar(float(group["lr"]), lambda: float(group["lr"]))
        momentum, dampening = group["momentum"], group["dampening"]
        wd, nesterov, maximize = group["weight_decay"], group["nesterov"], group["maximize"]
        for p in params:
            g = self._grad(p, maximize)
            if wd != 0:
                g = g + p * wd
            if momentum != 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = g.clone()
                else:
                    buf.mul_(momentum).add_(g if dampening == 0 else g * (1 - dampening))
                g = g + buf * momentum if nesterov else buf
            p.add_(g * _compile.scalar_tensor(-lr, p))  # -lr itself outside a recording
