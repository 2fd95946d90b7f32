"""The Tensor API ported PyTorch scripts use (issue 16, item 3), against torch: ``Tensor.data`` (getter and
setter), ``new_zeros/new_ones/new_full/new_empty/new_tensor``, ``Tensor.type``, ``ember.is_tensor``,
``ember.numel``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ember
from ember import DTypeError

DEVICES = ["flex", "flex+autodiff"]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> ember.Device:
    return ember.Device.parse(request.param)


def _param(device: ember.Device, values: list[float]) -> ember.nn.Parameter:
    return ember.nn.Parameter(ember.tensor(np.array(values, np.float32), device=device))


# -- Tensor.data ----------------------------------------------------------------------------------------------
def test_data_is_detached_and_shares_memory(device: ember.Device) -> None:
    p = _param(device, [1.0, 2.0, 3.0])
    d = p.data
    assert type(d) is ember.Tensor and not d.requires_grad and d.is_leaf
    assert p.requires_grad  # a Parameter's flag (only recorded on a device without autodiff)
    d.add_(ember.ones(3, device=device))  # the manual-SGD idiom: p.data.add_(-lr * p.grad)
    np.testing.assert_array_equal(p.numpy(), [2.0, 3.0, 4.0])
    p.data.mul_(0.5).sub_(1.0)
    np.testing.assert_array_equal(p.numpy(), [0.0, 0.5, 1.0])


def test_data_inplace_random_fill_changes_the_module_parameter(device: ember.Device) -> None:
    lin = ember.nn.Linear(4, 3).to(device)
    before = lin.weight.numpy().copy()
    lin.weight.data.normal_(0.0, 0.02)
    after = lin.weight.numpy()
    assert not np.array_equal(before, after) and abs(float(after.std()) - 0.02) < 0.02
    lin.bias.data.fill_(0.25)
    np.testing.assert_array_equal(lin.bias.numpy(), [0.25] * 3)
    assert lin.weight.is_leaf


def test_data_update_is_not_recorded_and_gradients_still_flow() -> None:
    dev = ember.Device.parse("flex+autodiff")
    p, tp = _param(dev, [1.0, -2.0]), torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    for q in (p, tp):
        (q * q).sum().backward()
        q.data.add_(q.grad * -0.1)  # SGD step outside the graph
        q.grad = None
        (q * q).sum().backward()
    assert p.grad is not None and tp.grad is not None and p.grad_fn is None
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy())
    np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy())


def test_data_setter_replaces_contents_shape_and_dtype(device: ember.Device) -> None:
    p = _param(device, [1.0, 2.0])
    t = ember.zeros(2, 3, dtype=ember.float64, device=device)
    p.data = t
    tp = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    tp.data = torch.zeros(2, 3, dtype=torch.float64)
    assert p.shape == tuple(tp.shape) == (2, 3) and p.dtype is ember.float64
    assert p.requires_grad and p.is_leaf and tp.requires_grad
    t.add_(1.0)  # as torch, p now shares t's memory
    np.testing.assert_array_equal(p.numpy(), np.ones((2, 3)))
    assert isinstance(p, ember.nn.Parameter)


def test_data_setter_keeps_a_fitting_grad() -> None:
    dev = ember.Device.parse("flex+autodiff")
    p = _param(dev, [1.0, 2.0])
    (p * 3).sum().backward()
    p.data = ember.tensor(np.array([5.0, 6.0], np.float32), device=dev)
    assert p.grad is not None
    np.testing.assert_array_equal(p.grad.numpy(), [3.0, 3.0])
    (p * p).sum().backward()  # accumulates into the kept grad, with p's new values
    np.testing.assert_array_equal(p.grad.numpy(), [13.0, 15.0])
    p.data = ember.zeros(3, device=dev)  # no longer fits: dropped (torch keeps a mismatched one)
    assert p.grad is None and p.requires_grad


def test_data_setter_errors() -> None:
    dev = ember.Device.parse("flex+autodiff")
    p = _param(dev, [1.0])
    with pytest.raises(DTypeError, match=r"data: expected a Tensor, got list"):
        p.data = [1.0]  # type: ignore[assignment]
    with pytest.raises(DTypeError, match=r"data: .*must be floating point, got ember.int64"):
        p.data = ember.zeros(1, dtype=ember.int64, device=dev)
    np.testing.assert_array_equal(p.numpy(), [1.0])


# -- Tensor.new_* ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["new_zeros", "new_ones", "new_empty"])
@pytest.mark.parametrize("size", [(2, 3), ((2, 3),), ([4],), ((),)], ids=["ints", "tuple", "list", "0d"])
def test_new_filled_defaults_to_self(device: ember.Device, name: str, size: tuple) -> None:
    x = ember.ones(2, dtype=ember.float64, device=device)
    out = getattr(x, name)(*size)
    want = getattr(torch.ones(2, dtype=torch.float64), name)(*size)
    assert out.shape == tuple(want.shape) and out.dtype is ember.float64 and out.device == device
    if name != "new_empty":  # torch's is uninitialised; ember's is zeros
        np.testing.assert_array_equal(out.numpy(), want.numpy())
    else:
        np.testing.assert_array_equal(out.numpy(), np.zeros(want.shape))


def test_new_keywords(device: ember.Device) -> None:
    x = ember.ones(2, device=device)
    z = x.new_zeros(3, dtype=ember.int32)
    assert z.dtype is ember.int32 and z.device == device
    host = ember.Device.parse("flex")
    assert x.new_ones(2, device="flex").device == host
    r = x.new_zeros((2,), requires_grad=True)
    assert r.requires_grad and r.is_leaf


def test_new_full_and_new_tensor_match_torch(device: ember.Device) -> None:
    x, tx = ember.ones(2, dtype=ember.float64, device=device), torch.ones(2, dtype=torch.float64)
    for got, want in (
        (x.new_full((2, 2), 3), tx.new_full((2, 2), 3)),  # int fill value: still self's dtype
        (x.new_full([3], 1.5, dtype=ember.float32), tx.new_full([3], 1.5, dtype=torch.float32)),
        (x.new_tensor([1, 2, 3]), tx.new_tensor([1, 2, 3])),
        (x.new_tensor(7), tx.new_tensor(7)),
        (x.new_tensor([[1, 2]], dtype=ember.int64), tx.new_tensor([[1, 2]], dtype=torch.int64)),
    ):
        assert got.dtype.name == str(want.dtype).removeprefix("torch.") and got.device == device
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_new_tensor_copies_and_detaches(device: ember.Device) -> None:
    src = _param(device, [1.0, 2.0])
    out = src.new_tensor(src)
    assert not out.requires_grad and out.is_leaf and type(out) is ember.Tensor
    src.data.add_(1.0)
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0])  # a copy, not a view
    a = np.array([1.0, 2.0], np.float32)
    t = src.new_tensor(a)
    a[0] = 9.0
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])


def test_new_errors() -> None:
    x = ember.ones(2)
    with pytest.raises(ember.ShapeError, match="new_zeros"):
        x.new_zeros(-1)
    with pytest.raises(DTypeError):
        x.new_ones(2, dtype="nope")


# -- Tensor.type, ember.is_tensor, ember.numel ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                                  "uint8", "bool"])
def test_type_string_matches_torch_on_the_host(name: str) -> None:
    want = torch.zeros(1, dtype=getattr(torch, name)).type()
    assert ember.zeros(1, dtype=name).type() == want.replace("torch.", "ember.")
    assert ember.zeros(1, dtype=name, device="flex+autodiff").type() == want.replace("torch.", "ember.")


def test_type_casts(device: ember.Device) -> None:
    x = ember.tensor(np.array([1.5, -2.5], np.float32), device=device)
    tx = torch.tensor([1.5, -2.5])
    cases = ((ember.int64, torch.int64), ("float64", torch.float64), ("torch.DoubleTensor", "torch.DoubleTensor"),
             ("ember.IntTensor", "torch.IntTensor"), ("HalfTensor", torch.float16))
    for arg, targ in cases:
        got, want = x.type(arg), tx.type(targ)
        assert got.dtype.name == str(want.dtype).removeprefix("torch.") and got.device == device
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert x.type(ember.float32) is x and x.type("torch.FloatTensor") is x  # as torch: self when nothing changes
    with pytest.raises(DTypeError, match=r"type: invalid type 'torch.cuda.FloatTensor'.*\.to\(device\)"):
        x.type("torch.cuda.FloatTensor")


def test_is_tensor_and_numel() -> None:
    x = ember.zeros(2, 3, 4)
    assert ember.is_tensor(x) and ember.is_tensor(ember.nn.Parameter(x))
    assert not ember.is_tensor(np.zeros(2)) and not ember.is_tensor([1]) and not ember.is_tensor(1.0)
    assert ember.numel(x) == torch.numel(torch.zeros(2, 3, 4)) == 24
    assert ember.numel(ember.zeros(0, 5)) == 0 and ember.numel(ember.tensor(3.0)) == 1
    with pytest.raises(DTypeError, match="numel: expected a Tensor, got list"):
        ember.numel([1, 2])  # type: ignore[arg-type]


# -- device mismatches say how to fix them (issue 16, item 9) -------------------------------------------------
def test_module_state_on_another_device_names_model_to() -> None:
    ad = ember.Device.parse("flex+autodiff")
    x = ember.ones(2, 3, device=ad)
    lin = ember.nn.Linear(3, 2)  # on the host device, the inputs on flex+autodiff
    with pytest.raises(ember.DeviceError, match=r"^linear: expected 'weight' on device flex\+autodiff, got flex; "
                       r"call model\.to\('flex\+autodiff'\) on the module holding it .*\.to\('flex'\)$"):
        lin(x)
    lin.to("flex+autodiff")  # the fix the message names works
    assert lin(x).shape == (2, 2)
    emb = ember.nn.Embedding(4, 2)
    with pytest.raises(ember.DeviceError, match=r"^embedding: expected 'weight' .*model\.to\('flex\+autodiff'\)"):
        emb(ember.tensor([0, 3], device=ad))
    bn = ember.nn.BatchNorm1d(3)
    with pytest.raises(ember.DeviceError, match=r"batch_norm: expected '\w+' .*model\.to\('flex\+autodiff'\)"):
        bn(x)


def test_other_arguments_on_another_device_name_to() -> None:
    ad = ember.Device.parse("flex+autodiff")
    F = ember.nn.functional
    for call, op in ((lambda: F.mse_loss(ember.ones(2), ember.ones(2, device=ad)), "mse_loss"),
                     (lambda: F.cross_entropy(ember.ones(2, 3), ember.tensor([0, 1], device=ad)), "cross_entropy"),
                     (lambda: F.binary_cross_entropy(ember.ones(2), ember.ones(2, device=ad)), "binary_cross_entropy")):
        with pytest.raises(ember.DeviceError, match=rf"^{op}: expected 'target' on device flex, got flex\+autodiff; "
                           r"move one with \.to\(device\), e\.g\. target\.to\('flex'\)$"):
            call()
