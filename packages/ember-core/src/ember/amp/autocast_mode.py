"""``ember.autocast``: mixed precision by op, with PyTorch's semantics.

Inside ``with ember.autocast(device_type, dtype):`` the ops of :mod:`ember.amp.policy` cast their floating
arguments on devices of that backend kind: matrix products and convolutions to the lower-precision dtype
(bfloat16 on CPU-like backends, float16 on GPUs, or what the backend declares), losses and other
precision-sensitive ops to float32, mixed inputs elsewhere to the widest dtype. The casts are ordinary
differentiable ``to(dtype)`` ops, so gradients reach float32 parameters in float32.

The state is per thread (a new thread starts without autocast, as in PyTorch) and nests: an inner
``autocast(enabled=False)`` turns it off for its body, an inner one with another dtype overrides it. Each wrapped op
pays one thread-local attribute read when autocast is off (``STATE.kinds is None``). While a wrapped op runs, the ops
it calls run without autocast (PyTorch excludes its autocast dispatch key the same way), so an op's own numerics
decide its internals.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .. import dtypes as dt
from ..dtypes import DType
from ..errors import DeviceError, DTypeError, EmberError, UnsupportedError
from ..tensor import Tensor
from .policy import TABLES

F = TypeVar("F", bound=Callable[..., Any])

_LOWER_DTYPES = (dt.bfloat16, dt.float16)


class _Entry:
    """Autocast as set for one backend kind: the dtype, the op table, whether casts of parameters are cached."""

    __slots__ = ("dtype", "table", "cache_enabled")

    def __init__(self, dtype: DType, table: dict[str, str], cache_enabled: bool) -> None:
        self.dtype = dtype
        self.table = table
        self.cache_enabled = cache_enabled


class _State(threading.local):
    """This thread's autocast state: {backend kind: _Entry} or None when autocast is off for every kind."""

    def __init__(self) -> None:
        self.kinds: dict[str, _Entry] | None = None
        self.saved: list[dict[str, _Entry] | None] = []  # the state each active autocast block restores on exit
        self.depth = 0  # nesting of autocast blocks; the cast cache is cleared when the outermost one exits
        # id(parameter) -> (parameter, its cast): a float32 leaf requiring grad cast once per autocast region
        self.cache: dict[int, tuple[Tensor, Tensor]] = {}


STATE = _State()


def _resolve(device_type: Any) -> Any:
    """The Device whose backend kind autocast applies to: None is the default device; a string is parsed as
    ``ember.device`` parses it ("cpu" is the host device); only the kind counts (all indices and decorations)."""
    from ..device import Device, as_device, default_device

    if device_type is None:
        return default_device()
    if isinstance(device_type, Device):
        return device_type
    if isinstance(device_type, str):
        try:
            return as_device(device_type)
        except EmberError as exc:  # "cuda" without a CUDA backend: say which call and what would work
            from ..plugins.manager import registry

            kinds = ", ".join(["'cpu'", *(repr(k) for k in sorted(registry.backends))])
            raise DeviceError(f"autocast: device_type {device_type!r} is not usable here ({exc}); use one of "
                              f"{kinds}, or None for the default device") from None
    raise DTypeError(f"autocast: device_type must be a device string (such as 'cpu' or 'flex'), a Device or None, "
                     f"got {type(device_type).__name__}: {device_type!r}")


def _defaults(device: Any) -> tuple[DType, str]:
    """(default autocast dtype, op table name) of the device's backend: declared through register_backend_traits,
    else by the backend's kind (float16 and the GPU lists on a "gpu", bfloat16 and the CPU lists elsewhere; the
    other of the two where the backend lacks that one)."""
    from ..plugins.manager import registry
    from ..runtime import backend_traits

    traits = backend_traits().get(device.kind)
    table = traits.autocast_ops if traits is not None else None
    if table is None:
        table = "gpu" if registry.backend(device.kind).kind_of(device.index) == "gpu" else "cpu"
    dtype = traits.autocast_dtype if traits is not None and traits.autocast_dtype is not None else None
    if dtype is None:
        preferred, other = (dt.float16, dt.bfloat16) if table == "gpu" else (dt.bfloat16, dt.float16)
        dtype = preferred
        try:  # a backend without the kind's usual dtype (WebGPU has float16, no bfloat16) gets the other one
            if not device.supports_dtype(preferred) and device.supports_dtype(other):
                dtype = other
        except EmberError:  # no such device here: the policy is still the kind's
            pass
    return dt.as_dtype(dtype), table


