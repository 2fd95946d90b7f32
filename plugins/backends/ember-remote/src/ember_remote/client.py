"""The client: :class:`RemoteBackend`, the backend of ``Device.remote("ember://host:port/device", ...)``.

Handles are :class:`RemoteHandle` s: an id on the server, a shape and a dtype. Contract calls are recorded as
:class:`ember.ir.OpRecord` s (output specs from :data:`ember.capture.SHAPE_RULES`); a method without a shape
rule is sent at once as a call. Records accumulate until a sync point (a read, ``sync()``, ``seed()``, a call, the
size bound); then they are one graph, registered once in relative form (:func:`ember.ir.relative_form`) and
replayed by id with bindings afterwards. Messages that need no reply (register, replay, upload, release, seed)
wait in a queue and travel with the next one that does, in one batch frame: a read costs one round trip.

A dropped connection loses the session's tensors on the server: the next operation reconnects (a new session),
and using a tensor of the old session raises :class:`~ember_remote.protocol.RemoteError`.

The layout (strides) of a server tensor is asked for when core needs it (``view()`` to a new shape, writes
through ``index_put``/``scatter_``/``masked_fill_``): one round trip, then kept on the handle, so those checks are
the served backend's own. Optional kernels the server offers (``conv_input_grad``, ``conv_weight_grad``) become
methods of the backend, so the autodiff stack here differentiates with the served backend's kernels, as it would
locally: training over remote gives the bits of training on the served device.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import secrets
import socket
import ssl
import threading
import weakref
from functools import partial
from math import prod
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ember import dtypes as dt
from ember import errors as ember_errors
from ember.backend import Backend
from ember.dtypes import DType
from ember.errors import ValueRangeError
from ember.ir import OpRecord, Ref, relative_form
from ember.ir_exec import (
    OPTIONAL_KERNELS,
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

from .protocol import (
    COMPRESSIONS,
    DEFAULT_MAX_FRAME,
    HEADER,
    TICKET_BYTES,
    Out,
    RemoteError,
    Slice,
    decode_array,
    decode_value,
    dtype_named,
    encode_array,
    encode_value,
    pack_frame,
    unpack_frame,
)
from .server import is_loopback

DEFAULT_MAX_PENDING = 1024
DEFAULT_FLUSH_BYTES = 1 << 26
#: queued upload bytes that send the queue at once (frames stay well below the server's limit)
QUEUE_BYTES = 32 << 20

_SCALARS = (bool, int, float)
_COUNTERS = ("graphs_registered", "graph_hits", "replays", "ops_sent", "bytes_sent", "bytes_received",
             "round_trips", "calls", "uploads", "downloads", "reconnects", "strides_asked", "peer_moves")
#: a handle whose strides were not asked for yet
_UNASKED: Any = object()


class RemoteHandle:
    """A remote tensor: its id in the server session ``epoch``, its shape and dtype."""

    __slots__ = ("shape", "dtype", "vid", "epoch", "backend", "_strides", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: DType, vid: int, epoch: int, backend: RemoteBackend) -> None:
        self.shape = shape
        self.dtype = dtype
        self.vid = vid
        self.epoch = epoch
        self.backend = backend
        self._strides = _UNASKED

    @property
    def strides(self) -> tuple[int, ...] | None:
        """The tensor's strides on the server, in bytes as the served backend reports them (None where it does
        not): asked for on first use (a round trip, after sending what is pending), then kept -- a handle's layout
        never changes."""
        s = self._strides
        if s is _UNASKED:
            s = self._strides = self.backend.strides_of(self)
        return s  # type: ignore[no-any-return]

    def __del__(self) -> None:
        try:
            b = self.backend
            if b._epoch == self.epoch:
                b._released.append(self.vid)  # freed on the server with the next batch
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: nothing left to free
            pass

    def __repr__(self) -> str:
        return f"RemoteHandle(%{self.vid}, shape={self.shape}, dtype={self.dtype})"


def _is_handle(a: Any) -> bool:
    t = type(a)
    return not (a is None or t in _SCALARS or t is str or t is tuple or t is list or t is slice or a is Ellipsis
                or t is complex or isinstance(a, DType)) and hasattr(a, "shape")


def parse_address(address: str) -> tuple[str, int, str]:
    """``ember://host:port/device`` -> (host, port, device string); the port defaults to 7433."""
    u = urlsplit(address)
    if u.scheme != "ember" or not u.hostname:
        raise ValueRangeError(f"Device.remote: the address must look like ember://host:7433/flex, got {address!r}")
    try:
        port = u.port or 7433
    except ValueError:
        raise ValueRangeError(f"Device.remote: bad port in {address!r}") from None
    return u.hostname, port, u.path.lstrip("/")


