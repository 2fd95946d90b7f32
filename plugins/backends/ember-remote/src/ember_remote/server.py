"""``ember serve``: ember devices behind an asyncio TLS 1.3 server (stdlib ``ssl``).

Why TLS over TCP with stdlib ``ssl`` rather than QUIC: no extra dependency, the platform's audited TLS 1.3, and
the traffic is request/reply on one stream (batches until a read), which gains nothing from QUIC's streams.

Per connection: the TLS handshake (``ssl_handshake_timeout``), then the first frame must be ``hello`` with the
token, compared with :func:`hmac.compare_digest` on SHA-256 digests (constant time, length hidden) before anything
else is read or run; a peer that fails is logged and dropped. The hello also names the device (the address's path:
one of those served, the first when empty) and the compressions the client reads; the reply names the device, the
compression both sides use and the optional kernels the device has. Then each ``batch`` frame runs in order on the
session's :class:`~ember_remote.executor.Session` (in a worker thread, so the event loop keeps serving other
sessions) and gets one reply frame. A malformed message gets an ``err`` reply; a frame that breaks the framing
(oversized, truncated, another protocol version) ends the connection. Every failure is confined to its session.
SIGTERM stops accepting, lets the batches in flight finish and reply, then closes every session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import itertools
import json
import logging
import os
import secrets
import signal
import ssl
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ember.errors import DeviceError, EmberError, ValueRangeError

from .protocol import (
    COMPRESSIONS,
    DEFAULT_MAX_FRAME,
    HEADER,
    MAX_HELLO_FRAME,
    VERSION,
    ProtocolError,
    decode_batch,
    encode_value,
    pack_frame,
    unpack_frame,
)

log = logging.getLogger("ember.serve")

#: message kinds whose reply goes into the batch's ``ok`` frame
_REPLYING = frozenset({"download", "call", "stats", "stream_state", "strides"})


def _event(event: str, **fields: Any) -> None:
    """One structured log line: a JSON object with the event name and its fields."""
    log.info(json.dumps({"t": round(time.time(), 3), "event": event, **fields}, default=str))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_ssl_context(cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS 1.3-only server context with ``cert``/``key``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


class Server:
    """Serves ``device`` (an :class:`ember.Device`, or a sequence of them: the address's path picks one, the first
    by default) to clients that present ``token``.

    ``ssl_context`` None means plaintext, allowed only on a loopback ``host``. ``idle_timeout`` closes sessions
    that send nothing for that many seconds; ``max_sessions`` refuses connections beyond it; ``limits`` are the
    per-session limits (:class:`~ember_remote.executor.Limits`); ``workers`` threads run sessions' batches.
    """

    def __init__(self, device: Any, token: str | bytes, host: str = "127.0.0.1", port: int = 7433,
                 ssl_context: ssl.SSLContext | None = None, max_sessions: int = 16, idle_timeout: float = 600.0,
                 max_frame: int = DEFAULT_MAX_FRAME, limits: Any = None, workers: int = 1,
                 handshake_timeout: float = 10.0) -> None:
        from .executor import Limits

        if ssl_context is None and not is_loopback(host):
            raise ValueRangeError(f"ember serve: plaintext (--insecure) listens on loopback only, not on {host!r}")
        token_b = token.encode() if isinstance(token, str) else bytes(token)
        if len(token_b) < 16:
            raise ValueRangeError("ember serve: the token must have at least 16 characters")
        # a mapping gives each device the spec it was parsed from ("opencl:0"), a name clients may use as well
        named = list(device.items()) if isinstance(device, Mapping) else [
            (None, d) for d in (device if isinstance(device, (list, tuple)) else [device])]
        devices = list(dict.fromkeys(d for _, d in named))
        if not devices:
            raise ValueRangeError("ember serve: no device to serve")
        #: the served devices by every name a client may give: str(device) and the spec it was parsed from
        self.devices: dict[str, Any] = {}
        for spec, d in named:
            for alias in (str(d), spec):
                if alias:
                    self.devices.setdefault(str(alias), d)
        self.device = devices[0]
        self._all = devices
        # resolved now: resolving a device takes core's lock, which an in-process client may hold while connecting
        self.stacks = {id(d): d.stack for d in devices}
        self.stack = self.stacks[id(self.device)]
        self._token_digest = hashlib.sha256(token_b).digest()
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_frame = max_frame
        self.limits = limits if limits is not None else Limits()
        self.handshake_timeout = handshake_timeout
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ember-serve")
        self._server: asyncio.base_events.Server | None = None
        self._sessions: dict[int, dict[str, Any]] = {}
        self._session_ids = itertools.count(1)
        from .executor import Exports

        #: tensors handed between sessions (.to() between two devices of this server), and this server's identity
        #: in the hello, by which a client knows that two of its devices are on one server
        self.exports = Exports()
        self.instance = secrets.token_hex(16)
        self._stopping = False
        self._stopped: asyncio.Event | None = None
        self.stats = {"accepted": 0, "refused": 0, "auth_failed": 0, "protocol_errors": 0, "batches": 0}

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen (``port`` 0 picks a free port, then stored in :attr:`port`)."""
        self._stopped = asyncio.Event()
        self._server = await asyncio.start_server(
            self._client, self.host, self.port, ssl=self.ssl_context,
            ssl_handshake_timeout=self.handshake_timeout if self.ssl_context else None,
            limit=1 << 16)
        self.port = self._server.sockets[0].getsockname()[1]
        _event("listening", host=self.host, port=self.port, device=str(self.device),
               devices=[str(d) for d in self._all], tls=self.ssl_context is not None)

    async def serve_forever(self) -> None:
        """Start, serve until :meth:`stop` (or SIGTERM/SIGINT), then shut down gracefully."""
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                loop.add_signal_handler(sig, self.stop)
        assert self._stopped is not None
        await self._stopped.wait()
        await self._shutdown()

    def stop(self) -> None:
        """Stop accepting; sessions finish their batch in flight, reply, and close."""
        if self._stopping:
            return
        self._stopping = True
        _event("stopping", sessions=len(self._sessions))
        if self._server is not None:
            self._server.close()
        for s in list(self._sessions.values()):
            if not s["busy"]:
                s["task"].cancel()  # an idle session: end its read (a busy one replies first, then ends)
        if self._stopped is not None:
            self._stopped.set()

    async def _shutdown(self) -> None:
        tasks = [s["task"] for s in self._sessions.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        self._pool.shutdown(wait=True)
        _event("stopped", **self.stats)

    # -- one connection --------------------------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        sid = next(self._session_ids)
        if self._stopping or len(self._sessions) >= self.max_sessions:
            self.stats["refused"] += 1
            _event("refused", session=sid, peer=peer, reason="stopping" if self._stopping else "max sessions")
            with contextlib.suppress(Exception):
                writer.write(pack_frame("err", ["Busy", "the server has no free session", -1]))
                await writer.drain()
            writer.close()
            return
        state = {"busy": False, "writer": writer, "task": asyncio.current_task()}
        self._sessions[sid] = state
        session = None
        why = "closed by client"
        try:
            chosen = await self._authenticate(reader, writer, sid, peer)
            if chosen is None:
                why = "authentication failed"
                return
            from .executor import Session

            device, compress = chosen
            session = Session(self.stacks[id(device)], device, self.limits, self.exports)
            session.compress = compress
            self.stats["accepted"] += 1
            _event("session", session=sid, peer=peer, device=str(device), compress=compress)
            why = await self._serve(reader, writer, session, state, sid)
        except Exception as exc:  # noqa: BLE001 - one session's failure must never reach the server
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self._sessions.pop(sid, None)
            if session is not None:
                session.close()  # frees every tensor of the session, however it ended
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5)
            _event("end", session=sid, reason=why)

    async def _read_frame(self, reader: asyncio.StreamReader, limit: int, timeout: float,
                          compressed: bool = False) -> tuple[str, Any]:
        header = await asyncio.wait_for(reader.readexactly(HEADER.size), timeout)
        (n,) = HEADER.unpack(header)
        if n > limit:
            raise ProtocolError(f"remote: frame of {n} bytes exceeds the limit of {limit}")
        # the body must follow promptly: a peer that trickles bytes holds no session forever
        data = await asyncio.wait_for(reader.readexactly(n), max(timeout, 30.0))
        return unpack_frame(data, limit, compressed)

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sid: int,
                            peer: Any) -> tuple[Any, str | None] | None:
        """Check the hello's token (before anything else); then pick the device and the compression. Returns
        ``(device, compression)``, or None when the peer is dropped."""
        try:
            kind, body = await self._read_frame(reader, MAX_HELLO_FRAME, self.handshake_timeout)
            token = body.get("token") if kind == "hello" and type(body) is dict else None
            given = token.encode() if type(token) is str else b""
            ok = hmac.compare_digest(hashlib.sha256(given).digest(), self._token_digest) and bool(given)
        except (TimeoutError, ProtocolError, asyncio.IncompleteReadError, ConnectionError, OSError, AttributeError,
                ssl.SSLError) as exc:
            self.stats["auth_failed"] += 1
            _event("auth_failed", session=sid, peer=peer, reason=type(exc).__name__)
            return None
        if not ok:
            self.stats["auth_failed"] += 1
            _event("auth_failed", session=sid, peer=peer, reason="bad token")
            with contextlib.suppress(Exception):
                writer.write(pack_frame("err", ["AuthenticationError", "the token is wrong", -1]))
                await writer.drain()
            return None
        device = self._pick_device(body.get("device"))
        if device is None:
            self.stats["refused"] += 1
            served = [str(d) for d in self._all]
            wanted = body.get("device")
            name = wanted[0] if type(wanted) is list and wanted else wanted
            _event("refused", session=sid, peer=peer, reason="device not served", device=str(name)[:80])
            with contextlib.suppress(Exception):
                writer.write(pack_frame("err", ["DeviceNotServed", f"remote: the server does not serve "
                                                f"{name!r:.80}; it serves {served}", -1]))
                await writer.drain()
            return None
        wanted = body.get("compress")
        compress = next((c for c in COMPRESSIONS if type(wanted) is list and c in wanted), None)
        from .executor import offered_kernels

        d = self.stacks[id(device)]
        writer.write(pack_frame("ok", {"device": str(device), "version": VERSION,
                                       "dtypes": sorted(x.name for x in d.supported_dtypes),
                                       "max_frame": self.max_frame, "describe": d.describe(),
                                       "max_graphs": self.limits.max_graphs, "compress": compress,
                                       "kernels": list(offered_kernels(d)), "server": self.instance}))
        await writer.drain()
        return device, compress

    def _pick_device(self, wanted: Any) -> Any:
        """The served device the hello names (a list of names: the address's path and its canonical form; empty:
        the first served device), or None when none of the names is served."""
        names = [wanted] if type(wanted) is str else wanted if type(wanted) is list else []
        names = [n for n in names[:4] if type(n) is str and n]
        if not names:
            return self.device
        return next((self.devices[n] for n in names if n in self.devices), None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: Any,
                     state: dict[str, Any], sid: int) -> str:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            try:
                kind, body = await self._read_frame(reader, self.max_frame, self.idle_timeout,
                                                    session.compress is not None)
            except TimeoutError:
                return "idle timeout"
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
                return "closed by client"
            except ProtocolError as exc:
                self.stats["protocol_errors"] += 1
                _event("protocol_error", session=sid, error=str(exc)[:200])
                writer.write(pack_frame("err", ["ProtocolError", str(exc), -1]))
                await writer.drain()
                return "protocol error"  # the framing may be lost: never guess where the next frame starts
            if kind != "batch":
                self.stats["protocol_errors"] += 1
                writer.write(pack_frame("err", ["ProtocolError", f"remote: unexpected {kind!r:.30} frame", -1]))
                await writer.drain()
                continue
            state["busy"] = True
            try:
                reply = await loop.run_in_executor(self._pool, self._run_batch, session, body, sid)
                writer.write(reply)
                await writer.drain()
            finally:
                state["busy"] = False
        return "server stopping"

    def _run_batch(self, session: Any, body: Any, sid: int) -> bytes:
        """Decode and run one batch (in a worker thread); returns the reply frame."""
        self.stats["batches"] += 1
        try:
            msgs = decode_batch(body, self.limits.max_bytes)
        except ProtocolError as exc:
            self.stats["protocol_errors"] += 1
            _event("protocol_error", session=sid, error=str(exc)[:200])
            return pack_frame("err", ["ProtocolError", str(exc), -1])
        replies = []
        compress = session.compress
        for i, m in enumerate(msgs):
            try:
                r = session.run(m)
            except Exception as exc:  # noqa: BLE001 - reported to this client only
                _event("error", session=sid, message=m.kind, error=f"{type(exc).__name__}: {str(exc)[:200]}")
                return pack_frame("err", [_error_kind(exc), str(exc), i])
            if m.kind in _REPLYING:
                replies.append(r if m.kind != "call" else encode_value(r))
        return pack_frame("ok", replies, compress)


