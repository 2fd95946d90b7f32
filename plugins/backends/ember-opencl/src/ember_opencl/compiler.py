"""Kernel compilation with a warm on-disk cache, and the autotune result store.

Layout under the cache directory (:func:`default_cache_dir`)::

    <cache>/opencl/<device_key>/<sha256 of source and options>.bin   program binaries (checksummed, see below)
    <cache>/opencl/<device_key>/tune.json                            autotune winners, {op: {shape key: config}}

The device key (:func:`device_key`) hashes the platform, device, driver version and vendor id, so a driver update
starts a fresh directory instead of loading binaries the new driver might reject (or, worse, misread).

Our cache is the single source of truth for OpenCL programs: pyopencl's own program cache is bypassed
(``build(cache_dir=False)``). Drivers may still cache underneath us, which is harmless but skews cold-compile timings:

* PoCL keeps compiled kernels in ``$POCL_CACHE_DIR`` (default ``~/.cache/pocl/kcache``); ``POCL_KERNEL_CACHE=0``
  turns that off. Both are read when PoCL loads, so set them before the first OpenCL call of the process.
* NVIDIA keeps ``~/.nv/ComputeCache`` (``CUDA_CACHE_DISABLE=1`` turns it off).

Robustness: a missing, truncated or corrupt cache file, a binary the driver rejects, or an unwritable cache directory
never fails a run -- the program is compiled from source (and the file rewritten when the directory is writable).
Binaries are written with a header holding their length and SHA-256 and checked before they reach the driver,
because some drivers crash on a truncated binary instead of rejecting it (PoCL 3.1 segfaults).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pathlib
import re
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from ember.errors import ValueRangeError
from ember.utils import tune_store
from ember.utils.tune_store import atomic_write, cache_dir

from .errors import AutotuneError, KernelBuildError

logger = logging.getLogger(__name__)

# Bumped when the binary file layout or the key derivation changes; old files are then simply never looked up.
_FORMAT = 1
_MAGIC = b"EMBRCLB\x01"
_HEADER = struct.Struct("<8s32sQ")  # magic, sha256(binary), len(binary)


def default_cache_dir() -> pathlib.Path:
    """The ember cache directory (:func:`ember.utils.tune_store.cache_dir`: ``$EMBER_CACHE_DIR`` if set, else the user
    cache directory for ``ember``); the OpenCL backend keeps its files under ``<dir>/opencl/``."""
    return cache_dir()


def _device_strings(device: cl.Device) -> list[str]:
    # Everything that changes what the compiler emits or whether a binary loads.
    return [
        device.platform.name,
        device.platform.version,
        device.name,
        device.version,
        device.driver_version,
        str(device.vendor_id),
    ]


def device_key(device: cl.Device) -> str:
    """A stable, filesystem-safe id for ``device``: a readable slug of its name plus a hash of platform name and
    version, device name and version, driver version and vendor id (e.g. ``pthread-haswell-amd-epyc-1f0c...``)."""
    digest = hashlib.sha256("\0".join(_device_strings(device)).encode()).hexdigest()[:20]
    slug = re.sub(r"[^a-z0-9]+", "-", device.name.lower()).strip("-")[:40] or "device"
    return f"{slug}-{digest}"


def describe_device(device: cl.Device) -> str:
    """A one-line description of ``device`` for messages: name, platform and driver version."""
    return f"'{device.name.strip()}' ({device.platform.name.strip()}, driver {device.driver_version.strip()})"


def _normalise_options(options: Sequence[str] | str) -> tuple[str, ...]:
    # A bare string would otherwise be iterated character by character.
    if isinstance(options, str):
        return tuple(options.split())
    return tuple(options)


def _program_hash(source: str, options: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    h.update(f"ember-opencl program v{_FORMAT}\0".encode())
    h.update(source.encode())
    for opt in options:
        h.update(b"\0" + opt.encode())
    # pyopencl appends these to every build, so they change the binary.
    h.update(b"\0\0" + os.environ.get("PYOPENCL_BUILD_OPTIONS", "").encode())
    return h.hexdigest()


def _clean_cl_error(err: BaseException) -> str:
    # pyopencl repeats the status once per nesting level ("X failed: Y - X failed: Y - ..."); once is enough.
    return re.sub(r"^(.+?)(?: - \1)+", r"\1", str(err), count=1)


# C scalar types of kernel parameters -> the numpy types pyopencl packs them as
_C_SCALARS: dict[str, Any] = {
    "char": np.int8, "uchar": np.uint8, "unsigned char": np.uint8, "short": np.int16, "ushort": np.uint16,
    "unsigned short": np.uint16, "int": np.int32, "uint": np.uint32, "unsigned int": np.uint32, "long": np.int64,
    "ulong": np.uint64, "unsigned long": np.uint64, "float": np.float32, "double": np.float64,
}
_QUALIFIERS = frozenset({"const", "__const", "private", "__private", "volatile"})
_arg_dtypes: dict[tuple[str, str], list[Any] | None] = {}


def scalar_arg_dtypes(source: str, name: str) -> list[Any] | None:
    """The argument types of kernel ``name`` in ``source`` as pyopencl's ``set_scalar_arg_dtypes`` wants them
    (None for pointers), or None when a parameter's type is not a plain C scalar (e.g. a macro).

    Declaring them lets pyopencl pack scalars with ``struct`` instead of probing each argument on every launch:
    on PoCL that is ~8 us per launch instead of ~65 us with seven arguments.
    """
    key = (source, name)
    if key in _arg_dtypes:
        return _arg_dtypes[key]
    result: list[Any] | None = None
    m = re.search(r"\b(?:__kernel|kernel)\s+(?:__attribute__\s*\(\(.*?\)\)\s*)*void\s+" + re.escape(name) + r"\s*\(",
                  source, re.S)
    if m is not None:
        depth, i = 1, m.end()
        while depth and i < len(source):
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        params, depth, cur = [], 0, []
        for ch in source[m.end():i - 1]:
            if ch == "," and depth == 0:
                params.append("".join(cur))
                cur = []
                continue
            depth += {"(": 1, ")": -1}.get(ch, 0)
            cur.append(ch)
        params.append("".join(cur))
        result = []
        for param in (p.strip() for p in params):
            if not param:
                continue
            if "*" in param:
                result.append(None)
                continue
            words = [w for w in param.split() if w not in _QUALIFIERS]
            dtype = _C_SCALARS.get(" ".join(words[:-1]))
            if dtype is None:
                result = None
                break
            result.append(dtype)
    _arg_dtypes[key] = result
    return result


@contextlib.contextmanager
def _quiet_compiler() -> Iterator[None]:
    """Route pyopencl's CompilerWarning (a build log with warnings only) to the debug log, not the user's screen."""
    import pyopencl as cl

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cl.CompilerWarning)
        yield
    for w in caught:
        if issubclass(w.category, cl.CompilerWarning):
            logger.debug("ember-opencl: compiler output: %s", w.message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class ProgramCache:
    """Builds OpenCL programs for one (context, device), memoised in memory and persisted as binaries on disk.

    ``stats`` counts ``memory_hits`` (program already built in this instance), ``disk_hits`` (loaded from a cached
    binary), ``compiled`` (built from source), ``compile_seconds`` (time spent building from source) and
    ``disk_rejected`` (cache files that were corrupt or refused by the driver and replaced).

    Not thread-safe for the returned kernels (their arguments are per-object state); building is serialised.
    """

    def __init__(self, context: cl.Context, device: cl.Device, cache_dir: pathlib.Path | None = None) -> None:
        self.context = context
        self.device = device
        self.device_key = device_key(device)
        root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.dir = root / "opencl" / self.device_key
        self._persist = True  # cleared when the directory turns out unwritable
        self._programs: dict[tuple[str, tuple[str, ...]], cl.Program] = {}
        self._local = threading.local()  # per-thread kernel objects (see kernel())
        self._lock = threading.RLock()
        self.stats: dict[str, float] = {
            "memory_hits": 0,
            "disk_hits": 0,
            "compiled": 0,
            "compile_seconds": 0.0,
            "disk_rejected": 0,
        }

    def kernel(self, source: str, name: str, options: Sequence[str] = ()) -> cl.Kernel:
        """The kernel ``name`` of the program built from ``source`` with ``options``.

        The same :class:`pyopencl.Kernel` object is returned on every call with the same arguments in one thread, so
        callers can set its arguments and enqueue it without creating kernels per call; each thread gets its own
        object, because a kernel's arguments live in the object and two threads launching it would race.
        """
        opts = options if type(options) is tuple else _normalise_options(options)
        kernels = getattr(self._local, "kernels", None)
        if kernels is None:
            kernels = self._local.kernels = {}
        # Fast path: keyed by the source string itself (its hash is cached by Python), no SHA-256 per call.
        knl = kernels.get((source, opts, name))
        if knl is not None:
            self.stats["memory_hits"] += 1
            return knl
        with self._lock:
            prg = self.program(source, opts)
        try:
            knl = cl.Kernel(prg, name)
        except cl.Error as err:
            names = prg.get_info(cl.program_info.KERNEL_NAMES)
            raise ValueRangeError(
                f"OpenCL program has no kernel {name!r} (it defines: {names or 'none'}) "
                f"on device {describe_device(self.device)}"
            ) from err
        dtypes = scalar_arg_dtypes(source, name)
        if dtypes is not None:
            knl.set_scalar_arg_dtypes(dtypes)
        kernels[(source, opts, name)] = knl
        return knl

    def program(self, source: str, options: Sequence[str] = ()) -> cl.Program:
        """The program built from ``source`` with ``options``: from memory, else from a cached binary, else compiled
        (and the binary saved). Raises :class:`~ember_opencl.errors.KernelBuildError` if the compiler rejects it."""
        opts = _normalise_options(options)
        prg = self._programs.get((source, opts))
        if prg is not None:
            self.stats["memory_hits"] += 1
            return prg
        with self._lock:
            prg = self._programs.get((source, opts))
            if prg is not None:
                self.stats["memory_hits"] += 1
                return prg
            digest = _program_hash(source, opts)
            path = self.dir / f"{digest}.bin"
            prg = self._load(path, opts)
            if prg is not None:
                self.stats["disk_hits"] += 1
            else:
                prg = self._compile(source, opts, digest)
                self._save(path, prg)
            self._programs[(source, opts)] = prg
            return prg

    def _load(self, path: pathlib.Path, opts: tuple[str, ...]) -> cl.Program | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            logger.debug("ember-opencl: cannot read cached binary %s: %s", path, err)
            return None
        binary = self._unpack(data)
        if binary is None:
            logger.debug("ember-opencl: cached binary %s is truncated or corrupt; rebuilding", path)
            self.stats["disk_rejected"] += 1
            return None
        try:
            with _quiet_compiler():
                return cl.Program(self.context, [self.device], [binary]).build(options=list(opts),
                                                                               devices=[self.device])
        except cl.Error as err:
            logger.debug("ember-opencl: driver rejected cached binary %s (%s); rebuilding", path, _clean_cl_error(err))
            self.stats["disk_rejected"] += 1
            return None

    @staticmethod
    def _unpack(data: bytes) -> bytes | None:
        if len(data) < _HEADER.size:
            return None
        magic, digest, length = _HEADER.unpack_from(data)
        binary = data[_HEADER.size :]
        if magic != _MAGIC or length != len(binary) or length == 0 or hashlib.sha256(binary).digest() != digest:
            return None
        return binary

    def _compile(self, source: str, opts: tuple[str, ...], digest: str) -> cl.Program:
        t0 = time.perf_counter()
        try:
            # cache_dir=False: bypass pyopencl's program cache, ours is the only one.
            with _quiet_compiler():
                prg = cl.Program(self.context, source).build(options=list(opts), devices=[self.device],
                                                             cache_dir=False)
        except cl.Error as err:
            raise KernelBuildError.from_build_log(
                source,
                _clean_cl_error(err),
                device=describe_device(self.device),
                options=opts,
                program=digest[:12],
            ) from None  # the pyopencl traceback repeats the log and adds nothing
        dt = time.perf_counter() - t0
        self.stats["compiled"] += 1
        self.stats["compile_seconds"] += dt
        logger.debug("ember-opencl: compiled program %s in %.3f s", digest[:12], dt)
        return prg

    def _save(self, path: pathlib.Path, prg: cl.Program) -> None:
        if not self._persist:
            return
        try:
            devices = prg.get_info(cl.program_info.DEVICES)
            binary = prg.get_info(cl.program_info.BINARIES)[devices.index(self.device)]
        except (cl.Error, ValueError, IndexError) as err:
            logger.debug("ember-opencl: driver gives no program binary (%s); not caching", err)
            return
        if not binary:
            return
        try:
            atomic_write(path, _HEADER.pack(_MAGIC, hashlib.sha256(binary).digest(), len(binary)) + bytes(binary))
        except OSError as err:
            self._persist = False
            logger.debug("ember-opencl: cache dir %s is not writable (%s); binaries stay in memory", self.dir, err)


class TuneStore(tune_store.TuneStore):
    """Autotune winners for one device, persisted as JSON in ``<cache>/opencl/<device_key>/tune.json`` (the store and
    format of :mod:`ember.utils.tune_store`); :meth:`tune` raises :class:`~ember_opencl.errors.AutotuneError` when
    every candidate fails."""

    def __init__(self, cache_dir: pathlib.Path | None, device_key: str) -> None:
        root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.device_key = device_key
        super().__init__(root / "opencl" / device_key / "tune.json", owner="ember-opencl", device=device_key,
                         error=AutotuneError)


__all__ = ["ProgramCache", "TuneStore", "default_cache_dir", "describe_device", "device_key"]
