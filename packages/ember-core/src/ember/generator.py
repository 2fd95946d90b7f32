"""``ember.Generator``: a seeded random stream of one device, independent of the device's own stream.

A generator holds a *random stream* made by the device's backend (``Backend.new_random_stream(seed)``, an
optional contract method): an object that draws ``rand``/``randn``/``randint`` samples as handles of that backend
and exports its exact state as bytes. :class:`HostRandomStream`, the default every backend inherits, draws on the
host with a numpy bit generator (Philox4x32-10, counter based like PyTorch's CUDA generator) and uploads the
samples with the backend's ``from_numpy``; a backend with its own on-device generator returns its own stream.

Streams are made on the device's *backend* (the bottom of its decorator chain), so one generator serves every
decoration of a device (``flex``, ``flex+autodiff``, ...); core lifts the backend's handles into the tensor's
stack. Draws hold the generator's lock, so threads sharing one generator each get whole, distinct chunks of its
sequence.

>>> import ember
>>> g = ember.Generator().manual_seed(7)
>>> a = ember.rand(3, generator=g).tolist()
>>> a == ember.rand(3, generator=ember.Generator().manual_seed(7)).tolist()
True
"""

from __future__ import annotations

import json
import secrets
import struct
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from . import dtypes as dt
from .device import Device, as_device, check_seed
from .dtypes import DType
from .errors import DeviceError, DTypeError, UnsupportedError, ValueRangeError

__all__ = ["Generator", "HostRandomStream", "RandomStream"]

Handle = Any
Shape = tuple[int, ...]

#: the seed a new generator starts from (PyTorch's default_rng_seed_val, so ``initial_seed()`` reads the same)
DEFAULT_SEED = 67280421310721

_MAGIC = b"EMBERGEN"
_VERSION = 1


@runtime_checkable
class RandomStream(Protocol):
    """What ``Backend.new_random_stream(seed)`` returns: one reproducible random stream whose draws are handles of
    the backend that made it. Core holds the owning generator's lock around every call."""

    def rand(self, shape: Shape, dtype: DType) -> Handle:
        """Uniform samples in [0, 1) of a floating dtype."""

    def randn(self, shape: Shape, dtype: DType) -> Handle:
        """Standard normal samples of a floating dtype."""

    def randint(self, low: int, high: int, shape: Shape, dtype: DType) -> Handle:
        """Integers uniform in [low, high) (both within int64), stored as dtype."""

    def get_state(self) -> bytes:
        """The stream's exact state; ``set_state`` of these bytes repeats every later draw."""

    def set_state(self, state: bytes) -> None:
        """Restore a state ``get_state`` returned (ValueRangeError when the bytes are no such state)."""


def _jsonable(v: Any) -> Any:
    """numpy's bit-generator state dict as JSON (arrays as tagged lists of Python ints)."""
    if isinstance(v, np.ndarray):
        return {"__ndarray__": v.tolist(), "dtype": v.dtype.str}
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, np.generic):
        return v.item()
    return v


def _from_jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        if "__ndarray__" in v:
            return np.array(v["__ndarray__"], dtype=np.dtype(v["dtype"]))
        return {k: _from_jsonable(x) for k, x in v.items()}
    return v


def _numpy_uniform(rng: np.random.Generator, shape: Shape, dtype: np.dtype[Any]) -> np.ndarray:
    """HostRandomStream's default uniform sampler: numpy's own ``Generator.random``."""
    return rng.random(shape, dtype=dtype)


