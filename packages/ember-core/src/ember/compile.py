"""``ember.compile``: whole-step capture and replay (torch's ``torch.compile`` name, CUDA-graph-like semantics).

>>> step = ember.compile(train_step)          # doctest: +SKIP
>>> loss = step(x, y)                         # first call: runs eagerly while recording    # doctest: +SKIP
>>> loss = step(x, y)                         # later calls with matching guards: replayed  # doctest: +SKIP

How it works. A call that has no replayable graph yet runs ``fn`` eagerly on a *recording chain*: the device's
decorators that change what is computed (autodiff) rebuilt over a tracing layer that sits directly on the device's
backend, in the calling thread only (other threads keep using the device as usual). Every backend-contract call
that reaches the backend -- forward, the backward autodiff derives, the optimizer's update, BatchNorm's running
statistics -- is recorded as one :class:`ember.ir.OpRecord` (the records :mod:`ember.capture` and the router use)
while it runs, so the recording call's results are the eager ones. Lazily recording decorators (fusion) are left
out of the chain: they only decide how ops run, and the replay schedule makes that decision itself.

The recording is then *scheduled* once: each record resolved to its bound kernel (the backend's method, or the
extension op's kernel), its arguments turned into a template over value slots, each value freed after its last
use, and runs of elementwise records with one shape compiled into one kernel by the backend's ``fusion_compile``.
A later call whose guards match replays the schedule: the new inputs' handles are bound to the input slots, the
kernels run one after another, the tensors the step replaced (a gradient, a state tensor rebound out of place)
get the replay's results, and the outputs are returned as tensors. No per-op dispatch, no autodiff bookkeeping.

Guards (checked on every call; a miss records again, counted in :meth:`CompiledFunction.stats`): the tensor
inputs' shapes, dtypes and device; the values of non-tensor arguments; grad mode; the training flags of the modules
``fn`` reaches; the identity of every state tensor (parameters, their gradients, buffers, optimizer state) and the
structure of the optimizers' hyper-parameters (those an optimizer passes as bindings, such as its learning rate,
excluded). After :data:`RECOMPILE_LIMIT` graphs for one function a warning is logged and new guard values run
eagerly (torch's recompile limit).

Graph breaks: reading a value computed inside the step (``item()``, ``bool()``, ``numpy()``), a draw from an
``ember.Generator``, reseeding, or a parameter replaced out of place cannot be replayed; that call's results are
the eager ones (it ran eagerly while recording) and calls with the same guards run eagerly from then on, never a
wrong result; so is an op whose result depends on the values (``allclose``, boolean-mask indexing). Reads
that ember's ops make only to validate a tensor (the class-index range check of cross-entropy, index range checks:
:data:`_VALIDATION_READERS`) are allowed: the graph then assumes the check passes for later inputs.
``fullgraph=True`` raises :class:`CompileError` at a graph break instead.

Python scalars: a scalar the step passes to a kernel is fixed in the graph, except those passed as *bindings*
(:func:`scalar`): a float that remembers how to recompute itself, re-evaluated on every replay. The optimizers
pass their learning rate, bias corrections and step counts this way, so a learning-rate scheduler and Adam's
step count replay the same graph, bit for bit as eager.

Memory: no worse than eager. A recording holds the values the step computes weakly (each is freed when eager
frees it) and the state's old handles too (the gradients ``zero_grad()`` drops); a replay frees each value after
its last use, drops the gradients the step replaces without reading them before its kernels run (as
``zero_grad()`` first would), and keeps no value in a local past its last use. A graph holds its kernels'
arguments and the constants the step uploads, not its values; :meth:`CompiledFunction.reset` drops the graphs.

``EMBER_REPLAY=0`` in the environment (read on every call) makes compiled functions run eagerly: the switch for
debugging a difference between eager and replayed results.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .backend import Backend
from .capture import IN_PLACE, CaptureStack, _is_handle, _unflatten, is_capturing
from .decorator import CONTRACT_METHODS, Decorator, Policy
from .device import Device
from .dtypes import DType, bool_
from .errors import DTypeError, EmberError, IndexOutOfRangeError, UnsupportedError, ValueRangeError
from .extension import ExtensionCall
from .ir import OpRecord, Ref
from .tensor import Tensor

__all__ = ["RECOMPILE_LIMIT", "Bound", "CompileError", "CompiledFunction", "binding_read", "compile",
           "is_recording", "replay_enabled", "scalar", "scalar_tensor"]

log = logging.getLogger("ember.compile")

#: graphs one compiled function keeps (one per guard value); past it, new guard values run eagerly with a warning
RECOMPILE_LIMIT = 8
#: recordings of one guard value that change the state's structure (optimizer state created) before giving up
_WARMUP_LIMIT = 3


class CompileError(UnsupportedError):
    """A compiled function cannot be replayed where that was required (``fullgraph=True`` and a graph break)."""


# ----------------------------------------------------------------------------------------------------------------
# bindings: Python scalars recomputed on every replay
# ----------------------------------------------------------------------------------------------------------------
class Bound(float):
    """A float argument of a kernel whose value on later replays comes from ``source()`` (see :func:`scalar`).
    It behaves as the float it holds everywhere else (arithmetic on it gives plain floats)."""

    source: Callable[[], float]
    #: the :func:`scalar` calls this value derives from (a recording checks each reached a kernel as a binding)
    roots: frozenset[int]

    def __new__(cls, value: float, source: Callable[[], float], roots: frozenset[int] = frozenset()) -> Bound:
        b = super().__new__(cls, value)
        b.source = source
        b.roots = roots
        return b

    def __reduce__(self) -> Any:
        return float, (float(self),)  # pickled (a checkpoint of a group's lr): the plain value


def _source_of(x: Any) -> Callable[[], Any]:
    if type(x) is Bound:
        return x.source
    return lambda: x


def _bound_op(name: str, reflected: bool) -> Callable[[Bound, Any], Any]:
    """Arithmetic on a Bound gives a Bound whose source repeats the same float operation on the sources' values,
    so derived scalars (``lr / (1 - beta1 ** step)``) are recomputed on replay exactly as eager computes them."""
    fop = getattr(float, name)

    def op(self: Bound, other: Any) -> Any:
        if not isinstance(other, (int, float)) or isinstance(other, bool):
            return fop(float(self), other) if not isinstance(other, Bound) else NotImplemented
        value = fop(float(self), float(other) if type(other) is Bound else other)
        if value is NotImplemented or not isinstance(value, float):
            return value
        s, o = self.source, _source_of(other)
        roots = self.roots | other.roots if type(other) is Bound else self.roots
        return Bound(value, lambda: fop(float(s()), o()), roots)

    op.__name__ = name
    return op


for _op in ("add", "sub", "mul", "truediv", "pow"):
    setattr(Bound, f"__{_op}__", _bound_op(f"__{_op}__", False))
    setattr(Bound, f"__r{_op}__", _bound_op(f"__r{_op}__", True))
Bound.__neg__ = lambda self: Bound(-float(self), lambda s=self.source: -float(s()), self.roots)  # type: ignore
Bound.__pos__ = lambda self: self  # type: ignore[method-assign]
del _op


_local = threading.local()


def is_recording() -> bool:
    """True while the calling thread records a step for :func:`compile` (eager code may then pass bindings)."""
    return getattr(_local, "trace", None) is not None


def scalar(value: float, source: Callable[[], float]) -> float:
    """``value`` for a kernel argument; while recording, a :class:`Bound` whose replays use ``source()``.

    ``source`` must compute, from state that exists before the step runs, the value the step would pass: the
    replay evaluates every source first, then runs the kernels. Outside a recording this is ``value`` itself."""
    t = getattr(_local, "trace", None)
    if t is None:
        return value
    t.roots += 1
    return Bound(float(value), source, frozenset((t.roots,)))


def scalar_tensor(value: float, like: Tensor) -> Any:
    """``value`` as a kernel operand with ``like``: while recording and when ``value`` is a :class:`Bound`, a 0-d
    tensor of like's dtype and device filled with it (refilled on every replay), else ``value`` itself.

    For code whose scalar operands go through ops that take Python numbers (which keep no binding): an elementwise
    op with a 0-d tensor of the operand's dtype computes what the op with the Python float computes."""
    if type(value) is not Bound or getattr(_local, "trace", None) is None:
        return value
    dev = like._device
    return Tensor._make(dev.stack.full((), value, like._dtype), like._dtype, dev)


