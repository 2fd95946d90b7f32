"""ember.linalg on complex64/complex128 input (flex, fused flex, flex+autodiff, OpenCL) against torch.linalg:
values, dtypes (real eigenvalues, singular values, log|det| and residuals), and gradients in torch's conjugate
convention; plus the gradients of eig/eigvals and householder_product (also for real input) and matrix_rank's
integer, gradient-free result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import ember
from ember.errors import AutodiffError, DeviceError, PluginError

LA = ember.linalg


def _c(rng: np.random.Generator, *s: int) -> np.ndarray:
    return rng.standard_normal(s) + 1j * rng.standard_normal(s)


def _sq(rng: np.random.Generator, *s: int) -> np.ndarray:
    return _c(rng, *s) + s[-1] * np.eye(s[-1])


def _hpd(rng: np.random.Generator, *s: int) -> np.ndarray:
    x = _c(rng, *s)
    return x @ np.swapaxes(x, -1, -2).conj() + s[-1] * np.eye(s[-1])


def _r(rng: np.random.Generator, *s: int) -> np.ndarray:
    return rng.standard_normal(s)


def _lin(lib: Any, x: Any) -> Any:
    """A real linear function of any output (real or complex), the same in both libraries."""
    if x.dtype.is_complex:
        return (lib.real(x) * 0.7).sum() + (lib.imag(x) * 0.3).sum()
    return (x * 0.5).sum()


def _weighted(lib: Any, out: Any) -> Any:
    outs = out if isinstance(out, tuple) else (out,)
    total = _lin(lib, outs[0])
    for o in outs[1:]:
        total = total + _lin(lib, o)
    return total


def _phase_free(lib: Any, out: Any) -> Any:
    """(eigenvalues, eigenvectors) losses that do not depend on the vectors' phase: |V|^2 weighted."""
    values, vectors = out
    return _lin(lib, values) + ((vectors.abs() ** 2) * 0.3).sum()


