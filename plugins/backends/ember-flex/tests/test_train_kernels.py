"""The flex kernels of core's training ops (ember.ops.train_kernels): cross-entropy at class-index targets and its
backward, training-mode batch norm and its backward, and Adam's update, against torch (values and gradients, every
option, float32/float64, odd shapes), against the ops' compositions, and -- for Adam -- bit for bit against the
unfused path. Every test that goes through nn.functional or an optimizer checks the kernels really ran (a silent
fall back to the composition gives the same numbers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import dispatch
from ember.errors import DTypeError, IndexOutOfRangeError, ShapeError, ValueRangeError
from ember.ops import train_kernels as T

torch = pytest.importorskip("torch")
TF = torch.nn.functional

TOL = {"float32": {"rtol": 1e-5, "atol": 1e-6}, "float64": {"rtol": 1e-10, "atol": 1e-12}}
DEVICES = ["flex+autodiff", "flex+fusion(False)+autodiff"]
OPS = {"ce": T.cross_entropy_index, "ce_bwd": T.cross_entropy_index_backward, "bn": T.batch_norm_train,
       "bn_bwd": T.batch_norm_train_backward, "adam": T.adam_step}


@pytest.fixture
def calls() -> Iterator[dict[str, int]]:
    """Count the kernels' calls (the originals are restored afterwards)."""
    ember.zeros(1)  # plugins load lazily: the flex kernels are registered once flex is loaded
    counts = dict.fromkeys(OPS, 0)
    originals = {name: op.kernels["flex"] for name, op in OPS.items()}

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name, op in OPS.items():
        op.kernel("flex")(counting(name, originals[name]))
    try:
        yield counts
    finally:
        for name, op in OPS.items():
            op.kernel("flex")(originals[name])


def _close(e: Any, t: Any, dtype: str) -> None:
    np.testing.assert_allclose(e.detach().numpy() if hasattr(e, "detach") else e,
                               t.detach().numpy() if hasattr(t, "detach") else t, **TOL[dtype])


def _pair(a: np.ndarray, dev: str, grad: bool = True) -> tuple[Any, Any]:
    return ember.tensor(a, device=dev, requires_grad=grad), torch.tensor(a, requires_grad=grad)


# -- cross-entropy -------------------------------------------------------------------------------------------------
CE_SHAPES = [(7,), (1, 3), (9, 5), (4, 3, 5), (3, 4, 2, 3)]


