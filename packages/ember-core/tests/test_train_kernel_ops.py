"""Core's training ops (ember.ops.train_kernels) through their compositions, against torch.

The "toy" backend has no kernel for the ops, so calling an op there runs its composition in ember ops: the
forward ops (cross-entropy with its log-sum-exp, training-mode batch norm with its statistics), the backward ops
(compared with torch's autograd) and the Adam update (compared with torch.optim.Adam/AdamW, step by step). On
toy+autodiff the forward compositions are differentiated op by op. (The flex kernels are tested in ember-flex's
tests/test_train_kernels.py.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ember
from ember import Device
from ember.errors import DTypeError, ShapeError, ValueRangeError
from ember.ops import train_kernels as T

torch = pytest.importorskip("torch")
TF = torch.nn.functional

TOL = {"rtol": 1e-9, "atol": 1e-11}


def _t(a: np.ndarray, dev: str = "toy", grad: bool = False) -> Any:
    return ember.tensor(a, device=Device.parse(dev), requires_grad=grad)


@pytest.mark.parametrize("shape", [(6,), (5, 4), (3, 4, 5), (2, 3, 2, 2)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_cross_entropy_ops_vs_torch(shape: tuple[int, ...], reduction: str, weighted: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * 2
    c = shape[1] if len(shape) > 1 else shape[0]
    t = rng.integers(0, c, (shape[0],) + shape[2:] if len(shape) > 1 else ()).astype(np.int64)
    if t.ndim:
        t.reshape(-1)[::2] = 1  # ignored
    w = rng.uniform(0.5, 2, c) if weighted else None
    kw = {"ignore_index": 1, "reduction": reduction, "label_smoothing": 0.15}
    tx = torch.tensor(x, requires_grad=True)
    tl = TF.cross_entropy(tx, torch.tensor(t), None if w is None else torch.tensor(w), **kw)
    g = rng.standard_normal(tuple(tl.shape))
    tl.backward(torch.tensor(g))
    ex, et, ew = _t(x), _t(t), None if w is None else _t(w)
    loss, lse = T.cross_entropy_index(ex, et, ew, **kw)
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), **TOL)
    xb = x.reshape(1, -1) if x.ndim == 1 else x
    np.testing.assert_allclose(lse.numpy(), torch.logsumexp(torch.tensor(xb), 1).numpy(), **TOL)
    dx = T.cross_entropy_index_backward(ex, et, ew, lse, _t(np.asarray(g)), **kw)
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), **TOL)
    # the forward composition, differentiated op by op on toy+autodiff
    ax = _t(x, "toy+autodiff", grad=True)
    al, _ = T.cross_entropy_index(ax, _t(t, "toy+autodiff"), None if w is None else _t(w, "toy+autodiff"), **kw)
    al.backward(_t(np.asarray(g), "toy+autodiff"))
    np.testing.assert_allclose(ax.grad.numpy(), tx.grad.numpy(), **TOL)


@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 4), (2, 3, 3, 2)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_batch_norm_ops_vs_torch(shape: tuple[int, ...], affine: bool) -> None:
    rng = np.random.default_rng(1)
    c = shape[1]
    x = rng.standard_normal(shape) * 3 + 1
    w, b = (rng.uniform(0.5, 2, c), rng.standard_normal(c)) if affine else (None, None)
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    ty = TF.batch_norm(tx, None, None, tw, tb, training=True, eps=1e-3)
    dy = rng.standard_normal(shape)
    ty.backward(torch.tensor(dy))
    ex = _t(x)
    ew, eb = (None, None) if w is None else (_t(w), _t(b))
    y, mean, invstd, var = T.batch_norm_train(ex, ew, eb, eps=1e-3)
    dims = (0,) + tuple(range(2, len(shape)))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **TOL)
    np.testing.assert_allclose(mean.numpy(), x.mean(dims), **TOL)
    np.testing.assert_allclose(var.numpy(), x.var(dims), **TOL)
    np.testing.assert_allclose(invstd.numpy(), 1 / np.sqrt(x.var(dims) + 1e-3), **TOL)
    dx, dweight, dbias = T.batch_norm_train_backward(ex, ew, mean, invstd, _t(dy))
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), **TOL)
    if affine:
        np.testing.assert_allclose(dweight.numpy(), tw.grad.numpy(), **TOL)
        np.testing.assert_allclose(dbias.numpy(), tb.grad.numpy(), **TOL)
    ax = _t(x, "toy+autodiff", grad=True)
    ay, *_ = T.batch_norm_train(ax, None if w is None else _t(w, "toy+autodiff"),
                                None if b is None else _t(b, "toy+autodiff"), eps=1e-3)
    ay.backward(_t(dy, "toy+autodiff"))
    np.testing.assert_allclose(ax.grad.numpy(), tx.grad.numpy(), **TOL)


@pytest.mark.parametrize("config", [{}, {"weight_decay": 0.1}, {"decoupled_weight_decay": True, "weight_decay": 0.1},
                                    {"amsgrad": True, "maximize": True}, {"betas": (0.2, 0.5)}],
                         ids=["adam", "l2", "adamw", "amsgrad-maximize", "beta1-high"])
def test_adam_step_op_vs_torch(config: dict[str, Any]) -> None:
    rng = np.random.default_rng(2)
    p0 = rng.standard_normal((4, 3))
    tp = torch.tensor(p0, requires_grad=True)
    opt = torch.optim.Adam([tp], lr=0.05, **config)
    amsgrad = config.get("amsgrad", False)
    beta1, beta2 = config.get("betas", (0.9, 0.999))
    p, m, v = _t(p0), _t(np.zeros_like(p0)), _t(np.zeros_like(p0))
    mx = _t(np.zeros_like(p0)) if amsgrad else None
    for step in range(1, 4):
        g = rng.standard_normal((4, 3))
        tp.grad = torch.tensor(g)
        opt.step()
        out = T.adam_step(p, _t(g), m, v, mx, lr=0.05, beta1=beta1, beta2=beta2, eps=1e-8,
                          weight_decay=config.get("weight_decay", 0.0),
                          decoupled_weight_decay=config.get("decoupled_weight_decay", False), amsgrad=amsgrad,
                          maximize=config.get("maximize", False), step=float(step))
        assert len(out) == (4 if amsgrad else 3)
        p, m, v = out[:3]
        mx = out[3] if amsgrad else None
    state = opt.state[tp]
    np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), **TOL)
    np.testing.assert_allclose(m.numpy(), state["exp_avg"].numpy(), **TOL)
    np.testing.assert_allclose(v.numpy(), state["exp_avg_sq"].numpy(), **TOL)
    if amsgrad:
        np.testing.assert_allclose(mx.numpy(), state["max_exp_avg_sq"].numpy(), **TOL)


def test_ops_refuse_bad_arguments_by_name() -> None:
    x = _t(np.zeros((4, 3)))
    with pytest.raises(ShapeError, match="cross_entropy_index.*target of shape"):
        T.cross_entropy_index(x, _t(np.zeros(3, np.int64)), None)
    with pytest.raises(DTypeError, match="cross_entropy_index.*int64"):
        T.cross_entropy_index(x, _t(np.zeros(4, np.int32)), None)
    with pytest.raises(ValueRangeError, match="reduction"):
        T.cross_entropy_index(x, _t(np.zeros(4, np.int64)), None, reduction="avg")
    with pytest.raises(ShapeError, match="cross_entropy_index.*weight"):
        T.cross_entropy_index(x, _t(np.zeros(4, np.int64)), _t(np.ones(4)))
    with pytest.raises(ShapeError, match="cross_entropy_index_backward.*grad"):
        T.cross_entropy_index_backward(x, _t(np.zeros(4, np.int64)), None, _t(np.zeros(4)), _t(np.zeros(4)))
    with pytest.raises(DTypeError, match="batch_norm_train.*floating"):
        T.batch_norm_train(_t(np.zeros((4, 3), np.int64)), None, None)
    with pytest.raises(ValueRangeError, match="batch_norm_train.*more than 1 value"):
        T.batch_norm_train(_t(np.zeros((1, 3))), None, None)
    with pytest.raises(ShapeError, match="batch_norm_train.*bias"):
        T.batch_norm_train(x, None, _t(np.zeros(4)))
    with pytest.raises(DTypeError, match="adam_step.*exp_avg"):
        T.adam_step(x, x, _t(np.zeros((4, 3), np.float32)), x, None, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    with pytest.raises(ShapeError, match="adam_step.*max_exp_avg_sq"):
        T.adam_step(x, x, x, x, x, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    assert not T.has_kernel(T.adam_step, x)
