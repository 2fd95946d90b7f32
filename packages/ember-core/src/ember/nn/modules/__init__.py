"""PyTorch's ``torch.nn.modules`` path for ports: ``ember.nn.modules.module`` holds the global module hooks
(``register_module_forward_hook`` and the others) and ``Module``; everything lives in :mod:`ember.nn.module`."""

from __future__ import annotations

from . import module

__all__ = ["module"]
