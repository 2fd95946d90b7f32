"""``ember.capture``: record what a function does into a graph of :mod:`ember.ir` op records.

>>> graph = ember.capture(model, ember.randn(8, 1, 28, 28))      # doctest: +SKIP
>>> graph.replay(batch)                                           # doctest: +SKIP

While ``fn`` runs, the device of its example inputs is served, *for the capturing thread only*, by a recording
stack (:class:`CaptureStack`) over the device's own stack. Every backend-contract call becomes one
:class:`ember.ir.OpRecord` and returns a :class:`SymbolicHandle`: a handle with a shape, a dtype and a value id, but
no data. Output shapes and dtypes come from shape rules (:data:`SHAPE_RULES`), so no kernel runs for them; a method
without a rule runs once on zero-filled inputs of the right shapes to learn its output specs. An extension op is one
record (``op == "extension"``) with its name, arguments and keyword arguments, its outputs described by the op's
declared output spec.

Tensors that were not made inside ``fn`` (an ``nn.Module``'s parameters and buffers, tensors in its closure) become
*constants* of the graph, named after the module attribute that holds them (``"conv1.weight"``) when ``fn`` is a
module, a bound method of one, or a function with modules among its arguments, closure or globals it names.

Reading a value (``.item()``, ``.numpy()``, the index range check of ``embedding``) needs data: when the example
inputs are tensors (with data) and ``allow_reads`` is true, the value is computed from them on the device (only the
records it depends on run) and the read is listed in :attr:`CapturedGraph.reads` -- the graph then assumes that
value (an index check stays valid for new inputs in range, a value-dependent branch does not). With
:class:`ember.TensorSpec` example inputs, or ``allow_reads=False``, a read raises :class:`CaptureError` naming the
op that needed data.

The graph (:class:`CapturedGraph`) is plain data: ``records`` in execution order, ``inputs`` and ``constants``
(:class:`GraphValue`: id, name, spec), ``outputs`` (ids); :meth:`CapturedGraph.replay` runs it on any device and
:meth:`CapturedGraph.relative_form` gives its cache key. ONNX export and the router's capture channel build on it.

Tensors made inside ``fn`` hold symbolic handles: only the graph's outputs are meant to leave it (as
:meth:`CapturedGraph.replay` results). One kept after the capture has no data (converting its handle to an array
raises :class:`CaptureError`).

In-place contract calls (``assign``, ``setitem``, ``inplace_binary``, ``write_back``) are records whose single
output is the written value's next version (its first input is the value before): replay runs them in place.
Writing in place into a constant (BatchNorm's running statistics in training mode) or through a view raises
:class:`CaptureError`: the graph could not say which tensor changed.
"""

from __future__ import annotations

import itertools
import math
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import dtypes as dt
from .backend import COMPARISON_OPS, PREDICATE_UNARY_OPS, Backend
from .decorator import CONTRACT_METHODS, Decorator, Policy
from .device import Device
from .dtypes import DType
from .errors import DeviceError, DTypeError, UnsupportedError
from .extension import TensorSpec
from .ir import Bindings, OpRecord, Ref, Scalar, relative_form
from .shapes import broadcast_shapes
from .tensor import Tensor

__all__ = ["SHAPE_RULES", "CaptureError", "CaptureStack", "CapturedGraph", "GraphValue", "SymbolicHandle", "capture",
           "execute_record", "is_capturing"]

Shape = tuple[int, ...]
_SCALARS = (bool, int, float)


class CaptureError(UnsupportedError):
    """What a captured function did cannot be recorded as a graph: it read a value without data, wrote in place
    into a constant or through a view, or a tensor made inside a capture was used outside it."""


# ----------------------------------------------------------------------------------------------------------------
# handles and graph values
# ----------------------------------------------------------------------------------------------------------------
class SymbolicHandle:
    """The handle of a tensor inside a capture: a shape, a dtype and the id of the value in the graph, no data.

    An in-place write gives the handle a new ``vid`` (the value's next version)."""

    __slots__ = ("shape", "dtype", "vid", "session", "is_view", "viewed", "__weakref__")

    def __init__(self, shape: Shape, dtype: DType, vid: int, session: _Session, is_view: bool = False) -> None:
        self.shape = shape
        self.dtype = dtype
        self.vid = vid
        self.session = session
        self.is_view = is_view
        self.viewed = False

    @property
    def strides(self) -> None:
        """None: a captured value has no memory layout yet (as a pending fused value)."""
        return None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        # a host backend reading a symbolic handle (a tensor kept after its capture ended) gets a clear error
        raise CaptureError("capture: a tensor made inside a captured function has no data outside it (replay the "
                           "graph to compute it)")

    def __repr__(self) -> str:
        return f"SymbolicHandle(%{self.vid}, shape={self.shape}, dtype={self.dtype})"


@dataclass(frozen=True)
class GraphValue:
    """One value the graph reads from outside: an input of the function (``kind == "input"``, in the order
    :meth:`CapturedGraph.replay` takes them) or a constant (``kind == "constant"``: a parameter, buffer or other
    tensor the function read; ``tensor`` holds it)."""

    id: int
    name: str
    spec: TensorSpec
    kind: str
    tensor: Tensor | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class ExtensionArgs:
    """``OpRecord.args`` of an extension record (``op == "extension"``): the op's registered name, its positional
    arguments (tensors as :class:`ember.ir.Ref`) and its keyword arguments as sorted (name, value) pairs."""

    name: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]


# ----------------------------------------------------------------------------------------------------------------
# shape rules: (method's positional args, with SymbolicHandles as they are) -> [(shape, dtype)], tuple-returning?
# ----------------------------------------------------------------------------------------------------------------
Spec = tuple[Shape, DType]