@contextmanager
def binding_read() -> Iterator[None]:
    """Allow reading tensor values (``item()``) inside a recording: for code that computes a binding's value
    (and passes its source to :func:`scalar`); any other read inside a step is a graph break."""
    t = getattr(_local, "trace", None)
    if t is None:
        yield
        return
    t.allow_read += 1
    try:
        yield
    finally:
        t.allow_read -= 1


# ----------------------------------------------------------------------------------------------------------------
# the recording: a tracing layer over the backend, and the chain above it
# ----------------------------------------------------------------------------------------------------------------
class _Break(Exception):
    """Internal: the recording cannot become a graph (the reason is the message)."""


class _Trace:
    """One recording in progress (one thread): records and the value table, keyed by the base handles' ids.

    Memory: the values the step computes are held *weakly* (a weak reference whose callback drops the id from the
    table when the value dies, so a later handle reusing the address gets a new value id), so a recording frees
    every intermediate when eager would and its peak is the eager step's. Handles made before the step (inputs,
    state, constants: the graph's externals) are held strongly: a replay binds them."""

    def __init__(self, device: Device, base: Any, norm: Callable[[Any], Any]) -> None:
        self.device = device
        self.base = base
        self.norm = norm
        self.records: list[OpRecord] = []
        self.calls: dict[int, ExtensionCall] = {}  # record index -> the extension call (kernel, spec, kwargs)
        self.tuple_out: set[int] = set()  # indices of records whose method returned a tuple (or list)
        self.vid_of: dict[int, int] = {}
        #: per value id: the handle (externals) or a weak reference to it (values computed in the step, the
        #: state's gradients before it: see :meth:`handle`)
        self.handles: list[Any] = []
        self.ndims: list[int] = []  # per value id: the rank of its handle (the fusion partition's broadcast check)
        self.produced: set[int] = set()
        self.weak: set[int] = set()  # value ids held by a weak reference
        self.ext_dtypes: dict[int, DType] = {}  # dtypes of the weakly held externals
        self.written: set[int] = set()
        self.inputs: set[int] = set()
        self.input_reads = 0
        self.roots = 0  # scalar() calls so far (each binding's root id)
        self.skip_packages: frozenset[str] = frozenset()  # the recording chain's decorator packages
        self.allow_read = 0
        self.broken: str | None = None

    def vid(self, h: Any, weak: bool = False) -> int:
        """The value id of handle ``h``, registered as an external (made before the step) if new; ``weak``: held
        by a weak reference (state that the step may replace, such as the gradients ``zero_grad()`` drops)."""
        v = self.vid_of.get(id(h))
        if v is None:
            v = self._register(h, weak)
            if weak:  # its dtype, for the schedule, which may find the handle gone
                self.ext_dtypes[v] = self.base.dtype_of(h)
        return v

    def new_value(self, h: Any) -> int:
        v = self._register(h, True)
        self.produced.add(v)
        return v

    def _register(self, h: Any, weak: bool) -> int:
        key = id(h)
        v = self.vid_of[key] = len(self.handles)
        self.ndims.append(len(h.shape))
        if not weak:
            self.handles.append(h)
            return v
        vid_of = self.vid_of

        def dead(_ref: Any, key: int = key, v: int = v) -> None:
            # the value died: its address may be reused by a new handle, which must not be taken for this value
            if vid_of.get(key) == v:
                del vid_of[key]

        try:
            ref: Any = weakref.ref(h, dead)
        except TypeError:  # a handle type without weak references: kept alive for the trace's lifetime
            ref = _Strong(h)
        self.weak.add(v)
        self.handles.append(ref)
        return v

    def handle(self, v: int) -> Any:
        """The handle of value ``v``; None for a weakly held value that has died since."""
        h = self.handles[v]
        return h() if v in self.weak else h

    def breaks(self, why: str) -> None:
        if self.broken is None:
            self.broken = why

    def norm_arg(self, a: Any) -> Any:
        t = type(a)
        if t is tuple or t is list:
            return t(self.norm_arg(x) for x in a)
        return self.norm(a) if _is_handle(a) else a

    def lower(self, a: Any, inputs: list[int], pos: dict[int, int]) -> Any:
        t = type(a)
        if t is tuple or t is list:
            return tuple(self.lower(x, inputs, pos) for x in a)
        if _is_handle(a):
            v = self.vid(a)
            k = pos.get(v)
            if k is None:
                k = pos[v] = len(inputs)
                inputs.append(v)
            return Ref(k)
        return a

    def call(self, name: str, args: tuple[Any, ...]) -> Any:
        nargs = tuple(self.norm_arg(a) for a in args)
        out = getattr(self.base, name)(*_plain(nargs))
        if self.broken is None:
            if name == "getitem" and len(nargs) > 1 and self.masks(nargs[1]):
                # a boolean mask selects as many elements as it holds True: the result's shape is the data's
                self.breaks("boolean-mask indexing (nonzero, masked_select, x[mask]) gives a result whose shape "
                            "depends on the data")
                return out
            self.record(name, nargs, out)
        return out

    def masks(self, index: Any) -> bool:
        """Whether a getitem index holds a bool tensor handle."""
        if type(index) is tuple or type(index) is list:
            return any(self.masks(x) for x in index)
        return _is_handle(index) and self.base.dtype_of(index) is bool_

    def record(self, name: str, nargs: tuple[Any, ...], out: Any, call: ExtensionCall | None = None) -> None:
        inputs: list[int] = []
        pos: dict[int, int] = {}
        if call is None:
            rec_args = tuple(self.lower(a, inputs, pos) for a in nargs)
        else:
            rec_args = (tuple(self.lower(a, inputs, pos) for a in nargs),)
        written = IN_PLACE.get(name)
        if written is not None:
            target = inputs[rec_args[written].k]
            self.written.add(target)
        outs = out if type(out) is tuple or type(out) is list else (() if out is None else (out,))
        if not all(_is_handle(h) for h in outs):
            self.breaks(f"{name} returned a value that is not a tensor handle")
            return
        vids = tuple(self.new_value(h) for h in outs)
        if call is not None:
            # without its arguments: the record holds them as value ids, and the call must not keep them alive
            self.calls[len(self.records)] = ExtensionCall(call.op, call.device, call.stack, (), call.kwargs,
                                                          call.kernel, call.spec, call.dtypes)
        if outs is out:
            self.tuple_out.add(len(self.records))
        base = self.base
        self.records.append(OpRecord(name, tuple(inputs), vids, tuple(tuple(h.shape) for h in outs),
                                     tuple(base.dtype_of(h) for h in outs), rec_args))


#: contract methods the tracing layer handles itself (not recorded as kernels)
_PLUMBING = frozenset({"lift", "lower", "sync", "memory_report", "memory_dry_run", "describe", "fusion_compile",
                       "may_share_memory", "from_numpy", "to_numpy", "dtype_of", "new_random_stream",
                       "run_extension", "extension_kernel", "seed"})


class _Strong:
    """A strong reference called like a weak one (a computed value whose type has no weak references)."""

    __slots__ = ("h",)

    def __init__(self, h: Any) -> None:
        self.h = h

    def __call__(self) -> Any:
        return self.h


def _weak(h: Any) -> Any:
    """A weak reference to ``h`` (a :class:`_Strong` one for a type without weak references)."""
    try:
        return weakref.ref(h)
    except TypeError:
        return _Strong(h)


