"""WArray, the WebGPU backend's handle: a pooled buffer plus a strided view of it.

Views (reshape of contiguous data, permute, expand, basic indexing) share the block and change only ``offset`` and
``estrides`` (element strides; 0 for broadcast dims, negative for reversed slices). Kernels read every operand
through its offset and strides, so views never need a copy before an op.

Storage per dtype (WGSL has no 8-bit storage and no float64): float32 ``f32``, int32 ``i32``, float16 ``f16``
(adapter feature ``shader-f16``), int64 ``i64`` (feature ``shader-int64``: the little-endian pair of 32-bit words
numpy uses, so transfers copy bytes unchanged), bool as one ``u32`` word per element (0 or 1), and int8,
uint8 and int16 as one ``i32`` word per element.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember.errors import DTypeError
from ember.shapes import basic_index_layout, contiguous_strides, expand_strides, view_strides

from .memory import Block

#: ember dtype -> (WGSL storage type, bytes per element, adapter feature it needs or None)
STORAGE: dict[DType, tuple[str, int, str | None]] = {
    dt.float32: ("f32", 4, None),
    dt.int32: ("i32", 4, None),
    dt.bool_: ("u32", 4, None),
    dt.float16: ("f16", 2, "shader-f16"),
    dt.int64: ("i64", 8, "shader-int64"),
    # WGSL storage holds 32-bit words: 8- and 16-bit integers take one i32 word each and wrap on store
    dt.int8: ("i32", 4, None),
    dt.uint8: ("i32", 4, None),
    dt.int16: ("i32", 4, None),
}
_WIDENED = {dt.bool_: np.uint32, dt.int8: np.int32, dt.uint8: np.int32, dt.int16: np.int32}

_WHY = {
    dt.float64: "WGSL has no 64-bit float type (WebGPU does not expose shader-f64)",
    dt.bfloat16: "WGSL has no bfloat16 type",
}


def supported_dtypes(features: frozenset[str]) -> frozenset[DType]:
    """The dtypes a device with these adapter features stores and computes."""
    return frozenset(d for d, (_, _, need) in STORAGE.items() if need is None or need in features)


def storage_type(dtype: DType, rt: Any, what: str) -> str:
    """The WGSL storage type of ``dtype`` on ``rt``'s device, or a DTypeError naming the op and the reason."""
    entry = STORAGE.get(dtype)
    if entry is None or (entry[2] is not None and entry[2] not in rt.features):
        why = (_WHY.get(dtype) or f"WGSL has no {dtype.name} type") if entry is None else \
            f"the adapter lacks the WebGPU feature {entry[2]}"
        ok = ", ".join(sorted(d.name for d in supported_dtypes(rt.features)))
        raise DTypeError(f"{what}: dtype {dtype.name} is not supported by the wgpu backend on {rt.describe()}: "
                         f"{why}; supported: {ok}")
    return entry[0]


class WArray:
    """A strided view of a pooled WebGPU buffer (the backend's handle; core reads ``.shape`` and ``.strides``)."""

    __slots__ = ("block", "offset", "shape", "estrides", "dtype", "rt", "__weakref__")

    def __init__(self, rt: Any, block: Block, shape: tuple[int, ...], dtype: DType,
                 estrides: tuple[int, ...] | None = None, offset: int = 0) -> None:
        self.rt = rt
        self.block = block
        self.shape = shape
        self.dtype = dtype
        self.estrides = contiguous_strides(shape) if estrides is None else estrides
        self.offset = offset

    @property
    def buf(self) -> Any:
        return self.block.buffer

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides as numpy would report them for the ember dtype (core's view() reads them)."""
        size = self.dtype.itemsize
        return tuple(s * size for s in self.estrides)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.estrides)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def view(self, shape: tuple[int, ...], estrides: tuple[int, ...], offset: int) -> WArray:
        return WArray(self.rt, self.block, tuple(shape), self.dtype, tuple(estrides), offset)

    def __repr__(self) -> str:
        return f"WArray(shape={self.shape}, dtype={self.dtype}, strides={self.estrides}, offset={self.offset})"


