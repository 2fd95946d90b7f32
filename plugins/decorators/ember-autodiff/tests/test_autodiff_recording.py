"""The recording fast path of binary and unary ops (issue 17): a node serves as its output's meta, a node holds its
vjp's arguments, saved values are kept as version-checked getters. Everything a user can observe stays PyTorch's:
gradients, retain_grad and hooks on non-leaf results, the in-place checks on saved values, freed graphs."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember.errors import AutodiffError

AD = Device.flex().autodiff()
BALANCED = Device.flex().autodiff(checkpointing="balanced")
OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("add", operator.add), ("sub", operator.sub), ("mul", operator.mul), ("div", operator.truediv),
    ("pow", operator.pow), ("maximum", lambda a, b: a.maximum(b) if isinstance(a, ember.Tensor)
                             else torch.maximum(a, b)),
]


def _pair(rng: np.random.Generator, shape_b: tuple[int, ...] = (4, 3)) -> tuple[np.ndarray, np.ndarray]:
    a = rng.uniform(0.5, 2.0, (4, 3)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, shape_b).astype(np.float32)
    return a, b


@pytest.mark.parametrize("dev", [AD, BALANCED], ids=["plain", "balanced"])
@pytest.mark.parametrize("needs", [(True, False), (False, True), (True, True)], ids=["a", "b", "both"])
@pytest.mark.parametrize(("name", "fn"), OPS, ids=[o[0] for o in OPS])
def test_binary_gradients_retain_grad_and_hooks_match_torch(name: str, fn: Callable[[Any, Any], Any],
                                                            needs: tuple[bool, bool], dev: Device) -> None:
    """Each operand that requires grad gets torch's gradient (b broadcast); the non-leaf result keeps its gradient
    (retain_grad) and runs its hook once, with the whole gradient, as torch's."""
    rng = np.random.default_rng(0)
    a_np, b_np = _pair(rng, (3,))
    g_np = rng.standard_normal((4, 3)).astype(np.float32)
    a, b = (ember.tensor(x, device=dev, requires_grad=n) for x, n in zip((a_np, b_np), needs))
    ta, tb = (torch.tensor(x, requires_grad=n) for x, n in zip((a_np, b_np), needs))
    seen: list[np.ndarray] = []
    y = fn(a, b)
    y.retain_grad()
    y.register_hook(lambda g: seen.append(g.numpy().copy()))
    ty = fn(ta, tb)
    ty.retain_grad()
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    (y * ember.tensor(g_np, device=dev)).sum().backward()
    (ty * torch.from_numpy(g_np)).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-6)
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], g_np, rtol=1e-6)
    for ours, theirs, n in ((a, ta, needs[0]), (b, tb, needs[1])):
        if n:
            np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
        else:
            assert ours.grad is None


@pytest.mark.parametrize("scalar", [2.5, 3])
@pytest.mark.parametrize(("name", "fn"), OPS[:5], ids=[o[0] for o in OPS[:5]])
def test_binary_with_a_python_scalar_matches_torch(name: str, fn: Callable[[Any, Any], Any], scalar: float) -> None:
    a_np = np.random.default_rng(1).uniform(0.5, 2.0, (5,)).astype(np.float32)
    for left in (True, False):
        a, ta = ember.tensor(a_np, device=AD, requires_grad=True), torch.tensor(a_np, requires_grad=True)
        (fn(a, scalar) if left else fn(scalar, a)).sum().backward()
        (fn(ta, scalar) if left else fn(scalar, ta)).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)


def test_unary_result_retains_its_gradient_and_hooks_replace_it() -> None:
    x_np = np.linspace(-1.0, 1.0, 6, dtype=np.float32)
    x, tx = ember.tensor(x_np, device=AD, requires_grad=True), torch.tensor(x_np, requires_grad=True)
    y, ty = x.exp(), tx.exp()
    y.retain_grad()
    ty.retain_grad()
    y.register_hook(lambda g: g * 2.0)
    ty.register_hook(lambda g: g * 2.0)
    y.tanh().sum().backward()
    ty.tanh().sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5)
    assert y.grad_fn() == "expBackward"


def test_a_saved_operand_modified_in_place_fails_backward() -> None:
    """a * c saves c (a's gradient reads it): writing c afterwards is caught, as in torch."""
    a = ember.tensor([1.0, 2.0], device=AD, requires_grad=True)
    c = ember.tensor([3.0, 4.0], device=AD)
    y = a * c
    c.add_(1.0)
    with pytest.raises(AutodiffError, match=r"modified by an in-place operation \(version 1, saved at version 0\)"):
        y.sum().backward()


def test_an_unread_operand_may_change_after_recording() -> None:
    """a * c with only c requiring grad reads a alone; a + c reads neither: torch lets later writes pass."""
    a = ember.tensor([1.0, 2.0], device=AD)
    c = ember.tensor([3.0, 4.0], device=AD, requires_grad=True)
    y = c * a + c
    with ember.no_grad():
        c.add_(1.0)  # c itself is not read by either rule
    y.sum().backward()
    np.testing.assert_allclose(c.grad.numpy(), [2.0, 3.0])


def test_an_output_saved_by_its_rule_modified_in_place_fails_backward() -> None:
    x = ember.tensor([0.5, 1.0], device=AD, requires_grad=True)
    y = x.exp() * 1.0  # a non-leaf copy to write into
    z = y.exp()  # exp saves its output
    z.mul_(2.0)
    with pytest.raises(AutodiffError, match="modified by an in-place operation"):
        z.sum().backward()


def test_a_freed_graph_says_so_and_retain_graph_keeps_it() -> None:
    a = ember.tensor([1.0, 2.0], device=AD, requires_grad=True)
    b = ember.tensor([3.0, 4.0], device=AD, requires_grad=True)
    y = (a * b).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(a.grad.numpy(), [6.0, 8.0])
    with pytest.raises(AutodiffError, match="backward through the graph a second time"):
        y.backward()


def test_only_leaves_may_change_requires_grad() -> None:
    a = ember.tensor([1.0], device=AD, requires_grad=True)
    y = a + a
    with pytest.raises(AutodiffError, match="only change requires_grad flags of leaf tensors"):
        y.requires_grad_(False)
    assert y.detach().grad_fn is None and y.detach().is_leaf


def test_untracked_and_no_grad_results_record_nothing() -> None:
    a = ember.tensor([1.0, 2.0], device=AD, requires_grad=True)
    b = ember.tensor([1.0, 2.0], device=AD)
    assert (b * b).grad_fn is None
    assert (a > b).grad_fn is None  # a comparison is not differentiable
    with ember.no_grad():
        assert (a * b).grad_fn is None
