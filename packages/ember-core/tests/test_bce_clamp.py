"""F.binary_cross_entropy at and near the edges of [0, 1] against torch: finite values (each log clamped at -100),
torch's gradient (x - t) / max(x * (1 - x), 1e-12) for predictions of exactly 0 or 1 (0 when they are right,
not NaN), with weights and every reduction, on a plain and a differentiable stack."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
import ember.nn.functional as F

X = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.5, 1e-6, 1 - 6e-8, 0.3, 0.999], np.float32)
T = np.array([0.0, 1.0, 1.0, 0.0, 0.5, 0.25, 0.3, 0.0, 1.0, 0.7, 0.1], np.float32)
W = np.linspace(0.5, 2.0, X.size).astype(np.float32)


@pytest.fixture(params=["flex", "flex+autodiff"])
def device(request: pytest.FixtureRequest) -> ember.Device:
    return ember.Device.parse(request.param)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_values_match_torch(device: ember.Device, reduction: str, weighted: bool) -> None:
    w = W if weighted else None
    got = F.binary_cross_entropy(ember.tensor(X, device=device), ember.tensor(T, device=device),
                                 None if w is None else ember.tensor(w, device=device), reduction=reduction)
    want = torch.nn.functional.binary_cross_entropy(torch.tensor(X), torch.tensor(T),
                                                    None if w is None else torch.tensor(w), reduction=reduction)
    assert np.all(np.isfinite(got.numpy()))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_input_gradient_matches_torch(reduction: str, weighted: bool) -> None:
    dev = ember.Device.parse("flex+autodiff")
    x = ember.tensor(X, device=dev, requires_grad=True)
    w = ember.tensor(W, device=dev) if weighted else None
    out = F.binary_cross_entropy(x, ember.tensor(T, device=dev), w, reduction=reduction)
    (out.sum() if reduction == "none" else out).backward()
    tx = torch.tensor(X, requires_grad=True)
    tout = torch.nn.functional.binary_cross_entropy(tx, torch.tensor(T), torch.tensor(W) if weighted else None,
                                                    reduction=reduction)
    (tout.sum() if reduction == "none" else tout).backward()
    assert x.grad is not None and tx.grad is not None
    g, tg = x.grad.numpy(), tx.grad.numpy()
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, tg, rtol=1e-5)
    # exactly right predictions at the edges get 0, exactly wrong ones about +-1e12 (torch's 1 / 1e-12, scaled)
    assert g[0] == 0 and g[1] == 0 and g[2] < -1e10 and g[3] > 1e10


def test_saturated_sigmoid_gives_zero_gradient() -> None:
    """The issue's case: logits 20 and -120 round to sigmoid 1 and 0 in float32; both predictions are right."""
    dev = ember.Device.parse("flex+autodiff")
    z = ember.tensor(np.array([20.0, -120.0], np.float32), device=dev, requires_grad=True)
    loss = F.binary_cross_entropy(ember.sigmoid(z), ember.tensor(np.array([1.0, 0.0], np.float32), device=dev))
    loss.backward()
    tz = torch.tensor([20.0, -120.0], requires_grad=True)
    torch.nn.functional.binary_cross_entropy(torch.sigmoid(tz), torch.tensor([1.0, 0.0])).backward()
    assert loss.item() == 0.0
    assert z.grad is not None and tz.grad is not None
    np.testing.assert_array_equal(z.grad.numpy(), tz.grad.numpy())
    np.testing.assert_array_equal(z.grad.numpy(), [0.0, 0.0])


def test_module_and_float16_edges() -> None:
    """nn.BCELoss takes the same path; float16 edge gradients are 0 where right (the 1e-12 runs in float32; torch
    2.x's float16 CPU backward gives NaN there, so only the interior element is compared with it)."""
    dev = ember.Device.parse("flex+autodiff")
    x = ember.tensor(np.array([0.0, 1.0, 0.25], np.float16), device=dev, requires_grad=True)
    t = ember.tensor(np.array([0.0, 1.0, 1.0], np.float16), device=dev)
    loss = ember.nn.BCELoss(reduction="sum")(x, t)
    loss.backward()
    tx = torch.tensor([0.0, 1.0, 0.25], dtype=torch.float16, requires_grad=True)
    tloss = torch.nn.BCELoss(reduction="sum")(tx, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float16))
    tloss.backward()
    np.testing.assert_allclose(float(loss.item()), float(tloss.item()), rtol=1e-3)
    assert x.grad is not None and tx.grad is not None
    g = x.grad.numpy().astype(np.float32)
    np.testing.assert_array_equal(g[:2], [0.0, 0.0])
    np.testing.assert_allclose(g[2], float(tx.grad[2]), rtol=1e-3)
