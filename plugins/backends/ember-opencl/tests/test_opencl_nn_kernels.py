"""ember-opencl's kernels for core's GELU, layer-norm and attention ops (ember_opencl.nn_kernels) against torch:
values and, through autodiff (whose backward ops read what the kernels return: mean/rstd, the probabilities),
gradients, for odd sizes that cross the kernels' work-group and tile sizes, masks (bool and float, broadcast),
causal attention, grouped-query heads, strided and broadcast operands, dropout factors, float64 and float16; and
that the kernel, not the op's composition, ran (the programs the runtime was asked for are recorded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")
torch = pytest.importorskip("torch")

import ember  # noqa: E402
import ember.nn.functional as F  # noqa: E402
from ember.dispatch import extension_kernel  # noqa: E402
from ember.ops import attention as A  # noqa: E402
from ember.ops import train_kernels as T  # noqa: E402
from ember_opencl import nn_kernels  # noqa: E402
from ember_opencl.runtime import device_count  # noqa: E402

pytestmark = pytest.mark.skipif(device_count() == 0, reason="no OpenCL device")

TF = torch.nn.functional
TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-5}, np.float64: {"rtol": 1e-10, "atol": 1e-12},
       np.float16: {"rtol": 1e-2, "atol": 2e-3}}


@pytest.fixture()
def launched(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the kernels the OpenCL runtime builds or looks up while the test runs."""
    rt = ember.Device.opencl(0).stack.rt
    names: list[str] = []
    real = rt.kernel

    def spy(source: str, name: str) -> Any:
        names.append(name)
        return real(source, name)

    monkeypatch.setattr(rt, "kernel", spy)
    yield names


def _dev(grad: bool = False) -> ember.Device:
    return ember.Device.parse("opencl+autodiff") if grad else ember.Device.opencl(0)


def test_kernels_are_registered() -> None:
    stack = ember.Device.opencl(0).stack
    assert extension_kernel(T.gelu, stack) is nn_kernels.gelu
    assert extension_kernel(T.gelu_backward, stack) is nn_kernels.gelu_backward
    assert extension_kernel(T.layer_norm, stack) is nn_kernels.layer_norm
    assert extension_kernel(T.layer_norm_backward, stack) is nn_kernels.layer_norm_backward
    assert extension_kernel(A.sdpa, stack) is nn_kernels.sdpa


# -- GELU ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_values_and_gradient(approximate: str, dtype: type, launched: list[str]) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((7, 143)) * 3).astype(dtype)
    g = rng.standard_normal((143, 7)).astype(dtype)
    ex = ember.tensor(x, device=_dev(True), requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    ey = F.gelu(ex.transpose(0, 1), approximate=approximate)  # a strided input: copied contiguous first
    ty = TF.gelu(tx.transpose(0, 1), approximate=approximate)
    np.testing.assert_allclose(ey.numpy(), ty.detach().numpy(), **TOL[dtype])
    (ey * ember.tensor(g, device=_dev(True))).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), **TOL[dtype])
    assert "ember_gelu" in launched and "ember_gelu_backward" in launched


def test_gelu_float16_and_empty() -> None:
    x = np.linspace(-6, 6, 1001).astype(np.float16)
    for approximate in ("none", "tanh"):
        y = T.gelu(ember.tensor(x, device=_dev()), approximate=approximate)
        ref = TF.gelu(torch.tensor(x, dtype=torch.float32), approximate=approximate).numpy().astype(np.float16)
        assert y.dtype is ember.float16
        np.testing.assert_allclose(y.numpy().astype(np.float32), ref.astype(np.float32), **TOL[np.float16])
    assert T.gelu(ember.zeros(0, 3, device=_dev())).shape == (0, 3)


# -- layer norm ----------------------------------------------------------------------------------------------------
LN_CASES = {
    "row37": ((3, 5, 37), (37,), True, True),
    "two-dims": ((4, 6, 7), (6, 7), True, False),
    "no-affine": ((9, 300), (300,), False, False),
    "bias-only": ((2, 1), (1,), False, True),
}