class Connection:
    """One authenticated session with a server: blocking socket, one batch frame out, one reply frame in."""

    def __init__(self, host: str, port: int, token: str, fingerprint: str | None, insecure: bool,
                 timeout: float, cafile: str | None = None, device: tuple[str, ...] = (),
                 compress: bool = False) -> None:
        self.sock: Any = None
        #: the compression the greeting negotiated (None: frames travel as they are)
        self.compress: str | None = None
        raw = socket.create_connection((host, port), timeout=timeout)
        try:
            if insecure:
                sock: Any = raw
            else:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_3
                if fingerprint is not None:  # the pin replaces CA verification (self-signed certificates)
                    ctx.check_hostname = False
                    ctx.verify_mode = ssl.CERT_NONE
                elif cafile is not None:
                    ctx.load_verify_locations(cafile)
                else:
                    ctx.load_default_certs()
                sock = ctx.wrap_socket(raw, server_hostname=host)
                if fingerprint is not None:
                    der = sock.getpeercert(binary_form=True) or b""
                    if not hmac.compare_digest(hashlib.sha256(der).hexdigest(), fingerprint):
                        sock.close()
                        raise RemoteError(f"remote: the certificate of {host}:{port} does not match the pinned "
                                          "fingerprint; nothing was sent (is it the right server?)",
                                          "FingerprintMismatch")
            self.sock = sock
            hello: dict[str, Any] = {"token": token, "device": list(device)}
            if compress:
                hello["compress"] = list(COMPRESSIONS)
            self.hello = self.exchange(pack_frame("hello", hello), DEFAULT_MAX_FRAME)
            chosen = self.hello.get("compress") if type(self.hello) is dict else None
            self.compress = chosen if compress and chosen in COMPRESSIONS else None
        except RemoteError:
            raw.close()
            raise
        except (OSError, ssl.SSLError) as exc:
            raw.close()
            raise RemoteError(f"remote: could not connect to {host}:{port}: {type(exc).__name__}: {exc}",
                              "ConnectionError") from None

    def exchange(self, frame: bytes, max_frame: int) -> Any:
        """Send ``frame``; return the reply body (an ``err`` reply raises)."""
        try:
            self.sock.sendall(frame)
            header = self._recv(HEADER.size)
            (n,) = HEADER.unpack(header)
            if n > max_frame:
                raise RemoteError(f"remote: the server sent a frame of {n} bytes", "ProtocolError")
            kind, body = unpack_frame(self._recv(n), max_frame, self.compress is not None)
        except (OSError, EOFError, ssl.SSLError) as exc:
            self.close()
            raise RemoteError(f"remote: the connection was lost ({type(exc).__name__}: {exc}); the server's "
                              "tensors of this session are gone", "ConnectionLost") from None
        if kind == "err":
            if type(body) is not list or len(body) != 3:
                raise RemoteError("remote: malformed error reply", "ProtocolError")
            raise _server_error(*body)
        return body

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("the server closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


def _server_error(kind: Any, message: Any, index: Any) -> Exception:
    """The server's error as the ember error of the same name (a typed error crosses the wire), else RemoteError."""
    kind, message = str(kind), str(message)
    cls = getattr(ember_errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, ember_errors.EmberError):
        return cls(f"{message} (on the server)")
    return RemoteError(f"remote: the server failed: {kind}: {message}", kind)


def _canonical(spec: str) -> str:
    """A device string as ``str(Device)`` prints it (``flex+fusion(False)`` -> ``flex+fusion(enabled=False)``),
    where this side knows the names in it; else as given."""
    try:
        from ember import Device

        return str(Device.parse(spec))
    except Exception:  # noqa: BLE001 - a device only the server has: compare the string as given
        return spec


class RemoteBackend(Backend):
    """The ``remote`` backend: records ops, sends them to an ``ember serve`` server, reads values back."""

    name = "remote"
    contract_version = 1

    def __init__(self, address: str, token: str | None = None, fingerprint: str | None = None,
                 insecure: bool = False, timeout: float = 300.0, cafile: str | None = None,
                 max_pending: int = DEFAULT_MAX_PENDING, flush_bytes: int = DEFAULT_FLUSH_BYTES,
                 compress: bool = False) -> None:
        super().__init__(0)
        self.host, self.port, self.device_name = parse_address(address)
        self.address = address
        token = token if token is not None else os.environ.get("EMBER_REMOTE_TOKEN")
        if not token:
            raise ValueRangeError("Device.remote: a token is needed (token=... or EMBER_REMOTE_TOKEN)")
        if insecure and not is_loopback(self.host):
            raise ValueRangeError(f"Device.remote: insecure=True (plaintext) is allowed for loopback hosts only, "
                                  f"not {self.host!r}")
        fingerprint = fingerprint if fingerprint is not None else os.environ.get("EMBER_REMOTE_FINGERPRINT")
        if fingerprint is not None:
            fingerprint = fingerprint.replace(":", "").strip().lower()
            if len(fingerprint) != 64 or any(c not in "0123456789abcdef" for c in fingerprint):
                raise ValueRangeError("Device.remote: fingerprint must be a SHA-256 digest (64 hex digits, colons "
                                      "allowed)")
        self._opts = (token, fingerprint, bool(insecure), float(timeout), cafile)
        self.compress = bool(compress)
        self.max_pending = int(max_pending)
        self.flush_bytes = int(flush_bytes)
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._epoch = 0
        self._pending: list[OpRecord] = []
        self._queue: list[list[Any]] = []
        self._queued_bytes = 0
        self._specs: dict[int, tuple[tuple[int, ...], DType]] = {}
        self._live: dict[int, Any] = {}
        self._released: list[int] = []
        self._graphs: dict[Any, int] = {}
        self._ids = itertools.count(1)
        self._graph_ids = itertools.count(1)
        self._stream_ids = itertools.count(1)
        self.counts = dict.fromkeys(_COUNTERS, 0)
        self._connect()

    # -- the connection --------------------------------------------------------------------------------------
    def _connect(self) -> Connection:
        token, fingerprint, insecure, timeout, cafile = self._opts
        # the address's device as written and as this side prints it: the server matches either against its own
        names = tuple(dict.fromkeys((self.device_name, _canonical(self.device_name)))) if self.device_name else ()
        conn = Connection(self.host, self.port, token, fingerprint, insecure, timeout, cafile, names, self.compress)
        hello = conn.hello
        served = hello.get("device") if type(hello) is dict else None
        if self.device_name and served not in (self.device_name, _canonical(self.device_name)):
            conn.close()
            raise RemoteError(f"remote: {self.host}:{self.port} serves {served!r}, not {self.device_name!r}",
                              "DeviceMismatch")
        self.served = served
        #: the server process's identity: two devices with the same one can move tensors on the server
        self.server_instance = str(hello.get("server", ""))
        offered = hello.get("kernels", ())
        for k in OPTIONAL_KERNELS:  # a method only where the server has the kernel: autodiff probes with getattr
            if type(offered) is list and k in offered:
                setattr(self, k, partial(self._record_kernel, k))
            else:
                self.__dict__.pop(k, None)
        self.server_describe = str(hello.get("describe", ""))
        self.supported_dtypes = frozenset(dtype_named(n) for n in hello.get("dtypes", ()))
        self.max_frame = int(hello.get("max_frame", DEFAULT_MAX_FRAME))
        self.max_graphs = max(2, int(hello.get("max_graphs", 10_000)))
        self._conn = conn
        return conn

    def _lost(self) -> None:
        """Forget the session: its tensors are gone on the server."""
        self._conn = None
        self._epoch += 1
        self._pending, self._queue, self._queued_bytes = [], [], 0
        self._specs.clear()
        self._live.clear()
        self._released.clear()
        self._graphs.clear()

    def _exchange(self, msgs: list[list[Any]]) -> list[Any]:
        """Send the queue plus ``msgs`` as one batch; return the replies of its reply-bearing messages."""
        conn = self._conn
        if conn is None:
            conn = self._connect()
            self.counts["reconnects"] += 1
        release = self._take_released()
        batch = self._queue + ([["release", list(release)]] if release else []) + msgs
        self._queue, self._queued_bytes = [], 0
        frame = pack_frame("batch", batch, conn.compress)
        self.counts["bytes_sent"] += len(frame)
        self.counts["round_trips"] += 1
        try:
            reply = conn.exchange(frame, self.max_frame)
        except RemoteError as exc:
            if exc.kind in ("ConnectionLost", "ProtocolError"):
                self._lost()
            raise
        if type(reply) is not list:
            raise RemoteError("remote: malformed reply", "ProtocolError")
        return reply

    def _enqueue(self, msg: list[Any], nbytes: int = 0) -> None:
        self._queue.append(msg)
        self._queued_bytes += nbytes
        if self._queued_bytes >= QUEUE_BYTES or len(self._queue) >= 4096:
            self._exchange([])

    def _check(self, h: RemoteHandle) -> int:
        if h.epoch != self._epoch:
            raise RemoteError(f"remote: tensor %{h.vid} belonged to a session that was lost when the connection "
                              "dropped; recompute it", "LostState")
        return h.vid

    def close(self) -> None:
        """Close the connection (the server frees the session's tensors)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._lost()

    # -- handles ---------------------------------------------------------------------------------------------
    def _new(self, shape: tuple[int, ...], dtype: DType, vid: int | None = None) -> RemoteHandle:
        if vid is None:
            vid = next(self._ids)
        h = RemoteHandle(shape, dtype, vid, self._epoch, self)
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
        if type(h) is not RemoteHandle:
            raise RemoteError(f"remote: got a handle of another backend ({type(h).__name__})", "WrongDevice")
        vid = self._check(h)
        return ref_for(vid, inputs, pos)

    def _lower_rec(self, a: Any, inputs: list[int], pos: dict[int, int]) -> Any:
        def leaf(x: Any) -> Any:
            if callable(x) and not isinstance(x, DType) and not _is_handle(x):
                raise RemoteError("remote: a Python callable cannot be sent to the server", "Unsupported")
            return self._ref_of(x, inputs, pos) if _is_handle(x) else x

        return lower_arg(a, Slice, leaf)

    def _rec_args(self, name: str, args: tuple[Any, ...], inputs: list[int], pos: dict[int, int]) -> tuple[Any, ...]:
        return record_args(name, args, lambda a: self._lower_rec(a, inputs, pos))

    # -- recording -------------------------------------------------------------------------------------------
    def _record(self, name: str, args: tuple[Any, ...],
                specs: list[tuple[tuple[int, ...], DType]] | None = None) -> Any:
        from ember.capture import IN_PLACE

        with self._lock:
            if IN_PLACE.get(name) is not None and name != "write_back":
                inputs: list[int] = []
                pos: dict[int, int] = {}
                rec_args = self._rec_args(name, args, inputs, pos)
                self._pending.append(OpRecord(name, tuple(inputs), (), (), (), rec_args))
                if len(self._pending) >= self.max_pending:
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
            if any(prod(o.shape) * o.dtype.itemsize >= self.flush_bytes for o in outs):
                # a large allocation runs now, so that running out of memory fails at its own call
                self.flush()
                self._exchange([])
            elif len(self._pending) >= self.max_pending:
                self.flush()
            return outs[0] if len(outs) == 1 and not returns_tuple(name, args) else tuple(outs)

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        """Run ``name`` on the server at once and return its result as this backend's handles."""
        with self._lock:
            self.flush()
            inputs: list[int] = []
            pos: dict[int, int] = {}
            lowered = tuple(self._lower_rec(a, inputs, pos) for a in args)
            self.counts["calls"] += 1
            (reply,) = self._exchange([["call", name, inputs, encode_value(lowered)]])
            return self._wrap_out(decode_value(reply))

    def flush(self) -> None:
        """Queue the accumulated records as one graph (registered once per relative form, then replayed)."""
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
                if len(self._graphs) >= self.max_graphs:
                    # the least recently used graph goes, here and on the server (within its graph limit)
                    old_key = next(iter(self._graphs))
                    self._queue.append(["forget", [self._graphs.pop(old_key)]])
                gid = self._graphs[key] = next(self._graph_ids)
                self._queue.append(["register", gid, encode_value(key)])
                self.counts["graphs_registered"] += 1
            else:
                self._graphs[key] = self._graphs.pop(key)  # most recently used last
                self.counts["graph_hits"] += 1
            release = self._take_released(produced)
            self.counts["replays"] += 1
            self.counts["ops_sent"] += len(records)
            self._enqueue(["replay", gid, [v for v, _, _ in externals], wanted,
                           [list(bindings.dims), encode_value(bindings.scalars)], list(release)])

    def _take_released(self, skip: set[int] = frozenset()) -> tuple[int, ...]:  # type: ignore[assignment]
        if not self._released:
            return ()
        dead, self._released = self._released, []
        out = []
        for v in dead:
            ref = self._live.get(v)
            if ref is not None and ref() is None:
                del self._live[v]
                self._specs.pop(v, None)
            if v not in skip:
                out.append(v)
        return tuple(out)

    def _record_kernel(self, name: str, *args: Any) -> Any:
        """An optional kernel the server offers (:data:`~ember.ir_exec.OPTIONAL_KERNELS`), recorded like a
        contract method: ``conv_input_grad(grad_y, w, x_shape, ...)`` gives x_shape, ``conv_weight_grad(x,
        grad_y, w_shape, ...)`` w_shape, in the dtype of the first argument."""
        return self._record(name, args, [(optional_kernel_shape(args), args[0].dtype)])

    def strides_of(self, h: RemoteHandle) -> tuple[int, ...] | None:
        """The strides of ``h``'s tensor on the server (what :attr:`RemoteHandle.strides` returns): sends what is
        pending, then asks (one round trip)."""
        with self._lock:
            vid = self._check(h)
            self.flush()
            self.counts["strides_asked"] += 1
            (reply,) = self._exchange([["strides", vid]])
            if reply is None:
                return None
            st = tuple(reply) if type(reply) is list else ()
            if len(st) != len(h.shape) or any(type(x) is not int for x in st):
                raise RemoteError(f"remote: malformed strides {reply!r:.60} for a tensor of shape {h.shape}",
                                  "ProtocolError")
            return st

    def from_peer(self, source: Any, h: Any) -> RemoteHandle | None:
        """``.to()`` from another remote device of the same server (core's optional hook): the tensor moves on the
        server, handed from the source's session to this one under a random ticket -- no data through this
        process. None (core then moves it through host memory) for any other source."""
        if type(source) is not RemoteBackend or type(h) is not RemoteHandle or source is self:
            return None
        if source._conn is None or self._conn is None or not source.server_instance \
                or source.server_instance != self.server_instance:
            return None  # another server (or a connection to re-establish first): through the host
        ticket = secrets.token_bytes(TICKET_BYTES)
        with source._lock:  # one lock at a time: two devices moving tensors both ways cannot deadlock
            vid = source._check(h)
            source.flush()
            source._exchange([["export", vid, ticket]])  # on the server before the import below is sent
        with self._lock:
            out = self._new(tuple(h.shape), h.dtype)
            self.counts["peer_moves"] += 1
            self._enqueue(["import", out.vid, ticket])
            return out

    # -- plumbing --------------------------------------------------------------------------------------------
    def to_numpy(self, h: Any) -> np.ndarray:
        with self._lock:
            vid = self._check(h)
            self.flush()
            self.counts["downloads"] += 1
            (reply,) = self._exchange([["download", vid]])
            self.counts["bytes_received"] += len(reply[2]) if type(reply) is list and len(reply) == 3 else 0
            return decode_array(reply, 1 << 62)

    def from_numpy(self, array: np.ndarray) -> Any:
        with self._lock:
            a = array if array.flags.c_contiguous else np.array(array, order="C")  # 0-d stays 0-d
            h = self._new(tuple(a.shape), dt.from_numpy_dtype(a.dtype))
            self.counts["uploads"] += 1
            # encoded now: a copy of the bytes, so later changes to the caller's array do not travel
            enc = encode_array(a)
            enc[2] = bytes(enc[2])
            self._enqueue(["upload", h.vid, enc], a.nbytes)
            return h

    def dtype_of(self, h: Any) -> DType:
        return h.dtype  # type: ignore[no-any-return]

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return True

    def new_random_stream(self, seed: int) -> Any:
        """An ``ember.Generator`` stream kept on the server (the served backend's own kind of stream, so a
        generator draws there what it draws on that device); draws are queued like records."""
        with self._lock:
            sid = next(self._stream_ids)
            self._enqueue(["stream", sid, int(seed) % (1 << 64)])
            return _RemoteStream(self, sid, self._epoch)

    def sync(self) -> None:
        with self._lock:
            self.flush()
            self._exchange([["sync"]])

    def seed(self, seed: int) -> None:
        with self._lock:
            self.flush()
            self._enqueue(["seed", int(seed) % (1 << 64)])

    def memory_report(self) -> dict[str, Any]:
        with self._lock:
            self.flush()
            (stats,) = self._exchange([["stats"]])
            out = {f"server_{k}": v for k, v in stats.items()} if type(stats) is dict else {}
            out["in_use"] = out.get("server_bytes", 0)
            out.update({f"remote_{k}": v for k, v in self.counts.items()})
            out["remote_pending"] = len(self._pending)
            return out

    def describe(self) -> str:
        return f"remote {self.host}:{self.port} serving {self.served} ({self.server_describe})"

    def run_extension(self, call: Any) -> Any:
        return self.record_extension(call.op, call.args, call.kwargs, call.spec, call.dtypes)

    def extension_kernel(self, op: Any) -> Any:
        """Every extension op that declares its outputs runs on the server as one record (with the server's own
        kernel, e.g. flex's fused cross-entropy) instead of its composition being recorded here; core asks this for
        ops that registered no ``remote`` kernel, so the shared op registry is never changed."""
        return None if getattr(op, "_output", None) is None else _extension_kernel(op)

    def record_extension(self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], spec: Any = None,
                         dtypes: dict[int, DType] | None = None) -> Any:
        """Record extension op ``op`` on ``args`` (this backend's handles where tensors go) as one ``extension``
        record: the server runs the op on its device, with its own kernel where it has one."""
        from ember.capture import ExtensionArgs
        from ember.extension import TensorSpec

        if dtypes is None:
            dtypes = {i: a.dtype for i, a in enumerate(args) if type(a) is RemoteHandle}
        if spec is None:
            spec = op.output_spec(*[TensorSpec(tuple(a.shape), a.dtype) if i in dtypes else a
                                    for i, a in enumerate(args)], **kwargs)
        if spec is None:
            raise ember_errors.UnsupportedError(f"remote: the extension op {op.name} declares no output spec, "
                                                "so it cannot be recorded; declare output= to run it remotely")
        with self._lock:
            inputs: list[int] = []
            pos: dict[int, int] = {}
            rec = tuple(self._ref_of(a, inputs, pos) if i in dtypes else a for i, a in enumerate(args))
            specs = spec if isinstance(spec, tuple) else (spec,)
            outs = [self._new(tuple(s.shape), s.dtype) for s in specs]
            ext = ExtensionArgs(op.name, rec, tuple(sorted(kwargs.items())))
            self._pending.append(OpRecord("extension", tuple(inputs), tuple(o.vid for o in outs),
                                          tuple(o.shape for o in outs), tuple(o.dtype for o in outs), (ext,)))
            if len(self._pending) >= self.max_pending:
                self.flush()
            return tuple(outs) if isinstance(spec, tuple) else outs[0]


