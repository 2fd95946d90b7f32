"""Every kernel program a GPU backend can emit from the shared generators, over a representative set of dtypes,
ranks and layouts: the input of ``ember kernels check``.

The sets follow what the generators vary on: every source is a function of (op family, dtypes, rank bucket,
layout, compile-time tile) only, never of sizes (sizes and strides are kernel arguments), so the product below
covers each distinct program text a GPU launch can ask for, for every ember dtype. CPU-only variants (the
``chunked`` map layouts, ``direct`` GEMM register tiles, CPU pooling loops and reduction ``run``/``tile`` kernels)
are what ember-opencl emits on PoCL, not on a GPU, and are left out; matmul tiles have vector width 1, as
:attr:`ember_kernels.dialect.Dialect.vectors` is false on CUDA and HIP.
"""

from __future__ import annotations

from collections.abc import Iterator

from ember import dtypes as dt
from ember.backend import BINARY_OPS, UNARY_OPS
from ember.dtypes import DType
from ember.ir import Instr, Kernel
from ember_kernels import conv, fusion, indexing, matmul, nn, pooling, random, reduction, sorting
from ember_kernels import elementwise as ew
from ember_kernels.ctypes_ import ctype

#: every dtype the generators know, in a fixed order (the report lists kernels in this order)
DTYPES: tuple[DType, ...] = (dt.float32, dt.float64, dt.float16, dt.bfloat16, dt.int64, dt.int32, dt.int16,
                             dt.int8, dt.uint8, dt.bool_)
FLOATS: tuple[DType, ...] = tuple(d for d in DTYPES if d.is_floating_point)
#: the map template's rank buckets (1: linear; 3 and 8: strided, see elementwise._rank_bucket) and GPU layouts
MAP_SHAPES: tuple[tuple[int, str], ...] = ((1, "linear"), (3, "strided"), (8, "strided"))
#: the GPU GEMM tiles (ember-opencl's GPU candidates with vector width 1)
TILES: tuple[matmul.Tile, ...] = (matmul.Tile(64, 64, 16, 4, 4, 1), matmul.Tile(128, 128, 16, 8, 8, 1),
                                  matmul.Tile(32, 32, 16, 2, 2, 1), matmul.Tile(16, 16, 16, 1, 1, 1))


def _families(d: DType) -> list[tuple[ew.Family, int]]:
    """The unary and binary map families of dtype d (one program each), with their arity."""
    t = ctype(d)
    seen: dict[int, tuple[ew.Family, int]] = {}
    for op in sorted(UNARY_OPS):
        if ew._valid(op, t):
            fam = ew._unary_plan(op, d)[3]
            seen.setdefault(id(fam), (fam, 1))
    for op in sorted(BINARY_OPS):
        if ew._valid(op, t):
            fam = ew._binary_plan(op, d, d)[3]
            seen.setdefault(id(fam), (fam, 2))
    return list(seen.values())


def elementwise_sources() -> Iterator[tuple[str, str]]:
    """Unary and binary families, where, casts between every pair of dtypes, full and arange."""
    for d in DTYPES:
        t = ctype(d)
        for fam, arity in _families(d):
            kind = "unary" if arity == 1 else "binary"
            for rank, layout in MAP_SHAPES:
                ops = tuple((t, True) for _ in range(arity))
                yield f"map/{kind}/{d.name}/{layout}{rank}", ew._map_source(fam, ops, rank, layout)
            # a scalar operand beside an array (x + 2)
            if arity == 2:
                yield (f"map/{kind}-scalar/{d.name}/linear1",
                       ew._map_source(fam, ((t, True), (t, False)), 1, "linear"))
        where = ew.Family([("(v0 ? v1 : v2)", frozenset(), d)])
        yield (f"map/where/{d.name}/strided3",
               ew._map_source(where, ((ctype(dt.bool_), True), (t, True), (t, True)), 3, "strided"))
        fill = ew.Family([("v0", frozenset(), d)])
        yield f"map/full/{d.name}/linear1", ew._map_source(fill, ((t, False),), 1, "linear")
        step = ctype(dt.float64 if d.is_floating_point else dt.int64)
        rng = ew.Family([(f"(v0 + ({step.compute})i * v1)", frozenset(), d)])
        yield f"map/arange/{d.name}/linear1", ew._map_source(rng, ((step, False), (step, False)), 1, "linear")
        for s in DTYPES:  # cast / copy / assign: out[i] = v0 from every source dtype
            cast = ew.Family([("v0", frozenset(), d)])
            yield f"map/cast/{s.name}->{d.name}/strided3", ew._map_source(cast, ((ctype(s), True),), 3, "strided")


