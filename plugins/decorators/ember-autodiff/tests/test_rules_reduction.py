"""Gradients of reductions, scans, sort/topk, softmax and logsumexp against torch autograd (float64).

Every case runs with and without balanced checkpointing (the recompute paths must give identical gradients).
Cases whose forward goes through movement ops (reshape, gather, getitem) need the movement rules and are skipped
while those are not there yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import Device
from ember_autodiff.rules_movement import MovementRules

torch = pytest.importorskip("torch")

needs_movement = pytest.mark.skipif(
    not hasattr(MovementRules, "getitem"), reason="needs the movement rules (reshape/getitem/gather)"
)


@pytest.fixture(params=[None, "balanced"], ids=["plain", "balanced"])
def dev(request: pytest.FixtureRequest) -> Device:
    base = Device.flex()
    return base.autodiff() if request.param is None else base.autodiff(checkpointing="balanced")


def _values(out: Any) -> Any:
    return out[0] if isinstance(out, tuple) else out


def check(dev: Device, fn: Callable[..., Any], tfn: Callable[..., Any] | None, *arrays: np.ndarray,
          seed: int = 0) -> list[np.ndarray]:
    """Run fn on ember leaves and tfn (default fn) on torch leaves, backprop one random upstream gradient
    through both, and compare the forward values and every input gradient."""
    tfn = tfn or fn
    xs = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, tout = _values(fn(*xs)), _values(tfn(*ts))
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-12, atol=1e-12)
    w = np.random.default_rng(seed).standard_normal(tuple(tout.shape))
    out.backward(ember.tensor(w, device=dev))
    tout.backward(torch.tensor(w))
    grads = []
    for x, t in zip(xs, ts):
        assert x.grad is not None, "no gradient reached the input"
        g = x.grad.numpy()
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)
        grads.append(g)
    return grads


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _ties(*shape: int, seed: int = 0) -> np.ndarray:
    """Small integers as floats: many ties per reduction group."""
    return np.random.default_rng(seed).integers(-2, 3, shape).astype(np.float64)


DIMS = [None, 0, 1, -1, (0, 2), (2, 0), (0, 1, 2)]


# -- sum / mean and compositions ---------------------------------------------------------------------------
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum(dev: Device, dim: Any, keepdim: bool) -> None:
    if dim is None:
        check(dev, lambda x: x.sum(), None, _rand(3, 4, 5))
    else:
        check(dev, lambda x: x.sum(dim, keepdim=keepdim), None, _rand(3, 4, 5))


def test_sum_of_broadcast_product(dev: Device) -> None:
    check(dev, lambda x, y: (x * y).sum((0, 2)), None, _rand(3, 4, 5), _rand(4, 1, seed=1))


@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_mean(dev: Device, dim: Any, keepdim: bool) -> None:
    check(dev, lambda x: x.mean(dim, keepdim=keepdim), None, _rand(3, 4, 5))


def test_sum_chain(dev: Device) -> None:
    # the brief's smoke check: (x.sum(1) ** 2).sum() -> 2 * rowsum broadcast back
    x = _rand(3, 4)
    (g,) = check(dev, lambda x: (x.sum(1) * x.sum(1)).sum(), None, x)
    w = np.random.default_rng(0).standard_normal(())
    np.testing.assert_allclose(g, np.broadcast_to(2 * w * x.sum(1, keepdims=True), (3, 4)))


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("correction", [0, 1])
def test_var_std_keepdim(dev: Device, keepdim: bool, correction: int) -> None:
    if not keepdim and not hasattr(MovementRules, "reshape"):
        pytest.skip("var without keepdim reshapes the mean: needs the movement rules")
    check(dev, lambda x: x.var((0, 2), correction=correction, keepdim=keepdim), None, _rand(3, 4, 5))
    check(dev, lambda x: x.std(1, correction=correction, keepdim=keepdim), None, _rand(3, 4, 5))


@pytest.mark.parametrize("ord_", [2, 1, 3, 0.5, float("inf"), float("-inf")])
def test_vector_norm(dev: Device, ord_: float) -> None:
    check(dev, lambda x: ember.linalg.vector_norm(x, ord_, dim=1), lambda x: torch.linalg.vector_norm(x, ord_, dim=1),
          _rand(3, 4, 5) + 0.1)


def test_vector_norm_inf_ties(dev: Device) -> None:
    # |x| ties (including x and -x): the inf-norm's gradient is split evenly, signed, as in PyTorch
    x = np.array([[1.0, -3.0, 3.0, 2.0], [0.5, 0.5, -0.5, 0.25]])
    check(dev, lambda x: ember.linalg.vector_norm(x, float("inf"), dim=1),
          lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1), x)


# -- prod ------------------------------------------------------------------------------------------------------
def _with_zeros(n_zero: int, seed: int = 0) -> np.ndarray:
    x = _rand(3, 4, 5, seed=seed)
    flat = x.reshape(-1)
    rng = np.random.default_rng(seed + 7)
    flat[rng.choice(flat.size, n_zero, replace=False)] = 0.0
    return x


@pytest.mark.parametrize("n_zero", [0, 1, 2, 6])
@pytest.mark.parametrize("dim", [None, 0, 1, 2])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod(dev: Device, n_zero: int, dim: Any, keepdim: bool) -> None:
    x = _with_zeros(n_zero)
    if dim is None:
        check(dev, lambda x: x.prod(), None, x)
    else:
        check(dev, lambda x: x.prod(dim, keepdim=keepdim), None, x)


def test_prod_zero_groups_exact(dev: Device) -> None:
    # one zero: only the zero gets the product of the others; two zeros: everything is 0
    x = np.array([[2.0, 0.0, 3.0], [0.0, 4.0, 0.0], [1.0, 2.0, 3.0]])
    (g,) = check(dev, lambda x: x.prod(1), None, x, seed=3)
    w = np.random.default_rng(3).standard_normal(3)
    np.testing.assert_allclose(g, [[0, 6 * w[0], 0], [0, 0, 0], [6 * w[2], 3 * w[2], 2 * w[2]]])
    assert np.isfinite(g).all()


@pytest.mark.parametrize("dims", [(0, 2), (2, 0), (1, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod_dim_tuple(dev: Device, dims: tuple[int, ...], keepdim: bool) -> None:
    # torch's prod takes one dim: the oracle reduces the dims one by one (the product is associative)
    def tfn(x: Any) -> Any:
        for d in sorted(dims, reverse=True):
            x = x.prod(d, keepdim=keepdim) if not keepdim else x.prod(d, keepdim=True)
        return x

    for n_zero in (0, 1, 3):
        check(dev, lambda x: x.prod(dims, keepdim=keepdim), tfn, _with_zeros(n_zero, seed=n_zero))


# -- amax / amin / full max and min ------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim", [0, 1, -1, (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_amax_amin_ties(dev: Device, op: str, dim: Any, keepdim: bool) -> None:
    x = _ties(3, 4, 5)
    (g,) = check(dev, lambda x: getattr(x, op)(dim, keepdim=keepdim), None, x)
    assert np.count_nonzero(g) > (g.size // 5)  # ties really occurred and shared the gradient


@pytest.mark.parametrize("op", ["max", "min"])
def test_full_max_min_split_evenly(dev: Device, op: str) -> None:
    x = np.array([[3.0, 1.0, 3.0], [-1.0, 3.0, -1.0]])
    (g,) = check(dev, lambda x: getattr(x, op)(), None, x, seed=5)
    w = np.random.default_rng(5).standard_normal(())
    hit = x == (x.max() if op == "max" else x.min())
    np.testing.assert_allclose(g, np.where(hit, w / hit.sum(), 0.0))


def test_amax_broadcast_input(dev: Device) -> None:
    check(dev, lambda x, y: (x + y).amax(1), None, _ties(3, 4), _ties(1, 4, seed=2))


def test_amax_nan_gives_nan_gradient_like_torch(dev: Device) -> None:
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 2.0]])
    xe = ember.tensor(x, device=dev, requires_grad=True)
    xe.amax(1).sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    xt.amax(1).sum().backward()
    np.testing.assert_array_equal(np.isnan(xe.grad.numpy()), np.isnan(xt.grad.numpy()))
    np.testing.assert_allclose(xe.grad.numpy()[1], xt.grad.numpy()[1])


@needs_movement
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim_gradient_to_index_only(dev: Device, op: str, dim: int, keepdim: bool) -> None:
    x = _ties(3, 4, 5)
    (g,) = check(dev, lambda x: getattr(x, op)(dim, keepdim=keepdim), None, x)
    # exactly one element per reduced group gets a gradient (ties are not split)
    assert (np.count_nonzero(g, axis=dim) <= 1).all()


@needs_movement
def test_max_dim_indices_untracked(dev: Device) -> None:
    x = ember.tensor(_ties(3, 4), device=dev, requires_grad=True)
    v, i = x.max(1)
    assert v.requires_grad and not i.requires_grad
    np.testing.assert_array_equal(i.numpy(), torch.tensor(_ties(3, 4)).max(1)[1].numpy())


# -- scans -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cumsum(dev: Device, dim: int) -> None:
    check(dev, lambda x: x.cumsum(dim), None, _rand(3, 4, 5))


@pytest.mark.parametrize("n_zero", [0, 1, 3, 12])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cumprod(dev: Device, n_zero: int, dim: int) -> None:
    check(dev, lambda x: x.cumprod(dim), None, _with_zeros(n_zero, seed=n_zero))


def test_cumprod_zero_pattern(dev: Device) -> None:
    x = np.array([[2.0, 0.0, 3.0, 0.0, 5.0], [0.0, 0.0, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0, 0.0]])
    (g,) = check(dev, lambda x: x.cumprod(1), None, x)
    assert np.isfinite(g).all()


@needs_movement
@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("dim", [0, 1])
def test_cummax_cummin(dev: Device, op: str, dim: int) -> None:
    check(dev, lambda x: getattr(x, op)(dim), None, _ties(4, 6))


# -- sort, topk, kthvalue, median -------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dev: Device, dim: int, descending: bool) -> None:
    check(dev, lambda x: x.sort(dim, descending=descending), None, _rand(3, 4, 5))


def test_sort_stable_ties(dev: Device) -> None:
    check(dev, lambda x: ember.sort(x, 1, stable=True), lambda x: torch.sort(x, dim=1, stable=True), _ties(4, 7))
    check(dev, lambda x: ember.sort(x, 0, descending=True, stable=True),
          lambda x: torch.sort(x, dim=0, descending=True, stable=True), _ties(4, 7, seed=3))


def test_sort_indices_untracked(dev: Device) -> None:
    x = ember.tensor(_rand(3, 4), device=dev, requires_grad=True)
    v, i = x.sort(1)
    assert v.requires_grad and not i.requires_grad and i.grad_fn is None


def test_sort_indices_modified_in_place(dev: Device) -> None:
    x = ember.tensor(_rand(3, 4), device=dev, requires_grad=True)
    v, i = x.sort(1)
    i.add_(0)  # the indices are saved for backward: modifying them invalidates the graph (PyTorch)
    with pytest.raises(ember.AutodiffError, match="modified by an in-place operation"):
        v.sum().backward()


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, -1])
def test_topk(dev: Device, k: int, largest: bool, dim: int) -> None:
    x = _rand(5, 6)
    check(dev, lambda x: x.topk(k, dim, largest=largest), None, x)


def test_topk_broadcast_input(dev: Device) -> None:
    check(dev, lambda x, y: (x * y).topk(2, 1), None, _rand(3, 5), _rand(1, 5, seed=4))


@needs_movement
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue_median_dim(dev: Device, keepdim: bool) -> None:
    x = _rand(5, 6)
    check(dev, lambda x: x.kthvalue(2, 1, keepdim=keepdim), None, x)
    check(dev, lambda x: x.median(0, keepdim=keepdim), None, x)


@needs_movement
def test_kthvalue_ties_gradient_follows_returned_index(dev: Device) -> None:
    # which tied element torch's kthvalue returns is unspecified: the gradient goes to the returned index
    x = ember.tensor(_ties(5, 6), device=dev, requires_grad=True)
    v, i = x.kthvalue(3, 1)
    w = _rand(5, seed=9)
    v.backward(ember.tensor(w, device=dev))
    expect = np.zeros((5, 6))
    expect[np.arange(5), i.numpy()] = w
    np.testing.assert_allclose(x.grad.numpy(), expect)


@needs_movement
def test_median_full_splits_ties(dev: Device) -> None:
    x = np.array([1.0, 2.0, 2.0, 3.0, 2.0, 0.0])
    (g,) = check(dev, lambda x: x.median(), None, x)
    np.testing.assert_allclose(g[x == 2.0].sum(), np.random.default_rng(0).standard_normal(()))
    assert np.ptp(g[x == 2.0]) == 0


# -- softmax, log_softmax, logsumexp ------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax(dev: Device, fn: str, dim: int) -> None:
    check(dev, lambda x: getattr(F, fn)(x, dim), lambda x: getattr(torch.nn.functional, fn)(x, dim),
          _rand(3, 4, 5) * 3)


def test_softmax_with_infinite_logits(dev: Device) -> None:
    x = _rand(3, 5)
    x[:, 1] = -np.inf  # masked logits: zero probability, zero gradient
    check(dev, lambda x: F.softmax(x, 1), lambda x: torch.nn.functional.softmax(x, 1), x)
    check(dev, lambda x: F.log_softmax(x, 1).amax(1), lambda x: torch.nn.functional.log_softmax(x, 1).amax(1), x)


@pytest.mark.parametrize("dim", [0, 1, -1, (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(dev: Device, dim: Any, keepdim: bool) -> None:
    check(dev, lambda x: x.logsumexp(dim, keepdim=keepdim), None, _rand(3, 4, 5) * 10)


def test_logsumexp_broadcast_input(dev: Device) -> None:
    check(dev, lambda x, y: (x - y).logsumexp(1), None, _rand(3, 4), _rand(3, 1, seed=1))


# -- untracked and no_grad ---------------------------------------------------------------------------------------
def test_no_record_without_requires_grad(dev: Device) -> None:
    x = ember.tensor(_rand(3, 4), device=dev)
    for out in (x.sum(1), x.prod(), x.amax(0), x.cumsum(1), x.cumprod(0), x.sort(1)[0], x.topk(2)[0],
                F.softmax(x, 1), x.logsumexp(1)):
        assert not out.requires_grad and out.grad_fn is None


def test_no_record_under_no_grad(dev: Device) -> None:
    x = ember.tensor(_rand(3, 4), device=dev, requires_grad=True)
    with ember.no_grad():
        outs = (x.sum(1), x.prod(), x.amin(0), x.cumprod(0), x.sort(1)[0], F.log_softmax(x, 1))
    assert not any(o.requires_grad for o in outs)


def test_grad_fn_names(dev: Device) -> None:
    x = ember.tensor(_rand(3, 4), device=dev, requires_grad=True)
    names = [o.grad_fn() for o in (x.sum(1), x.prod(1), x.amax(1), x.cumsum(1), x.cumprod(1), x.sort(1)[0],
                                   x.topk(2)[0], F.softmax(x, 1), F.log_softmax(x, 1), x.logsumexp(1))]
    assert names == ["sumBackward", "prodBackward", "maxBackward", "cumsumBackward", "cumprodBackward",
                     "sortBackward", "topkBackward", "softmaxBackward", "log_softmaxBackward", "logsumexpBackward"]


# -- non-contiguous inputs ---------------------------------------------------------------------------------------
@needs_movement
@pytest.mark.parametrize("name", ["sum", "prod", "amax", "cumsum", "cumprod", "sort", "topk", "softmax",
                                  "logsumexp"])
def test_non_contiguous_views(dev: Device, name: str) -> None:
    fns: dict[str, Callable[[Any], Any]] = {
        "sum": lambda v: v.sum((0, 1)),
        "prod": lambda v: v.prod(1),
        "amax": lambda v: v.amax(0),
        "cumsum": lambda v: v.cumsum(1),
        "cumprod": lambda v: v.cumprod(0),
        "sort": lambda v: v.sort(1, descending=True),
        "topk": lambda v: v.topk(2, 0),
        "softmax": lambda v: F.softmax(v, 1) if isinstance(v, ember.Tensor) else torch.softmax(v, 1),
        "logsumexp": lambda v: v.logsumexp(0),
    }
    fn = fns[name]
    x = _with_zeros(4, seed=2) if name in ("prod", "cumprod") else _rand(3, 4, 5)
    # a transposed, strided view of the leaf
    check(dev, lambda x: fn(x.transpose(0, 2)[:, ::2]), None, x)


# -- edge cases --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["topk0", "prod_size1_zero", "prod_empty", "sum_empty", "cumprod_empty",
                                  "sort_empty", "prod_0d", "logsumexp_empty", "logsumexp_all_neg_inf"])
def test_edge_shapes(dev: Device, case: str) -> None:
    fn, x = {
        "topk0": (lambda v: v.topk(0, 1), _rand(3, 4)),
        "prod_size1_zero": (lambda v: v.prod(1), np.zeros((3, 1))),
        "prod_empty": (lambda v: v.prod(1), np.zeros((3, 0))),
        "sum_empty": (lambda v: v.sum(0), np.zeros((0, 3))),
        "cumprod_empty": (lambda v: v.cumprod(1), np.zeros((3, 0))),
        "sort_empty": (lambda v: v.sort(1), np.zeros((3, 0))),
        "prod_0d": (lambda v: v.prod(), np.array(0.0)),
        "logsumexp_empty": (lambda v: v.logsumexp(1), np.zeros((2, 0))),
        "logsumexp_all_neg_inf": (lambda v: v.logsumexp(1), np.full((2, 3), -np.inf)),
    }[case]
    xe = ember.tensor(x, device=dev, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    _values(fn(xe)).sum().backward()
    _values(fn(xt)).sum().backward()
    assert xe.grad.shape == tuple(xt.grad.shape)
    np.testing.assert_allclose(xe.grad.numpy(), xt.grad.numpy(), equal_nan=True)


@pytest.mark.parametrize("name", ["amax", "prod", "softmax", "logsumexp"])
def test_float32(dev: Device, name: str) -> None:
    fn = {"amax": lambda v: v.amax(1), "prod": lambda v: v.prod(1), "logsumexp": lambda v: v.logsumexp(1),
          "softmax": lambda v: F.softmax(v, 1) if isinstance(v, ember.Tensor) else torch.softmax(v, 1)}[name]
    x = np.array([[1.0, 0.0, 2.0, 2.0], [0.5, -1.0, 3.0, 0.25]], dtype=np.float32)
    xe = ember.tensor(x, device=dev, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    fn(xe).sum().backward()
    fn(xt).sum().backward()
    assert xe.grad.dtype is ember.float32
    np.testing.assert_allclose(xe.grad.numpy(), xt.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_chain_with_freed_intermediates(dev: Device) -> None:
    # every intermediate is dropped before backward: under balanced checkpointing the saved outputs are
    # recomputed from their inputs, and the gradients must not change
    def fn(x: Any) -> Any:
        if isinstance(x, ember.Tensor):
            s = F.log_softmax(x.cumprod(1) * x.amax(0, keepdim=True), 1)
        else:
            s = torch.log_softmax(x.cumprod(1) * x.amax(0, keepdim=True), 1)
        return (s.sort(1)[0] * s.prod(0)).logsumexp(1) + s.topk(2, 0)[0].sum(0).cumsum(0)[:4]

    x = _with_zeros(2, seed=4)[0]
    check(dev, fn, None, x)
