"""Dispatch: finding an op's implementation for a device.

A device resolves once, here (:func:`resolve_stack`), to a stack object: its backend wrapped by its decorators,
``Autodiff(Fusion(Flex))``. Built-in ops are methods of the stack (``stack.conv(...)``): a backend overrides the
method or inherits the default composition from :class:`ember.backend.Backend`, and each decorator declares how
it treats the method (:class:`ember.decorator.Policy`), so dispatching a built-in op is one attribute lookup.

Extension ops (:func:`ember.backend_extension`, or a plugin's ``register_ops`` hook) are resolved here: the kernel
for a stack is the one registered for the backend at the bottom of its decorator chain, found once per
(op, stack) by walking the chain and cached, so later calls are one dict lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .errors import DeviceError, PluginError, UnsupportedError
from .tensor import Tensor

if TYPE_CHECKING:
    from .device import Device
    from .extension import ExtensionOp

# Resolved backends are shared by every device with the same (kind, index, options): decorators wrap the same
# inner backend, so Device.flex() and Device.flex().autodiff() see one memory pool and one random stream. The
# backend under its automatic decorators is cached too, keyed by those decorators' settings.
_backend_cache: dict[tuple[Any, ...], Any] = {}
_lock = threading.RLock()
_resolved: dict[tuple[int, int], Any] = {}
#: ops registered through the register_ops hook, as extension ops (rebuilt when the hook's spec changes)
_hook_ops: dict[str, tuple[Any, ExtensionOp]] = {}


def resolve_stack(device: Device) -> Any:
    """Build ``device``'s stack: the registered backend for its kind, index and options (one instance shared by
    all its decorations), under the automatic decorators (fusion) as the device's settings and their switches say,
    under the decorators the device names, in order. ``Device.stack`` calls this once per device."""
    from .device import _unknown_decorator
    from .plugins.manager import registry

    with _lock:
        bkey = (device.kind, device.index, device.options)
        backend = _backend_cache.get(bkey)
        if backend is None:
            spec = registry.backend(device.kind)
            try:
                backend = spec.factory(device.index, **dict(device.options))
            except Exception as exc:
                raise DeviceError(f"could not create device {device}: {type(exc).__name__}: {exc}") from exc
            _backend_cache[bkey] = backend
        named = dict(device.decorators)
        # each automatic decorator with this device's settings and whether it is on (part of the key, so a global
        # switch turned off later is not served the stack built while it was on); one the device does not name
        # applies only where it says it does (applies_to: flex declines fusion)
        autos = tuple((d.name, named.get(d.name, ()),
                       d.on_by_default() and (d.name in named or d.applies_unnamed(backend)))
                      for d in registry.automatic_decorators())
        # the automatically decorated backend is shared too: flex+fusion and flex+fusion+autodiff use one stack
        stack = _backend_cache.get((*bkey, autos))
        if stack is None:
            stack = backend
            for name, opts, on in autos:
                kw = dict(opts)
                if on and kw.pop("enabled", True) is not False:
                    stack = registry.decorator(name).factory(stack, **kw)
            _backend_cache[(*bkey, autos)] = stack
        for name, opts in device.decorators:
            deco = registry.decorator(name)
            if deco is None:
                raise PluginError(f"cannot resolve device {device}: {_unknown_decorator(name)}")
            if not deco.automatic:
                stack = deco.factory(stack, **dict(opts))
        return stack


def stack_chain(stack: Any) -> Iterator[Any]:
    """The stack and every stack under it, outermost first, down to the backend (decorators have ``inner``)."""
    while stack is not None:
        yield stack
        stack = getattr(stack, "inner", None)


def extension_kernel(op: ExtensionOp, stack: Any) -> Any:
    """The kernel of ``op`` to run on ``stack``, or None when the composition runs instead: the backend at the
    bottom of the chain has no kernel for it, or the op is ``fusable`` and a decorator records lazily."""
    key = (id(op), id(stack))
    try:
        return _resolved[key]
    except KeyError:
        pass
    chain = list(stack_chain(stack))
    base = chain[-1]
    kernel = op.kernels.get(base.name)
    if kernel is None and hasattr(base, "extension_kernel"):
        kernel = base.extension_kernel(op)
    if kernel is not None and op.fusable and any(getattr(s, "records_lazily", False) for s in chain):
        kernel = None
    _resolved[key] = kernel
    return kernel


def hook_op(name: str) -> ExtensionOp | None:
    """The op a plugin registered as ``name`` through the ``register_ops`` hook, as an extension op: its default
    (written on stack handles) is the composition, its per-backend functions are the kernels."""
    from .plugins.manager import registry

    registry.ensure_loaded()
    spec = registry.ops.get(name)
    if spec is None:
        return None
    cached = _hook_ops.get(name)
    if cached is not None and cached[0] is spec:
        return cached[1]
    from .extension import ExtensionOp

    def composition(*args: Any, **kwargs: Any) -> Any:
        first = next(a for a in args if isinstance(a, Tensor))
        dev = first._device
        out = spec.default(dev.stack, *(a._h if isinstance(a, Tensor) else a for a in args), **kwargs)
        return _hook_wrap(out, None, dev, [first])

    op = ExtensionOp(name, composition, None, fusable=spec.fusable, description=spec.description,
                     plugin=spec.plugin)
    op.kernels.update(spec.backends)
    op._wrap = _hook_wrap
    _hook_ops[name] = (spec, op)
    return op


def _hook_wrap(out: Any, _spec: Any, dev: Any, inputs: list[Tensor]) -> Any:
    """The register_ops convention: handles come back with the first tensor argument's dtype, unless the
    implementation returns ``(handle, dtype)`` pairs."""
    from .dtypes import DType

    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], DType):
        return Tensor._make(out[0], out[1], dev)
    if isinstance(out, (tuple, list)):
        return type(out)(_hook_wrap(o, None, dev, inputs) for o in out)
    if out is None or isinstance(out, (bool, int, float)):
        return out
    return Tensor._make(out, inputs[0]._dtype, dev)


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Run the extension op ``name`` on its tensor arguments' device (ops are also callable directly)."""
    from . import extension

    op = extension.get(name)
    if op is None:
        from .plugins.manager import registry

        known = sorted({*extension.registered(), *registry.ops}) or "none"
        raise UnsupportedError(f"no extension op named {name!r} is registered (registered: {known}); is the "
                               "plugin that provides it installed?")
    return op(*args, **kwargs)


def clear_cache() -> None:
    """Forget resolved implementations (after registering kernels or plugins at run time)."""
    _resolved.clear()
    _hook_ops.clear()
