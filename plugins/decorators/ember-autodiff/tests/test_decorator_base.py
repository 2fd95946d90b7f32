"""AutodiffBackend on ember.backend.Decorator: its declared policies, the per-call compose hook, and
``run_extension``'s three policies (untracked: the backend's kernel; tracked with a vjp: one graph node; tracked
without: the differentiated composition).

Extension calls are built here with a small stand-in for ``ember.extension.ExtensionCall`` (the same attributes),
so the decorator's policy is tested on its own; the end-to-end tests of ``ember.backend_extension`` live in core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import AutodiffError, Device, PluginError
from ember.autograd import GRAD_MODE
from ember.backend import Decorator, Differentiable
from ember.decorator import Policy
from ember.tensor import Tensor
from ember_autodiff.backend import AutodiffBackend
from ember_autodiff.graph import ADArray

AD = Device.flex().autodiff()
HOST = Device.flex().stack.base_backend  # the host backend's own instance, under any decorator


# ------------------------------------------------------------------------------------------------------------
# declared policies
# ------------------------------------------------------------------------------------------------------------
def test_autodiff_is_a_declared_decorator() -> None:
    stack = AD.stack
    assert isinstance(stack, AutodiffBackend) and isinstance(stack, Decorator)
    assert isinstance(stack, Differentiable) and stack.differentiable
    assert stack.decorator_name == "autodiff" and stack.name.endswith("+autodiff")
    assert stack.base_backend is HOST and not stack.records_lazily
    table = AutodiffBackend.policy
    for name in ("unary", "binary", "matmul", "conv", "reduce", "softmax", "getitem", "full", "run_extension"):
        assert table[name] is Policy.HANDLE, name
    for name in ("arange", "rand", "randn", "argreduce", "randint"):
        assert table[name] is Policy.BOUNDARY, name  # nothing to differentiate
    assert table["adaptive_avg_pool"] is table["interpolate"] is Policy.COMPOSE


def test_no_methods_outside_the_contract_are_forwarded() -> None:
    # an untracked forward of flex's conv_input_grad would silently drop gradients: autodiff hides them
    with pytest.raises(AttributeError):
        AD.stack.conv_input_grad  # noqa: B018


def _spied(name: str) -> tuple[AutodiffBackend, list[Any]]:
    """A fresh autodiff stack over a fresh host backend whose method ``name`` records its calls."""
    inner = type(HOST)()
    seen: list[Any] = []
    original = getattr(inner, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        return original(*args, **kwargs)

    setattr(inner, name, recorded)
    return AutodiffBackend(inner), seen


def test_compose_untracked_runs_the_inner_backend(rng: np.random.Generator) -> None:
    stack, seen = _spied("adaptive_avg_pool")
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    out = stack.adaptive_avg_pool(stack.from_numpy(x), (2, 3))
    assert len(seen) == 1 and type(out) is ADArray and out.meta is None
    ref = torch.nn.functional.adaptive_avg_pool2d(torch.from_numpy(x), (2, 3)).numpy()
    np.testing.assert_allclose(stack.to_numpy(out), ref, rtol=1e-5, atol=1e-6)


def test_compose_tracked_differentiates_the_composition(rng: np.random.Generator) -> None:
    stack, seen = _spied("adaptive_avg_pool")
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    h = stack.from_numpy(x.copy())
    stack.set_requires_grad(h, True)
    out = stack.adaptive_avg_pool(h, (2, 3))
    assert seen == [] and out.meta is not None  # Backend's composition ran on the autodiff stack
    g = rng.standard_normal((1, 2, 2, 3)).astype(np.float32)
    stack.backward([out], [stack.from_numpy(g)], False)
    tx = torch.from_numpy(x).requires_grad_()
    torch.nn.functional.adaptive_avg_pool2d(tx, (2, 3)).backward(torch.from_numpy(g))
    np.testing.assert_allclose(stack.to_numpy(stack.grad_of(h)), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


# ------------------------------------------------------------------------------------------------------------
# run_extension
# ------------------------------------------------------------------------------------------------------------
class FakeOp:
    """The part of ember.extension.ExtensionOp the policies read."""

    def __init__(self, name: str, composition: Callable[..., Any], vjp: Callable[..., Any] | None = None) -> None:
        self.name, self.composition, self.vjp = name, composition, vjp

    @property
    def has_vjp(self) -> bool:
        return self.vjp is not None

    def keeps_output(self, k: int, count: int) -> bool:
        return True  # every output kept for the vjp (ExtensionOp's default)


class FakeCall:
    """The part of ember.extension.ExtensionCall that run_extension uses; records what ran."""

    def __init__(self, op: FakeOp, device: Device, stack: Any, args: tuple[Any, ...], kernel: Callable[..., Any],
                 dtypes: dict[int, Any], kwargs: dict[str, Any] | None = None, log: dict[str, list[Any]] | None = None):
        self.op, self.device, self.stack, self.args, self.kernel = op, device, stack, args, kernel
        self.dtypes, self.kwargs = dtypes, kwargs or {}
        self.log = log if log is not None else {"kernel": [], "composition": [], "backward": []}

    @property
    def tensor_positions(self) -> tuple[int, ...]:
        return tuple(self.dtypes)

    def with_args(self, args: Any, stack: Any = None) -> FakeCall:
        return FakeCall(self.op, self.device, self.stack if stack is None else stack, tuple(args), self.kernel,
                        self.dtypes, self.kwargs, self.log)

    def run_kernel(self, backend: Any) -> Any:
        self.log["kernel"].append((backend, tuple(type(a) for a in self.args)))
        return self.kernel(backend, *self.args, **self.kwargs)

    def run_composition(self) -> Any:
        self.log["composition"].append(GRAD_MODE.enabled)
        ins = tuple(Tensor._make(a, self.dtypes[i], self.device) if i in self.dtypes else a
                    for i, a in enumerate(self.args))
        out = self.op.composition(*ins, **self.kwargs)
        return tuple(o._h for o in out) if isinstance(out, tuple) else out._h

    def backward(self, inputs: tuple[Any, ...], outputs: tuple[Tensor, ...],
                 grads: tuple[Tensor | None, ...]) -> tuple[Any, ...]:
        self.log["backward"].append((GRAD_MODE.enabled, inputs, outputs, grads))
        return tuple(self.op.vjp(inputs, outputs, grads))


def run(op: FakeOp, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, dict[str, list[Any]]]:
    """Call ``op`` through the autodiff stack's run_extension, as core does; returns (Tensor(s), the call's log)."""
    dev = next(a for a in args if isinstance(a, Tensor))._device
    dtypes = {i: a._dtype for i, a in enumerate(args) if isinstance(a, Tensor)}
    call = FakeCall(op, dev, dev.stack, tuple(a._h if isinstance(a, Tensor) else a for a in args), kernel, dtypes,
                    kwargs)
    out = dev.stack.run_extension(call)
    if isinstance(out, tuple):
        return tuple(Tensor._make(h, dev.stack.dtype_of(h), dev) for h in out), call.log
    return Tensor._make(out, dev.stack.dtype_of(out), dev), call.log


def _scaled_mul_kernel(backend: Any, x: Any, w: Any, scale: float) -> Any:
    return backend.binary("mul", backend.binary("mul", x, w), scale)


def _scaled_mul(x: Tensor, w: Tensor, scale: float) -> Tensor:
    return x * w * scale


def _scaled_mul_vjp(inputs: tuple[Any, ...], outputs: tuple[Tensor, ...], grads: tuple[Tensor, ...]) -> tuple:
    x, w, scale = inputs
    (g,) = grads
    return g * w * scale, g * x * scale, None


SCALED_MUL = FakeOp("test.scaled_mul", _scaled_mul, _scaled_mul_vjp)
SCALED_MUL_NO_VJP = FakeOp("test.scaled_mul_novjp", _scaled_mul)


def _data(rng: np.random.Generator, requires_grad: bool = True) -> tuple[np.ndarray, np.ndarray, Tensor, Tensor]:
    x, w = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    return x, w, ember.tensor(x, device=AD, requires_grad=requires_grad), ember.tensor(w, device=AD)


def _torch_grads(x: np.ndarray, w: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    (tx * tw * 1.5).backward(torch.from_numpy(g))
    return tx.grad.numpy(), tw.grad.numpy()


@pytest.mark.parametrize("requires_grad, grad_mode", [(False, True), (True, False)],
                         ids=["nothing-requires-grad", "no-grad-mode"])
def test_untracked_calls_run_the_backend_kernel(rng: np.random.Generator, requires_grad: bool,
                                                grad_mode: bool) -> None:
    x, w, tx, tw = _data(rng, requires_grad)
    with ember.set_grad_enabled(grad_mode):
        out, log = run(SCALED_MUL, _scaled_mul_kernel, tx, tw, 1.5)
    (backend, types), = log["kernel"]
    assert backend is HOST and all(t is not ADArray for t in types[:2])  # the host's own handles
    assert log["composition"] == [] and out.grad_fn is None and not out.requires_grad
    np.testing.assert_allclose(out.numpy(), x * w * 1.5, rtol=1e-6)


def test_tracked_with_a_vjp_is_one_graph_node(rng: np.random.Generator) -> None:
    x, w, tx, tw = _data(rng)
    out, log = run(SCALED_MUL, _scaled_mul_kernel, tx, tw, 1.5)
    assert len(log["kernel"]) == 1 and log["composition"] == []  # forward: the kernel
    assert out.requires_grad and out.grad_fn() == "test.scaled_mulBackward"
    np.testing.assert_allclose(out.numpy(), x * w * 1.5, rtol=1e-6)
    g = rng.standard_normal((3, 4)).astype(np.float32)
    out.backward(ember.tensor(g, device=AD))
    (enabled, inputs, outputs, grads), = log["backward"]
    assert enabled is False  # the vjp runs under no_grad
    assert inputs[2] == 1.5 and all(isinstance(t, Tensor) and t.device is AD for t in (*inputs[:2], *outputs))
    np.testing.assert_allclose(outputs[0].numpy(), x * w * 1.5, rtol=1e-6)
    np.testing.assert_allclose(grads[0].numpy(), g)
    gx, _ = _torch_grads(x, w, g)
    np.testing.assert_allclose(tx.grad.numpy(), gx, rtol=1e-5)
    assert tw.grad is None  # w does not require grad: its gradient is computed by the vjp but goes nowhere


def test_the_vjp_reads_inputs_as_they_were(rng: np.random.Generator) -> None:
    x, w, tx, tw = _data(rng)
    out, _ = run(SCALED_MUL, _scaled_mul_kernel, tx, tw, 1.5)
    with ember.no_grad():
        tw.add_(1.0)  # w was saved for backward: modifying it in place is caught, as for any recorded op
    with pytest.raises(AutodiffError, match="modified by an in-place operation"):
        out.sum().backward()


def test_gradients_come_back_in_the_input_dtype(rng: np.random.Generator) -> None:
    def vjp64(inputs: tuple[Any, ...], outputs: tuple[Tensor, ...], grads: tuple[Tensor, ...]) -> tuple:
        gx, gw, _ = _scaled_mul_vjp(inputs, outputs, grads)
        return gx.double(), gw.double(), None

    x, w, tx, tw = _data(rng)
    out, _ = run(FakeOp("test.scaled_mul64", _scaled_mul, vjp64), _scaled_mul_kernel, tx, tw, 1.5)
    out.sum().backward()
    assert tx.grad.dtype is ember.float32
    np.testing.assert_allclose(tx.grad.numpy(), w * 1.5, rtol=1e-6)


def test_a_vjp_with_the_wrong_number_of_gradients_is_an_error(rng: np.random.Generator) -> None:
    bad = FakeOp("test.bad", _scaled_mul, lambda inputs, outputs, grads: (grads[0],))
    _, _, tx, tw = _data(rng)
    out, _ = run(bad, _scaled_mul_kernel, tx, tw, 1.5)
    with pytest.raises(PluginError, match="test.bad: the vjp returned 1 gradients for 3 inputs"):
        out.sum().backward()


def test_tracked_without_a_vjp_differentiates_the_composition(rng: np.random.Generator) -> None:
    x, w, tx, tw = _data(rng)
    out, log = run(SCALED_MUL_NO_VJP, _scaled_mul_kernel, tx, tw, 1.5)
    assert log["kernel"] == [] and log["composition"] == [True]
    assert out.grad_fn() == "mulBackward"  # the composition's last op
    g = rng.standard_normal((3, 4)).astype(np.float32)
    out.backward(ember.tensor(g, device=AD))
    np.testing.assert_allclose(tx.grad.numpy(), _torch_grads(x, w, g)[0], rtol=1e-5)


def _pair_kernel(backend: Any, x: Any, y: Any) -> tuple[Any, Any]:
    return backend.binary("mul", x, y), backend.binary("add", x, y)


def _pair(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return x * y, x + y


def _pair_vjp(inputs: tuple[Any, ...], outputs: tuple[Tensor, ...], grads: tuple[Tensor, ...]) -> tuple:
    x, y = inputs
    g_prod, g_sum = grads
    return g_prod * y + g_sum, g_prod * x + g_sum


@pytest.mark.parametrize("weights", [(2.0, 3.0), (1.0, None), (None, 1.0)], ids=["both", "first", "second"])
def test_a_multi_output_op_is_one_node(rng: np.random.Generator, weights: tuple[float | None, float | None]) -> None:
    x, y = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    tx, ty = ember.tensor(x, device=AD, requires_grad=True), ember.tensor(y, device=AD, requires_grad=True)
    (p, s), log = run(FakeOp("test.pair", _pair, _pair_vjp), _pair_kernel, tx, ty)
    assert p.grad_fn() == s.grad_fn() == "test.pairBackward"
    loss = sum((t * wt).sum() for t, wt in zip((p, s), weights) if wt is not None)
    loss.backward()
    assert len(log["backward"]) == 1  # one vjp call, whatever number of outputs got gradients
    grads = log["backward"][0][3]
    assert all(g is not None and g.shape == (5,) for g in grads)  # an output without gradient gets zeros
    rx, ry = torch.from_numpy(x).requires_grad_(), torch.from_numpy(y).requires_grad_()
    tl = sum((t * wt).sum() for t, wt in zip((rx * ry, rx + ry), weights) if wt is not None)
    tl.backward()
    np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(ty.grad.numpy(), ry.grad.numpy(), rtol=1e-5)


def test_integer_outputs_are_not_tracked(rng: np.random.Generator) -> None:
    def kernel(backend: Any, x: Any) -> tuple[Any, Any]:
        return backend.binary("mul", x, 2.0), backend.argreduce("argmax", x, None, False)

    def vjp(inputs: tuple[Any, ...], outputs: tuple[Tensor, ...], grads: tuple[Any, ...]) -> tuple:
        assert grads[1] is None  # no gradient for an integer output
        return (grads[0] * 2.0,)

    x = rng.standard_normal(4).astype(np.float32)
    tx = ember.tensor(x, device=AD, requires_grad=True)
    (doubled, idx), _ = run(FakeOp("test.double_argmax", lambda t: (t * 2.0, t.argmax()), vjp), kernel, tx)
    assert doubled.requires_grad and not idx.requires_grad and idx.dtype is ember.int64
    assert int(idx.item()) == int(np.argmax(x))
    doubled.sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), np.full(4, 2.0))


def test_the_policies_hold_under_a_fused_inner_stack(rng: np.random.Generator) -> None:
    # flex+fusion+autodiff where fusion is on: the kernel still gets the host's realized handles
    dev = Device.flex().fusion().autodiff()
    if not isinstance(dev.stack.inner, Decorator):
        pytest.skip("ember-fusion is not installed or EMBER_FUSION=0")
    x, w, tx, tw = _data(rng)
    out, log = run(SCALED_MUL, _scaled_mul_kernel, tx * 1.0, tw, 1.5)  # tx * 1.0: a pending (recorded) input
    assert log["kernel"][0][0] is HOST and all(t is not ADArray for t in log["kernel"][0][1][:2])
    out.sum().backward()
    np.testing.assert_allclose(tx.grad.numpy(), w * 1.5, rtol=1e-6)

