"""The OpenCL device kernels (cholesky, triangular solve, LU with partial pivoting) against torch, their errors and
info codes, and the host fallback beyond their size limit; skipped where there is no OpenCL device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember import Device
from ember.errors import DeviceError, PluginError

LA = ember.linalg


@pytest.fixture(scope="module")
def cl() -> Device:
    try:
        dev = Device.parse("opencl")
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"no OpenCL device here: {exc}")
    return dev


def test_device_kernels_are_registered_for_opencl() -> None:
    for name in ("cholesky", "cholesky_ex", "solve_triangular", "lu_factor_ex"):
        kernel = ember.extension.get(f"linalg.{name}").kernels["opencl"]
        assert kernel.__module__ == "ember_linalg._opencl", name


def _spd(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.standard_normal(shape)
    return x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("n", [1, 5, 17], ids=lambda n: f"n{n}")
def test_device_kernels_match_torch(cl: Device, dtype: Any, n: int) -> None:
    rng = np.random.default_rng(n)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype is np.float32 else {"rtol": 1e-10, "atol": 1e-10}
    a = _spd(rng, 2, 3, n, n).astype(dtype)
    b = rng.standard_normal((2, 3, n, 4)).astype(dtype)
    g = rng.standard_normal((3, n, n + 2)).astype(dtype)
    ta, tb, tg = (torch.from_numpy(x) for x in (a, b, g))
    ea, eb, eg = (ember.tensor(x, device=cl) for x in (a, b, g))
    for upper in (False, True):
        np.testing.assert_allclose(LA.cholesky(ea, upper=upper).numpy(),
                                   torch.linalg.cholesky(ta, upper=upper).numpy(), **tol)
        for left in (False, True):
            rhs, trhs = (eb, tb) if left else (eb.mT, tb.mT)
            np.testing.assert_allclose(
                LA.solve_triangular(ea, rhs, upper=upper, left=left, unitriangular=not left).numpy(),
                torch.linalg.solve_triangular(ta, trhs, upper=upper, left=left, unitriangular=not left).numpy(),
                **tol)
    for x, tx in ((eg, tg), (eg.mT, tg.mT)):  # wide and tall (a strided input)
        lu, piv, info = LA.lu_factor_ex(x)
        want = torch.linalg.lu_factor_ex(tx)
        np.testing.assert_allclose(lu.numpy(), want.LU.numpy(), **tol)
        np.testing.assert_array_equal(piv.numpy(), want.pivots.numpy())
        np.testing.assert_array_equal(info.numpy(), want.info.numpy())


def test_device_errors_and_info_match_torch(cl: Device) -> None:
    a = np.stack([np.eye(3), np.diag([1.0, -1.0, 1.0])])
    with pytest.raises(torch.linalg.LinAlgError) as want:
        torch.linalg.cholesky(torch.from_numpy(a))
    with pytest.raises(LA.LinAlgError) as got:
        LA.cholesky(ember.tensor(a, device=cl))
    assert str(got.value) == str(want.value)
    np.testing.assert_array_equal(LA.cholesky_ex(ember.tensor(a, device=cl)).info.numpy(), [0, 2])
    s = np.stack([np.eye(3), np.eye(3)])
    s[1, 1, 1] = 0.0
    info = LA.lu_factor_ex(ember.tensor(s, device=cl)).info.numpy()
    np.testing.assert_array_equal(info, torch.linalg.lu_factor_ex(torch.from_numpy(s)).info.numpy())


def test_large_matrices_and_broadcast_batches_use_the_host_fallback(cl: Device) -> None:
    rng = np.random.default_rng(0)
    a = _spd(rng, 130, 130)
    np.testing.assert_allclose(LA.cholesky(ember.tensor(a, device=cl)).numpy(), np.linalg.cholesky(a), rtol=1e-10,
                               atol=1e-10)
    tri, b = np.tril(_spd(rng, 4, 4)), rng.standard_normal((3, 4, 2))
    got = LA.solve_triangular(ember.tensor(tri, device=cl), ember.tensor(b, device=cl), upper=False).numpy()
    np.testing.assert_allclose(got, np.linalg.solve(tri, b), rtol=1e-10, atol=1e-10)
