"""AutodiffBackend: the backend contract, recorded for reverse-mode differentiation.

Every method runs the op on the inner backend. When gradient mode is on and an input requires grad, it also
records a :class:`~ember_autodiff.graph.Node` whose vjp computes input gradients with inner-backend ops. The
rules live in mixins by kind (elementwise, reductions, movement, nn) over the shared recording machinery of
:class:`~ember_autodiff.recorder.Recorder`; a contract method with no rule here
falls back to :class:`ember.backend.Backend`'s default composition, which runs on *this* stack and is
therefore differentiated through its primitives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.backend import REQUIRED_PRIMITIVES, Backend
from ember.dtypes import DType
from ember.errors import AutodiffError

from .graph import ADArray, Meta, Node, backward
from .rules_elementwise import ElementwiseRules
from .rules_movement import MovementRules
from .rules_nn import NNRules
from .rules_reduction import ReductionRules


def unwrap(x: Any) -> Any:
    """The inner value of an AD handle; anything else (scalars, None) unchanged."""
    return x.value if type(x) is ADArray else x


def unwrap_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(k.value if type(k) is ADArray else k for k in key)


def _unwrap_deep(x: Any) -> Any:
    if type(x) is ADArray:
        return x.value
    if type(x) in (tuple, list):
        return type(x)(_unwrap_deep(i) for i in x)
    return x


def _handles_in(args: tuple[Any, ...]) -> list[ADArray]:
    found = []
    for a in args:
        if type(a) is ADArray:
            found.append(a)
        elif type(a) in (tuple, list):
            found.extend(i for i in a if type(i) is ADArray)
    return found


def _wrap_out(value: Any) -> Any:
    if type(value) is tuple:
        return tuple(ADArray(v) for v in value)
    return ADArray(value)


def _composite(name: str) -> Callable[..., Any]:
    """A contract method without a hand-written rule: untracked calls run the inner backend's (fast) version;
    tracked calls run Backend's default composition on this stack, so its primitives record the gradient."""
    default = getattr(Backend, name)

    def method(self: AutodiffBackend, *args: Any, **kwargs: Any) -> Any:
        if not self.tracking(*_handles_in(args)):
            return _wrap_out(getattr(self.inner, name)(*_unwrap_deep(args), **kwargs))
        return default(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"{name}: inner backend when untracked, else the differentiated default composition."
    return method


class AutodiffBackend(ElementwiseRules, ReductionRules, MovementRules, NNRules, Backend):
    """Wraps ``inner``; ``balanced`` turns on balanced gradient checkpointing."""

    differentiable = True
    contract_version = 1

    def __init__(self, inner: Backend, balanced: bool = False) -> None:
        super().__init__(inner.index)
        self.inner = inner
        self.balanced = balanced
        self.name = f"{inner.name}+autodiff"
        self.supported_dtypes = inner.supported_dtypes
        self._add = lambda a, b: inner.binary("add", a, b)

    # ------------------------------------------------------------------------------------------------------
    # decorated stack plumbing
    # ------------------------------------------------------------------------------------------------------
    def lift(self, h: Any) -> ADArray:
        return ADArray(self.inner.lift(h))

    def lower(self, h: ADArray) -> Any:
        return self.inner.lower(h.value)

    def sync(self) -> None:
        self.inner.sync()

    def memory_report(self) -> dict[str, Any]:
        return self.inner.memory_report()

    def memory_dry_run(self) -> Any:
        return self.inner.memory_dry_run()

    def describe(self) -> str:
        mode = "balanced checkpointing" if self.balanced else "no checkpointing"
        return f"autodiff ({mode}) over {self.inner.describe()}"

    def seed(self, seed: int) -> None:
        self.inner.seed(seed)

    # ------------------------------------------------------------------------------------------------------
    # data primitives: nothing to differentiate
    # ------------------------------------------------------------------------------------------------------
    def from_numpy(self, array: Any) -> ADArray:
        return ADArray(self.inner.from_numpy(array))

    def to_numpy(self, h: ADArray) -> Any:
        return self.inner.to_numpy(h.value)

    def full(self, shape: tuple[int, ...], value: Any, dtype: DType) -> ADArray:
        return ADArray(self.inner.full(shape, value, dtype))

    def arange(self, start: Any, stop: Any, step: Any, dtype: DType) -> ADArray:
        return ADArray(self.inner.arange(start, stop, step, dtype))

    def rand(self, shape: tuple[int, ...], dtype: DType) -> ADArray:
        return ADArray(self.inner.rand(shape, dtype))

    def randn(self, shape: tuple[int, ...], dtype: DType) -> ADArray:
        return ADArray(self.inner.randn(shape, dtype))

    def randint(self, low: int, high: int, shape: tuple[int, ...], dtype: DType) -> ADArray:
        return ADArray(self.inner.randint(low, high, shape, dtype))

    def argreduce(self, op: str, h: ADArray, dim: int | None, keepdim: bool) -> ADArray:
        return ADArray(self.inner.argreduce(op, h.value, dim, keepdim))

    # ------------------------------------------------------------------------------------------------------
    # the autodiff protocol core's gradient API calls (see ember.autograd and Tensor)
    # ------------------------------------------------------------------------------------------------------
    def requires_grad(self, h: ADArray) -> bool:
        return h.meta is not None

    def set_requires_grad(self, h: ADArray, flag: bool) -> None:
        if h.meta is not None and h.meta.node is not None:
            if not flag:
                raise AutodiffError(
                    "requires_grad_: you can only change requires_grad flags of leaf tensors; use detach() to get "
                    "a tensor without gradient history"
                )
            return
        if flag and h.meta is None:
            h.meta = Meta()
        elif not flag:
            h.meta = None

    def is_leaf(self, h: ADArray) -> bool:
        return h.meta is None or h.meta.node is None

    def grad_fn(self, h: ADArray) -> Node | None:
        return None if h.meta is None else h.meta.node

    def grad_of(self, h: ADArray) -> Any:
        if h.meta is None or h.meta.grad is None:
            return None
        return ADArray(h.meta.grad)

    def set_grad(self, h: ADArray, g: ADArray | None) -> None:
        if h.meta is None:
            if g is None:
                return
            raise AutodiffError("grad: cannot assign a gradient to a tensor that does not require grad")
        h.meta.grad = None if g is None else g.value

    def retain_grad(self, h: ADArray) -> None:
        if h.meta is None:
            raise AutodiffError("retain_grad: the tensor does not require grad")
        if h.meta.node is not None:
            h.meta.retains_grad = True

    def detach(self, h: ADArray) -> ADArray:
        # shares data and the version counter, as PyTorch's detach(), but is no view in the graph's sense: in-place
        # ops on it are allowed (and bump the counter, so backward still catches a saved value it changed)
        out = ADArray(h.value)
        out.version = h.version
        return out

    def _roots(self, op: str, outs: Sequence[ADArray], grads: Sequence[Any]) -> tuple[list[Meta], list[Any]]:
        metas, seeds = [], []
        for h, g in zip(outs, grads):
            if h.meta is None:
                raise AutodiffError(
                    f"{op}: element {len(metas)} of the outputs does not require grad and has no grad_fn "
                    "(did you create it under no_grad, or forget requires_grad=True on the inputs?)"
                )
            metas.append(h.meta)
            seeds.append(unwrap(g))
        return metas, seeds

    def backward(self, outs: Sequence[ADArray], grads: Sequence[Any], retain_graph: bool) -> None:
        metas, seeds = self._roots("backward", outs, grads)
        backward(metas, seeds, retain_graph, True, self._add, self.inner.copy)

    def grad(self, outs: Sequence[ADArray], inputs: Sequence[ADArray], grads: Sequence[Any],
             retain_graph: bool) -> list[ADArray | None]:
        metas, seeds = self._roots("grad", outs, grads)
        res = backward(metas, seeds, retain_graph, False, self._add, self.inner.copy, [h.meta for h in inputs])
        return [None if g is None else ADArray(g) for g in res or []]


def _install_composites() -> None:
    """Give every default composition the rule mixins do not define its pass-through/differentiated form."""
    import inspect

    for name, _ in inspect.getmembers(Backend, inspect.isfunction):
        if name.startswith("_") or name in REQUIRED_PRIMITIVES or name in AutodiffBackend.__dict__:
            continue
        if any(name in vars(mixin) for mixin in AutodiffBackend.__mro__[1:-2]):
            continue  # a rule mixin implements it
        setattr(AutodiffBackend, name, _composite(name))


_install_composites()
