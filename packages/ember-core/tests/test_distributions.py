"""ember.bernoulli, ember.normal (PyTorch's four overloads), ember.poisson and ember.multinomial (with the Tensor
methods bernoulli and multinomial): statistics over fixed seeds with generous tolerances, output shapes and dtypes
against torch, torch's error conditions (torch is the oracle for which calls it refuses), and PyTorch's zero
gradients to the distribution parameters."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember

torch = pytest.importorskip("torch")

DEVICES = ["flex", "flex+autodiff", "flex+fusion(False)", "toy"]
N = 100_000


def _device(name: str) -> ember.Device:
    try:
        return ember.Device.parse(name)
    except (ember.PluginError, ember.DeviceError) as e:  # toy is the example backend of the repository's tests
        pytest.skip(f"device {name} is not installed here: {e}")


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> ember.Device:
    return _device(request.param)


def _np(t: ember.Tensor) -> np.ndarray:
    return np.asarray(t.detach().to("float64").numpy(), dtype=np.float64)


def _gen(dev: ember.Device, seed: int = 0) -> ember.Generator:
    return ember.Generator(dev).manual_seed(seed)


def _moments(x: np.ndarray, mean: float, var: float, axis: int | None = None) -> None:
    """Sample mean within 5 standard errors, sample variance within 5% or 5 of its (normal-theory) standard
    errors, whichever is wider."""
    n = x.size if axis is None else x.shape[axis]
    m, v = x.mean(axis=axis), x.var(axis=axis)
    assert np.all(np.abs(m - mean) < 5 * np.sqrt(np.asarray(var) / n)), m
    assert np.all(np.abs(v - var) <= max(0.05, 5 * math.sqrt(2 / n)) * np.asarray(var)), v


def _chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> None:
    """Pearson's chi-square below the 0.9999 quantile (Wilson-Hilferty), so a fixed seed passes with margin and a
    wrong distribution (a 1% shift over 1e5 draws) fails."""
    keep = probs > 0
    exp = probs[keep] * counts.sum()
    chi2 = float((((counts[keep] - exp) ** 2) / exp).sum())
    k = int(keep.sum()) - 1
    z = 3.72  # the 0.9999 normal quantile
    bound = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    assert chi2 < bound, (chi2, bound, counts)


# -- bernoulli ------------------------------------------------------------------------------------------------------
def test_bernoulli_statistics(dev: ember.Device) -> None:
    p = ember.tensor([0.0, 0.1, 0.5, 0.9, 1.0], device=dev).expand(N // 5, 5).contiguous()
    x = _np(ember.bernoulli(p, generator=_gen(dev)))
    assert set(np.unique(x)) <= {0.0, 1.0}
    assert x[:, 0].sum() == 0 and x[:, 4].sum() == N // 5  # p 0 and 1 are exact
    _moments(x[:, 1:4], np.array([0.1, 0.5, 0.9]), np.array([0.09, 0.25, 0.09]), axis=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_bernoulli_keeps_the_dtype(dtype: str) -> None:
    x = ember.full((1000,), 0.25, dtype=dtype)
    y = ember.bernoulli(x, generator=_gen(x.device))
    assert y.dtype is x.dtype and y.shape == x.shape
    assert torch.bernoulli(torch.full((3,), 0.25, dtype=getattr(torch, dtype))).dtype == getattr(torch, dtype)
    assert 0.18 < _np(y).mean() < 0.32


@pytest.mark.parametrize("dtype", ["int64", "bool", "float32", "uint8"])
def test_bernoulli_with_p_takes_any_dtype(dtype: str) -> None:
    x = ember.zeros(N, dtype=dtype)
    y = ember.bernoulli(x, 0.3, generator=_gen(x.device))
    assert y.dtype is x.dtype
    assert torch.bernoulli(torch.zeros(3, dtype=getattr(torch, dtype)), 0.3).dtype == getattr(torch, dtype)
    _moments(_np(y), 0.3, 0.21)
    z = x.bernoulli(p=0.3, generator=_gen(x.device))  # the Tensor method
    assert np.array_equal(_np(z), _np(y))


def test_bernoulli_method_is_the_function() -> None:
    p = ember.full((10,), 0.5)
    assert np.array_equal(_np(p.bernoulli(generator=_gen(p.device, 4))),
                          _np(ember.bernoulli(p, generator=_gen(p.device, 4))))


BERNOULLI_ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception]]] = [
    ("above_one", lambda m: m.bernoulli(m.tensor([0.5, 1.5])), ember.ValueRangeError),
    ("negative", lambda m: m.bernoulli(m.tensor([-0.1])), ember.ValueRangeError),
    ("nan", lambda m: m.bernoulli(m.tensor([float("nan")])), ember.ValueRangeError),
    ("int_input", lambda m: m.bernoulli(m.tensor([1, 0])), ember.DTypeError),
    ("p_above_one", lambda m: m.bernoulli(m.tensor([0.5]), 1.5), ember.ValueRangeError),
    ("p_negative", lambda m: m.bernoulli(m.tensor([0.5]), -0.5), ember.ValueRangeError),
]


@pytest.mark.parametrize("case", BERNOULLI_ERRORS, ids=[c[0] for c in BERNOULLI_ERRORS])
def test_bernoulli_errors_match_torch(case: tuple[str, Callable[[Any], Any], type[Exception]]) -> None:
    _, call, err = case
    with pytest.raises((RuntimeError, NotImplementedError)):
        call(torch)
    with pytest.raises(err, match="bernoulli"):
        call(ember)


def test_bernoulli_refuses_a_non_tensor() -> None:
    with pytest.raises(ember.DTypeError, match="bernoulli: input must be a Tensor, got list"):
        ember.bernoulli([0.5])


# -- normal ---------------------------------------------------------------------------------------------------------
def test_normal_float_float_size(dev: ember.Device) -> None:
    x = ember.normal(2.0, 3.0, (N,), generator=_gen(dev), device=dev)
    assert x.shape == (N,) and x.dtype is ember.float32 and x.device is dev
    _moments(_np(x), 2.0, 9.0)
    y = ember.normal(0.0, 1.0, size=(2, 3), dtype="float64", device=dev, requires_grad=dev.stack.differentiable)
    ty = torch.normal(0.0, 1.0, size=(2, 3), dtype=torch.float64)
    assert y.shape == tuple(ty.shape) and y.dtype is ember.float64
    assert y.requires_grad is dev.stack.differentiable and y.is_leaf


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_normal_float_float_half_precision(dtype: str) -> None:
    x = ember.normal(-3.0, 0.5, (N,), generator=ember.Generator().manual_seed(2), dtype=dtype)
    assert x.dtype.name == dtype == str(torch.normal(0.0, 1.0, (2,), dtype=getattr(torch, dtype)).dtype)[6:]
    _moments(_np(x), -3.0, 0.25)
    with pytest.raises(ember.DTypeError, match="normal: expected a floating dtype"):
        ember.normal(0.0, 1.0, (2,), dtype="int64")


def test_normal_tensor_tensor_broadcasts(dev: ember.Device) -> None:
    mean = ember.tensor([[-5.0], [0.0], [5.0]], device=dev)  # (3, 1)
    std = ember.tensor([0.5, 1.0, 2.0, 4.0], device=dev)  # (4,)
    assert tuple(torch.normal(torch.zeros(3, 1), torch.ones(4)).shape) == (3, 4)
    x = ember.normal(mean.expand(3, 1).contiguous(), std, generator=_gen(dev))
    assert x.shape == (3, 4)
    g = _gen(dev, 1)
    many = np.stack([_np(ember.normal(mean, std, generator=g)) for _ in range(2000)])
    _moments(many.reshape(2000, 12), np.repeat([-5.0, 0.0, 5.0], 4), np.tile([0.25, 1.0, 4.0, 16.0], 3), axis=0)


def test_normal_tensor_float_and_float_tensor(dev: ember.Device) -> None:
    mean = ember.full((N,), -1.0, device=dev)
    _moments(_np(ember.normal(mean, 2.0, generator=_gen(dev))), -1.0, 4.0)
    _moments(_np(ember.normal(mean, generator=_gen(dev))), -1.0, 1.0)  # std defaults to 1
    std = ember.full((N,), 0.5, device=dev)
    _moments(_np(ember.normal(3.0, std, generator=_gen(dev))), 3.0, 0.25)
    zero = _np(ember.normal(ember.arange(5, dtype="float32", device=dev), 0.0, generator=_gen(dev)))
    assert np.array_equal(zero, np.arange(5.0))  # std 0 gives mean exactly


@pytest.mark.parametrize("md,sd", [("float32", "float64"), ("float64", "float32"), ("float16", None),
                                   (None, "bfloat16"), ("float64", None)])
def test_normal_dtype_is_torchs(md: str | None, sd: str | None) -> None:
    def args(m: Any) -> tuple[Any, Any]:
        mean = m.zeros(4, dtype=getattr(m, md)) if md else 0.0
        std = m.ones(4, dtype=getattr(m, sd)) if sd else 1.0
        return mean, std

    expected = torch.normal(*args(torch)).dtype
    got = ember.normal(*args(ember), generator=ember.Generator())
    assert got.dtype.name == str(expected).removeprefix("torch.")


def test_normal_gives_zero_gradients_like_torch() -> None:
    ad = _device("flex+autodiff")
    m = ember.tensor([0.2, 0.8], device=ad, requires_grad=True)
    s = ember.tensor([1.0, 2.0], device=ad, requires_grad=True)
    for out in (ember.normal(m, s), ember.normal(m, 1.0), ember.normal(1.0, s)):
        assert out.requires_grad
        out.sum().backward()
    tm = torch.tensor([0.2, 0.8], requires_grad=True)
    torch.normal(tm, 1.0).sum().backward()
    assert np.array_equal(_np(m.grad), tm.grad.numpy()) and np.array_equal(_np(s.grad), np.zeros(2))
    with ember.no_grad():
        assert not ember.normal(m, s).requires_grad


NORMAL_ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    ("negative_float_std", lambda m: m.normal(m.zeros(2), -1.0), ember.ValueRangeError, "std >= 0.0"),
    ("negative_tensor_std", lambda m: m.normal(m.zeros(2), m.tensor([-1.0, 1.0])), ember.ValueRangeError,
     "all elements of std >= 0.0"),
    ("nan_tensor_std", lambda m: m.normal(1.0, m.tensor([float("nan")])), ember.ValueRangeError, "std >= 0.0"),
    ("negative_std_size", lambda m: m.normal(1.0, -2.0, (2,)), ember.ValueRangeError, "found std -2"),
    ("nan_std_size", lambda m: m.normal(1.0, float("nan"), (2,)), ember.ValueRangeError, "found std nan"),
    ("no_size", lambda m: m.normal(1.0, 2.0), ember.DTypeError, "give size"),
    ("shapes", lambda m: m.normal(m.zeros(2, 2), m.ones(3)), ember.ShapeError, "normal"),
    ("int_mean", lambda m: m.normal(m.zeros(2, dtype=m.int64), 1.0), ember.DTypeError, "int64"),
    ("size_with_tensor", lambda m: m.normal(m.zeros(2), 1.0, (2,)), ember.DTypeError, "size"),
]


@pytest.mark.parametrize("case", NORMAL_ERRORS, ids=[c[0] for c in NORMAL_ERRORS])
def test_normal_errors_match_torch(case: tuple[str, Callable[[Any], Any], type[Exception], str]) -> None:
    _, call, err, msg = case
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)):
        call(torch)
    with pytest.raises(err, match=msg):
        call(ember)


def test_normal_tensors_on_two_devices() -> None:
    with pytest.raises(ember.DeviceError, match="normal: mean is on flex but std is on toy"):
        ember.normal(ember.zeros(2, device=_device("flex")), ember.ones(2, device=_device("toy")))


# -- poisson --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.5, 4.0, 100.0])
def test_poisson_statistics(dev: ember.Device, rate: float) -> None:
    x = _np(ember.poisson(ember.full((N,), rate, device=dev), generator=_gen(dev)))
    assert np.array_equal(x, np.round(x)) and x.min() >= 0
    _moments(x, rate, rate)


def test_poisson_details() -> None:
    x = ember.poisson(ember.tensor([0.0, 0.0, 1e20, float("inf")], dtype="float64"), generator=ember.Generator())
    v = _np(x)
    assert x.dtype is ember.float64 and v[0] == v[1] == 0 and abs(v[2] / 1e20 - 1) < 1e-6 and v[3] == math.inf
    for dtype in ("float16", "bfloat16", "float32"):
        assert ember.poisson(ember.ones(3, dtype=dtype)).dtype.name == dtype
    assert ember.poisson(ember.zeros(0, 3)).shape == (0, 3)
    g1, g2 = ember.Generator().manual_seed(3), ember.Generator().manual_seed(3)
    r = ember.full((50,), 7.0)
    assert np.array_equal(_np(ember.poisson(r, g1)), _np(ember.poisson(r, generator=g2)))
    assert not np.array_equal(_np(ember.poisson(r, g1)), _np(ember.poisson(r, generator=ember.Generator()
                                                                           .manual_seed(3))))


POISSON_ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception]]] = [
    ("negative", lambda m: m.poisson(m.tensor([1.0, -1.0])), ember.ValueRangeError),
    ("nan", lambda m: m.poisson(m.tensor([float("nan")])), ember.ValueRangeError),
    ("int", lambda m: m.poisson(m.tensor([1, 2])), ember.DTypeError),
]


@pytest.mark.parametrize("case", POISSON_ERRORS, ids=[c[0] for c in POISSON_ERRORS])
def test_poisson_errors_match_torch(case: tuple[str, Callable[[Any], Any], type[Exception]]) -> None:
    _, call, err = case
    with pytest.raises((RuntimeError, NotImplementedError)):
        call(torch)
    with pytest.raises(err, match="poisson"):
        call(ember)


def test_poisson_and_bernoulli_give_zero_gradients() -> None:
    ad = _device("flex+autodiff")
    r = ember.tensor([1.0, 3.0], device=ad, requires_grad=True)
    ember.poisson(r).sum().backward()
    assert np.array_equal(_np(r.grad), np.zeros(2))
    p = ember.tensor([0.2, 0.7], device=ad, requires_grad=True)
    b = ember.bernoulli(p)
    assert b.requires_grad
    b.sum().backward()
    tp = torch.tensor([0.2, 0.7], requires_grad=True)
    torch.bernoulli(tp).sum().backward()
    assert np.array_equal(_np(p.grad), tp.grad.numpy())


# -- multinomial ----------------------------------------------------------------------------------------------------
P4 = np.array([0.1, 0.2, 0.3, 0.4])


def test_multinomial_with_replacement_statistics(dev: ember.Device) -> None:
    w = ember.tensor((P4 * 7).tolist(), device=dev)  # unnormalised weights
    idx = ember.multinomial(w, N, replacement=True, generator=_gen(dev))
    assert idx.dtype is ember.int64 and idx.shape == (N,)
    _chi_square_ok(np.bincount(_np(idx).astype(np.int64), minlength=4), P4)


def test_multinomial_rows_are_independent_distributions(dev: ember.Device) -> None:
    w = ember.tensor([[0.0, 1.0, 1.0, 0.0], [0.7, 0.0, 0.0, 0.3]], device=dev)
    idx = _np(ember.multinomial(w, 20_000, True, generator=_gen(dev))).astype(np.int64)
    assert idx.shape == (2, 20_000)
    assert set(np.unique(idx[0])) == {1, 2} and set(np.unique(idx[1])) == {0, 3}  # zero weights never drawn
    _chi_square_ok(np.bincount(idx[1], minlength=4), np.array([0.7, 0, 0, 0.3]))


def test_multinomial_without_replacement_statistics(dev: ember.Device) -> None:
    """Two draws without replacement from 20k identical rows: each ordered pair (i, j) has probability
    p_i * p_j / (1 - p_i)."""
    rows = 20_000
    w = ember.tensor(P4.tolist(), device=dev).expand(rows, 4).contiguous()
    idx = _np(ember.multinomial(w, 2, generator=_gen(dev))).astype(np.int64)
    assert idx.shape == (rows, 2) and np.all(idx[:, 0] != idx[:, 1])
    pairs = np.bincount(idx[:, 0] * 4 + idx[:, 1], minlength=16)
    expected = np.array([P4[i] * P4[j] / (1 - P4[i]) if i != j else 0.0 for i in range(4) for j in range(4)])
    _chi_square_ok(pairs, expected)


def test_multinomial_without_replacement_is_a_permutation_at_full_size() -> None:
    w = ember.tensor([[1.0, 2.0, 3.0, 0.0, 5.0]] * 50)
    idx = _np(ember.multinomial(w, 5, generator=ember.Generator())).astype(np.int64)
    assert all(sorted(r) == [0, 1, 2, 3, 4] for r in idx.tolist())
    assert np.all(idx[:, 4] == 3)  # the zero-weight category comes last, once the others are used up


@pytest.mark.parametrize("shape,n,replacement", [((5,), 3, False), ((2, 5), 7, True), ((0, 3), 1, False),
                                                 ((1, 1), 4, True), ((3,), 3, False)])
def test_multinomial_shapes_match_torch(shape: tuple[int, ...], n: int, replacement: bool) -> None:
    t = torch.multinomial(torch.ones(shape), n, replacement)
    e = ember.ones(shape).multinomial(n, replacement, generator=ember.Generator())  # the Tensor method
    assert e.shape == tuple(t.shape) and e.dtype is ember.int64 and str(t.dtype) == "torch.int64"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_multinomial_input_dtypes(dtype: str) -> None:
    idx = _np(ember.multinomial(ember.tensor([0.0, 1.0, 3.0], dtype=dtype), 2000, True, generator=ember.Generator()))
    assert set(np.unique(idx)) == {1, 2} and 0.65 < (idx == 2).mean() < 0.85


def test_multinomial_does_not_track_gradients() -> None:
    ad = _device("flex+autodiff")
    w = ember.tensor([0.5, 0.5], device=ad, requires_grad=True)
    out = ember.multinomial(w, 1)
    assert not out.requires_grad and out.dtype is ember.int64


MULTINOMIAL_ERRORS: list[tuple[str, Callable[[Any], Any], type[Exception], str]] = [
    ("too_many", lambda m: m.multinomial(m.tensor([0.1, 0.2, 0.7]), 4), ember.ValueRangeError,
     "n_sample > prob_dist.size"),
    ("zero_samples", lambda m: m.multinomial(m.tensor([0.1, 0.9]), 0), ember.ValueRangeError, "n_sample <= 0"),
    ("negative_samples", lambda m: m.multinomial(m.tensor([0.1, 0.9]), -1), ember.ValueRangeError, "n_sample <= 0"),
    ("negative", lambda m: m.multinomial(m.tensor([-0.5, 1.0, 0.0]), 1), ember.ValueRangeError, "element < 0"),
    ("inf", lambda m: m.multinomial(m.tensor([float("inf"), 1.0]), 1), ember.ValueRangeError, "inf, nan"),
    ("nan", lambda m: m.multinomial(m.tensor([float("nan"), 1.0]), 1, True), ember.ValueRangeError, "inf, nan"),
    ("zero_sum", lambda m: m.multinomial(m.tensor([0.0, 0.0]), 1, True), ember.ValueRangeError,
     "sum of probabilities <= 0"),
    ("zero_sum_row", lambda m: m.multinomial(m.tensor([[0.0, 0.0], [1.0, 1.0]]), 1), ember.ValueRangeError,
     "sum of probabilities <= 0"),
    ("three_dims", lambda m: m.multinomial(m.ones(2, 2, 2), 1), ember.ShapeError, "1 or 2 dim"),
    ("zero_dims", lambda m: m.multinomial(m.tensor(1.0), 1), ember.ShapeError, "1 or 2 dim"),
    ("empty_1d", lambda m: m.multinomial(m.zeros(0), 1), ember.ValueRangeError, "n_sample > prob_dist.size"),
    ("int_input", lambda m: m.multinomial(m.tensor([1, 2]), 1), ember.DTypeError, "floating point"),
    ("float_samples", lambda m: m.multinomial(m.tensor([0.5, 0.5]), 2.0), ember.DTypeError, "num_samples"),
    ("too_many_categories", lambda m: m.multinomial(m.ones(2**24 + 1), 1), ember.ValueRangeError, "2\\^24"),
]


@pytest.mark.parametrize("case", MULTINOMIAL_ERRORS, ids=[c[0] for c in MULTINOMIAL_ERRORS])
def test_multinomial_errors_match_torch(case: tuple[str, Callable[[Any], Any], type[Exception], str]) -> None:
    _, call, err, msg = case
    with pytest.raises((RuntimeError, TypeError)):
        call(torch)
    with pytest.raises(err, match=f"multinomial: .*{msg}"):
        call(ember)


def test_multinomial_zero_weights_without_replacement_are_allowed_like_torch() -> None:
    torch.multinomial(torch.tensor([0.5, 0.0, 0.0]), 2)  # torch does not refuse it
    idx = _np(ember.multinomial(ember.tensor([0.5, 0.0, 0.0]), 2, generator=ember.Generator()))
    assert idx[0] == 0 and idx[1] in (1, 2)


def test_multinomial_large_draws_are_chunked_and_reproducible() -> None:
    w = ember.ones(3, 300)
    a = ember.multinomial(w, 6000, True, generator=ember.Generator().manual_seed(1))  # 5.4M keys: several chunks
    b = ember.multinomial(w, 6000, True, generator=ember.Generator().manual_seed(1))
    assert a.shape == (3, 6000) and np.array_equal(_np(a), _np(b))
    counts = np.bincount(_np(a).astype(np.int64).ravel(), minlength=300)
    _chi_square_ok(counts, np.full(300, 1 / 300))
