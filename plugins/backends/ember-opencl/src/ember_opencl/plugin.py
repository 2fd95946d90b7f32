"""ember plugin entry point for the OpenCL backend (entry-point group ``ember``, name ``opencl``).

Registration is cheap: pyopencl is imported only when ember counts or ranks OpenCL devices (``Device.default()``,
``Device.opencl(i)``, ``ember info``) or uses one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ember.plugins import hookimpl

from . import CONTRACT, __version__


def _factory(index: int = 0, **options: Any) -> Any:
    from .backend import OpenCLBackend

    if options:
        from ember.errors import DeviceError

        raise DeviceError(f"opencl takes no options, got {sorted(options)}")
    return OpenCLBackend(index)


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
        "opencl",
        _factory,
        contract=CONTRACT,
        kind="gpu",
        # below flex: a CPU OpenCL runtime (PoCL) is ranked as "cpu" and must not win Device.default() over flex
        priority=-1,
        is_available=_count,
        device_kind=_kind,
        install_hint=INSTALL_HINT,
        description=f"OpenCL backend on pyopencl (ember-opencl {__version__})",
    )


@hookimpl
def register_backend_traits(register: Callable[..., None]) -> None:
    register("opencl", nondeterministic_ops={
        "scatter": "reduce='add'/'multiply' combines duplicate indices with atomic compare-and-swap loops in "
                   "arbitrary order, so floating sums and products may round differently between runs "
                   "(scatter_add, index_add, index_put(accumulate=True) and embedding gradients reach it)",
    })


@hookimpl
def plugin_info() -> dict[str, Any]:
    info: dict[str, Any] = {}
    try:
        import pyopencl as cl

        info["pyopencl"] = cl.VERSION_TEXT
        from .runtime import list_devices

        info["devices"] = [f"{d.name.strip()} [{d.platform.name.strip()}, driver {d.driver_version}]"
                           for d in list_devices()]
    except Exception as exc:  # the info command must work without a runtime
        info["error"] = str(exc)
    return info


# `ember bench NAME` finds these through the entry-point group ``ember.benchmarks`` (this package's pyproject.toml);
# the scripts live in the source checkout's benchmarks/ folder, not in the wheel.
BENCHMARK = {
    "description": "OpenCL backend: matmul GFLOP/s vs numpy, seed-CNN step on OpenCL vs flex, cold vs warm first "
                   "step, pool reserved/peak",
    "script": "opencl.py",
}
