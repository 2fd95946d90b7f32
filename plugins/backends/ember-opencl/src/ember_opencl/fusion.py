"""Code generation for fused blocks: one :class:`ember.ir.Kernel` becomes one OpenCL C kernel.

Elementwise kernels reuse the strided map template of :mod:`.elementwise` (:func:`~.elementwise.map_kernel`): every
input is read through its own strides (0 where broadcast, negative for flipped views), the body runs as one C
statement per instruction (the per-op expression builders of :mod:`.elementwise`), and every output is stored in the
same pass. Reduce kernels evaluate the body at each point of the reduced dims and combine it in registers, with the
layouts of :mod:`.reduction`: ``col`` (one work-item per (row, chunk); every layout on CPUs) and ``row`` (a work-group
per (row, chunk) and a local-memory tree; GPUs, reduced dims inner). Rows split into several chunks write partials in
the accumulation dtype that :func:`.reduction._reduce` finishes.

Values keep the exact semantics of running the instructions one by one (:func:`ember.ir.interpret`): every
intermediate is converted to its instruction's dtype, float16/bfloat16 results are rounded to their storage
precision, and scalar arguments are kernel parameters (one binary serves all scalar values). The source depends only
on the kernel's structure and the layout (never on sizes or scalar values), so the on-disk program cache hits across
processes. Each compiled kernel memoises its layout decision per (shape, strides) signature, so a repeated call
builds one argument list and enqueues one kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ember import dtypes as dt
from ember.errors import ShapeError
from ember.ir import KERNEL_REDUCE_OPS, Kernel, interpret
from ember_kernels.fusion import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _ROUND,
    _Body,
    _coords,
    _Unsupported,
    map_source,
    reduce_source,
)

from . import elementwise as ew
from . import reduction as red
from .array import CLArray, empty
from .ctypes_ import CType, ctype

_LAYOUT_CACHE_MAX = 256  # distinct (shape, strides) signatures remembered per kernel


def _check_broadcast(h: CLArray, shape: tuple[int, ...], what: str) -> None:
    lead = len(shape) - h.ndim
    if lead < 0 or any(n != 1 and n != shape[lead + d] for d, n in enumerate(h.shape)):
        raise ShapeError(f"fused kernel: {what} of shape {h.shape} does not broadcast to the iteration shape {shape}")


class _Compiled:
    """What both kernel kinds share: the backend, the body and the per-signature layout memo."""

    def __init__(self, backend: Any, kernel: Kernel, body: _Body, cpu: bool) -> None:
        self.backend = backend
        self.rt = backend.rt
        self.kernel = kernel
        self.body = body
        self.cpu = cpu
        self.n_in = len(kernel.inputs)
        self.out_dtypes = [kernel.body[i].dtype for i in kernel.outputs]
        self.sources: dict[tuple[Any, ...], str] = {}
        self._layouts: dict[tuple[Any, ...], Any] = {}

    def _remember(self, key: tuple[Any, ...], layout: Any) -> Any:
        if len(self._layouts) >= _LAYOUT_CACHE_MAX:
            self._layouts.clear()
        self._layouts[key] = layout
        return layout


# -- elementwise ------------------------------------------------------------------------------------------------
class MapKernel(_Compiled):
    """An elementwise fused kernel: ``run(inputs, scalars, shape, outs)`` writes every output in one pass."""

    def source(self, layout: str, rank: int) -> str:
        """The program text for one (layout, rank bucket); a function of the kernel's structure only."""
        key = (layout, rank)
        src = self.sources.get(key)
        if src is None:
            src = map_source(self.body, self.out_dtypes, self.kernel.outputs, layout, rank)
            self.sources[key] = src
        return src

    def _layout(self, shape: tuple[int, ...], inputs: Sequence[CLArray], results: list[CLArray]) -> Any:
        for j, h in enumerate(inputs):
            _check_broadcast(h, shape, f"input {j}")
        n = math.prod(shape)
        strides = [r.estrides for r in results] + [ew._broadcast_strides(h, shape) for h in inputs]
        sh, strides = ew.collapse(shape, strides)
        linear = len(sh) <= 1 and all(st == (1,) or st == () for st in strides)
        rank = 1 if linear else ew._rank_bucket(len(sh))
        if self.cpu:
            layout = "linear_chunked" if linear else "chunked"
        else:
            layout = "linear" if linear else "strided"
        src = self.source(layout, rank)
        self.rt.kernel(src, "ember_fused")  # built now, so a failure names this call
        tail: list[Any] = [n]
        if not linear:
            pad = rank - len(sh)
            tail += [1] * pad + list(sh)
            for st in strides:
                tail += [0] * pad + list(st)
        gsize, lsize = self.rt.grid(n)
        return src, gsize, lsize, tail

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: Sequence[int],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        shape = tuple(shape)
        rt = self.rt
        if outs is None:
            outs = (None,) * len(self.out_dtypes)
        results = [o if o is not None else empty(rt, shape, d) for o, d in zip(outs, self.out_dtypes)]
        if 0 in shape:
            return results
        key = (shape, tuple([(h.shape, h.estrides) for h in inputs]),
               tuple([None if o is None else o.estrides for o in outs]))
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._remember(key, self._layout(shape, inputs, results))
        src, gsize, lsize, tail = lay
        args: list[Any] = []
        for r in results:
            args += (r.buf, r.eoff)
        for h in inputs:
            args += (h.buf, h.eoff)
        if self.body.scalar_slots:
            args += self.body.scalar_args(scalars)
        # kernel objects hold their arguments: the program cache gives each thread its own (a dict lookup)
        rt.kernel(src, "ember_fused")(rt.queue, gsize, lsize, *args, *tail)
        return results


