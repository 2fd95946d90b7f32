"""Tensor gradient hooks (``register_hook``, ``register_post_accumulate_grad_hook``) and the hook node module
backward hooks are built on, checked against PyTorch: each scenario runs the same code on torch and on ember and
compares the gradients, the values the hooks saw and the order they ran in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import AutodiffError, Device

FLEX = Device.flex()
AD = FLEX.autodiff()
BAL = FLEX.autodiff(checkpointing="balanced")

X = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], dtype=np.float32)
W = np.array([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.25]], dtype=np.float32)


def _leaf(lib: Any, a: np.ndarray, dev: Any) -> Any:
    if lib is torch:
        return torch.tensor(a, requires_grad=True)
    return ember.tensor(a, device=dev).requires_grad_()


def _np(t: Any) -> np.ndarray | None:
    if t is None:
        return None
    return t.detach().numpy().copy() if isinstance(t, torch.Tensor) else t.numpy().copy()


def _run(scenario: Callable[[Any, Any, list[Any]], Any], dev: Any = AD) -> None:
    """Run ``scenario(lib, dev, log)`` with torch and ember; compare the logs (hook calls with the values they got)
    and the returned gradients."""
    logs: dict[str, list[Any]] = {}
    outs: dict[str, Any] = {}
    for name, lib in (("torch", torch), ("ember", ember)):
        log: list[Any] = []
        outs[name] = scenario(lib, dev, log)
        logs[name] = log
    assert [e[0] for e in logs["ember"]] == [e[0] for e in logs["torch"]], (logs["ember"], logs["torch"])
    for (_, e), (_, t) in zip(logs["ember"], logs["torch"]):
        np.testing.assert_allclose(e, t, rtol=1e-6, atol=1e-6)
    for e, t in zip(outs["ember"], outs["torch"], strict=True):
        if t is None:
            assert e is None
        else:
            np.testing.assert_allclose(_np(e), _np(t), rtol=1e-6, atol=1e-6)


def _logging(log: list[Any], tag: str, scale: float | None = None) -> Callable[[Any], Any]:
    def hook(g: Any) -> Any:
        log.append((tag, _np(g)))
        return None if scale is None else g * scale

    return hook


# ------------------------------------------------------------------------------------------------------------
# register_hook against torch
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dev", [AD, BAL], ids=["autodiff", "balanced"])
def test_leaf_and_non_leaf_hooks_replace_the_gradient(dev: Any) -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x, w = _leaf(lib, X, dev), _leaf(lib, W, dev)
        w.register_hook(_logging(log, "w", 2.0))
        h = x @ w
        h.register_hook(_logging(log, "h", -1.0))
        y = (h.tanh() * h).sum()
        y.backward()
        return x.grad, w.grad

    _run(scenario, dev)


def test_hooks_run_in_registration_order_and_chain() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        h = x * 3
        h.register_hook(_logging(log, "first", 2.0))
        h.register_hook(_logging(log, "second"))  # sees the first hook's result
        h.register_hook(_logging(log, "third", 0.5))
        (h * h).sum().backward()
        return (x.grad,)

    _run(scenario, AD)


def test_a_hook_runs_once_with_the_summed_gradient_of_a_tensor_used_twice() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        x.register_hook(_logging(log, "x"))
        h = x.exp()
        h.register_hook(_logging(log, "h"))
        (h * 2 + h.sin() + x).sum().backward()
        return (x.grad,)

    _run(scenario, AD)


def test_removed_hooks_and_the_context_manager() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        handle = x.register_hook(_logging(log, "removed", 100.0))
        handle.remove()
        handle.remove()  # twice: nothing
        with x.register_hook(_logging(log, "scoped", 3.0)):
            (x * 2).sum().backward()
        (x * 2).sum().backward()  # the scoped hook is gone
        return (x.grad,)

    _run(scenario, AD)


def test_retain_grad_keeps_the_hooked_gradient() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        h = x * 2
        h.retain_grad()  # registered first, still sees the hook's result (PyTorch 2.x)
        h.register_hook(_logging(log, "h", 10.0))
        h.sum().backward()
        return h.grad, x.grad

    _run(scenario, AD)


def test_a_hook_on_the_root_gets_the_seed() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        y = (x * x).sum()
        y.register_hook(_logging(log, "y", 4.0))
        y.backward()
        return (x.grad,)

    _run(scenario, AD)


def test_hooks_fire_on_every_backward_with_retain_graph() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        h = x.sigmoid()
        h.register_hook(_logging(log, "h", 2.0))
        y = h.sum()
        y.backward(retain_graph=True)
        y.backward()
        return (x.grad,)

    _run(scenario, AD)


def test_autograd_grad_runs_the_hooks_on_the_way_to_the_inputs_only() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        a, b = _leaf(lib, X, dev), _leaf(lib, X * 2, dev)
        a.register_hook(_logging(log, "a", 2.0))  # an input: its hook runs and changes the result
        b.register_hook(_logging(log, "b", 5.0))  # not asked for: PyTorch does not run it
        m = a * b
        m.register_hook(_logging(log, "m", -1.0))
        k = m * 3
        k.register_hook(_logging(log, "k"))
        (ga,) = lib.autograd.grad(k.sum(), [a], retain_graph=True)
        (gm,) = lib.autograd.grad((k * k).sum(), [m])  # a non-leaf input: its own hook runs before capture
        return ga, gm, a.grad, b.grad

    _run(scenario, AD)


def test_hooks_registered_before_an_in_place_op_see_the_gradient_of_the_old_value() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        h = x * 2
        h.register_hook(_logging(log, "before"))
        h.mul_(3)
        h.register_hook(_logging(log, "after", 0.5))
        (h * h).sum().backward()
        return (x.grad,)

    _run(scenario, AD)


def test_hooks_run_without_recording() -> None:
    x = _leaf(ember, X, AD)
    seen: list[bool] = []

    def hook(g: ember.Tensor) -> ember.Tensor:
        seen.append(ember.is_grad_enabled())
        return g * x  # would record (x requires grad) if grad mode were on
    h = x * 2
    h.register_hook(hook)
    h.sum().backward()
    assert seen == [False]
    np.testing.assert_allclose(x.grad.numpy(), 2 * X, rtol=1e-6)


def test_a_hook_on_a_parameter_is_shared_by_every_tensor_of_its_handle() -> None:
    lin = ember.nn.Linear(3, 2).to(AD)
    log: list[Any] = []
    lin.weight.register_hook(_logging(log, "w", 0.0))
    lin(ember.tensor(X, device=AD)).sum().backward()
    assert [t for t, _ in log] == ["w"]
    assert not lin.weight.grad.numpy().any() and lin.bias.grad.numpy().any()


# ------------------------------------------------------------------------------------------------------------
# post-accumulate hooks
# ------------------------------------------------------------------------------------------------------------
def test_post_accumulate_hooks_see_the_accumulated_grad() -> None:
    def scenario(lib: Any, dev: Any, log: list[Any]) -> Any:
        x = _leaf(lib, X, dev)
        x.register_hook(_logging(log, "pre", 2.0))
        x.register_post_accumulate_grad_hook(lambda t: log.append(("post", _np(t.grad))))
        handle = x.register_post_accumulate_grad_hook(lambda t: log.append(("removed", _np(t.grad))))
        handle.remove()
        (x * x).sum().backward()
        (x * 3).sum().backward()  # accumulates: the hook sees the running total
        lib.autograd.grad((x * 2).sum(), [x])  # no accumulation: not called
        return (x.grad,)

    _run(scenario, AD)


def test_post_accumulate_hooks_can_step_the_parameter() -> None:
    """The optimizer-in-backward idiom: update and clear each parameter as soon as its gradient is ready."""
    results = []
    for lib in (torch, ember):
        w = _leaf(lib, W, AD)

        def step(p: Any, lib: Any = lib) -> None:
            with lib.no_grad():
                p.sub_(p.grad * 0.1)
            p.grad = None

        w.register_post_accumulate_grad_hook(step)
        for _ in range(3):
            (_leaf(lib, X, AD) @ w).pow(2).sum().backward()
        assert w.grad is None
        results.append(_np(w))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5)


# ------------------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------------------
def test_hooks_on_tensors_that_do_not_require_grad_are_refused() -> None:
    with pytest.raises(AutodiffError, match="doesn't require gradient"):
        ember.tensor(X, device=AD).register_hook(lambda g: g)
    with pytest.raises(AutodiffError, match="doesn't require gradient"):
        ember.tensor(X, device=AD).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(AutodiffError, match="register_hook: .*record no gradients.*autodiff"):
        ember.tensor(X, device=FLEX).requires_grad_().register_hook(lambda g: g)
    with pytest.raises(AutodiffError, match="register_post_accumulate_grad_hook: .*record no gradients"):
        ember.tensor(X, device=FLEX).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(AutodiffError, match="non-leaf"):
        (_leaf(ember, X, AD) * 2).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(AutodiffError, match="callable"):
        _leaf(ember, X, AD).register_hook(3)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda g: g[:1], r"changed the size of value \(was \(2, 3\), got \(1, 3\)\)"),
        (lambda g: g.to(ember.float64), "changed the type of value"),
        (lambda g: g.numpy(), "returned ndarray; expected a Tensor or None"),
        (lambda g: 5, "returned int"),
    ],
    ids=["shape", "dtype", "ndarray", "int"],
)
def test_a_hook_returning_a_wrong_gradient_is_an_error(bad: Callable[[Any], Any], match: str) -> None:
    x = _leaf(ember, X, AD)
    h = x * 2
    h.register_hook(bad)
    with pytest.raises(AutodiffError, match=match):
        h.sum().backward()


def test_a_post_accumulate_hook_returning_a_value_is_an_error() -> None:
    x = _leaf(ember, X, AD)
    x.register_post_accumulate_grad_hook(lambda t: t)
    with pytest.raises(AutodiffError, match="must return None"):
        (x * 2).sum().backward()


# ------------------------------------------------------------------------------------------------------------
# the hook node (module backward hooks' building block)
# ------------------------------------------------------------------------------------------------------------
def test_hook_node_gets_every_output_gradient_once() -> None:
    a, b, c = _leaf(ember, X, AD), ember.tensor(X, device=AD), _leaf(ember, X * 3, AD)
    calls: list[list[np.ndarray | None]] = []

    def hook(gs: list[Any]) -> list[Any]:
        calls.append([_np(g) for g in gs])
        return [None if g is None else g * 2 for g in gs]

    oa, ob, oc = ember.autograd.hook_node("test", [a, b, c], hook)
    assert oa.requires_grad and not ob.requires_grad and oc.requires_grad
    assert oa.grad_fn() == "BackwardHookFunctionBackward"
    np.testing.assert_array_equal(ob.numpy(), X)
    (oa * oa + oa * ob).sum().backward()  # oc unused: None
    assert len(calls) == 1
    np.testing.assert_allclose(calls[0][0], 2 * X + X, rtol=1e-6)
    assert calls[0][1] is None and calls[0][2] is None
    np.testing.assert_allclose(a.grad.numpy(), 2 * (3 * X), rtol=1e-6)
    assert c.grad is None


def test_hook_node_returning_none_keeps_the_gradients_and_untracked_inputs_pass_through() -> None:
    a = _leaf(ember, X, AD)
    (oa,) = ember.autograd.hook_node("test", [a], lambda gs: None)
    (oa * 5).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.full_like(X, 5))
    with ember.no_grad():
        (out,) = ember.autograd.hook_node("test", [a], lambda gs: None)
    assert not out.requires_grad
