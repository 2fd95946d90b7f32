"""ember.nn.layers against torch.nn: forward and backward (input grads and every parameter grad) for identical
weights (copied through state_dict) and inputs in float64 on the differentiable device, train/eval behaviour,
running statistics, default initialisation, reprs and the typed errors of bad input."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import ember
from ember import nn
from ember.nn import layers as L

torch = pytest.importorskip("torch")
tnn = torch.nn

DEV = ember.Device.flex().autodiff()
F64 = ember.float64


def rnd(shape: tuple[int, ...], seed: int = 0, positive: bool = False) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape)
    return np.abs(a) + 0.1 if positive else a


def load_from_torch(e_mod: nn.Module, t_mod: Any) -> None:
    e_mod.load_state_dict({k: ember.tensor(v.detach().numpy(), device=DEV) for k, v in t_mod.state_dict().items()})


def compare(e_mod: nn.Module, t_mod: Any, inputs: list[np.ndarray], *, grad_inputs: bool = True,
            copy: bool = True, tol: float = 1e-10, seed: int = 99, kwargs: dict | None = None) -> None:
    """Same forward output, input grads and parameter grads for e_mod and t_mod (float64)."""
    kwargs = kwargs or {}
    if copy:
        load_from_torch(e_mod, t_mod)
    t_in = [torch.tensor(a, requires_grad=grad_inputs and a.dtype.kind == "f") for a in inputs]
    e_in = [ember.tensor(a, device=DEV, requires_grad=grad_inputs and a.dtype.kind == "f") for a in inputs]
    t_out = t_mod(*t_in, **kwargs)
    e_out = e_mod(*e_in, **kwargs)
    assert tuple(e_out.shape) == tuple(t_out.shape)
    assert e_out.dtype == F64
    np.testing.assert_allclose(e_out.detach().numpy(), t_out.detach().numpy(), rtol=tol, atol=tol)
    assert e_out.requires_grad == t_out.requires_grad
    if not t_out.requires_grad:
        return
    g = rnd(tuple(t_out.shape), seed)
    (t_out * torch.tensor(g)).sum().backward()
    (e_out * ember.tensor(g, device=DEV)).sum().backward()
    for i, (te, ee) in enumerate(zip(t_in, e_in)):
        if te.requires_grad:
            np.testing.assert_allclose(ee.grad.numpy(), te.grad.numpy(), rtol=tol, atol=tol, err_msg=f"input {i}")
    t_params = dict(t_mod.named_parameters())
    e_params = dict(e_mod.named_parameters())
    assert sorted(t_params) == sorted(e_params)
    for name, tp in t_params.items():
        if tp.grad is None:
            assert e_params[name].grad is None or not np.any(e_params[name].grad.numpy()), name
            continue
        np.testing.assert_allclose(e_params[name].grad.numpy(), tp.grad.numpy(), rtol=tol, atol=tol, err_msg=name)


def build(e_cls: Any, t_cls: Any, *args: Any, **kw: Any) -> tuple[nn.Module, Any]:
    e = e_cls(*args, **kw, device=DEV, dtype=F64)
    t = t_cls(*args, **kw, dtype=torch.float64)
    return e, t


# ----------------------------------------------------------------------------------------------------------
# Linear, Bilinear, Identity
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (4,)])
def test_linear(bias, shape):
    e, t = build(L.Linear, tnn.Linear, 4, 3, bias=bias)
    compare(e, t, [rnd(shape)])


def test_bilinear():
    e, t = build(L.Bilinear, tnn.Bilinear, 3, 4, 5)
    compare(e, t, [rnd((2, 6, 3), 1), rnd((2, 6, 4), 2)])


def test_identity_passes_input_and_ignores_args():
    x = ember.randn(2, 3)
    assert L.Identity(54, unused="x")(x) is x
    assert repr(L.Identity()) == "Identity()"


def test_linear_default_init_bounds():
    m = L.Linear(50, 400)
    w, b = m.weight.numpy(), m.bias.numpy()
    bound = 1 / math.sqrt(50)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.98 * bound
    assert np.abs(b).max() <= bound
    assert w.std() == pytest.approx(bound / math.sqrt(3), rel=0.03)
    assert m.weight.dtype == ember.float32


def test_factory_kwargs_place_parameters():
    m = L.Linear(3, 2, device=DEV, dtype="float64")
    assert m.weight.device == DEV and m.weight.dtype == F64 and m.bias.dtype == F64
    assert m.weight.requires_grad and m.weight.is_leaf
    bn = L.BatchNorm1d(3, device=DEV, dtype="float64")
    assert bn.running_mean.dtype == F64 and bn.num_batches_tracked.dtype == ember.int64


def test_linear_float32_smoke():
    t = tnn.Linear(4, 3)
    e = L.Linear(4, 3).to(DEV)
    load_from_torch(e, t)
    x = rnd((2, 4)).astype(np.float32)
    np.testing.assert_allclose(e(ember.tensor(x, device=DEV)).detach().numpy(), t(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_linear_errors_name_module_and_shapes():
    m = L.Linear(4, 3)
    with pytest.raises(ember.ShapeError) as ei:
        m(ember.randn(2, 5))
    assert str(ei.value) == "Linear(in_features=4, out_features=3, bias=True): expected input with last dim 4, " \
                            "got shape (2, 5)"
    with pytest.raises(ember.DTypeError, match=r"Linear\(.*\): expected a Tensor input, got ndarray"):
        m(np.zeros((2, 4)))
    with pytest.raises(ember.ValueRangeError, match="Linear: in_features must be a non-negative int, got -1"):
        L.Linear(-1, 3)
    with pytest.raises(ember.ShapeError, match=r"Bilinear\(in1_features=3, in2_features=4.*\(2, 3\) and \(2, 5\)"):
        L.Bilinear(3, 4, 5)(ember.randn(2, 3), ember.randn(2, 5))


# ----------------------------------------------------------------------------------------------------------
# convolutions
# ----------------------------------------------------------------------------------------------------------
CONV = [
    (1, dict(kernel_size=3), (2, 4, 9)),
    (1, dict(kernel_size=3, stride=2, padding=1, dilation=2, groups=2, bias=False), (2, 4, 11)),
    (1, dict(kernel_size=4, padding="same", padding_mode="circular"), (2, 4, 9)),
    (2, dict(kernel_size=(3, 2), padding=1), (2, 4, 7, 6)),
    (2, dict(kernel_size=3, padding=2, padding_mode="reflect"), (2, 4, 6, 7)),
    (2, dict(kernel_size=3, padding=(1, 2), padding_mode="replicate", stride=2), (4, 6, 5)),
    (2, dict(kernel_size=3, padding="same", dilation=2, groups=4), (1, 4, 6, 6)),
    (2, dict(kernel_size=2, padding="valid"), (1, 4, 5, 5)),
    (3, dict(kernel_size=2, stride=(1, 2, 1), padding=1), (1, 4, 4, 5, 3)),
    (3, dict(kernel_size=3, padding=1, padding_mode="circular"), (1, 4, 3, 4, 3)),
]


@pytest.mark.parametrize("nd,kw,xshape", CONV, ids=[f"{c[0]}d-{i}" for i, c in enumerate(CONV)])
def test_conv(nd, kw, xshape):
    e, t = build(getattr(L, f"Conv{nd}d"), getattr(tnn, f"Conv{nd}d"), 4, 8, **kw)
    assert repr(e) == repr(t)
    compare(e, t, [rnd(xshape)])


CONVT = [
    (1, dict(kernel_size=3, stride=2, padding=1, output_padding=1), (2, 4, 5)),
    (1, dict(kernel_size=2, groups=2, dilation=2, bias=False), (4, 6)),
    (2, dict(kernel_size=3, stride=2, padding=1), (2, 4, 4, 5)),
    (2, dict(kernel_size=(2, 3), stride=(2, 1), output_padding=(1, 0)), (1, 4, 3, 3)),
    (3, dict(kernel_size=2, stride=2), (1, 4, 2, 3, 2)),
]


@pytest.mark.parametrize("nd,kw,xshape", CONVT, ids=[f"{c[0]}d-{i}" for i, c in enumerate(CONVT)])
def test_conv_transpose(nd, kw, xshape):
    e, t = build(getattr(L, f"ConvTranspose{nd}d"), getattr(tnn, f"ConvTranspose{nd}d"), 4, 6, **kw)
    assert repr(e) == repr(t)
    compare(e, t, [rnd(xshape)])


def test_conv_transpose_output_size():
    e, t = build(L.ConvTranspose2d, tnn.ConvTranspose2d, 3, 2, 3, stride=2, padding=1)
    x = rnd((1, 3, 4, 4))
    for size in ([8, 8], [1, 2, 7, 8], (8, 7)):
        compare(e, t, [x], kwargs=dict(output_size=size))
    with pytest.raises(ember.ValueRangeError, match=r"ConvTranspose2d\(3, 2.*valid sizes range from 7 to 8"):
        e(ember.tensor(x, device=DEV), output_size=[9, 9])


def test_conv_default_init_and_weight_shapes():
    c = L.Conv2d(4, 6, 3, groups=2)
    assert c.weight.shape == (6, 2, 3, 3) and c.bias.shape == (6,)
    bound = 1 / math.sqrt(2 * 9)
    assert np.abs(c.weight.numpy()).max() <= bound and np.abs(c.bias.numpy()).max() <= bound
    ct = L.ConvTranspose2d(4, 6, 3, groups=2)
    assert ct.weight.shape == (4, 3, 3, 3)


def test_conv_errors():
    c = L.Conv2d(3, 8, 3)
    with pytest.raises(ember.ShapeError) as ei:
        c(ember.randn(2, 4, 8, 8))
    msg = str(ei.value)
    assert msg.startswith("Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1)): expected input with 3 channels")
    assert "(2, 4, 8, 8)" in msg
    with pytest.raises(ember.ShapeError, match=r"Conv2d\(3, 8.*expected 3D \(unbatched\) or 4D \(batched\) input, "
                                               r"got shape \(8, 8\)"):
        c(ember.randn(8, 8))
    with pytest.raises(ember.ShapeError, match=r"ConvTranspose1d\(2, 3.*expected input with 2 channels"):
        L.ConvTranspose1d(2, 3, 2)(ember.randn(1, 3, 5))
    with pytest.raises(ember.ValueRangeError, match="in_channels \\(3\\) must be divisible by groups \\(2\\)"):
        L.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ember.ValueRangeError, match="padding='same' is not supported for strided"):
        L.Conv1d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ember.ValueRangeError, match="padding_mode must be one of"):
        L.Conv1d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ember.ValueRangeError, match="only 'zeros' padding mode"):
        L.ConvTranspose2d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(ember.ValueRangeError, match="invalid padding string 'full'"):
        L.Conv2d(3, 4, 3, padding="full")
    with pytest.raises(ember.ValueRangeError, match="kernel_size must be a positive int"):
        L.Conv2d(3, 4, (3, 0))


# ----------------------------------------------------------------------------------------------------------
# pooling, resampling, shape
# ----------------------------------------------------------------------------------------------------------
POOL = [
    ("MaxPool1d", (3,), dict(stride=2, padding=1), (2, 3, 9)),
    ("MaxPool2d", (2,), {}, (2, 3, 6, 7)),
    ("MaxPool2d", (3,), dict(stride=2, padding=1, dilation=1, ceil_mode=True), (3, 7, 8)),
    ("MaxPool3d", (2,), dict(stride=1), (1, 2, 3, 4, 3)),
    ("AvgPool1d", (3,), dict(stride=2, padding=1, count_include_pad=False), (2, 3, 9)),
    ("AvgPool2d", (2,), dict(ceil_mode=True), (2, 3, 5, 7)),
    ("AvgPool2d", (3,), dict(stride=1, padding=1, divisor_override=4), (1, 2, 5, 5)),
    ("AvgPool3d", ((2, 1, 2),), {}, (1, 2, 4, 3, 4)),
    ("AdaptiveAvgPool1d", (4,), {}, (2, 3, 10)),
    ("AdaptiveAvgPool2d", ((3, None),), {}, (2, 3, 7, 5)),
    ("AdaptiveAvgPool3d", (2,), {}, (1, 2, 5, 4, 3)),
    ("AdaptiveMaxPool1d", (3,), {}, (2, 3, 10)),
    ("AdaptiveMaxPool2d", ((2, 3),), {}, (2, 7, 8)),
    ("Upsample", (), dict(scale_factor=2, mode="nearest"), (1, 2, 3, 4)),
    ("Upsample", (), dict(size=(5, 7), mode="bilinear", align_corners=False), (1, 2, 3, 4)),
    ("Upsample", (), dict(scale_factor=1.5, mode="linear", align_corners=True), (2, 2, 4)),
    ("UpsamplingBilinear2d", (), dict(scale_factor=2), (1, 2, 3, 3)),
    ("UpsamplingNearest2d", (), dict(size=5), (1, 2, 3, 3)),
    ("Flatten", (), {}, (2, 3, 4, 5)),
    ("Flatten", (0, 2), {}, (2, 3, 4, 5)),
    ("Unflatten", (1, (2, 3)), {}, (4, 6, 5)),
    ("PixelShuffle", (2,), {}, (1, 8, 3, 3)),
    ("PixelUnshuffle", (2,), {}, (1, 2, 4, 6)),
]


@pytest.mark.parametrize("name,args,kw,xshape", POOL, ids=[f"{c[0]}-{i}" for i, c in enumerate(POOL)])
def test_parameter_free_layers(name, args, kw, xshape):
    e, t = getattr(L, name)(*args, **kw), getattr(tnn, name)(*args, **kw)
    assert repr(e) == repr(t)
    compare(e, t, [rnd(xshape)], copy=False)


def test_pool_return_indices():
    x = rnd((2, 3, 6, 6))
    ev, ei = L.MaxPool2d(2, return_indices=True)(ember.tensor(x))
    tv, ti = tnn.MaxPool2d(2, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(ev.numpy(), tv.numpy())
    np.testing.assert_array_equal(ei.numpy(), ti.numpy())
    ev, ei = L.AdaptiveMaxPool2d(3, return_indices=True)(ember.tensor(x))
    tv, ti = tnn.AdaptiveMaxPool2d(3, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(ei.numpy(), ti.numpy())


def test_pool_and_shape_errors():
    with pytest.raises(ember.ShapeError, match=r"MaxPool2d\(kernel_size=2.*expected 3D \(unbatched\) or 4D"):
        L.MaxPool2d(2)(ember.randn(2, 2, 3, 4, 4))
    with pytest.raises(ember.ShapeError, match=r"AdaptiveAvgPool1d\(output_size=2\): expected 2D"):
        L.AdaptiveAvgPool1d(2)(ember.randn(4))
    with pytest.raises(ember.DimError):
        L.Flatten(1, 5)(ember.randn(2, 3))
    with pytest.raises(ember.ShapeError):
        L.Unflatten(1, (4, 4))(ember.randn(2, 6))


# ----------------------------------------------------------------------------------------------------------
# normalisation
# ----------------------------------------------------------------------------------------------------------
BN = [
    ("BatchNorm1d", dict(), (6, 4)),
    ("BatchNorm1d", dict(momentum=None), (5, 4, 3)),
    ("BatchNorm2d", dict(affine=False), (3, 4, 2, 3)),
    ("BatchNorm2d", dict(track_running_stats=False), (3, 4, 2, 3)),
    ("BatchNorm3d", dict(momentum=0.3, eps=1e-3), (2, 4, 2, 2, 3)),
    ("InstanceNorm1d", dict(affine=True), (2, 4, 6)),
    ("InstanceNorm2d", dict(), (2, 4, 3, 5)),
    ("InstanceNorm2d", dict(affine=True, track_running_stats=True), (2, 4, 3, 5)),
    ("InstanceNorm2d", dict(track_running_stats=True, momentum=None), (4, 3, 5)),
    ("InstanceNorm3d", dict(affine=True), (2, 4, 2, 3, 2)),
]


@pytest.mark.parametrize("name,kw,xshape", BN, ids=[f"{c[0]}-{i}" for i, c in enumerate(BN)])
def test_batch_and_instance_norm_train_steps_then_eval(name, kw, xshape):
    e, t = build(getattr(L, name), getattr(tnn, name), 4, **kw)
    assert repr(e) == repr(t)
    load_from_torch(e, t)
    if e.weight is not None:  # non-trivial affine parameters
        with torch.no_grad():
            t.weight.copy_(torch.tensor(rnd((4,), 5)))
            t.bias.copy_(torch.tensor(rnd((4,), 6)))
    for step in range(3):  # running stats after several steps
        e.zero_grad()
        t.zero_grad()
        compare(e, t, [rnd(xshape, 10 + step) * 2 + 1], seed=step)
        sd_e, sd_t = e.state_dict(), t.state_dict()
        assert list(sd_e) == list(sd_t)
        for k in sd_t:
            np.testing.assert_allclose(sd_e[k].numpy(), sd_t[k].numpy(), rtol=1e-12, atol=1e-12, err_msg=k)
        if "num_batches_tracked" in sd_t and name.startswith("BatchNorm"):  # instance norm never counts
            assert sd_e["num_batches_tracked"].dtype == ember.int64
            assert sd_e["num_batches_tracked"].item() == step + 1
    e.eval()
    t.eval()
    compare(e, t, [rnd(xshape, 20)], copy=False)


def test_batchnorm_eval_uses_running_stats():
    bn = L.BatchNorm1d(2, device=DEV, dtype=F64)
    with ember.no_grad():
        bn.running_mean.copy_(ember.tensor([1.0, -1.0]))
        bn.running_var.copy_(ember.tensor([4.0, 0.25]))
    bn.eval()
    x = np.array([[3.0, 0.0], [1.0, -1.0]])
    out = bn(ember.tensor(x, device=DEV)).detach().numpy()
    np.testing.assert_allclose(out, (x - [1.0, -1.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-5))
    assert bn.num_batches_tracked.item() == 0  # eval does not count batches


def test_norm_defaults():
    bn = L.BatchNorm2d(3)
    np.testing.assert_array_equal(bn.weight.numpy(), np.ones(3))
    np.testing.assert_array_equal(bn.bias.numpy(), np.zeros(3))
    np.testing.assert_array_equal(bn.running_var.numpy(), np.ones(3))
    inn = L.InstanceNorm2d(3)
    assert inn.weight is None and inn.running_mean is None and not inn.affine and not inn.track_running_stats
    assert list(L.BatchNorm1d(3, track_running_stats=False).state_dict()) == ["weight", "bias"]


@pytest.mark.parametrize("kw,xshape", [(dict(normalized_shape=5), (2, 3, 5)),
                                       (dict(normalized_shape=(3, 5), bias=False), (2, 3, 5)),
                                       (dict(normalized_shape=[5], elementwise_affine=False), (4, 5))])
def test_layer_norm(kw, xshape):
    e, t = build(L.LayerNorm, tnn.LayerNorm, **kw)
    assert repr(e) == repr(t)
    if t.weight is not None:
        with torch.no_grad():
            t.weight.copy_(torch.tensor(rnd(t.weight.shape, 3)))
    compare(e, t, [rnd(xshape)])


@pytest.mark.parametrize("kw", [dict(normalized_shape=5), dict(normalized_shape=(3, 5), eps=1e-3),
                                dict(normalized_shape=5, elementwise_affine=False)])
def test_rms_norm(kw):
    e, t = build(L.RMSNorm, tnn.RMSNorm, **kw)
    assert repr(e) == repr(t)
    if t.weight is not None:
        with torch.no_grad():
            t.weight.copy_(torch.tensor(rnd(t.weight.shape, 3)))
    compare(e, t, [rnd((2, 3, 5))])


@pytest.mark.parametrize("groups,affine", [(2, True), (1, True), (6, False)])
def test_group_norm(groups, affine):
    e, t = build(L.GroupNorm, tnn.GroupNorm, groups, 6, affine=affine)
    assert repr(e) == repr(t)
    if affine:
        with torch.no_grad():
            t.weight.copy_(torch.tensor(rnd((6,), 3)))
            t.bias.copy_(torch.tensor(rnd((6,), 4)))
    compare(e, t, [rnd((3, 6, 2, 3))])


def test_norm_errors():
    with pytest.raises(ember.ShapeError, match=r"BatchNorm2d\(3, eps=1e-05.*expected input with 3 channels \(dim 1\), "
                                               r"got 4 in shape \(2, 4, 5, 5\)"):
        L.BatchNorm2d(3)(ember.randn(2, 4, 5, 5))
    with pytest.raises(ember.ShapeError, match=r"BatchNorm2d\(3.*expected 4D input, got shape \(2, 3, 5\)"):
        L.BatchNorm2d(3)(ember.randn(2, 3, 5))
    with pytest.raises(ember.ValueRangeError, match="more than 1 value per channel"):
        L.BatchNorm1d(3)(ember.randn(1, 3))
    with pytest.raises(ember.ShapeError, match=r"LayerNorm\(\(4,\).*expected input with trailing dims \(4,\), "
                                               r"got shape \(2, 5\)"):
        L.LayerNorm(4)(ember.randn(2, 5))
    with pytest.raises(ember.ValueRangeError, match=r"num_channels \(6\) must be divisible by num_groups \(4\)"):
        L.GroupNorm(4, 6)
    with pytest.raises(ember.ShapeError, match=r"GroupNorm\(2, 6.*expected input \(N, 6, \*\), got shape \(2, 4\)"):
        L.GroupNorm(2, 6)(ember.randn(2, 4))
    with pytest.raises(ember.ShapeError, match=r"InstanceNorm2d\(3.*expected input with 3 channels"):
        L.InstanceNorm2d(3, affine=True)(ember.randn(2, 4, 3, 3))
    with pytest.warns(UserWarning, match="num_features is ignored"):
        L.InstanceNorm2d(3)(ember.randn(2, 4, 3, 3))


# ----------------------------------------------------------------------------------------------------------
# dropout
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,xshape", [("Dropout", (50, 40)), ("Dropout1d", (8, 30, 10)),
                                        ("Dropout2d", (8, 30, 3, 3)), ("Dropout3d", (4, 30, 2, 2, 2))])
def test_dropout_train_and_eval(cls, xshape):
    m = getattr(L, cls)(p=0.4)
    assert repr(m) == repr(getattr(tnn, cls)(p=0.4)) == f"{cls}(p=0.4, inplace=False)"
    x = ember.ones(*xshape, device=DEV, dtype=F64, requires_grad=True)
    y = m(x)
    a = y.detach().numpy()
    assert set(np.unique(np.round(a, 12))) <= {0.0, round(1 / 0.6, 12)}
    assert (a == 0).mean() == pytest.approx(0.4, abs=0.1)
    if cls != "Dropout":  # whole channels are dropped together
        flat = a.reshape(xshape[0], xshape[1], -1)
        assert np.all(flat == flat[..., :1])
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), a)  # the gradient is the mask times the scale
    m.eval()
    xe = ember.tensor(rnd(xshape), device=DEV)
    np.testing.assert_array_equal(m(xe).numpy(), xe.numpy())


def test_dropout_errors():
    with pytest.raises(ember.ValueRangeError, match="Dropout: dropout probability has to be between 0 and 1, but "
                                                    "got 1.5"):
        L.Dropout(1.5)
    with pytest.raises(ember.ShapeError, match=r"Dropout2d\(p=0.5, inplace=False\): expected 3D or 4D input"):
        L.Dropout2d()(ember.randn(2, 3))


# ----------------------------------------------------------------------------------------------------------
# Embedding
# ----------------------------------------------------------------------------------------------------------
def test_embedding_forward_backward_padding():
    e, t = build(L.Embedding, tnn.Embedding, 10, 4, padding_idx=-2)
    assert repr(e) == repr(t) == "Embedding(10, 4, padding_idx=8)"
    np.testing.assert_array_equal(e.weight.numpy()[8], np.zeros(4))
    idx = np.array([[1, 8, 3], [8, 1, 0]])
    compare(e, t, [idx])
    assert e.weight.grad.numpy()[8].tolist() == [0.0] * 4


def test_embedding_default_init_and_max_norm():
    e = L.Embedding(400, 50)
    w = e.weight.numpy()
    # N(0, 1) over 20,000 draws: the mean's standard error is 0.007, so 0.03 is over 4 sigma (0.01 failed ~16 %)
    assert abs(w.mean()) < 0.03 and w.std() == pytest.approx(1.0, rel=0.03)
    em, tm = build(L.Embedding, tnn.Embedding, 6, 3, max_norm=1.0)
    load_from_torch(em, tm)
    idx = np.array([0, 2, 2, 5])
    compare(em, tm, [idx], copy=False)
    np.testing.assert_allclose(em.weight.detach().numpy(), tm.weight.detach().numpy(), rtol=1e-12)
    assert repr(em) == repr(tm)


def test_embedding_from_pretrained_and_errors():
    w = ember.tensor(rnd((5, 3)), device=DEV)
    e = L.Embedding.from_pretrained(w)
    assert not e.weight.requires_grad and e.weight.shape == (5, 3)
    assert L.Embedding.from_pretrained(w, freeze=False).weight.requires_grad
    with pytest.raises(ember.IndexOutOfRangeError, match="index 5 is out of range"):
        e(ember.tensor([1, 5], device=DEV))
    with pytest.raises(ember.DTypeError, match=r"Embedding\(5, 3\): expected integer indices"):
        e(ember.tensor([1.0], device=DEV))
    with pytest.raises(ember.ValueRangeError, match="padding_idx must be within num_embeddings"):
        L.Embedding(5, 3, padding_idx=5)


# ----------------------------------------------------------------------------------------------------------
# activations
# ----------------------------------------------------------------------------------------------------------
ACT = [
    ("ReLU", (), {}), ("ReLU6", (), {}), ("GELU", (), {}), ("GELU", (), dict(approximate="tanh")), ("SiLU", (), {}),
    ("ELU", (), dict(alpha=0.7)), ("SELU", (), {}), ("CELU", (), dict(alpha=1.3)), ("LeakyReLU", (0.2,), {}),
    ("Softplus", (), dict(beta=2.0, threshold=3.0)), ("Softsign", (), {}), ("Mish", (), {}), ("Hardswish", (), {}),
    ("Hardsigmoid", (), {}), ("Hardtanh", (-0.5, 1.5), {}), ("Sigmoid", (), {}), ("Tanh", (), {}),
    ("LogSigmoid", (), {}), ("Softmax", (), dict(dim=1)), ("LogSoftmax", (), dict(dim=-1)),
    ("Softmin", (), dict(dim=0)), ("Softmax2d", (), {}), ("GLU", (), dict(dim=1)), ("Threshold", (0.1, 20.0), {}),
    ("Hardshrink", (), dict(lambd=0.3)), ("Softshrink", (), {}), ("Tanhshrink", (), {}),
    ("ReLU", (), dict(inplace=True)), ("ELU", (), dict(inplace=True)),
]


@pytest.mark.parametrize("name,args,kw", ACT, ids=[f"{a[0]}-{i}" for i, a in enumerate(ACT)])
def test_activation(name, args, kw):
    e, t = getattr(L, name)(*args, **kw), getattr(tnn, name)(*args, **kw)
    assert repr(e) == repr(t)
    x = rnd((3, 4, 2, 5)) * 3
    if kw.get("inplace"):  # torch rejects in-place ops on leaves that require grad: compare the forward only
        xe, xt = ember.tensor(x), torch.tensor(x)
        ye, yt = e(xe), t(xt)
        assert ye is xe and yt is xt
        assert not np.allclose(xt.numpy(), x)  # the activation really changed the input
        np.testing.assert_allclose(xe.numpy(), xt.numpy(), rtol=1e-12)
        return
    # torch's CELU and Hardsigmoid backward use float32 constants (1/alpha, 1/6) even in float64; ember is exact
    compare(e, t, [x], copy=False, tol=1e-6 if name in ("CELU", "Hardsigmoid") else 1e-10)


@pytest.mark.parametrize("n", [1, 4])
def test_prelu(n):
    e, t = build(L.PReLU, tnn.PReLU, n, init=0.1)
    assert repr(e) == repr(t)
    np.testing.assert_array_equal(e.weight.numpy(), np.full(n, 0.1))
    with torch.no_grad():
        t.weight.copy_(torch.tensor(rnd((n,), 2)))
    compare(e, t, [rnd((2, 4, 3))])
    if n > 1:
        with pytest.raises(ember.ShapeError, match=r"PReLU\(num_parameters=4\): expected input with 4 channels"):
            e(ember.randn(2, 3, 3, device=DEV, dtype=F64))


def test_activation_errors():
    with pytest.raises(ember.ValueRangeError, match="GELU: approximate must be 'none' or 'tanh'"):
        L.GELU("fast")
    with pytest.raises(ember.DTypeError, match=r"ReLU\(\): expected a Tensor input, got float"):
        L.ReLU()(1.0)
    with pytest.raises(ember.ShapeError, match="glu: halving dimension must be even"):
        L.GLU(0)(ember.randn(3, 2))


# ----------------------------------------------------------------------------------------------------------
# losses
# ----------------------------------------------------------------------------------------------------------
def _sig(a: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-a))


LOSS = [
    ("MSELoss", {}, lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("MSELoss", dict(reduction="sum"), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("L1Loss", dict(reduction="none"), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("SmoothL1Loss", dict(beta=0.5), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("HuberLoss", dict(delta=0.7), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("BCELoss", {}, lambda: [_sig(rnd((3, 4), 1)), _sig(rnd((3, 4), 2))]),
    ("BCEWithLogitsLoss", {}, lambda: [rnd((3, 4), 1), _sig(rnd((3, 4), 2))]),
    ("KLDivLoss", dict(reduction="batchmean"), lambda: [np.log(_sig(rnd((3, 4), 1))), _sig(rnd((3, 4), 2))]),
    ("KLDivLoss", dict(log_target=True, reduction="sum"), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("NLLLoss", {}, lambda: [rnd((5, 4), 1), np.array([0, 3, 1, 1, 2])]),
    ("NLLLoss", dict(ignore_index=1, reduction="sum"), lambda: [rnd((5, 4), 1), np.array([0, 3, 1, 1, 2])]),
    ("CrossEntropyLoss", {}, lambda: [rnd((5, 4), 1), np.array([0, 3, 1, 1, 2])]),
    ("CrossEntropyLoss", dict(label_smoothing=0.1), lambda: [rnd((2, 4, 3), 1), np.array([[0, 3, 1], [1, 2, 2]])]),
    ("CrossEntropyLoss", {}, lambda: [rnd((5, 4), 1), _sig(rnd((5, 4), 2))]),
    ("MSELoss", dict(size_average=False), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
    ("L1Loss", dict(reduce=False), lambda: [rnd((3, 4), 1), rnd((3, 4), 2)]),
]


@pytest.mark.parametrize("name,kw,data", LOSS, ids=[f"{c[0]}-{i}" for i, c in enumerate(LOSS)])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_loss(name, kw, data):
    e, t = getattr(L, name)(**kw), getattr(tnn, name)(**kw)
    assert repr(e) == repr(t) == f"{name}()"
    assert e.reduction == t.reduction
    compare(e, t, data(), copy=False)


def test_weighted_losses_register_weight_buffers():
    w = rnd((4,), 3, positive=True)
    e = L.CrossEntropyLoss(weight=ember.tensor(w, device=DEV), ignore_index=2)
    t = tnn.CrossEntropyLoss(weight=torch.tensor(w), ignore_index=2)
    assert list(e.state_dict()) == list(t.state_dict()) == ["weight"]
    compare(e, t, [rnd((6, 4), 1), np.array([0, 2, 1, 3, 3, 2])], copy=False)
    pw = rnd((4,), 4, positive=True)
    e = L.BCEWithLogitsLoss(weight=ember.tensor(w, device=DEV), pos_weight=ember.tensor(pw, device=DEV))
    t = tnn.BCEWithLogitsLoss(weight=torch.tensor(w), pos_weight=torch.tensor(pw))
    assert list(e.state_dict()) == list(t.state_dict())
    compare(e, t, [rnd((3, 4), 1), _sig(rnd((3, 4), 2))], copy=False)


def test_loss_errors():
    with pytest.raises(ember.ValueRangeError, match="MSELoss: reduction must be one of"):
        L.MSELoss(reduction="avg")
    with pytest.raises(ember.ValueRangeError, match="CrossEntropyLoss: label_smoothing must be between"):
        L.CrossEntropyLoss(label_smoothing=2.0)
    with pytest.raises(ember.DTypeError, match=r"MSELoss\(\): expected a Tensor input, got list"):
        L.MSELoss()(ember.randn(2), [1.0, 2.0])
    with pytest.raises(ember.ShapeError):
        L.MSELoss()(ember.randn(2, 3), ember.randn(4, 3))


# ----------------------------------------------------------------------------------------------------------
# composition and exports
# ----------------------------------------------------------------------------------------------------------
def test_small_cnn_in_sequential_matches_torch():
    def make(ns: Any, **fk: Any) -> Any:
        return ns.Sequential(ns.Conv2d(2, 4, 3, padding=1, **fk), ns.BatchNorm2d(4, **fk), ns.ReLU(),
                             ns.MaxPool2d(2), ns.Flatten(), ns.Linear(4 * 3 * 3, 5, **fk), ns.GELU(),
                             ns.Dropout(0.0), ns.Linear(5, 3, **fk))

    class NS:
        Sequential = nn.Sequential

    for k in ("Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Flatten", "Linear", "GELU", "Dropout"):
        setattr(NS, k, getattr(L, k))
    e, t = make(NS, device=DEV, dtype=F64), make(tnn, dtype=torch.float64)
    assert repr(e) == repr(t)
    compare(e, t, [rnd((4, 2, 6, 6))])
    # float32 smoke: the default dtype, looser tolerance
    e32, t32 = make(NS).to(DEV), make(tnn)
    load_from_torch(e32, t32)
    x = rnd((4, 2, 6, 6)).astype(np.float32)
    ye = e32(ember.tensor(x, device=DEV))
    assert ye.dtype == ember.float32
    np.testing.assert_allclose(ye.detach().numpy(), t32(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_layers_all_exports_exist_and_are_modules():
    assert len(L.__all__) == len(set(L.__all__))
    for name in L.__all__:
        cls = getattr(L, name)
        assert issubclass(cls, nn.Module), name
        assert hasattr(tnn, name), name  # every exported name is PyTorch's