def _same(h: Any, *_: Any) -> list[Spec]:
    return [(tuple(h.shape), h.dtype)]


def _tensorlike(x: Any) -> bool:
    """A handle as shape rules see it: anything with a shape and an ember dtype (SymbolicHandle, a router's
    handle), not a Python scalar."""
    return type(x) not in _SCALARS and isinstance(getattr(x, "dtype", None), DType) and hasattr(x, "shape")


def _dtype_of_operands(*xs: Any) -> DType:
    for x in xs:
        if _tensorlike(x):
            return x.dtype
    raise DTypeError("capture: an elementwise op without a tensor operand")


def _shape_of(x: Any) -> Shape:
    return tuple(x.shape) if _tensorlike(x) else ()


def _r_binary(op: str, a: Any, b: Any) -> list[Spec]:
    shape = broadcast_shapes(_shape_of(a), _shape_of(b))
    return [(shape, dt.bool_ if op in COMPARISON_OPS else _dtype_of_operands(a, b))]


def _r_where(c: Any, a: Any, b: Any) -> list[Spec]:
    return [(broadcast_shapes(_shape_of(c), _shape_of(a), _shape_of(b)), _dtype_of_operands(a, b))]


def _reduced(shape: Shape, dims: Sequence[int], keepdim: bool) -> Shape:
    if keepdim:
        return tuple(1 if d in dims else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in dims)


def _r_argreduce(op: str, h: Any, dim: int | None, keepdim: bool) -> list[Spec]:
    if dim is None:
        return [((1,) * len(h.shape) if keepdim else (), dt.int64)]
    return [(_reduced(h.shape, (dim,), keepdim), dt.int64)]


def _r_matmul(a: Any, b: Any) -> list[Spec]:
    sa, sb = tuple(a.shape), tuple(b.shape)
    if len(sa) == 1 and len(sb) == 1:
        return [((), a.dtype)]
    if len(sb) == 1:
        return [(sa[:-1], a.dtype)]
    if len(sa) == 1:
        return [(sb[:-2] + sb[-1:], a.dtype)]
    return [(broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1]), a.dtype)]


def _window(n: int, k: int, s: int, p_lo: int, p_hi: int, d: int, ceil_mode: bool) -> int:
    """Output length of a sliding window (PyTorch's pooling/convolution formula, ceil_mode included)."""
    span = n + p_lo + p_hi - d * (k - 1) - 1
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + p_lo:  # the last window must start inside the input or the left padding
        out -= 1
    return out


def _r_conv(x: Any, w: Any, b: Any, stride: Sequence[int], padding: Sequence[tuple[int, int]],
            dilation: Sequence[int], groups: int) -> list[Spec]:
    spatial = tuple(_window(n, k, s, lo, hi, d, False) for n, k, s, (lo, hi), d in
                    zip(x.shape[2:], w.shape[2:], stride, padding, dilation))
    return [((x.shape[0], w.shape[0], *spatial), x.dtype)]


def _r_conv_transpose(x: Any, w: Any, b: Any, stride: Sequence[int], padding: Sequence[int],
                      output_padding: Sequence[int], dilation: Sequence[int], groups: int) -> list[Spec]:
    spatial = tuple((n - 1) * s - 2 * p + d * (k - 1) + op + 1 for n, k, s, p, op, d in
                    zip(x.shape[2:], w.shape[2:], stride, padding, output_padding, dilation))
    return [((x.shape[0], w.shape[1] * groups, *spatial), x.dtype)]


def _r_max_pool(x: Any, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], ceil_mode: bool, return_indices: bool) -> list[Spec]:
    lead = len(x.shape) - len(kernel_size)
    spatial = tuple(_window(n, k, s, p, p, d, ceil_mode) for n, k, s, p, d in
                    zip(x.shape[lead:], kernel_size, stride, padding, dilation))
    shape = (*x.shape[:lead], *spatial)
    return [(shape, x.dtype), (shape, dt.int64)] if return_indices else [(shape, x.dtype)]


def _r_avg_pool(x: Any, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int], ceil_mode: bool,
                count_include_pad: bool, divisor_override: int | None) -> list[Spec]:
    lead = len(x.shape) - len(kernel_size)
    spatial = tuple(_window(n, k, s, p, p, 1, ceil_mode) for n, k, s, p in
                    zip(x.shape[lead:], kernel_size, stride, padding))
    return [((*x.shape[:lead], *spatial), x.dtype)]


def _r_adaptive(x: Any, output_size: Sequence[int], return_indices: bool = False) -> list[Spec]:
    shape = (*x.shape[:len(x.shape) - len(output_size)], *output_size)
    return [(shape, x.dtype), (shape, dt.int64)] if return_indices else [(shape, x.dtype)]


def _r_pad(h: Any, pads: Sequence[tuple[int, int]], mode: str, value: Any) -> list[Spec]:
    return [(tuple(n + lo + hi for n, (lo, hi) in zip(h.shape, pads)), h.dtype)]


def _r_cat(hs: Sequence[Any], dim: int) -> list[Spec]:
    first = tuple(hs[0].shape)
    return [(first[:dim] + (sum(h.shape[dim] for h in hs),) + first[dim + 1:], hs[0].dtype)]


def _r_index_select(h: Any, dim: int, index: Any) -> list[Spec]:
    return [(tuple(h.shape[:dim]) + tuple(index.shape) + tuple(h.shape[dim + 1:]), h.dtype)]


def _r_getitem(h: Any, key: tuple[Any, ...]) -> list[Spec]:
    # numpy's indexing rules on a zero-strided dummy (no memory): int handles become zero index arrays of their
    # shape; a bool mask's result shape depends on its values, so it has no rule (a read decides it)
    np_key = []
    for k in key:
        if _tensorlike(k):
            if k.dtype is dt.bool_:
                raise _NoRule
            np_key.append(np.zeros(k.shape, dtype=np.int64))
        else:
            np_key.append(k)
    dummy = np.broadcast_to(np.zeros((), dtype=np.int8), tuple(h.shape))
    return [(tuple(dummy[tuple(np_key)].shape), h.dtype)]


