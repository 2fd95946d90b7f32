"""The user-facing Tensor.

A Tensor is a backend handle plus its ember dtype and device. It holds no backend code: operators and methods
forward to the functions in :mod:`ember.ops` (installed as methods by :func:`install_methods`), which validate
and dispatch to the device's resolved stack.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .device import Device, is_host
from .dtypes import DType
from .errors import DTypeError, ShapeError
from .shapes import Size, as_size


class Tensor:
    """An n-dimensional array on a device. Create with ``ember.tensor``, ``ember.zeros``, ... ."""

    # _rg/_grad are only used on devices without autodiff (a differentiable stack keeps both on its handles);
    # they are left unset by _make, so creating a result costs three stores
    __slots__ = ("_h", "_dtype", "_device", "_rg", "_grad", "__weakref__")
    __array_priority__ = 1000  # numpy defers to our reflected operators

    _h: Any
    _dtype: DType
    _device: Device

    def __init__(self, data: Any, dtype: Any = None, device: Any = None) -> None:
        from .bridge import to_tensor

        t = to_tensor(data, dtype, device)
        self._h, self._dtype, self._device = t._h, t._dtype, t._device

    @classmethod
    def _make(cls, h: Any, dtype: DType, device: Device) -> Tensor:
        t = object.__new__(cls)
        t._h = h
        t._dtype = dtype
        t._device = device
        return t

    # -- metadata -------------------------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return as_size(self._h.shape)

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def device(self) -> Device:
        return self._device

    @property
    def ndim(self) -> int:
        return len(self._h.shape)

    def dim(self) -> int:
        return len(self._h.shape)

    def size(self, dim: int | None = None) -> Any:
        if dim is None:
            return self.shape
        from .shapes import norm_dim

        return self.shape[norm_dim(dim, self.ndim, "size")] if self.ndim else 1

    def numel(self) -> int:
        n = 1
        for s in self._h.shape:
            n *= s
        return n

    nelement = numel

    @property
    def itemsize(self) -> int:
        return self._dtype.itemsize

    def element_size(self) -> int:
        return self._dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self._dtype.itemsize

    def is_floating_point(self) -> bool:
        return self._dtype.is_floating_point

    # -- gradients (recorded by a differentiable stack: Device.flex().autodiff()) ---------------------------
    @property
    def requires_grad(self) -> bool:
        stack = self._device.stack
        if stack.differentiable:
            return stack.requires_grad(self._h)
        return getattr(self, "_rg", False)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Mark a leaf tensor for gradient tracking (floating and complex dtypes only), in place."""
        if requires_grad and not (self._dtype.is_floating_point or self._dtype.is_complex):
            raise DTypeError(f"requires_grad_: only floating point and complex tensors can require gradients, got "
                             f"{self._dtype}")
        stack = self._device.stack
        if stack.differentiable:
            stack.set_requires_grad(self._h, bool(requires_grad))
        else:
            self._rg = bool(requires_grad)  # backward() will explain that this device records nothing
        return self

    @property
    def grad(self) -> Tensor | None:
        """The accumulated gradient of a leaf after ``backward()``, or None."""
        stack = self._device.stack
        if stack.differentiable:
            g = stack.grad_of(self._h)
            return None if g is None else Tensor._make(g, self._dtype, self._device)
        return getattr(self, "_grad", None)

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise DTypeError(f"grad: expected a Tensor or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise ShapeError(f"grad: assigned gradient has shape {value.shape} but the tensor has {self.shape}")
        stack = self._device.stack
        if stack.differentiable:
            stack.set_grad(self._h, None if value is None else value.to(self._device, self._dtype)._h)
        else:
            self._grad = value

    @property
    def is_leaf(self) -> bool:
        stack = self._device.stack
        return stack.is_leaf(self._h) if stack.differentiable else True

    @property
    def grad_fn(self) -> Any:
        """The node that produced this tensor (None for leaves and untracked tensors)."""
        stack = self._device.stack
        return stack.grad_fn(self._h) if stack.differentiable else None

    def retain_grad(self) -> None:
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        stack = self._device.stack
        if not stack.differentiable:
            from .autograd import _stack_of

            _stack_of("retain_grad", [self])
        stack.retain_grad(self._h)

    def register_hook(self, hook: Any) -> Any:
        """Call ``hook(grad) -> Tensor | None`` each time a backward pass (``backward()`` or ``autograd.grad``)
        computes this tensor's gradient, a leaf's or not (``torch.Tensor.register_hook``). It runs once per pass,
        with the whole gradient, before the gradient is accumulated into ``.grad``, kept by ``retain_grad()`` or
        passed on; a Tensor it returns (same shape, dtype and device) replaces the gradient from then on. Several
        hooks run in registration order. Returns a :class:`ember.utils.hooks.RemovableHandle`. An AutodiffError
        when the tensor does not require grad or its device records no gradients."""
        from .autograd import register_tensor_hook

        return register_tensor_hook(self, hook)

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """Call ``hook(tensor)`` (which returns None) after ``backward()`` has accumulated this leaf's ``.grad``
        (``torch.Tensor.register_post_accumulate_grad_hook``; not called by ``autograd.grad``). Returns a
        :class:`ember.utils.hooks.RemovableHandle`. An AutodiffError for a non-leaf, a tensor that does not
        require grad, or one on a device that records no gradients."""
        from .autograd import register_post_accumulate_hook

        return register_post_accumulate_hook(self, hook)

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False) -> None:
        """Accumulate the gradient of this tensor into the leaves' ``.grad`` (``torch.Tensor.backward``)."""
        from . import autograd

        if create_graph:
            from .errors import AutodiffError

            raise AutodiffError("backward: create_graph=True (higher-order gradients) is not supported yet")
        autograd.backward([self], None if gradient is None else [gradient], retain_graph)

    def detach(self) -> Tensor:
        """The same data, cut from the gradient history (shares memory)."""
        stack = self._device.stack
        return Tensor._make(stack.detach(self._h) if stack.differentiable else self._h, self._dtype, self._device)

    def detach_(self) -> Tensor:
        stack = self._device.stack
        if stack.differentiable:
            self._h = stack.detach(self._h)
        return self

    @property
    def data(self) -> Tensor:
        """This tensor's data outside the gradient history (``torch.Tensor.data``): a detached tensor sharing its
        memory, so ``p.data.add_(u)`` or ``m.weight.data.normal_()`` change ``p`` without being recorded."""
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        """``p.data = t``: p holds t's data from now on (t's shape, dtype and device, sharing t's memory, as
        torch), keeping its own identity: a leaf that required grad still does, and its ``.grad`` is kept when it
        still fits (same shape, dtype and device; torch keeps it regardless, ember's ``.grad`` must fit)."""
        if not isinstance(value, Tensor):
            raise DTypeError(f"data: expected a Tensor, got {type(value).__name__}")
        rg = self.requires_grad and self.is_leaf
        if rg and not value._dtype.is_floating_point:
            raise DTypeError(f"data: data set to a tensor that requires gradients must be floating point, got "
                             f"{value._dtype}")
        grad = self.grad
        stack = value._device.stack
        self._h = stack.detach(value._h) if stack.differentiable else value._h
        self._dtype, self._device = value._dtype, value._device
        if rg:
            self.requires_grad_(True)
        if grad is not None:
            fits = grad.shape == self.shape and grad._dtype is self._dtype and grad._device == self._device
            self.grad = grad if fits else None

    # -- factories and casts of ported code (torch.Tensor.new_zeros, .type): Tensor's own methods, as numel --------
    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """Zeros of ``size`` (ints or one tuple) with this tensor's dtype and device unless given."""
        from .ops.creation import new_zeros

        return new_zeros(self, *size, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """Ones of ``size`` (ints or one tuple) with this tensor's dtype and device unless given."""
        from .ops.creation import new_ones

        return new_ones(self, *size, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A tensor of ``size`` with this tensor's dtype and device unless given; zero-filled, as ``empty``."""
        from .ops.creation import new_empty

        return new_empty(self, *size, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False) -> Tensor:
        """``fill_value`` in a tensor of ``size`` with this tensor's dtype and device unless given."""
        from .ops.creation import new_full

        return new_full(self, size, fill_value, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_tensor(self, data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A copy of ``data`` (outside any graph) with this tensor's dtype and device unless given."""
        from .ops.creation import new_tensor

        return new_tensor(self, data, dtype=dtype, device=device, requires_grad=requires_grad)

    def type(self, dtype: Any = None, non_blocking: bool = False) -> Any:
        """No argument: the legacy type string (``'ember.FloatTensor'``, torch's ``'torch.FloatTensor'``); with a
        dtype, dtype name or type string: this tensor cast to it (see :func:`ember.ops.conversion.type_`)."""
        from .ops.conversion import type_

        return type_(self, dtype, non_blocking)

    # -- conversion -----------------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a numpy array (shares memory on host backends: those registered with ``host=True``)."""
        return self._device.stack.to_numpy(self._h)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        a = self.numpy()
        if dtype is not None:
            a = a.astype(dtype, copy=False)
        if copy:
            a = a.copy()
        return a

    def __dlpack__(self, **kwargs: Any) -> Any:
        h = self._h
        if not hasattr(h, "__dlpack__"):
            h = self.numpy()
        return h.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        h = self._h
        if hasattr(h, "__dlpack_device__"):
            return h.__dlpack_device__()
        return (1, 0)

    def item(self) -> Any:
        if self.numel() != 1:
            raise ShapeError(f"item: a Tensor with {self.numel()} elements cannot be converted to a Python scalar")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ShapeError(
                f"bool value of a Tensor with {self.numel()} elements is ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self._dtype.is_floating_point or self.numel() != 1:
            raise DTypeError(
                f"only integer tensors of a single element can be converted to an index, got "
                f"{self._dtype} of shape {self.shape}"
            )
        return int(self.item())

    def __len__(self) -> int:
        if not self.ndim:
            raise ShapeError("len() of a 0-d tensor")
        return self._h.shape[0]

    def __iter__(self) -> Any:
        if not self.ndim:
            raise ShapeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._h.shape[0]))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        arr = self.numpy()
        body = np.array2string(arr, separator=", ", prefix="tensor(", threshold=1000, precision=4)
        extras = []
        if self._dtype.is_complex:  # as PyTorch: the default complex dtype goes unnamed
            if self._dtype is not self._device.default_dtype.to_complex:
                extras.append(f"dtype={self._dtype}")
        elif self._dtype.name not in ("float32", "int64", "bool"):
            extras.append(f"dtype={self._dtype}")
        elif self._dtype.name == "float32" and self._dtype is not self._device.default_dtype:
            extras.append(f"dtype={self._dtype}")
        if self.numel() == 0:
            extras.append(f"size={self.shape}")
        if not is_host(self._device):  # as PyTorch, which names every device but the CPU
            extras.append(f"device={self._device}")
        if self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self.numel() == 1 and spec:
            return format(self.item(), spec)
        return repr(self)

    def __reduce__(self) -> Any:
        from . import bridge

        return (bridge.to_tensor, (self.numpy().copy(), self._dtype.name, self._device))

    # -- indexing -------------------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Tensor:
        from .ops.indexing import getitem

        return getitem(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        from .ops.indexing import setitem

        setitem(self, key, value)


def _binop(op: str, doc: str) -> tuple[Any, Any, Any]:
    from .ops.elementwise import binary, binary_operator, inplace_binary

    fwd = binary_operator(op)

    def rev(self: Tensor, other: Any) -> Tensor:
        return binary(op, other, self)

    def inp(self: Tensor, other: Any) -> Tensor:
        return inplace_binary(op, self, other)

    fwd.__doc__ = doc
    return fwd, rev, inp


def install_operators() -> None:
    """Attach Python operators to Tensor (done once at import), as the op registry (:mod:`ember.opinfo`) names
    them: a binary op's forward, reflected and in-place dunders, a comparison's one, a unary op's one."""
    from . import opinfo
    from .ops.elementwise import unary

    for info in opinfo.OPS:
        if not info.operators:
            continue
        if info.arity == 2:
            fwd, rev, inp = _binop(info.name, f"self {info.name} other")
            for name, fn in zip(info.operators, (fwd, rev, inp)):  # comparisons have the forward one only
                setattr(Tensor, name, fn)
        elif info.name == "bitwise_not":
            # ``~`` of a bool tensor is logical_not, as in PyTorch: backends see the predicate, not bitwise ops on bools
            def invert(self: Tensor) -> Tensor:
                return unary("logical_not" if self._dtype.is_bool else "bitwise_not", self)

            setattr(Tensor, info.operators[0], invert)
        else:
            setattr(Tensor, info.operators[0], (lambda o: lambda self: unary(o, self))(info.name))
    Tensor.__pos__ = lambda self: self  # type: ignore[method-assign]  # identity, no op (not in the registry)

    def matmul(self: Tensor, other: Any) -> Tensor:
        from .ops.linalg import matmul as mm

        return mm(self, other)

    def rmatmul(self: Tensor, other: Any) -> Tensor:
        from .ops.linalg import matmul as mm

        return mm(other, self)

    Tensor.__matmul__ = matmul  # type: ignore[attr-defined]
    Tensor.__rmatmul__ = rmatmul  # type: ignore[attr-defined]


def install_methods(functions: dict[str, Any]) -> None:
    """Attach op functions as Tensor methods (``x.exp()`` is ``ember.exp(x)``)."""
    for name, fn in functions.items():
        setattr(Tensor, name, fn)


install_operators()
