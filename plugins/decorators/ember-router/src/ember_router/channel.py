"""Channels: where a router's messages go. The :class:`Channel` interface, the :class:`Executor` that runs messages
on a device (the receiving side of every channel), and the built-in ``local`` and ``capture`` channels.

A third-party channel subclasses :class:`Channel` and implements :meth:`Channel.send`: deliver one message
(:mod:`ember_router.protocol`) and return the reply: ``None`` for everything but
:class:`~ember_router.protocol.Download`, which returns a numpy array, and :class:`~ember_router.protocol.Call`,
which returns the call's result with handles as :class:`~ember_router.protocol.Out`. A channel that carries
messages elsewhere (a socket, a queue) runs an :class:`Executor` on the other side and serializes the messages:
they are plain picklable data. Set
:attr:`Channel.local` only when the executor lives in this process (hooks and zero-copy moves need it).
"""

from __future__ import annotations

import itertools
import pickle
import threading
from collections.abc import Sequence
from typing import Any

from ember import Device
from ember.capture import CapturedGraph, ExtensionArgs, GraphValue
from ember.dtypes import DType
from ember.errors import DeviceError
from ember.extension import TensorSpec
from ember.ir import Bindings, OpRecord, Placeholder
from ember.ir_exec import optional_kernels, resolve_args, run_extension_record, run_graph

from .protocol import Call, Download, Out, Register, Release, Replay, Seed, SliceArg, Strides, Sync, Upload

_SCALARS = (bool, int, float)
#: backend methods outside the contract a channel's device may offer: autodiff above a router differentiates a
#: convolution with them where the backend has them (flex's, OpenCL's), so the router gives the bits of the device


class Channel:
    """Base class of channels. Subclasses implement :meth:`send`; the router counts what it sends."""

    #: the channel's name in device strings (``flex+router(local)``)
    name = "channel"
    #: True when the executor runs in this process, so handles and callables may cross (gradient hooks, generator
    #: streams and zero-copy moves between the router device and its undecorated device need it)
    local = False

    def send(self, message: Any) -> Any:
        """Deliver one message and return its reply (see the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__}.send")

    def message_size(self, message: Any) -> int:
        """The bytes ``message`` takes on the wire (pickled); 0 for local-only messages that hold callables."""
        try:
            return len(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, TypeError, AttributeError):
            return 0

    def bind(self, device: Device) -> None:
        """Told the router's device once it is known (the device extension ops were called on)."""

    def kernels(self) -> tuple[str, ...]:
        """The optional kernels (:data:`~ember.ir_exec.OPTIONAL_KERNELS`) the receiving side runs; the router
        records them like contract methods. None by default: a third-party channel lists those its executor's
        stack has."""
        return ()

    def memory_report(self) -> dict[str, Any]:
        """The receiving device's memory statistics, where the channel can tell."""
        return {}

    def describe(self) -> str:
        return self.name


def _is_handle(a: Any) -> bool:
    t = type(a)
    return not (a is None or t in _SCALARS or t is str or t is tuple or t is list or t is slice or a is Ellipsis
                or isinstance(a, DType)) and hasattr(a, "shape")


