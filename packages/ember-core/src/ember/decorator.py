"""Decorators: stacks that wrap a backend and implement the same contract (autodiff, fusion, ...).

A decorator subclasses :class:`Decorator` and declares, per contract method, what it does with it:

* **handle** -- the subclass implements the method itself (fusion records ``binary``, autodiff differentiates it);
* **boundary** -- the arguments' handles are lowered to the inner stack's (``_unwrap``), the inner stack's method
  runs, and its results are wrapped back (``_wrap``);
* **compose** (the default) -- a boundary where the inner backend implements the method itself; where the inner
  backend only inherits :class:`~ember.backend.Backend`'s default composition, that composition runs on *this*
  stack instead, so the decorator sees (records, fuses, differentiates) its primitives;
* **pass through** -- the inner stack's method runs on the handles as they are (for decorators whose handles
  *are* the inner stack's: counters, routers, loggers).

A method the subclass defines is *handle*; every other method of the contract gets ``policies.get(name,
default_policy)``. The resolved table is ``cls.policy`` (name -> :class:`Policy`), computed once per class; the
forwarding functions are bound once per instance, so a forwarded method costs one call more than the inner
backend's own, and a handled one (the hot path: ``unary``, ``binary``, ...) nothing at all.

The base also writes the plumbing every decorator needs once: ``inner``, ``name`` (``"flex+fusion"``),
``index``, ``supported_dtypes``, ``lift``/``lower``, ``sync``, ``memory_report``, ``memory_dry_run``,
``describe``, ``seed``, ``from_numpy``/``to_numpy``, ``dtype_of``, ``may_share_memory``, ``base_backend`` and
``run_extension`` (a boundary by default). A subclass converts handles through two hooks, ``_unwrap(h)`` (this
stack's handle -> the inner stack's) and ``_wrap(h)`` (the inner stack's -> this stack's); both are the
identity here, which is right for pass-through decorators.

:class:`Differentiable` declares what a stack that records gradients (``differentiable = True``) must offer:
the methods core's gradient API (``Tensor.backward``, ``.grad``, ``requires_grad_``, ``ember.autograd.grad``, ...)
calls on it.
"""

from __future__ import annotations

import enum
import inspect
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from .backend import REQUIRED_PRIMITIVES, Backend, Handle
from .dtypes import DType

__all__ = ["CONTRACT_METHODS", "Decorator", "Differentiable", "Policy", "inherits_composition"]


class Policy(enum.Enum):
    """What a decorator does with one contract method (see the module docstring)."""

    HANDLE = "handle"
    BOUNDARY = "boundary"
    COMPOSE = "compose"
    PASS = "pass through"


#: every public method of the backend contract (``Backend``'s public functions)
CONTRACT_METHODS: frozenset[str] = frozenset(
    n for n, v in vars(Backend).items() if not n.startswith("_") and inspect.isfunction(v)
)

#: contract methods a decorator never forwards: a decorator compiles no fused kernels itself (the fusion decorator
#: calls its inner backend's ``fusion_compile``), and forwarding it would make every decorator "support fusion"
_NOT_FORWARDED = frozenset({"fusion_compile"})