def _plain(a: Any) -> Any:
    """``a`` with every Bound replaced by its plain float: kernels get exactly what eager passes (numpy treats a
    float subclass as a float64 scalar, a plain float as a weak one)."""
    t = type(a)
    if t is Bound:
        return float(a)
    if t is tuple or t is list:
        return t(_plain(x) for x in a) if any(type(x) is Bound or type(x) in (tuple, list) for x in a) else a
    return a


def _trace() -> _Trace:
    t: _Trace | None = getattr(_local, "trace", None)
    if t is None:  # only a recording thread reaches a tracing layer (the router sends others elsewhere)
        raise CompileError("internal: a compile tracing layer was used outside a recording")
    return t


class TraceStack(Decorator):
    """The tracing layer of a recording chain: directly over the device's backend, its handles are the backend's
    own; every contract call runs the backend's method and is recorded in the calling thread's trace."""

    decorator_name = "trace"
    #: optional backend methods (flex's ``conv_input_grad``, which autodiff looks up) are traced too
    optional_policy = Policy.PASS

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if name.startswith("_") or inner is None:
            raise AttributeError(f"'TraceStack' object has no attribute {name!r}")
        attr = getattr(inner, name)
        if not callable(attr):
            return attr

        def traced(*args: Any) -> Any:
            return _trace().call(name, args)

        return traced

    def lift(self, h: Any) -> Any:
        t = _trace()
        if id(h) not in t.vid_of:  # a value made below the stack: an ember.Generator's draw uploaded by its stream
            t.breaks("a tensor made outside the device's stack (a draw from an ember.Generator) enters the step")
        return h

    def lower(self, h: Any) -> Any:
        return h

    def to_numpy(self, h: Any) -> Any:
        t = _trace()
        nh = t.norm(h)
        v = t.vid_of.get(id(nh))
        if not t.allow_read:
            caller, check = _reader(t.skip_packages)
            if v is not None and check:
                # ember's own validation of an input (a class-index range): assumed to hold for later inputs, as a
                # device-side assert would be. Any other read -- a user's, one of a value the step computes from
                # state, or one whose value shapes the result (nonzero, allclose, one_hot(num_classes=-1)) -- breaks
                t.input_reads += 1
            else:
                how = ("its result depends on the values read" if caller.startswith("ember.")
                       else "item(), bool(), numpy()")
                t.breaks(f"{caller} reads the value of a tensor inside the step ({how})")
        return self.inner.to_numpy(nh)

    def from_numpy(self, array: Any) -> Any:
        import numpy as np

        t = _trace()
        h = self.inner.from_numpy(array)
        if t.broken is None:
            # host data made inside the step is uploaded again on every replay (a copy: later in-place writes to a
            # constant must not leak into the next replay)
            t.records.append(OpRecord("from_numpy", (), (t.new_value(h),), (tuple(h.shape),),
                                      (self.inner.dtype_of(h),), (np.array(array, copy=True),)))
        return h

    def new_random_stream(self, seed: int) -> Any:
        _trace().breaks("an ember.Generator is created inside the step")
        return self.inner.new_random_stream(seed)

    def seed(self, seed: int) -> None:
        _trace().breaks("the device is reseeded inside the step")
        self.inner.seed(seed)

    def dtype_of(self, h: Any) -> DType:
        return self.inner.dtype_of(_trace().norm(h))

    def may_share_memory(self, a: Any, b: Any) -> bool:
        t = _trace()
        return bool(self.inner.may_share_memory(t.norm(a), t.norm(b)))

    def run_extension(self, call: Any) -> Any:
        t = _trace()
        nargs = tuple(t.norm_arg(a) for a in call.args)
        base_call = call.with_args(nargs, self.inner)
        kwargs = {k: _plain(v) for k, v in call.kwargs.items()}
        out = self.inner.run_extension(ExtensionCall(call.op, call.device, self.inner, _plain(nargs), kwargs,
                                                     call.kernel, call.spec, call.dtypes))
        if t.broken is None:
            t.record("extension", nargs, out, base_call)
        return out


def _traced_method(name: str) -> Callable[..., Any]:
    def method(self: TraceStack, *args: Any) -> Any:
        return _trace().call(name, args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name}: the backend's method, recorded in the calling thread's trace."
    return method


for _name in sorted(CONTRACT_METHODS - _PLUMBING):
    setattr(TraceStack, _name, _traced_method(_name))
TraceStack._resolve_policies()


#: core modules between an op and the stack (skipped when naming the code that read a value)
_PLUMBING_MODULES = frozenset({__name__, "ember.decorator", "ember.tensor", "ember.dispatch", "ember.extension"})


#: ember's functions whose reads of a tensor only validate it (raise or pass; the value read never reaches a
#: result): the reads a graph may assume pass for later inputs. Listed by name because a read does not say why it
#: reads; a read anywhere else (``nonzero``, ``allclose``, ``one_hot`` inferring its class count) shapes the result.
_VALIDATION_READERS = frozenset({
    "ember.ops.nn.class_target_bounds",  # cross_entropy / nll_loss: class indices in range
    "ember.ops.nn.embedding",  # indices in range (its max_norm renormalisation reads elsewhere: a break)
    "ember.nn.functional.loss._check_range01",  # binary_cross_entropy: input in [0, 1]
    "ember.ops.indexing._check_index_values",  # gather / scatter / take_along_dim: indices in range
    # tensor indices in range (while recording, the negative-index wrap is recorded whatever the values hold)
    "ember.ops.indexing._index_handle",
    "ember.ops.elementwise._check_int",  # integer division / remainder / fmod: no zero divisor
})
#: helpers that read for the function calling them (the reader is their caller)
_READ_HELPERS = frozenset({"ember.ops.nn._host_minmax", "ember.ops.nn.host_extrema", "ember.ops.indexing._minmax"})


def _frame_name(f: Any) -> str:
    return f"{f.f_globals.get('__name__', '?')}.{f.f_code.co_name}"


def _caller_frame(skip_packages: frozenset[str], depth: int) -> Any:
    """The frame ``depth`` levels above the caller, or the nearest above it outside the stack's layers (core's
    plumbing and the packages of the decorators in the recording chain)."""
    f = sys._getframe(depth + 1)
    while f is not None:
        mod = f.f_globals.get("__name__", "?")
        if mod not in _PLUMBING_MODULES and mod.split(".", 1)[0] not in skip_packages:
            break
        f = f.f_back
    return f


def _reader(skip_packages: frozenset[str]) -> tuple[str, bool]:
    """(the code that reads a value, whether that read is one of ember's validation checks): the nearest
    function outside the stack's layers, past the read helpers; ``one_hot`` validates only when given its class
    count."""
    f = _caller_frame(skip_packages, 2)
    while f is not None and _frame_name(f) in _READ_HELPERS:
        f = f.f_back
    if f is None:
        return "?", False
    name = _frame_name(f)
    if name == "ember.ops.nn.one_hot":
        return name, f.f_locals.get("num_classes", -1) != -1
    return name, name in _VALIDATION_READERS


class _Router(Decorator):
    """Serves a device while some thread records on it: that thread's calls go to its recording chain, every
    other thread's to the device's own stack. One per device, installed by the first recording and removed by the
    last."""

    decorator_name = "compile"
    optional_policy = Policy.PASS

    def __init__(self, inner: Any, device: Device, chain: Any) -> None:
        super().__init__(inner)
        self.device = device
        self.chain = chain
        self.users = 0

    def _target(self) -> Any:
        t = getattr(_local, "trace", None)
        return self.chain if t is not None and t.device is self.device else self.inner

    @property  # type: ignore[override]
    def differentiable(self) -> bool:
        return bool(getattr(self._target(), "differentiable", False))

    @property  # type: ignore[override]
    def records_lazily(self) -> bool:
        return bool(getattr(self._target(), "records_lazily", False))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "inner" not in self.__dict__:
            raise AttributeError(f"'_Router' object has no attribute {name!r}")
        return getattr(self._target(), name)


