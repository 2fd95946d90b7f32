"""The server side of a session: runs validated messages on one device's stack, within the session's limits.

A session holds its tensors by id (positive: allocated by the client; negative: results of calls) and its
registered graphs (relative forms, :func:`ember.ir.relative_form`). Only contract methods of the backend, and the
optional kernels of :data:`~ember.ir_exec.OPTIONAL_KERNELS` the served stack has, may be named by a record
or a call; plumbing methods (``lift``, ``memory_dry_run``, ...) and anything else are refused, and no value from the
wire is ever a callable. Graphs are checked when registered (every position refers to an
input or an earlier value, every dtype is an ember dtype) and replays before they run (input and output counts,
the bytes of every value the graph computes against the session's memory limit).

Running a validated graph, resolving record arguments and running extension records is shared with ember-router's
``Executor`` through :mod:`ember.ir_exec`; the validation above stays here, and always runs before the shared runner
(this is the server's security boundary).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ember.capture import ExtensionArgs
from ember.decorator import CONTRACT_METHODS
from ember.dtypes import DType
from ember.errors import DeviceError, OutOfMemoryError
from ember.ir import Bindings, Placeholder, Ref
from ember.ir_exec import optional_kernels, resolve_args, run_extension_record, run_graph

from .protocol import Msg, Out, ProtocolError, encode_array

#: contract methods a client may not name: plumbing that hands out backend objects or host memory views
_PLUMBING = frozenset({"lift", "lower", "sync", "memory_report", "memory_dry_run", "describe", "fusion_compile",
                       "may_share_memory", "from_numpy", "to_numpy", "new_random_stream", "run_extension", "seed",
                       "grad_hooks", "post_accumulate_grad_hooks", "hook_node"})
ALLOWED_OPS = frozenset(CONTRACT_METHODS - _PLUMBING)
#: drawn from the session's own stream
_RANDOM = frozenset({"rand", "randn", "randint"})


@dataclass
class Limits:
    """Per-session limits."""

    #: tensors stored at once
    max_tensors: int = 100_000
    #: bytes of stored tensors (and of the values one replay computes)
    max_bytes: int = 4 << 30
    #: registered graphs
    max_graphs: int = 10_000
    #: records in one graph
    max_graph_ops: int = 100_000
    #: generator streams
    max_streams: int = 1024
    #: tensors exported and not yet imported by another session
    max_exports: int = 1024


class Exports:
    """Tensors handed between sessions of one server (``.to()`` between two of its devices): ticket -> the
    exporting session's id, device, stack, handle and dtype. An entry ends when it is imported or its session
    closes; sessions run in worker threads and close in the event loop's, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[bytes, tuple[int, Any, Any, Any, DType]] = {}

    def put(self, ticket: bytes, owner: int, device: Any, stack: Any, h: Any, dtype: DType, limit: int) -> None:
        with self._lock:
            if sum(1 for v in self._items.values() if v[0] == owner) >= limit:
                raise OutOfMemoryError(f"remote: the session has {limit} tensors exported and not imported")
            if ticket in self._items:
                raise ProtocolError("remote: an export ticket was used twice")
            self._items[ticket] = (owner, device, stack, h, dtype)

    def take(self, ticket: bytes) -> tuple[Any, Any, Any, DType]:
        with self._lock:
            try:
                _owner, device, stack, h, dtype = self._items.pop(ticket)
            except KeyError:
                raise DeviceError("remote: no tensor was exported under this ticket (the exporting session ended, "
                                  "or it was imported already)") from None
        return device, stack, h, dtype

    def drop_owner(self, owner: int) -> None:
        with self._lock:
            for t in [t for t, v in self._items.items() if v[0] == owner]:
                del self._items[t]


def offered_kernels(stack: Any) -> tuple[str, ...]:
    """The optional kernels (:data:`~ember.ir_exec.OPTIONAL_KERNELS`) that ``stack`` has: the hello lists
    them, and a session allows records of them."""
    return optional_kernels(stack)


def _nbytes(shape: Sequence[int], dtype: DType) -> int:
    return int(prod(shape)) * dtype.itemsize


