"""``nn.Module`` and ``nn.Parameter``: PyTorch's module system over ember tensors.

Parameters, buffers and submodules are registered by attribute assignment and found again by stable dotted
paths (``named_parameters()``, ``state_dict()``). ``module.to(device)`` moves parameters *in place* -- each
``Parameter`` object keeps its identity, as in PyTorch, so an optimizer built before the move still updates the
model.

Hooks are PyTorch's: ``register_forward_pre_hook``, ``register_forward_hook``, ``register_full_backward_pre_hook``,
``register_full_backward_hook`` and the global ``register_module_*_hook`` functions, each returning an
:class:`ember.utils.hooks.RemovableHandle`. A module without hooks pays one flag check per call for them.
"""

from __future__ import annotations

import threading
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from ..autograd import no_grad
from ..errors import DTypeError, EmberError, ShapeError
from ..tensor import Tensor
from ..utils.hooks import BackwardHook, RemovableHandle


class Parameter(Tensor):
    """A tensor that is a module's learnable parameter: registered automatically, requires grad by default.

    On a device without autodiff the flag is only recorded (``backward()`` then explains how to get a
    differentiable device).
    """

    __slots__ = ()

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> Parameter:
        from ..ops.creation import empty

        if data is None:
            data = empty(0)
        if not isinstance(data, Tensor):
            raise DTypeError(f"Parameter: expected a Tensor, got {type(data).__name__}")
        p = object.__new__(cls)
        p._h = data.detach()._h
        p._dtype = data._dtype
        p._device = data._device
        if requires_grad and data._dtype.is_floating_point:
            p.requires_grad_(True)
        return p

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        pass  # everything happens in __new__ (Tensor.__init__ would rebuild from data)

    def _rebind(self, t: Tensor) -> None:
        """Take t's data (another device or dtype) while staying the same object."""
        if t is self:  # nothing to move or cast: keep the handle, and with it the gradient and the tensor hooks
            return
        requires_grad = self.requires_grad
        self._h, self._dtype, self._device = t.detach()._h, t._dtype, t._device
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __reduce__(self) -> Any:
        return (_rebuild_parameter, (Tensor.__reduce__(self), self.requires_grad))


def _rebuild_parameter(tensor_reduce: Any, requires_grad: bool) -> Parameter:
    build, args = tensor_reduce
    return Parameter(build(*args), requires_grad)


_local = threading.local()


def _running() -> list[Module]:
    """Modules whose forward is running in this thread, outermost first."""
    calls = getattr(_local, "calls", None)
    if calls is None:
        calls = _local.calls = []
    return calls


def _name_module_path(exc: EmberError, module: Module, calls: list[Module]) -> None:
    """Prefix an error raised inside a submodule with that submodule's dotted path in the outermost model
    (``Net.encoder.0 (Linear): ...``), once, where it was raised. Costs nothing unless an error occurs."""
    if getattr(exc, "_ember_module_path", None) is not None or len(calls) < 2 or not exc.args:
        return
    root = calls[0]
    for name, m in root.named_modules():
        if m is module:
            exc._ember_module_path = name  # type: ignore[attr-defined]
            exc.args = (f"{type(root).__name__}.{name} ({type(module).__name__}): {exc.args[0]}", *exc.args[1:])
            return


class _HookState:
    """Whether any module hook (a module's own or a global one) was ever registered in this process: until one is,
    ``Module.__call__`` skips looking at hook tables at all."""

    registered = False


_hooks = _HookState()


def _new_hook(table: OrderedDict[int, Any], hook: Callable[..., Any], extra_dict: Any = None) -> RemovableHandle:
    """Store ``hook`` in ``table`` under a new handle's id and return the handle."""
    if not callable(hook):
        raise EmberError(f"module hooks must be callable, got {type(hook).__name__}")
    _hooks.registered = True
    handle = RemovableHandle(table, extra_dict=extra_dict)
    table[handle.id] = hook
    return handle


