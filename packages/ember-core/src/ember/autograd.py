"""Gradient API of core: grad mode, ``ember.autograd.grad`` and ``ember.autograd.backward``.

Recording and differentiating is the job of a *differentiable stack* -- the autodiff decorator plugin
(``Device.flex().autodiff()``). Core only defines the user-facing API (PyTorch's names) and forwards to the
stack; on a device without autodiff these raise :class:`~ember.errors.AutodiffError` saying how to fix it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from .errors import AutodiffError

F = TypeVar("F", bound=Callable[..., Any])


class _GradMode(threading.local):
    """The grad-mode switch read by differentiable stacks on every op (one attribute load).

    Per thread, as in PyTorch: ``no_grad()`` in one thread leaves every other thread recording, and a new thread
    starts with grad enabled (``threading.local`` runs ``__init__`` in each thread on its first use).
    """

    def __init__(self) -> None:
        self.enabled = True


GRAD_MODE = _GradMode()


def is_grad_enabled() -> bool:
    """Whether ops in the calling thread record gradient history (per thread; True in a new thread)."""
    return GRAD_MODE.enabled


class set_grad_enabled:
    """Context manager (and decorator) that sets this thread's grad mode to ``mode`` for its body."""

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)
        self.prev = GRAD_MODE.enabled
        GRAD_MODE.enabled = self.mode  # also usable as a plain function call, as in PyTorch

    def __enter__(self) -> set_grad_enabled:
        return self

    def __exit__(self, *exc: object) -> None:
        GRAD_MODE.enabled = self.prev


class _GradModeContext:
    _mode: bool

    def __enter__(self) -> _GradModeContext:
        self._prev = GRAD_MODE.enabled
        GRAD_MODE.enabled = self._mode
        return self

    def __exit__(self, *exc: object) -> None:
        GRAD_MODE.enabled = self._prev

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class no_grad(_GradModeContext):
    """Context manager and decorator: ops inside record no gradient history."""

    _mode = False


class enable_grad(_GradModeContext):
    """Context manager and decorator: re-enable recording inside a ``no_grad`` block."""

    _mode = True


class inference_mode(_GradModeContext):
    """``torch.inference_mode``: a context manager and decorator (``@inference_mode`` or ``@inference_mode()``)
    inside which ops record no gradient history. ``mode=False`` leaves grad mode as it is.

    In ember this is ``no_grad``: a stack records nothing it need not, so there is no faster mode to switch to, and
    tensors made inside are ordinary tensors (PyTorch's "inference tensors" refuse later use in autograd; these
    do not)."""

    def __new__(cls, mode: Any = True) -> Any:
        if callable(mode) and not isinstance(mode, bool):  # the bare decorator: @inference_mode
            return cls(True)(mode)
        return super().__new__(cls)

    def __init__(self, mode: bool = True) -> None:
        self._on = bool(mode)

    def __enter__(self) -> inference_mode:
        self._prev = GRAD_MODE.enabled
        if self._on:
            GRAD_MODE.enabled = False
        return self

    def __call__(self, fn: F) -> F:
        on = self._on

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(on):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _stack_of(op: str, tensors: Sequence[Any]) -> Any:
    dev = tensors[0]._device
    for t in tensors[1:]:
        if t._device is not dev:
            from .errors import DeviceError

            raise DeviceError(f"{op}: expected all tensors on the same device, got {dev} and {t._device}")
    stack = dev.stack
    if not getattr(stack, "differentiable", False):
        from .plugins.manager import missing_plugin_hint, registry

        spec = registry.differentiable_decorator()  # a declared capability: core names no decorator
        if spec is not None:
            from .device import is_host

            # in the user's own spelling: the device string they wrote ("cpu" for the host), plus the decorator
            where = "cpu" if is_host(dev) else str(dev)
            fix = (f"create them (and the model: model.to(device)) on a device that records gradients: "
                   f"ember.device({where + '+' + spec.name!r}), or ember.device({where!r}).{spec.name}()")
        else:
            fix = f"no installed decorator records gradients: {missing_plugin_hint('a decorator that does')}"
        raise AutodiffError(f"{op}: tensors on device {dev} record no gradients; {fix}")
    return stack


