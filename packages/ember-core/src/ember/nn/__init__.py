"""Neural-network building blocks. ``ember.nn.functional`` holds the stateless functions (PyTorch's names)."""

from . import functional

__all__ = ["functional"]
