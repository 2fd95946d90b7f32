"""Fused elementwise kernels on CuPy: :meth:`CuPyBackend.fusion_compile` through the shared generator.

An elementwise :class:`ember.ir.Kernel` becomes one ``ember_fused`` map kernel (:func:`ember_kernels.fusion.
map_source`, the text ember-opencl runs), compiled with ``cupy.RawModule``; CuPy's on-disk kernel cache (keyed by
source, options, architecture and NVRTC/driver version) makes a warm start skip NVRTC. Fused reductions return None
for now: ember runs their instructions op by op (correct, not fused).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember.errors import ShapeError
from ember.ir import Kernel
from ember_kernels import elementwise as ew
from ember_kernels import fusion as kfusion


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
        for j, h in enumerate(inputs):
            lead = len(shape) - h.ndim
            if lead < 0 or any(m != 1 and m != shape[lead + d] for d, m in enumerate(h.shape)):
                raise ShapeError(f"fused kernel: input {j} of shape {h.shape} does not broadcast to the iteration "
                                 f"shape {shape}")
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


def fusion_compile(backend: Any, kernel: Kernel) -> CuPyMapKernel | None:
    """The compiled form of an elementwise ``kernel`` on ``backend`` (memoised per kernel), or None for what the
    generator does not handle (fused reductions, unknown ops or dtypes, bfloat16)."""
    cache = backend.__dict__.setdefault("_fusion_cache", {})
    if kernel in cache:
        return cache[kernel]
    compiled = None
    if kernel.reduce is None and kernel.outputs and kernel.rank >= 0 and \
            all(0 <= i < len(kernel.body) for i in kernel.outputs) and \
            all(d in backend.supported_dtypes for d in (*kernel.inputs, *(ins.dtype for ins in kernel.body))):
        try:
            compiled = CuPyMapKernel(backend, kernel, kfusion._Body(kernel, True))
        except (kfusion._Unsupported, KeyError, IndexError, TypeError):
            compiled = None
    cache[kernel] = compiled
    return compiled
