"""The faster paths of flex's training kernels (``ember_flex.train_kernels``), each against torch and against the
path it replaces where that must give the same bits:

* results do not depend on the thread count or the block size (every element and every per-block partial sum is
  computed alike, partial sums added in block order): bit for bit with 1 and 2 threads, blocks made small so that
  small tensors cut into many blocks and go through flex's pool;
* batch norm's one-sweep statistics (``E[x**2] - mean**2`` where every channel has ``mean**2 <= var``) against
  torch in float64, and the exact two-pass fallback where a channel's mean dwarfs its spread (where the one-sweep
  formula would lose every digit); per-channel planes against broadcast columns (same bits); channel-split blocks;
* cross-entropy's log-sum-exp without the row max (rows that overflow, underflow, NaN and inf logits redone) and
  the backward's row factor folded into the exponent (and not folded: negative or extreme gradients), with
  weights, ``ignore_index``, label smoothing, float64;
* batch norm through ``nn.functional`` and ``nn.BatchNorm2d`` in the one-sweep regime (train, eval, momentum None);
* Adam's blocked (and pooled) update bit for bit against the unblocked one and the unfused path, and against torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import dispatch
from ember.ops import train_kernels as T
from ember_flex import threads
from ember_flex import train_kernels as K

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """``use(n)``: n threads, every tensor large enough for the pool, blocks small (many per tiny tensor)."""
    before = threads.get_num_threads()
    monkeypatch.setattr(K, "BN_BLOCK", 64)
    monkeypatch.setattr(K, "BN_RUN", 16)
    monkeypatch.setattr(K, "CE_BLOCK", 64)
    monkeypatch.setattr(K, "ADAM_BLOCK", 32)

    def use(n: int) -> None:
        threads.set_num_threads(n)
        monkeypatch.setattr(threads, "min_elems", 1 if n > 1 else 1 << 62)

    try:
        yield use
    finally:
        threads.set_num_threads(before)


def _bits(a: Any, b: Any) -> None:
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes(), np.nanmax(np.abs(x - y))


def _t64(a: np.ndarray | None, grad: bool = False) -> Any:
    return None if a is None else torch.tensor(a.astype(np.float64), requires_grad=grad)


def _bn_torch(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, dy: np.ndarray,
              saved: tuple[np.ndarray, np.ndarray], eps: float = 1e-5) -> tuple[Any, ...]:
    """torch's native batch norm (training) forward and backward in float64 on the same data; the backward from
    the statistics the kernel saved (``saved``: mean, invstd, as the op's backward receives them), since with a
    large mean the float32 rounding of the saved mean alone moves dweight by ~1e-5 relative."""
    tx = _t64(x)
    y, mean, invstd = torch.ops.aten.native_batch_norm(tx, _t64(w), _t64(b), None, None, True, 0.1, eps)
    dx, dw, db = torch.ops.aten.native_batch_norm_backward(_t64(dy), tx, _t64(w), None, None, _t64(saved[0]),
                                                           _t64(saved[1]), True, eps, [True, True, True])
    return tuple(t.numpy() for t in (y, mean, invstd, dx, dw, db))


def _close(got: np.ndarray, ref: np.ndarray, dtype: Any, terms: float = 1.0, ulps: float = 1.0) -> None:
    """float32: a few ulps of the reference's scale (its float32 inputs are exact in float64), or of ``terms``,
    the size of the terms the result is a difference of, where larger; ``ulps`` times that where each element
    carries a known extra error."""
    scale = max(terms, float(np.nanmax(np.abs(ref))) if ref.size else 1.0)
    tol = (2e-6 if np.dtype(dtype) == np.float32 else 1e-12) * ulps
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale)


# -- thread count and block size -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_do_not_depend_on_threads_or_blocks(pooled: Callable[[int], None], dtype: Any) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5, 7, 3)).astype(dtype)
    w, b = rng.uniform(0.5, 1.5, 5).astype(dtype), rng.standard_normal(5).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    logits = (rng.standard_normal((37, 11)) * 4).astype(dtype)
    logits[3, 2] = 120.0  # a row whose exp overflows: redone with its max
    t = rng.integers(0, 11, 37)
    cw = rng.uniform(0.5, 2, 11).astype(dtype)
    shifted = (x + 10.0).astype(dtype)  # mean**2 > var: the two-pass path

    def run() -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for xx in (x, shifted):
            y, mean, invstd, var = K.batch_norm_train(None, xx, w, b)
            out += [y, mean, invstd, var, *K.batch_norm_train_backward(None, xx, w, mean, invstd, dy)]
        loss, lse = K.cross_entropy_index(None, logits, t, cw, reduction="none", label_smoothing=0.1)
        g = np.asarray(1.5, dtype)
        out += [loss, lse, K.cross_entropy_index_backward(None, logits, t, cw, lse, g, label_smoothing=0.1)]
        state = [a.astype(dtype) for a in (rng0.standard_normal(300), rng0.standard_normal(300),
                                           rng0.standard_normal(300), rng0.uniform(0, 1, 300))]
        K.adam_step(None, state[0], state[1], state[2], state[3], None, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8,
                    weight_decay=0.1, step=3.0)
        return out + [state[0], state[2], state[3]]

    rng0 = np.random.default_rng(1)
    pooled(1)
    serial = run()
    rng0 = np.random.default_rng(1)
    pooled(2)
    _bits(run(), serial)


# -- batch norm ----------------------------------------------------------------------------------------------------
BN_CASES = {
    "conv": ((8, 6, 9, 7), 0.5),        # |mean| < std: one sweep
    "bn1d": ((33, 9), 0.3),
    "long-rows": ((2, 3, 5000), 0.2),   # rows longer than BN_RUN: blocks split along the positions
    "shifted": ((8, 6, 9, 7), 40.0),    # |mean| >> std: the exact two passes
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("case", BN_CASES)
def test_batch_norm_vs_torch(dtype: Any, affine: bool, case: str) -> None:
    shape, spread = BN_CASES[case]
    rng = np.random.default_rng(2)
    c = shape[1]
    means = rng.standard_normal(c) * spread
    x = (rng.standard_normal(shape) + means.reshape((1, c) + (1,) * (len(shape) - 2))).astype(dtype)
    w = rng.uniform(0.5, 1.5, c).astype(dtype) if affine else None
    b = rng.standard_normal(c).astype(dtype) if affine else None
    dy = rng.standard_normal(shape).astype(dtype)
    y, mean, invstd, var = K.batch_norm_train(None, x, w, b)
    dx, dw, db = K.batch_norm_train_backward(None, x, w, mean, invstd, dy)
    ty, tmean, tinvstd, tdx, tdw, tdb = _bn_torch(x, w, b, dy, (mean, invstd))
    # y = (x - mean) * k: the float32 rounding of a large mean is an error of |mean| * k ulps in y
    terms = float(np.abs(tmean).max() * tinvstd.max() * (1.5 if affine else 1.0))
    for got, ref in ((y, ty), (mean, tmean), (invstd, tinvstd), (var, x.astype(np.float64).var(
            (0,) + tuple(range(2, len(shape))))), (dx, tdx), (dw, tdw), (db, tdb)):
        assert got.dtype == dtype
        _close(got, ref, dtype, terms)


def test_batch_norm_one_sweep_would_cancel_where_the_fallback_runs() -> None:
    """Mean 1e4, spread 1: ``E[x**2] - mean**2`` in float32 sums would have no correct digit; the kernel's guard
    sends this to the two passes, which get the variance to float32's precision."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((16, 4, 10, 10)) + 1e4).astype(np.float32)
    _, _, _, var = K.batch_norm_train(None, x, None, None)
    np.testing.assert_allclose(var, x.astype(np.float64).var((0, 2, 3)), rtol=1e-5)


def test_batch_norm_planes_and_columns_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-channel operands spread over (C, S) planes or broadcast as (C, 1) columns (beyond PLANE_MAX): the same
    ufuncs on the same values."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((5, 4, 6, 6)) * 2).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, 4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)

    def run() -> list[np.ndarray]:
        out = []
        for xx in (x, x + 30):
            y, mean, invstd, var = K.batch_norm_train(None, xx, w, b)
            out += [y, mean, invstd, var, *K.batch_norm_train_backward(None, xx, w, mean, invstd, dy)]
        return out

    monkeypatch.setattr(K, "PLANE_MIN", 1)
    planes = run()
    monkeypatch.setattr(K, "PLANE_MAX", 1)
    _bits(run(), planes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norm_row_dots_on_one_sample_blocks(monkeypatch: pytest.MonkeyPatch, dtype: Any) -> None:
    """Blocks of one sample (the seed CNN's 64 channels of 26x26): channel sums as BLAS row dots (vecdot, matmul
    against ones) on one BLAS thread -- within float32's few ulps of torch in float64 as einsum's sums are, and the
    same bits whatever BLAS's thread count."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(8)
    x = (rng.standard_normal((2, 64, 26, 26)) * 1.5 + 0.3).astype(dtype)
    w, b = rng.uniform(0.5, 1.5, 64).astype(dtype), rng.standard_normal(64).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)

    def run() -> list[np.ndarray]:
        y, mean, invstd, var = K.batch_norm_train(None, x, w, b)
        return [y, mean, invstd, var, *K.batch_norm_train_backward(None, x, w, mean, invstd, dy)]

    assert K._bn_blocks(2, 64, 26 * 26)[0][0][0] == slice(0, 1)  # one sample per block: the row-dot path
    for row_dots in (True, False):
        monkeypatch.setattr(K, "BN_ROW_DOTS", row_dots)
        y, mean, invstd, var, dx, dw, db = run()
        ty, tmean, tinvstd, tdx, tdw, tdb = _bn_torch(x, w, b, dy, (mean, invstd))
        for got, ref in ((y, ty), (mean, tmean), (invstd, tinvstd), (dx, tdx), (dw, tdw), (db, tdb)):
            _close(got, ref, dtype, terms=float(np.abs(ref).max()))
    monkeypatch.setattr(K, "BN_ROW_DOTS", True)
    with threadpool_limits(limits=1, user_api="blas"):
        one = run()
    with threadpool_limits(limits=2, user_api="blas"):
        _bits(run(), one)


def test_batch_norm_channel_split_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks smaller than one sample's rows: channel ranges of position ranges, partial sums in their columns."""
    monkeypatch.setattr(K, "BN_BLOCK", 40)
    monkeypatch.setattr(K, "BN_RUN", 16)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 7, 50)).astype(np.float64)
    w, b = rng.uniform(0.5, 1.5, 7), rng.standard_normal(7)
    dy = rng.standard_normal(x.shape)
    y, mean, invstd, _ = K.batch_norm_train(None, x, w, b)
    dx, dw, db = K.batch_norm_train_backward(None, x, w, mean, invstd, dy)
    ty, tmean, tinvstd, tdx, tdw, tdb = _bn_torch(x, w, b, dy, (mean, invstd))
    for got, ref in ((y, ty), (mean, tmean), (invstd, tinvstd), (dx, tdx), (dw, tdw), (db, tdb)):
        _close(got, ref, np.float64)


