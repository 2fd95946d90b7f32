"""Fused kernels on CuPy: :meth:`CuPyBackend.fusion_compile` through the shared generator.

An elementwise :class:`ember.ir.Kernel` becomes one ``ember_fused`` map kernel (:func:`ember_kernels.fusion.
map_source`, the text ember-opencl runs); a fused reduction (``kernel.reduce``: sum/prod/max/min of the body over
some dims) becomes ``ember_fred_row`` (a block per row with a shared-memory tree) or ``ember_fred_col`` (a thread per
row, for short rows or rows whose kept dims are inner in memory) of :func:`ember_kernels.fusion.reduce_source`: the
body is evaluated at each point of the reduced dims and combined in registers, no intermediate array. Rows too few
to fill the GPU are split into chunks whose partials (float for half types) CuPy reduces in a second pass; layouts
too scattered to decompose run op by op (:func:`ember.ir.interpret`). Programs are compiled with ``cupy.RawModule``;
CuPy's on-disk kernel cache (keyed by source, options, architecture and NVRTC/driver version) makes a warm start
skip NVRTC.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.errors import ShapeError
from ember.ir import KERNEL_REDUCE_OPS, Kernel, interpret
from ember_kernels import elementwise as ew
from ember_kernels import fusion as kfusion
from ember_kernels import reduction as kred
from ember_kernels.ctypes_ import CType, ctype

#: work-items per streaming multiprocessor that keep one-thread-per-row kernels busy, and blocks per multiprocessor
#: for block-per-row kernels (ember-opencl's GPU targets)
_ITEMS_PER_SM = 2048
_GROUPS_PER_SM = 8
_MAX_GROUPS = 65535


class CuPyMapKernel:
    """A compiled elementwise fused block: ``kernel(inputs, scalars, shape, outs=None)`` writes every output in one
    pass and returns them."""

    def __init__(self, backend: Any, kernel: Kernel, body: Any) -> None:
        self.backend = backend
        self.kernel = kernel
        self.body = body
        self.out_dtypes = [kernel.body[i].dtype for i in kernel.outputs]
        self.sources: dict[tuple[str, int], str] = {}

    def source(self, layout: str, rank: int) -> str:
        """The program for one (layout, rank bucket): a function of the kernel's structure only."""
        key = (layout, rank)
        src = self.sources.get(key)
        if src is None:
            src = self.sources[key] = kfusion.map_source(self.body, self.out_dtypes, self.kernel.outputs, layout,
                                                         rank)
        return src

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: Sequence[int],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        be = self.backend
        shape = tuple(shape)
        results = [o if o is not None else be.empty(shape, d)
                   for o, d in zip(outs or (None,) * len(self.out_dtypes), self.out_dtypes)]
        n = math.prod(shape)
        if n == 0:
            return results
        _check_broadcast(inputs, shape)
        strides = [be._strides(r, shape) for r in results] + [be._strides(h, shape) for h in inputs]
        sh, strides = ew.collapse(shape, strides)
        linear = len(sh) <= 1 and all(st == (1,) or st == () for st in strides)
        rank = 1 if linear else ew._rank_bucket(len(sh))
        layout = "linear" if linear else "strided"
        args: list[Any] = []
        for r in results:
            args += [r, np.int64(0)]
        for h in inputs:
            args += [h, np.int64(0)]
        args += self.body.scalar_args(scalars)
        args.append(np.int64(n))
        if not linear:
            pad = rank - len(sh)
            args += [np.int64(1)] * pad + [np.int64(v) for v in sh]
            for st in strides:
                args += [np.int64(0)] * pad + [np.int64(v) for v in st]
        be._launch(self.source(layout, rank), "ember_fused", n, args)
        return results


def _check_broadcast(inputs: Sequence[Any], shape: tuple[int, ...]) -> None:
    for j, h in enumerate(inputs):
        lead = len(shape) - h.ndim
        if lead < 0 or any(m != 1 and m != shape[lead + d] for d, m in enumerate(h.shape)):
            raise ShapeError(f"fused kernel: input {j} of shape {h.shape} does not broadcast to the iteration "
                             f"shape {shape}")


