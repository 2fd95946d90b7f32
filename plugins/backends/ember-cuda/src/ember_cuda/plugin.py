"""ember plugin entry point for the NVIDIA CUDA backend (entry-point group ``ember``, name ``cuda``).

Registration is cheap: CuPy is imported only when a driver is present and ember counts devices, or when a device
is used. Without CuPy, a driver or a device, ``Device.cuda(i)`` raises DeviceError naming which (with the pip line when
CuPy is missing) and ``Device.default()`` never picks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__

PLATFORM = "cuda"


def _factory(index: int = 0, **options: Any) -> Any:
    from ember.errors import DeviceError
    from ember_cupy import detect

    if options:
        raise DeviceError(f"cuda takes no options, got {sorted(options)}")
    count = detect.device_count(PLATFORM)
    if index >= count:
        raise DeviceError(f"Device.cuda({index}): only {count} cuda device(s) found"
                          + (f" ({detect.unavailable_reason(PLATFORM)})" if not count else ""))
    from ember_cupy.backend import CuPyBackend

    return CuPyBackend(PLATFORM, index)


def _count() -> int:
    from ember_cupy import detect

    return detect.device_count(PLATFORM)


@hookimpl
def register_backends(register: Callable[..., None]) -> None:
    from ember_cupy import detect

    register(
        "cuda",
        _factory,
        contract=CONTRACT,
        kind="gpu",
        priority=10,  # a real GPU ranks above OpenCL's GPU path when both are present
        is_available=_count,
        install_hint=detect.install_hint(PLATFORM),
        description=f"NVIDIA CUDA backend on CuPy (ember-cuda {__version__})",
    )


@hookimpl
def plugin_info() -> dict[str, Any]:
    from ember_cupy import detect

    return detect.facts(PLATFORM)