def _routed_method(name: str) -> Callable[..., Any]:
    def method(self: _Router, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._target(), name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name}: the recording chain's in a recording thread, else the device's own stack's."
    return method


for _name in sorted(CONTRACT_METHODS):
    setattr(_Router, _name, _routed_method(_name))
_Router._resolve_policies()
del _name


class _DeviceRecording:
    """Per device: the real stack, its recording chain (decorators rebuilt over a tracing layer on the backend),
    the router and how to normalize a handle of the real chain to the backend's."""

    def __init__(self, device: Device, real: Any) -> None:
        from .dispatch import stack_chain
        from .plugins.manager import registry

        chain = list(stack_chain(real))
        base = chain[-1]
        self.device = device
        self.real = real
        self.base = base
        above = chain[-2] if len(chain) > 1 else None
        self.norm: Callable[[Any], Any] = above._unwrap if isinstance(above, Decorator) else (lambda h: h)
        opts = dict(device.decorators)
        stack: Any = TraceStack(base)
        for deco in reversed(chain[:-1]):
            name = getattr(deco, "decorator_name", type(deco).__name__)
            if getattr(deco, "records_lazily", False):
                continue  # fusion: how ops run, which the schedule decides; its handles normalize to the base's
            spec = registry.decorator(name)
            # the spec's declared capability, not the instance's flag: a router over autodiff forwards
            # ``differentiable`` from below, but rebuilt over the tracing layer it would be a second router whose
            # handles the device's own one does not know
            if spec is None or not spec.differentiable:
                raise _Break(f"the device's decorator {name!r} cannot be recorded (only gradient and fusion "
                             "decorators can)")
            stack = spec.factory(stack, **dict(opts.get(name, ())))
        self.chain = stack
        self.router = _Router(real, device, stack)
        #: top-level packages of the chains' decorators (their frames are plumbing when naming a reader)
        self.packages = frozenset(type(d).__module__.split(".", 1)[0] for d in (*chain[:-1], *stack_chain(stack))
                                  if isinstance(d, Decorator)) - {"ember"}


_install_lock = threading.RLock()
_recordings: dict[Device, _DeviceRecording] = {}


def _recording_for(dev: Device) -> _DeviceRecording:
    real = dev.stack
    if isinstance(real, _Router):
        real = real.inner
    rec = _recordings.get(dev)
    if rec is None or rec.real is not real:
        rec = _recordings[dev] = _DeviceRecording(dev, real)
    return rec


# ----------------------------------------------------------------------------------------------------------------
# state the step reaches
# ----------------------------------------------------------------------------------------------------------------
def _reachable(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any], list[Tensor]]:
    """(modules, optimizers, tensors) that ``fn`` reaches: itself, its bound object and that object's attributes,
    its closure, the globals its code names and its arguments (one level into lists, tuples and dicts)."""
    from .nn import Module
    from .optim import Optimizer

    seen: set[int] = set()
    modules: list[Any] = []
    optimizers: list[Any] = []
    tensors: list[Tensor] = []

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, types.ModuleType)):
            return
        seen.add(id(obj))
        if isinstance(obj, Module):
            modules.append(obj)
        elif isinstance(obj, Optimizer):
            optimizers.append(obj)
        elif isinstance(obj, Tensor):
            tensors.append(obj)
        elif isinstance(obj, (list, tuple)) and depth > 0:
            for x in obj:
                visit(x, depth - 1)
        elif isinstance(obj, dict) and depth > 0:
            for x in obj.values():
                visit(x, depth - 1)
        elif isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)) and depth > 0:
            visit_fn(obj, depth - 1)
        elif depth > 0 and hasattr(obj, "__dict__") and not isinstance(obj, type):
            for x in vars(obj).values():
                visit(x, depth - 1)

    def visit_fn(f: Any, depth: int) -> None:
        if isinstance(f, functools.partial):
            for x in (f.func, *f.args, *f.keywords.values()):
                visit(x, depth)
            return
        visit(getattr(f, "__self__", None), depth)
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        for x in (*(getattr(f, "__defaults__", None) or ()), *(getattr(f, "__kwdefaults__", None) or {}).values()):
            visit(x, depth)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                visit(cell.cell_contents, depth)
            except ValueError:  # an empty cell
                pass
        glb = getattr(f, "__globals__", {})
        for n in getattr(code, "co_names", ()):
            if n in glb:
                visit(glb[n], 0)

    if isinstance(fn, Module):
        visit(fn, 0)
    else:
        visit_fn(fn, 2)
    for a in (*args, *kwargs.values()):
        if not isinstance(a, Tensor):
            visit(a, 1)
    return modules, optimizers, tensors


class _State:
    """The state tensors of one call: ``entries`` are (tensor, kind) with kind "value" or "grad"."""

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], found: Any) -> None:
        modules, optimizers, tensors = found
        entries: list[tuple[Tensor, str]] = []
        ids: set[tuple[int, str]] = set()

        def add(t: Any, kind: str) -> None:
            if isinstance(t, Tensor) and (id(t), kind) not in ids:
                ids.add((id(t), kind))
                entries.append((t, kind))

        flags: list[bool] = []
        for m in modules:
            for sub in m.modules():  # one walk: each module's own parameters and buffers
                flags.append(sub.training)
                for p in sub._parameters.values():
                    add(p, "value")
                    add(p, "grad")
                for b in sub._buffers.values():
                    add(b, "value")
        hyper: list[Any] = []
        for opt in optimizers:
            bound = getattr(opt, "_compile_bindings", ())
            for g in opt.param_groups:
                for p in g["params"]:
                    add(p, "value")
                    add(p, "grad")
                hyper.append(tuple((k, _hashable(v)) for k, v in sorted(g.items()) if k != "params" and k not in bound))
            for p, st in opt.state.items():
                for k, v in sorted(st.items()):
                    add(v, "value")
                    hyper.append((id(p), k, None if isinstance(v, Tensor) else _hashable(v)))
        for t in tensors:
            add(t, "value")
            if t.requires_grad:
                add(t, "grad")
        self.entries = entries
        self.flags = tuple(flags)
        self.hyper = tuple(hyper)

    def handles(self, real: Any) -> list[Any]:
        """The backend handle of each entry now (None for a missing gradient)."""
        lower = _lowering(real)
        out = []
        for t, kind in self.entries:
            if kind == "grad":
                g = t.grad
                out.append(None if g is None else lower(g._h))
            else:
                out.append(lower(t._h))
        return out

    def structure(self, handles: list[Any]) -> tuple[Any, ...]:
        """Which tensors, and which gradients exist (a step that accumulates is another graph than one that
        starts from none)."""
        return tuple((id(t), kind, h is None) for (t, kind), h in zip(self.entries, handles))

    def tensors(self) -> tuple[tuple[int, str], ...]:
        return tuple((id(t), kind) for t, kind in self.entries)


def _lowering(real: Any) -> Callable[[Any], Any]:
    """``real.lower`` (a stack's handle -> its backend's), as one function over the decorators' ``_unwrap`` hooks
    where the chain is made of plain decorators (one call per layer instead of two)."""
    from .dispatch import stack_chain

    chain = list(stack_chain(real))
    hooks = [d._unwrap for d in chain[:-1]]
    if not all(isinstance(d, Decorator) and type(d).lower is Decorator.lower for d in chain[:-1]) \
            or type(chain[-1]).lower is not Backend.lower:
        return real.lower  # a decorator with its own lowering: ask it
    if len(hooks) == 2:
        a, b = hooks
        return lambda h: b(a(h))
    return functools.reduce(lambda f, g: (lambda h: g(f(h))), hooks, lambda h: h)


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, Tensor):
        return ("tensor", id(v))
    try:
        hash(v)
    except TypeError:
        return ("object", id(v))
    return v