class Executor:
    """Runs messages on a stack: the receiving side of a channel. Holds the tensors by id and the registered
    graphs. ``device`` is the device whose stack ``stack`` is (extension ops are called on it); it may be set
    later (:meth:`Channel.bind`)."""

    def __init__(self, stack: Any, device: Device | None = None) -> None:
        self.stack = stack
        self.device = device
        self.table: dict[int, Any] = {}
        self.dtypes: dict[int, DType] = {}
        self.graphs: dict[int, tuple[Any, ...]] = {}
        self._ids = itertools.count(-1, -1)
        self._lock = threading.RLock()

    # -- ids ---------------------------------------------------------------------------------------------------
    def get(self, vid: int) -> Any:
        try:
            return self.table[vid]
        except KeyError:
            raise DeviceError(f"router: tensor %{vid} is not on the channel (its computation failed earlier, or it "
                              "was released)") from None

    def adopt(self, h: Any, dtype: DType | None = None) -> Out:
        """Store a handle of the executor's stack under a new id."""
        vid = next(self._ids)
        self.table[vid] = h
        d = self.stack.dtype_of(h) if dtype is None else dtype
        self.dtypes[vid] = d
        return Out(vid, tuple(h.shape), d)

    # -- messages ----------------------------------------------------------------------------------------------
    def handle(self, msg: Any) -> Any:
        """Run one message; returns its reply."""
        t = type(msg)
        with self._lock:
            if t is Replay:
                return self._replay(msg)
            if t is Register:
                self.graphs[msg.graph_id] = msg.key
                return None
            if t is Upload:
                self.table[msg.id] = self.stack.from_numpy(msg.array)
                self.dtypes[msg.id] = self.stack.dtype_of(self.table[msg.id])
                return None
            if t is Download:
                return self.stack.to_numpy(self.get(msg.id))
            if t is Release:
                self._release(msg.ids)
                return None
            if t is Call:
                return self._call(msg)
            if t is Seed:
                self.stack.seed(msg.seed)
                return None
            if t is Sync:
                self.stack.sync()
                return None
            if t is Strides:
                st = getattr(self.get(msg.id), "strides", None)
                return None if st is None else tuple(int(x) for x in st)
        raise DeviceError(f"router: unknown message {t.__name__}")

    def _release(self, ids: Sequence[int]) -> None:
        for vid in ids:
            self.table.pop(vid, None)
            self.dtypes.pop(vid, None)

    def _call(self, msg: Call) -> Any:
        ins = [self.get(v) for v in msg.inputs]
        with _grad_mode(msg.grad_enabled):
            result = getattr(self.stack, msg.method)(*resolve_args(msg.args, ins, ()))
        return self._outs(result)

    def _outs(self, r: Any) -> Any:
        t = type(r)
        if t is tuple or t is list:
            return t(self._outs(x) for x in r)
        return self.adopt(r) if _is_handle(r) else r

    def _replay(self, msg: Replay) -> None:
        try:
            key = self.graphs[msg.graph_id]
        except KeyError:
            raise DeviceError(f"router: graph {msg.graph_id} was never registered on this channel") from None
        inputs = [self.get(v) for v in msg.inputs]
        in_dtypes = [self.dtypes.get(v) for v in msg.inputs]
        with _grad_mode(msg.grad_enabled):
            results = run_graph(key, inputs, in_dtypes, msg.bindings.scalars,
                                lambda op: getattr(self.stack, op), self._extension)
        for vid, (h, d) in zip(msg.outputs, results):
            self.table[vid] = h
            self.dtypes[vid] = d
        self._release(msg.release)

    def _extension(self, ext: ExtensionArgs, ins: list[Any], dtypes: list[DType]) -> Any:
        from ember import extension

        if extension.get(ext.name) is not None and self.device is None:
            raise DeviceError(f"router: {ext.name}: the channel does not know its device yet")
        return run_extension_record(ext, ins, dtypes, self.device, self.stack,
                                    f"router: the extension op {ext.name!r} is not registered where the channel "
                                    "runs it")


def _unslice(a: Any) -> Any:
    """Recorded arguments with SliceArg turned back into slices (ember.capture's record form)."""
    t = type(a)
    if t is SliceArg:
        return a.to_slice()
    if t is tuple:
        return tuple(_unslice(x) for x in a)
    return a


class _grad_mode:
    """Run under the grad mode ops were recorded in (None: leave it)."""

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled
        self.ctx: Any = None

    def __enter__(self) -> None:
        if self.enabled is not None:
            from ember.autograd import set_grad_enabled

            self.ctx = set_grad_enabled(self.enabled)
            self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def _device_of(channel: Channel) -> Device | None:
    """The router device whose stack sends through ``channel``, when only plain contract calls ran so far and no
    extension op bound it to the channel."""
    from ember.device import _interned
    from ember.dispatch import stack_chain

    return next((d for d in list(_interned.values()) if d._stack is not None
                 and any(getattr(s, "channel", None) is channel for s in stack_chain(d._stack))), None)


