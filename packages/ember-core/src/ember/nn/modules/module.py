"""``torch.nn.modules.module``'s public names, for ports: the module class and the global module hooks (defined in
:mod:`ember.nn.module`)."""

from __future__ import annotations

from ..module import (
    Module,
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
    register_module_full_backward_pre_hook,
)

__all__ = [
    "Module",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
    "register_module_full_backward_hook",
    "register_module_full_backward_pre_hook",
]