def _ce_case(shape: tuple[int, ...], dtype: str, ignore: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    c = shape[1] if len(shape) > 1 else shape[0]
    tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    t = rng.integers(0, c, tshape).astype(np.int64)
    if ignore is not None and t.ndim and t.size > 1:
        t.reshape(-1)[::3] = ignore  # some targets ignored (never all)
    return x, t


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", CE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("opts", ["plain", "weight", "ignore", "smooth", "all"])
def test_cross_entropy_vs_torch(calls: dict[str, int], dev: str, dtype: str, shape: tuple[int, ...],
                                reduction: str, opts: str) -> None:
    ignore = 1 if opts in ("ignore", "all") else None
    x, t = _ce_case(shape, dtype, ignore)
    c = shape[1] if len(shape) > 1 else shape[0]
    kw: dict[str, Any] = {"reduction": reduction}
    if ignore is not None:
        kw["ignore_index"] = ignore
    if opts in ("smooth", "all"):
        kw["label_smoothing"] = 0.2
    w = np.random.default_rng(1).uniform(0.2, 2.0, c).astype(dtype) if opts in ("weight", "all") else None
    ex, tx = _pair(x, dev)
    el = F.cross_entropy(ex, ember.tensor(t, device=dev), None if w is None else ember.tensor(w, device=dev), **kw)
    tl = TF.cross_entropy(tx, torch.tensor(t), None if w is None else torch.tensor(w), **kw)
    assert el.shape == tuple(tl.shape) and el.dtype is getattr(ember, dtype)
    _close(el, tl, dtype)
    g = np.random.default_rng(2).standard_normal(tuple(tl.shape)).astype(dtype)
    el.backward(ember.tensor(g, device=dev))
    tl.backward(torch.tensor(g))
    _close(ex.grad, tx.grad, dtype)
    assert calls["ce"] == 1 and calls["ce_bwd"] == 1


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_all_ignored_and_infinite_logits(calls: dict[str, int], reduction: str) -> None:
    dev = "flex+autodiff"
    x = np.array([[1.0, -np.inf, 2.0], [0.5, 0.5, 0.5], [-np.inf, 3.0, 1.0]], dtype=np.float32)
    for t in (np.array([1, 1, 1]), np.array([0, 2, 1])):  # every target ignored; none ignored with -inf logits
        ex, tx = _pair(x, dev)
        kw = {"reduction": reduction, "ignore_index": 1, "label_smoothing": 0.1}
        el = F.cross_entropy(ex, ember.tensor(t, device=dev), **kw)
        tl = TF.cross_entropy(tx, torch.tensor(t), **kw)
        np.testing.assert_allclose(el.detach().numpy(), tl.detach().numpy(), rtol=1e-6, equal_nan=True)
        el.sum().backward()
        tl.sum().backward()
        np.testing.assert_allclose(ex.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-7, equal_nan=True)
    assert calls["ce"] == 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", CE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_kernels_match_compositions(dtype: str, shape: tuple[int, ...], reduction: str) -> None:
    dev = "flex"
    x, t = _ce_case(shape, dtype, 2)
    c = shape[1] if len(shape) > 1 else shape[0]
    w = ember.tensor(np.linspace(0.5, 1.5, c).astype(dtype), device=dev)
    ex, et = ember.tensor(x, device=dev), ember.tensor(t, device=dev)
    kw = {"ignore_index": 2, "reduction": reduction, "label_smoothing": 0.3}
    k_loss, k_lse = T.cross_entropy_index(ex, et, w, **kw)
    c_loss, c_lse = T.cross_entropy_index.composition(ex, et, w, **kw)
    _close(k_loss, c_loss.numpy(), dtype)
    _close(k_lse, c_lse.numpy(), dtype)
    g = ember.tensor(np.random.default_rng(3).standard_normal(k_loss.shape).astype(dtype), device=dev)
    k_dx = T.cross_entropy_index_backward(ex, et, w, k_lse, g, **kw)
    c_dx = T.cross_entropy_index_backward.composition(ex, et, w, c_lse, g, **kw)
    assert k_dx.shape == ex.shape
    _close(k_dx, c_dx.numpy(), dtype)


def test_cross_entropy_paths_that_keep_the_composition(calls: dict[str, int]) -> None:
    """A weight that requires grad (torch refuses its gradient; the composition gives one), class-probability
    targets, float16 and zero classes stay on the unfused path, as before."""
    dev = "flex+autodiff"
    x, t = _ce_case((5, 4), "float32", None)
    w = ember.tensor(np.ones(4, np.float32), device=dev, requires_grad=True)
    ex = ember.tensor(x, device=dev, requires_grad=True)
    F.cross_entropy(ex, ember.tensor(t, device=dev), w).backward()
    assert w.grad is not None and ex.grad is not None
    F.cross_entropy(ex, ember.tensor(np.full((5, 4), 0.25, np.float32), device=dev))
    F.cross_entropy(ex.detach().to(ember.float16), ember.tensor(t, device=dev))
    out = F.cross_entropy(ember.zeros(3, 0, device=dev), ember.full((3,), -100, dtype=ember.int64, device=dev))
    assert np.isnan(out.item())
    assert calls["ce"] == 0


def test_cross_entropy_errors_unchanged(calls: dict[str, int]) -> None:
    dev = "flex+autodiff"
    x = ember.randn(4, 3, device=dev)
    with pytest.raises(IndexOutOfRangeError, match="target 3 is out of bounds for 3 classes"):
        F.cross_entropy(x, ember.tensor([0, 1, 2, 3], device=dev))
    with pytest.raises(ShapeError, match="expected target of shape"):
        F.cross_entropy(x, ember.tensor([0, 1], device=dev))
    with pytest.raises(DTypeError, match="int64 or uint8"):
        F.cross_entropy(x, ember.tensor([0, 1, 2, 1], dtype=ember.int32, device=dev))
    with pytest.raises(ValueRangeError, match="label_smoothing"):
        F.cross_entropy(x, ember.tensor([0, 1, 2, 1], device=dev), label_smoothing=1.5)
    # the op itself refuses what its callers validated, naming itself
    with pytest.raises(ShapeError, match="cross_entropy_index.*target"):
        T.cross_entropy_index(x, ember.tensor([0, 1], device=dev), None)
    assert calls["ce"] == 0


# -- batch norm ----------------------------------------------------------------------------------------------------
#: the last two span several blocks of the flex kernels (a ragged last block; one sample per block)
BN_SHAPES = [(5, 3), (2, 4), (3, 5, 7), (4, 3, 5, 6), (2, 3, 3, 1, 2), (37, 4, 17, 19), (3, 2, 130, 130)]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("running", [True, False], ids=["running", "no-running"])
def test_batch_norm_training_vs_torch(calls: dict[str, int], dev: str, dtype: str, shape: tuple[int, ...],
                                      affine: bool, running: bool) -> None:
    """torch runs in float64 on the same (rounded) data: its float32 sums over tens of thousands of elements are
    less accurate than the kernels' (float64 across blocks), so float32 is held to float64's answer."""
    rng = np.random.default_rng(4)
    c = shape[1]

    def pair(a: np.ndarray, grad: bool = True) -> tuple[Any, Any]:
        a = a.astype(dtype)
        return ember.tensor(a, device=dev, requires_grad=grad), torch.tensor(a.astype(np.float64),
                                                                             requires_grad=grad)

    def close(e: Any, t: Any, terms: float = 1.0) -> None:
        ref = t.detach().numpy()
        scale = max(float(np.abs(ref).max()), terms)
        np.testing.assert_allclose(e.detach().numpy(), ref, rtol=TOL[dtype]["rtol"],
                                   atol=TOL[dtype]["atol"] * scale)

    ex, tx = pair(rng.standard_normal(shape) * 2 + 3)
    ew = tw = eb = tb = None
    if affine:
        ew, tw = pair(rng.uniform(0.5, 1.5, c))
        eb, tb = pair(rng.standard_normal(c))
    erm = erv = trm = trv = None
    if running:
        erm, trm = pair(rng.standard_normal(c), grad=False)
        erv, trv = pair(rng.uniform(0.5, 2, c), grad=False)
    kw = {"training": True, "momentum": 0.3, "eps": 1e-3}
    ey = F.batch_norm(ex, erm, erv, ew, eb, **kw)
    ty = TF.batch_norm(tx, trm, trv, tw, tb, **kw)
    assert ey.dtype is getattr(ember, dtype)
    close(ey, ty)
    if running:
        close(erm, trm)
        close(erv, trv)
    eg, tg = pair(rng.standard_normal(shape), grad=False)
    (ey * eg).sum().backward()
    (ty * tg).sum().backward()
    # dx is a difference of terms as large as |dy| * invstd * |weight| (with two samples it nearly cancels)
    dims = (0,) + tuple(range(2, len(shape)))
    invstd = 1 / np.sqrt(tx.detach().numpy().var(dims) + 1e-3)
    k1 = invstd * (tw.detach().numpy() if affine else 1.0)
    close(ex.grad, tx.grad, terms=max(1.0, float(np.abs(tg.numpy()).max() * k1.max())))
    if affine:
        close(ew.grad, tw.grad)
        close(eb.grad, tb.grad)
    assert calls["bn"] == 1 and calls["bn_bwd"] == 1


def test_batch_norm_module_train_and_eval(calls: dict[str, int]) -> None:
    """nn.BatchNorm2d with momentum=None (cumulative average) over a few steps, then eval (the running path)."""
    dev = "flex+autodiff"
    tm = torch.nn.BatchNorm2d(3, momentum=None)
    em = ember.nn.BatchNorm2d(3, momentum=None, device=dev)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
        _close(em(ember.tensor(x, device=dev)), tm(torch.tensor(x)), "float32")
    for name, buf in tm.state_dict().items():
        np.testing.assert_allclose(em.state_dict()[name].numpy(), buf.numpy(), rtol=1e-5, atol=1e-6)
    em.eval()
    tm.eval()
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    _close(em(ember.tensor(x, device=dev)), tm(torch.tensor(x)), "float32")
    assert calls["bn"] == 3


@pytest.mark.parametrize("dev", DEVICES)
def test_in_place_ops_on_the_results_keep_backward_legal(calls: dict[str, int], dev: str) -> None:
    """ResNet's ``out = bn(conv(x)); out += shortcut; relu_`` and ``loss /= steps``: in-place ops on what
    batch_norm and cross_entropy return are legal (the ops' vjps never read those outputs), as in torch."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    sc = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    t = rng.integers(0, 3, (4, 5, 5))
    ex, tx = _pair(x, dev)
    ew, tw = _pair(np.linspace(0.5, 1.5, 3).astype(np.float32), dev)

    def run(fw: Any, xx: Any, w: Any, shortcut: Any, target: Any, functional: Any) -> Any:
        out = functional.batch_norm(xx, None, None, w, None, training=True)
        out += shortcut
        out = out.relu_()
        loss = functional.cross_entropy(out, target)
        loss /= 2
        loss.backward()
        return loss

    el = run(ember, ex, ew, ember.tensor(sc, device=dev), ember.tensor(t, device=dev), F)
    tl = run(torch, tx, tw, torch.tensor(sc), torch.tensor(t), TF)
    _close(el, tl, "float32")
    _close(ex.grad, tx.grad, "float32")
    _close(ew.grad, tw.grad, "float32")
    assert calls["bn"] == 1 and calls["ce"] == 1 and calls["bn_bwd"] == 1 and calls["ce_bwd"] == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batch_norm_kernels_match_compositions(dtype: str, shape: tuple[int, ...]) -> None:
    dev = "flex"
    rng = np.random.default_rng(6)
    x = ember.tensor((rng.standard_normal(shape) + 5).astype(dtype), device=dev)
    w = ember.tensor(rng.uniform(0.5, 2, shape[1]).astype(dtype), device=dev)
    b = ember.tensor(rng.standard_normal(shape[1]).astype(dtype), device=dev)
    def close(kernel: Any, composed: Any) -> None:
        # both round differently (the kernel sums blocks in float64, the composition pairwise in the dtype) and
        # centred values cancel (dx of two samples is ~ eps / (var + eps)): compared to each output's largest entry
        ref = composed.numpy()
        scale = max(float(np.abs(ref).max()), 1.0)
        np.testing.assert_allclose(kernel.numpy(), ref, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] * scale)

    for kernel, composed in zip(T.batch_norm_train(x, w, b, eps=1e-4),
                                T.batch_norm_train.composition(x, w, b, eps=1e-4)):
        close(kernel, composed)
    _, mean, invstd, _ = T.batch_norm_train(x, None, None, eps=1e-4)
    dy = ember.tensor(rng.standard_normal(shape).astype(dtype), device=dev)
    for weight in (w, None):
        for kernel, composed in zip(T.batch_norm_train_backward(x, weight, mean, invstd, dy),
                                    T.batch_norm_train_backward.composition(x, weight, mean, invstd, dy)):
            close(kernel, composed)


def test_batch_norm_paths_and_errors(calls: dict[str, int]) -> None:
    dev = "flex+autodiff"
    with pytest.raises(ValueRangeError, match="more than 1 value per channel"):
        F.batch_norm(ember.randn(1, 3, device=dev), None, None, training=True)
    with pytest.raises(ShapeError, match="at least 2 dims"):
        F.batch_norm(ember.randn(3, device=dev), None, None, training=True)
    with pytest.raises(ValueRangeError, match="batch_norm_train.*more than 1 value"):
        T.batch_norm_train(ember.randn(1, 3, 1, device=dev), None, None)
    # eval mode, empty input and float16 keep the unfused path
    F.batch_norm(ember.randn(4, 3, device=dev), ember.zeros(3, device=dev), ember.ones(3, device=dev))
    F.batch_norm(ember.randn(0, 3, device=dev), None, None, training=True)
    F.batch_norm(ember.randn(4, 3, device=dev, dtype=ember.float16), None, None, training=True)
    assert calls["bn"] == 0


# -- Adam / AdamW --------------------------------------------------------------------------------------------------
ADAM_CONFIGS = {
    "adam": {}, "l2": {"weight_decay": 0.1}, "adamw": {"adamw": True}, "amsgrad": {"amsgrad": True},
    "maximize-l2": {"maximize": True, "weight_decay": 0.05}, "beta1-high": {"betas": (0.3, 0.0)},
    "adamw-amsgrad-maximize": {"adamw": True, "amsgrad": True, "maximize": True, "lr": 0.1, "eps": 1e-6},
}
ADAM_SHAPES = [(), (7,), (5, 3), (2, 3, 4)]


def _adam_run(dev: str, cfg: dict[str, Any], dtype: str, shape: tuple[int, ...], steps: int = 4,
              framework: Any = ember) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    cfg = dict(cfg)
    cls = framework.optim.AdamW if cfg.pop("adamw", False) else framework.optim.Adam
    rng = np.random.default_rng(7)
    kw = {"device": dev} if framework is ember else {}
    p = framework.tensor(rng.standard_normal(shape).astype(dtype), requires_grad=True, **kw)
    opt = cls([p], **cfg)
    for _ in range(steps):
        p.grad = framework.tensor(rng.standard_normal(shape).astype(dtype), **kw)
        opt.step()
    state = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in opt.state[p].items()}
    return p.detach().numpy().copy(), state


@pytest.mark.parametrize("dev", ["flex+autodiff", "flex+fusion(False)+autodiff", "flex"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_bit_identical_to_unfused_path(calls: dict[str, int], dev: str, dtype: str, config: str) -> None:
    cfg = ADAM_CONFIGS[config]
    for shape in ADAM_SHAPES:
        fused_p, fused_state = _adam_run(dev, cfg, dtype, shape)
        kernel = T.adam_step.kernels.pop("flex")
        dispatch.clear_cache()
        try:
            plain_p, plain_state = _adam_run(dev, cfg, dtype, shape)
        finally:
            T.adam_step.kernel("flex")(kernel)
        assert fused_p.tobytes() == plain_p.tobytes(), (shape, np.abs(fused_p - plain_p).max())
        assert fused_state.keys() == plain_state.keys()
        for k in fused_state:
            assert fused_state[k].tobytes() == plain_state[k].tobytes(), (shape, k)
    assert calls["adam"] == 4 * len(ADAM_SHAPES)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_vs_torch(calls: dict[str, int], dtype: str, config: str) -> None:
    cfg = ADAM_CONFIGS[config]
    ep, es = _adam_run("flex+autodiff", cfg, dtype, (6, 5))
    tp, ts = _adam_run("", cfg, dtype, (6, 5), framework=torch)
    _close(ep, tp, dtype)
    for k in ts:
        _close(es[k], ts[k], dtype)
    assert calls["adam"] == 4


def test_adam_keeps_identity_views_and_version_checks(calls: dict[str, int]) -> None:
    """The update is in place: the parameter and its state keep their tensors (and views of them see the new
    values), and a graph that saved the parameter before the step refuses to run backward, as torch."""
    dev = "flex+autodiff"
    p = ember.randn(4, 3, device=dev, requires_grad=True)
    view = p.detach()[1]
    opt = ember.optim.Adam([p], lr=0.5)
    p.grad = ember.ones(4, 3, device=dev)
    opt.step()
    m = opt.state[p]["exp_avg"]
    p.grad = ember.ones(4, 3, device=dev)
    opt.step()
    assert opt.state[p]["exp_avg"] is m
    np.testing.assert_array_equal(view.numpy(), p.detach().numpy()[1])
    loss = (p * p).sum()
    p.grad = ember.ones(4, 3, device=dev)
    opt.step()
    with pytest.raises(ember.errors.AutodiffError, match="modified by an in-place operation"):
        loss.backward()
    assert calls["adam"] == 3


def test_adam_other_dtypes_keep_the_unfused_path(calls: dict[str, int]) -> None:
    p = ember.randn(3, device="flex+autodiff", dtype=ember.bfloat16, requires_grad=True)
    opt = ember.optim.Adam([p])
    p.grad = ember.ones(3, device="flex+autodiff", dtype=ember.bfloat16)
    opt.step()
    assert calls["adam"] == 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
def test_adam_kernel_other_dtypes_compute_in_float32(dtype: str, amsgrad: bool) -> None:
    """Called directly with a half dtype, the kernel computes in float32 and rounds once (the composition rounds
    after every op): within the dtype's precision of each other; both update their arguments in place."""
    rng = np.random.default_rng(8)
    d = getattr(ember, dtype)
    arrays = [rng.standard_normal((5, 4)).astype(np.float32) for _ in range(3)]
    arrays += [rng.uniform(0, 1, (5, 4)).astype(np.float32)] * 2
    kw = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "step": 3.0, "amsgrad": amsgrad}
    results = []
    for fn in (T.adam_step, T.adam_step.composition):
        ts = [ember.tensor(a, device="flex").to(d) for a in arrays]
        p, g, m, v, mx = ts
        out = fn(p, g, m, v, mx if amsgrad else None, **kw)
        assert len(out) == (4 if amsgrad else 3)
        for new, old in zip(out, (p, m, v, mx)):
            assert new.dtype is d
            np.testing.assert_array_equal(new.to(ember.float32).numpy(), old.to(ember.float32).numpy())
        results.append([t.to(ember.float32).numpy() for t in out])
    for kernel, composed in zip(*results):
        np.testing.assert_allclose(kernel, composed, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_adam_kernel_in_place_on_strided_parameters(calls: dict[str, int], shape: tuple[int, ...]) -> None:
    """A parameter that is a strided view (a slice of a larger tensor) is updated where it lives."""
    dev = "flex+autodiff"
    rng = np.random.default_rng(9)
    base = rng.standard_normal((shape[0], 2 * shape[-1]) if len(shape) == 2 else (2 * shape[0],) + shape[1:])
    base = base.astype(np.float32)
    eb = ember.tensor(base, device=dev)
    ep = (eb[:, ::2] if len(shape) == 2 else eb[::2]).detach().requires_grad_()
    tb = torch.tensor(base)
    tp = (tb[:, ::2] if len(shape) == 2 else tb[::2]).detach().requires_grad_()
    eo, to = ember.optim.Adam([ep], lr=0.1, amsgrad=True), torch.optim.Adam([tp], lr=0.1, amsgrad=True)
    for _ in range(3):
        g = rng.standard_normal(tuple(tp.shape)).astype(np.float32)
        ep.grad, tp.grad = ember.tensor(g, device=dev), torch.tensor(g)
        eo.step()
        to.step()
    _close(ep, tp, "float32")
    assert calls["adam"] == 3