# ----------------------------------------------------------------------------------------------------------------
# the schedule
# ----------------------------------------------------------------------------------------------------------------
def _template(a: Any, slot: Callable[[int], int], bound: list[Bound]) -> Any:
    """A record argument with Ref(k) -> ("s", slot) markers and Bound -> ("b", index); None when it has neither
    (a literal)."""
    t = type(a)
    if t is Ref:
        return _Slot(slot(a.k))
    if t is Bound:
        bound.append(a)
        return _BSlot(len(bound) - 1)
    if t is tuple:
        parts = [_template(x, slot, bound) for x in a]
        if all(p is None for p in parts):
            return None
        return _Nested(tuple(x if p is None else p for x, p in zip(a, parts)))
    return None


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


class _BSlot:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


class _Nested:
    __slots__ = ("items",)

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items


def _fill(a: Any, vals: list[Any], bvals: list[float]) -> Any:
    t = type(a)
    if t is _Slot:
        return vals[a.i]
    if t is _BSlot:
        return bvals[a.i]
    if t is _Nested:
        return tuple(_fill(x, vals, bvals) for x in a.items)
    return a


class _Step:
    """One scheduled record: ``fn(*args)`` with args filled from slots; outputs stored in ``outs``; ``free`` the
    slots whose last use this is."""

    __slots__ = ("fn", "args", "dynamic", "slots", "outs", "single", "free", "call", "kwargs", "kw_dynamic",
                 "fused", "shape")

    def __init__(self) -> None:
        self.free: tuple[int, ...] = ()
        self.call: ExtensionCall | None = None
        self.fused: tuple[tuple[int, ...], tuple[Any, ...]] | None = None  # (input slots, scalars) of a fused block


class _Schedule:
    """A recording turned into straight-line kernel calls over value slots, with its bindings and rebinds."""

    def __init__(self, n_slots: int, steps: list[_Step], bound: list[Bound], inputs: list[tuple[int, int]],
                 consts: list[tuple[int, Any]], rebind_in: list[tuple[int, int]],
                 rebind_out: list[tuple[int, int | None, DType | None]],
                 outputs: list[tuple[int | None, Any, DType | None]], tree: Any, state_ok: list[tuple[int, Any]],
                 n_records: int, release: list[int] | None = None) -> None:
        self.n_slots = n_slots
        self.steps = steps
        self.sources = [b.source for b in bound]
        self.inputs = inputs
        self.consts = consts
        self.rebind_in = rebind_in
        self.rebind_out = rebind_out
        self.outputs = outputs
        self.tree = tree
        self.state_ok = state_ok
        self.n_records = n_records
        #: state entries (gradients) set to None before the kernels run: replaced by the step, never read by it
        self.release = release or []

    def run(self, in_handles: list[Any], state_handles: list[Any]) -> list[Any]:
        vals: list[Any] = [None] * self.n_slots
        for slot, i in self.inputs:
            vals[slot] = in_handles[i]
        for slot, h in self.consts:
            vals[slot] = h
        for slot, e in self.rebind_in:
            vals[slot] = state_handles[e]
        bvals = [float(src()) for src in self.sources]
        try:
            self._steps(vals, bvals)
        except EmberError:
            raise
        except Exception as exc:  # a kernel refused what ember's checks would have: say which, as ember's error
            raise _replay_error(exc) from exc
        return vals

    def _steps(self, vals: list[Any], bvals: list[float]) -> None:
        for st in self.steps:
            if st.fused is not None:  # a block of elementwise records as one compiled kernel
                in_slots, scalars = st.fused
                sc = [bvals[x.i] if type(x) is _BSlot else x for x in scalars]
                res = st.fn([vals[s] for s in in_slots], sc, st.shape, [None] * len(st.outs))
                for s, h in zip(st.outs, res):
                    vals[s] = h
                res = None  # (a local holding the results would keep them alive past their last use)
                for s in st.free:
                    vals[s] = None
                continue
            slots = st.slots
            if slots is not None:  # the common case: tensors at the top level of the arguments
                args = list(st.args)
                for p, s in slots:
                    args[p] = vals[s]
            elif st.dynamic:
                args = [_fill(a, vals, bvals) for a in st.args]
            else:
                args = st.args
            if st.call is not None:
                c = st.call
                kw = c.kwargs if not st.kw_dynamic else {k: _fill(v, vals, bvals) for k, v in st.kwargs.items()}
                out = st.fn(ExtensionCall(c.op, c.device, c.stack, tuple(args), kw, c.kernel, c.spec, c.dtypes))
            else:
                out = st.fn(*args)
            outs = st.outs
            if st.single:
                vals[outs[0]] = out
            elif outs:
                for s, h in zip(outs, out):
                    vals[s] = h
            out = args = None  # only the slots hold values: each is freed after its last use
            for s in st.free:
                vals[s] = None


def _replay_error(exc: Exception) -> EmberError:
    """The typed ember error for a backend error raised while replaying: a graph assumes that ember's input checks
    (index ranges, class targets, integer divisors), which ran while it was recorded, pass for later inputs too."""
    kind = IndexOutOfRangeError if isinstance(exc, IndexError) else ValueRangeError
    return kind(f"ember.compile: a replayed kernel failed ({type(exc).__name__}: {exc}). A compiled graph assumes "
                "the input checks that passed when it was recorded (index ranges, class targets, integer divisors) "
                "pass for later inputs; these inputs fail one. Run the step eagerly (EMBER_REPLAY=0, or without "
                "ember.compile) for the check's own error")


def _bind(b: Bound, bound: list[Bound]) -> int:
    bound.append(b)
    return len(bound) - 1


#: the elementwise contract methods a fused block (an ember.ir.Kernel) can hold
_ELEMENTWISE = frozenset({"unary", "binary", "where", "cast"})


def _fusion_groups(trace: _Trace, keep: set[int], last: dict[int, int]) -> dict[int, tuple[Any, ...]]:
    """Runs of consecutive elementwise records with one output shape, compiled by the backend's
    ``fusion_compile`` into one kernel each: {first record: (end, kernel, input vids, scalars, output vids, shape)}.

    A run's outputs are its values read after it (by a later record, as an output of the step or a rebound state
    tensor). A run the backend declines (``fusion_compile`` returns None) stays record by record."""
    from .backend import PREDICATE_UNARY_OPS
    from .ir import Instr, Kernel

    records, base = trace.records, trace.base
    if type(base).fusion_compile is Backend.fusion_compile:
        return {}
    dtypes: dict[int, DType] = dict(trace.ext_dtypes)
    for r in records:
        dtypes.update(zip(r.outputs, r.dtypes))

    def dtype_of(v: int) -> DType:
        d = dtypes.get(v)
        return d if d is not None else base.dtype_of(trace.handle(v))

    def fits(r: OpRecord, shape: tuple[int, ...]) -> bool:
        return r.op in _ELEMENTWISE and len(r.outputs) == 1 and r.shapes[0] == shape and all(
            trace.ndims[v] <= len(shape) for v in r.inputs)

    groups: dict[int, tuple[Any, ...]] = {}
    cache: dict[Any, Any] = {}
    i, n = 0, len(records)
    while i < n:
        r = records[i]
        if r.op not in _ELEMENTWISE or len(r.outputs) != 1:
            i += 1
            continue
        shape = r.shapes[0]
        end = i + 1
        while end < n and fits(records[end], shape):
            end += 1
        if end - i >= 2:
            found = _build_kernel(records[i:end], i, end, shape, dtype_of, keep, last, Instr, Kernel,
                                  PREDICATE_UNARY_OPS)
            if found is not None:
                kernel, in_vids, scalars, out_vids = found
                if kernel not in cache:
                    try:
                        cache[kernel] = base.fusion_compile(kernel)
                    except Exception:  # a backend that cannot compile this block: its records run one by one
                        log.debug("fusion_compile failed for a replay block", exc_info=True)
                        cache[kernel] = None
                if cache[kernel] is not None:
                    groups[i] = (end, cache[kernel], in_vids, scalars, out_vids, shape)
        i = end
    return groups