class autocast:  # noqa: N801 - torch.autocast's name
    """Context manager and decorator: run the ops inside in mixed precision (``torch.autocast``).

    ``device_type``: the backend the setting applies to: ``"cpu"`` (the host device), a backend name (``"flex"``,
    ``"opencl"``), a :class:`~ember.Device`, or None for the default device. ``dtype``: ``ember.bfloat16`` or
    ``ember.float16`` (default: the backend's, see :mod:`ember.amp.policy`). ``enabled=False`` turns autocast off for
    the body (also inside an enclosing autocast). ``cache_enabled`` (default True) casts each float32 parameter once
    per autocast region instead of once per use.

    Differs from PyTorch in one way: a dtype the backend cannot compute in (or one other than bfloat16/float16) is
    a typed error naming the device, the dtype and the supported dtypes, where PyTorch warns and disables autocast.
    """

    def __init__(self, device_type: Any = None, dtype: Any = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if not isinstance(enabled, bool):
            raise DTypeError(f"autocast: enabled must be a bool, got {type(enabled).__name__}: {enabled!r}")
        device = _resolve(device_type)
        self.device = device.kind  # torch.autocast.device: the kind it applies to
        self.device_type = device.kind
        self._enabled = enabled
        self._cache_enabled = True if cache_enabled is None else bool(cache_enabled)
        default, table = _defaults(device)
        self.fast_dtype: DType = default if dtype is None else dt.as_dtype(dtype)
        self._table = TABLES[table]
        if not enabled:
            return
        if self.fast_dtype not in _LOWER_DTYPES:
            raise DTypeError(f"autocast: dtype must be bfloat16 or float16 (the lower-precision dtype matmuls and "
                             f"convolutions run in), got {self.fast_dtype.name} for device {device}")
        if not device.supports_dtype(self.fast_dtype):
            supported = ", ".join(sorted(d.name for d in device.stack.supported_dtypes if d.is_floating_point))
            other = [d for d in _LOWER_DTYPES if d is not self.fast_dtype and device.supports_dtype(d)]
            hint = (f"pass dtype=ember.{other[0].name}" if other else "run without autocast (enabled=False)")
            raise UnsupportedError(f"autocast: device {device} does not support dtype {self.fast_dtype.name} "
                                   f"(its floating dtypes: {supported}); {hint}")

    def __enter__(self) -> autocast:
        st = STATE
        prev = st.kinds
        st.saved.append(prev)  # per thread, so one instance may be entered in several threads and nested
        kinds = dict(prev) if prev else {}
        if self._enabled:
            kinds[self.device_type] = _Entry(self.fast_dtype, self._table, self._cache_enabled)
        else:
            kinds.pop(self.device_type, None)
        st.kinds = kinds or None
        st.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        st = STATE
        st.kinds = st.saved.pop()
        st.depth -= 1
        if st.depth == 0:
            st.cache.clear()  # PyTorch frees the cast parameters when the outermost autocast exits

    def __call__(self, fn: F) -> F:
        """Decorator form: each call of ``fn`` runs inside a fresh copy of this autocast."""
        args = (self.device_type, self.fast_dtype, self._enabled, self._cache_enabled)

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            with autocast(*args):
                return fn(*a, **kw)

        return wrapper  # type: ignore[return-value]


def is_autocast_enabled(device_type: Any = None) -> bool:
    """Whether autocast is on in this thread for ``device_type`` (None: the default device's backend)."""
    kinds = STATE.kinds
    if kinds is None:
        return False
    return _resolve(device_type).kind in kinds


def get_autocast_dtype(device_type: Any = None) -> DType:
    """The dtype autocast casts to on ``device_type``: the active one in this thread, else the backend's default."""
    device = _resolve(device_type)
    kinds = STATE.kinds
    if kinds is not None and device.kind in kinds:
        return kinds[device.kind].dtype
    return _defaults(device)[0]


def is_autocast_cache_enabled() -> bool:
    """Whether the innermost active autocast caches parameter casts (``torch.is_autocast_cache_enabled``)."""
    kinds = STATE.kinds
    return True if not kinds else all(e.cache_enabled for e in kinds.values())


def clear_autocast_cache() -> None:
    """Drop this thread's cached parameter casts (``torch.clear_autocast_cache``)."""
    STATE.cache.clear()


# -- applying the policy at an op's entry ---------------------------------------------------------------------------
#: keyword arguments autocast never casts: state the op updates in place (a cast copy would lose the update)
_IN_PLACE = frozenset({"running_mean", "running_var"})


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Tensor]:
    """Every tensor argument (also inside a list or tuple), in order: the first decides the device; all of them,
    in-place state included, decide the widest dtype."""
    out: list[Tensor] = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, Tensor))
    return out


