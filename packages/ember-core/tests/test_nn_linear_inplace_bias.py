"""``F.linear`` adds the bias into matmul's fresh result in place on a bare backend; every other case (a decorated
stack, a bias that does not broadcast into the result, an empty reduction) keeps the out-of-place add. Results
match torch in each case."""

from __future__ import annotations

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import Device

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("device", ["flex", "flex+autodiff"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("x_shape", "w_shape"), [
    ((5, 7), (3, 7)),          # the in-place path on a bare backend
    ((2, 4, 7), (3, 7)),       # leading dims flattened into one GEMM
    ((5, 0), (3, 0)),          # empty reduction: the result is the bias
    ((6,), (3, 6)),            # a vector input
])
def test_linear_bias_matches_torch(device: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                   dtype: str) -> None:
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in (x_shape, w_shape, w_shape[:1]))
    dev = Device.parse(device)
    got = F.linear(ember.tensor(x, device=dev), ember.tensor(w, device=dev), ember.tensor(b, device=dev))
    want = torch.nn.functional.linear(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_in_place_bias_leaves_the_inputs_alone_and_gradients_flow() -> None:
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 5), (3, 5), (3,)))
    tx, tw, tb = (ember.tensor(a) for a in (x, w, b))
    F.linear(tx, tw, tb)
    for t, a in ((tx, x), (tw, w), (tb, b)):
        np.testing.assert_array_equal(t.numpy(), a)
    dev = Device.flex().autodiff()
    ax, aw, ab = (ember.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    F.linear(ax, aw, ab).sum().backward()
    np.testing.assert_allclose(ab.grad.numpy(), np.full(3, 4.0, np.float32))
    np.testing.assert_allclose(aw.grad.numpy(), np.tile(x.sum(0), (3, 1)), rtol=1e-6)
