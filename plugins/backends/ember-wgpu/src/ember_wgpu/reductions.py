"""Workgroup-tree reductions: sum/prod/max/min and argmax/argmin with one workgroup per output (or per chunk).

The one-invocation-per-output kernels of :mod:`ember_wgpu.kernels` are right when there are many outputs (every
invocation busy, reads coalesced across neighbouring outputs). With few outputs over long rows they leave the
device idle, so here a workgroup of :data:`TREE_WG` invocations shares one row (or one chunk of it): each
invocation folds a strided subsequence (float sums with Kahan compensation), then the workgroup combines the
partial results pairwise in workgroup memory (a tree: log2(TREE_WG) steps separated by barriers). A row longer
than one workgroup should take is split into chunks, each reduced by its own workgroup into a partial array, and a
second pass reduces the partials (:func:`ember_wgpu.kernels.reduce` recurses on them).

argmax/argmin keep (value, index, NaN seen) per invocation and combine them in the tree with the contract's rules:
a NaN wins over any number, and among equal values (or several NaNs) the first occurrence wins.
"""

from __future__ import annotations

import functools

from ember import dtypes as dt
from ember.dtypes import DType

from . import wgsl

#: invocations per reduction workgroup (a power of two)
TREE_WG = 128

_WG_MAIN = ("@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid_u: u32,\n"
            "        @builtin(num_workgroups) nwg: vec3<u32>) {{\n"
            "  let g = i32(wid.x + wid.y * nwg.x);\n  let lid = i32(lid_u);\n")

# the strided row: element j of output oi's row at offset base + (mixed-radix j over the reduced dims)
_ROW_BASE = ("  var base = p[4];\n  var rem = oi;\n"
             "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
             "    let c = rem % p[7 + d]; rem = rem / p[7 + d]; base = base + c * p[7 + ndo + d];\n  }\n")
_ROW_OFF = ("    var off = base; var r = j;\n"
            "    for (var d = ndr - 1; d >= 0; d = d - 1) {\n"
            "      let len = p[7 + 2 * ndo + d]; let c = r % len; r = r / len;\n"
            "      off = off + c * p[7 + 2 * ndo + ndr + d];\n    }\n")


def _shared_type(ct: str) -> str:
    return "u32" if ct == "bool" else ct  # bool is not storable in workgroup memory on every compiler


def _to_shared(ct: str, v: str) -> str:
    return f"select(0u, 1u, {v})" if ct == "bool" else v


def _from_shared(ct: str, v: str) -> str:
    return f"({v} != 0u)" if ct == "bool" else v


def _combine(op: str, ct: str, a: str, b: str) -> str:
    """The reduction of two partial results ``a`` and ``b`` (compute type ``ct``)."""
    if ct == "bool":
        return f"({a} || {b})" if op in ("sum", "max") else f"({a} && {b})"
    if op == "sum":
        return f"({a} + {b})"
    if op == "prod":
        return f"({a} * {b})"
    if ct == "f32":
        return f"{'f_maximum' if op == 'max' else 'f_minimum'}({a}, {b})"
    return f"{op}({a}, {b})"


@functools.cache
def tree_reduce_source(op: str, dtype: DType, out_dtype: DType) -> str:
    """One workgroup per (output, chunk): parameters as the kernels' per-invocation reduction (see
    :func:`ember_wgpu.kernels.reduce`), ``p[0]`` counting workgroups instead of invocations."""
    ct = wgsl.ctype(dtype)
    sh = _shared_type(ct)
    total = _from_shared(ct, "part[0]")
    kahan = op == "sum" and ct == "f32"
    # max/min start from the chunk's first element (idempotent: a duplicate changes nothing); sum/prod from 0/1
    if op in ("max", "min"):
        init = f"  var acc: {ct} = {wgsl.load(dtype, 'inp[first]')};\n"
    else:
        init = f"  var acc: {ct} = {wgsl.convert('i32(' + ('0' if op == 'sum' else '1') + ')', 'i32', ct)};\n"
    if kahan:
        step = ("    let y = v - comp; let t = acc + y; "
                "comp = select((t - acc) - y, 0.0, is_inf(t) || is_nan(t)); acc = t;\n")
    else:
        step = f"    acc = {_combine(op, ct, 'acc', 'v')};\n"
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            f"@group(0) @binding(1) var<storage, read_write> out: array<{wgsl.stype(out_dtype)}>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            f"var<workgroup> part: array<{sh}, {TREE_WG}>;\n"
            + _WG_MAIN.format(wg=TREE_WG)
            + "  if (g >= p[0]) { return; }\n"  # uniform: the whole workgroup leaves together
            "  let nr = p[1]; let ndo = p[2]; let ndr = p[3]; let chunk = p[5]; let nchunks = p[6];\n"
            "  let oi = g / nchunks; let j0 = (g % nchunks) * chunk; let j1 = min(j0 + chunk, nr);\n"
            + _ROW_BASE
            + "  var first = base;\n  { let j = j0;\n" + _ROW_OFF + "    first = off;\n  }\n"
            + init + ("  var comp: f32 = 0.0;\n" if kahan else "")
            + f"  for (var j = j0 + lid; j < j1; j = j + {TREE_WG}) {{\n" + _ROW_OFF
            + f"    let v = {wgsl.load(dtype, 'inp[off]')};\n" + step + "  }\n"
            + f"  part[lid] = {_to_shared(ct, 'acc - comp' if kahan else 'acc')};\n"
            f"  for (var s = {TREE_WG // 2}; s > 0; s = s / 2) {{\n"
            "    workgroupBarrier();\n"
            f"    if (lid < s) {{ part[lid] = "
            f"{_to_shared(ct, _combine(op, ct, _from_shared(ct, 'part[lid]'), _from_shared(ct, 'part[lid + s]')))};"
            " }\n  }\n"
            "  if (lid == 0) {\n"
            f"    out[g] = {wgsl.store(out_dtype, wgsl.convert(total, ct, wgsl.ctype(out_dtype)))};\n  }}\n}}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype, out_dtype])