def _map(args: tuple[Any, ...], kwargs: dict[str, Any], f: Callable[[Tensor], Tensor]
         ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def one(v: Any) -> Any:
        if isinstance(v, Tensor):
            return f(v)
        if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            return type(v)(f(x) if isinstance(x, Tensor) else x for x in v)
        return v

    return tuple(one(a) for a in args), {k: v if k in _IN_PLACE else one(v) for k, v in kwargs.items()}


def _lower_cast(entry: _Entry, kind: str) -> Callable[[Tensor], Tensor]:
    from ..autograd import is_grad_enabled

    target = entry.dtype
    cache = STATE.cache

    def cast(t: Tensor) -> Tensor:
        d = t._dtype
        if d is target or not d.is_floating_point or d is dt.float64 or t._device.kind != kind:
            return t
        # a float32 parameter (a leaf that requires grad) is cast once per region; only with grad recording on,
        # so a cast made under no_grad (no history) is never reused where gradients must flow
        cacheable = entry.cache_enabled and d is dt.float32 and is_grad_enabled() and t.requires_grad and t.is_leaf
        if cacheable:
            hit = cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
        out = t.to(target)
        if cacheable:
            cache[id(t)] = (t, out)  # keeping t alive keeps its id from being reused while cached
        return out

    return cast


def _fp32_cast(kind: str) -> Callable[[Tensor], Tensor]:
    def cast(t: Tensor) -> Tensor:
        return t.to(dt.float32) if t._dtype in _LOWER_DTYPES and t._device.kind == kind else t

    return cast


def _widest(tensors: list[Tensor]) -> DType | None:
    """The promoted floating dtype of tensors of more than one floating dtype; None when they agree."""
    floats = {t._dtype for t in tensors if t._dtype.is_floating_point}
    if len(floats) < 2:
        return None
    it = iter(floats)
    d = next(it)
    for o in it:
        d = dt.promote_types(d, o)
    return d


def run(op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the op ``fn`` under this thread's autocast: cast its tensor arguments by the policy of ``op`` on the
    first tensor's backend kind, then run it with autocast off for the ops it calls. The op's entry calls this only
    when ``STATE.kinds is not None`` (autocast is on somewhere), and ``fn`` is the op itself."""
    st = STATE
    kinds = st.kinds
    tensors = _tensors(args, kwargs)
    entry = kinds.get(tensors[0]._device.kind) if kinds and tensors else None
    restore: DType | None = None
    if entry is not None:
        kind = tensors[0]._device.kind
        rule = entry.table.get(op, "promote")
        if rule == "lower":
            args, kwargs = _map(args, kwargs, _lower_cast(entry, kind))
        elif rule == "fp32":
            args, kwargs = _map(args, kwargs, _fp32_cast(kind))
        elif rule == "banned":
            if any(t._dtype in _LOWER_DTYPES for t in tensors):
                raise UnsupportedError(
                    f"{op}: unsafe to autocast on device kind {kind!r} (float16/bfloat16 input can overflow its "
                    "log terms): use binary_cross_entropy_with_logits (BCEWithLogitsLoss), which fuses the sigmoid "
                    "and is safe, or run this op outside autocast on float32 input")
        elif rule == "input":
            first = tensors[0]._dtype
            if first.is_floating_point:
                args, kwargs = _map(args, kwargs, lambda t: t.to(first) if t._dtype.is_floating_point else t)
        else:  # "promote" and "keep"
            wide = _widest(tensors)
            if wide is not None:
                if rule == "keep" and tensors[0]._dtype.is_floating_point:
                    restore = tensors[0]._dtype
                args, kwargs = _map(args, kwargs, lambda t: t.to(wide) if t._dtype.is_floating_point else t)
    st.kinds = None
    try:
        out = fn(*args, **kwargs)
    finally:
        st.kinds = kinds
    if restore is not None and isinstance(out, Tensor) and out._dtype is not restore:
        out = out.to(restore)
    return out


__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "is_autocast_cache_enabled",
           "clear_autocast_cache", "run", "STATE"]