def _r_sort(h: Any, *_: Any) -> list[Spec]:
    return [(tuple(h.shape), h.dtype), (tuple(h.shape), dt.int64)]


def _r_topk(h: Any, k: int, dim: int, largest: bool, sorted_: bool) -> list[Spec]:
    shape = tuple(h.shape[:dim]) + (k,) + tuple(h.shape[dim + 1:])
    return [(shape, h.dtype), (shape, dt.int64)]


def _r_arange(start: Any, stop: Any, step: Any, dtype: DType) -> list[Spec]:
    return [((max(0, math.ceil((stop - start) / step)),), dtype)]


def _r_einsum(equation: str, *hs: Any) -> list[Spec]:
    dummies = [np.broadcast_to(np.zeros((), dtype=np.float32), tuple(h.shape)) for h in hs]
    return [(tuple(np.einsum(equation, *dummies).shape), hs[0].dtype)]  # einsum of zero-strided dummies: cheap


def _r_interpolate(x: Any, size: Sequence[int], *_: Any) -> list[Spec]:
    return [((*x.shape[:2], *size), x.dtype)]


class _NoRule(Exception):
    """Raised by a rule that cannot decide from specs alone."""


#: contract method -> its shape rule: gets the method's positional arguments, handles as objects with ``.shape`` and
#: ``.dtype`` (an ember DType); returns one (shape, dtype) per output; raises ``_NoRule`` when specs cannot decide
SHAPE_RULES: dict[str, Callable[..., list[Spec]]] = {
    "full": lambda shape, value, dtype: [(tuple(shape), dtype)],
    "arange": _r_arange,
    "cast": lambda h, dtype: [(tuple(h.shape), dtype)],
    "copy": _same, "contiguous": _same, "relu": _same, "flip": _same, "tril": _same, "softmax": _same,
    "cumulative": lambda op, h, dim: _same(h), "clamp": _same, "hardtanh": _same, "masked_fill": _same,
    "scatter": _same, "select_ties": lambda h, value: _same(value), "keep_graph": lambda out, inputs: _same(out),
    "select_at": lambda h, dim, index, values: _same(values),
    "write_back": lambda dst, src, op: _same(dst),
    "unary": lambda op, h: [(tuple(h.shape), dt.bool_ if op in PREDICATE_UNARY_OPS else h.dtype)],
    "binary": _r_binary,
    "where": _r_where,
    "reduce": lambda op, h, dims, keepdim: [(_reduced(h.shape, dims, keepdim), h.dtype)],
    "logsumexp": lambda h, dims, keepdim: [(_reduced(h.shape, dims, keepdim), h.dtype)],
    "clamped_norm": lambda h, dim, eps: [(_reduced(h.shape, (dim,), True), h.dtype)],
    "argreduce": _r_argreduce,
    "matmul": _r_matmul,
    "sort": _r_sort,
    "topk": _r_topk,
    "reshape": lambda h, shape: [(tuple(shape), h.dtype)],
    "permute": lambda h, dims: [(tuple(h.shape[d] for d in dims), h.dtype)],
    "expand": lambda h, shape: [(tuple(shape), h.dtype)],
    "getitem": _r_getitem,
    "cat": _r_cat,
    "rand": lambda shape, dtype: [(tuple(shape), dtype)],
    "randn": lambda shape, dtype: [(tuple(shape), dtype)],
    "randint": lambda low, high, shape, dtype: [(tuple(shape), dtype)],
    "gather": lambda h, dim, index: [(tuple(index.shape), h.dtype)],
    "index_select": _r_index_select,
    "embedding": lambda weight, index, padding_idx: [((*index.shape, weight.shape[1]), weight.dtype)],
    "einsum": _r_einsum,
    "conv": _r_conv,
    "conv_transpose": _r_conv_transpose,
    "max_pool": _r_max_pool,
    "avg_pool": _r_avg_pool,
    "adaptive_avg_pool": _r_adaptive,
    "adaptive_max_pool": _r_adaptive,
    "interpolate": _r_interpolate,
    "pad": _r_pad,
}

#: methods that return a tuple of handles (always, or when their return_indices argument is true)
_TUPLE_RESULTS = {"sort": None, "topk": None, "max_pool": 6, "adaptive_max_pool": 2}
#: positions of Python scalar *operands* (values, not structure such as dims): they become ir.Scalar, so a graph
#: that differs only in them has the same relative form (a new learning rate replays the same graph)
SCALAR_OPERANDS: dict[str, tuple[int, ...]] = {
    "binary": (1, 2), "where": (1, 2), "full": (1,), "clamp": (1, 2), "hardtanh": (1, 2), "masked_fill": (2,),
    "inplace_binary": (2,), "assign": (1,), "setitem": (2,), "scatter": (3,),
}
#: in-place contract methods: the handle at position IN_PLACE[name] is written
IN_PLACE = {"assign": 0, "setitem": 0, "inplace_binary": 1, "write_back": 0}
#: methods whose result may share memory with their first tensor argument (a write through it is refused)
VIEW_OPS = frozenset({"reshape", "permute", "expand", "getitem"})
#: contract methods a capture stack does not record: plumbing, reads and host transfers have their own handling
_NOT_RECORDED = frozenset({"lift", "lower", "sync", "memory_report", "memory_dry_run", "describe", "fusion_compile",
                           "may_share_memory", "from_numpy", "to_numpy", "dtype_of", "new_random_stream",
                           "run_extension", "extension_kernel", "seed"})


