"""GEMM kernel generators (moved from ember-opencl): ``simple`` (a work-item per element of C), ``tiled``
(local-memory tiles with vector loads of width ``vw``; CUDA/HIP use ``vw == 1``, see :attr:`.Dialect.vectors`) and
``direct`` (register tiles for CPU runtimes). Every kernel reads A and B through element strides (transposed views
and broadcast batches are never copied) and computes ``C = alpha * A @ B + beta * C`` in the accumulation type of
:data:`_ACC` (integers wrap like numpy's matmul). Sources are in the shared vocabulary (:mod:`.dialect`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.dtypes import DType

from .ctypes_ import CType, ctype, header

# accumulation type per storage dtype: (C name, numpy type of a kernel argument holding one, bits if integer)
_ACC: dict[DType, tuple[str, type, int]] = {
    dt.float32: ("float", np.float32, 0),
    dt.float64: ("double", np.float64, 0),
    dt.float16: ("float", np.float32, 0),
    dt.bfloat16: ("float", np.float32, 0),
    dt.bool_: ("uint", np.uint32, 32),
    dt.uint8: ("uint", np.uint32, 32),
    dt.int8: ("uint", np.uint32, 32),
    dt.int16: ("uint", np.uint32, 32),
    dt.int32: ("uint", np.uint32, 32),
    dt.int64: ("ulong", np.uint64, 64),
}



# Every kernel takes the same arguments: (buffer, element offset, batch strides b1/b2, matrix strides) per operand.
_ARGS = ("__global const {S}* A, long a_off, long sa1, long sa2, long sam, long sak, "
         "__global const {S}* B, long b_off, long sb1, long sb2, long sbk, long sbn, "
         "__global {S}* C, long c_off, long sc1, long sc2, long scm, long scn, "
         "int M, int N, int K, int nb2, int bz0, {ACC} alpha, {ACC} beta")



def _acc(dtype: DType) -> str:
    return _ACC[dtype][0]



def _load(t: CType, ptr: str, idx: str) -> str:
    """A scalar of t from ptr[idx], converted to the accumulation type."""
    return f"(({_acc(t.dtype)})({t.load(ptr, idx)}))"



def _vload(t: CType, n: int, ptr: str, idx: str) -> str:
    """n consecutive elements from ptr + idx as an accumulation-type vector (element alignment suffices)."""
    if n == 1:
        return _load(t, ptr, idx)
    acc = _acc(t.dtype)
    if t.dtype is dt.float16:
        return f"vload_half{n}(0, {ptr} + {idx})"
    if t.dtype is dt.bfloat16:
        return f"as_float{n}(convert_uint{n}(vload{n}(0, {ptr} + {idx})) << 16)"
    if t.storage == acc:
        return f"vload{n}(0, {ptr} + {idx})"
    return f"convert_{acc}{n}(vload{n}(0, {ptr} + {idx}))"



def _vstore(t: CType, n: int, value: str, ptr: str, idx: str) -> str | None:
    """A vector store of n accumulation-type values at ptr + idx, or None for dtypes stored element by element."""
    if t.dtype is dt.float16:
        return f"vstore_half{n}_rte({value}, 0, {ptr} + {idx})"
    if t.dtype in (dt.float32, dt.float64):
        return f"vstore{n}({value}, 0, {ptr} + {idx})"
    return None



def _comp(v: str, e: int, n: int) -> str:
    return v if n == 1 else f"{v}.s{e:x}"



def _vec(acc: str, n: int) -> str:
    return acc if n == 1 else f"{acc}{n}"



def _hsum(v: str, n: int) -> str:
    """The sum of the n lanes of vector expression v (a pairwise tree)."""
    while n > 1:
        v = f"(({v}).lo + ({v}).hi)" if n > 2 else f"(({v}).x + ({v}).y)"
        n //= 2
    return v



def _prologue(batch_from: str) -> list[str]:
    return [f"    const int bz = bz0 + {batch_from};",
            "    const int b1 = bz / nb2, b2 = bz - b1 * nb2;",
            "    const long pa = a_off + b1 * sa1 + b2 * sa2;",
            "    const long pb = b_off + b1 * sb1 + b2 * sb2;",
            "    const long pc = c_off + b1 * sc1 + b2 * sc2;"]



def _store(t: CType, row: str, col: str, value: str, indent: str) -> list[str]:
    """C[row, col] = alpha * value + beta * C[row, col] (C is not read when beta == 0: it may hold NaN)."""
    acc = _acc(t.dtype)
    return [f"{indent}{{ const long ci = pc + (long)({row}) * scm + (long)({col}) * scn;",
            f"{indent}  {acc} r = alpha * ({value});",
            f"{indent}  if (beta != ({acc})0) r += beta * {_load(t, 'C', 'ci')};",
            f"{indent}  {t.store('C', 'ci', 'r')}; }}"]



def _kernel_head(name: str, t: CType, local: tuple[int, int] | None) -> list[str]:
    attr = f"__attribute__((reqd_work_group_size({local[0]}, {local[1]}, 1)))\n" if local else ""
    return [f"__kernel {attr}void {name}({_ARGS.format(S=t.storage, ACC=_acc(t.dtype))}) {{"]



_simple_sources: dict[DType, str] = {}



def simple_source(dtype: DType) -> str:
    """The ``simple`` kernel ``ember_mm_simple``: global size (N, M, batch), any local size."""
    src = _simple_sources.get(dtype)
    if src is None:
        t = ctype(dtype)
        lines = [*_kernel_head("ember_mm_simple", t, None),
                 "    const int n = get_global_id(0), m = get_global_id(1);",
                 "    if (n >= N || m >= M) return;",
                 *_prologue("get_global_id(2)"),
                 "    const long ra = pa + (long)m * sam, rb = pb + (long)n * sbn;",
                 f"    {_acc(dtype)} s = 0;",
                 "    for (int k = 0; k < K; ++k)",
                 f"        s += {_load(t, 'A', 'ra + k * sak')} * {_load(t, 'B', 'rb + k * sbk')};",
                 *_store(t, "m", "n", "s", "    "),
                 "}"]
        src = _simple_sources[dtype] = header(t) + "\n".join(lines) + "\n"
    return src



@dataclass(frozen=True)
class Tile:
    """Compile-time parameters of one ``tiled`` kernel (a tuning candidate)."""

    tm: int  # rows of C per work-group
    tn: int  # columns of C per work-group
    tk: int  # K step staged in local memory
    wm: int  # rows per work-item (strided by TPY)
    wn: int  # columns per work-item (strided by TPX)
    vw: int  # vector width of global loads (divides tm, tn and tk)

    @property
    def tpx(self) -> int:
        return self.tn // self.wn

    @property
    def tpy(self) -> int:
        return self.tm // self.wm

    @property
    def threads(self) -> int:
        return self.tpx * self.tpy

    def local_bytes(self, itemsize: int) -> int:
        return self.tk * (self.tm + self.tn + 2) * itemsize  # one padding column per tile: no bank conflicts

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "tiled", "tm": self.tm, "tn": self.tn, "tk": self.tk, "wm": self.wm, "wn": self.wn,
                "vw": self.vw}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tile:
        return cls(int(d["tm"]), int(d["tn"]), int(d["tk"]), int(d["wm"]), int(d["wn"]), int(d["vw"]))



def _tile_loader(t: CType, tile: Tile, which: str, layout: str) -> list[str]:
    """Statements that copy one K step of A (TM x TK) or B (TK x TN) into local memory (element (r, kk) of the
    tile goes to ``dst[kk * ld + r]``): vector loads when the tile is inside the matrix, checked scalar loads with
    zero fill at the edges.

    layout names the operand's unit-stride dim: A "k" (rows contiguous) or "m" (a transposed view); B "n" (rows
    contiguous) or "k" (transposed); "g" for neither (scalar strided loads).
    """
    acc = _acc(t.dtype)
    if which == "A":
        ptr, base, outer, n_outer, lim, dst, ld, s_outer, s_k = "A", "pa", "m0", tile.tm, "M", "As", "LDA", "sam", "sak"
    else:
        ptr, base, outer, n_outer, lim, dst, ld, s_outer, s_k = "B", "pb", "n0", tile.tn, "N", "Bs", "LDB", "sbn", "sbk"
    tk = tile.tk
    vw = 1 if layout == "g" else tile.vw
    if layout == "k":  # a chunk is vw elements of one row (A) / column (B) along K: transpose into local memory
        per = tk // vw
        nch = n_outer * per
        idx = f"const int r = c / {per}, kk = (c - r * {per}) * {vw};"
        row = f"{base} + (long)({outer} + r) * {s_outer}"
        fast = [f"const {_vec(acc, vw)} v = {_vload(t, vw, ptr, f'{row} + (k0 + kk)')};"]
        fast += [f"{dst}[(kk + {e}) * {ld} + r] = {_comp('v', e, vw)};" for e in range(vw)]
        edge = [f"{dst}[(kk + {e}) * {ld} + r] = ({outer} + r < {lim} && k0 + kk + {e} < K) ? "
                f"{_load(t, ptr, f'{row} + (k0 + kk + {e})')} : ({acc})0;" for e in range(vw)]
    else:  # a chunk is vw elements along M (A) / N (B) at one k: stored as they are
        per = n_outer // vw
        nch = tk * per
        idx = f"const int kk = c / {per}, r = (c - kk * {per}) * {vw};"
        scale = f" * {s_outer}" if layout == "g" else ""
        col = f"(long)(k0 + kk) * {s_k}"
        if vw == 1:
            fast = [f"{dst}[kk * {ld} + r] = {_load(t, ptr, f'{base} + (long)({outer} + r){scale} + {col}')};"]
        else:
            fast = [f"vstore{vw}({_vload(t, vw, ptr, f'{base} + {outer} + r + {col}')}, 0, {dst} + kk * {ld} + r);"]
        edge = [f"{dst}[kk * {ld} + r + {e}] = ({outer} + r + {e} < {lim} && k0 + kk < K) ? "
                f"{_load(t, ptr, f'{base} + (long)({outer} + r + {e}){scale} + {col}')} : ({acc})0;"
                for e in range(vw)]
    loop = f"for (int c = tid; c < {nch}; c += {tile.threads}) {{ {idx}"
    return [f"        if ({outer} + {n_outer} <= {lim} && k0 + {tk} <= K) {{",
            f"            {loop}", *[f"                {s}" for s in fast], "            }",
            "        } else {",
            f"            {loop}", *[f"                {s}" for s in edge], "            }",
            "        }"]



_tiled_sources: dict[tuple[DType, str, str, Tile], str] = {}



def tiled_source(dtype: DType, la: str, lb: str, tile: Tile) -> str:
    """The ``tiled`` kernel ``ember_mm_tiled`` for dtype, operand layouts (see :func:`_tile_loader`) and tile.

    Global size (ceil(N/TN) * TPX, ceil(M/TM) * TPY, batch), local size (TPX, TPY, 1).
    """
    key = (dtype, la, lb, tile)
    src = _tiled_sources.get(key)
    if src is not None:
        return src
    t = ctype(dtype)
    acc = _acc(dtype)
    tm, tn, tk, wm, wn, tpx, tpy = tile.tm, tile.tn, tile.tk, tile.wm, tile.wn, tile.tpx, tile.tpy
    pairs = [(i, j) for i in range(wm) for j in range(wn)]
    lines = [f"#define LDA {tm + 1}", f"#define LDB {tn + 1}",
             *_kernel_head("ember_mm_tiled", t, (tpx, tpy)),
             f"    __local {acc} As[{tk} * LDA];",
             f"    __local {acc} Bs[{tk} * LDB];",
             f"    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * {tpx} + tx;",
             f"    const int m0 = get_group_id(1) * {tm}, n0 = get_group_id(0) * {tn};",
             *_prologue("get_group_id(2)"),
             *[f"    {acc} " + ", ".join(f"acc{i}_{j} = 0" for j in range(wn)) + ";" for i in range(wm)],
             f"    for (int k0 = 0; k0 < K; k0 += {tk}) {{",
             *_tile_loader(t, tile, "A", la),
             *_tile_loader(t, tile, "B", lb),
             "        barrier(CLK_LOCAL_MEM_FENCE);",
             f"        for (int kk = 0; kk < {tk}; ++kk) {{",
             *[f"            const {acc} a{i} = As[kk * LDA + ty + {i * tpy}];" for i in range(wm)],
             *[f"            const {acc} b{j} = Bs[kk * LDB + tx + {j * tpx}];" for j in range(wn)],
             *[f"            acc{i}_{j} += a{i} * b{j};" for i, j in pairs],
             "        }",
             "        barrier(CLK_LOCAL_MEM_FENCE);",
             "    }"]
    for i, j in pairs:
        row, col = f"m0 + ty + {i * tpy}", f"n0 + tx + {j * tpx}"
        lines.append(f"    if ({row} < M && {col} < N)")
        lines += _store(t, row, col, f"acc{i}_{j}", "        ")
    lines.append("}")
    src = _tiled_sources[key] = header(t) + "\n".join(lines) + "\n"
    return src



@dataclass(frozen=True)
class Direct:
    """Compile-time parameters of one ``direct`` kernel (a tuning candidate).

    ``vk == 0``: outer-product form, a work-item's WN adjacent columns form one vector. ``vk > 0``: dot form (A and
    B both unit-stride along K): WM x WN vector accumulators of vk lanes along K.
    """

    wm: int  # rows per work-item
    wn: int  # columns per work-item
    lx: int  # work-group shape: work-items along N, along M
    ly: int
    vk: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "direct", "wm": self.wm, "wn": self.wn, "lx": self.lx, "ly": self.ly, "vk": self.vk}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Direct:
        return cls(int(d["wm"]), int(d["wn"]), int(d["lx"]), int(d["ly"]), int(d.get("vk", 0)))



_direct_sources: dict[tuple[DType, str, str, Direct], str] = {}



def direct_source(dtype: DType, la: str, lb: str, cfg: Direct) -> str:
    """The ``direct`` kernel ``ember_mm_direct`` for dtype, operand layouts and cfg (see :class:`Direct`; the dot
    form needs layouts ("k", "k")).

    Global size (ceil(N/WN) rounded up to LX, ceil(M/WM) rounded up to LY, batch), local size (LX, LY, 1).
    """
    key = (dtype, la, lb, cfg)
    src = _direct_sources.get(key)
    if src is None:
        t = ctype(dtype)
        body = _dot_body(t, cfg) if cfg.vk else _outer_body(t, la, lb, cfg)
        lines = [*_kernel_head("ember_mm_direct", t, (cfg.lx, cfg.ly)),
                 f"    const int n = get_global_id(0) * {cfg.wn}, m = get_global_id(1) * {cfg.wm};",
                 "    if (n >= N || m >= M) return;",
                 *_prologue("get_global_id(2)"),
                 # clamped row/column starts: edge work-items re-read the last row/column, never past it
                 *[f"    const long ra{i} = pa + (long)min(m + {i}, M - 1) * sam;" for i in range(cfg.wm)],
                 *[f"    const long cb{j} = pb + (long)min(n + {j}, N - 1) * sbn;" for j in range(cfg.wn)],
                 *body, "}"]
        src = _direct_sources[key] = header(t) + "\n".join(lines) + "\n"
    return src



def _outer_body(t: CType, la: str, lb: str, cfg: Direct) -> list[str]:
    acc = _acc(t.dtype)
    wm, wn = cfg.wm, cfg.wn
    vt = _vec(acc, wn)
    vec_a = la == "m" and wm in (2, 4, 8, 16)
    ka = "k" if la == "k" else "k * sak"
    kb = "k" if lb == "k" else "k * sbk"

    def step(fast: bool) -> list[str]:
        if fast and lb == "n":
            out = [f"        const {vt} bv = {_vload(t, wn, 'B', 'pb + k * sbk + n')};"]
        else:
            parts = ", ".join(_load(t, "B", f"cb{j} + {kb}") for j in range(wn))
            out = [f"        const {vt} bv = {parts if wn == 1 else f'({vt})({parts})'};"]
        if fast and vec_a:
            out.append(f"        const {_vec(acc, wm)} av = {_vload(t, wm, 'A', 'pa + m + k * sak')};")
            out += [f"        acc{i} += av.s{i:x} * bv;" for i in range(wm)]
        else:
            out += [f"        acc{i} += {_load(t, 'A', f'ra{i} + {ka}')} * bv;" for i in range(wm)]
        return out

    lines = [f"    {vt} acc{i} = ({vt})0;" for i in range(wm)]
    fast_cond = " && ".join(([f"n + {wn} <= N"] if lb == "n" else []) + ([f"m + {wm} <= M"] if vec_a else []))
    if fast_cond:  # interior work-items: vector loads; edge ones: clamped scalar loads
        lines += [f"    if ({fast_cond}) {{", "      for (long k = 0; k < K; ++k) {", *step(True), "      }",
                  "    } else {", "      for (long k = 0; k < K; ++k) {", *step(False), "      }", "    }"]
    else:
        lines += ["    for (long k = 0; k < K; ++k) {", *step(False), "    }"]
    vs = _vstore(t, wn, "r", "C", "ci") if wn > 1 else None
    for i in range(wm):
        lines += [f"    if (m + {i} < M) {{", f"      const long ci = pc + (long)(m + {i}) * scm + (long)n * scn;"]
        if vs is not None:
            lines += [f"      if (n + {wn} <= N && scn == 1) {{",
                      f"        {vt} r = alpha * acc{i};",
                      f"        if (beta != ({acc})0) r += beta * {_vload(t, wn, 'C', 'ci')};",
                      f"        {vs};",
                      "      } else {"]
        if wn == 1:
            lines += _store(t, f"m + {i}", "n", f"acc{i}", "        ")
        else:  # edge columns or strided C: a loop, not WN unrolled copies of the store (halves JIT time)
            lines += [f"        const {acc}* ai = (const {acc}*)&acc{i};",
                      f"        for (int j = 0; j < min({wn}, N - n); ++j)",
                      *_store(t, f"m + {i}", "n + j", "ai[j]", "          ")]
        if vs is not None:
            lines.append("      }")
        lines.append("    }")
    return lines



def _dot_body(t: CType, cfg: Direct) -> list[str]:
    acc = _acc(t.dtype)
    wm, wn, vk = cfg.wm, cfg.wn, cfg.vk
    vt = _vec(acc, vk)
    pairs = [(i, j) for i in range(wm) for j in range(wn)]
    lines = [*[f"    {vt} v{i}_{j} = ({vt})0;" for i, j in pairs],
             "    int k = 0;",
             f"    for (; k + {vk} <= K; k += {vk}) {{",
             *[f"        const {vt} b{j} = {_vload(t, vk, 'B', f'cb{j} + k')};" for j in range(wn)],
             *[f"        const {vt} a{i} = {_vload(t, vk, 'A', f'ra{i} + k')};" for i in range(wm)],
             *[f"        v{i}_{j} += a{i} * b{j};" for i, j in pairs],
             "    }",
             *[f"    {acc} s{i}_{j} = {_hsum(f'v{i}_{j}', vk)};" for i, j in pairs],
             "    for (; k < K; ++k) {",  # the K % vk tail
             *[f"        const {acc} b{j} = {_load(t, 'B', f'cb{j} + k')};" for j in range(wn)],
             *[f"        const {acc} a{i} = {_load(t, 'A', f'ra{i} + k')};" for i in range(wm)],
             *[f"        s{i}_{j} += a{i} * b{j};" for i, j in pairs],
             "    }"]
    for i, j in pairs:
        lines.append(f"    if (m + {i} < M && n + {j} < N)")
        lines += _store(t, f"m + {i}", f"n + {j}", f"s{i}_{j}", "        ")
    return lines
