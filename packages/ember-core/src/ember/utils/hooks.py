"""PyTorch's ``torch.utils.hooks``: :class:`RemovableHandle` (what every ``register_*_hook`` returns) and
:class:`BackwardHook`, the machinery behind ``Module.register_full_backward_hook`` and
``register_full_backward_pre_hook``.

Module backward hooks need the gradients of all of a module's inputs (or outputs) at once, so both ends of the
module's forward pass go through one graph node each (:func:`ember.autograd.hook_node`, an identity the
differentiable stack records as a single node, as PyTorch's ``BackwardHookFunction``): the node on the outputs
runs the pre-hooks and keeps ``grad_output``, the node on the inputs calls the hooks with ``grad_input`` and
``grad_output``.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["BackwardHook", "RemovableHandle"]

_ids = itertools.count()  # hook ids, unique across every table (next() on a count is atomic in CPython)


class RemovableHandle:
    """A handle that removes a hook: ``handle.remove()``, or leaving ``with handle:``.

    ``hooks_dict`` is the table the hook is stored in under :attr:`id`; ``extra_dict`` (a dict or a list of dicts)
    holds per-hook flags removed with it (``with_kwargs``, ``always_call``). The tables are referenced weakly (a
    handle does not keep a tensor's or module's hooks alive), so they must be weak-referenceable (``OrderedDict``).
    """

    id: int

    def __init__(self, hooks_dict: Any, *, extra_dict: Any = None) -> None:
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = next(_ids)
        extras = [] if extra_dict is None else [extra_dict] if isinstance(extra_dict, dict) else list(extra_dict)
        self.extra_dict_ref: tuple[weakref.ref[Any], ...] = tuple(weakref.ref(d) for d in extras)

    def remove(self) -> None:
        """Remove the hook (and its flags); removing twice, or after the owner is gone, does nothing."""
        for ref in (self.hooks_dict_ref, *self.extra_dict_ref):
            table = ref()
            if table is not None:
                table.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"RemovableHandle(id={self.id})"


def _pack_with_none(indices: Sequence[int], values: Sequence[Any], size: int) -> tuple[Any, ...]:
    res: list[Any] = [None] * size
    for i, v in zip(indices, values):
        res[i] = v
    return tuple(res)


class BackwardHook:
    """The full backward hooks (``hook(module, grad_input, grad_output)``) and backward pre-hooks
    (``hook(module, grad_output)``) of one module call, with PyTorch's firing rules:

    * the pre-hooks run when the gradients of the module's outputs are known (None for outputs that got none), and
      may return replacements;
    * the hooks run when the gradients of its positional tensor inputs are known, get ``grad_input`` (None for
      non-Tensor arguments) and ``grad_output``, and may return a replacement ``grad_input``;
    * when no input requires grad they run at the outputs instead, with a ``grad_input`` of Nones (and a warning);
      when no output requires grad they do not run.
    """

    def __init__(self, module: Any, user_hooks: Sequence[Callable[..., Any]],
                 user_pre_hooks: Sequence[Callable[..., Any]]) -> None:
        self.module = module
        self.user_hooks = list(user_hooks)
        self.user_pre_hooks = list(user_pre_hooks)
        self.grad_outputs: tuple[Any, ...] | None = None
        self.n_inputs = -1
        self.n_outputs = -1
        self.input_tensors_index: list[int] | None = None
        self.output_tensors_index: list[int] | None = None

    def _apply_on_tensors(self, where: str, hook: Callable[[list[Any]], Sequence[Any] | None],
                          args: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[int] | None]:
        """``args`` with its tensors passed through one hook node (when one of them requires grad and grad mode is
        on; else unchanged, and None for the indices), and the positions of the tensors that went through it."""
        from ..autograd import hook_node, is_grad_enabled
        from ..errors import DeviceError
        from ..tensor import Tensor

        if not is_grad_enabled():
            return args, None
        tracked = [(i, a) for i, a in enumerate(args) if isinstance(a, Tensor)]
        grad_devices = {a._device for _, a in tracked if a.requires_grad}
        if not grad_devices:
            return args, None
        if len(grad_devices) > 1:
            raise DeviceError(f"{type(self.module).__name__}: backward hooks need the module's {where} that require "
                              f"grad on one device, got {sorted(map(str, grad_devices))}")
        device = grad_devices.pop()
        if not getattr(device.stack, "differentiable", False):
            return args, None  # nothing is recorded: backward() will say how to get a device that records
        tracked = [(i, a) for i, a in tracked if a._device == device]  # others get None gradients
        new = hook_node("backward hook", [a for _, a in tracked], hook)
        out = list(args)
        for (i, _), t in zip(tracked, new):
            out[i] = t
        return (tuple(out) if type(args) is tuple else type(args)(*out)), [i for i, _ in tracked]

    def setup_input_hook(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The module's positional arguments, routed through the node that calls the hooks."""
        res, idx = self._apply_on_tensors("inputs", self._input_hook, args)
        self.n_inputs = len(args)
        self.input_tensors_index = idx
        if idx is not None:
            # shape, dtype and device (not the tensors: no memory kept alive) for the zeros of inputs with no gradient
            self._input_likes = [(tuple(args[i].shape), args[i]._dtype, args[i]._device) for i in idx]
        return res

    def setup_output_hook(self, result: Any) -> Any:
        """The module's result (a Tensor or a tuple; anything else is returned as is), routed through the node that
        runs the pre-hooks."""
        single = not isinstance(result, tuple)
        args = (result,) if single else result
        res, idx = self._apply_on_tensors("outputs", self._output_hook, args)
        self.n_outputs = len(args)
        self.output_tensors_index = idx
        return res[0] if single else res

    def _output_hook(self, grads: list[Any]) -> list[Any]:
        assert self.output_tensors_index is not None
        self.grad_outputs = _pack_with_none(self.output_tensors_index, grads, self.n_outputs)
        expected = len(self.grad_outputs)
        for pre_hook in self.user_pre_hooks:
            res = pre_hook(self.module, self.grad_outputs)
            if res is None:
                continue
            if len(res) != expected:
                from ..errors import AutodiffError

                raise AutodiffError(f"{type(self.module).__name__}: backward pre hook returned an invalid number of "
                                    f"grad_output, got {len(res)}, but expected {expected}")
            self.grad_outputs = tuple(res)
        local = self.grad_outputs
        if self.input_tensors_index is None:
            warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs "
                          "since no inputs require gradients", stacklevel=2)
            grad_inputs = _pack_with_none([], [], self.n_inputs)
            for hook in self.user_hooks:
                res = hook(self.module, grad_inputs, self.grad_outputs)
                if res is not None and not (isinstance(res, tuple) and all(r is None for r in res)):
                    from ..errors import AutodiffError

                    raise AutodiffError(f"{type(self.module).__name__}: a backward hook for a module where no input "
                                        "requires gradient should always return None or None for all gradients")
            self.grad_outputs = None
        return [local[i] for i in self.output_tensors_index]

    def _input_hook(self, grads: list[Any]) -> list[Any]:
        from ..autograd import no_grad
        from ..ops.creation import zeros

        assert self.input_tensors_index is not None
        with no_grad():  # as PyTorch's node, inputs that got no gradient get zeros (floating ones)
            grads = [zeros(shape, dtype=dtype, device=device) if g is None and dtype.is_floating_point else g
                     for g, (shape, dtype, device) in zip(grads, self._input_likes)]
        if self.grad_outputs is None:
            # the gradient reached the inputs without passing through the outputs (the module's result did not
            # depend on this input): PyTorch runs no hook then
            return grads
        res = _pack_with_none(self.input_tensors_index, grads, self.n_inputs)
        for hook in self.user_hooks:
            out = hook(self.module, res, self.grad_outputs)
            if out is None:
                continue
            if len(out) != len(res):
                from ..errors import AutodiffError

                raise AutodiffError(f"{type(self.module).__name__}: backward hook returned an invalid number of "
                                    f"grad_input, got {len(out)}, but expected {len(res)}")
            res = tuple(out)
        self.grad_outputs = None
        return [res[i] for i in self.input_tensors_index]