#: (id, fn(linalg, *tensors), inputs(rng), loss)
CASES: list[tuple[str, Callable[..., Any], Callable[[np.random.Generator], list[np.ndarray]], Any]] = [
    ("solve", lambda L, A, B: L.solve(A, B), lambda g: [_sq(g, 2, 3, 3), _c(g, 3, 2)], _weighted),
    ("inv", lambda L, A: L.inv(A), lambda g: [_sq(g, 2, 3, 3)], _weighted),
    ("det", lambda L, A: L.det(A), lambda g: [_c(g, 2, 3, 3)], _weighted),
    ("slogdet", lambda L, A: tuple(L.slogdet(A)), lambda g: [_c(g, 2, 3, 3)], _weighted),
    ("cholesky", lambda L, A: L.cholesky(A), lambda g: [_hpd(g, 2, 3, 3)], _weighted),
    ("cholesky_upper", lambda L, A: L.cholesky(A, upper=True), lambda g: [_hpd(g, 3, 3)], _weighted),
    ("solve_triangular", lambda L, A, B: L.solve_triangular(A, B, upper=False), lambda g: [_sq(g, 3, 3), _c(g, 3, 2)],
     _weighted),
    ("solve_triangular_right", lambda L, A, B: L.solve_triangular(A, B, upper=True, left=False),
     lambda g: [_sq(g, 3, 3), _c(g, 2, 3)], _weighted),
    ("eigvalsh", lambda L, A: L.eigvalsh(A), lambda g: [_hpd(g, 2, 3, 3)], _weighted),
    ("eigh", lambda L, A: tuple(L.eigh(A)), lambda g: [_hpd(g, 3, 3)], _phase_free),
    ("svdvals", lambda L, A: L.svdvals(A), lambda g: [_c(g, 2, 3, 4)], _weighted),
    ("svd_gauge_free", lambda L, A: (lambda r: (r.S, r.U @ r.Vh))(L.svd(A, full_matrices=False)),
     lambda g: [_c(g, 3, 5)], _weighted),
    ("svd_abs_u", lambda L, A: (lambda r: (r.S, r.U.abs() ** 2))(L.svd(A, full_matrices=False)),
     lambda g: [_c(g, 4, 3)], _weighted),
    ("qr_tall", lambda L, A: tuple(L.qr(A)), lambda g: [_c(g, 2, 4, 3)], _weighted),
    ("qr_wide", lambda L, A: tuple(L.qr(A)), lambda g: [_c(g, 3, 5)], _weighted),
    ("lu", lambda L, A: tuple(L.lu(A))[1:], lambda g: [_c(g, 2, 3, 3)], _weighted),
    ("lu_solve", lambda L, A, B: L.lu_solve(*L.lu_factor(A), B), lambda g: [_sq(g, 3, 3), _c(g, 3, 2)], _weighted),
    ("lu_solve_adjoint", lambda L, A, B: L.lu_solve(*L.lu_factor(A), B, adjoint=True),
     lambda g: [_sq(g, 3, 3), _c(g, 3, 2)], _weighted),
    ("lu_solve_right", lambda L, A, B: L.lu_solve(*L.lu_factor(A), B, left=False),
     lambda g: [_sq(g, 3, 3), _c(g, 2, 3)], _weighted),
    ("lu_solve_right_adjoint", lambda L, A, B: L.lu_solve(*L.lu_factor(A), B, left=False, adjoint=True),
     lambda g: [_sq(g, 3, 3), _c(g, 2, 3)], _weighted),
    ("pinv", lambda L, A: L.pinv(A), lambda g: [_c(g, 3, 5)], _weighted),
    ("pinv_hermitian", lambda L, A: L.pinv(A, hermitian=True), lambda g: [_hpd(g, 3, 3)], _weighted),
    ("lstsq", lambda L, A, B: L.lstsq(A, B)[0], lambda g: [_c(g, 5, 3), _c(g, 5, 2)], _weighted),
    ("lstsq_gelsd", lambda L, A, B: tuple(L.lstsq(A, B, driver="gelsd"))[:2], lambda g: [_c(g, 5, 3), _c(g, 5, 2)],
     _weighted),
    ("matrix_exp", lambda L, A: L.matrix_exp(A), lambda g: [_c(g, 2, 3, 3)], _weighted),
    ("householder_product", lambda L, A, t: L.householder_product(A, t), lambda g: [_c(g, 4, 3), _c(g, 3)],
     _weighted),
    ("householder_product_real", lambda L, A, t: L.householder_product(A, t),
     lambda g: [_r(g, 2, 4, 3), _r(g, 2, 2)], _weighted),
    ("householder_product_real_square", lambda L, A, t: L.householder_product(A, t),
     lambda g: [_r(g, 3, 3), _r(g, 3)], _weighted),
    ("eig", lambda L, A: tuple(L.eig(A)), lambda g: [_c(g, 2, 3, 3)], _phase_free),
    ("eigvals", lambda L, A: L.eigvals(A), lambda g: [_c(g, 3, 3)], _weighted),
    ("eig_real", lambda L, A: tuple(L.eig(A)), lambda g: [_r(g, 3, 3)], _phase_free),
    ("eigvals_real", lambda L, A: L.eigvals(A), lambda g: [_r(g, 2, 4, 4)], _weighted),
    ("matrix_norm_fro", lambda L, A: L.matrix_norm(A), lambda g: [_c(g, 2, 3, 4)], _weighted),
    ("matrix_norm_nuc", lambda L, A: L.matrix_norm(A, "nuc"), lambda g: [_c(g, 2, 3, 4)], _weighted),
    ("matrix_norm_2", lambda L, A: L.matrix_norm(A, 2), lambda g: [_c(g, 3, 4)], _weighted),
    ("matrix_norm_1", lambda L, A: L.matrix_norm(A, 1), lambda g: [_c(g, 2, 3, 4)], _weighted),
    ("matrix_norm_inf", lambda L, A: L.matrix_norm(A, float("inf")), lambda g: [_c(g, 2, 3, 4)], _weighted),
    ("norm", lambda L, A: L.norm(A), lambda g: [_c(g, 2, 3, 4)], _weighted),
    ("vector_norm_3", lambda L, A: L.vector_norm(A, 3, dim=-1), lambda g: [_c(g, 2, 5)], _weighted),
    ("cond", lambda L, A: L.cond(A), lambda g: [_sq(g, 2, 3, 3)], _weighted),
]
IDS = [c[0] for c in CASES]


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().resolve_conj().numpy()
    return np.asarray(x.detach().numpy())


