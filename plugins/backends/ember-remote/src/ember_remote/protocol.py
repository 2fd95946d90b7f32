"""The ember-remote wire protocol: length-prefixed msgpack frames, validated before use.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack: ``[VERSION, kind, body]``. Tensor
data travels as msgpack ``bin`` (raw bytes, no base64). Records and graph keys (:func:`ember.ir.relative_form`)
are nested tuples of plain values; the few ember objects inside them (``Ref``, ``Placeholder``, ``Scalar``,
slices, dtypes, extension arguments) are encoded as one-entry maps ``{tag: payload}`` -- maps appear nowhere else,
so decoding is unambiguous and walks a bounded depth. No pickle: a frame can only ever decode to plain data.

Client -> server kinds: ``hello`` (must be first: the token, the device the client wants and the compressions it
reads), ``batch`` (a list of messages run in order, one reply). Messages inside a batch: ``register``, ``replay``,
``upload``, ``download``, ``release``, ``call``, ``seed``, ``sync``, ``stats``, ``forget`` (graphs), ``strides``
(of a stored tensor: the server's layout, which core checks before ``view`` and in-place writes), ``export`` and
``import`` (a tensor handed from one session to another under a random 16-byte ticket: ``.to()`` between two
devices of one server moves the data on the server), and for
``ember.Generator`` streams kept on the server ``stream``, ``draw``, ``stream_state``, ``stream_set``. Server ->
client: ``ok`` (the replies of the batch's reply-bearing messages) or ``err`` (``[error type, message, index of the
failing message]``).

Compression (negotiated in the greeting, never before authentication): a frame whose msgpack is at least
:data:`COMPRESS_MIN` bytes and that zlib shrinks by at least 1/8 travels as ``[VERSION, "z", zlib bytes]``, the
compressed ``[VERSION, kind, body]``; the receiver inflates it to at most its frame limit (no decompression bombs).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from math import prod
from typing import Any

import msgpack
import numpy as np

from ember import dtypes as dt
from ember.capture import ExtensionArgs
from ember.dtypes import DType
from ember.errors import DeviceError
from ember.ir import Bindings, Placeholder, Ref, Scalar

#: bumped on every incompatible change of the frames below; both sides refuse another version
#: (2: the hello names a device and compressions, the ``strides`` message, ``z`` frames, optional kernels)
VERSION = 2
HEADER = struct.Struct(">I")
#: frames larger than this are refused before reading them (the client splits its uploads below it)
DEFAULT_MAX_FRAME = 256 << 20
#: a hello frame is tiny: anything bigger from an unauthenticated peer is dropped unread
MAX_HELLO_FRAME = 4096
#: nesting depth of decoded values (graph keys are about 6 deep)
MAX_DEPTH = 32
#: most dims of one tensor
MAX_RANK = 64
#: messages in one batch
MAX_BATCH = 1 << 16
#: the compressions this version reads (``zlib``: the standard library's, so no extra dependency)
COMPRESSIONS = ("zlib",)
#: frames smaller than this are sent as they are (compressing a few kB buys nothing)
COMPRESS_MIN = 16 << 10
#: the length of an export ticket (random: only the exporting client knows it)
TICKET_BYTES = 16

_DTYPES: dict[str, DType] = {d.name: d for d in dt.ALL_DTYPES + dt.COMPLEX_DTYPES}


class ProtocolError(DeviceError):
    """A frame that is malformed, too large, of another protocol version, or not allowed in this state."""


class RemoteError(DeviceError):
    """Remote execution failed: the connection dropped or was refused, the server lost the session's tensors, or
    the server reported an error (``kind`` is the server-side exception type's name)."""

    def __init__(self, message: str, kind: str = "RemoteError") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Slice:
    """A slice inside recorded arguments (slices are unhashable before Python 3.12; graph keys are dict keys)."""

    start: Any
    stop: Any
    step: Any

    def to_slice(self) -> slice:
        return slice(self.start, self.stop, self.step)


@dataclass(frozen=True)
class Out:
    """A tensor in a call's reply: its new (negative) id on the server, its shape and dtype."""

    id: int
    shape: tuple[int, ...]
    dtype: DType


# -- values ----------------------------------------------------------------------------------------------------
def _enc(v: Any) -> Any:
    t = type(v)
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    if t is Ref:
        return {"r": v.k}
    if t is Placeholder:
        return {"p": [v.kind, v.k]}
    if t is Scalar:
        return {"s": _enc(v.value)}
    if t is slice or t is Slice:
        return {"sl": [_enc(v.start), _enc(v.stop), _enc(v.step)]}
    if isinstance(v, DType):
        return {"d": v.name}
    if t is ExtensionArgs:
        return {"x": [v.name, _enc(v.args), _enc(v.kwargs)]}
    if t is Out:
        return {"o": [v.id, list(v.shape), v.dtype.name]}
    if v is Ellipsis:
        return {"e": 0}
    if t is complex:
        return {"c": [v.real, v.imag]}
    if isinstance(v, (tuple, list)):
        return [_enc(x) for x in v]
    if isinstance(v, (np.integer, np.floating, np.bool_, np.complexfloating)):
        # a numpy scalar keeps its type: numpy promotes np.float32(2) and 2.0 differently
        return {"n": [dt.from_numpy_dtype(v.dtype).name, _enc(v.item())]}
    raise ProtocolError(f"remote: cannot send a value of type {t.__name__} ({v!r:.60})")


def encode_value(v: Any) -> Any:
    """``v`` (nested tuples of scalars, strings, None and ember IR objects) as msgpack-ready data."""
    return _enc(v)


def _dec(v: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"remote: value nested deeper than {MAX_DEPTH}")
    t = type(v)
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    if t is list:
        return tuple(_dec(x, depth + 1) for x in v)
    if t is dict and len(v) == 1:
        (tag, p), = v.items()
        if tag == "r":
            return Ref(_int(p, "ref"))
        if tag == "p" and type(p) is list and len(p) == 2 and type(p[0]) is str:
            return Placeholder(p[0], _int(p[1], "placeholder"))
        if tag == "s":
            s = _dec(p, depth + 1)
            if not isinstance(s, (bool, int, float, complex, np.number, np.bool_)):
                raise ProtocolError("remote: a scalar operand must be a number")
            return Scalar(s)
        if tag == "sl" and type(p) is list and len(p) == 3:
            parts = [_dec(x, depth + 1) for x in p]
            if any(x is not None and type(x) is not int for x in parts):
                raise ProtocolError("remote: slice bounds must be ints or None")
            return Slice(*parts)
        if tag == "d":
            return dtype_named(p)
        if tag == "x" and type(p) is list and len(p) == 3 and type(p[0]) is str:
            return ExtensionArgs(p[0], _dec(p[1], depth + 1), _dec(p[2], depth + 1))
        if tag == "o" and type(p) is list and len(p) == 3:
            return Out(_int(p[0], "tensor id"), check_shape(p[1], "result"), dtype_named(p[2]))
        if tag == "n" and type(p) is list and len(p) == 2 and type(p[1]) in (bool, int, float, dict):
            value = _dec(p[1], depth + 1)
            if type(value) not in (bool, int, float, complex):
                raise ProtocolError("remote: a numpy scalar must hold a number")
            try:
                return np.dtype(dtype_named(p[0]).numpy).type(value)
            except (OverflowError, ValueError, TypeError):
                raise ProtocolError(f"remote: {value!r:.30} does not fit {p[0]!r:.20}") from None
        if tag == "e":
            return Ellipsis
        if tag == "c" and type(p) is list and len(p) == 2 and all(type(x) is float for x in p):
            return complex(p[0], p[1])
    raise ProtocolError(f"remote: unexpected value of type {t.__name__} in a frame")


def decode_value(v: Any) -> Any:
    """The inverse of :func:`encode_value`, validating types and depth."""
    return _dec(v, 0)


def _int(v: Any, what: str, lo: int = -(1 << 62), hi: int = 1 << 62) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise ProtocolError(f"remote: {what} must be an int in [{lo}, {hi}], got {v!r:.40}")
    return v


def _ints(v: Any, what: str, limit: int = 1 << 20, lo: int = -(1 << 62)) -> tuple[int, ...]:
    if type(v) is not list or len(v) > limit:
        raise ProtocolError(f"remote: {what} must be a list of at most {limit} ints")
    return tuple(_int(x, what, lo) for x in v)


def dtype_named(name: Any) -> DType:
    """The ember dtype called ``name``; a :class:`ProtocolError` for anything else."""
    d = _DTYPES.get(name) if type(name) is str else None
    if d is None:
        raise ProtocolError(f"remote: unknown dtype {name!r:.40}")
    return d


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    """A tensor shape from a frame: at most MAX_RANK non-negative dims."""
    dims = _ints(shape, f"{what} shape", MAX_RANK, lo=0)
    if prod(dims) > 1 << 48:
        raise ProtocolError(f"remote: {what} shape {dims} is too large")
    return dims


# -- arrays ----------------------------------------------------------------------------------------------------
def encode_array(a: np.ndarray) -> list[Any]:
    """``[dtype name, shape, raw bytes]`` (C order)."""
    a = a if a.flags.c_contiguous else np.array(a, order="C")  # not ascontiguousarray: 0-d stays 0-d
    data = memoryview(a.reshape(-1).view(np.uint8)) if a.size else b""  # raw bytes of any dtype, no copy
    return [dt.from_numpy_dtype(a.dtype).name, list(a.shape), data]


def decode_array(v: Any, max_bytes: int) -> np.ndarray:
    """An array from :func:`encode_array`'s form, checking dtype, shape product and byte count (a copy that owns
    its memory: frames are freed after decoding)."""
    if type(v) is not list or len(v) != 3 or type(v[2]) is not bytes:
        raise ProtocolError("remote: an array must be [dtype, shape, bytes]")
    d = dtype_named(v[0])
    shape = check_shape(v[1], "array")
    np_dtype = np.dtype(d.numpy)
    n = prod(shape) * np_dtype.itemsize
    if n > max_bytes:
        raise ProtocolError(f"remote: an array of {n} bytes exceeds the limit of {max_bytes}")
    if len(v[2]) != n:
        raise ProtocolError(f"remote: array {d.name}{list(shape)} needs {n} bytes, the frame holds {len(v[2])}")
    return np.frombuffer(v[2], dtype=np_dtype).reshape(shape).copy()


# -- frames ----------------------------------------------------------------------------------------------------
def pack_frame(kind: str, body: Any, compress: str | None = None) -> bytes:
    """One frame: the length prefix and ``[VERSION, kind, body]`` as msgpack; with ``compress="zlib"`` (what the
    greeting negotiated) a large frame travels zlib-compressed when that saves at least 1/8 of it."""
    data = msgpack.packb([VERSION, kind, body], use_bin_type=True)
    if compress is not None and len(data) >= COMPRESS_MIN:
        if compress != "zlib":
            raise ProtocolError(f"remote: unknown compression {compress!r}")
        z = zlib.compress(data, 1)  # level 1: most of the gain on structured data, a fraction of the time
        if len(z) <= len(data) - (len(data) >> 3):
            data = msgpack.packb([VERSION, "z", z], use_bin_type=True)
    return HEADER.pack(len(data)) + data


def _inflate(z: Any, max_frame: int) -> bytes:
    """A ``z`` frame's payload, inflated to at most ``max_frame`` bytes (more is refused unread)."""
    if type(z) is not bytes:
        raise ProtocolError("remote: a compressed frame must hold bytes")
    d = zlib.decompressobj()
    try:
        out = d.decompress(z, max_frame + 1)
    except zlib.error as exc:
        raise ProtocolError(f"remote: undecodable compressed frame ({exc})") from None
    if len(out) > max_frame or d.unconsumed_tail:
        raise ProtocolError(f"remote: a compressed frame inflates past the limit of {max_frame} bytes")
    if not d.eof or d.unused_data:
        raise ProtocolError("remote: a compressed frame is truncated or has trailing data")
    return out


def unpack_frame(data: bytes, max_frame: int = DEFAULT_MAX_FRAME, compressed: bool = False) -> tuple[str, Any]:
    """``(kind, body)`` of a frame's payload (without its length prefix); a :class:`ProtocolError` for anything
    malformed. msgpack's own limits bound container and string sizes to the frame's. ``compressed``: whether a
    ``z`` frame is allowed (the greeting negotiated compression); its content is inflated and decoded the same way
    (it cannot nest another ``z`` frame)."""
    kind, body = _unpack(data, max_frame)
    if kind == "z":
        if not compressed:
            raise ProtocolError("remote: a compressed frame, but no compression was negotiated")
        kind, body = _unpack(_inflate(body, max_frame), max_frame)
        if kind == "z":
            raise ProtocolError("remote: a compressed frame inside a compressed frame")
    return kind, body


def _unpack(data: bytes, max_frame: int) -> tuple[str, Any]:
    if len(data) > max_frame:
        raise ProtocolError(f"remote: frame of {len(data)} bytes exceeds {max_frame}")
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True,
                              max_str_len=min(max_frame, 1 << 20), max_bin_len=max_frame,
                              max_array_len=min(max_frame, 1 << 24), max_map_len=16, max_ext_len=0)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            UnicodeDecodeError) as exc:
        raise ProtocolError(f"remote: undecodable frame ({type(exc).__name__}: {str(exc)[:80]})") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises a few other exception types on garbage
        raise ProtocolError(f"remote: undecodable frame ({type(exc).__name__})") from None
    if type(obj) is not list or len(obj) != 3 or type(obj[1]) is not str:
        raise ProtocolError("remote: a frame must be [version, kind, body]")
    if obj[0] != VERSION:
        raise ProtocolError(f"remote: protocol version {obj[0]!r:.20} is not {VERSION} (upgrade client or server)")
    return obj[1], obj[2]


