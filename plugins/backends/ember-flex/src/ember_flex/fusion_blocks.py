"""The blocked path of flex's fused kernels: an elementwise kernel run block by block, every instruction over one
cache-sized block before the next block starts.

The numpy path (:func:`ember.ir.interpret`) streams every instruction's full-size result through memory: on 1M
float32 elements each of the GELU chain's nine ops writes 4 MB and the next reads it back. Here a block of
:data:`BLOCK_ELEMS` elements (256 KiB of float32) and its temporaries stay in the core's cache; values are computed
into a few scratch blocks reused as values die (in place where an operand dies at its consumer), outputs are written
straight into their rows of the results, and ranges of blocks run on flex's thread pool.

Numerics: bit-identical to the numpy path. An instruction computed with ``out=`` is a numpy ufunc that flex's
backend method calls as is (``FlexBackend.binary``/``unary``), on float32/float64 operands of the instruction's own
dtype and Python int/float scalars (which numpy 2 adopts into the array's dtype): the same loop on the same
elements as the whole-array call, which flex's pool already splits into chunks the same way. Every other instruction
(casts, ``where``, comparisons on integers, sigmoid, erf, half types, ...) calls the backend method itself on the
block. Elementwise results do not depend on where a block starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.ir import Instr, Kernel

from . import threads as _threads

#: elements per block: a float32 block is 256 KiB, so a chain's few live blocks stay in L2. Smaller blocks measured
#: faster on one thread but slower on two: every ufunc call takes the GIL back, and 16 Ki-element blocks on two
#: threads spent more time handing it over than computing (1M-element GELU chain: 5-6 ms, against 1.7-2.2 ms with
#: 64 Ki elements and 3.3-3.5 ms for the numpy path)
BLOCK_ELEMS = 1 << 16
#: blocks per pool task (the scratch blocks are allocated once per task): 1M elements make 4 tasks, 2 per thread
BLOCKS_PER_TASK = 4
#: the blocked path is considered from this many elements on (below, the whole kernel fits in cache)
BLOCKED_MIN = 1 << 16

_FAST_DTYPES = (dt.float32, dt.float64)
#: Python ints up to this size convert to float64 exactly (and so to float32 exactly as numpy's weak scalars do)
_EXACT_INT = 1 << 53


def operands(ins: Instr) -> tuple[int, ...]:
    """The values an instruction reads (none for a load or a scalar)."""
    if ins.op in ("load", "scalar"):
        return ()
    if ins.op in ("unary", "cast"):
        return (ins.args[-1],)
    if ins.op == "binary":
        return (ins.args[1], ins.args[2])
    return tuple(ins.args)  # where


class BlockPlan:
    """How each instruction of an elementwise kernel runs on a block, and when its scratch block is free again.

    Built once per fused kernel; raises ``ValueError`` for a kernel the blocked path does not take: a reduction, a
    single op, or one with no float32/float64 ufunc step (half types and integers run through the backend's
    methods, which blocks would only call more often).
    """

    def __init__(self, kernel: Kernel, backend: Any) -> None:
        if kernel.reduce is not None:
            raise ValueError("the blocked path runs elementwise kernels only")
        body = kernel.body
        self.kernel = kernel
        self.backend = backend
        last: dict[int, int] = {}
        for i, ins in enumerate(body):
            for j in operands(ins):
                last[j] = i
        outputs = set(kernel.outputs)
        #: per instruction: the ufunc computed into a scratch block (``out=``), or None (backend call / leaf)
        self.ufunc: list[Any] = []
        #: per instruction: the values whose last read it is (their scratch blocks are free after it)
        self.frees: list[tuple[int, ...]] = [() for _ in body]
        for j, i in last.items():
            if j not in outputs:
                self.frees[i] += (j,)
        #: scalar indices whose Python type decides whether the ufunc steps are exact (see :meth:`scalars_ok`)
        scalar_reads: set[int] = set()
        scalar_dtype: dict[int, set[Any]] = {}  # scalar leaf -> the dtypes of the ufunc steps that read it
        for ins in body:
            fn = None
            if ins.op in ("unary", "binary") and ins.dtype in _FAST_DTYPES:
                table = backend._unary if ins.op == "unary" else backend._binary
                cand = table.get(ins.args[0])
                ops = operands(ins)
                arrays = [j for j in ops if body[j].op != "scalar"]
                if type(cand) is np.ufunc and arrays and all(body[j].dtype == ins.dtype for j in arrays):
                    fn = cand
                    for j in ops:
                        if body[j].op == "scalar":
                            scalar_reads.add(body[j].args[0])
                            scalar_dtype.setdefault(j, set()).add(np.dtype(ins.dtype.numpy))
            self.ufunc.append(fn)
        if not any(f is not None for f in self.ufunc) or sum(ins.op not in ("load", "scalar") for ins in body) < 2:
            # every step a backend call on each block, or a single op: no faster than the numpy path op by op
            raise ValueError("no chain of ufunc steps for scratch blocks in this kernel")
        self.scalar_reads = tuple(sorted(scalar_reads))
        #: scalar leaves read only by ufunc steps of one dtype, passed as that dtype's numpy scalar (see scalars_ok)
        self.typed_scalars = tuple((j, next(iter(d))) for j, d in scalar_dtype.items() if len(d) == 1
                                   and all(self.ufunc[i] is not None for i, ins in enumerate(body)
                                           if j in operands(ins)))
        self.outputs = tuple(kernel.outputs)
        self.first_output = {i: j for j, i in reversed(list(enumerate(kernel.outputs)))}
        self._schedules: dict[bool, tuple[list[tuple[Any, ...]], list[Any]]] = {}

    def scalars_ok(self, scalars: Sequence[Any]) -> bool:
        """Whether the scalars the ufunc steps read are Python ints or floats (weak: numpy computes in the array's
        dtype, exactly as flex's backend does); a numpy scalar or a bool would promote differently."""
        for k in self.scalar_reads:
            v = scalars[k]
            t = type(v)
            if t is not float and (t is not int or abs(v) > _EXACT_INT):
                return False
        return True

    # -- one call ------------------------------------------------------------------------------------------------
    def layout(self, inputs: Sequence[Any], shape: tuple[int, ...], outs: Sequence[Any] | None
               ) -> tuple[tuple[int, ...], list[Any], list[bool], list[Any], bool] | None:
        """The call's iteration layout, or None where the blocked path does not apply to these operands.

        Returns (iteration shape, inputs (flattened where the iteration is flat), per input whether blocks slice it,
        given output targets (or None each), whether a target is also an input). The iteration is flat when every
        full-size operand and target is C-contiguous and every other operand holds one element; otherwise blocks
        are ranges of rows of the first axis, full-size operands (first axis of the call's length) sliced, the
        others broadcast whole. A target may be an input itself (an in-place update), never overlap one otherwise."""
        n = math.prod(shape)
        if not shape or n < BLOCKED_MIN:
            return None
        rank = len(shape)
        given = [None] * len(self.outputs) if outs is None else list(outs)
        for o, i in zip(given, self.outputs):
            if o is not None and (type(o) is not np.ndarray or not o.flags.c_contiguous or o.shape != shape
                                  or o.dtype != self.kernel.body[i].dtype.numpy):
                return None
        targets = [o for o in given if o is not None]
        if any(np.may_share_memory(o, p) for k, o in enumerate(targets) for p in targets[k + 1:]):
            return None  # two targets in one memory: the numpy path's order of writes decides
        full: list[bool] = []
        flat = True
        for a in inputs:
            if type(a) is not np.ndarray:
                return None
            if a.shape == shape:
                if not a.flags.c_contiguous:
                    return None
                full.append(True)
            else:
                full.append(a.ndim == rank and a.shape[0] == shape[0] and shape[0] > 1)
                if full[-1] and not a.flags.c_contiguous:
                    return None  # a row-sliced operand's rows must be the whole call's rows
                flat = flat and a.size == 1
        aliased = False
        for o in given:
            if o is None:
                continue
            for a in inputs:
                if np.may_share_memory(o, a):
                    if not (a.shape == shape and a.ctypes.data == o.ctypes.data and a.strides == o.strides):
                        return None
                    aliased = True
        if flat:
            inputs = [a.reshape(-1) if f else a.reshape(()) for a, f in zip(inputs, full)]
            given = [None if o is None else o.reshape(-1) for o in given]
            return (n,), inputs, [a.ndim == 1 for a in inputs], given, aliased
        return shape, list(inputs), full, given, aliased

    def run(self, inputs: Sequence[Any], scalars: Sequence[Any], shape: tuple[int, ...], full: Sequence[bool],
            given: Sequence[Any], aliased: bool, outs: Sequence[Any] | None, result_shape: tuple[int, ...]
            ) -> list[Any]:
        """The kernel's outputs computed block by block over ``shape``'s first axis: the given targets ``outs``
        themselves, new arrays of ``result_shape`` for the others (``given``: the targets as :meth:`layout` made
        them, flattened where the iteration is flat). With
        ``aliased`` (a target is an input) a block's outputs are written only after the block's last instruction,
        so no instruction reads an input row already overwritten."""
        body = self.kernel.body
        results = [np.empty(shape, body[i].dtype.numpy) if o is None else o for o, i in zip(given, self.outputs)]
        rows = shape[0]
        step = max(1, BLOCK_ELEMS // max(math.prod(shape[1:]), 1))
        chunk = BLOCKS_PER_TASK * step
        tasks = [(self._blocks, (lo, min(lo + chunk, rows), step, inputs, scalars, full, results, aliased))
                 for lo in range(0, rows, chunk)]
        if len(tasks) > 1:
            _threads.run(tasks)
        else:
            self._blocks(*tasks[0][1])
        return [r.reshape(result_shape) if outs is None or outs[j] is None else outs[j]
                for j, r in enumerate(results)]

    def _schedule(self, aliased: bool) -> tuple[list[tuple[Any, ...]], list[Any]]:
        """The per-block program, the same for every block: a static assignment of values to scratch slots.

        Returns (steps, slot dtypes). A step is ``("u", i, ufunc, operands, slot)`` (the ufunc into scratch slot
        ``slot``, or into output ``-1 - slot``'s rows), ``("c", i, instr, j)`` (the backend call; ``j`` the output it
        is copied into, or -1) or ``("o", i, j)`` (output j copied from value i at the block's end). A value's slot
        is free again after its last read; a ufunc writes over an operand's slot in place where that operand dies
        there. ``aliased`` (a target is also an input): outputs are held in scratch and copied at the block's end."""
        cached = self._schedules.get(aliased)
        if cached is not None:
            return cached
        body, frees = self.kernel.body, self.frees
        first_out = {} if aliased else self.first_output
        slot_of: dict[int, int] = {}
        dtypes: list[Any] = []
        free: dict[Any, list[int]] = {}
        steps: list[tuple[Any, ...]] = []
        for i, ins in enumerate(body):
            if ins.op in ("load", "scalar"):
                continue
            fn, j = self.ufunc[i], first_out.get(i)
            ops = operands(ins)
            if fn is None:
                steps.append(("c", i, ins, -1 if j is None else j))
            elif j is not None:
                steps.append(("u", i, fn, ops, -1 - j))
            else:
                npdt = np.dtype(ins.dtype.numpy)
                slot = next((slot_of[k] for k in ops if k in slot_of and k in frees[i] and dtypes[slot_of[k]] == npdt),
                            None)
                if slot is None:
                    spare = free.get(npdt)
                    if spare:
                        slot = spare.pop()
                    else:
                        slot = len(dtypes)
                        dtypes.append(npdt)
                slot_of[i] = slot
                steps.append(("u", i, fn, ops, slot))
            for k in frees[i]:
                sk = slot_of.pop(k, None)
                if sk is not None and sk != slot_of.get(i):
                    free.setdefault(dtypes[sk], []).append(sk)
        for j, i in enumerate(self.outputs):  # outputs no step wrote: leaves, repeats, and all when aliased
            if first_out.get(i) != j or body[i].op in ("load", "scalar"):
                steps.append(("o", i, j))
        self._schedules[aliased] = (steps, dtypes)
        return steps, dtypes

    def _blocks(self, lo: int, hi: int, step: int, inputs: Sequence[Any], scalars: Sequence[Any],
                full: Sequence[bool], results: Sequence[Any], aliased: bool) -> None:
        """Rows lo:hi, ``step`` rows at a time, with scratch blocks of this task's own."""
        body, be = self.kernel.body, self.backend
        steps, dtypes = self._schedule(aliased)
        rows = min(step, hi - lo)
        scratch = [np.empty((rows, *results[0].shape[1:]), d) for d in dtypes]
        vals: list[Any] = [None] * len(body)
        loads = []
        for i, ins in enumerate(body):
            if ins.op == "load":
                k = ins.args[0]
                if full[k]:
                    loads.append((i, inputs[k]))
                else:
                    vals[i] = inputs[k]
            elif ins.op == "scalar":
                vals[i] = scalars[ins.args[0]]
        for i, npdt in self.typed_scalars:
            # the numpy scalar of the dtype the weak Python scalar is computed in: the same value, without
            # numpy's conversion of a Python object on every call
            vals[i] = npdt.type(vals[i])
        for b in range(lo, hi, step):
            e = min(b + step, hi)
            if e - b != rows:  # the last, shorter block
                rows = e - b
                scratch = [buf[:rows] for buf in scratch]
            for i, a in loads:
                vals[i] = a[b:e]
            for st in steps:
                kind = st[0]
                if kind == "u":
                    _, i, fn, ops, slot = st
                    target = scratch[slot] if slot >= 0 else results[-1 - slot][b:e]
                    if len(ops) == 2:
                        fn(vals[ops[0]], vals[ops[1]], out=target)
                    else:
                        fn(vals[ops[0]], out=target)
                    vals[i] = target
                elif kind == "c":
                    _, i, ins, j = st
                    r = backend_step(be, ins, body, vals.__getitem__)
                    if j >= 0:
                        np.copyto(results[j][b:e], r)
                    vals[i] = r
                else:
                    _, i, j = st
                    v = vals[i]
                    np.copyto(results[j][b:e], be.full((), v, body[i].dtype) if body[i].op == "scalar" else v)


def backend_step(be: Any, ins: Instr, body: Sequence[Instr], val: Callable[[int], Any]) -> Any:
    """One instruction through the backend method, with :func:`ember.ir.interpret`'s handling of scalar operands
    (``val(j)``: operand j's value, a scalar leaf's as its Python value) and the declared dtype. The fused kernels'
    numpy steps (numexpr path) and the blocked path's backend steps."""

    def handle(j: int) -> Any:  # a scalar leaf as the 0-d array interpret makes of it
        return be.full((), val(j), body[j].dtype) if body[j].op == "scalar" else val(j)

    op, a = ins.op, ins.args
    if op == "unary":
        r = be.unary(a[0], handle(a[1]))
    elif op == "binary":
        x, y = a[1], a[2]
        if body[x].op == "scalar" and body[y].op == "scalar":
            r = be.binary(a[0], handle(x), val(y))
        else:
            r = be.binary(a[0], val(x), val(y))
    elif op == "where":
        c, x, y = a
        both_scalar = body[x].op == "scalar" and body[y].op == "scalar"
        r = be.where(handle(c), handle(x) if both_scalar else val(x), val(y))
    else:
        r = be.cast(handle(a[0]), ins.dtype)
    npdt = ins.dtype.numpy
    return r if r.dtype == npdt else r.astype(npdt)
