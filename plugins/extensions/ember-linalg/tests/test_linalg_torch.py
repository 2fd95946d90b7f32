"""ember.linalg against torch.linalg: values on every device (flex, autodiff, fused, the toy backend's host
fallback, OpenCL), gradients against torch autograd, and a float64 finite-difference check of the vjps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

import ember


def _cases() -> ModuleType:
    # the shared cases, loaded by path (the tests run with --import-mode=importlib: no sibling imports)
    name = "ember_linalg_test_cases"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_linalg_cases.py"))
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


C = _cases()
GRAD_CASES = [c for c in C.CASES if c.grad]


def _inputs(case: Any, dtype: Any, seed: int = 0) -> list[np.ndarray]:
    return [a.astype(dtype) for a in case.inputs(np.random.default_rng(seed))]


def _compare(case: Any, got: tuple[Any, ...], want: tuple[Any, ...], tol: dict[str, float]) -> None:
    assert len(got) == len(want), case.id
    for i, (g, w) in enumerate(zip(got, want)):
        gn, wn = C.to_numpy(g), C.to_numpy(w)
        assert gn.shape == wn.shape, f"{case.id} output {i}: shape {gn.shape} != torch's {wn.shape}"
        assert gn.dtype == wn.dtype, f"{case.id} output {i}: dtype {gn.dtype} != torch's {wn.dtype}"
        if i in case.abs_outputs:
            gn, wn = np.abs(gn), np.abs(wn)
        np.testing.assert_allclose(gn, wn, err_msg=f"{case.id} output {i}", **tol)


TOL = {np.float32: {"rtol": 2e-4, "atol": 2e-4}, np.float64: {"rtol": 1e-9, "atol": 1e-9}}


# float64 on every device, float32 once per backend (flex, toy, OpenCL)
VALUE_PARAMS = [pytest.param(c, d, t, id=f"{c.id}-{d}-{np.dtype(t).name}")
                for c in C.CASES for d in C.DEVICES for t in (np.float32, np.float64)
                if t is np.float64 or d in ("flex", "toy", "opencl")]


@pytest.mark.parametrize("case, device, dtype", VALUE_PARAMS)
def test_values_match_torch(case: Any, device: str, dtype: Any) -> None:
    dev = C.device(device)
    arrays = _inputs(case, dtype)
    if case.id in ("eig", "eigvals") and not dev.supports_dtype(ember.complex128):
        # complex results on a device without complex dtypes (toy): the typed error, not a computation
        with pytest.raises(ember.DTypeError, match="linalg.eig: the result dtype complex.* is not supported"):
            case.fn(ember.linalg, *(ember.tensor(a, device=dev) for a in arrays))
        return
    want = C.outputs(case.fn(torch.linalg, *(torch.from_numpy(a) for a in arrays)))
    got = C.outputs(case.fn(ember.linalg, *(ember.tensor(a, device=dev) for a in arrays)))
    _compare(case, got, want, TOL[dtype])


def _loss_weights(outs: tuple[Any, ...], seed: int = 1) -> list[np.ndarray | None]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(o.shape)) if o.dtype in (torch.float32, torch.float64) and o.numel() else None
            for o in outs]


def _loss(case: Any, outs: tuple[Any, ...], weights: list[np.ndarray | None], make: Any) -> Any:
    # a weighted sum of the outputs; sign-ambiguous ones enter squared (a gauge-invariant loss)
    total = None
    for i, (o, w) in enumerate(zip(outs, weights)):
        if w is None:
            continue
        term = ((o * o if i in case.abs_outputs else o) * make(w)).sum()
        total = term if total is None else total + term
    return total


#: every case on flex+autodiff; a representative subset on the fused, toy and OpenCL stacks
SUBSET = ("solve", "inv", "cholesky", "eigh", "svd_reduced_tall", "lu", "qr_reduced_tall", "det", "matrix_exp", "lstsq")
GRAD_PARAMS = [pytest.param(c, d, id=f"{c.id}-{d}") for c in GRAD_CASES if c.torch_grad for d in C.GRAD_DEVICES
               if d == "flex+autodiff" or c.id in SUBSET]


@pytest.mark.parametrize("case, device", GRAD_PARAMS)
def test_gradients_match_torch_autograd(case: Any, device: str) -> None:
    dev = C.device(device)
    arrays = _inputs(case, np.float64)
    tx = [torch.tensor(a, requires_grad=True) for a in arrays]
    touts = C.outputs(case.fn(torch.linalg, *tx))
    weights = _loss_weights(touts)
    _loss(case, touts, weights, torch.from_numpy).backward()
    ex = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    eouts = C.outputs(case.fn(ember.linalg, *ex))
    _loss(case, eouts, weights, lambda w: ember.tensor(w, device=dev)).backward()
    for i, (e, t) in enumerate(zip(ex, tx)):
        assert e.grad is not None, f"{case.id}: no gradient for input {i}"
        np.testing.assert_allclose(C.to_numpy(e.grad), t.grad.numpy(), rtol=1e-7, atol=1e-8,
                                   err_msg=f"{case.id}: gradient of input {i}")


FD_CASES = ["solve", "inv", "det", "slogdet", "cholesky", "eigh", "svd_reduced_wide", "qr_reduced_wide", "lu_wide",
            "lu_tall", "lstsq", "pinv", "matrix_exp", "lu_solve", "solve_triangular_upper_right_unit",
            "matrix_norm_nuc", "cond_fro", "householder_product"]


@pytest.mark.parametrize("case", [c for c in GRAD_CASES if c.id in FD_CASES],
                         ids=[c.id for c in GRAD_CASES if c.id in FD_CASES])
def test_gradients_match_finite_differences(case: Any) -> None:
    """The vjp against central differences of the forward (float64), along one random direction per input."""
    dev = C.device("flex+autodiff")
    arrays = _inputs(case, np.float64, seed=3)
    ex = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    outs = C.outputs(case.fn(ember.linalg, *ex))
    weights = _loss_weights(tuple(torch.from_numpy(C.to_numpy(o)) for o in outs))
    make = lambda w: ember.tensor(w, device=dev)  # noqa: E731
    _loss(case, outs, weights, make).backward()
    rng = np.random.default_rng(7)
    h = 1e-6
    for i, a in enumerate(arrays):
        d = rng.standard_normal(a.shape)
        if case.symmetric:
            d = d + np.swapaxes(d, -1, -2)

        def f(x: np.ndarray, i: int = i) -> float:
            args = [ember.tensor(x if j == i else b, device=dev) for j, b in enumerate(arrays)]
            return float(_loss(case, C.outputs(case.fn(ember.linalg, *args)), weights, make).item())

        fd = (f(a + h * d) - f(a - h * d)) / (2 * h)
        got = float((C.to_numpy(ex[i].grad) * d).sum())
        assert got == pytest.approx(fd, rel=1e-5, abs=1e-6), f"{case.id}: input {i}"
