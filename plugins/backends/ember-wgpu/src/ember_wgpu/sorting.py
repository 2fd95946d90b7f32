"""Bitonic sort along one dim: O(n log^2 n) work, stable, every line sorted at once.

Each line of length ``len`` is padded to ``P``, the next power of two, with pad elements that order after every
real one. The sort key of an element is (pad, value, original position): values compare with NaN as the largest
(PyTorch), descending sorts reverse the value order only, and equal values keep their original order. Positions
within a line are distinct, so this is a strict total order and the bitonic network, which is not stable on its
own, gives exactly the stable sort's result (values *and* indices, as ``stable=True`` demands).

Kernels (:data:`BLOCK` elements per workgroup in workgroup memory, :data:`SORT_WG` invocations):

* ``local``: loads a block (from the strided input on the first pass, else from the work buffers), runs the
  network stages ``k = k0 .. k1`` whose compare distances ``j`` stay inside the block, and stores the block (to the
  work buffers, or -- on the last pass -- the values and int64 indices of the real elements to the outputs).
  Lines of at most ``BLOCK`` elements are sorted by this one dispatch.
* ``step``: one compare-exchange stage of distance ``j >= BLOCK`` over the work buffers (global memory); for each
  ``k > BLOCK`` the stages ``j = k/2 .. BLOCK`` run as steps, then one ``local`` pass finishes ``j < BLOCK``.
"""

from __future__ import annotations

import functools

from ember import dtypes as dt
from ember.dtypes import DType

from . import wgsl
from .array import WArray, empty
from .reductions import groups_grid

#: invocations per sort workgroup; each handles two elements of a BLOCK
SORT_WG = 256
BLOCK = 2 * SORT_WG


def _order(dtype: DType, descending: bool) -> str:
    """WGSL ``before(va, ia, vb, ib, len)``: whether element (va, ia) goes strictly before (vb, ib)."""
    ct = wgsl.ctype(dtype)
    if ct == "f32":
        lt = "(!is_nan(x) && (is_nan(y) || x < y))"
    elif ct == "bool":
        lt = "(!x && y)"
    else:
        lt = "(x < y)"
    return (f"fn less(x: {ct}, y: {ct}) -> bool {{ return {lt}; }}\n"
            f"fn before(va: {ct}, ia: i32, vb: {ct}, ib: i32, len: i32) -> bool {{\n"
            "  let pa = ia >= len; let pb = ib >= len;\n"
            "  if (pa != pb) { return pb; }\n"
            "  if (pa) { return ia < ib; }\n"
            f"  if (less({'vb, va' if descending else 'va, vb'})) {{ return true; }}\n"
            f"  if (less({'va, vb' if descending else 'vb, va'})) {{ return false; }}\n"
            "  return ia < ib;\n}\n")


def _shared(ct: str) -> str:
    return "u32" if ct == "bool" else ct


def _sh_in(ct: str, v: str) -> str:
    return f"select(0u, 1u, {v})" if ct == "bool" else v


def _sh_out(ct: str, v: str) -> str:
    return f"({v} != 0u)" if ct == "bool" else v


# parameters: [lines, len, P, ndo, step, offset, k0, k1, total, j, outer sizes..., outer strides...]
_HEAD = "  let lines = p[0]; let len = p[1]; let P = p[2]; let total = p[8];\n"


