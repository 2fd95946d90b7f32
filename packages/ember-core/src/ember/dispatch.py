"""Dispatch: finding an op's implementation for a device's resolved stack.

Built-in ops are methods of the stack (``stack.conv(...)``): a backend overrides the method or inherits the
default composition from :class:`ember.backend.Backend`, so dispatching them is one attribute lookup.

Extension ops registered by plugins through the ``register_ops`` hook live in a table. The first call of an
extension op on a stack picks the implementation -- the one registered for the stack's backend name, else
the default composition -- and caches it per (stack, op), so later calls are one dict lookup.
"""

from __future__ import annotations

from typing import Any

from .errors import DTypeError, UnsupportedError
from .tensor import Tensor

_resolved: dict[tuple[int, str], Any] = {}


def _impl(stack: Any, name: str) -> Any:
    key = (id(stack), name)
    fn = _resolved.get(key)
    if fn is None:
        from .plugins.manager import registry

        registry.ensure_loaded()
        spec = registry.ops.get(name)
        if spec is None:
            raise UnsupportedError(
                f"no extension op named {name!r} is registered (registered: {sorted(registry.ops) or 'none'}); "
                "is the plugin that provides it installed?"
            )
        fn = spec.backends.get(getattr(stack, "name", ""))
        if fn is None:
            fn = _boundary_impl(spec, stack) or spec.default
        _resolved[key] = fn
    return fn


def _boundary_impl(spec: Any, stack: Any) -> Any:
    """A decorator that defines ``extension_boundary`` (fusion) runs an inner backend's own implementation of
    an extension op on realized values, unless the op declared itself ``fusable`` (its default composition is
    then recorded like any other ops)."""
    if spec.fusable:
        return None
    wrap = getattr(stack, "extension_boundary", None)
    inner = getattr(stack, "inner", None)
    if wrap is None or inner is None:
        return None
    fn = spec.backends.get(getattr(inner, "name", ""))
    return None if fn is None else wrap(fn)


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Run the extension op ``name`` on its tensor arguments' device.

    Tensor arguments are passed to the implementation as handles; handles it returns come back as tensors
    with the dtype of the first tensor argument (an implementation may return ``(handle, dtype)`` pairs to
    choose another dtype).
    """
    tensors = [a for a in args if isinstance(a, Tensor)]
    if not tensors:
        raise DTypeError(f"{name}: an extension op needs at least one Tensor argument")
    dev = tensors[0]._device
    for t in tensors[1:]:
        if t._device is not dev:
            from .errors import DeviceError

            raise DeviceError(f"{name}: expected all tensors on the same device, got {dev} and {t._device}")
    stack = dev.stack
    fn = _impl(stack, name)
    handles = [a._h if isinstance(a, Tensor) else a for a in args]
    out = fn(stack, *handles, **kwargs)
    return _wrap(out, tensors[0]._dtype, dev)


def _wrap(out: Any, dtype: Any, dev: Any) -> Any:
    from .dtypes import DType

    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], DType):
        return Tensor._make(out[0], out[1], dev)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap(o, dtype, dev) for o in out)
    if out is None or isinstance(out, (bool, int, float)):
        return out
    return Tensor._make(out, dtype, dev)


def clear_cache() -> None:
    """Forget resolved implementations (after registering plugins at run time)."""
    _resolved.clear()
