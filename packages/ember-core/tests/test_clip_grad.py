"""nn.utils: clip_grad_norm_, clip_grad_value_, get_total_norm, parameters_to_vector, vector_to_parameters vs torch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember import nn
from ember.nn.utils import (
    clip_grad_norm_,
    clip_grad_value_,
    get_total_norm,
    parameters_to_vector,
    vector_to_parameters,
)

torch = pytest.importorskip("torch")
AD = ember.Device.flex().autodiff()
SHAPES = [(3, 4), (5,), (), (2, 2, 2)]


def _pair(seed: int = 0, scale: float = 1.0, device: ember.Device | None = None) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    ep, tp = [], []
    for s in SHAPES:
        w, g = rng.standard_normal(s), rng.standard_normal(s) * scale
        p = nn.Parameter(ember.tensor(w, device=device))
        p.grad = ember.tensor(g, device=device)
        t = torch.tensor(w, requires_grad=True)
        t.grad = torch.tensor(g)
        ep.append(p)
        tp.append(t)
    return ep, tp


@pytest.mark.parametrize("norm_type", [2.0, 1, 3.5, 0.5, math.inf, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
@pytest.mark.parametrize("device", [None, AD], ids=["flex", "autodiff"])
def test_clip_grad_norm_matches_torch(norm_type: float | str, max_norm: float, device: ember.Device | None) -> None:
    ep, tp = _pair(device=device)
    et = clip_grad_norm_(ep, max_norm, norm_type=norm_type)
    tt = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type=float(norm_type))
    assert isinstance(et, ember.Tensor) and et.shape == () and et.dtype is ember.float64
    np.testing.assert_allclose(et.item(), tt.item(), rtol=1e-13)
    for p, t in zip(ep, tp):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-13, atol=1e-15)
    new_norm = get_total_norm([p.grad for p in ep], norm_type).item()
    assert new_norm <= max_norm * (1 + 1e-9) if max_norm < 1 else new_norm == pytest.approx(et.item())


def test_clip_grad_norm_after_backward_and_single_tensor() -> None:
    w = nn.Parameter(ember.tensor(np.arange(6.0).reshape(2, 3), device=AD))
    (w * w).sum().backward()
    total = clip_grad_norm_(w, 1.0)  # a lone tensor is accepted
    g = 2 * np.arange(6.0).reshape(2, 3)
    assert total.item() == pytest.approx(np.linalg.norm(g))
    np.testing.assert_allclose(w.grad.numpy(), g / (np.linalg.norm(g) + 1e-6), rtol=1e-12)


def test_clip_grad_norm_float32_smoke() -> None:
    rng = np.random.default_rng(2)
    g = rng.standard_normal((4, 4)).astype(np.float32) * 10
    p, t = nn.Parameter(ember.zeros(4, 4)), torch.zeros(4, 4, requires_grad=True)
    p.grad, t.grad = ember.tensor(g), torch.tensor(g)
    et, tt = clip_grad_norm_([p], 2.0), torch.nn.utils.clip_grad_norm_([t], 2.0)
    assert et.dtype is ember.float32 and p.grad.dtype is ember.float32
    np.testing.assert_allclose(et.item(), tt.item(), rtol=1e-6)
    np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-6)


def test_clip_grad_norm_skips_params_without_grad() -> None:
    a, b = nn.Parameter(ember.ones(2)), nn.Parameter(ember.ones(2))
    a.grad = ember.tensor([3.0, 4.0])
    assert clip_grad_norm_([a, b], 1.0).item() == pytest.approx(5.0)
    assert b.grad is None
    assert a.grad.tolist() == pytest.approx([0.6, 0.8], rel=1e-6)
    none = clip_grad_norm_([b], 1.0)
    assert none.item() == 0.0 and none.shape == ()


def test_clip_grad_norm_nonfinite() -> None:
    a = nn.Parameter(ember.ones(2))
    a.grad = ember.tensor([math.inf, 1.0])
    with pytest.raises(ember.ValueRangeError, match="total norm of order 2.0 .* is non-finite.*error_if_nonfinite"):
        clip_grad_norm_([a], 1.0, error_if_nonfinite=True)
    assert a.grad.tolist()[1] == 1.0  # untouched when raising
    total = clip_grad_norm_([a], 1.0)  # as torch: scales by the non-finite norm
    t = torch.ones(2, requires_grad=True)
    t.grad = torch.tensor([math.inf, 1.0])
    tt = torch.nn.utils.clip_grad_norm_([t], 1.0)
    assert math.isinf(total.item()) and math.isinf(tt.item())
    np.testing.assert_array_equal(a.grad.numpy(), t.grad.numpy())


def test_clip_grad_norm_errors() -> None:
    a = nn.Parameter(ember.ones(2))
    a.grad = ember.ones(2)
    with pytest.raises(ember.ValueRangeError, match="clip_grad_norm_: norm_type must be a number or 'inf'"):
        clip_grad_norm_([a], 1.0, norm_type="fro")
    with pytest.raises(ember.ValueRangeError, match="max_norm must be a number"):
        clip_grad_norm_([a], "big")
    with pytest.raises(ember.DTypeError, match="one of the parameters is int"):
        clip_grad_norm_([a, 1], 1.0)
    with pytest.raises(ember.DTypeError, match="iterable of Tensors, got int"):
        clip_grad_norm_(3, 1.0)
    b = nn.Parameter(ember.ones(2, device=AD))
    b.grad = ember.ones(2, device=AD)
    with pytest.raises(ember.DeviceError, match="same device"):
        clip_grad_norm_([a, b], 1.0)


@pytest.mark.parametrize("device", [None, AD], ids=["flex", "autodiff"])
def test_clip_grad_value_matches_torch(device: ember.Device | None) -> None:
    ep, tp = _pair(1, scale=3.0, device=device)
    assert clip_grad_value_(ep, 1.5) is None
    torch.nn.utils.clip_grad_value_(tp, 1.5)
    for p, t in zip(ep, tp):
        np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())
    assert max(np.abs(p.grad.numpy()).max() for p in ep) == 1.5


def test_clip_grad_value_errors() -> None:
    with pytest.raises(ember.ValueRangeError, match="clip_value must be non-negative, got -1.0"):
        clip_grad_value_([nn.Parameter(ember.ones(1))], -1)
    with pytest.raises(ember.ValueRangeError, match="clip_value must be a number"):
        clip_grad_value_([nn.Parameter(ember.ones(1))], None)


def test_parameters_to_vector_and_back() -> None:
    ep, tp = _pair(3)
    ev = parameters_to_vector(ep)
    tv = torch.nn.utils.parameters_to_vector(tp)
    np.testing.assert_array_equal(ev.numpy(), tv.detach().numpy())
    assert ev.shape == (12 + 5 + 1 + 8,)
    ids = [id(p) for p in ep]
    vector_to_parameters(ev * 2, ep)
    torch.nn.utils.vector_to_parameters(tv * 2, tp)
    assert [id(p) for p in ep] == ids
    for p, t in zip(ep, tp):
        assert p.shape == tuple(t.shape)
        np.testing.assert_array_equal(p.numpy(), t.detach().numpy())


def test_vector_to_parameters_on_autodiff_device_keeps_leaves() -> None:
    ps = [nn.Parameter(ember.ones(2, 2, device=AD)), nn.Parameter(ember.ones(3, device=AD))]
    vector_to_parameters(ember.arange(7, dtype=ember.float32, device=AD), ps)
    assert ps[0].tolist() == [[0, 1], [2, 3]] and ps[1].tolist() == [4, 5, 6]
    assert all(p.is_leaf and p.requires_grad for p in ps)


def test_vector_helpers_errors() -> None:
    ps = [nn.Parameter(ember.ones(2)), nn.Parameter(ember.ones(3))]
    with pytest.raises(ember.ShapeError, match="the vector has 4 elements but the parameters have 5"):
        vector_to_parameters(ember.ones(4), ps)
    with pytest.raises(ember.ShapeError, match=r"expected a 1-D vector, got shape \(5, 1\)"):
        vector_to_parameters(ember.ones(5, 1), ps)
    with pytest.raises(ember.DTypeError, match="expected a Tensor, but got list"):
        vector_to_parameters([1.0] * 5, ps)
    with pytest.raises(ember.DeviceError, match="different devices"):
        parameters_to_vector([ps[0], nn.Parameter(ember.ones(1, device=AD))])
    with pytest.raises(ember.ValueRangeError, match="got no parameters"):
        parameters_to_vector([])
