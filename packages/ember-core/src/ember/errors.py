"""ember's error family.

Every error ember raises derives from :class:`EmberError`. The subclasses also derive from the matching
Python built-in (``ShapeError`` is a ``ValueError``, ``DTypeError`` a ``TypeError``, ...) so code written
against PyTorch's or numpy's exceptions keeps working. Messages name the op and the shapes, dtypes or devices
involved.
"""

from __future__ import annotations


class EmberError(Exception):
    """Base class of every error raised by ember."""


class ShapeError(EmberError, ValueError):
    """Operand shapes are incompatible (broadcasting, matmul, reshape, cat, ...)."""


class DimError(EmberError, IndexError):
    """A dimension argument is out of range for the tensor's rank."""


class IndexOutOfRangeError(EmberError, IndexError):
    """An index (integer, slice or index tensor element) is out of range."""


class DTypeError(EmberError, TypeError):
    """An operand's dtype is not accepted by the op, or cannot be cast as requested."""


class DeviceError(EmberError, RuntimeError):
    """Operands live on different devices, or a device cannot be created."""


class UnsupportedError(EmberError, NotImplementedError):
    """The device's backend does not implement this op or dtype."""


class PluginError(EmberError, RuntimeError):
    """A plugin failed to load, or a device's plugin is not installed."""


class MissingPluginError(PluginError, AttributeError):
    """A name a plugin publishes (``ember.fft``, ``ember.linalg.cholesky``) was asked for, and no installed
    plugin provides it; the message names the extra that does. An ``AttributeError``, so ``hasattr`` works."""


class OutOfMemoryError(EmberError, MemoryError):
    """A device could not allocate memory."""


class AutodiffError(EmberError, RuntimeError):
    """A gradient computation was asked for in a way that cannot work."""


class ValueRangeError(EmberError, ValueError):
    """An argument value is invalid (negative size, empty range, bad mode string, ...)."""


__all__ = [
    "EmberError",
    "ShapeError",
    "DimError",
    "IndexOutOfRangeError",
    "DTypeError",
    "DeviceError",
    "UnsupportedError",
    "PluginError",
    "MissingPluginError",
    "OutOfMemoryError",
    "AutodiffError",
    "ValueRangeError",
]