@pytest.mark.parametrize("dev", ["flex+autodiff", "flex+fusion(False)+autodiff"])
def test_functional_batch_norm_one_sweep_regime(dev: str) -> None:
    """nn.functional.batch_norm in training (running stats, momentum) and eval, on data centred near zero (the
    one-sweep statistics), values and gradients against torch."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((6, 4, 5, 5)) * 1.5 + 0.2).astype(np.float32)
    w, b = rng.uniform(0.5, 1.5, 4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    ex, ew, eb = (ember.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    erm, erv = ember.zeros(4, device=dev), ember.ones(4, device=dev)
    trm, trv = torch.zeros(4), torch.ones(4)
    ey = F.batch_norm(ex, erm, erv, ew, eb, training=True, momentum=0.2)
    ty = TF.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.2)
    (ey * ember.tensor(dy, device=dev)).sum().backward()
    (ty * torch.tensor(dy)).sum().backward()
    for e, t in ((ey, ty), (erm, trm), (erv, trv), (ex.grad, tx.grad), (ew.grad, tw.grad), (eb.grad, tb.grad)):
        np.testing.assert_allclose(e.detach().numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-5)
    ee = F.batch_norm(ex.detach(), erm, erv, ew.detach(), eb.detach(), training=False)
    te = TF.batch_norm(tx.detach(), trm, trv, tw.detach(), tb.detach(), training=False)
    np.testing.assert_allclose(ee.numpy(), te.numpy(), rtol=1e-5, atol=1e-5)


def test_batch_norm_module_momentum_none() -> None:
    """BatchNorm2d with momentum=None (cumulative averages) over steps of data near zero mean, then eval."""
    dev = "flex+autodiff"
    em = ember.nn.BatchNorm2d(5, momentum=None, device=dev)
    tm = torch.nn.BatchNorm2d(5, momentum=None)
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = (rng.standard_normal((4, 5, 6, 6)) + 0.3).astype(np.float32)
        np.testing.assert_allclose(em(ember.tensor(x, device=dev)).detach().numpy(),
                                   tm(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    for name, buf in tm.state_dict().items():
        np.testing.assert_allclose(em.state_dict()[name].numpy(), buf.numpy(), rtol=1e-5, atol=1e-6)
    em.eval()
    tm.eval()
    x = rng.standard_normal((2, 5, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(em(ember.tensor(x, device=dev)).detach().numpy(),
                               tm(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-5)


# -- cross-entropy -------------------------------------------------------------------------------------------------
def _ce_torch(x: np.ndarray, t: np.ndarray, w: np.ndarray | None, g: float, **kw: Any) -> tuple[np.ndarray, ...]:
    tx = _t64(x, grad=True)
    loss = TF.cross_entropy(tx, torch.tensor(t), weight=_t64(w), **kw)
    gt = torch.full_like(loss, g)
    loss.backward(gt)
    return loss.detach().numpy(), tx.grad.numpy()


CE_LOGITS = {
    "plain": (0.0, 3.0),
    "overflow": (95.0, 1.0),      # float32 exp(x) overflows: every row redone with its max
    "underflow": (-150.0, 1.0),   # every term underflows: redone
    "wide": (0.0, 40.0),          # some rows' sums far from 1
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("logits", CE_LOGITS)
@pytest.mark.parametrize("opts", ["plain", "weight-ignore", "smooth", "all"])
def test_cross_entropy_vs_torch(monkeypatch: pytest.MonkeyPatch, dtype: Any, logits: str, opts: str) -> None:
    """Every reduction, and gradients that fold into the exponent (1.0) and that do not (negative, extreme); with
    folding on at this size and off (the small-input path)."""
    off, scale = CE_LOGITS[logits]
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((13, 9)) * scale + off).astype(dtype)
    t = rng.integers(0, 9, 13)
    w = None
    kw: dict[str, Any] = {}
    if opts in ("weight-ignore", "all"):
        w = rng.uniform(0.2, 2.0, 9).astype(dtype)
        t[::4] = -100
        kw["ignore_index"] = -100
    if opts in ("smooth", "all"):
        kw["label_smoothing"] = 0.2
    for reduction, grad, fold_min in (("mean", 1.0, 1), ("sum", -0.5, 1), ("none", 1.0, 1), ("mean", 1e-12, 1),
                                      ("none", -2.0, 1), ("mean", 1.0, 1 << 40), ("none", 0.5, 1 << 40)):
        monkeypatch.setattr(K, "CE_FOLD_MIN", fold_min)
        loss, lse = K.cross_entropy_index(None, x, t, w, reduction=reduction, **kw)
        g = np.full(loss.shape, grad, dtype)
        dx = K.cross_entropy_index_backward(None, x, t, w, lse, g, reduction=reduction, **kw)
        tloss, tdx = _ce_torch(x, t, w, grad, reduction=reduction, **kw)
        assert loss.dtype == dx.dtype == dtype
        # the saved lse is rounded to the dtype: |lse| ulps of error in every exp(x - lse), and in the loss
        big = float(np.abs(x).max())
        _close(loss, tloss, dtype, terms=big)
        _close(dx, tdx, dtype, ulps=1.0 + big / 8)


def test_cross_entropy_nonfinite_logits_match_torch() -> None:
    """NaN and inf logits and rows of -inf: NaN exactly where torch has NaN, the finite rows unchanged."""
    x = np.random.default_rng(9).standard_normal((5, 6)).astype(np.float32)
    x[1, 2] = np.nan
    x[2, 3] = np.inf
    x[3, 1] = -np.inf
    t = np.array([0, 1, 2, 3, 4])
    loss, lse = K.cross_entropy_index(None, x, t, None, reduction="none")
    dx = K.cross_entropy_index_backward(None, x, t, None, lse, np.ones(5, np.float32), reduction="none")
    tloss, tdx = _ce_torch(x, t, None, 1.0, reduction="none")
    np.testing.assert_array_equal(np.isnan(loss), np.isnan(tloss))
    np.testing.assert_array_equal(np.isnan(dx), np.isnan(tdx))
    keep = ~np.isnan(tloss)
    np.testing.assert_allclose(loss[keep], tloss[keep], rtol=2e-6, atol=2e-6)
    rows = ~np.isnan(tdx).any(axis=1)
    np.testing.assert_allclose(dx[rows], tdx[rows], rtol=2e-6, atol=2e-6)


def test_cross_entropy_long_rows_use_pairwise_sums() -> None:
    """Rows longer than CE_EINSUM_MAX (a large vocabulary) against torch in float64."""
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((3, K.CE_EINSUM_MAX + 77)) * 2).astype(np.float32)
    t = rng.integers(0, x.shape[1], 3)
    loss, lse = K.cross_entropy_index(None, x, t, None, reduction="none")
    dx = K.cross_entropy_index_backward(None, x, t, None, lse, np.ones(3, np.float32), reduction="none")
    tloss, tdx = _ce_torch(x, t, None, 1.0, reduction="none")
    _close(loss, tloss, np.float32)
    _close(dx, tdx, np.float32)


# -- Adam ----------------------------------------------------------------------------------------------------------
ADAM_CONFIGS = {"adam": {}, "l2-amsgrad": {"weight_decay": 0.1, "amsgrad": True},
                "adamw-maximize": {"adamw": True, "maximize": True, "weight_decay": 0.05}}


def _adam_steps(cfg: dict[str, Any], dtype: str, framework: Any = ember, dev: str = "flex+autodiff",
                steps: int = 3) -> list[np.ndarray]:
    cfg = dict(cfg)
    cls = framework.optim.AdamW if cfg.pop("adamw", False) else framework.optim.Adam
    rng = np.random.default_rng(11)
    kw = {"device": dev} if framework is ember else {}
    p = framework.tensor(rng.standard_normal((9, 41)).astype(dtype), requires_grad=True, **kw)
    opt = cls([p], lr=0.01, **cfg)
    for _ in range(steps):
        p.grad = framework.tensor(rng.standard_normal((9, 41)).astype(dtype), **kw)
        opt.step()
    st = opt.state[p]
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if cfg.get("amsgrad") else [])
    return [p.detach().numpy().copy()] + [np.asarray(st[k].numpy() if hasattr(st[k], "numpy") else st[k])
                                          for k in keys]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_blocks_bit_identical_and_vs_torch(pooled: Callable[[int], None], dtype: str, config: str) -> None:
    """A (9, 41) parameter in blocks of 32 on two threads: the same bits as one thread's unblocked update (every
    element computed alike) and as the unfused path; within float tolerance of torch."""
    cfg = ADAM_CONFIGS[config]
    pooled(2)
    blocked = _adam_steps(cfg, dtype)
    pooled(1)
    K.ADAM_BLOCK = 1 << 20  # restored by the fixture's monkeypatch
    whole = _adam_steps(cfg, dtype)
    _bits(blocked, whole)
    kernel = T.adam_step.kernels.pop("flex")
    dispatch.clear_cache()
    try:
        plain = _adam_steps(cfg, dtype)
    finally:
        T.adam_step.kernel("flex")(kernel)
        dispatch.clear_cache()
    _bits(blocked, plain)
    ref = _adam_steps(cfg, dtype, framework=torch)
    tol = 1e-6 if dtype == "float32" else 1e-12
    for got, want in zip(blocked, ref):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
