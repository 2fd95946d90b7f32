"""Tensor factories with PyTorch's names and arguments (tensor, zeros, ones, full, arange, rand, ...)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

from .. import dtypes as dt
from ..bridge import check_dtype_supported, to_tensor
from ..device import Device, as_device, check_seed, default_device, seed_all
from ..device import draw_seed as _draw_seed
from ..device import initial_seed as _initial_seed
from ..dtypes import DType
from ..errors import DTypeError, EmberError, OutOfMemoryError, ValueRangeError
from ..generator import draw as _draw
from ..shapes import check_shape_arg
from ..tensor import Tensor


def _dev(device: Any) -> Device:
    return default_device() if device is None else as_device(device)


def _alloc(dev: Device, op: str, shape: tuple[int, ...], d: DType, make: Callable[[], Any]) -> Any:
    """make() (which allocates a new tensor of shape and dtype d); running out of memory, or a size past what
    the address space can hold, is an OutOfMemoryError naming the op, shape and bytes (not a raw numpy error)."""
    try:
        return make()
    except (MemoryError, ValueError) as exc:  # OutOfMemoryError is a MemoryError: the message gains the op
        if isinstance(exc, EmberError) and not isinstance(exc, OutOfMemoryError):
            raise
        if isinstance(exc, ValueError) and not any(
                m in str(exc) for m in ("array is too big", "Maximum allowed size exceeded")):
            raise
        n = math.prod(shape)
        raise OutOfMemoryError(
            f"{op}: cannot allocate a tensor of shape {tuple(shape)} and dtype {d.name} on {dev} "
            f"({n} elements, {n * d.itemsize} bytes): {type(exc).__name__}: {exc}"
        ) from None


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of data (nested lists, scalars, numpy arrays or tensors)."""
    if isinstance(data, Tensor) and dtype is None and device is None:
        data = data.numpy().copy()
        return _finish(to_tensor(data, None, None), requires_grad)
    t = to_tensor(data, dtype, device)
    src = data.numpy() if isinstance(data, Tensor) else data
    base = t._device.stack.lower(t._h)  # the undecorated backend's handle (an autodiff stack wraps it)
    if type(base) is type(src) and _np().may_share_memory(base, src):
        # host backends adopt arrays they are given; tensor() copies, as torch.tensor does (from_numpy shares)
        t = Tensor._make(t._device.stack.copy(t._h), t._dtype, t._device)
    return _finish(t, requires_grad)


def _np() -> Any:
    import numpy

    return numpy


def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> Tensor:
    """Like tensor() but returns data itself when it already is a tensor of that dtype and device."""
    if isinstance(data, Tensor):
        t = data
        if device is not None:
            t = t.to(as_device(device))
        if dtype is not None:
            t = t.to(dt.as_dtype(dtype))
        return t
    return to_tensor(data, dtype, device)


def from_numpy(array: Any) -> Tensor:
    """A tensor on the host device (``Device.host()``) sharing memory with the numpy array (zero-copy)."""
    import numpy as np

    if not isinstance(array, np.ndarray):
        raise DTypeError(f"from_numpy: expected numpy.ndarray, got {type(array).__name__}")
    d = dt.from_numpy_dtype(array.dtype)
    dev = Device.host()
    return Tensor._make(dev.stack.from_numpy(array), d, dev)


def from_dlpack(obj: Any, device: Any = None) -> Tensor:
    """A tensor from any DLPack producer (numpy, torch, cupy ...); zero-copy where the device allows it."""
    import numpy as np

    dev = _dev(device)
    stack = dev.stack
    if hasattr(stack, "from_dlpack"):
        h = stack.from_dlpack(obj)
        d = dt.from_numpy_dtype(h.dtype) if hasattr(h, "dtype") else None
        if d is not None:
            return Tensor._make(h, d, dev)
    arr = np.from_dlpack(obj)
    return to_tensor(arr, None, dev)


