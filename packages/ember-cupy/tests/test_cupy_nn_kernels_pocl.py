"""ember_cupy.nn_kernels on the PoCL stand-in of test_cupy_kernels_pocl.py (the real launch code, GPU geometry:
256-thread layer-norm rows, 64-row attention blocks with shared-memory tiles) against torch; the fixture checks that
every program launched is one ``ember kernels check`` compiles for CUDA and HIP."""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("pyopencl")

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import test_cupy_kernels_pocl as _standin  # noqa: E402

# the stand-in's fixtures, used here under their names
pocl, catalogued, be = _standin.pocl, _standin.catalogued, _standin.be

from ember_cupy import nn_kernels as nk  # noqa: E402

TF = torch.nn.functional
TOL = {np.float32: 2e-5, np.float64: 1e-10, np.float16: 1e-2}


def _close(got: np.ndarray, want: Any, dtype: type) -> None:
    w = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.shape == w.shape, (got.shape, w.shape)
    np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_forward_and_backward(be: Any, pocl: Any, approximate: str, dtype: type) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((37, 29)) * 3).astype(dtype)
    g = rng.standard_normal((29, 37)).astype(dtype)
    tx = torch.tensor(x.T.copy(), requires_grad=True)
    ty = TF.gelu(tx, approximate=approximate)
    ty.backward(torch.tensor(g))
    _close(nk.gelu(be, x.T, approximate=approximate), ty, dtype)  # a strided input
    _close(nk.gelu_backward(be, x.T, g, approximate=approximate), tx.grad, dtype)
    assert {"ember_gelu", "ember_gelu_backward"} <= set(pocl.launched)


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
def test_layer_norm(be: Any, pocl: Any, affine: tuple[bool, bool]) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 3, 300)) * 2 + 4).astype(np.float32)
    w = rng.standard_normal(300).astype(np.float32) if affine[0] else None
    b = rng.standard_normal(300).astype(np.float32) if affine[1] else None
    y, mean, rstd = nk.layer_norm(be, x, w, b, normalized_shape=(300,))
    ty, tmean, trstd = torch.native_layer_norm(torch.tensor(x), (300,), None if w is None else torch.tensor(w),
                                               None if b is None else torch.tensor(b), 1e-5)
    for got, want in ((y, ty), (mean, tmean), (rstd, trstd)):
        _close(got, want, np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dx, dw, db = nk.layer_norm_backward(be, x, w, mean, rstd, dy, normalized_shape=(300,))
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w if w is not None else np.ones(300, np.float32), requires_grad=True)
    tb = torch.zeros(300, requires_grad=True)
    TF.layer_norm(tx, (300,), tw, tb).backward(torch.tensor(dy))
    _close(dx, tx.grad, np.float32)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert {"ember_layer_norm", "ember_layer_norm_dx", "ember_layer_norm_dparams"} <= set(pocl.launched)


# name -> (query, key, value shapes, mask: None / (kind, shape), options); 70 rows cross the 64-row blocks
CASES: dict[str, tuple[Any, ...]] = {
    "plain": ((2, 70, 40), (2, 37, 40), (2, 37, 70), None, {}),
    "causal": ((2, 70, 8), (2, 75, 8), (2, 75, 5), None, {"is_causal": True}),
    "bool-mask": ((2, 3, 17, 12), (2, 3, 23, 12), (2, 3, 23, 6), ("bool", (17, 23)), {}),
    "float-mask": ((2, 3, 5, 4), (2, 3, 18, 4), (2, 3, 18, 6), ("float", (2, 1, 5, 18)), {}),
    "gqa": ((2, 6, 9, 16), (2, 2, 20, 16), (2, 3, 20, 7), None, {"enable_gqa": True}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_against_torch(be: Any, pocl: Any, case: str, dtype: type) -> None:
    qs, ks, vs, mask, kw = CASES[case]
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))
    m = None
    if mask is not None:
        m = rng.random(mask[1]) < 0.6 if mask[0] == "bool" else rng.standard_normal(mask[1]).astype(dtype)
    rk = qs[-3] // ks[-3] if kw.get("enable_gqa") else 1
    rv = qs[-3] // vs[-3] if kw.get("enable_gqa") else 1
    scale = qs[-1] ** -0.5
    out, attn = nk.sdpa(be, q, k, v, m, None, scale=scale, is_causal=kw.get("is_causal", False), repeat_k=rk,
                        repeat_v=rv)
    want = TF.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v),
                                           attn_mask=None if m is None else torch.tensor(m), **kw)
    _close(out, want.nan_to_num(0.0), dtype)
    assert attn.shape == out.shape[:-1] + (ks[-2],)
    np.testing.assert_allclose(attn.sum(-1)[attn.sum(-1) > 0], 1.0, rtol=1e-5)
    assert "ember_sdpa" in pocl.launched


def test_sdpa_dropout_probabilities(be: Any) -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((3, 66, 8)), rng.standard_normal((3, 21, 8)), rng.standard_normal((3, 21, 9))
    drop = (rng.random((3, 66, 21)) > 0.2) / 0.8
    out, attn = nk.sdpa(be, q, k, v, None, drop, scale=0.5)
    s = q @ k.swapaxes(-1, -2) * 0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    _close(attn, p, np.float64)
    _close(out, (p * drop) @ v, np.float64)