# -- reductions -------------------------------------------------------------------------------------------------


class ReduceKernel(_Compiled):
    """A fused reduction: the body at every point of the iteration shape, combined over the reduced dims in
    registers (no intermediate), written keepdim."""

    def __init__(self, backend: Any, kernel: Kernel, body: _Body, cpu: bool) -> None:
        super().__init__(backend, kernel, body, cpu)
        assert kernel.reduce is not None
        op, dims = kernel.reduce
        self.out_dtype = self.out_dtypes[0]
        self.op = red._BOOL_OP.get(op, op) if self.out_dtype is dt.bool_ else op  # bool sum/prod are any/all
        self.fill = 1 if op in ("prod", "min") else 0  # an empty reduction (max/min of nothing: core rejects)
        self.red = tuple(sorted(set(dims)))
        self.kept = tuple(d for d in range(kernel.rank) if d not in self.red)
        self.tin = ctype(self.out_dtype)

    def source(self, nred: int, tout: CType) -> str:
        """The program for nred collapsed reduced dims storing tout (the output, or float partials)."""
        key = (nred, tout.dtype)
        src = self.sources.get(key)
        if src is not None:
            return src
        src = reduce_source(self.body, self.kernel.outputs[0], self.n_in, self.op, self.tin, nred, tout, self.cpu)
        self.sources[key] = src
        return src

    def _layout(self, shape: tuple[int, ...], inputs: Sequence[CLArray], out: CLArray) -> Any:
        """(source, kernel name, global size, local size, partials shape or None, pass-2 dim, tail args, tout), or
        None where the layout is too scattered to decompose (the call then runs op by op)."""
        for j, h in enumerate(inputs):
            _check_broadcast(h, shape, f"input {j}")
        rt = self.rt
        bstrides = [ew._broadcast_strides(h, shape) for h in inputs]
        kept, rdims = self.kept, self.red
        osh, ost = ew.collapse(tuple(shape[d] for d in kept),
                               [tuple(out.estrides[d] for d in kept)] + [tuple(s[d] for d in kept) for s in bstrides])
        rsh, rst = ew.collapse(tuple(shape[d] for d in rdims), [tuple(s[d] for d in rdims) for s in bstrides])
        if len(osh) > red.OMAX or len(rsh) > red.RMAX:
            return None
        if not rsh:
            rsh, rst = (1,), [(0,) for _ in bstrides]
        rows, length = math.prod(osh), math.prod(rsh)
        col = length <= red._SHORT
        for o, r in zip(ost[1:], rst):  # kept dims inner in memory: neighbouring items read neighbours
            inner_r = [abs(s) for s in r if s]
            if o and o[-1] and inner_r and abs(o[-1]) < min(inner_r):
                col = True
        kernel_name = "ember_fred_col" if self.cpu or col else "ember_fred_row"
        local = 0
        if self.cpu:
            want = 1 if rows >= red._target_items(rt) else min(-(-red._target_items(rt) // rows), length // 2048)
        elif col:
            want = 1 if rows >= red._target_items(rt) else min(-(-red._target_items(rt) // rows), length // 64)
        else:
            local = red._local_size(rt, None, length)
            want = 1 if rows >= red._target_groups(rt) else min(-(-red._target_groups(rt) // rows),
                                                                 length // (local * 16))
        groups, chunk = red._chunks(length, want)
        tout = ctype(red._acc_dtype(self.out_dtype)) if groups > 1 else ctype(self.out_dtype)
        src = self.source(len(rsh), tout)
        knl = rt.kernel(src, kernel_name)
        tail: list[Any] = [rows, length, groups, chunk, *red._outer_args(osh, *ost)]
        tail += list(rsh) + [v for r in rst for v in r]
        pshape = None
        if groups > 1:
            pshape = (rows, groups) if kernel_name == "ember_fred_row" else (groups, rows)
        if kernel_name == "ember_fred_row":
            local = red._local_size(rt, knl, length)
            tail.append(red._local_mem(local * red._acc_itemsize(self.tin)))
            ngroups = min(rows * groups, max(rt.ew_max_groups, red._target_groups(rt)))
            gsize, lsize = (ngroups * local,), (local,)
        elif self.cpu:
            local = red._cpu_local(rt, rows * groups)
            gsize, lsize = (-(-rows * groups // local) * local,), (local,)
        else:
            gsize, lsize = rt.grid(rows * groups)
        return src, kernel_name, gsize, lsize, pshape, 1 if kernel_name == "ember_fred_row" else 0, tail, tout

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: Sequence[int],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        shape = tuple(shape)
        rt = self.rt
        out = outs[0] if outs else None
        out_shape = tuple(1 if d in self.red else n for d, n in enumerate(shape))
        result = out if out is not None else empty(rt, out_shape, self.out_dtype)
        if 0 in out_shape:
            return [result]
        if 0 in shape:  # nothing to reduce: the identity
            ew.assign(result, self.fill)
            return [result]
        key = (shape, tuple([(h.shape, h.estrides) for h in inputs]), None if out is None else out.estrides)
        lay = self._layouts.get(key, False)
        if lay is False:
            lay = self._remember(key, self._layout(shape, inputs, result))
        if lay is None:
            return interpret(self.kernel, self.backend, inputs, scalars, shape, [result])
        src, name, gsize, lsize, pshape, pdim, tail, tout = lay
        target = result if pshape is None else empty(rt, pshape, tout.dtype)
        args: list[Any] = [target.buf, target.eoff]
        for h in inputs:
            args += (h.buf, h.eoff)
        if self.body.scalar_slots:
            args += self.body.scalar_args(scalars)
        rt.kernel(src, name)(rt.queue, gsize, lsize, *args, *tail)
        if pshape is not None:
            final = red._reduce(self.op, False, target, (pdim,), out_shape, self.out_dtype, final=True)
            if out is None:
                return [final]
            ew.assign(out, final)
        return [result]


# -- entry points -----------------------------------------------------------------------------------------------
def compile_kernel(backend: Any, kernel: Kernel, cpu: bool | None = None) -> MapKernel | ReduceKernel | None:
    """The :data:`ember.ir.CompiledKernel` of ``kernel`` on ``backend`` (an OpenCLBackend), or None when the
    generator does not handle it (an unknown op or dtype, an op invalid for its dtype, float64 without fp64).

    ``cpu`` picks the CPU (True) or GPU (False) layouts instead of the device's own (tests use it to run the GPU
    kernels on a CPU driver). Programs are built lazily, on the first call with a given layout.
    """
    if not kernel.outputs or kernel.rank < 0:
        return None
    if kernel.reduce is not None:
        op, dims = kernel.reduce
        if op not in KERNEL_REDUCE_OPS or len(kernel.outputs) != 1 or not dims or \
                any(not 0 <= d < kernel.rank for d in dims):
            return None
    if any(not 0 <= i < len(kernel.body) for i in kernel.outputs):
        return None
    try:
        body = _Body(kernel, backend.rt.fp64)
    except (_Unsupported, KeyError, IndexError, TypeError):
        return None
    is_cpu = backend.rt.is_cpu if cpu is None else cpu
    if kernel.reduce is None:
        return MapKernel(backend, kernel, body, is_cpu)
    return ReduceKernel(backend, kernel, body, is_cpu)


def fusion_compile(backend: Any, kernel: Kernel) -> MapKernel | ReduceKernel | None:
    """:meth:`ember.backend.Backend.fusion_compile` for OpenCL, memoised per kernel on the backend."""
    cache = backend.__dict__.setdefault("_fusion_cache", {})
    try:
        return cache[kernel]
    except KeyError:
        fn = cache[kernel] = compile_kernel(backend, kernel)
        return fn


__all__ = ["MapKernel", "ReduceKernel", "compile_kernel", "fusion_compile"]
