"""Code generation for fused blocks (moved from ember-opencl): one :class:`ember.ir.Kernel` becomes one kernel.

:class:`_Body` turns the kernel's instructions into C statements over the operand values ``v{j}`` with the exact
semantics of running them one by one (every intermediate converted to its instruction's dtype, float16/bfloat16
rounded to their storage precision, scalars as kernel parameters). :func:`map_source` wraps a body in the strided
map template (:func:`.elementwise.map_kernel`); :func:`reduce_source` evaluates it at every point of the reduced dims
and combines it in registers, in the ``col`` and ``row`` layouts of :mod:`.reduction`. The source depends only on
the kernel's structure and the layout, never on sizes or scalar values. Sources are in the shared vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ember import dtypes as dt
from ember.backend import BINARY_OPS, UNARY_OPS
from ember.dtypes import DType
from ember.ir import Kernel

from . import elementwise as ew
from . import reduction as red
from .ctypes_ import CTYPES, CType, ctype, header

_ROUND = {
    # float16/bfloat16 intermediates rounded as a stored result would be (half is only a pointer type without
    # cl_khr_fp16, so the round trip goes through a private ushort)
    dt.float16: ("ember_round_f16", "static inline float ember_round_f16(float x) { ushort u; "
                                    "vstore_half_rte(x, 0, (half*)&u); return vload_half(0, (const half*)&u); }\n"),
    dt.bfloat16: ("ember_round_bf16", "static inline float ember_round_bf16(float x) { "
                                      "return ember_bf16_load(ember_bf16_store(x)); }\n"),
}



class _Unsupported(Exception):
    """The kernel uses something this generator does not handle (fusion_compile returns None)."""



class _Body:
    """The kernel body as OpenCL C statements over the operand values ``v{j}``.

    Operands are the kernel inputs (arrays, in order) and then one scalar parameter per distinct (scalar slot,
    dtype) pair, so :func:`~.elementwise.map_kernel` loads them all at the top of its loop.
    """

    def __init__(self, kernel: Kernel, fp64: bool) -> None:
        dtypes = set(kernel.inputs) | {ins.dtype for ins in kernel.body}
        # complex values are float2/double2 vectors: C's operators are not complex arithmetic, so they never fuse
        if any(d not in CTYPES or d.is_complex for d in dtypes) or (dt.float64 in dtypes and not fp64):
            raise _Unsupported("dtype")
        n_in = len(kernel.inputs)
        self.operands: list[tuple[CType, bool]] = [(ctype(d), True) for d in kernel.inputs]
        self.scalar_slots: list[tuple[int, CType]] = []
        self.names: list[str] = []
        self.stmts: list[str] = []
        used: set[str] = set()
        types: set[CType] = {ctype(d) for d in dtypes}
        slot_of: dict[tuple[int, DType], int] = {}
        rounding: set[DType] = set()
        body = kernel.body
        for i, ins in enumerate(body):
            op, a, r = ins.op, ins.args, ctype(ins.dtype)
            refs = a[1:] if op in ("unary", "binary") else a if op in ("where", "cast") else ()
            if any(not 0 <= x < i for x in refs):
                raise _Unsupported("reference to a later instruction")
            if op == "load":
                if not 0 <= a[0] < n_in or kernel.inputs[a[0]] is not ins.dtype:
                    raise _Unsupported("load")
                self.names.append(f"v{a[0]}")
                continue
            if op == "scalar":
                if not 0 <= a[0] < kernel.scalars:
                    raise _Unsupported("scalar")
                j = slot_of.get((a[0], ins.dtype))
                if j is None:
                    j = slot_of[(a[0], ins.dtype)] = n_in + len(self.scalar_slots)
                    self.operands.append((r, False))
                    self.scalar_slots.append((a[0], r))
                self.names.append(f"v{j}")
                continue
            if op == "unary":
                t = ctype(body[a[1]].dtype)
                if a[0] not in UNARY_OPS or not ew._valid(a[0], t):
                    raise _Unsupported(a[0])
                expr, u = ew._unary_expr(a[0], self.names[a[1]], t)
            elif op == "binary":
                t = ctype(body[a[1]].dtype)
                if a[0] not in BINARY_OPS or not ew._valid(a[0], t) or body[a[2]].dtype is not t.dtype:
                    raise _Unsupported(a[0])
                expr, u = ew._binary_expr(a[0], self.names[a[1]], self.names[a[2]], t)
            elif op == "where":
                t = r
                if body[a[0]].dtype is not dt.bool_ or body[a[1]].dtype is not r.dtype or \
                        body[a[2]].dtype is not r.dtype:
                    raise _Unsupported("where")
                expr, u = f"({self.names[a[0]]} ? {self.names[a[1]]} : {self.names[a[2]]})", set()
            elif op == "cast":
                t = ctype(body[a[0]].dtype)
                expr, u = self.names[a[0]], set()
            else:
                raise _Unsupported(op)
            used |= u
            value = r.convert(expr, t)
            if ins.dtype in _ROUND and op != "where":  # where picks values that are already rounded
                rounding.add(ins.dtype)
                value = f"{_ROUND[ins.dtype][0]}({value})"
            self.stmts.append(f"{r.compute} t{i} = {value};")
            self.names.append(f"t{i}")
        # sorted: the source (and so its on-disk cache key) must not depend on set order
        ordered = sorted(types, key=lambda c: c.dtype.name)
        self.types = ordered
        self.helpers = ew._helpers(used, ordered) + "".join(_ROUND[d][1] for d in sorted(rounding, key=str))

    def scalar_args(self, scalars: Sequence[Any]) -> list[Any]:
        return [t.arg(scalars[k]) for k, t in self.scalar_slots]



def _coords(nred: int, j: str) -> str:
    """Split flat reduced index j into coordinates k0.. (C order over r0..)."""
    if nred == 1:
        return f"const long k0 = {j};"
    if nred == 2:
        return f"const long k0 = {j} / r1, k1 = {j} % r1;"
    return f"const long q_ = {j} / r2, k2 = {j} % r2, k0 = q_ / r1, k1 = q_ % r1;"


def map_source(body: _Body, out_dtypes: Sequence[DType], outputs: Sequence[int], layout: str, rank: int) -> str:
    """The program of an elementwise fused kernel ``ember_fused`` for one (layout, rank bucket) of
    :func:`.elementwise.map_kernel`, storing the body's values ``outputs`` into outputs of ``out_dtypes``."""
    outs = [ctype(d) for d in out_dtypes]
    values = [body.names[i] for i in outputs]
    return (header(*body.types) + body.helpers
            + ew.map_kernel("ember_fused", outs, body.operands, rank, layout, values, body.stmts))


