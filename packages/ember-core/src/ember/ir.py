"""One IR for fusion, remote execution and export (design brief §5).

Two levels, both plain frozen data with no backend code, so any plugin can import them without depending on
another plugin:

* :class:`OpRecord` -- one backend-contract call as data: the method name, the ids of its tensor inputs and
  outputs, the outputs' shapes and dtypes, and its other arguments (tensor arguments appear as :class:`Ref`,
  Python scalar operands as :class:`Scalar`). :func:`relative_form` turns a sequence of records into a hashable
  *key* (positional ids, dims and scalars as placeholders) plus the *bindings* (the concrete dims and scalars),
  so a sequence seen before -- every training step after the first -- finds its compiled plan, server-side graph
  or export without re-analysis.
* :class:`Kernel` -- one fused block as a straight-line program (:class:`Instr`) over a broadcast iteration
  space, in relative form too: no sizes, no scalar values. A backend's :meth:`ember.backend.Backend.fusion_compile`
  hook turns it into a callable (see :data:`KERNEL_OPS` for the instruction set).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from .dtypes import DType

Shape = tuple[int, ...]


# Records are NamedTuples: built and hashed at C speed (a plan-cache lookup hashes a whole sequence), immutable.
# Each marker carries a tag field so that it never compares equal to a plain tuple argument such as dims.


class Ref(NamedTuple):
    """A tensor argument inside :attr:`OpRecord.args`: the record's ``k``-th input."""

    k: int
    tag: str = "ref"


class Scalar(NamedTuple):
    """A Python scalar operand at the top level of :attr:`OpRecord.args` (a value, not structure such as a dim;
    values inside nested tuples are structure and stay literal in the relative form)."""

    value: bool | int | float
    tag: str = "scalar"


class OpRecord(NamedTuple):
    """One backend-contract call: ``getattr(backend, op)(*args)`` with ``Ref(k)`` standing for ``inputs[k]``."""

    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    shapes: tuple[Shape, ...]
    dtypes: tuple[DType, ...]
    args: tuple[Any, ...] = ()


class Placeholder(NamedTuple):
    """A dim or scalar in relative form: ``kind`` is "dim" or the scalar's type name, ``k`` its binding slot."""

    kind: str
    k: int
    tag: str = "placeholder"


class Bindings(NamedTuple):
    """The concrete values a relative form abstracts: dims and scalars, each by slot."""

    dims: tuple[int, ...]
    scalars: tuple[bool | int | float, ...]


class _Abstractor:
    """Replaces dims and scalars by placeholders. Equal dims share a slot (so "these two dims are equal", which
    broadcasting depends on, stays in the key); 0 and 1 stay literal because they change semantics. Runs once per
    plan-cache lookup, so it avoids per-item calls."""

    def __init__(self) -> None:
        self.dim_slot: dict[int, Placeholder] = {}
        self.scalars: list[bool | int | float] = []

    def shape(self, shape: Shape) -> tuple[int | Placeholder, ...]:
        slots = self.dim_slot
        out: list[int | Placeholder] = []
        for n in shape:
            if n == 0 or n == 1:
                out.append(n)
            else:
                p = slots.get(n)
                if p is None:
                    p = slots[n] = Placeholder("dim", len(slots))
                out.append(p)
        return tuple(out)

    def args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """args with each top-level :class:`Scalar` replaced (nested tuples are structure: dims, shapes)."""
        out = None
        for i, a in enumerate(args):
            if type(a) is Scalar:
                if out is None:
                    out = list(args)
                self.scalars.append(a.value)
                out[i] = Placeholder(type(a.value).__name__, len(self.scalars) - 1)
        return args if out is None else tuple(out)

    def bindings(self) -> Bindings:
        dims = [0] * len(self.dim_slot)
        for n, p in self.dim_slot.items():
            dims[p.k] = n
        return Bindings(tuple(dims), tuple(self.scalars))