class _RemoteStream:
    """An ``ember.Generator`` stream on the server: draws become queued ``draw`` messages (in order with the
    records, which are flushed first); the state is read and set with a round trip."""

    def __init__(self, backend: RemoteBackend, sid: int, epoch: int) -> None:
        self.backend = backend
        self.sid = sid
        self.epoch = epoch

    def _draw(self, method: str, args: tuple[Any, ...], shape: Any, dtype: DType) -> RemoteHandle:
        b = self.backend
        with b._lock:
            if self.epoch != b._epoch:
                raise RemoteError("remote: this generator's stream was lost with its session", "LostState")
            b.flush()
            h = b._new(tuple(int(n) for n in shape), dtype)
            b._enqueue(["draw", self.sid, h.vid, method, encode_value(args)])
            return h

    def rand(self, shape: tuple[int, ...], dtype: DType) -> Any:
        return self._draw("rand", (tuple(shape), dtype), shape, dtype)

    def randn(self, shape: tuple[int, ...], dtype: DType) -> Any:
        return self._draw("randn", (tuple(shape), dtype), shape, dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> Any:
        return self._draw("randint", (int(low), int(high), tuple(shape), dtype), shape, dtype)

    def get_state(self) -> bytes:
        b = self.backend
        with b._lock:
            b.flush()
            (state,) = b._exchange([["stream_state", self.sid]])
            return bytes(state)

    def set_state(self, state: bytes) -> None:
        b = self.backend
        with b._lock:
            b.flush()
            b._enqueue(["stream_set", self.sid, bytes(state)])


def _extension_kernel(op: Any) -> Any:
    def kernel(backend: RemoteBackend, *args: Any, **kwargs: Any) -> Any:
        return backend.record_extension(op, args, kwargs)

    kernel.__name__ = f"remote_{op.__name__}"
    kernel.__doc__ = f"{op.name} on a remote device: one extension record, run by the server."
    return kernel


for _name in RECORDED_METHODS:
    setattr(RemoteBackend, _name, recording_method(
        _name, f"{_name}: recorded as an ember.ir.OpRecord and sent to the server at the next sync point."))
del _name
