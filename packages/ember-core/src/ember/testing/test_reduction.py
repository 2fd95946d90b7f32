"""Conformance: reductions, scans, sort/topk/kthvalue/median and norms on the device under test, against PyTorch
(semantics, dtypes, NaN rules, errors) and numpy (a seeded random sweep of shapes and dims)."""

from __future__ import annotations

import math
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import ember
from ember import DimError, DTypeError, EmberError, ShapeError, Tensor, ValueRangeError
from ember.ops import reduction
from ember.testing import torch_or_skip
from ember.testing._helpers import NC, need

torch = torch_or_skip()

NAN = math.nan
INF = math.inf
RNG = np.random.default_rng(1234)


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------
def E(arr: np.ndarray) -> Tensor:  # noqa: N802 - reads as "Ember"
    """arr on the device under test (skips when the device lacks arr's dtype)."""
    arr = np.asarray(arr)
    need(arr.dtype)
    return ember.tensor(arr)


def T(arr: np.ndarray) -> Any:  # noqa: N802 - reads as "Torch"
    return torch.from_numpy(np.array(arr, copy=True))


def _tname(d: Any) -> str:
    return str(d).removeprefix("torch.")


def _assert_tensor(got: Any, exp: Any, what: str = "") -> None:
    assert isinstance(got, Tensor), f"{what}: expected an ember Tensor, got {type(got).__name__}"
    assert got.shape == tuple(exp.shape), f"{what}: shape {got.shape} != {tuple(exp.shape)}"
    assert got.dtype.name == _tname(exp.dtype), f"{what}: dtype {got.dtype.name} != {_tname(exp.dtype)}"
    g = np.asarray(got.numpy())
    e = exp.numpy()
    if g.dtype.kind == "f":
        tol = 1e-12 if g.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(g, e, err_msg=what)


def _assert_same(got: Any, exp: Any, what: str = "") -> None:
    if isinstance(exp, torch.Tensor):
        _assert_tensor(got, exp, what)
        return
    assert isinstance(got, tuple) and len(got) == len(exp), f"{what}: {type(got)} vs {type(exp)}"
    if hasattr(exp, "values") and hasattr(exp, "indices"):
        _assert_tensor(got.values, exp.values, what + " values")
        _assert_tensor(got.indices, exp.indices, what + " indices")
    for g, e in zip(got, exp):
        _assert_same(g, e, what)


