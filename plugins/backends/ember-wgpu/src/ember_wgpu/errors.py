"""Errors of the WebGPU backend (subclasses of ember's typed errors, so callers can catch either)."""

from __future__ import annotations

from ember.errors import DeviceError


class ShaderError(DeviceError):
    """A generated WGSL shader failed to compile (the message carries the compiler's report and the source)."""


class AutotuneError(DeviceError):
    """Every candidate configuration of an autotuned kernel failed on this adapter."""
