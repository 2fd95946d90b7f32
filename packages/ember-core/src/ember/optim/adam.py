"""Adam and AdamW (``torch.optim.Adam``, ``torch.optim.AdamW``), with AMSGrad and maximize."""

from __future__ import annotations

from typing import Any

from .. import dtypes as dt
from ..ops import train_kernels as _tk
from ..ops.creation import zeros_like
from ..ops.elementwise import write_result
from ..ops.pointwise import maximum
from ..tensor import Tensor
from .optimizer import Optimizer, _check_adam_group, addcdiv_, addcmul_, lerp_

#: parameter dtypes whose update runs as one op where the backend has a kernel for it
_FUSED_DTYPES = (dt.float32, dt.float64)


class Adam(Optimizer):
    """Adam: bias-corrected first and second moment estimates; ``weight_decay`` is L2 added to the gradient
    (``decoupled_weight_decay=True`` gives AdamW)."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, decoupled_weight_decay: bool = False) -> None:
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                        capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_adam_group(type(self).__name__, group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, eps, wd = float(group["lr"]), group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        amsgrad, maximize, decoupled = group["amsgrad"], group["maximize"], group["decoupled_weight_decay"]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
                if amsgrad:
                    state["max_exp_avg_sq"] = zeros_like(p)
            step_t = state["step"]
            step_t.add_(1)
            if p._dtype in _FUSED_DTYPES and _tk.has_kernel(_tk.adam_step, p):
                self._fused_update(p, state, lr, beta1, beta2, eps, wd, decoupled, amsgrad, maximize)
                continue
            g = self._grad(p, maximize)
            if wd != 0:
                if decoupled:
                    p.mul_(1 - lr * wd)
                else:
                    g = g + p * wd
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            lerp_(exp_avg, g, 1 - beta1)
            addcmul_(exp_avg_sq.mul_(beta2), g, g, 1 - beta2)
            step = step_t.item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            bias_correction2_sqrt = bias_correction2**0.5
            if amsgrad:
                mx = state["max_exp_avg_sq"]
                mx.copy_(maximum(mx, exp_avg_sq))
                denom = (mx.sqrt() / bias_correction2_sqrt).add_(eps)
            else:
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            addcdiv_(p, exp_avg, denom, -step_size)

    @staticmethod
    def _fused_update(p: Tensor, state: dict[str, Any], lr: float, beta1: float, beta2: float, eps: float,
                      wd: float, decoupled: bool, amsgrad: bool, maximize: bool) -> None:
        """The update above as one op (``optim.adam_step``) where the backend has a kernel for it: the same
        arithmetic in the same order, the results written back into the parameter and its state in place."""
        g = p.grad
        assert g is not None  # step() passes only parameters with a gradient
        if g._dtype is not p._dtype:
            g = g.to(p._dtype)
        mx = state["max_exp_avg_sq"] if amsgrad else None
        out = _tk.adam_step(p, g, state["exp_avg"], state["exp_avg_sq"], mx, lr=lr, beta1=beta1, beta2=beta2,
                            eps=eps, weight_decay=wd, decoupled_weight_decay=decoupled, amsgrad=amsgrad,
                            maximize=maximize, step=state["step"].item())
        targets = (p, state["exp_avg"], state["exp_avg_sq"]) + ((mx,) if mx is not None else ())
        for t, new in zip(targets, out):
            write_result(t, new._h, "adam_step")


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p <- p * (1 - lr * weight_decay)`` before the Adam update."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
