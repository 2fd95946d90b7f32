"""Matrix products on OpenCL: numpy.matmul semantics over an autotuned GEMM (:func:`matmul`, :func:`gemm`).

Three kernel families serve every dtype, operand layout and batch pattern; all read A and B through their element
strides, so transposed views (``x @ w.T``), broadcast batches (stride 0) and slices are never copied (one exception,
below: the padded copy of a cache-aliasing B, a tuning candidate that must win on time to be used):

* ``simple``: one work-item per element of C, a plain loop over K. The safe fallback (always a tuning candidate)
  and the kernel of small products, where tuning would cost more than it saves.
* ``tiled`` (GPUs and accelerators): a work-group computes a TM x TN tile of C. Each K step of TK copies the A and
  B tiles into local memory with vector loads of VW elements along whichever dim of the operand has unit stride
  (scalar strided loads otherwise; zero fill past the edges, so M, N, K need no padding), converting them to the
  accumulation type once; each work-item then accumulates a WM x WN register tile at columns tx, tx + TPX, ...
  (conflict-free local reads, coalesced stores).
* ``direct`` (CPU runtimes such as PoCL): a work-item accumulates a WM x WN register tile over all of K straight
  from global memory. On a CPU, "local memory" is ordinary cached memory and every barrier splits the kernel into
  work-item loops with the accumulators spilled between them; measured on PoCL, the local-memory kernel was
  1.5-3x slower than these register tiles and took several times longer to JIT, so CPUs get register tiles and
  let the caches stage the operands.
  Outer-product form: a work-item's WN columns are one SIMD vector (B read along N with vector loads, A
  broadcast; A also vector-loaded when it is transposed). Dot form, for A and B both contiguous along K (the
  Linear layer's ``x @ w.T``): WM x WN vector accumulators of VK lanes along K, summed at the end. Edge
  work-items clamp their rows/columns (valid reads, masked stores) instead of padding. When B's row stride is a
  multiple of 4 KiB (a 1024-wide float32 matrix) every row falls into the same cache sets; for such B the CPU
  candidates are offered twice, once reading a copy of B with a padded row stride (one O(K*N) copy).

Tile sizes, work-group shape and vector widths are compile-time constants (one program per candidate). The first
time a (shape class, device) is met, :meth:`TuneStore.tune <ember_opencl.compiler.TuneStore.tune>` times a few
candidates that fit the device's work-group size and local memory (a build and warm-up run, then the median of up
to 3 profiled runs) and keeps the winner on disk. Shape class: dtype, operand layouts, M/N/K rounded up to powers
of two, batched or not (:func:`shape_key`).

Accumulation: float16/bfloat16 in float (rounded once at the store), float32/float64 in their own type, integers
in 32/64-bit unsigned arithmetic, which wraps exactly like numpy's integer matmul, bool as a count of ``a & b``
stored as ``count != 0`` (the logical or of ands).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.dtypes import DType
from ember.errors import DTypeError, ShapeError, ValueRangeError
from ember_kernels.matmul import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _ACC,
    _ARGS,
    Direct,
    Tile,
    _acc,
    _comp,
    _direct_sources,
    _dot_body,
    _hsum,
    _kernel_head,
    _load,
    _outer_body,
    _prologue,
    _simple_sources,
    _store,
    _tile_loader,
    _tiled_sources,
    _vec,
    _vload,
    _vstore,
    direct_source,
    simple_source,
    tiled_source,
)

from . import elementwise as ew
from .array import CLArray, contiguous_strides, empty

#: products with fewer multiply-adds than this use the simple kernel untuned (timing would cost more than it saves)
TUNE_MIN_MACS = 1 << 18
#: the TuneStore op name (bump the suffix when the kernel generators change what a stored config means)
TUNE_OP = "matmul.v1"


# -- source helpers ---------------------------------------------------------------------------------------------


# -- simple ------------------------------------------------------------------------------------------------------


# -- tiled (local memory) ----------------------------------------------------------------------------------------


# -- direct (register tiles from global memory) --------------------------------------------------------------------


# -- planning ------------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    """A batched GEMM ``C[b] = alpha * A[b] @ B[b] + beta * C[b]`` over element strides, after folding the batch
    into M where B is shared, dropping size-1 batch dims and swapping operands when both are transposed."""

    dtype: DType
    M: int
    N: int
    K: int
    a: CLArray
    b: CLArray
    c: CLArray
    sa: tuple[int, int]  # A's element strides along (M, K)
    sb: tuple[int, int]  # B's along (K, N)
    sc: tuple[int, int]  # C's along (M, N)
    batch: tuple[int, ...]  # collapsed batch shape: the last two dims go to the kernel, others loop on the host
    bsa: tuple[int, ...]  # batch strides of A, B and C (0 where an operand is broadcast)
    bsb: tuple[int, ...]
    bsc: tuple[int, ...]

    @property
    def nbatch(self) -> int:
        return math.prod(self.batch)

    @property
    def layouts(self) -> tuple[str, str]:
        """("k" | "m" | "g", "n" | "k" | "g"): the unit-stride dim of A and of B, "g" for none."""
        sam, sak = self.sa
        sbk, sbn = self.sb
        return ("k" if sak == 1 else "m" if sam == 1 else "g"), ("n" if sbn == 1 else "k" if sbk == 1 else "g")


def _normalise(M: int, N: int, K: int, sa: tuple[int, int], sb: tuple[int, int]
               ) -> tuple[tuple[int, int], tuple[int, int]]:
    """The stride of a size-1 dim is arbitrary: make it 1 where that gives an operand vector loads."""
    sam, sak = sa
    sbk, sbn = sb
    if K == 1:
        sak = 1 if sam != 1 else sak
        sbk = 1 if sbn != 1 else sbk
    if M == 1 and sak != 1:
        sam = 1
    if N == 1 and sbk != 1:
        sbn = 1
    return (sam, sak), (sbk, sbn)


def plan(a: CLArray, b: CLArray, c: CLArray) -> Plan:
    """The Plan of views a (*batch, M, K), b (*batch, K, N), c (*batch, M, N) with equal batch shapes (a batch
    stride of 0 broadcasts an operand)."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    sa, sb, sc = a.estrides[-2:], b.estrides[-2:], c.estrides[-2:]
    shape, (bsa, bsb, bsc) = ew.collapse(c.shape[:-2], [a.estrides[:-2], b.estrides[:-2], c.estrides[:-2]])
    if shape and not any(bsb):
        # B is shared by the whole batch: fold the batch into M when A and C allow it (one big GEMM, fuller tiles)
        fshape, (fa, fc) = ew.collapse(shape + (M,), [bsa + (sa[0],), bsc + (sc[0],)])
        if len(fshape) <= 1:
            M *= math.prod(shape)
            sa, sc = (fa[0] if fshape else sa[0], sa[1]), (fc[0] if fshape else sc[0], sc[1])
            shape, bsa, bsb, bsc = (), (), (), ()
    sa, sb = _normalise(M, N, K, sa, sb)
    p = Plan(a.dtype, M, N, K, a, b, c, sa, sb, sc, shape, bsa, bsb, bsc)
    if p.layouts == ("m", "k"):
        # both operands transposed: C^T = B^T A^T reads both along their rows (vector loads on both)
        p = Plan(a.dtype, N, M, K, b, a, c, (sb[1], sb[0]), (sa[1], sa[0]), (sc[1], sc[0]), shape, bsb, bsa, bsc)
    return p