class HostRandomStream:
    """The default random stream: a numpy bit generator on the host, samples uploaded with ``backend.from_numpy``
    (a host backend adopts the arrays, so nothing is copied). Float32/float64 are drawn natively; narrower floats
    are drawn in float32 and rounded; integers are drawn as the target integer dtype (int64 for bool and floats),
    the way the flex backend draws its own stream.

    ``uniform(rng, shape, dtype)``, when given, draws the uniform samples instead of ``rng.random(shape,
    dtype=dtype)`` (dtype float32 or float64), and must return exactly that call's numbers and leave ``rng`` in
    that call's state: a backend that draws its own stream faster (flex chunks large draws on its thread pool)
    passes the same function here, so a generator keeps repeating the device stream's draws."""

    def __init__(self, backend: Any, bit_generator: np.random.BitGenerator,
                 uniform: Callable[[np.random.Generator, Shape, np.dtype[Any]], np.ndarray] | None = None) -> None:
        self.backend = backend
        self.rng = np.random.Generator(bit_generator)
        self._uniform = uniform if uniform is not None else _numpy_uniform

    def rand(self, shape: Shape, dtype: DType) -> Handle:
        if dtype in (dt.float32, dt.float64):
            return self.backend.from_numpy(self._uniform(self.rng, shape, np.dtype(dtype.numpy)))
        return self.backend.from_numpy(self._uniform(self.rng, shape, np.dtype(np.float32)).astype(dtype.numpy))

    def randn(self, shape: Shape, dtype: DType) -> Handle:
        if dtype in (dt.float32, dt.float64):
            return self.backend.from_numpy(self.rng.standard_normal(shape, dtype=dtype.numpy))
        return self.backend.from_numpy(self.rng.standard_normal(shape, dtype=np.float32).astype(dtype.numpy))

    def randint(self, low: int, high: int, shape: Shape, dtype: DType) -> Handle:
        draw = dtype.numpy if dtype.is_integer else np.int64
        return self.backend.from_numpy(self.rng.integers(low, high, size=shape, dtype=draw).astype(dtype.numpy,
                                                                                                 copy=False))

    def get_state(self) -> bytes:
        return json.dumps(_jsonable(self.rng.bit_generator.state), sort_keys=True).encode()

    def set_state(self, state: bytes) -> None:
        try:
            value = _from_jsonable(json.loads(state.decode()))
            if value.get("bit_generator") != type(self.rng.bit_generator).__name__:
                raise ValueError(f"a {value.get('bit_generator')} state, this stream is "
                                 f"{type(self.rng.bit_generator).__name__}")
            self.rng.bit_generator.state = value
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueRangeError(f"Generator.set_state: not a state of this generator's stream ({exc})") from None


class Generator:
    """A random stream of one device that PyTorch code passes as ``generator=`` (``torch.Generator``).

    ``device`` is a :class:`~ember.Device` or device string; None is the default device (PyTorch's default is the
    CPU; ember's factories draw on the default device, so the generator follows them). A new generator starts from
    seed 67280421310721, as PyTorch's; two generators with the same seed on the same backend draw the same values,
    and drawing from one never moves the device's global stream (``ember.manual_seed``) nor any other generator.
    Every decoration of a device shares one backend, so a generator made for ``flex`` also serves ``flex+autodiff``.
    """

    __slots__ = ("_device", "_lock", "_seed", "_stream", "__weakref__")

    def __init__(self, device: Any = None) -> None:
        self._device: Device = as_device(device)
        self._lock = threading.RLock()
        self._seed = DEFAULT_SEED
        self._stream: Any = self._new_stream(DEFAULT_SEED)

    # -- the backend's stream ------------------------------------------------------------------------------------
    def _backend(self) -> Any:
        return self._device.stack.base_backend

    def _new_stream(self, seed: int) -> Any:
        backend = self._backend()
        stream = backend.new_random_stream(seed)
        missing = [m for m in ("rand", "randn", "randint", "get_state", "set_state") if not hasattr(stream, m)]
        if missing:
            raise UnsupportedError(f"Generator: backend {backend.name!r} returned a random stream without "
                                   f"{', '.join(missing)} from new_random_stream (see docs/contract.md)")
        return stream

    # -- PyTorch's API -----------------------------------------------------------------------------------------
    @property
    def device(self) -> Device:
        """The device this generator draws for (as given, decorators included)."""
        return self._device

    def manual_seed(self, seed: int) -> Generator:
        """Restart the stream from ``seed`` (an int in [-2**63, 2**64); negatives wrap modulo 2**64) and return
        the generator, as ``torch.Generator.manual_seed`` does."""
        s = check_seed(seed, "Generator.manual_seed")
        with self._lock:
            self._stream = self._new_stream(s)
            self._seed = s
        return self

    def seed(self) -> int:
        """Reseed from the operating system's entropy and return the new seed (``torch.Generator.seed``)."""
        s = secrets.randbits(63)
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        """The seed the stream last started from (``manual_seed``, ``seed`` or ``set_state``)."""
        return self._seed

    def get_state(self) -> Any:
        """The generator's exact state as a 1-d uint8 tensor on the host device (``torch.Generator.get_state``);
        ``set_state`` of it, on this generator or another of the same backend, repeats every later draw."""
        from .ops.creation import from_numpy

        with self._lock:
            name = self._backend().name.encode()
            payload = self._stream.get_state()
            blob = (_MAGIC + struct.pack("<BQI", _VERSION, self._seed, len(name)) + name + payload)
        return from_numpy(np.frombuffer(blob, dtype=np.uint8).copy())

    def set_state(self, new_state: Any) -> Generator:
        """Restore a state ``get_state`` returned and return the generator. Anything but a 1-d uint8 tensor is a
        DTypeError; bytes that are no state of this backend's generator are a ValueRangeError."""
        from .tensor import Tensor

        if not isinstance(new_state, Tensor) or new_state.dtype is not dt.uint8 or new_state.ndim != 1:
            what = (f"a {new_state.dtype.name} tensor of shape {new_state.shape}" if isinstance(new_state, Tensor)
                    else type(new_state).__name__)
            raise DTypeError(f"Generator.set_state: the state must be a 1-d uint8 tensor (what get_state returns), "
                             f"got {what}")
        blob = np.ascontiguousarray(new_state.numpy()).tobytes()
        head = len(_MAGIC) + struct.calcsize("<BQI")
        if len(blob) < head or not blob.startswith(_MAGIC):
            raise ValueRangeError(f"Generator.set_state: not an ember generator state ({len(blob)} bytes)")
        version, seed, n = struct.unpack_from("<BQI", blob, len(_MAGIC))
        if version != _VERSION:
            raise ValueRangeError(f"Generator.set_state: state format version {version}, expected {_VERSION}")
        name = blob[head:head + n].decode(errors="replace")
        with self._lock:
            mine = self._backend().name
            if name != mine:
                raise ValueRangeError(f"Generator.set_state: the state is of a {name!r} generator, this generator "
                                      f"draws on {mine!r} ({self._device})")
            stream = self._new_stream(seed)
            stream.set_state(blob[head + n:])
            self._stream, self._seed = stream, seed
        return self

    def __repr__(self) -> str:
        return f"ember.Generator(device={str(self._device)!r}, initial_seed={self._seed})"

    def __getstate__(self) -> tuple[Device, bytes]:
        return self._device, bytes(self.get_state().numpy())

    def __setstate__(self, state: tuple[Device, bytes]) -> None:
        from .ops.creation import from_numpy

        device, blob = state
        self.__init__(device)  # type: ignore[misc]
        self.set_state(from_numpy(np.frombuffer(blob, dtype=np.uint8).copy()))


