"""From a pending graph to a plan of fused kernels, and running a plan.

Partition rules (one pass over the nodes in creation order):

* A pending node is *stored* (written to memory) when it was asked for, when a live handle can still read it,
  when it is a reduction, or when a consumer reads it broadcast (its result is smaller than the consumer's, so
  storing it beats recomputing it per output element). Fills are never stored for a consumer: they become scalar
  arguments. Everything else is *inlined*: computed in registers inside each kernel that needs it.
* Stored elementwise nodes of one shape and one *level* form one kernel (several outputs in one pass); the level
  counts the stored reductions and broadcasts on the way from the leaves, so a kernel never waits on a kernel of
  its own level. Each reduction is one kernel that evaluates its inlined producers per element.

The plan is keyed by the graph's :func:`ember.ir.relative_form`; bindings carry the concrete dims and scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ember import ir
from ember.dtypes import DType

from .graph import Node

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One kernel launch of a plan. Positions index the plan's value table: external leaves first, then the
    pending nodes in creation order."""

    kernel: ir.Kernel
    run: Any  # ir.CompiledKernel, or None to interpret
    inputs: tuple[int, ...]
    scalars: tuple[int, ...]
    shape_of: int
    outputs: tuple[int, ...]
    squeeze: tuple[bool, ...]  # per output: a reduction without keepdim (reshape the keepdim result)
    split: bool = False  # run compiles the body alone (the backend declined the fused reduction): reduce after it


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]

    @property
    def stored(self) -> tuple[int, ...]:
        """The positions of the values the plan writes to memory: every step's outputs."""
        return tuple(sorted(p for st in self.steps for p in st.outputs))


class Graph:
    """A pending subgraph prepared for planning: its external leaves, value positions, records and key."""

    __slots__ = ("nodes", "externals", "pos", "stored", "key", "bindings")

    def __init__(self, nodes: list[Node], targets: set[int]) -> None:
        self.nodes = nodes
        ext: list[Node] = []
        seen: set[int] = set()
        for n in nodes:
            for s in n.srcs:
                if s.value is not None and id(s) not in seen:
                    seen.add(id(s))
                    ext.append(s)
        e = len(ext)
        pos = {id(s): i for i, s in enumerate(ext)}  # the value table: externals first, then the pending nodes
        for i, n in enumerate(nodes, e):
            pos[id(n)] = i
        self.externals = ext
        self.pos = pos
        self.stored = self._stored(targets)
        OpRecord = ir.OpRecord  # noqa: N806 - a local: this runs once per realization
        records = [OpRecord(n.op, tuple([pos[id(s)] for s in n.srcs]), (i,), (n.shape,), (n.dtype,), n.args)
                   for i, n in enumerate(nodes, e)]
        self.key, self.bindings = ir.relative_form(
            records, [(i, s.shape, s.dtype) for i, s in enumerate(ext)], sorted(self.stored))

    def _stored(self, targets: set[int]) -> set[int]:
        e = len(self.externals)
        stored = set()
        for i, n in enumerate(self.nodes):
            h = n.handle() if n.handle is not None else None
            if id(n) in targets or h is not None or n.op == "reduce":
                stored.add(e + i)
            if n.op == "reduce":
                continue  # a reduction evaluates its producer per element of the producer's own shape
            numel = math.prod(n.shape)
            for s in n.srcs:
                if s.value is None and s.op != "full" and math.prod(s.shape) != numel:
                    stored.add(self.pos[id(s)])  # read broadcast: store it once rather than recompute per element
        return stored

    def scalar_slots(self) -> dict[tuple[int, int], int]:
        """(position, arg index) of each Scalar operand -> its slot in ``bindings.scalars`` (relative_form numbers
        them in the same order); needed only to build a plan."""
        e, slots = len(self.externals), {}
        for i, n in enumerate(self.nodes, e):
            for j, a in enumerate(n.args):
                if type(a) is ir.Scalar:
                    slots[(i, j)] = len(slots)
        return slots

    def shape(self, p: int) -> Shape:
        e = len(self.externals)
        return self.externals[p].shape if p < e else self.nodes[p - e].shape


def build_plan(g: Graph, compile_kernel: Any) -> Plan:
    """Partition ``g`` into kernels (see the module docstring) and compile each with ``compile_kernel``."""
    e = len(g.externals)
    level: dict[int, int] = {}
    groups: dict[tuple[Shape, int], list[int]] = {}
    reduces: list[tuple[int, int]] = []
    for i, n in enumerate(g.nodes):
        p = e + i
        lv = 0
        for s in n.srcs:
            if s.value is not None or s.op == "full":
                continue
            sp = g.pos[id(s)]
            # a new level where a kernel must wait for another: after a reduction, before a reduction that loads
            # a stored producer, and at every shape change (a stored value read broadcast, or an inlined one whose
            # shape differs only by size-1 dims); values of one shape and level then never depend on another group
            # of their level
            crosses = s.op == "reduce" or (n.op == "reduce" and sp in g.stored) or s.shape != n.shape
            lv = max(lv, level[sp] + crosses)
        level[p] = lv
        if p in g.stored:
            if n.op == "reduce":
                reduces.append((lv, p))
            else:
                groups.setdefault((n.shape, lv), []).append(p)
    order = [(lv, members[0], members) for (_, lv), members in groups.items()]
    order += [(lv, p, [p]) for lv, p in reduces]
    order.sort(key=lambda t: (t[0], t[1]))
    slots = g.scalar_slots()
    return Plan(tuple(_step(g, slots, members, compile_kernel) for _, _, members in order))