# -- global module hooks (torch.nn.modules.module.register_module_*_hook): run before every module's own ---------
_global_forward_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
_global_forward_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
_global_forward_hooks_with_kwargs: OrderedDict[int, bool] = OrderedDict()
_global_forward_hooks_always_called: OrderedDict[int, bool] = OrderedDict()
_global_backward_pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
_global_backward_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()


def register_module_forward_pre_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """A forward pre-hook of every module (``hook(module, args) -> None or new args``), run before the modules' own
    (``torch.nn.modules.module.register_module_forward_pre_hook``; meant for debugging and profiling)."""
    return _new_hook(_global_forward_pre_hooks, hook)


def register_module_forward_hook(hook: Callable[..., Any], *, with_kwargs: bool = False,
                                 always_call: bool = False) -> RemovableHandle:
    """A forward hook of every module (``hook(module, args, output)``, or ``hook(module, args, kwargs, output)``
    with ``with_kwargs``; a value it returns replaces the output), run before the modules' own; ``always_call``
    runs it even when forward raises (``torch.nn.modules.module.register_module_forward_hook``)."""
    handle = _new_hook(_global_forward_hooks, hook,
                       [_global_forward_hooks_with_kwargs, _global_forward_hooks_always_called])
    if with_kwargs:
        _global_forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    return handle


def register_module_full_backward_pre_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """A backward pre-hook of every module (see :meth:`Module.register_full_backward_pre_hook`), run before the
    modules' own."""
    return _new_hook(_global_backward_pre_hooks, hook)


def register_module_full_backward_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """A full backward hook of every module (see :meth:`Module.register_full_backward_hook`), run before the
    modules' own."""
    return _new_hook(_global_backward_hooks, hook)