# -- what core's random ops call ----------------------------------------------------------------------------------
def check_generator(op: str, generator: Any, device: Device) -> Generator | None:
    """``generator`` checked for an op drawing on ``device``: None, or an :class:`Generator` of that device's
    backend (any decoration of it). Anything else is an UnsupportedError; another device a DeviceError naming
    both."""
    if generator is None:
        return None
    if not isinstance(generator, Generator):
        kind = type(generator)
        raise UnsupportedError(f"{op}: generator objects are not supported unless they are an ember.Generator, got "
                               f"{kind.__module__}.{kind.__qualname__}")
    if generator._device.base is not device.base:
        raise DeviceError(f"{op}: the generator draws on device {generator._device}, but the op draws on device "
                          f"{device}; make the generator with ember.Generator({str(device.base)!r})")
    return generator


def draw(op: str, generator: Any, device: Device, kind: str, shape: Shape, dtype: DType,
         low: int = 0, high: int = 1) -> Handle:
    """A handle of ``device.stack`` holding samples: ``kind`` is 'rand' (uniform [0, 1)), 'randn' (standard
    normal) or 'randint' ([low, high)). From ``generator`` when given (checked), else the device's own stream."""
    gen = check_generator(op, generator, device)
    if gen is None:
        stack = device.stack
        return stack.randint(low, high, shape, dtype) if kind == "randint" else getattr(stack, kind)(shape, dtype)
    with gen._lock:
        stream = gen._stream
        h = stream.randint(low, high, shape, dtype) if kind == "randint" else getattr(stream, kind)(shape, dtype)
    return device.stack.lift(h)


def host_rng(op: str, generator: Any, device: Device) -> np.random.Generator:
    """A numpy generator seeded by one draw from ``generator`` (else the device's stream), for samplers with no
    device kernel (poisson): reproducible from the same seed, and it advances the stream it came from."""
    h = draw(op, generator, device, "randint", (1,), dt.int64, 0, 2**62)
    seed = int(np.asarray(device.stack.to_numpy(h)).reshape(-1)[0])
    return np.random.Generator(np.random.Philox(seed))
