"""Shared helpers for the ember.nn.functional tests (torch is the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

import ember

torch = pytest.importorskip("torch")

TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-10, atol=1e-12)}
DTYPES = [np.float32, np.float64]


def rand(shape, dtype=np.float64, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def E(a, layout="contiguous"):
    """An ember tensor with a's values; layout 'strided' gives a non-contiguous handle (same values)."""
    a = np.asarray(a)
    if layout == "strided" and a.ndim >= 2:
        f = np.asfortranarray(a)
        t = ember.from_numpy(f)
        assert not t.numpy().flags.c_contiguous
        return t
    return ember.tensor(a)


def T(a):
    return torch.from_numpy(np.array(a, order="C", copy=True))  # ascontiguousarray would make 0-d 1-d


def check(out, ref, dtype=None, **kw):
    """out (ember Tensor) equals ref (torch Tensor) in shape, dtype and values."""
    ref = ref.detach().numpy()
    got = out.numpy()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    tol = dict(TOL.get(np.dtype(dtype or got.dtype).type, dict(rtol=0, atol=0)))
    tol.update(kw)
    np.testing.assert_allclose(got, ref, **tol)


def raises(exc, *fragments):
    """Context manager asserting the ember error type and that its message holds every fragment."""
    class _Ctx:
        def __enter__(self):
            self._cm = pytest.raises(exc)
            self.info = self._cm.__enter__()
            return self.info

        def __exit__(self, *a):
            r = self._cm.__exit__(*a)
            msg = str(self.info.value)
            for f in fragments:
                assert f in msg, f"{f!r} not in {msg!r}"
            return r

    return _Ctx()
