"""CLArray, the OpenCL backend's handle: a pooled memory block plus a strided view of it.

Views (reshape of contiguous data, permute, expand, basic indexing) share the block and change only ``offset``
(in elements, from the block's start) and ``estrides`` (element strides; 0 for broadcast dims, negative for
reversed slices). The block returns to the pool when the last view of it is gone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.shapes import basic_index_layout, contiguous_strides, expand_strides, view_strides

from .memory import Block


class CLArray:
    __slots__ = ("block", "offset", "shape", "estrides", "dtype", "rt", "__weakref__")

    def __init__(self, rt: Any, block: Block, shape: tuple[int, ...], dtype: DType,
                 estrides: tuple[int, ...] | None = None, offset: int = 0) -> None:
        self.rt = rt
        self.block = block
        self.shape = shape
        self.dtype = dtype
        self.estrides = contiguous_strides(shape) if estrides is None else estrides
        self.offset = offset

    # -- what kernels and core see -----------------------------------------------------------------------------
    @property
    def buf(self) -> Any:
        return self.block.buffer

    @property
    def eoff(self) -> int:
        """Element offset of this view's first element inside ``buf``."""
        return self.block.offset // self.dtype.itemsize + self.offset

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides, as numpy reports them (core's view() reads them)."""
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

    def view(self, shape: tuple[int, ...], estrides: tuple[int, ...], offset: int) -> CLArray:
        return CLArray(self.rt, self.block, shape, self.dtype, estrides, offset)

    def __repr__(self) -> str:
        return f"CLArray(shape={self.shape}, dtype={self.dtype}, strides={self.estrides}, offset={self.offset})"


def empty(rt: Any, shape: tuple[int, ...], dtype: DType) -> CLArray:
    """A new contiguous array (uninitialised) from the device's pool."""
    nbytes = math.prod(shape) * dtype.itemsize
    return CLArray(rt, rt.pool.allocate(nbytes), tuple(shape), dtype)


def upload(rt: Any, host: np.ndarray, dtype: DType) -> CLArray:
    import pyopencl as cl

    host = np.require(host, requirements="C")  # (ascontiguousarray would make a 0-d array 1-d)
    out = empty(rt, host.shape, dtype)
    if host.size:
        cl.enqueue_copy(rt.queue, out.buf, host, dst_offset=out.block.offset + out.offset * dtype.itemsize)
    return out


def download(h: CLArray) -> np.ndarray:
    """A contiguous array's data on the host (blocking read)."""
    import pyopencl as cl

    host = np.empty(h.shape, dtype=h.dtype.numpy)
    if host.size:
        cl.enqueue_copy(h.rt.queue, host, h.buf, src_offset=h.eoff * h.dtype.itemsize)
    return host


# -- views ------------------------------------------------------------------------------------------------------
def permute(h: CLArray, dims: tuple[int, ...]) -> CLArray:
    return h.view(tuple(h.shape[d] for d in dims), tuple(h.estrides[d] for d in dims), h.offset)


def expand(h: CLArray, shape: tuple[int, ...]) -> CLArray:
    return h.view(tuple(shape), expand_strides(h.shape, h.estrides, tuple(shape)), h.offset)


def reshape_view(h: CLArray, shape: tuple[int, ...]) -> CLArray | None:
    """A view of h with the new shape when its strides allow one (PyTorch's stride rule), else None."""
    if h.is_contiguous:
        return h.view(tuple(shape), contiguous_strides(shape), h.offset)
    strides = view_strides(h.shape, h.estrides, tuple(shape))
    return None if strides is None else h.view(tuple(shape), strides, h.offset)


def basic_index(h: CLArray, key: tuple[Any, ...]) -> CLArray:
    """A view for a key of ints, slices, None and Ellipsis (ints already in range)."""
    return h.view(*basic_index_layout(h.shape, h.estrides, h.offset, key))
