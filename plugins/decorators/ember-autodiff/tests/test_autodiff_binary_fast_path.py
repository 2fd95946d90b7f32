"""The recording path of ``a op b`` (ElementwiseRules.binary with its inlined constructors and, on a backend with
``binary_kernels``, the kernel called directly): gradients equal PyTorch's for every shape case and for one or both
operands requiring grad, saved operands are version-checked, and untracked results stay untracked."""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch

import ember
from ember.errors import AutodiffError

OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
       "pow": operator.pow}
SHAPES = [((7,), (7,)), ((3, 1), (1, 4)), ((4,), (3, 4)), ((), ()), ((1,), (1,)), ((), (5,)), ((5,), ())]


@pytest.mark.parametrize("needs", ["a", "b", "ab"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_gradients_match_torch(op: str, needs: str) -> None:
    dev = ember.Device.flex().autodiff()
    rng = np.random.default_rng(0)
    fn = OPS[op]
    for sa, sb in SHAPES:
        a_np = np.asarray(rng.uniform(0.5, 2.0, sa), dtype=np.float32)
        b_np = np.asarray(rng.uniform(0.5, 2.0, sb), dtype=np.float32)
        ea = ember.tensor(a_np, device=dev, requires_grad="a" in needs)
        eb = ember.tensor(b_np, device=dev, requires_grad="b" in needs)
        ta = torch.from_numpy(a_np.copy()).requires_grad_("a" in needs)
        tb = torch.from_numpy(b_np.copy()).requires_grad_("b" in needs)
        for _ in range(2):  # first call: the dtype is learned through binary(); then the short path
            out, ref = fn(ea, eb), fn(ta, tb)
            np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-6)
            assert out.grad_fn is not None and out.requires_grad
            out.sum().backward()
            ref.sum().backward()
        for e, t in ((ea, ta), (eb, tb)):
            if t.requires_grad:
                np.testing.assert_allclose(e.grad.numpy(), t.grad.numpy(), rtol=1e-5, err_msg=f"{op} {sa} {sb}")
            else:
                assert e.grad is None


def test_an_operand_modified_after_recording_is_an_error() -> None:
    dev = ember.Device.flex().autodiff()
    a = ember.tensor(np.ones(10, np.float32), device=dev, requires_grad=True)
    b = ember.tensor(np.full(10, 3.0, np.float32), device=dev)
    y = a * b  # saves b for a's gradient
    b.add_(1.0)
    with pytest.raises(AutodiffError, match="modified by an in-place operation"):
        y.sum().backward()


def test_untracked_results() -> None:
    dev = ember.Device.flex().autodiff()
    a = ember.tensor(np.ones(10, np.float32), device=dev, requires_grad=True)
    b = ember.tensor(np.ones(10, np.float32), device=dev)
    assert (a < b).grad_fn is None and not (a < b).requires_grad  # a comparison records nothing
    assert (b + b).grad_fn is None  # nothing requires grad
    with ember.no_grad():
        assert (a + b).grad_fn is None and not (a + b).requires_grad
    c = a + b
    assert c.grad_fn is not None and c.shape == (10,)
