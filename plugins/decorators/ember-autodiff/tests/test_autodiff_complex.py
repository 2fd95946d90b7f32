"""Gradients through complex values follow PyTorch's convention (grad_in = grad_out * conj(f'(z))), checked
against torch for holomorphic elementwise ops, matmul, mixed real/complex operands and the casts between them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


def _c(shape: tuple[int, ...], dtype: Any = np.complex64) -> np.ndarray:
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


Z, W, X = _c((2, 3)), _c((2, 3)), RNG.standard_normal((2, 3)).astype(np.float32)
A, B = _c((2, 3)), _c((3, 4))

CASES: dict[str, Callable[..., Any]] = {
    "mul": lambda m, z, w, x, a, b: m.real(z * w).sum() + m.imag(z * w).sum(),
    "div": lambda m, z, w, x, a, b: m.imag(z / w).sum(),
    "sub_neg": lambda m, z, w, x, a, b: m.real(-(z - w) * z).sum(),
    "exp": lambda m, z, w, x, a, b: m.real(m.exp(z)).sum() + m.imag(m.exp(w)).sum(),
    "log": lambda m, z, w, x, a, b: m.imag(m.log(z)).sum(),
    "sqrt": lambda m, z, w, x, a, b: m.real(m.sqrt(z) * w).sum(),
    "pow2": lambda m, z, w, x, a, b: m.real(z ** 2).sum(),
    "real_times_complex": lambda m, z, w, x, a, b: m.real(x * w).sum() + m.imag(w * x).sum(),
    "real_plus_complex": lambda m, z, w, x, a, b: m.imag(z + x).sum(),
    "matmul": lambda m, z, w, x, a, b: m.real(a @ b).sum() + m.imag(a @ b).sum(),
    "abs_of_product": lambda m, z, w, x, a, b: m.abs(z * w).sum(),
    "sum_then_mul": lambda m, z, w, x, a, b: m.real(z.sum() * w.sum()),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("device", ["flex+autodiff", "flex+fusion(eager_below=0)+autodiff"])
def test_complex_gradients_match_torch(name: str, device: str) -> None:
    dev = ember.Device.parse(device)
    if not dev.supports_dtype(ember.complex64):
        pytest.skip(f"{device} has no complex64")
    values = (Z, W, X, A, B)
    ours = [ember.tensor(v, device=dev, requires_grad=True) for v in values]
    theirs = [torch.tensor(v, requires_grad=True) for v in values]
    CASES[name](ember, *ours).backward()
    CASES[name](torch, *theirs).backward()
    for e, t, v in zip(ours, theirs, values):
        if t.grad is None or not t.grad.abs().sum():
            assert e.grad is None or not np.abs(e.grad.numpy()).sum(), name
            continue
        assert e.grad is not None, f"{name}: no gradient for a {v.dtype} input"
        assert e.grad.dtype is ember.tensor(v).dtype  # a real input gets a real gradient
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