@pytest.mark.parametrize("case", list(LN_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_values_and_gradients(case: str, dtype: type, launched: list[str]) -> None:
    shape, ns, has_w, has_b = LN_CASES[case]
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 2 + 5).astype(dtype)  # off-centre: the two-pass variance matters
    w = rng.standard_normal(ns).astype(dtype) if has_w else None
    b = rng.standard_normal(ns).astype(dtype) if has_b else None
    dev = _dev(True)
    ex = ember.tensor(x, device=dev, requires_grad=True)
    ew_ = None if w is None else ember.tensor(w, device=dev, requires_grad=True)
    eb = None if b is None else ember.tensor(b, device=dev, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    ey = F.layer_norm(ex, ns, ew_, eb)
    ty = TF.layer_norm(tx, ns, tw, tb)
    np.testing.assert_allclose(ey.numpy(), ty.detach().numpy(), **TOL[dtype])
    g = rng.standard_normal(shape).astype(dtype)
    (ey * ember.tensor(g, device=dev)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    for e, t in ((ex, tx), (ew_, tw), (eb, tb)):
        if e is not None:
            np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **TOL[dtype])
    assert {"ember_layer_norm", "ember_layer_norm_dx", "ember_layer_norm_dparams"} <= set(launched)


def test_layer_norm_backward_broadcast_gradient_and_no_rows() -> None:
    """The gradient of ``layer_norm(x).sum()`` arrives broadcast (stride 0); no rows give zero dweight/dbias."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((33, 20)).astype(np.float32)
    dev = _dev()
    ex = ember.tensor(x, device=dev)
    _, mean, rstd = T.layer_norm(ex, None, None, normalized_shape=(20,))
    dy = ember.ones(1, 1, device=dev).expand(33, 20)
    dx, dw, db = T.layer_norm_backward(ex, None, mean, rstd, dy, normalized_shape=(20,))
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.ones(20, requires_grad=True)
    tb = torch.zeros(20, requires_grad=True)
    TF.layer_norm(tx, (20,), tw, tb).sum().backward()
    for e, t in ((dx, tx.grad), (dw, tw.grad), (db, tb.grad)):
        np.testing.assert_allclose(e.numpy(), t.numpy(), rtol=1e-4, atol=1e-4)
    empty = ember.zeros(0, 20, device=dev)
    stat = ember.zeros(0, 1, device=dev)
    _, dw, db = T.layer_norm_backward(empty, None, stat, stat, empty, normalized_shape=(20,))
    np.testing.assert_array_equal(dw.numpy(), np.zeros(20, np.float32))
    np.testing.assert_array_equal(db.numpy(), np.zeros(20, np.float32))


def test_layer_norm_statistics_float16_and_strided() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    ex = ember.tensor(x, device=_dev()).transpose(0, 1)  # (6, 40), strided
    y, mean, rstd = T.layer_norm(ex, None, None, normalized_shape=(40,), eps=1e-5)
    ty, tmean, trstd = torch.native_layer_norm(torch.tensor(x).T, (40,), None, None, 1e-5)
    for e, t in ((y, ty), (mean, tmean), (rstd, trstd)):
        assert tuple(e.shape) == tuple(t.shape)
        np.testing.assert_allclose(e.numpy(), t.numpy(), **TOL[np.float32])
    h = x.astype(np.float16)
    w = rng.standard_normal(6).astype(np.float16)
    yh = T.layer_norm(ember.tensor(h, device=_dev()), ember.tensor(w, device=_dev()), None,
                      normalized_shape=(6,))[0]
    ref = TF.layer_norm(torch.tensor(h, dtype=torch.float32), (6,), torch.tensor(w, dtype=torch.float32))
    np.testing.assert_allclose(yh.numpy().astype(np.float32), ref.numpy(), **TOL[np.float16])


# -- attention -----------------------------------------------------------------------------------------------------
# name -> (query, key, value shapes, mask: None / (kind, shape), keyword arguments); sizes cross the kernel's
# 16-row work-groups, 16-key tiles and 32-feature tiles
SDPA_CASES: dict[str, tuple[Any, ...]] = {
    "plain": ((2, 3, 19, 40), (2, 3, 37, 40), (2, 3, 37, 33), None, {}),
    "causal": ((2, 2, 35, 8), (2, 2, 21, 8), (2, 2, 21, 5), None, {"is_causal": True}),
    "bool-mask": ((2, 3, 17, 12), (2, 3, 23, 12), (2, 3, 23, 6), ("bool", (17, 23)), {}),
    "float-mask": ((2, 3, 5, 4), (2, 3, 18, 4), (2, 3, 18, 6), ("float", (2, 1, 5, 18)), {"scale": 0.3}),
    "gqa": ((2, 6, 19, 16), (2, 2, 20, 16), (2, 3, 20, 7), None, {"enable_gqa": True}),
    "bcast": ((1, 3, 5, 4), (2, 1, 7, 4), (3, 7, 6), None, {}),
    "unbatched": ((9, 64), (70, 64), (70, 64), None, {}),
}


def _sdpa_data(case: str, dtype: type) -> tuple[list[np.ndarray], np.ndarray | None, dict[str, Any]]:
    rng = np.random.default_rng(3)
    qs, ks, vs, mask, kw = SDPA_CASES[case]
    arrays = [rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs)]
    m = None
    if mask is not None:
        kind, shape = mask
        if kind == "bool":
            m = rng.random(shape) < 0.6
            m[3] = False  # a row with every position masked gives zeros (torch's safe softmax)
        else:
            m = rng.standard_normal(shape).astype(dtype)
    return arrays, m, kw


def _torch_sdpa(arrays: list[np.ndarray], m: np.ndarray | None, kw: dict[str, Any],
                grad: bool) -> tuple[Any, list[Any]]:
    t_in = [torch.tensor(a, requires_grad=grad) for a in arrays]
    t_m = None if m is None else torch.tensor(m)
    out = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, **kw)
    if m is not None and m.dtype == np.bool_:
        out = out.nan_to_num(0.0)  # torch's math path gives NaN on fully masked rows where ember gives zeros
    return out, t_in


@pytest.mark.parametrize("case", list(SDPA_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_values_and_gradients(case: str, dtype: type, launched: list[str]) -> None:
    arrays, m, kw = _sdpa_data(case, dtype)
    dev = _dev(True)
    e_in = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    e_m = None if m is None else ember.tensor(m, device=dev)
    e_out = F.scaled_dot_product_attention(*e_in, attn_mask=e_m, **kw)
    t_out, t_in = _torch_sdpa(arrays, m, kw, True)
    np.testing.assert_allclose(e_out.numpy(), t_out.detach().numpy(), **TOL[dtype])
    assert "ember_sdpa" in launched
    g = np.random.default_rng(4).standard_normal(tuple(t_out.shape)).astype(dtype)
    (e_out * ember.tensor(g, device=dev)).sum().backward()
    (t_out * torch.tensor(g)).sum().backward()
    for e, t in zip(e_in, t_in):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **TOL[dtype])


def test_sdpa_probabilities_dropout_and_strided_operands() -> None:
    """The op's attn output is the undropped softmax; out is (attn * dropout) @ v; transposed q/k read in place."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 18, 3, 8))  # (B, L, H, E): the usual (B, H, L, E) is its transpose
    k = rng.standard_normal((2, 25, 3, 8))
    v = rng.standard_normal((2, 3, 25, 9))
    drop = (rng.random((2, 3, 18, 25)) > 0.25) / 0.75
    dev = _dev()
    eq, ek = (ember.tensor(a, device=dev).transpose(1, 2) for a in (q, k))
    out, attn = A.sdpa(eq, ek, ember.tensor(v, device=dev), None, ember.tensor(drop, device=dev), scale=0.4)
    qt, kt = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
    s = qt @ kt.swapaxes(-1, -2) * 0.4
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(attn.numpy(), p, **TOL[np.float64])
    np.testing.assert_allclose(out.numpy(), (p * drop) @ v, **TOL[np.float64])


@pytest.mark.parametrize("case", ["plain", "causal", "float-mask", "gqa"])
def test_sdpa_float16(case: str) -> None:
    arrays, m, kw = _sdpa_data(case, np.float16)
    dev = _dev()
    e_out = F.scaled_dot_product_attention(*(ember.tensor(a, device=dev) for a in arrays),
                                           attn_mask=None if m is None else ember.tensor(m, device=dev), **kw)
    assert e_out.dtype is ember.float16
    t_out, _ = _torch_sdpa([a.astype(np.float32) for a in arrays], None if m is None else m.astype(np.float32),
                           kw, False)
    np.testing.assert_allclose(e_out.numpy().astype(np.float32), t_out.numpy(), **TOL[np.float16])


def test_sdpa_empty_shapes() -> None:
    dev = _dev()
    q = ember.zeros(2, 0, 4, device=dev)
    out, attn = A.sdpa(q, ember.zeros(2, 3, 4, device=dev), ember.zeros(2, 3, 5, device=dev), None, None, scale=1.0)
    assert tuple(out.shape) == (2, 0, 5) and tuple(attn.shape) == (2, 0, 3)
    q = ember.ones(2, 3, 4, device=dev)
    out, attn = A.sdpa(q, ember.zeros(2, 0, 4, device=dev), ember.zeros(2, 0, 5, device=dev), None, None, scale=1.0)
    assert tuple(attn.shape) == (2, 3, 0)
    np.testing.assert_array_equal(out.numpy(), np.zeros((2, 3, 5), np.float32))
