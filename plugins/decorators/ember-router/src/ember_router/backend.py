"""RouterBackend: every contract call and extension op as an :class:`ember.ir.OpRecord`, sent through a channel.

Handles are :class:`RouterHandle` s: an id on the channel's side, a shape and a dtype -- no data here. Recording
needs only output specs, which come from :data:`ember.capture.SHAPE_RULES` (the capture's shape rules); a method
without one is sent at once as a :class:`~ember_router.protocol.Call`. Records accumulate until a sync point:

* a read (``to_numpy``), ``sync()``, ``seed()``, a move between devices, a call of the gradient API that changes
  state or reads a pending tensor (``grad_of`` of a tensor on the channel is no sync point);
* the size bound: ``max_pending`` records, or one op whose output has ``flush_bytes`` or more (an allocation that
  fails then fails at its own call);
* a change of grad mode (a differentiable channel device runs each graph under the mode its ops were recorded in);
* an in-place write under grad mode on a differentiable device (which may refuse it: the error belongs to the call).

Then the accumulated records are one graph: its relative form (:func:`ember.ir.relative_form`: positional ids, dims
and scalar operands as placeholders) is registered on the channel once, and every flush with the same form -- every
training step after the first -- sends only a :class:`~ember_router.protocol.Replay` with the graph id and the
bindings. Values that no live handle can read are never stored on the channel. Counters (``memory_report()``,
``router_*`` keys): graphs registered, replays, ops sent, bytes sent, messages, calls.

The optional kernels the channel's device offers (:meth:`Channel.kernels`: flex's convolution gradients) are
methods of the router too, recorded like contract methods, so autodiff above the router (``flex+router(local)+
autodiff``) differentiates with them as it would on the device: the same bits.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from functools import partial
from math import prod
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.autograd import is_grad_enabled
from ember.backend import Backend
from ember.capture import IN_PLACE, ExtensionArgs
from ember.decorator import Decorator
from ember.dtypes import DType
from ember.errors import DeviceError, UnsupportedError
from ember.ir import OpRecord, Ref, relative_form
from ember.ir_exec import (
    RECORDED_METHODS,
    graph_interface,
    lower_arg,
    optional_kernel_shape,
    output_specs,
    record_args,
    recording_method,
    ref_for,
    returns_tuple,
)

from .channel import Channel
from .protocol import Call, Download, Out, Register, Release, Replay, Seed, SliceArg, Strides, Sync, Upload

#: records accumulated before a flush (bounds the graph size and the memory its temporaries hold)
DEFAULT_MAX_PENDING = 1024
#: an op whose output has at least this many bytes flushes at once
DEFAULT_FLUSH_BYTES = 1 << 26

_SCALARS = (bool, int, float)
#: the gradient API (ember.decorator.Differentiable): sync points, sent as Calls
_GRADIENT_API = ("tracking", "requires_grad", "set_requires_grad", "is_leaf", "grad_fn", "grad_of", "set_grad",
                 "retain_grad", "detach", "backward", "grad")

#: calls of the gradient API that only read the state of tensors already on the channel: no flush before them
_READ_ONLY_CALLS = frozenset({"tracking", "requires_grad", "is_leaf", "grad_fn", "grad_of", "detach"})

#: a handle whose strides were not asked for yet
_UNASKED: Any = object()

_COUNTERS = ("graphs_registered", "graph_hits", "replays", "ops_sent", "bytes_sent", "messages", "calls",
             "uploads", "downloads")


class RouterHandle:
    """A router's handle: the id of a tensor on the channel's side, its shape and dtype."""

    __slots__ = ("shape", "dtype", "vid", "router", "_strides", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: DType, vid: int, router: RouterBackend) -> None:
        self.shape = shape
        self.dtype = dtype
        self.vid = vid
        self.router = router
        self._strides: Any = _UNASKED

    @property
    def strides(self) -> Any:
        """The strides of the data on the channel's side (core checks them before ``view()`` and in-place writes:
        a broadcast view is refused), as the channel device's backend reports them: read from a local channel's
        handle, asked for once with a :class:`~ember_router.protocol.Strides` message on other channels."""
        router = self.router
        if not router.channel.local:
            if self._strides is _UNASKED:
                self._strides = router.strides_of(self)
            return self._strides
        with router._lock:
            return getattr(router._local_handle(self), "strides", None)

    def __del__(self) -> None:
        try:
            self.router._released.append(self.vid)  # freed on the channel with the next message that carries it
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to free
            pass

    def __repr__(self) -> str:
        return f"RouterHandle(%{self.vid}, shape={self.shape}, dtype={self.dtype})"


def _is_handle(a: Any) -> bool:
    t = type(a)
    return not (a is None or t in _SCALARS or t is str or t is tuple or t is list or t is slice or a is Ellipsis
                or isinstance(a, DType)) and hasattr(a, "shape")


class RouterBackend(Decorator):
    """Wraps ``inner`` (for extension-kernel lookup and dtypes) and sends its work through ``channel``."""

    decorator_name = "router"
    contract_version = 1

    def __init__(self, inner: Backend, channel: Channel, max_pending: int = DEFAULT_MAX_PENDING,
                 flush_bytes: int = DEFAULT_FLUSH_BYTES) -> None:
        self.channel = channel
        self.max_pending = max_pending
        self.flush_bytes = flush_bytes
        self._lock = threading.RLock()
        self._pending: list[OpRecord] = []
        self._live: dict[int, weakref.ref[RouterHandle]] = {}
        self._specs: dict[int, tuple[tuple[int, ...], DType]] = {}
        self._released: list[int] = []
        self._graphs: dict[Any, int] = {}
        self._ids = itertools.count(1)
        self._graph_ids = itertools.count(1)
        self._mode: bool | None = None
        self.counts = dict.fromkeys(_COUNTERS, 0)
        super().__init__(inner)
        #: gradients are recorded where the ops run: the channel's device (the inner stack for ``local``)
        self.differentiable = bool(getattr(inner, "differentiable", False))
        for k in channel.kernels():  # instance methods: autodiff above probes them with getattr
            setattr(self, k, partial(self._record_kernel, k))

    # -- sending ---------------------------------------------------------------------------------------------
    def _send(self, msg: Any) -> Any:
        counts = self.counts
        counts["messages"] += 1
        counts["bytes_sent"] += self.channel.message_size(msg)
        return self.channel.send(msg)

    def _new(self, shape: tuple[int, ...], dtype: DType, vid: int | None = None) -> RouterHandle:
        if vid is None:
            vid = next(self._ids)
        h = RouterHandle(shape, dtype, vid, self)
        self._live[vid] = weakref.ref(h)
        self._specs[vid] = (shape, dtype)
        return h

    def _wrap_out(self, r: Any) -> Any:
        t = type(r)
        if t is Out:
            return self._new(tuple(r.shape), r.dtype, r.id)
        if t is tuple or t is list:
            return t(self._wrap_out(x) for x in r)
        return r

    def _ref_of(self, h: Any, inputs: list[int], pos: dict[int, int]) -> Ref:
        vid = h.vid if type(h) is RouterHandle else self._adopt(h).vid
        return ref_for(vid, inputs, pos)

    def _lower_rec(self, a: Any, inputs: list[int], pos: dict[int, int]) -> Any:
        return lower_arg(a, SliceArg, lambda x: self._ref_of(x, inputs, pos) if _is_handle(x) else x)

    def _grad_mode(self) -> bool | None:
        return is_grad_enabled() if self.differentiable else None

    # -- recording -------------------------------------------------------------------------------------------
    def _record(self, name: str, args: tuple[Any, ...],
                specs: list[tuple[tuple[int, ...], DType]] | None = None) -> Any:
        with self._lock:
            mode = self._grad_mode()
            if mode != self._mode:
                self.flush()
                self._mode = mode
            written = IN_PLACE.get(name)
            if written is not None and name != "write_back":
                inputs: list[int] = []
                pos: dict[int, int] = {}
                rec_args = self._rec_args(name, args, inputs, pos)
                self._pending.append(OpRecord(name, tuple(inputs), (), (), (), rec_args))
                if len(self._pending) >= self.max_pending or mode:
                    # under grad mode a differentiable device may refuse the write (a leaf that requires grad):
                    # the error must be raised here, at the call, not at a later sync point
                    self.flush()
                return None
            if specs is None:
                specs = output_specs(name, args)
            if specs is None:
                return self._call(name, args)
            inputs, pos = [], {}
            rec_args = self._rec_args(name, args, inputs, pos)
            outs = [self._new(tuple(int(n) for n in shape), dtype) for shape, dtype in specs]
            self._pending.append(OpRecord(name, tuple(inputs), tuple(o.vid for o in outs),
                                          tuple(o.shape for o in outs), tuple(o.dtype for o in outs), rec_args))
            if len(self._pending) >= self.max_pending or any(
                    prod(o.shape) * o.dtype.itemsize >= self.flush_bytes for o in outs):
                self.flush()
            return outs[0] if len(outs) == 1 and not returns_tuple(name, args) else tuple(outs)

    def _record_kernel(self, name: str, *args: Any) -> Any:
        """An optional kernel of the channel's device, recorded like a contract method: ``conv_input_grad(grad_y,
        w, x_shape, ...)`` gives x_shape, ``conv_weight_grad(x, grad_y, w_shape, ...)`` w_shape, in the dtype of
        the first argument."""
        return self._record(name, args, [(optional_kernel_shape(args), self.dtype_of(args[0]))])

    def _rec_args(self, name: str, args: tuple[Any, ...], inputs: list[int], pos: dict[int, int]) -> tuple[Any, ...]:
        return record_args(name, args, lambda a: self._lower_rec(a, inputs, pos))

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        """Run ``name`` on the channel at once and return its result as this router's handles. A call that changes
        state (backward, set_grad, ...) first sends everything pending; one that only reads the gradient state of
        tensors already on the channel does not (the pending ops cannot change what it reads)."""
        with self._lock:
            inputs: list[int] = []
            pos: dict[int, int] = {}
            lowered = tuple(self._lower_rec(a, inputs, pos) if not callable(a) else a for a in args)
            if name not in _READ_ONLY_CALLS or self._any_pending(inputs):
                self.flush()
            self.counts["calls"] += 1
            reply = self._send(Call(name, tuple(inputs), lowered, self._grad_mode()))
            return self._wrap_out(reply)

    def _any_pending(self, vids: Sequence[int]) -> bool:
        """Whether a pending record computes any of ``vids`` (they are not on the channel yet)."""
        if not self._pending:
            return False
        wanted = set(vids)
        return any(v in wanted for r in self._pending for v in r.outputs)

    def flush(self) -> None:
        """Send the accumulated records as one graph (registered once per relative form, then replayed)."""
        with self._lock:
            records = self._pending
            if not records:
                return
            self._pending = []
            live = self._live
            produced, externals, wanted = graph_interface(
                records, self._specs.__getitem__, lambda v: (ref := live.get(v)) is not None and ref() is not None)
            key, bindings = relative_form(records, externals, wanted)
            gid = self._graphs.get(key)
            if gid is None:
                gid = self._graphs[key] = next(self._graph_ids)
                self._send(Register(gid, key))
                self.counts["graphs_registered"] += 1
            else:
                self.counts["graph_hits"] += 1
            release = self._take_released(produced)
            self.counts["replays"] += 1
            self.counts["ops_sent"] += len(records)
            self._send(Replay(gid, tuple(v for v, _, _ in externals), tuple(wanted), bindings, release,
                              self._mode))

    def _take_released(self, skip: set[int] = frozenset()) -> tuple[int, ...]:  # type: ignore[assignment]
        """The ids whose handles died (to free on the channel), forgotten here."""
        if not self._released:
            return ()
        dead, self._released = self._released, []
        out = []
        for v in dead:
            ref = self._live.get(v)
            if ref is not None and ref() is None:
                del self._live[v]
                self._specs.pop(v, None)
            if v not in skip:  # a value computed and dropped in the same graph was never stored
                out.append(v)
        return tuple(out)

    # -- plumbing with router semantics ------------------------------------------------------------------------
    def _adopt(self, h: Any) -> RouterHandle:
        """A handle of the channel device's stack (a gradient hook's argument), registered under a new id."""
        ex = getattr(self.channel, "executor", None)
        if not self.channel.local or ex is None:
            raise DeviceError(f"router: got a handle of another stack ({type(h).__name__}) on a non-local channel")
        return self._wrap_out(ex.adopt(h))

    def _local_handle(self, h: RouterHandle) -> Any:
        """The channel device's handle for h (local channels only)."""
        self.flush()
        return self.channel.executor.get(h.vid)  # type: ignore[attr-defined]

    def strides_of(self, h: RouterHandle) -> tuple[int, ...] | None:
        """The strides of ``h``'s tensor on the channel's side: sends what is pending, then asks (one message)."""
        with self._lock:
            self.flush()
            reply = self._send(Strides(h.vid))
            return None if reply is None else tuple(int(x) for x in reply)

    def to_numpy(self, h: Any) -> np.ndarray:
        if type(h) is not RouterHandle:
            return self.inner.to_numpy(h)
        with self._lock:
            self.flush()
            self.counts["downloads"] += 1
            return self._send(Download(h.vid))  # type: ignore[no-any-return]

    def from_numpy(self, array: np.ndarray) -> Any:
        with self._lock:
            h = self._new(tuple(array.shape), dt.from_numpy_dtype(array.dtype))
            self.counts["uploads"] += 1
            # the array is copied, as a wire would: the tensor must not change when the caller's array does
            self._send(Upload(h.vid, np.array(array, copy=True)))
            return h

    def dtype_of(self, h: Any) -> DType:
        return h.dtype if type(h) is RouterHandle else self.inner.dtype_of(h)

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return True  # conservative: the data is on the channel's side

    def sync(self) -> None:
        with self._lock:
            self.flush()
            release = self._take_released()
            if release:
                self._send(Release(release))
            self._send(Sync())

    def seed(self, seed: int) -> None:
        with self._lock:
            self.flush()
            self._send(Seed(seed))

    def new_random_stream(self, seed: int) -> Any:
        if not self.channel.local:
            return Backend.new_random_stream(self, seed)  # drawn on the host, uploaded
        return _RouterStream(self, self._call("new_random_stream", (seed,)))

    def lift(self, h: Any) -> Any:
        if self.channel.local:
            with self._lock:
                ex = self.channel.executor  # type: ignore[attr-defined]
                return self._wrap_out(ex.adopt(ex.stack.lift(h)))
        base = self.base_backend
        return self.from_numpy(np.ascontiguousarray(base.to_numpy(h)))

    def lower(self, h: Any) -> Any:
        if type(h) is not RouterHandle:
            return h
        if self.channel.local:
            with self._lock:
                ex = self.channel.executor  # type: ignore[attr-defined]
                return ex.stack.lower(self._local_handle(h))
        return self.base_backend.from_numpy(self.to_numpy(h))

    def memory_report(self) -> dict[str, Any]:
        out = dict(self.channel.memory_report())
        out.update({f"router_{k}": v for k, v in self.counts.items()})
        out["router_pending"] = len(self._pending)
        return out

    def describe(self) -> str:
        return f"router({self.channel.describe()}) over {self.inner.describe()}"

    def run_extension(self, call: Any) -> Any:
        self.channel.bind(call.device)
        spec = call.spec
        with self._lock:
            if spec is None:  # outputs unknown without running: at once, on the channel (local only)
                if not self.channel.local:
                    raise UnsupportedError(f"router: the extension op {call.op.name} declares no output spec, so it "
                                           "cannot be recorded; declare output= to run it through this channel")
                self.flush()
                ex = self.channel.executor  # type: ignore[attr-defined]
                args = tuple(ex.get(a.vid) if type(a) is RouterHandle else a for a in call.args)
                out = ex.stack.run_extension(call.with_args(args, ex.stack))
                return self._wrap_out(ex._outs(out))
            mode = self._grad_mode()
            if mode != self._mode:
                self.flush()
                self._mode = mode
            inputs: list[int] = []
            pos: dict[int, int] = {}
            rec = tuple(self._ref_of(a, inputs, pos) if i in call.dtypes else a for i, a in enumerate(call.args))
            specs = spec if isinstance(spec, tuple) else (spec,)
            outs = [self._new(tuple(s.shape), s.dtype) for s in specs]
            ext = ExtensionArgs(call.op.name, rec, tuple(sorted(call.kwargs.items())))
            self._pending.append(OpRecord("extension", tuple(inputs), tuple(o.vid for o in outs),
                                          tuple(o.shape for o in outs), tuple(o.dtype for o in outs), (ext,)))
            if len(self._pending) >= self.max_pending:
                self.flush()
            return tuple(outs) if isinstance(spec, tuple) else outs[0]

    # -- the gradient API (used only when the channel's device records gradients) --------------------------------
    def grad_hooks(self, h: Any) -> MutableMapping[int, Callable[[Any], Any]]:
        return _HookTable(self, self._call("grad_hooks", (h,)), one=True)

    def post_accumulate_grad_hooks(self, h: Any) -> MutableMapping[int, Callable[[], None]]:
        return self._call("post_accumulate_grad_hooks", (h,))  # type: ignore[no-any-return]

    def hook_node(self, hs: Sequence[Any], hook: Callable[[list[Any]], Sequence[Any] | None]) -> list[Any]:
        def on_grads(ghs: list[Any]) -> list[Any] | None:
            out = hook([None if g is None else self._adopt(g) for g in ghs])
            if out is None:
                return None
            return [None if o is None else self._local_handle(o) for o in out]

        return self._call("hook_node", (list(hs), on_grads))  # type: ignore[no-any-return]


