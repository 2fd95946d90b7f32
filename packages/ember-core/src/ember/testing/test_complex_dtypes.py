"""Conformance: complex dtypes (complex64, complex128) on a device whose backend lists them in
``supported_dtypes``: storage, PyTorch's promotion, the elementwise subset, reductions, matmul, the complex
functions and, on a differentiable stack, their gradients. A device without them must refuse them with a
DTypeError naming the dtype and the backend (never compute something else)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import dtypes as dt
from ember.testing import assert_close, to_torch, torch_or_skip

Z = np.array([[1 + 2j, -3 + 0.5j, 0.25 - 1j], [2 - 2j, -0.5 - 0.5j, 4 + 0j]])
W = np.array([[0.5 - 1j, 2 + 1j, -1 + 3j], [1 + 1j, 3 - 0.5j, -2 - 2j]])


def _need_complex(device, d: dt.DType) -> None:
    if not device.supports_dtype(d):
        pytest.skip(f"{device} does not list {d.name} in its supported_dtypes (test_unsupported_complex_refused "
                    "checks the error instead)")


def test_unsupported_complex_refused(device):
    for d in dt.COMPLEX_DTYPES:
        if device.supports_dtype(d):
            continue
        with pytest.raises(ember.DTypeError, match=f"{d.name}.*not supported by backend"):
            ember.tensor([1 + 1j], dtype=d, device=device)
        with pytest.raises(ember.DTypeError, match=f"{d.name}.*not supported by backend"):
            ember.zeros(2, device=device).to(d)


@pytest.mark.parametrize("d", dt.COMPLEX_DTYPES, ids=str)
def test_complex_arithmetic_matches_torch(device, d):
    torch_or_skip()
    _need_complex(device, d)
    z, w = ember.tensor(Z, dtype=d, device=device), ember.tensor(W, dtype=d, device=device)
    tz, tw = to_torch(z), to_torch(w)
    assert z.dtype is d and z.is_complex()
    assert_close(z + w, tz + tw)
    assert_close(z - w * 2, tz - tw * 2)
    assert_close(z * w, tz * tw)
    assert_close(z / w, tz / tw)
    assert_close(z * 1j + 0.5, tz * 1j + 0.5)
    assert_close(-z, -tz)
    assert_close(z.exp(), tz.exp())
    assert_close(z.sqrt(), tz.sqrt())
    assert_close(z == w, tz == tw)
    assert_close(z.sum(dim=1), tz.sum(dim=1))
    assert_close(z.mean(), tz.mean())
    assert_close(z @ w.transpose(0, 1), tz @ tw.transpose(0, 1))
    r = ember.ones(2, 3, dtype=d.to_real, device=device)
    assert_close(z + r, tz + to_torch(r))


@pytest.mark.parametrize("d", dt.COMPLEX_DTYPES, ids=str)
def test_complex_functions_match_torch(device, d):
    torch = torch_or_skip()
    _need_complex(device, d)
    z = ember.tensor(Z, dtype=d, device=device)
    tz = to_torch(z)
    assert_close(z.real, tz.real)
    assert_close(z.imag, tz.imag)
    assert_close(z.abs(), tz.abs())
    assert_close(ember.angle(z), torch.angle(tz))
    assert_close(z.conj(), tz.conj())
    assert_close(ember.view_as_real(z), torch.view_as_real(tz))
    assert_close(ember.view_as_complex(ember.view_as_real(z)), tz)
    assert_close(ember.complex(z.real, z.imag), tz)
    with pytest.raises(ember.DTypeError, match="lt.*complex"):
        _ = z < z
    with pytest.raises(ember.DTypeError, match="max.*complex"):
        z.max()


def test_complex_gradients_match_torch(device):
    torch = torch_or_skip()
    _need_complex(device, dt.complex64)
    if not device.stack.differentiable:
        pytest.skip(f"{device} records no gradients")
    x = ember.tensor(Z.real, dtype=ember.float32, device=device, requires_grad=True)
    y = ember.tensor(Z.imag, dtype=ember.float32, device=device, requires_grad=True)
    z = ember.complex(x, y)
    if not z.requires_grad:
        pytest.skip(f"{device} does not record complex intermediates")
    (z.abs() ** 2 + ember.angle(z) + z.real * 3).sum().backward()
    tx, ty = to_torch(x).requires_grad_(), to_torch(y).requires_grad_()
    tzz = torch.complex(tx, ty)
    (tzz.abs() ** 2 + torch.angle(tzz) + tzz.real * 3).sum().backward()
    assert_close(x.grad, tx.grad)
    assert_close(y.grad, ty.grad)