def _as_list(x: Any) -> list[Any]:
    from .tensor import Tensor

    if isinstance(x, Tensor):
        return [x]
    return list(x)


def backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool | None = None) -> None:
    """Accumulate d(tensors)/d(leaves) into the leaves' ``.grad`` (``torch.autograd.backward``)."""
    outs = _as_list(tensors)
    grads = [None] * len(outs) if grad_tensors is None else _as_list(grad_tensors)
    if len(grads) != len(outs):
        raise AutodiffError(f"backward: got {len(outs)} tensors but {len(grads)} gradients")
    stack = _stack_of("backward", outs)
    stack.backward([t._h for t in outs], _grad_handles("backward", outs, grads), bool(retain_graph))


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple[Any, ...]:
    """d(outputs)/d(inputs) as a tuple of tensors, without touching ``.grad`` (``torch.autograd.grad``)."""
    from .tensor import Tensor

    if create_graph:
        raise AutodiffError("grad: create_graph=True (higher-order gradients) is not supported yet")
    outs = _as_list(outputs)
    ins = _as_list(inputs)
    grads = [None] * len(outs) if grad_outputs is None else _as_list(grad_outputs)
    if len(grads) != len(outs):
        raise AutodiffError(f"grad: got {len(outs)} outputs but {len(grads)} grad_outputs")
    stack = _stack_of("grad", outs + ins)
    for t in ins:
        if not stack.requires_grad(t._h):
            raise AutodiffError(f"grad: an input of shape {t.shape} does not require grad (use requires_grad_())")
    hs = stack.grad([t._h for t in outs], [t._h for t in ins], _grad_handles("grad", outs, grads), bool(retain_graph))
    result = []
    for t, h in zip(ins, hs):
        if h is None and not allow_unused:
            raise AutodiffError(
                f"grad: one of the inputs (shape {t.shape}) was not used to compute the outputs; "
                "pass allow_unused=True to get None for it"
            )
        result.append(None if h is None else Tensor._make(h, t._dtype, t._device))
    return tuple(result)


def _grad_handles(op: str, outs: list[Any], grads: list[Any]) -> list[Any]:
    from .tensor import Tensor

    handles = []
    for t, g in zip(outs, grads):
        if g is None:
            if t.numel() != 1:
                raise AutodiffError(
                    f"{op}: grad can be implicitly created only for scalar outputs, got shape {t.shape}; "
                    "pass a gradient of the same shape"
                )
            handles.append(t._device.stack.full(t.shape, 1, t._dtype))  # the implicit seed: ones
            continue
        if not isinstance(g, Tensor):
            raise AutodiffError(f"{op}: gradient must be a Tensor, got {type(g).__name__}")
        if g.shape != t.shape:
            raise AutodiffError(f"{op}: gradient has shape {g.shape} but the output has shape {t.shape}")
        if g._device is not t._device:
            g = g.to(t._device)
        handles.append(g._h if g._dtype is t._dtype else g.to(t._dtype)._h)
    return handles


# -- hooks (Tensor.register_hook and module backward hooks): core's side of the stack's hook tables -----------------
def _hook_name(hook: Any) -> str:
    return getattr(hook, "__name__", type(hook).__name__)


class _Like(NamedTuple):
    """What a hook's gradient must match: the shape, dtype and device of the tensor it belongs to (kept instead of
    the tensor, so that a hook does not keep its tensor's memory alive)."""

    shape: tuple[int, ...]
    dtype: Any
    device: Any

    @classmethod
    def of(cls, t: Any) -> _Like:
        return cls(tuple(t.shape), t._dtype, t._device)