def _float_dtype(dtype: Any, dev: Device) -> DType:
    return dev.default_dtype if dtype is None else dt.as_dtype(dtype)


def full(size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    dev = _dev(device)
    shape = check_shape_arg((size,) if not isinstance(size, (tuple, list)) else tuple(size), "full")
    if dtype is None:
        if isinstance(fill_value, Tensor):
            fill_value = fill_value.item()
        d = dt.bool_ if isinstance(fill_value, bool) else dt.int64 if isinstance(fill_value, int) else (
            dev.default_dtype.to_complex if isinstance(fill_value, complex) else dev.default_dtype)
    else:
        d = dt.as_dtype(dtype)
        if isinstance(fill_value, Tensor):
            fill_value = fill_value.item()
    check_dtype_supported(dev, d, "full")
    fill_value = dt.convert_scalar(fill_value, d, "full")  # PyTorch refuses values the dtype cannot hold
    _check_float_fill(fill_value, d, "full")
    return _finish(Tensor._make(_alloc(dev, "full", shape, d, lambda: dev.stack.full(shape, fill_value, d)), d, dev),
                   requires_grad)


@cache
def _float_max(d: DType) -> float:
    import ml_dtypes  # its finfo knows bfloat16 as well as numpy's float types

    return float(ml_dtypes.finfo(d.numpy).max)


def _check_float_fill(v: Any, d: DType, op: str) -> None:
    """PyTorch refuses a finite fill value beyond a float dtype's range (inf and NaN pass)."""
    if type(v) is float and d.is_floating_point and d.itemsize < 8 and math.isfinite(v) and abs(v) > _float_max(d):
        raise ValueRangeError(f"{op}: value {v} cannot be converted to type {d.name} without overflow")


def _filled(name: str, value: Any, size: tuple[Any, ...], dtype: Any, device: Any, requires_grad: bool) -> Tensor:
    dev = _dev(device)
    shape = check_shape_arg(size, name)
    d = _float_dtype(dtype, dev)
    check_dtype_supported(dev, d, name)
    return _finish(Tensor._make(_alloc(dev, name, shape, d, lambda: dev.stack.full(shape, value, d)), d, dev),
                   requires_grad)


def zeros(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return _filled("zeros", 0, size, dtype, device, requires_grad)


def ones(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    return _filled("ones", 1, size, dtype, device, requires_grad)


def empty(*size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Uninitialised in PyTorch; ember fills with zeros so results never depend on stale memory."""
    return _filled("empty", 0, size, dtype, device, requires_grad)


def _like(name: str, x: Tensor, dtype: Any, device: Any) -> tuple[tuple[int, ...], DType, Device]:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{name}: expected a Tensor, got {type(x).__name__}")
    d = x._dtype if dtype is None else dt.as_dtype(dtype)
    return x.shape, d, (x._device if device is None else as_device(device))


def zeros_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, d, dev = _like("zeros_like", x, dtype, device)
    return zeros(shape, dtype=d, device=dev, requires_grad=requires_grad)


def ones_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, d, dev = _like("ones_like", x, dtype, device)
    return ones(shape, dtype=d, device=dev, requires_grad=requires_grad)


def empty_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, d, dev = _like("empty_like", x, dtype, device)
    return empty(shape, dtype=d, device=dev, requires_grad=requires_grad)


def full_like(x: Tensor, fill_value: Any, *, dtype: Any = None, device: Any = None,
              requires_grad: bool = False) -> Tensor:
    shape, d, dev = _like("full_like", x, dtype, device)
    _check_float_fill(fill_value, d, "full_like")
    return full(shape, fill_value, dtype=d, device=dev, requires_grad=requires_grad)


def rand_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, d, dev = _like("rand_like", x, dtype, device)
    return rand(shape, dtype=d, device=dev, requires_grad=requires_grad)


def randn_like(x: Tensor, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    shape, d, dev = _like("randn_like", x, dtype, device)
    return randn(shape, dtype=d, device=dev, requires_grad=requires_grad)


def randint_like(x: Tensor, low: int = 0, high: int | None = None, *, dtype: Any = None,
                 device: Any = None) -> Tensor:
    shape, d, dev = _like("randint_like", x, dtype, device)
    if high is None:
        low, high = 0, low
    return randint(low, high, shape, dtype=d, device=dev)


def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: Any = None, device: Any = None,
           requires_grad: bool = False) -> Tensor:
    """Values from start to end (exclusive) by step; integer arguments give int64, else the default float."""
    if end is None:
        start, end = 0, start
    vals = []
    for v in (start, end, step):
        if isinstance(v, Tensor):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DTypeError(f"arange: start/end/step must be numbers, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueRangeError(f"arange: unsupported range {start} -> {end} with step {step}")
        vals.append(v)
    start, end, step = vals
    if step == 0:
        raise ValueRangeError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ValueRangeError(
            f"arange: upper bound and larger bound inconsistent with step sign (start={start}, end={end}, step={step})"
        )
    dev = _dev(device)
    if dtype is None:
        d = dt.int64 if all(isinstance(v, int) for v in vals) else dev.default_dtype
    else:
        d = dt.as_dtype(dtype)
    check_dtype_supported(dev, d, "arange")
    n = max(0, math.ceil((end - start) / step))
    if d.is_floating_point or not all(isinstance(v, int) for v in vals):
        # compute in float64 then cast, so the length is exactly ceil((end-start)/step) like PyTorch
        import numpy as np

        h = _alloc(dev, "arange", (n,), d, lambda: dev.stack.from_numpy(
            (start + step * np.arange(n, dtype=np.float64)).astype(d.numpy)))
        return _finish(Tensor._make(h, d, dev), requires_grad)
    h = _alloc(dev, "arange", (n,), d, lambda: dev.stack.arange(start, end, step, d))
    return _finish(Tensor._make(h, d, dev), requires_grad)


def linspace(start: float, end: float, steps: int, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    import numpy as np

    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueRangeError(f"linspace: number of steps must be a non-negative int, got {steps!r}")
    dev = _dev(device)
    d = _float_dtype(dtype, dev)
    for v in (start, end):
        _check_float_fill(float(v), d, "linspace")
    # PyTorch's formula: the first half steps up from start, the second half down from end (so an infinite or NaN
    # bound gives NaN where inf * 0 or inf - inf appears, as in torch); one step is [start] whatever end is
    if steps == 1:
        arr = np.array([float(start)])
    else:
        lo, hi = float(start), float(end)
        with np.errstate(all="ignore"):
            step = (hi - lo) / (steps - 1)
            idx = np.arange(steps, dtype=np.float64)
            half = steps // 2
            arr = np.where(idx < half, lo + step * idx, hi - step * (steps - 1 - idx))
    if d.is_integer:
        arr = np.trunc(arr)
    return _finish(to_tensor(arr.astype(d.numpy), d, dev), requires_grad)


def logspace(start: float, end: float, steps: int, base: float = 10.0, *, dtype: Any = None,
             device: Any = None) -> Tensor:
    import numpy as np

    dev = _dev(device)
    d = _float_dtype(dtype, dev)
    return to_tensor(np.logspace(start, end, steps, base=base).astype(d.numpy), d, dev)


def eye(n: int, m: int | None = None, *, dtype: Any = None, device: Any = None,
        requires_grad: bool = False) -> Tensor:
    import numpy as np

    m = n if m is None else m
    for v in (n, m):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueRangeError(f"eye: n and m must be non-negative ints, got n={n!r}, m={m!r}")
    dev = _dev(device)
    d = _float_dtype(dtype, dev)
    return _finish(_alloc(dev, "eye", (n, m), d, lambda: to_tensor(np.eye(n, m, dtype=d.numpy), d, dev)),
                   requires_grad)


def _random_float(name: str, size: tuple[Any, ...], dtype: Any, device: Any) -> tuple[tuple[int, ...], DType, Device]:
    dev = _dev(device)
    shape = check_shape_arg(size, name)
    d = _float_dtype(dtype, dev)
    if not d.is_floating_point:
        raise DTypeError(f"{name}: expected a floating dtype, got {d} (use randint for integers)")
    check_dtype_supported(dev, d, name)
    return shape, d, dev


def rand(*size: Any, generator: Any = None, dtype: Any = None, device: Any = None,
         requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1) from ``generator`` (an :class:`ember.Generator` of the device), else from the
    device's random stream (``device.seed(n)`` to reproduce)."""
    shape, d, dev = _random_float("rand", size, dtype, device)
    h = _alloc(dev, "rand", shape, d, lambda: _draw("rand", generator, dev, "rand", shape, d))
    return _finish(Tensor._make(h, d, dev), requires_grad)


def randn(*size: Any, generator: Any = None, dtype: Any = None, device: Any = None,
          requires_grad: bool = False) -> Tensor:
    """Standard normal samples from ``generator`` (an :class:`ember.Generator`), else the device's stream."""
    shape, d, dev = _random_float("randn", size, dtype, device)
    h = _alloc(dev, "randn", shape, d, lambda: _draw("randn", generator, dev, "randn", shape, d))
    return _finish(Tensor._make(h, d, dev), requires_grad)


def randint(low: int, high: Any = None, size: Any = None, *, generator: Any = None, dtype: Any = None,
            device: Any = None) -> Tensor:
    """Integers uniform in [low, high); ``randint(high, size)`` and ``randint(low, high, size)`` as in PyTorch.
    Drawn from ``generator`` (an :class:`ember.Generator`) when given, else from the device's stream."""
    if size is None:
        if high is None or not isinstance(high, (tuple, list)):
            raise ValueRangeError("randint: size is required, e.g. randint(0, 10, (3, 4))")
        low, high, size = 0, low, high
    if not isinstance(low, int) or not isinstance(high, int) or low >= high:
        raise ValueRangeError(f"randint: expected ints with low < high, got low={low!r}, high={high!r}")
    dev = _dev(device)
    shape = check_shape_arg(tuple(size), "randint")
    d = dt.int64 if dtype is None else dt.as_dtype(dtype)
    if not -(2**63) <= low or not high <= 2**63 - 1:  # PyTorch takes both as int64 arguments
        raise ValueRangeError(f"randint: low and high must fit int64, got low={low}, high={high}")
    if not d.is_floating_point:  # PyTorch: both ends of [low, high - 1] must be values of the dtype
        lo, hi = (0, 1) if d.is_bool else dt.int_range(d)
        if not lo <= low <= hi or not lo <= high - 1 <= hi:
            raise ValueRangeError(f"randint: the range [{low}, {high}) is out of bounds for dtype {d.name} "
                                  f"(values {lo} to {hi})")
    check_dtype_supported(dev, d, "randint")
    return Tensor._make(_alloc(dev, "randint", shape, d,
                               lambda: _draw("randint", generator, dev, "randint", shape, d, low, high)), d, dev)


def randperm(n: int, *, generator: Any = None, dtype: Any = None, device: Any = None) -> Tensor:
    """A random permutation of 0..n-1 (int64 unless ``dtype``), from ``generator`` when given, else the device's
    stream: the argsort of n uniform keys."""
    if not isinstance(n, int) or n < 0:
        raise ValueRangeError(f"randperm: n must be a non-negative int, got {n!r}")
    dev = _dev(device)
    keys = Tensor._make(_draw("randperm", generator, dev, "rand", (n,), dt.float64), dt.float64, dev)
    _, idx = dev.stack.sort(keys._h, 0, False, True)
    t = Tensor._make(idx, dt.int64, dev)
    return t if dtype is None else t.to(dt.as_dtype(dtype))


def manual_seed(seed: int, device: Any = None) -> None:
    """Seed every random stream a program draws from, as ``torch.manual_seed`` does: each device's stream (those
    in use now, and the others when first used) and ember's host generator, which a DataLoader without ``seed=``
    draws its shuffle seed from. ``device=`` seeds that device's stream only. Negative seeds wrap modulo 2**64.

    >>> import ember
    >>> ember.manual_seed(0); a = ember.rand(3).tolist()
    >>> ember.manual_seed(0); a == ember.rand(3).tolist()
    True
    """
    if device is None:
        seed_all(seed)
    else:
        _dev(device).seed(check_seed(seed, "manual_seed"))


def initial_seed() -> int:
    """The seed of ember's host generator (``torch.initial_seed``): the last ``manual_seed``/``seed`` value, else
    one drawn from the OS when first needed; ``manual_seed(initial_seed())`` repeats the run's host-side draws."""
    return _initial_seed()


def seed() -> int:
    """Seed everything (as :func:`manual_seed`) with a fresh seed from the OS and return it (``torch.seed``)."""
    import secrets

    s = secrets.randbits(63)
    seed_all(s)
    return s


def draw_seed() -> int:
    """A fresh seed in [0, 2**63) from ember's host generator: the same sequence after every ``manual_seed(n)``
    with the same n. Libraries that need their own reproducible stream (a shuffling DataLoader) take one."""
    return _draw_seed()


# -- Tensor.new_*: factories whose dtype and device default to an existing tensor's (torch.Tensor.new_zeros ...);
# Tensor's own methods (like numel and detach, they are no ops of the registry) call these --------------------
def _new_args(name: str, self: Tensor, dtype: Any, device: Any) -> tuple[DType, Device]:
    if not isinstance(self, Tensor):
        raise DTypeError(f"{name}: expected a Tensor, got {type(self).__name__}")
    return (self._dtype if dtype is None else dt.as_dtype(dtype),
            self._device if device is None else as_device(device))


def new_zeros(self: Tensor, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros of ``size`` (ints or one tuple) with self's dtype and device unless given (``Tensor.new_zeros``)."""
    d, dev = _new_args("new_zeros", self, dtype, device)
    return _filled("new_zeros", 0, size, d, dev, requires_grad)


def new_ones(self: Tensor, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones of ``size`` (ints or one tuple) with self's dtype and device unless given (``Tensor.new_ones``)."""
    d, dev = _new_args("new_ones", self, dtype, device)
    return _filled("new_ones", 1, size, d, dev, requires_grad)


def new_empty(self: Tensor, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``Tensor.new_empty``: zero-filled, as :func:`empty`, so results never depend on stale memory."""
    d, dev = _new_args("new_empty", self, dtype, device)
    return _filled("new_empty", 0, size, d, dev, requires_grad)


def new_full(self: Tensor, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """``fill_value`` in a tensor of ``size`` with self's dtype and device unless given (``Tensor.new_full``):
    the dtype is self's even for an int or bool fill value, as torch."""
    d, dev = _new_args("new_full", self, dtype, device)
    return full(size, fill_value, dtype=d, device=dev, requires_grad=requires_grad)


def new_tensor(self: Tensor, data: Any, *, dtype: Any = None, device: Any = None,
               requires_grad: bool = False) -> Tensor:
    """A copy of ``data`` (lists, scalars, arrays or tensors; never shared, never in a graph) with self's dtype
    and device unless given (``Tensor.new_tensor``)."""
    d, dev = _new_args("new_tensor", self, dtype, device)
    if isinstance(data, Tensor):
        data = data.detach()
    return tensor(data, dtype=d, device=dev, requires_grad=requires_grad)


__all__ = [
    "tensor", "as_tensor", "from_numpy", "from_dlpack", "full", "zeros", "ones", "empty", "zeros_like",
    "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "arange", "linspace",
    "logspace", "eye", "rand", "randn", "randint", "randperm", "manual_seed", "initial_seed", "seed", "draw_seed",
]