# -- messages --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Msg:
    """One decoded, validated message of a batch."""

    kind: str
    args: tuple[Any, ...]


def _bindings(v: Any) -> Bindings:
    if type(v) is not list or len(v) != 2:
        raise ProtocolError("remote: bindings must be [dims, scalars]")
    dims = _ints(v[0], "bindings dims", lo=0)
    scalars = decode_value(v[1])
    if type(scalars) is not tuple or any(not isinstance(s, (bool, int, float, complex, np.number, np.bool_))
                                         for s in scalars):
        raise ProtocolError("remote: bound scalars must be numbers")
    return Bindings(dims, scalars)


def decode_message(m: Any, max_bytes: int) -> Msg:
    """Validate one message of a batch (types, ids, dtypes, shape products) and return it decoded."""
    if type(m) is not list or not m or type(m[0]) is not str:
        raise ProtocolError("remote: a message must be [kind, ...]")
    kind, rest = m[0], m[1:]
    n = len(rest)
    if kind == "register" and n == 2:
        key = decode_value(rest[1])
        if type(key) is not tuple or len(key) != 3:
            raise ProtocolError("remote: a graph key must be (externals, body, outputs)")
        return Msg(kind, (_int(rest[0], "graph id", 1), key))
    if kind == "replay" and n == 5:
        return Msg(kind, (_int(rest[0], "graph id", 1), _ints(rest[1], "input ids"),
                          _ints(rest[2], "output ids", lo=1), _bindings(rest[3]), _ints(rest[4], "release ids")))
    if kind == "upload" and n == 2:
        return Msg(kind, (_int(rest[0], "tensor id", 1), decode_array(rest[1], max_bytes)))
    if kind in ("download", "strides") and n == 1:
        return Msg(kind, (_int(rest[0], "tensor id"),))
    if kind in ("export", "import") and n == 2 and type(rest[1]) is bytes and len(rest[1]) == TICKET_BYTES:
        return Msg(kind, (_int(rest[0], "tensor id", 1 if kind == "import" else -(1 << 62)), rest[1]))
    if kind == "forget" and n == 1:
        return Msg(kind, (_ints(rest[0], "graph ids", lo=1),))
    if kind == "release" and n == 1:
        return Msg(kind, (_ints(rest[0], "release ids"),))
    if kind == "call" and n == 3 and type(rest[0]) is str:
        args = decode_value(rest[2])
        if type(args) is not tuple:
            raise ProtocolError("remote: call arguments must be a list")
        return Msg(kind, (rest[0], _ints(rest[1], "input ids"), args))
    if kind == "seed" and n == 1:
        return Msg(kind, (_int(rest[0], "seed", 0, (1 << 64) - 1),))
    if kind == "stream" and n == 2:
        return Msg(kind, (_int(rest[0], "stream id", 1), _int(rest[1], "seed", 0, (1 << 64) - 1)))
    if kind == "draw" and n == 4 and rest[2] in ("rand", "randn", "randint"):
        args = decode_value(rest[3])
        if type(args) is not tuple or not 2 <= len(args) <= 4 or not isinstance(args[-1], DType):
            raise ProtocolError("remote: draw arguments must be ([low, high,] shape, dtype)")
        check_shape(list(args[-2]) if type(args[-2]) is tuple else None, "draw")
        return Msg(kind, (_int(rest[0], "stream id", 1), _int(rest[1], "tensor id", 1), rest[2], args))
    if kind == "stream_state" and n == 1:
        return Msg(kind, (_int(rest[0], "stream id", 1),))
    if kind == "stream_set" and n == 2 and type(rest[1]) is bytes and len(rest[1]) <= 1 << 16:
        return Msg(kind, (_int(rest[0], "stream id", 1), rest[1]))
    if kind in ("sync", "stats") and n == 0:
        return Msg(kind, ())
    raise ProtocolError(f"remote: unknown message {kind!r:.30} with {n} field(s)")


def decode_batch(body: Any, max_bytes: int) -> list[Msg]:
    """A batch frame's messages, each validated."""
    if type(body) is not list or len(body) > MAX_BATCH:
        raise ProtocolError(f"remote: a batch must be a list of at most {MAX_BATCH} messages")
    return [decode_message(m, max_bytes) for m in body]


