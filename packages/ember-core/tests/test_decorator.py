"""ember.backend.Decorator (the base of every decorator) and the Differentiable protocol.

The decorators here are built in the test over the host backend's own instance (found by device string, never by
importing a plugin): ``Boxing`` wraps every handle in a :class:`Box`, so a handle that crosses a boundary without
being lowered or wrapped shows up as a wrong type; ``Counting`` passes handles through.
"""

from __future__ import annotations

import ast
import inspect
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember.backend import REQUIRED_PRIMITIVES, Backend, Decorator, Differentiable
from ember.decorator import CONTRACT_METHODS, Policy, inherits_composition

SRC = Path(ember.__file__).resolve().parent


class Box:
    """A Boxing stack's handle: the inner handle inside."""

    def __init__(self, v: Any) -> None:
        self.v = v

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.v.shape)


class Boxing(Decorator):
    """Boxes handles; handles nothing itself except ``unary`` (to show a handled method stays the subclass's)."""

    decorator_name = "boxing"

    def __init__(self, inner: Backend) -> None:
        self.unboxed: Counter[str] = Counter()
        super().__init__(inner)

    def _wrap(self, h: Any) -> Box:
        return Box(h)

    def _unwrap(self, h: Any) -> Any:
        if type(h) is Box:
            return h.v
        return h

    def unary(self, op: str, h: Box) -> Box:
        self.unboxed["unary"] += 1
        return Box(self.inner.unary(op, h.v))


class Counting(Decorator):
    """A pass-through decorator: the inner stack's handles, one counted method."""

    decorator_name = "counting"
    default_policy = Policy.PASS

    def __init__(self, inner: Backend) -> None:
        self.calls: Counter[str] = Counter()
        super().__init__(inner)

    def binary(self, op: str, a: Any, b: Any) -> Any:
        self.calls["binary"] += 1
        return self.inner.binary(op, a, b)


@pytest.fixture(scope="module")
def host() -> Backend:
    """The host backend's own instance (no decorator)."""
    return Device.flex().stack.base_backend


@pytest.fixture(scope="module")
def inheriting(host: Backend) -> Backend:
    """The host backend with ``softmax`` and ``flip`` left to Backend's default composition."""
    cls = type("Inheriting", (type(host),), {"softmax": Backend.softmax, "flip": Backend.flip})
    return cls()


def box(dec: Boxing, a: np.ndarray) -> Box:
    return dec.from_numpy(np.ascontiguousarray(a))