def _error_kind(exc: BaseException) -> str:
    """The name the client re-raises the error as: an ember error's own class, else a generic remote error."""
    if isinstance(exc, EmberError):
        return type(exc).__name__
    if isinstance(exc, MemoryError):
        return "OutOfMemoryError"
    return f"{type(exc).__name__}"


# -- certificates ----------------------------------------------------------------------------------------------
def fingerprint_of(cert_pem: str | os.PathLike[str]) -> str:
    """The SHA-256 fingerprint (hex) of a PEM certificate's DER form: what clients pin."""
    der = ssl.PEM_cert_to_DER_cert(Path(cert_pem).read_text())
    return hashlib.sha256(der).hexdigest()


def write_self_signed(directory: str | os.PathLike[str], host: str = "localhost") -> dict[str, Path]:
    """Write ``cert.pem``, ``key.pem`` (mode 600) and ``token`` (mode 600, 32 random bytes as hex) into
    ``directory``: a self-signed ECDSA P-256 certificate valid for 10 years, made with the ``cryptography``
    package when installed, else with the ``openssl`` binary."""
    import secrets
    import shutil
    import subprocess

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert, key, token = d / "cert.pem", d / "key.pem", d / "token"
    for p in (cert, key):
        if p.exists():
            raise ValueRangeError(f"ember serve --init: {p} exists; remove it first (nothing was changed)")
    try:
        _self_signed_cryptography(cert, key, host)
    except ImportError:
        exe = shutil.which("openssl")
        if exe is None:
            raise DeviceError("ember serve --init needs the cryptography package (pip install cryptography) or "
                              "the openssl binary") from None
        subprocess.run([exe, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "3650", "-subj", f"/CN={host}"],
                       check=True, capture_output=True)
    key.chmod(0o600)
    if not token.exists():
        token.write_text(secrets.token_hex(32) + "\n")
        token.chmod(0o600)
    return {"cert": cert, "key": key, "token": token}


