"""addcmul / addcdiv / lerp_ and their in-place twins against torch: values, promotion, broadcasting, gradients and
the refusals (bool, integer division, a target that would have to broadcast or change dtype)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device

RNG = np.random.default_rng(7)
A, B, C = RNG.standard_normal((2, 3)), RNG.standard_normal((3,)), RNG.uniform(0.5, 2.0, (2, 1))


@pytest.mark.parametrize("name", ["addcmul", "addcdiv"])
@pytest.mark.parametrize("value", [1, 0.5, -2])
def test_values_and_gradients_match_torch(name: str, value: Any) -> None:
    dev = Device.parse("flex+autodiff")
    xs = [ember.tensor(a, dtype=ember.float64, device=dev, requires_grad=True) for a in (A, B, C)]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (A, B, C)]
    out, ref = getattr(ember, name)(*xs, value=value), getattr(torch, name)(*ts, value=value)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    w = np.arange(6, dtype=np.float64).reshape(2, 3)
    (out * ember.tensor(w, device=dev)).sum().backward()
    (ref * torch.tensor(w)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("dtypes", [("int64", "int64", "int64"), ("float32", "int64", "int64"),
                                    ("int64", "float32", "float32"), ("int32", "int64", "float64")])
@pytest.mark.parametrize("value", [1, 0.5, 3])
def test_addcmul_promotes_and_casts_value_as_torch(dtypes: tuple[str, str, str], value: Any) -> None:
    arrs = [np.array([[1, -2, 3]]).astype(d) for d in dtypes]
    out = ember.addcmul(*(ember.tensor(a) for a in arrs), value=value)
    ref = torch.addcmul(*(torch.tensor(a) for a in arrs), value=value)
    assert out.dtype.name == str(ref.dtype).removeprefix("torch.")
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)


@pytest.mark.parametrize("spec", ["flex", "flex+fusion(False)", "toy"])
def test_in_place_twins(spec: str) -> None:
    dev = Device.parse(spec)
    for name, args in (("addcmul_", (B, B)), ("addcdiv_", (B, C[0])), ("lerp_", (B, 0.25))):
        x = ember.tensor(A, device=dev)
        t = torch.tensor(A)
        view = x[0]
        r = getattr(x, name)(*(ember.tensor(a, device=dev) if isinstance(a, np.ndarray) else a for a in args))
        getattr(t, name)(*(torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args))
        assert r is x
        np.testing.assert_allclose(x.numpy(), t.numpy(), rtol=1e-12)
        np.testing.assert_allclose(view.numpy(), t.numpy()[0], rtol=1e-12)  # written in place: views see it


def test_refusals_are_typed_and_name_the_op() -> None:
    i = ember.tensor([1, 2, 3])
    f = ember.tensor([1.0, 2.0, 3.0])
    with pytest.raises(ember.DTypeError, match="addcdiv: integer division"):
        ember.addcdiv(f, i, i)
    with pytest.raises(ember.DTypeError, match="addcmul: not implemented for bool"):
        ember.addcmul(*(ember.tensor([True, False]),) * 3)
    with pytest.raises(ember.DTypeError, match="addcmul: tensor2 must be a Tensor"):
        ember.addcmul(f, f, 2.0)
    with pytest.raises(ember.DTypeError, match="addcmul: value must be a number"):
        ember.addcmul(f, f, f, value="2")
    with pytest.raises(ember.DTypeError, match="addcmul_: result type float32 can't be cast"):
        i.addcmul_(f, f)
    with pytest.raises(ember.ShapeError, match=r"addcdiv_: output with shape \(3,\) doesn't match the broadcast"):
        f.addcdiv_(ember.ones(2, 3), f)
    with pytest.raises(ember.DeviceError):
        ember.addcmul(f, f, ember.tensor([1.0, 2.0, 3.0], device=Device.parse("flex+fusion(False)")))
    for args in ((torch.tensor([1.0, 2, 3]), torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3])),):
        with pytest.raises(RuntimeError):  # torch refuses the same integer division
            torch.addcdiv(*args)


def test_inference_mode_is_no_grad_in_every_form() -> None:
    dev = Device.parse("flex+autodiff")
    x = ember.ones(2, device=dev, requires_grad=True)
    with ember.inference_mode():
        assert not ember.is_grad_enabled() and not (x * 2).requires_grad
    assert ember.is_grad_enabled()

    @ember.inference_mode
    def bare(a: Any) -> Any:
        return a * 2

    @ember.inference_mode()
    def called(a: Any) -> Any:
        return a * 2

    assert not bare(x).requires_grad and not called(x).requires_grad and bare.__name__ == "bare"
    with ember.inference_mode(False):
        assert (x * 2).requires_grad  # mode=False leaves grad mode on, as torch
    with ember.no_grad(), ember.inference_mode(False):
        assert not ember.is_grad_enabled()  # ... and off where it was off
    with torch.inference_mode(False), torch.no_grad():
        assert not torch.is_grad_enabled()  # the same rule in torch
