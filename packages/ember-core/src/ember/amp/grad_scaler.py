"""``ember.amp.GradScaler``: dynamic loss scaling with ``torch.amp.GradScaler``'s algorithm and API.

``scaler.scale(loss).backward()`` multiplies the loss by the scale so small float16 gradients do not flush to zero;
``scaler.step(opt)`` unscales the gradients (unless :meth:`GradScaler.unscale_` already did), and skips the step when
any of them is inf or NaN; ``scaler.update()`` halves the scale after a skipped step (``backoff_factor``) and doubles it
after ``growth_interval`` clean steps (``growth_factor``). The scale is kept as a float32 value, as PyTorch's
one-element float32 tensor. It works on every device and dtype (float32 gradients simply never overflow at the
default scale), so the same training loop runs with or without autocast.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np

from ..errors import AutodiffError, DTypeError, UnsupportedError, ValueRangeError
from ..tensor import Tensor


class _Stage(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _f32(x: float) -> float:
    """x rounded to float32, the precision PyTorch keeps the scale in."""
    return float(np.float32(x))


class GradScaler:
    """Loss scaler for mixed-precision training (``torch.amp.GradScaler``).

    ``device`` is accepted for PyTorch's signature (``"cuda"``, ``"cpu"``, a Device): the scale lives on the host and
    multiplies tensors on any device. ``enabled=False`` makes every method a pass-through (``scale`` returns its
    input, ``step`` just steps), so one script serves both precisions.
    """

    def __init__(self, device: Any = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if growth_factor <= 1.0:
            raise ValueRangeError(f"GradScaler: growth_factor should be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueRangeError(f"GradScaler: backoff_factor should be < 1 and > 0, got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval <= 0:
            raise ValueRangeError(f"GradScaler: growth_interval should be a positive int, got {growth_interval!r}")
        if not init_scale > 0:
            raise ValueRangeError(f"GradScaler: init_scale should be > 0, got {init_scale}")
        self._device = device
        self._enabled = bool(enabled)
        self._init_scale = float(init_scale)
        self._scale: float | None = None  # set lazily by the first scale(), as PyTorch does
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._init_growth_tracker = 0
        self._growth_tracker = 0
        # id(optimizer) -> {"stage": _Stage, "found_inf": bool}
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    # -- scaling ------------------------------------------------------------------------------------------------
    def _lazy_init(self) -> None:
        if self._scale is None:
            self._scale = _f32(self._init_scale)
            self._growth_tracker = self._init_growth_tracker

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a tensor or nested lists/tuples of tensors) multiplied by the current scale; the result keeps
        each tensor's dtype (the scale is a float32 scalar, which does not promote a float16 loss)."""
        if not self._enabled:
            return outputs
        self._lazy_init()
        assert self._scale is not None

        def apply(v: Any) -> Any:
            if isinstance(v, Tensor):
                return v * self._scale
            if isinstance(v, (list, tuple)):
                return type(v)(apply(x) for x in v)
            raise DTypeError(f"GradScaler.scale: outputs must be a Tensor or an iterable of Tensors, got "
                             f"{type(v).__name__}")

        return apply(outputs)

    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(id(optimizer), {"stage": _Stage.READY, "found_inf": False})

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any is inf or NaN (call it
        before clipping gradients; :meth:`step` then does not unscale again). Once per optimizer per update."""
        if not self._enabled:
            return
        self._check_scale_initialized("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise AutodiffError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise AutodiffError("unscale_() is being called after step().")
        assert self._scale is not None
        # PyTorch computes the reciprocal in double and rounds it to float32
        inv_scale = _f32(1.0 / float(np.float64(self._scale)))
        found_inf = False
        from .. import dtypes as dt
        from ..autograd import no_grad
        from ..ops.pointwise import isfinite

        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g._dtype is dt.float16 and not self._allow_fp16():
                        raise DTypeError("GradScaler.unscale_: attempting to unscale float16 gradients; keep the "
                                         "parameters in float32 (autocast casts them per op)")
                    g.mul_(inv_scale)
                    if not found_inf and not bool(isfinite(g).all().item()):
                        found_inf = True
        state["found_inf"] = found_inf
        state["stage"] = _Stage.UNSCALED

    @staticmethod
    def _allow_fp16() -> bool:
        return False  # PyTorch refuses float16 gradients (parameters) in GradScaler.unscale_, with allow_fp16=False

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale ``optimizer``'s gradients (unless :meth:`unscale_` did) and call ``optimizer.step(*args,
        **kwargs)`` unless a gradient is inf or NaN; returns what ``step`` returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise UnsupportedError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_initialized("step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise AutodiffError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        retval = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return retval

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Adjust the scale for the next iteration (``new_scale`` sets it outright): times ``backoff_factor`` if any
        optimizer stepped over inf/NaN gradients since the last update, else times ``growth_factor`` after
        ``growth_interval`` consecutive clean updates."""
        if not self._enabled:
            return
        self._check_scale_initialized("update")
        assert self._scale is not None
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1:
                    raise ValueRangeError(f"GradScaler.update: new_scale should be a one-element tensor, got shape "
                                          f"{new_scale.shape}")
                new_scale = float(new_scale.item())
            self._scale = _f32(float(new_scale))
        else:
            found = [s["found_inf"] for s in self._per_optimizer_states.values() if s["stage"] is not _Stage.READY]
            if not found:
                raise AutodiffError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale = _f32(self._scale * self._backoff_factor)
                self._growth_tracker = 0
            else:
                successful = self._growth_tracker + 1
                if successful == self._growth_interval:
                    grown = _f32(self._scale * self._growth_factor)
                    if np.isfinite(grown):  # PyTorch keeps the old scale when growing would overflow
                        self._scale = grown
                    self._growth_tracker = 0
                else:
                    self._growth_tracker = successful
        self._per_optimizer_states = {}

    def _check_scale_initialized(self, fn: str) -> None:
        if self._scale is None:
            raise AutodiffError(f"GradScaler.{fn}: attempted {fn} but the scale is not initialized: call "
                                  "scaler.scale(loss) first (in the same iteration)")

    # -- accessors ----------------------------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self) -> float:
        """The factor the scale grows by after ``growth_interval`` clean steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor."""
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        """The factor the scale shrinks by after a step with inf/NaN gradients."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor."""
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        """How many consecutive clean steps grow the scale."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval."""
        self._growth_interval = int(new_interval)

    def is_enabled(self) -> bool:
        """Whether the scaler scales (``enabled=True``)."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker ({} if disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a disabled scaler accepts nothing)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise ValueRangeError("The source state dict is empty, possibly because it was saved from a disabled "
                                  "instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = _f32(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._growth_tracker = self._init_growth_tracker


__all__ = ["GradScaler"]