def _step(g: Graph, slots: dict[tuple[int, int], int], outputs: list[int], compile_kernel: Any) -> Step:
    e = len(g.externals)
    members = set(outputs)
    body: list[ir.Instr] = []
    inputs: list[int] = []
    scalars: list[int] = []
    memo: dict[int, int] = {}

    def scalar(slot: int, dtype: DType) -> int:
        scalars.append(slot)
        body.append(ir.Instr("scalar", (len(scalars) - 1,), dtype))
        return len(body) - 1

    def emit(p: int) -> int:
        got = memo.get(p)
        if got is not None:
            return got
        n = g.externals[p] if p < e else g.nodes[p - e]
        if p < e or (p in g.stored and p not in members and n.op != "full"):
            inputs.append(p)
            body.append(ir.Instr("load", (len(inputs) - 1,), n.dtype))
        else:
            srcs = [g.pos[id(s)] for s in n.srcs]
            a = n.args
            if n.op == "full":
                memo[p] = scalar(slots[(p, 0)], n.dtype)
                return memo[p]
            if n.op == "unary":
                body.append(ir.Instr("unary", (a[0], emit(srcs[0])), n.dtype))
            elif n.op == "cast":
                body.append(ir.Instr("cast", (emit(srcs[0]),), n.dtype))
            else:  # binary (op, x, y) and where (c, x, y): operands are Refs or Scalars
                operand_dtype = n.srcs[0].dtype if n.op == "binary" else n.dtype
                first = 1 if n.op == "binary" else 0
                ops = []
                for j in range(first, 3):
                    x = a[j]
                    ops.append(emit(srcs[x.k]) if type(x) is ir.Ref else scalar(slots[(p, j)], operand_dtype))
                head = (a[0],) if n.op == "binary" else ()
                body.append(ir.Instr(n.op, (*head, *ops), n.dtype))
        memo[p] = len(body) - 1
        return memo[p]

    first = g.nodes[outputs[0] - e]
    if first.op == "reduce":  # args: (op, Ref(0), dims, keepdim)
        shape_of = g.pos[id(first.srcs[0])]
        roots, reduce = (emit(shape_of),), (first.args[0], tuple(first.args[2]))
        squeeze = (not first.args[3],)
    else:
        shape_of = outputs[0]
        roots, reduce = tuple(emit(p) for p in outputs), None
        squeeze = (False,) * len(outputs)
    dtypes = tuple((g.externals[p] if p < e else g.nodes[p - e]).dtype for p in inputs)
    kernel = ir.Kernel(len(g.shape(shape_of)), dtypes, len(scalars), tuple(body), roots, reduce)
    # a reduction of a value that is already in memory has nothing to fuse: the backend's own reduce (interpret
    # calls it) is at least as good as generated code
    plain_reduce = reduce is not None and len(body) == 1 and body[0].op == "load"
    run = None if plain_reduce else compile_kernel(kernel)
    split = False
    if run is None and reduce is not None and not plain_reduce:
        # the backend declined the fused reduction: fuse the body alone, then reduce with the backend's reduce
        run = compile_kernel(ir.Kernel(kernel.rank, dtypes, len(scalars), tuple(body), roots, None))
        split = run is not None
    return Step(kernel, run, tuple(inputs), tuple(scalars), shape_of, tuple(outputs), squeeze, split)


def run_plan(plan: Plan, g: Graph, backend: Any, into: dict[int, Any] | None = None) -> int:
    """Run the plan's kernels on ``g``'s current values and realize the stored nodes; returns kernels run.
    ``into`` maps a node's ``id`` to an existing handle its kernel writes in place (an in-place op's target)."""
    e = len(g.externals)
    dest = {g.pos[k]: h for k, h in into.items()} if into else {}
    table: list[Any] = [s.value for s in g.externals] + [None] * len(g.nodes)
    scalars = g.bindings.scalars
    for st in plan.steps:
        ins = [table[p] for p in st.inputs]
        sc = [scalars[k] for k in st.scalars]
        shape = g.shape(st.shape_of)
        outs = [dest.get(p) for p in st.outputs]
        if st.split:
            op, dims = st.kernel.reduce
            res = [backend.reduce(op, st.run(ins, sc, shape, [None])[0], dims, True)]
        elif st.run is not None:
            res = st.run(ins, sc, shape, outs)
        else:
            res = ir.interpret(st.kernel, backend, ins, sc, shape, outs)
        for p, r, sq in zip(st.outputs, res, st.squeeze):
            node = g.nodes[p - e]
            table[p] = r = backend.reshape(r, node.shape) if sq else r
            node.realize_as(r)  # later steps read the table, not the node
    return len(plan.steps)
