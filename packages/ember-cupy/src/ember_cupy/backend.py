"""CuPyBackend: the ember backend contract on CuPy arrays, shared by the CUDA and ROCm plugins.

Handles are ``cupy.ndarray`` views. Ops go where they are done well:

* elementwise ops (unary, binary, where) run the shared map kernels of :mod:`ember_kernels.elementwise` compiled
  from the CUDA/HIP dialect with ``cupy.RawModule`` -- the expressions ember-opencl runs on every CI run, so
  PyTorch's semantics (floor division, remainder sign, NaN-propagating maximum, shifts) are the same text;
* matmul is ``cupy.matmul`` (cuBLAS for floats; TF32 off unless ``CUPY_TF32=1`` is set, so float32 matches the
  kit), integer products accumulate in int64 and wrap back to their dtype, as numpy's do;
* pooling, interpolate, pad, softmax/log_softmax/logsumexp, convolution (im2col + cuBLAS, col2im gradients; cuDNN
  where CuPy still ships it) and scatter-add/multiply are the shared generators' kernels ember-opencl runs, launched
  by :mod:`ember_cupy.kernels`;
* reductions, scans, sorting, concatenation, gather and indexing are CuPy's (CUB-backed where CuPy uses CUB);
* random numbers are the shared Philox kernels with OpenCL's counter layout: the same seed gives the same stream
  as ``Device.opencl(i)``;
* memory: CuPy's pool, reported with ember-opencl's field names; ``memory_dry_run()`` records a step's allocations
  (CuPy's memory hooks) and sizes the pool from them; an allocation failure is ember's
  :class:`~ember.errors.OutOfMemoryError` naming the request and the pool state; host transfers of 64 KiB and
  more stage through pinned memory (uploads asynchronous on the device's stream); one stream per device.

bfloat16 is not supported (CuPy has no bfloat16 dtype). Everything not overridden here comes from the contract's
default compositions. Status: compiled and introspected in CI, not yet executed on a GPU (docs/plugins/cuda.md).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ember import dtypes as dt
from ember.backend import Backend
from ember.dtypes import DType
from ember.errors import DeviceError, DTypeError, OutOfMemoryError, ShapeError, ValueRangeError
from ember_kernels import CUDA, HIP
from ember_kernels import elementwise as ew
from ember_kernels.ctypes_ import CType, ctype
from ember_kernels.random import _source as philox_source

MASK64 = (1 << 64) - 1
#: allocation requests from this size on are compared with the device's memory before CuPy sees them
_HUGE = 1 << 30
#: host arrays of at least this many bytes move through pinned (page-locked) staging buffers
PINNED_MIN_BYTES = 64 << 10
#: threads per block of the grid-stride kernels; blocks are capped so a launch never exceeds the grid limit
_BLOCK = 256
_MAX_BLOCKS = 65535


def _cupy() -> Any:
    import cupy

    return cupy


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


class CuPyBackend(Backend):
    """The contract on one CuPy device (``platform`` "cuda" or "rocm", ``index`` the device ordinal)."""

    contract_version = 1

    def __init__(self, platform: str, index: int = 0) -> None:
        super().__init__(index)
        cp = _cupy()
        self.name = platform
        self.platform = platform
        self.dialect = HIP if platform == "rocm" else CUDA
        self.cp = cp
        self.device = cp.cuda.Device(index)
        with self.device:
            self.stream = cp.cuda.Stream(non_blocking=True)  # one stream per device: sync() waits on it
        self.pool = cp.get_default_memory_pool()
        self.supported_dtypes = frozenset(d for d in dt.ALL_DTYPES if d is not dt.bfloat16)
        self._modules: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._peak = 0
        self._peak_reserved = 0
        self._key = 0
        self._offset = 0
        self._staged: list[tuple[Any, Any]] = []  # (event, pinned buffer) of uploads still in flight
        self._dry_run_active = False

    # -- device management ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _on(self) -> Iterator[None]:
        """Run CuPy calls on this device and stream; CuPy's OOM becomes ember's typed error."""
        cp = self.cp
        try:
            with self.device, self.stream:
                yield
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise OutOfMemoryError(f"{self.describe()}: out of device memory ({exc}); pool in use "
                                   f"{_human(self.pool.used_bytes())}, reserved {_human(self.pool.total_bytes())}") \
                from exc
        finally:
            self._peak = max(self._peak, int(self.pool.used_bytes()))
            self._peak_reserved = max(self._peak_reserved, int(self.pool.total_bytes()))

    def describe(self) -> str:
        props = self.cp.cuda.runtime.getDeviceProperties(self.index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return f"{self.platform}:{self.index} ({name})"

    def sync(self) -> None:
        self.stream.synchronize()

    def memory_report(self) -> dict[str, Any]:
        """ember-opencl's fields where CuPy's pool knows them: ``in_use`` (bytes of live blocks, rounded to CuPy's
        512-byte bins), ``held`` (the same), ``reserved`` (bytes the pool holds from the driver), ``peak`` and
        ``peak_reserved`` (the highest seen at an op boundary), ``cached`` (reserved - in_use), ``cached_blocks``,
        ``limit`` (the pool's limit, 0 for none), ``capacity`` and ``free`` (the device's), ``allocator``,
        ``device``, ``kernels`` (programs compiled by this backend), and the pinned staging state."""
        pool = self.pool
        in_use, reserved = int(pool.used_bytes()), int(pool.total_bytes())
        self._peak = max(self._peak, in_use)
        self._peak_reserved = max(self._peak_reserved, reserved)
        free, total = self.cp.cuda.runtime.memGetInfo()
        return {"device": self.describe(), "allocator": "cupy.MemoryPool", "in_use": in_use, "held": in_use,
                "reserved": reserved, "peak": self._peak, "peak_reserved": self._peak_reserved,
                "cached": reserved - in_use, "cached_blocks": int(pool.n_free_blocks()),
                "limit": int(pool.get_limit()), "capacity": int(total), "free": int(free),
                "kernels": {"programs": len(self._modules)},
                "pinned_free_blocks": int(self.cp.get_default_pinned_memory_pool().n_free_blocks()),
                "staged_uploads": len(self._staged)}

    def memory_dry_run(self) -> contextlib.AbstractContextManager[dict[str, Any]]:
        """Record the allocations of one iteration (a training step) run inside the context, then size CuPy's pool
        for repeating it. See :func:`ember_cupy.memory.dry_run` for the statistics (ember-opencl's names)."""
        from . import memory

        return memory.dry_run(self)

    def may_share_memory(self, a: Any, b: Any) -> bool:
        return bool(self.cp.may_share_memory(a, b)) if a.size and b.size else False  # bounds overlap

    def fusion_compile(self, kernel: Any) -> Any:
        """One shared-generator CUDA/HIP kernel per elementwise fused block (see :mod:`ember_cupy.fusion`); None
        for fused reductions and what the generator does not handle."""
        from . import fusion

        return fusion.fusion_compile(self, kernel)

    # -- kernels -------------------------------------------------------------------------------------------------
    def compile_kernel(self, source: str, name: str) -> Any:
        """The ``cupy.RawKernel`` ``name`` of ``source`` (shared vocabulary, see :mod:`ember_kernels.dialect`),
        compiled once per program through CuPy's on-disk kernel cache (keyed by source, options and arch)."""
        module = self._modules.get(source)
        if module is None:
            with self._lock:
                module = self._modules.get(source)
                if module is None:
                    module = self.cp.RawModule(code=self.dialect.program(source),
                                               options=("--std=c++17", *self.dialect.options(source)))
                    self._modules[source] = module
        return module.get_function(name)

    def _launch_groups(self, source: str, name: str, groups: int, block: int, args: Sequence[Any],
                       shared_mem: int = 0) -> None:
        """``groups`` blocks of ``block`` threads (a work-group per row kernels), ``shared_mem`` bytes of dynamic
        shared memory for the program's first ``__local`` parameter."""
        with self._on():
            self.compile_kernel(source, name)((groups,), (block,), tuple(args), shared_mem=shared_mem)

    @functools.cached_property
    def _multiprocessors(self) -> int:
        return int(self.cp.cuda.runtime.getDeviceProperties(self.index)["multiProcessorCount"])

    def multiprocessors(self) -> int:
        """Streaming multiprocessors (CUDA) or compute units (ROCm) of this device."""
        return self._multiprocessors

    @functools.cached_property
    def _cudnn(self) -> Any:
        from .kernels import cudnn_module

        return cudnn_module() if self.platform == "cuda" else None

    def cudnn(self) -> Any:
        """CuPy's cuDNN wrapper when usable here (CuPy <= 13 with libcudnn; never on ROCm), else None."""
        return self._cudnn

    def _launch(self, source: str, name: str, n: int, args: Sequence[Any], shared_mem: int = 0) -> None:
        """A grid-stride kernel over n items on this device's stream (RawKernel launches on the current stream,
        which _on() sets); ``shared_mem``: bytes of dynamic shared memory (``__local`` parameters)."""
        blocks = max(1, min(-(-n // _BLOCK), _MAX_BLOCKS))
        with self._on():
            self.compile_kernel(source, name)((blocks,), (_BLOCK,), tuple(args), shared_mem=shared_mem)

    # -- data ----------------------------------------------------------------------------------------------------
    def empty(self, shape: Sequence[int], dtype: DType) -> Any:
        """A new contiguous uninitialised array (for extension kernels that write every element)."""
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ShapeError(f"{type(self).__name__}.empty: negative dimension in shape {shape}")
        self._check_dtype(dtype, "empty")
        self._check_request(shape, dtype, "empty")
        with self._on():
            return self.cp.empty(shape, dtype=dtype.numpy)

    def _check_request(self, shape: Sequence[int], dtype: DType, op: str) -> None:
        """An allocation larger than the device's whole memory is ember's OutOfMemoryError at once (CuPy, like
        numpy, refuses sizes past the address space with a ValueError instead)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < _HUGE:
            return
        capacity = int(self.cp.cuda.runtime.memGetInfo()[1])
        if nbytes > capacity:
            raise OutOfMemoryError(f"{op}: cannot allocate {nbytes} bytes for shape {tuple(shape)} ({dtype.name}) on "
                                   f"{self.describe()}, which has {_human(capacity)}; pool in use "
                                   f"{_human(self.pool.used_bytes())}, reserved {_human(self.pool.total_bytes())}")

    def _check_dtype(self, dtype: DType, op: str) -> None:
        if dtype not in self.supported_dtypes:
            raise DTypeError(f"{op}: {dtype.name} is not supported on {self.platform} (CuPy has no {dtype.name})")

    def _prune_staged(self) -> None:
        """Drop the pinned buffers of uploads that have finished (they go back to CuPy's pinned pool)."""
        with self._lock:
            self._staged = [(ev, buf) for ev, buf in self._staged if not ev.done]

    def from_numpy(self, array: np.ndarray) -> Any:
        """Upload ``array``. From 64 KiB on it is copied into a pinned staging buffer and sent asynchronously on
        this device's stream (the host is free at once; the buffer is held until the copy's event completes, and
        every later op on the stream sees the data); smaller arrays are copied directly."""
        self._check_dtype(dt.from_numpy_dtype(array.dtype), "from_numpy")
        cp = self.cp
        if array.nbytes < PINNED_MIN_BYTES:
            with self._on():
                return cp.asarray(array)
        self._prune_staged()
        import cupyx

        staged = cupyx.empty_pinned(array.shape, dtype=array.dtype)
        np.copyto(staged, array)
        with self._on():
            out = cp.empty(array.shape, dtype=array.dtype)
            out.set(staged, stream=self.stream)
            event = self.stream.record()
        with self._lock:
            self._staged.append((event, staged))
        return out

    def to_numpy(self, h: Any) -> np.ndarray:
        """Download ``h`` (waits for the stream). From 64 KiB on the copy lands in a pinned buffer (DMA at full
        bandwidth) and is returned as an ordinary numpy array."""
        cp = self.cp
        if h.nbytes < PINNED_MIN_BYTES:
            with self._on():
                return cp.asnumpy(h, stream=self.stream, blocking=True)
        import cupyx

        staged = cupyx.empty_pinned(h.shape, dtype=h.dtype)
        with self._on():
            cp.asnumpy(cp.ascontiguousarray(h), stream=self.stream, out=staged, blocking=True)
        return np.array(staged, copy=True)  # pageable: pinned memory stays a pooled, reused resource

    def from_dlpack(self, capsule: Any) -> Any:
        """Zero-copy import of a DLPack tensor on this GPU (torch, CuPy, JAX)."""
        with self._on():
            return self.cp.from_dlpack(capsule)

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> Any:
        self._check_dtype(dtype, "full")
        self._check_request(tuple(shape), dtype, "full")
        with self._on():
            return self.cp.full(tuple(shape), value, dtype=dtype.numpy)

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> Any:
        self._check_dtype(dtype, "arange")
        with self._on():
            return self.cp.arange(start, stop, step, dtype=np.float64 if dtype.is_floating_point else np.int64) \
                .astype(dtype.numpy)

    def cast(self, h: Any, dtype: DType) -> Any:
        self._check_dtype(dtype, "cast")
        with self._on():
            return h.astype(dtype.numpy)

    def copy(self, h: Any) -> Any:
        with self._on():
            return h.copy()

    def contiguous(self, h: Any) -> Any:
        """h itself when C-contiguous, else a contiguous copy."""
        with self._on():
            return self.cp.ascontiguousarray(h)

    def dtype_of(self, h: Any) -> DType:
        return dt.from_numpy_dtype(h.dtype)

    def assign(self, dst: Any, src: Any) -> None:
        with self._on():
            if isinstance(src, self.cp.ndarray) and self.may_share_memory(dst, src):
                src = src.copy()  # overlapping memory: read a snapshot
            dst[...] = src

    # -- elementwise: the shared map kernels -----------------------------------------------------------------------
    def _strides(self, h: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
        """h's element strides broadcast to shape (0 for new and stretched dims)."""
        lead = len(shape) - h.ndim
        item = h.itemsize
        return (0,) * lead + tuple(0 if n == 1 and shape[lead + d] != 1 else s // item
                                   for d, (n, s) in enumerate(zip(h.shape, h.strides)))

    def _run_map(self, family: ew.Family, k: int, out: Any, operands: list[tuple[Any, CType]]) -> None:
        """out[...] = member k of family over operands (arrays broadcast to out's shape, or scalars)."""
        n = out.size
        if n == 0:
            return
        cp = self.cp
        arrays = [op for op, _ in operands if isinstance(op, cp.ndarray)]
        shape, strides = ew.collapse(out.shape, [self._strides(out, out.shape)]
                                     + [self._strides(a, out.shape) for a in arrays])
        linear = len(shape) <= 1 and all(st == (1,) or st == () for st in strides)
        rank = 1 if linear else ew._rank_bucket(len(shape))
        layout = "linear" if linear else "strided"
        desc = tuple((t, isinstance(op, cp.ndarray)) for op, t in operands)
        source = ew._map_source(family, desc, rank, layout)
        args: list[Any] = [out, np.int64(0)]
        for op, t in operands:
            args += [op, np.int64(0)] if isinstance(op, cp.ndarray) else [t.arg(op)]
        args.append(np.int64(n))
        if not linear:
            pad = rank - len(shape)
            args += [np.int64(1)] * pad + [np.int64(v) for v in shape]
            for st in strides:
                args += [np.int64(0)] * pad + [np.int64(v) for v in st]
        self._launch(source, f"ember_map{k}", n, args)

    def _shape_of(self, *xs: Any) -> tuple[int, ...]:
        shapes = [x.shape for x in xs if isinstance(x, self.cp.ndarray)]
        try:
            return tuple(np.broadcast_shapes(*shapes))
        except ValueError as exc:
            raise ShapeError(f"{self.platform}: shapes {shapes} do not broadcast") from exc

    def _scalar_ctype(self, value: Any, other: CType) -> CType:
        if isinstance(value, float) and not other.is_float:
            return ctype(dt.float64)  # a comparison of ints with a float compares in double (no truncation)
        return other

    def unary(self, op: str, h: Any) -> Any:
        dtype = self.dtype_of(h)
        expr, _, out_dtype, family = ew._unary_plan(op, dtype)
        out = self.empty(h.shape, out_dtype)
        self._run_map(family, family.index[(expr, out_dtype)], out, [(h, ctype(dtype))])
        return out

    def binary(self, op: str, a: Any, b: Any, out: Any | None = None) -> Any:
        cp = self.cp
        ref = a if isinstance(a, cp.ndarray) else b
        dtype = self.dtype_of(ref)
        t = ctype(dtype)
        ta = t if isinstance(a, cp.ndarray) else self._scalar_ctype(a, t)
        tb = t if isinstance(b, cp.ndarray) else self._scalar_ctype(b, t)
        wide = ta if ta is not t else tb
        expr, _, out_dtype, family = ew._binary_plan(op, dtype, wide.dtype)
        if out is None:
            out = self.empty(self._shape_of(a, b), out_dtype)
        self._run_map(family, family.index[(expr, out_dtype)], out, [(a, ta), (b, tb)])
        return out

    def inplace_binary(self, op: str, a: Any, b: Any) -> None:
        if isinstance(b, self.cp.ndarray) and self.may_share_memory(a, b):
            b = self.copy(b)  # a's writes must not feed back into b
        self.binary(op, a, b, out=a)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        cp = self.cp
        ref = a if isinstance(a, cp.ndarray) else b if isinstance(b, cp.ndarray) else None
        if ref is not None:
            dtype = self.dtype_of(ref)
        else:
            dtype = dt.float32 if isinstance(a, float) or isinstance(b, float) else dt.int64
        t = ctype(dtype)
        out = self.empty(self._shape_of(cond, a, b), dtype)
        family = ew.Family([("(v0 ? v1 : v2)", frozenset(), dtype)])
        self._run_map(family, 0, out, [(cond, ctype(dt.bool_)), (a, t), (b, t)])
        return out

    # -- reductions and scans ------------------------------------------------------------------------------------
    def reduce(self, op: str, h: Any, dims: tuple[int, ...], keepdim: bool) -> Any:
        cp = self.cp
        dtype = self.dtype_of(h)
        axis = tuple(dims)
        with self._on():
            if dtype is dt.bool_ and op in ("sum", "prod", "max", "min"):
                fn = cp.any if op in ("sum", "max") else cp.all  # bool sum/prod stored as bool are any/all
                return fn(h, axis=axis, keepdims=keepdim)
            if op == "sum":
                acc = np.float32 if dtype is dt.float16 else dtype.numpy  # half sums accumulate in float
                return cp.sum(h, axis=axis, dtype=acc, keepdims=keepdim).astype(dtype.numpy, copy=False)
            if op == "prod":
                acc = np.float32 if dtype is dt.float16 else dtype.numpy
                return cp.prod(h, axis=axis, dtype=acc, keepdims=keepdim).astype(dtype.numpy, copy=False)
            if op in ("max", "min"):
                if any(h.shape[d] == 0 for d in axis):
                    raise ShapeError(f"{op}: cannot reduce over an empty dim of shape {h.shape}")
                fn = cp.amax if op == "max" else cp.amin
                return fn(h, axis=axis, keepdims=keepdim)
        raise ValueRangeError(f"reduce: unknown op {op!r}")

    def argreduce(self, op: str, h: Any, dim: int | None, keepdim: bool) -> Any:
        cp = self.cp
        fn = cp.argmax if op in ("max", "argmax") else cp.argmin
        with self._on():
            if dim is None:
                r = fn(h.reshape(-1)).astype(np.int64)
                return r.reshape((1,) * h.ndim) if keepdim else r
            r = fn(h, axis=dim).astype(np.int64)
            return cp.expand_dims(r, dim) if keepdim else r

    def cumulative(self, op: str, h: Any, dim: int) -> Any:
        cp = self.cp
        dtype = self.dtype_of(h)
        with self._on():
            if dtype is dt.bool_:  # cumsum/cumprod of bool stored as bool: running any / all
                if op == "sum":
                    return cp.cumsum(h.astype(np.int64), axis=dim) > 0
                return cp.cumprod(h.astype(np.uint8), axis=dim).astype(np.bool_)
            acc = np.float32 if dtype is dt.float16 else dtype.numpy
            fn = cp.cumsum if op == "sum" else cp.cumprod
            return fn(h, axis=dim, dtype=acc).astype(dtype.numpy, copy=False)

    # -- linear algebra ------------------------------------------------------------------------------------------
    def matmul(self, a: Any, b: Any) -> Any:
        cp = self.cp
        dtype = self.dtype_of(a)
        with self._on():
            if dtype.is_floating_point:
                return cp.matmul(a, b)  # cuBLAS / rocBLAS
            if dtype is dt.bool_:  # the logical or of ands: a count of a & b, then != 0
                return cp.matmul(a.astype(np.int64), b.astype(np.int64)) != 0
            # integers: accumulate in int64; the low bits are the wrapped product numpy's integer matmul gives
            return cp.matmul(a.astype(np.int64), b.astype(np.int64)).astype(dtype.numpy)

    # -- sorting -------------------------------------------------------------------------------------------------
    def sort(self, h: Any, dim: int, descending: bool, stable: bool) -> tuple[Any, Any]:
        """Values and int64 indices along dim; ties keep their order (CuPy's sorts are stable); NaN sorts last
        ascending and first descending, as in PyTorch."""
        cp = self.cp
        with self._on():
            if not descending:
                idx = cp.argsort(h, axis=dim, kind="stable")  # CuPy's sorts are stable; say so (numpy's default is not)
            else:
                # reverse, sort ascending (stable), reverse back: descending with ties in their original order
                n = h.shape[dim]
                rev = cp.flip(h, axis=dim)
                idx = cp.flip(cp.argsort(rev, axis=dim, kind="stable"), axis=dim)
                idx = (n - 1) - idx
            idx = idx.astype(np.int64)
            return cp.take_along_axis(h, idx, axis=dim), idx

    # -- movement and indexing -----------------------------------------------------------------------------------
    def reshape(self, h: Any, shape: tuple[int, ...]) -> Any:
        with self._on():
            return h.reshape(tuple(shape))

    def permute(self, h: Any, dims: tuple[int, ...]) -> Any:
        return self.cp.transpose(h, tuple(dims))

    def expand(self, h: Any, shape: tuple[int, ...]) -> Any:
        return self.cp.broadcast_to(h, tuple(shape))

    def getitem(self, h: Any, key: tuple[Any, ...]) -> Any:
        with self._on():
            return h[key]

    def setitem(self, h: Any, key: tuple[Any, ...], value: Any) -> None:
        with self._on():
            h[key] = value

    def cat(self, hs: Sequence[Any], dim: int) -> Any:
        with self._on():
            return self.cp.concatenate(list(hs), axis=dim)

    def flip(self, h: Any, dims: tuple[int, ...]) -> Any:
        with self._on():
            return self.cp.flip(h, axis=tuple(dims)).copy()

    def gather(self, h: Any, dim: int, index: Any) -> Any:
        if h.ndim == 0:
            return super().gather(h, dim, index)
        from . import kernels

        return kernels.gather(self, h, dim, index)

    def scatter(self, h: Any, dim: int, index: Any, src: Any, reduce: str | None) -> Any:
        """Replace: CuPy's advanced-index assignment; add/multiply: the shared deterministic scatter-loop kernel
        (no atomics: float sums come out the same on every run). bool and 0-d use the default composition."""
        if h.ndim == 0 or (reduce is not None and self.dtype_of(h) is dt.bool_):
            return super().scatter(h, dim, index, src, reduce)
        from . import kernels

        return kernels.scatter(self, h, dim, index, src, reduce)

    def pad(self, h: Any, pads: tuple[tuple[int, int], ...], mode: str, value: Any) -> Any:
        from . import kernels

        return kernels.pad(self, h, pads, mode, value)

    # -- softmax and logsumexp: one kernel per row ---------------------------------------------------------------
    def softmax(self, h: Any, dim: int, log: bool) -> Any:
        """One fused kernel per row (max, sum of exp, write); few very long rows use the default composition,
        whose reductions spread each row over the whole GPU."""
        from . import kernels

        out = kernels.softmax(self, h, dim, log) if self.dtype_of(h).is_floating_point else None
        return out if out is not None else super().softmax(h, dim, log)

    def logsumexp(self, h: Any, dims: tuple[int, ...], keepdim: bool) -> Any:
        from . import kernels

        out = kernels.logsumexp(self, h, dims, keepdim) if self.dtype_of(h).is_floating_point else None
        return out if out is not None else super().logsumexp(h, dims, keepdim)

    # -- convolution ---------------------------------------------------------------------------------------------
    def conv(self, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], padding: tuple[tuple[int, int], ...],
             dilation: tuple[int, ...], groups: int) -> Any:
        """im2col + ``cupy.matmul`` (cuBLAS), or cuDNN where CuPy ships it (see :mod:`ember_cupy.kernels`)."""
        from . import kernels

        return kernels.conv(self, x, w, b, stride, padding, dilation, groups)

    def conv_transpose(self, x: Any, w: Any, b: Any | None, stride: tuple[int, ...], padding: tuple[int, ...],
                       output_padding: tuple[int, ...], dilation: tuple[int, ...], groups: int) -> Any:
        from . import kernels

        return kernels.conv_transpose(self, x, w, b, stride, padding, output_padding, dilation, groups)

    def conv_input_grad(self, grad_y: Any, w: Any, x_shape: tuple[int, ...], stride: tuple[int, ...],
                        padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> Any:
        """Gradient of ``conv`` w.r.t. its input of shape x_shape (the autodiff decorator uses it)."""
        from . import kernels

        return kernels.conv_input_grad(self, grad_y, w, x_shape, stride, padding, dilation, groups)

    def conv_weight_grad(self, x: Any, grad_y: Any, w_shape: tuple[int, ...], stride: tuple[int, ...],
                         padding: tuple[tuple[int, int], ...], dilation: tuple[int, ...], groups: int) -> Any:
        """Gradient of ``conv`` w.r.t. its weight of shape w_shape (the autodiff decorator uses it)."""
        from . import kernels

        return kernels.conv_weight_grad(self, x, grad_y, w_shape, stride, padding, dilation, groups)

    # -- pooling and resampling ----------------------------------------------------------------------------------
    def max_pool(self, x: Any, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
                 dilation: tuple[int, ...], ceil_mode: bool, return_indices: bool) -> Any:
        from . import kernels

        return kernels.max_pool(self, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def avg_pool(self, x: Any, kernel_size: tuple[int, ...], stride: tuple[int, ...], padding: tuple[int, ...],
                 ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Any:
        from . import kernels

        return kernels.avg_pool(self, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                divisor_override)

    def adaptive_avg_pool(self, x: Any, output_size: tuple[int, ...]) -> Any:
        from . import kernels

        return kernels.adaptive_avg_pool(self, x, output_size)

    def adaptive_max_pool(self, x: Any, output_size: tuple[int, ...], return_indices: bool) -> Any:
        from . import kernels

        return kernels.adaptive_max_pool(self, x, output_size, return_indices)

    def interpolate(self, x: Any, size: tuple[int, ...], mode: str, align_corners: bool | None,
                    scales: tuple[float, ...] | None) -> Any:
        from . import kernels

        return kernels.interpolate(self, x, size, mode, align_corners, scales)

    # -- random numbers: the shared Philox kernels, ember-opencl's counter layout ------------------------------
    def seed(self, seed: int) -> None:
        with self._lock:
            self._key = int(seed) & MASK64
            self._offset = 0

    def _philox(self, kind: str, shape: tuple[int, ...], dtype: DType, low: int = 0, span: int = 0) -> Any:
        self._check_dtype(dtype, {"uniform": "rand", "normal": "randn"}.get(kind, "randint"))
        out = self.empty(tuple(shape), dtype)
        with self._lock:
            key, offset = self._key, self._offset
            self._offset = (offset + 1) & MASK64  # a fresh counter range even for empty draws, as on OpenCL
        n = out.size
        if n == 0:
            return out
        src, per = philox_source(kind, dtype)
        nblocks = -(-n // per)
        self._launch(src, f"ember_philox_{kind}", nblocks,
                     [out, np.int64(0), np.int64(n), np.int64(nblocks), np.uint32(key & 0xFFFFFFFF),
                      np.uint32(key >> 32), np.uint32(offset & 0xFFFFFFFF), np.uint32(offset >> 32),
                      np.int64(low), np.uint64(span)])
        return out

    def rand(self, shape: tuple[int, ...], dtype: DType) -> Any:
        if not dtype.is_floating_point:
            raise DTypeError(f"rand: expected a floating point dtype, got {dtype.name}")
        return self._philox("uniform", shape, dtype)

    def randn(self, shape: tuple[int, ...], dtype: DType) -> Any:
        if not dtype.is_floating_point:
            raise DTypeError(f"randn: expected a floating point dtype, got {dtype.name}")
        return self._philox("normal", shape, dtype)

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> Any:
        span = int(high) - int(low)
        if span <= 0 or span > MASK64 or not -(1 << 63) <= int(low) < (1 << 63):
            raise ValueRangeError(f"randint: unsupported range [{low}, {high}) for dtype {dtype.name}")
        return self._philox("integers", shape, dtype, int(low), span)


def require_device(platform: str, index: int) -> None:
    """Raise DeviceError naming why ``platform`` device ``index`` cannot be used (for callers outside the plugin
    factory, e.g. scripts that build a backend directly)."""
    from . import detect

    count = detect.device_count(platform)
    if index >= count:
        raise DeviceError(f"{platform}:{index}: only {count} device(s) found"
                          + (f" ({detect.unavailable_reason(platform)})" if not count else ""))
