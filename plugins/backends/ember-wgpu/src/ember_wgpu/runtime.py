"""WebGPU adapters and the per-device runtime: device, queue, memory pool, shader-module and pipeline caches.

``list_adapters(power)`` enumerates the adapters wgpu-native finds (Vulkan, Metal, DirectX 12), best first for the
power preference: ``"high"`` puts discrete GPUs first, ``"low"`` integrated ones; CPU implementations (Mesa's
lavapipe, "llvmpipe") always come last. Nothing here runs at ``import ember``: wgpu is imported on first use.

Setting ``EMBER_WGPU_DISABLE=1`` hides every adapter (as a machine without a Vulkan/Metal/DX12 driver would look),
so the missing-driver path can be tested and a broken driver worked around.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any

from ember.errors import DeviceError

log = logging.getLogger("ember.wgpu")

INSTALL_HINT = (
    "no WebGPU adapter was found. ember-wgpu needs a Vulkan, Metal (macOS) or DirectX 12 (Windows) driver: on "
    "Linux install your GPU's Vulkan driver, or Mesa's CPU driver lavapipe (Debian/Ubuntu: apt-get install "
    "mesa-vulkan-drivers libvulkan1; Fedora: dnf install mesa-vulkan-drivers), then check with `vulkaninfo "
    "--summary` or `ember info`"
)

POWERS = ("high", "low")
_TYPE_RANK = {"high": {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4},
              "low": {"IntegratedGPU": 0, "DiscreteGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}}
#: WebGPU features the backend uses when the adapter has them (float16 storage, 64-bit integers)
OPTIONAL_FEATURES = ("shader-f16", "shader-int64")
#: workgroup size of the elementwise kernels (lavapipe and desktop GPUs both like 256)
WG = 256

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # lavapipe's WSI layer complains on stderr when it is unset


def _adapter_type(adapter: Any) -> str:
    return str(adapter.info.get("adapter_type", "Unknown"))


@functools.cache
def _all_adapters() -> tuple[Any, ...]:
    if os.environ.get("EMBER_WGPU_DISABLE", "") not in ("", "0"):
        return ()
    try:
        import wgpu
    except ImportError as exc:  # pragma: no cover - wgpu is a dependency; a broken install lands here
        log.debug("wgpu unavailable: %s", exc)
        return ()
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:  # no loader / no driver: wgpu-native raises from the enumeration
        log.debug("no WebGPU adapter: %s", exc)
        return ()
    # the "compute only" contract needs storage buffers; OpenGL (GLES) adapters lack compute shaders on many drivers
    return tuple(a for a in adapters if str(a.info.get("backend_type", "")) != "OpenGL")


def list_adapters(power: str = "high") -> tuple[Any, ...]:
    """Every WebGPU adapter on this machine, best first for ``power`` ("high" or "low")."""
    rank = _TYPE_RANK[power]
    return tuple(sorted(_all_adapters(), key=lambda a: rank.get(_adapter_type(a), 3)))


def device_count() -> int:
    """How many WebGPU adapters (devices) there are."""
    return len(_all_adapters())


def device_kind(index: int) -> str:
    """The ember ranking kind of adapter ``index``: "emulated" for CPU implementations (lavapipe), else "gpu"."""
    adapters = list_adapters("high")
    if index >= len(adapters):
        return "emulated"
    return "emulated" if _adapter_type(adapters[index]) == "CPU" else "gpu"


def describe_adapter(adapter: Any) -> str:
    info = adapter.info
    return f"{info.get('device', '?')} [{info.get('backend_type', '?')}, {info.get('adapter_type', '?')}]"


class Runtime:
    """One WebGPU device: the queue all ops go to, the pool, and the shader caches (per process)."""

    def __init__(self, index: int, power: str) -> None:
        import wgpu

        self.wgpu = wgpu
        adapters = list_adapters(power)
        if not adapters:
            raise DeviceError(f"Device.wgpu({index}): {INSTALL_HINT}")
        if index >= len(adapters):
            raise DeviceError(f"Device.wgpu({index}): only {len(adapters)} WebGPU adapter(s) found")
        self.index = index
        self.power = power
        self.adapter = adapters[index]
        features = set(self.adapter.features)
        self.features = frozenset(f for f in OPTIONAL_FEATURES if f in features)
        limits = dict(self.adapter.limits)
        wanted = {k: limits[k] for k in ("max-buffer-size", "max-storage-buffer-binding-size",
                                          "max-storage-buffers-per-shader-stage", "max-compute-workgroup-storage-size",
                                          "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x")
                  if k in limits}
        try:
            self.device = self.adapter.request_device_sync(required_features=sorted(self.features),
                                                           required_limits=wanted)
        except Exception as exc:
            raise DeviceError(f"Device.wgpu({index}): {describe_adapter(self.adapter)} refused a device: {exc}") \
                from exc
        self.queue = self.device.queue
        self.max_binding = int(wanted.get("max-storage-buffer-binding-size", 128 << 20))
        self.max_buffer = int(wanted.get("max-buffer-size", 256 << 20))
        self.max_storage_buffers = int(wanted.get("max-storage-buffers-per-shader-stage", 8))
        self.f16 = "shader-f16" in self.features
        self.i64 = "shader-int64" in self.features
        self.lock = threading.RLock()
        self._modules: dict[str, Any] = {}
        self._fence: Any = None
        self._pipelines: dict[str, Any] = {}
        self.stats = {"modules": 0, "pipelines": 0, "pipeline_hits": 0, "compile_seconds": 0.0, "launches": 0}
        from .memory import MemoryPool

        self.pool = MemoryPool(self.device, capacity=self.max_buffer * 8, max_alloc=self.max_binding,
                               label=f"wgpu:{index}")

    def describe(self) -> str:
        return describe_adapter(self.adapter)

    @property
    def is_cpu(self) -> bool:
        return _adapter_type(self.adapter) == "CPU"

    def check_dtype(self, dtype: Any, what: str) -> None:
        """Raise DTypeError unless this device can store ``dtype``."""
        from .array import storage_type

        storage_type(dtype, self, what)

    # -- shaders -------------------------------------------------------------------------------------------------
    def pipeline(self, source: str) -> Any:
        """The compute pipeline of WGSL ``source`` (entry point ``main``), compiled once per process."""
        p = self._pipelines.get(source)
        if p is not None:
            self.stats["pipeline_hits"] += 1
            return p
        with self.lock:
            p = self._pipelines.get(source)
            if p is None:
                t = time.perf_counter()
                module = self._modules.get(source)
                if module is None:
                    try:
                        module = self.device.create_shader_module(code=source)
                    except Exception as exc:
                        from .errors import ShaderError

                        raise ShaderError(f"ember-wgpu: WGSL shader failed to compile on {self.describe()}: {exc}"
                                          f"\n--- source ---\n{source}") from exc
                    self._modules[source] = module
                    self.stats["modules"] += 1
                p = self.device.create_compute_pipeline(layout="auto", compute={"module": module,
                                                                                 "entry_point": "main"})
                self._pipelines[source] = p
                self.stats["pipelines"] += 1
                self.stats["compile_seconds"] += time.perf_counter() - t
        return p

    def launch(self, source: str, buffers: list[Any], groups: int | tuple[int, int, int]) -> None:
        """Dispatch ``source`` with ``buffers`` bound to @group(0) @binding(0..n-1), ``groups`` workgroups (a count
        is split into a 2-d grid when it exceeds the 65535-per-dimension limit; kernels rebuild the flat id)."""
        if isinstance(groups, int):
            if groups <= 0:
                return
            gx = min(groups, 65535)
            grid = (gx, -(-groups // gx), 1)
        else:
            grid = groups
        pipe = self.pipeline(source)
        entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                   for i, b in enumerate(buffers)]
        bind = self.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bind)
        cp.dispatch_workgroups(*grid)
        cp.end()
        self.queue.submit([enc.finish()])
        self.stats["launches"] += 1

    def sync(self) -> None:
        """Wait until every submitted command has finished."""
        # WebGPU has no queue.finish(): reading a word back maps a staging buffer, which the queue fills only after
        # every command submitted before it (on_submitted_work_done is broken in some wgpu-py releases)
        with self.lock:
            if self._fence is None:
                self._fence = self.device.create_buffer(
                    size=4, usage=self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC)
            self.queue.read_buffer(self._fence, 0, 4)


_runtimes: dict[tuple[int, str], Runtime] = {}
_lock = threading.Lock()


def runtime(index: int, power: str = "high") -> Runtime:
    """The process-wide runtime of adapter ``index`` for ``power`` (one WebGPU device each)."""
    if power not in POWERS:
        raise DeviceError(f"Device.wgpu({index}, power={power!r}): power must be one of {POWERS}")
    key = (index, power)
    rt = _runtimes.get(key)
    if rt is None:
        with _lock:
            rt = _runtimes.get(key)
            if rt is None:
                rt = _runtimes[key] = Runtime(index, power)
    return rt


__all__ = ["INSTALL_HINT", "Runtime", "device_count", "device_kind", "list_adapters", "runtime"]