def parity(efn: Callable[[Tensor], Any], tfn: Callable[[Any], Any], arr: np.ndarray, what: str = "",
           noncontig: bool = False) -> None:
    """ember and torch agree: same results, or both raise (ember with a typed EmberError)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            exp = tfn(T(arr))
        except (RuntimeError, IndexError, ValueError, TypeError) as exc:
            with pytest.raises(EmberError):
                efn(E(arr))
            return exc
    _assert_same(efn(E(arr)), exp, what)
    if noncontig and np.asarray(arr).ndim >= 2:
        _assert_same(efn(NC(arr)), exp, what + " (non-contiguous)")
    return None


INPUTS: dict[str, np.ndarray] = {
    "f32": RNG.standard_normal((3, 4, 5)).astype(np.float32),
    "f64": RNG.standard_normal((4, 6)),
    "i32_ties": RNG.integers(-3, 4, (3, 5)).astype(np.int32),
    "i64": RNG.integers(-100, 100, (2, 3, 4)).astype(np.int64),
    "i8": RNG.integers(-5, 5, (4, 3)).astype(np.int8),
    "u8": RNG.integers(0, 3, (3, 4)).astype(np.uint8),
    "bool": RNG.random((3, 4)) > 0.5,
    "nan_inf": np.array([[1.0, NAN, 3.0, -INF], [4.0, 2.0, 2.0, INF], [0.5, -1.0, NAN, 7.0]], np.float32),
    "scalar": np.array(2.5, np.float32),
    "empty0": np.zeros((0, 3), np.float32),
    "empty1": np.zeros((2, 0), np.float64),
    "ones_dim": RNG.standard_normal((1, 5, 1)).astype(np.float32),
}
FLOAT_INPUTS = [k for k, v in INPUTS.items() if v.dtype.kind == "f"]
DIMS = [None, 0, -1, (-1, 0), ()]  # (-1, 0): a tuple, unordered, with a negative dim


def _dims_for(arr: np.ndarray) -> list[Any]:
    out = []
    for d in DIMS:
        ds = d if isinstance(d, tuple) else (d,) if d is not None else ()
        if all(-max(arr.ndim, 1) <= x < max(arr.ndim, 1) for x in ds) and not (arr.ndim < 2 and len(ds) == 2):
            out.append(d)
    return out


def _cases(arr: np.ndarray) -> list[tuple[Any, bool]]:
    return [(d, k) for d in _dims_for(arr) for k in (False, True)]


# ------------------------------------------------------------------------------------------------------------
# sum, prod, mean, nansum, nanmean, amax, amin, all, any, count_nonzero, logsumexp
# ------------------------------------------------------------------------------------------------------------
def _call(fn_name: str, x: Any, dim: Any, keepdim: bool, lib: Any) -> Any:
    fn = getattr(lib, fn_name)
    if dim is None and keepdim and lib is torch:
        return fn(x, tuple(range(x.ndim)), keepdim=True)  # torch has no dim=None, keepdim=True overload
    if dim is None:
        return fn(x, keepdim=keepdim) if keepdim else fn(x)
    return fn(x, dim, keepdim=keepdim)


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("op", ["sum", "nansum", "mean", "nanmean", "amax", "amin", "all", "any"])
def test_reductions_match_torch(op: str, name: str) -> None:
    arr = INPUTS[name]
    for dim, keepdim in _cases(arr):
        if op in ("amax", "amin") and dim is None:
            dim = ()  # torch.amax has no dim=None overload; () means every dim there
        parity(lambda x, dim=dim, keepdim=keepdim: _call(op, x, dim, keepdim, ember),
               lambda x, dim=dim, keepdim=keepdim: _call(op, x, dim, keepdim, torch), arr,
               f"{op}[{name}, dim={dim}, keepdim={keepdim}]", noncontig=True)


@pytest.mark.parametrize("name", list(INPUTS))
def test_prod_matches_torch(name: str) -> None:
    arr = INPUTS[name]
    for dim, keepdim in _cases(arr):
        if isinstance(dim, tuple):
            dim = dim[0] if dim else None  # torch.prod takes one int
        if dim is None and keepdim:  # torch.prod has no dim=None, keepdim=True overload
            def tfn(x: Any) -> Any:
                return torch.prod(x).reshape((1,) * x.ndim)
        else:
            def tfn(x: Any, dim: Any = dim, keepdim: bool = keepdim) -> Any:
                return _call("prod", x, dim, keepdim, torch)
        parity(lambda x, dim=dim, keepdim=keepdim: _call("prod", x, dim, keepdim, ember), tfn, arr,
               f"prod[{name}, dim={dim}, keepdim={keepdim}]", noncontig=True)


@pytest.mark.parametrize("name", list(INPUTS))
def test_count_nonzero_and_logsumexp(name: str) -> None:
    arr = INPUTS[name]
    for dim in [d for d in _dims_for(arr) if d != ()]:
        _count_nonzero_and_logsumexp(arr, dim)


def _count_nonzero_and_logsumexp(arr: np.ndarray, dim: Any) -> None:
    parity(lambda x: ember.count_nonzero(x, dim), lambda x: torch.count_nonzero(x, dim), arr, "count_nonzero")
    if dim is not None and arr.dtype != bool:
        for k in (False, True):
            parity(lambda x, k=k: ember.logsumexp(x, dim, k), lambda x, k=k: torch.logsumexp(x, dim, k), arr,
                   "logsumexp", noncontig=True)


def test_dtype_rules() -> None:
    i8 = E(INPUTS["i8"])
    assert ember.sum(i8).dtype is ember.int64
    assert i8.prod().dtype is ember.int64
    assert E(INPUTS["bool"]).sum().dtype is ember.int64
    assert ember.sum(i8, dtype=ember.int32).dtype is ember.int32
    assert i8.amax().dtype is ember.int8
    wide = ember.float64 if ember.default_device().supports_dtype(ember.float64) else ember.float32
    assert ember.mean(i8, dtype=wide).dtype is wide
    np.testing.assert_allclose(ember.mean(i8, dtype=wide).item(), INPUTS["i8"].mean(), rtol=1e-6)
    assert E(INPUTS["u8"]).all().dtype is ember.uint8  # torch keeps uint8
    assert E(INPUTS["f32"]).all().dtype is ember.bool_
    assert ember.logsumexp(i8, 0).dtype is ember.float32
    need(np.float16)
    h = ember.tensor(INPUTS["f32"], dtype=ember.float16)
    _assert_tensor(h.sum(1), T(INPUTS["f32"]).half().sum(1), "float16 sum")
    _assert_tensor(h.sum(dtype=ember.float32), T(INPUTS["f32"]).half().sum(dtype=torch.float32), "sum dtype=")


def test_empty_identities() -> None:
    e = E(np.zeros((0,), np.float32))
    assert e.sum().item() == 0.0
    assert e.prod().item() == 1.0
    assert math.isnan(e.mean().item())
    assert e.all().item() is True
    assert e.any().item() is False
    assert ember.logsumexp(e, 0).item() == -INF
    assert ember.count_nonzero(e).item() == 0
    assert math.isnan(e.median().item())


def test_nan_propagation() -> None:
    x = E(np.array([1.0, NAN, 3.0], np.float32))
    assert math.isnan(x.max().item()) and math.isnan(x.min().item())
    assert math.isnan(x.amax().item()) and math.isnan(x.sum().item())
    assert x.argmax().item() == 1 and x.argmin().item() == 1
    assert ember.nansum(x).item() == 4.0
    assert ember.nanmean(x).item() == 2.0
    assert x.max(0).indices.item() == 1


# ------------------------------------------------------------------------------------------------------------
# max / min / argmax / argmin
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_match_torch(op: str, name: str) -> None:
    arr = INPUTS[name]
    parity(lambda x: getattr(x, op)(), lambda x: getattr(x, op)(), arr, f"{op}()")
    for d in (0, -1):
        for k in (False, True):
            parity(lambda x, d=d, k=k: getattr(ember, op)(x, d, k),
                   lambda x, d=d, k=k: getattr(torch, op)(x, d, k), arr, f"{op}({name}, {d}, {k})",
                   noncontig=True)


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin_match_torch(op: str, name: str) -> None:
    arr = INPUTS[name]
    for d in (None, 0, -1):
        for k in (False, True):
            parity(lambda x, d=d, k=k: getattr(ember, op)(x, d, k),
                   lambda x, d=d, k=k: getattr(torch, op)(x, d, k), arr, f"{op}({name}, {d}, {k})",
                   noncontig=True)


def test_max_ties_first_index_and_result_type() -> None:
    x = E(np.array([[1, 5, 5, 2], [7, 7, 0, 7]]))
    r = x.max(dim=1)
    assert isinstance(r, ember.return_types.max)
    assert r.values.tolist() == [5, 7] and r.indices.tolist() == [1, 0]
    v, i = ember.min(x, 1, keepdim=True)
    assert v.shape == (2, 1) and i.tolist() == [[0], [2]]
    assert pickle.loads(pickle.dumps(r)).values.tolist() == [5, 7]


def test_max_with_tensor_is_maximum() -> None:
    a, b = E(np.array([1.0, 5.0, NAN], np.float32)), E(np.array([3.0, 2.0, 1.0], np.float32))
    _assert_tensor(ember.max(a, b), torch.max(T(a.numpy()), T(b.numpy())))
    _assert_tensor(a.min(b), torch.min(T(a.numpy()), T(b.numpy())))


def test_aminmax() -> None:
    arr = INPUTS["nan_inf"]
    mn, mx = ember.aminmax(E(arr), dim=1, keepdim=True)
    emn, emx = torch.aminmax(T(arr), dim=1, keepdim=True)
    _assert_tensor(mn, emn)
    _assert_tensor(mx, emx)
    assert ember.aminmax(E(INPUTS["i64"])).max.item() == INPUTS["i64"].max()


# ------------------------------------------------------------------------------------------------------------
# var / std
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FLOAT_INPUTS)
@pytest.mark.parametrize("correction", [None, 0, 2, 10])
def test_var_std_match_torch(name: str, correction: Any) -> None:
    arr = INPUTS[name]
    for dim, keepdim in _cases(arr):
        for op in ("var", "std", "var_mean", "std_mean"):
            parity(lambda x, op=op, dim=dim, keepdim=keepdim: getattr(ember, op)(x, dim, keepdim=keepdim,
                                                                                 correction=correction),
                   lambda x, op=op, dim=dim, keepdim=keepdim: getattr(torch, op)(x, dim, keepdim=keepdim,
                                                                                 correction=correction),
                   arr, f"{op}[{name}, {dim}, {keepdim}, c={correction}]", noncontig=True)


def test_var_unbiased_and_positional_forms() -> None:
    arr = INPUTS["f64"]
    x, t = E(arr), T(arr)
    _assert_tensor(x.var(unbiased=False), t.var(unbiased=False))
    _assert_tensor(ember.var(x, False), torch.var(t, False))
    _assert_tensor(x.std(1, False, True), t.std(1, False, True))
    _assert_tensor(x.var(0, unbiased=True), t.var(0, unbiased=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isinf(E(np.array([1.0, 2.0, 3.0])).var(correction=5).item())
        assert math.isnan(E(np.array([1.0, 1.0])).var(correction=5).item())
    with pytest.raises(ValueRangeError, match="either unbiased= or correction="):
        x.var(unbiased=True, correction=0)


# ------------------------------------------------------------------------------------------------------------
# scans
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax", "cummin"])
def test_scans_match_torch(op: str, name: str) -> None:
    arr = INPUTS[name]
    if op == "cumprod" and arr.dtype.kind in "iu":
        arr = np.clip(arr, -2, 2)  # keep products in range
    for d in (0, -1):
        parity(lambda x, d=d: getattr(ember, op)(x, d), lambda x, d=d: getattr(torch, op)(x, d), arr,
               f"{op}({name}, {d})", noncontig=True)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize(
    "values",
    [
        [1.0, 3.0, 3.0, NAN, 2.0, NAN, 5.0],
        [NAN, 1.0, NAN, 0.0],
        [2.0, 2.0, 2.0, 1.0, 3.0, 3.0],
        [-0.0, 0.0, -0.0, INF, INF, -INF],
        [5.0, 4.0, 3.0, 3.0, 6.0, 1.0, 1.0, 0.0, 9.0, 9.0, 2.0, 3.0, 1.0, 0.0, 7.0, 7.0, 7.0],
    ],
)
def test_cummax_cummin_ties_and_nan(op: str, values: list[float]) -> None:
    arr = np.array(values, np.float32)
    parity(lambda x: getattr(ember, op)(x, 0), lambda x: getattr(torch, op)(x, 0), arr, op)
    ints = np.array([3, 1, 3, 1, 2, 3, 0, 0, 3])
    parity(lambda x: getattr(ember, op)(x, 0), lambda x: getattr(torch, op)(x, 0), ints, op + " ints")
    r = getattr(ember, op)(E(ints), 0)
    assert isinstance(r, getattr(ember.return_types, op))


def test_scan_dtypes() -> None:
    assert ember.cumsum(E(INPUTS["i8"]), 0).dtype is ember.int64
    assert ember.cumsum(E(INPUTS["bool"]), 1).dtype is ember.int64
    wide = ember.float64 if ember.default_device().supports_dtype(ember.float64) else ember.float32
    assert ember.cumsum(E(INPUTS["i8"]), 0, dtype=wide).dtype is wide
    assert E(INPUTS["f32"]).cumprod(2).dtype is ember.float32


# ------------------------------------------------------------------------------------------------------------
# sort, argsort, topk, kthvalue, median
# ------------------------------------------------------------------------------------------------------------
def _check_gather(x: np.ndarray, values: Tensor, indices: Tensor, dim: int) -> None:
    """values are x taken at indices along dim (NaN-aware)."""
    if x.ndim == 0:
        np.testing.assert_array_equal(values.numpy(), x)
        assert indices.item() == 0
        return
    idx = indices.numpy()
    v = values.numpy()
    if idx.ndim < x.ndim:
        idx, v = np.expand_dims(idx, dim), np.expand_dims(v, dim)
    np.testing.assert_array_equal(np.take_along_axis(x, idx, dim), v)


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_torch(name: str, descending: bool) -> None:
    arr = INPUTS[name]
    for d in (0, -1):
        # stable sorts are fully determined: values and indices must match
        parity(lambda x, d=d: ember.sort(x, d, descending, stable=True),
               lambda x, d=d: torch.sort(x, dim=d, descending=descending, stable=True), arr, f"sort({name})",
               noncontig=True)
        parity(lambda x, d=d: ember.argsort(x, d, descending, True),
               lambda x, d=d: torch.argsort(x, dim=d, descending=descending, stable=True), arr, "argsort")
        r = ember.sort(E(arr), d, descending)
        _assert_tensor(r.values, torch.sort(T(arr), d, descending).values, "unstable sort values")
        _check_gather(arr, r.values, r.indices, d % max(arr.ndim, 1))


def test_sort_nan_order() -> None:
    x = E(np.array([3.0, NAN, 1.0, -INF, NAN], np.float32))
    assert np.array_equal(x.sort().values.numpy(), [-INF, 1.0, 3.0, NAN, NAN], equal_nan=True)
    assert np.array_equal(x.sort(descending=True).values.numpy(), [NAN, NAN, 3.0, 1.0, -INF], equal_nan=True)
    assert x.sort(stable=True).indices.tolist() == [3, 2, 0, 1, 4]
    assert isinstance(x.sort(), ember.return_types.sort)


@pytest.mark.parametrize("name", list(INPUTS))
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(name: str, largest: bool) -> None:
    arr = INPUTS[name]
    for d in (0, -1):
        size = arr.shape[d] if arr.ndim else 1
        for k in sorted({0, 1, size}):
            r = parity(lambda x, k=k, d=d: ember.topk(x, k, d, largest).values,
                       lambda x, k=k, d=d: torch.topk(x, k, d, largest).values, arr,
                       f"topk({name}, {k}, {d})")
            if r is None:
                res = ember.topk(E(arr), k, d, largest)
                _check_gather(arr, res.values, res.indices, d % max(arr.ndim, 1))


def test_topk_nan_is_largest() -> None:
    x = E(np.array([3.0, 1.0, NAN, 2.0], np.float32))
    r = x.topk(2)
    assert math.isnan(r.values.tolist()[0]) and r.indices.tolist() == [2, 0]
    assert x.topk(2, largest=False).indices.tolist() == [1, 3]


@pytest.mark.parametrize("name", list(INPUTS))
def test_kthvalue_and_median_match_torch(name: str) -> None:
    arr = INPUTS[name]
    if arr.dtype == bool:
        pytest.skip("torch has no kthvalue/median for bool")
    parity(lambda x: x.median(), lambda x: x.median(), arr, f"median({name})")
    for d in (0, -1):
        for k in (False, True):
            size = arr.shape[d] if arr.ndim else 1
            for kk in sorted({1, max(size, 1)}):
                r = parity(lambda x, kk=kk, d=d, k=k: ember.kthvalue(x, kk, d, k).values,
                           lambda x, kk=kk, d=d, k=k: torch.kthvalue(x, kk, d, k).values, arr,
                           f"kthvalue({name}, {kk}, {d})")
                if r is None:
                    res = ember.kthvalue(E(arr), kk, d, k)
                    _check_gather(arr, res.values, res.indices, d % max(arr.ndim, 1))
            r = parity(lambda x, d=d, k=k: ember.median(x, d, k).values,
                       lambda x, d=d, k=k: torch.median(x, d, k).values, arr,
                       f"median({name}, {d}, {k})", noncontig=True)
            if r is None:
                res = ember.median(E(arr), d, k)
                if arr.dtype.kind == "f" and np.isnan(arr).any():
                    # torch: the index of the first NaN along dim
                    _assert_tensor(res.indices, torch.median(T(arr), d, k).indices, "median NaN index")
                else:
                    _check_gather(arr, res.values, res.indices, d % max(arr.ndim, 1))


def test_median_is_lower_median() -> None:
    assert E(np.array([4.0, 1.0, 3.0, 2.0])).median().item() == 2.0
    r = E(np.array([[1.0, NAN, 3.0, NAN], [4.0, 1.0, 2.0, 3.0]], np.float32)).median(1)
    assert math.isnan(r.values.tolist()[0]) and r.values.tolist()[1] == 2.0
    assert r.indices.tolist() == [1, 2]


# ------------------------------------------------------------------------------------------------------------
# norms
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FLOAT_INPUTS)
@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3, 0.5, -1])
def test_vector_norm_matches_torch(name: str, ord: float) -> None:
    arr = INPUTS[name]
    for dim in _dims_for(arr):
        if dim == ():
            continue
        for k in (False, True):
            parity(lambda x, dim=dim, k=k: ember.vector_norm(x, ord, dim, k),
                   lambda x, dim=dim, k=k: torch.linalg.vector_norm(x, ord, dim, k), arr,
                   f"vector_norm({name}, {ord}, {dim}, {k})", noncontig=True)


def test_norm_matches_torch() -> None:
    arr = INPUTS["f64"]
    for p in ("fro", 1, 2, INF, 3):
        for dim in (None, 0, (0, 1)):
            parity(lambda x, p=p, dim=dim: ember.norm(x, p, dim),
                   lambda x, p=p, dim=dim: torch.norm(x, p, dim), arr, f"norm({p}, {dim})")
    _assert_tensor(E(arr).norm(), T(arr).norm())
    _assert_tensor(ember.vector_norm(E(INPUTS["f32"]), 3, dtype=ember.float64),
                   torch.linalg.vector_norm(T(INPUTS["f32"]), 3, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------------------
# 0-d tensors and non-contiguous inputs
# ------------------------------------------------------------------------------------------------------------
def test_zero_dim_tensors() -> None:
    s = E(np.array(2.5, np.float32))
    for d in (0, -1):
        assert s.sum(d).item() == 2.5 and s.sum(d, keepdim=True).shape == ()
        assert s.max(d).indices.item() == 0 and s.max(d).values.shape == ()
        assert s.argmax(d).item() == 0
        assert s.cumsum(d).item() == 2.5 and s.cumsum(d).shape == ()
        assert s.sort(d).values.item() == 2.5
        assert s.topk(1, d).values.shape == ()
        assert s.cummax(d).indices.item() == 0
    with pytest.raises(DimError, match="out of range"):
        s.sum(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(s.var().item())


def test_noncontiguous_slices() -> None:
    arr = RNG.standard_normal((6, 8)).astype(np.float32)
    base = E(arr)
    stack = base._device.stack
    sl = Tensor._make(stack.getitem(base._h, (slice(None, None, 2), slice(1, None, 3))), base._dtype,
                      base._device)
    ref = arr[::2, 1::3]
    np.testing.assert_allclose(sl.sum(0).numpy(), ref.sum(0), rtol=1e-5)
    np.testing.assert_array_equal(sl.cummax(1).values.numpy(), np.maximum.accumulate(ref, 1))
    np.testing.assert_array_equal(sl.sort(0).values.numpy(), np.sort(ref, 0))


# ------------------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------------------
def test_bad_dim_errors() -> None:
    x = E(INPUTS["f32"])
    for fn in (lambda: x.sum(3), lambda: x.mean(-4), lambda: x.amax((0, 5)), lambda: x.max(3),
               lambda: x.argmax(3), lambda: x.cumsum(3), lambda: x.sort(3), lambda: x.var(3),
               lambda: x.topk(1, 3), lambda: x.median(7), lambda: x.cummax(-5),
               lambda: ember.logsumexp(x, 4)):
        with pytest.raises(DimError, match="out of range"):
            fn()
    with pytest.raises(DimError, match="multiple times"):
        x.sum((0, -3))
    with pytest.raises(DimError, match="must be an int"):
        x.sum(1.5)


def test_dtype_errors() -> None:
    i = E(INPUTS["i64"])
    with pytest.raises(DTypeError, match=r"mean\(\).*int64"):
        i.mean()
    with pytest.raises(DTypeError, match="floating point"):
        i.mean(dtype=ember.int32)
    with pytest.raises(DTypeError, match="nanmean"):
        ember.nanmean(i)
    with pytest.raises(DTypeError, match="var only support floating point"):
        i.var()
    with pytest.raises(DTypeError, match="vector_norm.*int64"):
        ember.vector_norm(i)
    with pytest.raises(DTypeError, match="vector_norm.*int64"):
        ember.vector_norm(i, dtype=ember.float32)  # torch refuses integer inputs even with dtype=
    with pytest.raises(DTypeError, match="bool"):
        E(INPUTS["bool"]).argmax()
    with pytest.raises(DTypeError, match="expected a Tensor"):
        ember.sum([1, 2, 3])


def test_empty_reduction_errors() -> None:
    e = E(np.zeros((0, 3), np.float32))
    for op in ("max", "min", "amax", "amin", "argmax", "argmin"):
        with pytest.raises(ShapeError, match=rf"{op}\(\): Expected reduction dim to be specified"):
            getattr(e, op)()
        with pytest.raises(ShapeError, match=rf"{op}\(\): Expected reduction dim 0 to have non-zero size"):
            getattr(e, op)(0)
        r = getattr(e, op)(1)  # reducing a non-empty dim of an empty tensor is fine
        assert (r.values if isinstance(r, tuple) else r).shape == (0,)
    with pytest.raises(ShapeError, match="non-zero size"):
        e.median(0)
    with pytest.raises(ShapeError, match="inf norm on an empty tensor"):
        ember.vector_norm(e, INF)
    with pytest.raises(ShapeError, match="-1 norm on an empty tensor"):
        ember.vector_norm(e, -1, 0)


def test_k_out_of_range_errors() -> None:
    x = E(np.array([1.0, 2.0]))
    with pytest.raises(ValueRangeError, match=r"topk\(\): selected number k=3 out of range.*size 2"):
        x.topk(3)
    with pytest.raises(ValueRangeError, match="k=-1 out of range"):
        x.topk(-1)
    with pytest.raises(ValueRangeError, match=r"kthvalue\(\): selected number k=0"):
        x.kthvalue(0)
    with pytest.raises(ValueRangeError, match="k=3"):
        x.kthvalue(3)
    with pytest.raises(DTypeError, match="k must be an int"):
        x.topk(1.5)


def test_norm_argument_errors() -> None:
    x = E(INPUTS["f64"])
    with pytest.raises(DTypeError, match="ord must be a number"):
        ember.vector_norm(x, "fro")
    with pytest.raises(ember.UnsupportedError, match="nuc"):
        ember.norm(x, "nuc")
    with pytest.raises(ValueRangeError, match="unknown norm type"):
        ember.norm(x, "bad")


# ------------------------------------------------------------------------------------------------------------
# namespace
# ------------------------------------------------------------------------------------------------------------
def test_exports_and_methods() -> None:
    for name in reduction.__all__:
        assert getattr(ember, name) is getattr(reduction, name)
    for name in reduction.TENSOR_METHODS:
        assert getattr(Tensor, name) is reduction.TENSOR_METHODS[name], name
    assert isinstance(E(INPUTS["f64"]).max(0), tuple)
    assert ember.return_types.max._fields == ("values", "indices")


# ------------------------------------------------------------------------------------------------------------
# seeded random sweep against numpy: shapes (0-d, empty, size-1 dims), dims (negative, tuples, none), dtypes
# ------------------------------------------------------------------------------------------------------------
def _random_case(rng: np.random.Generator) -> tuple[np.ndarray, Any, bool]:
    nd = int(rng.integers(0, 5))
    shape = tuple(int(s) for s in rng.integers(0, 5, nd))
    dtype = [np.float32, np.float64, np.int32, np.int64][int(rng.integers(0, 4))]
    arr = rng.integers(-20, 21, shape).astype(dtype)
    if nd == 0:
        dim = [None, 0, -1][int(rng.integers(0, 3))]
    else:
        chosen = [int(d) for d in rng.permutation(nd)[: int(rng.integers(0, nd + 1))]]
        dims = tuple(d - nd if rng.random() < 0.5 else d for d in chosen)
        dim = None if not dims else (dims[0] if len(dims) == 1 and rng.random() < 0.5 else dims)
    return arr, dim, bool(rng.random() < 0.5)


def _np_axis(arr: np.ndarray, dim: Any) -> Any:
    if dim is None or arr.ndim == 0:
        return None
    return tuple(d % arr.ndim for d in (dim if isinstance(dim, tuple) else (dim,)))


@pytest.mark.parametrize("seed", range(4))
def test_random_sum_mean_amax_vs_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(25):
        arr, dim, keepdim = _random_case(rng)
        what = f"shape {arr.shape} {arr.dtype} dim={dim} keepdim={keepdim}"
        x = E(arr)
        axis = _np_axis(arr, dim)
        s = x.sum(dim, keepdim=keepdim)
        exp = np.sum(arr, axis=axis, keepdims=keepdim, dtype=np.int64 if arr.dtype.kind == "i" else arr.dtype)
        assert s.shape == exp.shape, what
        np.testing.assert_allclose(s.numpy(), exp, rtol=1e-5, err_msg=what)
        if arr.dtype.kind == "f":
            m = x.mean(dim, keepdim=keepdim)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                em = np.mean(arr, axis=axis, keepdims=keepdim)
            assert m.shape == em.shape and m.dtype.numpy == arr.dtype, what
            np.testing.assert_allclose(m.numpy(), em, rtol=1e-5, equal_nan=True, err_msg=what)
        else:
            with pytest.raises(DTypeError):
                x.mean(dim)
        reduced = int(np.prod([arr.shape[a] for a in (axis or range(arr.ndim))]))
        if reduced == 0:
            with pytest.raises(ShapeError, match="amax"):
                x.amax(() if dim is None else dim, keepdim)
        else:
            a = x.amax(() if dim is None else dim, keepdim)
            ea = np.amax(arr, axis=axis, keepdims=keepdim)
            assert a.shape == ea.shape and a.dtype.numpy == arr.dtype, what
            np.testing.assert_array_equal(a.numpy(), ea, err_msg=what)
