"""flex's kernels of core's one-op GELU and layer norm (ember.ops.train_kernels: nn.gelu, nn.layer_norm and their
backward ops, ember_flex.norm_kernels): values and gradients against torch (float32/float64, both GELU forms,
odd and strided shapes, with and without affine parameters), the float32 erf approximation's error against float64,
agreement with the ops' compositions, identical results on one and two threads, and the paths that keep the
composition. Tests through nn.functional check that the kernels really ran."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember.errors import ShapeError, ValueRangeError
from ember.ops import train_kernels as T

torch = pytest.importorskip("torch")
TF = torch.nn.functional

DEVICES = ["flex", "flex+autodiff", "flex+fusion(False)+autodiff"]
OPS = {"gelu": T.gelu, "gelu_bwd": T.gelu_backward, "ln": T.layer_norm, "ln_bwd": T.layer_norm_backward}
# torch.testing's float32 defaults; float64 tighter than torch's own (the float64 kernels use scipy's erfc)
TOL = {"float32": {"rtol": 1.3e-6, "atol": 1e-5}, "float64": {"rtol": 1e-10, "atol": 1e-12}}


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


def _np(t: Any) -> np.ndarray:
    return t.detach().numpy() if hasattr(t, "detach") else np.asarray(t)


def _close(e: Any, t: Any, dtype: str, **tol: float) -> None:
    np.testing.assert_allclose(_np(e), _np(t), **{**TOL[dtype], **tol})


# -- GELU ----------------------------------------------------------------------------------------------------------
GELU_SHAPES = [(), (7,), (3, 5), (2, 3, 70001)]  # the last spans several blocks, with a partial one


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", GELU_SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
def test_gelu_vs_torch(calls: dict[str, int], dev: str, dtype: str, approximate: str,
                       shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    grad = "autodiff" in dev
    ex = ember.tensor(x, device=dev, requires_grad=grad)
    tx = torch.tensor(x, requires_grad=True)
    ey, ty = F.gelu(ex, approximate=approximate), TF.gelu(tx, approximate=approximate)
    _close(ey, ty, dtype)
    assert calls["gelu"] == 1
    if grad:
        g = rng.standard_normal(shape).astype(dtype)
        ey.backward(ember.tensor(g, device=dev))
        ty.backward(torch.tensor(g))
        _close(ex.grad, tx.grad, dtype)
        assert calls["gelu_bwd"] == 1


def test_gelu_float32_error_against_float64() -> None:
    """The float32 exact GELU (erf as ``tanh(x h(x**2))``) stays within 1e-6 of float64 GELU everywhere, tails included,
    and its derivative within 2e-6; inf, -inf and NaN give what the erf formula gives: inf, NaN, NaN (torch's
    float64 GELU and ember's composition; torch's float32 GELU gives NaN at inf)."""
    import scipy.special as sp

    from ember_flex import norm_kernels as K

    x = np.concatenate([np.linspace(-12, 12, 200001), np.random.default_rng(1).standard_normal(100000) * 3])
    x32 = x.astype(np.float32)
    x64 = x32.astype(np.float64)
    cdf = 0.5 * sp.erfc(-x64 / np.sqrt(2))
    np.testing.assert_allclose(K.gelu(None, x32), x64 * cdf, rtol=0, atol=1e-6)
    d = cdf + x64 * np.exp(-0.5 * x64 * x64) / np.sqrt(2 * np.pi)
    np.testing.assert_allclose(K.gelu_backward(None, x32, np.ones_like(x32)), d, rtol=0, atol=2e-6)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    out = K.gelu(None, special)
    ref = TF.gelu(torch.tensor(special, dtype=torch.float64)).numpy().astype(np.float32)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(out[~np.isnan(out)], ref[~np.isnan(ref)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernels_match_compositions(dtype: str, approximate: str) -> None:
    rng = np.random.default_rng(2)
    x = ember.tensor((rng.standard_normal((9, 31)) * 4).astype(dtype), device="flex")
    g = ember.tensor(rng.standard_normal((9, 31)).astype(dtype), device="flex")
    _close(T.gelu(x, approximate=approximate), T.gelu.composition(x, approximate=approximate), dtype)
    _close(T.gelu_backward(x, g, approximate=approximate),
           T.gelu_backward.composition(x, g, approximate=approximate), dtype)


def test_gelu_strided_input_and_in_place_on_output(calls: dict[str, int]) -> None:
    """A transposed input gives torch's result; the op's vjp reads only x, so the output may change in place."""
    dev = "flex+autodiff"
    x = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
    ex = ember.tensor(x, device=dev, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)

    def run(fw: Any, xx: Any, functional: Any) -> Any:
        y = functional.gelu(xx.t())
        y += 1.0
        (y * y).sum().backward()
        return y

    _close(run(ember, ex, F), run(torch, tx, TF), "float32")
    _close(ex.grad, tx.grad, "float32")
    assert calls["gelu"] == 1 and calls["gelu_bwd"] == 1


def test_gelu_paths_and_errors(calls: dict[str, int]) -> None:
    # half dtypes keep the composition; an empty input runs the kernel and gives an empty result
    F.gelu(ember.randn(5, dtype=ember.float16))
    assert calls["gelu"] == 0
    assert F.gelu(ember.randn(0, 3)).shape == (0, 3)
    with pytest.raises(ValueRangeError, match="gelu: approximate must be"):
        T.gelu(ember.randn(3), approximate="erf")
    with pytest.raises(ShapeError, match="gelu_backward: expected grad of shape"):
        T.gelu_backward(ember.randn(3), ember.randn(4))


# -- layer norm ----------------------------------------------------------------------------------------------------
LN_CASES = [((7,), (7,)), ((4, 5, 33), (33,)), ((3, 4, 6, 5), (6, 5)), ((2500, 40), (40,)), ((3, 70000), (70000,))]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", LN_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + str(len(c[1])))
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_vs_torch(calls: dict[str, int], dev: str, dtype: str, case: Any, affine: str) -> None:
    shape, ns = case
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)
    w = rng.uniform(0.5, 2, ns).astype(dtype) if affine != "none" else None
    b = rng.standard_normal(ns).astype(dtype) if affine == "both" else None
    grad = "autodiff" in dev
    ex = ember.tensor(x, device=dev, requires_grad=grad)
    ew = None if w is None else ember.tensor(w, device=dev, requires_grad=grad)
    eb = None if b is None else ember.tensor(b, device=dev, requires_grad=grad)
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    ey, ty = F.layer_norm(ex, ns, ew, eb, eps=1e-5), TF.layer_norm(tx, ns, tw, tb, eps=1e-5)
    _close(ey, ty, dtype)
    assert calls["ln"] == 1
    if grad:
        g = rng.standard_normal(shape).astype(dtype)
        ey.backward(ember.tensor(g, device=dev))
        ty.backward(torch.tensor(g))
        _close(ex.grad, tx.grad, dtype)
        rows = x.size // int(np.prod(ns))
        # dweight and dbias are sums over the rows: both frameworks round them in float32 (here per block, then
        # in float64), so their distance grows with the row count
        tol = {"rtol": 1e-5, "atol": 2e-6 * rows} if dtype == "float32" else {}
        for e, t in ((ew, tw), (eb, tb)):
            if e is not None:
                _close(e.grad, t.grad, dtype, **tol)
        assert calls["ln_bwd"] == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_kernels_match_compositions(dtype: str) -> None:
    rng = np.random.default_rng(5)
    shape, ns = (5, 6, 24), (6, 24)
    x = ember.tensor((rng.standard_normal(shape) + 4).astype(dtype), device="flex")
    w = ember.tensor(rng.uniform(0.5, 2, ns).astype(dtype), device="flex")
    b = ember.tensor(rng.standard_normal(ns).astype(dtype), device="flex")
    kw = {"normalized_shape": ns}
    outs = T.layer_norm(x, w, b, eps=1e-4, **kw)
    for kernel, composed in zip(outs, T.layer_norm.composition(x, w, b, eps=1e-4, **kw)):
        assert kernel.shape == composed.shape
        _close(kernel, composed, dtype)
    _, mean, rstd = outs
    dy = ember.tensor(rng.standard_normal(shape).astype(dtype), device="flex")
    for weight in (w, None):
        for kernel, composed in zip(T.layer_norm_backward(x, weight, mean, rstd, dy, **kw),
                                    T.layer_norm_backward.composition(x, weight, mean, rstd, dy, **kw)):
            assert kernel.shape == composed.shape
            _close(kernel, composed, dtype, atol=1e-5 if dtype == "float32" else 1e-12)


def test_layer_norm_in_place_on_output_and_paths(calls: dict[str, int]) -> None:
    """The vjp reads mean and rstd only (y may change in place, as torch's pre-norm residual adds); float16 with
    float32 parameters (mixed) and empty inputs keep the composition."""
    dev = "flex+autodiff"
    x = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    ex, tx = ember.tensor(x, device=dev, requires_grad=True), torch.tensor(x, requires_grad=True)
    ey, ty = F.layer_norm(ex, (8,)), TF.layer_norm(tx, (8,))
    ey += ember.tensor(x, device=dev)
    ty += torch.tensor(x)
    (ey * ey).sum().backward()
    (ty * ty).sum().backward()
    _close(ex.grad, tx.grad, "float32")
    assert calls["ln"] == 1 and calls["ln_bwd"] == 1
    F.layer_norm(ember.randn(3, 8, dtype=ember.float16), (8,), ember.ones(8), ember.zeros(8))
    F.layer_norm(ember.randn(0, 8), (8,))
    assert calls["ln"] == 1
    with pytest.raises(ShapeError, match="layer_norm: normalized_shape"):
        T.layer_norm(ember.randn(3, 8), None, None, normalized_shape=(4,))
    with pytest.raises(ShapeError, match="layer_norm: expected weight of shape"):
        T.layer_norm(ember.randn(3, 8), ember.ones(4), None, normalized_shape=(8,))


# -- threads -------------------------------------------------------------------------------------------------------
def test_results_do_not_depend_on_the_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large inputs cut into ranges on flex's pool give bit-identical results to one thread."""
    from ember_flex import norm_kernels as K
    from ember_flex import threads

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((300, 1000)) * 3).astype(np.float32)
    g = rng.standard_normal((300, 1000)).astype(np.float32)
    w = rng.uniform(0.5, 2, 1000).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)

    def run() -> list[np.ndarray]:
        y, mean, rstd = K.layer_norm(None, x, w, b, normalized_shape=(1000,))
        return [K.gelu(None, x), K.gelu_backward(None, x, g), K.gelu(None, x, approximate="tanh"), y, mean, rstd,
                *K.layer_norm_backward(None, x, w, mean, rstd, g, normalized_shape=(1000,))]

    before = threads.get_num_threads()
    try:
        ember.set_num_threads(1)
        serial = run()
        ember.set_num_threads(2)
        monkeypatch.setattr(threads, "min_elems", 1 << 10)
        assert len(K._ranges(x.size, K.BLOCK, x.size)) > 1  # elementwise: ranges of whole blocks
        assert len(K._ranges(300, K._row_block(1000), x.size)) > 1  # rows
        parallel = run()
    finally:
        ember.set_num_threads(before)
    for s, p in zip(serial, parallel):
        np.testing.assert_array_equal(s, p)
