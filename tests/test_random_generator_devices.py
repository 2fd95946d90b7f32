"""``ember.Generator`` on every installed backend: flex draws its generators natively (numpy PCG64, as its device
stream), OpenCL and the example backend ``toy`` inherit the default host stream (numpy Philox, uploaded with
``from_numpy``), so those two give identical samples for one seed. Per device: reproducible draws, independence
from the device stream, state round-trips, every sampling op with ``generator=``, and sane statistics."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.backend import Backend

DEVICES = ["flex", "flex+autodiff", "opencl", "opencl+autodiff", "toy"]


def _device(name: str) -> ember.Device:
    try:
        return ember.Device.parse(name)
    except (ember.PluginError, ember.DeviceError) as e:
        pytest.skip(f"device {name} is not available here: {e}")


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> ember.Device:
    return _device(request.param)


def _np(t: ember.Tensor) -> np.ndarray:
    return np.asarray(t.detach().to("float32").cpu().numpy(), dtype=np.float64)


def _all_draws(dev: ember.Device, g: ember.Generator) -> list[np.ndarray]:
    """One call of every op that takes generator=."""
    out = [
        ember.rand(64, generator=g, device=dev),
        ember.randn(64, generator=g, device=dev),
        ember.randint(0, 1000, (64,), generator=g, device=dev),
        ember.randperm(16, generator=g, device=dev),
        ember.zeros(32, device=dev).uniform_(-2, 2, generator=g),
        ember.zeros(32, device=dev).normal_(generator=g),
        ember.zeros(32, device=dev).exponential_(generator=g),
        ember.zeros(32, device=dev).random_(0, 50, generator=g),
        ember.zeros(32, device=dev).geometric_(0.5, generator=g),
        ember.bernoulli(ember.full((32,), 0.5, device=dev), generator=g),
        ember.normal(ember.zeros(32, device=dev), ember.ones(32, device=dev), generator=g),
        ember.normal(0.0, 1.0, (32,), generator=g, device=dev),
        ember.poisson(ember.full((32,), 4.0, device=dev), generator=g),
        ember.multinomial(ember.ones(4, 10, device=dev), 5, generator=g),
        ember.multinomial(ember.ones(10, device=dev), 40, True, generator=g),
    ]
    return [_np(t) for t in out]


def test_every_op_is_reproducible_per_device(dev: ember.Device) -> None:
    a = _all_draws(dev, ember.Generator(dev).manual_seed(5))
    b = _all_draws(dev, ember.Generator(dev).manual_seed(5))
    c = _all_draws(dev, ember.Generator(dev).manual_seed(6))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_generators_leave_the_device_stream_alone(dev: ember.Device) -> None:
    dev.seed(12)
    expected = _np(ember.rand(16, device=dev))
    dev.seed(12)
    _all_draws(dev, ember.Generator(dev))
    assert np.array_equal(_np(ember.rand(16, device=dev)), expected)


def test_state_round_trip(dev: ember.Device) -> None:
    g = ember.Generator(dev).manual_seed(9)
    ember.randn(10, generator=g, device=dev)
    state = g.get_state()
    first = _all_draws(dev, g)
    again = _all_draws(dev, ember.Generator(dev).set_state(state))
    assert all(np.array_equal(x, y) for x, y in zip(first, again))


def test_statistics(dev: ember.Device) -> None:
    g = ember.Generator(dev).manual_seed(1)
    u = _np(ember.rand(50_000, generator=g, device=dev))
    z = _np(ember.randn(50_000, generator=g, device=dev))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.003
    assert abs(z.mean()) < 0.03 and abs(z.var() - 1) < 0.05


def test_the_default_stream_is_shared_by_backends_without_their_own() -> None:
    """OpenCL and toy do not override new_random_stream: both draw Philox on the host, so one seed gives the same
    samples on both; flex overrides it (PCG64)."""
    ocl, toy, flex = _device("opencl"), _device("toy"), _device("flex")
    assert type(ocl.stack.base_backend).new_random_stream is Backend.new_random_stream
    assert type(flex.stack.base_backend).new_random_stream is not Backend.new_random_stream
    a = _np(ember.randn(32, generator=ember.Generator(ocl).manual_seed(3), device=ocl))
    b = _np(ember.randn(32, generator=ember.Generator(toy).manual_seed(3), device=toy))
    c = _np(ember.randn(32, generator=ember.Generator(flex).manual_seed(3), device=flex))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_wrong_device_names_both() -> None:
    ocl, flex = _device("opencl"), _device("flex")
    with pytest.raises(ember.DeviceError, match="generator draws on device flex, but the op draws on device opencl"):
        ember.rand(3, generator=ember.Generator(flex), device=ocl)
    with pytest.raises(ember.DeviceError, match="draws on device opencl\\+autodiff"):
        ember.zeros(3, device=ocl.autodiff()).normal_(generator=ember.Generator(flex))
