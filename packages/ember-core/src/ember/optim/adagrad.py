"""Adagrad (``torch.optim.Adagrad``): per-coordinate learning rates from accumulated squared gradients."""

from __future__ import annotations

from typing import Any

from ..ops.creation import full_like
from ..tensor import Tensor
from .optimizer import Optimizer, _check_range, addcdiv_, addcmul_


class Adagrad(Optimizer):
    """``sum += g*g; p -= clr * g / (sqrt(sum) + eps)`` with ``clr = lr / (1 + (step - 1) * lr_decay)``."""

    def __init__(self, params: Any, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False, fused: bool | None = None) -> None:
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if not state:
            state["step"] = self._step_tensor(p)
            state["sum"] = full_like(p, group["initial_accumulator_value"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        # PyTorch creates Adagrad's state eagerly, so a state_dict taken before the first step already has it
        for p in self.param_groups[-1]["params"]:
            self._init_state(p, self.param_groups[-1])

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_range("Adagrad", "learning rate (lr)", group["lr"])
        _check_range("Adagrad", "lr_decay value", group["lr_decay"])
        _check_range("Adagrad", "weight_decay value", group["weight_decay"])
        _check_range("Adagrad", "initial_accumulator_value", group["initial_accumulator_value"])
        _check_range("Adagrad", "epsilon value (eps)", group["eps"])

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "sum")

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, lr_decay, wd, eps = float(group["lr"]), group["lr_decay"], group["weight_decay"], group["eps"]
        for p in params:
            g = self._grad(p, group["maximize"])
            self._init_state(p, group)
            state = self.state[p]
            step_t = state["step"]
            step_t.add_(1)
            step = step_t.item()
            if wd != 0:
                g = g + p * wd
            clr = lr / (1 + (step - 1) * lr_decay)
            state_sum = state["sum"]
            addcmul_(state_sum, g, g, 1)
            std = state_sum.sqrt().add_(eps)
            addcdiv_(p, g, std, -clr)