def reduction_sources() -> Iterator[tuple[str, str]]:
    """Reductions (1-3 reduced dims, float partials for half types), argmax/argmin, scans, logsumexp, softmax."""
    for d in DTYPES:
        t = ctype(d)
        # bool sum/prod are stored as any/all: the max/min kernels
        for op in ("sum", "prod", "max", "min") if d is not dt.bool_ else ("max", "min"):
            for nred in (1, 2, 3):
                yield f"reduce/{op}/{d.name}/nred{nred}", reduction._reduce_source(op, t, t, nred, False, False)
            if d in reduction._HALF:  # pass 1 of a split row writes float partials
                acc = ctype(reduction._acc_dtype(d))
                yield f"reduce/{op}/{d.name}->float32/nred1", reduction._reduce_source(op, t, acc, 1, False, False)
        for op in ("max", "min"):
            for nred in (1, 2):
                yield (f"argreduce/{op}/{d.name}/nred{nred}",
                       reduction._reduce_source(op, t, ctype(dt.int64), nred, True, False))
            yield (f"argreduce/{op}/{d.name}/pass2",
                   reduction._reduce_source(op, t, ctype(dt.int64), 1, True, True))
        for op in ("sum", "prod") if d is not dt.bool_ else ("max", "min"):
            yield f"scan/{op}/{d.name}", reduction._scan_source(op, t)
    for d in FLOATS:
        t = ctype(d)
        for nred in (1, 2, 3):
            yield f"logsumexp/{d.name}/nred{nred}", reduction._lse_source(t, nred)
        yield f"softmax/{d.name}", reduction._softmax_source(t)


def matmul_sources() -> Iterator[tuple[str, str]]:
    """The simple GEMM and the tiled GEMM over every operand layout pair and GPU tile."""
    for d in DTYPES:
        yield f"matmul/simple/{d.name}", matmul.simple_source(d)
        for la in ("k", "m", "g"):
            for lb in ("n", "k", "g"):
                # every tile shape for float32; one per layout pair for the others (the tile only changes
                # compile-time constants, the layouts and dtypes change the code)
                for tile in TILES if d is dt.float32 else TILES[:1]:
                    name = f"matmul/tiled/{d.name}/{la}{lb}/{tile.tm}x{tile.tn}x{tile.tk}"
                    yield name, matmul.tiled_source(d, la, lb, tile)


def conv_sources() -> Iterator[tuple[str, str]]:
    """im2col per element width and order, col2im, direct convolution and the split-K sum, for 1-3 spatial dims."""
    for nd in (1, 2, 3):
        for width in (1, 2, 4, 8):
            for order in ("ngrl", "grnl"):
                yield f"conv/im2col/{width * 8}bit/{nd}d/{order}", conv._im2col_source(width, nd, order)
        for d in FLOATS:
            for bias in (False, True):
                yield f"conv/col2im/{d.name}/{nd}d/bias{int(bias)}", conv._col2im_source(d, nd, bias)
                for cot in (1, 4) if d is dt.float32 else (4,):
                    yield (f"conv/direct/{d.name}/{nd}d/cot{cot}/bias{int(bias)}",
                           conv._direct_source(d, nd, cot, bias))
    for d in FLOATS:
        yield f"conv/sum/{d.name}", conv._sum_source(d)


def pooling_sources() -> Iterator[tuple[str, str]]:
    """The pooling/interpolation program per dtype, 32- and 64-bit output indexing."""
    for d in DTYPES:
        for wide in (False, True):
            yield f"pooling/{d.name}/{'i64' if wide else 'u32'}", pooling._program(d, True, wide, False)