def relative_form(records: Sequence[OpRecord], inputs: Iterable[tuple[int, Shape, DType]] = (),
                  outputs: Iterable[int] = ()) -> tuple[tuple[Any, ...], Bindings]:
    """The cache key and bindings of a record sequence.

    ``inputs`` lists the external values (id, shape, dtype) in the order the consumer will pass them; ids not
    listed there are numbered in order of first use. ``outputs`` names the ids the consumer wants back. Ids
    become positions, dims and :class:`Scalar` operands become :class:`Placeholder` slots: two sequences that
    differ only in ids, in the value of dims (keeping which dims are equal, 0 or 1) or in scalar values have the
    same key.
    """
    ab = _Abstractor()
    pos: dict[int, tuple[str, int]] = {}
    ext: list[Any] = []
    for vid, shape, dtype in inputs:
        pos[vid] = ("in", len(ext))
        ext.append((ab.shape(shape), dtype))
    n_values = 0
    body = []
    for r in records:
        ins = []
        for vid in r.inputs:
            p = pos.get(vid)
            if p is None:  # an external value the caller did not list: numbered on first use
                p = pos[vid] = ("in", len(ext))
                ext.append(None)
            ins.append(p)
        for vid in r.outputs:
            pos[vid] = ("v", n_values)
            n_values += 1
        shapes = tuple(ab.shape(s) for s in r.shapes) if len(r.shapes) != 1 else (ab.shape(r.shapes[0]),)
        body.append((r.op, tuple(ins), shapes, r.dtypes, ab.args(r.args)))
    outs = tuple(pos[v] for v in outputs)
    return (tuple(ext), tuple(body), outs), ab.bindings()


# ----------------------------------------------------------------------------------------------------------------
# fused kernels
# ----------------------------------------------------------------------------------------------------------------

#: The instruction set of :class:`Kernel` bodies. ``args`` per op:
#:
#: * ``load``:   ``(k,)`` -- kernel input k, read broadcast to the iteration shape (numpy rules, right-aligned)
#: * ``scalar``: ``(k,)`` -- scalar argument k, converted to the instruction's dtype
#: * ``unary``:  ``(name, a)`` -- ``name`` from :data:`ember.backend.UNARY_OPS`
#: * ``binary``: ``(name, a, b)`` -- ``name`` from :data:`ember.backend.BINARY_OPS`; a and b have one dtype
#: * ``where``:  ``(c, a, b)`` -- c is bool; a and b have the instruction's dtype
#: * ``cast``:   ``(a,)`` -- convert to the instruction's dtype (float->int truncates, as ``Backend.cast``)
#:
#: ``a``, ``b`` and ``c`` are indices of earlier instructions. Semantics are exactly those of the backend contract
#: method of the same name, so a kernel's result equals running its instructions one by one as contract calls.
KERNEL_OPS = ("load", "scalar", "unary", "binary", "where", "cast")

#: Reductions a :class:`Kernel` may end in (``Backend.reduce`` semantics: max/min propagate NaN).
KERNEL_REDUCE_OPS = ("sum", "prod", "max", "min")


class Instr(NamedTuple):
    """One instruction: ``op`` from :data:`KERNEL_OPS`, its ``args``, and the ember dtype of its result."""

    op: str
    args: tuple[Any, ...]
    dtype: DType


class Kernel(NamedTuple):
    """A fused block: a straight-line program evaluated at every point of an iteration shape of rank ``rank``.

    * ``inputs``: the dtypes of the tensor inputs (each broadcastable to the iteration shape).
    * ``scalars``: how many scalar arguments there are (each ``scalar`` instruction says its dtype).
    * ``body``: the instructions; ``outputs``: the indices of the instructions whose values are written out.
    * ``reduce``: ``None`` for an elementwise kernel, whose outputs have the iteration shape; else
      ``(op, dims)``: the kernel has exactly one output, the body's value reduced with ``op`` from
      :data:`KERNEL_REDUCE_OPS` over ``dims`` (sorted, non-empty) of the iteration shape, returned with those dims
      kept as size 1 (keepdim).

    A kernel carries no sizes and no scalar values, so one compiled kernel serves every call with the same
    structure. It is hashable and is the key of a backend's compiled-kernel cache.
    """

    rank: int
    inputs: tuple[DType, ...]
    scalars: int
    body: tuple[Instr, ...]
    outputs: tuple[int, ...]
    reduce: tuple[str, tuple[int, ...]] | None = None

    def describe(self) -> str:
        """A readable listing (used in error messages and debug logs)."""
        lines = [f"kernel rank={self.rank} inputs={[str(d) for d in self.inputs]} scalars={self.scalars}"]
        for i, ins in enumerate(self.body):
            lines.append(f"  %{i} = {ins.op}{ins.args} : {ins.dtype}")
        tail = f"  out {list(self.outputs)}"
        if self.reduce is not None:
            tail += f" reduced by {self.reduce[0]} over dims {list(self.reduce[1])} (keepdim)"
        return "\n".join([*lines, tail])


