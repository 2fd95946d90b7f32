"""Neural-network building blocks with PyTorch's names: ``Module``, ``Parameter``, containers, layers,
``init``, and ``functional`` (the stateless functions)."""

from . import functional
from .module import IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, Sequential

__all__ = ["functional", "Module", "Parameter", "Sequential", "ModuleList", "ModuleDict", "IncompatibleKeys"]