def indexing_sources() -> Iterator[tuple[str, str]]:
    """Advanced-index get/put per element width and rank, atomic add/multiply per dtype, the scatter loop (ranks 3
    and 6: the CuPy backend's scatter add/multiply), mask counting and coordinates, pad (ranks 1, 4, 8)."""
    for width in (1, 2, 4, 8):
        for mode in ("get", "put"):
            for ndim, nk in ((1, 1), (3, 2)):
                yield (f"index/{mode}/{width * 8}bit/rank{ndim}/keys{nk}",
                       indexing._adv_source(mode, width, ndim, nk, False))
        for ndim in (1, 4, 8):  # ember_cupy.kernels.pad_rank's buckets
            yield f"pad/{width * 8}bit/rank{ndim}", indexing._pad_source(width, ndim)
    for d in DTYPES:
        if d is dt.bool_:
            continue
        for mode in ("add", "mul"):
            yield f"index/atomic-{mode}/{d.name}", indexing._adv_source(mode, ctype(d), 2, 1, False)
        for op in ("add", "multiply"):
            for rank in (3, 6):  # ember_cupy.kernels._loop_rank's buckets
                yield f"scatter-loop/{op}/{d.name}/rank{rank}", indexing._loop_source(ctype(d), op, rank)
    yield "mask/count", indexing._COUNT_SRC
    for k in (1, 2, 4):
        yield f"mask/coords/rank{k}", indexing._coords_source(k)


def sorting_sources() -> Iterator[tuple[str, str]]:
    """The bitonic network (32-bit keys packed with indices, and 64-bit key pairs), keys and gathers."""
    for wide in (False, True):
        yield f"sort/network/{'wide' if wide else 'packed'}", sorting._net_source(wide)
    for width in (1, 2, 4, 8):
        for rank in (0, 1, 3):
            yield f"sort/keys/{width * 8}bit/rank{rank}", sorting._key_source(width, rank)
            yield f"sort/gather/{width * 8}bit/rank{rank}", sorting._out_source(width, rank)


def random_sources() -> Iterator[tuple[str, str]]:
    """Philox draws: raw words, uniform and normal per float dtype, integers per dtype."""
    yield "philox/raw", random._source("raw", dt.int32)[0]
    for d in FLOATS:
        for kind in ("uniform", "normal"):
            yield f"philox/{kind}/{d.name}", random._source(kind, d)[0]
    for d in DTYPES:
        if d is not dt.bool_:
            yield f"philox/integers/{d.name}", random._source("integers", d)[0]


def _fused_samples() -> Iterator[tuple[str, Kernel]]:
    """Representative fused blocks: a GELU-like chain with a scalar, a cast chain, a where, two outputs, and a
    fused reduction per reduce op."""
    for d in FLOATS:
        yield f"{d.name}/chain", Kernel(
            rank=2, inputs=(d, d), scalars=1,
            body=(Instr("load", (0,), d), Instr("load", (1,), d), Instr("binary", ("mul", 0, 1), d),
                  Instr("scalar", (0,), d), Instr("binary", ("add", 2, 3), d), Instr("unary", ("tanh", 4), d),
                  Instr("unary", ("erfinv", 5), d), Instr("binary", ("maximum", 6, 0), d)),
            outputs=(7,))
        yield f"{d.name}/where-two-outputs", Kernel(
            rank=3, inputs=(d, d), scalars=0,
            body=(Instr("load", (0,), d), Instr("load", (1,), d), Instr("binary", ("gt", 0, 1), dt.bool_),
                  Instr("where", (2, 0, 1), d), Instr("cast", (3,), dt.float32), Instr("unary", ("exp", 4),
                                                                                        dt.float32)),
            outputs=(3, 5))
        for op in ("sum", "prod", "max", "min"):
            for dims in ((1,), (0, 2)):
                yield f"{d.name}/reduce-{op}-{'-'.join(map(str, dims))}", Kernel(
                    rank=3, inputs=(d, d), scalars=0,
                    body=(Instr("load", (0,), d), Instr("load", (1,), d), Instr("binary", ("sub", 0, 1), d),
                          Instr("binary", ("mul", 2, 2), d)),
                    outputs=(3,), reduce=(op, dims))
    yield "int64/bits", Kernel(
        rank=1, inputs=(dt.int64, dt.int32), scalars=1,
        body=(Instr("load", (0,), dt.int64), Instr("load", (1,), dt.int32), Instr("cast", (1,), dt.int64),
              Instr("scalar", (0,), dt.int64), Instr("binary", ("bitwise_left_shift", 2, 3), dt.int64),
              Instr("binary", ("floor_divide", 0, 4), dt.int64), Instr("binary", ("pow", 5, 3), dt.int64)),
        outputs=(6,))


