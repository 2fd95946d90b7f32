"""The OpenCL FFT (ember_signal._opencl: Stockham passes of radix 2, 3, 4, 5, 7 on the device, the host fallback
for sizes with a larger prime factor) against torch.fft: sizes, norms, both precisions, several dims, and which path
ran."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember.errors import DeviceError, PluginError
from ember_signal import _opencl

SIZES = [1, 2, 3, 5, 6, 7, 8, 12, 30, 49, 64, 105, 128, 11, 22, 1000]


@pytest.fixture
def dev(monkeypatch: pytest.MonkeyPatch) -> Device:
    """The OpenCL device with the device kernel forced (on a CPU runtime the default policy is the host)."""
    try:
        d = Device.parse("opencl")
        ember.zeros(1, device=d).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"no OpenCL device here: {exc}")
    monkeypatch.setenv(_opencl.FFT_ENV, "device")
    return d


def test_plan_factors_small_primes_only() -> None:
    assert _opencl.plan(1000) == [4, 2, 5, 5, 5]
    assert _opencl.plan(64) == [4, 4, 4]
    assert _opencl.plan(2 * 3 * 7) == [2, 3, 7]
    assert _opencl.plan(1) == []
    assert _opencl.plan(11) is None and _opencl.plan(2 * 13) is None


def _close(got: ember.Tensor, want: torch.Tensor, tol: float) -> None:
    g, w = got.numpy(), want.resolve_conj().numpy()
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max(initial=0))))


@pytest.mark.parametrize("precision", ["single", "double"])
@pytest.mark.parametrize("n", SIZES)
def test_one_dim_transforms_match_torch(dev: Device, n: int, precision: str) -> None:
    if precision == "double" and not dev.supports_dtype(ember.complex128):
        pytest.skip(f"{dev} has no complex128 (no fp64)")
    real, cplx, tol = (np.float32, np.complex64, 3e-5) if precision == "single" else (np.float64, np.complex128, 1e-12)
    rng = np.random.default_rng(n)
    x = rng.standard_normal((3, n)).astype(real)
    z = (x + 1j * rng.standard_normal((3, n))).astype(cplx)
    for norm in (None, "ortho", "forward"):
        _close(ember.fft.fft(ember.tensor(z, device=dev), norm=norm), torch.fft.fft(torch.from_numpy(z), norm=norm),
               tol)
        _close(ember.fft.ifft(ember.tensor(z, device=dev), norm=norm),
               torch.fft.ifft(torch.from_numpy(z), norm=norm), tol)
        _close(ember.fft.rfft(ember.tensor(x, device=dev), norm=norm),
               torch.fft.rfft(torch.from_numpy(x), norm=norm), tol)
        half = z[:, : n // 2 + 1]
        _close(ember.fft.irfft(ember.tensor(half, device=dev), n=n, norm=norm),
               torch.fft.irfft(torch.from_numpy(half), n=n, norm=norm), tol)


def test_several_dims_resizing_and_hermitian_match_torch(dev: Device) -> None:
    a = np.random.default_rng(1).standard_normal((4, 6, 10)).astype(np.float32)
    ta = torch.from_numpy(a)
    _close(ember.fft.fft2(ember.tensor(a, device=dev)), torch.fft.fft2(ta), 3e-5)
    _close(ember.fft.rfftn(ember.tensor(a, device=dev), dim=(0, 2)), torch.fft.rfftn(ta, dim=(0, 2)), 3e-5)
    spec = torch.fft.rfftn(ta)
    _close(ember.fft.irfftn(ember.tensor(spec.numpy(), device=dev), s=(4, 6, 10)),
           torch.fft.irfftn(spec, s=(4, 6, 10)), 3e-5)
    _close(ember.fft.fft(ember.tensor(a, device=dev), n=16, dim=1), torch.fft.fft(ta, n=16, dim=1), 3e-5)
    _close(ember.fft.fft(ember.tensor(a, device=dev), n=3, dim=0), torch.fft.fft(ta, n=3, dim=0), 3e-5)
    za = a.astype(np.complex64)
    _close(ember.fft.hfft(ember.tensor(za, device=dev)), torch.fft.hfft(torch.from_numpy(za)), 3e-5)


@pytest.mark.parametrize("n, policy, on_device", [(480, "device", True), (11 * 4, "device", False),
                                                  (480, "host", False), (480, "auto", None)])
def test_device_passes_or_host_fallback(dev: Device, n: int, policy: str, on_device: bool | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes of 2, 3, 5, 7 factors run the device passes; a size with a larger prime factor the host fallback; the
    policy can force the host, and ``auto`` uses the device kernel exactly on non-CPU runtimes."""
    monkeypatch.setenv(_opencl.FFT_ENV, policy)
    if on_device is None:
        on_device = not dev.stack.base_backend.rt.is_cpu
    calls: list[int] = []
    lines = _opencl._lines

    def counting(backend: Any, h: Any, size: int, sign: float, scale: float) -> Any:
        calls.append(size)
        return lines(backend, h, size, sign, scale)

    monkeypatch.setattr(_opencl, "_lines", counting)
    x = np.random.default_rng(2).standard_normal((2, n)).astype(np.float32)
    _close(ember.fft.rfft(ember.tensor(x, device=dev)), torch.fft.rfft(torch.from_numpy(x)), 3e-5)
    assert (calls == [n]) is on_device, calls


def test_bad_policy_is_a_typed_error(dev: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_opencl.FFT_ENV, "gpu")
    with pytest.raises(ember.errors.ValueRangeError, match="EMBER_OPENCL_FFT='gpu': expected one of auto, device"):
        ember.fft.fft(ember.tensor(np.ones(8, np.complex64), device=dev))


def test_gradients_through_the_device_kernel_match_torch(dev: Device) -> None:
    """stft and irfft(rfft) under opencl+autodiff with the device FFT: the vjps run the device passes too."""
    sig = np.random.default_rng(4).standard_normal((2, 300))
    adev = Device.parse("opencl+autodiff")
    x = ember.tensor(sig, device=adev, requires_grad=True)
    w = ember.hann_window(60, dtype=ember.float64, device=adev)
    spec = ember.stft(x, 60, hop_length=15, window=w, return_complex=True)
    back = ember.fft.irfft(ember.fft.rfft(x, norm="ortho") * 2, n=300, norm="ortho")
    ((spec.abs() ** 2).mean() + (back * back).sum() * 1e-2).backward()
    xt = torch.from_numpy(sig).requires_grad_()
    st = torch.stft(xt, 60, hop_length=15, window=torch.hann_window(60, dtype=torch.float64), return_complex=True)
    bt = torch.fft.irfft(torch.fft.rfft(xt, norm="ortho") * 2, n=300, norm="ortho")
    ((st.abs() ** 2).mean() + (bt * bt).sum() * 1e-2).backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