@functools.cache
def tree_argreduce_source(op: str, dtype: DType) -> str:
    """argmax/argmin, one workgroup per output: ``p`` = [n_out, row length, outer dims, row step, offset,
    outer sizes..., outer strides...] (as the per-invocation kernel)."""
    ct = wgsl.ctype(dtype)
    sh = _shared_type(ct)
    if ct == "bool":
        better = "(vb && !va)" if op == "argmax" else "(!vb && va)"
    else:
        better = "(vb > va)" if op == "argmax" else "(vb < va)"
    nan = "is_nan(v)" if ct == "f32" else "false"
    # (va, ia, na) := the winner of itself and (vb, ib, nb): NaN first, then the better value, then the lower index
    take = ("(nb && (!na || ib < ia)) || (!na && !nb && (" + better + " || (vb == va && ib < ia)))")
    body = (f"@group(0) @binding(0) var<storage, read> inp: array<{wgsl.stype(dtype)}>;\n"
            "@group(0) @binding(1) var<storage, read_write> out: array<i64>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n"
            f"var<workgroup> sv: array<{sh}, {TREE_WG}>;\n"
            f"var<workgroup> si: array<i32, {TREE_WG}>;\n"
            f"var<workgroup> sn: array<u32, {TREE_WG}>;\n"
            f"fn take(va: {ct}, ia: i32, na: bool, vb: {ct}, ib: i32, nb: bool) -> bool {{ return {take}; }}\n"
            + _WG_MAIN.format(wg=TREE_WG)
            + "  if (g >= p[0]) { return; }\n"
            "  let nr = p[1]; let ndo = p[2]; let step = p[3];\n"
            "  var base = p[4];\n  var rem = g;\n"
            "  for (var d = ndo - 1; d >= 0; d = d - 1) {\n"
            "    let c = rem % p[5 + d]; rem = rem / p[5 + d]; base = base + c * p[5 + ndo + d];\n  }\n"
            f"  var best = {wgsl.load(dtype, 'inp[base]')};\n  var bi = 0;\n"
            f"  var bn = {nan.replace('(v)', '(best)')};\n"
            f"  for (var j = lid; j < nr; j = j + {TREE_WG}) {{\n"
            f"    let v = {wgsl.load(dtype, 'inp[base + j * step]')};\n"
            f"    if (take(best, bi, bn, v, j, {nan})) {{ best = v; bi = j; bn = {nan}; }}\n  }}\n"
            f"  sv[lid] = {_to_shared(ct, 'best')}; si[lid] = bi; sn[lid] = select(0u, 1u, bn);\n"
            f"  for (var s = {TREE_WG // 2}; s > 0; s = s / 2) {{\n"
            "    workgroupBarrier();\n"
            "    if (lid < s) {\n"
            f"      if (take({_from_shared(ct, 'sv[lid]')}, si[lid], sn[lid] != 0u, "
            f"{_from_shared(ct, 'sv[lid + s]')}, si[lid + s], sn[lid + s] != 0u)) {{\n"
            "        sv[lid] = sv[lid + s]; si[lid] = si[lid + s]; sn[lid] = sn[lid + s];\n      }\n"
            "    }\n  }\n"
            "  if (lid == 0) { out[g] = i64(si[0]); }\n}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype, dt.int64])


def groups_grid(n: int) -> tuple[int, int, int]:
    """A dispatch grid of ``n`` workgroups (split over y beyond the 65535-per-dimension limit)."""
    gx = min(n, 65535)
    return gx, -(-n // gx), 1


def use_tree(n_out: int, n_red: int, parallel: int) -> bool:
    """Whether a reduction of ``n_out`` rows of ``n_red`` elements should run as workgroup trees: when there are
    too few outputs to keep the device busy with one invocation each and the rows are long enough to share."""
    return n_out < parallel and n_red >= 2 * TREE_WG


__all__ = ["TREE_WG", "groups_grid", "tree_argreduce_source", "tree_reduce_source", "use_tree"]