def fusion_sources() -> Iterator[tuple[str, str]]:
    """The fused map (every GPU layout) and fused reduction programs of the sample blocks."""
    for name, k in _fused_samples():
        body = fusion._Body(k, True)
        if k.reduce is None:
            for rank, layout in MAP_SHAPES:
                out_dtypes = [k.body[i].dtype for i in k.outputs]
                yield f"fused/{name}/{layout}{rank}", fusion.map_source(body, out_dtypes, k.outputs, layout, rank)
            continue
        op, dims = k.reduce
        out = k.body[k.outputs[0]].dtype
        tin = ctype(out)
        nred = len(dims)
        yield f"fused/{name}", fusion.reduce_source(body, k.outputs[0], len(k.inputs), op, tin, nred, tin, False)
        if out in reduction._HALF:
            acc = ctype(reduction._acc_dtype(out))
            yield (f"fused/{name}->float32",
                   fusion.reduce_source(body, k.outputs[0], len(k.inputs), op, tin, nred, acc, False))


def nn_sources() -> Iterator[tuple[str, str]]:
    """Core's neural-network ops (:mod:`ember_kernels.nn`): GELU forward/backward (exact, tanh), layer norm forward
    and backward with and without weight and bias, attention plain/causal/bool-mask/float-mask with and without
    dropout, per float dtype, at GPU work-group sizes (256 threads per layer-norm row; 64 query rows and 16-key by
    64-feature tiles for attention)."""
    for d in FLOATS:
        t = ctype(d)
        for mode in nn.GELU_MODES:
            yield f"nn/gelu/{mode}/{d.name}", nn.gelu_source(t, mode, False)
            yield f"nn/gelu_backward/{mode}/{d.name}", nn.gelu_source(t, mode, True)
        for w in (True, False):
            for b in (True, False):
                yield (f"nn/layer_norm/{'w' if w else '-'}{'b' if b else '-'}/{d.name}",
                       nn.layer_norm_source(t, w, b, 256))
            yield f"nn/layer_norm_backward/{'w' if w else '-'}/{d.name}", nn.layer_norm_backward_source(t, w, 256)
        ec = 32 if d is dt.float64 else 64
        for kind, mask, causal in (("plain", None, False), ("causal", None, True),
                                   ("bool-mask", ctype(dt.bool_), False), ("float-mask", t, False)):
            for drop in (False, True):
                yield (f"nn/sdpa/{kind}{'-dropout' if drop else ''}/{d.name}",
                       nn.sdpa_source(t, mask, causal, drop, 64, 16, ec))


#: the areas in report order
AREAS = {
    "elementwise": elementwise_sources,
    "reduction": reduction_sources,
    "matmul": matmul_sources,
    "conv": conv_sources,
    "pooling": pooling_sources,
    "indexing": indexing_sources,
    "sorting": sorting_sources,
    "random": random_sources,
    "fusion": fusion_sources,
    "nn": nn_sources,
}


def all_sources(areas: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """(name, program in the shared vocabulary) of every catalogued kernel program, optionally only of some
    areas (keys of :data:`AREAS`). Names are unique."""
    for area, make in AREAS.items():
        if areas is None or area in areas:
            yield from make()
