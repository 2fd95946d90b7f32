"""OpenCL devices and their per-device runtime: context, queue, memory pool, kernel cache, tuning store.

``list_devices()`` enumerates every device of every platform, GPUs first (then accelerators, then CPUs), so
``Device.opencl(0)`` is the best GPU when there is one. Nothing here runs at ``import ember``: pyopencl is
imported on first use of an OpenCL device.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from ember.errors import DeviceError

log = logging.getLogger("ember.opencl")

INSTALL_HINT = (
    "no OpenCL runtime was found. Install a driver with an OpenCL ICD for your hardware (NVIDIA, AMD ROCm or "
    "Intel compute-runtime), or the portable CPU runtime PoCL (Debian/Ubuntu: apt-get install pocl-opencl-icd; "
    "conda: conda install -c conda-forge pocl), then check with `clinfo` or `ember info`"
)

_TYPE_RANK = {"gpu": 0, "accelerator": 1, "cpu": 2, "other": 3}


def _type_name(device: Any) -> str:
    import pyopencl as cl

    t = device.type
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.ACCELERATOR:
        return "accelerator"
    if t & cl.device_type.CPU:
        return "cpu"
    return "other"


@functools.cache
def list_devices() -> tuple[Any, ...]:
    """Every OpenCL device on this machine, best first (GPUs, accelerators, CPUs; platform order within)."""
    try:
        import pyopencl as cl
    except ImportError as exc:  # pragma: no cover - pyopencl is a dependency; a broken install lands here
        log.debug("pyopencl unavailable: %s", exc)
        return ()
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:  # PLATFORM_NOT_FOUND_KHR: ICD loader present, no driver
        log.debug("no OpenCL platform: %s", exc)
        return ()
    found = []
    for platform in platforms:
        try:
            found.extend(platform.get_devices())
        except cl.Error as exc:  # a platform with no usable device
            log.debug("OpenCL platform %s has no devices: %s", platform.name, exc)
    return tuple(sorted(found, key=lambda d: _TYPE_RANK[_type_name(d)]))


def device_count() -> int:
    return len(list_devices())


def device_kind(index: int) -> str:
    """The ember ranking kind of device index: "gpu" for GPUs and accelerators, else "cpu"."""
    devices = list_devices()
    if index >= len(devices):
        return "cpu"
    return "cpu" if _type_name(devices[index]) in ("cpu", "other") else "gpu"


def get_device(index: int) -> Any:
    devices = list_devices()
    if not devices:
        raise DeviceError(f"Device.opencl({index}): {INSTALL_HINT}")
    if index >= len(devices):
        raise DeviceError(f"Device.opencl({index}): only {len(devices)} OpenCL device(s) found")
    return devices[index]


class Runtime:
    """Everything one OpenCL device needs: context, in-order queue, memory pool, kernels, autotune results."""

    def __init__(self, index: int) -> None:
        import pyopencl as cl

        from .compiler import ProgramCache, TuneStore, device_key
        from .memory import MemoryPool

        self.index = index
        self.device = get_device(index)
        self.ctx = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.type_name = _type_name(self.device)
        extensions = self.device.extensions.split()
        self.fp64 = "cl_khr_fp64" in extensions or bool(getattr(self.device, "double_fp_config", 0))
        self.fp16 = "cl_khr_fp16" in extensions
        self.max_work_group = int(self.device.max_work_group_size)
        self.compute_units = int(self.device.max_compute_units)
        self.local_mem = int(self.device.local_mem_size)
        self.is_cpu = self.type_name == "cpu"
        # work-group size and a cap on the grid of grid-stride kernels (CPUs want few, large groups)
        self.ew_local = min(64 if self.is_cpu else 256, self.max_work_group)
        self.ew_max_groups = self.compute_units * (4 if self.is_cpu else 64)
        options = []
        if self.device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
            options.append("-cl-fp32-correctly-rounded-divide-sqrt")  # x / x == 1 as on every other backend
        self.build_options = tuple(options)
        self.key = device_key(self.device)
        self.pool = MemoryPool(self.ctx, capacity=int(self.device.global_mem_size),
                               max_alloc=int(self.device.max_mem_alloc_size), label=f"opencl:{index}")
        self.programs = ProgramCache(self.ctx, self.device)
        self.tune = TuneStore(None, self.key)
        self.lock = threading.Lock()

    def kernel(self, source: str, name: str) -> Any:
        """The compiled kernel ``name`` of ``source`` (memoised in process, binaries cached on disk)."""
        return self.programs.kernel(source, name, self.build_options)

    def describe(self) -> str:
        d = self.device
        return (f"{d.name.strip()} ({self.type_name}, {d.platform.name.strip()} {d.driver_version}, "
                f"{self.compute_units} compute units, {d.global_mem_size / 2**30:.1f} GiB)")

    def grid(self, n: int) -> tuple[tuple[int], tuple[int]]:
        """Global and local size of a grid-stride kernel over n items."""
        local = self.ew_local
        groups = max(1, min(-(-n // local), self.ew_max_groups))
        return (groups * local,), (local,)


_runtimes: dict[int, Runtime] = {}
_lock = threading.Lock()


def runtime(index: int) -> Runtime:
    """The shared Runtime of device index (created on first use)."""
    rt = _runtimes.get(index)
    if rt is None:
        with _lock:
            rt = _runtimes.get(index)
            if rt is None:
                rt = _runtimes[index] = Runtime(index)
    return rt