class Decorator(Backend):
    """Base class of every decorator: wraps ``inner`` (a backend or another decorator) and forwards the whole
    contract to it with a declared per-method :class:`Policy`.

    Subclasses set :attr:`decorator_name`, override the methods they handle and the handle hooks
    (:meth:`_wrap`, :meth:`_unwrap`), and may change :attr:`default_policy`, :attr:`policies`,
    :attr:`optional_policy` and :attr:`records_lazily`.
    """

    #: the name the decorator is registered under; the stack is named ``f"{inner.name}+{decorator_name}"``
    decorator_name: ClassVar[str] = "decorator"
    #: the policy of every contract method the subclass neither implements nor lists in :attr:`policies`
    default_policy: ClassVar[Policy] = Policy.COMPOSE
    #: per-method policies that differ from :attr:`default_policy` (``{"randint": Policy.BOUNDARY}``)
    policies: ClassVar[Mapping[str, Policy]] = {}
    #: how methods of the inner backend *outside* the contract (flex's ``conv_input_grad``, which autodiff looks up
    #: with ``getattr``) are offered: None hides them, BOUNDARY or PASS forwards them with that policy
    optional_policy: ClassVar[Policy | None] = None
    #: True for decorators that record ops and run them later (fusion): core then runs a ``fusable`` extension
    #: op's composition, so its ops are recorded with their neighbours, instead of the op's kernel
    records_lazily: ClassVar[bool] = False
    #: the resolved policy of every contract method (computed per class; read-only)
    policy: ClassVar[Mapping[str, Policy]] = {}
    #: (name, policy) of the methods bound per instance (neither the subclass nor this base implements them)
    _forwarded: ClassVar[tuple[tuple[str, Policy], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._resolve_policies()

    @classmethod
    def _resolve_policies(cls) -> None:
        """Compute :attr:`policy` and the methods to bind per instance from the class's declarations."""
        policies = dict(cls.policies)
        unknown = sorted(set(policies) - CONTRACT_METHODS)
        if unknown:
            raise TypeError(f"{cls.__name__}.policies names no contract method: {unknown}")
        if Policy.HANDLE in policies.values() or cls.default_policy is Policy.HANDLE:
            raise TypeError(f"{cls.__name__}: HANDLE is declared by defining the method, not in policies")
        table: dict[str, Policy] = {}
        forwarded: list[tuple[str, Policy]] = []
        for name in sorted(CONTRACT_METHODS):
            owner = next(k for k in cls.__mro__ if name in vars(k))
            if owner is not Backend or name in _NOT_FORWARDED:
                if name in policies:
                    raise TypeError(f"{cls.__name__} implements {name}() and also declares it {policies[name].value!r}")
                table[name] = Policy.HANDLE
                continue
            p = policies.get(name, cls.default_policy)
            if p is Policy.COMPOSE and name in REQUIRED_PRIMITIVES:
                p = Policy.BOUNDARY  # a required primitive has no composition to run
            table[name] = p
            forwarded.append((name, p))
        cls.policy = types.MappingProxyType(table)
        cls._forwarded = tuple(forwarded)

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner.index)
        self.inner = inner
        self.name = f"{inner.name}+{self.decorator_name}"
        self.supported_dtypes = inner.supported_dtypes
        self._bind_contract()

    # ------------------------------------------------------------------------------------------------------
    # handle hooks (identity here: a pass-through decorator's handles are the inner stack's)
    # ------------------------------------------------------------------------------------------------------
    def _unwrap(self, h: Any) -> Any:
        """The inner stack's handle for one of this stack's handles; anything else (scalars, None, dtypes, ...)
        unchanged."""
        return h

    def _wrap(self, h: Handle) -> Handle:
        """This stack's handle for a handle of the inner stack."""
        return h

    def _lower_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The positional arguments of one boundary call with every handle (also inside tuples and lists, as in
        ``cat`` and ``getitem`` keys) lowered by :meth:`_unwrap`. Called once per boundary call: a subclass may
        override it to lower all arguments together (fusion realizes them as one plan)."""
        unwrap = self._unwrap

        def lower(a: Any) -> Any:
            t = type(a)
            if t is tuple or t is list:
                return t(lower(x) for x in a)
            return unwrap(a)

        return tuple(lower(a) for a in args)

    def _wrap_out(self, out: Any) -> Any:
        """A boundary call's result as this stack's handles: None stays None, tuples and lists element-wise."""
        if out is None:
            return None
        t = type(out)
        if t is tuple or t is list:
            return t(self._wrap_out(o) for o in out)
        return self._wrap(out)

    # ------------------------------------------------------------------------------------------------------
    # the forwarding mechanism
    # ------------------------------------------------------------------------------------------------------
    def _bind_contract(self) -> None:
        """Bind, on this instance, every contract method the class does not implement, by its policy."""
        for name, p in self._forwarded:
            if p is Policy.PASS:
                fn: Callable[..., Any] = getattr(self.inner, name)
            elif p is Policy.BOUNDARY:
                fn = self._boundary(name)
            else:
                fn = self._compose(name, types.MethodType(getattr(Backend, name), self), self._boundary(name))
            setattr(self, name, fn)

    def _boundary(self, name: str) -> Callable[..., Any]:
        """The inner stack's method ``name`` as a boundary: handles lowered, results wrapped."""
        inner_method = getattr(self.inner, name)
        lower_args, wrap_out = self._lower_args, self._wrap_out

        def boundary(*args: Any, **kwargs: Any) -> Any:
            return wrap_out(inner_method(*lower_args(args), **kwargs))

        boundary.__name__ = boundary.__qualname__ = name
        boundary.__doc__ = f"{name}: the inner stack's implementation, run as a boundary."
        return boundary

    def _compose(self, name: str, composition: Callable[..., Any], boundary: Callable[..., Any]) -> Callable[..., Any]:
        """The implementation of contract method ``name`` under :attr:`Policy.COMPOSE`, chosen once per instance.

        ``composition`` is Backend's default composition bound to this stack, ``boundary`` the inner stack's method
        as a boundary. The default picks the composition where the inner backend only inherits it (so this
        decorator sees its primitives) and the boundary where the inner backend implements the method. Override
        to decide per call (autodiff: the boundary when nothing is tracked, the composition when it is).
        """
        return composition if inherits_composition(self.inner, name) else boundary

    def __getattr__(self, name: str) -> Any:
        """Methods of the inner backend outside the contract, forwarded by :attr:`optional_policy` (and bound on
        first use); a missing one, or any with ``optional_policy = None``, is an AttributeError."""
        p = type(self).optional_policy
        inner = self.__dict__.get("inner")
        if p is None or name.startswith("_") or inner is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        attr = getattr(inner, name)  # AttributeError when the inner stack lacks it too
        if not callable(attr):
            return attr
        method = attr if p is Policy.PASS else self._boundary(name)
        setattr(self, name, method)
        return method

    # ------------------------------------------------------------------------------------------------------
    # plumbing, written once
    # ------------------------------------------------------------------------------------------------------
    @property
    def base_backend(self) -> Backend:
        """The backend at the bottom of the decorator chain (extension kernels are looked up by its name)."""
        return self.inner.base_backend

    def lift(self, h: Handle) -> Handle:
        return self._wrap(self.inner.lift(h))

    def lower(self, h: Handle) -> Handle:
        return self.inner.lower(self._unwrap(h))

    def sync(self) -> None:
        self.inner.sync()

    def memory_report(self) -> dict[str, Any]:
        return self.inner.memory_report()

    def memory_dry_run(self) -> AbstractContextManager[dict[str, Any]]:
        return self.inner.memory_dry_run()

    def describe(self) -> str:
        return f"{self.decorator_name} over {self.inner.describe()}"

    def seed(self, seed: int) -> None:
        self.inner.seed(seed)

    def from_numpy(self, array: np.ndarray) -> Handle:
        return self._wrap(self.inner.from_numpy(array))

    def to_numpy(self, h: Handle) -> np.ndarray:
        return self.inner.to_numpy(self._unwrap(h))

    def dtype_of(self, h: Handle) -> DType:
        return self.inner.dtype_of(self._unwrap(h))

    def may_share_memory(self, a: Handle, b: Handle) -> bool:
        return self.inner.may_share_memory(self._unwrap(a), self._unwrap(b))

    def run_extension(self, call: Any) -> Any:
        """Run an extension op's kernel as a boundary: this stack's handles lowered to the inner stack's, the
        inner stack runs ``call.with_args(...)``, the outputs are wrapped back into this stack's handles."""
        inner_call = call.with_args(self._lower_args(call.args), self.inner)
        return self._wrap_out(self.inner.run_extension(inner_call))


def inherits_composition(stack: Backend, name: str) -> bool:
    """True when ``stack`` runs :class:`Backend`'s default composition for the contract method ``name``: no
    decorator down its chain handles the method and the backend at the bottom inherits it. (A decorator's forwarded
    methods are bound per instance, so its class alone cannot tell.)"""
    while isinstance(stack, Decorator):
        if stack.policy.get(name) is Policy.HANDLE:
            return False
        stack = stack.inner
    return getattr(type(stack), name, None) is getattr(Backend, name)


Decorator._resolve_policies()  # Decorator itself is usable: every method composed or forwarded, handles as is


@runtime_checkable
class Differentiable(Protocol):
    """What a stack that records gradients offers (``differentiable = True``; the autodiff decorator). Core's
    gradient API calls exactly these methods on such a stack, with the stack's own handles.

    ``isinstance(stack, Differentiable)`` checks that the members exist.
    """

    #: True: core's gradient API forwards to this stack (False everywhere else, where it raises AutodiffError)
    differentiable: bool

    def tracking(self, *hs: Any) -> bool:
        """True when gradient mode is on and any of the handles ``hs`` requires grad (scalars and None never do):
        an op on them is recorded."""
        ...

    def requires_grad(self, h: Handle) -> bool:
        """Whether ``h`` requires grad (a leaf marked with ``requires_grad_`` or the result of a recorded op)."""
        ...

    def set_requires_grad(self, h: Handle, flag: bool) -> None:
        """Mark (or unmark) a leaf for gradient tracking; an AutodiffError for a non-leaf that is unmarked."""
        ...

    def is_leaf(self, h: Handle) -> bool:
        """True unless ``h`` is the output of a recorded op."""
        ...

    def grad_fn(self, h: Handle) -> Any:
        """The node that produced ``h`` (calling it gives its name, ``"AddBackward"``), or None for a leaf."""
        ...

    def grad_of(self, h: Handle) -> Handle | None:
        """The accumulated gradient of ``h`` (a handle of this stack), or None."""
        ...

    def set_grad(self, h: Handle, g: Handle | None) -> None:
        """Replace (or clear, with None) the accumulated gradient of ``h``."""
        ...

    def retain_grad(self, h: Handle) -> None:
        """Keep the gradient of a non-leaf ``h`` in the next backward."""
        ...

    def detach(self, h: Handle) -> Handle:
        """A handle sharing ``h``'s data, outside the graph (``Tensor.detach``)."""
        ...

    def backward(self, outs: Sequence[Handle], grads: Sequence[Handle], retain_graph: bool) -> None:
        """Accumulate d(outs)/d(leaves), seeded with ``grads``, into the leaves' gradients."""
        ...

    def grad(self, outs: Sequence[Handle], inputs: Sequence[Handle], grads: Sequence[Handle],
             retain_graph: bool) -> list[Handle | None]:
        """The gradients of ``outs`` with respect to ``inputs`` (None where unreachable); no ``.grad`` changes."""
        ...

    def grad_hooks(self, h: Handle) -> MutableMapping[int, Callable[[Handle], Handle | None]]:
        """The ordered table of ``h``'s gradient hooks (``Tensor.register_hook``), created empty on first use; an
        AutodiffError when ``h`` does not require grad. Core adds and removes entries (keyed by a
        ``RemovableHandle`` id; the table must be weak-referenceable, as ``OrderedDict`` is). In a backward pass
        (``backward`` or ``grad``) that reaches ``h``, the stack calls them in order, once, when ``h``'s gradient is
        complete, before it is captured, kept (``retain_grad``), accumulated or propagated: each gets the gradient
        so far (a handle of this stack) and may return a handle that replaces it. Hooks run with grad mode off."""
        ...

    def post_accumulate_grad_hooks(self, h: Handle) -> MutableMapping[int, Callable[[], None]]:
        """The ordered table of the leaf ``h``'s post-accumulate hooks
        (``Tensor.register_post_accumulate_grad_hook``), as :meth:`grad_hooks`; the stack calls them in order right
        after ``backward`` updated ``h``'s accumulated gradient (never in ``grad``). An AutodiffError for a handle
        that does not require grad or is no leaf."""
        ...

    def hook_node(self, hs: Sequence[Handle],
                  hook: Callable[[list[Handle | None]], Sequence[Handle | None] | None]) -> list[Handle]:
        """An identity over ``hs`` recorded as a single graph node (PyTorch's ``BackwardHookFunction``, which
        module backward hooks are built on): new handles sharing ``hs``'s data (those of handles that do not require
        grad are outside the graph). When a backward pass reaches the node, the stack calls ``hook`` once with the
        gradients of all outputs (None where none arrived) and propagates what it returns (one handle or None per
        input) to ``hs``; None keeps the gradients as they are."""
        ...
