"""Batched matmul on WebGPU: a register-strip kernel and a workgroup-tiled kernel, autotuned per adapter.

Two kernel families read A and B through their strides (transposed and broadcast operands need no copy):

* ``strip``: each invocation keeps a ``strip``-wide piece of a row of C in registers and reuses every element of A
  for all of it. No workgroup memory and no barriers -- what CPU drivers (lavapipe runs a barrier as a switch of
  its SIMD loop) and small products like best.
* ``tiled``: a ``tx`` x ``ty`` workgroup computes a ``ty*rm`` x ``tx*rn`` tile of C; per step of ``bk`` along K it
  stages the A and B tiles in workgroup memory (one cooperative load, a barrier) and each invocation accumulates
  ``rm`` x ``rn`` outputs from them -- what GPUs with fast shared memory like best.

Which is fastest depends on the adapter and the shape, so the first product of a shape class (dtype, and M, N, K
rounded up to powers of two) with at least :data:`TUNE_MIN_MACS` multiply-adds times every candidate on the real
operands and keeps the winner in the adapter's :class:`~ember_wgpu.tune.TuneStore` (``tune.json`` under the ember
cache directory, op :data:`TUNE_OP`): later processes read it instead of timing again. A product larger than
:data:`TUNE_BLOCK` is timed on a corner of itself (views of A and B, one batch element), so tuning stays a few
products' time however large the first product is. Smaller products use the 4-wide strip untimed (timing them
would cost more than any choice saves).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from ember import dtypes as dt
from ember.dtypes import DType
from ember.errors import ValueRangeError

from . import array as arr
from . import wgsl
from .array import WArray, empty

TUNE_OP = "matmul.v1"
#: products with fewer multiply-adds run the default kernel untimed
TUNE_MIN_MACS = 1 << 21
DEFAULT: dict[str, Any] = {"kind": "strip", "strip": 4}
#: candidates are timed on at most this (rows, columns, depth) corner of the product, and on one batch element,
#: when the product is larger: on a slow device a huge product would cost minutes per candidate
TUNE_BLOCK = (512, 512, 1024)
#: the candidates timed per shape class: strips of 4 and 8, (tx, ty, rm, rn, bk) tiles of 32x32 to 64x64 outputs
CANDIDATES: tuple[dict[str, Any], ...] = (
    DEFAULT,
    {"kind": "strip", "strip": 8},
    {"kind": "tiled", "tx": 16, "ty": 16, "rm": 2, "rn": 2, "bk": 8},
    {"kind": "tiled", "tx": 8, "ty": 8, "rm": 4, "rn": 4, "bk": 8},
    {"kind": "tiled", "tx": 16, "ty": 16, "rm": 4, "rn": 4, "bk": 8},
)
_STRIP_WG = 64

# parameters: [M, N, K, batch dims, first batch, a offset, b offset, a row/col strides, b row/col strides,
#              batch sizes..., a batch strides..., b batch strides...]
_BATCH = ("  var ao = p[5]; var bo = p[6];\n"
          "  let ars = p[7]; let acs = p[8]; let brs = p[9]; let bcs = p[10];\n"
          "  var rem = batch;\n"
          "  for (var d = nd - 1; d >= 0; d = d - 1) {\n"
          "    let c = rem % p[11 + d]; rem = rem / p[11 + d];\n"
          "    ao = ao + c * p[11 + nd + d]; bo = bo + c * p[11 + 2 * nd + d];\n  }\n")


def _io(dtype: DType) -> tuple[str, Any, Any]:
    """(compute type, load(raw), store(value)): bool multiplies as i32 (a sum of products, then != 0)."""
    if dtype is dt.bool_:
        return "i32", (lambda raw: f"select(0, 1, {raw} != 0u)"), (lambda v: f"select(0u, 1u, {v} != 0)")
    return wgsl.ctype(dtype), (lambda raw: wgsl.load(dtype, raw)), (lambda v: wgsl.store(dtype, v))


def _bindings(dtype: DType) -> str:
    st = wgsl.stype(dtype)
    return (f"@group(0) @binding(0) var<storage, read> a: array<{st}>;\n"
            f"@group(0) @binding(1) var<storage, read> b: array<{st}>;\n"
            f"@group(0) @binding(2) var<storage, read_write> out: array<{st}>;\n"
            "@group(0) @binding(3) var<storage, read> p: array<i32>;\n")


@functools.cache
def strip_source(dtype: DType, strip: int) -> str:
    """The strip kernel: one invocation per ``strip`` consecutive outputs of a row of C."""
    ct, load, store = _io(dtype)
    body = (_bindings(dtype) + f"@compute @workgroup_size({_STRIP_WG})\n"
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {\n"
            "  let M = p[0]; let N = p[1]; let K = p[2]; let nd = p[3];\n"
            f"  let strips = (N + {strip - 1}) / {strip};\n"
            "  let t = i32(gid.x);\n"
            "  if (t >= M * strips) { return; }\n"
            f"  let row = t / strips; let col0 = (t % strips) * {strip};\n"
            "  let batch = i32(gid.y) + p[4];\n" + _BATCH
            # scalar accumulators with constant names stay in registers (see tiled_source); the columns past N of
            # the last strip read clamped or foreign elements of b, never stored
            + "".join(f"  var c{s} = {ct}(0);\n" for s in range(strip))
            + "  let arow = ao + row * ars;\n"
            "  for (var k = 0; k < K; k = k + 1) {\n"
            f"    let av = {load('a[arow + k * acs]')};\n"
            "    let bk = bo + k * brs + col0 * bcs;\n"
            + "".join(f"    c{s} = c{s} + av * {load(f'b[bk + {s} * bcs]')};\n" for s in range(strip))
            + "  }\n"
            "  let obase = batch * M * N + row * N + col0;\n"
            + "".join(f"  if (col0 + {s} < N) {{ out[obase + {s}] = {store(f'c{s}')}; }}\n" for s in range(strip))
            + "}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype])


@functools.cache
def tiled_source(dtype: DType, tx: int, ty: int, rm: int, rn: int, bk: int) -> str:
    """The tiled kernel: a ``tx`` x ``ty`` workgroup per ``ty*rm`` x ``tx*rn`` tile of C, K in steps of ``bk``."""
    ct, load, store = _io(dtype)
    bm, bn, nt = ty * rm, tx * rn, tx * ty
    zero = f"{ct}(0)"
    body = (_bindings(dtype)
            + f"var<workgroup> As: array<{ct}, {bk * bm}>;\nvar<workgroup> Bs: array<{ct}, {bk * bn}>;\n"
            f"@compute @workgroup_size({tx}, {ty})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {\n"
            "  let M = p[0]; let N = p[1]; let K = p[2]; let nd = p[3];\n"
            "  let batch = i32(wid.z) + p[4];\n" + _BATCH
            + f"  let tc = i32(lid.x); let tr = i32(lid.y); let tid = tr * {tx} + tc;\n"
            f"  let row0 = i32(wid.y) * {bm}; let col0 = i32(wid.x) * {bn};\n"
            # the accumulators are scalars, not an array: constant names keep them in registers (a dynamically
            # indexed array lives in memory on CPU drivers, and costs registers on some GPU compilers)
            + "".join(f"  var c{i}_{j} = {zero};\n" for i in range(rm) for j in range(rn))
            + f"  for (var k0 = 0; k0 < K; k0 = k0 + {bk}) {{\n"
            f"    for (var e = tid; e < {bm * bk}; e = e + {nt}) {{\n"
            f"      let r = e / {bk}; let kk = e % {bk}; let gr = row0 + r; let gk = k0 + kk;\n"
            f"      var v = {zero};\n"
            f"      if (gr < M && gk < K) {{ v = {load('a[ao + gr * ars + gk * acs]')}; }}\n"
            f"      As[kk * {bm} + r] = v;\n    }}\n"
            f"    for (var e = tid; e < {bk * bn}; e = e + {nt}) {{\n"
            f"      let kk = e / {bn}; let c = e % {bn}; let gc = col0 + c; let gk = k0 + kk;\n"
            f"      var v = {zero};\n"
            f"      if (gc < N && gk < K) {{ v = {load('b[bo + gk * brs + gc * bcs]')}; }}\n"
            f"      Bs[kk * {bn} + c] = v;\n    }}\n"
            "    workgroupBarrier();\n"
            f"    for (var kk = 0; kk < {bk}; kk = kk + 1) {{\n"
            + "".join(f"      let a{i} = As[kk * {bm} + tr + {i * ty}];\n" for i in range(rm))
            + "".join(f"      let b{j} = Bs[kk * {bn} + tc + {j * tx}];\n" for j in range(rn))
            + "".join(f"      c{i}_{j} = c{i}_{j} + a{i} * b{j};\n" for i in range(rm) for j in range(rn))
            + "    }\n    workgroupBarrier();\n  }\n"
            "  let obase = batch * M * N;\n"
            + "".join(f"  if (row0 + tr + {i * ty} < M && col0 + tc + {j * tx} < N) {{ "
                      f"out[obase + (row0 + tr + {i * ty}) * N + col0 + tc + {j * tx}] = {store(f'c{i}_{j}')}; }}\n"
                      for i in range(rm) for j in range(rn))
            + "}\n")
    from .kernels import _with_library

    return _with_library(body, [dtype])


def _launch(cfg: dict[str, Any], a: WArray, b: WArray, out: WArray) -> None:
    """Record the product ``out = a @ b`` with kernel configuration ``cfg`` (batch dims already broadcast)."""
    from .kernels import _params

    rt = a.rt
    batch = a.shape[:-2]
    M, K = a.shape[-2:]
    N = b.shape[-1]
    nb = math.prod(batch)
    kind = cfg.get("kind")
    if kind == "strip":
        src = _source(cfg, a.dtype)
        gx = -(-(M * -(-N // int(cfg["strip"]))) // _STRIP_WG)
    elif kind == "tiled":
        src = _source(cfg, a.dtype)
        gx, gy = -(-N // (int(cfg["tx"]) * int(cfg["rn"]))), -(-M // (int(cfg["ty"]) * int(cfg["rm"])))
        if gx > 65535 or gy > 65535:
            raise ValueRangeError(f"wgpu.matmul: {M}x{N} output needs more than 65535 tiles per dimension")
    else:
        raise ValueRangeError(f"wgpu.matmul: unknown kernel configuration {cfg!r}")
    if kind == "strip" and gx > 65535:
        raise ValueRangeError(f"wgpu.matmul: {M}x{N} output needs more than 65535 workgroups")
    start = 0
    while start < nb:
        count = min(nb - start, 65535)
        prm = _params(rt, [M, N, K, len(batch), start, a.offset, b.offset, a.estrides[-2], a.estrides[-1],
                           b.estrides[-2], b.estrides[-1], *batch, *a.estrides[:-2], *b.estrides[:-2]])
        grid = (gx, count, 1) if kind == "strip" else (gx, gy, count)
        rt.launch(src, [a.buf, b.buf, out.buf, prm.buffer], grid)
        start += count


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def shape_key(dtype: DType, M: int, N: int, K: int, nb: int) -> str:
    """The tune store's key of a product: dtype and M, N, K, batch rounded up to powers of two."""
    return f"{dtype.name}|m{_pow2(M)}|n{_pow2(N)}|k{_pow2(K)}|b{_pow2(nb)}"