def _build_kernel(run: list[OpRecord], start: int, end: int, shape: tuple[int, ...], dtype_of: Callable[[int], DType],
                  keep: set[int], last: dict[int, int], Instr: Any, Kernel: Any, predicates: Any) -> Any:
    """The ember.ir.Kernel of a run of elementwise records, or None where an argument does not fit one."""
    body: list[Any] = []
    at: dict[int, int] = {}  # value id -> instruction index
    in_vids: list[int] = []
    scalars: list[Any] = []

    def operand(a: Any, r: OpRecord, dtype: DType) -> int | None:
        if type(a) is Ref:
            v = r.inputs[a.k]
            k = at.get(v)
            if k is None:
                body.append(Instr("load", (len(in_vids),), dtype_of(v)))
                in_vids.append(v)
                k = at[v] = len(body) - 1
            return k
        if type(a) in (bool, int, float, Bound):
            body.append(Instr("scalar", (len(scalars),), dtype))
            scalars.append(a)
            return len(body) - 1
        return None

    for r in run:
        out_dtype = r.dtypes[0]
        if r.op == "unary":
            name, a = r.args
            x = operand(a, r, out_dtype)
            if x is None or not isinstance(name, str):
                return None
            instr = Instr("unary", (name, x), bool_ if name in predicates else out_dtype)
        elif r.op == "binary":
            name, a, b = r.args
            ref = a if type(a) is Ref else b
            if type(ref) is not Ref:
                return None
            operand_dtype = dtype_of(r.inputs[ref.k])
            x, y = operand(a, r, operand_dtype), operand(b, r, operand_dtype)
            if x is None or y is None:
                return None
            instr = Instr("binary", (name, x, y), out_dtype)
        elif r.op == "where":
            c, a, b = r.args
            if type(c) is not Ref:
                return None
            z, x, y = operand(c, r, bool_), operand(a, r, out_dtype), operand(b, r, out_dtype)
            if z is None or x is None or y is None:
                return None
            instr = Instr("where", (z, x, y), out_dtype)
        else:  # cast
            a, _dtype = r.args
            x = operand(a, r, out_dtype)
            if x is None:
                return None
            instr = Instr("cast", (x,), out_dtype)
        body.append(instr)
        at[r.outputs[0]] = len(body) - 1
    produced = [r.outputs[0] for r in run]
    out_vids = tuple(v for v in produced if v in keep or last.get(v, -1) >= end)
    if not out_vids:
        return None
    kernel = Kernel(len(shape), tuple(dtype_of(v) for v in in_vids), len(scalars), tuple(body),
                    tuple(at[v] for v in out_vids))
    return kernel, tuple(in_vids), tuple(scalars), out_vids


def _schedule(trace: _Trace, in_slots: dict[int, int], state: _State, pre: list[Any], pre_vids: list[int | None],
              post: list[Any], out_tree: Any, out_handles: list[Any], fuse: bool = True) -> _Schedule:
    """Turn a finished trace into a :class:`_Schedule` (raises :class:`_Break` when it cannot replay)."""
    base = trace.base
    records = trace.records
    n = len(trace.handles)
    # state the step replaced: bound from the tensor before the replay, set from the replay's value after it
    pre_vid: dict[int, int] = {}
    rebind_out: list[tuple[int, int | None, DType | None]] = []
    state_ok: list[tuple[int, Any]] = []
    for e, ((t, kind), ref, after) in enumerate(zip(state.entries, pre, post)):
        if pre_vids[e] is not None:
            pre_vid.setdefault(pre_vids[e], e)
        before = None if ref is None else ref()
        if after is before and (ref is None or before is not None):  # (a handle that died was replaced)
            state_ok.append((e, before))
            continue
        if after is not None and trace.vid_of.get(id(after)) not in trace.produced:
            raise _Break(f"a state tensor ({kind}) was given a value not computed in the step")
        if kind == "value" and t.requires_grad:
            raise _Break("a parameter that requires grad was replaced out of place (not in place) in the step")
        rebind_out.append((e, None if after is None else trace.vid_of[id(after)], None if after is None
                           else base.dtype_of(after)))
    rebound = {e for e, _, _ in rebind_out}
    # last use of every value (outputs, rebinds and kept externals live to the end)
    keep = {v for _, v, _ in rebind_out if v is not None} | {v for v, _, _ in out_handles if v is not None}
    last: dict[int, int] = {}
    for i, r in enumerate(records):
        for v in r.inputs:
            last[v] = i
    steps: list[_Step] = []
    bound: list[Bound] = []
    externals: set[int] = set()
    groups = _fusion_groups(trace, keep, last) if fuse else {}
    skip_to = -1
    for i, r in enumerate(records):
        for v in r.inputs:
            if v not in trace.produced:
                externals.add(v)
        if i < skip_to:
            continue
        group = groups.get(i)
        if group is not None:
            end, fn, in_vids, scalars, out_vids, shape = group
            st = _Step()
            st.fn, st.shape, st.outs = fn, shape, out_vids
            st.fused = (in_vids, tuple(_BSlot(_bind(b, bound)) if type(b) is Bound else b for b in scalars))
            inside = {v for k in range(i, end) for v in records[k].inputs}
            st.free = tuple(v for v in inside if last.get(v, -1) < end and v not in keep and v in trace.produced
                            and v not in out_vids)
            steps.append(st)
            skip_to = end
            continue
        st = _Step()
        slot = r.inputs.__getitem__
        if r.op == "extension":
            call = trace.calls[i]
            st.fn = base.run_extension
            st.call = ExtensionCall(call.op, call.device, base, (), call.kwargs, call.kernel, call.spec, call.dtypes)
            tmpl = [_template(a, slot, bound) for a in r.args[0]]
            kw = {k: _template(v, slot, bound) for k, v in call.kwargs.items()}
            st.kw_dynamic = any(v is not None for v in kw.values())
            st.kwargs = {k: (call.kwargs[k] if v is None else v) for k, v in kw.items()}
            args = r.args[0]
        else:
            st.fn = getattr(base, r.op)
            tmpl = [_template(a, slot, bound) for a in r.args]
            args = r.args
        st.dynamic = any(p is not None for p in tmpl)
        st.args = tuple(a if p is None else p for a, p in zip(args, tmpl))
        simple = st.dynamic and all(p is None or type(p) is _Slot for p in tmpl)
        st.slots = tuple((k, p.i) for k, p in enumerate(tmpl) if p is not None) if simple else None
        st.outs = r.outputs
        st.single = len(r.outputs) == 1 and i not in trace.tuple_out
        st.free = tuple(v for v in set(r.inputs) if last.get(v) == i and v not in keep and v in trace.produced)
        # a result nothing reads (a gradient autodiff computes for a leaf that drops it): freed at once, not at
        # the end of the replay
        st.free += tuple(v for v in r.outputs if v not in last and v not in keep)
        steps.append(st)
    used: set[int] = set()
    for b in bound:
        used |= b.roots
    lost = set(range(1, trace.roots + 1)) - used
    if lost:
        # a binding became a plain number on its way to a kernel (an op converted it): the graph would fix a value
        # the step recomputes every call
        raise _Break(f"{len(lost)} scalar binding(s) (a learning rate, a step count) reached kernels as fixed "
                     "numbers")
    inputs = [(slot, i) for slot, i in in_slots.items()]
    input_vids = set(in_slots)
    rebind_in: list[tuple[int, int]] = []
    consts: list[tuple[int, Any]] = []
    for v in sorted(externals):
        if v in input_vids:
            continue
        e = pre_vid.get(v)
        if e is not None and e in rebound:
            rebind_in.append((v, e))
        else:
            h = trace.handle(v)
            if h is None:  # a state handle the step read and that died without being replaced (not expected)
                raise _Break("a state tensor read by the step was freed during it")
            consts.append((v, h))
    for v, h, _ in out_handles:
        if v is not None and v not in trace.produced and v not in input_vids and all(c != v for c, _ in consts):
            consts.append((v, h))
    # gradients the step replaces without reading them (``zero_grad()`` first, then ``backward()``): eager frees
    # the old ones before the forward pass, so the replay drops them before its kernels run, not when it rebinds
    read_in = {e for _, e in rebind_in}
    release = [e for e in sorted(rebound) if state.entries[e][1] == "grad" and pre[e] is not None
               and e not in read_in]
    return _Schedule(n, steps, bound, inputs, consts, rebind_in, rebind_out, out_handles, out_tree,
                     state_ok, len(records), release)