# ----------------------------------------------------------------------------------------------------------------
# executing records (replay, and the reads a capture answers from example data)
# ----------------------------------------------------------------------------------------------------------------
def _resolve(a: Any, ins: Sequence[Any]) -> Any:
    t = type(a)
    if t is Ref:
        return ins[a.k]
    if t is Scalar:
        return a.value
    if t is tuple:
        return tuple(_resolve(x, ins) for x in a)
    return a


def execute_record(record: OpRecord, stack: Any, device: Device, values: dict[int, Any],
                   dtypes: dict[int, DType], *, functional: bool = False) -> None:
    """Run one record on ``stack`` (the stack of ``device``): its inputs are read from ``values`` (id -> handle of
    that stack) and its outputs stored there. ``dtypes`` gives each id's dtype (extension ops take tensors).

    An in-place record writes into its target's handle, as the function did; ``functional=True`` writes into a
    copy instead, so the value before the write stays intact (a capture's reads must not change example data)."""
    ins = [values[v] for v in record.inputs]
    if functional and record.op in IN_PLACE:
        k = record.args[IN_PLACE[record.op]].k
        ins[k] = stack.copy(ins[k])
    if record.op == "extension":
        from . import extension

        ext: ExtensionArgs = record.args[0]
        op = extension.get(ext.name)
        if op is None:
            raise CaptureError(f"replay: the extension op {ext.name!r} is not registered in this process")
        targs = [Tensor._make(x, dtypes[v], device) for x, v in zip(ins, record.inputs)]
        out = op(*_resolve(ext.args, targs), **dict(ext.kwargs))
        outs = out if isinstance(out, tuple) else (out,)
        for vid, t in zip(record.outputs, outs):
            values[vid] = t._h
        return
    result = getattr(stack, record.op)(*_resolve(record.args, ins))
    if record.op in IN_PLACE:
        if record.outputs:  # a record without outputs (the router's form) leaves the written value's id as is
            written = ins[record.args[IN_PLACE[record.op]].k]
            values[record.outputs[0]] = written if result is None else result
        return
    if len(record.outputs) == 1 and not isinstance(result, tuple):
        values[record.outputs[0]] = result
    else:
        for vid, h in zip(record.outputs, result):
            values[vid] = h


# ----------------------------------------------------------------------------------------------------------------
# the capture session and stack
# ----------------------------------------------------------------------------------------------------------------
class _Session:
    """One capture in progress: the records so far, the external values, the example data for reads."""

    def __init__(self, device: Device, real_stack: Any, names: dict[int, str], allow_reads: bool) -> None:
        self.device = device
        self.real_stack = real_stack
        self.names = names
        self.allow_reads = allow_reads
        self.records: list[OpRecord] = []
        self.inputs: list[GraphValue] = []
        self.constants: list[GraphValue] = []
        self.const_ids: dict[int, int] = {}  # id(real handle) -> value id
        self.keep: list[Any] = []  # real handles of constants stay alive (their id() keys const_ids)
        self.data: dict[int, Any] = {}  # value id -> real handle (inputs with data, constants, computed reads)
        self.dtypes: dict[int, DType] = {}
        self.reads: list[str] = []
        self.fallbacks: set[str] = set()
        self.ext_calls: dict[int, Any] = {}  # index of an extension record -> its call (for reads)
        self._ids = itertools.count()
        self.closed = False

    def new_id(self) -> int:
        return next(self._ids)

    def constant(self, h: Any, dtype: DType) -> int:
        """The value id of a real handle read by the function (registered as a constant on first use)."""
        vid = self.const_ids.get(id(h))
        if vid is None:
            vid = self.new_id()
            self.const_ids[id(h)] = vid
            self.keep.append(h)
            name = self.names.get(id(h)) or f"constant{len(self.constants)}"
            t = Tensor._make(h, dtype, self.device)
            self.constants.append(GraphValue(vid, name, TensorSpec(tuple(h.shape), dtype), "constant", t))
            self.data[vid] = h
            self.dtypes[vid] = dtype
        return vid

    def value_for_read(self, h: SymbolicHandle, what: str) -> Any:
        """The real handle of ``h``'s value, computed from the example data (a read); a CaptureError when the
        capture has no data or reads are not allowed."""
        if h.vid in self.data:
            return self.data[h.vid]
        caller = _caller()
        if not self.allow_reads:
            raise CaptureError(f"capture: {caller} reads the value of a tensor ({what}) and reads are off "
                               "(allow_reads=False)")
        needed = self._needed(h.vid)
        if needed is None:
            raise CaptureError(f"capture: {caller} reads the value of a tensor ({what}), which needs data; the "
                               "example inputs are TensorSpecs (pass tensors to allow data-dependent steps)")
        stack, values = self.real_stack, self.data  # every value computed is kept: each record runs once
        for i in needed:
            r = self.records[i]
            if r.op == "extension":
                call = self.ext_calls[i]
                ins = [values[v] for v in r.inputs]
                out = stack.run_extension(call.with_args(_resolve(r.args[0].args, ins), stack))
                for vid, o in zip(r.outputs, out if isinstance(out, tuple) else (out,)):
                    values[vid] = o
            else:
                execute_record(r, stack, self.device, values, self.dtypes, functional=True)
        self.reads.append(caller)
        return values[h.vid]

    def _needed(self, vid: int) -> list[int] | None:
        """Indices of the records that compute ``vid`` from values with data, or None when an input without data
        is among what it depends on."""
        producer = {o: i for i, r in enumerate(self.records) for o in r.outputs}
        needed: set[int] = set()
        stack = [vid]
        while stack:
            v = stack.pop()
            if v in self.data:
                continue
            i = producer.get(v)
            if i is None:
                return None
            if i in needed:
                continue
            needed.add(i)
            stack.extend(self.records[i].inputs)  # an in-place record's inputs hold the version it writes over
        return sorted(needed)