def _hook_result(op: str, name: str, out: Any, like: _Like) -> Any:
    """The handle of a hook's returned gradient, after PyTorch's checks: a Tensor with the shape, dtype and device
    of the gradient it replaces."""
    from .tensor import Tensor

    if not isinstance(out, Tensor):
        raise AutodiffError(f"{op}: hook {name!r} returned {type(out).__name__}; expected a Tensor or None")
    if tuple(out.shape) != like.shape:
        raise AutodiffError(f"{op}: hook {name!r} has changed the size of value (was {tuple(like.shape)}, got "
                            f"{tuple(out.shape)})")
    if out._dtype is not like.dtype:
        raise AutodiffError(f"{op}: hook {name!r} has changed the type of value (was {like.dtype}, got "
                            f"{out._dtype})")
    if out._device != like.device:
        raise AutodiffError(f"{op}: hook {name!r} has changed the device of value (was {like.device}, got "
                            f"{out._device})")
    return out._h


def register_tensor_hook(t: Any, hook: Callable[[Any], Any]) -> Any:
    """``Tensor.register_hook``: ``hook(grad) -> Tensor | None`` runs when ``t``'s gradient is computed; see there."""
    from .tensor import Tensor
    from .utils.hooks import RemovableHandle

    if not callable(hook):
        raise AutodiffError(f"register_hook: the hook must be callable, got {type(hook).__name__}")
    stack = _stack_of("register_hook", [t])
    table = stack.grad_hooks(t._h)
    name = _hook_name(hook)
    like = _Like.of(t)

    def on_grad(gh: Any) -> Any:
        out = hook(Tensor._make(gh, like.dtype, like.device))
        return None if out is None else _hook_result("register_hook", name, out, like)

    handle = RemovableHandle(table)
    table[handle.id] = on_grad
    return handle


def register_post_accumulate_hook(t: Any, hook: Callable[[Any], None]) -> Any:
    """``Tensor.register_post_accumulate_grad_hook``: ``hook(t)`` after backward accumulated into ``t.grad``."""
    from .utils.hooks import RemovableHandle

    if not callable(hook):
        raise AutodiffError(
            f"register_post_accumulate_grad_hook: the hook must be callable, got {type(hook).__name__}")
    stack = _stack_of("register_post_accumulate_grad_hook", [t])
    table = stack.post_accumulate_grad_hooks(t._h)
    name = _hook_name(hook)

    def on_accumulated() -> None:
        if hook(t) is not None:
            raise AutodiffError(f"register_post_accumulate_grad_hook: hook {name!r} returned a value; post "
                                "accumulate grad hooks must return None")

    handle = RemovableHandle(table)
    table[handle.id] = on_accumulated
    return handle


def hook_node(op: str, tensors: Sequence[Any], hook: Callable[[list[Any]], Sequence[Any] | None]) -> list[Any]:
    """Identity over ``tensors`` (one device, whose stack records gradients) recorded as one graph node; backward
    calls ``hook`` once with every output's gradient (Tensors, None where none arrived), and the gradients it returns
    (one Tensor or None per tensor; returning None keeps them) flow on to ``tensors``. Module backward hooks are
    built on it (:class:`ember.utils.hooks.BackwardHook`)."""
    from .tensor import Tensor

    stack = _stack_of(op, tensors)
    likes = [_Like.of(t) for t in tensors]

    def on_grads(ghs: list[Any]) -> list[Any] | None:
        gs = [None if gh is None else Tensor._make(gh, t.dtype, t.device) for gh, t in zip(ghs, likes)]
        out = hook(gs)
        if out is None:
            return None
        if len(out) != len(likes):
            raise AutodiffError(f"{op}: the hook returned {len(out)} gradients for {len(likes)} tensors")
        return [None if o is None else _hook_result(op, _hook_name(hook), o, t) for o, t in zip(out, likes)]

    hs = stack.hook_node([t._h for t in tensors], on_grads)
    return [Tensor._make(h, t._dtype, t._device) for h, t in zip(hs, tensors)]


__all__ = ["GRAD_MODE", "backward", "grad", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled"]
