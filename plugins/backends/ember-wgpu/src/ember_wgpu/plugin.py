"""ember plugin entry point for the WebGPU backend (entry-point group ``ember``, name ``wgpu``).

Registration is cheap: wgpu is imported only when ember counts or ranks WebGPU adapters (``Device.default()``,
``Device.wgpu(i)``, ``ember info``) or uses one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__


def _factory(index: int = 0, **options: Any) -> Any:
    from .backend import WGPUBackend

    power = options.pop("power", "high")
    if options:
        from ember.errors import DeviceError

        raise DeviceError(f"Device.wgpu({index}): unknown option(s) {sorted(options)}; wgpu takes power='high'|'low'")
    return WGPUBackend(index, power=power)


def _count() -> int:
    from .runtime import device_count

    return device_count()


def _kind(index: int) -> str:
    from .runtime import device_kind

    return device_kind(index)


@hookimpl
def register_backends(register: Callable[..., None]) -> None:
    from .runtime import INSTALL_HINT

    register(
        "wgpu",
        _factory,
        contract=CONTRACT,
        kind="gpu",
        # below flex and opencl within a kind; a CPU adapter (lavapipe) ranks as "emulated" through device_kind
        priority=-2,
        is_available=_count,
        device_kind=_kind,
        install_hint=INSTALL_HINT,
        description=f"WebGPU backend on wgpu-py: Vulkan, Metal, DirectX 12 (ember-wgpu {__version__})",
    )


@hookimpl
def plugin_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import wgpu

        info["wgpu"] = wgpu.__version__
        from .runtime import describe_adapter, list_adapters

        info["adapters"] = [describe_adapter(a) for a in list_adapters("high")]
    except Exception as exc:  # the info command must work without a driver
        info["error"] = str(exc)
    return info
