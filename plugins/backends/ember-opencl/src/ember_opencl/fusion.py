"""Code generation for fused blocks: one :class:`ember.ir.Kernel` becomes one OpenCL C kernel.

Elementwise kernels reuse the strided map template of :mod:`.elementwise` (:func:`~.elementwise.map_kernel`): every
input is read through its own strides (0 where broadcast, negative for flipped views), the body runs as one C
statement per instruction (the per-op expression builders of :mod:`.elementwise`), and every output is stored in the
same pass. Reduce kernels evaluate the body at each point of the reduced dims and combine it in registers, with the
layouts of :mod:`.reduction`: ``col`` (one work-item per (row, chunk); every layout on CPUs) and ``row`` (a work-group
per (row, chunk) and a local-memory tree; GPUs, reduced dims inner). Rows split into several chunks write partials in
the accumulation dtype that :func:`.reduction._reduce` finishes.

CPU drivers (PoCL) get their own forms. Elementwise bodies of float32 values and bool masks are written with explicit
``floatW`` vectors (:func:`map_vec_source`) where every output is contiguous along the innermost dim and every input
contiguous or broadcast there: PoCL left the scalar loops unvectorised (a math builtin in the body, or many pointers
that may alias), so the GELU chain ran exp-bound at ~1.3 ns per element. Fused reductions (:func:`reduce_cpu_source`)
walk their chunk in pieces with carried coordinates and run float32 sums in vector lanes. Other bodies keep the
scalar template.

Values keep the exact semantics of running the instructions one by one (:func:`ember.ir.interpret`): every
intermediate is converted to its instruction's dtype, float16/bfloat16 results are rounded to their storage
precision, and scalar arguments are kernel parameters (one binary serves all scalar values). The exceptions are the
vector forms' transcendental builtins (their vector overloads round differently from the scalar ones in a few cases,
both within an ulp) and the vector sums' order of summation (still compensated). The source depends only
on the kernel's structure and the layout (never on sizes or scalar values), so the on-disk program cache hits across
processes. Each compiled kernel memoises its layout decision per (shape, strides) signature, so a repeated call
builds one argument list and enqueues one kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ember import dtypes as dt
from ember.dtypes import DType
from ember.errors import ShapeError
from ember.ir import KERNEL_REDUCE_OPS, Kernel, interpret
from ember_kernels.fusion import (  # noqa: F401 (moved to ember-kernels; re-exported)
    _ROUND,
    _Body,
    _coords,
    _Unsupported,
    map_source,
    reduce_source,
)

from . import elementwise as ew
from . import reduction as red
from .array import CLArray, empty
from .ctypes_ import CType, ctype, header

_LAYOUT_CACHE_MAX = 256  # distinct (shape, strides) signatures remembered per kernel


def _check_broadcast(h: CLArray, shape: tuple[int, ...], what: str) -> None:
    lead = len(shape) - h.ndim
    if lead < 0 or any(n != 1 and n != shape[lead + d] for d, n in enumerate(h.shape)):
        raise ShapeError(f"fused kernel: {what} of shape {h.shape} does not broadcast to the iteration shape {shape}")


class _Compiled:
    """What both kernel kinds share: the backend, the body and the per-signature layout memo."""

    def __init__(self, backend: Any, kernel: Kernel, body: _Body, cpu: bool) -> None:
        self.backend = backend
        self.rt = backend.rt
        self.kernel = kernel
        self.body = body
        self.cpu = cpu
        self.n_in = len(kernel.inputs)
        self.out_dtypes = [kernel.body[i].dtype for i in kernel.outputs]
        self.sources: dict[tuple[Any, ...], str] = {}
        self._layouts: dict[tuple[Any, ...], Any] = {}

    def _remember(self, key: tuple[Any, ...], layout: Any) -> Any:
        if len(self._layouts) >= _LAYOUT_CACHE_MAX:
            self._layouts.clear()
        self._layouts[key] = layout
        return layout


# -- explicit vectors on CPU drivers ---------------------------------------------------------------------------
# PoCL compiles a work-item's loop as scalar code when the body calls a math builtin (exp, tanh's exp, ...) or when
# many pointers may alias: the 8-op GELU chain ran at ~1.3 ns per element, against ~0.4 ns for the same loop without
# its exp. Written with floatW vectors (vloadW/vstoreW and the vector overloads of the builtins, which PoCL
# implements with SIMD code) it runs at ~0.5 ns. Only float32 values (and bool masks between them) take this path;
# everything else keeps the scalar template. Results are those of the scalar code lane by lane (IEEE arithmetic,
# both branches of a select computed as the scalar code computes the one it takes), except for the transcendental
# builtins, whose vector overloads round differently from the scalar ones in a few cases (both within 1 ulp).
# (no sin/cos/tan: PoCL 3.1's vector overloads return garbage for subnormal arguments, e.g. sin(-1e-38) = -0.0145)
_VEC_UNARY_FN = {"exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2", "log10": "log10",
                 "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt", "asin": "asin", "acos": "acos", "atan": "atan",
                 "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "erf": "erf",
                 "erfc": "erfc", "floor": "floor", "ceil": "ceil", "trunc": "trunc", "round": "rint", "abs": "fabs"}
_VEC_PREDICATES = {"isnan": "isnan({x})", "isinf": "isinf({x})", "isfinite": "isfinite({x})",
                   "signbit": "signbit({x})", "isposinf": "(isinf({x}) & ({x} > 0.0f))",
                   "isneginf": "(isinf({x}) & ({x} < 0.0f))", "logical_not": "({x} == 0.0f)"}
_VEC_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_VEC_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_VEC_BINARY_FN = {"fmax": "fmax", "fmin": "fmin", "atan2": "atan2", "copysign": "copysign", "hypot": "hypot",
                  "pow": "pow"}
_VEC_MASK_BINARY = {"logical_and": "&", "logical_or": "|", "logical_xor": "^", "bitwise_and": "&",
                    "bitwise_or": "|", "bitwise_xor": "^", "eq": "==", "ne": "!="}


def vec_width(rt: Any) -> int:
    """The float lanes of the vector kernels on ``rt``'s device: 16 where the driver prefers 16 (AVX-512), else 8
    (an 8-lane vector is two SSE registers or one AVX one; wider vectors the backend splits)."""
    return 16 if int(getattr(rt.device, "preferred_vector_width_float", 0) or 0) >= 16 else 8


class _VecBody:
    """The kernel body as OpenCL C statements over ``floatW`` values (float32) and ``intW`` masks (bool: -1 or 0 per
    lane, what vector comparisons give), or :class:`_Unsupported` when an instruction has no vector form here."""

    def __init__(self, kernel: Kernel, width: int) -> None:
        f32, b = dt.float32, dt.bool_
        if any(d not in (f32, b) for d in kernel.inputs) or any(ins.dtype not in (f32, b) for ins in kernel.body):
            raise _Unsupported("vector dtype")
        w = width
        self.width = w
        self.instrs = kernel.body
        self.fv, self.mv = f"float{w}", f"int{w}"
        self.kinds: list[str] = []  # "f" (floatW) or "m" (intW mask) per instruction
        self.stmts: list[str] = []
        self.tanh = False
        fv, mv = self.fv, self.mv
        body = kernel.body
        for i, ins in enumerate(body):
            op, a = ins.op, ins.args
            kind = "f" if ins.dtype is f32 else "m"
            if op == "load":
                self.kinds.append(kind)
                self.stmts.append("")  # loaded at the top of the block (see map_vec_source)
                continue
            if op == "scalar":
                self.kinds.append(kind)
                self.stmts.append("")
                continue
            refs = a[1:] if op in ("unary", "binary") else a
            arg_kinds = [self.kinds[r] for r in refs]
            x = [f"x{r}" for r in refs]
            if op == "unary":
                name = a[0]
                if arg_kinds == ["f"] and kind == "f":
                    if name in _VEC_UNARY_FN:
                        expr = f"{_VEC_UNARY_FN[name]}({x[0]})"
                    elif name == "neg":
                        expr = f"-{x[0]}"
                    elif name == "reciprocal":
                        expr = f"(1.0f / {x[0]})"
                    elif name == "tanh":
                        self.tanh = True
                        expr = f"ember_tanh_v({x[0]})"
                    elif name == "sigmoid":  # the scalar code's two forms share e = exp(-|x|) exactly
                        self.kinds.append(kind)
                        self.stmts.append(f"{fv} e{i} = exp(-fabs({x[0]})); {fv} x{i} = select(e{i} / (1.0f + "
                                          f"e{i}), 1.0f / (1.0f + e{i}), {x[0]} >= 0.0f);")
                        continue
                    elif name == "sign":
                        z = f"({fv})(0.0f)"
                        expr = (f"select(select(select({z}, ({fv})(-1.0f), {x[0]} < 0.0f), ({fv})(1.0f), "
                                f"{x[0]} > 0.0f), {z}, isnan({x[0]}))")
                    else:
                        raise _Unsupported(name)
                elif arg_kinds == ["f"] and kind == "m" and name in _VEC_PREDICATES:
                    expr = _VEC_PREDICATES[name].format(x=x[0])
                elif arg_kinds == ["m"] and kind == "m" and name in ("logical_not", "bitwise_not"):
                    expr = f"({x[0]} == 0)"
                else:
                    raise _Unsupported(name)
            elif op == "binary":
                name = a[0]
                if arg_kinds == ["f", "f"] and kind == "f":
                    if name in _VEC_ARITH:
                        expr = f"({x[0]} {_VEC_ARITH[name]} {x[1]})"
                    elif name in _VEC_BINARY_FN:
                        expr = f"{_VEC_BINARY_FN[name]}({x[0]}, {x[1]})"
                    elif name in ("maximum", "minimum"):  # NaN propagates, as the scalar form
                        f = "fmax" if name == "maximum" else "fmin"
                        expr = f"select({f}({x[0]}, {x[1]}), {x[0]} + {x[1]}, isnan({x[0]}) | isnan({x[1]}))"
                    else:
                        raise _Unsupported(name)
                elif arg_kinds == ["f", "f"] and kind == "m" and name in _VEC_COMPARE:
                    expr = f"({x[0]} {_VEC_COMPARE[name]} {x[1]})"
                elif arg_kinds == ["m", "m"] and kind == "m" and name in _VEC_MASK_BINARY:
                    expr = f"({x[0]} {_VEC_MASK_BINARY[name]} {x[1]})"
                else:
                    raise _Unsupported(name)
            elif op == "where":
                if arg_kinds[0] != "m" or arg_kinds[1] != kind or arg_kinds[2] != kind:
                    raise _Unsupported("where")
                expr = f"select({x[2]}, {x[1]}, {x[0]})"
            elif op == "cast":
                src_kind = arg_kinds[0]
                if src_kind == kind:
                    expr = x[0]
                elif kind == "f":  # bool -> float: a -1 lane is 1.0f
                    expr = f"convert_{fv}(-{x[0]})"
                else:  # float -> bool: nonzero (NaN included) is true
                    expr = f"({x[0]} != 0.0f)"
            else:
                raise _Unsupported(op)
            self.kinds.append(kind)
            self.stmts.append(f"{fv if kind == 'f' else mv} x{i} = {expr};")

    def scalar_decl(self, j: int, t: CType) -> str:
        """``w{j}``: scalar operand ``s{j}`` broadcast to every lane (a bool as a -1/0 mask)."""
        if t.is_bool:
            return f"const {self.mv} w{j} = ({self.mv})(s{j} ? -1 : 0);"
        return f"const {self.fv} w{j} = ({self.fv})(s{j});"

    def load_decl(self, j: int, t: CType, ptr: str, contiguous: bool) -> str:
        """``w{j}``: W lanes of array operand j from ``ptr`` on (``contiguous``), or the one value at ``ptr``
        broadcast (an input whose stride along the walked dim is 0). bool lanes become -1/0 masks."""
        w = self.width
        if contiguous:
            if t.is_bool:
                return f"const {self.mv} w{j} = convert_{self.mv}(vload{w}(0, {ptr})) != 0;"
            return f"const {self.fv} w{j} = vload{w}(0, {ptr});"
        if t.is_bool:
            return f"const {self.mv} w{j} = ({self.mv})(*({ptr}) ? -1 : 0);"
        return f"const {self.fv} w{j} = ({self.fv})(*({ptr}));"

    def aliases(self, names: Sequence[str]) -> list[str]:
        """``x{i}`` for each load and scalar instruction: the operand ``w{j}`` it reads (``names``: the scalar
        body's value names, ``v{j}`` for those instructions)."""
        out = []
        for i, ins in enumerate(self.instrs):
            if ins.op in ("load", "scalar"):
                out.append(f"const {self.fv if self.kinds[i] == 'f' else self.mv} x{i} = w{names[i][1:]};")
        return out

    def helpers(self) -> str:
        """Vector helpers the body calls (tanh: the scalar ember_tanh_float's two branches, selected per lane)."""
        if not self.tanh:
            return ""
        fv = self.fv
        return f"""
static inline {fv} ember_tanh_v({fv} x) {{
    {fv} a = fabs(x);
    {fv} u = x * x;
    {fv} p = -0.006262957180789449f;
    p = p * u + 0.02105950400655511f; p = p * u - 0.053847690148170625f; p = p * u + 0.13332511325760393f;
    p = p * u - 0.3333331272948062f; p = p * u + 0.9999999991619565f;
    {fv} e = exp(-2.0f * a);
    return select(copysign((1.0f - e) / (1.0f + e), x), x * p, a < 0.55f);
}}
"""


def map_vec_source(body: _Body, vb: _VecBody, kernel: Kernel, out_dtypes: Sequence[DType], rank: int,
                   inner: tuple[int, ...]) -> str:
    """The program of an elementwise fused kernel ``ember_fused`` on a CPU driver, with explicit vectors.

    Same parameters as the scalar "linear_chunked" (``rank`` 0) or "chunked" (``rank`` >= 1) layouts of
    :func:`ember_kernels.elementwise.map_kernel`, so the launch is unchanged. Each work-item takes a contiguous run
    of flat indices; the run is cut at the ends of the innermost dim, and every piece is a vector loop (``W`` lanes
    per step) plus a scalar remainder (the scalar body). ``inner`` gives each input's stride along the innermost dim
    (1: contiguous, 0: broadcast, read once per piece); every output's is 1.
    """
    w = vb.width
    n_out = len(out_dtypes)
    sfx = ["" if m == 0 else str(m) for m in range(n_out)]
    outs = [ctype(d) for d in out_dtypes]
    arrays = [j for j, (_, is_array) in enumerate(body.operands) if is_array]
    params = []
    for m, t in enumerate(outs):
        params += [f"__global {t.storage}* out{sfx[m]}", f"long out{sfx[m]}_off"]
    for j, (t, is_array) in enumerate(body.operands):
        params += [f"__global const {t.storage}* a{j}", f"long a{j}_off"] if is_array else [f"{t.compute} s{j}"]
    params.append("long n")
    if rank:
        params += [f"long n{d}" for d in range(rank)]
        for s in sfx:
            params += [f"long so{s}{'_' if s else ''}{d}" for d in range(rank)]
        params += [f"long s{j}_{d}" for j in arrays for d in range(rank)]
    # offsets of the current piece's first element, per output and input
    offs = [f"oo{s}" for s in sfx] + [f"o{j}" for j in arrays]
    strides = {f"oo{s}": f"so{s}{'_' if s else ''}" for s in sfx} | {f"o{j}": f"s{j}_" for j in arrays}
    # whole vectors per work-item: a run ends on a lane boundary (only the last one has a scalar remainder)
    lines = [f"const long chunk = ((n + get_global_size(0) - 1) / get_global_size(0) + {w - 1}) & ~{w - 1}L;",
             "long i = get_global_id(0) * chunk;", "if (i >= n) return;", "const long end = min(i + chunk, n);"]
    scalar_vec = [vb.scalar_decl(j, t) for j, (t, is_array) in enumerate(body.operands) if not is_array]
    lines += scalar_vec
    if rank:
        last = rank - 1
        lines.append(f"long q = i / n{last}, c = i - q * n{last};")
        lines.append(", ".join([f"long {o} = " + ("out" + o[2:] + "_off" if o.startswith("oo") else f"a{o[1:]}_off")
                                for o in offs]) .replace(", long", "; long") + ";")
        for d in range(rank - 2, -1, -1):
            lines.append(f"long c{d} = q % n{d}; q /= n{d};" + "".join(f" {o} += c{d} * {strides[o]}{d};"
                                                                         for o in offs))
        lines.append("".join(f"{o} += c * {strides[o]}{last}; " for o in offs))
        lines.append("while (1) {")
        lines.append(f"    const long run = min(end - i, n{last} - c);")
    else:
        lines.append(", ".join([f"long {o} = " + ("out" + o[2:] + "_off" if o.startswith("oo") else f"a{o[1:]}_off")
                                + " + i" for o in offs]).replace(", long", "; long") + ";")
        lines.append("{")
        lines.append("    const long run = end - i;")
    # the vector loop
    vec_loads, scal_loads = [], []
    bcast_head = []
    for k, j in enumerate(arrays):
        t = body.operands[j][0]
        if inner[k] == 1:
            vec_loads.append(vb.load_decl(j, t, f"a{j} + o{j} + k", True))
            scal_loads.append(f"const {t.compute} v{j} = a{j}[o{j} + k];")
        else:  # broadcast along the row: one read per piece
            bcast_head.append(vb.load_decl(j, t, f"a{j} + o{j}", False))
            scal_loads.append(f"const {t.compute} v{j} = a{j}[o{j}];")
    for j, (t, is_array) in enumerate(body.operands):
        if not is_array:
            scal_loads.append(f"const {t.compute} v{j} = s{j};")
    alias = vb.aliases(body.names)  # load/scalar instructions name their operand's lanes
    vstmts = [st for st in vb.stmts if st]
    stores_v, stores_s = [], []
    for m, (t, out_i) in enumerate(zip(outs, kernel.outputs)):
        ptr, idx = "out" + sfx[m], f"oo{sfx[m]} + k"
        if t.is_bool:
            stores_v.append(f"vstore{w}(convert_uchar{w}(x{out_i} & 1), 0, {ptr} + {idx});")
        else:
            stores_v.append(f"vstore{w}(x{out_i}, 0, {ptr} + {idx});")
        stores_s.append(t.store(ptr, idx, body.names[out_i]) + ";")
    lines += ["    " + x for x in bcast_head]
    lines.append("    long k = 0;")
    lines.append(f"    for (; k + {w} <= run; k += {w}) {{")
    lines += ["        " + x for x in vec_loads + alias + vstmts + stores_v]
    lines.append("    }")
    lines.append("    for (; k < run; ++k) {")
    lines += ["        " + x for x in scal_loads + list(body.stmts) + stores_s]
    lines.append("    }")
    if rank:
        lines.append("    i += run;")
        lines.append("    if (i >= end) break;")
        # next row: back to the row's start (c = 0) and one step along the outer dims, carrying
        lines.append("    " + "".join(f"{o} -= c * {strides[o]}{last}; " for o in offs) + "c = 0;")
        carry = ""  # the innermost outer dim (rank - 2) steps first and carries outwards, as "chunked"
        for d in range(rank - 1):
            step = f"++c{d};" + "".join(f" {o} += {strides[o]}{d};" for o in offs)
            if d == 0:
                carry = step
            else:
                reset = f"c{d} = 0;" + "".join(f" {o} -= {strides[o]}{d} * n{d};" for o in offs)
                carry = f"{step} if (c{d} == n{d}) {{ {reset} {carry} }}"
        lines.append("    " + carry)
    lines.append("}")
    src = f"__kernel void ember_fused({', '.join(params)}) {{\n    " + "\n    ".join(lines) + "\n}\n"
    return header(*body.types) + body.helpers + vb.helpers() + src


# -- elementwise ------------------------------------------------------------------------------------------------
class MapKernel(_Compiled):
    """An elementwise fused kernel: ``run(inputs, scalars, shape, outs)`` writes every output in one pass."""

    def __init__(self, backend: Any, kernel: Kernel, body: _Body, cpu: bool) -> None:
        super().__init__(backend, kernel, body, cpu)
        self.vec: _VecBody | None = None
        if cpu:  # explicit vectors where the body has a vector form (float32 values, bool masks)
            try:
                self.vec = _VecBody(kernel, vec_width(self.rt))
            except _Unsupported:
                self.vec = None

    def source(self, layout: str | tuple[str, tuple[int, ...]], rank: int) -> str:
        """The program text for one (layout, rank bucket); a function of the kernel's structure only. ``layout`` is a
        layout of :func:`ember_kernels.elementwise.map_kernel`, or ``("vec", inner)`` for :func:`map_vec_source`
        (``inner``: each input's stride along the innermost dim, 0 or 1; rank 0 is the linear form)."""
        key = (layout, rank)
        src = self.sources.get(key)
        if src is None:
            if isinstance(layout, tuple):
                assert self.vec is not None
                src = map_vec_source(self.body, self.vec, self.kernel, self.out_dtypes, rank, layout[1])
            else:
                src = map_source(self.body, self.out_dtypes, self.kernel.outputs, layout, rank)
            self.sources[key] = src
        return src

    def _layout(self, shape: tuple[int, ...], inputs: Sequence[CLArray], results: list[CLArray],
                vec: bool = True) -> Any:
        for j, h in enumerate(inputs):
            _check_broadcast(h, shape, f"input {j}")
        n = math.prod(shape)
        n_out = len(results)
        strides = [r.estrides for r in results] + [ew._broadcast_strides(h, shape) for h in inputs]
        sh, strides = ew.collapse(shape, strides)
        linear = len(sh) <= 1 and all(st == (1,) or st == () for st in strides)
        rank = 1 if linear else ew._rank_bucket(len(sh))
        layout: str | tuple[str, tuple[int, ...]]
        if self.cpu:
            layout = "linear_chunked" if linear else "chunked"
        else:
            layout = "linear" if linear else "strided"
        if vec and self.vec is not None:
            if linear:
                layout, rank = ("vec", (1,) * len(inputs)), 0
            elif all(st[-1] == 1 for st in strides[:n_out]) and all(st[-1] in (0, 1) for st in strides[n_out:]):
                layout = ("vec", tuple(st[-1] for st in strides[n_out:]))
        src = self.source(layout, rank)
        self.rt.kernel(src, "ember_fused")  # built now, so a failure names this call
        tail: list[Any] = [n]
        if not linear:
            pad = rank - len(sh)
            tail += [1] * pad + list(sh)
            for st in strides:
                tail += [0] * pad + list(st)
        gsize, lsize = self.rt.grid(n)
        return src, gsize, lsize, tail

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: Sequence[int],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        shape = tuple(shape)
        rt = self.rt
        if outs is None:
            outs = (None,) * len(self.out_dtypes)
        results = [o if o is not None else empty(rt, shape, d) for o, d in zip(outs, self.out_dtypes)]
        if 0 in shape:
            return results
        if self.vec is not None and any(o is not None for o in outs) and _overlaps(outs, inputs):
            # an output sharing memory with another operand, not element for element: the vector loop would read
            # lanes ahead of the scalar order's writes, so this call takes the scalar loop (never memoised)
            lay = self._layout(shape, inputs, results, vec=False)
        else:
            key = (shape, tuple([(h.shape, h.estrides) for h in inputs]),
                   tuple([None if o is None else o.estrides for o in outs]))
            lay = self._layouts.get(key)
            if lay is None:
                lay = self._remember(key, self._layout(shape, inputs, results))
        src, gsize, lsize, tail = lay
        args: list[Any] = []
        for r in results:
            args += (r.buf, r.eoff)
        for h in inputs:
            args += (h.buf, h.eoff)
        if self.body.scalar_slots:
            args += self.body.scalar_args(scalars)
        # kernel objects hold their arguments: the program cache gives each thread its own (a dict lookup)
        rt.kernel(src, "ember_fused")(rt.queue, gsize, lsize, *args, *tail)
        return results


def _overlaps(outs: Sequence[Any], inputs: Sequence[Any]) -> bool:
    """Whether a given output shares its memory block with an input or another output other than as the very same
    view (same offset and strides: element i read and written by the same lane is safe)."""
    for m, o in enumerate(outs):
        if o is None:
            continue
        for h in list(inputs) + [x for k, x in enumerate(outs) if k != m and x is not None]:
            if h.block is o.block and (h.eoff != o.eoff or h.estrides != o.estrides or h.shape != o.shape):
                return True
    return False


# -- reductions -------------------------------------------------------------------------------------------------


def reduce_cpu_source(b: _Body, vb: _VecBody | None, output: int, n_in: int, op: str, tin: CType, nred: int,
                      tout: CType, inner: tuple[int, ...]) -> str:
    """The CPU drivers' fused reduction ``ember_fred_col`` (the parameters and work split of
    :func:`ember_kernels.fusion.reduce_source`'s col kernel: a work-item per (row, chunk)).

    A work-item's chunk of the reduced dims is walked in pieces along the innermost reduced dim, with coordinates
    carried from piece to piece (the col kernel divided the flat index into coordinates for every element, 64-bit
    divisions that cost more than the body). Where ``vb`` is given (float32 sums whose body has a vector form)
    and every input's stride along the innermost reduced dim is 0 or 1 (``inner``), a piece runs ``W`` lanes at a
    time, each lane a compensated (Kahan) sum as the scalar loop's, and the lanes are folded into the scalar sum
    at the end in lane order: a different (still compensated) summation order from the scalar loop.
    """
    a = tin.compute
    arrays = range(n_in)
    value = b.names[output]
    ident = red._identity(op, tin)
    kahan = op == "sum" and tin.is_float
    use_vec = vb is not None and kahan and tin.dtype is dt.float32 and len(inner) == n_in and \
        all(c in (0, 1) for c in inner)
    params = [f"__global {tout.storage}* out, long out_off"]
    for j in arrays:
        params += [f"__global const {b.operands[j][0].storage}* a{j}", f"long a{j}_off"]
    params += [f"{t.compute} s{j}" for j, (t, is_array) in enumerate(b.operands) if not is_array]
    params += ["long rows, long L, long G, long CL", red._outer_params("so", *[f"os{j}_" for j in arrays])]
    params += [f"long r{d}" for d in range(nred)] + [f"long rs{j}_{d}" for j in arrays for d in range(nred)]
    last = nred - 1
    scalars = " ".join(f"const {t.compute} v{j} = s{j};" for j, (t, is_array) in enumerate(b.operands)
                       if not is_array)
    outer = red._outer_code("row", [("ob", "out_off", "so")] + [(f"b{j}", f"a{j}_off", f"os{j}_") for j in arrays])
    if kahan:
        init = f"{a} acc = {ident}, cmp = ({a})0;"
        finish = "acc -= cmp;"

        def step(v: str) -> str:
            return (f"{{ {a} y_ = ({a})({v}) - cmp; {a} t_ = acc + y_; "
                    f"cmp = isfinite(t_) ? (t_ - acc) - y_ : ({a})0; acc = t_; }}")
    else:
        init = f"{a} acc = {ident};"
        finish = ""

        def step(v: str) -> str:
            return f"acc = ember_comb(acc, ({a})({v}));"
    coords = {1: "long k0 = j;", 2: "long k0 = j / r1, k1 = j % r1;",
              3: "long q_ = j / r2, k2 = j % r2, k0 = q_ / r1, k1 = q_ % r1;"}[nred]
    carry = ""
    if nred >= 2:
        carry = f"if (++k{last - 1} == r{last - 1}) {{ k{last - 1} = 0; ++k{last - 2}; }}" if nred == 3 else \
            f"++k{last - 1};"
    lines = [scalars]
    if use_vec:
        assert vb is not None
        fv = vb.fv
        lines += [vb.scalar_decl(j, t) for j, (t, is_array) in enumerate(b.operands) if not is_array]
    lines += ["const long total = rows * G;",
              "for (long t = get_global_id(0); t < total; t += get_global_size(0)) {",
              "    const long c = t / rows, row = t - c * rows;", "    " + outer,
              "    const long j1 = min(L, (c + 1) * CL);", f"    {init}", "    long j = c * CL;", f"    {coords}"]
    if use_vec:
        lines.append(f"    {fv} accv = ({fv})(0.0f), cmpv = ({fv})(0.0f);")
    lines.append("    while (j < j1) {")
    lines.append(f"        const long run = min(j1 - j, r{last} - k{last});")
    for j in arrays:
        lines.append(f"        const long p{j} = b{j} + " + " + ".join(f"k{d} * rs{j}_{d}" for d in range(nred)) + ";")
    lines.append("        long e = 0;")
    if use_vec:
        assert vb is not None
        w = vb.width
        loads = [vb.load_decl(j, b.operands[j][0], f"a{j} + p{j} + e" if inner[k] == 1 else f"a{j} + p{j}",
                              inner[k] == 1) for k, j in enumerate(arrays)]
        alias = vb.aliases(b.names)
        vstep = (f"{{ {fv} y_ = x{output} - cmpv; {fv} t_ = accv + y_; "
                 f"cmpv = select(({fv})(0.0f), (t_ - accv) - y_, isfinite(t_)); accv = t_; }}")
        lines.append(f"        for (; e + {w} <= run; e += {w}) {{")
        lines += ["            " + x for x in loads + alias + [st for st in vb.stmts if st] + [vstep]]
        lines.append("        }")
    sloads = " ".join(
        f"const {t.compute} v{j} = {t.load(f'a{j}', f'p{j} + e * rs{j}_{last}')};"
        for j, (t, is_array) in enumerate(b.operands) if is_array)
    lines.append(f"        for (; e < run; ++e) {{ {sloads} {' '.join(b.stmts)} {step(value)} }}")
    lines.append(f"        j += run; k{last} = 0; {carry}")
    lines.append("    }")
    if use_vec:
        assert vb is not None
        lines += [f"    accv -= cmpv; float lanes_[{vb.width}]; vstore{vb.width}(accv, 0, lanes_);",
                  f"    for (int l_ = 0; l_ < {vb.width}; ++l_) {step('lanes_[l_]')}"]
    lines += [f"    {finish}",
              f"    {{ const long oi = G > 1 ? out_off + t : ob; {tout.store('out', 'oi', 'acc')}; }}", "}"]
    src = f"__kernel void ember_fred_col({', '.join(params)}) {{\n" + "\n".join(lines) + "\n}\n"
    helpers = b.helpers + (vb.helpers() if use_vec and vb is not None else "")
    return header(*b.types, tout) + helpers + red._comb_fn(op, tin) + src


class ReduceKernel(_Compiled):
    """A fused reduction: the body at every point of the iteration shape, combined over the reduced dims in
    registers (no intermediate), written keepdim."""

    def __init__(self, backend: Any, kernel: Kernel, body: _Body, cpu: bool) -> None:
        super().__init__(backend, kernel, body, cpu)
        assert kernel.reduce is not None
        op, dims = kernel.reduce
        self.out_dtype = self.out_dtypes[0]
        self.op = red._BOOL_OP.get(op, op) if self.out_dtype is dt.bool_ else op  # bool sum/prod are any/all
        self.fill = 1 if op in ("prod", "min") else 0  # an empty reduction (max/min of nothing: core rejects)
        self.red = tuple(sorted(set(dims)))
        self.kept = tuple(d for d in range(kernel.rank) if d not in self.red)
        self.tin = ctype(self.out_dtype)
        self.vec: _VecBody | None = None
        if cpu and self.op == "sum" and self.out_dtype is dt.float32:  # compensated float32 sums in vector lanes
            try:
                self.vec = _VecBody(kernel, vec_width(self.rt))
            except _Unsupported:
                self.vec = None

    def source(self, nred: int, tout: CType, inner: tuple[int, ...] = ()) -> str:
        """The program for nred collapsed reduced dims storing tout (the output, or float partials); on CPUs,
        ``inner`` (each input's stride class along the innermost reduced dim: 1, 0 or -1 for any other) picks the
        vector form (see :func:`reduce_cpu_source`)."""
        key = (nred, tout.dtype, inner)
        src = self.sources.get(key)
        if src is not None:
            return src
        if self.cpu:
            src = reduce_cpu_source(self.body, self.vec, self.kernel.outputs[0], self.n_in, self.op, self.tin, nred,
                                    tout, inner)
        else:
            src = reduce_source(self.body, self.kernel.outputs[0], self.n_in, self.op, self.tin, nred, tout, False)
        self.sources[key] = src
        return src

    def _layout(self, shape: tuple[int, ...], inputs: Sequence[CLArray], out: CLArray) -> Any:
        """(source, kernel name, global size, local size, partials shape or None, pass-2 dim, tail args, tout), or
        None where the layout is too scattered to decompose (the call then runs op by op)."""
        for j, h in enumerate(inputs):
            _check_broadcast(h, shape, f"input {j}")
        rt = self.rt
        bstrides = [ew._broadcast_strides(h, shape) for h in inputs]
        kept, rdims = self.kept, self.red
        osh, ost = ew.collapse(tuple(shape[d] for d in kept),
                               [tuple(out.estrides[d] for d in kept)] + [tuple(s[d] for d in kept) for s in bstrides])
        rsh, rst = ew.collapse(tuple(shape[d] for d in rdims), [tuple(s[d] for d in rdims) for s in bstrides])
        if len(osh) > red.OMAX or len(rsh) > red.RMAX:
            return None
        if not rsh:
            rsh, rst = (1,), [(0,) for _ in bstrides]
        rows, length = math.prod(osh), math.prod(rsh)
        col = length <= red._SHORT
        for o, r in zip(ost[1:], rst):  # kept dims inner in memory: neighbouring items read neighbours
            inner_r = [abs(s) for s in r if s]
            if o and o[-1] and inner_r and abs(o[-1]) < min(inner_r):
                col = True
        kernel_name = "ember_fred_col" if self.cpu or col else "ember_fred_row"
        local = 0
        if self.cpu:
            want = 1 if rows >= red._target_items(rt) else min(-(-red._target_items(rt) // rows), length // 2048)
        elif col:
            want = 1 if rows >= red._target_items(rt) else min(-(-red._target_items(rt) // rows), length // 64)
        else:
            local = red._local_size(rt, None, length)
            want = 1 if rows >= red._target_groups(rt) else min(-(-red._target_groups(rt) // rows),
                                                                 length // (local * 16))
        groups, chunk = red._chunks(length, want)
        tout = ctype(red._acc_dtype(self.out_dtype)) if groups > 1 else ctype(self.out_dtype)
        inner = tuple(s[-1] if s[-1] in (0, 1) else -1 for s in rst) if self.vec is not None else ()
        src = self.source(len(rsh), tout, inner)
        knl = rt.kernel(src, kernel_name)
        tail: list[Any] = [rows, length, groups, chunk, *red._outer_args(osh, *ost)]
        tail += list(rsh) + [v for r in rst for v in r]
        pshape = None
        if groups > 1:
            pshape = (rows, groups) if kernel_name == "ember_fred_row" else (groups, rows)
        if kernel_name == "ember_fred_row":
            local = red._local_size(rt, knl, length)
            tail.append(red._local_mem(local * red._acc_itemsize(self.tin)))
            ngroups = min(rows * groups, max(rt.ew_max_groups, red._target_groups(rt)))
            gsize, lsize = (ngroups * local,), (local,)
        elif self.cpu:
            local = red._cpu_local(rt, rows * groups)
            gsize, lsize = (-(-rows * groups // local) * local,), (local,)
        else:
            gsize, lsize = rt.grid(rows * groups)
        return src, kernel_name, gsize, lsize, pshape, 1 if kernel_name == "ember_fred_row" else 0, tail, tout

    def __call__(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: Sequence[int],
                 outs: Sequence[Any] | None = None) -> list[Any]:
        shape = tuple(shape)
        rt = self.rt
        out = outs[0] if outs else None
        out_shape = tuple(1 if d in self.red else n for d, n in enumerate(shape))
        result = out if out is not None else empty(rt, out_shape, self.out_dtype)
        if 0 in out_shape:
            return [result]
        if 0 in shape:  # nothing to reduce: the identity
            ew.assign(result, self.fill)
            return [result]
        key = (shape, tuple([(h.shape, h.estrides) for h in inputs]), None if out is None else out.estrides)
        lay = self._layouts.get(key, False)
        if lay is False:
            lay = self._remember(key, self._layout(shape, inputs, result))
        if lay is None:
            return interpret(self.kernel, self.backend, inputs, scalars, shape, [result])
        src, name, gsize, lsize, pshape, pdim, tail, tout = lay
        target = result if pshape is None else empty(rt, pshape, tout.dtype)
        args: list[Any] = [target.buf, target.eoff]
        for h in inputs:
            args += (h.buf, h.eoff)
        if self.body.scalar_slots:
            args += self.body.scalar_args(scalars)
        rt.kernel(src, name)(rt.queue, gsize, lsize, *args, *tail)
        if pshape is not None:
            final = red._reduce(self.op, False, target, (pdim,), out_shape, self.out_dtype, final=True)
            if out is None:
                return [final]
            ew.assign(out, final)
        return [result]


# -- entry points -----------------------------------------------------------------------------------------------
def compile_kernel(backend: Any, kernel: Kernel, cpu: bool | None = None) -> MapKernel | ReduceKernel | None:
    """The :data:`ember.ir.CompiledKernel` of ``kernel`` on ``backend`` (an OpenCLBackend), or None when the
    generator does not handle it (an unknown op or dtype, an op invalid for its dtype, float64 without fp64).

    ``cpu`` picks the CPU (True) or GPU (False) layouts instead of the device's own (tests use it to run the GPU
    kernels on a CPU driver). Programs are built lazily, on the first call with a given layout.
    """
    if not kernel.outputs or kernel.rank < 0:
        return None
    if kernel.reduce is not None:
        op, dims = kernel.reduce
        if op not in KERNEL_REDUCE_OPS or len(kernel.outputs) != 1 or not dims or \
                any(not 0 <= d < kernel.rank for d in dims):
            return None
    if any(not 0 <= i < len(kernel.body) for i in kernel.outputs):
        return None
    try:
        body = _Body(kernel, backend.rt.fp64)
    except (_Unsupported, KeyError, IndexError, TypeError):
        return None
    is_cpu = backend.rt.is_cpu if cpu is None else cpu
    if kernel.reduce is None:
        return MapKernel(backend, kernel, body, is_cpu)
    return ReduceKernel(backend, kernel, body, is_cpu)


def fusion_compile(backend: Any, kernel: Kernel) -> MapKernel | ReduceKernel | None:
    """:meth:`ember.backend.Backend.fusion_compile` for OpenCL, memoised per kernel on the backend."""
    cache = backend.__dict__.setdefault("_fusion_cache", {})
    try:
        return cache[kernel]
    except KeyError:
        fn = cache[kernel] = compile_kernel(backend, kernel)
        return fn


__all__ = ["MapKernel", "ReduceKernel", "compile_kernel", "fusion_compile"]
