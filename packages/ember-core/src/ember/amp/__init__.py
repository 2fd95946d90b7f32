"""``ember.amp``: automatic mixed precision, as ``torch.amp``.

:class:`autocast` (also ``ember.autocast``) runs matrix products and convolutions in bfloat16/float16 and
precision-sensitive ops in float32 (:mod:`ember.amp.policy`); :class:`GradScaler` scales the loss so float16
gradients do not underflow and skips steps whose gradients overflowed.
"""

from __future__ import annotations

from .autocast_mode import (
    autocast,
    clear_autocast_cache,
    get_autocast_dtype,
    is_autocast_cache_enabled,
    is_autocast_enabled,
)
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype", "is_autocast_cache_enabled",
           "clear_autocast_cache"]