def reduce_source(b: _Body, output: int, n_in: int, op: str, tin: CType, nred: int, tout: CType, cpu: bool) -> str:
    """The program of a fused reduction over ``nred`` collapsed reduced dims: ``ember_fred_col`` (a work-item per
    (row, chunk)) and, unless ``cpu``, ``ember_fred_row`` (a work-group per (row, chunk), local-memory tree),
    combining the body's value ``output`` with ``op`` and storing ``tout`` (the output, or float partials)."""
    a = tin.compute
    arrays = range(n_in)
    value = b.names[output]
    ident = red._identity(op, tin)
    kahan = op == "sum" and tin.is_float
    params = [f"__global {tout.storage}* out, long out_off"]
    for j in arrays:
        params += [f"__global const {b.operands[j][0].storage}* a{j}", f"long a{j}_off"]
    params += [f"{t.compute} s{j}" for j, (t, is_array) in enumerate(b.operands) if not is_array]
    params += ["long rows, long L, long G, long CL", red._outer_params("so", *[f"os{j}_" for j in arrays])]
    params += [f"long r{d}" for d in range(nred)] + [f"long rs{j}_{d}" for j in arrays for d in range(nred)]
    common = ", ".join(params)
    scalars = " ".join(f"const {t.compute} v{j} = s{j};" for j, (t, is_array) in enumerate(b.operands)
                       if not is_array)
    outer = red._outer_code("row", [("ob", "out_off", "so")] + [(f"b{j}", f"a{j}_off", f"os{j}_")
                                                                 for j in arrays])
    loads = " ".join(
        f"const {t.compute} v{j} = {t.load(f'a{j}', f'b{j} + ' + ' + '.join(f'k{d} * rs{j}_{d}' for d in range(nred)))};"  # noqa: E501
        for j, (t, is_array) in enumerate(b.operands) if is_array)
    stmts = " ".join(b.stmts)
    if kahan:  # compensated, as Backend.reduce; a non-finite partial stays what plain summation gives
        init = f"{a} acc = {ident}, cmp = ({a})0;"
        step = (f"{{ {a} y_ = ({a})({value}) - cmp; {a} t_ = acc + y_; "
                f"cmp = isfinite(t_) ? (t_ - acc) - y_ : ({a})0; acc = t_; }}")
        finish = "acc -= cmp;"
    else:
        init = f"{a} acc = {ident};"
        step = f"acc = ember_comb(acc, ({a})({value}));"
        finish = ""

    def element(j: str) -> str:
        return f"{{ {_coords(nred, j)} {loads} {stmts} {step} }}"

    def store(part: str) -> str:
        return f"{{ const long oi = G > 1 ? out_off + {part} : ob; {tout.store('out', 'oi', 'acc')}; }}"

    kernels = f"""
__kernel void ember_fred_col({common}) {{
{scalars}
const long total = rows * G;
for (long t = get_global_id(0); t < total; t += get_global_size(0)) {{
    const long c = t / rows, row = t - c * rows;
    {outer}
    const long j1 = min(L, (c + 1) * CL);
    {init}
    for (long j = c * CL; j < j1; ++j) {element("j")}
    {finish}
    {store("t")}
}}
}}
"""
    if not cpu:  # CPUs use only the col kernel: a smaller program compiles faster
        kernels += f"""
__kernel void ember_fred_row({common}, __local {a}* sv) {{
const int lid = get_local_id(0), ls = get_local_size(0);
{scalars}
const long total = rows * G;
for (long g = get_group_id(0); g < total; g += get_num_groups(0)) {{
    const long row = g / G, c = g - row * G;
    {outer}
    {init}
    for (long j = c * ls + lid; j < L; j += G * ls) {element("j")}
    {finish}
    sv[lid] = acc;
    {red._group_tree("sv[lid] = ember_comb(sv[lid], sv[lid + s]);")}
    if (lid == 0) {{ acc = sv[0]; {store("g")} }}
    barrier(CLK_LOCAL_MEM_FENCE);
}}
}}
"""
    return header(*b.types, tout) + b.helpers + red._comb_fn(op, tin) + kernels