class Session:
    """One client's tensors and graphs on ``stack`` (the served device's backend stack)."""

    def __init__(self, stack: Any, device: Any, limits: Limits, exports: Exports | None = None) -> None:
        self.stack = stack
        #: the server's table of tensors handed between sessions (None: this session cannot hand any)
        self.exports = exports
        self.device = device
        self.limits = limits
        #: the methods records and calls may name: the contract's (less plumbing) and the stack's optional kernels
        self.allowed = ALLOWED_OPS | frozenset(offered_kernels(stack))
        self.table: dict[int, Any] = {}
        self.meta: dict[int, tuple[DType, int]] = {}  # id -> (dtype, bytes)
        self.bytes = 0
        self.graphs: dict[int, tuple[Any, ...]] = {}
        self._ids = itertools.count(-1, -1)
        self.ops_run = 0
        #: the compression the greeting negotiated for this session's frames (None: none)
        self.compress: str | None = None
        # the session's own random stream: one client's seed or draws never change another's (the served
        # backend's stream is shared); a stream seeded with n draws what the backend's seed(n) would
        self.stream = stack.new_random_stream(0)
        #: the session's generator streams (ember.Generator on a remote device), by client id
        self.streams: dict[int, Any] = {}

    # -- storage ---------------------------------------------------------------------------------------------
    def get(self, vid: int) -> Any:
        try:
            return self.table[vid]
        except KeyError:
            raise DeviceError(f"remote: tensor %{vid} is not on the server (its computation failed earlier, or it "
                              "was released)") from None

    def put(self, vid: int, h: Any, dtype: DType | None = None) -> None:
        """Store ``h`` as ``vid``, within the session's tensor-count and memory limits."""
        d = self.stack.dtype_of(h) if dtype is None else dtype
        n = _nbytes(h.shape, d)
        self.drop(vid)
        if len(self.table) >= self.limits.max_tensors:
            raise OutOfMemoryError(f"remote: the session already holds {len(self.table)} tensors (limit "
                                   f"{self.limits.max_tensors})")
        if self.bytes + n > self.limits.max_bytes:
            raise OutOfMemoryError(f"remote: storing {d.name}{list(h.shape)} ({n} bytes) would exceed the "
                                   f"session's memory limit of {self.limits.max_bytes} bytes ({self.bytes} in use)")
        self.table[vid] = h
        self.meta[vid] = (d, n)
        self.bytes += n

    def drop(self, vid: int) -> None:
        if self.table.pop(vid, None) is not None:
            self.bytes -= self.meta.pop(vid)[1]

    def close(self) -> None:
        """Free every tensor and graph of the session (and its exports that no session imported)."""
        if self.exports is not None:
            self.exports.drop_owner(id(self))
        self.table.clear()
        self.meta.clear()
        self.graphs.clear()
        self.streams.clear()
        self.bytes = 0

    # -- messages --------------------------------------------------------------------------------------------
    def run(self, msg: Msg) -> Any:
        """Run one message; returns its reply (None for messages without one)."""
        kind, a = msg.kind, msg.args
        if kind == "replay":
            self._replay(*a)
            return None
        if kind == "register":
            if len(self.graphs) >= self.limits.max_graphs and a[0] not in self.graphs:
                raise OutOfMemoryError(f"remote: the session registered {len(self.graphs)} graphs (limit "
                                       f"{self.limits.max_graphs})")
            self.graphs[a[0]] = _check_graph(a[1], self.limits.max_graph_ops, self.allowed)
            return None
        if kind == "forget":
            for gid in a[0]:
                self.graphs.pop(gid, None)
            return None
        if kind == "upload":
            self.put(a[0], self.stack.from_numpy(a[1]))
            return None
        if kind == "download":
            return encode_array(np.asarray(self.stack.to_numpy(self.get(a[0]))))
        if kind == "strides":
            # the layout core checks before view() and in-place writes (a broadcast view is refused), as the served
            # backend reports it (bytes, numpy's convention); None where the backend does not say
            st = getattr(self.get(a[0]), "strides", None)
            return None if st is None else [int(x) for x in st]
        if kind == "export":
            if self.exports is None:
                raise ProtocolError("remote: this server hands no tensors between sessions")
            vid, ticket = a
            h = self.get(vid)
            self.exports.put(ticket, id(self), self.device, self.stack, h, self.meta[vid][0], self.limits.max_exports)
            return None
        if kind == "import":
            if self.exports is None:
                raise ProtocolError("remote: this server hands no tensors between sessions")
            vid, ticket = a
            src_device, _src_stack, h, dtype = self.exports.take(ticket)
            self.put(vid, self._moved(src_device, h, dtype), dtype)
            return None
        if kind == "release":
            for vid in a[0]:
                self.drop(vid)
            return None
        if kind == "call":
            return self._call(*a)
        if kind == "seed":
            self.stream = self.stack.new_random_stream(a[0])
            return None
        if kind == "stream":
            if len(self.streams) >= self.limits.max_streams and a[0] not in self.streams:
                raise OutOfMemoryError(f"remote: the session has {len(self.streams)} random streams (limit "
                                       f"{self.limits.max_streams})")
            self.streams[a[0]] = self.stack.new_random_stream(a[1])
            return None
        if kind == "draw":
            sid, vid, method, args = a
            shape, dtype = args[-2], args[-1]
            if self.bytes + _nbytes(shape, dtype) > self.limits.max_bytes:
                raise OutOfMemoryError(f"remote: drawing {dtype.name}{list(shape)} would exceed the session's "
                                       f"memory limit of {self.limits.max_bytes} bytes")
            self.put(vid, getattr(self._stream(sid), method)(*args), dtype)
            return None
        if kind == "stream_state":
            return bytes(self._stream(a[0]).get_state())
        if kind == "stream_set":
            self._stream(a[0]).set_state(a[1])
            return None
        if kind == "sync":
            self.stack.sync()
            return None
        if kind == "stats":
            return {"tensors": len(self.table), "bytes": self.bytes, "graphs": len(self.graphs),
                    "ops_run": self.ops_run}
        raise ProtocolError(f"remote: unknown message {kind!r}")

    def _call(self, method: str, inputs: tuple[int, ...], args: tuple[Any, ...]) -> Any:
        if method not in self.allowed:
            raise ProtocolError(f"remote: {method!r} is not a backend method a client may call")
        ins = [self.get(v) for v in inputs]
        result = self._method(method)(*resolve_args(args, ins, (), _protocol_error))
        self.ops_run += 1
        return self._outs(result)

    def _moved(self, src_device: Any, h: Any, dtype: DType) -> Any:
        """Handle ``h`` of ``src_device`` (another device of this server) as a new tensor of this session's device:
        core's own move (DLPack, else host memory), run here on the server. Always a tensor of its own, as the
        client's ``.to()`` between two remote devices promises: where core would share the data (one device, or
        two stacks of one backend) it is copied."""
        from ember import Tensor
        from ember.bridge import transfer

        if src_device.base is self.device.base:
            return self.stack.copy(self.stack.lift(src_device.stack.lower(h)))
        return transfer(Tensor._make(h, dtype, src_device), self.device)._h

    def _stream(self, sid: int) -> Any:
        try:
            return self.streams[sid]
        except KeyError:
            raise ProtocolError(f"remote: random stream {sid} was never created in this session") from None

    def _method(self, name: str) -> Any:
        return getattr(self.stream, name) if name in _RANDOM else getattr(self.stack, name)

    def _outs(self, r: Any) -> Any:
        t = type(r)
        if t is tuple or t is list:
            return tuple(self._outs(x) for x in r)
        if r is None or t in (bool, int, float, str, complex) or isinstance(r, DType) or not hasattr(r, "shape"):
            if callable(r) and not isinstance(r, DType):
                raise ProtocolError("remote: a call returned a callable, which cannot cross the wire")
            return r
        vid = next(self._ids)
        self.put(vid, r)
        return Out(vid, tuple(int(n) for n in r.shape), self.meta[vid][0])

    def _replay(self, gid: int, inputs: tuple[int, ...], outputs: tuple[int, ...], bindings: Bindings,
                release: tuple[int, ...]) -> None:
        try:
            key = self.graphs[gid]
        except KeyError:
            raise ProtocolError(f"remote: graph {gid} was never registered in this session") from None
        ext, body, outs = key
        if len(inputs) != len(ext) or len(outputs) != len(outs):
            raise ProtocolError(f"remote: graph {gid} takes {len(ext)} inputs and gives {len(outs)} outputs, the "
                                f"replay names {len(inputs)} and {len(outputs)}")
        dims, scalars = bindings.dims, bindings.scalars
        # the bytes every value of the graph takes, before anything runs (a replay cannot allocate past the limit)
        total = 0
        for _op, _pos, shapes, dtypes, _args in body:
            for s, d in zip(shapes, dtypes):
                total += _nbytes(_bind_shape(s, dims), d)
        if self.bytes + total > self.limits.max_bytes:
            raise OutOfMemoryError(f"remote: graph {gid} computes {total} bytes, past the session's memory limit "
                                   f"of {self.limits.max_bytes} ({self.bytes} in use)")
        ins = [self.get(v) for v in inputs]
        in_dtypes = [self.meta[v][0] for v in inputs]
        results = run_graph(key, ins, in_dtypes, scalars, self._method, self._extension,
                            _protocol_error, self._count)
        for vid, (h, d) in zip(outputs, results):
            self.put(vid, h, d)
        for vid in release:
            self.drop(vid)

    def _count(self) -> None:
        self.ops_run += 1

    def _extension(self, ext: ExtensionArgs, hs: list[Any], dtypes: list[DType]) -> Any:
        # the op's own entry point on the served device: its kernel where the server has one, else its composition
        return run_extension_record(ext, hs, dtypes, self.device, None,
                                    f"remote: the extension op {ext.name!r} is not installed on the server",
                                    _protocol_error)