def _sorted_eig(vals: np.ndarray) -> np.ndarray:
    # geev's order is the same LAPACK's on both sides, but sort anyway so a build difference cannot flip a pair
    return np.sort_complex(vals.reshape(-1, vals.shape[-1])).reshape(vals.shape)


def _device(name: str) -> ember.Device:
    try:
        dev = ember.Device.parse(name)
        ember.zeros(1, device=dev).numpy()
    except (DeviceError, PluginError) as exc:
        pytest.skip(f"device {name} not available here: {exc}")
    return dev


@pytest.mark.parametrize("device", ["flex", "flex+fusion(eager_below=0)", "opencl"])
@pytest.mark.parametrize("precision", ["complex64", "complex128"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_complex_values_and_dtypes_match_torch(case: Any, precision: str, device: str) -> None:
    name, fn, make, _ = case
    dev = _device(device)
    if not dev.supports_dtype(getattr(ember, precision)):
        pytest.skip(f"{device} has no {precision}")
    arrays = make(np.random.default_rng(0))
    if precision == "complex64":
        arrays = [a.astype(np.complex64) if np.iscomplexobj(a) else a.astype(np.float32) for a in arrays]
    want = fn(torch.linalg, *(torch.from_numpy(a) for a in arrays))
    got = fn(LA, *(ember.tensor(a, device=dev) for a in arrays))
    want, got = (want if isinstance(want, tuple) else (want,)), (got if isinstance(got, tuple) else (got,))
    tol = {"rtol": 2e-4, "atol": 2e-4} if precision == "complex64" else {"rtol": 1e-9, "atol": 1e-9}
    for i, (g, w) in enumerate(zip(got, want)):
        gn, wn = _np(g), _np(w)
        assert gn.dtype == wn.dtype, f"{name} output {i}: dtype {gn.dtype} != torch's {wn.dtype}"
        if name.startswith("eig") and i == 0:
            gn, wn = _sorted_eig(gn), _sorted_eig(wn)
        if name.startswith("eig") and i == 1:  # eigenvectors: defined up to a phase
            gn, wn = np.abs(gn), np.abs(wn)
        np.testing.assert_allclose(gn, wn, err_msg=f"{name} output {i}", **tol)


#: gradients on flex+autodiff for every case; on OpenCL (the host fallback under autodiff) a subset
GRAD_PARAMS = [pytest.param(c, d, id=f"{c[0]}-{d}") for c in CASES for d in ("flex+autodiff", "opencl+autodiff")
               if d == "flex+autodiff" or c[0] in ("solve", "cholesky", "eigh", "svd_gauge_free", "qr_tall", "eig",
                                                   "householder_product")]


@pytest.mark.parametrize("case, device", GRAD_PARAMS)
def test_complex_gradients_match_torch_autograd(case: Any, device: str) -> None:
    name, fn, make, loss = case
    dev = _device(device)
    arrays = make(np.random.default_rng(1))
    tx = [torch.tensor(a, requires_grad=True) for a in arrays]
    loss(torch, fn(torch.linalg, *tx)).backward()
    ex = [ember.tensor(a, device=dev, requires_grad=True) for a in arrays]
    loss(ember, fn(LA, *ex)).backward()
    for i, (e, t) in enumerate(zip(ex, tx)):
        assert e.grad is not None, f"{name}: no gradient for input {i}"
        assert e.grad.dtype.name == str(t.dtype).split(".")[-1], f"{name}: gradient dtype of input {i}"
        np.testing.assert_allclose(_np(e.grad), _np(t.grad), rtol=1e-7, atol=1e-9,
                                   err_msg=f"{name}: gradient of input {i}")


def test_eig_gradient_refuses_a_phase_dependent_loss() -> None:
    """torch's rule: eigenvectors are defined up to e^{i phi}; a loss that reads the phase has no gradient."""
    a = np.random.default_rng(2).standard_normal((3, 3))
    x = ember.tensor(a, device=ember.device("flex").autodiff(), requires_grad=True)
    vectors = LA.eig(x).eigenvectors
    with pytest.raises(AutodiffError, match="specified up to multiplication by e\\^\\{i phi\\}"):
        ember.imag(vectors).sum().backward()


def test_householder_product_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(3)
    a, tau = rng.standard_normal((5, 3)), rng.standard_normal(3)
    w = rng.standard_normal((5, 3))
    dev = ember.device("flex").autodiff()
    x = ember.tensor(a, device=dev, requires_grad=True)
    t = ember.tensor(tau, device=dev, requires_grad=True)
    (LA.householder_product(x, t) * ember.tensor(w, device=dev)).sum().backward()

    def f(aa: np.ndarray, tt: np.ndarray) -> float:
        return float((LA.householder_product(ember.tensor(aa), ember.tensor(tt)).numpy() * w).sum())

    h = 1e-6
    da, dt_ = rng.standard_normal(a.shape), rng.standard_normal(tau.shape)
    fd = (f(a + h * da, tau + h * dt_) - f(a - h * da, tau - h * dt_)) / (2 * h)
    got = float((x.grad.numpy() * da).sum() + (t.grad.numpy() * dt_).sum())
    assert got == pytest.approx(fd, rel=1e-6, abs=1e-8)


def test_matrix_rank_is_an_integer_without_gradient_as_in_torch() -> None:
    a = np.random.default_rng(4).standard_normal((2, 4, 3))
    x = ember.tensor(a, device=ember.device("flex").autodiff(), requires_grad=True)
    r = LA.matrix_rank(x)
    t = torch.linalg.matrix_rank(torch.tensor(a, requires_grad=True))
    assert r.dtype is ember.int64 and not r.requires_grad and not t.requires_grad
    np.testing.assert_array_equal(r.numpy(), t.numpy())
    c = _c(np.random.default_rng(5), 2, 4, 3)
    np.testing.assert_array_equal(LA.matrix_rank(ember.tensor(c)).numpy(), torch.linalg.matrix_rank(
        torch.from_numpy(c)).numpy())


def test_toy_backend_refuses_complex_with_a_typed_error() -> None:
    """A backend without complex dtypes (the toy example) refuses complex matrices naming the dtype and backend,
    before any linear algebra runs; eig of a real matrix there needs complex outputs and is refused the same way."""
    from ember.errors import DTypeError

    toy = _device("toy")
    with pytest.raises(DTypeError, match="complex128.*not supported by backend 'toy'"):
        LA.inv(ember.tensor(_sq(np.random.default_rng(6), 3, 3), device=toy))
    with pytest.raises(DTypeError, match="complex64.*not supported by backend 'toy'"):
        LA.eigvals(ember.tensor(np.eye(3, dtype=np.float32), device=toy))


def test_norms_of_complex_input_refuse_a_real_dtype_and_integers() -> None:
    from ember.errors import DTypeError

    z = ember.tensor(_c(np.random.default_rng(3), 3, 3))
    with pytest.raises(DTypeError, match=r"linalg\.matrix_norm: dtype should be complex for complex inputs.*float64"):
        ember.linalg.matrix_norm(z, dtype=ember.float64)
    with pytest.raises(DTypeError, match=r"linalg\.matrix_norm: .*Got int64 \(shape"):
        ember.linalg.matrix_norm(ember.ones(3, 3, dtype=ember.int64))
    # a complex dtype for complex input is a cast, as torch's
    got = ember.linalg.matrix_norm(z, "nuc", dtype=ember.complex128)
    want = torch.linalg.matrix_norm(torch.from_numpy(z.numpy()), "nuc", dtype=torch.complex128)
    assert got.dtype == ember.float64
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