def _self_signed_cryptography(cert: Path, key: Path, host: str) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=3650))
         .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
         .sign(k, hashes.SHA256()))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))


# -- the command -----------------------------------------------------------------------------------------------
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", action="append", default=None,
                   help="a device to serve (a device string; default flex); repeat it to serve several, the address's "
                   "path picks one (ember://host:7433/opencl:0), the first by default")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7433, help="port (default 7433; 0 picks a free one)")
    p.add_argument("--token-file", help="file holding the token clients must present (required)")
    p.add_argument("--cert", help="PEM certificate (see --init)")
    p.add_argument("--key", help="PEM private key of --cert")
    p.add_argument("--insecure", action="store_true", help="plaintext, no TLS (loopback hosts only)")
    p.add_argument("--init", metavar="DIR", help="write a self-signed cert.pem/key.pem and a token into DIR, print "
                   "the certificate's SHA-256 fingerprint, and exit")
    p.add_argument("--max-sessions", type=int, default=16, help="concurrent sessions (default 16)")
    p.add_argument("--idle-timeout", type=float, default=600.0, help="seconds before an idle session is closed")
    p.add_argument("--max-frame-mb", type=int, default=DEFAULT_MAX_FRAME >> 20, help="largest frame, MiB")
    p.add_argument("--max-session-mb", type=int, default=4096, help="tensor memory per session, MiB")
    p.add_argument("--max-tensors", type=int, default=100_000, help="tensors per session")