class LocalChannel(Channel):
    """Runs the messages on an ember device in this process: ``target`` (a Device), or the router's inner stack.
    Each message is measured as it would be sent (pickled size), so the counters say what a remote channel would
    carry."""

    name = "local"
    local = True

    def __init__(self, stack: Any, device: Device | None = None) -> None:
        self.executor = Executor(stack, device)

    def send(self, message: Any) -> Any:
        return self.executor.handle(message)

    def bind(self, device: Device) -> None:
        if self.executor.device is None:
            self.executor.device = device

    def kernels(self) -> tuple[str, ...]:
        return optional_kernels(self.executor.stack)

    def memory_report(self) -> dict[str, Any]:
        return dict(self.executor.stack.memory_report())

    def describe(self) -> str:
        return f"local({self.executor.stack.describe()})"


class CaptureChannel(LocalChannel):
    """A local channel that also keeps every graph it runs: :meth:`graphs` returns them as
    :class:`ember.capture.CapturedGraph` s (inputs named by tensor id), for export or whole-step replay."""

    name = "capture"

    def __init__(self, stack: Any, device: Device | None = None, keep: int = 64) -> None:
        super().__init__(stack, device)
        self.keep = keep
        self.registered: dict[int, tuple[Any, ...]] = {}
        self.replays: list[Replay] = []
        self._in_specs: list[dict[int, tuple[tuple[int, ...], DType]]] = []

    def send(self, message: Any) -> Any:
        if type(message) is Register:
            self.registered[message.graph_id] = message.key
        elif type(message) is Replay:
            ex = self.executor
            specs = {v: (tuple(ex.get(v).shape), ex.dtypes[v]) for v in message.inputs}
            self.replays.append(message)
            self._in_specs.append(specs)
            if len(self.replays) > self.keep:
                del self.replays[0], self._in_specs[0]
        return super().send(message)

    def kernels(self) -> tuple[str, ...]:
        return ()  # the graphs kept are for export and replay on any device: contract methods only

    def graphs(self) -> list[CapturedGraph]:
        """The graphs of the kept replays, oldest first, with concrete ids, shapes and scalars."""
        return [self._graph(r, specs) for r, specs in zip(self.replays, self._in_specs)]

    def _graph(self, replay: Replay, specs: dict[int, tuple[tuple[int, ...], DType]]) -> CapturedGraph:
        ext, body, outs = self.registered[replay.graph_id]
        b: Bindings = replay.bindings
        fresh = itertools.count(max([0, *replay.inputs, *replay.outputs]) + 1)
        ids: dict[tuple[str, int], int] = {("in", k): v for k, v in enumerate(replay.inputs)}
        wanted = {pos: vid for pos, vid in zip(outs, replay.outputs)}
        records = []
        n = 0

        def bind(a: Any) -> Any:
            t = type(a)
            if t is Placeholder:
                return b.dims[a.k] if a.kind == "dim" else b.scalars[a.k]
            if t is tuple:
                return tuple(bind(x) for x in a)
            return a

        for op, positions, shapes, dtypes, args in body:
            outputs = []
            for _ in dtypes:
                outputs.append(wanted.get(("v", n), None) or next(fresh))
                ids[("v", n)] = outputs[-1]
                n += 1
            from ember.ir import Scalar

            rec_args = tuple(Scalar(b.scalars[a.k]) if type(a) is Placeholder else _unslice(a) for a in args)
            records.append(OpRecord(op, tuple(ids[p] for p in positions), tuple(outputs),
                                    tuple(tuple(bind(s)) for s in shapes), tuple(dtypes), rec_args))
        inputs = tuple(GraphValue(v, f"%{v}", TensorSpec(*specs[v]), "input") for v in replay.inputs)
        out_ids = tuple(ids[p] for p in outs)
        shape_of = {v.id: v.spec for v in inputs}
        for r in records:
            shape_of.update((o, TensorSpec(s, d)) for o, s, d in zip(r.outputs, r.shapes, r.dtypes))
        device = self.executor.device or _device_of(self)
        if device is None:
            raise DeviceError("capture channel: the device the graphs ran on is not known yet (run an op first)")
        return CapturedGraph(tuple(records), inputs, (), out_ids, tuple(shape_of[o] for o in out_ids),
                             ("seq", tuple, tuple(("t",) for _ in out_ids)), device)