def _pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


def _aliased(p: Plan) -> bool:
    """Whether B is one matrix streamed along K at a row stride of a multiple of 4 KiB: every row then maps to the
    same cache sets, and a padded copy (see :func:`_pad_b`) pays for itself on large products."""
    return (p.layouts[1] == "n" and not any(p.bsb) and p.K >= 256 and p.N >= 64
            and (abs(p.sb[0]) * p.dtype.itemsize) % 4096 == 0)


def shape_key(p: Plan) -> str:
    """The tuning shape class of a plan: dtype, layouts (with "~" when B's row stride aliases in caches), M/N/K
    rounded up to powers of two, batched or not."""
    la, lb = p.layouts
    dims = "x".join(str(min(_pow2(n), 1 << 16)) for n in (p.M, p.N, p.K))
    return f"{p.dtype.name}|{la}{lb}{'~' if _aliased(p) else ''}|{dims}|{'b' if p.nbatch > 1 else '1'}"


def _pad_b(p: Plan) -> Plan:
    """p with B copied to a row stride off the 4 KiB period (the "pad" candidates; one O(K*N) copy)."""
    ld = -(-p.N // 16) * 16 + 16
    buf = empty(p.c.rt, (p.K, ld), p.dtype)
    padded = buf.view((p.K, p.N), (ld, 1), 0)
    ew.assign(padded, p.b.view((p.K, p.N), p.sb, p.b.offset))
    return dataclasses.replace(p, b=padded, sb=(ld, 1), bsb=(0,) * len(p.bsb))


# -- launching ---------------------------------------------------------------------------------------------------
SIMPLE: dict[str, Any] = {"kind": "simple"}


def _kernel_and_grid(rt: Any, cfg: dict[str, Any], p: Plan, nb: int
                     ) -> tuple[Any, tuple[int, int, int], tuple[int, int, int]]:
    kind = cfg.get("kind")
    la, lb = p.layouts
    if kind == "simple":
        lx = 1 if p.N == 1 else min(16, _pow2(p.N))
        ly = max(1, min(64 // lx, _pow2(p.M)))
        knl = rt.kernel(simple_source(p.dtype), "ember_mm_simple")
        return knl, (-(-p.N // lx) * lx, -(-p.M // ly) * ly, nb), (lx, ly, 1)
    if kind == "direct":
        d = Direct.from_dict(cfg)
        if d.vk and (la, lb) != ("k", "k"):  # a forced dot-form config on other layouts: same tile, outer form
            d = dataclasses.replace(d, vk=0)
        knl = rt.kernel(direct_source(p.dtype, la, lb, d), "ember_mm_direct")
        gx, gy = -(-p.N // d.wn), -(-p.M // d.wm)
        return knl, (-(-gx // d.lx) * d.lx, -(-gy // d.ly) * d.ly, nb), (d.lx, d.ly, 1)
    if kind == "tiled":
        tile = Tile.from_dict(cfg)
        knl = rt.kernel(tiled_source(p.dtype, la, lb, tile), "ember_mm_tiled")
        return knl, (-(-p.N // tile.tn) * tile.tpx, -(-p.M // tile.tm) * tile.tpy, nb), (tile.tpx, tile.tpy, 1)
    raise ValueRangeError(f"matmul: unknown kernel configuration {cfg!r}")


def _scalar(dtype: DType, value: Any) -> np.generic:
    _, scal, bits = _ACC[dtype]
    return scal(int(value) % (1 << bits)) if bits else scal(value)


_MAX_GRID_Z = 65535  # work-groups along dim 2 that every driver accepts; larger batches launch in chunks


def launch(cfg: dict[str, Any], p: Plan, c: CLArray, bsc: tuple[int, ...], sc: tuple[int, int],
           alpha: Any = 1, beta: Any = 0) -> list[Any]:
    """Enqueue plan p with kernel configuration cfg, writing into c (batch strides bsc, matrix strides sc);
    returns the events (one per host-looped batch index; batch dims beyond two loop on the host)."""
    rt = c.rt
    outer = p.batch[:-2]
    inner = p.batch[len(outer):]
    nb2 = inner[-1] if inner else 1
    nb = math.prod(inner)
    knl, gsize, lsize = _kernel_and_grid(rt, cfg, p, min(nb, _MAX_GRID_Z))
    chunks = [(np.int32(z), gsize if nb - z >= _MAX_GRID_Z else gsize[:2] + (nb - z,))
              for z in range(0, nb, _MAX_GRID_Z)]
    al, be = _scalar(p.dtype, alpha), _scalar(p.dtype, beta)

    def kstrides(bs: tuple[int, ...]) -> tuple[int, int]:
        s = bs[len(outer):]
        return (s[0], s[1]) if len(s) == 2 else (0, s[0]) if s else (0, 0)

    i64 = np.int64
    (a1, a2), (b1, b2), (c1, c2) = kstrides(p.bsa), kstrides(p.bsb), kstrides(bsc)
    fixed_a = (i64(a1), i64(a2), i64(p.sa[0]), i64(p.sa[1]))
    fixed_b = (i64(b1), i64(b2), i64(p.sb[0]), i64(p.sb[1]))
    fixed_c = (i64(c1), i64(c2), i64(sc[0]), i64(sc[1]))
    sizes = (np.int32(p.M), np.int32(p.N), np.int32(p.K), np.int32(nb2))
    events = []
    for idx in itertools.product(*(range(n) for n in outer)):
        da = sum(i * s for i, s in zip(idx, p.bsa))
        db = sum(i * s for i, s in zip(idx, p.bsb))
        dc = sum(i * s for i, s in zip(idx, bsc))
        for z0, grid in chunks:
            events.append(knl(rt.queue, grid, lsize, p.a.buf, i64(p.a.eoff + da), *fixed_a, p.b.buf,
                              i64(p.b.eoff + db), *fixed_b, c.buf, i64(c.eoff + dc), *fixed_c, *sizes, z0, al, be))
    return events


# -- candidates and autotuning -------------------------------------------------------------------------------------
# GPUs: 128-256 work-items per group, strided register tiles, float4 loads; the last one (64 work-items, 4 KiB of
# local memory) fits small embedded GPUs.
_GPU_TILES = (Tile(64, 64, 16, 4, 4, 4), Tile(128, 128, 16, 8, 8, 4), Tile(32, 32, 16, 2, 2, 4),
              Tile(64, 64, 32, 8, 4, 4), Tile(32, 32, 8, 4, 4, 4))


def candidates(rt: Any, p: Plan) -> list[dict[str, Any]]:
    """Tuning candidates of plan p on rt's device, ending with the simple kernel (always valid).

    CPUs: two register-tile shapes of the form the layouts allow (sized for 16 SIMD registers of 8 floats / 4
    doubles), plus a one-row / one-column shape for vector-matrix products. GPUs: local-memory tiles that fit the
    device's work-group size and local memory and are not much bigger than the problem.
    """
    wide = _acc(p.dtype) in ("double", "ulong")
    la, lb = p.layouts
    out: list[dict[str, Any]] = []
    if rt.is_cpu:
        vk = 4 if wide else 8
        if (la, lb) == ("k", "k"):
            ds = [Direct(2, 4, 8, 4, vk), Direct(2, 2, 8, 8, vk)] + ([Direct(4, 1, 1, 16, vk)] if p.N <= 2 else [])
        else:
            w = 8 if wide else 16
            ds = [Direct(6, w, 2, 8), Direct(8, w // 2, 4, 16)] + ([Direct(1, w, 16, 1)] if p.M <= 2 else [])
        out += [d.as_dict() for d in ds if d.lx * d.ly <= rt.max_work_group]
        if _aliased(p):
            out += [dict(cfg, pad=1) for cfg in out]
    else:
        itemsize = 8 if wide else 4
        for tile in _GPU_TILES:
            if tile.threads > rt.max_work_group or tile.local_bytes(itemsize) > rt.local_mem:
                continue
            if tile.tm > 2 * max(_pow2(p.M), 16) or tile.tn > 2 * max(_pow2(p.N), 16):
                continue  # mostly idle work-items
            out.append(tile.as_dict())
    out.append(dict(SIMPLE))
    return out


def _timer(p: Plan, alpha: Any, beta: Any) -> Callable[[dict[str, Any]], float]:
    """run(cfg) for TuneStore.tune: build and warm up once, then the median of up to 3 profiled runs.

    Writes into C itself when beta == 0 (the real launch overwrites it afterwards), else into scratch. The simple
    kernel is only timed when nothing else ran or the product is skinny: on large products it is 10-100x slower
    and timing it would dominate the tuning time.
    """
    if beta == 0:
        c, bsc, sc = p.c, p.bsc, p.sc
    else:
        c = empty(p.c.rt, p.batch + (p.M, p.N), p.c.dtype)
        bsc, sc = contiguous_strides(p.batch + (p.M, p.N))[:-2], (p.N, 1)
    best = [math.inf]
    padded: list[Any] = []  # [plan with padded B, seconds the copy took]

    def run(cfg: dict[str, Any]) -> float:
        if cfg.get("kind") == "simple" and best[0] < math.inf and min(p.M, p.N) >= 32:
            return math.inf
        q, extra = p, 0.0
        if cfg.get("pad"):
            if not padded:
                _pad_b(p)  # warm-up: builds the copy kernel
                p.c.rt.queue.finish()
                t0 = time.perf_counter()
                padded.append(_pad_b(p))
                p.c.rt.queue.finish()
                padded.append(time.perf_counter() - t0)
            q, extra = padded
        for ev in launch(cfg, q, c, bsc, sc, alpha, 0):
            ev.wait()
        times: list[float] = []
        for _ in range(3):
            events = launch(cfg, q, c, bsc, sc, alpha, 0)
            for ev in events:
                ev.wait()
            times.append(extra + sum(ev.profile.end - ev.profile.start for ev in events) * 1e-9)
            if times[0] > 3 * best[0] or times[0] > 0.25:
                break  # clearly losing, or long enough for one sample to be accurate
        t = statistics.median(times)
        best[0] = min(best[0], t)
        return t

    return run


# per TuneStore: shape key -> chosen config (skips rebuilding candidate lists on every call)
_chosen: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


def choose(p: Plan, alpha: Any = 1, beta: Any = 0) -> dict[str, Any]:
    """The kernel configuration of plan p: the simple kernel for small products, else the winner of its shape class
    (stored, or tuned now; see the module docstring)."""
    if p.M * p.N * p.K * p.nbatch < TUNE_MIN_MACS:
        return SIMPLE
    store = p.c.rt.tune
    memo = _chosen.setdefault(store, {})
    key = shape_key(p)
    cfg = memo.get(key)
    if cfg is None:
        cands = candidates(p.c.rt, p)
        cfg = cands[0] if len(cands) == 1 else store.tune(TUNE_OP, key, cands, _timer(p, alpha, beta))
        memo[key] = cfg
    return cfg


def _run(a: CLArray, b: CLArray, c: CLArray, alpha: Any, beta: Any, config: dict[str, Any] | None = None) -> None:
    """c = alpha * a @ b + beta * c over views with equal batch shapes (see :func:`plan`)."""
    if c.size == 0:
        return
    if a.shape[-1] == 0:  # empty sum
        if beta == 0:
            ew.assign(c, 0)
        elif beta != 1:
            ew.binary("mul", c, beta, out=c)
        return
    p = plan(a, b, c)
    cfg = config or choose(p, alpha, beta)
    if cfg.get("pad") and _aliased(p):
        p = _pad_b(p)
    launch(cfg, p, p.c, p.bsc, p.sc, alpha, beta)


# -- public entry points -------------------------------------------------------------------------------------------
def _view(h: CLArray, shape: tuple[int, ...], strides: tuple[int, ...]) -> CLArray:
    return h.view(tuple(shape), tuple(strides), h.offset)


def _expand(h: CLArray, batch: tuple[int, ...]) -> CLArray:
    """h (..., R, S) with its batch dims broadcast to batch (stride 0 where broadcast: no copy)."""
    lead = len(batch) - (h.ndim - 2)
    strides = [0] * lead + [0 if h.shape[d] != batch[lead + d] else h.estrides[d] for d in range(h.ndim - 2)]
    return _view(h, batch + h.shape[-2:], tuple(strides) + h.estrides[-2:])


def matmul(a: CLArray, b: CLArray) -> CLArray:
    """numpy.matmul(a, b): 1-d operands are promoted (and the added dim dropped from the result), batch dims
    broadcast through stride 0 (never copied). a and b share a dtype; float16/bfloat16 accumulate in float,
    integers wrap like numpy's, bool gives the logical or of ands. Returns a new contiguous array."""
    if a.dtype is not b.dtype:
        raise DTypeError(f"matmul: operands must share a dtype, got {a.dtype.name} and {b.dtype.name}")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: both arguments need at least 1 dimension, got shapes {a.shape} and {b.shape}")
    a2 = a if a.ndim > 1 else _view(a, (1,) + a.shape, (0,) + a.estrides)
    b2 = b if b.ndim > 1 else _view(b, b.shape + (1,), b.estrides + (0,))
    (M, K), (K2, N) = a2.shape[-2:], b2.shape[-2:]
    if K != K2:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} cannot be multiplied ({K} != {K2})")
    try:
        batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
    except ValueError:
        raise ShapeError(f"matmul: batch dims of shapes {a.shape} and {b.shape} are not broadcastable") from None
    c = empty(a.rt, batch + ((M,) if a.ndim > 1 else ()) + ((N,) if b.ndim > 1 else ()), a.dtype)
    c3 = _view(c, batch + (M, N), contiguous_strides(batch + (M, N)))
    _run(_expand(a2, batch), _expand(b2, batch), c3, 1, 0)
    return c


def gemm(a: CLArray, b: CLArray, out: CLArray | None = None, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1, beta: float = 0, config: dict[str, Any] | None = None) -> CLArray:
    """``out = alpha * op(a) @ op(b) + beta * out``: the BLAS-style entry point (conv's im2col GEMMs use it).

    a, b: 2-d or 3-d (batched) CLArrays of one dtype with any element strides; transposed or sliced views are read
    in place, never copied. ``op(x)`` is x, or x with its last two dims swapped when ``trans_a``/``trans_b`` is
    set (equivalent to passing a transposed view), so op(a) is ([batch,] M, K) and op(b) is ([batch,] K, N).
    A 2-d operand, or a batch of 1, is shared by every batch entry (stride 0, no copy); otherwise the batch sizes
    must be equal.

    out: None, for a new contiguous (M, N) result, or (batch, M, N) when an operand is 3-d; or an existing
    CLArray of exactly that shape and the operands' dtype, with any strides (e.g. a strided slice of a bigger
    buffer), written in place and returned. With ``beta == 0`` out is never read (it may hold garbage or NaN);
    otherwise the product is accumulated into it (e.g. summing weight gradients over chunks of a batch).
    out must not overlap a or b.

    alpha, beta: scalars of the accumulation type (float for float16/bfloat16/float32, double for float64;
    integer dtypes wrap modulo 2**32, int64 modulo 2**64; for bool, nonzero means true).

    config: None to autotune (the normal case); a kernel configuration dict (``{"kind": "simple"}``,
    ``Direct(...).as_dict()``, ``Tile(...).as_dict()``) to force one, for tests and benchmarks.

    Raises ShapeError or DTypeError naming the shapes and dtypes on misuse.
    """
    if a.dtype is not b.dtype or (out is not None and out.dtype is not a.dtype):
        names = [a.dtype.name, b.dtype.name] + ([out.dtype.name] if out is not None else [])
        raise DTypeError(f"gemm: a, b and out must share a dtype, got {', '.join(names)}")
    if a.ndim not in (2, 3) or b.ndim not in (2, 3):
        raise ShapeError(f"gemm: expected 2-d or 3-d operands, got shapes {a.shape} and {b.shape}")
    if trans_a:
        a = _view(a, a.shape[:-2] + a.shape[:-3:-1], a.estrides[:-2] + a.estrides[:-3:-1])
    if trans_b:
        b = _view(b, b.shape[:-2] + b.shape[:-3:-1], b.estrides[:-2] + b.estrides[:-3:-1])
    (M, K), (K2, N) = a.shape[-2:], b.shape[-2:]
    ba = a.shape[0] if a.ndim == 3 else 1
    bb = b.shape[0] if b.ndim == 3 else 1
    if K != K2 or (ba != bb and 1 not in (ba, bb)):
        raise ShapeError(f"gemm: op(a) of shape {a.shape} and op(b) of shape {b.shape} cannot be multiplied "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    batched = a.ndim == 3 or b.ndim == 3
    shape = ((max(ba, bb),) if batched else ()) + (M, N)
    if out is None:
        out, beta = empty(a.rt, shape, a.dtype), 0
    elif out.shape != shape:
        raise ShapeError(f"gemm: out has shape {out.shape}, expected {shape} for op(a) of shape {a.shape} @ op(b) "
                         f"of shape {b.shape}")
    batch = shape[:-2] or (1,)
    c3 = out if batched else _view(out, (1, M, N), (0,) + out.estrides)
    _run(_expand(a, batch), _expand(b, batch), c3, alpha, beta, config)
    return out


__all__ = ["SIMPLE", "TUNE_MIN_MACS", "TUNE_OP", "Direct", "Plan", "Tile", "candidates", "choose", "direct_source",
           "gemm", "launch", "matmul", "plan", "shape_key", "simple_source", "tiled_source"]
