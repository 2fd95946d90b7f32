"""Neural-network building blocks with PyTorch's names: ``Module``, ``Parameter``, containers, every layer,
``init``, ``utils`` (gradient clipping), ``ParamGroup``, and ``functional`` (the stateless functions)."""

from . import functional, init, layers, modules, sequence, utils
from .layers import *  # noqa: F403 - the layer classes, listed in layers.__all__
from .module import IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, Sequential
from .param_group import ParamGroup, param_groups
from .sequence import *  # noqa: F403 - attention, transformer and recurrent layers

__all__ = [
    "functional", "init", "utils", "Module", "Parameter", "Sequential", "ModuleList", "ModuleDict",
    "IncompatibleKeys", "ParamGroup", "param_groups", *layers.__all__, *sequence.__all__,
]