def _caller() -> str:
    """The nearest ember or user function outside this module (names the op that needed data)."""
    f = sys._getframe(1)
    here = __file__
    chain = []
    while f is not None and len(chain) < 2:
        if f.f_code.co_filename != here and "decorator.py" not in f.f_code.co_filename:
            chain.append(f"{f.f_globals.get('__name__', '?')}.{f.f_code.co_name}")
        f = f.f_back
    return " <- ".join(chain) or "?"


_local = threading.local()


def is_capturing() -> bool:
    """True while the calling thread runs a function under :func:`capture`."""
    return getattr(_local, "session", None) is not None


def _is_handle(a: Any) -> bool:
    t = type(a)
    return not (a is None or t in _SCALARS or t is str or t is tuple or t is list or t is slice or a is Ellipsis
                or isinstance(a, DType)) and hasattr(a, "shape")


class CaptureStack(Decorator):
    """The stack that serves a device while a thread captures on it: each contract call of that thread becomes an
    :class:`ember.ir.OpRecord` returning :class:`SymbolicHandle` s; other threads' calls go to the device's own
    stack unchanged. Installed and removed by :func:`capture`; not a registered decorator."""

    decorator_name = "capture"
    #: other threads may use the device's gradient API (tracking, grad_of, ...) while one thread captures
    optional_policy = Policy.PASS

    def __init__(self, inner: Backend, device: Device) -> None:
        super().__init__(inner)
        self.device = device
        self.users = 0  # captures in progress on this device (the stack is removed when the last one ends)

    @property  # type: ignore[override]
    def differentiable(self) -> bool:
        """The device's own stack's, for other threads; False in the capturing thread (forward graphs only)."""
        return self._session() is None and bool(getattr(self.inner, "differentiable", False))

    def _session(self) -> _Session | None:
        s: _Session | None = getattr(_local, "session", None)
        return s if s is not None and s.device is self.device else None

    # -- recording ---------------------------------------------------------------------------------------------
    def _record(self, s: _Session, name: str, args: tuple[Any, ...]) -> Any:
        inputs: list[int] = []
        pos: dict[int, int] = {}

        def ref(h: Any) -> Ref:
            if isinstance(h, SymbolicHandle):
                if h.session is not s:
                    raise CaptureError(f"capture: {name} got a tensor from another capture (or one used after its "
                                       "capture ended)")
                vid = h.vid
            else:
                vid = s.constant(h, self.inner.dtype_of(h))
            k = pos.get(vid)
            if k is None:
                k = pos[vid] = len(inputs)
                inputs.append(vid)
            return Ref(k)

        def lower(a: Any) -> Any:
            # lists and tuple subclasses (ember.Size) become plain tuples: records are hashable plain data
            if type(a) is list or (isinstance(a, tuple) and not hasattr(a, "_fields")):
                return tuple(lower(x) for x in a)
            return ref(a) if _is_handle(a) else a

        scalar_pos = SCALAR_OPERANDS.get(name, ())
        rec_args = tuple(Scalar(a) if i in scalar_pos and type(a) in _SCALARS else lower(a)
                         for i, a in enumerate(args))
        written = IN_PLACE.get(name)
        if written is not None:
            target = args[written]
            if not isinstance(target, SymbolicHandle):
                label = s.names.get(id(target), "a tensor made outside the captured function")
                raise CaptureError(f"capture: {name} writes in place into {label}, which the graph reads as a "
                                   "constant (capture a module in eval mode, or make the tensor inside the function)")
            if target.is_view or target.viewed:
                raise CaptureError(f"capture: {name} writes in place through a view (or into a tensor that has "
                                   "views); the graph cannot say which values change")
            vid = s.new_id()
            s.records.append(OpRecord(name, tuple(inputs), (vid,), (tuple(target.shape),), (target.dtype,),
                                      rec_args))
            s.dtypes[vid] = target.dtype
            target.vid = vid
            return None if name != "write_back" else target
        specs, as_tuple = self._specs(s, name, args)
        outs = []
        is_view = name in VIEW_OPS
        for shape, dtype in specs:
            vid = s.new_id()
            s.dtypes[vid] = dtype
            outs.append(SymbolicHandle(tuple(int(n) for n in shape), dtype, vid, s, is_view))
        if is_view and isinstance(args[0], SymbolicHandle):
            args[0].viewed = True
        s.records.append(OpRecord(name, tuple(inputs), tuple(o.vid for o in outs), tuple(o.shape for o in outs),
                                  tuple(o.dtype for o in outs), rec_args))
        return tuple(outs) if as_tuple else outs[0]

    def _specs(self, s: _Session, name: str, args: tuple[Any, ...]) -> tuple[list[Spec], bool]:
        flag = _TUPLE_RESULTS.get(name, -1)
        as_tuple = flag is None or (flag >= 0 and len(args) > flag and bool(args[flag]))
        rule = SHAPE_RULES.get(name)
        if rule is not None:
            try:
                return rule(*(self._spec_view(a) for a in args)), as_tuple
            except _NoRule:
                pass
        return self._specs_by_running(s, name, args)

    def _spec_view(self, a: Any) -> Any:
        """Rules read ``.shape`` and ``.dtype``: real handles (constants) get a SymbolicHandle-like view."""
        t = type(a)
        if t is tuple or t is list:
            return t(self._spec_view(x) for x in a)
        if _is_handle(a) and not isinstance(a, SymbolicHandle):
            return SymbolicHandle(tuple(a.shape), self.inner.dtype_of(a), -1, None)  # type: ignore[arg-type]
        return a

    def _specs_by_running(self, s: _Session, name: str, args: tuple[Any, ...]) -> tuple[list[Spec], bool]:
        """Output specs of a method without a shape rule: run it once on the device on zero-filled stand-ins
        (bool masks in getitem keys need their data: that is a read)."""
        inner = self.inner
        s.fallbacks.add(name)

        def standin(a: Any, in_key: bool) -> Any:
            t = type(a)
            if t is tuple or t is list:
                return t(standin(x, in_key) for x in a)
            if isinstance(a, SymbolicHandle):
                if in_key and a.dtype is dt.bool_:
                    return s.value_for_read(a, f"the boolean mask of {name}")
                return inner.full(a.shape, 0, a.dtype)
            return a

        out = getattr(inner, name)(*(standin(a, name in ("getitem", "setitem")) for a in args))
        outs = out if isinstance(out, tuple) else (out,)
        return [(tuple(h.shape), inner.dtype_of(h)) for h in outs], isinstance(out, tuple)

    # -- plumbing with capture semantics ------------------------------------------------------------------------
    def to_numpy(self, h: Any) -> np.ndarray:
        s = self._session()
        if isinstance(h, SymbolicHandle):
            if s is None or h.session is not s:
                raise CaptureError("capture: a tensor made inside a captured function has no data outside it "
                                   "(replay the graph to compute it)")
            return self.inner.to_numpy(s.value_for_read(h, "to_numpy"))
        return self.inner.to_numpy(h)

    def from_numpy(self, array: np.ndarray) -> Any:
        return self.inner.from_numpy(array)  # host data is a constant of the graph once an op reads it

    def dtype_of(self, h: Any) -> DType:
        return h.dtype if isinstance(h, SymbolicHandle) else self.inner.dtype_of(h)

    def may_share_memory(self, a: Any, b: Any) -> bool:
        if isinstance(a, SymbolicHandle) or isinstance(b, SymbolicHandle):
            return True
        return self.inner.may_share_memory(a, b)

    def new_random_stream(self, seed: int) -> Any:
        if self._session() is not None:
            raise CaptureError("capture: an ember.Generator's draws cannot be recorded (use the device's stream)")
        return self.inner.new_random_stream(seed)

    def seed(self, seed: int) -> None:
        if self._session() is not None:
            raise CaptureError("capture: reseeding inside a captured function is not recorded")
        self.inner.seed(seed)

    def sync(self) -> None:
        if self._session() is None:
            self.inner.sync()

    def run_extension(self, call: Any) -> Any:
        s = self._session()
        if s is None:
            return self.inner.run_extension(call.with_args(call.args, self.inner))
        if call.spec is None:
            raise CaptureError(f"capture: the extension op {call.op.name} declares no output spec, so its outputs "
                               "cannot be described without running it")
        inputs: list[int] = []
        rec_args = []
        for i, a in enumerate(call.args):
            if i in call.dtypes:
                vid = a.vid if isinstance(a, SymbolicHandle) else s.constant(a, call.dtypes[i])
                rec_args.append(Ref(len(inputs)))
                inputs.append(vid)
            else:
                rec_args.append(a)
        specs = call.spec if isinstance(call.spec, tuple) else (call.spec,)
        outs = []
        for sp in specs:
            vid = s.new_id()
            s.dtypes[vid] = sp.dtype
            outs.append(SymbolicHandle(tuple(sp.shape), sp.dtype, vid, s))
        ext = ExtensionArgs(call.op.name, tuple(rec_args), tuple(sorted(call.kwargs.items())))
        s.ext_calls[len(s.records)] = call
        s.records.append(OpRecord("extension", tuple(inputs), tuple(o.vid for o in outs),
                                  tuple(o.shape for o in outs), tuple(o.dtype for o in outs), (ext,)))
        return tuple(outs) if isinstance(call.spec, tuple) else outs[0]