def _gradient_method(name: str) -> Callable[..., Any]:
    def method(self: RouterBackend, *args: Any) -> Any:
        return self._call(name, args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"{name}: the channel device's gradient API, called at once (a sync point)."
    return method


for _name in RECORDED_METHODS:
    setattr(RouterBackend, _name, recording_method(
        _name, f"{_name}: recorded as an ember.ir.OpRecord and sent at the next sync point."))
for _name in _GRADIENT_API:
    setattr(RouterBackend, _name, _gradient_method(_name))
RouterBackend._resolve_policies()
del _name


class _HookTable(MutableMapping):  # type: ignore[type-arg]
    """The channel device's hook table seen from the router: hooks get and return this router's handles."""

    def __init__(self, router: RouterBackend, table: MutableMapping[int, Any], one: bool) -> None:
        self.router = router
        self.table = table

    def __setitem__(self, key: int, fn: Callable[[Any], Any]) -> None:
        router = self.router

        def on_grad(g: Any) -> Any:
            out = fn(router._adopt(g))
            return None if out is None else router._local_handle(out)

        on_grad.__wrapped__ = fn  # type: ignore[attr-defined]
        self.table[key] = on_grad

    def __getitem__(self, key: int) -> Any:
        return getattr(self.table[key], "__wrapped__", self.table[key])

    def __delitem__(self, key: int) -> None:
        del self.table[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


class _RouterStream:
    """An ``ember.Generator`` stream of the channel's device whose draws come back as router handles."""

    def __init__(self, router: RouterBackend, stream: Any) -> None:
        self.router = router
        self.stream = stream

    def _draw(self, name: str, *args: Any) -> Any:
        with self.router._lock:
            self.router.flush()  # draws run now, in order with the recorded ops
            return self.router._adopt(getattr(self.stream, name)(*args))

    def rand(self, shape: tuple[int, ...], dtype: DType) -> Any:
        return self._draw("rand", shape, dtype)

    def randn(self, shape: tuple[int, ...], dtype: DType) -> Any:
        return self._draw("randn", shape, dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> Any:
        return self._draw("randint", low, high, shape, dtype)

    def get_state(self) -> bytes:
        return self.stream.get_state()  # type: ignore[no-any-return]

    def set_state(self, state: bytes) -> None:
        self.stream.set_state(state)