def empty(rt: Any, shape: tuple[int, ...], dtype: DType) -> WArray:
    """A new contiguous, uninitialised array from the device's pool."""
    itemsize = STORAGE[dtype][1]
    return WArray(rt, rt.pool.allocate(max(math.prod(shape), 1) * itemsize), tuple(shape), dtype)


def _host_words(host: np.ndarray, dtype: DType) -> np.ndarray:
    """The bytes to store for ``host`` (bool widened to one u32 word per element), C-contiguous."""
    wide = _WIDENED.get(dtype)
    if wide is not None:
        return np.ascontiguousarray(host, dtype=wide)
    return np.ascontiguousarray(host, dtype=dtype.numpy)


def upload(rt: Any, host: np.ndarray, dtype: DType) -> WArray:
    """Copy a host array into a new device array (``queue.write_buffer`` goes through wgpu's staging memory)."""
    storage_type(dtype, rt, "wgpu.from_numpy")
    out = empty(rt, tuple(host.shape), dtype)
    if host.size:
        data = _host_words(host, dtype).reshape(-1).view(np.uint8)
        pad = (-data.size) % 4  # writes are in whole 32-bit words
        if pad:
            data = np.concatenate([data, np.zeros(pad, np.uint8)])
        with rt.lock:
            rt.flush()  # recorded dispatches may still read this (reused) buffer: they run first
            rt.queue.write_buffer(out.buf, 0, data)
    return out


def download(h: WArray) -> np.ndarray:
    """A contiguous array's data on the host (waits for the queue; the read goes through a mapped staging buffer)."""
    itemsize = STORAGE[h.dtype][1]
    storage = _WIDENED.get(h.dtype, h.dtype.numpy)
    n = h.size
    if n == 0:
        return np.empty(h.shape, dtype=h.dtype.numpy)
    start = h.offset * itemsize
    lo, hi = start & ~3, (start + n * itemsize + 3) & ~3  # reads are in whole 32-bit words
    rt = h.rt
    rt.flush()
    # not under the runtime's lock: wgpu-py resolves the read on its poll thread, where a garbage-collected Block
    # may need the lock to return its buffer to the pool
    raw = np.frombuffer(rt.queue.read_buffer(h.buf, lo, hi - lo), dtype=np.uint8)
    data = raw[start - lo:start - lo + n * itemsize].view(storage).reshape(h.shape)
    if h.dtype is dt.bool_:
        return data != 0
    return data.astype(h.dtype.numpy)  # a copy: the read-back buffer is not ours to keep


# -- views ------------------------------------------------------------------------------------------------------
def permute(h: WArray, dims: tuple[int, ...]) -> WArray:
    return h.view(tuple(h.shape[d] for d in dims), tuple(h.estrides[d] for d in dims), h.offset)


def expand(h: WArray, shape: tuple[int, ...]) -> WArray:
    return h.view(tuple(shape), expand_strides(h.shape, h.estrides, tuple(shape)), h.offset)


def reshape_view(h: WArray, shape: tuple[int, ...]) -> WArray | None:
    """A view of h with the new shape when its strides allow one (PyTorch's stride rule), else None."""
    if h.is_contiguous:
        return h.view(tuple(shape), contiguous_strides(shape), h.offset)
    strides = view_strides(h.shape, h.estrides, tuple(shape))
    return None if strides is None else h.view(tuple(shape), strides, h.offset)


def basic_index(h: WArray, key: tuple[Any, ...]) -> WArray:
    """A view for a key of ints, slices, None and Ellipsis (ints already in range)."""
    return h.view(*basic_index_layout(h.shape, h.estrides, h.offset, key))


def element_offsets(h: WArray) -> np.ndarray:
    """The element offset (in ``h.buf``) of every element of ``h``, as an int64 array of h's shape (host side)."""
    offs = np.full(h.shape, h.offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(h.shape, h.estrides)):
        if n > 1 and s:
            shp = [1] * h.ndim
            shp[d] = n
            offs = offs + (np.arange(n, dtype=np.int64) * s).reshape(shp)
    return offs