def _protocol_error(message: str) -> ProtocolError:
    return ProtocolError(f"remote: {message}")


def _bind_shape(shape: Any, dims: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for n in shape:
        if type(n) is Placeholder:
            if n.kind != "dim" or not 0 <= n.k < len(dims):
                raise ProtocolError(f"remote: shape placeholder {n} has no binding")
            out.append(dims[n.k])
        elif type(n) is int and n >= 0:
            out.append(n)
        else:
            raise ProtocolError(f"remote: bad dim {n!r:.30} in a graph shape")
    return tuple(out)


def _check_graph(key: tuple[Any, ...], max_ops: int, allowed: frozenset[str] = ALLOWED_OPS) -> tuple[Any, ...]:
    """Validate a graph key (see the module docstring) before it is stored; ``allowed``: the method names a record
    may name."""
    ext, body, outs = key
    if type(ext) is not tuple or type(body) is not tuple or type(outs) is not tuple or len(body) > max_ops:
        raise ProtocolError(f"remote: a graph key must be three tuples with at most {max_ops} records")
    n_values = 0
    for entry in body:
        if type(entry) is not tuple or len(entry) != 5:
            raise ProtocolError("remote: a graph record must be (op, positions, shapes, dtypes, args)")
        op, positions, shapes, dtypes, args = entry
        if op != "extension" and op not in allowed:
            raise ProtocolError(f"remote: {op!r:.40} is not a backend method a graph may record")
        if op == "extension" and (not args or type(args[0]) is not ExtensionArgs):
            raise ProtocolError("remote: an extension record needs its ExtensionArgs")
        if type(positions) is not tuple or type(shapes) is not tuple or type(dtypes) is not tuple \
                or type(args) is not tuple:
            raise ProtocolError(f"remote: malformed record of {op}")
        for p in positions:
            _check_position(p, len(ext), n_values)
        if any(not isinstance(d, DType) for d in dtypes) or len(shapes) != len(dtypes) and dtypes:
            raise ProtocolError(f"remote: record of {op}: one dtype per output shape")
        for s in shapes:
            if type(s) is not tuple:
                raise ProtocolError(f"remote: record of {op}: shapes must be tuples")
        n_values += len(dtypes)
        _check_refs(args, len(positions), 0)
    for p in outs:
        _check_position(p, len(ext), n_values)
    return key


def _check_position(p: Any, n_in: int, n_values: int) -> None:
    ok = (type(p) is tuple and len(p) == 2 and type(p[1]) is int and
          ((p[0] == "in" and 0 <= p[1] < n_in) or (p[0] == "v" and 0 <= p[1] < n_values)))
    if not ok:
        raise ProtocolError(f"remote: graph position {p!r:.40} refers to no input or earlier value")


def _check_refs(a: Any, n: int, depth: int) -> None:
    t = type(a)
    if t is Ref and not 0 <= a.k < n:
        raise ProtocolError(f"remote: argument reference {a.k} out of range (the record has {n} inputs)")
    if t is tuple:
        for x in a:
            _check_refs(x, n, depth + 1)
    elif t is ExtensionArgs:
        _check_refs(a.args, n, depth + 1)