def spy(inner: Backend, name: str) -> list[tuple[Any, ...]]:
    """Record the calls of ``inner``'s method ``name`` (patched on the instance: do it before a decorator binds its
    forwards to it)."""
    seen: list[tuple[Any, ...]] = []
    original = getattr(inner, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        return original(*args, **kwargs)

    setattr(inner, name, recorded)
    return seen


# ------------------------------------------------------------------------------------------------------------
# the declared policy table
# ------------------------------------------------------------------------------------------------------------
def test_the_contract_is_every_public_backend_method() -> None:
    assert CONTRACT_METHODS == {n for n, v in vars(Backend).items()
                                if not n.startswith("_") and inspect.isfunction(v)}
    assert {"unary", "conv", "run_extension", "lift", "sync"} <= CONTRACT_METHODS


def test_policy_resolution() -> None:
    table = Boxing.policy
    assert set(table) == CONTRACT_METHODS
    assert table["unary"] is Policy.HANDLE  # the subclass defines it
    for name in ("lift", "lower", "sync", "memory_report", "memory_dry_run", "describe", "seed", "from_numpy",
                 "to_numpy", "dtype_of", "may_share_memory", "run_extension"):
        assert table[name] is Policy.HANDLE, name  # the base's plumbing
    assert table["fusion_compile"] is Policy.HANDLE  # never forwarded
    for name in REQUIRED_PRIMITIVES - {"unary", "from_numpy", "to_numpy", "dtype_of", "seed"}:
        assert table[name] is Policy.BOUNDARY, name  # compose has no composition to run for a primitive
    assert table["conv"] is table["softmax"] is Policy.COMPOSE
    assert Counting.policy["matmul"] is Counting.policy["softmax"] is Policy.PASS


def test_declared_policies_override_the_default() -> None:
    class Declared(Boxing):
        policies = {"softmax": Policy.BOUNDARY, "matmul": Policy.PASS}

    assert Declared.policy["softmax"] is Policy.BOUNDARY and Declared.policy["matmul"] is Policy.PASS
    assert Declared.policy["conv"] is Policy.COMPOSE and Declared.policy["unary"] is Policy.HANDLE


@pytest.mark.parametrize("policies, match", [
    ({"no_such_op": Policy.BOUNDARY}, "names no contract method"),
    ({"unary": Policy.BOUNDARY}, "implements unary"),
    ({"describe": Policy.PASS}, "implements describe"),
    ({"softmax": Policy.HANDLE}, "HANDLE is declared by defining the method"),
], ids=["unknown", "handled-and-declared", "plumbing-declared", "handle-declared"])
def test_bad_declarations_are_refused_at_class_creation(policies: dict[str, Policy], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        type("Bad", (Boxing,), {"policies": policies})


def test_a_decorator_does_not_claim_fusion_support(host: Backend) -> None:
    # fusion applies to backends that override fusion_compile; a decorator never does
    assert Boxing.fusion_compile is Backend.fusion_compile
    assert Boxing(host).fusion_compile(object()) is None


# ------------------------------------------------------------------------------------------------------------
# plumbing
# ------------------------------------------------------------------------------------------------------------
def test_plumbing(host: Backend) -> None:
    dec = Boxing(host)
    assert dec.inner is host and dec.name == f"{host.name}+boxing" and dec.index == host.index
    assert dec.supported_dtypes == host.supported_dtypes
    assert dec.base_backend is host and host.base_backend is host
    assert Boxing(dec).base_backend is host and Boxing(dec).name == f"{host.name}+boxing+boxing"
    assert dec.describe() == f"boxing over {host.describe()}"
    assert dec.memory_report() == host.memory_report()
    with dec.memory_dry_run() as stats:
        assert isinstance(stats, dict)
    dec.sync()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = box(dec, a)
    assert type(h) is Box and type(h.v) is type(host.from_numpy(a))
    np.testing.assert_array_equal(dec.to_numpy(h), a)
    assert dec.dtype_of(h) is ember.float32
    lifted = dec.lift(host.from_numpy(a))
    assert type(lifted) is Box and dec.lower(lifted) is lifted.v
    assert dec.may_share_memory(h, h) and not dec.may_share_memory(h, box(dec, a.copy()))
    dec.seed(7)
    r1 = dec.to_numpy(dec.rand((4,), ember.float32))
    host.seed(7)
    np.testing.assert_array_equal(r1, host.to_numpy(host.rand((4,), ember.float32)))


def test_a_handled_method_is_the_subclass_s(host: Backend) -> None:
    dec = Boxing(host)
    out = dec.unary("neg", box(dec, np.ones(3, np.float32)))
    assert dec.unboxed["unary"] == 1 and type(out) is Box
    np.testing.assert_array_equal(dec.to_numpy(out), -np.ones(3))
    assert "unary" not in vars(dec)  # the class's method, not a per-instance forward


# ------------------------------------------------------------------------------------------------------------
# boundary, compose, pass through
# ------------------------------------------------------------------------------------------------------------
def test_boundary_lowers_arguments_and_wraps_results(host: Backend) -> None:
    inner = host.__class__()  # a fresh instance: spy() patches it
    seen = spy(inner, "matmul")
    dec = Boxing(inner)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    out = dec.matmul(box(dec, a), box(dec, b))
    assert type(out) is Box and all(type(x) is not Box for x in seen[0])
    np.testing.assert_allclose(dec.to_numpy(out), a @ b, rtol=1e-5)
    # handles inside tuples and lists (cat's list, getitem's key) are lowered too; tuples of results are wrapped
    parts = dec.cat([box(dec, a), box(dec, a)], 0)
    np.testing.assert_array_equal(dec.to_numpy(parts), np.concatenate([a, a]))
    idx = dec.from_numpy(np.array([2, 0], dtype=np.int64))
    np.testing.assert_array_equal(dec.to_numpy(dec.getitem(box(dec, a), (idx,))), a[[2, 0]])
    values, indices = dec.sort(box(dec, a), 1, False, True)
    assert type(values) is Box and type(indices) is Box
    np.testing.assert_array_equal(dec.to_numpy(values), np.sort(a, 1))
    # in-place methods return None through the boundary
    target = box(dec, np.zeros(3, np.float32))
    assert dec.assign(target, 1.5) is None
    np.testing.assert_array_equal(dec.to_numpy(target), np.full(3, 1.5))


def test_compose_runs_the_inner_backend_s_own_implementation(host: Backend) -> None:
    inner = host.__class__()
    seen = spy(inner, "softmax")
    dec = Boxing(inner)
    assert not inherits_composition(dec.inner, "softmax")
    x = np.random.default_rng(1).standard_normal((2, 5)).astype(np.float32)
    out = dec.softmax(box(dec, x), 1, False)
    assert len(seen) == 1 and dec.unboxed["unary"] == 0  # one boundary, no primitive of this stack
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(dec.to_numpy(out), e / e.sum(1, keepdims=True), rtol=1e-5)


def test_compose_runs_an_inherited_composition_on_this_stack(inheriting: Backend) -> None:
    dec = Boxing(inheriting)
    assert inherits_composition(dec.inner, "softmax") and inherits_composition(dec, "softmax")
    x = np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32)
    out = dec.softmax(box(dec, x), 1, True)
    assert dec.unboxed["unary"] >= 1  # the composition's exp/log went through this stack's (handled) unary
    np.testing.assert_allclose(dec.to_numpy(out), x - np.log(np.exp(x).sum(1, keepdims=True)), rtol=1e-5,
                               atol=1e-6)
    flipped = dec.flip(box(dec, x), (1,))
    np.testing.assert_array_equal(dec.to_numpy(flipped), x[:, ::-1])


def test_compose_sees_through_decorators_in_between(host: Backend, inheriting: Backend) -> None:
    # a decorator's forwards are bound per instance, so the check walks the chain, not the inner's class
    over_inheriting = Boxing(Counting(inheriting))
    assert inherits_composition(over_inheriting.inner, "softmax")
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    over_inheriting.softmax(box(over_inheriting, x), 0, False)
    assert over_inheriting.unboxed["unary"] >= 1
    over_host = Boxing(Counting(host.__class__()))
    assert not inherits_composition(over_host.inner, "softmax")
    over_host.softmax(box(over_host, x), 0, False)
    assert over_host.unboxed["unary"] == 0
    # a decorator in between that handles the method itself counts as implementing it
    assert not inherits_composition(Counting(inheriting), "binary")


def test_pass_through_forwards_the_inner_methods_unchanged(host: Backend) -> None:
    dec = Counting(host)
    assert dec.matmul == host.matmul and dec.softmax == host.softmax  # the inner's bound methods, no wrapper
    a = dec.from_numpy(np.ones((2, 2), np.float32))
    assert type(a) is type(host.from_numpy(np.ones(1, np.float32)))  # handles are the inner's
    y = dec.binary("add", dec.binary("mul", a, 2.0), 1.0)
    assert dec.calls["binary"] == 2
    np.testing.assert_array_equal(dec.to_numpy(y), np.full((2, 2), 3.0))


def test_a_decorator_can_be_registered_and_used_as_a_device() -> None:
    from ember.plugins import CONTRACT_VERSION, hookimpl, registry

    made: list[Counting] = []

    def factory(inner: Backend) -> Counting:
        made.append(Counting(inner))
        return made[-1]

    class Plugin:
        @hookimpl
        def register_decorators(self, register: Any) -> None:
            register("counting_test", factory, contract=CONTRACT_VERSION, description="counts binary calls")

    registry.register_plugin(Plugin(), "counting-test")
    dev = Device.flex().counting_test()
    y = ember.ones(3, device=dev) * 2 + 1
    np.testing.assert_array_equal(y.numpy(), np.full(3, 3.0))
    assert dev.stack.calls["binary"] == 2 and dev.stack.base_backend is Device.flex().stack.base_backend


# ------------------------------------------------------------------------------------------------------------
# methods outside the contract
# ------------------------------------------------------------------------------------------------------------
class WithExtra(Backend):
    """An inner stack with an optional method outside the contract."""

    name = "extra"

    def double(self, h: Any) -> Any:
        return 2 * h


def test_optional_methods_are_hidden_by_default() -> None:
    with pytest.raises(AttributeError, match="double"):
        Boxing(WithExtra()).double  # noqa: B018
    assert getattr(Boxing(WithExtra()), "double", None) is None


def test_optional_methods_forwarded_by_policy() -> None:
    class BoundaryExtras(Boxing):
        optional_policy = Policy.BOUNDARY

    class PassExtras(Boxing):
        optional_policy = Policy.PASS

    dec = BoundaryExtras(WithExtra())
    out = dec.double(Box(5))
    assert type(out) is Box and out.v == 10  # lowered, run by the inner stack, wrapped
    assert "double" in vars(dec)  # bound once
    with pytest.raises(AttributeError):
        dec.triple  # noqa: B018
    assert PassExtras(WithExtra()).double(7) == 14


# ------------------------------------------------------------------------------------------------------------
# extension ops
# ------------------------------------------------------------------------------------------------------------
class FakeCall:
    """The part of ember.extension.ExtensionCall that run_extension uses."""

    def __init__(self, args: tuple[Any, ...], kernel: Any, stack: Any = None, kwargs: dict[str, Any] | None = None):
        self.args, self.kernel, self.stack, self.kwargs = args, kernel, stack, kwargs or {}
        self.made: list[FakeCall] = []

    def with_args(self, args: Any, stack: Any = None) -> FakeCall:
        call = FakeCall(tuple(args), self.kernel, stack if stack is not None else self.stack, self.kwargs)
        self.made.append(call)
        return call

    def run_kernel(self, backend: Any) -> Any:
        return self.kernel(backend, *self.args, **self.kwargs)


def test_a_backend_runs_the_kernel_on_its_own_handles(host: Backend) -> None:
    seen: list[Any] = []

    def kernel(backend: Any, x: Any, scale: float = 1.0) -> Any:
        seen.append(backend)
        return backend.binary("mul", x, scale)

    x = host.from_numpy(np.arange(3, dtype=np.float32))
    out = host.run_extension(FakeCall((x,), kernel, host, {"scale": 2.0}))
    assert seen == [host]
    np.testing.assert_array_equal(host.to_numpy(out), [0, 2, 4])


def test_a_decorator_s_default_run_extension_is_a_boundary(host: Backend) -> None:
    dec = Boxing(Boxing(host))
    seen: list[tuple[Any, ...]] = []

    def kernel(backend: Any, x: Any, k: int, y: Any) -> Any:
        seen.append((backend, type(x), k, type(y)))
        return backend.binary("add", x, y), backend.unary("neg", x)

    a = np.arange(4, dtype=np.float32)
    x, y = box(dec, a), box(dec, 2 * a)
    call = FakeCall((x, 3, y), kernel, dec)
    s, n = dec.run_extension(call)
    # the kernel ran once, on the backend at the bottom, with its handles; non-tensor arguments as given
    assert seen == [(host, type(host.from_numpy(a)), 3, type(host.from_numpy(a)))]
    assert call.made[0].stack is dec.inner and type(call.made[0].args[0]) is Box  # one level lowered per decorator
    assert type(s) is Box and type(s.v) is Box  # wrapped back by each decorator on the way up
    np.testing.assert_array_equal(dec.to_numpy(s), 3 * a)
    np.testing.assert_array_equal(dec.to_numpy(n), -a)


def test_records_lazily_is_declared_false_by_default() -> None:
    assert Decorator.records_lazily is False and Boxing.records_lazily is False


# ------------------------------------------------------------------------------------------------------------
# the Differentiable protocol
# ------------------------------------------------------------------------------------------------------------
def test_backends_and_plain_decorators_are_not_differentiable(host: Backend) -> None:
    assert not isinstance(host, Differentiable) and not isinstance(Boxing(host), Differentiable)


def test_a_stack_with_the_gradient_methods_is_differentiable(host: Backend) -> None:
    members = {n: (lambda self, *a, **k: None) for n in _protocol_methods()}
    cls = type("Grads", (Boxing,), {"differentiable": True, **members})
    assert isinstance(cls(host), Differentiable)
    incomplete = type("Incomplete", (Boxing,), {"differentiable": True,
                                                **{n: f for n, f in members.items() if n != "grad_of"}})
    assert not isinstance(incomplete(host), Differentiable)


def _protocol_methods() -> set[str]:
    return {n for n, v in vars(Differentiable).items() if inspect.isfunction(v) and not n.startswith("_")}


def _gradient_calls() -> set[str]:
    """Names core's gradient API calls on a stack (``stack.<name>(...)``) that are not contract methods."""
    names: set[str] = set()
    for rel in ("tensor.py", "autograd.py", "ops/elementwise.py", "ops/reduction.py"):
        tree = ast.parse((SRC / rel).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "stack"):
                names.add(node.func.attr)
    return names - CONTRACT_METHODS


def test_the_protocol_lists_every_gradient_method_core_calls() -> None:
    called = _gradient_calls()
    assert {"requires_grad", "backward", "grad"} <= called  # the scan finds them at all
    assert called <= _protocol_methods(), f"core calls {sorted(called - _protocol_methods())} on differentiable stacks"
    assert _protocol_methods() - called <= {"tracking"}  # nothing listed that core does not need
