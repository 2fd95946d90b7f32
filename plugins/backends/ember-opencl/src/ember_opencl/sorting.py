"""sort and topk: a bitonic sort of (key, index) pairs, in local memory per work-group plus global merge passes.

Every element becomes an unsigned *key* whose integer order is the wanted order (IEEE bits with the sign folded,
-0.0 == 0.0, every NaN the largest key; signed ints with the sign bit flipped; complemented for descending), paired
with its index along the sorted dim. Pairs are distinct, so any sorting network gives the stable order (ties by
index), as ember-flex and torch(stable=True) return it. Keys of types up to 32 bits pack with the index into one
``ulong`` (key << 32 | index); 64-bit types use ``ulong2`` (key, index).

Each row is padded to a power of two ``seg`` with sentinel pairs (all ones) that order after everything. A tile of
``TILE`` pairs (or several whole rows) is sorted in local memory by one work-group; longer rows then run the
remaining bitonic stages with one global compare-exchange pass per step down to the tile size, finishing each stage
in local memory. topk with a small k sorts tiles and keeps only the first k' (k rounded up to a power of two) of
each, repeating until a row fits one tile: the top k of a row are among the top k of its tiles.

The key kernel reads the input through its strides and the output kernel gathers the values by index through them,
so no contiguous copy is made; kernels depend only on the element width and the rank of the collapsed outer dims.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember.errors import UnsupportedError
from ember_kernels.sorting import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _FLOAT_INF,
    _NET,
    _UTYPE,
    _key_source,
    _key_sources,
    _net_source,
    _net_sources,
    _out_source,
    _out_sources,
    _outer_code,
    _pair_defs,
)

from .array import CLArray, contiguous_strides, empty
from .elementwise import collapse

_MAX_TILE = 2048  # pairs sorted per work-group (1024 work-items); bounded further by the device below
U32_MAX = 0xFFFFFFFF
_tiles: dict[int, dict[bool, int]] = {}  # id(runtime) -> {wide: tile}


def _pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


class _Scratch:
    """A pooled buffer of `count` pairs (kept alive while kernels use it)."""

    def __init__(self, rt: Any, count: int, esize: int) -> None:
        self.block = rt.pool.allocate(max(count, 1) * esize)
        self.buf = self.block.buffer
        self.off = np.int64(self.block.offset // esize)


def _max_tile(rt: Any, wide: bool) -> int:
    """Pairs one work-group sorts: bounded by work-group size, local memory and _MAX_TILE (4 KiB on CPUs, where
    "local" memory is cached global memory and a tile should stay in L1)."""
    cache = _tiles.get(id(rt))
    if cache is None:
        cache = _tiles[id(rt)] = {}
    tile = cache.get(wide)
    if tile is None:
        import pyopencl as cl

        kernel = rt.kernel(_net_source(wide), "ember_sort_local")
        wg = int(kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, rt.device))
        esize = 16 if wide else 8
        by_mem = (4096 if rt.is_cpu else rt.local_mem // 2) // esize
        tile = min(_MAX_TILE, 1 << (min(2 * wg, by_mem).bit_length() - 1))
        tile = cache[wide] = max(tile, 2)
    return tile


def _grid(rt: Any, n: int) -> tuple[tuple[int], tuple[int]]:
    """One work-item per item (PoCL vectorises across work-items; a grid-stride loop would defeat that)."""
    local = rt.ew_local
    return (-(-n // local) * local,), (local,)


def _local(rt: Any, wide: bool, src: _Scratch, dst: _Scratch, total: int, upto: int, keep: int | None,
           merge: bool) -> None:
    """Run ember_sort_local over total pairs: tiles of min(max tile, total rounded up) pairs."""
    tile = min(_max_tile(rt, wide), _pow2(total))
    tile = max(tile, upto, 2)
    keep = tile if keep is None else keep
    groups = -(-total // tile)
    local = min(tile // 2, 8) if rt.is_cpu else tile // 2  # CPUs: few work-items, each loops
    esize = 16 if wide else 8
    import pyopencl as cl

    kernel = rt.kernel(_net_source(wide), "ember_sort_local")
    kernel(rt.queue, (groups * local,), (local,), src.buf, src.off, dst.buf, dst.off, np.int64(total),
           np.uint32(tile), np.uint32(upto), np.uint32(keep), np.int32(merge), cl.LocalMemory(tile * esize))


def _sort_rows(rt: Any, wide: bool, data: _Scratch, rows: int, seg: int) -> None:
    """Sort each of rows consecutive segments of seg (a power of two) pairs ascending, in place."""
    if seg <= 1:
        return
    total = rows * seg
    tile = min(_max_tile(rt, wide), _pow2(total))
    if seg <= tile:
        _local(rt, wide, data, data, total, seg, None, False)
        return
    _local(rt, wide, data, data, total, tile, None, False)
    step = rt.kernel(_net_source(wide), "ember_sort_step")
    npairs = total // 2
    gsize, lsize = _grid(rt, npairs)
    k = tile * 2
    while k <= seg:
        j = k // 2
        while j >= tile:
            step(rt.queue, gsize, lsize, data.buf, data.off, np.int64(npairs), np.int64(k), np.int64(j),
                 np.int32(j == k // 2))
            j //= 2
        _local(rt, wide, data, data, total, tile, None, True)
        k *= 2


def _prepare(h: CLArray, dim: int, kk: int) -> tuple[tuple[int, ...], list[tuple[int, ...]], tuple[int, ...]]:
    """Collapsed outer dims (all but dim) with input and output strides, and the output shape (kk along dim)."""
    out_shape = h.shape[:dim] + (kk,) + h.shape[dim + 1:]
    ostrides = contiguous_strides(out_shape)
    outer = tuple(n for d, n in enumerate(h.shape) if d != dim)
    si = tuple(s for d, s in enumerate(h.estrides) if d != dim)
    so = tuple(s for d, s in enumerate(ostrides) if d != dim)
    shape, strides = collapse(outer, [si, so])
    return shape, strides, out_shape


def _key_params(dtype: DType) -> tuple[int, int, int]:
    """(mode, sign mask, inf mask): mode 0 unsigned, 1 signed integer, 2 IEEE float."""
    bits = dtype.itemsize * 8
    if dtype.is_floating_point:
        return 2, 1 << (bits - 1), _FLOAT_INF[dtype]
    if dtype.is_signed:
        return 1, 1 << (bits - 1), 0
    return 0, 0, 0


def _run(h: CLArray, dim: int, kk: int, descending: bool, small_k: bool) -> tuple[CLArray, CLArray]:
    """The first kk pairs of each row after a stable sort along dim: (values, int64 indices)."""
    rt = h.rt
    n = h.shape[dim]
    if n >= U32_MAX:  # indices travel as 32-bit words beside the keys
        raise UnsupportedError(f"sort/topk: dimension {dim} of shape {h.shape} ({h.dtype.name}) has {n} elements; "
                               f"the OpenCL backend sorts rows of fewer than {U32_MAX}")
    shape, (si, so), out_shape = _prepare(h, dim, kk)
    values, indices = empty(rt, out_shape, h.dtype), empty(rt, out_shape, dt.int64)
    rows = math.prod(shape)
    if values.size == 0:
        return values, indices
    width = h.dtype.itemsize
    wide = width == 8
    esize = 16 if wide else 8
    seg = _pow2(n)
    total = rows * seg
    rank = len(shape)
    dims = [np.int64(v) for v in shape]
    data = _Scratch(rt, total, esize)
    mode, sign, inf = _key_params(h.dtype)
    kt = np.uint64 if wide else np.uint32
    keys = rt.kernel(_key_source(width, rank), "ember_sort_keys")
    gsize, lsize = _grid(rt, total)
    keys(rt.queue, gsize, lsize, h.buf, np.int64(h.eoff), np.int64(h.estrides[dim]), data.buf, data.off,
         np.int64(n), np.int64(seg), np.int64(total), np.int32(mode), kt(sign), kt(inf), np.int32(descending),
         *dims, *[np.int64(v) for v in si])
    tile = _max_tile(rt, wide)
    keep = _pow2(kk)
    if small_k and seg > tile and keep * 4 <= tile:
        # tournament of tiles: each pass keeps the first `keep` pairs of every sorted tile
        while seg > tile:
            nxt = _Scratch(rt, total // tile * keep, esize)
            _local(rt, wide, data, nxt, total, tile, keep, False)
            data, seg = nxt, seg // tile * keep
            total = rows * seg
    _sort_rows(rt, wide, data, rows, seg)
    out = rt.kernel(_out_source(width, rank), "ember_sort_out")
    count = rows * kk
    gsize, lsize = _grid(rt, count)
    out(rt.queue, gsize, lsize, data.buf, data.off, np.int64(seg), h.buf, np.int64(h.eoff),
        np.int64(h.estrides[dim]), values.buf, np.int64(values.eoff), indices.buf, np.int64(indices.eoff),
        np.int64(kk), np.int64(count), np.int64(values.estrides[dim]), *dims, *[np.int64(v) for v in si],
        *[np.int64(v) for v in so])
    return values, indices


def sort(h: CLArray, dim: int, descending: bool, stable: bool) -> tuple[CLArray, CLArray]:
    """(values, int64 indices) sorted along dim; always stable (ties keep index order), NaN the largest value."""
    return _run(h, dim, h.shape[dim], bool(descending), False)


def topk(h: CLArray, k: int, dim: int, largest: bool, sorted_: bool) -> tuple[CLArray, CLArray]:
    """The k largest (smallest) values along dim and their indices, in stable sorted order (also for sorted_=False)."""
    return _run(h, dim, int(k), bool(largest), True)
