"""ember.nn.init: in-place fills under no_grad; random inits checked statistically (mean/std/bounds), the
deterministic ones (gains, fans, constants, eye, dirac, orthogonality) exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.nn import Parameter, init

torch = pytest.importorskip("torch")

DEV = ember.Device.flex().autodiff()


def P(*shape: int, dtype: str = "float64") -> Parameter:  # noqa: N802 - reads as "Parameter"
    return Parameter(ember.zeros(*shape, device=DEV, dtype=dtype))


def arr(t: ember.Tensor) -> np.ndarray:
    return t.detach().to("float64").numpy()


@pytest.mark.parametrize("name,param", [
    ("linear", None), ("conv2d", None), ("conv_transpose3d", None), ("sigmoid", None), ("tanh", None),
    ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", math.sqrt(5)), ("selu", None),
])
def test_calculate_gain_matches_torch(name, param):
    assert init.calculate_gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param), rel=1e-15)


def test_calculate_gain_errors():
    with pytest.raises(ember.ValueRangeError, match="unsupported nonlinearity 'swish'"):
        init.calculate_gain("swish")
    with pytest.raises(ember.ValueRangeError, match="not a valid number"):
        init.calculate_gain("leaky_relu", "x")


@pytest.mark.parametrize("shape", [(3, 4), (8, 3, 5), (6, 2, 3, 4), (2, 4, 1, 2, 3)])
def test_fan_in_fan_out_matches_torch(shape):
    assert init._calculate_fan_in_and_fan_out(P(*shape)) == \
        torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))


def test_fan_needs_two_dims():
    with pytest.raises(ember.ShapeError, match="fewer than 2 dimensions.*\\(5,\\)"):
        init._calculate_fan_in_and_fan_out(P(5))
    with pytest.raises(ember.ShapeError, match="fewer than 2"):
        init.xavier_uniform_(P(5))


def test_uniform_and_normal_statistics_and_identity():
    w = P(200, 300)
    grad_flag = w.requires_grad
    out = init.uniform_(w, -2.0, 3.0)
    assert out is w and w.requires_grad == grad_flag and w.is_leaf and w.grad_fn is None
    a = arr(w)
    assert a.min() >= -2.0 and a.max() < 3.0
    assert a.mean() == pytest.approx(0.5, abs=0.03)
    assert a.std() == pytest.approx(5 / math.sqrt(12), rel=0.02)
    init.normal_(w, mean=1.5, std=0.5)
    a = arr(w)
    assert a.mean() == pytest.approx(1.5, abs=0.01) and a.std() == pytest.approx(0.5, rel=0.02)


def test_random_draws_follow_the_device_seed():
    w1, w2 = P(4, 5), P(4, 5)
    DEV.seed(7)
    init.normal_(w1)
    DEV.seed(7)
    init.normal_(w2)
    np.testing.assert_array_equal(arr(w1), arr(w2))
    init.normal_(w2)
    assert not np.array_equal(arr(w1), arr(w2))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_low_precision_dtypes(dtype):
    w = P(64, 128, dtype=dtype)
    init.kaiming_uniform_(w, a=math.sqrt(5))
    assert w.dtype.name == dtype
    a = arr(w)
    bound = 1 / math.sqrt(128)
    assert np.abs(a).max() <= bound * 1.01 and a.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("shape,mode", [((300, 200), "fan_in"), ((300, 200), "fan_out"), ((64, 16, 3, 3), "fan_in")])
def test_kaiming_matches_torch_distribution(shape, mode):
    tw = torch.empty(shape, dtype=torch.float64)
    w = P(*shape)
    for e_fn, t_fn in ((init.kaiming_uniform_, torch.nn.init.kaiming_uniform_),
                       (init.kaiming_normal_, torch.nn.init.kaiming_normal_)):
        e_fn(w, a=0.1, mode=mode, nonlinearity="leaky_relu")
        t_fn(tw, a=0.1, mode=mode, nonlinearity="leaky_relu")
        a, t = arr(w), tw.numpy()
        assert a.std() == pytest.approx(t.std(), rel=0.05)
        assert abs(a.mean()) < 3 * t.std() / math.sqrt(a.size)
    fan = init._calculate_correct_fan(w, mode)
    init.kaiming_uniform_(w, mode=mode, nonlinearity="relu")
    assert np.abs(arr(w)).max() <= math.sqrt(2) * math.sqrt(3 / fan)


def test_kaiming_bad_mode_and_empty():
    with pytest.raises(ember.ValueRangeError, match="mode 'fan_avg' not supported"):
        init.kaiming_normal_(P(3, 4), mode="fan_avg")
    with pytest.warns(UserWarning, match="zero-element"):
        init.kaiming_uniform_(P(0, 4))


def test_xavier_bounds_and_std():
    w = P(100, 400)
    init.xavier_uniform_(w, gain=2.0)
    bound = 2.0 * math.sqrt(6 / 500)
    a = arr(w)
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.95 * bound
    init.xavier_normal_(w, gain=0.5)
    assert arr(w).std() == pytest.approx(0.5 * math.sqrt(2 / 500), rel=0.03)


def test_trunc_normal_bounds_and_moments():
    w = P(300, 300)
    init.trunc_normal_(w, mean=0.5, std=1.0, a=-0.5, b=2.0)
    tw = torch.nn.init.trunc_normal_(torch.empty(300, 300, dtype=torch.float64), mean=0.5, std=1.0, a=-0.5, b=2.0)
    a = arr(w)
    assert a.min() >= -0.5 and a.max() <= 2.0
    assert a.mean() == pytest.approx(tw.mean().item(), abs=0.01)
    assert a.std() == pytest.approx(tw.std().item(), rel=0.02)
    with pytest.raises(ember.ValueRangeError, match="a < b"):
        init.trunc_normal_(w, a=1.0, b=0.0)


@pytest.mark.parametrize("shape", [(6, 6), (4, 9), (9, 4), (5, 2, 3)])
def test_orthogonal(shape):
    w = P(*shape)
    init.orthogonal_(w, gain=1.5)
    m = arr(w).reshape(shape[0], -1)
    if m.shape[0] <= m.shape[1]:
        np.testing.assert_allclose(m @ m.T, 2.25 * np.eye(m.shape[0]), atol=1e-12)
    else:
        np.testing.assert_allclose(m.T @ m, 2.25 * np.eye(m.shape[1]), atol=1e-12)
    with pytest.raises(ember.ShapeError, match="2 or more dimensions"):
        init.orthogonal_(P(3))


def test_deterministic_fills():
    w = P(3, 4)
    init.constant_(w, 2.5)
    np.testing.assert_array_equal(arr(w), np.full((3, 4), 2.5))
    init.ones_(w)
    np.testing.assert_array_equal(arr(w), np.ones((3, 4)))
    init.zeros_(w)
    np.testing.assert_array_equal(arr(w), np.zeros((3, 4)))
    init.eye_(w)
    np.testing.assert_array_equal(arr(w), np.eye(3, 4))
    with pytest.raises(ember.ShapeError, match="2 dimensions"):
        init.eye_(P(2, 2, 2))
    i = ember.zeros(3, dtype="int64")
    init.constant_(i, 4)
    assert i.numpy().tolist() == [4, 4, 4]


@pytest.mark.parametrize("shape,groups", [((4, 4, 3), 1), ((6, 3, 3, 3), 2), ((2, 3, 1, 3, 2), 1)])
def test_dirac_matches_torch(shape, groups):
    w = P(*shape)
    init.dirac_(w, groups)
    np.testing.assert_array_equal(arr(w), torch.nn.init.dirac_(torch.empty(shape), groups).numpy())


def test_type_errors_name_the_function():
    with pytest.raises(ember.DTypeError, match="nn.init.normal_: expected a Tensor, got list"):
        init.normal_([1.0, 2.0])
    with pytest.raises(ember.DTypeError, match="nn.init.uniform_: expected a floating point tensor.*int64"):
        init.uniform_(ember.zeros(3, dtype="int64"))
    with pytest.raises(ember.UnsupportedError, match="generator"):
        init.normal_(P(2, 2), generator=object())
    with pytest.raises(ember.ValueRangeError, match="std >= 0"):
        init.normal_(P(2, 2), std=-1.0)


def test_init_does_not_enter_the_graph():
    w = P(3, 4)
    init.normal_(w)
    (ember.tensor(np.ones((2, 3)), device=DEV) @ w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 4), 2.0))


@pytest.mark.parametrize("fill", [
    lambda w, g: init.uniform_(w, -1.0, 1.0, generator=g),
    lambda w, g: init.normal_(w, 0.0, 2.0, generator=g),
    lambda w, g: init.trunc_normal_(w, generator=g),
    lambda w, g: init.xavier_uniform_(w, generator=g),
    lambda w, g: init.kaiming_normal_(w, generator=g),
    lambda w, g: init.orthogonal_(w, generator=g),
], ids=["uniform", "normal", "trunc_normal", "xavier_uniform", "kaiming_normal", "orthogonal"])
def test_a_generator_reproduces_the_init_and_leaves_the_device_stream_alone(fill):
    w = P(5, 4)
    dev = w.device
    dev.seed(7)
    expected_stream = ember.rand(3, device=dev).numpy()
    draws = []
    for _ in range(2):
        dev.seed(7)
        fill(w, ember.Generator(dev).manual_seed(123))
        draws.append(arr(w).copy())
        np.testing.assert_array_equal(ember.rand(3, device=dev).numpy(), expected_stream)
    np.testing.assert_array_equal(draws[0], draws[1])
    fill(w, ember.Generator(dev).manual_seed(124))
    assert not np.array_equal(arr(w), draws[0])


def test_a_generator_of_another_device_is_refused():
    try:
        toy = ember.Device.parse("toy")  # the example backend of the repository's tests
    except (ember.PluginError, ember.DeviceError):
        pytest.skip("the example backend (toy) is not installed")
    with pytest.raises(ember.DeviceError, match="generator draws on device toy"):
        init.normal_(P(2, 2), generator=ember.Generator(toy))
    with pytest.raises(ember.DeviceError, match="generator draws on device toy"):
        init.orthogonal_(P(2, 2), generator=ember.Generator(toy))
