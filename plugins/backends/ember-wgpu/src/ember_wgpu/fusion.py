"""fusion_compile for the WebGPU backend: one generated WGSL kernel per fused elementwise block.

An :class:`ember.ir.Kernel` (``load``/``scalar``/``unary``/``binary``/``where``/``cast`` over a broadcast
iteration space) becomes one strided map kernel with several outputs: each input is read through its own offset
and strides (0 for broadcast dims), the scalar arguments travel in the parameter buffer (two 32-bit words each,
encoded on the host in the instruction's dtype), and each output is written through its own strides, so in-place
outputs (views) need no copy. Kernels that end in a reduction, use a dtype the device lacks, or an op the WGSL
tables do not define compile to ``None``: fusion then runs them op by op with the contract methods.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType
from ember.ir import Kernel, interpret

from . import kernels as k
from . import wgsl
from .array import WArray, empty, expand
from .runtime import WG


def _scalar_expr(slot: int, dtype: DType) -> str:
    lo, hi = f"p[2 + {2 * slot}]", f"p[3 + {2 * slot}]"
    ct = wgsl.ctype(dtype)
    if ct == "f32":
        return f"bitcast<f32>({lo})"
    if ct == "bool":
        return f"({lo} != 0)"
    if ct == "i64":
        return f"((i64({hi}) << 32u) | i64(bitcast<u32>({lo})))"
    return lo


def _scalar_words(value: Any, dtype: DType) -> tuple[int, int]:
    """Two i32 words holding ``value`` converted to ``dtype`` (as ``Backend.full`` would convert it)."""
    ct = wgsl.ctype(dtype)
    with np.errstate(all="ignore"):
        if ct == "f32":
            f = np.float32(np.float16(value)) if dtype is dt.float16 else np.float32(value)
            return int(np.array(f).view(np.uint32)), 0
        if ct == "bool":
            return int(bool(value)), 0
        v = int(np.array(value).astype(dtype.numpy)) if dtype is not dt.int64 else int(value)
        return v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF


@functools.cache
def fused_source(kernel: Kernel) -> str | None:
    """The WGSL source of an elementwise kernel, or None when some instruction has no WGSL form here."""
    n_in, n_out = len(kernel.inputs), len(kernel.outputs)
    body = kernel.body
    n_sc = sum(1 for ins in body if ins.op == "scalar")
    head = 2 + 2 * n_sc  # p[0] = size, p[1] = rank, then the scalar words, then shape and strides
    lines = [f"@group(0) @binding({j}) var<storage, read> in{j}: array<{wgsl.stype(d)}>;"
             for j, d in enumerate(kernel.inputs)]
    for j, o in enumerate(kernel.outputs):
        lines.append(f"@group(0) @binding({n_in + j}) var<storage, read_write> out{j}: "
                     f"array<{wgsl.stype(body[o].dtype)}>;")
    lines.append(f"@group(0) @binding({n_in + n_out}) var<storage, read> p: array<i32>;")
    src = "\n".join(lines) + "\n" + k._MAIN.format(wg=WG) + "  " + k._FLAT_ID.format(wg=WG) + "\n"
    src += "  if (i >= p[0]) { return; }\n  let nd = p[1];\n  var rem = i;\n"
    n_ops = n_in + n_out
    for j in range(n_ops):
        src += f"  var o{j} = p[{head} + nd + {j} * (nd + 1)];\n"
    src += f"  for (var d = nd - 1; d >= 0; d = d - 1) {{\n    let len = p[{head} + d];\n    let c = rem % len;\n"
    src += "    rem = rem / len;\n"
    for j in range(n_ops):
        src += f"    o{j} = o{j} + c * p[{head + 1} + nd + {j} * (nd + 1) + d];\n"
    src += "  }\n"
    slot = 0
    for i, ins in enumerate(body):
        ct = wgsl.ctype(ins.dtype)
        a = ins.args
        if ins.op == "load":
            expr = wgsl.load(kernel.inputs[a[0]], f"in{a[0]}[o{a[0]}]")
        elif ins.op == "scalar":
            expr = _scalar_expr(slot, ins.dtype)
            slot += 1
        elif ins.op == "unary":
            expr = wgsl.unary_expr(a[0], wgsl.ctype(body[a[1]].dtype), f"v{a[1]}")
        elif ins.op == "binary":
            expr = wgsl.binary_expr(a[0], wgsl.ctype(body[a[1]].dtype), f"v{a[1]}", f"v{a[2]}")
        elif ins.op == "where":
            c, x, y = a
            expr = (f"select({wgsl.convert(f'v{y}', wgsl.ctype(body[y].dtype), ct)}, "
                    f"{wgsl.convert(f'v{x}', wgsl.ctype(body[x].dtype), ct)}, "
                    f"{wgsl.truth(f'v{c}', wgsl.ctype(body[c].dtype))})")
        elif ins.op == "cast":
            expr = wgsl.convert(f"v{a[0]}", wgsl.ctype(body[a[0]].dtype), ct)
        else:
            return None
        if expr is None:
            return None
        src += f"  let v{i}: {ct} = {expr};\n"
    for j, o in enumerate(kernel.outputs):
        src += f"  out{j}[o{n_in + j}] = {wgsl.store(body[o].dtype, f'v{o}')};\n"
    src += "}\n"
    return k._with_library(src, [*kernel.inputs, *(ins.dtype for ins in body)])


def compile_kernel(backend: Any, kernel: Kernel) -> Any:
    """The CompiledKernel of an elementwise ``kernel`` on ``backend``, or None (run op by op)."""
    if kernel.reduce is not None:
        return None
    supported = backend.supported_dtypes
    if any(d not in supported for d in kernel.inputs) or any(ins.dtype not in supported for ins in kernel.body):
        return None
    n_bindings = len(kernel.inputs) + len(kernel.outputs) + 1
    if n_bindings > backend.rt.max_storage_buffers:
        return None
    source = fused_source(kernel)
    if source is None:
        return None
    backend.rt.pipeline(source)  # compile now: a shader error falls back to op by op instead of failing later
    scalar_dtypes = [(ins.args[0], ins.dtype) for ins in kernel.body if ins.op == "scalar"]
    out_dtypes = [kernel.body[o].dtype for o in kernel.outputs]

    def run(inputs: Sequence[WArray], scalars: Sequence[Any], shape: tuple[int, ...],
            outs: Sequence[WArray | None]) -> list[WArray]:
        shape = tuple(shape)
        rt = backend.rt
        outputs = [o if o is not None else empty(rt, shape, d) for o, d in zip(outs, out_dtypes)]
        blocks = {id(o.block) for o in outputs}
        if len(blocks) < len(outputs):  # two outputs in one buffer cannot both be bound for writing
            return interpret(kernel, backend, inputs, scalars, shape, outs)
        # WebGPU cannot bind a buffer for reading and writing in one dispatch: read such inputs from a copy
        ins = [backend.copy(h) if id(h.block) in blocks else h for h in inputs]
        ins = [h if h.shape == shape else expand(h, shape) for h in ins]
        n = int(np.prod(shape)) if shape else 1
        if n == 0:
            return outputs
        words: list[int] = []
        for idx, d in scalar_dtypes:
            words.extend(_scalar_words(scalars[idx], d))
        dims, strides = k.collapse(shape, *(h.estrides for h in ins), *(o.estrides for o in outputs))
        vals = [n, len(dims), *words, *dims]
        for h, s in zip([*ins, *outputs], strides):
            vals.append(h.offset)
            vals.extend(s)
        prm = k._params(rt, vals)
        rt.launch(source, [*(h.buf for h in ins), *(o.buf for o in outputs), prm.buffer], -(-n // WG))
        return outputs

    return run