#: What :meth:`ember.backend.Backend.fusion_compile` returns: ``run(inputs, scalars, shape, outs) -> outputs``.
#: ``inputs`` are handles broadcastable to ``shape`` (the iteration shape; any strides, possibly views),
#: ``scalars`` the Python values of the scalar arguments, ``outs`` one entry per output: ``None`` (allocate a new
#: contiguous handle) or a handle of the output's shape and dtype to write in place (possibly a strided view,
#: never aliasing an input other than through the same element). Returns the output handles in order.
CompiledKernel = Callable[[Sequence[Any], Sequence[Any], Shape, Sequence[Any]], list[Any]]


def interpret(kernel: Kernel, backend: Any, inputs: Sequence[Any], scalars: Sequence[Any], shape: Shape,
              outs: Sequence[Any] | None = None) -> list[Any]:
    """Run a kernel op by op with ``backend``'s contract methods (the :data:`CompiledKernel` calling convention).

    This is the reference semantics of :class:`Kernel` and the fallback where a backend's ``fusion_compile``
    returns None; backends test their generated code against it.
    """
    vals: list[Any] = []
    is_handle: list[bool] = []
    in_place = _in_place_outputs(kernel, inputs, outs)
    last_use = _last_uses(kernel)
    deaths = _deaths(kernel)

    def dead_temporary(x: int, i: int, other: int) -> bool:
        """Whether instruction i may overwrite x's value in place: a temporary computed here (not an input, not
        an output), of i's dtype, read for the last time by i, shaped like the result, shared with nothing live."""
        body = kernel.body
        if not is_handle[x] or body[x].op == "load" or last_use[x] != i or x in kernel.outputs:
            return False
        if body[x].dtype is not body[i].dtype:
            return False
        v = vals[x]
        if is_handle[other]:
            w = vals[other]
            if not _broadcasts_into(tuple(w.shape), tuple(v.shape)):
                return False
            # the out-of-place op would lay its result out by both operands (numpy's K order), the in-place one
            # keeps x's: a later reduction would then sum in another order than the eager op by op (1 ulp apart)
            if tuple(w.shape) == tuple(v.shape):
                if getattr(w, "strides", None) != getattr(v, "strides", None):
                    return False
            elif not getattr(getattr(v, "flags", None), "c_contiguous", True):
                return False
        return not any(v is w for w in inputs) and not any(
            w is v for k, w in enumerate(vals) if k != x and last_use[k] >= i)

    def handle(i: int) -> Any:  # a scalar operand becomes a 0-d handle where a contract method needs one
        return vals[i] if is_handle[i] else backend.full((), vals[i], kernel.body[i].dtype)

    for i, ins in enumerate(kernel.body):
        op, a = ins.op, ins.args
        target = in_place.get(i)
        if target is not None and any(w is target for k, w in enumerate(vals) if last_use[k] > i and k != a[1]):
            target = None  # another value still read later is the target object itself: write out of place
        if target is not None:  # out = out (op) b: the backend's in-place op, no temporary and no copy
            backend.inplace_binary(a[0], target, vals[a[2]])
            v, h = target, True
        elif op == "load":
            v, h = inputs[a[0]], True
        elif op == "scalar":
            v, h = scalars[a[0]], False
        elif op == "unary":
            v, h = backend.unary(a[0], handle(a[1])), True
        elif op == "binary":
            x, y = a[1], a[2]
            if not is_handle[x] and not is_handle[y]:
                v = backend.binary(a[0], handle(x), vals[y])
            elif x != y and dead_temporary(x, i, y):  # no new allocation (large ones cost page faults)
                backend.inplace_binary(a[0], vals[x], vals[y])
                v = vals[x]
            elif x != y and a[0] in _COMMUTATIVE and dead_temporary(y, i, x):
                backend.inplace_binary(a[0], vals[y], vals[x])
                v = vals[y]
            else:
                v = backend.binary(a[0], vals[x], vals[y])
            h = True
        elif op == "where":
            c, x, y = a
            # with two scalar branches the result dtype would be unknown: give one branch a handle
            v, h = backend.where(handle(c), vals[x] if is_handle[x] or is_handle[y] else handle(x), vals[y]), True
        elif op == "cast":
            v, h = backend.cast(handle(a[0]), ins.dtype), True
        else:
            raise ValueError(f"interpret: unknown kernel op {op!r}")
        vals.append(v)
        is_handle.append(h)
        for x in deaths[i]:  # values read for the last time here: freed now, as the op-by-op eager run frees them
            vals[x] = None
    results = []
    for j, i in enumerate(kernel.outputs):
        v = handle(i)
        if kernel.reduce is not None:
            if tuple(v.shape) != tuple(shape):
                v = backend.expand(v, tuple(shape))
            v = backend.reduce(kernel.reduce[0], v, kernel.reduce[1], True)
        elif tuple(v.shape) != tuple(shape) or is_handle[i] and kernel.body[i].op == "load":
            v = backend.copy(backend.expand(v, tuple(shape)))  # outputs are new memory, never an input's view
        out = None if outs is None else outs[j]
        if out is not None and v is not out:
            backend.assign(out, v)
            v = out
        results.append(v)
    return results