def _source(cfg: dict[str, Any], dtype: DType) -> str:
    if cfg.get("kind") == "strip":
        return strip_source(dtype, int(cfg["strip"]))
    return tiled_source(dtype, *(int(cfg[n]) for n in ("tx", "ty", "rm", "rn", "bk")))


def _timer(a: WArray, b: WArray, out: WArray) -> Any:
    """run(cfg) for TuneStore.tune: compile the candidate's pipeline, then time one product (a slow device runs a
    large product for seconds; one run per candidate keeps a cold tune to about the candidates' total time)."""
    def run(cfg: dict[str, Any]) -> float:
        a.rt.pipeline(_source(cfg, a.dtype))
        a.rt.sync()
        t = time.perf_counter()
        _launch(cfg, a, b, out)
        a.rt.sync()
        return time.perf_counter() - t

    return run


def choose(a: WArray, b: WArray, out: WArray) -> dict[str, Any]:
    """The kernel configuration for ``a @ b`` on this adapter (stored, tuned now, or the untuned default)."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    nb = math.prod(a.shape[:-2])
    if M * N * K * nb < TUNE_MIN_MACS:
        return DEFAULT
    cands = [c for c in CANDIDATES if c["kind"] == "strip"
             or (-(-N // (c["tx"] * c["rn"])) <= 65535 and -(-M // (c["ty"] * c["rm"])) <= 65535)]
    bm, bn, bk = TUNE_BLOCK
    if M * N * K * nb > bm * bn * bk:  # time a corner of the product (views: no copy)
        m, n, k = min(M, bm), min(N, bn), min(K, bk)
        lead: tuple[Any, ...] = (0,) * (a.ndim - 2) if nb * m * n * k > bm * bn * bk else (slice(None),) * (a.ndim - 2)
        a = arr.basic_index(a, (*lead, slice(0, m), slice(0, k)))
        b = arr.basic_index(b, (*lead, slice(0, k), slice(0, n)))
        out = empty(a.rt, (*a.shape[:-1], n), a.dtype)
    return a.rt.tune.tune(TUNE_OP, shape_key(a.dtype, M, N, K, nb), cands, _timer(a, b, out))


def matmul(a: WArray, b: WArray, config: dict[str, Any] | None = None) -> WArray:
    """Batched matmul of (..., M, K) and (..., K, N) views whose batch dims are already broadcast to one shape.

    ``config``: None to use the tuned kernel (the normal case), or one of :data:`CANDIDATES` to force it."""
    from .kernels import run_map

    rt = a.rt
    batch = a.shape[:-2]
    M, K = a.shape[-2:]
    N = b.shape[-1]
    out = empty(rt, (*batch, M, N), a.dtype)
    if out.size == 0:
        return out
    if K == 0:
        run_map(wgsl.convert("i32(0)", "i32", wgsl.ctype(a.dtype)), [], out)
        return out
    _launch(choose(a, b, out) if config is None else config, a, b, out)
    return out


__all__ = ["CANDIDATES", "DEFAULT", "TUNE_MIN_MACS", "TUNE_OP", "choose", "matmul", "shape_key"]
