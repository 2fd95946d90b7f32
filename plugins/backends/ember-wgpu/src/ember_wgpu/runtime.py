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

import numpy as np

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
#: dispatches recorded per command buffer before it is submitted
MAX_BATCH = 64
#: bytes of the parameter arena (the kernels' shape/stride words of one command buffer)
ARENA_BYTES = 1 << 16


class ParamWords:
    """A kernel's parameter words (uint32), bound from the runtime's parameter arena at launch."""

    __slots__ = ("words",)

    def __init__(self, words: Any) -> None:
        self.words = words

    @property
    def buffer(self) -> ParamWords:
        return self

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
        self._layouts: dict[str, Any] = {}
        self._encoder: Any = None  # the open command encoder of recorded, unsubmitted dispatches
        self._pending = 0
        self._arena_buf: Any = None  # parameter words of the recorded dispatches, written at flush
        self._arena_chunks: list[tuple[int, Any]] = []
        self._arena_used = 0
        self._arena_align = max(int(limits.get("min-storage-buffer-offset-alignment", 256)), 4)
        self._fence: Any = None
        self._pipelines: dict[str, Any] = {}
        self.stats = {"modules": 0, "pipelines": 0, "pipeline_hits": 0, "compile_seconds": 0.0, "launches": 0,
                      "submits": 0}
        from .memory import MemoryPool

        self.pool = MemoryPool(self.device, capacity=self.max_buffer * 8, max_alloc=self.max_binding,
                               label=f"wgpu:{index}", lock=self.lock)
        self.pool.before_release = self.flush  # recorded dispatches may still use a buffer about to be destroyed

    def describe(self) -> str:
        return describe_adapter(self.adapter)

    @functools.cached_property
    def key(self) -> str:
        """This adapter's stable id for on-disk results (see :func:`ember_wgpu.tune.adapter_key`)."""
        from .tune import adapter_key

        native = getattr(getattr(self.wgpu, "backends", None), "wgpu_native", None)
        return adapter_key(dict(self.adapter.info), f"{self.wgpu.__version__}/{getattr(native, '__version__', '')}")

    @functools.cached_property
    def tune(self) -> Any:
        """The adapter's :class:`~ember_wgpu.tune.TuneStore` (autotune winners under the ember cache directory)."""
        from .tune import TuneStore

        return TuneStore(None, self.key)

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
        """Record a dispatch of ``source`` with ``buffers`` bound to @group(0) @binding(0..n-1) (a
        :class:`ParamWords` entry binds its words from the parameter arena) and ``groups`` workgroups (a count is
        split into a 2-d grid beyond the 65535-per-dimension limit; kernels rebuild the flat id).

        Dispatches are batched into one command buffer (a submit costs ~1 ms on lavapipe, more than a small
        kernel): :meth:`flush` submits it, and every host transfer, buffer release and ``sync`` flushes first, so
        the queue always sees work in program order."""
        if isinstance(groups, int):
            if groups <= 0:
                return
            gx = min(groups, 65535)
            grid = (gx, -(-groups // gx), 1)
        else:
            grid = groups
        pipe = self.pipeline(source)
        with self.lock:
            entries = []
            for i, b in enumerate(buffers):
                if isinstance(b, ParamWords):
                    nbytes = b.words.nbytes
                    off = -(-self._arena_used // self._arena_align) * self._arena_align
                    if off + nbytes > ARENA_BYTES:
                        self.flush()
                        off = 0
                    self._arena_chunks.append((off, b.words))
                    self._arena_used = off + nbytes
                    entries.append({"binding": i, "resource": {"buffer": self._arena(), "offset": off,
                                                               "size": nbytes}})
                else:
                    entries.append({"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}})
            layout = self._layouts.get(source)
            if layout is None:
                layout = self._layouts[source] = pipe.get_bind_group_layout(0)
            bind = self.device.create_bind_group(layout=layout, entries=entries)
            if self._encoder is None:
                self._encoder = self.device.create_command_encoder()
            cp = self._encoder.begin_compute_pass()
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bind)
            cp.dispatch_workgroups(*grid)
            cp.end()
            self._pending += 1
            self.stats["launches"] += 1
            if self._pending >= MAX_BATCH:
                self.flush()

    def _arena(self) -> Any:
        if self._arena_buf is None:
            self._arena_buf = self.device.create_buffer(
                size=ARENA_BYTES, usage=self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_DST)
        return self._arena_buf

    def flush(self) -> None:
        """Submit the recorded dispatches (after writing their parameters into the arena)."""
        with self.lock:
            enc = self._encoder
            if enc is None:
                return
            self._encoder = None
            if self._arena_chunks:
                host = np.zeros(-(-self._arena_used // 4), np.uint32)
                for off, words in self._arena_chunks:
                    host[off // 4:off // 4 + words.size] = words
                # ordered after every earlier submit (which read the arena's previous contents) and before this one
                self.queue.write_buffer(self._arena(), 0, host)
            self._arena_chunks = []
            self._arena_used = 0
            self._pending = 0
            self.queue.submit([enc.finish()])
            self.stats["submits"] += 1

    def sync(self) -> None:
        """Wait until every submitted command has finished."""
        # WebGPU has no queue.finish(): reading a word back maps a staging buffer, which the queue fills only after
        # every command submitted before it (on_submitted_work_done is broken in some wgpu-py releases)
        with self.lock:
            self.flush()
            if self._fence is None:
                self._fence = self.device.create_buffer(
                    size=4, usage=self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC)
        # the wait is outside the lock: the read resolves on wgpu-py's poll thread, where a garbage-collected
        # Block may need the lock to return its buffer to the pool
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