# ----------------------------------------------------------------------------------------------------------------
# the compiled function
# ----------------------------------------------------------------------------------------------------------------
def _flatten(out: Any, flat: list[Tensor]) -> Any:
    if isinstance(out, Tensor):
        flat.append(out)
        return ("t",)
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # a named tuple (max(dim=...), sort, topk)
        return ("named", type(out), tuple(_flatten(o, flat) for o in out))
    if isinstance(out, (tuple, list)):
        return ("seq", type(out), tuple(_flatten(o, flat) for o in out))
    if isinstance(out, dict):
        return ("dict", tuple(out), tuple(_flatten(o, flat) for o in out.values()))
    return ("const", out)


def _rebuild(tree: Any, flat: Iterator[Tensor]) -> Any:
    """The structure :func:`_flatten` described, with the replay's tensors: capture's ``_unflatten`` plus named
    tuples (built from positional fields)."""
    if tree[0] == "named":
        return tree[1](*(_rebuild(t, flat) for t in tree[2]))
    if tree[0] == "seq":
        return tree[1](_rebuild(t, flat) for t in tree[2])
    if tree[0] == "dict":
        return dict(zip(tree[1], (_rebuild(t, flat) for t in tree[2])))
    return _unflatten(tree, flat)


def replay_enabled() -> bool:
    """False when ``EMBER_REPLAY=0`` (or ``false``/``off``/``no``) is set: compiled functions run eagerly."""
    return os.environ.get("EMBER_REPLAY", "1").strip().lower() not in ("0", "false", "off", "no")


def _escapes(trace: _Trace, outputs: list[Tensor], state: _State, args: tuple[Any, ...]) -> str | None:
    """Why the recording cannot replay because a value computed in the step outlives it in a tensor the compiled
    function does not know (the state of an optimizer it cannot see, a tensor appended to a list, an attribute
    reassigned): a replay would leave that tensor as the recording left it. None when nothing escapes.

    Found by walking, from the step's values, the objects that refer to them (up to three levels: a handle, its
    decorators' wrapper, the tensor) and keeping the tensors. The walk runs first without collecting garbage
    (a full collection costs ~0.1 s in a large process): garbage only adds referrers, so a walk that finds
    nothing is the answer; one that finds a tensor is repeated after ``gc.collect()`` (the tensor may be garbage of
    a reference cycle)."""
    import gc

    produced = [h for h in map(trace.handle, trace.produced) if h is not None]  # a dead value cannot escape
    if not produced:
        return None
    known = {id(t) for t in outputs} | {id(t) for t, _ in state.entries} | {id(a) for a in args}
    skip = {id(trace.handles), id(produced), id(trace.vid_of)} | {id(h) for h in trace.handles}
    skip |= {id(h) for h in produced}
    if _escaping(produced, known, skip) is None:
        return None
    gc.collect()
    return _escaping(produced, known, skip)


def _escaping(produced: list[Any], known: set[int], skip: set[int]) -> str | None:
    """:func:`_escapes`' walk over the referrers of the step's values (the reason, or None)."""
    import gc

    frontier: list[Any] = produced
    seen: set[int] = set(skip)
    for _ in range(3):
        nxt: list[Any] = []
        for r in gc.get_referrers(*frontier):
            if id(r) in seen or isinstance(r, (types.FrameType, types.ModuleType, type)) or r is frontier:
                continue
            seen.add(id(r))
            if isinstance(r, Tensor):
                if id(r) not in known:
                    return (f"a tensor ({list(r.shape)} {r.dtype}) computed in the step is kept outside it where the "
                            "compiled function cannot see it (state of an optimizer or module it does not reach, a "
                            "tensor stored in a list or attribute); a replay would not update it")
                continue
            nxt.append(r)
        if not nxt:
            break
        frontier = nxt
    return None