def _recording_method(name: str) -> Callable[..., Any]:
    def method(self: CaptureStack, *args: Any) -> Any:
        s = self._session()
        if s is None:  # another thread's call: the device's own stack
            return getattr(self.inner, name)(*args)
        return self._record(s, name, args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name}: recorded as an ember.ir.OpRecord in the capturing thread."
    return method


for _name in sorted(CONTRACT_METHODS - _NOT_RECORDED):
    setattr(CaptureStack, _name, _recording_method(_name))
CaptureStack._resolve_policies()  # every contract method is now handled by the class
del _name


# ----------------------------------------------------------------------------------------------------------------
# the graph
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CapturedGraph:
    """A function's ops as :mod:`ember.ir` records, with its inputs, constants and outputs.

    * ``records``: :class:`ember.ir.OpRecord` s in execution order. ``op`` is a backend-contract method name
      (``"conv"``, ``"binary"``, ...; its Python signature in :class:`ember.backend.Backend` says what each of
      ``args`` is), or ``"extension"`` with ``args == (ExtensionArgs(name, args, kwargs),)``. ``Ref(k)`` in args
      is the record's ``inputs[k]``; :class:`ember.ir.Scalar` wraps scalar operands.
    * ``inputs``: the function's tensor inputs (:class:`GraphValue`, ``kind="input"``), in argument order;
      ``constants``: the tensors it read from elsewhere (``kind="constant"``, ``name`` from modules).
    * ``outputs``: the ids of the returned tensors, flattened in order; ``output_tree`` rebuilds the structure.
    * ``reads``: the functions that read a value during capture (the graph assumes those values), ``fallbacks``
      the contract methods whose output specs were learned by running them on stand-ins.
    """

    records: tuple[OpRecord, ...]
    inputs: tuple[GraphValue, ...]
    constants: tuple[GraphValue, ...]
    outputs: tuple[int, ...]
    output_specs: tuple[TensorSpec, ...]
    output_tree: Any
    device: Device
    reads: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()
    #: constants copied to other devices by replay, by (constant id, device)
    _moved: dict[tuple[int, Device], Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def dtypes(self) -> dict[int, DType]:
        """Every value id's dtype (inputs, constants and record outputs)."""
        out = {v.id: v.spec.dtype for v in (*self.inputs, *self.constants)}
        for r in self.records:
            out.update(zip(r.outputs, r.dtypes))
        return out

    @property
    def shapes(self) -> dict[int, Shape]:
        """Every value id's shape."""
        out = {v.id: v.spec.shape for v in (*self.inputs, *self.constants)}
        for r in self.records:
            out.update(zip(r.outputs, r.shapes))
        return out

    def ops(self) -> dict[str, int]:
        """How many records of each op (extension ops by their name)."""
        counts: dict[str, int] = {}
        for r in self.records:
            key = r.args[0].name if r.op == "extension" else r.op
            counts[key] = counts.get(key, 0) + 1
        return counts

    def relative_form(self) -> tuple[tuple[Any, ...], Bindings]:
        """The graph's :func:`ember.ir.relative_form` (cache key and bindings), inputs then constants first.
        Slices in arguments appear in the key as ``("slice", start, stop, step)`` (a slice is unhashable before
        Python 3.12)."""
        ext = [(v.id, v.spec.shape, v.spec.dtype) for v in (*self.inputs, *self.constants)]
        records = [r._replace(args=_hashable(r.args)) for r in self.records]
        return relative_form(records, ext, self.outputs)

    def describe(self) -> str:
        """A readable listing, one record a line."""
        lines = [f"graph on {self.device}: {len(self.records)} records"]
        for v in (*self.inputs, *self.constants):
            lines.append(f"  %{v.id} = {v.kind} {v.name} : {list(v.spec.shape)} {v.spec.dtype}")
        for r in self.records:
            outs = ", ".join(f"%{o}" for o in r.outputs) or "-"
            lines.append(f"  {outs} = {r.op}{_show_args(r)}  # {[list(s) for s in r.shapes]}")
        lines.append(f"  return {', '.join(f'%{o}' for o in self.outputs)}")
        return "\n".join(lines)

    def replay(self, *inputs: Any, device: Device | str | None = None) -> Any:
        """Run the graph on ``device`` (default: the first input's device, else the capture's) with new inputs of
        the captured shapes and dtypes; returns what the function returned (tensors on that device).

        Inputs on another device are moved there; constants are copied there once per device."""
        from .device import as_device

        if len(inputs) != len(self.inputs):
            raise CaptureError(f"replay: the graph takes {len(self.inputs)} inputs, got {len(inputs)}")
        if device is None:
            first = next((x for x in inputs if isinstance(x, Tensor)), None)
            dev = first.device if first is not None else self.device
        else:
            dev = as_device(device)
        stack = dev.stack
        values: dict[int, Any] = {}
        for v, x in zip(self.inputs, inputs):
            if not isinstance(x, Tensor):
                raise DTypeError(f"replay: input {v.name} must be a Tensor, got {type(x).__name__}")
            if tuple(x.shape) != v.spec.shape or x.dtype is not v.spec.dtype:
                raise _shape_error(v, x)
            values[v.id] = (x if x.device is dev else x.to(dev))._h
        for c in self.constants:
            values[c.id] = self._constant_on(c, dev)._h
        dtypes = self.dtypes
        for r in self.records:
            execute_record(r, stack, dev, values, dtypes)
        flat = [Tensor._make(values[o], dtypes[o], dev) for o in self.outputs]
        return _unflatten(self.output_tree, iter(flat))

    def _constant_on(self, c: GraphValue, dev: Device) -> Tensor:
        assert c.tensor is not None
        if c.tensor.device is dev:
            return c.tensor
        key = (c.id, dev)
        t = self._moved.get(key)
        if t is None:
            t = self._moved[key] = c.tensor.to(dev)
        return t


def _hashable(a: Any) -> Any:
    t = type(a)
    if t is slice:
        return ("slice", a.start, a.stop, a.step)
    if t is tuple:
        return tuple(_hashable(x) for x in a)
    return a


def _shape_error(v: GraphValue, x: Tensor) -> Exception:
    from .errors import ShapeError

    return ShapeError(f"replay: input {v.name} was captured as {list(v.spec.shape)} {v.spec.dtype}, got "
                      f"{list(x.shape)} {x.dtype} (capture again for other shapes)")


def _show_args(r: OpRecord) -> str:
    def show(a: Any) -> str:
        if type(a) is Ref:
            return f"%{r.inputs[a.k]}"
        if type(a) is Scalar:
            return repr(a.value)
        if type(a) is tuple:
            return "(" + ", ".join(show(x) for x in a) + ("," if len(a) == 1 else "") + ")"
        if isinstance(a, ExtensionArgs):
            kw = "".join(f", {k}={v!r}" for k, v in a.kwargs)
            return f"[{a.name}]({', '.join(show(x) for x in a.args)}{kw})"
        return repr(a) if not isinstance(a, DType) else str(a)

    return "(" + ", ".join(show(a) for a in r.args) + ")"


# output structure: tensors are leaves ("t"), tuples/lists/dicts are rebuilt, anything else is kept as is
def _flatten(out: Any, s: _Session, flat: list[int]) -> Any:
    if isinstance(out, Tensor):
        h = out._h
        flat.append(h.vid if isinstance(h, SymbolicHandle) and h.session is s else s.constant(h, out.dtype))
        return ("t",)
    if isinstance(out, (tuple, list)):
        return ("seq", type(out), tuple(_flatten(o, s, flat) for o in out))
    if isinstance(out, dict):
        return ("dict", tuple(out), tuple(_flatten(o, s, flat) for o in out.values()))
    return ("const", out)


def _unflatten(tree: Any, flat: Iterator[Tensor]) -> Any:
    kind = tree[0]
    if kind == "t":
        return next(flat)
    if kind == "seq":
        return tree[1](_unflatten(t, flat) for t in tree[2])
    if kind == "dict":
        return dict(zip(tree[1], (_unflatten(t, flat) for t in tree[2])))
    return tree[1]


def _module_names(fn: Any, args: Sequence[Any]) -> dict[int, str]:
    """id(handle) -> name for the parameters and buffers of the modules ``fn`` reaches: fn itself, its bound
    object, its arguments, its closure cells and the globals its code names."""
    from .nn import Module

    found: list[tuple[str, Module]] = []
    candidates: list[tuple[str, Any]] = [("", fn), ("", getattr(fn, "__self__", None))]
    candidates += [("", a) for a in args]
    code = getattr(fn, "__code__", None)
    for cell_name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or ()):
        try:
            candidates.append((cell_name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    glb = getattr(fn, "__globals__", {})
    for n in getattr(code, "co_names", ()):
        if n in glb:
            candidates.append((n, glb[n]))
    for prefix, obj in candidates:
        if isinstance(obj, Module) and all(m is not obj for _, m in found):
            found.append((prefix, obj))
    names: dict[int, str] = {}
    for prefix, m in found:
        for n, t in (*m.named_parameters(), *m.named_buffers()):
            if t is not None:
                names.setdefault(id(t._h), f"{prefix}.{n}" if prefix else n)
    return names


_install_lock = threading.RLock()
_stacks: dict[Device, CaptureStack] = {}


def capture(fn: Callable[..., Any], *example_inputs: Any, device: Device | str | None = None,
            allow_reads: bool = True, **kwargs: Any) -> CapturedGraph:
    """Record what ``fn(*example_inputs, **kwargs)`` does into a :class:`CapturedGraph`, without running kernels.

    Args:
        fn: a function of tensors, or an ``nn.Module`` (its parameters and buffers become named constants).
        example_inputs: tensors (their data answers reads such as an index range check; their shapes and dtypes
            are the graph's) or :class:`ember.TensorSpec` s (no data: a read raises :class:`CaptureError`).
            Non-tensor arguments are passed as they are and stay fixed in the graph.
        device: where TensorSpec inputs live (default: the tensors' device, else ``ember.default_device()``).
        allow_reads: compute values that ``fn`` reads from the example data (listed in ``graph.reads``); False
            makes any read a CaptureError.
        kwargs: keyword arguments for ``fn`` (fixed in the graph).

    Returns:
        the graph; ``graph.replay(*inputs)`` runs it on any device.
    """
    from .device import as_device, default_device

    if not callable(fn):
        raise DTypeError(f"capture: fn must be callable, got {type(fn).__name__}")
    if is_capturing():
        raise CaptureError("capture: the calling thread is already capturing (captures do not nest)")
    devices = {x.device for x in example_inputs if isinstance(x, Tensor)}
    if device is not None:
        dev = as_device(device)
    elif devices:
        dev = next(iter(devices))
    else:
        dev = default_device()
    if any(d is not dev for d in devices):
        raise DeviceError(f"capture: expected all example inputs on {dev}, got {sorted(map(str, devices))}")
    real = dev.stack
    if isinstance(real, CaptureStack):
        real = real.inner
    session = _Session(dev, real, _module_names(fn, example_inputs), allow_reads)
    with _install_lock:
        # one capture stack per device, kept for later captures (dispatch caches extension kernels per stack)
        cstack = _stacks.get(dev)
        if cstack is None or cstack.inner is not real:
            cstack = _stacks[dev] = CaptureStack(real, dev)
        cstack.users += 1
        dev._stack = cstack
    args: list[Any] = []
    try:
        for i, x in enumerate(example_inputs):
            if isinstance(x, (Tensor, TensorSpec)):
                spec = TensorSpec.of(x) if isinstance(x, Tensor) else x
                vid = session.new_id()
                session.inputs.append(GraphValue(vid, f"input{i}", spec, "input"))
                session.dtypes[vid] = spec.dtype
                if isinstance(x, Tensor):
                    session.data[vid] = x._h
                args.append(Tensor._make(SymbolicHandle(spec.shape, spec.dtype, vid, session), spec.dtype, dev))
            else:
                args.append(x)
        _local.session = session
        try:
            out = fn(*args, **kwargs)
        finally:
            _local.session = None
        flat: list[int] = []
        tree = _flatten(out, session, flat)
    finally:
        session.closed = True
        with _install_lock:
            cstack.users -= 1
            if cstack.users == 0 and dev._stack is cstack:
                dev._stack = real
    shapes: dict[int, Spec] = {v.id: (v.spec.shape, v.spec.dtype) for v in (*session.inputs, *session.constants)}
    for r in session.records:
        shapes.update((o, (s, d)) for o, s, d in zip(r.outputs, r.shapes, r.dtypes))
    return CapturedGraph(tuple(session.records), tuple(session.inputs), tuple(session.constants), tuple(flat),
                         tuple(TensorSpec(*shapes[o]) for o in flat), tree, dev, tuple(session.reads),
                         tuple(sorted(session.fallbacks)))


class _CaptureModule(types.ModuleType):
    """``ember.capture`` is this module, callable as :func:`capture` (``ember.capture(fn, x)``), so importing
    ``ember.capture`` for its classes never hides the function."""

    def __call__(self, fn: Callable[..., Any], *example_inputs: Any, **kwargs: Any) -> CapturedGraph:
        return capture(fn, *example_inputs, **kwargs)


sys.modules[__name__].__class__ = _CaptureModule
