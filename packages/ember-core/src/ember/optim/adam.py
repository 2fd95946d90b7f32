"""Adam and AdamW (``torch.optim.Adam``, ``torch.optim.AdamW``), with AMSGrad and maximize."""

from __future__ import annotations

from typing import Any

from .. import compile as _compile
from .. import dtypes as dt
from ..errors import AutodiffError
from ..ops import train_kernels as _tk
from ..ops.creation import zeros_like
from ..ops.elementwise import write_result
from ..tensor import Tensor
from .optimizer import Optimizer, _check_adam_group

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

    @property
    def _compile_bindings(self) -> tuple[str, ...]:
        """Hyper-parameters passed to kernels as ember.compile bindings: a replayed step reads them anew (a
        scheduler changing them replays the same graph), so they are no guard of a compiled step. ``lr`` always;
        ``betas`` (cycled by OneCycleLR's momentum) where every parameter takes the fused kernel, whose arguments
        keep bindings -- the composition passes them through ops that would fix their values, so there they stay
        guards (a change records again)."""
        if all(_fused(p) for g in self.param_groups for p in g["params"]):
            return ("lr", "betas")
        return ("lr",)

    def _validate_group(self, group: dict[str, Any]) -> None:
        _check_adam_group(type(self).__name__, group)

    def _state_keys(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("step", "exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        # lr as an ember.compile binding: a replayed step reads the group's current lr (a scheduler's)
        lr = _compile.scalar(float(group["lr"]), lambda: float(group["lr"]))
        eps, wd = group["eps"], group["weight_decay"]
        recording = _compile.is_recording()
        beta1, beta2 = group["betas"]
        if recording and "betas" in self._compile_bindings:
            beta1 = _compile.scalar(float(beta1), lambda: float(group["betas"][0]))
            beta2 = _compile.scalar(float(beta2), lambda: float(group["betas"][1]))
        amsgrad, maximize, decoupled = group["amsgrad"], group["maximize"], group["decoupled_weight_decay"]
        synced: set[Any] = set()
        for p in params:
            g = p.grad
            if g is None:  # pragma: no cover - filtered by step()
                raise AutodiffError("internal: parameter without grad")
            if g._dtype is not p._dtype:
                g = g.to(p._dtype)
            state = self.state[p]
            if not state:
                state["step"] = self._step_tensor(p)
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
                if amsgrad:
                    state["max_exp_avg_sq"] = zeros_like(p)
            step_t = state["step"]
            if recording:
                # a replayed step reads the count before its kernels run (then the graph increments it): the
                # count as a binding instead of a read of the incremented value, which would be a graph break
                with _compile.binding_read():
                    step = step_t.item() + 1
                step = _compile.scalar(step, lambda t=step_t: t.item() + 1)
                step_t.add_(1)
            else:
                step_t.add_(1)
                step = step_t.item()
            targets = (p, state["exp_avg"], state["exp_avg_sq"]) + ((state["max_exp_avg_sq"],) if amsgrad else ())
            mx = targets[3] if amsgrad else None
            kw = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd, decoupled_weight_decay=decoupled,
                      amsgrad=amsgrad, maximize=maximize, step=step)
            if _fused(p):
                # one kernel updates the parameter and its state in place (ember.ops.train_kernels): first the
                # device runs whatever pending value may read their old contents, then each result is written back
                # through the stack (onto itself: free) so autodiff's version counters see the update
                if p._device not in synced:
                    p._device.stack.sync()
                    synced.add(p._device)
                out = _tk.adam_step(p, g, targets[1], targets[2], mx, **kw)
                for t, new in zip(targets, out):
                    write_result(t, new._h, "adam_step")
            elif recording:  # the composition, with the step's bindings kept as 0-d tensors
                _adam_capturable(p, g, targets[1], targets[2], mx, **kw)
            else:  # the op's composition: torch's single-tensor update in ember's in-place ops
                _tk.adam_step.composition(p, g, targets[1], targets[2], mx, **kw)


def _fused(p: Tensor) -> bool:
    """Whether ``p``'s update runs the fused ``optim.adam_step`` kernel (its device has one for its dtype)."""
    return p._dtype in _FUSED_DTYPES and _tk.has_kernel(_tk.adam_step, p)


def _adam_capturable(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, max_exp_avg_sq: Tensor | None,
                     *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                     decoupled_weight_decay: bool, amsgrad: bool, maximize: bool, step: float) -> None:
    """``ember.ops.train_kernels.adam_step``'s composition for a recorded step (torch's ``capturable=True``): the
    scalars derived from the learning rate and the step count (ember.compile bindings) enter the ops as 0-d tensors
    of the parameter's dtype, which compute what the Python floats compute, so a replay recomputes them."""
    from ..ops.pointwise import maximum
    from ..ops.train_kernels import adam_scalars
    from .optimizer import addcdiv_, addcmul_, lerp_

    # the betas are bindings only where every parameter takes the fused kernel (Adam._compile_bindings), so here
    # they are guarded numbers; made plain so that a bound one could never reach lerp_/addcmul_ and be fixed there
    beta1, beta2 = float(beta1), float(beta2)
    g = -grad if maximize else grad
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(_compile.scalar_tensor(1 - lr * weight_decay, param))
        else:
            g = g + param * weight_decay
    lerp_(exp_avg, g, 1 - beta1)
    addcmul_(exp_avg_sq.mul_(beta2), g, g, 1 - beta2)
    step_size, bc2_sqrt = adam_scalars(lr, beta1, beta2, step)
    bc2 = _compile.scalar_tensor(bc2_sqrt, param)
    if amsgrad:
        assert max_exp_avg_sq is not None  # the state holds it with amsgrad
        max_exp_avg_sq.copy_(maximum(max_exp_avg_sq, exp_avg_sq))
        denom = (max_exp_avg_sq.sqrt() / bc2).add_(eps)
    else:
        denom = (exp_avg_sq.sqrt() / bc2).add_(eps)
    addcdiv_(param, exp_avg, denom, -step_size)


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p <- p * (1 - lr * weight_decay)`` before the Adam update."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
