"""In-place random fills (``ember.ops.random``): each distribution checked statistically over 100k samples on
several stacks, PyTorch's dtype refusals and argument errors (torch is the oracle for which calls it refuses), the
autograd rules of an in-place op, seeded reproducibility; and nn.init / nn.layers reaching the device only
through ember ops."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ember
from ember.ops import random as rnd

torch = pytest.importorskip("torch")

DEVICES = ["flex", "flex+autodiff", "flex+fusion(False)", "toy"]
N = 100_000
SRC = Path(ember.__file__).parent


def _device(name: str) -> ember.Device:
    try:
        return ember.Device.parse(name)
    except (ember.PluginError, ember.DeviceError) as e:  # toy is the example backend of the repository's tests
        pytest.skip(f"device {name} is not installed here: {e}")


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> ember.Device:
    return _device(request.param)


def _vals(t: ember.Tensor) -> np.ndarray:
    return np.asarray(t.detach().to("float64").numpy(), dtype=np.float64)


def _moments(x: np.ndarray, mean: float, var: float) -> None:
    """Sample mean within 5 standard errors, sample variance within 4% (100k samples: ~1% standard error for the
    distributions used here)."""
    assert abs(x.mean() - mean) < 5 * math.sqrt(var / x.size), (x.mean(), mean)
    assert abs(x.var() - var) < 0.04 * var, (x.var(), var)


# -- the Tensor methods exist and are the module's functions --------------------------------------------------------
def test_methods_installed_and_nothing_exported() -> None:
    assert rnd.__all__ == []
    for name, fn in rnd.TENSOR_METHODS.items():
        assert getattr(ember.Tensor, name) is fn
        assert hasattr(torch.Tensor, name), f"{name} is not a torch Tensor method"
    assert set(rnd.TENSOR_METHODS) == {"uniform_", "normal_", "bernoulli_", "exponential_", "random_",
                                       "log_normal_", "cauchy_", "geometric_"}


# -- distributions ----------------------------------------------------------------------------------------------
def test_uniform(dev: ember.Device) -> None:
    t = ember.zeros(N, device=dev)
    assert t.uniform_(-2, 3) is t
    x = _vals(t)
    assert x.min() >= -2 and x.max() < 3
    _moments(x, 0.5, 25 / 12)
    x = _vals(ember.zeros(N, device=dev).uniform_())  # defaults: [0, 1)
    assert x.min() >= 0 and x.max() < 1
    _moments(x, 0.5, 1 / 12)
    y = _vals(ember.zeros(N, device=dev).uniform_(**{"from": 4, "to": 6}))  # torch's keyword name
    assert y.min() >= 4 and y.max() < 6
    y = _vals(ember.zeros(N, device=dev).uniform_(from_=4, to=6))
    assert y.min() >= 4 and y.max() < 6


def test_normal(dev: ember.Device) -> None:
    _moments(_vals(ember.zeros(N, device=dev).normal_(1.5, 2.0)), 1.5, 4.0)
    _moments(_vals(ember.zeros(N, device=dev).normal_()), 0.0, 1.0)
    np.testing.assert_array_equal(_vals(ember.zeros(5, device=dev).normal_(3.0, 0.0)), np.full(5, 3.0))


def test_exponential(dev: ember.Device) -> None:
    x = _vals(ember.zeros(N, device=dev).exponential_(2.0))
    assert x.min() >= 0 and not np.signbit(x).any()
    _moments(x, 0.5, 0.25)


def test_log_normal(dev: ember.Device) -> None:
    x = _vals(ember.zeros(N, device=dev).log_normal_(0.5, 0.4))
    assert x.min() > 0
    _moments(np.log(x), 0.5, 0.16)


def test_cauchy(dev: ember.Device) -> None:
    x = _vals(ember.zeros(N, device=dev).cauchy_(1.0, 2.0))
    q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])  # quartiles of Cauchy(m, s) are m - s, m, m + s
    assert abs(med - 1.0) < 0.05 and abs(q1 + 1.0) < 0.06 and abs(q3 - 3.0) < 0.06


def test_bernoulli_scalar_p(dev: ember.Device) -> None:
    x = _vals(ember.zeros(N, device=dev).bernoulli_(0.3))
    assert set(np.unique(x)) <= {0.0, 1.0}
    _moments(x, 0.3, 0.21)
    assert _vals(ember.zeros(100, device=dev).bernoulli_(0.0)).sum() == 0
    assert _vals(ember.zeros(100, device=dev).bernoulli_(1)).sum() == 100
    b = ember.zeros(N, dtype="bool", device=dev).bernoulli_()  # default p = 0.5, any dtype
    assert b.dtype == ember.bool_
    _moments(_vals(b), 0.5, 0.25)


def test_bernoulli_tensor_p(dev: ember.Device) -> None:
    probs = [0.0, 0.1, 0.5, 0.9, 1.0]
    p = ember.tensor(probs, device=dev)
    x = _vals(ember.zeros(N, 5, device=dev).bernoulli_(p))  # p broadcasts over the rows; N samples per column
    assert set(np.unique(x)) <= {0.0, 1.0}
    assert x[:, 0].sum() == 0 and x[:, 4].sum() == N
    for j in (1, 2, 3):
        _moments(x[:, j], probs[j], probs[j] * (1 - probs[j]))
    same = ember.full((N,), 0.25, dtype="float64", device=dev)
    _moments(_vals(ember.zeros(N, dtype="int32", device=dev).bernoulli_(same)), 0.25, 0.1875)


def test_geometric(dev: ember.Device) -> None:
    for dtype in ("float32", "int64"):
        x = _vals(ember.zeros(N, dtype=dtype, device=dev).geometric_(0.25))
        assert x.min() >= 1 and np.array_equal(x, np.round(x))
        _moments(x, 4.0, 12.0)  # mean 1/p, variance (1-p)/p^2


def test_random_ranges(dev: ember.Device) -> None:
    x = _vals(ember.zeros(N, dtype="int64", device=dev).random_(3, 7))
    assert set(np.unique(x)) == {3, 4, 5, 6}
    _moments(x, 4.5, 1.25)
    x = _vals(ember.zeros(N, device=dev).random_(5))  # random_(to): [0, to)
    assert set(np.unique(x)) == {0, 1, 2, 3, 4}
    x = _vals(ember.zeros(N, dtype="int8", device=dev).random_())  # [0, dtype max]
    assert x.min() >= 0 and x.max() == 127 and x.min() == 0
    x = _vals(ember.zeros(N, device=dev).random_())  # float32: [0, 2**24], integer valued
    assert x.min() >= 0 and x.max() <= 2**24 and np.array_equal(x, np.round(x))
    _moments(x, 2**23, (2**24 + 1) ** 2 / 12)
    x = _vals(ember.zeros(N, dtype="int16", device=dev).random_(-5, None))  # to=None: up to the dtype max
    assert x.min() >= -5 and x.max() <= 32767 and x.max() > 30000
    b = _vals(ember.zeros(1000, dtype="bool", device=dev).random_())
    assert set(np.unique(b)) == {0, 1}


def test_half_precision_drawn_in_float32_and_rounded_once(dev: ember.Device) -> None:
    for fill, args in (("uniform_", (-2.0, 3.0)), ("normal_", (1.0, 3.0)), ("exponential_", (1.5,))):
        dev.seed(7)
        h = getattr(ember.zeros(1000, dtype="float16", device=dev), fill)(*args)
        dev.seed(7)
        f = getattr(ember.zeros(1000, dtype="float32", device=dev), fill)(*args)
        assert h.dtype == ember.float16
        np.testing.assert_array_equal(h.numpy(), f.numpy().astype(np.float16))


def test_fills_write_through_views(dev: ember.Device) -> None:
    t = ember.zeros(3, 4, device=dev)
    t[1].uniform_(5, 6)
    x = t.numpy()
    assert (x[[0, 2]] == 0).all() and (x[1] >= 5).all() and (x[1] < 6).all()
    t = ember.zeros(3, 4, device=dev)
    t.t().fill_(2.0).normal_(10.0, 0.001)
    assert np.all(np.abs(t.numpy() - 10) < 0.1)


def test_empty_tensor() -> None:
    for fill in rnd.TENSOR_METHODS:
        t = ember.zeros(0, 3)
        assert getattr(t, fill)(*((0.5,) if fill == "geometric_" else ())) is t


# -- seeding ----------------------------------------------------------------------------------------------------
_CALLS: list[tuple[str, str, tuple[Any, ...]]] = [
    ("uniform_", "float32", (-1, 1)), ("normal_", "float32", (0, 2)), ("bernoulli_", "float32", (0.4,)),
    ("exponential_", "float32", (3,)), ("random_", "int64", (0, 1000)), ("log_normal_", "float32", ()),
    ("cauchy_", "float32", ()), ("geometric_", "int32", (0.3,)),
]


@pytest.mark.parametrize("fill,dtype,args", _CALLS, ids=[c[0] for c in _CALLS])
def test_seeded_draws_repeat(dev: ember.Device, fill: str, dtype: str, args: tuple[Any, ...]) -> None:
    def draw(seed: int) -> np.ndarray:
        dev.seed(seed)
        return getattr(ember.zeros(500, dtype=dtype, device=dev), fill)(*args).numpy()

    a, b, c = draw(11), draw(11), draw(12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


# -- dtype rules against torch ----------------------------------------------------------------------------------
_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"]


def _torch_refuses(fill: str, dtype: str, args: tuple[Any, ...]) -> bool:
    try:
        getattr(torch.zeros(4, dtype=getattr(torch, dtype)), fill)(*args)
    except (RuntimeError, NotImplementedError):
        return True
    return False


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("fill,args", [
    ("uniform_", ()), ("normal_", ()), ("bernoulli_", ()), ("exponential_", ()), ("random_", (0, 2)),
    ("log_normal_", ()), ("cauchy_", ()), ("geometric_", (0.5,)),
])
def test_dtype_rules_match_torch(fill: str, args: tuple[Any, ...], dtype: str) -> None:
    t = ember.zeros(4, dtype=dtype, device="flex")
    if _torch_refuses(fill, dtype, args):
        with pytest.raises(ember.DTypeError, match=f"{fill}: .*dtype {dtype}"):
            getattr(t, fill)(*args)
    else:
        assert getattr(t, fill)(*args).dtype == ember.dtypes.as_dtype(dtype)


# -- argument errors against torch ------------------------------------------------------------------------------
_BAD: list[tuple[str, str, Callable[[Any], Any], type[Exception], str]] = [
    ("uniform from > to", "float32", lambda t: t.uniform_(3, 2), ember.ValueRangeError, r"uniform_: .*from=3 > to=2"),
    ("uniform to inf", "float32", lambda t: t.uniform_(0, math.inf), ember.ValueRangeError, "uniform_: to=inf"),
    ("uniform from nan", "float32", lambda t: t.uniform_(math.nan, 1), ember.ValueRangeError, "uniform_: from=nan"),
    ("uniform span overflows", "float32", lambda t: t.uniform_(-3e38, 3e38), ember.ValueRangeError,
     "uniform_: expects to-from"),
    ("uniform beyond half", "float16", lambda t: t.uniform_(0, 70000), ember.ValueRangeError,
     "uniform_: to=70000.* float16"),
    ("normal std < 0", "float32", lambda t: t.normal_(0, -1), ember.ValueRangeError, "normal_: expects std >= 0"),
    ("normal std nan", "float32", lambda t: t.normal_(0, math.nan), ember.ValueRangeError, "normal_: .*std nan"),
    ("bernoulli p > 1", "float32", lambda t: t.bernoulli_(1.5), ember.ValueRangeError, r"bernoulli_: .*\[0, 1\]"),
    ("bernoulli p < 0", "float32", lambda t: t.bernoulli_(-0.1), ember.ValueRangeError, "bernoulli_: .*p=-0.1"),
    ("bernoulli p nan", "float32", lambda t: t.bernoulli_(math.nan), ember.ValueRangeError, "bernoulli_"),
    ("bernoulli tensor p > 1", "float32", lambda t: t.bernoulli_(_p(t, [0.5, 1.3, 0.1, 0.2])),
     ember.ValueRangeError, "bernoulli_: expects every element of p"),
    ("bernoulli tensor p nan", "float32", lambda t: t.bernoulli_(_p(t, [0.5, math.nan, 0.1, 0.2])),
     ember.ValueRangeError, "bernoulli_: expects every element of p"),
    ("bernoulli p shape", "float32", lambda t: t.bernoulli_(_p(t, [0.5, 0.5, 0.5])), ember.ShapeError,
     r"bernoulli_: .*\(3,\)"),
    ("bernoulli p more dims", "float32", lambda t: t.bernoulli_(_p(t, [[0.5] * 4] * 2)), ember.ShapeError,
     "bernoulli_: p of shape"),
    ("bernoulli int p", "float32", lambda t: t.bernoulli_(_p(t, [1, 0, 1, 0])), ember.DTypeError,
     "bernoulli_: p must be a floating point tensor, got dtype int64"),
    ("exponential lambda 0", "float32", lambda t: t.exponential_(0), ember.ValueRangeError,
     "exponential_: expects lambda > 0"),
    ("exponential lambda nan", "float32", lambda t: t.exponential_(math.nan), ember.ValueRangeError,
     "exponential_"),
    ("log_normal std 0", "float32", lambda t: t.log_normal_(1, 0), ember.ValueRangeError,
     "log_normal_: expects std > 0"),
    ("cauchy sigma 0", "float32", lambda t: t.cauchy_(0, 0), ember.ValueRangeError, "cauchy_: expects sigma > 0"),
    ("geometric p 0", "float32", lambda t: t.geometric_(0), ember.ValueRangeError, r"geometric_: .*\(0, 1\)"),
    ("geometric p 1", "float32", lambda t: t.geometric_(1), ember.ValueRangeError, "geometric_: .*p=1"),
    ("random from == to", "float32", lambda t: t.random_(5, 5), ember.ValueRangeError,
     "random_: expects 'from' to be less than 'to', but got from=5 >= to=5"),
    ("random to < 0", "float32", lambda t: t.random_(-1), ember.ValueRangeError, "random_: .*from=0 >= to=-1"),
    ("random to beyond int8", "int8", lambda t: t.random_(200), ember.ValueRangeError,
     "random_: to - 1 = 199 is out of bounds for int8"),
    ("random from beyond int8", "int8", lambda t: t.random_(-200, 3), ember.ValueRangeError,
     "random_: from=-200 is out of bounds for int8"),
    ("random negative uint8", "uint8", lambda t: t.random_(-1, 3), ember.ValueRangeError,
     "random_: from=-1 is out of bounds for uint8"),
    ("random bool to 3", "bool", lambda t: t.random_(3), ember.ValueRangeError, "random_: to - 1 = 2 .* bool"),
    ("random beyond half", "float16", lambda t: t.random_(70000), ember.ValueRangeError,
     "random_: to - 1 = 69999 is out of bounds for float16"),
    ("random beyond int64", "int64", lambda t: t.random_(2**63), (ember.ValueRangeError, ValueError),
     "random_: to=.* does not fit int64"),
    ("random float bound", "float32", lambda t: t.random_(2.5), (ember.DTypeError, TypeError),
     "random_: to must be an int, got float"),
]


def _p(t: Any, values: list[Any]) -> Any:
    """p as a tensor of t's library (ember or torch), on t's device."""
    if isinstance(t, torch.Tensor):
        return torch.tensor(values)
    return ember.tensor(values, device=t.device)


@pytest.mark.parametrize("case", _BAD, ids=[c[0] for c in _BAD])
def test_argument_errors_match_torch(case: tuple[str, str, Callable[[Any], Any], Any, str]) -> None:
    _, dtype, call, err, match = case
    with pytest.raises((RuntimeError, NotImplementedError, TypeError, ValueError)):
        call(torch.zeros(4, dtype=getattr(torch, dtype)))
    t = ember.zeros(4, dtype=dtype, device="flex")
    before = t.numpy().copy()
    with pytest.raises(err, match=match):
        call(t)
    np.testing.assert_array_equal(t.numpy(), before)  # refused before anything was written


_EDGE: list[tuple[str, Callable[[Any], Any], float]] = [
    ("uniform from == to", lambda t: t.uniform_(2, 2), 2.0),
    ("normal std 0", lambda t: t.normal_(-1.5, 0), -1.5),
    ("exponential lambda inf", lambda t: t.exponential_(math.inf), 0.0),
    ("bernoulli True", lambda t: t.bernoulli_(True), 1.0),
    ("uniform 0-d tensor bound", lambda t: t.uniform_(_p(t, 1.0), 1), 1.0),
]


@pytest.mark.parametrize("case", _EDGE, ids=[c[0] for c in _EDGE])
def test_edge_arguments_accepted_as_torch(case: tuple[str, Callable[[Any], Any], float]) -> None:
    _, call, value = case
    np.testing.assert_array_equal(call(torch.zeros(4)).numpy(), np.full(4, value, np.float32))
    np.testing.assert_array_equal(call(ember.zeros(4)).numpy(), np.full(4, value, np.float32))


def test_generator_only_none() -> None:
    t = ember.zeros(3)
    t.uniform_(generator=None)
    for fill, args in (("uniform_", ()), ("normal_", ()), ("bernoulli_", ()), ("random_", ()),
                       ("exponential_", ()), ("geometric_", (0.5,)), ("log_normal_", ()), ("cauchy_", ())):
        with pytest.raises(ember.UnsupportedError, match=f"{fill}: generator objects are not supported"):
            getattr(t, fill)(*args, generator=torch.Generator())


def test_bad_argument_types() -> None:
    t = ember.zeros(3)
    with pytest.raises(ember.DTypeError, match="uniform_: to must be a number, got str"):
        t.uniform_(0, "1")
    with pytest.raises(ember.ShapeError, match="normal_: mean must be a number or a one-element tensor"):
        t.normal_(ember.zeros(2))
    with pytest.raises(ember.DTypeError, match="uniform_: unexpected keyword argument 'hi'"):
        t.uniform_(hi=2)
    with pytest.raises(ember.DTypeError, match="uniform_: got 'from' twice"):
        t.uniform_(1.0, **{"from": 0.5})
    with pytest.raises(ember.DTypeError, match="random_: takes at most 2"):
        t.random_(0, 1, 2)
    with pytest.raises(ember.DTypeError, match="random_: unexpected keyword argument 'high'"):
        t.random_(high=3)
    with pytest.raises(ember.DTypeError, match="uniform_: expected a Tensor, got list"):
        rnd.uniform_([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ember.DeviceError, match="bernoulli_: expected p on device"):
        t.bernoulli_(ember.full((3,), 0.5, device=ember.Device.parse("flex+autodiff")))
    x = ember.zeros(1000, dtype="int32").random_(**{"from": 10, "to": 12})
    assert set(np.unique(x.numpy())) == {10, 11}
    x = ember.zeros(1000, dtype="int32").random_(7, to=9)
    assert set(np.unique(x.numpy())) == {7, 8}


# -- autograd ---------------------------------------------------------------------------------------------------
_ALL = [(f, (0.5,) if f == "geometric_" else ()) for f in sorted(rnd.TENSOR_METHODS)]


@pytest.mark.parametrize("fill,args", _ALL, ids=[f for f, _ in _ALL])
def test_leaf_requiring_grad_refused_like_torch(fill: str, args: tuple[Any, ...]) -> None:
    tx = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        getattr(tx, fill)(*args)
    dev = ember.Device.parse("flex+autodiff")
    x = ember.ones(3, device=dev, requires_grad=True)
    with pytest.raises(ember.AutodiffError, match=f"{fill}: a leaf tensor that requires grad is being used in an "
                                                  "in-place operation"):
        getattr(x, fill)(*args)
    np.testing.assert_array_equal(x.detach().numpy(), np.ones(3, np.float32))
    with ember.no_grad():  # as torch: allowed under no_grad (what nn.init does), and x stays a leaf
        assert getattr(x, fill)(*args) is x
    assert x.requires_grad and x.is_leaf and x.grad is None


def test_fill_bumps_the_version_like_torch() -> None:
    """A value the graph saved and a fill then overwrote makes backward fail, in torch and in ember (the fill is an
    in-place write, whether or not grad mode is on)."""
    dev = ember.Device.parse("flex+autodiff")
    for lib, x in ((torch, torch.ones(3, requires_grad=True)), (ember, ember.ones(3, device=dev, requires_grad=True))):
        z = (x * x).sum()
        with lib.no_grad():
            x.normal_()
        with pytest.raises(RuntimeError, match="modified by an in-place operation|modified by an inplace operation"):
            z.backward()
        y = x * 1
        z = (y * y).sum()
        y.uniform_()  # a non-leaf may be filled with grad on
        with pytest.raises(RuntimeError, match="modified by an in-place operation|modified by an inplace operation"):
            z.backward()


def test_samples_never_join_the_graph() -> None:
    dev = ember.Device.parse("flex+autodiff")
    x = ember.ones(3, device=dev, requires_grad=True)
    p = ember.full((3,), 0.5, device=dev, requires_grad=True)
    t = ember.zeros(3, device=dev)
    t.bernoulli_(p)  # a p that requires grad is only read
    assert not t.requires_grad and p.grad is None
    y = x * 2
    y.normal_(ember.tensor(1.0, device=dev), 1)
    # overwritten by values that depend on nothing: ember's autodiff drops y's history (as for fill_/copy_), torch
    # keeps y in the graph with a zero gradient; either way nothing reaches x but zeros
    if y.requires_grad:
        y.sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.zeros(3, np.float32))
    else:
        assert x.grad is None


# -- nn.init and nn.layers reach the device only through ember ops ------------------------------------------------
NN_SOURCES = [SRC / "nn" / "init.py", *sorted((SRC / "nn" / "layers").glob("*.py"))]


@pytest.mark.parametrize("path", NN_SOURCES, ids=[p.name for p in NN_SOURCES])
def test_nn_init_and_layers_never_touch_the_stack(path: Path) -> None:
    attrs = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
    assert not {"stack", "_stack", "_h"} & attrs, f"{path.name} reaches the stack or a handle; call ember ops"


def test_batchnorm_counts_batches_through_ops() -> None:
    bn = ember.nn.BatchNorm1d(2, momentum=None)
    x = ember.tensor([[1.0, 2.0], [3.0, 5.0]])
    for _ in range(3):
        bn(x)
    assert bn.num_batches_tracked.item() == 3 and bn.num_batches_tracked.dtype == ember.int64
    tb = torch.nn.BatchNorm1d(2, momentum=None)
    for _ in range(3):
        tb(torch.tensor([[1.0, 2.0], [3.0, 5.0]]))
    np.testing.assert_allclose(bn.running_var.numpy(), tb.running_var.numpy(), rtol=1e-6)