def _chunks(length: int, want: int) -> tuple[int, int]:
    """(chunk count, chunk length) splitting length into at most want non-empty chunks."""
    want = max(1, min(want, length))
    size = -(-length // want)
    return -(-length // size), size


class CuPyReduceKernel:
    """A compiled fused reduction: ``kernel(inputs, scalars, shape, outs=None)`` evaluates the body over ``shape``
    and reduces it over the kernel's dims into one keepdim output."""

    def __init__(self, backend: Any, kernel: Kernel, body: Any) -> None:
        assert kernel.reduce is not None
        op, dims = kernel.reduce
        self.backend = backend
        self.kernel = kernel
        self.body = body
        self.out_dtype = kernel.body[kernel.outputs[0]].dtype
        self.op = kred._BOOL_OP.get(op, op) if self.out_dtype is dt.bool_ else op  # bool sum/prod are any/all
        self.fill = 1 if op in ("prod", "min") else 0  # an empty reduction's value (core rejects max/min of none)
        self.red = tuple(sorted(set(dims)))
        self.kept = tuple(d for d in range(kernel.rank) if d not in self.red)
        self.tin = ctype(self.out_dtype)
        self.sources: dict[tuple[int, Any], str] = {}

    def source(self, nred: int, tout: CType) -> str:
        """The program for nred collapsed reduced dims storing tout (the output, or float partials)."""
        key = (nred, tout.dtype)
        src = self.sources.get(key)
        if src is None:
            src = self.sources[key] = kfusion.reduce_source(self.body, self.kernel.outputs[0],
                                                            len(self.kernel.inputs), self.op, self.tin, nred, tout,
                                                            False)
        return src

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: Sequence[int],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        be = self.backend
        shape = tuple(shape)
        out = outs[0] if outs else None
        out_shape = tuple(1 if d in self.red else n for d, n in enumerate(shape))
        result = out if out is not None else be.empty(out_shape, self.out_dtype)
        if 0 in out_shape:
            return [result]
        if 0 in shape:  # nothing to reduce: the identity
            be.assign(result, self.fill)
            return [result]
        _check_broadcast(inputs, shape)
        bstrides = [be._strides(h, shape) for h in inputs]
        rstrides = be._strides(result, shape)  # 0 along the reduced (size-1) dims
        kept, rdims = self.kept, self.red
        osh, ost = ew.collapse(tuple(shape[d] for d in kept),
                               [tuple(rstrides[d] for d in kept)] + [tuple(s[d] for d in kept) for s in bstrides])
        rsh, rst = ew.collapse(tuple(shape[d] for d in rdims), [tuple(s[d] for d in rdims) for s in bstrides])
        if len(osh) > kred.OMAX or len(rsh) > kred.RMAX:
            return interpret(self.kernel, be, inputs, scalars, shape, [result])
        if not rsh:
            rsh, rst = (1,), [(0,) for _ in bstrides]
        rows, length = math.prod(osh), math.prod(rsh)
        col = length <= kred._SHORT
        for o, r in zip(ost[1:], rst):  # kept dims inner in memory: neighbouring threads read neighbours
            inner_r = [abs(v) for v in r if v]
            if o and o[-1] and inner_r and abs(o[-1]) < min(inner_r):
                col = True
        sms = be.multiprocessors()
        if col:
            local = 0
            items = sms * _ITEMS_PER_SM
            want = 1 if rows >= items else min(-(-items // rows), length // 64)
        else:
            from .kernels import _row_block

            local = _row_block(length)
            groups_target = sms * _GROUPS_PER_SM
            want = 1 if rows >= groups_target else min(-(-groups_target // rows), length // (local * 16))
        groups, chunk = _chunks(length, want)
        tout = ctype(kred._acc_dtype(self.out_dtype)) if groups > 1 else self.tin
        src = self.source(len(rsh), tout)
        pshape = ((rows, groups) if not col else (groups, rows)) if groups > 1 else None
        target = result if pshape is None else be.empty(pshape, tout.dtype)
        args: list[Any] = [target, np.int64(0)]
        for h in inputs:
            args += [h, np.int64(0)]
        args += self.body.scalar_args(scalars)
        args += [np.int64(v) for v in (rows, length, groups, chunk)]
        pad = kred.OMAX - len(osh)
        args += [np.int64(v) for v in [1] * pad + list(osh)]
        for st in ost:
            args += [np.int64(v) for v in [0] * pad + list(st)]
        args += [np.int64(v) for v in rsh] + [np.int64(v) for r in rst for v in r]
        if col:
            be._launch(src, "ember_fred_col", rows * groups, args)
        else:
            be._launch_groups(src, "ember_fred_row", min(rows * groups, _MAX_GROUPS), local, args,
                              local * kred._acc_dtype(self.out_dtype).itemsize)
        if pshape is None:
            return [result]
        # pass 2: CuPy reduces the partials (row kernels write (rows, groups), column kernels (groups, rows))
        final = be.reduce(self.op, target, (1 if not col else 0,), False)
        final = be.reshape(be.cast(final, self.out_dtype), out_shape)
        if out is None:
            return [final]
        be.assign(out, final)
        return [out]


def fusion_compile(backend: Any, kernel: Kernel) -> CuPyMapKernel | CuPyReduceKernel | None:
    """The compiled form of ``kernel`` on ``backend`` (memoised per kernel), or None for what the generator does not
    handle (unknown ops or dtypes, bfloat16, a reduction with several outputs)."""
    cache = backend.__dict__.setdefault("_fusion_cache", {})
    if kernel in cache:
        return cache[kernel]
    compiled: CuPyMapKernel | CuPyReduceKernel | None = None
    ok = bool(kernel.outputs) and kernel.rank >= 0 and all(0 <= i < len(kernel.body) for i in kernel.outputs) and \
        all(d in backend.supported_dtypes for d in (*kernel.inputs, *(ins.dtype for ins in kernel.body)))
    if ok and kernel.reduce is not None:
        op, dims = kernel.reduce
        ok = op in KERNEL_REDUCE_OPS and len(kernel.outputs) == 1 and bool(dims) and \
            all(0 <= d < kernel.rank for d in dims)
    if ok:
        try:
            body = kfusion._Body(kernel, True)
            compiled = CuPyMapKernel(backend, kernel, body) if kernel.reduce is None else \
                CuPyReduceKernel(backend, kernel, body)
        except (kfusion._Unsupported, KeyError, IndexError, TypeError):
            compiled = None
    cache[kernel] = compiled
    return compiled
