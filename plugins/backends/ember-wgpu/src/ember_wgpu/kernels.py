"""Generated WGSL compute kernels: strided maps, reductions, scans, tiled matmul, sort, gather/scatter, Philox.

Every kernel reads its operands through (offset, strides) metadata in a small ``array<i32>`` parameter buffer, so
one compiled pipeline serves every shape and layout of an op and dtype combination (lavapipe compiles a shader
in ~0.1 s; per-shape shaders would make every new shape pay that). Sources are cached by text in the runtime, so
the pipeline cache key is the source itself.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType

from . import wgsl
from .array import WArray, contiguous_strides, empty
from .reductions import TREE_WG, groups_grid, tree_argreduce_source, tree_reduce_source, use_tree
from .runtime import WG, ParamWords

_FLAT_ID = "let i = i32(gid.x + gid.y * nwg.x * {wg}u);"
_MAIN = ("@compute @workgroup_size({wg})\n"
         "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{\n")

_FN = re.compile(r"\nfn (\w+)\(")


@functools.cache
def _library(with_i64: bool) -> dict[str, str]:
    text = wgsl.prelude([dt.int64] if with_i64 else [])
    starts = [(m.start(), m.group(1)) for m in _FN.finditer(text)]
    out = {}
    for k, (pos, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(text)
        out[name] = text[pos:end]
    return out


def _with_library(body: str, dtypes: list[DType]) -> str:
    """``body`` preceded by the ``enable`` directives and the prelude functions it calls (transitively)."""
    lib = _library(any(d is dt.int64 for d in dtypes))
    need: list[str] = []
    frontier = body
    while True:
        new = [n for n in lib if n not in need and re.search(rf"\b{n}\(", frontier)]
        if not new:
            break
        need.extend(new)
        frontier = "".join(lib[n] for n in new)
    ordered = [n for n in lib if n in need]  # definition order: callees come first in the prelude
    return wgsl.header(dtypes) + "".join(lib[n] for n in ordered) + "\n" + body


def _params(rt: Any, values: list[int]) -> ParamWords:
    """A kernel's parameter words: ``values`` as 32-bit two's complement (bound from the runtime's arena)."""
    arr = np.asarray(values, dtype=np.int64)
    data = (arr & 0xFFFFFFFF).astype(np.uint32)
    return ParamWords(data if data.size else np.zeros(1, np.uint32))


def collapse(shape: tuple[int, ...], *strides: tuple[int, ...]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims that are contiguous with each other in every operand (fewer index divisions)."""
    dims = [(n, [s[d] for s in strides]) for d, n in enumerate(shape) if n != 1]
    if not dims:
        return [], [[] for _ in strides]
    out_n = [dims[0][0]]
    out_s = [list(dims[0][1])]
    for n, ss in dims[1:]:
        prev = out_s[-1]
        if all(p == s * n for p, s in zip(prev, ss)):
            out_n[-1] *= n
            out_s[-1] = list(ss)
        else:
            out_n.append(n)
            out_s.append(list(ss))
    return out_n, [[s[k] for s in out_s] for k in range(len(strides))]


def _groups(n: int, per: int = WG) -> int:
    return -(-n // per)


# -- strided elementwise map --------------------------------------------------------------------------------------
@functools.cache  # generating a source costs more than a launch: once per op and dtypes
def map_source(expr: str, in_dtypes: tuple[DType, ...], out_dtype: DType) -> str:
    n = len(in_dtypes)
    lines = []
    for k, d in enumerate(in_dtypes):
        lines.append(f"@group(0) @binding({k}) var<storage, read> in{k}: array<{wgsl.stype(d)}>;")
    lines.append(f"@group(0) @binding({n}) var<storage, read_write> out: array<{wgsl.stype(out_dtype)}>;")
    lines.append(f"@group(0) @binding({n + 1}) var<storage, read> p: array<i32>;")
    body = "\n".join(lines) + "\n" + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
    body += "  if (i >= p[0]) { return; }\n  let nd = p[1];\n  var rem = i;\n"
    for k in range(n + 1):
        body += f"  var o{k} = p[2 + nd + {k} * (nd + 1)];\n"
    # one dim after merging (contiguous and most broadcast operands): no index division at all
    body += "  if (nd == 1) {\n"
    for k in range(n + 1):
        body += f"    o{k} = o{k} + i * p[4 + {k} * 2];\n"
    body += "  } else {\n"
    body += "  for (var d = nd - 1; d >= 0; d = d - 1) {\n    let len = p[2 + d];\n    let c = rem % len;\n"
    body += "    rem = rem / len;\n"
    for k in range(n + 1):
        body += f"    o{k} = o{k} + c * p[3 + nd + {k} * (nd + 1) + d];\n"
    body += "  }\n  }\n"
    values = {}
    for k, d in enumerate(in_dtypes):
        body += f"  let x{k} = {wgsl.load(d, f'in{k}[o{k}]')};\n"
        values[f"x{k}"] = f"x{k}"
    body += f"  out[o{n}] = {wgsl.store(out_dtype, expr.format(**values))};\n}}\n"
    return _with_library(body, [*in_dtypes, out_dtype])


def run_map(expr: str, ins: list[WArray], out: WArray) -> None:
    """out[...] = expr(ins...) elementwise; every input is already broadcast (a view) to ``out.shape``.

    ``expr`` names the inputs' compute-type values ``{x0}``, ``{x1}`` ... and yields ``out``'s compute type.
    """
    rt = out.rt
    n = out.size
    if n == 0:
        return
    shape, strides = collapse(out.shape, *(h.estrides for h in ins), out.estrides)
    nd = len(shape)
    vals = [n, nd, *shape]
    for h, s in zip([*ins, out], strides):
        vals.append(h.offset)
        vals.extend(s)
    src = map_source(expr, tuple(h.dtype for h in ins), out.dtype)
    prm = _params(rt, vals)
    rt.launch(src, [*(h.buf for h in ins), out.buf, prm.buffer], _groups(n))


# -- reductions ----------------------------------------------------------------------------------------------------
def _reduce_step(op: str, ct: str) -> tuple[str, str]:
    """(initialisation from the first value ``v``, update of ``acc`` by ``v``) for a reduction op."""
    if ct == "bool":
        return "acc = v;", {"sum": "acc = acc || v;", "max": "acc = acc || v;", "prod": "acc = acc && v;",
                            "min": "acc = acc && v;"}[op]
    if op == "sum" and ct == "f32":  # Kahan summation: float32 sums as accurate as PyTorch's pairwise ones
        return ("acc = v; comp = 0.0;",
                "let y = v - comp; let t = acc + y; "
                "comp = select((t - acc) - y, 0.0, is_inf(t) || is_nan(t)); acc = t;")
    if op == "sum":
        return "acc = v;", "acc = acc + v;"
    if op == "prod":
        return "acc = v;", "acc = acc * v;"
    fn = {"max": "f_maximum", "min": "f_minimum"}[op] if ct == "f32" else op
    return "acc = v;", f"acc = {fn}(acc, v);"


@functools.cache
def reduce_source(op: str, dtype: DType, out_dtype: DType) -> str:
    ct = wgsl.ctype(dtype)
    init, step = _reduce_step(op, ct)
    empty_val = {"sum": "0", "prod": "1"}.get(op, "0")
    empty_expr = wgsl.convert(f"i32({empty_val})", "i32", ct)
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            f"@group(0) @binding(1) var<storage, read_write> out: array<{wgsl.stype(out_dtype)}>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n"
            "  let nr = p[1]; let ndo = p[2]; let ndr = p[3]; let chunk = p[5]; let nchunks = p[6];\n"
            "  let oi = i / nchunks; let j0 = (i % nchunks) * chunk; let j1 = min(j0 + chunk, nr);\n"
            "  var base = p[4];\n  var rem = oi;\n"
            "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
            "    let c = rem % p[7 + d]; rem = rem / p[7 + d]; base = base + c * p[7 + ndo + d];\n  }\n"
            f"  var acc: {ct} = {empty_expr};\n"
            + ("  var comp: f32 = 0.0;\n" if ct == "f32" else "")
            + "  for (var j = j0; j < j1; j = j + 1) {\n"
            "    var off = base; var r = j;\n"
            "    for (var d = ndr - 1; d >= 0; d = d - 1) {\n"
            "      let len = p[7 + 2 * ndo + d]; let c = r % len; r = r / len;\n"
            "      off = off + c * p[7 + 2 * ndo + ndr + d];\n    }\n"
            f"    let v = {wgsl.load(dtype, 'inp[off]')};\n"
            f"    if (j == j0) {{ {init} }} else {{ {step} }}\n  }}\n"
            f"  out[i] = {wgsl.store(out_dtype, wgsl.convert('acc', ct, wgsl.ctype(out_dtype)))};\n}}\n")
    return _with_library(body, [dtype, out_dtype])


#: a reduction with fewer outputs than this many invocations, over long rows, runs in two passes
_PARALLEL = 4096
_CHUNK = 256
#: a tree reduction splits rows longer than this into chunks (one workgroup each) and reduces the partials again
_TREE_ROW = 8 * TREE_WG
#: ... into at most about this many workgroups in all
_TREE_GROUPS = 256


def _split_view(h: WArray, dims: tuple[int, ...]) -> tuple[list[int], list[int], list[int], list[int]]:
    keep = [d for d in range(h.ndim) if d not in dims]
    ko, ks = collapse(tuple(h.shape[d] for d in keep), tuple(h.estrides[d] for d in keep))
    ro, rs = collapse(tuple(h.shape[d] for d in dims), tuple(h.estrides[d] for d in dims))
    return ko, ks[0], ro, rs[0]


def reduce(op: str, h: WArray, dims: tuple[int, ...], out_shape: tuple[int, ...], out_dtype: DType) -> WArray:
    """Reduce ``h`` over ``dims`` into a new contiguous array of ``out_shape``.

    Many outputs: one invocation per output. Few outputs over long rows: workgroup trees
    (:mod:`ember_wgpu.reductions`), one workgroup per output or, for rows longer than ``_TREE_ROW``, per chunk of
    a row into a partial array that a second pass reduces."""
    rt = h.rt
    out = empty(rt, out_shape, out_dtype)
    n_out = math.prod(out_shape)
    if n_out == 0:
        return out
    ko, ks, ro, rs = _split_view(h, dims)
    n_red = math.prod(ro)
    tree = use_tree(n_out, n_red, _PARALLEL)
    nchunks = 1
    if tree and n_red > _TREE_ROW:
        # enough workgroups to fill the device, each folding at least _TREE_ROW elements
        nchunks = min(-(-n_red // _TREE_ROW), max(_TREE_GROUPS // n_out, 1))
    elif not tree and n_out < _PARALLEL and n_red >= 4 * _CHUNK:
        # few rows of moderate length: each invocation reduces one chunk of a row, then a second pass
        nchunks = min(-(-n_red // _CHUNK), max(_PARALLEL // n_out, 1))
    chunk = -(-n_red // nchunks) if n_red else 1
    partial = dt.float32 if h.dtype is dt.float16 else h.dtype  # float16 partial sums would round twice
    target = out if nchunks == 1 else empty(rt, (n_out, nchunks), partial)
    prm = _params(rt, [n_out * nchunks, n_red, len(ko), len(ro), h.offset, chunk, nchunks,
                       *ko, *ks, *ro, *rs])
    if tree:
        rt.launch(tree_reduce_source(op, h.dtype, target.dtype), [h.buf, target.buf, prm.buffer],
                  groups_grid(n_out * nchunks))
    else:
        rt.launch(reduce_source(op, h.dtype, target.dtype), [h.buf, target.buf, prm.buffer],
                  _groups(n_out * nchunks))
    if nchunks > 1:
        final = reduce(op, target, (1,), (n_out,), out_dtype)
        return final if final.shape == tuple(out_shape) else final.view(
            tuple(out_shape), contiguous_strides(tuple(out_shape)), 0)
    return out


@functools.cache
def argreduce_source(op: str, dtype: DType) -> str:
    ct = wgsl.ctype(dtype)
    better = "v > best" if op == "argmax" else "v < best"
    if ct == "bool":
        better = "(v && !best)" if op == "argmax" else "(!v && best)"
    if ct == "f32":
        update = ("    if (is_nan(v)) { if (!nan) { nan = true; bi = j; } }\n"
                  f"    else if (!nan && ({better})) {{ best = v; bi = j; }}\n")
    else:
        update = f"    if ({better}) {{ best = v; bi = j; }}\n"
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            "@group(0) @binding(1) var<storage, read_write> out: array<i64>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n"
            "  let nr = p[1]; let ndo = p[2]; let step = p[3];\n"
            "  var base = p[4];\n  var rem = i;\n"
            "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
            "    let c = rem % p[5 + d]; rem = rem / p[5 + d]; base = base + c * p[5 + ndo + d];\n  }\n"
            f"  var best = {wgsl.load(dtype, 'inp[base]')};\n  var bi = 0;\n"
            + ("  var nan = is_nan(best);\n" if ct == "f32" else "")
            + "  for (var j = 1; j < nr; j = j + 1) {\n"
            f"    let v = {wgsl.load(dtype, 'inp[base + j * step]')};\n" + update + "  }\n"
            "  out[i] = i64(bi);\n}\n")
    return _with_library(body, [dtype, dt.int64])


def argreduce(op: str, h: WArray, dim: int, out_shape: tuple[int, ...]) -> WArray:
    """argmax/argmin over one dim of ``h`` (int64 result of ``out_shape``)."""
    rt = h.rt
    out = empty(rt, out_shape, dt.int64)
    n_out = math.prod(out_shape)
    if n_out == 0:
        return out
    keep = [d for d in range(h.ndim) if d != dim]
    ko, ks = collapse(tuple(h.shape[d] for d in keep), tuple(h.estrides[d] for d in keep))
    prm = _params(rt, [n_out, h.shape[dim], len(ko), h.estrides[dim], h.offset, *ko, *ks[0]])
    if use_tree(n_out, h.shape[dim], _PARALLEL):
        rt.launch(tree_argreduce_source(op, h.dtype), [h.buf, out.buf, prm.buffer], groups_grid(n_out))
    else:
        rt.launch(argreduce_source(op, h.dtype), [h.buf, out.buf, prm.buffer], _groups(n_out))
    return out


# -- scans ---------------------------------------------------------------------------------------------------------
@functools.cache
def scan_source(op: str, dtype: DType) -> str:
    ct = wgsl.ctype(dtype)
    if op == "sum" and ct == "f32":
        step = ("let y = v - comp; let t = acc + y; comp = select((t - acc) - y, 0.0, is_inf(t) || is_nan(t)); "
                "acc = t;")
    elif ct == "bool":
        step = "acc = acc || v;" if op == "sum" else "acc = acc && v;"
    else:
        step = "acc = acc + v;" if op == "sum" else "acc = acc * v;"
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            f"@group(0) @binding(1) var<storage, read_write> out: array<{wgsl.stype(dtype)}>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n"
            "  let len = p[1]; let ndo = p[2]; let step = p[3];\n"
            "  var base = p[4];\n  var rem = i;\n"
            "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
            "    let c = rem % p[5 + d]; rem = rem / p[5 + d]; base = base + c * p[5 + ndo + d];\n  }\n"
            f"  var acc = {wgsl.load(dtype, 'inp[base]')};\n"
            + ("  var comp: f32 = 0.0;\n" if ct == "f32" else "")
            + f"  out[i * len] = {wgsl.store(dtype, 'acc')};\n"
            "  for (var j = 1; j < len; j = j + 1) {\n"
            f"    let v = {wgsl.load(dtype, 'inp[base + j * step]')};\n    {step}\n"
            f"    out[i * len + j] = {wgsl.store(dtype, 'acc')};\n  }}\n}}\n")
    return _with_library(body, [dtype])


@functools.cache
def scan_chunks_source(op: str, dtype: DType, pdtype: DType) -> str:
    """The last pass of a chunked scan: one invocation per (line, chunk) scans its chunk, starting from the scanned
    chunk totals ``pre`` (``p`` = [lines * nchunks, len, outer dims, step, offset, chunk, nchunks, outer sizes...,
    outer strides...])."""
    ct = wgsl.ctype(dtype)
    pct = wgsl.ctype(pdtype)
    kahan = op == "sum" and ct == "f32"
    if kahan:
        step = ("let y = v - comp; let t = acc + y; comp = select((t - acc) - y, 0.0, is_inf(t) || is_nan(t)); "
                "acc = t;")
    elif ct == "bool":
        step = "acc = acc || v;" if op == "sum" else "acc = acc && v;"
    else:
        step = "acc = acc + v;" if op == "sum" else "acc = acc * v;"
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            f"@group(0) @binding(1) var<storage, read> pre: array<{wgsl.stype(pdtype)}>;\n"
            f"@group(0) @binding(2) var<storage, read_write> out: array<{wgsl.stype(dtype)}>;\n"
            "@group(0) @binding(3) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n"
            "  let len = p[1]; let ndo = p[2]; let step = p[3]; let chunk = p[5]; let nchunks = p[6];\n"
            "  let line = i / nchunks; let c = i % nchunks;\n"
            "  let j0 = c * chunk; let j1 = min(j0 + chunk, len);\n"
            "  var base = p[4];\n  var rem = line;\n"
            "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
            "    let cc = rem % p[7 + d]; rem = rem / p[7 + d]; base = base + cc * p[7 + ndo + d];\n  }\n"
            f"  var acc = {wgsl.load(dtype, 'inp[base + j0 * step]')};\n"
            + ("  var comp: f32 = 0.0;\n" if kahan else "")
            + "  if (c > 0) {\n"
            f"    let v = acc; acc = {wgsl.convert(wgsl.load(pdtype, 'pre[line * nchunks + c - 1]'), pct, ct)};\n"
            f"    {step}\n  }}\n"
            f"  out[line * len + j0] = {wgsl.store(dtype, 'acc')};\n"
            "  for (var j = j0 + 1; j < j1; j = j + 1) {\n"
            f"    let v = {wgsl.load(dtype, 'inp[base + j * step]')};\n    {step}\n"
            f"    out[line * len + j] = {wgsl.store(dtype, 'acc')};\n  }}\n}}\n")
    return _with_library(body, [dtype, pdtype])


def scan(op: str, h: WArray, dim: int) -> WArray:
    """Inclusive scan along ``dim``; returns a view of a contiguous (outer..., len) array.

    Many lines: one invocation per line. Few long lines: in chunks of ``_CHUNK`` -- the chunk totals (one
    invocation each), their scan along the line (recursively), then each chunk scanned from its predecessor's
    total (one invocation each)."""
    rt = h.rt
    keep = [d for d in range(h.ndim) if d != dim]
    moved = tuple(h.shape[d] for d in keep) + (h.shape[dim],)
    out = empty(rt, moved, h.dtype)
    lines = math.prod(h.shape[d] for d in keep)
    n = h.shape[dim]
    if h.size:
        ko, ks = collapse(tuple(h.shape[d] for d in keep), tuple(h.estrides[d] for d in keep))
        if lines < _PARALLEL and n >= 4 * _CHUNK:
            nchunks = -(-n // _CHUNK)
            pdtype = dt.float32 if h.dtype is dt.float16 else h.dtype  # float16 totals would round twice
            totals = empty(rt, (lines, nchunks), pdtype)
            prm = _params(rt, [lines * nchunks, n, len(ko), 1, h.offset, _CHUNK, nchunks, *ko, *ks[0], n,
                               h.estrides[dim]])
            rt.launch(reduce_source(op, h.dtype, pdtype), [h.buf, totals.buf, prm.buffer],
                      _groups(lines * nchunks))
            pre = scan(op, totals, 1)  # a contiguous (lines, nchunks) view at offset 0
            prm = _params(rt, [lines * nchunks, n, len(ko), h.estrides[dim], h.offset, _CHUNK, nchunks, *ko,
                               *ks[0]])
            rt.launch(scan_chunks_source(op, h.dtype, pdtype), [h.buf, pre.buf, out.buf, prm.buffer],
                      _groups(lines * nchunks))
        else:
            prm = _params(rt, [lines, n, len(ko), h.estrides[dim], h.offset, *ko, *ks[0]])
            rt.launch(scan_source(op, h.dtype), [h.buf, out.buf, prm.buffer], _groups(lines))
    perm = list(range(h.ndim - 1))
    perm.insert(dim, h.ndim - 1)
    return out.view(tuple(out.shape[d] for d in perm), tuple(out.estrides[d] for d in perm), 0)


# -- matmul -------------------------------------------------------------------------------------------------------
def matmul(a: WArray, b: WArray) -> WArray:
    """Batched matmul of (..., M, K) and (..., K, N) views whose batch dims are already broadcast to one shape
    (the kernel autotuned per adapter and shape class: see :mod:`ember_wgpu.matmul`)."""
    from .matmul import matmul as tuned

    return tuned(a, b)


# -- sort ------------------------------------------------------------------------------------------------------------
def sort(h: WArray, dim: int, descending: bool) -> tuple[WArray, WArray]:
    """Stable bitonic sort along ``dim`` (see :mod:`ember_wgpu.sorting`)."""
    from .sorting import sort as bitonic

    return bitonic(h, dim, descending)


# -- gather / scatter through element offsets ------------------------------------------------------------------------
@functools.cache
def gather_source(dtype: DType) -> str:
    s = wgsl.stype(dtype)
    body = (f"@group(0) @binding(0) var<storage, read> src: array<{s}>;\n"
            "@group(0) @binding(1) var<storage, read> offs: array<i32>;\n"
            f"@group(0) @binding(2) var<storage, read_write> out: array<{s}>;\n"
            "@group(0) @binding(3) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n  out[i] = src[offs[i]];\n}\n")
    return _with_library(body, [dtype])


@functools.cache
def scatter_source(dtype: DType) -> str:
    s = wgsl.stype(dtype)
    body = (f"@group(0) @binding(0) var<storage, read> vals: array<{s}>;\n"
            "@group(0) @binding(1) var<storage, read> offs: array<i32>;\n"
            f"@group(0) @binding(2) var<storage, read_write> dst: array<{s}>;\n"
            "@group(0) @binding(3) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n  dst[offs[i]] = vals[i];\n}\n")
    return _with_library(body, [dtype])


def offsets_array(rt: Any, offs: np.ndarray) -> WArray:
    from .array import upload

    return upload(rt, np.ascontiguousarray(offs, dtype=np.int32), dt.int32)


def gather(h: WArray, offs: np.ndarray) -> WArray:
    """A new contiguous array of ``offs.shape`` with ``h.buf``'s elements at the element offsets ``offs``."""
    rt = h.rt
    out = empty(rt, tuple(offs.shape), h.dtype)
    if offs.size:
        o = offsets_array(rt, offs)
        prm = _params(rt, [offs.size])
        rt.launch(gather_source(h.dtype), [h.buf, o.buf, out.buf, prm.buffer], _groups(offs.size))
    return out


def scatter(dst: WArray, offs: np.ndarray, vals: WArray) -> None:
    """``dst.buf[offs[i]] = vals[i]`` for a contiguous ``vals`` of ``offs.shape`` (duplicates: one of them wins)."""
    rt = dst.rt
    if offs.size:
        o = offsets_array(rt, offs)
        prm = _params(rt, [offs.size])
        rt.launch(scatter_source(dst.dtype), [vals.buf, o.buf, dst.buf, prm.buffer], _groups(offs.size))


# -- Philox4x32-10 random numbers ------------------------------------------------------------------------------------
PHILOX = r"""
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
  // 32x32 -> 64-bit product from 16-bit halves (WGSL has no mul_hi)
  let al = a & 0xffffu; let ah = a >> 16u; let bl = b & 0xffffu; let bh = b >> 16u;
  let p0 = al * bl; let p1 = al * bh; let p2 = ah * bl; let p3 = ah * bh;
  let mid = (p0 >> 16u) + (p1 & 0xffffu) + (p2 & 0xffffu);
  return vec2<u32>(p3 + (p1 >> 16u) + (p2 >> 16u) + (mid >> 16u), a * b);
}
fn philox(c0: vec4<u32>, k0: vec2<u32>) -> vec4<u32> {
  var c = c0;
  var k = k0;
  for (var r = 0; r < 10; r = r + 1) {
    let m0 = mulhilo(0xD2511F53u, c.x);
    let m1 = mulhilo(0xCD9E8D57u, c.z);
    c = vec4<u32>(m1.x ^ c.y ^ k.x, m1.y, m0.x ^ c.w ^ k.y, m0.y);
    k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
  }
  return c;
}
"""


@functools.cache
def random_source(kind: str, dtype: DType) -> str:
    """kind: "rand" (uniform [0, 1)), "randn" (standard normal, Box-Muller) or "randint" (low + x mod range)."""
    s = wgsl.stype(dtype)
    if kind == "rand":
        shift, scale = ("21u", "4.8828125e-04") if dtype is dt.float16 else ("8u", "5.9604644775390625e-08")
        vals = [f"f32(r[{k}] >> {shift}) * {scale}" for k in range(4)]
    elif kind == "randn":
        pre = ("  let u1 = (f32(r.x >> 8u) + 1.0) * 5.9604644775390625e-08;\n"
               "  let u2 = f32(r.y >> 8u) * 5.9604644775390625e-08;\n"
               "  let u3 = (f32(r.z >> 8u) + 1.0) * 5.9604644775390625e-08;\n"
               "  let u4 = f32(r.w >> 8u) * 5.9604644775390625e-08;\n"
               "  let ra = sqrt(-2.0 * log(u1)); let rb = sqrt(-2.0 * log(u3));\n")
        vals = ["ra * cos(6.283185307179586 * u2)", "ra * sin(6.283185307179586 * u2)",
                "rb * cos(6.283185307179586 * u4)", "rb * sin(6.283185307179586 * u4)"]
    else:
        ct = wgsl.ctype(dtype)
        if ct == "i64":
            pre = ("  let span = (i64(bitcast<u32>(p[7])) << 32u) | i64(bitcast<u32>(p[6]));\n"
                   "  let low = (i64(p[9]) << 32u) | i64(bitcast<u32>(p[8]));\n"
                   "  let r2 = philox(vec4<u32>(u32(i), bitcast<u32>(p[3]), bitcast<u32>(p[4]), 1u),\n"
                   "                  vec2<u32>(bitcast<u32>(p[1]), bitcast<u32>(p[2])));\n"
                   "  let small = p[7] == 0;\n"
                   "  let w0 = (i64(r.x >> 1u) << 32u) | i64(r.y);\n"
                   "  let w1 = (i64(r.z >> 1u) << 32u) | i64(r.w);\n"
                   "  let w2 = (i64(r2.x >> 1u) << 32u) | i64(r2.y);\n"
                   "  let w3 = (i64(r2.z >> 1u) << 32u) | i64(r2.w);\n")
            # spans below 2**32 take one 32-bit word per value; wider spans take 63 bits (two words)
            vals = [f"low + select(w{k} % span, i64(r[{k}] % bitcast<u32>(p[6])), small)" for k in range(4)]
        else:
            pre = "  let span = bitcast<u32>(p[6]);\n  let low = p[8];\n"
            vals = [f"low + i32(r[{k}] % span)" for k in range(4)]
    if kind == "rand":
        pre = ""
    body = (f"@group(0) @binding(0) var<storage, read_write> out: array<{s}>;\n"
            "@group(0) @binding(1) var<storage, read> p: array<i32>;\n" + PHILOX
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  let n = p[0];\n  if (i * 4 >= n) { return; }\n"
            "  let r = philox(vec4<u32>(u32(i), bitcast<u32>(p[3]), bitcast<u32>(p[4]), bitcast<u32>(p[5])),\n"
            "                 vec2<u32>(bitcast<u32>(p[1]), bitcast<u32>(p[2])));\n" + pre)
    for k in range(4):
        body += f"  if (i * 4 + {k} < n) {{ out[i * 4 + {k}] = {wgsl.store(dtype, vals[k])}; }}\n"
    body += "}\n"
    return _with_library(body, [dtype])


def random(kind: str, rt: Any, shape: tuple[int, ...], dtype: DType, key: int, counter: int,
           low: int = 0, span: int = 0) -> WArray:
    """Fill a new array from Philox4x32-10 with ``key`` (64 bits) at stream position ``counter`` (64 bits)."""
    out = empty(rt, shape, dtype)
    n = out.size
    if n:
        prm = _params(rt, [n, key & 0xFFFFFFFF, key >> 32 & 0xFFFFFFFF, counter & 0xFFFFFFFF,
                           counter >> 32 & 0xFFFFFFFF, 0, span & 0xFFFFFFFF, span >> 32 & 0xFFFFFFFF,
                           low & 0xFFFFFFFF, low >> 32 & 0xFFFFFFFF])
        rt.launch(random_source(kind, dtype), [out.buf, prm.buffer], _groups(-(-n // 4)))
    return out


# -- softmax -------------------------------------------------------------------------------------------------------
@functools.cache
def softmax_source(dtype: DType, log: bool) -> str:
    result = "v - m - ls" if log else "exp(v - m) / s"
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            f"@group(0) @binding(1) var<storage, read_write> out: array<{wgsl.stype(dtype)}>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            + _MAIN.format(wg=WG) + "  " + _FLAT_ID.format(wg=WG) + "\n"
            "  if (i >= p[0]) { return; }\n"
            "  let len = p[1]; let ndo = p[2]; let step = p[3];\n"
            "  var base = p[4];\n  var rem = i;\n"
            "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
            "    let c = rem % p[5 + d]; rem = rem / p[5 + d]; base = base + c * p[5 + ndo + d];\n  }\n"
            "  var m = -f_inf();\n"
            "  for (var j = 0; j < len; j = j + 1) {\n"
            f"    m = f_maximum(m, {wgsl.load(dtype, 'inp[base + j * step]')});\n  }}\n"
            "  var s = 0.0;\n"
            "  for (var j = 0; j < len; j = j + 1) {\n"
            f"    s = s + exp({wgsl.load(dtype, 'inp[base + j * step]')} - m);\n  }}\n"
            "  let ls = log(s);\n"
            "  for (var j = 0; j < len; j = j + 1) {\n"
            f"    let v = {wgsl.load(dtype, 'inp[base + j * step]')};\n"
            f"    out[i * len + j] = {wgsl.store(dtype, result)};\n  }}\n}}\n")
    return _with_library(body, [dtype])


def softmax(h: WArray, dim: int, log: bool) -> WArray:
    """softmax / log_softmax along ``dim`` (one invocation per row: max, sum of exp, write)."""
    rt = h.rt
    keep = [d for d in range(h.ndim) if d != dim]
    moved = tuple(h.shape[d] for d in keep) + (h.shape[dim],)
    out = empty(rt, moved, h.dtype)
    lines = math.prod(h.shape[d] for d in keep)
    if h.size:
        ko, ks = collapse(tuple(h.shape[d] for d in keep), tuple(h.estrides[d] for d in keep))
        prm = _params(rt, [lines, h.shape[dim], len(ko), h.estrides[dim], h.offset, *ko, *ks[0]])
        rt.launch(softmax_source(h.dtype, log), [h.buf, out.buf, prm.buffer], _groups(lines))
    perm = list(range(h.ndim - 1))
    perm.insert(dim, h.ndim - 1)
    return out.view(tuple(out.shape[d] for d in perm), tuple(out.estrides[d] for d in perm), 0)