@functools.cache
def local_source(dtype: DType, descending: bool, from_input: bool, to_output: bool) -> str:
    """The in-workgroup pass (see the module docstring)."""
    ct = wgsl.ctype(dtype)
    st = wgsl.stype(dtype)
    binds = []
    if from_input:
        binds.append(f"var<storage, read> inp: array<{st}>;")
    if not (from_input and to_output):
        mode = "read" if to_output else "read_write"
        binds += [f"var<storage, {mode}> wv: array<{st}>;", f"var<storage, {mode}> wi: array<i32>;"]
    if to_output:
        binds += [f"var<storage, read_write> ov: array<{st}>;", "var<storage, read_write> oi: array<i64>;"]
    binds.append("var<storage, read> p: array<i32>;")
    decl = "".join(f"@group(0) @binding({k}) {b}\n" for k, b in enumerate(binds))
    if from_input:
        load = ("    let line = q / P; let pos = q % P;\n"
                "    var v: {ct} = {zero};\n"
                "    if (line < lines && pos < len) {{\n"
                "      var base = p[5]; var rem = line;\n"
                "      for (var d = p[3] - 1; d >= 0; d = d - 1) {{\n"
                "        let c = rem % p[10 + d]; rem = rem / p[10 + d]; base = base + c * p[10 + p[3] + d];\n"
                "      }}\n"
                "      v = {ld};\n    }}\n"
                "    sv[e] = {shv}; si[e] = pos;\n").format(
                    ct=ct, zero=wgsl.convert("i32(0)", "i32", ct), ld=wgsl.load(dtype, "inp[base + pos * p[4]]"),
                    shv=_sh_in(ct, "v"))
    else:
        load = (f"    if (q < total) {{ sv[e] = {_sh_in(ct, wgsl.load(dtype, 'wv[q]'))}; si[e] = wi[q]; }}\n"
                "    else { si[e] = 0x7fffffff; }\n")
    if to_output:
        store = ("    let line = q / P; let pos = q % P;\n"
                 "    if (line < lines && pos < len) {\n"
                 f"      ov[line * len + pos] = {wgsl.store(dtype, _sh_out(ct, 'sv[e]'))};\n"
                 "      oi[line * len + pos] = i64(si[e]);\n    }\n")
    else:
        store = f"    if (q < total) {{ wv[q] = {wgsl.store(dtype, _sh_out(ct, 'sv[e]'))}; wi[q] = si[e]; }}\n"
    body = (decl + f"var<workgroup> sv: array<{_shared(ct)}, {BLOCK}>;\n"
            f"var<workgroup> si: array<i32, {BLOCK}>;\n" + _order(dtype, descending)
            + f"@compute @workgroup_size({SORT_WG})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid_u: u32,\n"
            "        @builtin(num_workgroups) nwg: vec3<u32>) {\n"
            + _HEAD + "  let lid = i32(lid_u);\n"
            f"  let start = i32(wid.x + wid.y * nwg.x) * {BLOCK};\n"
            "  for (var h = 0; h < 2; h = h + 1) {\n"
            f"    let e = lid + h * {SORT_WG}; let q = start + e;\n" + load + "  }\n"
            "  for (var k = p[6]; k <= p[7]; k = k * 2) {\n"
            f"    for (var j = min(k / 2, {BLOCK // 2}); j > 0; j = j / 2) {{\n"
            "      workgroupBarrier();\n"
            "      let a = ((lid & ~(j - 1)) << 1u) | (lid & (j - 1)); let b = a | j;\n"
            "      let asc = (((start + a) & (P - 1)) & k) == 0;\n"
            f"      let va = {_sh_out(ct, 'sv[a]')}; let vb = {_sh_out(ct, 'sv[b]')};\n"
            "      if (before(vb, si[b], va, si[a], len) == asc) {\n"
            "        let ti = si[a]; sv[a] = sv[b]; si[a] = si[b]; sv[b] = " + _sh_in(ct, "va") + "; si[b] = ti;\n"
            "      }\n    }\n  }\n"
            "  workgroupBarrier();\n"
            "  for (var h = 0; h < 2; h = h + 1) {\n"
            f"    let e = lid + h * {SORT_WG}; let q = start + e;\n" + store + "  }\n}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype, dt.int64] if to_output else [dtype])


@functools.cache
def step_source(dtype: DType, descending: bool) -> str:
    """One global compare-exchange stage (k = p[7], j = p[9]) over the work buffers."""
    st = wgsl.stype(dtype)
    body = (f"@group(0) @binding(0) var<storage, read_write> wv: array<{st}>;\n"
            "@group(0) @binding(1) var<storage, read_write> wi: array<i32>;\n"
            "@group(0) @binding(2) var<storage, read> p: array<i32>;\n" + _order(dtype, descending)
            + f"@compute @workgroup_size({SORT_WG})\n"
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {\n"
            + _HEAD + f"  let t = i32(gid.x + gid.y * nwg.x * {SORT_WG}u);\n"
            "  if (t * 2 >= total) { return; }\n"
            "  let k = p[7]; let j = p[9];\n"
            "  let a = ((t & ~(j - 1)) << 1u) | (t & (j - 1)); let b = a | j;\n"
            "  let asc = ((a & (P - 1)) & k) == 0;\n"
            f"  let va = {wgsl.load(dtype, 'wv[a]')}; let vb = {wgsl.load(dtype, 'wv[b]')};\n"
            "  let ia = wi[a]; let ib = wi[b];\n"
            "  if (before(vb, ib, va, ia, len) == asc) {\n"
            f"    wv[a] = {wgsl.store(dtype, 'vb')}; wi[a] = ib; wv[b] = {wgsl.store(dtype, 'va')}; wi[b] = ia;\n"
            "  }\n}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype])


def sort(h: WArray, dim: int, descending: bool) -> tuple[WArray, WArray]:
    """Stable sort of ``h`` along ``dim``: (values, int64 indices), NaN as the largest value."""
    from .kernels import _params, collapse

    rt = h.rt
    keep = [d for d in range(h.ndim) if d != dim]
    moved = tuple(h.shape[d] for d in keep) + (h.shape[dim],)
    vals = empty(rt, moved, h.dtype)
    idx = empty(rt, moved, dt.int64)
    n = h.shape[dim]
    if h.size:
        lines = h.size // n
        P = 1 << max(n - 1, 0).bit_length()
        total = -(-lines * P // BLOCK) * BLOCK
        if total >= 2 ** 31:
            from ember.errors import UnsupportedError

            raise UnsupportedError(f"wgpu.sort: {lines} lines of {n} (padded to {P}) exceed 32-bit indexing "
                                   f"(shape {h.shape}, dim {dim})")
        ko, ks = collapse(tuple(h.shape[d] for d in keep), tuple(h.estrides[d] for d in keep))
        head = [lines, n, P, len(ko), h.estrides[dim], h.offset]
        tail = [total, 0, *ko, *ks[0]]
        grid = groups_grid(total // BLOCK)
        if P <= BLOCK:
            prm = _params(rt, [*head, 2, P, *tail])
            rt.launch(local_source(h.dtype, descending, True, True), [h.buf, vals.buf, idx.buf, prm.buffer], grid)
        else:
            wv = empty(rt, (total,), h.dtype)
            wi = empty(rt, (total,), dt.int32)
            prm = _params(rt, [*head, 2, BLOCK, *tail])
            rt.launch(local_source(h.dtype, descending, True, False), [h.buf, wv.buf, wi.buf, prm.buffer], grid)
            k = 2 * BLOCK
            while k <= P:
                j = k // 2
                while j >= BLOCK:
                    prm = _params(rt, [*head, k, k, total, j, *ko, *ks[0]])
                    rt.launch(step_source(h.dtype, descending), [wv.buf, wi.buf, prm.buffer],
                              -(-(total // 2) // SORT_WG))
                    j //= 2
                prm = _params(rt, [*head, k, k, *tail])
                if k == P:
                    rt.launch(local_source(h.dtype, descending, False, True),
                              [wv.buf, wi.buf, vals.buf, idx.buf, prm.buffer], grid)
                else:
                    rt.launch(local_source(h.dtype, descending, False, False), [wv.buf, wi.buf, prm.buffer], grid)
                k *= 2
    perm = list(range(h.ndim - 1))
    perm.insert(dim, h.ndim - 1)

    def back(x: WArray) -> WArray:
        return x.view(tuple(x.shape[d] for d in perm), tuple(x.estrides[d] for d in perm), 0)

    return back(vals), back(idx)


__all__ = ["BLOCK", "SORT_WG", "sort"]

