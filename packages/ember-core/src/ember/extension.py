"""``ember.backend_extension``: custom ops with their own shape rule, kernels and gradient.

An extension op is declared once, by a user or by an extension plugin::

    @ember.backend_extension("mylib.linear_relu",
                             output=lambda x, w, b: ember.TensorSpec((*x.shape[:-1], w.shape[0]), x.dtype))
    def linear_relu(x, w, b):                 # the default composition, in ember ops: runs on every device
        return ember.relu(x @ w.T + b)

    @linear_relu.kernel("flex")               # a backend's own kernel, on that backend's handles
    def _(backend, x, w, b): ...

    @linear_relu.vjp                          # optional backward, in ember ops
    def _(ctx, grad): ...

What happens on a call (the op's path, see docs/extensions.md):

1. the arguments are checked (one device for all tensors) and ``output`` describes the results as
   :class:`TensorSpec` s before anything runs -- the op's shape rule;
2. :mod:`ember.dispatch` finds the kernel of the device's backend by walking the decorator chain to it. Without
   one, the composition runs on the whole stack (so it is fused and differentiated like any ember code);
3. with one, the stack's ``run_extension(call)`` runs it. Each decorator declares its policy (the default is a
   boundary: its inputs are computed, the inner stack runs the call); autodiff records one node when the op has a
   vjp and differentiates the composition when it has none; a ``fusable`` op on a lazily recording stack runs its
   composition so its ops are fused with their neighbours.

The ``register_ops`` plugin hook and ``ember.dispatch.call`` are thin uses of the same registry.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import dtypes as dt
from .device import Device
from .dtypes import DType
from .errors import DeviceError, DTypeError, EmberError, PluginError, ShapeError
from .tensor import Tensor

__all__ = ["ExtensionCall", "ExtensionContext", "ExtensionOp", "TensorSpec", "backend_extension", "get", "registered",
           "unregister"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor will be, without its data: its shape and dtype (``jax.ShapeDtypeStruct``'s role)."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(s.__index__()) for s in self.shape)
        except (TypeError, AttributeError):
            raise ShapeError(f"TensorSpec: shape must be a sequence of ints, got {self.shape!r}") from None
        if any(s < 0 for s in shape):
            raise ShapeError(f"TensorSpec: negative size in shape {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dt.as_dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, t: Tensor) -> TensorSpec:
        """The spec of an existing tensor."""
        # a tensor's shape and dtype are valid already: skip __post_init__'s checks (every extension call makes
        # one spec per tensor argument)
        spec = object.__new__(cls)
        object.__setattr__(spec, "shape", tuple(t._h.shape))
        object.__setattr__(spec, "dtype", t._dtype)
        return spec


Spec = TensorSpec | tuple[TensorSpec, ...]


class ExtensionContext:
    """What a vjp receives as ``ctx``: ``inputs`` (the call's positional arguments, tensors as tensors),
    ``outputs`` (a tuple of the output tensors), ``kwargs``, and any attribute the op's ``save`` function set."""

    def __init__(self, inputs: tuple[Any, ...], outputs: tuple[Tensor, ...], kwargs: dict[str, Any]) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.kwargs = kwargs


# Every extension call asks whether debug checks are on. ``os.environ.get`` encodes the key and decodes the value
# on each call (~0.5 us of a ~10 us call); os.environ's own dict of encoded bytes answers in one lookup and still
# sees every change made through os.environ (monkeypatch.setenv in tests, os.environ[...] = ... in user code).
_ENV_DATA: dict[Any, Any] | None = getattr(os.environ, "_data", None)
try:
    _DEBUG_KEY: Any = os.environ.encodekey("EMBER_DEBUG")  # type: ignore[attr-defined]
except AttributeError:  # another Python's os.environ: read it the documented way
    _ENV_DATA = None
_debug_seen: tuple[Any, bool] = (None, False)  # (raw value, whether it means on)


def _debug() -> bool:
    """Whether ``EMBER_DEBUG`` is set to something other than empty/0/false/no (read on every call)."""
    global _debug_seen
    if _ENV_DATA is None:
        return os.environ.get("EMBER_DEBUG", "") not in ("", "0", "false", "no")
    raw = _ENV_DATA.get(_DEBUG_KEY)
    if raw is None:
        return False
    seen, on = _debug_seen
    if raw is not seen:
        on = os.environ.get("EMBER_DEBUG", "") not in ("", "0", "false", "no")
        _debug_seen = (raw, on)
    return on


class ExtensionOp:
    """One registered extension op; calling it runs the op. Created by :func:`backend_extension`."""

    def __init__(self, name: str, fn: Callable[..., Any], output: Callable[..., Spec] | None, *,
                 fusable: bool = False, description: str = "", plugin: str = "") -> None:
        self.name = name
        self.composition = fn
        self._output = output
        self.fusable = fusable
        self.description = description or (fn.__doc__ or "").strip().split("\n")[0]
        self.plugin = plugin
        self.kernels: dict[str, Callable[..., Any]] = {}
        self._vjp: Callable[..., Any] | None = None
        self._save: Callable[..., Any] | None = None
        #: the outputs the vjp reads (indices; negative ones count from the end), None for all of them
        self.saved_outputs: tuple[int, ...] | None = None
        self.__name__ = name.rsplit(".", 1)[-1]
        self.__qualname__ = self.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        #: outputs as handles -> tensors; hook-registered ops keep that hook's dtype convention
        self._wrap: Callable[[Any, Any, Device, Sequence[Tensor]], Any] = _wrap_by_spec

    def __repr__(self) -> str:
        kernels = ", ".join(sorted(self.kernels)) or "none"
        return f"<ember extension op {self.name} (kernels: {kernels}; vjp: {'yes' if self._vjp else 'no'})>"

    # -- registration --------------------------------------------------------------------------------------
    def kernel(self, backend: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(backend, *args, **kwargs)`` as the op's kernel for the backend named ``backend`` (its
        device kind, e.g. ``"flex"``, ``"opencl"``). Tensor arguments arrive as that backend's handles; the
        kernel returns one handle, or a tuple of handles matching ``output``."""
        if not isinstance(backend, str) or not backend:
            raise PluginError(f"{self.name}.kernel: the backend name must be a non-empty string, got {backend!r}")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if not callable(fn):
                raise PluginError(f"{self.name}.kernel({backend!r}): expected a function, got {fn!r}")
            with _lock:
                self.kernels[backend] = fn
                _clear_resolution()
            return fn

        return register

    def vjp(self, fn: Callable[..., Any] | None = None, *, outputs: Sequence[int] | None = None) -> Any:
        """Register the backward: ``fn(ctx, *grads)`` returns one gradient per positional argument (None where
        an argument is no tensor or gets no gradient). Without one, autodiff differentiates the composition.

        ``@op.vjp(outputs=(1,))`` names the outputs the vjp reads from ``ctx.outputs`` (negative indices count from
        the end); the others are not kept for the backward (``ctx.outputs`` holds None there), so modifying them in
        place (``out += shortcut``, ``loss /= n``) stays legal, as for a PyTorch Function that saves only what it
        names. By default every output is kept and version-checked."""
        if outputs is not None:
            try:
                kept = tuple(int(i.__index__()) for i in outputs)
            except (TypeError, AttributeError):
                raise PluginError(f"{self.name}.vjp: outputs= must be a sequence of ints, got {outputs!r}") from None
        if fn is None:
            def register(f: Callable[..., Any]) -> Callable[..., Any]:
                return self.vjp(f, outputs=outputs)

            return register
        if not callable(fn):
            raise PluginError(f"{self.name}.vjp: expected a function, got {fn!r}")
        self._vjp = fn
        self.saved_outputs = kept if outputs is not None else None
        return fn

    def keeps_output(self, k: int, count: int) -> bool:
        """Whether output ``k`` of ``count`` is kept for the vjp (see :meth:`vjp`'s ``outputs``)."""
        kept = self.saved_outputs
        return kept is None or k in kept or k - count in kept

    def save(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn(ctx, inputs, outputs)``, run before the vjp to compute what it needs (PyTorch's
        ``setup_context``)."""
        self._save = fn
        return fn

    @property
    def has_vjp(self) -> bool:
        return self._vjp is not None

    # -- shape rule ----------------------------------------------------------------------------------------
    def output_spec(self, *args: Any, **kwargs: Any) -> Spec | None:
        """The outputs' :class:`TensorSpec` (or a tuple of them) for inputs given as TensorSpecs (tensors are
        accepted too), computed without running anything. None when the op declared no ``output``."""
        if self._output is None:
            return None
        specs = [TensorSpec.of(a) if isinstance(a, Tensor) else a for a in args]
        try:
            out = self._output(*specs, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a shape rule that fails names the op and the inputs
            shown = ", ".join(f"{s.shape}:{s.dtype}" if isinstance(s, TensorSpec) else repr(s) for s in specs)
            # an ember error keeps its type (a ShapeError from broadcasting stays one); anything else is a ShapeError
            kind = type(exc) if isinstance(exc, EmberError) else ShapeError
            detail = str(exc) if isinstance(exc, EmberError) else f"{type(exc).__name__}: {exc}"
            raise kind(f"{self.name}: the output spec failed for inputs ({shown}): {detail}") from exc
        if isinstance(out, TensorSpec) or (isinstance(out, tuple) and out
                                            and all(isinstance(o, TensorSpec) for o in out)):
            return out
        raise PluginError(f"{self.name}: output= must return a TensorSpec or a tuple of TensorSpecs, got {out!r}")

    # -- calling -------------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from . import dispatch

        positions = tuple(i for i, a in enumerate(args) if isinstance(a, Tensor))
        if not positions:
            raise DTypeError(f"{self.name}: an extension op needs at least one Tensor argument")
        dev = args[positions[0]]._device
        for i in positions[1:]:
            if args[i]._device is not dev:
                raise DeviceError(f"{self.name}: expected all tensors on the same device, got {dev} and "
                                  f"{args[i]._device} (move one with .to(device))")
        spec = self.output_spec(*args, **kwargs)
        stack = dev.stack
        kernel = dispatch.extension_kernel(self, stack)
        if kernel is None:
            out = self.composition(*args, **kwargs)
            if spec is not None and _debug():
                self._check_tensors(out, spec)
            return out
        call = ExtensionCall(self, dev, stack, tuple(a._h if isinstance(a, Tensor) else a for a in args), kwargs,
                             kernel, spec, {i: args[i]._dtype for i in positions})
        inputs = [args[i] for i in positions]
        return self._wrap(stack.run_extension(call), spec, dev, inputs)

    def _check_tensors(self, out: Any, spec: Spec) -> None:
        outs = out if isinstance(out, tuple) else (out,)
        specs = spec if isinstance(spec, tuple) else (spec,)
        _check(self.name, "the composition", [(o.shape, o.dtype) for o in outs], specs)

    # -- gradients -----------------------------------------------------------------------------------------
    def backward(self, inputs: tuple[Any, ...], outputs: tuple[Tensor, ...], grads: tuple[Tensor | None, ...],
                 kwargs: dict[str, Any]) -> tuple[Tensor | None, ...]:
        """Run the vjp: one gradient per positional input (checked against the input's shape)."""
        if self._vjp is None:
            raise PluginError(f"{self.name}: the op has no vjp")
        ctx = ExtensionContext(inputs, outputs, kwargs)
        if self._save is not None:
            self._save(ctx, inputs, outputs)
        res = self._vjp(ctx, *grads)
        res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        if len(res) != len(inputs):
            raise PluginError(f"{self.name}: the vjp returned {len(res)} gradients for {len(inputs)} inputs "
                              "(return one per positional argument, None where there is none)")
        out: list[Tensor | None] = []
        for i, (g, x) in enumerate(zip(res, inputs)):
            if g is not None:
                if not isinstance(x, Tensor):
                    raise PluginError(f"{self.name}: the vjp returned a gradient for argument {i}, which is no "
                                      "tensor")
                g = self._fit_grad(i, g, x)
            out.append(g)
        return tuple(out)

    def _fit_grad(self, i: int, g: Any, x: Tensor) -> Tensor:
        """g with x's shape: a gradient of the broadcast shape is summed down to x's (as PyTorch's autograd does
        for a custom Function); any other shape is an error naming the op."""
        if isinstance(g, Tensor) and g.shape != x.shape:
            lead = g.ndim - x.ndim
            if lead >= 0 and all(n in (1, m) for n, m in zip(x.shape, g.shape[lead:])):
                dims = tuple(range(lead)) + tuple(lead + d for d, n in enumerate(x.shape)
                                                  if n == 1 and g.shape[lead + d] != 1)
                return g.sum(dim=dims, keepdim=True).reshape(x.shape) if dims else g.reshape(x.shape)
        if not isinstance(g, Tensor) or g.shape != x.shape:
            got = g.shape if isinstance(g, Tensor) else type(g).__name__
            raise ShapeError(f"{self.name}: the vjp's gradient for argument {i} has shape {got}, expected the "
                             f"input's {x.shape} (or one it broadcasts to)")
        return g


class ExtensionCall:
    """One call of an extension op on its way down a stack (what ``run_extension`` receives).

    ``args`` hold the handles of ``stack`` (the stack whose ``run_extension`` got the call); a decorator passing the
    call on to its inner stack makes the inner one with :meth:`with_args`.
    """

    __slots__ = ("op", "device", "stack", "args", "kwargs", "kernel", "spec", "dtypes")

    def __init__(self, op: ExtensionOp, device: Device, stack: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 kernel: Callable[..., Any], spec: Spec | None, dtypes: dict[int, DType]) -> None:
        self.op = op
        self.device = device
        self.stack = stack
        self.args = args
        self.kwargs = kwargs
        self.kernel = kernel
        self.spec = spec
        #: the dtype of each tensor argument, by position
        self.dtypes = dtypes

    @property
    def tensor_positions(self) -> tuple[int, ...]:
        return tuple(self.dtypes)

    def with_args(self, args: Sequence[Any], stack: Any = None) -> ExtensionCall:
        """The same call with other handles (those of ``stack``, the inner stack, when given)."""
        return ExtensionCall(self.op, self.device, self.stack if stack is None else stack, tuple(args), self.kwargs,
                             self.kernel, self.spec, self.dtypes)

    def run_kernel(self, backend: Any) -> Any:
        """Run the kernel on ``backend`` (the stack's base backend; ``args`` are its handles). In debug mode
        (``EMBER_DEBUG=1``) the outputs are checked against the op's spec."""
        out = self.kernel(backend, *self.args, **self.kwargs)
        if self.spec is not None and _debug():
            outs = out if isinstance(out, tuple) else (out,)
            specs = self.spec if isinstance(self.spec, tuple) else (self.spec,)
            _check(self.op.name, f"the {backend.name!r} kernel",
                   [(tuple(h.shape), backend.dtype_of(h)) for h in outs], specs)
        return out

    def input_tensors(self) -> tuple[Any, ...]:
        """The positional arguments with this call's handles as tensors on :attr:`device` (valid for the
        device's own stack, the outermost)."""
        if self.stack is not self.device.stack:
            raise PluginError(f"{self.op.name}: input_tensors()/run_composition() need the handles of the device's "
                              "own stack (the outermost decorator), not an inner one")
        return tuple(Tensor._make(a, self.dtypes[i], self.device) if i in self.dtypes else a
                     for i, a in enumerate(self.args))

    def run_composition(self) -> Any:
        """Run the default composition on :attr:`device`; returns the output handles of the device's stack."""
        out = self.op.composition(*self.input_tensors(), **self.kwargs)
        if isinstance(out, tuple):
            return tuple(o._h for o in out)
        return out._h

    def backward(self, inputs: tuple[Any, ...], outputs: tuple[Tensor, ...],
                 grads: tuple[Tensor | None, ...]) -> tuple[Tensor | None, ...]:
        """The op's vjp (see :meth:`ExtensionOp.backward`)."""
        return self.op.backward(inputs, outputs, grads, self.kwargs)


def _check(name: str, what: str, got: list[tuple[tuple[int, ...], DType]], specs: Sequence[TensorSpec]) -> None:
    if len(got) != len(specs):
        raise ShapeError(f"{name}: {what} returned {len(got)} outputs, the output spec describes {len(specs)}")
    for i, ((shape, dtype), s) in enumerate(zip(got, specs)):
        if shape != s.shape or dtype != s.dtype:
            raise ShapeError(f"{name}: {what} returned output {i} of shape {shape} and dtype {dtype}, the output "
                             f"spec says {s.shape} and {s.dtype}")


def _wrap_by_spec(out: Any, spec: Spec | None, dev: Device, inputs: Sequence[Tensor]) -> Any:
    if spec is None:  # no shape rule declared: the stack knows each result's dtype
        stack = dev.stack
        if isinstance(out, tuple):
            return tuple(Tensor._make(h, stack.dtype_of(h), dev) for h in out)
        return Tensor._make(out, stack.dtype_of(out), dev)
    if isinstance(spec, tuple):
        if not isinstance(out, tuple) or len(out) != len(spec):
            raise ShapeError(f"kernel returned {type(out).__name__}, the output spec describes {len(spec)} outputs")
        return tuple(Tensor._make(h, s.dtype, dev) for h, s in zip(out, spec))
    return Tensor._make(out, spec.dtype, dev)


# ----------------------------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------------------------
_lock = threading.RLock()
_ops: dict[str, ExtensionOp] = {}


def _clear_resolution() -> None:
    from . import dispatch

    dispatch.clear_cache()


def get(name: str) -> ExtensionOp | None:
    """The extension op registered as ``name`` (by :func:`backend_extension` or a plugin's ``register_ops``)."""
    op = _ops.get(name)
    if op is None:
        from . import dispatch

        op = dispatch.hook_op(name)
    return op


def registered() -> dict[str, ExtensionOp]:
    """Every op registered with :func:`backend_extension`, by name."""
    with _lock:
        return dict(_ops)


def backend_extension(name: str, *, output: Callable[..., Spec] | None, fusable: bool = False,
                      method: str | None = None, publish: bool = True,
                      description: str = "") -> Callable[[Callable[..., Any]], ExtensionOp]:
    """Declare an extension op; decorates its default composition (written in ember ops).

    Args:
        name: ``"namespace.fn"`` (published as ``ember.namespace.fn`` unless ``publish=False``) or a plain name.
        output: the shape rule: gets a :class:`TensorSpec` per tensor argument (other arguments as given) and
            returns the output's TensorSpec (or a tuple), without running anything. Lazy decorators and tools use
            it (``op.output_spec(...)``); raise an ember error here to refuse bad inputs before any kernel runs.
        fusable: on a stack that records lazily (fusion), record the composition's ops instead of running a
            kernel as a boundary.
        method: also publish the op as this Tensor method (``x.linear_relu(w, b)``).
        description: one line for ``ember info`` (default: the composition's first docstring line).

    Returns:
        the :class:`ExtensionOp`; register kernels with ``op.kernel("flex")``, a backward with ``op.vjp``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PluginError(f"backend_extension: the op name must be a dotted Python identifier such as "
                          f"'mylib.linear_relu', got {name!r}")
    if output is not None and not callable(output):
        raise PluginError(f"backend_extension({name!r}): output= must be a function returning TensorSpecs")

    def register(fn: Callable[..., Any]) -> ExtensionOp:
        if not callable(fn):
            raise PluginError(f"backend_extension({name!r}) decorates the op's default composition (a function)")
        op = ExtensionOp(name, fn, output, fusable=fusable, description=description,
                         plugin=getattr(fn, "__module__", "") or "")
        with _lock:
            old = _ops.get(name)
            if old is not None and _origin(old.composition) != _origin(fn):
                raise PluginError(f"backend_extension: an op named {name!r} is already registered by "
                                  f"{_origin(old.composition)}")
            # check every name the op takes before taking any, so a refused registration leaves nothing behind
            target = _namespace(name, replacing=old) if publish and "." in name else None
            if method is not None:
                _check_method(name, method, replacing=old)
            _ops[name] = op  # the same function registered again (a module reloaded) replaces its op
            if target is not None:
                setattr(target, name.rsplit(".", 1)[1], op)
            if method is not None:
                _publish_method(method, op)
            _clear_resolution()
        return op

    return register


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


def _namespace(name: str, replacing: ExtensionOp | None) -> Any:
    """The module ``ember.a.b`` that will hold ``ember.a.b.fn`` (created when missing: ``ember.linalg`` exists,
    ``ember.mylib`` does not), after checking ``fn`` is free there."""
    import ember

    *path, fn_name = name.split(".")
    mod: Any = ember
    for part in path:
        child = getattr(mod, part, None)
        if child is None:
            child = types.ModuleType(f"{mod.__name__}.{part}", f"Extension ops published under {part!r}.")
            setattr(mod, part, child)
            sys.modules[child.__name__] = child
        elif not isinstance(child, types.ModuleType):
            raise PluginError(f"backend_extension({name!r}): ember.{'.'.join(path)} exists and is no namespace")
        mod = child
    existing = getattr(mod, fn_name, None)
    if existing is not None and existing is not replacing:
        raise PluginError(f"backend_extension({name!r}): {mod.__name__}.{fn_name} already exists")
    return mod


def _check_method(name: str, method: str, replacing: ExtensionOp | None) -> None:
    if not isinstance(method, str) or not method.isidentifier() or method.startswith("_"):
        raise PluginError(f"backend_extension({name!r}): method={method!r} must be a public identifier")
    existing = getattr(Tensor, method, None)
    if existing is not None and (replacing is None or getattr(existing, "__wrapped__", None) is not replacing):
        raise PluginError(f"backend_extension({name!r}): Tensor.{method} already exists")


def _publish_method(method: str, op: ExtensionOp) -> None:
    def tensor_method(self: Tensor, *args: Any, **kwargs: Any) -> Any:
        return op(self, *args, **kwargs)

    tensor_method.__name__ = method
    tensor_method.__doc__ = op.__doc__
    tensor_method.__wrapped__ = op  # type: ignore[attr-defined]
    setattr(Tensor, method, tensor_method)


def unregister(name: str) -> None:
    """Remove the op registered as ``name`` with :func:`backend_extension`, and what it published (a notebook
    redefining an op, a test cleaning up); a KeyError names an unknown op."""
    import ember

    with _lock:
        op = _ops.pop(name)
        *path, fn_name = name.split(".")
        mod: Any = ember
        for part in path:
            mod = getattr(mod, part, None)
        if path and mod is not None and getattr(mod, fn_name, None) is op:
            delattr(mod, fn_name)
        for attr, value in list(vars(Tensor).items()):
            if getattr(value, "__wrapped__", None) is op:
                delattr(Tensor, attr)
        _clear_resolution()