_COMMUTATIVE = frozenset({"add", "mul", "maximum", "minimum"})


@functools.lru_cache(maxsize=4096)
def _last_uses(kernel: Kernel) -> tuple[int, ...]:
    """Per instruction, the index of the last instruction reading it (outputs count as read at the end)."""
    body = kernel.body
    last = [-1] * len(body)
    for k, ins in enumerate(body):
        operands = ins.args[1:] if ins.op in ("unary", "binary") else ins.args if ins.op in ("where", "cast") else ()
        for x in operands:
            last[x] = k
    for i in kernel.outputs:
        last[i] = len(body)
    return tuple(last)


@functools.lru_cache(maxsize=4096)
def _deaths(kernel: Kernel) -> tuple[tuple[int, ...], ...]:
    """Per instruction, the values it reads for the last time, and itself when nothing reads it (not an output):
    what :func:`interpret` drops after running it."""
    last = _last_uses(kernel)
    out: list[list[int]] = [[] for _ in kernel.body]
    for x, k in enumerate(last):
        if k == -1:
            out[x].append(x)
        elif k < len(kernel.body):
            out[k].append(x)
    return tuple(tuple(d) for d in out)


def _broadcasts_into(small: Shape, big: Shape) -> bool:
    """Whether an operand of shape small combined with one of shape big gives shape big."""
    if len(small) > len(big):
        return False
    return all(b == a or b == 1 for a, b in zip(big[len(big) - len(small):], small))


def _readers(body: tuple[Instr, ...], x: int) -> list[int]:
    """The instructions that use the value of instruction x."""
    found = []
    for k, ins in enumerate(body):
        operands = ins.args[1:] if ins.op in ("unary", "binary") else ins.args if ins.op in ("where", "cast") else ()
        if x in operands:
            found.append(k)
    return found


def _in_place_outputs(kernel: Kernel, inputs: Sequence[Any], outs: Sequence[Any] | None) -> dict[int, Any]:
    """Output instructions ``binary(op, load k, b)`` written into ``inputs[k]`` itself (an in-place op's target)
    where no later instruction reads that input: {instruction index: target}. They run as
    ``Backend.inplace_binary``."""
    if not outs or kernel.reduce is not None:
        return {}
    body, found = kernel.body, {}
    for j, i in enumerate(kernel.outputs):
        out, ins = outs[j], body[i]
        if out is None or ins.op != "binary" or kernel.outputs.count(i) > 1:
            continue
        x, y = ins.args[1], ins.args[2]
        load = body[x]
        if load.op != "load" or inputs[load.args[0]] is not out or load.dtype is not ins.dtype:
            continue
        if x == y or x in kernel.outputs or any(k > i for k in _readers(body, x)):
            continue  # instructions before i have read the old value already; none may read it after the write
        found[i] = out
    return found
