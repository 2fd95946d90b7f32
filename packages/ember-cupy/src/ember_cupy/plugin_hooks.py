"""The pluggy hooks of a CuPy backend plugin, made once for ember-cuda and ember-rocm.

The two plugins differ only in their platform (``"cuda"`` or ``"rocm"``, which is also the backend's name),
packaging and description, so each plugin module is two lines over :func:`backend_hooks`. Registration is cheap:
CuPy is imported only when a driver is present and ember counts devices, or when a device is used. Without CuPy, a
driver or a device, ``Device.<platform>(i)`` raises DeviceError naming which (with the pip line when CuPy is missing)
and ``Device.default()`` never picks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl


def backend_hooks(platform: str, description: str, contract: int) -> tuple[Callable[..., None],
                                                                           Callable[[], dict[str, Any]]]:
    """``(register_backends, plugin_info)`` hook implementations for the backend ``platform``."""

    def factory(index: int = 0, **options: Any) -> Any:
        from ember.errors import DeviceError

        from . import detect

        if options:
            raise DeviceError(f"{platform} takes no options, got {sorted(options)}")
        count = detect.device_count(platform)
        if index >= count:
            raise DeviceError(f"Device.{platform}({index}): only {count} {platform} device(s) found"
                              + (f" ({detect.unavailable_reason(platform)})" if not count else ""))
        from .backend import CuPyBackend

        return CuPyBackend(platform, index)

    def count() -> int:
        from . import detect

        return detect.device_count(platform)

    @hookimpl
    def register_backends(register: Callable[..., None]) -> None:
        from . import detect

        register(
            platform,
            factory,
            contract=contract,
            kind="gpu",
            priority=10,  # a real GPU ranks above OpenCL's GPU path when both are present
            is_available=count,
            install_hint=detect.install_hint(platform),
            description=description,
        )

    @hookimpl
    def plugin_info() -> dict[str, Any]:
        from . import detect

        return detect.facts(platform)

    return register_backends, plugin_info
