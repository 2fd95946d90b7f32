"""GPU detection for the CUDA and ROCm plugins, without importing CuPy unless a GPU can be there.

``import ember``, ``ember info`` and ``Device.default()`` ask how many devices a backend has; importing CuPy costs
a second or more, so :func:`device_count` first checks the cheap signs of a driver (``/proc/driver/nvidia`` and
``/dev/nvidia*`` for NVIDIA, ``/dev/kfd`` for AMD) and only then asks CuPy. :func:`unavailable_reason` says why
there is no device: CuPy missing (with the pip line), the wrong CuPy build, no driver, or no device.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
from typing import Any

#: the two platforms: "cuda" (NVIDIA, CuPy's CUDA wheels) and "rocm" (AMD, CuPy's ROCm builds)
PLATFORMS = ("cuda", "rocm")

PIP_HINT = {
    "cuda": "pip install cupy-cuda12x (CUDA 12 drivers) or cupy-cuda13x (CUDA 13)",
    "rocm": "pip install cupy-rocm-5-0 (ROCm 5.0 wheels) or build CuPy against the machine's ROCm "
            "(CUPY_INSTALL_USE_HIP=1 pip install cupy); see docs/plugins/rocm.md",
}


def cupy_installed() -> bool:
    """Whether a CuPy distribution is importable (a path lookup, CuPy is not imported)."""
    return importlib.util.find_spec("cupy") is not None


def cupy_distribution() -> str:
    """The installed CuPy distribution and version ("cupy-cuda12x 14.0.1"), read from its metadata (no import);
    empty when none is installed."""
    from importlib import metadata

    try:
        names = metadata.packages_distributions().get("cupy", [])
        return ", ".join(f"{n} {metadata.version(n)}" for n in sorted(set(names)))
    except Exception:  # broken metadata must not break `ember info`
        return ""


def driver_present(platform: str) -> bool:
    """Cheap signs of the platform's kernel driver: NVIDIA's /proc entry or device nodes, AMD's /dev/kfd."""
    if platform == "cuda":
        return os.path.exists("/proc/driver/nvidia/version") or bool(glob.glob("/dev/nvidia[0-9]*"))
    return os.path.exists("/dev/kfd")


def _cupy() -> Any:
    import cupy

    return cupy


def _is_hip(cupy: Any) -> bool:
    return bool(getattr(cupy.cuda.runtime, "is_hip", False))


@functools.cache
def _probe(platform: str) -> tuple[int, str]:
    """(device count, reason when 0) -- cached: drivers do not appear while a process runs."""
    if not cupy_installed():
        return 0, f"CuPy is not installed: {PIP_HINT[platform]}"
    if not driver_present(platform):
        what = "NVIDIA driver (/proc/driver/nvidia)" if platform == "cuda" else "AMD ROCm kernel driver (/dev/kfd)"
        return 0, f"no {what} was found on this machine"
    try:
        cupy = _cupy()
    except Exception as exc:  # a CuPy wheel for another CUDA major, missing libraries...
        return 0, f"CuPy failed to import ({type(exc).__name__}: {exc}); reinstall it: {PIP_HINT[platform]}"
    if _is_hip(cupy) != (platform == "rocm"):
        build = "ROCm" if _is_hip(cupy) else "CUDA"
        return 0, f"the installed CuPy is the {build} build; {PIP_HINT[platform]}"
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # cudaErrorInsufficientDriver, cudaErrorNoDevice, ...
        return 0, f"the {platform} runtime found no usable device ({type(exc).__name__}: {exc})"
    if n == 0:
        return 0, f"the {platform} driver is loaded but reports no device"
    return n, ""


def device_count(platform: str) -> int:
    """How many devices of ``platform`` CuPy can use here (0 without CuPy, driver or device)."""
    return _probe(platform)[0]


def unavailable_reason(platform: str) -> str:
    """Why :func:`device_count` is 0 (empty when devices were found)."""
    return _probe(platform)[1]


def install_hint(platform: str) -> str:
    """The hint ``Device.<kind>(i)`` shows when no device is found; computed from cheap checks only (no CuPy
    import), so registering the backend stays fast."""
    if not cupy_installed():
        return f"CuPy is not installed: {PIP_HINT[platform]}"
    if not driver_present(platform):
        what = "an NVIDIA driver" if platform == "cuda" else "the AMD ROCm kernel driver (amdgpu, /dev/kfd)"
        return f"no GPU driver found: install {what}, then check with `ember info`"
    return f"the driver is present but no usable device was found; `ember info` shows the {platform} runtime's error"


def facts(platform: str) -> dict[str, Any]:
    """``ember info`` facts: CuPy, runtime and driver versions, and per device its name, compute capability (CUDA)
    or gfx architecture (ROCm) and memory; ``reason`` when there is no device. Never raises."""
    info: dict[str, Any] = {}
    dist = cupy_distribution()
    if dist:
        info["cupy"] = dist
    if not cupy_installed():
        info["cupy"] = "not installed"
        info["reason"] = unavailable_reason(platform)
        return info
    n, reason = _probe(platform)
    if not n:
        info["reason"] = reason
        if not driver_present(platform):
            return info  # without a driver importing CuPy only costs time
    try:
        cupy = _cupy()
        info["cupy"] = info.get("cupy") or cupy.__version__
        rt = cupy.cuda.runtime
        info["runtime"] = _version(rt.runtimeGetVersion(), platform)
        if n:
            info["driver"] = _version(rt.driverGetVersion(), platform)
            devices = []
            for i in range(n):
                props = rt.getDeviceProperties(i)
                name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
                arch = (props.get("gcnArchName", b"") if platform == "rocm" else f"{props['major']}.{props['minor']}")
                if isinstance(arch, bytes):
                    arch = arch.decode()
                label = "gfx arch" if platform == "rocm" else "compute capability"
                devices.append(f"{name} [{label} {arch}, {props['totalGlobalMem'] / 2**30:.1f} GiB]")
            info["devices"] = devices
    except Exception as exc:  # the info command must work whatever the driver does
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def _version(v: int, platform: str) -> str:
    """CUDA encodes versions as 1000 * major + 10 * minor; HIP as 10_000_000 * major + 100_000 * minor + patch."""
    if platform == "rocm":
        return f"{v // 10_000_000}.{v // 100_000 % 100}.{v % 100_000}"
    return f"{v // 1000}.{v % 1000 // 10}"