class CompiledFunction:
    """What :func:`compile` returns: call it as ``fn``. See the module docstring for recording, guards, graph
    breaks and bindings; :meth:`stats` says what happened so far."""

    def __init__(self, fn: Callable[..., Any], fullgraph: bool = False) -> None:
        self.fn = fn
        self.fullgraph = fullgraph
        functools.update_wrapper(self, fn, updated=())  # type: ignore[arg-type]
        self._lock = threading.RLock()
        self._graphs: dict[Any, _Schedule] = {}
        self._eager_keys: dict[Any, str] = {}
        self._warmups: dict[Any, int] = {}
        self._found: Any = None
        self._warned: set[str] = set()
        self._stats = {"calls": 0, "replays": 0, "recordings": 0, "eager_calls": 0, "graph_breaks": 0,
                       "guard_misses": 0, "warmups": 0, "records": 0, "kernels": 0, "input_reads": 0}
        self._last_reason: str | None = None

    def stats(self) -> dict[str, Any]:
        """Counters: ``calls``, ``replays``, ``recordings`` (every recording, the first included), ``guard_misses``
        (recordings because guards matched no graph after the first), ``graph_breaks``, ``warmups`` (recordings
        that changed the state's structure, such as an optimizer creating its state), ``eager_calls`` (calls run
        eagerly without recording), ``graphs`` (graphs kept), ``records`` (backend calls recorded in the last
        graph), ``kernels`` (calls its replay makes, after fusing runs of elementwise records),
        ``input_reads`` and ``reason`` (why the last call did not replay, or None)."""
        with self._lock:
            return {**self._stats, "graphs": len(self._graphs), "reason": self._last_reason}

    def reset(self) -> None:
        """Forget every graph and guard decision (the next call records again); frees what the graphs held (their
        schedules, fused kernels and uploaded constants)."""
        with self._lock:
            self._graphs.clear()
            self._eager_keys.clear()
            self._warmups.clear()
            self._found = None

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        # used as a method decorator: bind like a function (each instance's calls share the graphs, keyed by the
        # instance's state through the guards)
        if obj is None:
            return self
        return types.MethodType(self, obj)

    def _why(self, reason: str) -> None:
        self._last_reason = reason
        if reason not in self._warned:
            self._warned.add(reason)
            log.info("ember.compile(%s): running eagerly: %s", getattr(self.fn, "__qualname__", self.fn), reason)

    def _eager(self, reason: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            self._stats["eager_calls"] += 1
            self._why(reason)
        return self.fn(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .autograd import is_grad_enabled

        with self._lock:
            self._stats["calls"] += 1
        if not replay_enabled():
            return self._eager("EMBER_REPLAY=0", args, kwargs)
        if is_capturing() or is_recording():
            return self._eager("called inside a capture or another compiled step", args, kwargs)
        if any(isinstance(v, Tensor) for v in kwargs.values()):
            return self._eager("tensor keyword arguments are not replayed (pass tensors positionally)", args, kwargs)
        devices = {a._device for a in args if isinstance(a, Tensor)}
        if len(devices) > 1:
            return self._eager(f"tensor arguments on several devices ({sorted(map(str, devices))})", args, kwargs)
        if self._found is None:
            self._found = _reachable(self.fn, args, kwargs)
        state = _State(self.fn, args, kwargs, self._found)
        if not devices:  # a step of its state alone (its data from a closure): the state's device
            devices = {t._device for t, _ in state.entries}
            if len(devices) != 1:
                return self._eager("the step reaches no tensor (arguments or state) to find its device" if not
                                   devices else f"state tensors on several devices ({sorted(map(str, devices))})",
                                   args, kwargs)
        dev = next(iter(devices))
        real = dev.stack
        if isinstance(real, CaptureStack):
            return self._eager("another thread is capturing on the device", args, kwargs)
        if isinstance(real, _Router):  # another thread records on the device: this one uses the device's stack
            real = real.inner
        handles = state.handles(real)
        try:
            first: dict[int, int] = {}  # which tensor arguments are the same tensor (one input slot)
            key = (dev, tuple((tuple(a.shape), a._dtype, first.setdefault(id(a), i)) if isinstance(a, Tensor)
                              else ("py", _hashable(a)) for i, a in enumerate(args)),
                   tuple((k, _hashable(v)) for k, v in sorted(kwargs.items())),
                   is_grad_enabled(), state.flags, state.hyper, state.structure(handles))
            hash(key)
        except TypeError:
            return self._eager("an argument is not hashable (guards compare arguments by value)", args, kwargs)
        with self._lock:
            graph = self._graphs.get(key)
            eager_reason = self._eager_keys.get(key)
        if graph is not None:
            if all(handles[e] is h for e, h in graph.state_ok):
                return self._replay(graph, dev, real, args, state, handles)
            with self._lock:
                self._graphs.pop(key, None)  # a state tensor's memory changed outside the step: record again
        if eager_reason is not None:
            return self._eager(eager_reason, args, kwargs)
        with self._lock:
            if len(self._graphs) >= RECOMPILE_LIMIT:
                msg = (f"ember.compile: {getattr(self.fn, '__qualname__', self.fn)} reached the recompile limit "
                       f"({RECOMPILE_LIMIT} graphs); new guard values run eagerly")
                if "limit" not in self._warned:
                    self._warned.add("limit")
                    log.warning(msg)
                return self._eager(msg, args, kwargs)
        del handles  # the recording must not hold the state's old handles (the gradients zero_grad() drops)
        return self._record(dev, state, args, kwargs, key)

    # -- replay --------------------------------------------------------------------------------------------------
    def _replay(self, g: _Schedule, dev: Device, real: Any, args: tuple[Any, ...], state: _State,
                handles: list[Any]) -> Any:
        lower = real.lower
        in_handles = [lower(a._h) if isinstance(a, Tensor) else None for a in args]
        for e in g.release:  # the old gradients eager's zero_grad() frees first: not held through the replay
            state.entries[e][0].grad = None
            handles[e] = None
        vals = g.run(in_handles, handles)
        lift = real.lift
        for e, v, d in g.rebind_out:
            t, kind = state.entries[e]
            if kind == "grad":
                t.grad = None if v is None else Tensor._make(lift(vals[v]), d, dev)
            else:
                t._h = lift(vals[v])
        flat = [Tensor._make(lift(h if v is None else vals[v]), d, dev) for v, h, d in g.outputs]
        with self._lock:
            self._stats["replays"] += 1
            self._last_reason = None
        return _rebuild(g.tree, iter(flat))

    # -- recording -----------------------------------------------------------------------------------------------
    def _record(self, dev: Device, state: _State, args: tuple[Any, ...], kwargs: dict[str, Any], key: Any) -> Any:
        with _install_lock:
            try:
                rec = _recording_for(dev)
            except _Break as e:
                self._found_eager(key, str(e))
                return self._eager(str(e), args, kwargs)
            handles = state.handles(rec.real)
            router = rec.router
            if router.users == 0:
                dev._stack = router
            router.users += 1
        trace = _Trace(dev, rec.base, rec.norm)
        trace.skip_packages = rec.packages
        real = rec.real
        in_slots: dict[int, int] = {}
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                v = trace.vid(real.lower(a._h))
                trace.inputs.add(v)
                in_slots.setdefault(v, i)
        # the state before the step, held weakly: eager frees what the step drops (old gradients) when it drops it
        pre_vids = [None if h is None else trace.vid(h, weak=True) for h in handles]
        pre = [None if h is None else _weak(h) for h in handles]
        del handles
        with self._lock:
            self._stats["recordings"] += 1
            if self._graphs and key not in self._warmups:
                self._stats["guard_misses"] += 1
        _local.trace = trace
        try:
            out = self.fn(*args, **kwargs)
        finally:
            _local.trace = None
            with _install_lock:
                router.users -= 1
                if router.users == 0 and dev._stack is router:
                    dev._stack = rec.real
        flat: list[Tensor] = []
        tree = _flatten(out, flat)
        reason = trace.broken
        graph = None
        if reason is None:
            post = state.handles(real)
            post_state = _State(self.fn, args, kwargs, self._found)
            if post_state.tensors() != state.tensors() or post_state.hyper != state.hyper:
                # a warm-up call (an optimizer created its state): the next call records the steady step
                with self._lock:
                    self._stats["warmups"] += 1
                    n = self._warmups[key] = self._warmups.get(key, 0) + 1
                if n < _WARMUP_LIMIT:
                    return out
                reason = "the step changes the structure of its state on every call"
            else:
                reason = _escapes(trace, flat, state, args)
        if reason is None:
            outs = []
            for t in flat:
                if t._device is not dev:
                    reason = "the step returns a tensor on another device"
                    break
                h = real.lower(t._h)
                outs.append((trace.vid_of.get(id(h)), h, t._dtype))
            if reason is None:
                try:
                    graph = _schedule(trace, in_slots, state, pre, pre_vids, post, tree, outs)
                except _Break as e:
                    reason = str(e)
        if reason is not None:
            with self._lock:
                self._stats["graph_breaks"] += 1
            if self.fullgraph:
                raise CompileError(f"ember.compile(fullgraph=True): graph break in "
                                   f"{getattr(self.fn, '__qualname__', self.fn)}: {reason}")
            self._found_eager(key, f"graph break: {reason}")
            return out
        assert graph is not None
        with self._lock:
            if key is not None:
                self._graphs[key] = graph
            self._stats["records"] = graph.n_records
            self._stats["kernels"] = len(graph.steps)
            self._stats["input_reads"] += trace.input_reads
            self._last_reason = None
        return out

    def _found_eager(self, key: Any, reason: str) -> None:
        with self._lock:
            if key is not None:
                self._eager_keys[key] = reason
            self._why(reason)


def compile(fn: Callable[..., Any] | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            mode: str | None = None, backend: Any = None) -> Any:
    """Whole-step capture and replay of ``fn`` (``torch.compile``'s signature; also a decorator, with or
    without arguments). Returns a :class:`CompiledFunction`.

    Args:
        fn: the step: a function or callable (a module, a bound method) of tensors.
        fullgraph: raise :class:`CompileError` at a graph break instead of running that call eagerly.
        dynamic: None or False; shapes are always specialised (a new shape records a new graph), so True is
            refused.
        mode, backend: accepted for torch compatibility; ``mode`` must be None or "default", ``backend`` None.
    """
    if dynamic:
        raise ValueRangeError("ember.compile: dynamic=True is not supported; each new input shape records its own "
                              "graph (pass dynamic=None or False)")
    if mode not in (None, "default"):
        raise ValueRangeError(f"ember.compile: mode must be None or 'default', got {mode!r}")
    if backend is not None:
        raise ValueRangeError(f"ember.compile: backend must be None (replay runs the device's own kernels), got "
                              f"{backend!r}")
    if not isinstance(fullgraph, bool):
        raise DTypeError(f"ember.compile: fullgraph must be a bool, got {type(fullgraph).__name__}")
    if fn is None:
        return lambda f: compile(f, fullgraph=fullgraph, dynamic=dynamic, mode=mode, backend=backend)
    if not callable(fn):
        raise DTypeError(f"ember.compile: fn must be callable, got {type(fn).__name__}")
    return CompiledFunction(fn, fullgraph)


class _CompileModule(types.ModuleType):
    """``ember.compile`` is this module, callable as :func:`compile` (``ember.compile(fn)``, ``@ember.compile``)."""

    def __call__(self, fn: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
        return compile(fn, **kwargs)


sys.modules[__name__].__class__ = _CompileModule