def register_serve(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to core's ``ember`` subcommands (the ``ember.commands`` entry point)."""
    p = subparsers.add_parser("serve", help="serve devices to Device.remote clients over TLS (ember-remote)",
                              description="Serve ember devices: ember serve --device flex [--device opencl:0] "
                              "--port 7433 --token-file T --cert C --key K (ember serve --init DIR makes C, K and T)")
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``ember serve`` with parsed arguments; returns the exit status."""
    if args.init:
        paths = write_self_signed(args.init, "localhost" if is_loopback(args.host) else args.host)
        print(f"certificate: {paths['cert']}\nkey: {paths['key']}\ntoken: {paths['token']}")
        print(f"fingerprint (sha256): {fingerprint_of(paths['cert'])}")
        return 0
    if not args.token_file:
        print("ember serve: --token-file is required (ember serve --init DIR writes one)", file=sys.stderr)
        return 2
    if args.insecure and (args.cert or args.key):
        print("ember serve: --insecure and --cert/--key exclude each other", file=sys.stderr)
        return 2
    if not args.insecure and not (args.cert and args.key):
        print("ember serve: --cert and --key are required (ember serve --init DIR writes them), or --insecure on "
              "a loopback host", file=sys.stderr)
        return 2
    if args.insecure and not is_loopback(args.host):
        print(f"ember serve: --insecure listens on loopback only, not on {args.host}", file=sys.stderr)
        return 2
    from ember import Device

    from .executor import Limits

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    token = Path(args.token_file).read_text().strip()
    specs = args.device or ["flex"]
    devices = {spec: Device.parse(spec) for spec in specs}
    if len({str(d) for d in devices.values()}) != len(specs):
        print(f"ember serve: a device is given twice in --device {specs}", file=sys.stderr)
        return 2
    server = Server(devices, token, args.host, args.port,
                    None if args.insecure else server_ssl_context(args.cert, args.key),
                    max_sessions=args.max_sessions, idle_timeout=args.idle_timeout,
                    max_frame=args.max_frame_mb << 20,
                    limits=Limits(max_tensors=args.max_tensors, max_bytes=args.max_session_mb << 20))
    asyncio.run(server.serve_forever())
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m ember_remote.server ...`` (the same options as ``ember serve``)."""
    p = argparse.ArgumentParser(prog="python -m ember_remote.server", description=__doc__.splitlines()[0])
    _add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
