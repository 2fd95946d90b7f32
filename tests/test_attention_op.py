"""ember.ops.attention's compositions on a backend without attention kernels (the example backend ``toy``): the
forward op and, through autodiff, the backward against torch; and the backward op's own composition (what a backend
with a forward kernel but no backward kernel runs) against torch's gradients; the output-only op (``sdpa_out``,
inference) through its composition, untracked and differentiated when tracked. Devices are reached by name; no
plugin is imported."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import ember
import ember.nn.functional as F
from ember.ops import attention as A

TF = torch.nn.functional
TOL = {"rtol": 1e-10, "atol": 1e-12}

# name -> (query, key, value shapes, mask: None / "bool" / "float" + its shape, keyword arguments)
CASES: dict[str, tuple[Any, ...]] = {
    "plain": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), None, {}),
    "causal": ((2, 3, 6, 4), (2, 3, 4, 4), (2, 3, 4, 6), None, {"is_causal": True}),
    "bool-mask": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), ("bool", (5, 7)), {}),
    "float-mask": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6), ("float", (2, 1, 5, 7)), {"scale": 0.3}),
    "gqa": ((2, 6, 5, 4), (2, 2, 7, 4), (2, 3, 7, 6), None, {"enable_gqa": True}),
    "bcast": ((1, 3, 5, 4), (2, 1, 7, 4), (3, 7, 6), None, {}),
}


def _data(case: str, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray | None, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    qs, ks, vs, mask, kw = CASES[case]
    arrays = [rng.standard_normal(s) for s in (qs, ks, vs)]
    m = None
    if mask is not None:
        kind, shape = mask
        if kind == "bool":
            m = rng.random(shape) < 0.6
            m[..., 0] = True
        else:
            m = rng.standard_normal(shape)
    return arrays, m, kw


@pytest.mark.parametrize("case", list(CASES))
def test_composition_on_toy_against_torch(case: str) -> None:
    dev = ember.Device.parse("toy+autodiff")
    assert "toy" not in A.sdpa.kernels and "toy" not in A.sdpa_backward.kernels
    arrays, m, kw = _data(case)
    grad_mask = m is not None and m.dtype != np.bool_
    e_in = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    e_m = None if m is None else ember.tensor(m, device=dev, requires_grad=grad_mask)
    t_m = None if m is None else torch.tensor(m, requires_grad=grad_mask)
    e_out = F.scaled_dot_product_attention(*e_in, attn_mask=e_m, **kw)
    t_out = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, **kw)
    np.testing.assert_allclose(e_out.numpy(), t_out.detach().numpy(), **TOL)
    g = np.random.default_rng(1).standard_normal(tuple(t_out.shape))
    (e_out * ember.tensor(g, device=dev)).sum().backward()
    (t_out * torch.tensor(g)).sum().backward()
    for e, t in zip(e_in, t_in):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **TOL)
    if grad_mask:
        np.testing.assert_allclose(e_m.grad.numpy(), t_m.grad.numpy(), **TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_backward_composition_against_torch(case: str) -> None:
    """sdpa_backward's composition (run directly on toy) gives torch's gradients."""
    dev = ember.Device.parse("toy")
    arrays, m, kw = _data(case, seed=2)
    grad_mask = m is not None and m.dtype != np.bool_
    q, k, v = (ember.tensor(a, device=dev) for a in arrays)
    em = None if m is None else ember.tensor(m, device=dev)
    hq = arrays[0].shape[-3] if len(arrays[0].shape) >= 3 else 1
    rk = hq // arrays[1].shape[-3] if kw.get("enable_gqa") else 1
    rv = hq // arrays[2].shape[-3] if kw.get("enable_gqa") else 1
    scale = kw.get("scale", arrays[0].shape[-1] ** -0.5)
    opts = {"scale": scale, "is_causal": kw.get("is_causal", False), "repeat_k": rk, "repeat_v": rv,
            "mask_grad": grad_mask}
    out, attn = A.sdpa(q, k, v, em, None, **opts)
    g = np.random.default_rng(3).standard_normal(tuple(out.shape))
    grads = A.sdpa_backward(q, k, v, em, None, out, attn, ember.tensor(g, device=dev), **opts)
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    t_m = None if m is None else torch.tensor(m, requires_grad=grad_mask)
    t_out = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, **kw)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL)
    (t_out * torch.tensor(g)).sum().backward()
    want = [t.grad for t in t_in] + ([t_m.grad] if grad_mask else [])
    assert len(grads) == len(want)
    for a, b in zip(grads, want):
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(a.numpy(), b.numpy(), **TOL)


def test_shape_rules_refuse_bad_operands() -> None:
    dev = ember.Device.parse("toy")
    q = ember.zeros(2, 4, 8, device=dev)
    with pytest.raises(ember.ShapeError, match=r"nn.scaled_dot_product_attention: .*\(2, 4, 8\)"):
        A.sdpa(q, ember.zeros(2, 5, 3, device=dev), q, None, None, scale=1.0)
    with pytest.raises(ember.DTypeError, match="attn_mask dtype"):
        A.sdpa(q, q, q, ember.zeros(4, 4, dtype=ember.int64, device=dev), None, scale=1.0)
    out, attn = A.sdpa(q, q, q, None, None, scale=1.0)
    with pytest.raises(ember.ShapeError, match="expected dout of shape"):
        A.sdpa_backward(q, q, q, None, None, out, attn, ember.zeros(2, 4, 7, device=dev), scale=1.0)
    with pytest.raises(ember.DTypeError, match="mask_grad needs a float attn_mask"):
        A.sdpa_backward(q, q, q, None, None, out, attn, out, scale=1.0, mask_grad=True)


@pytest.mark.parametrize("case", list(CASES))
def test_output_only_op_on_toy(case: str) -> None:
    """sdpa_out on a backend without kernels: its composition (sdpa's first output) gives torch's numbers and the
    exact bits of sdpa's output; its shape rule describes one output of the output's shape."""
    dev = ember.Device.parse("toy")
    assert "toy" not in A.sdpa_out.kernels
    arrays, m, kw = _data(case, seed=4)
    q, k, v = (ember.tensor(a, device=dev) for a in arrays)
    em = None if m is None else ember.tensor(m, device=dev)
    hq = arrays[0].shape[-3] if len(arrays[0].shape) >= 3 else 1
    rk = hq // arrays[1].shape[-3] if kw.get("enable_gqa") else 1
    rv = hq // arrays[2].shape[-3] if kw.get("enable_gqa") else 1
    opts = {"scale": kw.get("scale", arrays[0].shape[-1] ** -0.5), "is_causal": kw.get("is_causal", False),
            "repeat_k": rk, "repeat_v": rv}
    out = A.sdpa_out(q, k, v, em, None, **opts)
    spec = A.sdpa_out.output_spec(q, k, v, em, None, **opts)
    assert isinstance(spec, ember.TensorSpec) and spec.shape == tuple(out.shape) and spec.dtype is out.dtype
    assert np.array_equal(out.numpy(), A.sdpa(q, k, v, em, None, **opts)[0].numpy())
    want = TF.scaled_dot_product_attention(*(torch.tensor(a) for a in arrays),
                                           attn_mask=None if m is None else torch.tensor(m), **kw)
    np.testing.assert_allclose(out.numpy(), want.numpy(), **TOL)


@pytest.mark.parametrize("case", ["plain", "float-mask", "gqa"])
def test_output_only_op_tracked_differentiates_its_composition(case: str) -> None:
    """Called on operands that require grad (it has no vjp of its own), autodiff differentiates the composition:
    torch's gradients, the float mask's included."""
    dev = ember.Device.parse("toy+autodiff")
    arrays, m, kw = _data(case, seed=5)
    grad_mask = m is not None
    e_in = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    e_m = None if m is None else ember.tensor(m, device=dev, requires_grad=True)
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    t_m = None if m is None else torch.tensor(m, requires_grad=True)
    rk, rv = (3, 2) if kw.get("enable_gqa") else (1, 1)
    out = A.sdpa_out(*e_in, e_m, None, scale=kw.get("scale", 0.5), repeat_k=rk, repeat_v=rv)
    t_out = TF.scaled_dot_product_attention(*t_in, attn_mask=t_m, **kw)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL)
    g = np.random.default_rng(6).standard_normal(tuple(t_out.shape))
    (out * ember.tensor(g, device=dev)).sum().backward()
    (t_out * torch.tensor(g)).sum().backward()
    for e, t in zip(e_in + ([e_m] if grad_mask else []), t_in + ([t_m] if grad_mask else [])):
        np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), **TOL)


def test_output_only_op_refuses_bad_operands() -> None:
    dev = ember.Device.parse("toy")
    q = ember.zeros(2, 4, 8, device=dev)
    with pytest.raises(ember.ShapeError, match=r"nn.scaled_dot_product_attention_out: .*\(2, 4, 8\)"):
        A.sdpa_out(q, ember.zeros(2, 5, 3, device=dev), q, None, None, scale=1.0)
    with pytest.raises(ember.DTypeError, match="attn_mask dtype"):
        A.sdpa_out(q, q, q, ember.zeros(4, 4, dtype=ember.int64, device=dev), None, scale=1.0)
    with pytest.raises(ember.ShapeError, match="dropout_mask"):
        A.sdpa_out(q, q, q, None, ember.zeros(2, 4, 5, device=dev), scale=1.0)
    with pytest.raises(ember.DTypeError, match="query, key and value must have one dtype"):
        A.sdpa_out(q, q, ember.zeros(2, 4, 8, dtype=ember.float64, device=dev), None, None, scale=1.0)