#: the hook tables of a module without hooks: read-only and empty (a module's own tables are created by the first
#: register_*_hook call, so modules pay nothing for hooks they do not have)
_NO_HOOKS: Mapping[int, Any] = types.MappingProxyType({})


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict`` did not match: keys the module expected and keys it did not know."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of every layer and model. Subclasses set attributes in ``__init__`` and define ``forward``."""

    training: bool
    _parameters: dict[str, Parameter | None]
    _buffers: dict[str, Tensor | None]
    _non_persistent: set[str]
    _modules: dict[str, Module | None]
    # hook tables (torch's attribute names), replaced by an OrderedDict of the module's own on first registration
    _forward_pre_hooks: Mapping[int, Callable[..., Any]] = _NO_HOOKS
    _forward_pre_hooks_with_kwargs: Mapping[int, bool] = _NO_HOOKS
    _forward_hooks: Mapping[int, Callable[..., Any]] = _NO_HOOKS
    _forward_hooks_with_kwargs: Mapping[int, bool] = _NO_HOOKS
    _forward_hooks_always_called: Mapping[int, bool] = _NO_HOOKS
    _backward_pre_hooks: Mapping[int, Callable[..., Any]] = _NO_HOOKS
    _backward_hooks: Mapping[int, Callable[..., Any]] = _NO_HOOKS

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise EmberError(f"{type(self).__name__} has no forward(); subclasses of nn.Module must define it")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # one global load on the hook-free path; the tables are looked at only once some hook was ever registered
        if _hooks.registered and (
                self._forward_pre_hooks or self._forward_hooks or self._backward_hooks or self._backward_pre_hooks
                or _global_forward_pre_hooks or _global_forward_hooks or _global_backward_hooks
                or _global_backward_pre_hooks):
            return self._call_with_hooks(args, kwargs)
        calls = _running()
        calls.append(self)
        try:
            return self.forward(*args, **kwargs)
        except EmberError as exc:
            _name_module_path(exc, self, calls)
            raise
        finally:
            calls.pop()

    def _call_with_hooks(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``__call__`` of a module with hooks (or while global hooks exist), in PyTorch's order: global then own
        forward pre-hooks; backward hooks set up on the inputs; forward; global then own forward hooks; backward
        hooks set up on the outputs. When anything raises, the ``always_call`` forward hooks not run yet run (their
        own errors become warnings) before the error propagates."""
        calls = _running()
        calls.append(self)
        result: Any = None
        called_always: set[int] = set()
        try:
            try:
                for hook_id, hook in (*_global_forward_pre_hooks.items(), *self._forward_pre_hooks.items()):
                    if hook_id in self._forward_pre_hooks_with_kwargs:
                        res = hook(self, args, kwargs)
                        if res is not None:
                            if not (isinstance(res, tuple) and len(res) == 2):
                                raise EmberError(f"{type(self).__name__}: a forward pre-hook with_kwargs must return "
                                                 f"None or a tuple of (new_args, new_kwargs), but got {res!r}")
                            args, kwargs = res
                    else:
                        res = hook(self, args)
                        if res is not None:
                            args = res if isinstance(res, tuple) else (res,)
                backward_hooks = [*_global_backward_hooks.values(), *self._backward_hooks.values()]
                backward_pre_hooks = [*_global_backward_pre_hooks.values(), *self._backward_pre_hooks.values()]
                bw_hook = None
                if backward_hooks or backward_pre_hooks:
                    bw_hook = BackwardHook(self, backward_hooks, backward_pre_hooks)
                    args = bw_hook.setup_input_hook(args)
                result = self.forward(*args, **kwargs)
                for hook_id, hook in (*_global_forward_hooks.items(), *self._forward_hooks.items()):
                    if hook_id in self._forward_hooks_always_called or hook_id in _global_forward_hooks_always_called:
                        called_always.add(hook_id)
                    res = self._call_forward_hook(hook_id, hook, args, kwargs, result)
                    if res is not None:
                        result = res
                if bw_hook is not None:
                    if not isinstance(result, (Tensor, tuple)):
                        warnings.warn("For backward hooks to be called, module output should be a Tensor or a tuple "
                                      f"of Tensors but received {type(result)}", stacklevel=3)
                    result = bw_hook.setup_output_hook(result)
                return result
            except Exception:
                self._run_always_called_hooks(args, kwargs, result, called_always)
                raise
        except EmberError as exc:
            _name_module_path(exc, self, calls)
            raise
        finally:
            calls.pop()

    def _call_forward_hook(self, hook_id: int, hook: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                           result: Any) -> Any:
        """One forward hook, called as it was registered (``with_kwargs`` or not); returns what it returned."""
        if hook_id in self._forward_hooks_with_kwargs or hook_id in _global_forward_hooks_with_kwargs:
            return hook(self, args, kwargs, result)
        return hook(self, args, result)

    def _run_always_called_hooks(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                                 called: set[int]) -> None:
        """The ``always_call`` forward hooks that did not run because forward (or a hook) raised."""
        for hook_id, hook in (*_global_forward_hooks.items(), *self._forward_hooks.items()):
            if hook_id in called or not (hook_id in self._forward_hooks_always_called
                                         or hook_id in _global_forward_hooks_always_called):
                continue
            try:
                res = self._call_forward_hook(hook_id, hook, args, kwargs, result)
                if res is not None:
                    result = res
            except Exception as e:  # noqa: BLE001 - the forward's error is the one to raise, as in PyTorch
                warnings.warn("module forward hook with ``always_call=True`` raised an exception that was silenced "
                              f"as another error was raised in forward: {e}", stacklevel=3)

    # -- hooks -------------------------------------------------------------------------------------------------
    def _hook_table(self, name: str) -> OrderedDict[int, Any]:
        """This module's own hook table ``name``, created on first use."""
        table = self.__dict__.get(name)
        if table is None:
            table = OrderedDict()
            object.__setattr__(self, name, table)
        return table

    def register_forward_pre_hook(self, hook: Callable[..., Any], *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """Call ``hook(module, args)`` before every ``forward`` (``hook(module, args, kwargs)`` with
        ``with_kwargs``). A value it returns replaces the positional arguments (a non-tuple becomes a 1-tuple); with
        ``with_kwargs`` it must return None or ``(new_args, new_kwargs)``. ``prepend`` runs it before this module's
        other pre-hooks (global ones always run first). Returns a :class:`~ember.utils.hooks.RemovableHandle`."""
        table = self._hook_table("_forward_pre_hooks")
        flags = self._hook_table("_forward_pre_hooks_with_kwargs")
        handle = _new_hook(table, hook, flags)
        if with_kwargs:
            flags[handle.id] = True
        if prepend:
            table.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after every ``forward`` (``hook(module, args, kwargs, output)`` with
        ``with_kwargs``); a value it returns replaces the output. ``prepend`` runs it before this module's other
        forward hooks (global ones always run first); ``always_call`` runs it even when forward raises (with
        ``output`` None). Returns a :class:`~ember.utils.hooks.RemovableHandle`."""
        table = self._hook_table("_forward_hooks")
        kw = self._hook_table("_forward_hooks_with_kwargs")
        always = self._hook_table("_forward_hooks_always_called")
        handle = _new_hook(table, hook, [kw, always])
        if with_kwargs:
            kw[handle.id] = True
        if always_call:
            always[handle.id] = True
        if prepend:
            table.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_pre_hook(self, hook: Callable[..., Any], prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_output)`` when the gradients of this module's outputs are computed
        (``grad_output`` is a tuple, None for non-Tensor outputs and outputs that got no gradient); a tuple it
        returns replaces ``grad_output`` from then on. Needs a device that records gradients; the module's forward
        then gets (and its caller receives) new tensors sharing the data. Returns a
        :class:`~ember.utils.hooks.RemovableHandle`."""
        table = self._hook_table("_backward_pre_hooks")
        handle = _new_hook(table, hook)
        if prepend:
            table.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_hook(self, hook: Callable[..., Any], prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_input, grad_output)`` when the gradients of this module's positional tensor
        inputs are computed (tuples; None for non-Tensor arguments); a tuple it returns replaces ``grad_input``.
        When no input requires grad it runs when the output gradients are known, with ``grad_input`` all None (and
        must return None); when no output requires grad it does not run (PyTorch's rules). Returns a
        :class:`~ember.utils.hooks.RemovableHandle`."""
        table = self._hook_table("_backward_hooks")
        handle = _new_hook(table, hook)
        if prepend:
            table.move_to_end(handle.id, last=False)
        return handle

    # -- registration ----------------------------------------------------------------------------------------
    def _check_init(self, name: str) -> None:
        if "_parameters" not in self.__dict__:
            raise EmberError(
                f"cannot assign {name!r} before Module.__init__() call: call super().__init__() first in "
                f"{type(self).__name__}.__init__"
            )

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Parameter):
            self._check_init(name)
            self._forget(name, keep=self._parameters)
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._check_init(name)
            self._forget(name, keep=self._modules)
            self._modules[name] = value
        elif "_parameters" in self.__dict__ and name in self._parameters:
            if value is not None:
                raise DTypeError(
                    f"cannot assign {type(value).__name__} as parameter {name!r} of {type(self).__name__} "
                    "(nn.Parameter or None expected)"
                )
            self._parameters[name] = None
        elif "_modules" in self.__dict__ and name in self._modules:
            if value is not None:
                raise DTypeError(f"cannot assign {type(value).__name__} as child module {name!r} (Module or None)")
            self._modules[name] = None
        elif "_buffers" in self.__dict__ and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise DTypeError(f"cannot assign {type(value).__name__} as buffer {name!r} (Tensor or None)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str, keep: dict[str, Any] | None = None) -> None:
        """Drop ``name`` from every store but ``keep`` (the one it is about to be set in: as PyTorch, replacing a
        parameter, buffer or submodule keeps its place, so ``decoder.weight = encoder.weight`` keeps
        ``decoder.weight`` before ``decoder.bias`` in ``state_dict``)."""
        for d in (self._parameters, self._buffers, self._modules):
            if d is not keep:
                d.pop(name, None)
        self._non_persistent.discard(name)
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._check_init(name)
        self._check_name(name, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise DTypeError(
                f"register_parameter: {name!r} must be an nn.Parameter or None, got {type(param).__name__}"
            )
        self._forget(name, keep=self._parameters)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that is state but not a parameter (running statistics); saved in state_dict if persistent."""
        self._check_init(name)
        self._check_name(name, "buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise DTypeError(f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        self._forget(name, keep=self._buffers)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        self._check_init(name)
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise DTypeError(f"add_module: {name!r} must be a Module or None, got {type(module).__name__}")
        self._forget(name, keep=self._modules)
        self._modules[name] = module

    register_module = add_module

    @staticmethod
    def _check_name(name: str, what: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise EmberError(f"{what} name must be a non-empty string without '.', got {name!r}")

    # -- traversal ---------------------------------------------------------------------------------------------
    def named_modules(self, memo: set[int] | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        memo = set() if memo is None else memo
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named_members(self, store: str, prefix: str, recurse: bool,
                       remove_duplicate: bool) -> Iterator[tuple[str, Any]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, value in getattr(mod, store).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted path, parameter) pairs in registration order; shared parameters appear once."""
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> Module:
        mod: Module = self
        for part in filter(None, target.split(".")):
            child = mod._modules.get(part)
            if child is None:
                raise EmberError(f"{type(mod).__name__} has no submodule {part!r} (looking up {target!r})")
            mod = child
        return mod

    def get_parameter(self, target: str) -> Parameter:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        p = mod._parameters.get(name)
        if p is None:
            raise EmberError(f"{type(mod).__name__} has no parameter {name!r} (looking up {target!r})")
        return p

    def num_params(self, trainable_only: bool = False) -> int:
        """Number of parameter elements (shared parameters counted once)."""
        return sum(p.numel() for p in self.parameters() if not trainable_only or p.requires_grad)

    # -- modes and state ---------------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise DTypeError(f"train: mode must be a bool, got {type(mode).__name__}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with no_grad():
                    p.grad = p.grad.detach() * 0

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """Call fn on every submodule (children first) and on self, e.g. for custom initialisation."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def _apply_to_tensors(self, convert: Callable[[Tensor], Tensor]) -> Module:
        for m in self.modules():
            for p in m._parameters.values():
                if p is not None:
                    grad = p.grad  # read first: rebinding to new data starts a new gradient record
                    p._rebind(convert(p))
                    if grad is not None:
                        p.grad = convert(grad)
            for name, b in m._buffers.items():
                if b is not None:
                    m._buffers[name] = convert(b)
        return self

    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Move and/or cast parameters and buffers in place: ``to(device)``, ``to(dtype)``, ``to(device, dtype)``.
        Only floating tensors change dtype (integer buffers such as ``num_batches_tracked`` keep theirs)."""
        from ..device import Device
        from ..dtypes import DType, as_dtype

        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        if kwargs:
            raise EmberError(f"Module.to: unexpected arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, (Device, str)) and not _is_dtype_name(a):
                device = a
            elif isinstance(a, (DType, str)) or a is not None:
                dtype = a
        dt_ = None if dtype is None else as_dtype(dtype)
        if dt_ is not None and not dt_.is_floating_point:
            raise DTypeError(f"Module.to: only floating dtypes are accepted, got {dt_}")

        def convert(t: Tensor) -> Tensor:
            out = t if device is None else t.to(device)
            if dt_ is not None and out._dtype.is_floating_point:
                out = out.to(dt_)
            return out

        return self._apply_to_tensors(convert)

    def float(self) -> Module:  # noqa: A003 - PyTorch's name
        return self.to(dtype="float32")

    def double(self) -> Module:
        return self.to(dtype="float64")

    def half(self) -> Module:
        return self.to(dtype="float16")

    def bfloat16(self) -> Module:
        return self.to(dtype="bfloat16")

    def cpu(self) -> Module:
        """Move parameters and buffers to the host device (``Device.host()``), as ``Tensor.cpu``."""
        from ..device import Device

        return self.to(Device.host())

    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted path (detached unless keep_vars), in PyTorch's order: a
        module's parameters, then its buffers, then each child's entries. Shared tensors and shared submodules
        appear under every path they are registered at (a tied weight under both names)."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mod_prefix, mod in self.named_modules(prefix=prefix.rstrip("."), remove_duplicate=False):
            base = f"{mod_prefix}." if mod_prefix else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[base + name] = p if keep_vars else p.detach()
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent:
                    out[base + name] = b if keep_vars else b.detach()
        return out

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy tensors into parameters and buffers by path. Shape mismatches always raise ShapeError naming
        every mismatched key; with strict=True (default) missing or unexpected keys raise EmberError too.
        Returns ``(missing_keys, unexpected_keys)``."""
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        mismatched = []
        for k, target in own.items():
            if k in state_dict:
                src = state_dict[k]
                shape = tuple(getattr(src, "shape", ()))
                if shape != target.shape:
                    mismatched.append(f"{k}: checkpoint shape {shape}, model shape {target.shape}")
        if mismatched:
            raise ShapeError(
                f"load_state_dict for {type(self).__name__}: size mismatch for " + "; ".join(mismatched)
            )
        if strict and (missing or unexpected):
            raise EmberError(
                f"load_state_dict for {type(self).__name__}: missing keys {missing}, unexpected keys {unexpected} "
                "(pass strict=False to load the matching keys only)"
            )
        with no_grad():
            for k, target in own.items():
                if k in state_dict:
                    target.copy_(state_dict[k])
        return IncompatibleKeys(missing, unexpected)

    # -- printing ----------------------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """Constructor arguments shown in repr (override in layers)."""
        return ""

    def __repr__(self) -> str:
        lines = []
        extra = self.extra_repr()
        for name, m in self._modules.items():
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {body}")
        if not lines:
            return f"{type(self).__name__}({extra})"
        head = f"{type(self).__name__}(" + (f"{extra}" if extra else "")
        return head + "\n  " + "\n  ".join(lines) + "\n)"


def _is_dtype_name(s: Any) -> bool:
    if not isinstance(s, str):
        return False
    from ..dtypes import as_dtype

    try:
        as_dtype(s)
        return True
    except DTypeError:
        return False


class Sequential(Module):
    """Modules applied in order; built from arguments or an OrderedDict of named modules."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], dict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def forward(self, input: Any) -> Any:
        for m in self._modules.values():
            input = m(input)
        return input

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def __getitem__(self, idx: int | slice) -> Any:
        items = list(self._modules.items())
        if isinstance(idx, slice):
            return Sequential(OrderedDict(items[idx]))
        try:
            return items[idx][1]
        except IndexError:
            from ..errors import IndexOutOfRangeError

            raise IndexOutOfRangeError(f"Sequential: index {idx} is out of range for {len(items)} modules") from None

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of modules whose parameters are registered (paths ``0.weight``, ``1.weight``, ...)."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _index(self, idx: int) -> int:
        n = len(self._modules)
        if not -n <= idx < n:
            from ..errors import IndexOutOfRangeError

            raise IndexOutOfRangeError(f"ModuleList: index {idx} is out of range for {n} modules")
        return idx % n

    def __getitem__(self, idx: int | slice) -> Any:
        if isinstance(idx, slice):
            return ModuleList(list(self._modules.values())[idx])
        return self._modules[str(self._index(idx))]

    def __setitem__(self, idx: int, module: Module) -> None:
        self.add_module(str(self._index(idx)), module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())  # type: ignore[arg-type]

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Any) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m


class ModuleDict(Module):
    """A dict of modules whose parameters are registered under their keys."""

    def __init__(self, modules: Any = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        if key not in self._modules:
            raise KeyError(f"ModuleDict has no key {key!r} (keys: {list(self._modules)})")
        return self._modules[key]  # type: ignore[return-value]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self) -> Any:
        return self._modules.keys()

    def values(self) -> Any:
        return self._modules.values()

    def items(self) -> Any:
        return self._modules.items()

    def update(self, modules: Any) -> None:
        items = modules.items() if isinstance(modules, dict) else modules
        for k, m in items:
            self.add_module(k, m)
